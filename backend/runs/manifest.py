"""The manifest's one schema (manifest.json, docs/SCHEMA.md), for reading and for writing.

- `StoredManifest`: a stored manifest.json as every reader sees it (`RunDir.read()`, `Run.read()`): the keys the
  code reads, typed, in typed sections (`model`, `headline`, `progress`, `bench` with its `speedup`, `drafter`,
  `aux`, `source`, `job`, `check`, a load run's `load`, a watch's `watch`); every key optional (a failed or older
  run lacks some), unknown keys kept as they are (`extra="allow"`), and `to_json()` gives back exactly the keys that
  were read, so a read-modify-write changes only what it changes. `settings` is typed by the run's kind (a stored
  view of that kind's settings model, backend/settings.py: `StoredCaptureSettings`, `StoredImportSettings` for an
  imported capture, `StoredBenchSettings`, `StoredCheckSettings`, `StoredLoadSettings`, `StoredWatchSettings`; a load
  run's `identity` too), every key optional and unknown keys kept like any section; a resume compares the stored
  view whole with the one of its settings model's `identity()` (`StoredSettings.identity_of`): equal exactly when
  the two dicts are.
- `check_stored`: the check the catalog runs on every manifest.json it reads (backend/store/validate.py), so that
  one bad run directory is quarantined with a one-line reason naming the key instead of breaking a refresh or a
  page: a status, then `StoredManifest`'s own validation (text is text, an object an object, integers fit a BIGINT,
  numbers are numbers).
- `Manifest`: what every kind of run records about itself when it is created (`backend.runs.lifecycle.Run.create`):
  the stored schema with the keys a new run must have (kind, engine, model, progress) and non-negative sizes, so
  that a run with a malformed manifest is refused at its start instead of quarantined by the catalog later."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, NoReturn, Protocol, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeInt,
    PlainValidator,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
)

from backend.errors import SpecLensError

KINDS = ("capture", "bench", "check", "load", "watch")
STATUSES = ("running", "complete", "failed", "interrupted")
_INT64 = 2**63 - 1


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


# ---------------------------------------------------------------------------- the value types of a stored manifest
# Each keeps the value exactly as read (no coercion: what is read is what is written back) or gives the reason, as
# the end of a one-line sentence that starts "manifest key '<dotted key>'".

def _bad(reason: str) -> NoReturn:
    raise ValueError(reason)


def _shown(v) -> str:
    return repr(str(v)[:40])


def _text(v):
    if v is None or isinstance(v, str):
        return v
    _bad(f"is a {json_type(v)}, not text")


def _int(v):
    if v is None or is_int64(v):
        return v
    _bad(f"= {_shown(v)} is not an integer that fits 64 bits")


def _number(v):
    if v is None or _is_number(v):
        return v
    _bad(f"= {_shown(v)} is not a number")


def _flag(v):
    if v is None or isinstance(v, bool):
        return v
    _bad(f"is a {json_type(v)}, not true/false")


def _texts(v):
    if v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v)):
        return v
    _bad("is not a list of text")


def _object(v):
    if v is None or isinstance(v, dict):
        return v
    _bad(f"is a {json_type(v)}, not an object")


def _ints(v):
    if v is None or (isinstance(v, list) and all(is_int64(x) for x in v)):
        return v
    _bad("is not a list of integers")


def _numbers(v):
    if v is None or (isinstance(v, list) and all(_is_number(x) for x in v)):
        return v
    _bad("is not a list of numbers")


def _counts(v):
    if v is None or (isinstance(v, dict) and all(is_int64(x) for x in v.values())):
        return v
    _bad("is not an object of integer token counts")


def _status(v):
    if v is None or (isinstance(v, str) and v in STATUSES):
        return v
    _bad(f"= {v!r:.40} is not one of {', '.join(STATUSES)}")


Text = Annotated[str | None, PlainValidator(_text)]
Int = Annotated[int | float | None, PlainValidator(_int)]          # an integer (also written 3.0) that fits 64 bits
Number = Annotated[int | float | None, PlainValidator(_number)]     # any JSON number (NaN and inf too)
Flag = Annotated[bool | None, PlainValidator(_flag)]
Texts = Annotated[list[str] | None, PlainValidator(_texts)]
Ints = Annotated[list[int] | None, PlainValidator(_ints)]
Numbers = Annotated[list[int | float] | None, PlainValidator(_numbers)]
Object = Annotated[dict | None, PlainValidator(_object)]
Counts = Annotated[dict[str, int] | None, PlainValidator(_counts)]
Status = Annotated[Literal[STATUSES] | None, PlainValidator(_status)]  # type: ignore[valid-type]


class Section(BaseModel):
    """A typed object of the manifest: the keys SpecLens reads, unknown keys kept."""

    model_config = ConfigDict(extra="allow")

    def to_json(self) -> dict:
        """The keys as read (no defaults added), values unchanged."""
        return self.model_dump(exclude_unset=True)


def section_json(section: Section | None) -> dict | None:
    """A section's dict as read, or None (for a result that carries a run's figures on, e.g. a job's)."""
    return section.to_json() if section is not None else None


