"""Runs: every capture with its status, filterable by kind, status and engine (?kind=&status=&engine=)."""

import streamlit as st

from backend import charts, ui
from backend.store import catalog

LIVE_EVERY_S = 5
STATUSES = ["complete", "running", "interrupted", "failed"]

st.title("Runs")
runs = ui.load_runs(refresh=True)

c1, c2, c3 = st.columns(3)
kinds = ui.multiselect("Kind", sorted(runs["kind"].dropna().unique()), "kind", [], where=c1, placeholder="all")
statuses = ui.multiselect("Status", STATUSES, "status", [], where=c2, placeholder="all")
engines = ui.multiselect("Engine", sorted(runs["engine"].dropna().unique()), "engine", [], where=c3, placeholder="all")
shown = charts.filter_runs(runs, kind=kinds, status=statuses, engine=engines)

counts = runs["status"].value_counts()
st.caption(f"{len(shown)} of {len(runs)} runs shown; " + ", ".join(f"{counts[s]} {s}" for s in counts.index))


@st.fragment(run_every=LIVE_EVERY_S)
def live_progress(run_ids: list[str]) -> None:
    """Progress bars of running runs, rescanned every few seconds; a full rerun once one of them ends."""
    ui.rescan()
    now = ui.guarded(catalog.list_runs)
    now = now[now["run_id"].isin(run_ids)]
    if len(now) != len(run_ids) or (now["status"] != "running").any():
        st.rerun()
    for r in now.itertuples():
        done, total = charts.progress(r.progress_done, r.progress_total)
        st.progress(done / total if total else 0.0, text=f"`{r.run_id}` running: {done} / {total} prompts")


running = shown[shown["status"] == "running"]["run_id"].tolist()
if running:
    live_progress(running)
stalled = [f"`{r.run_id}` at {'/'.join(map(str, charts.progress(r.progress_done, r.progress_total)))} prompts"
           for r in shown[shown["status"] == "interrupted"].itertuples()]
if stalled:
    st.warning(f"Interrupted: {', '.join(stalled)}. Run the same capture command (same `--name`) to resume.",
               icon=":material/pause_circle:")

if shown.empty:
    st.info("No run matches these filters.")
else:
    st.dataframe(
        charts.runs_frame(shown), hide_index=True, key="runs_table", placeholder="-",
        column_config={
            "run_id": st.column_config.TextColumn("run", pinned=True),
            "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0, format="percent"),
            "nonfinite_tokens": st.column_config.NumberColumn(
                "NaN/inf tokens", help="tokens holding NaN or inf, summed over boundaries (left out of statistics)"),
            "engine": st.column_config.TextColumn("engine", width="medium"),
            "boundaries": st.column_config.TextColumn("boundaries", width="medium"),
            "stats": st.column_config.LinkColumn("stats", display_text="open", help="per-boundary statistics"),
        })
