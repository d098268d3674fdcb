"""Job specs: a YAML or JSON mapping with `kind: capture | bench | sweep | load`, validated by the settings model of
its kind (pydantic: backend/settings.py, and the job-only extras below; backend.settings.LoadSettings for load),
the first failure as a one-line error; paths confined to the configured roots (backend.config.model_roots); a sweep
expanded into bench jobs.

    kind: capture                      kind: bench                       kind: sweep (bench fields, and lists)
    model: models/toy                  target: models/toy                target: models/toy
    prompts: datasets/.../q.jsonl      drafter: models/toy-drafter       drafters: [models/d1, models/d2]
    limit: 12                          prompts: ...                      num_spec_tokens: [1, 2, 4]
    device: cpu                        num_spec_tokens: 4                temperature: [0, 0.7]
    name: my-capture  (run name)       temperature: 0                    batch_size: [1]
    num_gpus: 0 (Ray; default 1 on     repeats: 3                        prompts: ...
      cuda devices, else 0)            max_new_tokens: 64
    num_cpus: 1 (Ray; torch threads)

Relative paths are taken from `base` (the spec file's directory for `submit`, the repo root otherwise) and
stored absolute. The settings map one to one onto CaptureSettings / BenchSettings.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from pathlib import Path
from typing import Any

from pydantic import field_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from backend.config import REPO_ROOT, data_root, model_roots
from backend.errors import SpecLensError
from backend.options import build, field_choices, field_types, required_fields
from backend.settings import STRICT, BenchSettings, CaptureSettings, tensor_parallel
from backend.store.rundir import valid_run_id


@pydantic_dataclass(config=STRICT)
class CaptureJobExtras:
    """What a capture job gives beyond CaptureSettings: the engine's parallelism and options, handed to the engine."""
    tensor_parallel_size: int = 1
    engine_options: dict | None = None

    _tp = field_validator("tensor_parallel_size")(tensor_parallel)


@pydantic_dataclass(config=STRICT)
class SweepJobExtras:
    """What a bench or sweep job gives beyond BenchSettings: the batch size (the HF bench decodes one at a time)."""
    batch_size: int = 1

    @field_validator("batch_size")
    @classmethod
    def _one(cls, v: int) -> int:
        if v != 1:
            raise ValueError(f"{v}: the hf bench decodes one sequence at a time; use 1 (batched benches run on vLLM "
                             "or SGLang)")
        return v


KINDS = ("capture", "bench", "sweep", "load")
COMMON = {"kind", "name", "num_gpus", "num_cpus", "max_attempts"}
# a job's settings are the settings classes' fields (backend/settings.py), plus what only a job gives: a capture's
# engine parallelism and options (handed to the engine), a sweep's batch size
CAPTURE = {**field_types(CaptureSettings), **field_types(CaptureJobExtras)}
BENCH = {**field_types(BenchSettings), **field_types(SweepJobExtras)}
SWEEP_LISTS = {"num_spec_tokens": "num_spec_tokens", "temperature": "temperature", "batch_size": "batch_size",
               "drafters": "drafter"}
REQUIRED = {"capture": required_fields(CaptureSettings), "bench": required_fields(BenchSettings),
            "sweep": required_fields(BenchSettings)}
CHOICES = {**field_choices(CaptureSettings), **field_choices(BenchSettings)}
MODEL_FIELDS = ("model", "target", "drafter")
MAX_SWEEP = 256


