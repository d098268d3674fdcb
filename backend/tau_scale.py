"""The thresholds of the one severity scale and the level of a relative tau cost, as data: dashboard/severity.py
words and colours them for every page, and the backend's own findings (backend/findings.py, the `runs` command's
text) grade by the same numbers. A cost is a relative loss of tau against the better tau (negative: a gain)."""

from __future__ import annotations

import math

NEGLIGIBLE = 0.01        # a tau cost under 1% is no cost worth a word
NOTE_BELOW = 0.05        # under 5%: a note (the toy after-layer drafter: 2% predicted, 4% measured)
ERROR_FROM = 0.20        # 20% or more: an error (the slot-shift drafter: 50% predicted, 43% measured)
KEYS = ("ok", "note", "warning", "error")


def level_key(rel: float | None, sure: bool = True) -> str:
    """ok | note | warning | error of a relative tau cost: under NEGLIGIBLE (or a gain, or no figure) ok; a cost the
    sample cannot tell from none at most a note; under NOTE_BELOW a note; under ERROR_FROM a warning; else an error."""
    if rel is None or not math.isfinite(rel) or rel < NEGLIGIBLE:
        return "ok"
    if not sure or rel < NOTE_BELOW:
        return "note"
    return "warning" if rel < ERROR_FROM else "error"


def relative_cost(better: float, worse: float) -> float:
    """(better - worse) / better: the cost of `worse` as a fraction of the better tau (NaN without a better tau)."""
    return (better - worse) / better if better else math.nan
