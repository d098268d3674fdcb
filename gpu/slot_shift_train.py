"""Train the slot-shift drafter (issue 15) for the shipped toy target on one GPU, the way the toy pair's drafters were
trained (all 4,428 self-distillation prompts, 2000 TTT steps of 4 draft steps), and measure it.

    python gpu/slot_shift_train.py --out $OUT [--budget-s 300] [--variants cold-F[,cold-layout,warm-fc-F]] [--tiny]

For each variant (init-teacher: `cold` = fc and layer random, `warm-fc` = the matched drafter's layer with a fresh fc;
`F` = the target's own distribution as teacher, `layout` = the files' last slot S_6 through the target's final norm
and head, what standardize_data_v1 did) it writes OUT/<variant>/ (drafter-slot-shift/, training-data/,
TRAINING.json with the held-out tau replayed for every feed: as trained S_0, S_3, S_5; SGLang ids [2, 4, 5] ->
S_3, S_5, S_6; patched [-1, 3, 5] -> S_0, S_4, S_6; and the matched drafter) and OUT/<variant>/toy-slot-shift.tar.gz
(what `make demo` ships as models/toy-slot-shift.tar.gz, about 6 MB). OUT/summary.json lists every variant's taus.
Data are generated once and shared. Every returned file stays far below 16 MiB. `--tiny` is a CPU smoke run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    import torch

    from backend.demo import PAIR_TARBALL
    from backend.toy import slot_shift as ss

    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget-s", type=float, default=400.0, help="stop starting new variants past this")
    p.add_argument("--variants", default="cold-F")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--tiny", action="store_true", help="CPU smoke run: a few prompts and steps")
    a = p.parse_args()
    t0 = time.time()
    a.out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() and not a.tiny else "cpu"
    work = Path(tempfile.mkdtemp(prefix="slot-shift-"))
    pair = work / "toy-pair"
    import tarfile
    with tarfile.open(PAIR_TARBALL) as tf:
        tf.extractall(pair, filter="data")
    if a.tiny:
        base = ss.SlotShiftConfig(steps=3, batch_size=4, batch_tokens=1024, train_rows=6, tau_prompts=4, gen_tokens=16,
                                  device=device, threads=2)
    else:
        base = ss.SlotShiftConfig(steps=a.steps, batch_size=64, batch_tokens=16384, lr=1e-3, warmup=50,
                                  doc_prompts=4000, gen_batch=256, tau_prompts=48, device=device)
    cache = work / "data.pt"
    summary = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "variants": {},
               "command": " ".join(sys.argv)}
    for v in [x.strip() for x in a.variants.split(",") if x.strip()]:
        if time.time() - t0 > a.budget_s:
            summary["variants"][v] = {"skipped": f"budget {a.budget_s:.0f}s spent"}
            continue
        init, teacher = v.rsplit("-", 1)
        cfg = replace(base, init=init, teacher=teacher)
        out = work / v
        try:
            rec = ss.build(out, pair, cfg, command=f"gpu/slot_shift_train.py variant {v}", data_cache=cache)
            dst = a.out / v
            dst.mkdir(parents=True, exist_ok=True)
            shutil.copy(out / "TRAINING.json", dst / "TRAINING.json")
            ss.pack(out, dst / "toy-slot-shift.tar.gz")
            summary["variants"][v] = {"heldout_tau_replay": rec["heldout_tau_replay"],
                                      "train_s": rec["train"]["train_s"],
                                      "steps_done": rec["train"]["steps_done"], "wall_s": rec["wall_s"]}
        except Exception as e:  # noqa: BLE001 - record and go on to the next variant
            summary["variants"][v] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
        summary["wall_s"] = round(time.time() - t0, 1)
        (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps({v: summary["variants"][v]}, indent=1), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
