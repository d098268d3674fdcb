"""The Feeds page's words (pages/feeds.py): its summary lines from backend/feeds.py `Summary`. backend/feeds.py
returns the data; backend/text/feeds_text.py words it once, for the command line (backend/release_cli.py) and this
page alike; the page shows each line as markdown, a line that differs from training as a warning."""

from __future__ import annotations

from backend.feeds import Summary
from backend.text import feeds_text


def summary_lines(s: Summary) -> list[str]:
    """The summary's plain lines (backend/text/feeds_text.py summary_lines), as the page shows them."""
    return feeds_text.summary_lines(s)
