"""Engine servers die with the command that started them (backend/engines/lifeline.py).

Seen on the lent GPU node (docs/RELIABILITY.md): an SGLang server started by `capture --engine sglang` runs in
a session of its own, so a kill -9 of the command's process group does not reach it. Here a real command
process starts a real ServerProcess (a `sleep` stands in for the server binary), is SIGKILLed, and the server
must be gone; the control shows that without the lifeline the same child outlives its parent.

Also seen there (vLLM 0.24, 2026-12-06): `vllm serve`'s EngineCore, a child of the server without
PR_SET_PDEATHSIG, outlived its API server after a kill -9 of the command. A small Python "server" that starts such
a grandchild stands in for it: with the reaper both are gone after the kill; the control, started with only the
PR_SET_PDEATHSIG lifeline, leaves the grandchild alive. The normal stop() path releases the reaper, which then
exits without killing anything.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend.engines.lifeline import REAPED, RELEASED, start_reaper
from backend.engines.server_process import ServerProcess

REPO = Path(__file__).resolve().parents[1]

PARENT = """
import subprocess, sys, time
from pathlib import Path
from backend.engines.lifeline import die_with_parent_in_new_session
from backend.engines.server_process import ServerProcess
mode, log = sys.argv[1], Path(sys.argv[2])
if mode == "server":
    p = ServerProcess(["sleep", "120"], log, "test", "127.0.0.1", 9).proc
elif mode == "plain":
    p = subprocess.Popen(["sleep", "120"], start_new_session=True)
else:   # a server with a child of its own, started with the reaper ("tree") or with only PR_SET_PDEATHSIG
    argv = [sys.executable, "-c", sys.argv[3], str(log.with_suffix(".pid"))]
    if mode == "tree":
        p = ServerProcess(argv, log, "test", "127.0.0.1", 9).proc
    else:
        p = subprocess.Popen(argv, preexec_fn=die_with_parent_in_new_session)
    end = time.time() + 10
    while not log.with_suffix(".pid").exists() and time.time() < end:
        time.sleep(0.02)
    print(p.pid, log.with_suffix(".pid").read_text(), flush=True)
    time.sleep(120)
print(p.pid, flush=True)
time.sleep(120)
"""

# A server (stand-in for `vllm serve`) that starts a child of its own (its EngineCore: same process group, no
# PR_SET_PDEATHSIG), writes the child's pid to argv[1], and sleeps; on SIGTERM it waits for the child and exits.
TREE = """
import os, signal, subprocess, sys, time
c = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
signal.signal(signal.SIGTERM, lambda *a: (c.wait(), sys.exit(0)))
open(sys.argv[1] + ".tmp", "w").write(str(c.pid))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
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


def _wait_gone(pids: list[int], seconds: float = 5.0) -> None:
    end = time.time() + seconds
    while any(_alive(p) for p in pids) and time.time() < end:
        time.sleep(0.05)


