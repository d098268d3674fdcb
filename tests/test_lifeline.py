"""Engine servers die with the command that started them (backend/engines/lifeline.py).

Seen on the lent GPU node (docs/RELIABILITY.md): an SGLang server started by `capture --engine sglang` runs in
a session of its own, so a kill -9 of the command's process group does not reach it. Here a real command
process starts a real ServerProcess (a `sleep` stands in for the server binary), is SIGKILLed, and the server
must be gone; the control shows that without the lifeline the same child outlives its parent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

PARENT = """
import subprocess, sys, time
from pathlib import Path
from backend.engines.server_process import ServerProcess
if sys.argv[1] == "server":
    p = ServerProcess(["sleep", "120"], Path(sys.argv[2]), "test", "127.0.0.1", 9).proc
else:
    p = subprocess.Popen(["sleep", "120"], start_new_session=True)
print(p.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a zombie of a reaped-later child counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _child_after_parent_kill(mode: str, tmp_path: Path) -> tuple[int, bool]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode, str(tmp_path / "server.log")], cwd=REPO,
                              stdout=subprocess.PIPE, text=True, start_new_session=True,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    child = int(parent.stdout.readline())
    assert _alive(child)
    os.killpg(parent.pid, signal.SIGKILL)     # kill -9 of the command's process group
    parent.wait(10)
    end = time.time() + 5
    while _alive(child) and time.time() < end:
        time.sleep(0.05)
    return child, _alive(child)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_a_server_dies_with_the_command_that_started_it(tmp_path):
    child, alive = _child_after_parent_kill("server", tmp_path)
    assert not alive, f"server {child} outlived the SIGKILLed command"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_control_a_child_in_its_own_session_without_the_lifeline_outlives_the_kill(tmp_path):
    child, alive = _child_after_parent_kill("plain", tmp_path)
    try:
        assert alive, "the control child died too: the test above would prove nothing"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
