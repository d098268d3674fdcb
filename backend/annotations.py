"""User annotations of a run: tags, notes and the pinned-baseline flag.

They live in `runs/<run_id>/annotations.json`, the one mutable file of a run directory (the manifest and
result tables stay as the run wrote them), written atomically like every other file there and read by
the catalog's refresh (`data.catalog.write.refresh`) into the `runs` table (`tags`, `notes`, `pinned`). Input is
validated here with the stored form's checks (backend/store/annotations_file.py); values reach DuckDB only as bound
parameters or DataFrame cells, never as SQL text.

    tags    up to MAX_TAGS short words of letters, digits and `-_.` (no spaces, commas or quotes)
    notes   free text up to MAX_NOTES characters (no NUL)
    pinned  this bench run is *the* baseline of its target model: pinning one unpins the others of that target

SPECLENS_READONLY=1 (backend.config.writes_refused) refuses every write; the dashboard edits only when
SPECLENS_READONLY=0 (backend.config.read_only: read-only by default).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict

from backend.config import read_only, writes_refused
from backend.errors import SpecLensError
from backend.runs.manifest import StoredManifest
from backend.store.annotations_file import (  # noqa: F401 - the stored form, re-exported for callers
    FILE,
    MAX_NOTES,
    MAX_TAG_LEN,
    MAX_TAGS,
    Annotations,
    check_notes,
    parse_tags,
    read_path,
)
from backend.store.data_root import DataRoot
from backend.store.rundir import RunDir, atomic_write_json, now


def editable() -> bool:
    """Whether the dashboard may edit annotations: only when enabled with SPECLENS_READONLY=0 (read-only by
    default; backend.config.read_only)."""
    return not read_only()


# ---------------------------------------------------------------------- read / write


def read(run_id: str, data: DataRoot | None = None) -> Annotations:
    """The run's annotations; the manifest's own tags and notes when nothing was annotated yet."""
    rd = DataRoot.of(data).run_dir(run_id)
    ann = read_path(rd.path)
    if ann is not None:
        return ann
    m = rd.read()
    try:
        tags = parse_tags(m.tags or [])
    except SpecLensError:
        tags = []
    return Annotations(tags=tags, notes=(m.notes or "")[:MAX_NOTES])


def save(run_id: str, *, tags: str | Iterable[str] | None = None, notes: str | None = None,
         pinned: bool | None = None, data: DataRoot | None = None) -> Annotations:
    """Validate and write the given fields (others keep their value). Pinning a bench run unpins every other
    run pinned for the same target model. Refreshing the catalog is the caller's job."""
    if writes_refused():
        raise SpecLensError("the dashboard is read-only (SPECLENS_READONLY is set); annotations cannot be changed")
    data = DataRoot.of(data)
    rd = data.run_dir(run_id)                          # validates the id: no path outside the runs folder
    ann = read(run_id, data)
    if tags is not None:
        ann.tags = parse_tags(tags)
    if notes is not None:
        ann.notes = check_notes(notes)
    if pinned is not None:
        m = rd.read()
        if pinned and m.kind != "bench":
            raise SpecLensError(f"run '{run_id}' is a {m.kind} run; only bench runs can be a pinned baseline")
        if pinned and m.status != "complete":
            raise SpecLensError(f"run '{run_id}' is {m.status}; only a complete bench run can be pinned")
        if pinned:
            for other in pinned_for_target(_target(m), data):
                if other != run_id:
                    _write(data.run_dir(other), {**asdict(read(other, data)), "pinned": False})
        ann.pinned = bool(pinned)
    _write(rd, asdict(ann))
    return read(run_id, data)


def _write(rd: RunDir, d: dict) -> None:
    d["updated"] = now()
    atomic_write_json(rd.file(FILE), d)


def _target(m: StoredManifest) -> str | None:
    return m.model.path if m.model is not None else None


def pinned_for_target(target: str | None, data: DataRoot | None = None) -> list[str]:
    """Run ids pinned as the baseline of this target model path (normally one at most)."""
    out = []
    for rd in DataRoot.of(data).run_dirs():
        ann = read_path(rd.path) if rd.file(FILE).exists() else None
        if ann is None or not ann.pinned:
            continue
        try:
            if _target(rd.read()) == target:
                out.append(rd.run_id)
        except SpecLensError:
            continue
    return out
