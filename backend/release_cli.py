"""`python -m backend feeds` and `python -m backend regress`: engine releases, what each feeds a drafter, and
whether a bench run on a new release is worse than one on the old (backend/feeds.py, backend/regress.py)."""

from __future__ import annotations

import argparse
import json
import sys


def cmd_feeds(a: argparse.Namespace) -> int:
    from backend import feeds

    drafter, target = a.drafter, a.target
    if a.check:
        drafter, target = feeds.check_pair(a.check)
    if not drafter or not target:
        from backend.errors import SpecLensError
        raise SpecLensError("feeds needs --drafter DIR --target DIR (or --check RUN, a stored drafter check)")
    m = feeds.matrix(drafter, target)
    if a.json:
        print(json.dumps(m))
    else:
        print_feeds(m)
    return 0


def print_feeds(m: dict) -> None:
    """`feeds`' text: the pair, the summary (backend/feeds.py `Summary`, worded in backend/text/feeds_text.py, the
    same lines as the Feeds page's) and one line per engine release."""
    from backend.feeds import summary
    from backend.text.feeds_text import fed, summary_lines

    print(f"drafter {m['drafter']}\ntarget  {m['target']} ({'/'.join(m['target_info']['architectures'])}, "
          f"N={m['target_info']['n_layers']})")
    for line in summary_lines(summary(m)):
        print("  " + line)
    print(f"{'engine':7} {'release':8} {'runner':6} {'picked':6} {'feeds':24} {'trained':8} {'status':8} ids from")
    for r in m["rows"]:
        print(f"{r['engine']:7} {r['release']:8} {(r['runner'] or '-'):6} {('yes' if r['picked'] else ''):6} "
              f"{fed(r['feeds']):24} {(r['trained'] or '-'):8} {r['status']:8} {r['ids_from'] or '-'}")


def cmd_regress(a: argparse.Namespace) -> int:
    from backend import regress

    r = regress.compare(a.baseline, a.candidate, max_tau_drop=a.max_tau_drop)
    if a.json:
        print(json.dumps(r))
    else:
        print(r["line"])
    if r["verdict"] == "worse":
        if a.json:
            print(r["line"], file=sys.stderr)
        return 1
    return 0


def add_parsers(sub) -> None:
    f = sub.add_parser("feeds", help="what every vLLM and SGLang release feeds a drafter (engine x release x "
                                     "runner), from config files alone")
    f.add_argument("--drafter", help="drafter directory (its config.json)")
    f.add_argument("--target", help="target directory (its config.json)")
    f.add_argument("--check", help="a stored drafter check run: take its drafter and target")
    f.add_argument("--json", action="store_true", help="print one JSON object")
    f.set_defaults(fn=cmd_feeds)

    r = sub.add_parser("regress", help="exit 1 when a candidate bench run is worse than a baseline bench run "
                                       "beyond the paired interval (tau), or loses losslessness")
    r.add_argument("--baseline", required=True, help="bench run id (e.g. on the old engine release)")
    r.add_argument("--candidate", required=True, help="bench run id (e.g. on the new engine release)")
    r.add_argument("--max-tau-drop", type=float, default=0.02,
                   help="tau may drop by this much before it counts (default 0.02)")
    r.add_argument("--json", action="store_true", help="print one JSON object (the reason also on stderr)")
    r.set_defaults(fn=cmd_regress)
