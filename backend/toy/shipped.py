"""The models this project ships (models/*.tar.gz), unpacked once under the data root, and the prompts they were
never trained on. Used by the demo, the slot-shift trainer, the GPU scripts and the tests."""

from __future__ import annotations

from pathlib import Path

from backend.config import REPO_ROOT
from backend.store.data_root import DataRoot

PROMPTS = REPO_ROOT / "datasets" / "spec_bench" / "question.jsonl"
PAIR_TARBALL = REPO_ROOT / "models" / "toy-pair.tar.gz"


def toy_pair(data: DataRoot | None = None) -> Path | None:
    """The shipped toy pair, unpacked once under <data>/models/toy-pair (None when the tarball is absent)."""
    import tarfile

    out = DataRoot.of(data).paths.models / "toy-pair"
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
