"""A run's annotations file as stored: `runs/<run_id>/annotations.json` (tags, notes, the pinned-baseline flag).

The store's reading side of it: the file name, the record, the checks a stored value must pass, and `read_path`
(what the catalog's refresh indexes). Writing, pinning and the read-only switch are backend/annotations.py's.

    tags    up to MAX_TAGS short words of letters, digits and `-_.` (no spaces, commas or quotes)
    notes   free text up to MAX_NOTES characters (no NUL)
    pinned  this bench run is *the* baseline of its target model
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from backend.errors import SpecLensError

FILE = "annotations.json"
MAX_TAGS = 20
MAX_TAG_LEN = 40
MAX_NOTES = 4000
_TAG = re.compile(rf"^[A-Za-z0-9._-]{{1,{MAX_TAG_LEN}}}$")


@dataclass
class Annotations:
    tags: list[str] = field(default_factory=list)
    notes: str = ""
    pinned: bool = False
    updated: str | None = None


def parse_tags(text: str | Iterable[str]) -> list[str]:
    """'a, b c' or ['a', 'b'] -> ['a', 'b', 'c'] (comma or space separated, duplicates dropped, order kept).
    Raises SpecLensError naming every tag that is not a short word of letters, digits and -_."""
    items = re.split(r"[,\s]+", text) if isinstance(text, str) else [str(t) for t in text]
    tags = list(dict.fromkeys(t.strip() for t in items if t and t.strip()))
    bad = [t for t in tags if not _TAG.match(t)]
    if bad:
        shown = ", ".join(repr(t[:60]) for t in bad[:3])
        raise SpecLensError(f"tag {shown} not allowed: a tag is 1-{MAX_TAG_LEN} letters, digits, '-', '_' or '.' "
                            "(separate tags with commas)")
    if len(tags) > MAX_TAGS:
        raise SpecLensError(f"{len(tags)} tags: at most {MAX_TAGS} per run")
    return tags


def check_notes(notes: str) -> str:
    if not isinstance(notes, str):
        raise SpecLensError(f"notes must be text, not {type(notes).__name__}")
    if "\x00" in notes:
        raise SpecLensError("notes contain a NUL character; remove it")
    if len(notes) > MAX_NOTES:
        raise SpecLensError(f"notes are {len(notes)} characters long: at most {MAX_NOTES}")
    return notes


def read_path(run_path: Path) -> Annotations | None:
    """A run directory's annotations, or None when it has none or the file is unreadable (never raises:
    the catalog falls back to the manifest's tags and notes)."""
    f = Path(run_path) / FILE
    try:
        d = json.loads(f.read_text())
        return Annotations(tags=parse_tags(d.get("tags") or []), notes=check_notes(str(d.get("notes") or "")),
                           pinned=bool(d.get("pinned", False)), updated=d.get("updated"))
    except (OSError, ValueError, SpecLensError, AttributeError, TypeError, RecursionError):
        return None
