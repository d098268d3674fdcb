"""Child processes that die with the process that started them.

An engine server (SGLang's `launch_server`, `vllm serve`) runs in a session of its own so that stopping it can
tear its whole process group down. That also means a SIGKILL of the SpecLens command (kill -9, an OOM killer,
a cancelled job's process group) never reaches it: on the lent GPU node an SGLang server was seen in its own
session beside the capture that started it (docs/RELIABILITY.md, "GPU kill -9 trials"), holding its GPU memory
after the command was gone. `die_with_parent` asks Linux (prctl PR_SET_PDEATHSIG) to SIGKILL the child when
its parent dies. SGLang 0.5.15's scheduler and detokenizer processes die with the launcher (they call
`kill_itself_when_parent_died`, sglang/srt/utils/common.py), so the whole SGLang tree goes; vLLM 0.24's
multiprocess workers watch a death pipe to their parent (v1/executor/multiproc_executor.py); whether every process
of `vllm serve` follows its API server has not been checked on the GPU.

The signal fires when the *thread* that started the child ends: start servers from the main thread (every
SpecLens command does; the dashboard starts none).
"""

from __future__ import annotations

import ctypes
import os
import signal

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
