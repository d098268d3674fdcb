"""A capture run's files and life: create or resume, checkpoint, finish (statistics, sample, complete).

Shared by every way a capture run is made: backend/capture.py (the HF engine), the vLLM and SGLang adapters
(backend/engines/) and the importers of other tools' training data (backend/importers.py). None of them imports
another: each describes what it computes and hands the accumulators here. Files: docs/SCHEMA.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from backend import coords
from backend.errors import SpecLensError
from backend.model_id import fingerprint
from backend.runs.lifecycle import Run
from backend.runs.manifest import StoredCaptureSettings
from backend.stats import StatsState, StreamingStats, TokenSample, norm_bin_edges
from backend.store.data_root import DataRoot
from backend.store.rundir import COMPLETE, atomic_save_safetensors, atomic_write_parquet

if TYPE_CHECKING:
    from backend.settings import CaptureSettings

CHECKPOINT = "checkpoint.safetensors"


@dataclass
class CaptureResult:
    run_id: str
    path: Path
    tokens: int
    prompts: int
    seconds: float
    nonfinite: dict[str, int] = field(default_factory=dict)


def boundaries(wanted: list[str] | None, n_layers: int) -> list[coords.Boundary]:
    """The boundaries a capture asks for (--boundaries labels; None: every one, S_0..S_N and F), in stream order."""
    if not wanted:
        return coords.all_boundaries(n_layers)
    out = []
    for lbl in wanted:
        b = coords.parse(lbl, n_layers)
        if not b.final and b.index > n_layers:
            raise SpecLensError(f"--boundaries {lbl}: out of range for a {n_layers}-layer model; "
                                f"use S_0..S_{n_layers} or F")
        out.append(b)
    return sorted(set(out), key=lambda b: b.sort_key())


def open_or_resume(run_id: str, settings: CaptureSettings, lm, labels: list[str], data: DataRoot | None, n_prompts: int,
                   engine_version: str | None = None):
    """Create the capture run, or claim the interrupted one of the same name and settings: (Run, prompts done,
    statistics state on the CPU, sample tensors) from its last checkpoint. A complete run or other settings are
    refused. The state stays on the CPU: the accumulator that continues it moves it (StreamingStats), and an engine in
    other processes gets it as tensors. CUDA initialised in this process would make vLLM spawn its engine core instead
    of forking it (slower to start)."""
    manifest = {
        "kind": "capture", "engine": settings.engine, "engine_version": engine_version or transformers_version(),
        "name": run_id,
        "model": {"path": str(Path(settings.model).resolve()), "model_type": getattr(lm.config, "model_type", None),
                  "n_layers": lm.n_layers, "hidden_size": lm.hidden_size,
                  "vocab_size": int(getattr(lm.config, "vocab_size", 0)),
                  "fingerprint": fingerprint(settings.model)},
        "dtype": settings.dtype, "device": str(lm.device), "boundaries": labels,
        "settings": settings.identity(), "progress": {"done": 0, "total": n_prompts},
        "dataset": Path(settings.prompts).name,
    }
    try:
        return Run.create(run_id, manifest, data), 0, None, None
    except SpecLensError:
        rd = Run.open(run_id, data)
    m = rd.read()
    if m.status == COMPLETE:
        raise SpecLensError(f"run '{run_id}' is already complete ({rd.path}); pick another --name")
    if m.settings != StoredCaptureSettings.identity_of(settings):
        raise SpecLensError(f"run '{run_id}' was started with other settings ({rd.manifest_path}); "
                            f"resume it with the same options or pick another --name")
    ck = rd.file(CHECKPOINT)
    start, state, sample_t = 0, None, None
    if ck.exists():
        from safetensors import SafetensorError
        from safetensors.torch import load_file, safe_open
        try:
            t = load_file(str(ck))
            with safe_open(str(ck), "pt") as f:
                start = int(f.metadata()["done"])
        except (SafetensorError, OSError, KeyError, ValueError) as e:
            raise SpecLensError(f"{ck}: corrupt checkpoint ({e}); "
                                f"delete it to restart this run from the beginning") from e
        state = StatsState.from_tensors({k[6:]: v for k, v in t.items() if k.startswith("stats.")})
        sample_t = {k[7:]: v for k, v in t.items() if k.startswith("sample.")}
    rd.claim(progress={"done": start, "total": n_prompts})
    return rd, start, state, sample_t


def transformers_version() -> str:
    import transformers

    return f"transformers {transformers.__version__}"


def checkpoint(rd: Run, stats: StreamingStats, sample: TokenSample, done: int, total: int) -> None:
    """The accumulators and the progress, so a run started again resumes here."""
    t = {f"stats.{k}": v.detach().cpu() for k, v in stats.state.tensors().items()}
    t.update({f"sample.{k}": v for k, v in sample.tensors().items()})
    atomic_save_safetensors(rd.file(CHECKPOINT), t, metadata={"done": str(done)})
    rd.progress(done, total, checkpoint=True)   # the dashboard's progress bar reads the catalog


def check_every_token_counted(rd: Run, stats: StreamingStats, tokens: int, engine: str, fix: str = "") -> None:
    """Every prompt token passes every boundary: a boundary whose statistics hold fewer tokens (finite or not) than
    the engine ran never reached them, whatever the engine's own token count says. The run is failed, not completed
    with statistics of part of the tokens (or none); its checkpoint stays."""
    short = [f"{lbl} {n}" for lbl, n in zip(stats.labels, stats.state.tokens()) if n != tokens]
    if short:
        what = f"the statistics hold {', '.join(short[:4])}{' ...' if len(short) > 4 else ''} of {tokens} tokens"
        rd.fail(f"{engine} ran every token, but {what}")
        raise SpecLensError(f"capture {rd.run_id}: {engine} ran all {tokens} prompt tokens but {what}: its boundaries "
                            "did not reach the statistics; nothing was marked complete"
                            f"{fix or ' (report it with its log)'}")


def finish(rd: Run, stats: StreamingStats, sample: TokenSample, labels: list[str], tokens: int,
           n_prompts: int, seconds: float) -> CaptureResult:
    """Write the statistics and the sample, mark the run complete, drop the checkpoint."""
    table = stats.table()
    table.insert(0, "run_id", rd.run_id)
    atomic_write_parquet(rd.file("stats.parquet"), table)
    vec = stats.vectors()
    per = {}
    for i, lbl in enumerate(labels):
        for key in ("mean", "var", "max_abs", "norm_hist"):
            per[f"{lbl}.{key}"] = torch.from_numpy(vec[key][i].astype("float32"))
    per["norm_bin_edges"] = torch.from_numpy(norm_bin_edges().astype("float32"))
    atomic_save_safetensors(rd.file("stats.safetensors"), per)
    atomic_save_safetensors(rd.file("sample.safetensors"), sample.tensors())
    nonfinite = {r.boundary: int(r.nonfinite_tokens) for r in table.itertuples() if r.nonfinite_tokens}
    # every token passes every boundary: finite + non-finite tokens of one boundary = all tokens
    headline = {"tokens": int(table["n_tokens"].iloc[0] + table["nonfinite_tokens"].iloc[0]) if len(table) else tokens,
                "prompts": n_prompts, "sample_tokens": sample.n, "nonfinite": nonfinite, "seconds": round(seconds, 3)}
    rd.complete(drop=(CHECKPOINT,), progress={"done": n_prompts, "total": n_prompts}, headline=headline)
    return CaptureResult(rd.run_id, rd.path, headline["tokens"], n_prompts, seconds, nonfinite)


def write_capture_files(rd: Run, stats: StreamingStats, sample: TokenSample, labels: list[str],
                        n_sequences: int, extra: dict | None = None, seconds: float = 0.0) -> CaptureResult:
    """Shared by importers: write the same files a capture writes and mark the run complete."""
    if extra:
        rd.record(**extra)
    return finish(rd, stats, sample, labels, 0, n_sequences, seconds)
