"""What identifies a model's weights, wherever its files sit: `fingerprint(path)`, and for a drafter
`weights_fingerprint(path)`.

The same target is often read from different paths (a training box, a GPU node, a Docker volume), so runs
compare by this key, not by path. It hashes config.json and, per weight file (*.safetensors, *.bin, sorted),
its name, size and 64 blocks of 4 KiB spread evenly over it (a safetensors header lies at offset 0, so every
tensor's name, dtype and shape is in the first block). Reading 256 KiB a file keeps it cheap for a 16 GB target;
two trainings of one shape differ in nearly every block. None when the path is no model directory.

`weights_fingerprint` is the same sample of the weight files without config.json: what a drafter was trained on is a
property of its weights, so a drafter whose config was edited (other aux ids, the fix `check-drafter --write-fix`
writes beside linked weights) keeps it while its `fingerprint` changes (backend/findings.py matches a bench to the
drafter check of the same weights by it). `identity(path)` gives both from one read.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

BLOCKS = 64
BLOCK = 4096


def fingerprint(path: str | Path) -> str | None:
    return identity(path)["fingerprint"]


def weights_fingerprint(path: str | Path) -> str | None:
    """The weight files' sample alone (module docstring); None when the path holds no weight files or config.json."""
    return identity(path)["weights_fingerprint"]


def identity(path: str | Path) -> dict[str, str | None]:
    """{"fingerprint", "weights_fingerprint"} of a model directory, the weight files read once (both None when the
    path is no model directory: no config.json or no weight file)."""
    none = {"fingerprint": None, "weights_fingerprint": None}
    p = Path(path)
    cfg = p / "config.json"
    if not cfg.is_file():
        return none
    files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix in (".safetensors", ".bin"))
    if not files:
        return none
    full, weights = hashlib.sha256(cfg.read_bytes()), hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        _update((full, weights), f"{f.name}\0{size}\0".encode())
        with open(f, "rb") as fh:
            step = max(BLOCK, size // BLOCKS)
            for off in range(0, size, step):
                fh.seek(off)
                _update((full, weights), fh.read(BLOCK))
    return {"fingerprint": "sha256-sampled:" + full.hexdigest()[:32],
            "weights_fingerprint": "sha256-sampled-weights:" + weights.hexdigest()[:32]}


def _update(hashes, data: bytes) -> None:
    for h in hashes:
        h.update(data)
