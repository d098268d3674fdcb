"""Where SpecLens keeps its files. One setting moves everything: SPECLENS_DATA (default ./data)."""

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
