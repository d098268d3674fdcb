"""What a kind of page content costs the first chart in a real browser: small Streamlit apps, each the bare one-chart
floor plus one thing (server work before or after the chart, more charts, navigation, a table, pickers, download
buttons, markdown and tabs), served side by side and opened in interleaved rounds in fresh Chromium contexts
(bench/pages_bench.py's time_view); prints each app's median time to its first chart and that minus the floor's.

    python bench/floor_variants.py [--apps floor,busy_after,busy_before,nav,table,pickers,buttons] [--rounds 7]
        [--figures FILE]    # a JSON list of plotly figure dicts for the `figures` app (e.g. a page's four)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from pages_bench import CHART, CHROMIUM_ARGS, _serve, _stop, time_view  # noqa: E402

HEAD = "import plotly.graph_objects as go\nimport streamlit as st\n"
CHART_LINE = "st.plotly_chart(go.Figure(go.Bar(x=[0, 1, 2, 3], y=[0.4, 0.2, 0.2, 0.2])))\n"
BUSY = "import time\nt = time.perf_counter()\nwhile time.perf_counter() - t < 0.4:\n    pass\n"
APPS = {
    "floor": HEAD + CHART_LINE,
    "busy_after": HEAD + CHART_LINE + BUSY + "st.write('done')\n",
    "busy_before": HEAD + BUSY + CHART_LINE,
    "figures": HEAD + "import json, os\nfor i, f in enumerate(json.load(open(os.environ['FIGURES']))):\n"
                      "    st.plotly_chart(f, key=f'f{i}')\n",
    "nav": HEAD + "def main():\n    " + CHART_LINE + "def other():\n    st.write('other')\n"
                  "pages = [st.Page(main, title='Main', url_path='main', default=True)] + [st.Page(other, "
                  "title=f'Page {i}', url_path=f'p{i}', icon=':material/description:') for i in range(11)]\n"
                  "st.navigation(pages, position='top').run()\n",
    "table": HEAD + "import numpy as np, pandas as pd\n" + CHART_LINE +
             "st.dataframe(pd.DataFrame(np.random.default_rng(0).random((24, 15)), "
             "columns=[f'col {i}' for i in range(15)]))\n",
    "pickers": HEAD + CHART_LINE + "opts = [f'bench-{i:05d}-d{i % 20:02d}' for i in range(500)]\n"
               "st.selectbox('Open another run', opts)\nst.multiselect('Bench runs', opts, default=opts[:3])\n",
    "buttons": HEAD + CHART_LINE + "row = st.container(horizontal=True, gap='small')\n"
               "for f in ('PNG', 'SVG', 'HTML', 'CSV', 'Report'):\n    row.download_button(f, data=b'x', "
               "file_name=f'x.{f.lower()}', on_click='ignore', icon=':material/download:', width='content')\n",
    "markdown_tabs": HEAD + CHART_LINE + "for i in range(8):\n    st.markdown(f'**Paragraph {i}**: some `code` "
                     "and words ' * 6)\nst.tabs(['Acceptance', 'Speed', 'Per category', 'Settings that differ'])\n"
                     "st.info('a notice')\n",
    # a SpecLens-like page: navigation, a headline, tiles, pickers, buttons, a table and the chart, in three orders
    "kitchen_before": HEAD + "import kitchen\nkitchen.page('before')\n",
    "kitchen_after": HEAD + "import kitchen\nkitchen.page('after')\n",
    "kitchen_slot": HEAD + "import kitchen\nkitchen.page('slot')\n",
    **{f"kitchen_no_{part}": HEAD + f"import kitchen\nkitchen.page('before', drop='{part}')\n"
       for part in ("nav", "title", "markdown", "tiles", "pickers", "buttons", "table")},
    "kitchen_popover": HEAD + "import kitchen\nkitchen.page('before', pickers_in='popover')\n",
}
# kitchen_before: everything above the chart and sent before it (how the pages are written); kitchen_after: the chart
# first on screen and on the wire; kitchen_slot: the same screen as kitchen_before, but the chart is written into an
# empty slot (st.container) made above the rest before anything else is sent, so it goes out first
KITCHEN = """import numpy as np, pandas as pd, plotly.graph_objects as go, streamlit as st
def _chart():
    st.plotly_chart(go.Figure(go.Bar(x=[0, 1, 2, 3], y=[0.4, 0.2, 0.2, 0.2])))
