"""The demo's fast path (issue 24 item 4): the slot-shift benches run the first SLOT_LIMIT held-out prompts, and the
story compares its runs on the prompts all of them decoded, not a 116-prompt tau against a 40-prompt one."""

from __future__ import annotations

import inspect

import pandas as pd

from backend import demo


def _rows(run: str, per_prompt: dict[int, tuple[int, int]]) -> pd.DataFrame:
    return pd.DataFrame([{"run_id": run, "prompt_id": p, "accepted": a, "drafts": d}
                         for p, (a, d) in per_prompt.items()])


def test_story_tau_is_over_the_shared_prompts():
    matched, slot, patched, fixed = demo.STORY_RUNS
    # the matched run decoded 4 prompts; prompts 3 and 4 (only there) are much easier than 1 and 2
    by_run = {matched: _rows(matched, {1: (10, 10), 2: (10, 10), 3: (40, 10), 4: (40, 10)}),
              slot: _rows(slot, {1: (2, 10), 2: (4, 10)}),
              patched: _rows(patched, {1: (9, 10), 2: (9, 10)}),
              fixed: _rows(fixed, {1: (10, 10), 2: (9, 10), 5: (0, 10)})}
    runs = pd.DataFrame({"tau": [3.5, 1.3, 1.9, 1.63]}, index=list(demo.STORY_RUNS))
    tau = demo._shared_tau(runs, by_run)
    assert tau[matched] == 2.0                          # prompts 1, 2 only (its own tau over 4 prompts: 3.5)
    assert tau[slot] == 1.3 and tau[patched] == 1.9 and tau[fixed] == 1.95
    # no per-prompt rows for a run: each run's own tau, nothing invented
    assert demo._shared_tau(runs, {matched: by_run[matched]}) == runs["tau"].to_dict()


def test_slot_shift_benches_default_to_the_first_slot_limit_prompts():
    assert inspect.signature(demo.build_slot_shift_demo).parameters["limit"].default == demo.SLOT_LIMIT == 40
    assert demo.REGRESS_LIMIT <= demo.SLOT_LIMIT        # the regression pair stays inside the fixed bench's prompts
