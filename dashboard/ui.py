"""Streamlit helpers shared by the pages: widgets bound to URL query parameters (the URL is the source of
truth, so a copied link reproduces the view), backend calls that show errors instead of tracebacks,
the empty-catalog message, the verdict banner and charts with their downloads."""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from backend.config import data_root
from backend.errors import SpecLensError
from backend.store import catalog as catalog_store
from backend.store.catalog import CatalogReader
from backend.store.data_root import DataRoot
from dashboard import exports

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


# ---------------------------------------------------------------------------- notices for link parameters
# A link parameter that cannot be shown as asked (a missing run, an unknown choice, a duplicated id) is never
# replaced silently: one warning names the parameter and its value (cut to SHOWN_MAX characters) and what is shown
# instead. The URL keeps what the link asked for (a copied link shares the asked run, not the substitute, and shows
# the same notice), and what is shown instead never carries a verdict: no tiles, headline or banner (`instead`).

SHOWN_MAX = 80           # characters of a link value a notice shows (a 100 KB bogus id is cut, then "…")
_NOTES = "_qp_notes"     # session_state: this script run's reasons, pickers and substitutions (see _notes)


def cut(value: Any, n: int = SHOWN_MAX) -> str:
    """A value from the URL as a notice shows it: one line, no backticks (it sits in a code span), at most n
    characters, then an ellipsis."""
    text = re.sub(r"\s+", " ", str(value)).replace("`", "'")
    return text if len(text) <= n else text[:n] + "\u2026"


def _notes() -> dict:
    """What this script run learnt about its link parameters: `why` {(param, value): the reason a run id cannot
    be shown (unknown_runs)}, `groups` (the params of one unknown_runs call), `picked` {param: (label, value)} of
    the single pickers, `substituted` (params shown otherwise than asked) and `same` (a pair holding one run).
    Kept in session_state under a token of this run (its cursor table, new on every run, and its page)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    token = (id(ctx.cursors), ctx.page_script_hash) if ctx is not None else None
    notes = st.session_state.get(_NOTES)
    if not isinstance(notes, dict) or notes.get("token") != token:
        notes = {"token": token, "why": {}, "groups": [], "picked": {}, "substituted": [], "instead": [],
                 "same": None}
        st.session_state[_NOTES] = notes
    return notes


def _choices(label: str, options: Sequence[str], format_func: Callable[[Any], str] = str) -> str:
    shown = ", ".join(f"`{cut(format_func(o), 40)}`" for o in list(options)[:8])
    more = f" and {len(options) - 8} more" if len(options) > 8 else ""
    return f"not one of the choices of \u201c{label}\u201d ({shown}{more})"


def link_notice(text: str) -> None:
    """One notice about what the link asked for and what is shown instead."""
    st.warning(text, icon=":material/link_off:")


def _head(param: str, value: str, label: str, options: Sequence[str], format_func: Callable[[Any], str],
          one_of: bool = False) -> str:
    """Why a URL value cannot be shown: unknown_runs' reason, else not one of the options (`one_of`: the value is one
    of the list the parameter holds)."""
    why = _notes()["why"].get((param, value))
    if why:
        return why
    if one_of:
        return (f"`{param}={cut(qp_get(param))}` (from the URL): `{cut(value)}` is "
                f"{_choices(label, options, format_func)}")
    return f"`{param}={cut(value)}` (from the URL) is {_choices(label, options, format_func)}"


def select(label: str, options: Sequence[str], param: str, default: str, *, where: Any = st,
           sticky: bool = True, none_instead: bool = False, **kw: Any) -> str | None:
    """A selectbox whose value lives in the URL (`?param=value`). An unknown URL value shows a notice naming it and
    what is shown instead (the default; for one of an unknown_runs pair, never the run the other one holds); two run
    pickers of a pair on the same run get a notice too (verdict_banner then shows no verdict). sticky=False leaves a
    default value out of the URL (it appears once the user picks one). none_instead=True: a URL value that cannot be
    shown leaves the picker empty (None, the page shows nothing for it) instead of holding a substitute, so that
    picking any run, the newest included, shows it."""
    return select_later(label, options, param, default, where=where, sticky=sticky, none_instead=none_instead,
                        **kw).draw()


@dataclass
class Later:
    """A picker whose value is known now (read from the URL, checked against its options, written back as
    `select`/`multiselect` do) and drawn later by draw(where=...) (its notices, then the widget; returns the value): a
    page draws its first chart before its pickers, into a `slot` that holds their place above it."""

    value: Any
    draw: Callable[[], Any]


def select_later(label: str, options: Sequence[str], param: str, default: str, *, where: Any = st,
                 sticky: bool = True, none_instead: bool = False, **kw: Any) -> Later:
    """`select`'s value now, its notices and selectbox on draw() (Later)."""
    key = f"qp_{param}"
    asked = qp_get(param)
    value = asked
    notices: list[str] = []
    if none_instead and asked is not None and asked not in options:
        fmt = kw.get("format_func", str)
        notices.append(f"{_head(param, asked, label, options, fmt)}; nothing is shown in its place: pick one above.")
        _notes()["substituted"].append(param)
        _notes()["instead"].append(param)
        kw = {"placeholder": f"pick a {label.lower()}", **kw}
        return Later(None, partial(_draw_select, label, options, key, param, None, notices, kw, where=where))
    if value not in options:
        value = default if default in options else options[0]
        partner = _partner(param, options)
        if value == partner:                  # never pair a run with itself by a fallback (Alignment's A and B)
            value = next((o for o in options if o != partner), value)
        if asked is not None:
            fmt = kw.get("format_func", str)
            notices.append(f"{_head(param, asked, label, options, fmt)}; showing `{cut(fmt(value))}` instead.")
            _notes()["substituted"].append(param)
            _notes()["instead"].append(param)
    notices += _pair_check(param, label, value)
    if (sticky or param in st.query_params) and param not in _notes()["substituted"]:
        qp_set(param, value)             # a substitute is never written to the URL: the link keeps what it asked
    return Later(value, partial(_draw_select, label, options, key, param, value, notices, kw, where=where))


