"""The one owner of a run's life: `Run` (create, resume by identity, progress, checkpoint, fail, complete) and
`RunGuard`, the one place where a run that stops fails.

Every state change of a run goes through `Run._write`, which writes the manifest and re-indexes the catalog (that run
only: `CatalogWriter.refresh_runs`, whose cost does not grow with the catalog), so the dashboard sees a run the moment
it starts, fails or completes, and no producer (capture, bench, import, check) refreshes the catalog itself.
Progress re-indexes at most every `PROGRESS_REINDEX_S` seconds (a checkpoint always does).

`with RunGuard(run, ...):` around the work of a run: any exception inside fails the run with a one-line reason
(re-indexed), so a run that died never looks complete and the dashboard shows why at once; what was computed is
saved first (`save`, e.g. a checkpoint) where that makes a resume possible. The exception goes on up unchanged,
except:

- KeyboardInterrupt: the reason is `interrupted()` (how far it got, how to resume); with `keep_interrupt` the
  interrupt stops here (`guard.interrupted` is then True), for code that reports a stopped run as a result;
- SpecLensError: the reason is its text (already one line naming the file and the fix), plus `note()` when given
  (e.g. the tail of a dead server's log), re-raised with that note;
- anything else: `describe(e)` (default "Type: first line"), re-raised as `wrap(e)` when given (an engine's
  error in SpecLens's one-line form).
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from backend.errors import SpecLensError
from backend.runs.manifest import Manifest, StoredManifest
from backend.store.data_root import DataRoot
from backend.store.rundir import COMPLETE, FAILED, RUNNING, RunDir, now

PROGRESS_REINDEX_S = 10.0
_JOB: ContextVar[dict | None] = ContextVar("run_job_tag", default=None)


@contextmanager
def tagged_runs(job: dict) -> Iterator[None]:
    """Runs created inside this block (this thread/context) record `job` in their manifest (the job worker)."""
    token = _JOB.set(job)
    try:
        yield
    finally:
        _JOB.reset(token)


def one_line(e: BaseException) -> str:
    """'Type: first line of the message'."""
    first = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {first}"


class Run:
    """A run directory and the catalog that indexes it; the only writer of a run's state."""

    def __init__(self, rd: RunDir, data: DataRoot | None = None):
        self.rd = rd
        # the data root the run directory lies in (runs/<run_id>) when none is given
        self.data = data if data is not None else DataRoot(rd.path.parent.parent)
        self.catalog = self.data.catalog
        self._indexed = 0.0

    # ------------------------------------------------------------------ identity
    @classmethod
    def create(cls, run_id: str, manifest: Manifest | dict, data: DataRoot | None = None) -> Run:
        """A new run (status running), indexed at once; a malformed manifest is refused before anything is
        written; an existing run of that name raises SpecLensError (the caller may then resume it)."""
        if isinstance(manifest, dict):
            manifest = Manifest.of(manifest, run_id)
        if _JOB.get() is not None:
            manifest = manifest.with_job(_JOB.get())
        data = DataRoot.of(data)
        run = cls(data.new_run_dir(run_id, manifest), data)
        run._changed()
        return run

    @classmethod
    def open(cls, run_id: str, data: DataRoot | None = None) -> Run:
        data = DataRoot.of(data)
        return cls(data.run_dir(run_id), data)

    @staticmethod
    def remove(run_id: str, data: DataRoot | None = None) -> None:
        """Delete a run directory (to rebuild it) and drop it from the catalog."""
        data = DataRoot.of(data)
        p = data.runs / run_id
        if p.exists():
            shutil.rmtree(p, ignore_errors=True)
            data.catalog.write.refresh_runs([run_id])

    @property
    def run_id(self) -> str:
        return self.rd.run_id

    @property
    def path(self) -> Path:
        return self.rd.path

    @property
    def manifest_path(self) -> Path:
        return self.rd.manifest_path

    def file(self, name: str) -> Path:
        return self.rd.file(name)

    def read(self) -> StoredManifest:
        """The manifest, typed (what readers read: RunDir.read)."""
        return self.rd.read()

    def manifest(self) -> dict:
        """The manifest.json as a plain dict (RunDir.manifest)."""
        return self.rd.manifest()

    # ------------------------------------------------------------------ state changes (each re-indexes)
    def claim(self, **fields: Any) -> dict:
        """Resume: the run is running again, in this process."""
        return self._write(True, status=RUNNING, pid=os.getpid(), host=socket.gethostname(), error=None, **fields)

    def progress(self, done: int, total: int, checkpoint: bool = False) -> dict:
        """How far it got; re-indexed on a checkpoint, else at most every PROGRESS_REINDEX_S seconds."""
        due = checkpoint or time.monotonic() - self._indexed >= PROGRESS_REINDEX_S
        return self._write(due, progress={"done": done, "total": total})

    def record(self, **fields: Any) -> dict:
        """Facts about the run that change no state (what a server was started with, an engine's token count)."""
        return self._write(False, **fields)

    def complete(self, drop: tuple[str, ...] = (), **fields: Any) -> dict:
        """Mark the run complete, then delete its files named in `drop` (a checkpoint, a journal: only a resume
        reads them), then re-index: a kill between those steps leaves as little behind as it can."""
        m = self._write(False, status=COMPLETE, finished=now(), **fields)
        for name in drop:
            self.rd.file(name).unlink(missing_ok=True)
        self._changed()
        return m

    def fail(self, error: str) -> dict:
        return self._write(True, status=FAILED, error=error, finished=now())

    def _write(self, reindex: bool, **fields: Any) -> dict:
        m = self.rd.manifest()
        m.update(fields)
        self.rd.write_manifest(m)
        if reindex:
            self._changed()
        return m

    def _changed(self) -> None:
        self.catalog.write.refresh_runs([self.run_id])     # this run only: the cost does not grow with the catalog
        self._indexed = time.monotonic()


class RunGuard:
    def __init__(self, run: Run, *,
                 interrupted: Callable[[], str] | None = None,
                 save: Callable[[], None] | None = None, save_on_error: bool = True,
                 describe: Callable[[BaseException], str] | None = None,
                 wrap: Callable[[BaseException], BaseException] | None = None,
                 note: Callable[[], str] | None = None,
                 keep_interrupt: bool = False):
        self.run = run
        self._interrupted, self.save, self.save_on_error = interrupted, save, save_on_error
        self.describe, self.wrap, self.note, self.keep_interrupt = describe, wrap, note, keep_interrupt
        self.interrupted = False

    def __enter__(self) -> RunGuard:
        return self

    def __exit__(self, et, e, tb) -> bool:
        if e is None:
            return False
        new: BaseException | None = None
        if isinstance(e, KeyboardInterrupt):
            self.interrupted = True
            if self.save:
                self.save()
            reason = self._interrupted() if self._interrupted else "interrupted"
        elif isinstance(e, SpecLensError):
            reason = str(e) + (self.note() if self.note else "")
            if self.note:
                new = SpecLensError(reason)
        else:
            if self.save and self.save_on_error:
                self.save()
            reason = self.describe(e) if self.describe else one_line(e)
            new = self.wrap(e) if self.wrap else None
        self.run.fail(reason)
        if self.interrupted and self.keep_interrupt:
            return True
        if new is not None:
            raise new from (None if isinstance(e, SpecLensError) else e)
        return False
