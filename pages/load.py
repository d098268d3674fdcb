"""Serving load (?run=RUN | ?runs=a,b &pct=p50|p90|p99): serving-load runs recorded by `python -m backend bench
--concurrency ...` or `python -m backend sweep` (backend/load_bench.py): speedup vs concurrency per config with its
interval, throughput vs per-user speed with the Pareto front, the best K at each concurrency and where speculative
decoding stops paying (in words, no verdict where the baseline was noisy), TTFT/TPOT/ITL percentiles per level,
acceptance from the server's counters beside SpecLens's own count, and for synthetic-acceptance configs the speedup
ceiling map. Numbers: the runs' summary.json and levels.parquet (backend/metrics.py definitions, metrics.SERVING);
figures and words: dashboard/load_charts.py; data: catalog.load_cells and catalog.load_levels (aggregates only)."""

import streamlit as st

from backend import metrics
from backend.runs.manifest import Progress, StoredManifest
from dashboard import load_charts as lc
from dashboard import ui

HOW = ("`python -m backend bench --engine vllm --target T --drafter D --prompts P --concurrency 1,8,32,64` (one K) "
       "or `python -m backend sweep --engine vllm ... --num-spec-tokens 1,2,4 --concurrency 1,8,32,64` records a load "
       "run here; add `--synthetic-tau 1,2,3,4` for the speedup ceiling map.")
# green/red only for a verdict; a noisy baseline (no verdict) and an interval covering 1 are grey without an arrow
TONE = {"slower": "normal", "faster": "normal", "unclear": "off", "none": "off", "noisy": "off"}
NOTE = {"warning": (st.warning, ":material/speed:"), "info": (st.info, ":material/info:")}

st.title("Serving load")
ui.rescan()
cat = ui.catalog()
runs = ui.guarded(cat.list_runs, kind="load")
ids = runs["run_id"].tolist()
if not ids:
    st.info(f"No load runs yet. {HOW}")
    st.stop()
names = {r.run_id: f"{r.run_id}  ({r.engine or '?'}, {r.status})" for r in runs.itertuples()}
status = dict(zip(runs["run_id"], runs["status"]))

asked = ui.qp_list("runs") or ui.qp_list("run")      # what the link names (the pickers below may show others)
if ui.qp_list("runs"):                      # several runs: ?runs=a,b
    ui.unknown_runs(["runs"], ids, ui.guarded(cat.run_states, ui.qp_list("runs")), what="load run")
    if ui.qp_get("run"):
        ui.link_notice(f"`run={ui.cut(ui.qp_get('run'))}` (from the URL) is not used: `runs=` names the runs shown.")
    chosen = ui.multiselect("Load runs", ui.capped(ids, ui.qp_list("runs")), "runs", [ids[0]],
                            format_func=lambda r: names.get(r, r), placeholder="pick one or more load runs")
else:                                       # one run: ?run=
    ui.unknown_runs(["run"], ids, ui.guarded(cat.run_states, ui.qp_list("run")), what="load run")
    pick, more = st.columns([3, 1], vertical_alignment="bottom")
    run = ui.select("Load run", ui.capped(ids, [ui.qp_get("run") or "", ids[0]]), "run", ids[0], where=pick,
                    format_func=lambda r: names.get(r, r))
    chosen = [run]
    if len(ids) > 1:
        more.page_link("pages/load.py", label="Show beside other load runs", icon=":material/library_add:",
                       query_params={"runs": run})
if not chosen:
    st.info("Pick at least one load run.")
    st.stop()
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
    st.stop()
with cat.snapshot():
    cells = ui.guarded(cat.load_cells, done)
    levels = ui.guarded(cat.load_levels, done)
multi = len(done) > 1
empty = [r for r in done if lc.of_run(cells, r).empty]
if empty:
    st.warning(f"No results indexed for {', '.join(f'`{r}`' for r in empty)} (no summary.json).",
               icon=":material/warning:")
done = [r for r in done if r not in empty]
if not done:
    st.stop()

# ---------------------------------------------------------------------------- per run: what ran, tiles, words

