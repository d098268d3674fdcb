"""Drafter check (?run=&metric=): will the engine feed this drafter what it was trained on? The lint table, accuracy
by candidate boundary set, the verdict and the findings of one stored check (`python -m backend check-drafter`).
Numbers: backend/drafter/finder.py and lint.py; figures: dashboard/check_charts.py; data: the run's check.json."""

import json

import streamlit as st

from dashboard import charts, check_charts, load_charts, severity, ui

HOW = ("`python -m backend check-drafter --drafter DRAFTER_DIR --target TARGET_DIR` stores a check here; "
       "`make demo` unpacks the toy pair (data/models/toy-pair) to try it on.")
BANNER = {"ok": (st.success, ":material/check_circle:"), "warning": (st.warning, ":material/warning:"),
          "error": (st.error, ":material/error:"), "info": (st.info, ":material/info:")}

st.title("Drafter check")
ui.rescan_named("run")      # the runs the link names (and the running ones) if changed; all without one
cat = ui.catalog()
runs = ui.guarded(cat.check_runs)
ids = runs["run_id"].tolist()
if not ids:
    st.info(f"No drafter checks yet. {HOW}")
    st.stop()
ui.unknown_runs(["run"], ids, ui.guarded(cat.run_states, ui.qp_list("run")), what="drafter check")
names = {r.run_id: f"{r.run_id}  ({r.drafter or '?'} on {r.model or '?'})" for r in runs.itertuples()}

c1, c2 = st.columns([3, 2])
run = ui.select("Check", ui.capped(ids, [ui.qp_get("run") or "", ids[0]]), "run", ids[0], where=c1,
                format_func=lambda r: names.get(r, r), none_instead=True)
metric = ui.select("Rank chart by", list(check_charts.METRICS), "metric", "step1_accuracy", where=c2,
                   format_func=lambda m: check_charts.METRICS[m][0])
if run is None:              # the link's run is no drafter check: never the verdict of another one in its place
    st.stop()
rep = ui.guarded(cat.drafter_check, run)

s = rep.get("sample")
about = (f"Drafter `{rep['drafter']}` ({rep['drafter_info']['format']} format, k={rep['drafter_info']['num_aux']}) on "
         f"target `{rep['target']}` ({rep['target_info']['n_layers']} layers); "
         f"verdict for {rep['engine_feeds']['name']}")
if s:
    st.caption(f"{about}, drafter run with {rep['semantics']}'s semantics. Sample: {s['prompts']} prompts from "
               f"`{s['prompts_file'].rsplit('/', 1)[-1]}`, {s['scored_slots']} scored slots, K = "
               f"{s['num_spec_tokens']} draft steps, {s['device']}; check took {rep['timing']['total']:.1f} s.")
else:
    st.caption(f"{about}. Lint only (`--lint-only`): read from the config files, no model loaded, so what the drafter "
               f"was trained on is not checked; took {rep['timing']['total']:.2f} s.")
level, verdict = check_charts.verdict_level(rep)      # as loud as what the mismatch costs (dashboard/severity.py)
ui.level_banner(level, verdict)
if check_charts.check_cost(rep) is not None:
    st.caption(severity.scale_text() + " Here the cost is the check's predicted tau of what the engine feeds against "
               "the trained set's; the measured one is below when a bench exists.")

st.subheader("What each engine feeds")
st.caption("From the drafter's config.json and the conventions table (backend/conventions.yaml): where each engine "
           "reads the aux layer ids, and the target boundaries (S_b = input of layer b, F = after the final norm) "
           "it will capture and feed.")
choice = rep.get("runner_choice")
if choice:
    st.caption(f"vLLM model runner: **{choice['runner'].upper()}** "
               f"({choice['reason']}; `--runner {choice['requested']}`). "
               "The V2 runner reads only top-level ids, V1 the top level, then `eagle_config`.")
st.dataframe(check_charts.lint_table(rep), hide_index=True, key="lint", column_config={
    "verdict is about": st.column_config.CheckboxColumn("verdict"),
    "problem": st.column_config.TextColumn(width="large", help="what is wrong with this reading, in words")})

