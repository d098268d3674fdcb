"""Run directories: the source of truth. `data/runs/<run_id>/` holds a manifest and its tables.

Every file is written to a temporary name and renamed into place, and the manifest's
status becomes "complete" last, so a reader never sees half a file and a run that died never
looks complete. See docs/SCHEMA.md for the files and their columns.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backend.config import REPO_ROOT, Paths
from backend.errors import SpecLensError
from backend.runs.manifest import StoredManifest

if TYPE_CHECKING:                      # pandas only where a table is written: `check-drafter --lint-only` stays fast
    import pandas as pd

RUNNING, COMPLETE, FAILED, INTERRUPTED = "running", "complete", "failed", "interrupted"
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def valid_run_id(run_id: str) -> bool:
    return bool(_RUN_ID.match(run_id)) and ".." not in run_id


def new_run_id(kind: str, name: str | None) -> str:
    if name:
        if not valid_run_id(name):
            raise SpecLensError(f"--name '{name}' is not a valid run name; use letters, digits, '.', '_' or '-'")
        return name
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{kind}-{stamp}-{os.getpid() % 10000:04d}"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())


def read_journal(path: Path) -> list[dict]:
    """The whole lines of an append-only JSONL journal (a run's finished units); a torn last line (the process died
    mid-write) and anything after it are dropped; [] when there is no journal yet."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def atomic_write_parquet(path: Path, df: pd.DataFrame) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    df.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def atomic_save_safetensors(path: Path, tensors: dict, metadata: dict[str, str] | None = None) -> None:
    from safetensors.torch import save_file

    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    os.replace(tmp, path)


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs. A zombie (dead, not yet reaped: a killed worker's child reparented to
    a PID 1 that does not reap, as in a container without an init) counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


@dataclass
class RunDir:
    """One run directory. Create with `DataRoot.new_run_dir` or open with `DataRoot.run_dir`
    (backend/store/data_root.py)."""

    path: Path

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def manifest_path(self) -> Path:
        return self.path / "manifest.json"

    # ------------------------------------------------------------------ open / create
    @classmethod
    def create(cls, run_id: str, manifest: dict, where: Paths) -> RunDir:
        """A new run directory under `where` (a data root's paths: DataRoot.new_run_dir)."""
        p = where.runs / run_id
        if (p / "manifest.json").exists():
            raise SpecLensError(f"run '{run_id}' already exists in {p.parent}; pick another --name")
        p.mkdir(parents=True, exist_ok=True)
        rd = cls(p)
        base = {
            "run_id": run_id, "status": RUNNING, "created": now(), "updated": now(),
            "host": socket.gethostname(), "pid": os.getpid(), "git_commit": git_commit(),
            "schema_version": 1, "error": None,
        }
        base.update(manifest)
        base["run_id"], base["status"] = run_id, RUNNING
        rd.write_manifest(base)
        return rd

    @classmethod
    def open(cls, run_id: str, where: Paths) -> RunDir:
        """An existing run directory under `where` (a data root's paths: DataRoot.run_dir)."""
        if not valid_run_id(run_id):
            raise SpecLensError(f"'{run_id}' is not a valid run id; list runs with `python -m backend runs`")
        p = where.runs / run_id
        if not (p / "manifest.json").exists():
            raise SpecLensError(f"no run '{run_id}' under {p.parent}; list runs with `python -m backend runs`")
        return cls(p)

    # ------------------------------------------------------------------ manifest
    def read(self) -> StoredManifest:
        """The manifest, typed (backend/runs/manifest.py): what every reader reads. A manifest of the wrong shape
        raises SpecLensError with the one-line reason naming the key."""
        raw = self.manifest()
        try:
            return StoredManifest.parse(raw)
        except SpecLensError as e:
            raise SpecLensError(f"{self.manifest_path}: {e}; remove the run directory or restore the file") from None

    def manifest(self) -> dict:
        """The manifest.json as a plain dict, for a writer's read-modify-write (`update`, backend/runs/lifecycle.py)
        and the catalog's check of what it indexes; readers use `read()`."""
        try:
            return json.loads(self.manifest_path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SpecLensError(f"{self.manifest_path}: unreadable manifest ({e}); remove the run directory "
                                f"or restore the file") from e

    def write_manifest(self, m: dict) -> None:
        m["updated"] = now()
        atomic_write_json(self.manifest_path, m)

    def update(self, **fields: Any) -> dict:
        """Rewrite manifest fields as they are (a file operation: no re-index). A run's state changes go through
        backend.runs.lifecycle.Run, which also re-indexes the catalog."""
        m = self.manifest()
        m.update(fields)
        self.write_manifest(m)
        return m

    def effective_status(self, m: StoredManifest | None = None) -> str:
        """running -> interrupted when the writing process is gone (same host)."""
        m = m if m is not None else self.read()
        st = m.status or FAILED
        if st == RUNNING and m.host == socket.gethostname():
            if not isinstance(m.pid, int) or not _pid_alive(m.pid):
                return INTERRUPTED
        return st

    def file(self, name: str) -> Path:
        return self.path / name


def list_run_dirs(where: Paths) -> list[RunDir]:
    runs = where.runs
    if not runs.exists():
        return []
    return [RunDir(p) for p in sorted(runs.iterdir()) if (p / "manifest.json").exists()]