def _rest(drop, pickers_in):
    if drop != 'title':
        st.title('Compare')
    if drop != 'markdown':
        st.markdown('**Headline**: the drafter is fed S_3, S_5, S_6; it was trained on S_2, S_4, S_5 ' * 3)
    if drop != 'tiles':
        for i, c in enumerate(st.columns(4)):
            c.metric(f'tile {i}', f'{i * 1.1:.2f}', f'{i - 1.5:+.2f}')
    if drop != 'pickers':
        opts = [f'bench-{i:05d}-d{i % 20:02d}' for i in range(500)]
        with (st.popover('Runs') if pickers_in == 'popover' else st.container()):
            st.selectbox('Open another run', opts)
            st.multiselect('Bench runs', opts, default=opts[:3])
    if drop != 'buttons':
        row = st.container(horizontal=True, gap='small')
        for f in ('PNG', 'SVG', 'HTML', 'CSV'):
            row.download_button(f, data=b'x', file_name=f'x.{f.lower()}', on_click='ignore', width='content')
    if drop != 'table':
        st.dataframe(pd.DataFrame(np.random.default_rng(0).random((24, 15)), columns=[f'col {i}' for i in range(15)]))
def _main(order, drop, pickers_in):
    if order == 'after':
        _chart(); _rest(drop, pickers_in)
    elif order == 'slot':
        top, slot = st.container(), st.container()
        with slot:
            _chart()
        with top:
            _rest(drop, pickers_in)
    else:
        _rest(drop, pickers_in); _chart()
def page(order, drop=None, pickers_in=None):
    def main():
        _main(order, drop, pickers_in)
    if drop == 'nav':
        main()
        return
    def other():
        st.write('other')
    pages = [st.Page(main, title='Main', url_path='main', default=True)] + [st.Page(other, title=f'Page {i}',
             url_path=f'p{i}', icon=':material/description:') for i in range(11)]
    st.navigation(pages, position='top').run()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--apps", default="floor,busy_after,busy_before,nav,table,pickers,buttons")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--figures", type=Path, default=None)
    a = ap.parse_args()
    names = [n for n in a.apps.split(",") if n]
    if names[0] != "floor" or any(n not in APPS for n in names):
        ap.error(f"--apps: names from {sorted(APPS)}, the first one 'floor'")
    if "figures" in names and a.figures is None:
        ap.error("--apps figures needs --figures FILE")
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="floor-variants-"))
    env = {**os.environ, **({"FIGURES": str(a.figures.resolve())} if a.figures else {})}
    servers = {}
    try:
        (work / "kitchen.py").write_text(KITCHEN)
        for n in names:
            (work / f"{n}.py").write_text(APPS[n])
            servers[n] = _serve(work / f"{n}.py", work, env, work / f"{n}.log")
        res = {n: [] for n in names}
        load_before = list(os.getloadavg())
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
            for n in names:                                     # first load of each (imports) left out
                time_view(b, servers[n][1] + "/", CHART)
            for _ in range(a.rounds):
                for n in names:
                    res[n].append(time_view(b, servers[n][1] + "/", CHART)[0])
            b.close()
    finally:
        for proc, _url in servers.values():
            _stop(proc)
    floor = statistics.median(res["floor"])
    print(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rounds": a.rounds,
                      "load_avg_before": load_before, "load_avg_after": list(os.getloadavg()),
                      "apps": {n: {"median_s": round(statistics.median(v), 3),
                                   "minus_floor_s": round(statistics.median(v) - floor, 3), "tries_s": v}
                               for n, v in res.items()}}, indent=1))


if __name__ == "__main__":
    main()
