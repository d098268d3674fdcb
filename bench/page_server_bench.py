"""Server-side pieces of a page view on a large data root, timed in one process (the pages' own functions, no
browser): the rescan of the run directories when nothing changed (the first in the process and the ones after it),
and the build time of the Serving-load, Compare and run pages' figures. Prints JSON (medians of --repeats, ms).

    python bench/page_server_bench.py --root DATA [--repeats 7]     # DATA: bench/pages_bench.py --root DATA --keep

To compare two versions, copy this file into a checkout of the other version and run it there on the same DATA.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LOAD_RUN = "h200-vllm-sweep"
BENCH_RUNS = ["bench-00001-d07", "bench-00002-d14", "bench-00011-d17"]


def _ms(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return round(statistics.median(ts) * 1000, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    os.environ["SPECLENS_DATA"] = str(a.root)
    from backend import compare
    from backend.store.data_root import DataRoot
    from dashboard import charts, load_charts

    data = DataRoot(a.root)
    out: dict = {"root": str(a.root), "repeats": a.repeats, "load_avg_before": list(os.getloadavg())}
    t = time.perf_counter()
    data.catalog.write.refresh()
    out["rescan_first_ms"] = round((time.perf_counter() - t) * 1000, 1)
    out["rescan_again_ms"] = _ms(data.catalog.write.refresh, a.repeats)
    cat = data.catalog.read
    cells, levels = cat.load_cells([LOAD_RUN]), cat.load_levels([LOAD_RUN])
    cmp = compare.compare(BENCH_RUNS, data=data)
    acc = compare.load_acceptance([BENCH_RUNS[1]], data)
    figures = {
        "load.speedup": lambda: load_charts.speedup_figure(cells),
        "load.pareto": lambda: load_charts.pareto_figure(cells),
        "load.latency": lambda: load_charts.latency_figure(levels),
        "load.acceptance": lambda: load_charts.acceptance_figure(cells),
        "compare.throughput": lambda: charts.throughput_bars(cmp.figures),
        "compare.speedup": lambda: charts.speedup_chart(cmp.figures, "each run's paired baseline"),
        "compare.latency": lambda: charts.latency_chart(cmp.figures),
        "compare.category": lambda: charts.category_chart(cmp.categories, cmp.run_ids),
        "run.accepted_histogram": lambda: charts.accepted_histogram(acc.histogram, acc.run_ids),
        "run.acceptance_curves": lambda: charts.acceptance_curves(acc.positions, acc.run_ids),
    }
    for f in figures.values():
        f()                                           # first builds (imports, templates) left out
    out["figure_build_ms"] = {name: _ms(f, a.repeats) for name, f in figures.items()}
    out["figure_build_ms_total"] = round(sum(out["figure_build_ms"].values()), 1)
    out["load_avg_after"] = list(os.getloadavg())
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
