"""A/B of dashboard variants in a real browser: time to a view's first chart (Runs and run pages: first table) for two
or more copies of the app (each a folder holding app.py, pages/, dashboard/, backend/, .streamlit/: a git worktree or
a copy with one change), served side by side on one data root and opened in interleaved rounds, each round starting
with the bare one-chart floor (bench/pages_bench.py's FLOOR_APP). What pages_bench.py cannot tell apart at one
variant per run (this VM's speed drifts by more than a change is worth between two runs) shows here as a paired
difference per round.

    python bench/pages_ab.py --root DATA --variant /tmp/before --variant /work/main \\
        --path /compare --path '/run?id=bench-00002-d14' [--rounds 5]

Prints, per variant and path, the median first paint, its gap to the floor's median and the median over rounds of
(view - the same round's floor); load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from pages_bench import CHART, CHROMIUM_ARGS, FLOOR_APP, TABLE, _serve, _stop, time_view  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, required=True, help="data root (e.g. pages_bench.py --root DIR --keep)")
    ap.add_argument("--variant", type=Path, action="append", required=True, help="an app tree; give two or more")
    ap.add_argument("--path", action="append", required=True,
                    help="a view, e.g. /compare or '/load?run=X'; waited on until its first chart (Runs and run pages: "
                         "first table), or as a prefix says: 'chart:/run?id=X', 'table:/compare'")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", type=Path, default=Path("/tmp/pages-ab"))
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright

    a.work.mkdir(parents=True, exist_ok=True)
    (a.work / "floor_app.py").write_text(FLOOR_APP)
    env = {**os.environ, "SPECLENS_DATA": str(a.root)}
    load_before = os.getloadavg()
    servers = {"floor": _serve(a.work / "floor_app.py", a.work, env, a.work / "floor.log")}
    for i, v in enumerate(a.variant):
        servers[f"{i}:{v}"] = _serve(v.resolve() / "app.py", v.resolve(), env, a.work / f"variant{i}.log")
    times: dict[str, list[float]] = {}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
            for _, url in servers.values():                 # first load of `/` (streamlit issue #8860)
                ctx = browser.new_context()
                ctx.new_page().goto(url + "/")
                time.sleep(2)
                ctx.close()
            for _ in range(a.rounds):
                times.setdefault("floor", []).append(time_view(browser, servers["floor"][1] + "/", CHART)[0])
                for path in a.path:
                    what, _, url_path = path.partition(":") if path.startswith(("chart:", "table:")) else ("", "", path)
                    sel = {"chart": CHART, "table": TABLE}.get(what) or (TABLE if path.startswith("/run") else CHART)
                    for name, (_, url) in servers.items():
                        if name != "floor":
                            times.setdefault(f"{name} {path}", []).append(
                                time_view(browser, url + url_path, sel)[0])
            browser.close()
    finally:
        for proc, _ in servers.values():
            _stop(proc)
    floor = times["floor"]
    print(f"floor: median {statistics.median(floor):.3f} s {floor}")
    for key, v in times.items():
        if key != "floor":
            paired = statistics.median(x - f for x, f in zip(v, floor))
            print(f"{key}: median {statistics.median(v):.3f} s, minus the floor "
                  f"{statistics.median(v) - statistics.median(floor):+.3f} s, paired {paired:+.3f} s  {v}")
    print(f"load average before {[round(x, 2) for x in load_before]}, after "
          f"{[round(x, 2) for x in os.getloadavg()]}")


if __name__ == "__main__":
    main()