def _draw_select(label: str, options: Sequence[str], key: str, param: str, value: str | None, notices: list[str],
                 kw: dict, where: Any = st) -> str | None:
    for text in notices:
        link_notice(text)
    st.session_state[key] = value
    return where.selectbox(label, list(options), key=key, on_change=_writer(param, key), **kw)


def slot(height: int, *params: str) -> Any:
    """A place in the layout for the pickers of these URL params, which the page draws last (draw_last): `height`
    pixels of blank space until `with slot.container():` fills it, so that what is below does not move when it
    does. No blank space on a rerun of the page whose pickers are already on it (shown): they are drawn into it at
    once, where they are, and keep their focus and state."""
    spot = st.empty()
    if not shown(*params):
        spot.container(height=height, border=False)
    return spot


def pickers_popover(label: str, where: Any = st) -> Any:
    """A button that opens the page's pickers (the runs shown, the baseline, ...) in a popover: what they hold is on
    the button and in the URL. Their widgets are not on the page until it is opened: pickers on the page delay its
    first chart in a cold browser (0.45-0.55 s on a test page, 0.05-0.2 s measured on Compare and Serving load:
    docs/PERFORMANCE.md). Changing a picker keeps the popover open."""
    return where.popover(label, icon=":material/tune:", width="content")


def shown(*params: str) -> bool:
    """Whether the pickers of these URL params were on the page in this session's last run (a rerun after the user
    changed one of them): then they are drawn in place at once (draw_last) instead of last, so that they are not
    replaced while the user works in them."""
    return any(f"qp_{p}" in st.session_state for p in params)


def _partner(param: str, options: Sequence[str]) -> str | None:
    """The run the other picker of param's unknown_runs pair holds (picked already, else valid in the URL)."""
    notes = _notes()
    for group in notes["groups"]:
        if len(group) == 2 and param in group:
            other = group[1 - group.index(param)]
            if other in notes["picked"]:
                return notes["picked"][other][1]
            return qp_get(other) if qp_get(other) in options else None
    return None


def _pair_check(param: str, label: str, value: str) -> list[str]:
    """Two single pickers of one unknown_runs pair (Alignment's A and B) on the same run: the notice that says so."""
    notes = _notes()
    notes["picked"][param] = (label, value)
    for group in notes["groups"]:
        if len(group) == 2 and param in group:
            other = group[1 - group.index(param)]
            if other in notes["picked"] and notes["picked"][other][1] == value:
                notes["same"] = (notes["picked"][other][0], label, value)
                return [f"\u201c{notes['picked'][other][0]}\u201d and \u201c{label}\u201d are both `{cut(value)}`"
                        f"{' (the link asks for it twice)' if qp_get(other) == qp_get(param) == value else ''}: "
                        "a run compared with itself matches trivially, so no verdict is shown. Pick another run."]
    return []


