"""The one place where a run that stops fails: `with RunGuard(rd, root, ...):` around the work of a run.

Any exception inside fails the run with a one-line reason and refreshes the catalog, so a run that died never
looks complete and the dashboard shows why at once; what was computed is saved first (`save`, e.g. a
checkpoint) where that makes a resume possible. The exception goes on up unchanged, except:

- KeyboardInterrupt: the reason is `interrupted()` (how far it got, how to resume); with `keep_interrupt` the
  interrupt stops here (`guard.interrupted` is then True), for code that reports a stopped run as a result;
- SpecLensError: the reason is its text (already one line naming the file and the fix), plus `note()` when given
  (e.g. the tail of a dead server's log), re-raised with that note;
- anything else: `describe(e)` (default "Type: first line"), re-raised as `wrap(e)` when given (an engine's
  error in SpecLens's one-line form).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from backend.errors import SpecLensError
from backend.store.rundir import RunDir


def one_line(e: BaseException) -> str:
    """'Type: first line of the message'."""
    first = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {first}"


class RunGuard:
    def __init__(self, rd: RunDir, root: Path | None = None, *,
                 interrupted: Callable[[], str] | None = None,
                 save: Callable[[], None] | None = None, save_on_error: bool = True,
                 describe: Callable[[BaseException], str] | None = None,
                 wrap: Callable[[BaseException], BaseException] | None = None,
                 note: Callable[[], str] | None = None,
                 keep_interrupt: bool = False):
        self.rd, self.root = rd, root
        self._interrupted, self.save, self.save_on_error = interrupted, save, save_on_error
        self.describe, self.wrap, self.note, self.keep_interrupt = describe, wrap, note, keep_interrupt
        self.interrupted = False

    def __enter__(self) -> "RunGuard":
        return self

    def __exit__(self, et, e, tb) -> bool:
        if e is None:
            return False
        from backend.store import catalog

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
        self.rd.fail(reason)
        catalog.refresh(self.root)
        if self.interrupted and self.keep_interrupt:
            return True
        if new is not None:
            raise new from (None if isinstance(e, SpecLensError) else e)
        return False
