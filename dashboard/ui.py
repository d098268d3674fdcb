"""Streamlit helpers shared by the pages: widgets bound to URL query parameters (the URL is the source of
truth, so a copied link reproduces the view), backend calls that show errors instead of tracebacks,
the empty-catalog message, the verdict banner and charts with their downloads."""

from __future__ import annotations

import logging
import re
from functools import partial
from pathlib import Path
from urllib.parse import urlencode
from typing import Any, Callable, Sequence, TypeVar

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboard import exports
from backend.config import data_root
from backend.errors import SpecLensError
from backend.store import catalog

T = TypeVar("T")
_log = logging.getLogger(__name__)

NO_DATA = ("No runs in the catalog yet ({root}). Run `python -m backend demo` to build demo captures, "
           "or capture your own with `python -m backend capture`.")
_BANNER = {"aligned": (st.success, ":material/check_circle:"), "drift": (st.warning, ":material/warning:"),
           "offset": (st.error, ":material/error:"), "final_norm": (st.error, ":material/error:"),
           "mislabelled": (st.error, ":material/error:"),
           "rotation": (st.error, ":material/error:")}
DEMO_PAIR = ("demo-fp32", "demo-after-layer")
DEMO_STATS = ["demo-fp32", "demo-after-layer", "demo-final-norm"]


# ---------------------------------------------------------------------------- query parameters

def qp_get(name: str) -> str | None:
    return st.query_params.get(name) or None


def qp_list(name: str) -> list[str]:
    return [x.strip() for x in (qp_get(name) or "").split(",") if x.strip()]


def qp_set(name: str, value: str | Sequence[str] | None) -> None:
    """Write one query parameter (lists comma-separated); an empty value removes it."""
    text = value if isinstance(value, str) or value is None else ",".join(value)
    if text:
        if st.query_params.get(name) != text:
            st.query_params[name] = text
    elif name in st.query_params:
        del st.query_params[name]


MAX_OPTIONS = 500        # a picker lists at most this many runs (a 10,000-option widget takes seconds to draw)


def capped(options: Sequence[str], keep: Sequence[str] = (), n: int = MAX_OPTIONS) -> list[str]:
    """The first n options (newest runs first), plus any of `keep` (the URL's, the default) that are further down."""
    head = list(options[:n])
    seen = set(head)
    rest = set(options[n:])
    return head + [k for k in dict.fromkeys(keep) if k in rest and k not in seen]


def _writer(param: str, key: str) -> Callable[[], None]:
    return lambda: qp_set(param, st.session_state[key])


def select(label: str, options: Sequence[str], param: str, default: str, *, where: Any = st,
           sticky: bool = True, **kw: Any) -> str:
    """A selectbox whose value lives in the URL (`?param=value`); an unknown URL value falls back to default.
    sticky=False leaves a default value out of the URL (it appears once the user picks one)."""
    key = f"qp_{param}"
    value = qp_get(param)
    if value not in options:
        value = default if default in options else options[0]
    st.session_state[key] = value
    if sticky or param in st.query_params:
        qp_set(param, value)
    return where.selectbox(label, list(options), key=key, on_change=_writer(param, key), **kw)


def multiselect(label: str, options: Sequence[str], param: str, default: Sequence[str], *, where: Any = st,
                **kw: Any) -> list[str]:
    """A multiselect whose values live in the URL (`?param=a,b`); absent or all unknown means default."""
    key = f"qp_{param}"
    wanted = qp_list(param) if param in st.query_params else list(default)
    value = [v for v in wanted if v in options] or [v for v in default if v in options]
    st.session_state[key] = value
    qp_set(param, value)
    return where.multiselect(label, list(options), key=key, on_change=_writer(param, key), **kw)


