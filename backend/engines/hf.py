"""HF transformers engine: every boundary S_0..S_N and F of any causal LM through forward hooks.

S_0 is the input of decoder layer 0 (a pre-hook, so models that scale their embeddings are right),
S_b (b >= 1) the output of decoder layer b-1, F the output of the final norm. This is the reference
engine: it runs on CPU or CUDA, fp32 or bf16, and needs nothing but transformers. It is registered as "hf" in
backend/engines/base.py: `capture_session` feeds the one capture loop (backend/engines/capture_loop.py) through
`Capturer`; benches run in-process through backend/engines/hf_spec.py, so `make_engine` refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from backend.coords import Boundary
from backend.engines.base import CaptureSettings, EngineOptions, EngineSettings
from backend.errors import SpecLensError
from backend.hf_model import (  # noqa: F401 (the HF engine's primitives, imported from here by engine users)
    DTYPES,
    BoundaryHooks,
    LoadedModel,
    boundary_final,
    default_boundaries,
    find_stack,
    forward,
    generate_greedy,
    load,
    model_config,
    resolve_device,
)
from backend.stats import StatsState, StreamingStats, TokenSample

if TYPE_CHECKING:
    from backend.runs.lifecycle import Run

# ---------------------------------------------------------------------- the engine interface (base.EngineAdapter)

def require() -> str:
    import transformers

    return transformers.__version__


class Capturer:
    """The hot path: a forward-hook sink that feeds the statistics and, while it has room, the sample.

    On a GPU each boundary is reduced as its hook fires (a compiled kernel, no host sync); on a CPU, where
    per-op overhead dominates small models, the hooks only keep references and all boundaries are reduced
    together after the forward pass (memory: boundaries x prompt tokens x hidden for one prompt)."""

    def __init__(self, stats: StreamingStats, sample: TokenSample, deferred: bool | None = None):
        self.stats, self.sample = stats, sample
        self.room = 0
        self.deferred = (stats.state.moments.device.type == "cpu") if deferred is None else deferred
        self.pending: list[torch.Tensor | None] = [None] * len(stats.labels)

    def sink(self, k: int, x: torch.Tensor) -> None:
        if self.deferred:
            self.pending[k] = x
        else:
            self.stats.update(k, x)
        if self.room:
            self.sample.stage(k, x, self.room)

    def run(self, lm, ids: list[int]) -> None:
        """One prompt through the model with the hooks installed (see engines.hf.BoundaryHooks)."""
        self.room = self.sample.room(len(ids))
        forward(lm, ids)
        if self.deferred:
            self.stats.update_all(self.pending)
            self.pending = [None] * len(self.pending)
        self.sample.commit(torch.tensor(ids), self.room)


class HFCapture:
    """The HF engine's side of the one capture loop: the model in this process, forward hooks on every boundary
    feeding `Capturer`; one prompt at a time, a checkpoint every `checkpoint_every` prompts, and on a failure or
    Ctrl-C the accumulators saved first so the same command resumes."""

    label = ""
    engine_version = None                      # the manifest says "transformers X"
    chunk = 1
    missing_tokens_fix = ""

    def __init__(self, settings: CaptureSettings):
        self.settings = settings
        self.lm: LoadedModel | None = None
        self.hooks: BoundaryHooks | None = None

    def target(self) -> LoadedModel:
        self.lm = load(self.settings.model, self.settings.device, self.settings.dtype)
        return self.lm

    def begin(self, rd: Run, run_id: str, start: int, labels: list[str], wanted: list[Boundary],
              state: StatsState | None, sample: dict[str, torch.Tensor] | None) -> None:
        s, lm = self.settings, self.lm
        self.stats = StreamingStats(labels, lm.hidden_size, lm.device, state, exact=s.exact_sums)
        self.sample = TokenSample(labels, lm.hidden_size, s.sample_tokens, s.sample_per_prompt,
                                  dtype=torch.float32 if s.dtype == "fp32" else torch.bfloat16,
                                  pin=lm.device.type == "cuda")
        if sample is not None:
            self.sample.load(sample)
        self.cap = Capturer(self.stats, self.sample)
        self.wanted = wanted

    def guard_options(self, run_id: str, where: Callable[[], str], save: Callable[[], None]) -> dict:
        return {"save": save,
                "interrupted": lambda: f"interrupted after {where()}; run the same command again to resume"}

    def start(self, rd: Run) -> None:
        self.hooks = BoundaryHooks(self.lm, self.wanted, self.cap.sink)

    def run(self, seqs: list[list[int]]) -> None:
        for ids in seqs:
            self.cap.run(self.lm, ids)

    def checkpoint_due(self, done: int) -> bool:
        return done % self.settings.checkpoint_every == 0

    def accumulators(self) -> tuple[StreamingStats, TokenSample]:
        return self.stats, self.sample

    def close(self) -> None:
        if self.hooks is not None:
            self.hooks.remove()

    def verify(self, rd: Run, tokens_expected: int) -> None:
        pass                                   # the hooks run in this process on every token of every prompt


def capture_options(settings: CaptureSettings, tensor_parallel_size: int = 1,
                    engine_options: dict | None = None) -> None:
    """None: the HF engine has no options of its own (device and dtype are settings)."""
    return None


def capture_session(settings: CaptureSettings, options: EngineOptions | None = None) -> HFCapture:
    if options is not None:
        raise SpecLensError(f"the HF engine takes no engine options (got {type(options).__name__})")
    return HFCapture(settings)


def make_engine(settings: EngineSettings, drafter: str | None, eos: list[int]):
    raise SpecLensError("the HF engine benches in-process (backend/bench.py with backend/engines/hf_spec.py); "
                        "use --engine vllm or sglang for a serving engine")
