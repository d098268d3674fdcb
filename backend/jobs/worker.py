"""The worker: runs queued jobs one at a time (each in a child process), or hands them to Ray as tasks.

Local mode (`run_worker`): recover orphaned jobs, claim the oldest pending job, run
`python -m backend.jobs.child ROOT JOB_ID` (which calls run_capture / run_bench exactly as the CLI does, with
the job id as run name), heartbeat and watch for a cancel flag while it runs, then move the job to done/,
failed/, cancelled/ or back to pending/. The child dies with the worker (PR_SET_PDEATHSIG), so a killed worker
never leaves a second writer behind; the next worker resumes the same run by its name.

Ray mode (`run_ray`): the same claim and recovery, but each job becomes a Ray task with the job's num_gpus and
num_cpus that calls the same `execute` in the Ray worker and writes to the shared run root.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from backend.config import REPO_ROOT
from backend.engines.lifeline import die_with_parent
from backend.errors import SpecLensError
from backend.jobs import queue as q
from backend.runs.lifecycle import Run, tagged_runs
from backend.runs.manifest import StoredManifest, section_json
from backend.store.data_root import DataRoot
from backend.store.rundir import COMPLETE, RunDir, _pid_alive, now

if TYPE_CHECKING:
    from backend.engines.base import EngineOptions
    from backend.settings import CaptureSettings

CANCEL_GRACE_S = 30.0
HEARTBEAT_S = 2.0


# ---------------------------------------------------------------------- one job, in this process


def run_status(run_name: str, data: DataRoot) -> StoredManifest | None:
    """The run's manifest (typed); None when there is none or it cannot be read."""
    try:
        return RunDir(data.runs / run_name).read()
    except SpecLensError:
        return None


def _tag_runs(job: dict):
    """Runs created while this job runs carry `job: {id, sweep, kind}` in their manifest (dashboard, tests)."""
    return tagged_runs({"id": job["job_id"], "sweep": job.get("sweep"), "kind": job.get("kind")})


def execute(job: dict, data: DataRoot) -> dict:
    """Run one job here and now: run_capture or run_bench with the job's settings and run name. A run that is
    already complete is not run again (a job retried after its run finished). Returns a small result dict."""
    from backend.jobs.spec import settings_object

    name = job["run_name"]
    m = run_status(name, data)
    if m is None or m.status != COMPLETE:
        threads = int(job.get("num_cpus") or 0)
        if threads >= 1:
            import torch
            torch.set_num_threads(threads)
        s = settings_object(job)
        with _tag_runs(job):
            if job["kind"] == "capture":
                from backend.capture import run_capture
                run_capture(s, name=name, data=data, progress=False, engine_options=_capture_engine_options(job, s))
            elif job["kind"] == "load":
                from backend.load_bench import run_load
                run_load(s, name=name, data=data, progress=False)
            else:
                from backend.bench import run_bench
                r = run_bench(s, name=name, data=data, progress=False)
                if r.status != COMPLETE:
                    raise SpecLensError(f"baseline {r.run_id} of {name} ended {r.status}")
        m = run_status(name, data) or StoredManifest()
    return {"run": name, "status": m.status, "headline": section_json(m.headline), "bench": section_json(m.bench),
            "baseline_run": m.baseline_run, "host": socket.gethostname()}


def _capture_engine_options(job: dict, s: CaptureSettings) -> EngineOptions | None:
    """The engine's own options of a capture job, built as `python -m backend capture` builds them (the engine's
    `capture_options` from the job's tensor_parallel_size and engine_options)."""
    from backend.engines.base import adapter

    st = job["settings"]
    return adapter(s.engine).capture_options(s, int(st.get("tensor_parallel_size") or 1),
                                             dict(st.get("engine_options") or {}))


def fail_runs(job: dict, msg: str, data: DataRoot) -> list[str]:
    """Mark the job's unfinished runs (its run and its own baseline) failed with `msg`; never touches a complete
    run or another job's. Called only once the job's writer is gone (child reaped, Ray task over, orphan killed)."""
    out = []
    for rid in (job["run_name"], f"{job['run_name']}-baseline"):
        p = data.runs / rid
        if not (p / "manifest.json").exists():
            continue
        rd = RunDir(p)
        try:
            m = rd.read()
        except SpecLensError:
            continue
        if m.status == COMPLETE or (m.job.id if m.job is not None else None) not in (None, job["job_id"]):
            continue
        Run(rd, data).fail(msg)                # re-indexed there
        out.append(rid)
    return out


# ---------------------------------------------------------------------- recovery


def _is_our_child(pid: int, job_id: str) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"backend.jobs.child" in cmd and job_id.encode() in cmd


