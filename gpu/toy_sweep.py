"""Train a few toy-pair variants side by side on one GPU and keep the one that tells the story best.

    python gpu/toy_sweep.py --work /tmp/toy-sweep --out DIR [--budget-minutes 10] [--only A,B]

Each variant is one `python -m backend.toy.pair` process (logs in WORK/NAME.log); they share the GPU.
The pick: among variants whose matched drafter reaches held-out tau >= --min-tau (K=4, greedy,
`train_drafter.simulate_tau`), the largest drop of the after-layer drafter when vLLM feeds it
S_2,S_4,S_5 instead of the S_3,S_5,S_6 it was trained on. Writes DIR/sweep.json (every variant's
headline) and DIR/toy-pair.tar.gz (the pick, in the layout of models/toy-pair.tar.gz).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CODE = "spec_bench,pydoc_topics,stdlib_docstrings,debian_docs,stdlib_source"

VARIANTS = {   # name: extra arguments of backend.toy.pair
    "A": ["--steps-target", "1500"],
    "B": ["--steps-target", "1500", "--sources", CODE, "--echo-docs", "8000"],
    "C": ["--steps-target", "3000", "--sources", CODE, "--echo-docs", "8000"],
}


def headline(rec: dict) -> dict:
    d = rec["drafters"]
    m = d["drafter-matched"]["heldout_tau"]
    a = d["drafter-after-layer"]["heldout_tau"]
    return {"matched_tau": m["as_trained"]["tau"], "after_layer_tau_as_trained": a["as_trained"]["tau"],
            "after_layer_tau_as_served_vllm": a["as_served_vllm"]["tau"],
            "drop": a["as_trained"]["tau"] - a["as_served_vllm"]["tau"],
            "matched_minus_mismatched": m["as_trained"]["tau"] - a["as_served_vllm"]["tau"],
            "target_heldout_loss": rec["target"].get("heldout_loss"),
            "target_greedy_prob": rec["data"]["heldout_target_confidence"]["mean_greedy_prob"],
            "wall_s": rec["wall_s"]}


def pick(rows: dict[str, dict], min_tau: float) -> str | None:
    ok = {k: v for k, v in rows.items() if "error" not in v}
    good = {k: v for k, v in ok.items() if v["matched_tau"] >= min_tau}
    pool = good or ok
    if not pool:
        return None
    key = "matched_minus_mismatched" if good else "matched_tau"
    return max(pool, key=lambda k: pool[k][key])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/toy-sweep"))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget-minutes", type=float, default=10.0)
    p.add_argument("--steps-drafter", type=int, default=2000)
    p.add_argument("--min-tau", type=float, default=2.2)
    p.add_argument("--only", default=None, help="comma-separated variant names")
    p.add_argument("--threads", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="seconds-long variants (to try the sweep on a CPU)")
    a = p.parse_args()
    names = [n for n in VARIANTS if a.only is None or n in a.only.split(",")]
    a.work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    procs = {}
    for n in names:
        cmd = [sys.executable, "-m", "backend.toy.pair", "--out", str(a.work / n), "--device", a.device,
               "--budget-minutes", str(a.budget_minutes), "--steps-drafter", str(a.steps_drafter),
               "--threads", str(a.threads), *VARIANTS[n]] + (["--tiny"] if a.tiny else [])
        log = open(a.work / f"{n}.log", "w")
        procs[n] = (subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT), cmd)
        print(f"[sweep] {n}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.time()
    rows: dict[str, dict] = {}
    for n, (proc, _cmd) in procs.items():
        rc = proc.wait()
        rec_path = a.work / n / "TRAINING.json"
        if rc != 0 or not rec_path.is_file():
            tail = (a.work / f"{n}.log").read_text(errors="replace")[-1500:]
            rows[n] = {"error": f"exit {rc}", "log_tail": tail, "args": VARIANTS[n]}
        else:
            rec = json.loads(rec_path.read_text())
            rows[n] = {**headline(rec), "args": VARIANTS[n], "summary": rec["summary"]}
            (a.out / f"TRAINING-{n}.json").write_text(rec_path.read_text())
        print(f"[sweep] {n} done after {time.time() - t0:.0f}s: "
              + json.dumps({k: v for k, v in rows[n].items() if k not in ("summary", "log_tail")}), flush=True)
    best = pick(rows, a.min_tau)
    (a.out / "sweep.json").write_text(json.dumps({"variants": rows, "pick": best, "min_tau": a.min_tau,
                                                  "budget_minutes": a.budget_minutes,
                                                  "steps_drafter": a.steps_drafter}, indent=2) + "\n")
    if best is not None:
        src = a.work / best
        with tarfile.open(a.out / "toy-pair.tar.gz", "w:gz") as tf:
            for name in ("TRAINING.json", "target", "drafter-matched", "drafter-after-layer"):
                tf.add(src / name, arcname=name)
    print(f"[sweep] pick: {best}", flush=True)


if __name__ == "__main__":
    main()
