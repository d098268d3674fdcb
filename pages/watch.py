"""Watch (?run=): a live vLLM/SGLang server's speculative decoding over time, recorded by `python -m backend watch`:
tau per window against the baseline band, acceptance per draft position, tokens/s and running requests, restarts
and drifted windows marked, the verdict in one line. Numbers: backend/watch.py (backend/metrics.py definitions);
figures: dashboard/watch_charts.py; data: catalog.watch_windows."""

import streamlit as st

from backend import metrics
from backend.runs.manifest import StoredManifest, StoredWatchSettings
from dashboard import severity, ui, watch_charts

HOW = ("`python -m backend watch --server-url http://HOST:8000 [--interval 10] [--duration 3600] [--min-tau T]` "
       "records a watch here (exit 1 on drift or below --min-tau, for cron and CI).")

st.title("Watch a live server")
ui.rescan_named("run")      # the runs the link names (and the running ones) if changed; all without one
cat = ui.catalog()
runs = ui.guarded(cat.list_runs, kind="watch")
ids = runs["run_id"].tolist()
if not ids:
    st.info(f"No watch runs yet. {HOW}")
    st.stop()
ui.unknown_runs(["run"], ids, ui.guarded(cat.run_states, ui.qp_list("run")), what="watch run")
names = {r.run_id: f"{r.run_id}  ({r.engine or '?'}, {r.status})" for r in runs.itertuples()}
run = ui.select("Watch run", ui.capped(ids, [ui.qp_get("run") or "", ids[0]]), "run", ids[0],
                format_func=lambda r: names.get(r, r))
row = ui.guarded(cat.get_run, run)
m = StoredManifest.indexed(row["manifest"] if row else None)
df = ui.guarded(cat.watch_windows, run)
verdict = watch_charts.stored_verdict(m)
status = row["status"] if row else "?"

if status == "running":
    st.info(f"This watch is running ({len(df)} window(s) so far); reload the page for new windows. The verdict so far "
            "is below.", icon=":material/sensors:")
elif status in ("failed", "interrupted", "quarantined"):
    why = row.get("error") or ("its process is gone (killed or crashed) before it completed" if status == "interrupted"
                               else "no reason recorded")
    st.warning(f"This watch is {status}: {why}. The {len(df)} window(s) it recorded are shown; it is not complete.",
               icon=":material/warning:")
if ui.instead("run"):        # the link's run is not shown: never this run's verdict in its place
    ui.no_verdict_for_substitute(["run"], "drift verdict")
elif verdict:                # as loud as the drift costs in tau (dashboard/severity.py), the same scale as every page
    level, line = watch_charts.verdict_level(verdict, df)
    ui.level_banner(level, line)
    if verdict.get("state") == "drift":
        floor = " Below your --min-tau is an error whatever the size." if verdict.get("min_tau") is not None else ""
        st.caption(severity.scale_text() + floor)
else:
    st.info("No verdict: the watch recorded no window.", icon=":material/info:")
if df.empty:
    st.caption(HOW)
    st.stop()

st.caption(watch_charts.summary(m, df))
settings = m.settings_as(StoredWatchSettings)
ui.chart_with_downloads(watch_charts.tau_figure(df, settings.min_tau, settings.level),
                        watch_charts.tau_frame(df), f"watch_{run}_tau")
left, right = st.columns(2)
with left:
    if df["per_pos_rate"].notna().any():
        ui.chart_with_downloads(watch_charts.position_figure(df), watch_charts.position_frame(df),
                                f"watch_{run}_positions")
    else:
        st.info("No per-position acceptance: this server's counters carry none (SGLang counts verification steps "
                "and tokens per finished request only).", icon=":material/info:")
with right:
    ui.chart_with_downloads(watch_charts.rates_figure(df), watch_charts.rates_frame(df), f"watch_{run}_rates")

st.subheader("Windows")
st.dataframe(watch_charts.windows_table(df), hide_index=True, key="windows", column_config={
    "note": st.column_config.TextColumn(width="large")})
with st.expander("How the verdict is computed"):
    min_drafts = "?" if settings.min_drafts is None else settings.min_drafts
    st.markdown(f"{metrics.DRIFT_STATISTIC}. Windows with fewer than {min_drafts} drafts are "
                "\"too few drafts\": not evidence either way. A restart (a counter went down) starts a new segment "
                "with its own baseline; it is never read as a drop.")
st.caption(HOW)
