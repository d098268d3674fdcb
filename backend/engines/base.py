"""The engine interface: what every engine (HF in-process, vLLM and SGLang on a GPU node) implements, the typed
settings it is built from, and the one registry that finds it by name.

An engine is a module registered in `ENGINES` that satisfies `EngineAdapter`:

- `require() -> str`: its version, or a one-line error saying where it runs;
- `capture_options(settings, tensor_parallel_size, engine_options) -> EngineOptions | None`: its own options for a
  capture (what only it reads: vllm.py `VllmOptions`, sglang.py `SGLangOptions`; HF has none), built from the
  command line's or a job's `--tensor-parallel-size` and `--engine-option KEY=VALUE`s, so neither the CLI nor a job
  knows an engine's fields;
- `capture_session(settings: CaptureSettings, options: EngineOptions | None = None) -> CaptureSession`: its side of
  the one capture loop (backend/engines/capture_loop.py: prompts, run creation or resume, checkpoints, progress and
  the run's end are the loop's; the engine loads the target (`Target`), puts prompts through its hooks and hands
  back the accumulators);
- `make_engine(settings: EngineSettings, drafter, eos) -> Engine`: one request at a time for a bench
  (backend/bench.py's loop; `Generation` is what it records).

Engines are looked up by name (`adapter`), so neither capture nor bench imports an engine module statically, and no
engine module imports capture or bench. Also shared here: the target's shape and tokenizer without its weights, and
the way an engine's hook results become a capture's statistics. docs/ARCHITECTURE.md has the walk-through.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from backend.errors import SpecLensError
from backend.options import ENGINES  # the one registry (name -> module, imported lazily)
from backend.settings import CaptureSettings, EngineSettings  # noqa: F401 (the typed settings, re-exported)

if TYPE_CHECKING:
    import torch

    from backend.coords import Boundary
    from backend.runs.lifecycle import Run
    from backend.stats import StatsState, StreamingStats, TokenSample


@dataclass
class Generation:
    """One request through a serving engine: what bench.py's loop records (as hf_spec.Generation)."""
    tokens: list[int]
    seconds: float
    ttft: float | None
    accepted: list[int]                  # per verify step, 0..K (only their counts are reported by the engines)
    raw: dict | None = None              # the engine's own figures for the request (counter snapshots, meta_info)


class Engine(Protocol):
    """One request at a time through an engine, for a bench."""
    version: str

    def generate(self, prompt: list[int], max_new_tokens: int, temperature: float, seed: int) -> Generation: ...

    def aux_ids(self) -> list[int] | None: ...

    def fed_boundaries(self, n_layers: int) -> list[str] | None: ...

    def close(self) -> None: ...


class Target(Protocol):
    """The target as the capture loop reads it (`CaptureSession.target()`): HF's loaded model
    (backend/hf_model.py `LoadedModel`) or a serving engine's `TargetInfo` (tokenizer and shape, no weights)."""

    @property
    def config(self) -> object: ...            # the transformers config (model_type, vocab_size)

    @property
    def tokenizer(self) -> object: ...         # what backend/prompts.py encode_all encodes with

    @property
    def n_layers(self) -> int: ...

    @property
    def hidden_size(self) -> int: ...

    @property
    def device(self) -> torch.device | str: ...


@dataclass
class TargetInfo:
    """Tokenizer and shape of a target directory, its weights not loaded (`target_info`): what a serving engine's
    capture and a bench through a serving engine know of the target in this process."""
    config: object
    tokenizer: object
    n_layers: int
    hidden_size: int
    device: str
    eos: list[int]
    model_type: str | None


@dataclass
class EngineOptions:
    """An engine's own capture options, beyond `CaptureSettings`: each engine module defines its subclass beside
    its adapter (backend/engines/vllm.py `VllmOptions`, sglang.py `SGLangOptions`) and builds it in
    `capture_options`; the HF engine has none."""


_O = TypeVar("_O", bound=EngineOptions)


def own_options(cls: type[_O], options: EngineOptions | None) -> _O:
    """`options` as the engine's own class (its defaults where None); a one-line error for another engine's."""
    if options is None:
        return cls()
    if not isinstance(options, cls):
        raise SpecLensError(f"{type(options).__name__} given to an engine that takes {cls.__name__}; build them "
                            "with that engine's capture_options")
    return options


