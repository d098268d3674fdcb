"""Hidden-state statistics: per-boundary curves across captures, their difference from a reference capture, and one
capture's outlier dimensions (?runs=a,b&stat=&mode=values|diff|rel&ref=&run=)."""

import streamlit as st

from backend import stats_compare
from dashboard import charts, severity, stats_words, ui

st.title("Hidden-state statistics")
runs = ui.load_runs()
ids = ui.complete_captures(runs)
ui.need_captures(ids, 1)
ui.unknown_runs(["runs", "run", "ref"], ids, runs)

c1, c2, c3, c4 = st.columns([3, 2, 2, 2])
chosen = ui.multiselect("Captures", ids, "runs", ui.default_stats_runs(ids), where=c1, placeholder="pick captures")
stat = ui.select("Statistic", list(charts.STATS), "stat", "mean_norm", where=c2, format_func=charts.STATS.get)
mode = ui.select("Show", list(charts.STAT_MODES), "mode", "values", where=c3, sticky=False,
                 format_func=charts.STAT_MODES.get)
if not chosen:
    st.info("Pick at least one capture.")
    st.stop()
ref = None
if mode == "values" and ui.qp_get("ref"):      # the link's reference does nothing here: say so, as for any parameter
    ui.link_notice(f"`ref={ui.cut(ui.qp_get('ref'))}` (from the URL) is not used: `Show: values` draws each capture's "
                   "own curve; a reference applies to `mode=diff` and `mode=rel`.")
if mode != "values":
    ref = ui.select("Reference", ui.capped(ids, [ui.qp_get("ref") or "", chosen[0]]), "ref", chosen[0], where=c4)

shown = list(dict.fromkeys([*chosen, *([ref] if ref else [])]))
cat = ui.catalog()
stats = ui.guarded(cat.boundary_stats, shown)
sel = runs[runs["run_id"].isin(shown)]
n_layers = dict(zip(sel["run_id"], sel["n_layers"]))
stats = stats_compare.with_depth(stats, n_layers)
if mode == "values":
    if ui.instead("runs"):  # captures the link did not ask for: curves, no headline
        ui.no_verdict_for_substitute(["runs"], "headline")
    elif len(chosen) > 1:   # a headline here too: how far the curves lie from the first, by the same rule
        comp = stats_compare.compare(stats, stat, chosen[0], chosen, n_layers, label=charts.STATS[stat])
        level, line = severity.stat_headline(comp.frame, "values", charts.STATS[stat], chosen[0],
                                             stats_words.verdict(comp))
        ui.level_banner(level, line)
    st.caption("x is depth: S_b at b, F one step after S_N; a boundary a capture lacks is a gap in its line. "
               "`Show: difference` compares every capture with a reference.")
    ui.chart_with_downloads(charts.stat_curves(stats, stat, chosen), charts.stat_frame(stats, stat),
                            f"stats_{stat}_{'_'.join(chosen)}")
else:
    comp = stats_compare.compare(stats, stat, ref, shown, n_layers, label=charts.STATS[stat])
    # one definition of change for the headline and the chart: absolute in `diff`, relative in `rel`
    level, line = severity.stat_headline(comp.frame, mode, charts.STATS[stat], ref, stats_words.verdict(comp))
    if ui.instead("runs", "ref"):
        ui.no_verdict_for_substitute(ui.instead("runs", "ref"), "headline")
    else:
        ui.level_banner(level, line)
    st.caption(f"Each capture minus the reference `{ref}` at every boundary both hold "
               f"({'absolute' if mode == 'diff' else 'relative to the reference, in %'}); x is depth, gaps where "
               "either capture lacks a boundary.")
    ui.chart_with_downloads(charts.stat_diff_curves(comp, mode, shown), charts.stat_diff_frame(comp),
                            f"stats_{stat}_{mode}_vs_{ref}_{'_'.join(chosen)}")

st.subheader("Outlier dimensions")
run = ui.select("Capture", chosen, "run", chosen[0])
frame = charts.outlier_frame(stats, run)
if frame.empty:
    st.info(f"`{run}` has no per-dimension maxima in the catalog.")
else:
    ui.chart_with_downloads(charts.outlier_heatmap(frame, run), frame, f"outliers_{run}")
