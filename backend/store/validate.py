"""Checks the catalog runs on what it ingests, so that one bad run directory is quarantined with a one-line reason
instead of breaking a refresh or a page: the manifest's shape (types of the keys the catalog and the pages read,
integers that fit a BIGINT) and the headers of a complete capture's safetensors files (read without loading a
tensor). Parquet tables are checked by DuckDB as the catalog reads them (backend/store/catalog.py).

Every function returns None when the input is fine, else the reason (one line)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

QUARANTINED = "quarantined"
STATUSES = ("running", "complete", "failed", "interrupted")
_INT64 = 2**63 - 1
_MAX_HEADER = 100 * 2**20                       # safetensors' own limit on the JSON header
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
                "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}

# key -> expected type, for the manifest's top level and the objects the catalog reads
_TEXT = ("kind", "engine", "engine_version", "dtype", "dataset", "created", "updated", "error", "baseline_run",
         "notes", "run_id")
_OBJECTS = ("model", "headline", "progress", "bench", "settings", "source", "aux")
_INTS = {"headline": ("tokens", "prompts", "sample_tokens"), "progress": ("done", "total"),
         "model": ("n_layers", "hidden_size", "vocab_size")}
_NUMBERS = {"bench": ("tau", "acceptance_rate", "tokens_per_s", "throughput", "ttft", "tpot", "mismatched_prompts"),
            "speedup": ("mean", "std", "ci_low", "ci_high")}
_TOP_NUMBERS = ("num_spec_tokens", "temperature", "repeats")


def _is_int(x) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return -_INT64 <= x <= _INT64
    return isinstance(x, float) and math.isfinite(x) and x.is_integer() and abs(x) <= _INT64


def _is_number(x) -> bool:
    """A JSON number a DOUBLE column can hold (NaN and inf included: metrics may produce them)."""
    return not isinstance(x, bool) and (isinstance(x, float) or (isinstance(x, int) and abs(x) <= _INT64))


def _name(x) -> str:
    return "null" if x is None else type(x).__name__


def check_manifest(m) -> str | None:
    """Why this parsed manifest cannot be indexed (wrong types, numbers out of range), or None."""
    if not isinstance(m, dict):
        return f"manifest is a JSON {_name(m)}, not an object"
    st = m.get("status")
    if not isinstance(st, str) or st not in STATUSES:
        return f"manifest status {st!r:.40} is not one of {', '.join(STATUSES)}"
    for k in _TEXT:
        if m.get(k) is not None and not isinstance(m[k], str):
            return f"manifest key '{k}' is a {_name(m[k])}, not text"
    for k in _OBJECTS:
        if m.get(k) is not None and not isinstance(m[k], dict):
            return f"manifest key '{k}' is a {_name(m[k])}, not an object"
    if m.get("drafter") is not None and not isinstance(m["drafter"], (dict, str)):
        return f"manifest key 'drafter' is a {_name(m['drafter'])}, not an object"
    for k in ("boundaries", "tags"):
        v = m.get(k)
        if v is not None and not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            return f"manifest key '{k}' is not a list of text"
    for obj, keys in _INTS.items():
        d = m.get(obj) or {}
        for k in keys:
            if d.get(k) is not None and not _is_int(d[k]):
                return f"manifest key '{obj}.{k}' = {str(d[k])[:40]!r} is not an integer that fits 64 bits"
    model = m.get("model") or {}
    if model.get("path") is not None and not isinstance(model["path"], str):
        return f"manifest key 'model.path' is a {_name(model['path'])}, not text"
    nonfinite = (m.get("headline") or {}).get("nonfinite")
    if nonfinite is not None and not (isinstance(nonfinite, dict) and all(_is_int(v) for v in nonfinite.values())):
        return "manifest key 'headline.nonfinite' is not an object of integer token counts"
    bench = m.get("bench") or {}
    for obj, d in (("bench", bench), ("speedup", bench.get("speedup"))):
        if d is None:
            continue
        if not isinstance(d, dict):
            return f"manifest key 'bench.{obj}' is a {_name(d)}, not an object"
        for k in _NUMBERS[obj]:
            if d.get(k) is not None and not _is_number(d[k]):
                return f"manifest key '{obj}.{k}' = {str(d[k])[:40]!r} is not a number"
    if bench.get("lossless") is not None and not isinstance(bench["lossless"], bool):
        return f"manifest key 'bench.lossless' is a {_name(bench['lossless'])}, not true/false"
    for k in _TOP_NUMBERS:
        if m.get(k) is not None and not _is_number(m[k]):
            return f"manifest key '{k}' = {str(m[k])[:40]!r} is not a number"
    if m.get("num_spec_tokens") is not None and not _is_int(m["num_spec_tokens"]):
        return f"manifest key 'num_spec_tokens' = {m['num_spec_tokens']!r:.40} is not an integer"
    if m.get("repeats") is not None and not _is_int(m["repeats"]):
        return f"manifest key 'repeats' = {m['repeats']!r:.40} is not an integer"
    return None


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
        return f"{name}: header is a JSON {_name(header)}, not an object"
    data, spans = size - 8 - n, []
    for key, t in header.items():
        if key == "__metadata__":
            if t is not None and not (isinstance(t, dict) and all(isinstance(v, str) for v in t.values())):
                return f"{name}: __metadata__ is not an object of text"
            continue
        try:
            dtype, shape, (a, b) = t["dtype"], t["shape"], t["data_offsets"]
            dims_ok = isinstance(shape, list) and all(_is_int(d) and d >= 0 for d in shape)
            ok = dims_ok and dtype in _DTYPE_BYTES and _is_int(a) and _is_int(b) and 0 <= a <= b <= data \
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
