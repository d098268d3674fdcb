"""Feeds (?check=RUN or ?drafter=DIR&target=DIR): what every vLLM and SGLang release feeds a drafter, engine x
release x runner, marked against what a stored drafter check found it was trained on, and the releases where the
answer changed. Numbers: backend/feeds.py (conventions table derived from the wheels); figures:
dashboard/release_charts.py."""

import streamlit as st

from backend import feeds, links
from dashboard import check_charts, feeds_words, release_charts, ui

HOW = ("`python -m backend feeds --drafter DRAFTER_DIR --target TARGET_DIR` prints the same matrix; "
       "`python -m backend check-drafter ...` stores a check whose pair this page can open.")

st.title("Feeds across engine releases")
checks = ui.guarded(ui.catalog().check_runs)
ids = checks["run_id"].tolist()
names = {r.run_id: f"{r.run_id}  ({r.drafter or '?'} on {r.model or '?'})" for r in checks.itertuples()}
drafter, target = ui.qp_get("drafter"), ui.qp_get("target")
if drafter or target:
    check = None
    st.caption(f"Drafter `{drafter}` on target `{target}` (from the URL).")
elif ids:
    asked = ui.qp_get("check")
    check = ui.select("Drafter check", ui.capped(ids, [asked or "", ids[0]]), "check", ids[0],
                      format_func=lambda r: names.get(r, r), none_instead=True)
    if check is None:              # the link's check cannot be shown: no matrix of another one in its place
        st.stop()
    if asked is None:              # a bare /feeds: say which check it opens and why, never silently
        st.info(f"The link names no drafter check (`?check=`), so this shows the newest of the {len(ids)} stored, "
                f"`{check}`; pick another above, or open `/feeds?drafter=DIR&target=DIR` for any pair.",
                icon=":material/info:")
else:
    st.info(f"No drafter checks yet and no ?drafter=&target= in the URL. {HOW}")
    st.stop()
d, t = ui.guarded(feeds.page_pair, drafter, target, check)
m = ui.guarded(feeds.matrix, d, t)
ti = m["target_info"]
ids_text = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in m["drafter_ids"].items() if k != "format" and v) \
    or "no aux ids written (each engine uses its default)"
st.caption(f"Drafter `{m['drafter']}` ({m['drafter_ids']['format']} format; {ids_text}) on `{m['target']}` "
           f"({'/'.join(ti['architectures']) or '?'}, {ti['n_layers']} layers). Read from the config files and "
           f"backend/conventions.yaml: rows derived from each release's wheel (tools/rederive_conventions.py); "
           f"'seen' = run on real hardware (vLLM 0.24.0, 0.25.1; SGLang 0.5.15), 'inferred' = read in the code.")
for line in feeds_words.summary_lines(feeds.summary(m)):
    (st.warning if "differs" in line else st.markdown)(line)
    ui.note_verdict(line)        # above exported charts, in the report bundle
if check:                          # the fix line, in the Drafter check page's own words
    kind, words = check_charts.fix_words(ui.guarded(ui.catalog().drafter_check, check))
    if words:
        (st.info if kind == "info" else st.success)(
            f"**The fix** (drafter check [{check}]({links.drafter_check(check)})): {words}", icon=":material/build:")
ui.chart_with_downloads(release_charts.feeds_grid(m), release_charts.feeds_table(m),
                        f"feeds_{ti['architectures'][0] if ti['architectures'] else 'target'}_{ti['n_layers']}")
st.subheader("Where the answer changed")
ch = release_charts.changes_table(m)
if ch.empty:
    st.caption("Every release in the table feeds the same boundaries.")
else:
    st.dataframe(ch, hide_index=True, key="changes")
st.subheader("Every release")
st.dataframe(release_charts.feeds_table(m), hide_index=True, key="feeds", column_config={
    "picked": st.column_config.CheckboxColumn("vLLM picks it"),
    "why": st.column_config.TextColumn(width="large"), "decided by": st.column_config.TextColumn(width="large")})
st.caption(HOW)
