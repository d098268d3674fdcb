"""A capture run: prompts through an engine, streaming statistics per boundary, a bounded raw sample.

The run checkpoints its accumulators every few prompts; started again with the same --name it resumes
from the last checkpoint and gives the same result as an uninterrupted run.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from backend import coords
from backend.errors import SpecLensError
from backend.model_id import fingerprint
from backend.prompts import encode_all, load_prompts
from backend.stats import StatsState, StreamingStats, TokenSample, norm_bin_edges
from backend.store import catalog
from backend.store.rundir import COMPLETE, RunDir, atomic_save_safetensors, atomic_write_json, atomic_write_parquet, new_run_id

CHECKPOINT = "checkpoint.safetensors"


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


@dataclass
class CaptureResult:
    run_id: str
    path: Path
    tokens: int
    prompts: int
    seconds: float
    nonfinite: dict[str, int] = field(default_factory=dict)


def run_capture(settings: CaptureSettings, name: str | None = None, root: Path | None = None,
                progress: bool = True, stop_after: int | None = None, engine_options=None) -> CaptureResult:
    """Capture (or resume) a run. `stop_after` stops after that many prompts (tests of resume);
    `engine_options`: backend.engines.vllm.EngineOptions for --engine vllm."""
    from backend.engines import hf

    if settings.engine == "vllm":
        from backend.engines import vllm
        return vllm.run_capture(settings, name, root, progress, opts=engine_options)
    if settings.engine == "sglang":
        from backend.engines import sglang
        return sglang.run_capture(settings, name, root, progress)
    if settings.engine != "hf":
        raise SpecLensError(f"--engine {settings.engine}: unknown; use hf, vllm or sglang")
    if settings.sample_tokens < 0:
        raise SpecLensError("--sample-tokens must be >= 0")
    prompts = load_prompts(settings.prompts, settings.limit)
    lm = hf.load(settings.model, settings.device, settings.dtype)
    wanted = _boundaries(settings.boundaries, lm.n_layers)
    labels = coords.labels(wanted)
    seqs = encode_all(lm.tokenizer, prompts, settings.prompts, settings.chat_template, settings.max_prompt_tokens)
    total_tokens = sum(len(s) for s in seqs)

    run_id = new_run_id("capture", name)
    rd, start, state, sample_t = _open_or_resume(run_id, settings, lm, labels, root, len(prompts))
    stats = StreamingStats(labels, lm.hidden_size, lm.device, state)
    sample = TokenSample(labels, lm.hidden_size, settings.sample_tokens, settings.sample_per_prompt,
                         dtype=torch.float32 if settings.dtype == "fp32" else torch.bfloat16,
                         pin=lm.device.type == "cuda")
    if sample_t is not None:
        sample.load(sample_t)

    cap = Capturer(stats, sample)
    t0 = time.perf_counter()
    done = start
    try:
        with hf.BoundaryHooks(lm, wanted, cap.sink):
            bar = tqdm(total=len(seqs), initial=start, desc=f"capture {run_id}", unit="prompt",
                       disable=not progress, file=sys.stderr)
            for i in range(start, len(seqs)):
                cap.run(lm, seqs[i])
                done = i + 1
                bar.update(1)
                if done % settings.checkpoint_every == 0 and done < len(seqs):
                    _checkpoint(rd, stats, sample, done, len(seqs))
                if stop_after is not None and done - start >= stop_after and done < len(seqs):
                    _checkpoint(rd, stats, sample, done, len(seqs))
                    bar.close()
                    return CaptureResult(run_id, rd.path, 0, done, time.perf_counter() - t0)
            bar.close()
    except KeyboardInterrupt:
        _checkpoint(rd, stats, sample, done, len(seqs))
        rd.fail(f"interrupted after {done}/{len(seqs)} prompts; run the same command again to resume")
        catalog.refresh(root)
        raise
    except SpecLensError as e:
        rd.fail(str(e))
        catalog.refresh(root)
        raise
    except Exception as e:  # keep what was computed; say what happened in one line
        _checkpoint(rd, stats, sample, done, len(seqs))
        rd.fail(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        catalog.refresh(root)
        raise
    return _finish(rd, stats, sample, labels, total_tokens, len(seqs), time.perf_counter() - t0, root)


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


def _boundaries(wanted: list[str] | None, n_layers: int) -> list[coords.Boundary]:
    if not wanted:
        return coords.all_boundaries(n_layers)
    out = []
    for lbl in wanted:
        b = coords.parse(lbl, n_layers)
        if not b.final and b.index > n_layers:
            raise SpecLensError(f"--boundaries {lbl}: out of range for a {n_layers}-layer model; use S_0..S_{n_layers} or F")
        out.append(b)
    return sorted(set(out), key=lambda b: b.sort_key())


def _open_or_resume(run_id, settings, lm, labels, root, n_prompts, engine_version: str | None = None):
    manifest = {
        "kind": "capture", "engine": settings.engine, "engine_version": engine_version or _engine_version(),
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
        rd = RunDir.create(run_id, manifest, root)
        catalog.refresh(root)
        return rd, 0, None, None
    except SpecLensError:
        rd = RunDir.open(run_id, root)
    m = rd.manifest()
    if m.get("status") == COMPLETE:
        raise SpecLensError(f"run '{run_id}' is already complete ({rd.path}); pick another --name")
    if m.get("settings") != settings.identity():
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
            raise SpecLensError(f"{ck}: corrupt checkpoint ({e}); delete it to restart this run from the beginning") from e
        state = StatsState.from_tensors({k[6:]: v for k, v in t.items() if k.startswith("stats.")}, lm.device)
        sample_t = {k[7:]: v for k, v in t.items() if k.startswith("sample.")}
    rd.claim()
    rd.update(progress={"done": start, "total": n_prompts})
    catalog.refresh(root)
    return rd, start, state, sample_t


def _engine_version() -> str:
    import transformers

    return f"transformers {transformers.__version__}"


def _checkpoint(rd: RunDir, stats: StreamingStats, sample: TokenSample, done: int, total: int) -> None:
    t = {f"stats.{k}": v.detach().cpu() for k, v in stats.state.tensors().items()}
    t.update({f"sample.{k}": v for k, v in sample.tensors().items()})
    atomic_save_safetensors(rd.file(CHECKPOINT), t, metadata={"done": str(done)})
    rd.update(progress={"done": done, "total": total})
    catalog.refresh(rd.path.parent.parent)   # the dashboard's progress bar reads the catalog


def _finish(rd: RunDir, stats: StreamingStats, sample: TokenSample, labels: list[str], tokens: int,
            n_prompts: int, seconds: float, root) -> CaptureResult:
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
    rd.complete(progress={"done": n_prompts, "total": n_prompts}, headline=headline)
    ck = rd.file(CHECKPOINT)
    if ck.exists():
        ck.unlink()
    catalog.refresh(root)
    return CaptureResult(rd.run_id, rd.path, headline["tokens"], n_prompts, seconds, nonfinite)


def write_capture_files(rd: RunDir, stats: StreamingStats, sample: TokenSample, labels: list[str],
                        n_sequences: int, root=None, extra: dict | None = None, seconds: float = 0.0) -> CaptureResult:
    """Shared by importers: write the same files a capture writes and mark the run complete."""
    if extra:
        rd.update(**extra)
    return _finish(rd, stats, sample, labels, 0, n_sequences, seconds, root)


__all__ = ["CaptureSettings", "CaptureResult", "run_capture", "write_capture_files", "atomic_write_json"]
