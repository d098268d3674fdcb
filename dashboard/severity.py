"""One severity scale for every page: how loud a finding is follows what it costs and how sure that cost is.

A cost is a relative loss of tau (the mean acceptance length), measured (a bench, paired over prompts, with its 95%
interval) or predicted (a drafter check's candidates, told apart or not by their paired z). Its level:

| cost (fraction of the better tau)   | level     |
|-------------------------------------|-----------|
| under NEGLIGIBLE (1%), or a gain    | ok        |
| the sample cannot tell it from none | note (at most) |
| under NOTE_BELOW (5%)               | note      |
| NOTE_BELOW to ERROR_FROM (20%)      | warning   |
| ERROR_FROM and more                 | error     |

So a 2% tau cost, however certain, is a note; a 50% one is an error; statistical significance (a z or an interval
that excludes 0) says only whether there is a cost, never how large: the words always give the size.

The numbers come from the backend (verdict objects, intervals); the words and colours live here. The thresholds and
the level of a cost are backend/tau_scale.py's (the backend's own findings and the `runs` command grade by them too),
read here, never restated. Pure functions, no Streamlit (dashboard/ui.py draws a level as a banner).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from backend.tau_scale import ERROR_FROM, NEGLIGIBLE, NOTE_BELOW, level_key, relative_cost

MATTERS_REL = 0.01       # a hidden-state statistic "changes" when it moves by 1% of the reference's value or more


@dataclass(frozen=True)
class Level:
    key: str              # ok | note | warning | error
    name: str             # the word the pages show
    colour: str           # for charts
    icon: str             # Streamlit material icon


LEVELS: dict[str, Level] = {
    "ok": Level("ok", "No cost", "#2ca02c", ":material/check_circle:"),
    "note": Level("note", "Note", "#1f77b4", ":material/info:"),
    "warning": Level("warning", "Warning", "#ff7f0e", ":material/warning:"),
    "error": Level("error", "Error", "#d62728", ":material/error:"),
}
ORDER = list(LEVELS)


def scale_text() -> str:
    """The scale in one line, for a caption next to a level."""
    return (f"Severity follows the tau cost: under {NEGLIGIBLE:.0%} none, under {NOTE_BELOW:.0%} a note, "
            f"{NOTE_BELOW:.0%} to {ERROR_FROM:.0%} a warning, {ERROR_FROM:.0%} or more an error; a cost the sample "
            "cannot tell from none is at most a note.")


@dataclass(frozen=True)
class Cost:
    level: Level
    rel: float             # the cost as a fraction of the better tau (negative: a gain)
    sure: bool             # the sample tells it from no cost
    words: str             # "tau 2.47 against 2.52: 2% lower (...)"


def level_of(rel: float, sure: bool = True) -> Level:
    """The level of a relative tau cost (module docstring; backend/tau_scale.py `level_key`)."""
    return LEVELS[level_key(rel, sure)]


def tau_cost(better: float, worse: float, lo: float | None = None, hi: float | None = None,
             sure: bool | None = None, what: str = "tau") -> Cost:
    """The cost of `worse` against `better` (two tau values). lo, hi: the 95% interval of better - worse (paired over
    prompts) when measured; `sure`: whether the sample tells them apart (default: lo > 0 when an interval is
    given, else True)."""
    rel = relative_cost(better, worse)
    has_ci = lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi)
    if sure is None:
        sure = lo > 0 if has_ci else True
    level = level_of(rel, sure)
    ci = f", 95% CI {100 * lo / better:.0f}% to {100 * hi / better:.0f}%" if has_ci and better else ""
    if not math.isfinite(rel):
        size = "no figure"
    elif rel < 0:
        size = f"{-rel:.0%} higher"
    else:
        size = (f"{rel:.0%} lower" if rel >= NEGLIGIBLE else f"{rel:.1%} lower" if rel >= 0.0005 else "the same")
    tail = "" if sure or rel < NEGLIGIBLE else ", not told apart from no cost on this sample"
    return Cost(level, rel, bool(sure), f"{what} {worse:.2f} against {better:.2f}: {size}{ci}{tail}")


def headline(cost: Cost, subject: str) -> str:
    """'**Error** (tau cost 50%): subject' — the level's name and the size first, then what it is about."""
    if cost.level.key == "ok":
        return f"**{cost.level.name}**: {subject}"
    return f"**{cost.level.name}** (tau cost {cost.rel:.0%}): {subject}"


def significance_words(z: float | None, sure_z: float, cost: Cost | None) -> str:
    """A paired z in words that never reads as importance: whether the sample tells two candidates apart, then how
    large the difference is on the scale ("told apart (z 13.3), but small: a note")."""
    if z is None or not math.isfinite(z):
        return "z not computable"
    if z < sure_z:
        return f"z {z:.1f} < {sure_z:g}: not told apart on this sample"
    if cost is None:
        return f"z {z:.1f}: told apart on this sample; its size is not measured"
    size = {"ok": "negligible", "note": "but small", "warning": "a real cost", "error": "a large cost"}[cost.level.key]
    return f"z {z:.1f}: told apart on this sample, {size} ({cost.level.name.lower()}: {cost.words})"


def stat_headline(frame, mode: str, label: str, reference: str, verdict: str,
                  threshold: float = MATTERS_REL) -> tuple[Level, str]:
    """The Stats page's headline with one definition of change, the chart's: mode "diff" names the largest absolute
    difference (what the chart plots), "rel" and "values" the largest relative one (rel: what the chart plots;
    values: the curves' spread, against the first capture). `verdict`: stats_compare's line (relative), kept for
    "rel"; then whether it matters: a change of `threshold` of the reference's value or more, at how many
    boundaries."""
    from dashboard.stats_words import pct

    f = frame[frame["rel"].notna()] if len(frame) else frame
    if not len(f):
        return LEVELS["ok"], verdict
    rel = f["rel"].astype(float).abs()
    n, big = len(f), int((rel >= threshold).sum())
    level = LEVELS["note"] if big else LEVELS["ok"]     # a change is information, not a cost: blue, never red
    where = ", ".join(f"{r.boundary} ({r.run_id})" for r in f[rel >= threshold].head(4).itertuples())
    more = f" and {big - 4} more" if big > 4 else ""
    rule = (f" Matters from {threshold:.0%} of the reference's value: {big} of {n} boundary values compared"
            + (f" ({where}{more})." if big else ", so no change here matters."))
    if rel.max() == 0:
        return LEVELS["ok"], verdict
    if mode == "diff":
        d = f["diff"].astype(float)
        top = f.loc[d.abs().idxmax()]
        text = (f"Largest difference: {label} {top['diff']:+.4g} at {top['boundary']} ({top['run_id']} minus "
                f"{reference}; {pct(top['rel']).lstrip('+') if abs(top['rel']) != float('inf') else 'from 0'} "
                "of the reference's value).")
        return level, text + rule
    if mode == "values":
        top = f.loc[rel.idxmax()]
        change = pct(top["rel"]) if abs(top["rel"]) != float("inf") else "from 0"
        return level, (f"Against the first capture `{reference}`: the largest difference in {label} is {change} at "
                       f"{top['boundary']} ({top['run_id']}).") + rule
    return level, verdict + rule
