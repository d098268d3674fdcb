"""Issue 19's bar for speed you can trust at batch 1: "Two benches of the same drafter, one of them beside a CPU-bound
load: their speedups agree within their intervals, or the loaded one carries the noise notice and no verdict."

The shipped toy pair (models/toy-pair.tar.gz, unpacked under the data root as the demo does) with its matched drafter
on the first --limit held-out Spec-Bench prompts (the rows it was never trained on), K=4, greedy, the bench's default
3 repeats, one torch thread: `python -m backend bench` run twice as a child process, one after the other,

  quiet   alone;
  loaded  with --load CPU-bound processes (a Python busy loop each, not SpecLens) started --load-delay seconds
          after the bench, running until it ends: the issue's case ("two CPU-bound processes started a few
          seconds in").

The load processes are children of this script, not of the bench (the bench counts its own children as its own CPU).
Printed and written (--out, JSON): each run's tau, speedup with its 95% interval, whether its speed_noise finding
fired and why (backend/metrics.py speed_noise, as the bench stored it), its load summary, wall time and peak RSS of
the bench process; whether the two speedups' intervals overlap and whether each point lies in the other's interval;
whether the bar is met; and every unit's timings and load (what tests/test_metrics.py re-derives the finding from).

    python bench/noise_bench.py [--limit 16] [--repeats 3] [--load 2] [--load-delay 3] [--data DIR]
                                [--out docs/results/noise_bench_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402

from backend.store.data_root import DataRoot  # noqa: E402
from backend.toy.shipped import heldout_prompts, toy_pair  # noqa: E402

UNIT_COLUMNS = ["unit_order", "repeat", "prompt_index", "prompt_id", "first_arm", "tokens_per_s", "base_tokens_per_s",
                "ttft", "base_ttft", "load1", "cpu_util", "other_cpu", "speclens_cpu"]
BUSY = "import time\nt = time.time()\nwhile time.time() - t < {s}: pass\n"


def bench(name: str, root: Path, pair: Path, a: argparse.Namespace, load: int = 0) -> dict:
    """One `python -m backend bench` child (one torch thread); with `load`, that many busy loops start load_delay
    seconds in. Returns wall seconds and the child's peak RSS (KiB)."""
    env = {**os.environ, "SPECLENS_DATA": str(root), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "backend", "bench", "--engine", "hf", "--target", str(pair / "target"),
           "--drafter", str(pair / "drafter-matched"), "--prompts", str(heldout_prompts(pair)), "--limit",
           str(a.limit), "--num-spec-tokens", "4", "--max-new-tokens", str(a.max_new_tokens), "--repeats",
           str(a.repeats), "--device", "cpu", "--name", name, "--quiet"]
    hogs: list[subprocess.Popen] = []
    stop = threading.Event()

    def start_load() -> None:
        if not stop.wait(a.load_delay):
            hogs.extend(subprocess.Popen([sys.executable, "-c", BUSY.format(s=3600)]) for _ in range(load))
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, cwd=REPO, env=env)
    timer = threading.Thread(target=start_load, daemon=True)
    if load:
        timer.start()
    try:
        _, status, ru = os.wait4(p.pid, 0)
    finally:
        stop.set()
        if load:
            timer.join()
        for h in hogs:
            h.kill()
            h.wait()
    wall = time.monotonic() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"bench {name} failed (exit {os.waitstatus_to_exitcode(status)})")
    return {"wall_s": round(wall, 1), "peak_rss_mib": round(ru.ru_maxrss / 1024, 1), "load_processes": len(hogs)}


def result(name: str, root: Path, run: dict) -> dict:
    m = json.loads((root / "runs" / name / "manifest.json").read_text())
    b = m["bench"]
    units = pd.read_parquet(root / "runs" / name / "prompts.parquet").sort_values("unit_order")
    sp, noise = b["speedup"], b["speed_noise"]
    return {"run_id": name, "tau": round(b["tau"], 4), "lossless": b["lossless"],
            "speedup": {k: round(sp[k], 4) for k in ("mean", "ci_low", "ci_high", "std")},
            "per_repeat": [round(x, 4) for x in sp["per_repeat"]],
            "tokens_per_s": round(b["tokens_per_s"], 1),
            "baseline_tokens_per_s": round(float(units["base_tokens_per_s"].mean()), 1),
            "noise": noise, "load": b["load"], **run,
            "units": json.loads(units[UNIT_COLUMNS].to_json(orient="records"))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--load", type=int, default=2, help="CPU-bound processes beside the second bench")
    ap.add_argument("--load-delay", type=float, default=3.0)
    ap.add_argument("--data", help="data root (default: a temporary folder)")
    ap.add_argument("--out", help="write the result JSON here")
    a = ap.parse_args()
    root = Path(a.data) if a.data else Path(tempfile.mkdtemp(prefix="noise-bench-"))
    pair = toy_pair(DataRoot(root))
    if pair is None:
        raise SystemExit("models/toy-pair.tar.gz is missing")
    t0 = time.monotonic()
    quiet = result("noise-quiet", root, bench("noise-quiet", root, pair, a))
    loaded = result("noise-loaded", root, bench("noise-loaded", root, pair, a, load=a.load))
    q, lo = quiet["speedup"], loaded["speedup"]
    overlap = q["ci_low"] <= lo["ci_high"] and lo["ci_low"] <= q["ci_high"]
    each_in_other = q["ci_low"] <= lo["mean"] <= q["ci_high"] and lo["ci_low"] <= q["mean"] <= lo["ci_high"]
    bar = overlap or bool(loaded["noise"]["noisy"])
    out = {"bench": "bench/noise_bench.py", "command": "python " + " ".join([Path(sys.argv[0]).as_posix(),
                                                                              *sys.argv[1:]]),
           "date": time.strftime("%Y-%m-%d"), "hardware": f"{os.cpu_count()}-core CPU, no GPU",
           "platform": platform.platform(), "python": platform.python_version(),
           "settings": {"pair": "models/toy-pair.tar.gz drafter-matched", "prompts": f"first {a.limit} held-out",
                        "num_spec_tokens": 4, "max_new_tokens": a.max_new_tokens, "repeats": a.repeats,
                        "temperature": 0.0, "torch_threads": 1, "load_processes": a.load,
                        "load_delay_s": a.load_delay},
           "quiet": quiet, "loaded": loaded,
           "intervals_overlap": overlap, "each_point_in_the_other_interval": each_in_other,
           "bar_met": bar, "seconds": round(time.monotonic() - t0, 1)}
    for r in (quiet, loaded):
        s = r["speedup"]
        print(f"{r['run_id']}: tau {r['tau']:.2f}, speedup {s['mean']:.2f}x [{s['ci_low']:.2f}, {s['ci_high']:.2f}], "
              f"plain {r['baseline_tokens_per_s']:.0f} tok/s, notice: {r['noise']['reason'] or 'none'} "
              f"({r['wall_s']} s, peak RSS {r['peak_rss_mib']} MiB)")
    print(f"intervals overlap: {overlap}; each point in the other's interval: {each_in_other}; bar met: {bar}")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {a.out}")
    return 0 if bar else 1


if __name__ == "__main__":
    sys.exit(main())