def unknown_runs(params: Sequence[str], known: Sequence[str], runs: pd.DataFrame, what: str = "capture") -> None:
    """One line per run id in the URL that cannot be shown: not in the catalog, or not a complete `what`."""
    status = dict(zip(runs["run_id"], runs["status"]))
    kind = dict(zip(runs["run_id"], runs["kind"]))
    known = set(known)
    for p in params:
        wanted = qp_list(p)
        then = "left out" if any(r in known for r in wanted) else "showing a default instead"
        for rid in wanted:
            if rid in known:
                continue
            if rid in status:
                state = status[rid] if status[rid] != "complete" else f"a {kind[rid]} run"
                st.warning(f"Run `{rid}` (from the URL, `{p}`) is {state}, not a complete {what}; {then}.")
            else:
                st.warning(f"No run `{rid}` (from the URL, `{p}`) in the catalog at {data_root()}; {then}.")


# ---------------------------------------------------------------------------- backend calls

def guarded(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call the backend; on failure show one error line and stop this page (never a traceback)."""
    try:
        return fn(*args, **kwargs)
    except SpecLensError as e:
        st.error(str(e))
    except Exception as e:  # noqa: BLE001 - the page must not show a traceback
        _log.exception("dashboard: %s failed", getattr(fn, "__name__", fn))
        first = str(e).splitlines()[0] if str(e) else ""
        st.error(f"{type(e).__name__}: {first}")
    st.stop()
    raise AssertionError("unreachable")  # st.stop() raises


def rescan() -> None:
    """Rebuild the catalog from the run directories (current status and progress of running runs)."""
    try:
        catalog.refresh()
    except Exception as e:  # noqa: BLE001 - a read-only data root still shows the last catalog
        st.caption(f"Could not rescan the run directories ({type(e).__name__}: {e}); showing the last catalog.")


def load_runs(refresh: bool = False, query: Callable[[], pd.DataFrame] = catalog.list_runs) -> pd.DataFrame:
    """All runs (from `query`, catalog.list_runs by default), newest first; stops the page with a hint when there
    are none. refresh=True rescans the run directories first (statuses of running/interrupted runs, progress,
    annotations); the rescan re-reads only what changed."""
    if refresh:
        rescan()
    runs = guarded(query)
    if runs.empty:
        st.info(NO_DATA.format(root=data_root()))
        st.stop()
    return runs


def complete_captures(runs: pd.DataFrame) -> list[str]:
    """Run ids of complete captures, newest first."""
    ok = runs[(runs["status"] == "complete") & (runs["kind"] == "capture")]
    return ok["run_id"].tolist()


def need_captures(ids: list[str], n: int = 1) -> None:
    if len(ids) < n:
        st.info(f"This view needs {n} complete capture{'s' if n > 1 else ''}; the catalog at {data_root()} has "
                f"{len(ids)}. Run `python -m backend demo`, or capture with `python -m backend capture`.")
        st.stop()


def complete_bench(bench: pd.DataFrame) -> list[str]:
    """Run ids of complete bench runs (catalog.bench_runs rows), newest first."""
    return bench[bench["status"] == "complete"]["run_id"].tolist()


def need_bench(ids: list[str], n: int = 2) -> None:
    if len(ids) < n:
        st.info(f"This view needs {n} complete bench runs; the catalog at {data_root()} has {len(ids)}. "
                "Run `python -m backend bench --target ... --drafter ... --prompts ...` (it also runs the paired "
                "baseline); `python -m backend demo` builds demo captures.")
        st.stop()


def default_pair(ids: list[str]) -> tuple[str, str]:
    """(A, B) for the alignment page without query parameters: the demo's offset pair when present,
    else the second newest vs the newest complete capture."""
    if all(r in ids for r in DEMO_PAIR):
        return DEMO_PAIR
    return (ids[1], ids[0]) if len(ids) > 1 else (ids[0], ids[0])


def default_stats_runs(ids: list[str], n: int = 3) -> list[str]:
    """Captures for the statistics page without query parameters: the demo reference and its two mislabelled
    imports when present, else the n newest complete captures."""
    demo = [r for r in DEMO_STATS if r in ids]
    return demo if len(demo) > 1 else ids[:n]


# ---------------------------------------------------------------------------- output

def verdict_banner(findings: Sequence[Any]) -> None:
    """One coloured banner per finding: success when aligned, error or warning otherwise. The texts are the view's
    verdict in its exported charts and report bundle."""
    for f in findings:
        show, icon = _BANNER.get(f.kind, (st.warning, ":material/warning:"))
        show(f.text, icon=icon)
        note_verdict(f.text)


def warning_list(lines: Sequence[str]) -> None:
    """Backend warnings (NaN/inf tokens left out, ...) in one box, one line each."""
    if lines:
        st.warning("  \n".join(lines), icon=":material/data_alert:")


def _file_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[:120] or "chart"


def chart_with_downloads(fig: go.Figure, df: pd.DataFrame, name: str) -> None:
    """The chart in the app's theme (Streamlit's plotly theme, light or dark), then PNG / SVG / HTML / CSV download
    buttons, and next to the first chart of a view its report bundle (`report_button`). Files are made only when
    clicked; PNG, SVG and HTML carry the view's verdict above the chart, in the figure's own (light) style."""
    stem = _file_stem(name)
    report = _report()
    first = not report.charts
    report.charts[stem] = (fig, df)
    report.link = view_link()
    st.plotly_chart(fig, theme="streamlit", key=f"chart_{stem}", config={"displaylogo": False})
    images = exports.images_available()
    row = st.container(horizontal=True, gap="small")        # content-wide buttons: readable in half-width columns
    for fmt in exports.FORMATS:
        no_image = fmt in ("png", "svg") and not images
        row.download_button(   # report.verdict: the list the page goes on filling; read when the button is clicked
            fmt.upper(), data=partial(exports.export, fig, df, fmt, report.verdict), file_name=f"{stem}.{fmt}",
            mime=exports.MIME[fmt], on_click="ignore", key=f"dl_{stem}_{fmt}", icon=":material/download:",
            disabled=no_image, width="content",
            help="needs Chromium (Debian `chromium`) on the server" if no_image else f"download as {fmt.upper()}")
    if first:
        report_button(stem, where=row)


# ---------------------------------------------------------------------------- page set-up, theme, report bundle

FAVICON = Path(__file__).resolve().parent / "assets" / "favicon.png"   # served by this server: no font-CDN icon
# Streamlit leaves about 6rem above the first element (room for its header); the top navigation needs less
_STYLE = """<style>
[data-testid="stMainBlockContainer"] { padding-top: 3.5rem; }
</style>"""
_REPORT = "speclens_report"


def page_setup() -> None:
    """Called by app.py before every page runs: the page config (title, the local favicon, wide layout), the compact
    style, and a fresh report for this run (what chart_with_downloads and the verdict calls gather for the bundle)."""
    st.set_page_config(page_title="SpecLens", page_icon=str(FAVICON), layout="wide")
    st.html(_STYLE)
    st.session_state[_REPORT] = exports.Report()


def _report() -> exports.Report:
    """This run's report (page_setup starts one per run; a page run on its own, as in AppTest, starts it here)."""
    if not isinstance(st.session_state.get(_REPORT), exports.Report):
        st.session_state[_REPORT] = exports.Report()
    return st.session_state[_REPORT]


def note_verdict(text: str) -> None:
    """Record a verdict line the page shows (verdict_banner does it for its findings): it is written above the
    exported charts and into the report bundle."""
    _report().note_verdict(text)


def view_link() -> str:
    """The view's full link: the page's URL in the browser with the current query parameters."""
    query = urlencode(st.query_params.to_dict(), safe=",")
    base = st.context.url or ""
    return f"{base}?{query}" if query else base


def report_button(stem: str, where: Any = st) -> None:
    """The view's report bundle as one zip download (made when clicked, so charts drawn after this button are in)."""
    report = _report()
    report.link = view_link()
    where.download_button(
        "Report", data=partial(exports.bundle, report), file_name=f"{stem}_report.zip", mime="application/zip",
        on_click="ignore", key="dl_report_bundle", icon=":material/folder_zip:", width="content",
        help="this whole view in one zip: every chart as PNG and SVG with the verdict, its data as CSV, "
             "verdict.txt and README.txt with the view's link")

