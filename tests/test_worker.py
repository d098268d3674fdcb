"""The job worker: submit -> worker -> complete run in the catalog, spec validation (one-line errors, paths
confined to the model roots), cancel, and a job whose worker died resumed by the next worker with the same
result as an uninterrupted run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from backend.__main__ import main as cli
from backend.config import REPO_ROOT
from backend.errors import SpecLensError
from backend.jobs import queue
from backend.jobs import spec as specs
from backend.jobs.cli import submit_spec
from backend.jobs.worker import _tag_runs, run_worker
from backend.store.data_root import DataRoot

PROMPTS = REPO_ROOT / "datasets" / "spec_bench" / "question.jsonl"
DEAD_PID = 2**22 + 12345            # beyond pid_max: never alive

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def env(data_root: Path, tiny_llama: Path, monkeypatch) -> dict:
    """Model roots = the directory of the tiny target; the data root from the data_root fixture."""
    monkeypatch.setenv("SPECLENS_MODEL_ROOTS", str(tiny_llama.parent))
    return {**os.environ, "SPECLENS_DATA": str(data_root), "SPECLENS_MODEL_ROOTS": str(tiny_llama.parent)}


def capture_spec(model: Path, **kw) -> dict:
    return {"kind": "capture", "model": str(model), "prompts": str(PROMPTS), "limit": 4, "device": "cpu",
            "num_cpus": 1, **kw}


def state_of(job_id: str, root: Path) -> str:
    got = queue.find(job_id, DataRoot(root))
    return got[0] if got else "missing"


def test_submit_then_worker_once_gives_a_complete_run(env, data_root, tiny_llama, tmp_path):
    spec = tmp_path / "cap.yaml"
    spec.write_text(f"kind: capture\nname: cap-one\nmodel: {tiny_llama}\nprompts: {PROMPTS}\nlimit: 4\n"
                    "device: cpu\nnum_cpus: 1\n")
    sub = subprocess.run([sys.executable, "-m", "backend", "submit", str(spec)], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert sub.returncode == 0 and "queued cap-one" in sub.stdout, sub.stderr
    assert state_of("cap-one", data_root) == "pending"
    assert DataRoot(data_root).catalog.read.list_runs().empty                          # nothing ran yet
    w = subprocess.run([sys.executable, "-m", "backend", "worker", "--once"], cwd=REPO_ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert w.returncode == 0, w.stderr
    assert state_of("cap-one", data_root) == "done"
    DataRoot(data_root).catalog.write.refresh()
    runs = DataRoot(data_root).catalog.read.list_runs().set_index("run_id")
    assert list(runs.index) == ["cap-one"] and runs.loc["cap-one", "status"] == "complete"
    m = json.loads((data_root / "runs" / "cap-one" / "manifest.json").read_text())
    assert m["job"]["id"] == "cap-one" and m["progress"] == {"done": 4, "total": 4}
    job = queue.find("cap-one", DataRoot(data_root))[1]
    assert job["attempts"] == 1 and job["result"]["status"] == "complete" and job["error"] is None
    rows = queue.table(DataRoot(data_root))
    assert rows[0]["job_id"] == "cap-one" and rows[0]["state"] == "done" and rows[0]["done"] == 4


BAD = [
    ("kind: nope\n", "kind: 'nope' is not one of"),
    ("kind: capture\nprompts: x\n", "model: required"),
    ("kind: bench\ntarget: {m}\nprompts: {p}\nrepeats: 0\n", "repeats: 0 must be >= 1"),
    ("kind: bench\ntarget: {m}\nprompts: {p}\nnum_spec_tokens: four\n", "num_spec_tokens: expected int"),
    ("kind: capture\nmodel: {m}\nprompts: {p}\nfoo: 1\n", "foo: unknown field"),
    ("kind: sweep\ntarget: {m}\nprompts: {p}\ntemperature: []\n", "temperature: an empty list"),
    ("kind: capture\nmodel: {m}\nprompts: {p}\nname: ../escape\n", "name: '../escape' is not a valid run name"),
    ("kind: [unclosed\n", "not valid YAML"),
    ("- just\n- a list\n", "a job spec is a mapping"),
]


@pytest.mark.parametrize("text,msg", BAD)
def test_invalid_spec_is_one_line_error(env, data_root, tiny_llama, tmp_path, capsys, text, msg):
    f = tmp_path / "bad.yaml"
    f.write_text(text.format(m=tiny_llama, p=PROMPTS))
    assert cli(["submit", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and msg in err and err.count("\n") == 1, err
    assert not any((data_root / "queue" / "pending").glob("*.json"))


def test_paths_outside_the_model_roots_are_refused(env, data_root, tiny_llama, tmp_path, monkeypatch):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    link = tiny_llama.parent / "sneaky-link"
    link.symlink_to(outside, target_is_directory=True)
    for model, why in [(outside, "outside the allowed roots"),
                       (f"{tiny_llama}/../../../etc", "outside the allowed roots"),
                       (link, "outside the allowed roots"),                 # a symlink out of the root
                       (tiny_llama.parent / "missing", "does not exist")]:
        with pytest.raises(SpecLensError, match=why) as e:
            submit_spec(capture_spec(Path(model)), data=DataRoot(data_root))
        assert "\n" not in str(e.value)
    with pytest.raises(SpecLensError, match="prompts: /etc/passwd is outside"):
        submit_spec(capture_spec(tiny_llama, prompts="/etc/passwd"), data=DataRoot(data_root))
    with pytest.raises(SpecLensError, match="drafters: .* is outside"):
        submit_spec({"kind": "sweep", "target": str(tiny_llama), "prompts": str(PROMPTS), "drafters": [str(outside)]},
                    data=DataRoot(data_root))
    assert queue.jobs("pending", DataRoot(data_root)) == []
    # the default roots: the data root and <repo>/models
    monkeypatch.delenv("SPECLENS_MODEL_ROOTS")
    from backend.config import model_roots
    assert model_roots() == [data_root.resolve(), REPO_ROOT / "models"]
    with pytest.raises(SpecLensError, match="outside the allowed roots"):
        submit_spec(capture_spec(tiny_llama), data=DataRoot(data_root))


def test_sweep_expands_into_named_bench_jobs(env, data_root, tiny_llama):
    sweep = {"kind": "sweep", "name": "sw", "target": str(tiny_llama), "prompts": str(PROMPTS),
             "num_spec_tokens": [1, 2, 4], "temperature": [0, 0.7], "batch_size": [1],
             "drafters": [str(tiny_llama)], "repeats": 1}
    jobs = submit_spec(sweep, data=DataRoot(data_root))
    assert [j["job_id"] for j in jobs] == [f"sw-{i:02d}-k{k}-t{t}" for i, (k, t) in
                                           enumerate((k, t) for k in (1, 2, 4) for t in ("0", "0.7"))]
    assert {(j["settings"]["num_spec_tokens"], j["settings"]["temperature"]) for j in jobs} == \
        {(k, t) for k in (1, 2, 4) for t in (0.0, 0.7)}
    assert all(j["kind"] == "bench" and j["num_gpus"] == 0 for j in jobs)
    with pytest.raises(SpecLensError, match="exists already"):
        submit_spec(sweep, data=DataRoot(data_root))
    assert len(queue.jobs("pending", DataRoot(data_root))) == 6
    with pytest.raises(SpecLensError, match="batch_size: 4"):
        specs.validate({"kind": "sweep", "target": str(tiny_llama), "prompts": str(PROMPTS), "batch_size": [1, 4]})


def _wait(cond, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_cancel_pending_and_running_jobs(env, data_root, tiny_llama):
    # long enough that it cannot end on its own between "running" and the cancel, even on a loaded machine (a
    # clean-clone CI run at load average 10 once saw the 20 x 5 version finish first: `done`); a cancel ends it at once
    long = {"kind": "bench", "target": str(tiny_llama), "prompts": str(PROMPTS), "limit": 20, "repeats": 40,
            "max_new_tokens": 64, "device": "cpu", "num_cpus": 1}
    submit_spec({**long, "name": "long"}, data=DataRoot(data_root))
    submit_spec({**long, "name": "never", "repeats": 1}, data=DataRoot(data_root))
    assert queue.cancel("never", DataRoot(data_root)) == "cancelled" and state_of("never", data_root) == "cancelled"
    w = subprocess.Popen([sys.executable, "-m", "backend", "worker", "--once", "--poll", "0.2"], cwd=REPO_ROOT,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        man = data_root / "runs" / "long" / "manifest.json"
        _wait(lambda: man.exists() and json.loads(man.read_text())["status"] == "running", 120, "run 'long' to start")
        assert queue.table(DataRoot(data_root))[-1]["state"] in ("running",) or state_of("long", data_root) == "running"
        assert queue.cancel("long", DataRoot(data_root)) == "cancelling"
        assert w.wait(timeout=90) == 0
    finally:
        if w.poll() is None:
            w.kill()
    assert state_of("long", data_root) == "cancelled", w.stdout.read()
    m = json.loads(man.read_text())
    assert m["status"] == "failed" and "cancelled" in m["error"]
    assert m["progress"]["done"] < m["progress"]["total"] == 20 * 40
    assert not (data_root / "runs" / "never").exists()
    DataRoot(data_root).catalog.write.refresh()
    assert DataRoot(data_root).catalog.read.list_runs().set_index("run_id").loc["long", "status"] == "failed"
    assert not (data_root / "queue" / "running" / "long.cancel").exists()


def test_a_failing_job_ends_failed_with_its_one_line_error(env, data_root, tiny_llama):
    submit_spec(capture_spec(tiny_llama, name="oob", boundaries=["S_99"]), data=DataRoot(data_root))
    assert run_worker(DataRoot(data_root), once=True, log=lambda s: None) == 1
    st, job = queue.find("oob", DataRoot(data_root))
    assert st == "failed" and "S_99: out of range" in job["error"] and "\n" not in job["error"]


def _interrupted(job_id: str, root: Path, stop_after: int) -> None:
    """What a worker killed mid-job leaves: the job in running/ owned by a dead pid, its run part-way (checkpoint
    or journal) and still marked running by that dead pid."""
    from backend.bench import run_bench
    from backend.capture import run_capture

    job = queue.move(job_id, "pending", "running", DataRoot(root), owner={"host": socket.gethostname(), "pid": DEAD_PID,
                                                                 "child_pid": DEAD_PID}, attempts=1)
    s = specs.settings_object(job)
    with _tag_runs(job):
        if job["kind"] == "capture":
            run_capture(s, name=job["run_name"], data=DataRoot(root), progress=False, stop_after=stop_after)
        else:
            run_bench(s, name=job["run_name"], data=DataRoot(root), progress=False, stop_after=stop_after)
    DataRoot(root).run_dir(job["run_name"]).update(status="running", pid=DEAD_PID, error=None)


def test_job_of_a_dead_worker_is_resumed_and_equals_an_uninterrupted_run(env, data_root, tiny_llama, tmp_path):
    from backend.bench import run_bench
    from backend.capture import run_capture

    cap = capture_spec(tiny_llama, limit=10, sample_tokens=300, sample_per_prompt=64, checkpoint_every=3)
    ben = {"kind": "bench", "target": str(tiny_llama), "prompts": str(PROMPTS), "limit": 3, "repeats": 2,
           "max_new_tokens": 12, "temperature": 0.8, "device": "cpu", "num_cpus": 1}
    submit_spec({**cap, "name": "cap-crash"}, data=DataRoot(data_root))
    submit_spec({**ben, "name": "ben-crash"}, data=DataRoot(data_root))
    _interrupted("cap-crash", data_root, stop_after=4)
    _interrupted("ben-crash", data_root, stop_after=2)
    assert DataRoot(data_root).run_dir("cap-crash").effective_status() == "interrupted"
    assert len(queue.jobs("running", DataRoot(data_root))) == 2

    ref = tmp_path / "ref"                               # the same jobs, never interrupted, elsewhere
    full_cap = run_capture(specs.settings_object(specs.validate(cap)[0]), name="ref-cap", data=DataRoot(ref),
                           progress=False)
    full_ben = run_bench(specs.settings_object(specs.validate(ben)[0]), name="ref-ben", data=DataRoot(ref),
                         progress=False)

    assert run_worker(DataRoot(data_root), once=True, log=lambda s: None) == 2
    for jid in ("cap-crash", "ben-crash"):
        st, job = queue.find(jid, DataRoot(data_root))
        assert st == "done" and job["attempts"] == 2 and job["previous_owner"]["pid"] == DEAD_PID
    assert queue.jobs("running", DataRoot(data_root)) == [] and queue.jobs("pending", DataRoot(data_root)) == []
    a = pd.read_parquet(full_cap.path / "stats.parquet").drop(columns="run_id")
    b = pd.read_parquet(data_root / "runs" / "cap-crash" / "stats.parquet").drop(columns="run_id")
    pd.testing.assert_frame_equal(a, b, rtol=1e-9)
    sa, sb = load_file(str(full_cap.path / "sample.safetensors")), load_file(str(data_root / "runs" / "cap-crash" /
                                                                                 "sample.safetensors"))
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    pa = pd.read_parquet(full_ben.path / "prompts.parquet")
    pb = pd.read_parquet(data_root / "runs" / "ben-crash" / "prompts.parquet")
    assert list(pa["output_hash"]) == list(pb["output_hash"]) and len(pb) == 6     # same samples at T = 0.8
    DataRoot(data_root).catalog.write.refresh()
    runs = DataRoot(data_root).catalog.read.list_runs()
    assert sorted(runs["run_id"]) == ["ben-crash", "cap-crash"]                   # resumed, not duplicated
    assert (runs["status"] == "complete").all()


def test_orphan_past_max_attempts_fails_cleanly(env, data_root, tiny_llama):
    submit_spec(capture_spec(tiny_llama, name="poison", max_attempts=1, limit=10, checkpoint_every=3),
                data=DataRoot(data_root))
    _interrupted("poison", data_root, stop_after=4)
    assert run_worker(DataRoot(data_root), once=True, log=lambda s: None) == 0
    st, job = queue.find("poison", DataRoot(data_root))
    assert st == "failed" and "worker died" in job["error"]
    m = DataRoot(data_root).run_dir("poison").manifest()
    assert m["status"] == "failed" and "poison" in m["error"]


# ---------------------------------------------------------------------- the New run page


def _new_run_page():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(REPO_ROOT / "app.py"), default_timeout=120)
    at.switch_page("pages/new_run.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.parametrize("readonly,allow,why", [("1", "1", "read-only"), ("0", "", "SPECLENS_ALLOW_JOBS=1")])
def test_new_run_page_is_disabled_unless_enabled(env, monkeypatch, readonly, allow, why):
    monkeypatch.setenv("SPECLENS_READONLY", readonly)
    monkeypatch.setenv("SPECLENS_ALLOW_JOBS", allow)
    at = _new_run_page()
    assert why in "\n".join(w.value for w in at.warning)
    assert at.button[0].disabled                                    # the form's "Queue job"


def test_new_run_page_queues_a_job_and_lists_it(env, data_root, tiny_llama, monkeypatch):
    monkeypatch.setenv("SPECLENS_READONLY", "0")
    monkeypatch.setenv("SPECLENS_ALLOW_JOBS", "1")
    at = _new_run_page()
    assert not at.warning and not at.button[0].disabled
    assert at.selectbox[0].options == [str(tiny_llama)]            # models found under the roots, nothing else
    at.number_input[0].set_value(3)
    at.text_input[0].input("from-page")
    at.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Queued `from-page`" in "\n".join(s.value for s in at.success)
    st, job = queue.find("from-page", DataRoot(data_root))
    assert st == "pending" and job["kind"] == "capture" and job["settings"]["model"] == str(tiny_llama)
    assert job["settings"]["limit"] == 3 and job["settings"]["prompts"].endswith(".jsonl")
    assert "from-page" in at.dataframe[0].value["job_id"].tolist()
    # the same name again: refused with its one-line reason, nothing queued twice
    at.text_input[0].input("from-page")
    at.button[0].click().run()
    assert "exists already" in "\n".join(e.value for e in at.error)
    assert len(queue.jobs("pending", DataRoot(data_root))) == 1


def test_engine_fields_and_gpu_requests(env, tiny_llama):
    base = {"target": str(tiny_llama), "prompts": str(PROMPTS)}
    assert specs.validate({"kind": "bench", **base})[0]["num_gpus"] == 0
    assert specs.validate({"kind": "bench", **base, "device": "cuda:1"})[0]["num_gpus"] == 1
    j = specs.validate({"kind": "bench", **base, "engine": "vllm", "tensor_parallel_size": 2,
                        "engine_options": {"gpu_memory_utilization": 0.5}})[0]
    assert j["num_gpus"] == 2 and specs.settings_object(j).tensor_parallel_size == 2
    assert specs.validate({"kind": "bench", **base, "engine": "sglang", "server_url": "http://gpu1:30000"})[0][
        "num_gpus"] == 0                                          # a running server does the GPU work
    assert specs.validate({"kind": "sweep", **base, "num_gpus": 0.5, "temperature": [0, 1]})[1]["num_gpus"] == 0.5
    with pytest.raises(SpecLensError, match="server_url: expected an http"):
        specs.validate({"kind": "bench", **base, "engine": "sglang", "server_url": "file:///etc/passwd"})
    with pytest.raises(SpecLensError, match="engine: 'trt' is not one of"):
        specs.validate({"kind": "bench", **base, "engine": "trt"})
    cap = specs.validate({"kind": "capture", "model": str(tiny_llama), "prompts": str(PROMPTS), "engine": "vllm",
                          "tensor_parallel_size": 4})[0]
    assert cap["num_gpus"] == 4 and specs.settings_object(cap).engine == "vllm"
