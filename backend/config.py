"""Where SpecLens keeps its files and what it may change. SPECLENS_DATA (default ./data) moves everything;
SPECLENS_READONLY=1 makes the dashboard read-only (no annotation editing)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Paths:
    root: Path

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def catalog(self) -> Path:
        return self.root / "speclens.duckdb"

    @property
    def alignments(self) -> Path:
        return self.root / "alignments"

    @property
    def models(self) -> Path:
        return self.root / "models"


def data_root() -> Path:
    """The data root: $SPECLENS_DATA if set, else <repo>/data."""
    env = os.environ.get("SPECLENS_DATA")
    return Path(env).expanduser().resolve() if env else REPO_ROOT / "data"


def paths(root: Path | str | None = None) -> Paths:
    return Paths(Path(root).resolve() if root is not None else data_root())


def read_only() -> bool:
    """SPECLENS_READONLY=1 (or true/yes/on): the dashboard edits nothing. The one place this setting is read:
    backend/annotations.py refuses writes and the pages hide their edit widgets through it."""
    return os.environ.get("SPECLENS_READONLY", "").strip().lower() in ("1", "true", "yes", "on")
