"""The Compare page's parts below its pickers (pages/compare.py): the speed tiles, the headline, the drafter
diagnoses and warnings, and each tab's charts and tables, drawn from a compare_words.View."""

from __future__ import annotations

from typing import Any

import streamlit as st

from backend import metrics
from backend.compare import Acceptance
from dashboard import charts, load_charts, severity, ui
from dashboard import compare_words as words

# green/red only for a verdict; "noisy" (the speed figures are not comparable: timing noise, load, another moment)
# is grey without an arrow, like "no clear difference"
TONE = {"slower": "normal", "faster": "normal", "unclear": "off", "none": "off", "noisy": "off"}


def tiles(cmp: words.View, slot: Any) -> None:
    """Each run's speedup tile, four a row."""
    with slot.container():
        for start in range(0, len(cmp.tiles), 4):                        # four tiles a row
            for col, tile in zip(st.columns(4), cmp.tiles[start:start + 4]):
                with col.container(border=True, key=f"tile_{start + cmp.tiles[start:start + 4].index(tile)}"):
                    st.metric(tile.run_id, tile.value, tile.delta, delta_color=TONE.get(tile.tone, "off"),
                              delta_arrow="off" if tile.tone == "noisy" else "auto")
                    st.caption("  \n".join(tile.lines))


def headline(cmp: words.View, slot: Any) -> None:
    """The headline, with the tau loss on the severity scale; also the view's verdict (exports, report bundle)."""
    with slot.container(border=True):
        st.markdown(cmp.headline)
        if cmp.loss:                     # the tau loss on the one severity scale (dashboard/severity.py)
            lo = cmp.loss
            cost = severity.tau_cost(lo.best_tau, lo.worst_tau, lo.ci_low, lo.ci_high)
            ui.level_banner(cost.level, severity.headline(cost, f"`{lo.worst}` against `{lo.best}`, {cost.words}"
                            + (f" over {lo.prompts} shared prompts" if lo.prompts else "") + "."))
            st.caption(severity.scale_text())
            if worth := load_charts.worth_line(lo.worst_tau, lo.best_tau):
                st.markdown(worth)
    ui.note_verdict(cmp.headline)        # above exported charts, in the report bundle


def warnings(cmp: words.View, slot: Any) -> None:
    """Each drafter diagnosis at the level of what it costs here, then the other warnings."""
    with slot.container():
        for run, line in cmp.diagnoses.items():     # each drafter diagnosis at the level of what it costs here
            if cmp.loss and run == cmp.loss.worst and run != cmp.loss.best:
                cost = severity.tau_cost(cmp.loss.best_tau, cmp.loss.worst_tau, cmp.loss.ci_low, cmp.loss.ci_high)
            else:
                cost = None
            level = cost.level if cost else severity.LEVELS["note"]
            ui.level_banner(level, (severity.headline(cost, line) if cost else
                                    f"**{level.name}** (cost not measured in this comparison): {line}"), note=False)
        ui.warning_list([w for w in cmp.warnings if w not in cmp.diagnoses.values()])


def acceptance(acc: Acceptance, stem: str) -> None:
    """The Acceptance tab: accepted-length histograms and per-position acceptance."""
    left, right = st.columns(2)
    with left:
        ui.chart_with_downloads(charts.accepted_histogram(acc.histogram, acc.run_ids), acc.histogram,
                                f"accepted_hist_{stem}")
    with right:
        ui.chart_with_downloads(charts.acceptance_curves(acc.positions, acc.run_ids), acc.positions,
                                f"acceptance_per_position_{stem}")


def speed(cmp: words.View, stem: str, against: str) -> None:
    """The Speed tab: both throughput definitions, throughput, speedup and latency charts, the summary table."""
    st.caption("Two throughput figures, both with 95% bootstrap intervals over prompts; they differ when prompts "
               "of different lengths run at different speeds:")
    for col, d in zip(st.columns(2), words.speed_definitions(cmp.figures)):
        with col.container(border=True, key=f"definition_{d.key}"):
            st.markdown(f"**{d.name.capitalize()}**: {d.definition}.")
            st.markdown("\n".join(f"- {line}" for line in d.lines))
    left, right = st.columns(2)
    speed = charts.speed_frame(cmp.figures)
    with left:
        ui.chart_with_downloads(charts.throughput_bars(cmp.figures), speed, f"throughput_{stem}")
    with right:
        ui.chart_with_downloads(charts.speedup_chart(cmp.figures, words.BASELINE_LABELS[against]), speed,
                                f"speedup_{against}_{stem}")
    left, right = st.columns(2)
    with left:
        ui.chart_with_downloads(charts.latency_chart(cmp.figures), speed, f"latency_{stem}")
    with right.container(border=True, key="latency"):
        st.markdown("**TTFT** (time to first token: the prompt's prefill) and **TPOT** (time per output token "
                    "after the first), means over prompts with 95% intervals:")
        st.markdown("\n".join(f"- {line}" for line in words.latency_lines(cmp.figures)))
    table = ui.on_demand("Summary table: tau, acceptance, both throughputs, speedups, TTFT and TPOT per run",
                         "summary_table")
    if table is None:
        return
    with table:
        two = {"format": "%.2f"}
        st.dataframe(charts.summary_table(cmp.figures), hide_index=True, key="summary", column_config={
            "tau": st.column_config.NumberColumn(**two),
            "acceptance": st.column_config.NumberColumn(format="percent"),
            **{c: st.column_config.NumberColumn(format="%.1f") for c in ("tok/s per-prompt mean", "tok/s total/time")},
            **{c: st.column_config.NumberColumn(**two) for c in ("speedup (per-prompt)", "speedup (total)", "TTFT ms",
                                                                 "TPOT ms")}})


def categories(cmp: words.View, stem: str) -> None:
    """The Per category tab."""
    st.caption("Spec-Bench categories: tau (mean acceptance length), mean per-prompt tokens/s, and the speedup "
               "over the same baseline on that category's prompts, each with its 95% bootstrap interval over "
               f"the category's prompts; a category with fewer than {metrics.MIN_INTERVAL_PROMPTS} prompts "
               "shows its value without an interval (a bootstrap over so few prompts would look falsely tight).")
    ui.chart_with_downloads(charts.category_chart(cmp.categories, cmp.run_ids),
                            charts.category_frame(cmp.categories), f"per_category_{stem}")
    categories = charts.category_table(cmp.categories, cmp.run_ids)
    st.dataframe(categories, hide_index=True, key="categories",
                 column_config={c: st.column_config.NumberColumn(format="%.2f") for c in categories.columns
                                if c.endswith(("tau", "tokens/s", "speedup"))})


def settings(cmp: words.View) -> None:
    """The Settings that differ tab."""
    if cmp.config.empty:
        st.caption("The manifests of these runs record the same settings.")
    else:
        st.caption("Manifest keys (flattened) whose values differ; results and bookkeeping (times, progress) "
                   "left out.")
        st.dataframe(cmp.config, hide_index=True, key="config_diff")
