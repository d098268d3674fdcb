"""Serving load (?run=RUN | ?runs=a,b &pct=p50|p90|p99): serving-load runs recorded by `python -m backend bench
--concurrency ...` or `python -m backend sweep` (backend/load_bench.py): speedup vs concurrency per config with its
interval, throughput vs per-user speed with the Pareto front, the best K at each concurrency and where speculative
decoding stops paying (in words, no verdict where the baseline was noisy), TTFT/TPOT/ITL percentiles per level,
acceptance from the server's counters beside SpecLens's own count, and for synthetic-acceptance configs the speedup
ceiling map. Numbers: the runs' summary.json and levels.parquet (backend/metrics.py definitions, metrics.SERVING);
figures and words: dashboard/load_charts.py; data: catalog.load_cells and catalog.load_levels (aggregates only)."""

import streamlit as st

from backend.runs.manifest import Progress, StoredManifest
from dashboard import load_charts as lc
from dashboard import load_view as parts
from dashboard import ui

HOW = ("`python -m backend bench --engine vllm --target T --drafter D --prompts P --concurrency 1,8,32,64` (one K) "
       "or `python -m backend sweep --engine vllm ... --num-spec-tokens 1,2,4 --concurrency 1,8,32,64` records a load "
       "run here; add `--synthetic-tau 1,2,3,4` for the speedup ceiling map.")
PICKERS_PX = 68           # the height of a picker row, held for it until it is drawn

st.title("Serving load")
ui.rescan_named("runs", "run")      # the runs the link names (and the running ones) if changed; all without one
cat = ui.catalog()
runs = ui.guarded(cat.list_runs, kind="load")
ids = runs["run_id"].tolist()
if not ids:
    st.info(f"No load runs yet. {HOW}")
    st.stop()
names = {r.run_id: f"{r.run_id}  ({r.engine or '?'}, {r.status})" for r in runs.itertuples()}
status = dict(zip(runs["run_id"], runs["status"]))

asked = ui.qp_list("runs") or ui.qp_list("run")      # what the link names (the pickers below may show others)
# the pickers' values come from the URL now; the pickers are drawn last, into this slot above the charts (sent with
# the first chart, their widgets' code delays its first paint: docs/PERFORMANCE.md)
pickers = ui.slot(PICKERS_PX, "runs", "run")
several = bool(ui.qp_list("runs"))
if several:                                 # several runs: ?runs=a,b
    ui.unknown_runs(["runs"], ids, ui.guarded(cat.run_states, ui.qp_list("runs")), what="load run")
    ignored = ui.qp_get("run")
    pick = ui.multiselect_later("Load runs", ui.capped(ids, ui.qp_list("runs")), "runs", [ids[0]],
                                format_func=lambda r: names.get(r, r), placeholder="pick one or more load runs")
    chosen = pick.value
else:                                       # one run: ?run=
    ui.unknown_runs(["run"], ids, ui.guarded(cat.run_states, ui.qp_list("run")), what="load run")
    ignored = None
    pick = ui.select_later("Load run", ui.capped(ids, [ui.qp_get("run") or "", ids[0]]), "run", ids[0],
                           format_func=lambda r: names.get(r, r))
    chosen = [pick.value]


def draw_pickers() -> None:
    with pickers.container():
        if ignored:
            ui.link_notice(f"`run={ui.cut(ignored)}` (from the URL) is not used: `runs=` names the runs shown.")
        row = st.container(horizontal=True, gap="small", vertical_alignment="center")
        if several:
            pick.draw(where=ui.pickers_popover(f"{len(chosen)} load runs", where=row))
            return
        pick.draw(where=ui.pickers_popover(f"Load run {ui.cut(pick.value)}", where=row))
        if len(ids) > 1:
            row.page_link("pages/load.py", label="Show beside other load runs", icon=":material/library_add:",
                           query_params={"runs": pick.value})


ui.draw_last(draw_pickers, "runs", "run")
if not chosen:
    st.info("Pick at least one load run.")
    ui.stop()
# a run shown instead of the link's (its notice is above) gets its figures and charts, never tiles or verdict lines
instead = [r for r in chosen if asked and r not in asked]

manifests = {r: StoredManifest.indexed(d) for r, d in ui.guarded(cat.run_manifests, chosen).items()}
for rid in chosen:
    if status.get(rid) != "complete":
        m = manifests.get(rid, StoredManifest())
        prog = m.progress or Progress()
        done_n, total_n = ("?" if n is None else n for n in (prog.done, prog.total))
        why = m.error or ("its process is gone before it completed: run the same command again to resume"
                          if status.get(rid) == "interrupted" else "")
        st.info(f"Load run `{rid}` is {status.get(rid)} ({done_n} / {total_n} levels)"
                + (f": {why}" if why else "") + ". Its results appear here once it is complete.",
                icon=":material/hourglass_top:")
