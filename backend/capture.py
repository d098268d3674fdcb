"""A capture run: prompts through an engine, streaming statistics per boundary, a bounded raw sample.

The run checkpoints its accumulators every few prompts; started again with the same --name it resumes
from the last checkpoint and gives the same result as an uninterrupted run.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from backend import coords
from backend.errors import SpecLensError
from backend.prompts import encode_all, load_prompts
from backend.runs.capture_run import CaptureResult, boundaries, checkpoint, finish, open_or_resume
from backend.runs.lifecycle import RunGuard
from backend.stats import StreamingStats, TokenSample
from backend.store.rundir import new_run_id


@dataclass
class CaptureSettings:
    model: str
    prompts: str
    engine: str = "hf"
    limit: int | None = None
    device: str = "auto"
    dtype: str = "fp32"
    boundaries: list[str] | None = None        # None = every boundary S_0..S_N and F
    sample_tokens: int = 4096
    sample_per_prompt: int = 512
    max_prompt_tokens: int | None = 2048
    chat_template: bool = True
    checkpoint_every: int = 16

    def identity(self) -> dict:
        """The settings a resumed run must share with the run it resumes."""
        d = asdict(self)
        d.pop("checkpoint_every")
        d.pop("device")
        return d


def run_capture(settings: CaptureSettings, name: str | None = None, root: Path | None = None,
                progress: bool = True, stop_after: int | None = None, engine_options=None) -> CaptureResult:
    """Capture (or resume) a run. `stop_after` stops after that many prompts (tests of resume);
    `engine_options`: backend.engines.vllm.EngineOptions for --engine vllm."""
    from backend.engines import hf

    if settings.engine != "hf":                 # a serving engine, looked up by name (backend/engines/base.py)
        from backend.engines.base import engine_module
        extra = {"opts": engine_options} if settings.engine == "vllm" else {}
        return engine_module(settings.engine).run_capture(settings, name, root, progress, **extra)
    if settings.sample_tokens < 0:
        raise SpecLensError("--sample-tokens must be >= 0")
    prompts = load_prompts(settings.prompts, settings.limit)
    lm = hf.load(settings.model, settings.device, settings.dtype)
    wanted = boundaries(settings.boundaries, lm.n_layers)
    labels = coords.labels(wanted)
    seqs = encode_all(lm.tokenizer, prompts, settings.prompts, settings.chat_template, settings.max_prompt_tokens)
    total_tokens = sum(len(s) for s in seqs)

    run_id = new_run_id("capture", name)
    rd, start, state, sample_t = open_or_resume(run_id, settings, lm, labels, root, len(prompts))
    stats = StreamingStats(labels, lm.hidden_size, lm.device, state)
    sample = TokenSample(labels, lm.hidden_size, settings.sample_tokens, settings.sample_per_prompt,
                         dtype=torch.float32 if settings.dtype == "fp32" else torch.bfloat16,
                         pin=lm.device.type == "cuda")
    if sample_t is not None:
        sample.load(sample_t)

    cap = Capturer(stats, sample)
    t0 = time.perf_counter()
    done = start
    guard = RunGuard(rd, save=lambda: checkpoint(rd, stats, sample, done, len(seqs)),
                     interrupted=lambda: f"interrupted after {done}/{len(seqs)} prompts; run the same command again "
                                         f"to resume")
    with guard, hf.BoundaryHooks(lm, wanted, cap.sink):
        bar = tqdm(total=len(seqs), initial=start, desc=f"capture {run_id}", unit="prompt",
                   disable=not progress, file=sys.stderr)
        for i in range(start, len(seqs)):
            cap.run(lm, seqs[i])
            done = i + 1
            bar.update(1)
            if done % settings.checkpoint_every == 0 and done < len(seqs):
                checkpoint(rd, stats, sample, done, len(seqs))
            if stop_after is not None and done - start >= stop_after and done < len(seqs):
                checkpoint(rd, stats, sample, done, len(seqs))
                bar.close()
                return CaptureResult(run_id, rd.path, 0, done, time.perf_counter() - t0)
        bar.close()
    return finish(rd, stats, sample, labels, total_tokens, len(seqs), time.perf_counter() - t0)


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
        from backend.engines import hf

        self.room = self.sample.room(len(ids))
        hf.forward(lm, ids)
        if self.deferred:
            self.stats.update_all(self.pending)
            self.pending = [None] * len(self.pending)
        self.sample.commit(torch.tensor(ids), self.room)


__all__ = ["CaptureSettings", "CaptureResult", "run_capture"]
