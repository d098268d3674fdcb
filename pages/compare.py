"""Compare bench runs (?runs=a,b,c&baseline=paired|pinned&view=Acceptance|Speed|...): speedup tiles and a short
headline, then accepted-length histograms, per-position acceptance, throughput under both definitions (mean
per-prompt tokens/s; total tokens / total time), speedups, TTFT and TPOT with 95% CIs, per-category figures and the
settings that differ. Numbers and verdicts: backend/compare.py (from backend/metrics.py); their words, tiles and
links: dashboard/compare_words.py; how each part is drawn: dashboard/compare_view.py; data: catalog aggregates. The
pickers sit in a popover above the charts, drawn last into the place held for them (on the page, their widgets
delay its first chart: docs/PERFORMANCE.md)."""

import streamlit as st

from backend import compare
from dashboard import compare_view as parts
from dashboard import compare_words as words
from dashboard import ui

PICKERS_PX = 68           # the height of the pickers' row, held for them until they are drawn

st.title("Compare bench runs")
cat = ui.catalog()
bench = ui.guarded(cat.bench_index)
ids = ui.complete_bench(bench)
ui.need_bench(ids, 2)
ui.unknown_runs(["runs"], ids, ui.guarded(cat.run_states, ui.qp_list("runs")), what="bench run")

# the pickers' values come from the URL now; the pickers themselves are drawn last, into this slot above the charts:
# sent with the first chart, their widgets' code delays its first paint in the browser (docs/PERFORMANCE.md)
pickers = ui.slot(PICKERS_PX, "runs", "baseline")
default = compare.default_runs(bench)
runs_pick = ui.multiselect_later(
    "Bench runs", ui.capped(ids, ui.qp_list("runs") + default), "runs", default,
    placeholder="pick two or more bench runs",
    help=f"lists the {ui.MAX_OPTIONS} newest bench runs and those in the URL; find older ones on the Runs page "
         "(filter, tick their rows, then Compare)" if len(ids) > ui.MAX_OPTIONS else None)
against_pick = ui.select_later("Speedup against", list(compare.BASELINES), "baseline", "paired",
                               format_func=words.BASELINE_LABELS.get)
chosen, against = runs_pick.value, against_pick.value


def draw_pickers() -> None:
    with pickers.container():            # notices about the link here; the pickers in a popover
        pop = ui.pickers_popover(f"{len(chosen)} runs, speedups against {words.BASELINE_LABELS[against]}")
        runs_pick.draw(where=pop)
        against_pick.draw(where=pop)


ui.draw_last(draw_pickers, "runs", "baseline")
if len(chosen) < 2:
    st.info("Pick at least two bench runs to compare.")
    ui.stop()

def view() -> None:
    """Everything below the pickers: tiles, headline and warnings (slots filled once the speed figures are in), the
    tabs, and in the open tab its charts and tables (lazy tabs: only the open one runs and is sent)."""
    substitute = ui.instead("runs")      # runs the link did not ask for: charts only, no tiles, headline or banner
    ui.tab_choice("view", words.VIEWS)   # an unknown view= gets its notice first, with the link's other notices
    tile_row, headline, warnings = st.empty(), st.empty(), st.empty()
    acc_tab, speed_tab, cat_tab, cfg_tab = st.tabs(list(words.VIEWS), key="view", on_change="rerun",
                                                   bind="query-params")
    if not acc_tab.open:        # the other tabs' charts need the whole comparison: the pickers' code loads meanwhile
        ui.finish()
    acc = ui.guarded(compare.load_acceptance, chosen)     # the first charts need only the histograms: draw them first
    stem = "_".join(acc.run_ids)
    if acc_tab.open:
        with acc_tab:
            parts.acceptance(acc, stem)
    with st.spinner(f"Speedups of {len(acc.run_ids)} runs ..."):
        cmp = ui.guarded(words.compare, chosen, against, acceptance=acc)
    if substitute:
        with tile_row.container():
            ui.no_verdict_for_substitute(substitute, "speed tiles, headline or verdict")
    else:
        parts.tiles(cmp, tile_row)
        parts.headline(cmp, headline)
        parts.warnings(cmp, warnings)
    for tab, draw in ((speed_tab, lambda: parts.speed(cmp, stem, against)),
                      (cat_tab, lambda: parts.categories(cmp, stem)), (cfg_tab, lambda: parts.settings(cmp))):
        if tab.open:
            with tab:
                draw()


view()
ui.finish()             # the pickers (ui.draw_last; also drawn when the view stops early on an error line)