# ---------------------------------------------------------------------------- sections

class ModelInfo(Section):
    """The target the run used."""

    path: Text = None
    name: Text = None                  # an import's verifier, where the target's path is not known
    model_type: Text = None
    n_layers: Int = None
    hidden_size: Int = None
    vocab_size: Int = None
    fingerprint: Text = None           # backend/model_id.py


class Progress(Section):
    done: Int = None
    total: Int = None


class Headline(Section):
    """What a finished run reports first: tokens and prompts it saw, the raw sample's size, NaN/inf tokens per
    boundary."""

    tokens: Int = None
    prompts: Int = None
    sample_tokens: Int = None
    nonfinite: Counts = None
    seconds: Number = None
    windows: Int = None                # a watch: the windows it scraped


class Speedup(Section):
    """A drafter bench's speedup over its paired baseline (metrics.speedup)."""

    mean: Number = None
    std: Number = None
    ci_low: Number = None
    ci_high: Number = None


class SpeedNoise(Section):
    """Why a bench's speed figures are no verdict (plain decoding drifted, load, another SpecLens process)."""

    reason: Text = None
    moment_ttft_ratio: Object = None   # the bench compared its prefill with its baseline's already


class Bench(Section):
    """A bench run's figures (backend/bench.py)."""

    tau: Number = None
    acceptance_rate: Number = None
    tokens_per_s: Number = None
    throughput: Number = None
    ttft: Number = None
    tpot: Number = None
    mismatched_prompts: Number = None
    speedup: Speedup | None = None
    lossless: Flag = None
    pairing: Text = None
    speed_noise: SpeedNoise | None = None
    load: Object = None                # the machine's load while it ran (backend/bench.py load_summary)


class DrafterInfo(Section):
    """The drafter a bench or check ran."""

    path: Text = None
    fingerprint: Text = None
    weights_fingerprint: Text = None   # backend/model_id.py: the weights alone (absent in manifests written before)
    format: Text = None


def _drafter_shape(v):
    """A drafter is a section or its path as text (older manifests)."""
    return v if isinstance(v, str) else _object(v)


class Aux(Section):
    """What a drafter bench fed its drafter: the boundaries and whose reading they follow (backend/drafter/aux.py),
    the ids that reading found and where, and what the running engine reported."""

    boundaries: Texts = None
    producer: Text = None
    version: Text = None
    runner: Text = None
    ids: Ints = None                   # the aux layer ids read (None: the engine's default)
    ids_from: Text = None              # where they were read from, in words
    runner_reason: Text = None         # vLLM: why this runner (backend/vllm_runner.py)
    predicted: Texts = None            # the boundaries predicted from the config, when the engine reported its own
    engine_ids: Ints = None            # the ids the running engine reported
    warning: Text = None               # the engine fed other boundaries than the config predicts


class Source(Section):
    """Where an imported capture came from (backend/importers.py)."""

    path: Text = None
    producer: Text = None
    version: Text = None               # the producer releases whose convention the import read
    format: Text = None


class JobTag(Section):
    """The job a run was made by (backend/jobs)."""

    id: Text = None
    kind: Text = None


class CheckInfo(Section):
    """A drafter check's verdict (backend/check_drafter.py)."""

    best: Texts = None                 # the boundaries the drafter was trained on (None: not found)
    mode: Text = None                  # "lint" or "full"
    severity: Text = None
    engine: Text = None                # the release checked: engine, version, vLLM runner
    engine_version: Text = None
    runner: Text = None
    feeds: Texts = None                # what that release feeds the drafter


