"""`python -m backend watch --server-url URL ...`: registered by backend/__main__.py through `add_parser(subparsers)`.

Exit codes (for cron and CI): 0 no drift (or no verdict: no traffic, baseline not complete), 1 drift or tau below
--min-tau, 2 the server cannot be watched (unreachable, lost, not vLLM/SGLang metrics, no speculative decoding; one
line, the run kept as failed), 130 a second Ctrl-C (the run is failed as interrupted; one Ctrl-C or SIGTERM ends
the watch normally, with the windows it has)."""

from __future__ import annotations

import argparse
import sys

from backend.options import add_options, from_args
from backend.settings import WatchSettings


def cmd_watch(a: argparse.Namespace) -> int:
    from backend.watch import run_watch

    s = from_args(WatchSettings, a)
    try:
        r = run_watch(s, name=a.name, echo=None if a.quiet else lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        print("interrupted: the watch stopped at a second Ctrl-C; its windows are kept in the run (failed)",
              file=sys.stderr)
        return 130
    print(f"{r.verdict['line']} -> {r.path}", flush=True)
    return r.exit_code


def add_parser(subparsers) -> argparse.ArgumentParser:
    w = subparsers.add_parser("watch", help="record a live vLLM/SGLang server's speculative-decoding counters over "
                                            "time; exit 1 on acceptance drift or below --min-tau")
    add_options(w, WatchSettings)             # every field of the settings: --server-url, --interval, ...
    w.add_argument("--name", help="run id (default watch-<date>-<time>-<pid>)")
    w.add_argument("--quiet", action="store_true", help="only the summary line")
    w.set_defaults(fn=cmd_watch)
    return w
