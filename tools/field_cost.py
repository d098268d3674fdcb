"""What a dropped drafter config field costs, measured on the toy pair on CPU (issue 22 item 3).

    python tools/field_cost.py [--field rope_theta|norm_before_fc] [--limit 40] [--out docs/results/field_cost_toy.json]

The output file is a list with one entry per field; a run replaces its field's entry and keeps the others.

rope_theta: the toy matched drafter (models/toy-pair.tar.gz) was trained with rope_theta 10000. A release that dropped
the drafter's rope setting would build its rotary embedding from another base; here the same weights are served with
rope_theta 500000 (the Llama-3 base, what a drafter of a Llama-3 target is usually trained with), the rest of the
config unchanged. Every derived release honours rope (backend/drafter_fields.yaml): this is the size of such a drop.

norm_before_fc: a drafter trained with norm_before_fc: true (backend/toy/norm_before_fc.py; its trained tensors are
tests/data/field_cost/norm_before_fc_delta.safetensors over the matched drafter) is served as trained (input_norm
applied to the concatenated aux states before fc, what vLLM does) and as a release without input_norm feeds it (the
same weights with norm_before_fc: false, so fc gets the un-normed states: SGLang <= 0.5.16), everything else alike.

Both drafters of a field are benched through the HF reference engine in one loop on the same held-out prompts,
greedy, K=4, against one paired baseline; the result is tau of each and the paired 95% interval of the difference over
prompts (backend/metrics.tau_difference). backend/drafter/lint.py quotes it in that field's findings.
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
NBF_DIR = REPO / "tests" / "data" / "field_cost"
# field -> (what the drafter was trained with, what the dropping release serves it with)
CASES = {"rope_theta": ({"rope_theta": 10000.0}, {"rope_theta": 500000.0}),
         "norm_before_fc": ({"norm_before_fc": True}, {"norm_before_fc": False})}


def drafters(field: str, pair: Path) -> tuple[Path, Path, dict, str]:
    """(trained drafter dir, dropped drafter dir, trained config, what the pair entry says) for `field`."""
    if field == "rope_theta":
        trained, what = pair / "drafter-matched", "models/toy-pair.tar.gz drafter-matched"
    else:
        from backend.toy.norm_before_fc import DELTA, assemble
        trained = assemble(pair / "drafter-matched", NBF_DIR / DELTA, pair / "drafter-norm-before-fc")
        what = ("models/toy-pair.tar.gz target; drafter-matched + tests/data/field_cost/" + DELTA +
                " (backend/toy/norm_before_fc.py)")
    cfg = json.loads((trained / "config.json").read_text())
    dropped = pair / f"drafter-{field}-dropped"
    dropped.mkdir()
    (dropped / "model.safetensors").symlink_to(trained / "model.safetensors")
    (dropped / "config.json").write_text(json.dumps({**cfg, **CASES[field][1]}, indent=1))
    return trained, dropped, cfg, what


def merge(out: Path, entry: dict) -> list[dict]:
    """The file's entries (a single old-style object counts as one) with `entry` replacing its field's."""
    old = json.loads(out.read_text()) if out.exists() else []
    old = [old] if isinstance(old, dict) else old
    return [e for e in old if e.get("field") != entry["field"]] + [entry]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--field", choices=sorted(CASES), default="rope_theta")
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
    from backend.bench import BenchSettings, run_benches
    from backend.prove_fix import _per_prompt
    from backend.toy.shipped import PAIR_TARBALL, heldout_prompts

    with tarfile.open(PAIR_TARBALL) as t:
        t.extractall(work / "pair", filter="data")
    pair = work / "pair"
    trained, dropped, cfg, what = drafters(a.field, pair)
    prompts = heldout_prompts(pair)
    t0 = time.time()
    tags = ("trained", "dropped")
    settings = [BenchSettings(target=str(pair / "target"), drafter=str(d), prompts=str(prompts), num_spec_tokens=4,
                              limit=a.limit, max_new_tokens=a.max_new_tokens, repeats=1, device="cpu")
                for d in (trained, dropped)]
    field = a.field.replace("_", "-")
    runs = dict(zip(tags, run_benches(settings, [f"field-cost-{field}-{t}" for t in tags], progress=False)))
    x, y = _per_prompt(runs["dropped"].path), _per_prompt(runs["trained"].path)
    shared = x.index.intersection(y.index)
    diff, lo, hi = metrics.tau_difference(x.loc[shared].to_numpy(), y.loc[shared].to_numpy())
    key = a.field
    entry = {
        "field": key, "pair": what,
        "trained_with": {key: cfg.get(key)}, "served_with": CASES[key][1],
        "tau_trained": round(float(runs["trained"].tau), 3), "tau_dropped": round(float(runs["dropped"].tau), 3),
        "difference": round(float(diff), 3), "ci95": [round(float(lo), 3), round(float(hi), 3)],
        "prompts": int(len(shared)), "k": 4, "max_new_tokens": a.max_new_tokens, "temperature": 0,
        "lossless": bool(runs["trained"].lossless and runs["dropped"].lossless),
        "lossless_each": {t: bool(runs[t].lossless) for t in tags},
        "command": "python tools/field_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "hardware": f"{platform.processor() or platform.machine()}, CPU, 1 torch thread",
        "load_average": list(os.getloadavg()), "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "seconds": round(time.time() - t0),
    }
    Path(a.out).write_text(json.dumps(merge(Path(a.out), entry), indent=1) + "\n")
    print(json.dumps(entry, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
