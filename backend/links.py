"""The dashboard's views as URL paths, built in this one place: the command line prints them on the configured
address (backend.config.dashboard_link) and the pages link with them, so a path printed by `check-drafter`, the
demo or a proof opens the same view as the page's own link. Run ids are quoted (a run id is letters, digits, '.',
'_' and '-': quoting changes nothing for a valid one)."""

from __future__ import annotations

from urllib.parse import quote


def compare(run_ids: list[str] | tuple[str, ...]) -> str:
    """Compare on these runs (the first is shown first)."""
    return "/compare?runs=" + quote(",".join(run_ids), safe=",")


def drafter_check(run_id: str) -> str:
    """The Drafter check page of a check run."""
    return "/drafter?run=" + quote(run_id, safe="")


def run(run_id: str) -> str:
    """The run page."""
    return "/run?id=" + quote(run_id, safe="")
