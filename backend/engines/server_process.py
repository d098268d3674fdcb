"""OpenAI-compatible servers that SpecLens starts for serving-load benches: `vllm serve` and SGLang's
`launch_server`, each in its own process group (always torn down with it), started together and waited for
together so that a sweep of several drafter configurations pays one start-up, not one per configuration.

    specs = [vllm_spec(target, None), vllm_spec(target, drafter, k=4)]
    with ServerGroup(specs, log_dir) as servers:       # every server healthy, or a one-line error with a log tail
        servers[1].url                                  # http://127.0.0.1:PORT

vLLM's speculative options use its own vocabulary (`--speculative-config` JSON: method, model,
num_speculative_tokens, rejection_sample_method / synthetic_acceptance_length); SGLang's its flags
(--speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens, --enable-metrics).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from backend.engines.lifeline import Reaper, die_with_parent_in_new_session, start_reaper
from backend.engines.stderr_tail import root_cause
from backend.errors import SpecLensError
from backend.netutil import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ServerSpec:
    """One server to start. `label` names it in messages and log files (e.g. "vllm K=4")."""

    engine: str                                   # "vllm" | "sglang"
    label: str
    argv_tail: list[str]                          # everything after the executable and the port flags
    host: str = "127.0.0.1"
    env: dict = field(default_factory=dict)

    def argv(self, port: int) -> list[str]:
        if self.engine == "vllm":
            return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *self.argv_tail, "--host", self.host,
                    "--port", str(port)]
        return [sys.executable, "-m", "sglang.launch_server", *self.argv_tail, "--host", self.host, "--port", str(port)]


def _flags(options: dict | None) -> list[str]:
    out: list[str] = []
    for k, v in (options or {}).items():
        if v is None or v is False:
            continue
        k = k.replace("_", "-")
        out += [f"--{k}"] if v is True else [f"--{k}", json.dumps(v) if isinstance(v, (dict, list)) else str(v)]
    return out


def vllm_spec(target: str, drafter: str | None, k: int = 0, synthetic_tau: float | None = None,
              dtype: str = "bfloat16", gpu_memory_utilization: float = 0.2, options: dict | None = None) -> ServerSpec:
    """`vllm serve TARGET [--speculative-config {...}]`; a synthetic acceptance length makes vLLM accept draft tokens
    at that mean (rejection_sample_method "synthetic", vLLM 0.22+), whatever the drafter proposes."""
    tail = [target, "--dtype", dtype, "--gpu-memory-utilization", str(gpu_memory_utilization),
            "--no-enable-prefix-caching"]
    label = "vllm baseline"
    if drafter:
        sc: dict = {"method": "eagle3", "model": drafter, "num_speculative_tokens": k}
        label = f"vllm K={k}"
        if synthetic_tau is not None:
            sc.update(rejection_sample_method="synthetic", synthetic_acceptance_length=float(synthetic_tau))
            label += f" tau*={synthetic_tau:g}"
        tail += ["--speculative-config", json.dumps(sc)]
    tail += _flags(options)
    return ServerSpec("vllm", label, tail, env={"VLLM_USE_FLASHINFER_SAMPLER": "0"})


def sglang_spec(target: str, drafter: str | None, k: int = 0, topk: int = 1, draft_tokens: int | None = None,
                synthetic_tau: float | None = None, dtype: str = "bfloat16", mem_fraction: float = 0.2,
                options: dict | None = None) -> ServerSpec:
    """SGLang's launch_server with metrics on; a chain (topk 1, K+1 draft tokens) unless topk/draft_tokens say
    otherwise; a synthetic acceptance length through SGLang's SGLANG_SIMULATE_ACC_LEN switch."""
    tail = ["--model-path", target, "--dtype", dtype, "--mem-fraction-static", str(mem_fraction),
            "--enable-metrics", "--disable-radix-cache", "--sampling-backend", "pytorch", "--skip-tokenizer-init"]
    label, env = "sglang baseline", {}
    if drafter:
        n_draft = draft_tokens or (k + 1 if topk == 1 else 8)
        tail += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", drafter,
                 "--speculative-num-steps", str(k), "--speculative-eagle-topk", str(topk),
                 "--speculative-num-draft-tokens", str(n_draft)]
        label = f"sglang K={k}" + (f" topk={topk} draft={n_draft}" if topk != 1 else "")
        if synthetic_tau is not None:
            env["SGLANG_SIMULATE_ACC_LEN"] = str(float(synthetic_tau))
            label += f" tau*={synthetic_tau:g}"
    tail += _flags(options)
    return ServerSpec("sglang", label, tail, env=env)


_LIVE: list[ServerProcess] = []      # every server started here and not stopped yet (stopped at exit)


