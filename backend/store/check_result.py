"""A stored drafter check (run kind "check": manifest.json + check.json, docs/SCHEMA.md), read back without torch.

backend/check_drafter.py computes and writes it; reading it back is a file read of the run directory, so it lives in
the store, and the catalog's read side (`data.catalog.read.drafter_check`) hands it to pages."""

from __future__ import annotations

import json

from backend.config import Paths
from backend.errors import SpecLensError
from backend.store.rundir import COMPLETE, RunDir

RESULT = "check.json"


def load_check(run_id: str, where: Paths) -> dict:
    """The stored result of a complete check run (what the Drafter check page shows) under a data root's paths
    (`DataRoot.catalog.read.drafter_check`)."""
    rd = RunDir.open(run_id, where)
    m = rd.read()
    if m.kind != "check":
        raise SpecLensError(f"run '{run_id}' is a {m.kind} run, not a drafter check; pick a check run")
    if rd.effective_status(m) != COMPLETE:
        raise SpecLensError(f"check '{run_id}' is {rd.effective_status(m)}; "
                            f"run `python -m backend check-drafter` again")
    f = rd.file(RESULT)
    try:
        return json.loads(f.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SpecLensError(f"{f}: unreadable check result ({type(e).__name__}); run the check again") from None
