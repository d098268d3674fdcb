"""Reliability under crashes and load, on real runs of tiny models.

(a) kill -9 at random points. A capture and a bench (with a drafter: its paired baseline runs first) are started
    with the CLI's own entry point (`backend.__main__.main([...])`, what `python -m backend capture|bench` runs) in
    processes forked from a server that imported torch once (multiprocessing "forkserver": a trial then costs
    about a second instead of the five an interpreter needs to import torch), and SIGKILLed after a random
    delay. Meanwhile the test refreshes and reads the catalog as a dashboard would. Then the same command runs
    again (same --name). Checked: no run showed `complete` in the catalog unless it was whole; after the restart
    the results equal an uninterrupted run of the same command (capture statistics and raw sample, bench
    per-prompt outputs, accepted lengths and figures, the baseline's too); no run duplicated or missing. Two more
    trials kill -9 the job worker itself (`python -m backend worker --once`, its job child dies with it) and
    restart the worker.
(b) a writer process producing 200 runs (captures and bench runs written with RunDir as the CLI writes them,
    the catalog refreshed after each) while 4 browser sessions (Playwright + Debian chromium) keep reloading
    /runs and /compare: zero error elements shown; every run present at the end.

SPECLENS_RELIABILITY_TRIALS (default 6 per kind), SPECLENS_RELIABILITY_SEED and SPECLENS_SOAK_RUNS (default 200)
scale it; SPECLENS_RELIABILITY_REPORT writes the figures as JSON (docs/RELIABILITY.md).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from backend.config import REPO_ROOT
from backend.store.data_root import DataRoot

PROMPTS = REPO_ROOT / "datasets" / "spec_bench" / "question.jsonl"
TRIALS = int(os.environ.get("SPECLENS_RELIABILITY_TRIALS", "6"))
SEED = int(os.environ.get("SPECLENS_RELIABILITY_SEED", "20261201"))
SOAK_RUNS = int(os.environ.get("SPECLENS_SOAK_RUNS", "200"))
REPORT: dict = {}
CAP_LIMIT = 80                      # prompts of a capture: checkpoints every 16
BENCH_ARGS = ["--num-spec-tokens", "3", "--repeats", "2", "--max-new-tokens", "12", "--limit", "4",
              "--runner", "v1"]    # V1 reads the drafter's nested ids; V2 (vLLM's pick for Llama) would not
PRELOAD = ["torch", "transformers", "transformers.models.llama.modeling_llama", "pandas", "pyarrow.parquet",
           "safetensors.torch", "duckdb", "backend.__main__", "backend.capture", "backend.bench", "backend.engines.hf",
           "backend.engines.hf_spec", "backend.drafter"]


def cli_child(argv: list[str], root: str) -> None:
    """A forked child: the CLI's main() on one torch thread over `root`."""
    os.environ["SPECLENS_DATA"] = root
    import torch

    torch.set_num_threads(1)
    from backend.__main__ import main

    sys.exit(main(argv))


def noop() -> None:
    pass


@pytest.fixture(scope="module")
def forkserver():
    """A forkserver that imported torch, transformers and the backend (started, and warm, before any timing)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    p = ctx.Process(target=noop)
    p.start()
    p.join(120)
    return ctx


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny target (4 layers, hidden 64), a random EAGLE-3 drafter for it, 4 bench prompts and 80 capture prompts."""
    import torch

    from backend.drafter import DrafterConfig, Eagle3Drafter, init_random
    from backend.toy.target import build_random_target

    d = tmp_path_factory.mktemp("rel-models")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target = build_random_target(d / "target", n_layers=4, hidden=64, vocab_size=512, seed=0)
        cfg = DrafterConfig(hidden_size=64, target_hidden_size=64, num_aux=3, vocab_size=512, draft_vocab_size=512,
                            num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                            aux_layer_ids_nested=[1, 2, 3])
        drafter = init_random(Eagle3Drafter(cfg), 0).save(d / "drafter", "eagle")
    finally:
        torch.set_num_threads(n)
    lines = PROMPTS.read_text().splitlines()
    (d / "cap.jsonl").write_text("\n".join(lines[:CAP_LIMIT]) + "\n")
    (d / "bench.jsonl").write_text("\n".join(lines[:4]) + "\n")
    return {"target": target, "drafter": drafter, "cap_prompts": d / "cap.jsonl", "bench_prompts": d / "bench.jsonl",
            "dir": d}