done = [r for r in chosen if status.get(r) == "complete"]
if not done:
    ui.stop()
with cat.snapshot():
    cells = ui.guarded(cat.load_cells, done)
    levels = ui.guarded(cat.load_levels, done)
multi = len(done) > 1
queried = tuple(done)                # what cells and levels hold (the runs without results are dropped below)
empty = [r for r in done if lc.of_run(cells, r).empty]
if empty:
    st.warning(f"No results indexed for {', '.join(f'`{r}`' for r in empty)} (no summary.json).",
               icon=":material/warning:")
done = [r for r in done if r not in empty]
if not done:
    ui.stop()

# ---------------------------------------------------------------------------- per run: what ran, tiles, words

# figures, frames and words come from the catalog's rows alone: kept per catalog version (ui.kept), a repeat visit
# draws them without computing them again
for rid in done:
    summary = ui.kept("load.summary", (rid, rid in instead), lambda rid=rid: parts.summarize(
        rid, lc.of_run(cells, rid), lc.of_run(levels, rid), manifests.get(rid, StoredManifest()), rid in instead))
    parts.run_summary(rid, summary, multi, rid in instead)

# ---------------------------------------------------------------------------- charts

stem = "_".join(done)
own = lc.real(cells)
syn = lc.synthetic(cells)
key = (queried, tuple(done))          # the figures' and tables' inputs, with the catalog version (ui.kept)
left, right = st.columns(2)
with left:
    shown = own if len(own) else syn
    ui.chart_with_downloads(*ui.kept("load.speedup", key, lambda: (lc.speedup_figure(shown, multi),
                                                                    lc.speedup_frame(shown))), f"load_speedup_{stem}")
with right:
    ui.chart_with_downloads(*ui.kept("load.pareto", key, lambda: (lc.pareto_figure(shown, multi),
                                                                   lc.pareto_frame(shown))), f"load_pareto_{stem}")
if len(syn):
    st.subheader("What a better drafter is worth: the speedup ceiling map")
    st.caption("Configs with a synthetic acceptance length tau*: the engine accepts draft tokens at that set mean "
               "length instead of checking the drafter's guesses, so the speed at each tau* is what a drafter "
               "that good would give on this target and server. Stars: this drafter's own acceptance, measured.")
    ui.chart_with_downloads(*ui.kept("load.ceiling", key, lambda: (lc.ceiling_figure(syn, own),
                                                                    lc.ceiling_frame(syn))), f"load_ceiling_{stem}")
    st.markdown("  \n".join(lc.ceiling_lines(syn, own)))

pct_slot = ui.slot(PICKERS_PX, "pct")   # the percentile picker, drawn last like the run pickers
pct_pick = ui.select_later("Latency percentile", list(lc.PERCENTILES), "pct", "p50", sticky=False,
                           format_func=lc.PERCENTILES.get)
ui.draw_last(lambda: pct_pick.draw(where=pct_slot.container().columns([1, 3])[0]), "pct")
pct = pct_pick.value
ui.chart_with_downloads(*ui.kept("load.latency", (*key, pct), lambda: (lc.latency_figure(levels, pct, multi),
                                                                        lc.latency_frame(levels))),
                        f"load_latency_{stem}")
left, right = st.columns(2)
with left:
    ui.chart_with_downloads(*ui.kept("load.acceptance", key, lambda: (lc.acceptance_figure(cells, multi),
                                                                       lc.acceptance_frame(cells))),
                            f"load_acceptance_{stem}")
with right.container(border=True, key="acceptance_how"):
    st.markdown(parts.ACCEPTANCE_HOW)

# ---------------------------------------------------------------------------- tables and definitions

tables = ui.on_demand("Tables: per config and concurrency, per level (the numbers behind the charts)", "tables")
if tables is not None:
    with tables:
        st.subheader("Per config and concurrency")
        st.dataframe(ui.kept("load.cells_table", key, lambda: lc.cells_table(cells, multi)), hide_index=True,
                     key="load_cells", column_config={"note": st.column_config.TextColumn(width="large")})
        st.subheader("Per level")
        st.caption("Each measurement in the order it ran: TTFT, TPOT and ITL percentiles over the level's requests "
                   "(ms), tau from the server's counters and from the requests' own count, and the machine's load.")
        st.dataframe(ui.kept("load.levels_table", key, lambda: lc.levels_table(levels, multi)), hide_index=True,
                     key="load_levels")
parts.definitions()
st.caption(HOW)

ui.finish()             # the pickers (ui.draw_last; also drawn when the page stops early: not complete, an error)
