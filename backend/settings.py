"""The settings of each kind of run, defined once as pydantic models (strict pydantic dataclasses): the fields from
which the command line's options (backend/options.py `add_options`), job-spec validation (backend/jobs/spec.py builds
the model from the spec) and the manifest's settings (each class's `identity`) derive. A field's help, choices,
minimum and CLI spelling are written beside it (`option`); the model checks its own values on construction.

- `CaptureSettings`: `python -m backend capture`, capture jobs; the same for every engine.
- `BenchSettings`: `python -m backend bench`, bench and sweep jobs; `EngineSettings` is what an engine is built from.
- `LoadSettings`: the serving-load bench and sweep (`python -m backend sweep`, `bench --concurrency`, `kind: load`
  jobs), a pydantic BaseModel whose fields carry their options the same way (`model_option`); the watch's and the
  drafter check's are `WatchSettings` and `CheckSettings`.

Base layer: nothing here imports an engine, torch or pandas, so building the command line stays fast.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import asdict, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator
from pydantic.dataclasses import dataclass

from backend.config import REPO_ROOT
from backend.errors import SpecLensError
from backend.options import (
    CHECK_K,
    DEFAULT_K,
    DRAFT_SAMPLING,
    DTYPES,
    ENGINE_NAMES,
    RUNNERS,
    SERVING_ENGINES,
    TORCH_DTYPES,
    check_fields,
    model_option,
    option,
    parse_engine_options,
)

DEFAULT_PROMPTS = REPO_ROOT / "datasets" / "spec_bench" / "question.jsonl"    # the drafter check's prompts
SPEC_ONLY = ("drafter", "num_spec_tokens", "producer", "producer_version", "runner", "draft_sampling")


def _boundaries(text: str | None) -> list[str] | None:
    return text.split(",") if text else None


# Every settings class is a pydantic dataclass: strict types (a job spec's "4" is not K = 4, a bool is not a
# number), then `Checked.__post_init__`: each field's choices and minimum (backend/options.py check_fields) and the
# class's own field checks. backend/options.py `build` turns a failure into one line; argparse options
# (`add_options`), job specs (backend/jobs/spec.py) and manifests (`identity`) all go through these models.
STRICT = ConfigDict(strict=True)


def _path_text(v):
    """A path field given as a Path (callers in Python do) is its text; anything else goes to the strict check."""
    return os.fspath(v) if isinstance(v, os.PathLike) else v


def _device(v: str) -> str:
    if not (v in ("auto", "cpu", "cuda") or (v.startswith("cuda:") and v[5:].isdigit())):
        raise ValueError(f"{v!r} is not auto, cpu, cuda or cuda:N")
    return v


def _server_url(v: str | None) -> str | None:
    if v is not None and not (v.startswith(("http://", "https://")) and len(v) < 512):
        raise ValueError("expected an http(s):// URL of a running vLLM or SGLang server")
    return v


def tensor_parallel(v: int) -> int:
    """GPUs per engine: 1..64 (a bench's setting and a capture job's)."""
    if not 1 <= v <= 64:
        raise ValueError(f"{v} must be 1..64")
    return v


class Checked:
    """Run after pydantic's type validation: choices and minimums of every field (`option(choices=, minimum=)`)."""

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(config=STRICT)
class CaptureSettings(Checked):
    """What a capture is asked for (`python -m backend capture`, a capture job); the same for every engine."""
    model: str = option(help="HF model directory")
    prompts: str = option(help="Spec-Bench style JSONL or a text file (one prompt a line)")
    engine: str = option("hf", choices=ENGINE_NAMES)
    limit: int | None = option(None, minimum=1, help="first N prompts only")
    device: str = option("auto", help="auto, cpu or cuda[:i]")
    dtype: str = option("fp32", choices=DTYPES)
    boundaries: list[str] | None = option(     # None = every boundary S_0..S_N and F
        None, parse=_boundaries, help="comma-separated subset, e.g. S_2,S_4,S_5,S_8 (default: all and F)")
    sample_tokens: int = option(4096, minimum=0, help="raw tokens kept for alignment (default 4096)")
    sample_per_prompt: int = option(512, cli=False)
    max_prompt_tokens: int | None = option(2048, minimum=1)
    chat_template: bool = True
    checkpoint_every: int = option(16, minimum=1, cli=False)
    exact_sums: bool = option(False, help="order-free integer sums: the statistics are the same bit for bit "
                                          "however the engine batches tokens, and after a resume (slower)")

    _paths = field_validator("model", "prompts", mode="before")(_path_text)
    _device = field_validator("device")(_device)

    def identity(self) -> dict:
        """The settings a resumed run must share with the run it resumes (exact sums only when on, so that the
        runs made before the setting existed keep their identity)."""
        d = asdict(self)
        d.pop("checkpoint_every")
        d.pop("device")
        if not d["exact_sums"]:
            d.pop("exact_sums")
        return d


