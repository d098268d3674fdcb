"""dashboard/severity.py: one scale, in proportion to the cost and its certainty (issue 20 item 1), and the Stats
headline's one definition of change (item 5)."""

from __future__ import annotations

import math

import pandas as pd

from dashboard import severity


def test_levels_follow_the_size_of_the_cost() -> None:
    assert severity.tau_cost(2.52, 2.47).level.key == "note"           # the toy after-layer drafter: 2%
    assert severity.tau_cost(2.55, 1.27).level.key == "error"          # the slot-shift drafter: 50%
    assert severity.tau_cost(2.13, 1.80).level.key == "warning"        # 15%
    assert severity.tau_cost(2.13, 2.125).level.key == "ok"            # under 1%
    assert severity.tau_cost(2.0, 2.4).level.key == "ok"               # a gain is no cost
    assert "20% higher" in severity.tau_cost(2.0, 2.4).words


def test_an_uncertain_cost_is_at_most_a_note() -> None:
    c = severity.tau_cost(2.13, 1.21, lo=-0.1, hi=1.9)                 # the interval reaches 0
    assert c.level.key == "note" and not c.sure and "not told apart" in c.words
    sure = severity.tau_cost(2.13, 1.21, lo=0.83, hi=1.01)
    assert sure.level.key == "error" and sure.sure and "95% CI 39% to 47%" in sure.words
    assert severity.tau_cost(2.52, 1.27, sure=False).level.key == "note"


def test_significance_is_never_read_as_size() -> None:
    small = severity.tau_cost(2.52, 2.47, sure=True)
    words = severity.significance_words(13.3, 2.0, small)
    assert "told apart" in words and "but small" in words and "clearly" not in words
    assert "not told apart" in severity.significance_words(1.2, 2.0, small)
    big = severity.tau_cost(2.55, 1.27, sure=True)
    assert "a large cost" in severity.significance_words(20.0, 2.0, big)
    assert severity.significance_words(None, 2.0, None) == "z not computable"


def test_headline_puts_level_and_size_first() -> None:
    assert severity.headline(severity.tau_cost(2.55, 1.27), "x").startswith("**Error** (tau cost 50%): x")
    assert severity.headline(severity.tau_cost(2.0, 2.4), "x") == "**No cost**: x"


def _frame(rows):
    return pd.DataFrame(rows, columns=["run_id", "boundary", "diff", "rel"])


def test_stat_headline_uses_the_charts_change() -> None:
    # S_2 has the largest relative change, S_8 the largest absolute one: diff mode names S_8, rel mode S_2
    f = _frame([("b", "S_2", 0.5, 0.25), ("b", "S_8", -40.0, -0.10), ("b", "S_4", 0.001, 0.0001)])
    level, line = severity.stat_headline(f, "diff", "mean norm", "a", "Largest change: mean norm +25% at S_2 (b vs a).")
    assert "-40 at S_8 (b minus a" in line and level.key == "note"
    assert "Matters from 1% of the reference's value: 2 of 3" in line
    _, rel = severity.stat_headline(f, "rel", "mean norm", "a", "Largest change: mean norm +25% at S_2 (b vs a).")
    assert rel.startswith("Largest change: mean norm +25% at S_2")
    _, values = severity.stat_headline(f, "values", "mean norm", "a", "")
    assert "is +25% at S_2 (b)" in values
    quiet = _frame([("b", "S_2", 0.001, 0.001)])
    level, line = severity.stat_headline(quiet, "diff", "mean norm", "a", "")
    assert level.key == "ok" and "so no change here matters" in line
    level, _ = severity.stat_headline(_frame([("b", "S_2", math.nan, math.nan)]), "diff", "m", "a", "v")
    assert level.key == "ok"
