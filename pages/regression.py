"""Regression (?group=N): bench runs of one drafter and target grouped by engine release and date, tau and speedup
with their 95% intervals, and the change in tau against the group's first run paired over prompts. Numbers:
backend/regress.py (backend/metrics.py definitions); figures: dashboard/release_charts.py."""

import streamlit as st

from backend import regress
from dashboard import release_charts, ui

HOW = ("`python -m backend regress --baseline RUN --candidate RUN [--max-tau-drop 0.02]` exits 1 with one line "
       "when the candidate is worse beyond the paired interval (for CI); `python -m backend runs --json` carries "
       "every run's headline figures.")

st.title("Regression over engine releases")
ui.rescan()
groups = ui.guarded(regress.history)
if not groups:
    st.info(f"No complete bench runs with a drafter yet: `python -m backend bench ...` on each engine release. {HOW}")
    st.stop()
labels = list(groups)
keys = [str(i) for i in range(len(labels))]
g = ui.select("Drafter and target", keys, "group", "0", format_func=lambda k: labels[int(k)])
frame = groups[labels[int(g)]]
shown = ui.guarded(regress.with_release, regress.newest(frame))
t = ui.guarded(regress.group_table, shown)
more = f" (the newest {len(shown)} of {len(frame)})" if len(shown) < len(frame) else ""
st.caption(f"{len(t)} bench run(s){more} of {labels[int(g)]}, ordered by engine release, then date. tau: 95% bootstrap "
           f"interval over prompts; change: tau minus the first run's, paired over the prompts both decoded; speedup: "
           f"the Spec-Bench speedup over each run's paired plain-decoding baseline with its 95% interval.")
ui.chart_with_downloads(release_charts.regression_figure(t), t, f"regression_{labels[int(g)]}")
st.dataframe(release_charts.regression_rows(t), hide_index=True, key="regression")
st.caption(HOW)