def capture_argv(m: dict, name: str) -> list[str]:
    return ["capture", "--model", str(m["target"]), "--prompts", str(m["cap_prompts"]), "--limit", str(CAP_LIMIT),
            "--device", "cpu", "--sample-tokens", "512", "--name", name, "--quiet"]


def bench_argv(m: dict, name: str, seed: int) -> list[str]:
    # --seed differs per trial so that each trial runs its own paired baseline (at T = 0 outputs do not depend on it)
    return ["bench", "--target", str(m["target"]), "--drafter", str(m["drafter"]), "--prompts",
            str(m["bench_prompts"]), *BENCH_ARGS, "--device", "cpu", "--seed", str(seed), "--name", name, "--quiet"]


def start(ctx, argv: list[str], root: Path):
    p = ctx.Process(target=cli_child, args=(argv, str(root)))
    p.start()
    return p


def run_to_end(ctx, argv: list[str], root: Path, timeout: float = 240) -> float:
    t0 = time.monotonic()
    p = start(ctx, argv, root)
    p.join(timeout)
    assert p.exitcode == 0, f"{argv[0]} {argv[-2]} exited {p.exitcode}"
    return time.monotonic() - t0


# ---------------------------------------------------------------------------- result comparison

PROMPT_COLS = ["repeat", "prompt_index", "prompt_id", "category", "prompt_tokens", "output_tokens", "accepted",
               "drafts", "output_hash"]


def same_capture(ref: Path, got: Path) -> None:
    import torch
    from safetensors.torch import load_file

    a = pd.read_parquet(ref / "stats.parquet").drop(columns="run_id")
    b = pd.read_parquet(got / "stats.parquet").drop(columns="run_id")
    pd.testing.assert_frame_equal(a, b, rtol=1e-9)
    sa, sb = load_file(str(ref / "sample.safetensors")), load_file(str(got / "sample.safetensors"))
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa), got.name
    ma, mb = json.loads((ref / "manifest.json").read_text()), json.loads((got / "manifest.json").read_text())
    for k in ("tokens", "prompts", "sample_tokens", "nonfinite"):
        assert ma["headline"][k] == mb["headline"][k], (got.name, k)
    assert mb["progress"] == {"done": CAP_LIMIT, "total": CAP_LIMIT}
    assert not (got / "checkpoint.safetensors").exists()


def same_bench(ref: Path, got: Path, spec: bool) -> None:
    a = pd.read_parquet(ref / "prompts.parquet")[PROMPT_COLS]
    b = pd.read_parquet(got / "prompts.parquet")[PROMPT_COLS]
    assert not b.duplicated(["repeat", "prompt_index"]).any(), f"{got.name}: a unit recorded twice"
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
    sa = pd.read_parquet(ref / "steps.parquet").drop(columns="run_id")
    sb = pd.read_parquet(got / "steps.parquet").drop(columns="run_id")
    pd.testing.assert_frame_equal(sa.reset_index(drop=True), sb.reset_index(drop=True))
    ma, mb = json.loads((ref / "manifest.json").read_text()), json.loads((got / "manifest.json").read_text())
    for k in ("tau", "acceptance_rate", "lossless", "mismatched_prompts") if spec else ("tau",):
        assert ma["bench"].get(k) == mb["bench"].get(k), (got.name, k)