def recover(data: DataRoot, log: Callable[[str], None] = print) -> int:
    """Handle running jobs whose worker died: stop a leftover child, then requeue the job (the next claim resumes
    its run) or, past max_attempts or when cancelled, fail its runs and move it to failed/ or cancelled/."""
    n = 0
    for j in list(q.orphans(data)):
        o = j.get("owner") or {}
        child = o.get("child_pid")
        if child and o.get("host") == socket.gethostname() and _is_our_child(int(child), j["job_id"]):
            os.kill(int(child), signal.SIGKILL)
            for _ in range(100):
                if not _pid_alive(int(child)) or not _is_our_child(int(child), j["job_id"]):
                    break
                time.sleep(0.05)
        got = q.release(j, data)
        if got is None:
            continue
        n += 1
        if got["state"] != "pending":
            fail_runs(got, f"job {j['job_id']} {got['state']}: {got.get('error')}", data)
        log(f"recovered job {j['job_id']} (worker {o.get('host')}:{o.get('pid')} gone) -> {got['state']}")
    return n


# ---------------------------------------------------------------------- local worker


def _die_with_parent() -> None:  # runs in the child between fork and exec
    die_with_parent()
    os.setpgrp()   # ^C in the worker's terminal reaches the worker, which forwards it


def _last_error(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    for ln in reversed(lines):
        if ln.startswith("error:"):
            return ln[len("error:"):].strip()
    return lines[-1][:300] if lines else "no output"


class Worker:
    """`python -m backend worker`: one job at a time. Stop it with SIGTERM/SIGINT (the running job is interrupted,
    checkpointed and requeued) or kill -9 (the next worker resumes the job)."""

    def __init__(self, data: DataRoot | None = None, poll_s: float = 1.0, log: Callable[[str], None] = print):
        self.data = DataRoot.of(data)
        self.poll_s, self.log = poll_s, log
        self.stopping = False
        self.proc: subprocess.Popen | None = None

    def _stop(self, signum, frame) -> None:
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def run(self, once: bool = False, max_jobs: int | None = None) -> int:
        """Process jobs; `once`: until the queue is empty; `max_jobs`: at most that many. Returns jobs finished."""
        q.ensure(self.data)
        (q.qdir(self.data) / "logs").mkdir(exist_ok=True)
        old = [signal.signal(s, self._stop) for s in (signal.SIGTERM, signal.SIGINT)]
        done = 0
        try:
            while not self.stopping and (max_jobs is None or done < max_jobs):
                recover(self.data, self.log)
                job = q.claim(self.data, owner=q.me(worker="local"))
                if job is None:
                    if once:
                        break
                    time.sleep(self.poll_s)
                    continue
                self.run_job(job)
                done += 1
        finally:
            for s, h in zip((signal.SIGTERM, signal.SIGINT), old):
                signal.signal(s, h)
        return done

    def run_job(self, job: dict) -> str:
        job_id, data = job["job_id"], self.data
        log_path = q.qdir(data) / "logs" / f"{job_id}.log"
        env = {**os.environ, "SPECLENS_DATA": str(data.path), "SPECLENS_JOB_PARENT": str(os.getpid()),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        with open(log_path, "a") as lf:
            lf.write(f"--- {now()} attempt {job.get('attempts')} on {socket.gethostname()} pid {os.getpid()}\n")
            lf.flush()
            self.proc = subprocess.Popen([sys.executable, "-m", "backend.jobs.child", str(data.path), job_id],
                                         cwd=REPO_ROOT, env=env, stdout=lf, stderr=subprocess.STDOUT,
                                         preexec_fn=_die_with_parent)
        running = q.job_path(job_id, "running", data)
        cur = q.read(running) or job
        cur["owner"] = {**(cur.get("owner") or {}), "child_pid": self.proc.pid}
        q.write(running, cur)
        self.log(f"job {job_id} ({job['kind']}) -> run {job['run_name']} (child {self.proc.pid})")
        cancel_at, beat = None, 0.0
        while (rc := self.proc.poll()) is None:
            if time.monotonic() - beat > HEARTBEAT_S:
                q.heartbeat(job_id, data)
                beat = time.monotonic()
            if cancel_at is None and q.cancel_flag(job_id, data).exists():
                cancel_at = time.monotonic()
                self.proc.send_signal(signal.SIGINT)
            if cancel_at is not None and time.monotonic() - cancel_at > CANCEL_GRACE_S:
                self.proc.kill()
            time.sleep(0.1)
        self.proc = None
        cancelled = cancel_at is not None or q.cancel_flag(job_id, data).exists()
        return self.finish(job, rc, cancelled, log_path)

    def finish(self, job: dict, rc: int, cancelled: bool, log_path: Path) -> str:
        job_id, data = job["job_id"], self.data
        m = run_status(job["run_name"], data) or StoredManifest()
        if rc == 0 and m.status == COMPLETE:
            q.move(job_id, "running", "done", data, finished=now(), error=None,
                   result={"run": job["run_name"], "status": COMPLETE, "headline": section_json(m.headline)})
            state = "done"
        elif cancelled:
            fail_runs(job, f"cancelled: job {job_id} was cancelled", data)
            q.move(job_id, "running", "cancelled", data, finished=now(), error="cancelled")
            state = "cancelled"
        elif self.stopping:
            cur = q.read(q.job_path(job_id, "running", data)) or job
            q.move(job_id, "running", "pending", data, owner=None, attempts=max(0, int(cur.get("attempts", 1)) - 1))
            state = "pending"
        elif rc < 0 and int(job.get("attempts", 1)) < int(job.get("max_attempts", 3)):
            q.move(job_id, "running", "pending", data, owner=None, error=f"child killed by signal {-rc}; retrying")
            state = "pending"
        else:
            err = _last_error(log_path) if rc != 0 else f"run {job['run_name']} ended {m.status}"
            if rc < 0:
                err = f"killed by signal {-rc} ({err})"
            fail_runs(job, f"job {job_id} failed: {err}", data)
            q.move(job_id, "running", "failed", data, finished=now(), error=err, exit_code=rc)
            state = "failed"
        self.log(f"job {job_id} -> {state}")
        return state


def run_worker(data: DataRoot | None = None, once: bool = False, max_jobs: int | None = None,
               ray_address: str | None = None, poll_s: float = 1.0, log: Callable[[str], None] = print) -> int:
    if ray_address:
        return run_ray(ray_address, data, once=once, poll_s=poll_s, log=log)
    return Worker(data, poll_s, log).run(once=once, max_jobs=max_jobs)


# ---------------------------------------------------------------------- Ray


def _ray_task(job: dict, data_path: str) -> dict:
    """The body of a Ray task: the same `execute` the local child runs, on whichever node Ray picked. The data root
    crosses the process boundary as a string and becomes a DataRoot here, at the task's entry (like a CLI's)."""
    os.environ["SPECLENS_DATA"] = data_path
    return execute(job, DataRoot(data_path))


def run_ray(address: str, data: DataRoot | None = None, once: bool = False, only: set[str] | None = None,
            poll_s: float = 1.0, log: Callable[[str], None] = print) -> int:
    """Claim pending jobs (all, or the ids in `only`) and run each as a Ray task with the job's num_gpus/num_cpus,
    all writing to `data` (which every node must see at the same path: local disk of a one-host cluster, NFS, a
    mounted bucket). `once`: return when nothing is pending or running for this driver. Returns jobs finished."""
    import ray
    from ray.exceptions import RayTaskError, TaskCancelledError

    data = DataRoot.of(data)
    q.ensure(data)
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                     filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}})
    task = ray.remote(_ray_task)
    inflight: dict = {}
    cancelling: set[str] = set()
    finished, beat = 0, 0.0
    while True:
        recover(data, log)
        while True:
            pend = [j for j in q.jobs("pending", data) if only is None or j["job_id"] in only]
            if not pend:
                break
            j = pend[0]
            job = q.move(j["job_id"], "pending", "running", data, owner=q.me(worker=f"ray {address}"),
                         started=now(), attempts=int(j.get("attempts", 0)) + 1)
            if job is None:
                continue
            ref = task.options(num_gpus=float(job.get("num_gpus", 0)), num_cpus=float(job.get("num_cpus", 1)),
                               max_retries=0, name=f"speclens-{job['job_id']}").remote(job, str(data.path))
            inflight[ref] = job
            log(f"job {job['job_id']} ({job['kind']}) -> Ray task (gpus {job.get('num_gpus', 0)})")
        if not inflight:
            if once:
                return finished
            time.sleep(poll_s)
            continue
        ready, _ = ray.wait(list(inflight), num_returns=1, timeout=min(poll_s, 1.0))
        if time.monotonic() - beat > HEARTBEAT_S:
            for job in inflight.values():
                q.heartbeat(job["job_id"], data)
            beat = time.monotonic()
        for ref, job in inflight.items():
            if job["job_id"] not in cancelling and q.cancel_flag(job["job_id"], data).exists():
                cancelling.add(job["job_id"])
                ray.cancel(ref, force=True)
        for ref in ready:
            job = inflight.pop(ref)
            jid = job["job_id"]
            try:
                res = ray.get(ref)
                q.move(jid, "running", "done", data, finished=now(), error=None, result=res)
                state = "done"
            except (TaskCancelledError, RayTaskError, Exception) as e:  # noqa: B014 - every failure ends the job
                if jid in cancelling or isinstance(e, TaskCancelledError):
                    fail_runs(job, f"cancelled: job {jid} was cancelled", data)
                    q.move(jid, "running", "cancelled", data, finished=now(), error="cancelled")
                    state = "cancelled"
                else:
                    cause = getattr(e, "cause", None) or e
                    msg = str(cause).strip().splitlines()
                    err = f"{type(cause).__name__}: {msg[-1] if msg else ''}"[:300]
                    if isinstance(cause, SpecLensError):
                        err = str(cause).splitlines()[0][:300]
                    fail_runs(job, f"job {jid} failed: {err}", data)
                    q.move(jid, "running", "failed", data, finished=now(), error=err)
                    state = "failed"
            cancelling.discard(jid)
            finished += 1
            log(f"job {jid} -> {state}")


def result_json(job: dict) -> str:
    return json.dumps({k: job.get(k) for k in ("job_id", "state", "run_name", "error", "result")})
