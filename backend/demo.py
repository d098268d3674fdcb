"""`python -m backend demo`: the project's own demo data, one capture pair per alignment verdict.

Builds (once, cached under <data>/models/) a small Llama-shaped target with non-unit norm weights and
its rotated copy, then captures and imports:

| pair (A vs B)                         | shows       |
|---------------------------------------|-------------|
| demo-fp32 vs demo-fp32-again          | aligned     |
| demo-fp32 vs demo-after-layer         | offset +1   |
| demo-fp32 vs demo-final-norm          | final_norm  |
| demo-fp32 vs demo-rotated             | rotation    |
| demo-fp32 vs demo-bf16                | drift       |

and, with the toy pair (models/toy-pair.tar.gz, trained on the H200 by `python -m backend.toy.pair --device cuda
--steps-target 400 --steps-drafter 2000 --budget-minutes 8.3`; unpacked under <data>/models/toy-pair), three
speculative-decoding benches on held-out Spec-Bench prompts: the paired baseline, the matched drafter and the
drafter trained on "after layer" captures (the speculators <= 0.4 convention) served with vLLM's reading of its ids.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from backend.config import REPO_ROOT, paths
from backend.store import catalog
from backend.store.rundir import COMPLETE, RunDir, list_run_dirs

PROMPTS = REPO_ROOT / "datasets" / "spec_bench" / "question.jsonl"
LIMIT = 40
PAIR_TARBALL = REPO_ROOT / "models" / "toy-pair.tar.gz"
BENCH_RUNS = ("demo-bench-matched", "demo-bench-after-layer")
DEMO_PAIRS = [
    ("demo-fp32", "demo-fp32-again", "aligned"),
    ("demo-fp32", "demo-after-layer", "offset"),
    ("demo-fp32", "demo-final-norm", "final_norm"),
    ("demo-fp32", "demo-rotated", "rotation"),
    ("demo-fp32", "demo-bf16", "drift"),
]


def demo_models(root: Path | None = None, force: bool = False) -> tuple[Path, Path]:
    from backend.toy.rotate import write_rotated
    from backend.toy.target import build_random_target

    models = paths(root).models
    target, rotated = models / "demo-target", models / "demo-target-rotated"
    if force or not (target / "config.json").exists():
        shutil.rmtree(target, ignore_errors=True)
        build_random_target(target, n_layers=8, hidden=256, seed=0)
    if force or not (rotated / "config.json").exists():
        shutil.rmtree(rotated, ignore_errors=True)
        write_rotated(target, rotated)
    return target, rotated


def _complete(run_id: str, root: Path | None) -> bool:
    try:
        rd = RunDir.open(run_id, root)
        return rd.effective_status() == COMPLETE
    except Exception:
        return False


def _fresh(run_id: str, root: Path | None, force: bool) -> bool:
    """True when the run must be (re)built; removes a stale or incomplete run directory."""
    if not force and _complete(run_id, root):
        return False
    shutil.rmtree(paths(root).runs / run_id, ignore_errors=True)
    return True


def build_demo(root: Path | None = None, force: bool = False, progress: bool = True, limit: int = LIMIT) -> list[str]:
    from backend.capture import CaptureSettings, run_capture
    from backend.importers import import_capture
    from backend.producers import write_training_data

    target, rotated = demo_models(root, force)
    made = []

    def capture(run_id: str, model: Path, dtype: str = "fp32") -> None:
        if _fresh(run_id, root, force):
            run_capture(CaptureSettings(model=str(model), prompts=str(PROMPTS), limit=limit, dtype=dtype),
                        name=run_id, root=root, progress=progress)
            made.append(run_id)

    capture("demo-fp32", target)
    capture("demo-fp32-again", target)
    capture("demo-bf16", target, "bf16")
    capture("demo-rotated", rotated)
    files = paths(root).root / "training-data"
    for run_id, fmt, kw in [
        ("demo-after-layer", "speculators", {"capture_rule": "after"}),   # captured after layer a, labelled S_a
        ("demo-final-norm", "vllm-extract", {"teacher": "F"}),          # last state after the final norm
    ]:
        if _fresh(run_id, root, force):
            out = files / run_id
            shutil.rmtree(out, ignore_errors=True)
            write_training_data(target, PROMPTS, fmt, out, limit=limit, **kw)
            import_capture(out, fmt, num_layers=8, name=run_id, root=root)
            made.append(run_id)
    catalog.refresh(root)
    return made


def toy_pair(root: Path | None = None) -> Path | None:
    """The shipped toy pair, unpacked once under <data>/models/toy-pair (None when the tarball is absent)."""
    import tarfile

    out = paths(root).models / "toy-pair"
    if (out / "drafter-after-layer" / "config.json").exists():
        return out
    if not PAIR_TARBALL.exists():
        return None
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(PAIR_TARBALL) as tf:
        tf.extractall(out, filter="data")
    return out


def heldout_prompts(pair: Path) -> Path:
    """Spec-Bench rows never used to train the pair (TRAINING.json), as a prompts file next to it."""
    import json

    out = pair / "heldout.jsonl"
    if not out.exists():
        ids = set(json.loads((pair / "TRAINING.json").read_text())["heldout_question_ids"])
        rows = [line for line in PROMPTS.read_text().splitlines() if json.loads(line)["question_id"] in ids]
        out.write_text("\n".join(rows) + "\n")
    return out


def build_bench_demo(root: Path | None = None, force: bool = False, progress: bool = True, limit: int | None = None,
                     max_new_tokens: int = 48, repeats: int = 1) -> list[str]:
    """Baseline, matched drafter and after-layer drafter on the held-out prompts (all 116 by default: the two
    drafters differ by about 4% in tau, which takes that many prompts to tell apart; K=4, greedy)."""
    from backend.bench import BenchSettings, run_bench

    import torch

    # a toy target decodes fastest on one thread; two threads collapse when anything else uses a core
    torch.set_num_threads(1)
    pair = toy_pair(root)
    if pair is None:
        print(f"no toy pair ({PAIR_TARBALL} missing): skipping the benchmark demo")
        return []
    prompts = heldout_prompts(pair)
    made = []
    for run_id, drafter in zip(BENCH_RUNS, ("drafter-matched", "drafter-after-layer")):
        if not _fresh(run_id, root, force):
            continue
        s = BenchSettings(target=str(pair / "target"), drafter=str(pair / drafter), prompts=str(prompts),
                          num_spec_tokens=4, limit=limit, max_new_tokens=max_new_tokens, repeats=repeats,
                          device="cpu")
        r = run_bench(s, name=run_id, root=root, progress=progress)
        made.append(r.run_id)
    catalog.refresh(root)
    return made


CHECK_RUN = "demo-check-after-layer"


def build_check_demo(root: Path | None = None, force: bool = False, progress: bool = True) -> list[str]:
    """The drafter check of the after-layer drafter against vLLM 0.24 (what the Drafter check page opens on)."""
    from backend.check_drafter import CheckSettings, run_check

    pair = toy_pair(root)
    if pair is None or not _fresh(CHECK_RUN, root, force):
        return []
    r = run_check(CheckSettings(drafter=str(pair / "drafter-after-layer"), target=str(pair / "target"),
                                device="cpu"), name=CHECK_RUN, root=root, progress=progress)
    return [r.run_id]


def run_demo(force: bool = False, progress: bool = True, root: Path | None = None) -> None:
    from backend.align import get_alignment

    t0 = time.perf_counter()
    made = build_demo(root, force, progress)
    print(f"demo data ready in {time.perf_counter() - t0:.1f} s ({len(made)} runs built, "
          f"{len(list_run_dirs(root))} runs in {paths(root).runs})")
    for a, b, expected in DEMO_PAIRS:
        al = get_alignment(a, b, root)
        kinds = ",".join(f.kind for f in al.verdict)
        print(f"  align {a} {b}: [{kinds}] {al.verdict[0].text[:110]}")
    t1 = time.perf_counter()
    build_bench_demo(root, force, progress)
    for r in catalog.bench_runs(root=root, run_ids=list(BENCH_RUNS)).itertuples():
        print(f"  bench {r.run_id}: tau {r.tau:.2f}, {r.tokens_per_s:.1f} tok/s, speedup {r.speedup:.2f}x, "
              f"lossless {r.lossless}")
    print(f"benchmark demo ready in {time.perf_counter() - t1:.1f} s; open http://localhost:8501/compare?runs="
          f"{','.join(BENCH_RUNS)}")
    t2 = time.perf_counter()
    if build_check_demo(root, force, progress) or _complete(CHECK_RUN, root):
        print(f"drafter check ready in {time.perf_counter() - t2:.1f} s; open http://localhost:8501/drafter?run={CHECK_RUN}")
