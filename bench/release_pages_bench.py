"""The Feeds and Regression pages in a real browser: first chart time and screenshots.

Builds the toy-pair release data of tests/test_release_pages.py (benches under two engine readings, a planted
drop, a drafter check of the after-layer drafter) in a data root, or uses --root; serves the dashboard
(`python -m dashboard.serve`, as bench/pages_bench.py does) and opens each view `--repeats` times in a fresh browser
context (Debian chromium through Playwright): seconds from navigation to the first chart attached and to the
script's end. Saves one screenshot per view to --shots. Prints JSON.

    python bench/release_pages_bench.py [--root DIR] [--shots DIR] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from pages_bench import CHART, CHROMIUM_ARGS, _serve, _stop, time_view  # noqa: E402

VIEWS = (("feeds", "/feeds"), ("feeds-by-check", "/feeds?check=chk-after"), ("regression", "/regression?group=0"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", help="an existing data root (default: build the toy release data in a temp dir)")
    ap.add_argument("--shots", help="write a screenshot per view here")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    if a.root:
        root = Path(a.root)
    else:
        from tests.test_release_pages import build_release_data
        root = Path(tempfile.mkdtemp(prefix="release-pages-")) / "data"
        root.mkdir(parents=True)
        t = time.perf_counter()
        build_release_data(root)
        print(f"built the toy release data in {time.perf_counter() - t:.0f} s: {root}", file=sys.stderr)
    shots = Path(a.shots) if a.shots else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    proc, url = _serve(REPO / "app.py", REPO, {**os.environ, "SPECLENS_DATA": str(root)}, root.parent / "streamlit.log")
    out: dict = {"root": str(root), "load_avg_before": list(os.getloadavg()), "cpus": os.cpu_count(),
                 "command": "python bench/release_pages_bench.py " + " ".join(sys.argv[1:]),
                 "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "floor_note": "bench/pages_bench.py measures this machine's floor (a bare app with one plotly chart): "
                               "3.0-3.2 s in docs/results/pages_bench_cpu.json"}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
            warm = browser.new_context(viewport={"width": 1440, "height": 1000})
            pg = warm.new_page()
            pg.goto(url + "/feeds")                 # modules imported once, as on a running server
            pg.wait_for_selector(CHART, timeout=120_000)
            warm.close()
            res = {n: {"first_chart_s": [], "script_done_s": [], "exceptions": 0} for n, _ in VIEWS}
            for rep in range(a.repeats):
                for name, path in VIEWS:
                    first, done, exc = time_view(browser, url + path, CHART, height=1400, settle_ms=1500,
                                                 full_page=True,
                                                 shot=shots / f"{name}.png" if shots and rep == 0 else None)
                    res[name]["first_chart_s"].append(first)
                    res[name]["script_done_s"].append(done)
                    res[name]["exceptions"] += exc
            for name, r in res.items():
                f = sorted(r["first_chart_s"])
                out[name] = {**r, "median_first_chart_s": f[len(f) // 2]}
            browser.close()
    finally:
        _stop(proc)
    out["load_avg_after"] = list(os.getloadavg())
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