def _kill_command(mode: str, tmp_path: Path) -> list[int]:
    """Start a command process (PARENT) in `mode`, SIGKILL its process group once its server is up, and return the
    server's pid (and its child's, for the tree modes) after up to 5 s for them to go."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode, str(tmp_path / "server.log"), TREE], cwd=REPO,
                              stdout=subprocess.PIPE, text=True, start_new_session=True,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert pids and all(_alive(p) for p in pids)
    os.killpg(parent.pid, signal.SIGKILL)     # kill -9 of the command's process group
    parent.wait(10)
    parent.stdout.close()
    _wait_gone(pids)
    return pids


def _child_after_parent_kill(mode: str, tmp_path: Path) -> tuple[int, bool]:
    (child,) = _kill_command(mode, tmp_path)
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_the_reaper_kills_the_servers_children_when_the_command_is_killed(tmp_path):
    server, grandchild = _kill_command("tree", tmp_path)
    try:
        assert not _alive(server), f"server {server} outlived the SIGKILLed command"
        assert not _alive(grandchild), f"the server's child {grandchild} outlived the SIGKILLed command"
    finally:
        if _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_control_without_the_reaper_the_servers_child_outlives_the_kill(tmp_path):
    server, grandchild = _kill_command("lifeline-only", tmp_path)
    try:
        assert not _alive(server), "PR_SET_PDEATHSIG did not kill the server itself"
        assert _alive(grandchild), "the server's child died without the reaper: the test above would prove nothing"
    finally:
        if _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def _fds(pid: int) -> dict[str, str]:
    d = Path(f"/proc/{pid}/fd")
    return {fd.name: os.readlink(fd) for fd in d.iterdir()}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_stop_releases_the_reaper_and_no_other_process_holds_its_pipe(tmp_path):
    servers, grandchildren = [], []
    try:
        for i in range(2):      # a second server (and its reaper) must not inherit the first reaper's pipe
            pid_file = tmp_path / f"server{i}.pid"
            servers.append(ServerProcess([sys.executable, "-c", TREE, str(pid_file)], tmp_path / f"server{i}.log",
                                         "test", "127.0.0.1", 9))
            end = time.time() + 10
            while not pid_file.exists() and time.time() < end:
                time.sleep(0.02)
            grandchildren.append(int(pid_file.read_text()))
        reapers = [s._reaper for s in servers]
        assert all(r is not None and r.proc.poll() is None for r in reapers), "no reaper is watching a server"
        for r in reapers:
            assert os.getsid(r.proc.pid) == r.proc.pid != os.getsid(0), "a reaper is not in a session of its own"
            assert set(_fds(r.proc.pid)) == {"0", "1", "2"}, "a reaper holds more than its stdin, stdout and stderr"
        first_pipe = os.readlink(f"/proc/self/fd/{reapers[0].proc.stdin.fileno()}")
        others = [servers[1].proc.pid, grandchildren[1], reapers[1].proc.pid]
        assert not [p for p in others if first_pipe in _fds(p).values()], "another process holds the reaper's pipe"
    finally:
        t0 = time.time()
        for s in servers:
            s.stop()
    assert time.time() - t0 < 5
    for s, r in zip(servers, reapers):
        assert r.proc.returncode == RELEASED, f"a reaper exited with {r.proc.returncode}, not released"
        assert s._reaper is None
        assert not _alive(s.proc.pid)
    assert not any(_alive(g) for g in grandchildren)
    servers[0].stop()     # a second stop is harmless


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups are POSIX; tested on Linux")
def test_a_released_reaper_kills_nothing_and_an_unreleased_one_kills_the_group():
    kept = subprocess.Popen(["sleep", "120"], start_new_session=True)
    doomed = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        released = start_reaper(kept.pid)
        released.release()
        assert released.proc.returncode == RELEASED
        orphaned = start_reaper(doomed.pid, linger=1.0)
        orphaned.proc.stdin.close()               # what the kernel does when this process dies
        assert doomed.wait(5) == -signal.SIGKILL
        assert orphaned.proc.wait(5) == REAPED
        time.sleep(0.2)
        assert kept.poll() is None, "the released reaper killed its group"
    finally:
        for p in (kept, doomed):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_server_that_fails_to_start_says_its_own_last_error(tmp_path):
    """A server that exits while starting is reported by its last exception line, not its log's last lines: SGLang
    0.5.15's log when mem-fraction-static is too small (RECORDED on the lent GPU node, an H100 80GB, 2026-12-06,
    gpu/fault_suite.py sglang-oom), replayed by a real process that prints it and exits."""
    from backend.errors import SpecLensError

    rec = Path(__file__).parent / "data" / "recorded" / "sglang_start" / "server_mem_fraction_0.001.log"
    code = f"import sys; sys.stdout.write(open({str(rec)!r}).read()); sys.stdout.flush(); sys.exit(1)"
    sp = ServerProcess([sys.executable, "-c", code], tmp_path / "server.log", "SGLang", "127.0.0.1", 1)
    with pytest.raises(SpecLensError) as e:
        sp.wait_healthy(30)
    msg = str(e.value)
    assert "\n" not in msg
    assert "SGLang server exited with code 1 while starting: ValueError: Loaded weights leave no GPU memory for the " \
           "KV cache under --mem-fraction-static=0.001. Raise --mem-fraction-static above 0.002" in msg
    assert "^^^" not in msg and "kill_process_tree" not in msg
    assert str(tmp_path / "server.log") in msg
