"""Are two data roots' run files the same, timestamps and timings aside? (Issue 12's bar: the demo's run files are
identical before and after a refactor.)

    SPECLENS_DATA=/tmp/demo_old python -m backend demo     # at the old commit (a git worktree)
    SPECLENS_DATA=/tmp/demo_new python -m backend demo     # at the new one
    python tools/compare_run_roots.py /tmp/demo_old /tmp/demo_new

Compares every run directory's file names, JSON fields, Parquet columns and tensors, leaving out what differs
between any two runs of the same settings: timestamps, pids, hosts, paths, the git commit and timing figures
(seconds, tokens/s, TTFT/TPOT, speedup). Prints each difference; exits 1 when there is one.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import sys
from pathlib import Path

import pandas as pd

VOLATILE = {"created", "updated", "finished", "pid", "host", "git_commit", "seconds", "start_seconds", "timing",
            "path", "tokens_per_s", "throughput", "ttft", "tpot", "speedup", "log", "run_id", "name"}
TIMED_COLUMNS = ("seconds", "tokens_per_s", "ttft", "tpot")


def scrub(x):
    if isinstance(x, dict):
        return {k: scrub(v) for k, v in x.items() if k not in VOLATILE}
    if isinstance(x, list):
        return [scrub(v) for v in x]
    return "<path>" if isinstance(x, str) and x.startswith("/") else x


def differences(a: Path, b: Path, name: str) -> list[str]:
    if name.endswith(".json"):
        ja, jb = scrub(json.loads(a.read_text())), scrub(json.loads(b.read_text()))
        if ja == jb:
            return []
        la = json.dumps(ja, sort_keys=True, indent=0).splitlines()
        lb = json.dumps(jb, sort_keys=True, indent=0).splitlines()
        return [f"{name}: " + " | ".join(list(difflib.unified_diff(la, lb, lineterm="", n=0))[2:14])]
    if name.endswith(".parquet"):
        da, db = pd.read_parquet(a), pd.read_parquet(b)
        da = da.drop(columns=[c for c in TIMED_COLUMNS if c in da.columns])
        db = db.drop(columns=[c for c in TIMED_COLUMNS if c in db.columns])
        return [] if list(da.columns) == list(db.columns) and da.equals(db) else [f"{name}: rows or columns differ"]
    if name.endswith(".safetensors") and hashlib.sha256(a.read_bytes()).digest() != hashlib.sha256(
            b.read_bytes()).digest():
        from safetensors.torch import load_file

        ta, tb = load_file(str(a)), load_file(str(b))
        if ta.keys() != tb.keys() or not all(bool((ta[k] == tb[k]).all()) for k in ta):
            return [f"{name}: tensors differ"]
    return []


def main() -> int:
    old, new = Path(sys.argv[1]) / "runs", Path(sys.argv[2]) / "runs"
    runs_old, runs_new = sorted(p.name for p in old.iterdir()), sorted(p.name for p in new.iterdir())
    out = [] if runs_old == runs_new else [f"run names differ: {sorted(set(runs_old) ^ set(runs_new))}"]
    for run in sorted(set(runs_old) & set(runs_new)):
        fa, fb = {p.name for p in (old / run).iterdir()}, {p.name for p in (new / run).iterdir()}
        if fa != fb:
            out.append(f"{run}: files differ {sorted(fa ^ fb)}")
        out += [f"{run}/{d}" for f in sorted(fa & fb) for d in differences(old / run / f, new / run / f, f)]
    print("\n".join(out) if out else f"{len(runs_old)} runs, no differences")
    return 1 if out else 0


if __name__ == "__main__":
    sys.exit(main())