class LoadInfo(Section):
    """A serving-load run's counts and verdicts (backend/load_bench.py; its summary.json holds the rest)."""

    levels: Int = None
    requests: Int = None
    tokens: Int = None
    best: Object = None
    stops_paying: Object = None


class WatchInfo(Section):
    """A watch of a live server (backend/watch.py): where it scraped, its verdict so far, what stopped it."""

    server_url: Text = None
    metrics_url: Text = None
    verdict: Object = None             # backend/watch.py Tracker.verdict: state, tau, drafts, windows, exit_code, ...
    stopped_by: Text = None            # "windows", "duration", "signal"


# ---------------------------------------------------------------------------- settings, typed by the run's kind
# What each kind records under `settings` (and a load run under `identity`): a stored view of its settings model
# (backend/settings.py), not the model itself: every key optional (older runs lack some), unknown keys kept, values
# as written (no coercion), so an old manifest still reads and `to_json()` gives back what was read.

class _Identified(Protocol):
    def identity(self) -> dict: ...


_S = TypeVar("_S", bound="StoredSettings")


class StoredSettings(Section):
    """A run's `settings` as stored; this class itself where the kind is unknown (its keys are kept, none typed).
    Two are equal when they are of one kind and their dicts are (`to_json()`): what a resume compares."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoredSettings):
            return NotImplemented
        return type(self) is type(other) and self.to_json() == other.to_json()

    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def identity_of(cls: type[_S], settings: _Identified) -> _S:
        """The stored view of a settings model's `identity()`: what a run of these settings records, and what a
        resume of it must find."""
        return cls.model_validate(settings.identity())


class PromptedSettings(StoredSettings):
    """Settings of a run that read a prompts file (a capture, a bench, a drafter check, a load run)."""

    prompts: Text = None


class StoredCaptureSettings(PromptedSettings):
    """A capture's (backend/settings.py `CaptureSettings.identity()`: its fields but device and checkpoint_every)."""

    model: Text = None
    engine: Text = None
    limit: Int = None
    dtype: Text = None
    boundaries: Texts = None           # None: every boundary
    sample_tokens: Int = None
    sample_per_prompt: Int = None
    max_prompt_tokens: Int = None
    chat_template: Flag = None
    exact_sums: Flag = None            # present only when on (order-free statistics sums)


class StoredImportSettings(StoredSettings):
    """An imported capture's (engine `import:<format>`, backend/importers.py): what the import read."""

    path: Text = None
    format: Text = None
    producer_ids: Ints = None
    num_layers: Int = None
    drafter_config: Text = None
    model: Text = None
    sample_tokens: Int = None
    sample_per_prompt: Int = None


class StoredBenchSettings(PromptedSettings):
    """A bench's (`BenchSettings.identity()`: paths absolute; the engine fields only where not the HF defaults; the
    drafter-only fields only for a drafter run)."""

    target: Text = None
    drafter: Text = None
    num_spec_tokens: Int = None
    temperature: Number = None
    repeats: Int = None
    limit: Int = None
    max_new_tokens: Int = None
    device: Text = None
    dtype: Text = None
    seed: Int = None
    chat_template: Flag = None
    max_prompt_tokens: Int = None
    producer: Text = None
    producer_version: Text = None
    runner: Text = None
    draft_sampling: Text = None
    warmup: Int = None
    engine: Text = None
    server_url: Text = None
    tensor_parallel_size: Int = None
    engine_options: Object = None


class StoredCheckSettings(PromptedSettings):
    """A drafter check's (`CheckSettings`, every field)."""

    drafter: Text = None
    target: Text = None
    engine: Text = None
    engine_version: Text = None
    runner: Text = None
    engine_options: Object = None
    lint_only: Flag = None
    num_prompts: Int = None
    new_tokens: Int = None
    max_prompt_tokens: Int = None
    num_spec_tokens: Int = None
    chat_template: Flag = None
    search: Flag = None
    device: Text = None
    dtype: Text = None
    threads: Int = None
    training_data: Text = None
    training_format: Text = None
    producer_ids: Ints = None
    training_files: Int = None
    trained_on: Texts = None


