"""The one capture loop that every engine feeds (HF in-process, vLLM, SGLang; backend/engines/base.py CaptureSession).

The loop owns what is the same for every engine: the prompts, encoded exactly as the HF engine encodes them; the
boundaries asked for; the run, created or resumed by identity (backend/runs/capture_run.py); the progress bar;
checkpoints; what a failure or Ctrl-C leaves (RunGuard); the hook token check and the files of a complete run. The
engine only loads the target, puts prompts through its hooks and hands the accumulators back.
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

from backend import coords
from backend.engines.base import CaptureSession, CaptureSettings
from backend.errors import SpecLensError
from backend.prompts import encode_all, load_prompts
from backend.runs.capture_run import (
    CaptureResult,
    boundaries,
    check_every_token_counted,
    checkpoint,
    finish,
    open_or_resume,
)
from backend.runs.lifecycle import RunGuard
from backend.store.data_root import DataRoot
from backend.store.rundir import new_run_id


def run(session: CaptureSession, settings: CaptureSettings, name: str | None = None, data: DataRoot | None = None,
        progress: bool = True, stop_after: int | None = None) -> CaptureResult:
    """Capture (or resume) a run through `session`. `stop_after` stops after that many prompts (tests of resume)."""
    if settings.sample_tokens < 0:
        raise SpecLensError("--sample-tokens must be >= 0")
    prompts = load_prompts(settings.prompts, settings.limit)
    target = session.target()
    wanted = boundaries(settings.boundaries, target.n_layers)
    labels = coords.labels(wanted)
    seqs = encode_all(target.tokenizer, prompts, settings.prompts, settings.chat_template, settings.max_prompt_tokens)
    n = len(seqs)

    run_id = new_run_id("capture", name)
    rd, start, state, sample_t = open_or_resume(run_id, settings, target, labels, data, len(prompts),
                                                engine_version=session.engine_version)
    session.begin(rd, run_id, start, labels, wanted, state, sample_t)
    t0 = time.perf_counter()
    done = start
    guard = RunGuard(rd, **session.guard_options(run_id, where=lambda: f"{done}/{n} prompts",
                                                 save=lambda: checkpoint(rd, *session.accumulators(), done, n)))
    try:
        with guard:
            session.start(rd)
            bar = tqdm(total=n, initial=start, desc=f"capture {run_id}{session.label}", unit="prompt",
                       disable=not progress, file=sys.stderr)
            for i in range(start, n, session.chunk):
                session.run(seqs[i:i + session.chunk])
                done = min(n, i + session.chunk)
                bar.update(done - i)
                if done < n and session.checkpoint_due(done):
                    checkpoint(rd, *session.accumulators(), done, n)
                if stop_after is not None and done - start >= stop_after and done < n:
                    checkpoint(rd, *session.accumulators(), done, n)
                    bar.close()
                    return CaptureResult(run_id, rd.path, 0, done, time.perf_counter() - t0)
            bar.close()
            stats, sample = session.accumulators()
    finally:
        session.close()
    session.verify(rd, sum(len(x) for x in seqs[start:]))
    tokens = sum(len(x) for x in seqs)
    check_every_token_counted(rd, stats, tokens, settings.engine, session.missing_tokens_fix)
    return finish(rd, stats, sample, labels, tokens, n, time.perf_counter() - t0)
