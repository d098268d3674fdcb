"""Run (?id=RUN&category=&q=&sort=): one run on one page: its status (and error, or why it stopped), links to every
view that shows it, its headline figures, what the engine fed the drafter, a bench run's per-prompt table (filtered by
category and text, sorted; all in the URL), a capture's boundaries, its settings (the manifest flattened), the files
of its run directory and the tail of its log. A bench run carries its problems here (the drafter check's finding that
the engine fed other boundaries than the drafter was trained on, the HF engine reproducing a serving engine's reading;
written above its exported charts too) and its charts (accepted lengths, per-position acceptance, tokens/s per prompt).
Every "open" link of the dashboard comes here. Words, numbers and tables: dashboard/run_view.py (tau and acceptance from
backend/metrics.py); data: catalog queries."""

import streamlit as st

from backend import compare, findings, regress, run_files
from backend.config import data_root
from backend.runs.manifest import StoredManifest
from dashboard import charts, compare_view, page_registry, run_view, severity, ui, watch_charts

PICKERS_PX = 68           # the height of the per-prompt filters' row, held for it until it is drawn
STATUS = {"complete": "green", "running": "blue", "interrupted": "orange", "failed": "red", "quarantined": "red"}

ui.rescan_named("id")      # the run the link names (and the running ones) if changed; all without one
cat = ui.catalog()
choices = ui.guarded(cat.run_choices)
if choices.empty:
    st.info(ui.NO_DATA.format(root=data_root()))
    st.stop()
ids = choices["run_id"].tolist()
ui.unknown_runs(["id"], ids, choices, what="run")
head, pick = st.columns([3, 1], vertical_alignment="bottom")
# the pickers' values come from the URL now; the pickers are drawn last (ui.draw_last), each where it belongs: sent
# with the first table and chart, their widgets' code delays their first paint (docs/PERFORMANCE.md)
run_pick = ui.select_later("Open another run", ui.capped(ids, [ui.qp_get("id") or "", ids[0]]), "id", ids[0],
                           where=pick, help=f"lists the {ui.MAX_OPTIONS} newest runs and the one in the URL"
                           if len(ids) > ui.MAX_OPTIONS else None, none_instead=True)
below_head = st.empty()               # the picker's notice, under the title row


def draw_run_pick() -> None:
    with below_head.container():         # the picker's notices under the title row, the picker in a popover beside it
        run_pick.draw(where=ui.pickers_popover("Open another run", where=pick))


ui.draw_last(draw_run_pick, "id")
rid = run_pick.value
if rid is None:                       # the link's run cannot be shown: never another run's verdicts in its place
    ui.stop()
run = ui.guarded(cat.get_run, rid)
if run is None:                       # gone between the two queries (a rescan removed it)
    st.info(f"Run `{ui.cut(rid)}` left the catalog; pick another.")
    ui.stop()
m = StoredManifest.indexed(run["manifest"])          # the catalog's manifest, typed; every key: m.to_json()
kind, status = run.get("kind") or "?", run.get("status") or "?"
head.title(f"Run {rid}")

facts = [f":{STATUS.get(status, 'gray')}-badge[{status}]", f"**{kind}**"]
engine = charts.engine_label(run.get("engine"), run.get("engine_version"))
reading = run_view.engine_fact(m)
engine_words = f"engine `{engine}`" + (f", reproducing **{reading}**'s reading" if reading else "") if engine else None
facts += [engine_words, f"target `{run['model']}`" if run.get("model") else None,
          f"drafter `{run['drafter']}`" if run.get("drafter") else None,
          f"dataset `{run['dataset']}`" if run.get("dataset") else None,
          f"created {run['created']}" if run.get("created") else None,
          f"tags {', '.join(f'`{t}`' for t in run['tags'].split(','))}" if run.get("tags") else None]
st.markdown(" · ".join(f for f in facts if f))
if run.get("notes"):
    st.caption(f"Notes: {run['notes']}")
if status in ("failed", "quarantined"):
    st.error(f"{status.capitalize()}: {run.get('error') or 'no reason recorded'}", icon=":material/error:")
elif status == "interrupted":
    done, total = charts.progress(run.get("progress_done"), run.get("progress_total"))
    st.warning(f"Interrupted at {done} / {total}: its process is gone. Run the same command (same `--name`) to "
               "resume it.", icon=":material/pause_circle:")
elif status == "running":
    done, total = charts.progress(run.get("progress_done"), run.get("progress_total"))
    st.progress(done / total if total else 0.0, text=f"running: {done} / {total}")
found = (ui.guarded(findings.findings, {rid: m}, ui.guarded(cat.check_manifests), cat).get(rid, [])
         if kind == "bench" else [])