for rid in done:
    c, lv = lc.of_run(cells, rid), lc.of_run(levels, rid)
    with st.container(key=f"load_run_{rid}"):
        if multi:
            st.subheader(rid)
        st.caption(lc.run_caption(manifests.get(rid, StoredManifest()), lv, c))
        if rid in instead:
            text = (f"No verdict: `{rid}` is shown instead of the run the link names (see the notice above); its "
                    "charts and tables are below, without tiles or verdict lines.")
            st.info(text, icon=":material/info:")
            ui.note_verdict(text)
            continue
        row_tiles = lc.tiles(c)
        for start in range(0, len(row_tiles), 4):
            for col, (i, tile) in zip(st.columns(4), enumerate(row_tiles[start:start + 4], start=start)):
                with col.container(border=True, key=f"tile_{rid}_{i}"):
                    st.metric(tile.label, tile.value, tile.delta, delta_color=TONE.get(tile.tone, "off"),
                              delta_arrow="off" if tile.tone in ("noisy", "unclear") else "auto")
                    st.caption("  \n".join(tile.lines))
        words = lc.best_lines(c)
        stops = lc.stops_lines(c)
        if words or stops:
            with st.container(border=True, key=f"verdict_{rid}"):
                if words:
                    st.markdown(("**Best K at each concurrency**" if lc.real(c)["config"].nunique() > 1
                                 else "**Speedup at each concurrency**") + "  \n" + "  \n".join(words))
                if stops:
                    st.markdown("**Where speculative decoding stops paying**  \n" + "  \n".join(stops))
        ui.note_verdict(lc.headline(rid, c))
        for note in (lc.noise_note(c, lv), lc.agreement_note(c)):
            if note is None:
                continue
            kind, text = note
            if kind in NOTE:
                show, icon = NOTE[kind]
                show(text, icon=icon)
            else:
                st.caption(text)

# ---------------------------------------------------------------------------- charts

stem = "_".join(done)
own = lc.real(cells)
syn = lc.synthetic(cells)
left, right = st.columns(2)
with left:
    shown = own if len(own) else syn
    ui.chart_with_downloads(lc.speedup_figure(shown, multi), lc.speedup_frame(shown), f"load_speedup_{stem}")
with right:
    ui.chart_with_downloads(lc.pareto_figure(shown, multi), lc.pareto_frame(shown), f"load_pareto_{stem}")
if len(syn):
    st.subheader("What a better drafter is worth: the speedup ceiling map")
    st.caption("Configs with a synthetic acceptance length tau*: the engine accepts draft tokens at that set mean "
               "length instead of checking the drafter's guesses, so the speed at each tau* is what a drafter "
               "that good would give on this target and server. Stars: this drafter's own acceptance, measured.")
    ui.chart_with_downloads(lc.ceiling_figure(syn, own), lc.ceiling_frame(syn), f"load_ceiling_{stem}")
    st.markdown("  \n".join(lc.ceiling_lines(syn, own)))

pick, _ = st.columns([1, 3])
pct = ui.select("Latency percentile", list(lc.PERCENTILES), "pct", "p50", sticky=False, where=pick,
                format_func=lc.PERCENTILES.get)
ui.chart_with_downloads(lc.latency_figure(levels, pct, multi), lc.latency_frame(levels), f"load_latency_{stem}")
left, right = st.columns(2)
with left:
    ui.chart_with_downloads(lc.acceptance_figure(cells, multi), lc.acceptance_frame(cells), f"load_acceptance_{stem}")
with right.container(border=True, key="acceptance_how"):
    st.markdown("**Two counts of acceptance.** The server's counters (vLLM `spec_decode` drafts, draft tokens and "
                "accepted tokens; SGLang's equivalents), read from `/metrics` before and after each level, are the "
                "reference. SpecLens also counts each request's own verification steps from its stream (vLLM: one "
                "chunk per step; SGLang: the request's `meta_info`); the two agree within 2% when every chunk is "
                "read in time. Under load vLLM merges the chunks of steps that the client did not read in time, so "
                "the requests' own count misses steps and reads tau too high (hollow red points).")

# ---------------------------------------------------------------------------- tables and definitions

st.subheader("Per config and concurrency")
st.dataframe(lc.cells_table(cells, multi), hide_index=True, key="load_cells",
             column_config={"note": st.column_config.TextColumn(width="large")})
st.subheader("Per level")
st.caption("Each measurement in the order it ran: TTFT, TPOT and ITL percentiles over the level's requests (ms), "
           "tau from the server's counters and from the requests' own count, and the machine's load.")
st.dataframe(lc.levels_table(levels, multi), hide_index=True, key="load_levels")
with st.expander("Definitions"):
    st.markdown("\n".join(f"- **{name}**: {text}." for name, text in metrics.SERVING.values()) + "\n"
                "- **tau**: 1 + accepted draft tokens / drafts, from the server's own counters (a delta of its "
                "Prometheus `/metrics` around the level); the requests' own count is shown beside it.\n"
                "- **95% interval** of a speedup: request pairs (same prompt, same position in the order) resampled; "
                "it covers request-to-request variation, not a drift of the machine between measurements: that is "
                "what the baseline-noise check looks for.\n"
                "- **best K**: the highest speedup at a concurrency; the configs whose interval reaches its lower "
                "bound are within its interval (not a clear winner). **Stops paying**: the lowest concurrency where "
                "the speedup is below 1.")
st.caption(HOW)
