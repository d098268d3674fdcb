"""Where a page's time to its first chart goes in the browser: for each view, in a fresh Chromium context, when the
server's messages arrive on the websocket (the first, the one that carries the first chart's figure or table, the
last of the script) against when the chart is in the page, and, from a Chromium trace of the same load, how long the
page's main thread was busy and on what (module evaluation, JavaScript calls, style and layout). The bare one-chart
floor app (bench/pages_bench.py's FLOOR_APP) is measured the same way, first.

    python bench/page_timeline.py --root DATA [--view '/run?id=X' ...] [--repeats 2] [--out FILE]

A view whose last message arrives long before its chart is in the page waits for the browser, not for the server.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from pages_bench import CHART, CHROMIUM_ARGS, FLOOR_APP, TABLE, _serve, _stop  # noqa: E402

VIEWS = ["/compare", "/compare?runs=bench-00001-d07,bench-00002-d14,bench-00011-d17&view=Speed",
         "/run?id=bench-00002-d14", "/load?run=h200-vllm-sweep"]
MAIN_THREAD = ("v8.evaluateModule", "FunctionCall", "UpdateLayoutTree", "Layout", "MinorGC", "MajorGC", "Paint",
               "TimerFire", "EventDispatch", "ParseHTML", "v8.compileModule")


def frames_timing(browser, url: str, selector: str) -> dict:
    """Seconds from navigation: websocket open, first message, the first message holding a plotly figure (or an
    Arrow table), the last message before the chart is in the page, and the chart in the page."""
    ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
    pg = ctx.new_page()
    seen: dict = {"frames": []}
    t = time.perf_counter()

    def on_ws(ws):
        seen["open"] = time.perf_counter() - t
        ws.on("framereceived", lambda p: seen["frames"].append(
            (time.perf_counter() - t, isinstance(p, bytes) and b'"layout"' in p,
             isinstance(p, bytes) and b"pandas" in p)))

    pg.on("websocket", on_ws)
    pg.goto(url)
    pg.wait_for_selector(selector, state="attached", timeout=120_000)
    paint = time.perf_counter() - t
    ctx.close()
    fr = seen["frames"]
    want = 2 if selector == TABLE else 1
    first_content = next((f[0] for f in fr if f[want]), None)
    return {"ws_open_s": round(seen.get("open", float("nan")), 3),
            "first_message_s": round(fr[0][0], 3) if fr else None,
            "chart_message_s": round(first_content, 3) if first_content else None,
            "last_message_s": round(max((f[0] for f in fr if f[0] <= paint), default=0.0), 3),
            "messages": len(fr), "chart_in_page_s": round(paint, 3)}


def main_thread(browser, url: str, selector: str, trace: Path) -> dict:
    """The renderer main thread's busy time during one load (Chromium trace), by kind of work."""
    ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
    pg = ctx.new_page()
    browser.start_tracing(page=pg, path=str(trace),
                          categories=["devtools.timeline", "v8", "disabled-by-default-devtools.timeline"])
    t = time.perf_counter()
    pg.goto(url)
    pg.wait_for_selector(selector, state="attached", timeout=120_000)
    paint = time.perf_counter() - t
    browser.stop_tracing()
    ctx.close()
    ev = json.loads(trace.read_text())
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    mains = [k for k, v in names.items() if v == "CrRendererMain"]
    mine = [e for e in ev if (e.get("pid"), e.get("tid")) in mains and e.get("ph") == "X"]
    by_thread = collections.Counter()
    for e in mine:
        if e["name"] == "RunTask":
            by_thread[(e["pid"], e["tid"])] += e["dur"]
    key = by_thread.most_common(1)[0][0]
    kinds = collections.Counter()
    for e in mine:
        if (e["pid"], e["tid"]) == key and e["name"] in MAIN_THREAD:
            kinds[e["name"]] += e["dur"] / 1e6
    return {"chart_in_page_s": round(paint, 3), "busy_s": round(by_thread[key] / 1e6, 3),
            "by_kind_s": {k: round(v, 3) for k, v in kinds.most_common()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, required=True, help="data root (e.g. pages_bench.py --root DIR --keep)")
    ap.add_argument("--view", action="append", default=None, help=f"a path; default {VIEWS}")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="page-timeline-"))
    (work / "floor_app.py").write_text(FLOOR_APP)
    floor_proc, floor_url = _serve(work / "floor_app.py", work, dict(os.environ), work / "floor.log")
    proc, url = _serve(REPO / "app.py", REPO, {**os.environ, "SPECLENS_DATA": str(a.root)}, work / "streamlit.log")
    views = [("floor", floor_url + "/", CHART)] + [(v, url + v, TABLE if v.startswith("/run") else CHART)
                                                   for v in (a.view or VIEWS)]
    out: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_avg_before": list(os.getloadavg()),
                 "views": {}}
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
            for _name, u, sel in views:                    # first load of each (the server's imports) left out
                frames_timing(b, u, sel)
            for name, u, sel in views:
                tries = [frames_timing(b, u, sel) for _ in range(a.repeats)]
                med = {k: statistics.median(t[k] for t in tries if t[k] is not None) for k in tries[0]
                       if any(t[k] is not None for t in tries)}
                out["views"][name] = {"messages": {k: round(v, 3) for k, v in med.items()},
                                      "main_thread": main_thread(b, u, sel, work / "trace.json")}
            b.close()
    finally:
        _stop(proc)
        _stop(floor_proc)
    out["load_avg_after"] = list(os.getloadavg())
    text = json.dumps(out, indent=1)
    if a.out:
        a.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