def catalog_whole(root: Path, rid: str, kind: str, ref_row_count: int) -> None:
    row = DataRoot(root).catalog.read.get_run(rid)
    assert row is not None and row["status"] == "complete", (rid, row and row["status"])
    if kind == "capture":
        assert len(DataRoot(root).catalog.read.boundary_stats([rid])) == row["n_boundaries"] == ref_row_count
    else:
        assert len(DataRoot(root).catalog.read.bench_prompts([rid])) == ref_row_count


# ---------------------------------------------------------------------------- (a) kill -9 trials


def _watch_until(root: Path, ids: list[str], until: float, seen: dict[str, set]) -> None:
    """Refresh and read the catalog (as a dashboard does) until `until`; record every status seen per run."""
    while time.monotonic() < until:
        try:
            DataRoot(root).catalog.write.refresh()
            st = DataRoot(root).catalog.read.run_states(ids)
            for r, s in zip(st["run_id"], st["status"]):
                seen.setdefault(r, set()).add(s)
        except Exception as e:  # noqa: BLE001 - a reader must never fail
            seen.setdefault("_errors", set()).add(repr(e))
        time.sleep(0.03)


def _manifest_status(root: Path, rid: str) -> str | None:
    f = root / "runs" / rid / "manifest.json"
    return json.loads(f.read_text())["status"] if f.exists() else None


def _alive(pid) -> bool:
    """A process that exists and is not a zombie."""
    try:
        return isinstance(pid, int) and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _progress(root: Path, rid: str) -> str | None:
    f = root / "runs" / rid / "manifest.json"
    if not f.exists():
        return None
    pr = json.loads(f.read_text()).get("progress") or {}
    ck = "+checkpoint" if (f.parent / "checkpoint.safetensors").exists() else ""
    jr = (f"+journal:{len((f.parent / 'journal.jsonl').read_text().splitlines())}"
          if (f.parent / "journal.jsonl").exists() else "")
    return f"{pr.get('done')}/{pr.get('total')}{ck}{jr}"