@dataclass(frozen=True, config=STRICT)
class EngineSettings:
    """What a bench's engine is built from (`BenchSettings.engine_settings()` makes one)."""
    target: str
    num_spec_tokens: int
    dtype: str = "fp32"                        # fp32 | bf16 (or an engine's own dtype name)
    tensor_parallel_size: int = 1
    server_url: str | None = None              # a running server instead of one started here
    options: dict = field(default_factory=dict)   # passed through (vllm.LLM keywords, SGLang flags, server_log)

    def engine_dtype(self) -> str:
        return TORCH_DTYPES.get(self.dtype, self.dtype)


@dataclass(config=STRICT)
class BenchSettings(Checked):
    """What a bench runs: `python -m backend bench` options (backend/options.py add_options), job-spec fields
    (backend/jobs/spec.py) and the manifest's settings (`identity`) all derive from these fields."""
    target: str = option(help="target HF model directory")
    prompts: str = option(help="Spec-Bench style JSONL or a text file (one prompt a line)")
    drafter: str | None = option(None, help="EAGLE-3 drafter directory (none: a plain-decoding baseline run)")
    num_spec_tokens: int = option(DEFAULT_K, minimum=1,         # K, vLLM num_speculative_tokens (chain)
                                  help=f"K draft tokens per step (default {DEFAULT_K})")
    temperature: float = option(0.0, help="0 = greedy (default)")
    repeats: int = option(3, minimum=1, help="runs over the prompts (default 3)")
    limit: int | None = option(None, minimum=1, help="first N prompts only")
    max_new_tokens: int = option(64, minimum=1)
    device: str = option("auto", help="auto, cpu or cuda[:i]")
    dtype: str = option("fp32", choices=DTYPES)
    seed: int = 0
    chat_template: bool = True
    max_prompt_tokens: int | None = option(2048, minimum=1, cli=False)
    producer: str = option("vllm", help="whose reading of the drafter's aux layer ids (default vllm)")
    producer_version: str | None = option(
        "0.24.0", cli_default=None, help="that producer's release (default: the one SpecLens was checked against, e.g. "
        "vllm 0.24.0, sglang 0.5.15)")
    runner: str | None = option(None, choices=RUNNERS, help="vLLM model runner whose id reading to apply (default "
                                "auto: the one vLLM picks for the target)")   # None = auto: as vLLM picks
    draft_sampling: str = option("sample", choices=DRAFT_SAMPLING,
                                 help="at T > 0: draft from q (standard) or argmax (vLLM V1)")
    warmup: int = option(1, cli=False, job=False)   # untimed generations before the first unit
    engine: str = option("hf", choices=ENGINE_NAMES)   # hf (reference, any device) | vllm | sglang (GPU node)
    server_url: str | None = option(None, help="vllm/sglang: bench a running server (OpenAI API) instead of starting "
                                    "one")
    tensor_parallel_size: int = option(1, help="vllm/sglang: GPUs per engine")
    engine_options: dict | None = option(         # passed through to the engine (vllm.LLM kwargs, sglang flags)
        None, flag="--engine-option", action="append", metavar="KEY=VALUE",
        parse=lambda v: parse_engine_options(v) or None,
        help="vllm: passed to vllm.LLM (e.g. gpu_memory_utilization=0.5); sglang: a server flag")

    _ENGINE_DEFAULTS = {"engine": "hf", "server_url": None, "tensor_parallel_size": 1, "engine_options": None}

    _paths = field_validator("target", "prompts", "drafter", mode="before")(_path_text)
    _device = field_validator("device")(_device)
    _server_url = field_validator("server_url")(_server_url)

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, v: float) -> float:
        if not 0 <= v <= 100:
            raise ValueError(f"{v} must be >= 0 (0 = greedy)")
        return v

    _tp = field_validator("tensor_parallel_size")(tensor_parallel)

    def identity(self) -> dict:
        """What a resumed (or reused baseline) run must share; paths absolute, spec-only fields dropped
        for a baseline."""
        d = asdict(self)
        for k, v in self._ENGINE_DEFAULTS.items():   # HF runs keep the identity they had before engines existed
            if d.get(k) == v:
                d.pop(k)
        for k in ("target", "prompts", "drafter"):
            if d[k] is not None:
                d[k] = str(Path(d[k]).resolve())
        if self.drafter is None:
            for k in SPEC_ONLY:
                d.pop(k)
        return d

    def baseline(self) -> BenchSettings:
        return dataclasses.replace(self, drafter=None)

    def engine_settings(self):
        """The typed settings a serving engine is built from (`EngineSettings`)."""
        return EngineSettings(target=self.target, num_spec_tokens=self.num_spec_tokens, dtype=self.dtype,
                              tensor_parallel_size=self.tensor_parallel_size, server_url=self.server_url,
                              options=dict(self.engine_options or {}))


