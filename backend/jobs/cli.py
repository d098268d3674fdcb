"""`python -m backend submit|worker|cancel|jobs`: registered by backend/__main__.py through `add_parsers`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from backend.store.data_root import DataRoot


def submit_spec(spec: dict, base: Path | str | None = None, data: DataRoot | None = None) -> list[dict]:
    """Validate a spec mapping and enqueue its jobs (what `submit` and the New run page call)."""
    from backend.jobs import queue
    from backend.jobs import spec as specs

    return queue.enqueue(specs.validate(spec, base), data)


def cmd_submit(a: argparse.Namespace) -> int:
    from backend.jobs import spec as specs

    spec = specs.load_spec_file(a.spec)
    jobs = submit_spec(spec, base=Path(a.spec).resolve().parent)
    for j in jobs:
        print(f"queued {j['job_id']} ({j['kind']})")
    if a.ray:
        from backend.jobs import queue
        from backend.jobs.worker import run_ray

        run_ray(a.ray, once=True, only={j["job_id"] for j in jobs})
        states = [(queue.find(j["job_id"]) or ("missing", {}))[0] for j in jobs]
        bad = [f"{j['job_id']} {s}" for j, s in zip(jobs, states) if s != "done"]
        print(f"{len(jobs) - len(bad)}/{len(jobs)} jobs done" + (f"; not done: {', '.join(bad)}" if bad else ""))
        return 1 if bad else 0
    return 0


def cmd_worker(a: argparse.Namespace) -> int:
    from backend.jobs.worker import run_worker

    n = run_worker(once=a.once, max_jobs=a.max_jobs, ray_address=a.ray, poll_s=a.poll)
    print(f"worker: {n} jobs finished")
    return 0


def cmd_cancel(a: argparse.Namespace) -> int:
    from backend.jobs import queue

    print(f"{a.job}: {queue.cancel(a.job)}")
    return 0


def cmd_jobs(a: argparse.Namespace) -> int:
    from backend.jobs import queue

    rows = queue.table(limit=a.limit)
    if a.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        print("no jobs: submit one with `python -m backend submit SPEC.yaml`")
    for r in rows:
        prog = f"{r['done']}/{r['total']}" if r["total"] else "-"
        print(f"{r['job_id']:<40} {r['state']:<10} {r['kind']:<8} {prog:>9}  {r['error'] or ''}")
    return 0


def add_parsers(sub) -> None:
    s = sub.add_parser("submit", help="queue a job spec (YAML/JSON: kind capture, bench, sweep or load)")
    s.add_argument("spec", help="job spec file; see backend/jobs/spec.py for the fields")
    s.add_argument("--ray", metavar="ADDRESS", help="also run the jobs now as Ray tasks on this cluster and wait")
    s.set_defaults(fn=cmd_submit)

    w = sub.add_parser("worker", help="run queued jobs one at a time (or as Ray tasks with --ray)")
    w.add_argument("--once", action="store_true", help="exit when the queue is empty")
    w.add_argument("--max-jobs", type=int, help="exit after this many jobs")
    w.add_argument("--ray", metavar="ADDRESS", help="hand each job to this Ray cluster (auto, ray://host:10001, ...)")
    w.add_argument("--poll", type=float, default=1.0, help="seconds between looks at an empty queue")
    w.set_defaults(fn=cmd_worker)

    c = sub.add_parser("cancel", help="cancel a queued or running job (its run ends failed, never complete)")
    c.add_argument("job")
    c.set_defaults(fn=cmd_cancel)

    j = sub.add_parser("jobs", help="list jobs with state and progress")
    j.add_argument("--json", action="store_true")
    j.add_argument("--limit", type=int, default=100)
    j.set_defaults(fn=cmd_jobs)