def test_kill9_at_random_points_then_resume_equals_uninterrupted(forkserver, models: dict, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    ref, root = tmp_path / "ref", tmp_path / "data"
    t0 = time.monotonic()
    t_cap = run_to_end(forkserver, capture_argv(models, "ref-cap"), ref)
    t_ben = run_to_end(forkserver, bench_argv(models, "ref-ben", 999), ref)
    ref_prompts = len(pd.read_parquet(ref / "runs" / "ref-ben" / "prompts.parquet"))
    ref_bounds = len(pd.read_parquet(ref / "runs" / "ref-cap" / "stats.parquet"))
    trials, expected = [], set()
    plan = [("capture", i) for i in range(TRIALS)] + [("bench", i) for i in range(TRIALS)]
    rng.shuffle(plan)
    for kind, i in plan:
        name = f"{'cap' if kind == 'capture' else 'ben'}-{i}"
        argv = capture_argv(models, name) if kind == "capture" else bench_argv(models, name, i)
        ids = [name] if kind == "capture" else [name, f"{name}-baseline"]
        expected.update(ids)
        delay = rng.uniform(0.05, 0.95) * (t_cap if kind == "capture" else t_ben)
        seen: dict[str, set] = {}
        p = start(forkserver, argv, root)
        _watch_until(root, ids, time.monotonic() + delay, seen)
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:                                # it finished first (the watch overshot)
            pass
        p.join(30)
        assert p.exitcode in (-signal.SIGKILL, 0), p.exitcode
        at_kill = {r: _manifest_status(root, r) for r in ids}
        progress = {r: _progress(root, r) for r in ids}
        DataRoot(root).catalog.write.refresh()
        after = DataRoot(root).catalog.read.run_states(ids)
        after = dict(zip(after["run_id"], after["status"]))
        for r in ids:
            if at_kill[r] != "complete":                         # died unfinished: never complete in the catalog
                assert "complete" not in seen.get(r, set()), (r, seen)
                assert after.get(r) in (None, "interrupted"), (r, after.get(r))
                read = DataRoot(root).catalog.read
                assert read.boundary_stats([r]).empty and read.bench_prompts([r]).empty
            else:                                                 # finished before the kill: whole already
                if kind == "capture":
                    same_capture(ref / "runs" / "ref-cap", root / "runs" / r)
                else:
                    same_bench(ref / "runs" / ("ref-ben" if r == name else "ref-ben-baseline"), root / "runs" / r,
                               spec=r == name)
        assert "_errors" not in seen, seen["_errors"]
        restarted = at_kill[name] != "complete"
        if restarted:
            run_to_end(forkserver, argv, root)
        if kind == "capture":
            same_capture(ref / "runs" / "ref-cap", root / "runs" / name)
            catalog_whole(root, name, "capture", ref_bounds)
        else:
            same_bench(ref / "runs" / "ref-ben", root / "runs" / name, spec=True)
            same_bench(ref / "runs" / "ref-ben-baseline", root / "runs" / f"{name}-baseline", spec=False)
            catalog_whole(root, name, "bench", ref_prompts)
            catalog_whole(root, f"{name}-baseline", "bench", ref_prompts)
        trials.append({"kind": kind, "name": name, "kill_after_s": round(delay, 2), "state_at_kill": at_kill,
                       "progress_at_kill": progress, "restarted": restarted})
    runs = DataRoot(root).catalog.read.list_runs()
    assert sorted(runs["run_id"]) == sorted(expected), "a run duplicated or missing"
    assert (runs["status"] == "complete").all()
    REPORT["kill9"] = {"trials": len(trials), "seed": SEED, "reference_s": {"capture": round(t_cap, 2),
                       "bench": round(t_ben, 2)}, "seconds": round(time.monotonic() - t0, 1), "detail": trials,
                       "died_unfinished": sum(any(v != "complete" for v in t["state_at_kill"].values())
                                              for t in trials)}


def test_kill9_of_the_worker_then_restart_resumes(models: dict, tmp_path: Path, monkeypatch) -> None:
    """The job worker (`python -m backend worker --once`) SIGKILLed while its job runs (a capture, then a bench);
    the next worker resumes the same run, which equals an uninterrupted one."""
    from backend.jobs import queue
    from backend.jobs.cli import submit_spec

    rng = random.Random(SEED + 1)
    root, ref = tmp_path / "data", tmp_path / "ref"
    monkeypatch.setenv("SPECLENS_MODEL_ROOTS", str(models["dir"]))
    env = {**os.environ, "SPECLENS_DATA": str(root), "SPECLENS_MODEL_ROOTS": str(models["dir"])}
    cap = {"kind": "capture", "name": "w-cap", "model": str(models["target"]), "prompts": str(models["cap_prompts"]),
           "limit": CAP_LIMIT, "device": "cpu", "sample_tokens": 512, "num_cpus": 1, "checkpoint_every": 4}
    ben = {"kind": "bench", "name": "w-ben", "target": str(models["target"]), "drafter": str(models["drafter"]),
           "prompts": str(models["bench_prompts"]), "num_spec_tokens": 3, "repeats": 2, "max_new_tokens": 12,
           "limit": 4, "device": "cpu", "num_cpus": 1, "seed": 7,
           "runner": "v1"}    # V1 reads the drafter's nested ids; V2 (vLLM's pick for Llama) would not
    import torch

    from backend.bench import run_bench
    from backend.capture import run_capture
    from backend.jobs import spec as specs

    t0 = time.monotonic()
    n = torch.get_num_threads()
    torch.set_num_threads(1)                                    # as the job child (num_cpus: 1): same float sums
    try:
        run_capture(specs.settings_object(specs.validate({**cap, "name": "r"})[0]), name="ref-cap", data=DataRoot(ref),
                    progress=False)
        run_bench(specs.settings_object(specs.validate({**ben, "name": "r"})[0]), name="ref-ben", data=DataRoot(ref),
                  progress=False)
    finally:
        torch.set_num_threads(n)
    trials = []
    for job, ids in ((cap, ["w-cap"]), (ben, ["w-ben", "w-ben-baseline"])):
        submit_spec(job, data=DataRoot(root))
        w = subprocess.Popen([sys.executable, "-m", "backend", "worker", "--once", "--poll", "0.2"], cwd=REPO_ROOT,
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120                       # wait for the job's run to exist, then a random delay
        while not (root / "runs" / ids[-1] / "manifest.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        delay = rng.uniform(0.0, 1.5)
        seen: dict[str, set] = {}
        _watch_until(root, ids, time.monotonic() + delay, seen)
        w.send_signal(signal.SIGKILL)
        w.wait(30)
        t_kill = time.monotonic()
        child = json.loads((root / "runs" / ids[-1] / "manifest.json").read_text()).get("pid")
        while _alive(child) and time.monotonic() - t_kill < 30:   # the job child dies with its worker (PDEATHSIG)
            time.sleep(0.05)
        child_gone_s = time.monotonic() - t_kill
        assert not _alive(child), f"the job child {child} outlived its worker by {child_gone_s:.1f} s"
        at_kill = {r: _manifest_status(root, r) for r in ids}
        DataRoot(root).catalog.write.refresh()
        after = DataRoot(root).catalog.read.run_states(ids)
        after = dict(zip(after["run_id"], after["status"]))
        for r in ids:
            if at_kill[r] != "complete":
                assert "complete" not in seen.get(r, set()) and after.get(r) in (None, "interrupted"), (r, seen, after)
        r = subprocess.run([sys.executable, "-m", "backend", "worker", "--once", "--poll", "0.2"], cwd=REPO_ROOT,
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        state, j = queue.find(job["name"], DataRoot(root))
        assert state == "done", (state, j)
        trials.append({"kind": job["kind"], "kill_after_s": round(delay, 2), "state_at_kill": at_kill,
                       "child_gone_after_s": round(child_gone_s, 2), "attempts": j.get("attempts")})
    same_capture(ref / "runs" / "ref-cap", root / "runs" / "w-cap")
    same_bench(ref / "runs" / "ref-ben", root / "runs" / "w-ben", spec=True)
    same_bench(ref / "runs" / "ref-ben-baseline", root / "runs" / "w-ben-baseline", spec=False)
    DataRoot(root).catalog.write.refresh()
    runs = DataRoot(root).catalog.read.list_runs()
    assert sorted(runs["run_id"]) == ["w-ben", "w-ben-baseline", "w-cap"] and (runs["status"] == "complete").all()
    REPORT["worker_kill9"] = {"trials": len(trials), "detail": trials, "seconds": round(time.monotonic() - t0, 1)}


# ---------------------------------------------------------------------------- (b) writer + 4 browser sessions


def writer_main(root: str, template: str, n: int, done_flag: str) -> None:
    """Write n runs as the CLI does: DataRoot.new_run_dir (running), the result files, complete; refresh after each."""

    src, data = Path(template), DataRoot(root)
    for i in range(n):
        kind = "bench" if i % 2 else "capture"
        tpl = src / ("spec-random" if kind == "bench" else "cap-tiny")
        m = json.loads((tpl / "manifest.json").read_text())
        for k in ("run_id", "status", "pid", "host", "created", "updated", "finished"):
            m.pop(k, None)
        rd = data.new_run_dir(f"soak-{i:04d}", {**m, "progress": {"done": 0, "total": m["progress"]["total"]}})
        data.catalog.write.refresh()
        for f in tpl.iterdir():
            if f.suffix in (".parquet", ".safetensors") or f.name == "summary.json":
                shutil.copyfile(f, rd.file("." + f.name + ".tmp"))
                os.replace(rd.file("." + f.name + ".tmp"), rd.file(f.name))
        rd.update(status="complete", progress=m["progress"])
        data.catalog.write.refresh()
    Path(done_flag).write_text("done")


async def _session(url: str, browser, k: int, stop, out: dict) -> None:
    ctx = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await ctx.new_page()
    page.set_default_timeout(90_000)
    await page.goto(url + "/")
    views = ["/runs", "/compare?runs=spec-oracle,spec-random&baseline=paired"]
    i = 0
    while not stop():
        view = views[(i + k) % 2]
        t = time.monotonic()
        await page.goto(url + view)
        await page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', state="attached")
        await page.wait_for_timeout(150)
        errors = await page.locator('[data-testid="stException"], '
                                    '[data-testid="stAlertContentError"]').all_inner_texts()
        out["loads"] += 1
        out["seconds"] += time.monotonic() - t
        # a red severity banner is a verdict the page means to show (dashboard/severity.py: "Error (tau cost ...)"),
        # not a failure of the page
        out["errors"] += [f"{view}: {e[:200]}" for e in errors if "Error (tau cost" not in e[:40]]
        i += 1
    await page.goto(url + "/runs")                             # the final look: every run listed
    await page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', state="attached")
    await page.wait_for_selector('[data-testid="stDataFrame"]')
    out["final_caption"] = await page.locator('[data-testid="stCaptionContainer"]').first.inner_text()
    await ctx.close()


def test_writer_200_runs_while_4_browsers_reload(bench_root: Path, tmp_path: Path) -> None:
    import asyncio

    from test_browser import CHROMIUM, CHROMIUM_ARGS, streamlit_server

    if not CHROMIUM.exists():
        pytest.skip("needs Debian chromium at /usr/bin/chromium")
    from playwright.async_api import async_playwright

    root = tmp_path / "data"
    shutil.copytree(bench_root / "runs", root / "runs")
    DataRoot(root).catalog.write.refresh()
    seed_runs = len(DataRoot(root).catalog.read.list_runs())
    flag = tmp_path / "writer.done"
    sessions = [{"loads": 0, "seconds": 0.0, "errors": []} for _ in range(4)]
    t0 = time.monotonic()
    with streamlit_server(root, tmp_path) as url:
        ctx = mp.get_context("spawn")
        writer = ctx.Process(target=writer_main, args=(str(root), str(bench_root / "runs"), SOAK_RUNS, str(flag)))

        async def drive() -> None:
            async with async_playwright() as p:
                browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
                writer.start()
                await asyncio.gather(*[_session(url, browser, k, lambda: flag.exists() or not writer.is_alive(),
                                                sessions[k]) for k in range(4)])
                await browser.close()

        asyncio.run(drive())
        writer.join(60)
        t_writer = time.monotonic() - t0
    assert writer.exitcode == 0 and flag.exists()
    errors = [e for s in sessions for e in s["errors"]]
    loads = sum(s["loads"] for s in sessions)
    REPORT["browser_soak"] = {"runs_written": SOAK_RUNS, "sessions": 4, "page_loads": loads, "errors": len(errors),
                              "seconds": round(t_writer, 1),
                              "mean_load_s": round(sum(s["seconds"] for s in sessions) / max(loads, 1), 2),
                              "final_captions": [s.get("final_caption") for s in sessions]}
    assert errors == [], errors[:5]
    assert all(s["loads"] >= 2 for s in sessions), [s["loads"] for s in sessions]
    total = seed_runs + SOAK_RUNS
    for s in sessions:
        assert f"of {total} runs shown" in s["final_caption"], s["final_caption"]
    runs = DataRoot(root).catalog.read.list_runs()
    assert len(runs) == total and (runs["status"] == "complete").all()
    assert sorted(r for r in runs["run_id"] if r.startswith("soak-")) == [f"soak-{i:04d}" for i in range(SOAK_RUNS)]


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    if os.environ.get("SPECLENS_RELIABILITY_REPORT") and REPORT:
        Path(os.environ["SPECLENS_RELIABILITY_REPORT"]).write_text(json.dumps(REPORT, indent=1, default=str))