class CaptureSession(Protocol):
    """An engine's side of the one capture loop (backend/engines/capture_loop.py), in the order the loop calls it:
    `target()` (tokenizer, config, n_layers, hidden_size, device), `begin` (the run is open: accumulators from the
    resumed state, or a refusal to resume), `guard_options` (how a failure is told), `start` (model or server up,
    hooks in), `run` once per `chunk` prompts (`checkpoint_due(done)` says when the loop checkpoints
    `accumulators()`), `accumulators()` at the end, `close()` always, then `verify` (the hooks saw every token)."""
    label: str                                 # progress bar suffix, e.g. " (vllm)"
    engine_version: str | None                 # the manifest's engine_version (None: transformers' version)
    chunk: int
    missing_tokens_fix: str                    # appended to the error when statistics miss tokens ("": none known)

    def target(self) -> Target: ...

    def guard_options(self, run_id: str, where: Callable[[], str],
                      save: Callable[[], None]) -> dict: ...

    def begin(self, rd: Run, run_id: str, start: int, labels: list[str], wanted: list[Boundary],
              state: StatsState | None, sample: dict[str, torch.Tensor] | None) -> None: ...

    def start(self, rd: Run) -> None: ...

    def run(self, seqs: list[list[int]]) -> None: ...

    def checkpoint_due(self, done: int) -> bool: ...

    def accumulators(self) -> tuple[StreamingStats, TokenSample]: ...

    def close(self) -> None: ...

    def verify(self, rd: Run, tokens_expected: int) -> None: ...


class EngineAdapter(Protocol):
    """An engine module (`ENGINES[name]`)."""

    def require(self) -> str: ...

    def capture_options(self, settings: CaptureSettings, tensor_parallel_size: int = 1,
                        engine_options: dict | None = None) -> EngineOptions | None: ...

    def capture_session(self, settings: CaptureSettings, options: EngineOptions | None = None) -> CaptureSession: ...

    def make_engine(self, settings: EngineSettings, drafter: str | None, eos: list[int]) -> Engine: ...


def adapter(name: str) -> EngineAdapter:
    """The engine registered under `name`."""
    if name not in ENGINES:
        raise SpecLensError(f"--engine {name}: unknown; use {', '.join(ENGINES)}")
    return importlib.import_module(ENGINES[name])   # type: ignore[return-value]


engine_module = adapter          # the name bench.py and the load bench use


def target_info(model: str) -> TargetInfo:
    """Tokenizer and shape of a target directory (no weights loaded)."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        cfg = AutoConfig.from_pretrained(model)
        tok = AutoTokenizer.from_pretrained(model)
    except Exception as e:
        raise SpecLensError(f"{model}: not a model directory with a tokenizer transformers can read "
                            f"({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})") from None
    text = getattr(cfg, "text_config", None) or cfg
    eos = getattr(cfg, "eos_token_id", None)
    try:
        from transformers import GenerationConfig
        eos = GenerationConfig.from_pretrained(model).eos_token_id or eos
    except Exception:
        pass
    eos = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(x) for x in eos])
    return TargetInfo(config=cfg, tokenizer=tok, n_layers=int(text.num_hidden_layers),
                      hidden_size=int(text.hidden_size), device="cuda", eos=eos,
                      model_type=getattr(cfg, "model_type", None))


def rebuild_capture(res: dict, hidden: int, sample_tokens: int, sample_per_prompt: int
                    ) -> tuple[StreamingStats, TokenSample]:
    """The (StreamingStats, TokenSample) of what an engine's hooks collected (`labels`, `state`, `sample`)."""
    import torch

    from backend.stats import StatsState, StreamingStats, TokenSample

    stats = StreamingStats(res["labels"], hidden, "cpu", StatsState.from_tensors(res["state"], "cpu"), compile=False)
    dt = res["sample"][res["labels"][0]].dtype if res["labels"] else torch.float32
    sample = TokenSample(res["labels"], hidden, sample_tokens, sample_per_prompt, dtype=dt)
    sample.load(res["sample"])
    return stats, sample


def check_hook_tokens(rd: Run, res: dict, expected: int, engine: str, hint: str = "", **extra: object) -> None:
    """Record how many tokens the engine ran through the hooks next to the prompts' count; a difference means
    the statistics are not the prompts' (cached prefixes, padding): the run is failed and the error says so."""
    seen = int(res["tokens_seen"])
    rd.record(engine_check={"tokens_expected": expected, "tokens_seen_by_hooks": seen,
                            "forward_passes": int(res["forwards"]), **extra})
    if seen != expected:
        rd.fail(f"{engine} ran {seen} tokens through the hooks, the prompts hold {expected}{hint}")
        raise SpecLensError(f"capture {rd.run_id}: token count mismatch inside {engine} ({seen} != {expected})")
