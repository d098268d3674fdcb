"""`python -m backend watch --server-url URL ...`: registered by backend/__main__.py through `add_parser(subparsers)`.

Exit codes (for cron and CI): 0 no drift (or no verdict: no traffic, baseline not complete), 1 drift or tau below
--min-tau, 2 the server cannot be watched (unreachable, lost, not vLLM/SGLang metrics, no speculative decoding; one
line, the run kept as failed), 130 a second Ctrl-C (the run is failed as interrupted; one Ctrl-C or SIGTERM ends
the watch normally, with the windows it has)."""

from __future__ import annotations

import argparse
import sys

from backend.options import SERVING_ENGINES


def cmd_watch(a: argparse.Namespace) -> int:
    from backend.watch import WatchSettings, run_watch

    s = WatchSettings(server_url=a.server_url, interval=a.interval, duration=a.duration, windows=a.windows,
                      min_tau=a.min_tau, engine=a.engine, baseline_windows=a.baseline_windows,
                      min_drafts=a.min_drafts, level=a.level, confirm=a.confirm, max_missed=a.max_missed,
                      timeout=a.timeout)
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
    w.add_argument("--server-url", required=True, help="the server, e.g. http://HOST:8000 (its GET /metrics is read)")
    w.add_argument("--interval", type=float, default=10.0, help="seconds per window (default 10)")
    w.add_argument("--duration", type=float, help="stop after this many seconds (default: until Ctrl-C)")
    w.add_argument("--windows", type=int, help="stop after this many windows")
    w.add_argument("--min-tau", type=float, help="exit 1 when tau stays below this (see --confirm)")
    w.add_argument("--name", help="run id (default watch-<date>-<time>-<pid>)")
    w.add_argument("--engine", choices=SERVING_ENGINES, help="default: told from the metric names")
    w.add_argument("--baseline-windows", type=int, default=6,
                   help="windows with enough drafts that form the baseline (default 6)")
    w.add_argument("--min-drafts", type=int, default=100,
                   help="a window with fewer drafts is 'too few drafts', not evidence (default 100)")
    w.add_argument("--level", type=float, default=0.99, help="one-sided level of the baseline band (default 0.99)")
    w.add_argument("--confirm", type=int, default=2,
                   help="windows in a row below the band (or --min-tau) that make the verdict (default 2)")
    w.add_argument("--max-missed", type=int, default=3, help="failed scrapes in a row that end the watch (default 3)")
    w.add_argument("--timeout", type=float, default=5.0, help="seconds per scrape (default 5)")
    w.add_argument("--quiet", action="store_true", help="only the summary line")
    w.set_defaults(fn=cmd_watch)
    return w
