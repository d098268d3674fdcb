"""The Stats page's words (pages/stats.py): the one-line verdict of a comparison against a reference capture
(backend/stats_compare.py `StatComparison`: the largest change, where, and how large the rest are) and the
percentages it and the page's headline (dashboard/severity.py) write."""

from __future__ import annotations

import math

from backend.stats_compare import StatComparison


def pct(x: float) -> str:
    """A relative change as a signed percentage with two significant digits: +12%, -1.2%, +0.30%, +0.0042%."""
    p = float(f"{100 * x:.2g}")              # two significant digits first: 0.0999999 -> 0.1, not 0.100
    if p == 0:
        return "0%"
    digits = min(6, max(0, 1 - math.floor(math.log10(abs(p)))))
    return f"{p:+.{digits}f}%"


def _change(row) -> str:
    if math.isinf(row.rel):
        return f"from 0 to {row.value:.4g}"
    return pct(row.rel)


def _few(labels: list[str], n: int = 4) -> str:
    return ", ".join(labels[:n]) + (f" and {len(labels) - n} more" if len(labels) > n else "")


def verdict(c: StatComparison) -> str:
    """One line: the largest change of `c.label`, at which boundary of which run, and how large the rest are."""
    reference, cands = c.reference, c.candidates
    if not cands:
        return f"Pick a capture other than the reference `{reference}` to compare with it."
    if c.frame.empty:
        return f"No boundary in common between {', '.join(cands)} and the reference {reference}: nothing to compare."
    top, rest = c.largest()
    gaps = {r: m for r, m in c.missing.items() if m}
    tail = (f" Boundaries only one side holds ({'; '.join(f'{r}: {_few(m)}' for r, m in gaps.items())}) "
            "are gaps." if gaps else "")
    if top["size"] <= 0:
        return (f"No change: {c.label} is identical at all {len(c.frame)} boundaries compared "
                f"({', '.join(cands)} vs {reference}).{tail}")
    elsewhere = "" if rest is None else "; elsewhere no change" if rest == 0 else (
        "; other boundaries also change from 0" if math.isinf(rest) else
        f"; elsewhere within {pct(rest).lstrip('+')}")
    return (f"Largest change: {c.label} {_change(top)} at {top.boundary} ({top.run_id} vs {reference})"
            f"{elsewhere}.{tail}")
