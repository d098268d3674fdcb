"""The manifest's one schema (manifest.json, docs/SCHEMA.md), for writing and for reading.

- `Manifest`: what every kind of run records about itself, checked when the run is created
  (`backend.runs.lifecycle.Run.create`), so that a run with a malformed manifest is refused at its start instead of
  quarantined by the catalog later. Kind-specific sections (bench figures, an import's source, a check's verdict)
  are kept as they are given (`extra="allow"`).
- `check_stored`: the check the catalog runs on every manifest.json it reads (backend/store/validate.py), so that one
  bad run directory is quarantined with a one-line reason instead of breaking a refresh or a page: the types of the
  keys the catalog and the pages read, integers that fit a BIGINT. Its integer keys of `model` and `progress` are
  the typed model's own fields."""

from __future__ import annotations

import math
from typing import Annotated, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt

KINDS = ("capture", "bench", "check", "load", "watch")
STATUSES = ("running", "complete", "failed", "interrupted")


class ModelInfo(BaseModel):
    """The target the run used."""

    model_config = ConfigDict(extra="allow")

    path: str | None
    model_type: str | None = None
    n_layers: NonNegativeInt | None = None
    hidden_size: NonNegativeInt | None = None
    vocab_size: NonNegativeInt | None = None
    fingerprint: str | None = None


class Progress(BaseModel):
    model_config = ConfigDict(extra="forbid")

    done: NonNegativeInt
    total: NonNegativeInt


class Manifest(BaseModel):
    """What a run records when it is created; fields added later (status, headline, bench figures, error) are
    written by the run's lifecycle."""

    model_config = ConfigDict(extra="allow")

    kind: Literal[KINDS]  # type: ignore[valid-type]
    engine: str
    engine_version: str | None = None
    model: ModelInfo
    dtype: str | None = None
    device: str | None = None
    dataset: str | None = None
    boundaries: list[str] = Field(default_factory=list)
    settings: dict = Field(default_factory=dict)
    progress: Progress

    def to_json(self) -> dict:
        """The fields as given (no defaults added), for manifest.json."""
        return self.model_dump(mode="json", exclude_unset=True)


def _int_fields(model: type[BaseModel]) -> tuple[str, ...]:
    """The fields of a typed section declared as (optional, constrained) integers."""
    def is_int(t) -> bool:
        return t is int or (get_origin(t) is Annotated and get_args(t)[0] is int)

    return tuple(n for n, f in model.model_fields.items()
                 if is_int(f.annotation) or any(is_int(a) for a in get_args(f.annotation)))


_INT64 = 2**63 - 1

# key -> expected type, for the manifest's top level and the objects the catalog reads
_TEXT = ("kind", "engine", "engine_version", "dtype", "dataset", "created", "updated", "error", "baseline_run",
         "notes", "run_id")
_OBJECTS = ("model", "headline", "progress", "bench", "settings", "source", "aux")
_INTS = {"headline": ("tokens", "prompts", "sample_tokens"), "progress": _int_fields(Progress),
         "model": _int_fields(ModelInfo)}
_NUMBERS = {"bench": ("tau", "acceptance_rate", "tokens_per_s", "throughput", "ttft", "tpot", "mismatched_prompts"),
            "speedup": ("mean", "std", "ci_low", "ci_high")}
_TOP_NUMBERS = ("num_spec_tokens", "temperature", "repeats")


def is_int64(x) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return -_INT64 <= x <= _INT64
    return isinstance(x, float) and math.isfinite(x) and x.is_integer() and abs(x) <= _INT64


def _is_number(x) -> bool:
    """A JSON number a DOUBLE column can hold (NaN and inf included: metrics may produce them)."""
    return not isinstance(x, bool) and (isinstance(x, float) or (isinstance(x, int) and abs(x) <= _INT64))


def json_type(x) -> str:
    return "null" if x is None else type(x).__name__


def check_stored(m) -> str | None:
    """Why this parsed manifest.json cannot be indexed (wrong types, numbers out of range), or None: the check the
    catalog runs on what it reads (backend/store/validate.py `check_manifest`), with `Manifest`'s key types."""
    if not isinstance(m, dict):
        return f"manifest is a JSON {json_type(m)}, not an object"
    st = m.get("status")
    if not isinstance(st, str) or st not in STATUSES:
        return f"manifest status {st!r:.40} is not one of {', '.join(STATUSES)}"
    for k in _TEXT:
        if m.get(k) is not None and not isinstance(m[k], str):
            return f"manifest key '{k}' is a {json_type(m[k])}, not text"
    for k in _OBJECTS:
        if m.get(k) is not None and not isinstance(m[k], dict):
            return f"manifest key '{k}' is a {json_type(m[k])}, not an object"
    if m.get("drafter") is not None and not isinstance(m["drafter"], (dict, str)):
        return f"manifest key 'drafter' is a {json_type(m['drafter'])}, not an object"
    for k in ("boundaries", "tags"):
        v = m.get(k)
        if v is not None and not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            return f"manifest key '{k}' is not a list of text"
    for obj, keys in _INTS.items():
        d = m.get(obj) or {}
        for k in keys:
            if d.get(k) is not None and not is_int64(d[k]):
                return f"manifest key '{obj}.{k}' = {str(d[k])[:40]!r} is not an integer that fits 64 bits"
    model = m.get("model") or {}
    if model.get("path") is not None and not isinstance(model["path"], str):
        return f"manifest key 'model.path' is a {json_type(model['path'])}, not text"
    nonfinite = (m.get("headline") or {}).get("nonfinite")
    if nonfinite is not None and not (isinstance(nonfinite, dict) and all(is_int64(v) for v in nonfinite.values())):
        return "manifest key 'headline.nonfinite' is not an object of integer token counts"
    bench = m.get("bench") or {}
    for obj, d in (("bench", bench), ("speedup", bench.get("speedup"))):
        if d is None:
            continue
        if not isinstance(d, dict):
            return f"manifest key 'bench.{obj}' is a {json_type(d)}, not an object"
        for k in _NUMBERS[obj]:
            if d.get(k) is not None and not _is_number(d[k]):
                return f"manifest key '{obj}.{k}' = {str(d[k])[:40]!r} is not a number"
    if bench.get("lossless") is not None and not isinstance(bench["lossless"], bool):
        return f"manifest key 'bench.lossless' is a {json_type(bench['lossless'])}, not true/false"
    for k in _TOP_NUMBERS:
        if m.get(k) is not None and not _is_number(m[k]):
            return f"manifest key '{k}' = {str(m[k])[:40]!r} is not a number"
    if m.get("num_spec_tokens") is not None and not is_int64(m["num_spec_tokens"]):
        return f"manifest key 'num_spec_tokens' = {m['num_spec_tokens']!r:.40} is not an integer"
    if m.get("repeats") is not None and not is_int64(m["repeats"]):
        return f"manifest key 'repeats' = {m['repeats']!r:.40} is not an integer"
    return None
