"""Dashboard page speed on a large catalog: 10,000 bench runs and 10 million per-step rows, beside the serving-load
runs recorded on the H200 (tests/data/recorded/load/: the Serving load view).

1. Builds a synthetic data root: run directories as backend/bench.py writes them (manifest.json with the bench
   figures, steps.parquet, prompts.parquet; annotations.json with tags on some runs and a pinned baseline per
   target), numbers random but consistent (tau from the steps, tokens/s rising with it). Groups of 10 runs share
   a target, dataset and paired baseline (1 plain-decoding baseline + 9 drafter runs).
2. Builds the catalog with the project's own `DataRoot(root).catalog.write.refresh(full=True)` (timed), then times the
   incremental refresh with nothing changed (what the Runs page does on every render) and after one annotation edit.
3. Per page view: the first server-side render with streamlit's AppTest, in a fresh process each (cold: the
   process imports the app's modules) and a second fresh AppTest in the same process (warm: a running server
   has imported them), and a one-line script for AppTest's own fixed cost; then in a real browser (`streamlit
   run` without file watcher + Playwright with Debian chromium, a fresh browser context per try, --repeats
   rounds) the time from navigation until the first chart is in the page (Runs has no chart: its runs table; the run
   page: its first table, and as a view of its own its first chart), and
   at the start of every round the same for a bare streamlit app holding one plotly chart, served beside it (this
   machine's floor, interleaved so that a drift of the machine moves both).
4. Prints JSON: sizes, build and query times, timings per view with each view's median minus the floor's median
   (the bar: <= 0.5 s) and the median of its per-round differences, peak memory (this process, the AppTest
   processes, the streamlit server), load average before and after.

    python bench/pages_bench.py [--runs 10000] [--steps 10000000] [--root DIR] [--keep] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from backend import annotations  # noqa: E402
from backend.netutil import free_port  # noqa: E402
from backend.store.data_root import DataRoot  # noqa: E402

K = 4
PROMPTS = 24                        # per run and repeat
REPEATS = 2
GROUP = 10                          # runs per (target, dataset, baseline): 1 baseline + 9 drafter runs
TARGETS = ["Llama-3.1-8B-Instruct", "Qwen3-8B", "Llama-3.3-70B-Instruct", "Qwen3-32B", "DeepSeek-V3"]
DATASETS = ["question.jsonl", "mt_bench.jsonl", "gsm8k.jsonl"]
ENGINES = [("vllm", "0.24.0"), ("vllm", "0.23.1"), ("sglang", "0.5.23"), ("hf", None)]
CATEGORIES = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
              "translation", "summarization", "qa", "math_reasoning", "rag"]
TAGS = ["nightly", "h200", "ablation", "fp8", "long-ctx", "release", "eagle3", "tree", "baseline-check", "v2"]
CHART = '[data-testid="stPlotlyChart"] .js-plotly-plot .main-svg'
TABLE = '[data-testid="stDataFrame"] canvas, [data-testid="stTable"] table'   # a grid, or an HTML table


# ---------------------------------------------------------------------- synthetic data root


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, sort_keys=True))


def build_root(root: Path, n_runs: int, n_steps: int, seed: int = 0) -> dict:
    """n_runs bench run directories holding about n_steps per-step rows in all."""
    rng = np.random.default_rng(seed)
    runs_dir = root / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    n_spec = n_runs - n_runs // GROUP
    steps_per_unit = max(1, round(n_steps / max(1, n_spec) / (PROMPTS * REPEATS)))
    cats = [CATEGORIES[i % len(CATEGORIES)] for i in range(PROMPTS)]
    prompt_ids = [str(100 + i) for i in range(PROMPTS)]
    total_steps, t0 = 0, time.perf_counter()
    for g in range(0, n_runs, GROUP):
        target = TARGETS[(g // GROUP) % len(TARGETS)]
        dataset = DATASETS[(g // GROUP) % len(DATASETS)]
        engine, version = ENGINES[(g // GROUP) % len(ENGINES)]
        base_speed = float(rng.uniform(40, 120))
        base_id = f"bench-{g:05d}-baseline"
        for j in range(min(GROUP, n_runs - g)):
            i = g + j
            spec = j > 0
            run_id = f"bench-{i:05d}-d{(i * 7) % 20:02d}" if spec else base_id
            p_acc = float(rng.uniform(0.2, 0.85)) if spec else 0.0
            d = runs_dir / run_id
            d.mkdir(exist_ok=True)
            # per-step accepted lengths: a chain accepts a prefix, each draft with probability p_acc
            units = PROMPTS * REPEATS
            n = steps_per_unit * units if spec else 0
            acc = np.minimum(rng.geometric(1 - p_acc, n) - 1, K) if spec else np.zeros(0, dtype=np.int64)
            unit = np.repeat(np.arange(units), steps_per_unit) if spec else np.zeros(0, dtype=np.int64)
            step = np.tile(np.arange(steps_per_unit), units) if spec else np.zeros(0, dtype=np.int64)
            pq.write_table(pa.table({                 # a baseline's is empty, as backend/bench.py writes it
                "run_id": pa.array([run_id] * n, pa.string()), "repeat": (unit // PROMPTS).astype(np.int64),
                "prompt_id": pa.array([prompt_ids[u % PROMPTS] for u in unit], pa.string()),
                "step": step.astype(np.int64), "accepted": acc.astype(np.int64)}), d / "steps.parquet")
            per_unit_acc = np.bincount(unit, weights=acc, minlength=units).astype(np.int64)
            tau = 1 + acc.mean() if spec else 1.0
            tps = base_speed * (tau * 0.8 if spec else 1.0) * rng.uniform(0.85, 1.15, units)
            out_tok = rng.integers(100, 512, units)
            pq.write_table(pa.table({
                "run_id": pa.array([run_id] * units), "repeat": np.repeat(np.arange(REPEATS), PROMPTS).astype(np.int64),
                "prompt_index": np.tile(np.arange(PROMPTS), REPEATS).astype(np.int64),
                "prompt_id": pa.array(prompt_ids * REPEATS), "category": pa.array(cats * REPEATS),
                "prompt_tokens": rng.integers(20, 800, units), "output_tokens": out_tok,
                "seconds": out_tok / tps, "tokens_per_s": tps, "ttft": rng.uniform(0.01, 0.2, units),
                "tpot": 1 / tps, "accepted": per_unit_acc,
                "drafts": np.full(units, steps_per_unit if spec else 0, dtype=np.int64),
                "output_hash": pa.array([f"{h:016x}" for h in rng.integers(0, 2**62, units)])}), d / "prompts.parquet")
            speedup = tau * 0.8 if spec else None
            _write_json(d / "manifest.json", {
                "run_id": run_id, "kind": "bench", "engine": engine, "engine_version": version, "status": "complete",
                "created": f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:00+00:00",
                "updated": "2026-12-01T00:00:00+00:00", "host": "synthetic", "pid": 1, "schema_version": 1,
                "error": None, "dtype": "bf16", "device": "cuda:0", "dataset": dataset,
                "model": {"path": f"/models/{target}", "model_type": "llama", "n_layers": 32, "hidden_size": 4096},
                "drafter": ({"path": f"/drafters/{target}-eagle3-d{(i * 7) % 20:02d}", "format": "eagle"}
                            if spec else None),
                "aux": {"ids": [2, 16, 29], "boundaries": ["S_2", "S_16", "S_29"]} if spec else None,
                "settings": {"num_spec_tokens": K if spec else None, "max_new_tokens": 512, "temperature": 0.0,
                             "repeats": REPEATS, "seed": i % 3},
                "repeats": REPEATS, "num_spec_tokens": K if spec else 0, "temperature": 0.0,
                "baseline_run": base_id if spec else None,
                "progress": {"done": units, "total": units},
                "headline": {"tokens": int(out_tok.sum()), "prompts": PROMPTS, "seconds": float((out_tok / tps).sum())},
                "bench": {"tau": tau, "acceptance_rate": (acc.mean() / K) if spec else None,
                          "tokens_per_s": float(tps.mean()), "ttft": 0.05, "tpot": float((1 / tps).mean()),
                          "speedup": {"mean": speedup, "std": 0.02, "ci_low": speedup - 0.05, "ci_high": speedup + 0.05,
                                      "per_repeat": [speedup, speedup]} if spec else None,
                          "lossless": True if spec else None, "mismatched_prompts": 0 if spec else None}})
            if i % 10 == 3:
                _write_json(d / annotations.FILE, {"tags": list(rng.choice(TAGS, 2, replace=False)), "notes": "",
                                                    "pinned": False, "updated": "2026-12-01T00:00:00+00:00"})
            if g < len(TARGETS) * GROUP and not spec:        # one pinned baseline per target
                _write_json(d / annotations.FILE, {"tags": ["pinned-baseline"], "notes": "", "pinned": True,
                                                    "updated": "2026-12-01T00:00:00+00:00"})
            total_steps += n
        if g and g % 2000 == 0:
            print(f"  {g} runs written ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return {"runs": n_runs, "step_rows": int(total_steps), "prompt_rows": n_runs * PROMPTS * REPEATS,
            "write_s": round(time.perf_counter() - t0, 1)}


# ---------------------------------------------------------------------- AppTest first render


VIEWS = [("runs", "pages/runs.py", {}),
         ("runs?kind=bench&tag=nightly", "pages/runs.py", {"kind": "bench", "tag": "nightly"}),
         ("compare", "pages/compare.py", {}),
         ("compare?runs=3&baseline=pinned", "pages/compare.py",
          {"runs": "bench-00001-d07,bench-00002-d14,bench-00011-d17", "baseline": "pinned"}),
         ("compare?runs=3&view=Speed", "pages/compare.py",
          {"runs": "bench-00001-d07,bench-00002-d14,bench-00011-d17", "view": "Speed"}),
         ("run?id=bench-00002-d14", "pages/run.py", {"id": "bench-00002-d14"}),
         # the run page's first table (above) and its first chart (the browser half times both; AppTest once)
         ("run?id=bench-00002-d14 chart", "pages/run.py", {"id": "bench-00002-d14"}),
         ("load?run=h200-vllm-sweep", "pages/load.py", {"run": "h200-vllm-sweep"})]
# the serving-load runs recorded on the H200 (tests/data/recorded/load/), copied beside the bench runs
LOAD_RUNS = REPO / "tests" / "data" / "recorded" / "load"


def add_load_runs(root: Path) -> list[str]:
    """Copy the recorded load runs (K 1/2/4 x concurrency 1/8/32/64 sweep, the K=4 pair) into the data root."""
    out = []
    for name in ("h200-vllm-sweep", "h200-vllm-pair"):
        if not (root / "runs" / name).exists():
            shutil.copytree(LOAD_RUNS / name, root / "runs" / name)
        out.append(name)
    return out

_APPTEST = r"""
import json, resource, sys, time
from streamlit.runtime.pages_manager import PagesManager
from streamlit.testing.v1 import AppTest
page, params = sys.argv[1], json.loads(sys.argv[2])
# app.py routes with st.navigation, as `python -m dashboard.serve` serves it (its main() sets this flag): the page runs
# inside app.py (page setup, one catalog connection per page run). AppTest resets the flag on every run, and a pages/
# folder beside app.py then makes it run the page script alone, each catalog query opening the catalog again.
_pm_init = PagesManager.__init__
def _navigation_mode(self, *a, **kw):
    _pm_init(self, *a, **kw)
    PagesManager.uses_pages_directory = False
