"""The Feeds summary in words (backend/feeds.py `Summary`): plain lines, the same for `python -m backend feeds`
(backend/release_cli.py) and the Feeds page (dashboard/feeds_words.py)."""

from __future__ import annotations

from backend.drafter.kinds import KIND_NAMES
from backend.feeds import Summary

TRAINED = {"matches": " - matches what the drafter was trained on",
           "differs": " - differs from what the drafter was trained on"}


def fed(feeds: list[str] | None) -> str:
    return ", ".join(feeds) if feeds else "cannot serve"


def summary_lines(s: Summary) -> list[str]:
    """A few plain lines: what the newest release of each engine feeds, the first change, the training match (a
    line that differs from training is the page's warning)."""
    lines = []
    if s.kind:
        lines.append(f"a {KIND_NAMES.get(s.kind, s.kind)} drafter: ids and releases read from the kind rows of "
                     f"backend/conventions.yaml (backend/drafter/kinds.py)")
    for n in s.newest:
        last = n.row
        run = f" ({last.runner.upper()})" if last.runner else ""
        lines.append(f"{n.engine} {last.release}{run} feeds {fed(last.feeds)}" + TRAINED.get(last.trained or "", ""))
        if not n.changes:
            lines.append(f"{n.engine}: the same over every release in the table")
        for c in n.changes:
            lines.append(f"{n.engine}: {'first change' if c['first'] else 'then'} at {c['release']} "
                         f"(from {c['from']}): {c['change']}")
    t = s.trained_on
    lines.append(f"trained on {', '.join(t['boundaries'])} (drafter check {t['run_id']})" if t else
                 "no full drafter check of this pair is stored, so rows are not marked against training "
                 "(run `python -m backend check-drafter` without --lint-only)")
    return lines