def log_tail(path: Path | str, n: int = 6, sep: str = " | ") -> str:
    """The last n non-empty lines of a server log, each cut to 200 characters."""
    try:
        lines = [ln for ln in Path(path).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return sep.join(ln.strip()[:200] for ln in lines[-n:])


class ServerProcess:
    """One server process (`vllm serve`, SGLang's launch_server) in its own process group, SIGKILLed by the kernel
    if the command that started it dies, and its whole group SIGKILLed then by a reaper process (vLLM's EngineCore
    outlived its API server without it; backend/engines/lifeline.py): started with the
    repository on its PYTHONPATH (the hooks it may load live here) and its output in `log`; `healthy()` polls
    `/health`; `stop()` always tears the whole group down (SIGTERM, then SIGKILL, then waits until it is gone: the
    engine cores and schedulers hold the GPU until then). `label` names it in messages ("SGLang", "vllm K=4")."""

    tail_lines = 4

    def __init__(self, argv: list[str], log: Path, label: str, host: str, port: int, env: dict | None = None):
        self.label, self.log, self.port = label, log, port
        self.url = f"http://{host}:{port}"
        log.parent.mkdir(parents=True, exist_ok=True)
        full_env = dict(os.environ, **(env or {}))
        full_env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [
            p for p in full_env.get("PYTHONPATH", "").split(os.pathsep) if p])
        self._fh = open(log, "w")
        self.t0 = time.perf_counter()
        try:
            self.proc = subprocess.Popen(argv, stdout=self._fh, stderr=subprocess.STDOUT, env=full_env,
                                         preexec_fn=die_with_parent_in_new_session)
        except BaseException:
            self._fh.close()
            raise
        self._reaper: Reaper | None = None
        try:     # the server leads a session of its own: its process group id is its pid
            self._reaper = start_reaper(self.proc.pid)
        except OSError:     # the server still dies with this process (PR_SET_PDEATHSIG), only its children may not
            pass
        self.start_seconds: float | None = None
        _LIVE.append(self)

    def tail(self, n: int | None = None) -> str:
        return log_tail(self.log, n or self.tail_lines)

    def why(self) -> str:
        """The server's last exception line (e.g. SGLang's "ValueError: ... Raise --mem-fraction-static above
        0.002"), else its log's last lines."""
        try:
            with open(self.log, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 64 * 1024))
                cause = root_cause(fh.read().decode("utf-8", errors="replace"))
        except OSError:
            cause = None
        return cause[:400] if cause else self.tail()

    def healthy(self) -> bool:
        """Whether `/health` answers 200; a one-line error with the log's tail when the process has exited."""
        if self.proc.poll() is not None:
            raise SpecLensError(f"{self.label} server exited with code {self.proc.returncode} while starting: "
                                f"{self.why()} (log {self.log})")
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                ok = r.status == 200
        except (urllib.error.URLError, OSError):
            return False
        if ok and self.start_seconds is None:
            self.start_seconds = time.perf_counter() - self.t0
        return ok

    def wait_healthy(self, timeout: float) -> None:
        """Until healthy; stopped and a one-line error when it exits or `timeout` passes first."""
        try:
            deadline = time.time() + timeout
            while not self.healthy():
                if time.time() > deadline:
                    raise SpecLensError(f"{self.label} server did not become healthy within {timeout:.0f} s "
                                        f"(log {self.log}): {self.tail()}")
                time.sleep(1.0)
        except BaseException:
            self.stop()
            raise

    def alive(self) -> bool:
        return self.proc.poll() is None

    def death_note(self) -> str:
        """' (the server exited with code C; log L: tail)' when the server process is gone, else ''."""
        if self.alive():
            return ""
        return f" (the {self.label} server exited with code {self.proc.returncode}: {self.why()}; log {self.log})"

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        deadline = time.time() + 15                 # children (engine core, scheduler) may outlive the leader
        while time.time() < deadline:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.2)
        reaper, self._reaper = getattr(self, "_reaper", None), None
        if reaper is not None:       # the group is gone: the reaper exits without killing anything
            reaper.release()
        self._fh.close()
        if self in _LIVE:
            _LIVE.remove(self)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_all() -> None:
    for s in list(_LIVE):
        try:
            s.stop()
        except Exception:     # noqa: BLE001 - the others must still be stopped
            pass


atexit.register(stop_all)


class Server(ServerProcess):
    """A server of a ServerGroup: a free port, its spec's command line and environment; `url` once healthy."""

    def __init__(self, spec: ServerSpec, log: Path):
        self.spec = spec
        port = free_port(spec.host)
        super().__init__(spec.argv(port), log, spec.label, spec.host, port, env=spec.env)


class ServerGroup:
    """Start every spec, wait until all are healthy (or fail with the first one's log tail), stop all on exit, also
    when the bench fails or is interrupted. `stagger` (the default) starts each server once the previous one is
    healthy: vLLM sizes its KV cache from the GPU memory it sees used while it profiles, so servers that start at the
    same moment count each other's memory as their own ("No available memory for the cache blocks", seen on the
    H200 with five toy servers at 3% each)."""

    def __init__(self, specs: list[ServerSpec], log_dir: Path, start_timeout: float | None = None,
                 stagger: bool = True):
        self.specs, self.log_dir, self.stagger = specs, log_dir, stagger
        self.timeout = start_timeout or float(os.environ.get("SPECLENS_SERVER_START_TIMEOUT") or 900)
        self.servers: list[Server] = []

    def __enter__(self) -> list[Server]:
        try:
            deadline = time.time() + self.timeout
            pending: list[Server] = []
            for i, s in enumerate(self.specs):
                name = "".join(c if c.isalnum() else "-" for c in s.label).strip("-")
                self.servers.append(Server(s, self.log_dir / f"server-{i:02d}-{name}.log"))
                pending.append(self.servers[-1])
                if self.stagger:
                    self._wait(pending, deadline)
                    pending = []
            self._wait(pending, deadline)
        except BaseException:
            self.__exit__()
            raise
        return self.servers

    def _wait(self, pending: list[Server], deadline: float) -> None:
        while pending:
            pending = [s for s in pending if not s.healthy()]
            if pending and time.time() > deadline:
                s = pending[0]
                raise SpecLensError(f"{s.label} server did not become healthy within {self.timeout:.0f} s "
                                    f"(log {s.log}): {s.tail()}; raise SPECLENS_SERVER_START_TIMEOUT")
            if pending:
                time.sleep(1.0)

    def __exit__(self, *exc) -> None:
        for s in self.servers:
            try:
                s.stop()
            except Exception:     # noqa: BLE001 - the others must still be stopped
                pass
