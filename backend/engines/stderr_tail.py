"""What an engine's child processes printed while it started, kept so that a failure can say why.

vLLM starts its engine core in a child process; when that child fails (the KV cache does not fit, CUDA out of
memory) the parent only raises "Engine core initialization failed. See root cause above": the cause is a line
the child wrote to the shared stderr. `StderrTail` passes fd 2 through a pipe for the duration of a `with`
block (children started inside inherit it), forwards every byte to the real stderr unchanged and keeps the
last `keep` bytes; `root_cause` finds the child's last exception line in them.

    with StderrTail() as tail:
        try:
            llm = LLM(...)
        except Exception as e:
            cause = root_cause(tail.text())    # "ValueError: To serve at least one request ..."

Children that outlive the block keep writing through the pipe; a daemon thread forwards their output until
they exit. Where fd 2 cannot be redirected, the block runs unchanged and `text()` is empty.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import deque

MARK = b"\x00speclens-stderr-tail-mark\x00"   # written by settle(): every byte before it has been read once it is seen
EXC_LINE = re.compile(r"\b((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)): (.+)$")
PREFIX = re.compile(r"^\((?:EngineCore|Worker|APIServer)[^)]*\)\s*"             # (EngineCore pid=10350)
                    r"(?:(?:ERROR|WARNING|INFO)\s+\S+\s+\S+\s+\[[^\]]*\]\s*)?")   # ERROR 12-05 08:00:01 [core.py:1231]


class StderrTail:
    def __init__(self, keep: int = 64 * 1024):
        self.keep = keep
        self._buf: deque[bytes] = deque()
        self._size = 0
        self._lock = threading.Lock()
        self._last = 0.0
        self._orig: int | None = None
        self._marked = threading.Event()

    def __enter__(self) -> StderrTail:
        try:
            r, w = os.pipe()
            self._orig = os.dup(2)
            os.dup2(w, 2)
            os.close(w)
        except OSError:
            self._orig = None
            return self
        threading.Thread(target=self._pump, args=(r, self._orig), daemon=True, name="stderr-tail").start()
        return self

    def _pump(self, r: int, out: int) -> None:
        while True:
            try:
                data = os.read(r, 65536)
            except OSError:
                break
            if not data:
                break
            marked = MARK in data       # (a mark split across two reads is forwarded as is; settle then times out)
            data = data.replace(MARK, b"") if marked else data
            try:
                os.write(out, data)
            except OSError:
                pass
            with self._lock:
                self._buf.append(data)
                self._size += len(data)
                while self._size > self.keep and len(self._buf) > 1:
                    self._size -= len(self._buf.popleft())
                self._last = time.monotonic()
            if marked:                  # only once what came before the mark is in the buffer
                self._marked.set()
        os.close(r)

    def __exit__(self, *exc) -> None:
        if self._orig is not None:
            os.dup2(self._orig, 2)      # our own fd 2 is the terminal/log again; children keep the pipe

    def settle(self, quiet_s: float = 0.2, at_most_s: float = 2.0) -> None:
        """Inside the block: wait until what was already written is read (a mark sent through the pipe comes back),
        then until nothing arrived for quiet_s (a failing child may still be writing its traceback)."""
        end = time.monotonic() + at_most_s
        if self._orig is not None:
            self._marked.clear()
            try:
                os.write(2, MARK)
                self._marked.wait(at_most_s)
            except OSError:
                pass
        since = time.monotonic()
        while time.monotonic() < end:
            with self._lock:
                idle = time.monotonic() - max(self._last, since)
            if idle >= quiet_s:
                return
            time.sleep(0.05)

    def text(self) -> str:
        with self._lock:
            return b"".join(self._buf).decode("utf-8", errors="replace")


def root_cause(text: str) -> str | None:
    """The last exception line ("ValueError: ...") in a child's output, without vLLM's process/log prefixes;
    the wrapper's own "Engine core initialization failed" is not a cause."""
    found = None
    for ln in text.splitlines():
        ln = PREFIX.sub("", ln.strip())
        m = EXC_LINE.search(ln)
        if m and "Engine core initialization failed" not in m.group(2):
            found = f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2).strip()}"
    return found