def load_spec_file(path: str | Path) -> dict:
    """Read a YAML or JSON spec file into a mapping (one-line errors)."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise SpecLensError(f"{p}: cannot read the job spec ({e.strerror or e})") from None
    try:
        obj = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SpecLensError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'} ({first})") from None
    if not isinstance(obj, dict):
        raise SpecLensError(f"{p}: a job spec is a mapping with a 'kind' (capture, bench, sweep or load)")
    return obj


def input_roots() -> list[Path]:
    """Roots prompts files may come from: the model roots, the data root and <repo>/datasets."""
    out = []
    for r in [*model_roots(), data_root(), REPO_ROOT / "datasets"]:
        if r not in out:
            out.append(r)
    return out


def confine(value: str, field: str, roots: list[Path], base: Path) -> str:
    """The absolute, symlink-resolved path of `value` if it lies under one of `roots`, else a one-line error."""
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise SpecLensError(f"{field}: expected a path")
    p = Path(value).expanduser()
    p = (p if p.is_absolute() else base / p).resolve()
    for r in roots:
        try:
            p.relative_to(r.resolve())
        except ValueError:
            continue
        if not p.exists():
            raise SpecLensError(f"{field}: {p} does not exist")
        return str(p)
    raise SpecLensError(f"{field}: {value} is outside the allowed roots ({', '.join(map(str, roots))}); "
                        "set SPECLENS_MODEL_ROOTS to allow another directory")


def _check(kind: str, d: dict, where: str = "") -> None:
    """Validate a job's settings with the settings model of its kind (types, choices, minimums, the model's field
    checks; backend/settings.py) and its job-only fields with the extras model: a one-line error on the first
    failure."""
    cls, extras = (CaptureSettings, CaptureJobExtras) if kind == "capture" else (BenchSettings, SweepJobExtras)
    names = {f.name for f in dataclasses.fields(extras)}
    build(cls, {k: v for k, v in d.items() if k not in names}, where)
    build(extras, {k: v for k, v in d.items() if k in names}, where)


def _resources(spec: dict, settings: dict) -> dict:
    dev = str(settings.get("device", "auto"))
    engine_gpus = settings.get("engine", "hf") != "hf" and not settings.get("server_url")
    gpus = float(settings.get("tensor_parallel_size") or 1) if engine_gpus else 1.0 if dev.startswith("cuda") else 0.0
    out = {"num_gpus": gpus, "num_cpus": 1.0, "max_attempts": 3}
    for k in ("num_gpus", "num_cpus"):
        if k in spec:
            v = spec[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v > 1024:
                raise SpecLensError(f"{k}: expected a number >= 0, got {v!r}"[:200])
            out[k] = float(v)
    if "max_attempts" in spec:
        v = spec["max_attempts"]
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 10:
            raise SpecLensError(f"max_attempts: expected an integer 1..10, got {v!r}"[:200])
        out["max_attempts"] = v
    return out


def validate(spec: Any, base: Path | str | None = None) -> list[dict]:
    """Check a spec and return its jobs: [{kind: capture|bench, name, settings, num_gpus, num_cpus, max_attempts,
    sweep}]; a sweep gives one bench job per combination. Raises SpecLensError with a one-line message."""
    base = Path(base) if base is not None else REPO_ROOT
    if not isinstance(spec, dict):
        raise SpecLensError("a job spec is a mapping with a 'kind' (capture, bench, sweep or load)")
    kind = spec.get("kind")
    if kind not in KINDS:
        raise SpecLensError(f"kind: {kind!r} is not one of {', '.join(KINDS)}")
    if kind == "load":
        return _load_jobs(spec, base)
    fields = CAPTURE if kind == "capture" else BENCH
    allowed = COMMON | set(fields) | (set(SWEEP_LISTS) if kind == "sweep" else set())
    unknown = sorted(set(map(str, spec)) - allowed)
    if unknown:
        raise SpecLensError(f"{unknown[0]}: unknown field for a {kind} job "
                            f"(known: {', '.join(sorted(allowed - {'kind'}))})")
    for k in REQUIRED[kind]:
        if spec.get(k) in (None, ""):
            raise SpecLensError(f"{k}: required for a {kind} job")
    name = spec.get("name")
    if name is not None and (not isinstance(name, str) or not valid_run_id(name) or len(name) > 96):
        raise SpecLensError(f"name: {name!r} is not a valid run name; use letters, digits, '.', '_' or '-' "
                            "(at most 96)"[:200])
    settings = {k: v for k, v in spec.items()
                if k in fields and v is not None and not (kind == "sweep" and k in SWEEP_LISTS)}
    _check(kind, settings)                         # types and values, before any path is resolved
    settings = {k: float(v) if fields[k] is float else v for k, v in settings.items()}   # stored as the model holds
    roots, iroots = model_roots(), input_roots()
    for k in MODEL_FIELDS:
        if k in settings:
            settings[k] = confine(settings[k], k, roots, base)
    settings["prompts"] = confine(settings["prompts"], "prompts", iroots, base)
    res = _resources(spec, settings)
    if kind != "sweep":
        return [{"kind": kind, "name": name, "settings": settings, "sweep": None, **res}]

    axes: dict[str, list] = {}
    for key, field in SWEEP_LISTS.items():
        if key not in spec:
            continue
        vals = spec[key] if isinstance(spec[key], list) else [spec[key]]
        if not vals:
            raise SpecLensError(f"{key}: an empty list sweeps nothing")
        for v in vals:                             # each value's type, named by the list it came from
            try:
                _check("sweep", {**settings, field: v})
            except SpecLensError as e:
                if str(e).startswith(f"{field}: expected "):
                    raise SpecLensError(key + str(e)[len(field):]) from None
        vals = [float(v) if BENCH[field] is float else v for v in vals]
        if field == "drafter":
            vals = [confine(v, "drafters", roots, base) for v in vals]
        axes[field] = vals
    if "drafter" in settings and "drafter" in axes:
        raise SpecLensError("drafter: give either drafter or drafters in a sweep, not both")
    combos = list(itertools.product(*axes.values())) if axes else [()]
    if len(combos) > MAX_SWEEP:
        raise SpecLensError(f"sweep: {len(combos)} jobs is more than {MAX_SWEEP}; split the sweep")
    jobs = []
    for i, combo in enumerate(combos):
        s = {**settings, **dict(zip(axes, combo))}
        _check("sweep", s, f"sweep job {i}: ")
        tag = "".join(f"-{_short(f, v, axes[f])}" for f, v in zip(axes, combo) if len(axes[f]) > 1)
        jobs.append({"kind": "bench", "name": f"{i:02d}{tag}", "settings": s, "sweep": name or "", **res})
    return jobs


def _short(field: str, v: Any, vals: list) -> str:
    if field == "drafter":
        return f"d{vals.index(v)}"
    prefix = {"num_spec_tokens": "k", "temperature": "t", "batch_size": "b"}[field]
    return f"{prefix}{v:g}" if isinstance(v, float) else f"{prefix}{v}"


def _load_jobs(spec: dict, base: Path) -> list[dict]:
    """A serving-load bench or sweep (backend.settings.LoadSettings, whose fields are the spec's): one job, or with
    `split: true` one job per drafter configuration (K, synthetic tau), so that a Ray cluster of several GPUs runs the
    configurations side by side, each against its own paired baseline server."""
    from pydantic import ValidationError

    from backend.settings import LoadSettings

    extra = {"split"}
    fields = {k: v for k, v in spec.items() if k not in COMMON | extra}
    name = spec.get("name")
    if name is not None and (not isinstance(name, str) or not valid_run_id(name) or len(name) > 80):
        raise SpecLensError(f"name: {name!r} is not a valid run name; use letters, digits, '.', '_' or '-' "
                            "(at most 80)"[:200])
    try:
        st = LoadSettings.model_validate(fields)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise SpecLensError(f"{where}: {err['msg']}"[:200]) from None
    roots, iroots = model_roots(), input_roots()
    upd = {"target": confine(st.target, "target", roots, base), "prompts": confine(st.prompts, "prompts", iroots, base)}
    if st.drafter:
        upd["drafter"] = confine(st.drafter, "drafter", roots, base)
    for url in (st.server_url, st.baseline_url):
        if url is not None and not (url.startswith(("http://", "https://")) and len(url) < 512):
            raise SpecLensError("server_url: expected an http(s):// URL of a running vLLM or SGLang server")
    st = st.model_copy(update=upd)
    res = _resources(spec, {"engine": st.engine, "server_url": st.server_url})
    configs = st.configs() if spec.get("split") is True else [None]
    jobs = []
    for cfg in configs:
        one = st if cfg is None else st.model_copy(update={"num_spec_tokens": [cfg.k], "synthetic_tau":
                                                           None if cfg.synthetic_tau is None else [cfg.synthetic_tau]})
        if cfg is None:
            jobs.append({"kind": "load", "name": name, "settings": one.model_dump(mode="json"), "sweep": None, **res})
        else:            # job id (and run name) <name or a fresh id>-K-4[-tau-2.5]
            tag = "".join(c if c.isalnum() or c == "." else "-" for c in cfg.label.replace("*=", "-").replace("=", "-"))
            jobs.append({"kind": "load", "name": tag.replace(" ", "-"), "settings": one.model_dump(mode="json"),
                         "sweep": name or "", **res})
    return jobs


def settings_object(job: dict):
    """The CaptureSettings or BenchSettings of a job (the objects `python -m backend capture|bench` build)."""
    s = dict(job["settings"])
    s.pop("batch_size", None)
    if job["kind"] == "load":
        from backend.settings import LoadSettings
        return LoadSettings.model_validate(s)
    if job["kind"] == "capture":
        s.pop("tensor_parallel_size", None)
        s.pop("engine_options", None)
        return CaptureSettings(**s)
    return BenchSettings(**s)


_SKIP = {"runs", "queue", "alignments", ".git", "__pycache__", "node_modules", ".venv"}


def discover_models(roots: list[Path] | None = None, depth: int = 3, cap: int = 200) -> list[str]:
    """Directories holding a config.json under the model roots (depth-limited; run and queue folders skipped)."""
    out: list[str] = []

    def walk(d: Path, left: int) -> None:
        if len(out) >= cap or left < 0:
            return
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            return
        if any(e.name == "config.json" and e.is_file() for e in entries):
            out.append(str(d))
            return
        for e in entries:
            if e.is_dir(follow_symlinks=False) and e.name not in _SKIP and not e.name.startswith("."):
                walk(Path(e.path), left - 1)

    for r in roots if roots is not None else model_roots():
        walk(r, depth)
    return out


def discover_prompts(roots: list[Path] | None = None, depth: int = 3, cap: int = 200) -> list[str]:
    """Prompt files (*.jsonl, *.txt) under the input roots (depth-limited)."""
    out: list[str] = []
    for r in roots if roots is not None else input_roots():
        stack = [(r, depth)]
        while stack and len(out) < cap:
            d, left = stack.pop()
            try:
                entries = sorted(os.scandir(d), key=lambda e: e.name, reverse=True)
            except OSError:
                continue
            for e in entries:
                if e.is_file() and e.name.endswith((".jsonl", ".txt")) and e.name not in ("journal.jsonl",):
                    out.append(e.path)
                elif (left > 0 and e.is_dir(follow_symlinks=False) and e.name not in _SKIP
                      and not e.name.startswith(".")):
                    stack.append((Path(e.path), left - 1))
    return sorted(dict.fromkeys(out))[:cap]
