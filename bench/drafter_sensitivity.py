"""How much does a drafter depend on the target states it is fed? `python bench/drafter_sensitivity.py [--limit 8]`

Benches one drafter of the toy pair (HF engine, K=4, greedy, held-out Spec-Bench prompts, one torch thread) fed
different boundary sets: the set it was trained on, engine conventions that shift it by one, and sets far from it.
A drafter whose tau barely moves when fed the wrong boundaries cannot show a convention mismatch in its acceptance.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    import torch

    from backend.bench import BenchSettings, run_bench
    from backend.demo import heldout_prompts, toy_pair
    from backend.store.data_root import DataRoot

    p = argparse.ArgumentParser()
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--drafter", default="drafter-matched")
    p.add_argument("--out", type=Path, default=Path("docs/results/drafter_sensitivity.json"))
    a = p.parse_args()
    torch.set_num_threads(1)
    pair = toy_pair()
    prompts = str(heldout_prompts(pair))
    root = Path(tempfile.mkdtemp(prefix="speclens-sens-"))
    cases = [("as trained (S_2,S_4,S_5)", [2, 4, 5]), ("one later (S_3,S_5,S_6)", [3, 5, 6]),
             ("one earlier (S_1,S_3,S_4)", [1, 3, 4]), ("late (S_6,S_7,S_8)", [6, 7, 8]),
             ("far (S_0,S_1,S_7)", [0, 1, 7])]
    rows = []
    for label, ids in cases:
        d = root / f"drafter-{'-'.join(map(str, ids))}"
        shutil.copytree(pair / a.drafter, d)
        cfg = json.loads((d / "config.json").read_text())
        cfg.pop("eagle_config", None)
        cfg["eagle_aux_hidden_state_layer_ids"] = ids
        (d / "config.json").write_text(json.dumps(cfg))
        t = time.perf_counter()
        r = run_bench(BenchSettings(target=str(pair / "target"), drafter=str(d), prompts=prompts, limit=a.limit,
                                    repeats=1, max_new_tokens=64, runner="v2"),
                      name=d.name, data=DataRoot(root), progress=False)
        rows.append({"fed": label, "ids": ids, "tau": round(r.tau, 3), "acceptance_rate": round(r.acceptance_rate, 3),
                     "lossless": r.lossless, "seconds": round(time.perf_counter() - t, 1)})
        print(rows[-1], flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"drafter": a.drafter, "prompts": a.limit, "k": 4, "max_new_tokens": 64,
                                 "engine": "hf (vLLM 0.24 V2 reading of top-level ids)", "rows": rows}, indent=1))
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
