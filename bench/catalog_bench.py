"""Catalog scaling: the cost of one run's state change, and a config-only drafter check as a whole process, on
data roots of 0 to 100,000 runs.

For each size N: N synthetic run directories (manifest-only captures, as fast to write as the catalog is to
index; `--bench-runs` makes them bench runs with prompts.parquet and steps.parquet instead, as bench/pages_bench.py
writes them), the catalog built once (`db rebuild`), then:

- state changes: runs created, checkpointed and completed through backend.runs.lifecycle.Run (each change
  re-indexes that run: `CatalogWriter.refresh_runs`), each timed; the fold of a full delta into a new base
  (one per DELTA_MAX_RUNS changes) timed on its own; and, for comparison, one `refresh()` (the scan of every run
  directory) after a change;
- `python -m backend check-drafter --lint-only --json` on a config-only target, whole process (wall time and
  peak RSS of the child), against that root and against an empty root.

    python bench/catalog_bench.py [--sizes 0,10000,100000] [--changes 30] [--lint-repeats 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from backend.runs.lifecycle import Run  # noqa: E402
from backend.store import catalog as cat  # noqa: E402
from backend.store.data_root import DataRoot  # noqa: E402

DRAFTER = REPO / "tests" / "data" / "real_configs" / "specforge_llama3-8b.json"
MANIFEST = {"kind": "capture", "engine": "hf", "model": {"path": "/m", "n_layers": 2, "hidden_size": 8},
            "boundaries": ["S_0", "S_1"], "progress": {"done": 0, "total": 2}}


def build_runs(root: Path, n: int) -> float:
    """n manifest-only complete capture runs; returns the seconds it took."""
    t0 = time.perf_counter()
    runs = root / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        d = runs / f"cap-{i:06d}"
        d.mkdir(exist_ok=True)
        (d / "manifest.json").write_text(json.dumps({
            "run_id": d.name, "kind": "capture", "engine": "hf", "status": "complete", "schema_version": 1,
            "created": f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:00+00:00",
            "updated": "2026-12-01T00:00:00+00:00", "host": "synthetic", "pid": 1, "dtype": "bf16",
            "model": {"path": f"/models/t{i % 7}", "n_layers": 32, "hidden_size": 4096},
            "boundaries": ["S_2", "S_16", "S_29"], "headline": {"tokens": 1000 + i, "prompts": 8}}))
    return time.perf_counter() - t0


def target_dir(work: Path) -> Path:
    d = work / "target"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                               "num_hidden_layers": 32, "hidden_size": 4096,
                                               "vocab_size": 128256}))
    return d


def lint_process(root: Path, target: Path, repeats: int) -> dict:
    """Whole-process wall time (and the child's peak RSS) of a config-only check against this data root."""
    env = {**os.environ, "SPECLENS_DATA": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "backend", "check-drafter", "--drafter", str(DRAFTER), "--target", str(target),
           "--lint-only", "--json"]
    times, rss = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:                                   # a child of its own, so its max RSS is its own
            out = os.open(os.devnull, os.O_WRONLY)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.chdir(REPO)
            os.execve(sys.executable, cmd, env)
        _, status, ru = os.wait4(pid, 0)
        times.append(time.perf_counter() - t0)
        rss.append(ru.ru_maxrss / 1024)
        if os.waitstatus_to_exitcode(status) != 0:
            err = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True).stderr
            raise SystemExit(f"check-drafter --lint-only failed on {root}: {err.strip()[-500:]}")
    return {"seconds_median": round(statistics.median(times), 3), "seconds_min": round(min(times), 3),
            "seconds_all": [round(t, 3) for t in times], "peak_rss_mb": round(max(rss))}


def state_changes(root: Path, changes: int) -> dict:
    """Create, checkpoint and complete `changes` runs through Run; every state change timed (ms)."""
    per: list[float] = []
    for i in range(changes):
        t0 = time.perf_counter()
        run = Run.create(f"change-{i:04d}", MANIFEST, DataRoot(root))
        t1 = time.perf_counter()
        run.progress(1, 2, checkpoint=True)
        t2 = time.perf_counter()
        run.complete(headline={"tokens": i})
        t3 = time.perf_counter()
        per += [t1 - t0, t2 - t1, t3 - t2]
    ms = sorted(1000 * t for t in per)
    return {"changes": len(ms), "ms_median": round(statistics.median(ms), 1),
            "ms_p90": round(ms[int(0.9 * (len(ms) - 1))], 1), "ms_max": round(ms[-1], 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="0,10000,100000")
    ap.add_argument("--changes", type=int, default=30)
    ap.add_argument("--lint-repeats", type=int, default=5)
    ap.add_argument("--work")
    ap.add_argument("--out")
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="catalog-bench-"))
    target = target_dir(work)
    empty = work / "empty"
    empty.mkdir(exist_ok=True)
    res = {"bench": "catalog", "date": time.strftime("%Y-%m-%d"), "cpu": platform.processor() or platform.machine(),
           "cores": os.cpu_count(), "load_before": os.getloadavg(), "delta_max_runs": cat.DELTA_MAX_RUNS,
           "lint_empty_root": lint_process(empty, target, a.lint_repeats), "sizes": {}}
    for n in [int(s) for s in a.sizes.split(",")]:
        root = work / f"root-{n}"
        if root.exists():
            shutil.rmtree(root)
        root.mkdir()
        write_s = build_runs(root, n)
        data = DataRoot(root)
        t0 = time.perf_counter()
        data.catalog.write.refresh(full=True)
        rebuild_s = time.perf_counter() - t0
        size_mb = (root / "speclens.duckdb").stat().st_size / 2**20
        row = {"runs": n, "write_s": round(write_s, 1), "rebuild_s": round(rebuild_s, 2),
               "catalog_mb": round(size_mb, 1), "state_change": state_changes(root, a.changes)}
        t0 = time.perf_counter()                                  # the fold of a full delta into a new base
        cat._write_base(data.paths, cat._Plan([], [], []))
        row["fold_s"] = round(time.perf_counter() - t0, 3)
        row["fold_amortised_ms"] = round(1000 * row["fold_s"] / cat.DELTA_MAX_RUNS, 2)
        Run.create("scan-probe", MANIFEST, data)
        t0 = time.perf_counter()                                  # the scan of every run directory, as before
        data.catalog.write.refresh()
        row["full_scan_refresh_s"] = round(time.perf_counter() - t0, 3)
        t0 = time.perf_counter()
        listed = len(data.catalog.read.list_runs())
        row["read_list_runs_s"] = round(time.perf_counter() - t0, 3)
        assert listed == n + a.changes + 1, (listed, n)
        row["lint"] = lint_process(root, target, a.lint_repeats)
        row["lint_minus_empty_s"] = round(row["lint"]["seconds_median"] - res["lint_empty_root"]["seconds_median"], 3)
        res["sizes"][str(n)] = row
        print(json.dumps({str(n): row}), file=sys.stderr)
    res["load_after"] = os.getloadavg()
    res["peak_rss_mb_bench"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(res))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
