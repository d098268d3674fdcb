"""A capture run: prompts through an engine, streaming statistics per boundary, a bounded raw sample.

The run checkpoints its accumulators every few prompts; started again with the same --name it resumes
from the last checkpoint and gives the same result as an uninterrupted run. The loop is one for every engine
(backend/engines/capture_loop.py); the engine is looked up by name (backend/engines/base.py `adapter`).
"""

from __future__ import annotations

from backend.engines.base import CaptureSettings, EngineOptions, adapter
from backend.engines.hf import Capturer  # noqa: F401 (the hot path's home; bench/capture_overhead.py imports it here)
from backend.runs.capture_run import CaptureResult
from backend.store.data_root import DataRoot


def run_capture(settings: CaptureSettings, name: str | None = None, data: DataRoot | None = None,
                progress: bool = True, stop_after: int | None = None,
                engine_options: EngineOptions | None = None) -> CaptureResult:
    """Capture (or resume) a run. `stop_after` stops after that many prompts (tests of resume);
    `engine_options`: the engine's own options, as its `capture_options` builds them (backend/engines/vllm.py
    `VllmOptions`, sglang.py `SGLangOptions`; None: the engine's defaults)."""
    from backend.engines import capture_loop

    eng = adapter(settings.engine)
    eng.require()
    session = eng.capture_session(settings, engine_options)
    return capture_loop.run(session, settings, name, data, progress, stop_after)


__all__ = ["CaptureSettings", "CaptureResult", "run_capture"]
