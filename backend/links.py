"""The dashboard's pages and their URL paths, registered in this one place.

`PAGES` is the one page registry: each view's URL path, its script under pages/, its title and icon in the top bar
and whether the bar shows it. dashboard/page_registry.py builds the navigation (app.py) and the page links (the run
page's) from it; the functions below build the URL paths the command line prints on the configured address
(backend.config.dashboard_link), so a path printed by `check-drafter`, the demo or a proof opens the same view as the
page's own link. Adding a page is its script plus one row here (docs/ARCHITECTURE.md "Where to add");
tests/test_architecture.py finds any second list of page paths. Run ids are quoted (a run id is letters, digits,
'.', '_' and '-': quoting changes nothing for a valid one)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True)
class Page:
    """One dashboard view: served at `/<path>`, drawn by `script`; `hidden`: reached by links only, not shown in the
    top bar. `params`: the query parameters it reads (each view is addressable by them). `first`: the elements whose
    code its first screen waits on, in the order it draws them: "metric" (the tiles', `st.metric`), "chart"
    (Plotly's), "table" (an HTML table's, `st.table`) or "grid" (the data grid's, `st.dataframe`); the browser loads
    that code while the page script runs (dashboard/serve.py). A view with a chart on its first screen names
    "chart", and what comes before it only if that code is small."""

    path: str
    script: str
    title: str
    icon: str
    params: str = ""
    hidden: bool = False
    first: tuple[str, ...] = ("metric", "chart")   # tiles above the charts: drawn before them


# in the top bar's order; `/` forwards to the first (dashboard/page_registry.py)
PAGES: dict[str, Page] = {p.path: p for p in (
    # captures and bench runs; tags, notes, pinned baseline
    Page("runs", "pages/runs.py", "Runs", ":material/list:",
         "kind=&status=&engine=&version=&target=&drafter=&dataset=&tag=&run=", first=("grid",)),
    # bench runs side by side
    Page("compare", "pages/compare.py", "Compare", ":material/compare_arrows:",
         "runs=a,b,c&baseline=paired|pinned&view=Acceptance|Speed|Per category|..."),
    # which boundary of run A matches which of run B
    Page("alignment", "pages/alignment.py", "Layer alignment", ":material/grid_on:", "a=&b=&metric=cosine|rel_l2|cka"),
    # per-boundary hidden-state statistics
    Page("stats", "pages/stats.py", "Hidden-state stats", ":material/show_chart:", "runs=a,b&stat=&run="),
    # drafter check: what each engine feeds a drafter, accuracy by candidate
    Page("drafter", "pages/drafter_check.py", "Drafter check", ":material/fact_check:", "run=&metric="),
    # what every vLLM/SGLang release feeds a drafter
    Page("feeds", "pages/feeds.py", "Feeds", ":material/alt_route:", "check=RUN | drafter=DIR&target=DIR"),
    # bench runs of one drafter+target by engine release and date, tau and speedup intervals
    Page("regression", "pages/regression.py", "Regression", ":material/trending_down:", "group=N"),
    # a live server's tau per window, baseline band, drift verdict (python -m backend watch)
    Page("watch", "pages/watch.py", "Watch", ":material/monitor_heart:", "run="),
    # serving load: speedup vs concurrency per K, Pareto front, best K, where it stops paying
    Page("load", "pages/load.py", "Serving load", ":material/speed:", "run= | runs=a,b"),
    # queue a capture or bench job (SPECLENS_ALLOW_JOBS=1, not read-only) and watch the queue
    Page("new", "pages/new_run.py", "New run", ":material/add_circle:", first=("grid",)),
    # one run: settings, what the engine fed, per-prompt table, files, log, links. Reached from every "open" link
    # and from the other views, not a view over runs (hidden from the top bar, like a W&B / MLflow run page)
    Page("run", "pages/run.py", "Run", ":material/description:", "id=&category=&q=&sort=", hidden=True,
         first=("metric", "table", "chart")),
)}


def _url(view: str, param: str, value: str, safe: str = "") -> str:
    return f"/{PAGES[view].path}?{param}=" + quote(value, safe=safe)


def compare(run_ids: list[str] | tuple[str, ...]) -> str:
    """Compare on these runs (the first is shown first)."""
    return _url("compare", "runs", ",".join(run_ids), safe=",")


def drafter_check(run_id: str) -> str:
    """The Drafter check page of a check run."""
    return _url("drafter", "run", run_id)


def run(run_id: str) -> str:
    """The run page."""
    return _url("run", "id", run_id)