PagesManager.__init__ = _navigation_mode
out = {}
labels = ("cold", "warm")
components = None
if len(sys.argv) > 4 and sys.argv[4] == "preload":      # what `python -m dashboard.serve` does before serving
    from dashboard.serve import preload
    from streamlit.components.v2.component_manager import BidiComponentManager
    t0 = time.perf_counter()
    out["preload_s"] = round(preload(), 3)
    # a server scans installed packages for components once, at start; AppTest does it in every new AppTest
    components = BidiComponentManager()
    components.discover_and_register_components(start_file_watching=False)
    out["server_start_s"] = round(time.perf_counter() - t0, 3)
    labels = ("after_start",)
for label in labels:
    at = AppTest.from_file(sys.argv[3], default_timeout=300)
    if components is not None:
        at._bidi_component_manager = components
    for k, v in params.items():
        at.query_params[k] = v
    at.switch_page(page)
    t = time.perf_counter()
    at.run()
    out[label + "_s"] = round(time.perf_counter() - t, 3)
    out["exceptions"] = [str(e.value)[:200] for e in at.exception]
    out["errors"] = [str(e.value)[:200] for e in at.error]
    out["charts"] = len(at.get("plotly_chart"))
out["peak_rss_mb"] = [round(int(l.split()[1]) / 1024) for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(json.dumps(out))
"""


_HARNESS = r"""
import json, sys, time
from streamlit.testing.v1 import AppTest
at = AppTest.from_string("import streamlit as st\nst.write('x')", default_timeout=300)
t = time.perf_counter()
at.run()
print(json.dumps({"cold_s": round(time.perf_counter() - t, 3)}))
"""


def apptest_harness() -> float | None:
    """A cold AppTest run of a one-line script: AppTest's own fixed cost in a fresh process."""
    r = subprocess.run([sys.executable, "-c", _HARNESS], capture_output=True, text=True, timeout=300)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])["cold_s"]
    except (IndexError, json.JSONDecodeError, KeyError):
        return None


