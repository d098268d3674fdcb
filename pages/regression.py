"""Regression (?group=N): bench runs of one drafter and target grouped by engine release and date, tau and speedup
with their 95% intervals, and the change in tau against the group's first run paired over prompts. Numbers:
backend/regress.py (backend/metrics.py definitions); figures: dashboard/release_charts.py."""

import pandas as pd
import streamlit as st

from backend import regress
from dashboard import release_charts, severity, ui

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
sizes = [len(groups[lb]) for lb in labels]
first = next((k for k, n in zip(keys, sizes) if n >= 2), "0")       # open on a group that has a trend, if any
g = ui.select("Drafter and target", keys, "group", first,
              format_func=lambda k: f"{labels[int(k)]}: {sizes[int(k)]} run{'s' if sizes[int(k)] != 1 else ''}")
frame = groups[labels[int(g)]]
shown = ui.guarded(regress.with_release, regress.newest(frame))
t = ui.guarded(regress.group_table, shown)
more = f" (the newest {len(shown)} of {len(frame)})" if len(shown) < len(frame) else ""
st.caption(f"{len(t)} bench run(s){more} of {labels[int(g)]}, ordered by engine release, then date. tau: 95% bootstrap "
           f"interval over prompts; change: tau minus the first run's, paired over the prompts both decoded; speedup: "
           f"the Spec-Bench speedup over each run's paired plain-decoding baseline with its 95% interval.")
if ui.instead("group"):          # the link's group cannot be shown: the figures of another, but no verdict
    ui.no_verdict_for_substitute(["group"])
elif len(t) < 2:
    only = t["run_id"].iloc[0] if len(t) else "?"
    st.info(f"Nothing to compare yet: this group holds one bench run (`{only}`), so there is no trend and no "
            "verdict. To get one, bench the same drafter on the same target again as another engine release reads "
            "it, on the same prompts file: `python -m backend bench --engine hf --target TARGET_DIR --drafter "
            "DRAFTER_DIR --prompts FILE --producer sglang --producer-version 0.5.15` (or another `--producer-version`,"
            " or `--engine vllm|sglang` on a GPU node), then `python -m backend regress --baseline "
            f"{only} --candidate NEW_RUN`." + (" Groups with a trend: " + ", ".join(
                f"[{labels[i]}](/regression?group={i})" for i, n in enumerate(sizes) if n >= 2) + "."
                if any(n >= 2 for n in sizes) else ""), icon=":material/timeline:")
else:
    base, cand = t.iloc[0], t.iloc[-1]          # the newest release's run against the first (the table's change)
    if pd.isna(cand["tau_change"]):
        st.info(f"No verdict for `{cand['run_id']}` against `{base['run_id']}`: they share fewer than 2 prompts "
                "(bench both on the same prompts file).", icon=":material/info:")
    else:
        d, dlo, dhi = (float(cand[k]) for k in ("tau_change", "tau_change_ci_low", "tau_change_ci_high"))
        cost = severity.tau_cost(float(base["tau"]), float(base["tau"]) + d, -dhi, -dlo)
        flag = [None if pd.isna(v) else bool(v) for v in (base["lossless"], cand["lossless"])]
        tau_worse, lost = regress.worse(d, dhi, regress.MAX_TAU_DROP, *flag)
        said = ("worse" if tau_worse or lost else "ok") + (" (no longer lossless)" if lost else "")
        what = (f"`{cand['run_id']}` ({cand['release']}) against the first, `{base['run_id']}` ({base['release']}): "
                f"{cost.words}, paired over the prompts both decoded. `python -m backend regress --baseline "
                f"{base['run_id']} --candidate {cand['run_id']}` says **{said}** (it fails a CI job when the drop "
                f"exceeds {regress.MAX_TAU_DROP:g} and the interval excludes 0).")
        ui.level_banner(severity.LEVELS["error"] if lost else cost.level, severity.headline(cost, what))
        st.caption(severity.scale_text())
ui.chart_with_downloads(release_charts.regression_figure(t), t, f"regression_{labels[int(g)]}")
st.dataframe(release_charts.regression_rows(t), hide_index=True, key="regression")
st.caption(HOW)