wrong = [f for f in found if f.kind == "mismatch"]
for i, f in enumerate(wrong):       # a wrong feed first, as loud as what it costs (dashboard/severity.py)
    line = run_view.finding_line(f, m)
    with st.container(key=f"run_finding_{i}"):
        ui.level_banner(run_view.finding_level(f), line, note=False)
if wrong:
    st.caption(severity.scale_text())
for f in found:                     # in exports too (the HF note: in the header and the feed line)
    ui.note_verdict(run_view.plain(run_view.finding_line(f, m)))

# ---------------------------------------------------------------------------- views that show this run

bench = ui.guarded(cat.bench_index) if kind == "bench" else None
captures = ui.guarded(cat.list_runs, "capture", "complete") if kind == "capture" else None
checks = ui.guarded(cat.list_runs, "check", "complete") if kind == "bench" and run.get("drafter") else None
groups = ui.guarded(regress.group_labels) if kind == "bench" and run.get("drafter") else None
links = run_view.links(run, bench, captures, checks, groups)
row = st.container(horizontal=True, gap="small", key="run_links")
for link in links:
    row.page_link(page_registry.script(link.view), label=link.label, icon=page_registry.icon(link.view),
                  query_params=link.params)
if status != "complete":
    st.caption("The other views show complete runs only.")

# ---------------------------------------------------------------------------- headline and feeds

if kind == "bench":
    figures = run_view.bench_figures(m)
    if figures:
        with st.container(horizontal=True, gap="medium", key="run_figures"):
            for label, value in figures:
                st.metric(label, value, border=True, width="content")
    notice = run_view.speed_notice(m)
    if notice:
        st.container(key="run_speed_noise").warning(
            f"**No faster/slower verdict from this run's speed figures.** {notice}", icon=":material/speed:")
    timing = run_view.timing_lines(m)
    if timing:
        st.caption("  \n".join(timing))
elif kind == "capture":
    with st.container(horizontal=True, gap="medium", key="run_figures"):
        for label, value in run_view.capture_headline(m):
            st.metric(label, value, border=True, width="content")
elif kind in ("load", "watch"):
    figures = run_view.load_figures(m) if kind == "load" else run_view.watch_figures(m)
    if figures:
        with st.container(horizontal=True, gap="medium", key="run_figures"):
            for label, value in figures:
                st.metric(label, value, border=True, width="content")
    verdict = watch_charts.stored_verdict(m) if kind == "watch" else {}
    if verdict.get("line"):             # the watch's verdict at the Watch page's level (a drift: what it costs)
        level, line = watch_charts.verdict_level(verdict, ui.guarded(cat.watch_windows, rid))
        ui.level_banner(level, line, note=False)
    elif kind == "load" and status == "complete":
        st.caption("Speedups, the best K per concurrency, where speculative decoding stops paying and whether the "
                   "baseline was steady: on the Serving load page (link above).")

st.subheader({"capture": "Boundaries", "load": "What ran", "watch": "What ran"}.get(kind,
                                                                                   "What the engine fed the drafter"))
fed = run_view.fed(m)
st.markdown(fed.summary)
if fed.warning:
    st.warning(fed.warning, icon=":material/warning:")
if not fed.rows.empty:
    st.container(key="run_fed").table(fed.rows, hide_index=True, width="content")   # a few rows: no grid
if kind == "capture" and status == "complete":
    stats = ui.guarded(cat.boundary_stats, [rid])
    if not stats.empty:
        st.container(key="run_boundaries").dataframe(
            stats[["boundary", "n_tokens", "nonfinite_tokens", "mean_norm", "rms", "max_abs", "kurtosis"]],
            hide_index=True, column_config={
                "n_tokens": st.column_config.NumberColumn("tokens"),
                "mean_norm": st.column_config.NumberColumn("mean token norm", format="%.3g"),
                "nonfinite_tokens": st.column_config.NumberColumn("NaN/inf tokens"),
                **{c: st.column_config.NumberColumn(format="%.3g") for c in ("rms", "max_abs", "kurtosis")}})

# ---------------------------------------------------------------------------- charts and per-prompt table (bench runs)