class StoredLoadSettings(PromptedSettings):
    """A serving-load run's (`LoadSettings`: every field under `settings`; its `identity()`, without the servers'
    URLs, under `identity`)."""

    engine: Text = None
    target: Text = None
    drafter: Text = None
    num_spec_tokens: Ints = None
    synthetic_tau: Numbers = None
    concurrency: Ints = None
    requests: Int = None
    max_tokens: Int = None
    repeats: Int = None
    temperature: Number = None
    limit: Int = None
    chat_template: Flag = None
    max_prompt_tokens: Int = None
    server_url: Text = None
    baseline_url: Text = None
    dtype: Text = None
    memory: Number = None
    load_format: Text = None
    topk: Int = None
    draft_tokens: Int = None
    engine_options: Object = None
    start_together: Flag = None


class StoredWatchSettings(StoredSettings):
    """A watch's (`WatchSettings`, every field)."""

    server_url: Text = None
    interval: Number = None
    duration: Number = None
    windows: Int = None
    min_tau: Number = None
    engine: Text = None
    baseline_windows: Int = None
    min_drafts: Int = None
    level: Number = None
    confirm: Int = None
    max_missed: Int = None
    timeout: Number = None


SETTINGS_OF_KIND: dict[str, type[StoredSettings]] = {
    "capture": StoredCaptureSettings, "bench": StoredBenchSettings, "check": StoredCheckSettings,
    "load": StoredLoadSettings, "watch": StoredWatchSettings}


def settings_class(kind: str | None, engine: str | None) -> type[StoredSettings]:
    """The stored settings view of a run of this kind and engine (an import's engine is `import:<format>`)."""
    if kind == "capture" and isinstance(engine, str) and engine.startswith("import:"):
        return StoredImportSettings
    return SETTINGS_OF_KIND.get(kind or "", StoredSettings)


def _typed_settings(v: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo):
    """`settings` (and `identity`) as its kind's stored view; the kind and engine are validated before it."""
    if isinstance(v, dict):
        return settings_class(info.data.get("kind"), info.data.get("engine")).model_validate(v)
    return handler(v)


# ---------------------------------------------------------------------------- the manifest

class StoredManifest(Section):
    """A run's manifest.json as read back (every key optional, unknown keys kept)."""

    run_id: Text = None
    status: Status = None
    kind: Text = None
    engine: Text = None
    engine_version: Text = None
    dtype: Text = None
    device: Text = None
    dataset: Text = None
    created: Text = None
    updated: Text = None
    finished: Text = None
    error: Text = None
    host: Text = None
    pid: Int = None
    baseline_run: Text = None
    pairing: Text = None
    notes: Text = None
    model: ModelInfo | None = None
    headline: Headline | None = None
    progress: Progress | None = None
    bench: Bench | None = None
    drafter: Annotated[DrafterInfo | str | None, BeforeValidator(_drafter_shape)] = None
    aux: Aux | None = None
    source: Source | None = None
    job: JobTag | None = None
    check: CheckInfo | None = None
    load: LoadInfo | None = None
    watch: WatchInfo | None = None
    settings: SerializeAsAny[StoredSettings] | None = None    # typed by kind (`settings_class`)
    identity: SerializeAsAny[StoredSettings] | None = None    # a load run's settings that decide a resume (load_bench)
    boundaries: Texts = None
    tags: Texts = None
    num_spec_tokens: Int = None
    temperature: Number = None
    repeats: Int = None

    _settings = field_validator("settings", "identity", mode="wrap")(_typed_settings)

    @classmethod
    def parse(cls, raw) -> StoredManifest:
        """The typed manifest of a parsed manifest.json; SpecLensError with the one-line reason (`check_stored`)
        when it is not one."""
        if isinstance(raw, StoredManifest):
            return raw
        if not isinstance(raw, dict):
            raise SpecLensError(f"manifest is a JSON {json_type(raw)}, not an object")
        try:
            return cls.model_validate(raw)
        except ValidationError as e:
            raise SpecLensError(_reason(e)) from None

    @classmethod
    def indexed(cls, raw: dict | StoredManifest | None) -> StoredManifest:
        """A manifest as the catalog hands it on (`catalog.read.run_manifests`, a runs row's `manifest`): checked
        when it was indexed; a run the catalog could not index (`{}`), or one indexed before a key's type was
        checked, reads as a manifest without keys."""
        try:
            return cls.parse(raw if raw is not None else {})
        except SpecLensError:
            return cls()

    @classmethod
    def checked(cls, raw) -> StoredManifest:
        """`parse`, and the run has a known status: what the catalog indexes."""
        if isinstance(raw, dict) and raw.get("status") not in STATUSES:
            raise SpecLensError(f"manifest key 'status' = {raw.get('status')!r:.40} is not one of "
                                f"{', '.join(STATUSES)}")
        return cls.parse(raw)

    @staticmethod
    def raw_value(raw: dict, dotted: str):
        """One key of a manifest as stored, untyped (`"aux.producer"`): what a page over 10,000 runs reads before it
        types the few manifests that need it; None where a section is missing or not an object."""
        for key in dotted.split("."):
            if not isinstance(raw, dict):
                return None
            raw = raw.get(key)
        return raw

    @property
    def drafter_info(self) -> DrafterInfo | None:
        """The drafter section (None when there is none, or only a path as text)."""
        return self.drafter if isinstance(self.drafter, DrafterInfo) else None

    def settings_as(self, cls: type[_S]) -> _S:
        """The settings as this kind's view (`m.settings_as(StoredLoadSettings).concurrency`); an empty view where
        the run has none or is of another kind."""
        return self.settings if isinstance(self.settings, cls) else cls()