def apptest_views(root: Path) -> dict:
    env = {**os.environ, "SPECLENS_DATA": str(root), "PYTHONPATH": str(REPO)}
    out = {}
    for name, page, params in VIEWS:
        if name.endswith(" chart"):
            continue
        out[name] = {}
        for mode in ("plain", "preload"):
            r = subprocess.run([sys.executable, "-c", _APPTEST, page, json.dumps(params), str(REPO / "app.py"), mode],
                               env=env, capture_output=True, text=True, cwd=REPO, timeout=600)
            try:
                out[name].update(json.loads(r.stdout.strip().splitlines()[-1]))
            except (IndexError, json.JSONDecodeError):
                out[name][f"failed_{mode}"] = r.stderr[-1500:]
    return out


# ---------------------------------------------------------------------- browser first paint




def _peak_rss_mb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024)
    except OSError:
        return None
    return None


CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
                 "--no-first-run", "--disable-component-update", "--disable-sync"]
FLOOR_APP = """import plotly.graph_objects as go
import streamlit as st
st.plotly_chart(go.Figure(go.Bar(x=[0, 1, 2, 3], y=[0.4, 0.2, 0.2, 0.2])))
"""


def _serve(app: Path, cwd: Path, env: dict, log: Path) -> tuple[subprocess.Popen, str]:
    """`streamlit run` on a free port (no file watcher: on a big tree its inotify reconciling costs seconds). A
    dashboard tree's app.py (this repository's, or a copy's for bench/pages_ab.py) is served as `make serve` serves
    it, `python -m dashboard.serve` run in `cwd` = the tree, so that it imports that tree's modules."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    launcher = ["-m", "dashboard.serve"] if app.name == "app.py" else ["-m", "streamlit", "run", str(app)]
    proc = subprocess.Popen([sys.executable, *launcher, "--server.headless", "true",
                             "--server.port", str(port), "--server.address", "127.0.0.1",
                             "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
                            cwd=cwd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    break
        except OSError:
            time.sleep(0.3)
    return proc, url


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def time_view(browser, url: str, selector: str, height: int = 1000, shot: Path | None = None,
              settle_ms: int = 1000, full_page: bool = False) -> tuple[float, float, int]:
    """One view in a fresh browser context (cold cache): seconds to the first `selector`, seconds until the script
    is done, and the exceptions the page shows; a screenshot to `shot` when given."""
    ctx = browser.new_context(viewport={"width": 1440, "height": height})
    pg = ctx.new_page()
    t = time.perf_counter()
    pg.goto(url)
    pg.wait_for_selector(selector, state="attached", timeout=120_000)
    first = round(time.perf_counter() - t, 3)
    pg.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', state="attached",
                         timeout=120_000)
    done = round(time.perf_counter() - t, 3)
    exc = pg.locator('[data-testid="stException"]').count()
    if shot is not None:
        pg.wait_for_timeout(settle_ms)
        pg.screenshot(path=str(shot), full_page=full_page)
    ctx.close()
    return first, done, exc


def _painted(view: str) -> str:
    """What a view's first paint is timed on: Runs and the run page their first table (a grid or an HTML table), the
    run page also its first chart (the view named '... chart'), every other view its first chart."""
    return "table" if view.startswith("run") and not view.endswith(" chart") else "chart"


def browser_views(root: Path, shots: Path | None, repeats: int = 3) -> tuple[dict, list[float]]:
    """Each view `repeats` times, in rounds over the views, each time in a fresh browser context (cold cache):
    seconds from navigation to the first chart (Runs: the runs table) attached, and to the script's end; the
    median first paint. Each round starts with the floor: a bare streamlit app holding one plotly chart, served
    beside the dashboard (what this machine's browser and streamlit cost before any SpecLens code runs), so a
    drift of the machine's speed during the run moves the floor with the views. Returns (views, floor tries)."""
    from playwright.sync_api import sync_playwright

    work = root.parent
    (work / "floor_app.py").write_text(FLOOR_APP)
    floor_proc, floor_url = _serve(work / "floor_app.py", work, dict(os.environ), work / "floor.log")
    proc, url = _serve(REPO / "app.py", REPO, {**os.environ, "SPECLENS_DATA": str(root)}, root.parent / "streamlit.log")
    out: dict = {}
    floor: list[float] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
            warm = browser.new_context(viewport={"width": 1440, "height": 1000})
            pg = warm.new_page()
            pg.goto(url + "/")                    # first load of `/` (streamlit issue #8860); modules imported
            pg.wait_for_selector(TABLE, timeout=120_000)
            warm.close()
            # rounds over the views (view 1..n, then again), not one view's tries in a row: load that drifts during
            # the run (another process, the catalog's first reads) then spreads over every view instead of one
            floor_warm = browser.new_context()
            floor_warm.new_page().goto(floor_url + "/")
            floor_warm.close()
            res = {name: {"first_paint_s": [], "script_done_s": [], "exceptions": 0} for name, _, _ in VIEWS}
            for rep in range(repeats):
                floor.append(time_view(browser, floor_url + "/", CHART)[0])
                for name, _, params in VIEWS:
                    query = "&".join(f"{k}={v}" for k, v in params.items())
                    path = "/" + name.split("?")[0] + (f"?{query}" if query else "")
                    sel = TABLE if _painted(name) == "table" else CHART
                    shot = (shots / f"bench-{list(res).index(name) + 1}-{name.split('?')[0]}.png"
                            if shots and rep == 0 else None)
                    first, done, exc = time_view(browser, url + path, sel, shot=shot)     # cold cache
                    res[name]["first_paint_s"].append(first)
                    res[name]["script_done_s"].append(done)
                    res[name]["exceptions"] += exc
            floor_median = statistics.median(floor)
            for name, r in res.items():
                firsts = r["first_paint_s"]
                median = statistics.median(firsts)
                out[name] = {**r, "median_s": round(median, 3),
                             "painted": _painted(name),
                             "minus_floor_s": round(median - floor_median, 3),      # the bar: <= 0.5 s
                             "minus_floor_paired_s": round(statistics.median(            # the same round's floor
                                 [v - f for v, f in zip(firsts, floor)]), 3)}
            browser.close()
        out["server_peak_rss_mb"] = _peak_rss_mb(proc.pid)
    finally:
        _stop(proc)
        _stop(floor_proc)
    return out, floor


# ---------------------------------------------------------------------- main


def _timed(fn, *a, **kw) -> tuple[object, float]:
    t = time.perf_counter()
    r = fn(*a, **kw)
    return r, round(time.perf_counter() - t, 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=10_000_000)
    ap.add_argument("--root", type=Path, default=None, help="data root to build (or reuse when it has a catalog)")
    ap.add_argument("--keep", action="store_true", help="keep the data root")
    ap.add_argument("--shots", type=Path, default=None, help="folder for screenshots of each view")
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--repeats", type=int, default=3, help="browser tries per view (in rounds over the views)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()

    result: dict = {"load_avg_before": list(os.getloadavg()), "cpus": os.cpu_count()}
    tmp = a.root is None
    root = (Path(tempfile.mkdtemp(prefix="pages-bench-")) / "data") if tmp else a.root
    try:
        if (root / "speclens.duckdb").exists():
            result["data"] = {"reused": str(root)}
        else:
            result["data"] = build_root(root, a.runs, a.steps)
            result["data"]["load_runs"] = add_load_runs(root)
            _, result["data"]["catalog_full_refresh_s"] = _timed(DataRoot(root).catalog.write.refresh, full=True)
        result["data"]["catalog_mb"] = round((root / "speclens.duckdb").stat().st_size / 2**20, 1)
        result["data"]["runs_dir_mb"] = round(sum(f.stat().st_size for f in (root / "runs").rglob("*") if f.is_file())
                                              / 2**20, 1)
        _, result["data"]["refresh_nothing_changed_s"] = _timed(DataRoot(root).catalog.write.refresh)
        os.environ["SPECLENS_DATA"] = str(root)
        some = "bench-00013-d11"
        _, result["data"]["annotation_save_s"] = _timed(annotations.save, some, tags="bench-edit",
                                                               data=DataRoot(root))
        _, result["data"]["refresh_after_one_edit_s"] = _timed(DataRoot(root).catalog.write.refresh)
        ids = ["bench-00001-d07", "bench-00002-d14", "bench-00011-d17"]
        # a data root and its catalog built per query, as the page code did with Catalog(root) before
        queries = {"runs_overview": lambda: DataRoot(root).catalog.read.runs_overview(),
                   "bench_histogram_3_runs": lambda: DataRoot(root).catalog.read.bench_histogram(ids),
                   "bench_categories_3_runs": lambda: DataRoot(root).catalog.read.bench_categories(ids),
                   "bench_runs_all": lambda: DataRoot(root).catalog.read.bench_runs(),
                   "load_cells_and_levels_sweep": lambda: (DataRoot(root).catalog.read.load_cells(["h200-vllm-sweep"]),
                                                           DataRoot(root).catalog.read.load_levels(["h200-vllm-sweep"]))}
        result["queries_s"] = {k: _timed(q)[1] for k, q in queries.items()}
        result["apptest_first_render"] = apptest_views(root)
        result["apptest_harness_one_line_script_cold_s"] = apptest_harness()
        if not a.no_browser:
            if a.shots:
                a.shots.mkdir(parents=True, exist_ok=True)
            views, floor = browser_views(root, a.shots, a.repeats)
            result["browser_first_paint"] = views
            result["browser_floor_one_chart_s"] = floor
            gaps = [v["minus_floor_s"] for v in views.values() if isinstance(v, dict)]
            result["max_minus_floor_s"] = max(gaps)
        result["bench_process_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        result["load_avg_after"] = list(os.getloadavg())
        result["bar"] = {"apptest_first_render_max_s": 1.0, "browser_first_paint_max_s": 4.0,
                         "max_minus_floor_s": 0.5}
    finally:
        if tmp and not a.keep:
            shutil.rmtree(root.parent, ignore_errors=True)
        elif tmp:
            result["root"] = str(root)
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
