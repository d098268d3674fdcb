"""Checks the catalog runs on what it ingests, so that one bad run directory is quarantined with a one-line reason
instead of breaking a refresh or a page: the manifest's shape (`check_manifest`: the typed manifest's own check of
a stored manifest, backend/runs/manifest.py `check_stored`) and the headers of a complete capture's safetensors
files (read without loading a tensor). Parquet tables are checked by DuckDB as the catalog reads them
(backend/store/catalog.py).

Every function returns None when the input is fine, else the reason (one line)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

from backend.runs.manifest import STATUSES, check_stored, is_int64, json_type  # noqa: F401 (STATUSES re-exported)

check_manifest = check_stored   # why a parsed manifest cannot be indexed, or None (backend/runs/manifest.py)

QUARANTINED = "quarantined"
_MAX_HEADER = 100 * 2**20                       # safetensors' own limit on the JSON header
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
                "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}

def check_safetensors(f: Path) -> str | None:
    """Why this safetensors file cannot be read (header unparseable, tensors not tiling the data), or None; reads
    only the header."""
    try:
        with open(f, "rb") as fh:
            return _check_safetensors(fh, f.stat().st_size, f.name)
    except OSError as e:
        return f"{f.name}: unreadable ({e.strerror or e})"


def check_safetensors_bytes(data: bytes, name: str = "safetensors") -> str | None:
    """check_safetensors on a file's bytes."""
    return _check_safetensors(io.BytesIO(data), len(data), name)


def _check_safetensors(fh, size: int, name: str) -> str | None:
    head = fh.read(8)
    if len(head) < 8:
        return f"{name}: {size} bytes, shorter than a safetensors header"
    n = int.from_bytes(head, "little")
    if n > min(size - 8, _MAX_HEADER):
        return f"{name}: header length {n} beyond the file ({size} bytes)"
    try:
        header = json.loads(fh.read(n))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        return f"{name}: header is not JSON ({str(e).splitlines()[0][:80]})"
    if not isinstance(header, dict):
        return f"{name}: header is a JSON {json_type(header)}, not an object"
    data, spans = size - 8 - n, []
    for key, t in header.items():
        if key == "__metadata__":
            if t is not None and not (isinstance(t, dict) and all(isinstance(v, str) for v in t.values())):
                return f"{name}: __metadata__ is not an object of text"
            continue
        try:
            dtype, shape, (a, b) = t["dtype"], t["shape"], t["data_offsets"]
            dims_ok = isinstance(shape, list) and all(is_int64(d) and d >= 0 for d in shape)
            ok = dims_ok and dtype in _DTYPE_BYTES and is_int64(a) and is_int64(b) and 0 <= a <= b <= data \
                and b - a == math.prod(int(d) for d in shape) * _DTYPE_BYTES[dtype]
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            return f"{name}: tensor '{str(key)[:40]}' has a bad dtype, shape or offsets"
        spans.append((a, b))
    end = 0
    for a, b in sorted(spans):                  # the tensors must tile the data buffer, in order, no gaps
        if a != end:
            return f"{name}: tensor data overlaps or leaves a gap at byte {end}"
        end = b
    if end != data:
        return f"{name}: tensors cover {end} of {data} data bytes"
    return None