_UNION_TAGS = {"DrafterInfo"}          # where a key may hold one of two types, pydantic names the one it tried


def _reason(e: ValidationError) -> str:
    """'manifest key '<dotted key>' <why>' for a validation's first error."""
    err = e.errors()[0]
    key = ".".join(str(p) for p in err["loc"] if p not in _UNION_TAGS)
    if err["type"] == "value_error":                  # one of the value types above
        why = str(err["ctx"]["error"])
    elif err["type"] in ("model_type", "model_attributes_type", "dict_type"):
        why = f"is a {json_type(err.get('input'))}, not an object"
    else:
        why = f"is not valid ({err['msg']})"
    return f"manifest key '{key}' {why}"


def check_stored(m) -> str | None:
    """Why this parsed manifest.json cannot be indexed (not an object, no known status, a key of the wrong type, an
    integer beyond 64 bits), or None: the check the catalog runs on what it reads (backend/store/validate.py
    `check_manifest`), by `StoredManifest`'s own validation."""
    try:
        StoredManifest.checked(m)
    except SpecLensError as e:
        return str(e)
    return None


# ---------------------------------------------------------------------------- creating a run

class NewModelInfo(ModelInfo):
    """The target as a new run records it: its path (None: not known) and non-negative sizes."""

    path: str | None
    n_layers: NonNegativeInt | None = None
    hidden_size: NonNegativeInt | None = None
    vocab_size: NonNegativeInt | None = None


class NewProgress(Progress):
    model_config = ConfigDict(extra="forbid")

    done: NonNegativeInt
    total: NonNegativeInt


class Manifest(StoredManifest):
    """What a run records when it is created; fields added later (status, headline, bench figures, error) are
    written by the run's lifecycle."""

    kind: Literal[KINDS]  # type: ignore[valid-type]
    engine: str
    model: NewModelInfo
    boundaries: list[str] = Field(default_factory=list)
    settings: SerializeAsAny[StoredSettings] = Field(default_factory=StoredSettings)
    progress: NewProgress

    @classmethod
    def of(cls, fields: dict, run_id: str) -> Manifest:
        """The typed manifest of a new run from its fields; SpecLensError (one line naming the field) when they do not
        make one: a bug of the code that builds them, refused before anything is written."""
        try:
            return cls.model_validate(fields)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise SpecLensError(f"run '{run_id}': manifest field '{where}': {err['msg']}; "
                                f"this is a SpecLens bug, report it with the command you ran") from None

    def with_job(self, job: dict) -> Manifest:
        """The same manifest recording the job that made the run (backend/runs/lifecycle.py `tagged_runs`)."""
        return self.model_copy(update={"job": JobTag.model_validate(job)})

    def to_json(self) -> dict:
        """The fields as given (no defaults added), for manifest.json."""
        return self.model_dump(mode="json", exclude_unset=True)
