"""The file queue: `<data root>/queue/{pending,running,done,failed,cancelled}/<job_id>.json`.

A job moves between states by `os.rename` (atomic on a local disk and on NFS): whoever renames
pending/X.json to running/X.json owns X. A running job file holds its owner (host, worker pid, child pid) and
its mtime is the owner's heartbeat (touched every few seconds). A cancel request is the file
`running/X.cancel` (or a plain rename of a pending job to cancelled/). Files are written to a temporary name and
renamed into place, so a reader never sees half a job.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from backend.errors import SpecLensError
from backend.runs.manifest import Progress, StoredManifest
from backend.store.data_root import DataRoot
from backend.store.rundir import RunDir, _pid_alive, atomic_write_json, now, valid_run_id

STATES = ("pending", "running", "done", "failed", "cancelled")
# a foreign host's job with no heartbeat for this long is dead
STALE_S = float(os.environ.get("SPECLENS_JOB_STALE_S", "120"))


def qdir(data: DataRoot | None = None) -> Path:
    return DataRoot.of(data).paths.queue


def ensure(data: DataRoot | None = None) -> Path:
    q = qdir(data)
    for s in STATES:
        (q / s).mkdir(parents=True, exist_ok=True)
    return q


def job_path(job_id: str, state: str, data: DataRoot | None = None) -> Path:
    return qdir(data) / state / f"{job_id}.json"


def cancel_flag(job_id: str, data: DataRoot | None = None) -> Path:
    return qdir(data) / "running" / f"{job_id}.cancel"


def read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write(path: Path, job: dict) -> None:
    job["updated"] = now()
    atomic_write_json(path, job)


def find(job_id: str, data: DataRoot | None = None) -> tuple[str, dict] | None:
    """(state, job) of a job id, or None."""
    if not valid_run_id(job_id):
        return None
    for s in STATES:
        j = read(job_path(job_id, s, data))
        if j is not None:
            return s, j
    return None


def jobs(state: str, data: DataRoot | None = None) -> list[dict]:
    """Jobs in one state, oldest submission first."""
    d = qdir(data) / state
    if not d.exists():
        return []
    out = [j for p in sorted(d.glob("*.json")) if (j := read(p)) is not None]
    return sorted(out, key=lambda j: (j.get("submitted", ""), j.get("seq", 0), j.get("job_id", "")))


def move(job_id: str, src: str, dst: str, data: DataRoot | None = None, **fields: Any) -> dict | None:
    """Rename src/<id>.json to dst/ (atomic; None if someone else moved it first), then record `fields`."""
    a, b = job_path(job_id, src, data), job_path(job_id, dst, data)
    try:
        os.rename(a, b)
    except FileNotFoundError:
        return None
    job = read(b) or {"job_id": job_id}
    job.update(fields, state=dst)
    write(b, job)
    if dst != "running":
        try:
            cancel_flag(job_id, data).unlink()
        except FileNotFoundError:
            pass
    return job


def new_base(prefix: str = "job") -> str:
    return f"{prefix}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def enqueue(jobs_: list[dict], data: DataRoot | None = None, base: str | None = None) -> list[dict]:
    """Write validated jobs (backend.jobs.spec.validate) to pending/; their ids are also their run names."""
    data = DataRoot.of(data)
    ensure(data)
    base = base or new_base()
    out = []
    t = now()
    for seq, j in enumerate(jobs_):
        if j.get("sweep") is not None:
            job_id = f"{j['sweep'] or base}-{j['name']}"
        else:
            job_id = j.get("name") or (base if len(jobs_) == 1 else f"{base}-{seq:02d}")
        if not valid_run_id(job_id):
            raise SpecLensError(f"name: job id '{job_id}' is not a valid run name")
        if find(job_id, data) is not None or (data.runs / job_id / "manifest.json").exists():
            raise SpecLensError(f"name: a job or run called '{job_id}' exists already; pick another name")
        out.append({**j, "job_id": job_id, "run_name": job_id, "submitted": t, "seq": seq, "attempts": 0,
                    "state": "pending", "owner": None, "error": None})
    for j in out:
        write(job_path(j["job_id"], "pending", data), j)
    return out


def claim(data: DataRoot | None = None, owner: dict | None = None) -> dict | None:
    """Take the oldest pending job (rename into running/); None when the queue is empty."""
    for j in jobs("pending", data):
        got = move(j["job_id"], "pending", "running", data, owner=owner or me(), started=now(),
                   attempts=int(j.get("attempts", 0)) + 1)
        if got is not None:
            return got
    return None


def me(**extra: Any) -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), **extra}


def heartbeat(job_id: str, data: DataRoot | None = None) -> None:
    try:
        os.utime(job_path(job_id, "running", data))
    except FileNotFoundError:
        pass


def owner_alive(job: dict, path: Path) -> bool:
    """Is the worker that claimed this running job still there? Same host: its pid; another host: a heartbeat
    younger than SPECLENS_JOB_STALE_S. A job with no owner yet (claimed a moment ago) counts as alive for 30 s."""
    o = job.get("owner") or {}
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return True
    if not o.get("pid"):
        return age < 30
    if o.get("host") == socket.gethostname():
        return _pid_alive(int(o["pid"]))
    return age < STALE_S


def orphans(data: DataRoot | None = None) -> Iterator[dict]:
    """Running jobs whose worker is gone."""
    for j in jobs("running", data):
        if not owner_alive(j, job_path(j["job_id"], "running", data)):
            yield j


def release(job: dict, data: DataRoot | None = None) -> dict | None:
    """Take an orphaned running job back: requeue it (pending/) or, past max_attempts or when a cancel was asked
    for, move it to failed/ or cancelled/ (the caller then fails its runs). The job file goes to a private name
    first, so two workers that both saw the orphan cannot both take it; a job claimed again meanwhile is put back.
    Returns the moved job (its 'state' says where), or None."""
    job_id = job["job_id"]
    src = job_path(job_id, "running", data)
    private = src.with_name(f".{job_id}.json.release-{socket.gethostname()}-{os.getpid()}")
    try:
        os.rename(src, private)
    except FileNotFoundError:
        return None
    cur = read(private) or dict(job)
    if (cur.get("owner") or {}) != (job.get("owner") or {}):     # claimed again since we looked: not ours
        os.rename(private, src)
        return None
    if cancel_flag(job_id, data).exists():
        state, err = "cancelled", "cancelled while its worker was gone"
    elif int(cur.get("attempts", 0)) >= int(cur.get("max_attempts", 3)):
        state, err = "failed", (f"worker died {cur.get('attempts')} times running this job "
                                f"(last owner {cur.get('owner')}); resubmit to try again")
    else:
        state, err = "pending", None
    cur.update(state=state, owner=None, previous_owner=cur.get("owner"))
    if state != "pending":
        cur.update(error=err, finished=now())
    write(private, cur)
    os.rename(private, job_path(job_id, state, data))
    if state != "pending":
        try:
            cancel_flag(job_id, data).unlink()
        except FileNotFoundError:
            pass
    return cur


def cancel(job_id: str, data: DataRoot | None = None) -> str:
    """Cancel a job: a pending one moves to cancelled/ at once; a running one gets a cancel flag its worker acts
    on within a second or two. Returns the state the job is in (or is heading to)."""
    got = find(job_id, data)
    if got is None:
        raise SpecLensError(f"no job '{job_id}' in {qdir(data)}; list jobs with `python -m backend jobs`")
    state, _ = got
    if state == "pending":
        if move(job_id, "pending", "cancelled", data, finished=now(), error="cancelled before it started"):
            return "cancelled"
        state, _ = find(job_id, data) or ("", {})
    if state == "running":
        from backend.store.rundir import atomic_write_bytes
        atomic_write_bytes(cancel_flag(job_id, data), now().encode())
        return "cancelling"
    return state


def table(data: DataRoot | None = None, limit: int = 100) -> list[dict]:
    """Rows for the dashboard and `python -m backend jobs`: newest first, with the run's progress."""
    data = DataRoot.of(data)
    rows = []
    for s in STATES:
        for j in jobs(s, data):
            rows.append(j)
    rows.sort(key=lambda j: (j.get("submitted", ""), j.get("seq", 0)), reverse=True)
    out = []
    for j in rows[:limit]:
        try:
            m = RunDir(data.runs / str(j.get("run_name"))).read()
        except SpecLensError:
            m = StoredManifest()
        prog = m.progress or Progress()
        st = j.get("state")
        if st == "running" and cancel_flag(j["job_id"], data).exists():
            st = "cancelling"
        out.append({"job_id": j["job_id"], "state": st, "kind": j.get("kind"), "run": j.get("run_name"),
                    "run_status": m.status, "done": prog.done, "total": prog.total,
                    "progress": _fraction(prog.done, prog.total, st),
                    "submitted": j.get("submitted"), "attempts": j.get("attempts"),
                    "error": (j.get("error") or "")[:200] or None})
    return out


def _fraction(done, total, state: str | None) -> float | None:
    if state == "done":
        return 1.0
    if isinstance(done, int) and isinstance(total, int) and total > 0:
        return max(0.0, min(1.0, done / total))
    return None
