"""What a dropped drafter config field costs, measured on the toy pair on CPU (issue 22 item 3).

    python tools/field_cost.py [--limit 40] [--out docs/results/field_cost_toy.json]

The toy matched drafter (models/toy-pair.tar.gz) was trained with rope_theta 10000. A release that dropped the
drafter's rope setting would build its rotary embedding from another base; here the same weights are served with
rope_theta 500000 (the Llama-3 base, what a drafter of a Llama-3 target is usually trained with), the rest of the
config unchanged. Both drafters are benched through the HF reference engine on the same held-out prompts, greedy,
K=4, against one paired baseline; the result is tau of each and the paired 95% interval of the difference over
prompts (backend/metrics.tau_difference). backend/drafter/lint.py quotes it in the rope findings.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

OUT = REPO / "docs" / "results" / "field_cost_toy.json"
DROPPED = {"rope_theta": 500000.0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=40, help="held-out prompts (default 40)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--data", help="SpecLens data root for the two bench runs (default: a temporary one)")
    p.add_argument("--out", default=str(OUT))
    a = p.parse_args(argv)

    import torch

    torch.set_num_threads(1)                      # the toy target decodes fastest on one thread
    work = Path(tempfile.mkdtemp(prefix="field-cost-"))
    os.environ.setdefault("SPECLENS_DATA", a.data or str(work / "data"))
    from backend import metrics
    from backend.bench import BenchSettings, run_bench
    from backend.prove_fix import _per_prompt
    from backend.toy.shipped import PAIR_TARBALL, heldout_prompts

    with tarfile.open(PAIR_TARBALL) as t:
        t.extractall(work / "pair", filter="data")
    pair = work / "pair"
    trained = pair / "drafter-matched"
    cfg = json.loads((trained / "config.json").read_text())
    dropped = pair / "drafter-rope-dropped"
    dropped.mkdir()
    (dropped / "model.safetensors").symlink_to(trained / "model.safetensors")
    (dropped / "config.json").write_text(json.dumps({**cfg, **DROPPED}, indent=1))
    prompts = heldout_prompts(pair)
    runs, t0 = {}, time.time()
    for tag, d in (("trained", trained), ("dropped", dropped)):
        s = BenchSettings(target=str(pair / "target"), drafter=str(d), prompts=str(prompts), num_spec_tokens=4,
                          limit=a.limit, max_new_tokens=a.max_new_tokens, repeats=1, device="cpu")
        runs[tag] = run_bench(s, name=f"field-cost-rope-{tag}", progress=False)
    x, y = _per_prompt(runs["dropped"].path), _per_prompt(runs["trained"].path)
    shared = x.index.intersection(y.index)
    diff, lo, hi = metrics.tau_difference(x.loc[shared].to_numpy(), y.loc[shared].to_numpy())
    out = {
        "field": "rope_theta", "pair": "models/toy-pair.tar.gz drafter-matched",
        "trained_with": {"rope_theta": cfg.get("rope_theta")}, "served_with": DROPPED,
        "tau_trained": round(float(runs["trained"].tau), 3), "tau_dropped": round(float(runs["dropped"].tau), 3),
        "difference": round(float(diff), 3), "ci95": [round(float(lo), 3), round(float(hi), 3)],
        "prompts": int(len(shared)), "k": 4, "max_new_tokens": a.max_new_tokens, "temperature": 0,
        "lossless": bool(runs["trained"].lossless and runs["dropped"].lossless),
        "command": "python tools/field_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "hardware": f"{platform.processor() or platform.machine()}, CPU, 1 torch thread",
        "load_average": list(os.getloadavg()), "seconds": round(time.time() - t0),
    }
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
