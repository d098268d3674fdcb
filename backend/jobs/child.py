"""`python -m backend.jobs.child ROOT JOB_ID`: run one claimed job (running/JOB_ID.json) in this process.
Started by the local worker; exits 0 (run complete), 2 (a one-line `error:` on stderr), 130 (interrupted: the run
was checkpointed and marked failed, resumable), or dies with its worker (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import os
import sys
import traceback


def main(argv: list[str]) -> int:
    job_id = argv[1]
    parent = os.environ.get("SPECLENS_JOB_PARENT")
    if parent and os.getppid() != int(parent):      # the worker died before PDEATHSIG was armed
        return 3
    from backend.errors import SpecLensError
    from backend.jobs import queue as q
    from backend.jobs.worker import execute
    from backend.store.data_root import DataRoot

    data = DataRoot(argv[0])           # the data root arrives as a path on the command line (an entry point)
    job = q.read(q.job_path(job_id, "running", data))
    if job is None:
        print(f"error: job {job_id} is not in {q.qdir(data) / 'running'}", file=sys.stderr)
        return 2
    try:
        res = execute(job, data)
    except SpecLensError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one line for the job, the traceback for its log
        traceback.print_exc()
        print(f"error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr)
        return 1
    print(f"run {res['run']} {res['status']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
