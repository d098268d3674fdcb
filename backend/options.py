"""The names and defaults that options, job specs, settings models and engines share, each defined here once.

- `ENGINES`: the one engine registry (name -> the adapter module, imported lazily by backend/engines/base.py
  `adapter`); `ENGINE_NAMES` and `SERVING_ENGINES` (the engines with their own server, counters and id conventions)
  derive from it. Adding an engine is its module plus one line here (docs/ARCHITECTURE.md "Where to add").
- `RUNNERS`: the vLLM model runners whose id reading SpecLens applies (backend/vllm_runner.py decides `auto`).
- `ENGINE_LABELS` (how pages and reports name each engine), `RUNNER_ENGINE` (the engine whose model runner decides
  what it reads) and `ENGINE_READINGS` (the engine and runner of each reading the lint reports), derived from them.
- `DTYPES`, `DEFAULT_K` (draft tokens per step for benches and engines), `DRAFT_SAMPLING`.

This module sits in the base layer (it imports nothing of backend/ but vllm_runner), so the engines, the settings
models and the CLI below and above it all read the same lists; it imports only the standard library and `packaging`,
so the GPU scripts (gpu/) and tools import it too. tests/test_settings.py checks that no second literal list of engine
names or runner values, and no second K default, appears in backend/, dashboard/, pages/, gpu/, tools/ or bench/.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from backend.errors import SpecLensError
from backend.vllm_runner import RUNNERS

# the one registry: engine name -> adapter module (vLLM and SGLang live on the GPU node, so imported only when used)
ENGINES = {"hf": "backend.engines.hf", "vllm": "backend.engines.vllm", "sglang": "backend.engines.sglang"}
IN_PROCESS_ENGINE = "hf"                                  # the reference engine: in this process, any device
ENGINE_NAMES = tuple(ENGINES)
SERVING_ENGINES = tuple(e for e in ENGINES if e != IN_PROCESS_ENGINE)
ENGINE_LABELS = {"hf": "HF", "vllm": "vLLM", "sglang": "SGLang"}    # how the pages and reports name each engine
RUNNER_ENGINE = "vllm"                                    # the engine whose model runner decides what it reads


def engine_label(engine: str | None, unknown: str = "?") -> str:
    """How the pages and reports name a serving engine (ENGINE_LABELS: "vLLM", "SGLang"); any other name, the
    reference engine "hf" included, as it is written (the drafter and run pages have always shown it so), and
    `unknown` when there is none."""
    if engine in SERVING_ENGINES:
        return ENGINE_LABELS[engine]
    return engine or unknown


DTYPES = ("fp32", "bf16")
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}     # the engines' (and torch's) names of DTYPES
DEFAULT_K = 4                                              # K draft tokens per step (vLLM num_speculative_tokens)
CHECK_K = 3                                                # draft steps check-drafter scores by default
DRAFT_SAMPLING = ("sample", "argmax")                      # T > 0: draft from q (Leviathan) or argmax (vLLM V1)
VLLM_RUNNERS = tuple(sorted(r for r in RUNNERS if r != "auto"))   # what `auto` resolves to: v1, v2
# (engine, runner) of each reading of a drafter's ids the lint reports: each vLLM runner (the newest first), then
# every other serving engine's one reading (no runner)
ENGINE_READINGS = tuple((e, r) for e in SERVING_ENGINES
                        for r in (tuple(reversed(VLLM_RUNNERS)) if e == RUNNER_ENGINE else (None,)))

__all__ = ["CHECK_K", "DEFAULT_K", "DRAFT_SAMPLING", "DTYPES", "ENGINES", "ENGINE_LABELS", "ENGINE_NAMES",
           "ENGINE_READINGS", "IN_PROCESS_ENGINE", "RUNNERS", "RUNNER_ENGINE", "SERVING_ENGINES", "TORCH_DTYPES",
           "VLLM_RUNNERS", "add_options", "build", "check_fields", "engine_label", "field_choices", "field_minimums",
           "field_types", "from_args", "option", "parse_engine_options", "required_fields", "settings_fields"]


# ---------------------------------------------------------------------------- options derived from settings fields

def option(default: Any = MISSING, *, help: str | None = None, choices: tuple | None = None, cli: bool = True,
           job: bool = True, flag: str | None = None, parse: Callable[[Any], Any] | None = None,
           default_factory: Any = MISSING, cli_default: Any = MISSING, minimum: float | None = None,
           **argparse_kw: Any) -> Any:
    """A settings field (a dataclass field) with what its command-line option says: `help`, `choices` (else from a
    Literal annotation), `flag` (default --field-name; a bool field that defaults to True becomes --no-field-name),
    `parse` (the option's text -> the field's value, for list and dict fields), `cli_default` (the option's default
    where it differs from the field's), `minimum` (the least value a job spec may give), any other argparse keyword
    (`action`, `metavar`). `cli=False`: no option;
    `job=False`: not a job-spec field (backend/jobs/spec.py)."""
    md = {"help": help, "choices": choices, "cli": cli, "job": job, "flag": flag, "parse": parse, "minimum": minimum,
          "argparse": argparse_kw}
    if cli_default is not MISSING:
        argparse_kw["default"] = cli_default
    kw: dict[str, Any] = {"metadata": {"option": md}}
    if default is not MISSING:
        kw["default"] = default
    if default_factory is not MISSING:
        kw["default_factory"] = default_factory
    return field(**kw)


def model_option(default: Any = MISSING, *, default_factory: Any = MISSING, **kw: Any) -> Any:
    """`option` for a field of a pydantic BaseModel settings class (LoadSettings): the same keywords, kept where
    `settings_fields` finds them (the field's json_schema_extra)."""
    from pydantic import Field

    md = option(**kw).metadata["option"]
    extra = {"json_schema_extra": {"option": md}}
    if default_factory is not MISSING:
        return Field(default_factory=default_factory, **extra)
    return Field(default, **extra) if default is not MISSING else Field(**extra)


@dataclass
class _ModelField:
    """A pydantic model field seen as a dataclass field (name, default, default_factory, metadata)."""

    name: str
    default: Any
    default_factory: Any
    metadata: dict


def _fields_of(cls: type) -> list[Any]:
    """The fields of a settings class: a (pydantic) dataclass's, or a pydantic BaseModel's as `_ModelField`s."""
    if hasattr(cls, "model_fields"):
        out = []
        for name, fi in cls.model_fields.items():
            extra = fi.json_schema_extra if isinstance(fi.json_schema_extra, dict) else {}
            no_default = fi.is_required() or fi.default_factory is not None
            out.append(_ModelField(name, MISSING if no_default else fi.default,
                                   fi.default_factory if fi.default_factory is not None else MISSING,
                                   {"option": extra["option"]} if "option" in extra else {}))
        return out
    return list(fields(cls))


def parse_engine_options(items: list[str] | None) -> dict:
    """--engine-option KEY=VALUE (VALUE parsed as JSON when it is JSON: numbers, true/false, lists)."""
    import json

    out = {}
    for it in items or []:
        if "=" not in it:
            raise SpecLensError(f"--engine-option {it}: expected KEY=VALUE, e.g. gpu_memory_utilization=0.5")
        k, v = it.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


def _base_type(t: Any) -> tuple[Any, tuple | None]:
    """(python type, Literal choices or None) of an annotation, Optional removed: int | None -> int, list[str] ->
    list, Literal['a', 'b'] -> (str, ('a', 'b'))."""
    args = [a for a in get_args(t) if a is not type(None)]
    if get_origin(t) in (Union, UnionType) and len(args) == 1:
        return _base_type(args[0])
    if get_origin(t) is Literal:
        return type(args[0]), tuple(args)
    return (get_origin(t) or t), None


def settings_fields(cls: type, *, cli: bool | None = None, job: bool | None = None) -> dict[str, Any]:
    """name -> the field of a settings dataclass, in declaration order (only those on the CLI / in job specs)."""
    out = {}
    for f in _fields_of(cls):
        md = f.metadata.get("option", {})
        if cli is not None and md.get("cli", True) != cli:
            continue
        if job is not None and md.get("job", True) != job:
            continue
        out[f.name] = f
    return out


def field_types(cls: type, *, job: bool | None = True) -> dict[str, type]:
    """name -> python type (Optional removed; list, dict for generics) of a settings dataclass's fields: what a job
    spec of that kind may hold (backend/jobs/spec.py checks the values against it)."""
    hints = get_type_hints(cls)
    return {n: _base_type(hints[n])[0] for n in settings_fields(cls, job=job)}


def required_fields(cls: type) -> tuple[str, ...]:
    """The fields of a settings dataclass without a default (a required option, a required job-spec field)."""
    return tuple(n for n, f in settings_fields(cls).items() if f.default is MISSING and f.default_factory is MISSING)


def field_minimums(cls: type) -> dict[str, float]:
    """name -> the least value of the fields that have one (option(minimum=...))."""
    return {n: f.metadata["option"]["minimum"] for n, f in settings_fields(cls).items()
            if f.metadata.get("option", {}).get("minimum") is not None}


def field_choices(cls: type) -> dict[str, tuple]:
    """name -> allowed values of the fields that have them (a Literal annotation or option(choices=...))."""
    hints, out = get_type_hints(cls), {}
    for n, f in settings_fields(cls).items():
        ch = f.metadata.get("option", {}).get("choices") or _base_type(hints[n])[1]
        if ch:
            out[n] = tuple(ch)
    return out


def _flag(name: str, f: Any, typ: type) -> tuple[str, str]:
    """(--flag, argparse dest) of a field."""
    md = f.metadata.get("option", {})
    if md.get("flag"):
        flag = md["flag"]
    elif typ is bool and f.default is True:
        flag = "--no-" + name.replace("_", "-")
    else:
        flag = "--" + name.replace("_", "-")
    return flag, flag[2:].replace("-", "_")


def add_options(parser: Any, cls: type, skip: tuple[str, ...] = (), only: tuple[str, ...] | None = None,
                defaults: dict[str, Any] | None = None) -> None:
    """Add one option per CLI field of the settings class `cls` to an argparse parser: --field-name, its type,
    default, choices and help from the field (see `option`); a field without a default is a required option.
    `only`: these fields alone; `defaults`: argparse defaults that differ here (`bench`'s --concurrency is None:
    no serving load unless asked)."""
    hints = get_type_hints(cls)
    for name, f in settings_fields(cls, cli=True).items():
        if name in skip or (only is not None and name not in only):
            continue
        md = f.metadata.get("option", {})
        typ, lit = _base_type(hints[name])
        flag, dest = _flag(name, f, typ)
        kw: dict[str, Any] = {}
        if md.get("help"):
            kw["help"] = md["help"]
        if typ is bool:
            kw["action"] = "store_true"
        else:
            if f.default is MISSING and f.default_factory is MISSING:
                kw["required"] = True
            elif f.default is not MISSING and f.default is not None and md.get("parse") is None:
                kw["default"] = f.default
            if typ in (int, float):
                kw["type"] = typ
            ch = md.get("choices") or lit
            if ch:
                kw["choices"] = ch
        kw.update(md.get("argparse") or {})
        if defaults and name in defaults:
            kw["default"] = defaults[name]
        parser.add_argument(flag, dest=dest, **kw)


class FieldError(SpecLensError):
    """A settings field's value out of its choices or below its minimum (`check_fields`): one line naming the field
    (`field`), so that the command line can name its --flag instead (`from_args`)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def check_fields(obj: Any) -> None:
    """The checks a settings model runs on itself after pydantic's type validation (its `__post_init__`): every
    field's `choices` and `minimum` (see `option`). Not a ValueError, so pydantic passes it through as it is."""
    for name, ch in field_choices(type(obj)).items():
        v = getattr(obj, name)
        if v is not None and v not in ch:
            raise FieldError(name, f"{v!r} is not one of {', '.join(map(str, ch))}")
    for name, lo in field_minimums(type(obj)).items():
        v = getattr(obj, name)
        if v is not None and v < lo:
            raise FieldError(name, f"{v} must be >= {lo:g}")


def build(cls: type, values: dict, where: str = "") -> Any:
    """A settings model from a mapping of its fields (a job spec's settings, parsed options), its pydantic
    validation error turned into one line (`where` prefixes it, e.g. "sweep job 3: "). Unknown fields are the
    caller's to refuse (a job spec names the known ones in its message)."""
    from pydantic import ValidationError

    try:
        return cls(**values)
    except ValidationError as e:
        raise SpecLensError(where + _one_line(e)) from None
    except FieldError as e:
        if not where:
            raise
        raise SpecLensError(where + str(e)) from None


def _one_line(e: Any) -> str:
    """The first error of a pydantic ValidationError as `field: message` (a model-level check's message is already
    written that way)."""
    err = e.errors()[0]
    msg = str(err.get("msg", "")).removeprefix("Value error, ")
    loc = ".".join(str(x) for x in err.get("loc", ()))
    if not loc:
        return msg[:300]
    kind, got = str(err.get("type", "")), err.get("input")
    if kind.endswith("_type"):           # a wrong type: name the one wanted, as the job spec's errors always have
        want = {"string": "str", "dataclass": "mapping"}.get(kind.removesuffix("_type"), kind.removesuffix("_type"))
        return f"{loc}: expected {want}, got {type(got).__name__} {got!r}"[:200]
    return f"{loc}: {msg}"[:300]


def from_args(cls: type, a: Any, **given: Any) -> Any:
    """The settings object of parsed options (`add_options`); `given` fields are taken as they are."""
    hints, kw = get_type_hints(cls), {}
    for name, f in settings_fields(cls, cli=True).items():
        if name in given:
            continue
        typ = _base_type(hints[name])[0]
        flag, dest = _flag(name, f, typ)
        if not hasattr(a, dest):
            continue
        v = getattr(a, dest)
        if typ is bool and f.default is True:          # --no-field-name (or its own flag) turns it off
            v = not v
        parse = f.metadata.get("option", {}).get("parse")
        v = parse(v) if parse is not None else v
        if v is None and (f.default_factory is not MISSING or f.default not in (None, MISSING)):
            continue                                   # not given: the model's own default
        kw[name] = v
    try:
        return build(cls, {**kw, **given})
    except SpecLensError as e:           # on the command line, name the option, not the field
        text = str(e)
        for name, f in settings_fields(cls, cli=True).items():
            if text.startswith(name + ": "):
                flag = _flag(name, f, _base_type(hints[name])[0])[0]
                raise SpecLensError(f"{flag} {text[len(name) + 2:]}") from None
        raise