@dataclass(config=STRICT)
class WatchSettings(Checked):
    """What `python -m backend watch` records of a live server (backend/watch.py)."""
    server_url: str = option(help="the server, e.g. http://HOST:8000 (its GET /metrics is read)")
    interval: float = option(10.0, help="seconds per window (default 10)")    # seconds between scrapes
    duration: float | None = option(None, help="stop after this many seconds (default: until Ctrl-C)")
    windows: int | None = option(None, help="stop after this many windows")
    min_tau: float | None = option(None, help="exit 1 when tau stays below this (see --confirm)")
    engine: str | None = option(None, choices=SERVING_ENGINES, help="default: told from the metric names")
    baseline_windows: int = option(6, help="windows with enough drafts that form the baseline (default 6)")
    min_drafts: int = option(100, help="a window with fewer drafts is 'too few drafts', not evidence (default 100)")
    level: float = option(0.99, help="one-sided level of the baseline band (default 0.99)")
    confirm: int = option(2, help="windows in a row below the band (or --min-tau) that make the verdict (default 2)")
    max_missed: int = option(3, help="failed scrapes in a row that end the watch (default 3)")
    timeout: float = option(5.0, help="seconds per scrape (default 5)")

    def check(self) -> None:
        if self.interval <= 0:
            raise SpecLensError(f"--interval {self.interval}: must be more than 0 seconds")
        if self.duration is not None and self.duration <= 0:
            raise SpecLensError(f"--duration {self.duration}: must be more than 0 seconds")
        if self.windows is not None and self.windows < 1:
            raise SpecLensError(f"--windows {self.windows}: must be at least 1")
        if self.baseline_windows < 2:
            raise SpecLensError(f"--baseline-windows {self.baseline_windows}: needs at least 2 (the band's spread)")
        if not 0.5 < self.level < 1:
            raise SpecLensError(f"--level {self.level}: a one-sided level between 0.5 and 1, e.g. 0.99")
        if self.confirm < 1 or self.max_missed < 1 or self.min_drafts < 1:
            raise SpecLensError("--confirm, --max-missed and --min-drafts must be at least 1")
        if self.engine is not None and self.engine not in SERVING_ENGINES:
            raise SpecLensError(f"--engine {self.engine}: expected one of {', '.join(SERVING_ENGINES)}")

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _ids(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecLensError(f"--producer-ids '{text}': expected comma-separated integers like 2,16,29") from None


def _labels(text: str | None) -> list[str] | None:
    """--trained-on S_0,S_3,S_5 -> boundary labels in stream order (a one-line error for anything else)."""
    from backend import coords

    if not text:
        return None
    out = [x.strip() for x in text.split(",") if x.strip()]
    try:
        return sorted(out, key=coords.label_index)
    except (SpecLensError, ValueError, KeyError):
        raise SpecLensError(f"--trained-on '{text}': expected boundaries like S_2,S_16,S_29 (S_b = input of layer "
                            "b)") from None


@dataclass(config=STRICT)
class CheckSettings(Checked):
    """What `python -m backend check-drafter` checks (backend/check_drafter.py)."""
    drafter: str = option(help="EAGLE-3 drafter directory (config.json + model.safetensors), or its config file "
                               "with --lint-only")
    target: str = option(help="target HF model directory (with --lint-only: a directory holding config.json, or "
                              "the config file)")
    engine: str = option("vllm", choices=SERVING_ENGINES,              # the engine the verdict is about
                         help="the engine the verdict is about (default vllm)")
    engine_version: str | None = option(            # default: vLLM 0.24.0 / SGLang 0.5.15 (coords.DEFAULT_VERSIONS)
        None, help="default: vLLM 0.24.0, SGLang 0.5.15")
    runner: str = option(                           # vLLM model runner: auto decides as vLLM does (vllm_runner.py)
        "auto", choices=RUNNERS, help="vLLM model runner (default auto: as vLLM picks it from the target's "
        "architectures, the engine options and VLLM_USE_V2_MODEL_RUNNER)")
    engine_options: dict = option(                  # vLLM engine options the runner choice depends on
        default_factory=dict, flag="--engine-option", action="append", cli_default=[], metavar="KEY=VALUE",
        parse=parse_engine_options,
        help="a vLLM engine option the runner choice depends on (pipeline_parallel_size=2, enable_dbo=true, "
             "compilation_config='{\"mode\": 1}', ...); repeatable")
    lint_only: bool = option(False, help="config files only (drafter and target config.json, the weights' header when "
                                         "present): what each engine feeds, no model loaded")
    prompts: str | None = option(                   # default: the Spec-Bench questions shipped in datasets/
        None, help=f"Spec-Bench style JSONL or text (default {DEFAULT_PROMPTS.relative_to(REPO_ROOT)})")
    num_prompts: int = option(16, help="prompts, spread over the file (default 16)")
    new_tokens: int = option(64, help="the target's greedy answer per prompt (default 64)")
    max_prompt_tokens: int = 256
    num_spec_tokens: int = option(CHECK_K, help=f"draft steps scored, K (default {CHECK_K})")   # K draft steps
    chat_template: bool = True
    search: bool = option(True, help="score only the listed candidates")    # search around the best candidate
    device: str = option("auto", help="auto, cpu or cuda[:i]")
    dtype: str = option("fp32", choices=DTYPES)
    threads: int | None = option(None, help="torch CPU threads (default 1 on a CPU)")   # fastest for small models
    training_data: str | None = option(None, help="training-data files of this drafter (a directory or one file)")
    training_format: str | None = option(
        None, choices=("speculators", "vllm-extract", "speculators-legacy", "specforge"),
        help="default: detected from the files' contents (as import-capture does)")
    producer_ids: list[int] | None = option(
        None, parse=_ids, help="layer ids the training-data producer used (default: from the config)")
    training_files: int = option(4, help="training files compared (default 4)")
    trained_on: list[str] | None = option(          # with lint_only: the boundaries the drafter was trained on
        None, parse=_labels, metavar="S_a,S_b,S_c", help="with --lint-only: the boundaries the drafter was trained "
        "on, when known (e.g. the trainer's convention), so --write-fix can write the fix")

    _paths = field_validator("drafter", "target", "prompts", "training_data", mode="before")(_path_text)
    _device = field_validator("device")(_device)

    def validate(self) -> None:
        if self.engine not in SERVING_ENGINES:
            raise SpecLensError(f"--engine {self.engine}: unknown; use vllm or sglang")
        if self.runner not in RUNNERS:
            raise SpecLensError(f"--runner {self.runner}: unknown; use auto (decide as vLLM does), v2 or v1")
        for name, v, lo in (("--num-prompts", self.num_prompts, 1), ("--new-tokens", self.new_tokens, 2),
                            ("--num-spec-tokens", self.num_spec_tokens, 1),
                            ("--training-files", self.training_files, 1)):
            if v < lo:
                raise SpecLensError(f"{name} {v}: must be >= {lo}")
        if self.new_tokens <= self.num_spec_tokens:
            raise SpecLensError(f"--new-tokens {self.new_tokens} must exceed --num-spec-tokens {self.num_spec_tokens} "
                                "(each scored slot needs K answer tokens after it)")
        if self.training_format and not self.training_data:
            raise SpecLensError("--training-format needs --training-data (the files); the format alone names nothing "
                                "to compare")


def _number_list(flag: str, cast: type, example: str):
    """`--flag 1,8,32`-style text (or a number, e.g. bench's --num-spec-tokens) -> a list of `cast`; None when not
    given; a one-line error naming the flag otherwise."""
    what = "integers" if cast is int else "numbers"

    def parse(text) -> list | None:
        if text is None or text == "":
            return None
        try:
            return [cast(x) for x in str(text).split(",") if x.strip()]
        except ValueError:
            raise SpecLensError(f"{flag} '{text}': expected comma-separated {what} like {example}") from None
    return parse


@dataclass(frozen=True)
class Config:
    """One drafter server of a load run: K draft tokens, optionally a synthetic acceptance length."""

    k: int
    synthetic_tau: float | None = None

    @property
    def label(self) -> str:
        return f"K={self.k}" + (f" tau*={self.synthetic_tau:g}" if self.synthetic_tau is not None else "")


class LoadSettings(BaseModel):
    """What a serving-load bench or sweep runs (backend/load_bench.py): `python -m backend sweep` options (all of
    them, `options.add_options`), the load-only options of `bench --concurrency`, job specs (`kind: load`) and the
    manifest's settings. A field's option is written beside it (`model_option`, as `option` for the dataclasses)."""

    model_config = ConfigDict(extra="forbid")

    engine: Literal[SERVING_ENGINES]  # type: ignore[valid-type]
    target: str
    prompts: str
    drafter: str | None = None
    num_spec_tokens: list[int] = model_option(
        default_factory=lambda: [DEFAULT_K], parse=_number_list("--num-spec-tokens", int, "1,8,32,64"),
        cli_default="1,2,4,6", help="K values, e.g. 1,2,4,6")
    synthetic_tau: list[float] | None = model_option(      # vLLM synthetic acceptance / SGLang simulated acceptance
        None, parse=_number_list("--synthetic-tau", float, "1,2,3"), help="accept drafts synthetically at these mean "
        "acceptance lengths (vLLM 0.22+: rejection_sample_method synthetic; SGLang SGLANG_SIMULATE_ACC_LEN)")
    concurrency: list[int] = model_option(
        default_factory=lambda: [1, 8, 32, 64], parse=_number_list("--concurrency", int, "1,8,32,64"),
        cli_default="1,8,32,64", help="vllm/sglang: requests in flight, e.g. 1,8,32,64 (a serving-load bench "
        "through the engine's OpenAI-compatible server, paired baseline server)")
    requests: int | None = model_option(None, help="with --concurrency: requests per level and side (default "
                                                   "max(16, 4 x concurrency))")
    max_tokens: int = model_option(128, flag="--max-new-tokens")
    repeats: int = 1
    temperature: float = 0.0
    limit: int | None = None
    chat_template: bool = True
    max_prompt_tokens: int = model_option(1024, cli=False)
    server_url: str | None = None                   # a running drafter server (one configuration)
    baseline_url: str | None = model_option(None, help="with --server-url: a running server of the target without "
                                                       "a drafter")
    dtype: str = model_option("bf16", choices=DTYPES)
    memory: float = model_option(0.15, help="GPU memory fraction of each server SpecLens starts")
    load_format: str | None = model_option(None, help="e.g. dummy: random weights of the target's shape (speed only)")
    topk: int = model_option(1, help="sglang: --speculative-eagle-topk (1 = a chain)")
    draft_tokens: int | None = model_option(None, help="sglang: --speculative-num-draft-tokens (default K+1 for a "
                                                       "chain)")
    engine_options: dict = model_option(
        default_factory=dict, flag="--engine-option", action="append", metavar="KEY=VALUE",
        parse=parse_engine_options, help="a server flag, e.g. max-model-len=4096")
    start_together: bool = model_option(      # start every server at once (one start-up for the sweep)
        True, flag="--one-server-at-a-time", help="keep one baseline server and start one drafter server at a time "
        "(default: all at once)")

    @field_validator("concurrency", "num_spec_tokens")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if not v or any(x < 1 for x in v):
            raise ValueError("needs one or more integers >= 1")
        return sorted(set(v))

    def configs(self) -> list[Config]:
        taus = self.synthetic_tau or [None]
        return [Config(k, t) for k in self.num_spec_tokens for t in taus]

    def identity(self) -> dict:
        """What a resumed run must share: everything but where the servers listen (a restarted server has a new
        URL, and resuming after one is the point)."""
        d = self.model_dump(mode="json", exclude={"server_url", "baseline_url"})
        for k in ("target", "prompts", "drafter"):
            if d[k] is not None:
                d[k] = str(Path(d[k]).resolve())
        return d

    def per_level(self, c: int) -> int:
        return self.requests or max(16, 4 * c)


# the load-only options `bench --concurrency` adds to the bench's own (the rest are BenchSettings options)
LOAD_ONLY = ("concurrency", "requests", "baseline_url", "memory", "load_format", "topk", "draft_tokens",
             "start_together")
