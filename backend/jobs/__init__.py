"""Jobs: a spec schema, a file queue under the data root, and a worker (local, or Ray tasks).

Interface
---------
Start a worker (runs jobs one at a time, each in a child process `python -m backend.jobs.child ROOT JOB_ID`):

    SPECLENS_DATA=/data python -m backend worker [--once] [--max-jobs N] [--poll S] [--ray ADDRESS]
    # in Python: backend.jobs.worker.run_worker(data, once=True)  (or Worker(data).run(once=True)), data a DataRoot

`--once` drains the queue (orphans included) and exits; without it the worker polls forever. Queue jobs with
`python -m backend submit SPEC.yaml [--ray ADDRESS]` or `backend.jobs.cli.submit_spec(dict, base, data)`; cancel
with `python -m backend cancel JOB_ID` (`backend.jobs.queue.cancel`); list with `python -m backend jobs [--json]`.

Queue layout (all under the data root; every move is an atomic rename):

    queue/pending/<job_id>.json     submitted, oldest first
    queue/running/<job_id>.json     claimed; "owner": {host, pid (worker), child_pid}; mtime = heartbeat (2 s)
    queue/running/<job_id>.cancel   a cancel request; the worker SIGINTs the child (SIGKILL after 30 s)
    queue/{done,failed,cancelled}/<job_id>.json   finished; "error" says why, "result" holds the headline
    queue/logs/<job_id>.log         the child's output, one section per attempt

A job's id is also its run name (`runs/<job_id>/`; a bench's baseline is `<job_id>-baseline` unless an
identical complete one is reused), so a restarted worker resumes the same run (capture checkpoints, bench
journal) and never makes a second one. Runs made by a job carry `"job": {"id", "sweep", "kind"}` in their
manifest; progress is the run manifest's `progress` ({done, total}).

Killing and restarting (tests): `kill -9 <worker pid>` (the child dies with it through PR_SET_PDEATHSIG; its run
shows interrupted, never complete), then start a worker again: it finds the job in running/ whose owner pid is
dead (same host; another host: no heartbeat for SPECLENS_JOB_STALE_S = 120 s), requeues it (attempts + 1) and
resumes the run; past the job's max_attempts (default 3) it fails the job and marks its runs failed. SIGTERM or
SIGINT to a worker interrupts the child (checkpoint), requeues the job without counting an attempt and exits.
"""
