"""SpecLens dashboard: `streamlit run app.py`. Data root: $SPECLENS_DATA (default ./data).

Pages (each view is addressable by its URL query parameters):
  /runs       captures and bench runs; tags, notes, pinned baseline
              ?kind=&status=&engine=&version=&target=&drafter=&dataset=&tag=&run=
  /compare    bench runs side by side        ?runs=a,b,c&baseline=paired|pinned&view=Acceptance|Speed|Per category|...
  /alignment  which boundary of run A matches which of run B  ?a=&b=&metric=cosine|rel_l2|cka
  /stats      per-boundary hidden-state statistics            ?runs=a,b&stat=&run=
  /drafter    drafter check: what each engine feeds a drafter, accuracy by candidate  ?run=&metric=
  /feeds      what every vLLM/SGLang release feeds a drafter  ?check=RUN | ?drafter=DIR&target=DIR
  /regression bench runs of one drafter+target by engine release and date, tau and speedup intervals  ?group=N
  /watch      a live server's tau per window, baseline band, drift verdict (python -m backend watch)  ?run=
  /load       serving load: speedup vs concurrency per K, Pareto front, best K, where it stops paying  ?run= | ?runs=a,b
  /new        queue a capture or bench job (SPECLENS_ALLOW_JOBS=1, not read-only) and watch the queue
  /run        one run: settings, what the engine fed, per-prompt table, files, log, links  ?id=&category=&q=&sort=
`/` forwards to /runs (streamlit serves its default page at `/` only, so the default is a hidden forwarder).
"""

import streamlit as st

from dashboard import ui

ui.page_setup()       # page config (title, local favicon, wide), compact style, a fresh report bundle for this run

RUNS = st.Page("pages/runs.py", title="Runs", url_path="runs", icon=":material/list:")
ALIGNMENT = st.Page("pages/alignment.py", title="Layer alignment", url_path="alignment", icon=":material/grid_on:")
STATS = st.Page("pages/stats.py", title="Hidden-state stats", url_path="stats", icon=":material/show_chart:")
COMPARE = st.Page("pages/compare.py", title="Compare", url_path="compare", icon=":material/compare_arrows:")
DRAFTER = st.Page("pages/drafter_check.py", title="Drafter check", url_path="drafter", icon=":material/fact_check:")
FEEDS = st.Page("pages/feeds.py", title="Feeds", url_path="feeds", icon=":material/alt_route:")
REGRESSION = st.Page("pages/regression.py", title="Regression", url_path="regression", icon=":material/trending_down:")
WATCH = st.Page("pages/watch.py", title="Watch", url_path="watch", icon=":material/monitor_heart:")
LOAD = st.Page("pages/load.py", title="Serving load", url_path="load", icon=":material/speed:")
NEW_RUN = st.Page("pages/new_run.py", title="New run", url_path="new", icon=":material/add_circle:")
# a run's own page: reached from every "open" link and from the other views, not a view over runs (hidden from
# the top bar, like a W&B / MLflow run page)
RUN = st.Page("pages/run.py", title="Run", url_path="run", icon=":material/description:", visibility="hidden")


def home() -> None:
    st.switch_page(RUNS, query_params=st.query_params.to_dict())


HOME = st.Page(home, title="SpecLens", url_path="home", default=True, visibility="hidden")

page = st.navigation([HOME, RUNS, COMPARE, ALIGNMENT, STATS, DRAFTER, FEEDS, REGRESSION, WATCH, LOAD, NEW_RUN, RUN],
                     position="top")
with ui.shared_catalog_reads():       # the page's catalog queries share one connection (docs/PERFORMANCE.md)
    page.run()