def multiselect(label: str, options: Sequence[str], param: str, default: Sequence[str], *, where: Any = st,
                **kw: Any) -> list[str]:
    """A multiselect whose values live in the URL (`?param=a,b`); absent or empty means default. Values the
    options lack are left out and a value named twice is kept once (a run is never compared with itself), each
    with a notice; when none is left, the default is shown, and the notice says so."""
    return multiselect_later(label, options, param, default, where=where, **kw).draw()


def multiselect_later(label: str, options: Sequence[str], param: str, default: Sequence[str], *, where: Any = st,
                      **kw: Any) -> Later:
    """`multiselect`'s value now, its notice and widget on draw() (Later)."""
    key = f"qp_{param}"
    fmt = kw.get("format_func", str)
    lines: list[str] = []
    if qp_list(param):
        asked = qp_list(param)
        wanted = list(dict.fromkeys(asked))
        value = [v for v in wanted if v in options]
        missing = [v for v in wanted if v not in options]
        lines = [f"{_head(param, v, label, options, fmt, one_of=True)}; left out." for v in missing[:MAX_NOTICE_LINES]]
        if len(missing) > MAX_NOTICE_LINES:          # a long link: the first few named, the rest counted
            lines.append(f"... and {len(missing) - MAX_NOTICE_LINES} more value(s) of `{param}` that cannot be shown "
                         "either; left out.")
        twice = [v for v in wanted if asked.count(v) > 1] if len(wanted) < len(asked) else []
        if twice:
            lines.append(f"`{param}={cut(qp_get(param))}` names {', '.join(f'`{cut(v)}`' for v in twice[:5])} more "
                         "than once; each is shown once (a run is not compared with itself).")
        if not value:
            value = [v for v in default if v in options]
            lines.append(f"Nothing in `{param}={cut(qp_get(param))}` can be shown; showing "
                         f"{', '.join(f'`{cut(fmt(v))}`' for v in value) or 'nothing'} instead, without a verdict.")
            _notes()["instead"].append(param)
        if lines:
            _notes()["substituted"].append(param)
    else:
        value = [v for v in default if v in options]
    if param not in _notes()["substituted"]:
        qp_set(param, value)             # the link keeps what it asked (see the notice)
    return Later(value, partial(_draw_multiselect, label, options, key, param, value, lines, kw, where=where))


def _draw_multiselect(label: str, options: Sequence[str], key: str, param: str, value: list[str], lines: list[str],
                      kw: dict, where: Any = st) -> list[str]:
    if lines:
        link_notice("  \n".join(lines))
    st.session_state[key] = value
    return where.multiselect(label, list(options), key=key, on_change=_writer(param, key), **kw)


def text(label: str, param: str, *, where: Any = st, max_chars: int = 200, **kw: Any) -> str:
    """A text input whose value lives in the URL (`?param=text`); a longer value is cut, with a notice."""
    return text_later(label, param, where=where, max_chars=max_chars, **kw).draw()


def text_later(label: str, param: str, *, where: Any = st, max_chars: int = 200, **kw: Any) -> Later:
    """`text`'s value now, its notice and text input on draw() (Later)."""
    key = f"qp_{param}"
    value = qp_get(param) or ""
    notices = []
    if len(value) > max_chars:
        notices.append(f"`{param}={cut(value)}` (from the URL) is longer than {max_chars} characters; "
                       f"using its first {max_chars}.")
        value = value[:max_chars]
        _notes()["substituted"].append(param)
    if param not in _notes()["substituted"]:
        qp_set(param, value)
    return Later(value, partial(_draw_text, label, key, param, value, notices, {"max_chars": max_chars, **kw},
                                where=where))


def _draw_text(label: str, key: str, param: str, value: str, notices: list[str], kw: dict, where: Any = st) -> str:
    for line in notices:
        link_notice(line)
    st.session_state[key] = value
    return where.text_input(label, key=key, on_change=_writer(param, key), **kw)


def ticked(ids: pd.Series, param: str = "ticked") -> list[int]:
    """Row positions (in `ids`, a table's run_id column) of the runs the URL ticks (`?ticked=a,b`): a link reproduces
    the ticked rows. Runs the table does not show get a notice."""
    wanted = list(dict.fromkeys(qp_list(param)))
    if not wanted:
        return []
    shown = ids.reset_index(drop=True)
    rows = shown.index[shown.isin(wanted)].tolist()
    missing = sorted(set(wanted) - set(shown.iloc[rows]))
    if missing:
        link_notice(f"`{param}` ticks {', '.join(f'`{cut(r)}`' for r in missing[:5])}"
                    f"{f' and {len(missing) - 5} more' if len(missing) > 5 else ''}, not among the runs shown "
                    "(filtered out, or not in the catalog); left unticked.")
    return rows