if rep["candidates"]:
    st.subheader("Accuracy by candidate")
    st.caption("Each candidate boundary set fed to the drafter, teacher-forced over the target's own greedy answers: "
               "top-1 agreement with the target's next token (step 1, and steps 2..K unrolled from the drafter's own "
               "hidden), predicted tau, and the cross-entropy against the target's distribution that ranks them "
               "(z: how many standard errors a candidate's cross-entropy lies above the best's, paired over slots). "
               f"The bars are ranked by {check_charts.METRICS[metric][0]} (`Rank chart by`) and start at 0; the table "
               "keeps the check's own order (`rank`, by cross-entropy).")
    left, right = st.columns([3, 2])
    with left:
        ui.chart_with_downloads(check_charts.candidate_bars(rep, metric), check_charts.candidates_table(rep, metric),
                                f"drafter_check_{run}_{metric}")
    with right:
        ui.chart_with_downloads(check_charts.step_curves(rep), check_charts.step_frame(rep),
                                f"drafter_check_{run}_steps")
    st.dataframe(check_charts.candidates_display(rep), hide_index=True, key="candidates", column_config={
        "problem": st.column_config.TextColumn(width="large", help="what is wrong with this candidate, in words"),
        "why": st.column_config.TextColumn("why tried")})

if rep["candidates"]:
    st.subheader("Predicted against measured")
    benches = check_charts.benches_of(ui.guarded(cat.run_manifests, [run]).get(run, {}), ui.guarded(cat.bench_history))
    if benches.empty:
        st.caption("No bench of this drafter on this target yet: `python -m backend bench --target TARGET_DIR "
                   "--drafter DRAFTER_DIR --prompts FILE` measures the tau this check predicts (with `--producer "
                   "ENGINE --producer-version V`: as that release reads the ids).")
    else:
        st.caption("Each bench of this drafter on this target: the boundaries its engine reading fed, the tau it "
                   "measured (95% bootstrap interval over prompts) and the tau this check predicts for the same "
                   "boundaries (teacher-forced over the check's sample). The prediction ranks boundary sets; the "
                   "measured tau is what serving gets.")
        speeds = ui.guarded(cat.bench_prompt_speeds, benches["run_id"].tolist())
        st.dataframe(check_charts.predicted_vs_measured(rep, benches, speeds), hide_index=True, key="measured")

kind, words = check_charts.fix_words(rep)
if words:
    st.subheader("The fix")
    if kind == "info":
        st.info(words, icon=":material/info:")
    else:
        st.markdown(words)
        if worth := load_charts.worth_for_check(rep):
            st.markdown(worth)
        through = check_charts.proof_engines(rep)
        engine = st.radio("Prove it through", list(through), key="prove_engine", horizontal=True,
                          format_func=through.get,
                          help="the two proof benches (original and fixed, one paired baseline): the HF reference "
                               "bench, or the engine the fix is for, through the job queue") or "hf"
        st.code(check_charts.fix_command(rep, engine), language="bash", wrap_lines=True)
        st.download_button("config.json with the fix", data=json.dumps(rep["fix"]["config"], indent=2) + "\n",
                           file_name="config.json", mime="application/json", icon=":material/download:",
                           key="dl_fix_config", help="the drafter's config with only the ids changed")
        if ui.writes_enabled():
            if st.button("Write the fix and queue its proof", key="prove", icon=":material/science:",
                         help="writes the fixed drafter under the data root's models/fixes/ and queues two benches "
                              "(original and fixed, one paired baseline) through the engine picked above for the "
                              "worker"):
                res = ui.guarded(ui.queue_fix_proof, rep, engine)
                if res:
                    st.success(f"Fixed drafter: `{res['fixed']}`. Queued {', '.join(res['jobs'])}; once the worker "
                               f"has run them: [Compare]({res['compare']})", icon=":material/check_circle:")
        else:
            st.caption("The dashboard is read-only: run the command above (or set SPECLENS_READONLY=0 and "
                       "SPECLENS_ALLOW_JOBS=1 for a button that writes the fix and queues its proof).")

st.subheader("Findings")
for sev, source, text in check_charts.findings(rep):
    f, ic = BANNER.get(sev, BANNER["info"])
    f(f"**{source.replace('_', ' ')}**: {text}", icon=ic)

table = check_charts.training_table(rep)
if table is not None:
    td = rep["training_data"]
    st.subheader("Training data against a fresh capture")
    st.caption(f"{td['files']} of {td['files_total']} `{td['format']}` files from `{td['path']}` "
               f"({td['tokens']} tokens), "
               f"{'ids ' + str(td['ids']) + ' from ' + td['ids_from'] if td['ids'] else 'the producer default ids'}; "
               "each stored state's best match among the target's boundaries "
               "on the same token ids.")
    st.dataframe(table, hide_index=True, key="training")
    al = check_charts.training_alignment(rep)
    ui.chart_with_downloads(charts.alignment_heatmap(al, "cosine"), charts.alignment_long(al),
                            f"drafter_check_{run}_training_data")

st.download_button("check.json", data=json.dumps(rep, indent=1), file_name=f"{run}.json", mime="application/json",
                   icon=":material/download:", key="dl_check_json", help="the whole stored result of this check")
