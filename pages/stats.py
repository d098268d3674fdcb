"""Hidden-state statistics: per-boundary curves across captures and one capture's outlier dimensions
(?runs=a,b&stat=&run=)."""

import streamlit as st

from dashboard import charts, ui
from backend.store import catalog

st.title("Hidden-state statistics")
runs = ui.load_runs()
ids = ui.complete_captures(runs)
ui.need_captures(ids, 1)
ui.unknown_runs(["runs", "run"], ids, runs)

c1, c2 = st.columns([3, 1])
chosen = ui.multiselect("Captures", ids, "runs", ui.default_stats_runs(ids), where=c1, placeholder="pick captures")
stat = ui.select("Statistic", list(charts.STATS), "stat", "mean_norm", where=c2, format_func=charts.STATS.get)
if not chosen:
    st.info("Pick at least one capture.")
    st.stop()

stats = ui.guarded(catalog.boundary_stats, chosen)
ui.chart_with_downloads(charts.stat_curves(stats, stat, chosen), charts.stat_frame(stats, stat),
                        f"stats_{stat}_{'_'.join(chosen)}")

st.subheader("Outlier dimensions")
run = ui.select("Capture", chosen, "run", chosen[0])
frame = charts.outlier_frame(stats, run)
if frame.empty:
    st.info(f"`{run}` has no per-dimension maxima in the catalog.")
else:
    ui.chart_with_downloads(charts.outlier_heatmap(frame, run), frame, f"outliers_{run}")
