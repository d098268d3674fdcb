"""Runs: every capture and bench run with its status, filterable by kind, status, engine and its version, target,
drafter, dataset and tag (?kind=&status=&engine=&version=&target=&drafter=&dataset=&tag=); lint-only drafter checks
(config files only: no tokens, nothing measured) hidden unless ?lint=shown; bench runs' tau, speedup and findings (the
drafter check's "fed the wrong boundaries", HF reproducing a serving engine's reading) next to the id; the ticked rows
are in the
URL too (?ticked=a,b: a link reproduces the selection that feeds "Compare"), and each row's "open" link goes to the
run's page (/run?id=). Tags, notes and the pinned baseline of a run (?run=) are edited below the table when
SPECLENS_READONLY=0 (read-only by default; with [auth] secrets only after a login, dashboard/auth.py)."""

import streamlit as st

from backend import annotations, findings
from backend.demo import story as demo_story_of
from dashboard import auth, charts, demo_story, ui

LIVE_EVERY_S = 5
STATUSES = ["complete", "running", "interrupted", "failed", "quarantined"]
LINT = {"hidden": "hidden (the default)", "shown": "shown"}
FLASH = "runs_flash"

st.title("Runs")
if story := demo_story_of():   # `make demo`: the slot-shift case in three lines, each linked to its proof
    with st.container(border=True, key="demo_story"):
        for line in demo_story.lines(story):
            st.markdown(line)
cat = ui.catalog()
runs = ui.load_runs(refresh=True, query=cat.runs_overview)


def options(col: str) -> list[str]:
    return sorted(runs[col].dropna().unique())


c1, c2, c3, c4 = st.columns(4)
kinds = ui.multiselect("Kind", options("kind"), "kind", [], where=c1, placeholder="all")
statuses = ui.multiselect("Status", STATUSES, "status", [], where=c2, placeholder="all")
engines = ui.multiselect("Engine", options("engine"), "engine", [], where=c3, placeholder="all")
versions = ui.multiselect("Engine version", options("engine_version"), "version", [], where=c4,
                          placeholder="all" if options("engine_version") else "none recorded")
c5, c6, c7, c8 = st.columns(4)
targets = ui.multiselect("Target", options("model"), "target", [], where=c5, placeholder="all")
drafters = ui.multiselect("Drafter", options("drafter"), "drafter", [], where=c6,
                          placeholder="all" if options("drafter") else "no bench runs")
datasets = ui.multiselect("Dataset", options("dataset"), "dataset", [], where=c7, placeholder="all")
all_tags = charts.tag_options(runs)
tags = ui.multiselect("Tag", all_tags, "tag", [], where=c8, placeholder="any" if all_tags else "no tags yet")
shown = charts.with_any_tag(charts.filter_runs(runs, kind=kinds, status=statuses, engine=engines,
                                               engine_version=versions, model=targets, drafter=drafters,
                                               dataset=datasets), tags)
lint_rows = charts.lint_only(shown)
lint = ui.select("Lint-only checks", list(LINT), "lint", "hidden", format_func=LINT.get, where=st.columns(4)[0],
                 help="`check-drafter --lint-only` runs read config files only: no tokens, no tau") \
    if lint_rows.any() or ui.qp_get("lint") else "hidden"
if lint == "hidden":
    shown = shown[~lint_rows]

counts = runs["status"].value_counts()
st.caption(f"{len(shown)} of {len(runs)} runs shown; " + ", ".join(f"{counts[s]} {s}" for s in counts.index)
           + (f"; {int(lint_rows.sum())} lint-only drafter checks hidden (config files only, nothing measured: "
              "\u201cLint-only checks\u201d shows them)" if lint == "hidden" and lint_rows.any() else ""))


@st.fragment(run_every=LIVE_EVERY_S)
def live_progress(run_ids: list[str]) -> None:
    """Progress bars of running runs, rescanned every few seconds; a full rerun once one of them ends."""
    ui.rescan()
    now = ui.guarded(cat.list_runs)
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
quarantined = shown[shown["status"] == "quarantined"]["run_id"].tolist()
if quarantined:
    st.warning(f"Quarantined: {', '.join(f'`{r}`' for r in quarantined[:10])}{' ...' if len(quarantined) > 10 else ''}"
               ": files the catalog cannot index (the reason is in the error column); left out of every view.",
               icon=":material/block:")

if shown.empty:
    st.info("No run matches these filters.")
    st.stop()

table = charts.runs_frame(shown)
bench_ids = shown.loc[shown["kind"] == "bench", "run_id"].tolist()
found = ui.guarded(findings.findings,           # only the keys findings read, of runs that record a feed
                   ui.guarded(cat.run_manifest_keys, bench_ids, findings.MANIFEST_KEYS, findings.NEEDS),
                   ui.guarded(cat.check_manifests), cat) if bench_ids else {}
table.insert(table.columns.get_loc("speedup") + 1, "finding",      # a wrong feed at its level; the HF note in "fed as"
             [findings.finding_text(found[r], "mismatch") if r in found else "" for r in table["run_id"]])
table.insert(table.columns.get_loc("finding") + 1, "fed as",
             [findings.finding_text(found[r], "hf_reading") if r in found else "" for r in table["run_id"]])
