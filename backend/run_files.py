"""A run directory's files as the run page lists them, read here so that pages and dashboard/ never open run
directories themselves: the files and their sizes, the tail of the run's log (or of its job's log), and the texts of
a bench run's prompts (from the prompts file its manifest recorded, when it is under an allowed root)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from backend.config import REPO_ROOT, model_roots
from backend.prompts import load_prompts
from backend.runs.manifest import PromptedSettings, StoredManifest
from backend.store.data_root import DataRoot
from backend.store.rundir import valid_run_id

LOG_TAIL_LINES = 40
PROMPT_FILE_MAX_BYTES = 64 << 20    # a prompts file larger than this is not read for the table's texts
LOG_TAIL_BYTES = 64 * 1024          # a log is read from its end: a 2 GB server log costs what a small one does
MAX_FILES = 200                     # files listed (a run directory holds a handful)


def files(run_dir: str | Path) -> pd.DataFrame:
    """The files of a run directory (and of its sub-folders, one level), names and sizes; links are listed, never
    followed."""
    out = []
    try:
        top = sorted(os.scandir(run_dir), key=lambda e: e.name)
    except OSError:
        return pd.DataFrame(columns=["file", "bytes", "size"])
    for e in top:
        if e.is_dir(follow_symlinks=False):
            try:
                inner = sorted(os.scandir(e.path), key=lambda x: x.name)
            except OSError:
                inner = []
            out += [(f"{e.name}/{x.name}", _size(x)) for x in inner if not x.is_dir(follow_symlinks=False)]
        else:
            out.append((e.name, _size(e)))
        if len(out) >= MAX_FILES:
            break
    df = pd.DataFrame(out[:MAX_FILES], columns=["file", "bytes"])
    return df.assign(size=[human_size(b) for b in df["bytes"]])


def _size(e: os.DirEntry) -> int | None:
    try:
        return e.stat(follow_symlinks=False).st_size
    except OSError:
        return None


def human_size(n: int | None) -> str:
    if n is None or n != n:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


@dataclass
class LogTail:
    path: str                      # relative to the data root
    lines: list[str]


def log_tail(run_dir: str | Path, manifest: dict | StoredManifest, data: DataRoot | None = None,
             n: int = LOG_TAIL_LINES) -> LogTail | None:
    """The last n lines of the run's log: a `*.log` file in its run directory (the newest), else the log of the job
    that made it (`queue/logs/<job id>.log`, backend/jobs); None when there is none."""
    d = Path(run_dir)
    try:
        logs = [e for e in os.scandir(d) if e.name.endswith(".log") and e.is_file(follow_symlinks=False)]
    except OSError:
        logs = []
    queue = DataRoot.of(data).paths.queue
    if logs:
        f = max(logs, key=lambda e: e.stat(follow_symlinks=False).st_mtime)
        path, shown = Path(f.path), f"runs/{d.name}/{f.name}"
    else:
        job = StoredManifest.indexed(manifest).job
        jid = (job.id if job is not None else None) or ""
        if not jid or not valid_run_id(jid):
            return None
        path, shown = queue / "logs" / f"{jid}.log", f"queue/logs/{jid}.log"
        if path.is_symlink() or not path.is_file():
            return None
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - LOG_TAIL_BYTES))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    lines = [ln.rstrip()[:500] for ln in text.splitlines() if ln.strip()]
    return LogTail(shown, lines[-n:])


# ---------------------------------------------------------------------------- per-prompt table (bench runs)

def prompt_texts(manifest: dict | StoredManifest, data: DataRoot | None = None) -> dict[str, str]:
    """prompt id -> its text, from the prompts file the bench read (`settings.prompts`, backend/prompts.py), for the
    per-prompt table; empty when the file is gone, unreadable, too large or outside the places job specs may read
    prompts from (config.model_roots of the run's data root `data` and <repo>/datasets: a manifest never makes the
    page show another file)."""
    path = StoredManifest.indexed(manifest).settings_as(PromptedSettings).prompts
    if not isinstance(path, str) or not path:
        return {}
    try:
        data = DataRoot.of(data)
        allowed = [r.resolve() for r in (*model_roots(data.paths), REPO_ROOT / "datasets")]
        f = _prompts_file(Path(path), allowed, data)
        if f is None or f.stat().st_size > PROMPT_FILE_MAX_BYTES:
            return {}
        return {p.id: p.text for p in load_prompts(f)}
    except Exception:  # noqa: BLE001 - a bad prompts file costs the texts, never the page
        return {}


def _prompts_file(recorded: Path, allowed: list[Path], data: DataRoot) -> Path | None:
    """The prompts file a bench read: its recorded path when that is a file under an allowed root, else (a data root
    moved or copied since) the same trailing path under the run's data root `data` (`models/toy-pair/heldout.jsonl`)."""
    tries = [recorded] + [data.path / Path(*recorded.parts[-k:]) for k in range(min(6, len(recorded.parts) - 1), 0, -1)]
    for t in tries:
        f = t.resolve()
        if any(f.is_relative_to(r) for r in allowed) and f.is_file():
            return f
    return None
