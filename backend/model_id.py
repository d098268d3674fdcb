"""What identifies a model's weights, wherever its files sit: `fingerprint(path)`.

The same target is often read from different paths (a training box, a GPU node, a Docker volume), so runs
compare by this key, not by path. It hashes config.json and, per weight file (*.safetensors, *.bin, sorted),
its name, size and 64 blocks of 4 KiB spread evenly over it (a safetensors header lies at offset 0, so every
tensor's name, dtype and shape is in the first block). Reading 256 KiB a file keeps it cheap for a 16 GB target;
two trainings of one shape differ in nearly every block. None when the path is no model directory.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

BLOCKS = 64
BLOCK = 4096


def fingerprint(path: str | Path) -> str | None:
    p = Path(path)
    cfg = p / "config.json"
    if not cfg.is_file():
        return None
    h = hashlib.sha256(cfg.read_bytes())
    files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix in (".safetensors", ".bin"))
    if not files:
        return None
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}\0{size}\0".encode())
        with open(f, "rb") as fh:
            step = max(BLOCK, size // BLOCKS)
            for off in range(0, size, step):
                fh.seek(off)
                h.update(fh.read(BLOCK))
    return "sha256-sampled:" + h.hexdigest()[:32]