picked = st.dataframe(
    table, hide_index=True, key="runs_table", placeholder="-", on_select="rerun", selection_mode="multi-row",
    selection_default={"selection": {"rows": ui.ticked(table["run_id"])}},
    column_order=charts.runs_columns(table),
    column_config={
        "run_id": st.column_config.TextColumn("run", pinned=True),
        "view": st.column_config.LinkColumn(
            "view", display_text="open", help="the run's page: settings, what the engine fed, per-prompt table, "
                                              "files, log and links to every view that shows it"),
        "pinned": st.column_config.CheckboxColumn("pinned", help="the pinned baseline of its target (Compare page)"),
        "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0, format="percent"),
        "tau": st.column_config.NumberColumn("tau", format="%.2f", help="mean acceptance length, bonus token included"),
        "finding": st.column_config.TextColumn(
            "finding", width=charts.text_width(table["finding"], 560),
            help="what to know before trusting the figures: the drafter check's finding that the engine fed other "
                 "boundaries than the drafter was trained on, led by its level on the one severity scale (what the "
                 "check predicts it costs in tau, else what a bench fed the trained set measured; a note when its "
                 "cost is not measured)"),
        "fed as": st.column_config.TextColumn(
            "fed as", width=charts.text_width(table["fed as"]),
            help="a bench on the HF engine feeds the drafter what this serving engine's release would (its reading "
                 "of the drafter's aux ids); tau and speed are HF's decoding, not measured inside that engine"),
        "drafter": st.column_config.TextColumn("drafter", width=charts.text_width(table["drafter"])),
        "speedup": st.column_config.NumberColumn("speedup", format="%.2fx", help="over the paired baseline"),
        "nonfinite_tokens": st.column_config.NumberColumn(
            "NaN/inf tokens", help="tokens holding NaN or inf, summed over boundaries (left out of statistics)"),
        "model": st.column_config.TextColumn("target", width=charts.text_width(table["model"])),
        "engine": st.column_config.TextColumn("engine"),      # sized to its text ("hf transformers 5.x" was cut)
        "boundaries": st.column_config.TextColumn("boundaries", width="medium"),
        "notes": st.column_config.TextColumn("notes", width="medium"),
    })

rows = picked.selection.rows if picked is not None else []
chosen = table.iloc[rows] if rows else table.iloc[0:0]
ui.qp_set("ticked", chosen["run_id"].tolist())         # the ticked rows in the URL: a copied link ticks them again
if len(chosen) == 1:
    st.page_link("pages/run.py", label=f"Open `{chosen['run_id'].iloc[0]}`", icon=":material/description:",
                 query_params={"id": chosen["run_id"].iloc[0]})
    one = chosen.iloc[0]
    if one["kind"] == "watch":          # the Watch page shows a running or stopped watch too
        st.page_link("pages/watch.py", label=f"Watch `{one['run_id']}`: tau per window and the drift verdict",
                     icon=":material/monitor_heart:", query_params={"run": one["run_id"]})
    elif one["kind"] == "load" and one["status"] == "complete":
        st.page_link("pages/load.py", label=f"Serving load `{one['run_id']}`: speedup vs concurrency, best K",
                     icon=":material/speed:", query_params={"run": one["run_id"]})
bench_chosen = chosen[(chosen["kind"] == "bench") & (chosen["status"] == "complete")]["run_id"].tolist()
if len(bench_chosen) >= 2:
    st.page_link("pages/compare.py", label=f"Compare the {len(bench_chosen)} selected bench runs",
                 icon=":material/compare_arrows:", query_params={"runs": ",".join(bench_chosen)})
elif ((table["kind"] == "bench") & (table["status"] == "complete")).sum() >= 2:
    st.caption("Select two or more complete bench runs (tick their rows) to compare them.")

# ---------------------------------------------------------------------------- annotations

if annotations.editable():
    st.subheader("Tags, notes and baseline")
if annotations.editable() and auth.allowed("edit tags, notes and the pinned baseline"):
    if msg := st.session_state.pop(FLASH, None):
        st.success(msg, icon=":material/check_circle:")
    ids = table["run_id"].tolist()
    default = chosen["run_id"].iloc[0] if len(chosen) == 1 else ids[0]
    left, right = st.columns([1, 2])
    rid = ui.select("Run", ui.capped(ids, [ui.qp_get("run") or "", default]), "run", default, sticky=False,
                    where=left, help="the run to annotate (a ticked row is picked when only one is ticked); lists "
                                     f"the {ui.MAX_OPTIONS} newest runs shown: filter the table for older ones")
    row = shown.set_index("run_id").loc[rid]
    left.caption(f"{row['kind']} run, {row['status']}; target `{row['model']}`"
                 + (f", drafter `{row['drafter']}`" if isinstance(row["drafter"], str) else "")
                 + ". Saved in the run directory as `annotations.json` (its results stay as written).")
    ann = ui.guarded(annotations.read, rid)
    with right.form(f"annotate_{rid}", border=True):
        tags_text = st.text_input("Tags", value=", ".join(ann.tags), key=f"tags_{rid}",
                                  help="comma-separated; letters, digits, '-', '_' and '.'")
        notes = st.text_area("Notes", value=ann.notes, max_chars=annotations.MAX_NOTES, key=f"notes_{rid}", height=100)
        pinned = None
        if row["kind"] == "bench":
            pinned = st.checkbox(f"Pinned baseline of target `{row['model']}`", value=ann.pinned, key=f"pin_{rid}",
                                 disabled=row["status"] != "complete",
                                 help="Compare measures speedups against it with ?baseline=pinned; pinning this run "
                                      "unpins the target's previous baseline")
        saved = st.form_submit_button("Save", icon=":material/save:")
    if saved:
        ui.guarded(annotations.save, rid, tags=tags_text, notes=notes, pinned=pinned)
        ui.rescan()
        st.session_state[FLASH] = f"Saved the annotations of `{rid}`."
        st.rerun()
