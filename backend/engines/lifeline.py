"""Child processes that die with the process that started them.

An engine server (SGLang's `launch_server`, `vllm serve`) runs in a session of its own so that stopping it can
tear its whole process group down. That also means a SIGKILL of the SpecLens command (kill -9, an OOM killer,
a cancelled job's process group) never reaches it: on the lent GPU node an SGLang server was seen in its own
session beside the capture that started it (docs/RELIABILITY.md, "GPU kill -9 trials"), holding its GPU memory
after the command was gone. `die_with_parent` asks Linux (prctl PR_SET_PDEATHSIG) to SIGKILL the child when
its parent dies. SGLang 0.5.15's scheduler and detokenizer processes die with the launcher (they call
`kill_itself_when_parent_died`, sglang/srt/utils/common.py), so the whole SGLang tree goes. PR_SET_PDEATHSIG is
not inherited by the server's own children, and vLLM 0.24's are not all covered: its `vllm serve` EngineCore
(`VLLM::EngineCore`) and a multiprocessing resource_tracker, in the server's process group, were SEEN (on the
lent GPU node, an NVIDIA H100 80GB, 2026-12-06, gpu/fault_suite.py vllm-load step) to outlive their API server
after a kill -9 of the command, holding 5.5 GB of GPU memory each until killed by hand. With the reaper below,
the same trial on the same node left no engine process and the GPU memory was free 0.55 s after the kill.

Hence `start_reaper`: a tiny standard-library Python process in a session of its own (so a kill of the command's
process group does not reach it) that blocks reading a pipe from the command. When the command dies, by any
means, SIGKILL included, the kernel closes the pipe's write end; the reaper reads EOF and SIGKILLs the server's
whole process group (repeatedly for a few seconds: children may linger). `Reaper.release()`, called once the
normal stop path has torn the group down, writes one byte: the reaper exits and kills nothing. The write end is
non-inheritable (Python's default) and later servers are started with close_fds, so no other child keeps the
pipe open; a child *forked* without exec (multiprocessing's fork start method) would, and would delay the reaper
until it exits too.

The signal fires when the *thread* that started the child ends: start servers from the main thread (every
SpecLens command does; the dashboard starts none).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when its parent dies (no-op where prctl is missing)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def die_with_parent_in_new_session() -> None:
    """preexec_fn for servers: a session (and process group) of its own, yet dead with its parent."""
    os.setsid()
    die_with_parent()


# Run as `python -I -S -c REAPER_CODE PGID LINGER`: standard library only, no site-packages, no backend imports.
REAPER_CODE = """
import os, signal, sys, time
pgid = int(sys.argv[1])
try:
    released = os.read(0, 1)
except OSError:
    released = b""
if released:
    sys.exit(0)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        break
    time.sleep(0.1)
sys.exit(3)
"""

RELEASED, REAPED = 0, 3          # the reaper's exit codes
LINGER_S = 5.0                   # how long an unreleased reaper goes on signalling its group


class Reaper:
    """A started reaper for process group `pgid` (see the module docstring); `release()` when the group is gone."""

    def __init__(self, pgid: int, linger: float = LINGER_S):
        self.pgid = pgid
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", REAPER_CODE, str(pgid), str(linger)],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     cwd="/", start_new_session=True, close_fds=True)

    def release(self, timeout: float = 2.0) -> None:
        """Tell the reaper to exit without killing anything; idempotent."""
        stdin, self.proc.stdin = self.proc.stdin, None
        if stdin is not None:
            try:
                stdin.write(b"x")
                stdin.flush()
            except OSError:            # it is gone already (killed by someone): nothing to release
                pass
            try:
                stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_reaper(pgid: int, linger: float = LINGER_S) -> Reaper:
    """A reaper that SIGKILLs process group `pgid` when this process dies (for `linger` seconds, until the group is
    empty), unless released first. Raises OSError when the reaper cannot be started."""
    return Reaper(pgid, linger)
