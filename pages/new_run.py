"""New run: fill a capture or bench job spec over the models under the allowed roots (SPECLENS_MODEL_ROOTS) and
queue it for the worker (`python -m backend worker`); below, the queue with each job's state and progress.
Submitting is off unless SPECLENS_ALLOW_JOBS=1 and the dashboard is not read-only; with OIDC configured
([auth] in the app's secrets) it also needs a login."""

from pathlib import Path

import pandas as pd
import streamlit as st

from backend.config import jobs_enabled, model_roots, read_only
from backend.errors import SpecLensError
from backend.jobs import queue
from backend.jobs.cli import submit_spec
from backend.jobs.spec import discover_models, discover_prompts, input_roots

try:
    from dashboard import auth
except ImportError:  # pragma: no cover - login helper not present: OIDC checked here
    auth = None

LIVE_EVERY_S = 5
FLASH = "new_run_flash"

st.title("New run")


def login_ok() -> bool:
    """With OIDC configured, a logged-in user only (shows a login button otherwise)."""
    if auth is not None:
        return auth.allowed("submit jobs")
    try:
        configured = "auth" in st.secrets
    except Exception:  # noqa: BLE001 - no secrets file: login off
        configured = False
    if configured and not st.user.is_logged_in:
        st.info("Log in to submit jobs.", icon=":material/lock:")
        st.button("Log in", on_click=st.login, icon=":material/login:")
        return False
    return True


why = []
if read_only():
    why.append("the dashboard is read-only (set SPECLENS_READONLY=0 to allow changes)")
if not jobs_enabled():
    why.append("job submission is off (set SPECLENS_ALLOW_JOBS=1 on the dashboard's host)")
if why:
    st.warning("Submitting is disabled: " + "; ".join(why) + ".", icon=":material/block:")
enabled = not why and login_ok()

if FLASH in st.session_state:
    kind, text = st.session_state.pop(FLASH)
    (st.success if kind == "ok" else st.error)(text)

models = discover_models()
prompts = discover_prompts()
roots = ", ".join(f"`{r}`" for r in model_roots())
st.caption(f"Models come from {roots} (SPECLENS_MODEL_ROOTS); prompts also from "
           f"{', '.join(f'`{r}`' for r in input_roots() if str(r) not in roots)}. Jobs run when a worker is "
           "running: `python -m backend worker` (or `--ray ADDRESS`).")

off = not enabled
kind = st.segmented_control("Kind", ["capture", "bench"], default="capture", key="nr_kind", disabled=off)
kind = kind or "capture"
with st.form("new_run", border=True):
    c1, c2 = st.columns(2)
    model = c1.selectbox("Target model" if kind == "bench" else "Model", models, index=0 if models else None,
                         placeholder="no model directories under the roots", disabled=off)
    prompt_file = c2.selectbox("Prompts", prompts, index=0 if prompts else None, placeholder="no prompt files",
                               format_func=lambda p: str(Path(p).name) + f"  ({Path(p).parent})", disabled=off)
    c3, c4, c5, c6 = st.columns(4)
    limit = c3.number_input("Prompts (limit)", min_value=1, value=16, step=1, disabled=off)
    device = c4.selectbox("Device", ["auto", "cpu", "cuda"], disabled=off)
    dtype = c5.selectbox("dtype", ["fp32", "bf16"], disabled=off)
    name = c6.text_input("Run name (optional)", placeholder="job-<time>-<id>", max_chars=96, disabled=off)
    spec: dict = {"kind": kind, "device": device, "dtype": dtype, "limit": int(limit)}
    if kind == "capture":
        spec["sample_tokens"] = int(st.number_input("Raw tokens kept for alignment", min_value=0, value=4096, step=512,
                                                         disabled=off))
    else:
        b1, b2, b3, b4, b5 = st.columns(5)
        drafter = b1.selectbox("Drafter", ["(none: baseline)"] + models, disabled=off)
        spec.update(num_spec_tokens=int(b2.number_input("K (draft tokens)", min_value=1, max_value=16, value=4,
                                                        disabled=off)),
                    temperature=float(b3.number_input("Temperature", min_value=0.0, max_value=2.0, value=0.0,
                                                      step=0.1, disabled=off)),
                    repeats=int(b4.number_input("Repeats", min_value=1, max_value=20, value=3, disabled=off)),
                    max_new_tokens=int(b5.number_input("Max new tokens", min_value=1, max_value=4096, value=64,
                                                                     disabled=off)))
        if drafter and not drafter.startswith("(none"):
            spec["drafter"] = drafter
    submitted = st.form_submit_button("Queue job", type="primary", disabled=off or not models or not prompts,
                                      icon=":material/play_arrow:")

if submitted and enabled:
    spec["model" if kind == "capture" else "target"] = model
    spec["prompts"] = prompt_file
    if name.strip():
        spec["name"] = name.strip()
    try:
        jobs = submit_spec(spec)
        st.session_state[FLASH] = ("ok", f"Queued `{jobs[0]['job_id']}` ({kind}); run `{jobs[0]['run_name']}` "
                                         "appears on the Runs page once a worker picks it up.")
    except SpecLensError as e:
        st.session_state[FLASH] = ("err", f"Not queued: {e}")
    st.rerun()

st.subheader("Queue")


@st.fragment(run_every=LIVE_EVERY_S)
def queue_table() -> None:
    rows = pd.DataFrame(queue.table(limit=200))
    if rows.empty:
        st.info("No jobs yet.")
        return
    counts = rows["state"].value_counts()
    st.caption(", ".join(f"{counts[s]} {s}" for s in counts.index) + f" (refreshed every {LIVE_EVERY_S} s)")
    st.dataframe(rows, hide_index=True, key="queue_table", placeholder="-",
                 column_order=["job_id", "state", "kind", "progress", "done", "total", "run_status", "attempts",
                               "submitted", "error"],
                 column_config={"job_id": st.column_config.TextColumn("job", pinned=True),
                                "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0,
                                                                            format="percent"),
                                "run_status": "run", "error": st.column_config.TextColumn("error", width="large")})
    active = rows[rows["state"].isin(["pending", "running"])]["job_id"].tolist()
    if enabled and active:
        c1, c2 = st.columns([3, 1])
        pick = c1.selectbox("Cancel a job", active, key="cancel_pick")
        if c2.button("Cancel job", icon=":material/cancel:"):
            try:
                st.toast(f"{pick}: {queue.cancel(pick)}")
            except SpecLensError as e:
                st.error(str(e))


queue_table()
