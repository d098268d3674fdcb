"""One data root: where SpecLens keeps its files ($SPECLENS_DATA, default <repo>/data) as one object.

`DataRoot(path)` (None: $SPECLENS_DATA, backend.config.data_root) resolves the path once and owns what lies under
it: `paths` (runs/, alignments/, models/, queue/, the catalog file: backend.config.Paths), the run directories
(`run_dir`, `new_run_dir`, `run_dirs`) and one catalog, built once (`data.catalog.read`, `data.catalog.write`).
Everything under backend/ that works on a data root takes `data: DataRoot | None = None` (None: the default root,
looked up when called) and passes it on; only this constructor and the command-line entry points turn a path
into one (docs/ARCHITECTURE.md, checked by tests/test_architecture.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from backend.config import Paths, paths
from backend.runs.manifest import StoredManifest
from backend.store.rundir import RunDir, list_run_dirs

if TYPE_CHECKING:  # the catalog (duckdb) is imported where it is first used: holding a data root stays cheap
    from backend.store.catalog import Catalog


class DataRoot:
    """A data root: its paths, its run directories and its catalog."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.paths: Paths = paths(path)
        self._catalog: Catalog | None = None

    @classmethod
    def of(cls, data: DataRoot | None) -> DataRoot:
        """`data`, or the default data root ($SPECLENS_DATA) when None; a bare path is refused (wrap it in
        DataRoot(path) where it enters: a CLI or a worker)."""
        if data is None:
            return cls()
        if isinstance(data, DataRoot):
            return data
        raise TypeError(f"expected a DataRoot, got {type(data).__name__} {str(data)[:80]!r}: pass DataRoot(path)")

    # ------------------------------------------------------------------ what it owns

    @property
    def path(self) -> Path:
        return self.paths.root

    @property
    def runs(self) -> Path:
        return self.paths.runs

    @property
    def catalog(self) -> Catalog:
        """The catalog of this data root (one object, built on first use)."""
        if self._catalog is None:
            from backend.store.catalog import Catalog

            self._catalog = Catalog(self.paths)
        return self._catalog

    def run_dir(self, run_id: str) -> RunDir:
        """An existing run directory (the id is checked: no path outside runs/); SpecLensError when there is none."""
        return RunDir.open(run_id, self.paths)

    def new_run_dir(self, run_id: str, manifest: StoredManifest | dict) -> RunDir:
        """A new run directory with its first manifest (status running): the typed manifest a run is created with
        (backend/runs/manifest.py `Manifest`, written as its `to_json()`), or, for tests and tools that write a bare
        run, its keys; SpecLensError when the run exists."""
        fields = manifest.to_json() if isinstance(manifest, StoredManifest) else dict(manifest)
        return RunDir.create(run_id, fields, self.paths)

    def run_dirs(self) -> list[RunDir]:
        """Every run directory holding a manifest, by name."""
        return list_run_dirs(self.paths)

    # ------------------------------------------------------------------ identity

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DataRoot) and other.paths == self.paths

    def __hash__(self) -> int:
        return hash(self.paths)

    def __repr__(self) -> str:
        return f"DataRoot({str(self.path)!r})"