def instead(*params: str) -> list[str]:
    """The params among these (all when none given) whose shown value is a substitute for the link's: what is shown
    then carries no verdict (no tiles, headline or banner)."""
    shown = dict.fromkeys(_notes()["instead"])
    return [p for p in shown if not params or p in params]


def no_verdict_for_substitute(params: Sequence[str], what: str = "verdict") -> None:
    """One neutral line in place of a verdict for a view whose runs are substitutes for the link's."""
    st.info(f"No {what} for what the link did not ask for: {', '.join(f'`{p}`' for p in params)} in the link cannot "
            "be shown as asked (see the notice above). Pick above to see it.", icon=":material/info:")


def tab_choice(param: str, tabs: Sequence[str], label: str = "View") -> None:
    """A tab bar bound to `?param=` (st.tabs(bind="query-params")) opens its first tab on a value that names no tab,
    silently; call this before st.tabs: a notice names the value and the tab shown."""
    asked = qp_get(param)
    if asked is not None and asked not in tabs:
        link_notice(f"`{param}={cut(asked)}` (from the URL) is {_choices(label, tabs)}; showing `{tabs[0]}` instead.")
        _notes()["substituted"].append(param)


MAX_NOTICE_LINES = 5        # values of one link parameter named one by one in a notice; the rest are counted


def unknown_runs(params: Sequence[str], known: Sequence[str], runs: pd.DataFrame, what: str = "capture") -> None:
    """Why each run id in these URL parameters cannot be shown: not in the catalog, or not a complete `what`. Call
    it before the pickers of these params: their notice (select, multiselect) names the reason and what is shown
    instead. Two single pickers of these params on one run (a pair) are named too."""
    known = set(known)
    notes = _notes()
    notes["groups"].append(list(params))
    unknown = {rid for p in params for rid in qp_list(p) if rid not in known}
    # only the URL's unknown runs are looked up (the run page passes all 10,000 runs: a dict of them took 25 ms)
    of = runs[runs["run_id"].isin(unknown)] if unknown else runs.iloc[:0]
    status = dict(zip(of["run_id"], of["status"]))
    kind = dict(zip(of["run_id"], of["kind"]))
    for p in params:
        for rid in qp_list(p):
            if rid in known:
                continue
            if rid in status:
                state = status[rid] if status[rid] != "complete" else f"a {kind[rid]} run"
                notes["why"][(p, rid)] = f"Run `{cut(rid)}` (from the URL, `{p}`) is {state}, not a complete {what}"
            else:
                notes["why"][(p, rid)] = f"No run `{cut(rid)}` (from the URL, `{p}`) in the catalog at {data_root()}"


# ---------------------------------------------------------------------------- backend calls

def on_demand(label: str, key: str, opened: bool = False) -> Any | None:
    """A closed expander whose content is made and sent only once it is opened (None while closed), its state in the
    view's link (`?KEY=true` opens it): for the tables under a view's charts, which are the numbers behind them
    (each chart also downloads its data as CSV). Sent closed, they leave the browser's first second to the charts
    (docs/PERFORMANCE.md, issue 24 item 2). opened=True: open unless the link closes it."""
    box = st.expander(label, expanded=opened, key=key, bind="query-params")
    return box if box.open else None


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
    stop()
    raise AssertionError("unreachable")  # st.stop() raises


_LAST = "_draw_last"     # session_state: this script run's token and what it draws last (draw_last)


def draw_last(fn: Callable[[], Any], *params: str) -> None:
    """Draw `fn` (the pickers of these URL params, into their slot) once the page is done: at `finish()`, or before
    `stop()` (guarded's error line, an empty view) so that a page that stops early still shows its pickers. At once
    when they are already on the page (`shown`: a rerun after the user changed one)."""
    if shown(*params):
        fn()
    else:
        _pending().append(fn)


def _pending() -> list:
    token = _notes()["token"]
    held = st.session_state.get(_LAST)
    if not isinstance(held, tuple) or held[0] != token:
        held = (token, [])
        st.session_state[_LAST] = held
    return held[1]


def finish() -> None:
    """Draw what the page left for last (draw_last), in the order given."""
    pending = _pending()
    while pending:
        pending.pop(0)()


def stop() -> None:
    """st.stop(), after drawing what the page left for last (draw_last)."""
    finish()
    st.stop()


def data() -> DataRoot:
    """This dashboard's data root ($SPECLENS_DATA), what pages pass to the backend functions they call."""
    return DataRoot()


def catalog() -> CatalogReader:
    """The catalog's read side for this data root ($SPECLENS_DATA): what every page reads through."""
    return data().catalog.read


