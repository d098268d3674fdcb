"""Read a JSON object (a config.json, a drafter config) with one-line errors that name the file and the fix."""

from __future__ import annotations

import json
from pathlib import Path

from backend.errors import SpecLensError


def read_object(f: Path, what: str, missing: str) -> dict:
    """The JSON object in file `f`; `missing` is the error text after 'FILE: ' when there is no such file."""
    if not f.is_file():
        raise SpecLensError(f"{f}: {missing}")
    try:
        d = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SpecLensError(f"{f}: {what} is not valid JSON ({first}); fix or re-save it") from e
    if not isinstance(d, dict):
        raise SpecLensError(f"{f}: {what} is not a JSON object; pass a config.json")
    return d