if kind == "bench":
    k = int(m.num_spec_tokens or 0)
    base = run.get("baseline_run") if isinstance(run.get("baseline_run"), str) else None
    texts = run_files.prompt_texts(m, ui.data()) if status == "complete" else {}
    if status == "complete":
        st.subheader("Charts")
        both = ui.guarded(cat.bench_prompt_timings, [rid, base] if base else [rid])     # one query
        speeds = run_view.prompt_speeds(both[both["run_id"] == rid], both[both["run_id"] == base] if base else None,
                                        texts)
        if k > 0:                     # the same two charts as Compare's Acceptance tab, for this run alone
            compare_view.acceptance(ui.guarded(compare.load_acceptance, [rid]), rid)
        left, right = st.columns(2)
        if not speeds.empty:
            with left:
                ui.chart_with_downloads(charts.prompt_speed_chart(speeds, rid), speeds,
                                        f"tokens_per_s_per_prompt_{rid}")
    st.subheader("Per prompt")
    agg = ui.guarded(cat.bench_prompt_table, rid, base) if status == "complete" else None
    if agg is None or agg.empty:
        st.caption("The per-prompt rows are indexed once the run is complete." if status != "complete"
                   else "No per-prompt rows in the catalog for this run.")
    else:
        greedy = not m.temperature
        table = run_view.prompt_table(agg, k, greedy, texts)
        filters = ui.slot(PICKERS_PX, "category", "q", "sort")
        cats_pick = ui.multiselect_later("Category", sorted(table["category"].unique()), "category", [],
                                         placeholder="all")
        needle_pick = ui.text_later("Find", "q", placeholder="prompt id, text, category or output hash")
        sort_pick = ui.select_later("Sort by", list(run_view.SORTS), "sort", "order", sticky=False,
                                    format_func=run_view.SORT_LABELS.get)

        def draw_filters() -> None:
            with filters.container():        # notices about the link here; the filters in a popover
                shown_cats = ui.cut(", ".join(cats_pick.value), 60) if cats_pick.value else "all categories"
                found = f" · find `{ui.cut(needle_pick.value, 30)}`" if needle_pick.value else ""
                pop = ui.pickers_popover(f"Prompts: {shown_cats}{found} · sorted by "
                                         f"{run_view.SORT_LABELS.get(sort_pick.value, sort_pick.value)}")
                for p in (cats_pick, needle_pick, sort_pick):
                    p.draw(where=pop)

        ui.draw_last(draw_filters, "category", "q", "sort")
        cats, needle, sort = cats_pick.value, needle_pick.value, sort_pick.value
        shown = run_view.filter_prompts(table, cats, needle, sort)
        repeats = int(table["repeats"].max())
        cut_to = (f"texts cut to {run_view.PROMPT_TEXT_MAX} characters" if texts else
                  "no texts: the prompts file it read is gone or outside SPECLENS_MODEL_ROOTS")
        st.caption(f"{len(shown)} of {len(table)} prompts ({cut_to}); figures pooled over {repeats} repeat(s): "
                   "accepted and "
                   f"drafted draft tokens (K = {k}), acceptance = accepted / drafted, tau = 1 + accepted / verify "
                   "steps (backend/metrics.py), mean tokens/s, TTFT and TPOT"
                   + (f"; same as baseline: every repeat's output equals `{base}`'s (greedy)." if greedy and base
                      else "."))
        st.container(key="run_prompts").dataframe(shown, hide_index=True,
                     column_order=run_view.prompt_columns(table, k, greedy and bool(base)), column_config={
                         "text": st.column_config.TextColumn("text", width="large"),
                         "acceptance": st.column_config.NumberColumn(format="percent"),
                         "tau": st.column_config.NumberColumn(format="%.2f"),
                         "tokens/s": st.column_config.NumberColumn(format="%.1f"),
                         "TTFT ms": st.column_config.NumberColumn(format="%.1f"),
                         "TPOT ms": st.column_config.NumberColumn(format="%.2f"),
                         "output tokens": st.column_config.NumberColumn(format="%d"),
                         "same as baseline": st.column_config.CheckboxColumn()})

# ---------------------------------------------------------------------------- settings, files, log

details = ui.on_demand("Settings, files and log", "details", opened=status != "complete")   # why it stopped
if details is not None:
    with details:
        left, right = st.columns([3, 2])
        with left:
            st.subheader("Settings")
            st.caption("The manifest flattened (`settings.*` = what a resume must match); results and bookkeeping "
                       "left out.")
            st.container(key="run_settings").dataframe(
                run_view.settings_table(m.to_json()), hide_index=True,
                column_config={"value": st.column_config.TextColumn(width="large")})
        with right:
            st.subheader("Files")
            st.caption(f"`{run.get('path')}`")
            st.container(key="run_files").dataframe(run_files.files(run["path"]), hide_index=True,
                                                    column_order=["file", "size"])
            st.download_button("manifest.json", data=run_view.manifest_text(m.to_json()),
                               file_name=f"{rid}.manifest.json", mime="application/json",
                               icon=":material/download:", key="dl_manifest")

        log = run_files.log_tail(run["path"], m, ui.data())
        if log is not None:
            st.subheader("Log")
            st.caption(f"The last {len(log.lines)} lines of `{log.path}`.")
            st.code("\n".join(log.lines) or "(empty)", language=None)

ui.finish()          # the pickers (ui.draw_last)