def shared_catalog_reads():
    """The scope of one page run in which the catalog's queries share one connection (app.py wraps every page in
    it): a page makes 3-7 queries, each opening a 10,000-run catalog took 15-25 ms."""
    return catalog_store.shared_reads()


def kept(what: str, args: tuple, compute: Callable[[], T]) -> T:
    """compute()'s result (figures, their frames, words made from the catalog's rows alone), computed once per catalog
    version this page reads and kept per process (CatalogReader.kept), as a copy; plotly figures in it are shared, not
    copied (copying one validates it again; nothing changes a figure once drawn: exports copy theirs)."""
    hit = catalog().kept(what, args, compute)
    figures = hit if isinstance(hit, go.Figure) else (
        [x for x in hit if isinstance(x, go.Figure)] if isinstance(hit, tuple | list) else [])
    return hit if isinstance(hit, go.Figure) else copy.deepcopy(hit, {id(f): f for f in figures})


def rescan(run_ids: list[str] | None = None) -> None:
    """Bring the catalog up to date with the run directories (current status and progress of running runs): every
    directory, or (run_ids) those runs and the runs indexed as running only, a few file stats each whatever the
    catalog's size, where the whole rescan stats every run directory (10,000 runs: 40-250 ms of each page view)."""
    try:
        if run_ids:
            data().catalog.write.refresh_changed(run_ids)
        else:
            data().catalog.write.refresh()
    except Exception as e:  # noqa: BLE001 - a read-only data root still shows the last catalog
        st.caption(f"Could not rescan the run directories ({type(e).__name__}: {e}); showing the last catalog.")


def rescan_named(*params: str) -> None:
    """rescan() for a page about the runs its link names (these URL parameters): those runs and the running ones; a
    link that names no run rescans all."""
    rescan([r for name in params for r in qp_list(name)])


def load_runs(refresh: bool = False, query: Callable[[], pd.DataFrame] | None = None) -> pd.DataFrame:
    """All runs (from `query`, the catalog's list_runs by default), newest first; stops the page with a hint when there
    are none. refresh=True rescans the run directories first (statuses of running/interrupted runs, progress,
    annotations); the rescan re-reads only what changed."""
    if refresh:
        rescan()
    runs = guarded(query or catalog().list_runs)
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

def verdict_banner(findings: Sequence[tuple[str, str]]) -> None:
    """One coloured banner per finding, (kind, sentence): success when aligned, error or warning otherwise (the
    alignment's sentences: dashboard/align_words.py banners). The texts are the view's
    verdict in its exported charts and report bundle. Never a verdict the link did not ask for: a pair of run
    pickers on one run (select's notice) shows none, and runs shown instead of the link's (a missing run) show one
    neutral line that says why there is no verdict."""
    notes = _notes()
    if notes["same"]:
        first, second, run = notes["same"]
        text = f"No verdict: \u201c{first}\u201d and \u201c{second}\u201d are the same run `{cut(run)}`."
        st.info(text, icon=":material/info:")
        note_verdict(text)
        return
    swapped = [p for p in instead() if any(p in g for g in notes["groups"])]
    if swapped:                     # runs the link did not ask for: no verdict at all, not even a neutral one
        no_verdict_for_substitute(swapped)
        return
    for kind, text in findings:
        show, icon = _BANNER.get(kind, (st.warning, ":material/warning:"))
        show(text, icon=icon)
        note_verdict(text)


_LEVEL_SHOW = {"ok": st.success, "note": st.info, "warning": st.warning, "error": st.error}


def level_banner(level: Any, text: str, note: bool = True) -> None:
    """A banner in the colour of a severity level (dashboard/severity.py: ok green, note blue, warning orange, error
    red), the same on every page; `note`: the text is also the view's verdict (exports, report bundle)."""
    _LEVEL_SHOW.get(level.key, st.warning)(text, icon=level.icon)
    if note:
        note_verdict(text)


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
            help="needs Chromium (Debian `chromium`) on the server" if no_image else None)
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



def writes_enabled() -> bool:
    """Whether this dashboard may write files and queue jobs (SPECLENS_READONLY=0 and SPECLENS_ALLOW_JOBS=1)."""
    from backend.config import jobs_enabled, read_only

    return jobs_enabled() and not read_only()


def queue_fix_proof(report: dict, engine: str = "hf") -> dict:
    """The Drafter check page's button: write the check's fix and queue its two proof benches through `engine` (hf,
    or the fix's vLLM/SGLang for the GPU worker; backend.prove_fix)."""
    from backend.prove_fix import queue_proof

    return queue_proof(report, data(), engine=engine)
