"""Run lifecycles: create or resume by identity, checkpoint, fail on any exception, complete (capture_run.py,
lifecycle.py); the run directory itself is backend/store/rundir.py."""
