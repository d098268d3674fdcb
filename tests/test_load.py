"""Serving-load benches (backend/load_bench.py, load_client.py, server_metrics.py) against what real servers sent.

Everything served here was recorded from vLLM 0.24.0 on the lent H200 (gpu/load_suite.py, 2026-12-02): `/metrics`
texts (tests/data/recorded/metrics/), streamed completions (tests/data/recorded/streams/) and whole load runs
(tests/data/recorded/load/). A small local HTTP server replays them; no response is written by hand. SGLang's
`/metrics` could not be recorded (its drafter servers failed to start on the H200 this session: docs/PERFORMANCE.md),
so the SGLang parsing is checked on text rendered by prometheus_client with SGLang's metric names, and says so.
"""

from __future__ import annotations

import http.server
import json
import tarfile
import threading
from pathlib import Path

import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from backend import metrics, server_metrics
from backend.config import REPO_ROOT
from backend.errors import SpecLensError
from backend.load_bench import LoadSettings, run_load, summarize
from backend.load_client import run_level
from backend.store.data_root import DataRoot

DATA = Path(__file__).parent / "data" / "recorded"
METRICS = DATA / "metrics"
TOY = Path(__file__).resolve().parents[1] / "models" / "toy-pair.tar.gz"
PROMPTS = Path(__file__).resolve().parents[1] / "datasets" / "spec_bench" / "question.jsonl"


def _text(name: str) -> str:
    return (METRICS / f"vllm_0.24.0_{name}.txt").read_text()


# ---------------------------------------------------------------------------- /metrics of a real vLLM server


def test_real_vllm_metrics_parse_and_delta() -> None:
    idle, after, end = (server_metrics.parse(_text(n)) for n in ("idle", "after_bench", "end"))
    assert idle.engine == "vllm" and idle.speculative
    assert idle.per_pos is not None and len(idle.per_pos) == 4          # the K=4 server registers 4 positions
    assert after.drafts > idle.drafts and after.generation_tokens > 0
    iv = server_metrics.delta(after, end)                                # `vllm bench serve` ran in between
    acc = iv.acceptance(4)
    assert iv.drafts > 0 and 0 < iv.accepted <= 4 * iv.drafts
    assert acc.tau == pytest.approx(1 + iv.accepted / iv.drafts)
    assert sum(iv.per_pos) == pytest.approx(iv.accepted)                 # a chain: accepted = sum over positions
    assert all(a >= b for a, b in zip(iv.per_pos, iv.per_pos[1:]))      # position i+1 needs position i
    with pytest.raises(server_metrics.CounterReset, match="restarted"):
        server_metrics.delta(end, idle)


def test_not_metrics_text_is_one_line() -> None:
    with pytest.raises(server_metrics.MetricsError, match="neither vllm"):
        server_metrics.parse("# just a comment\nup 1\n")


def test_sglang_counters_from_prometheus_client_text() -> None:
    """Rendered with prometheus_client under SGLang 0.5.15's names (not recorded: see the module docstring).
    Three finished requests of 33 tokens each with 10 verify steps: accepted = 99 - 3 - 30 = 66, tau = 3.2."""
    def text(gen: float, req: float, verify: float) -> str:
        reg = CollectorRegistry()
        lab = {"model_name": "m"}
        for name, v in (("sglang:generation_tokens", gen), ("sglang:num_requests", req),
                        ("sglang:spec_verify_calls", verify)):
            Counter(name, "x", list(lab), registry=reg).labels(**lab).inc(v)
        Gauge("sglang:num_running_reqs", "x", list(lab), registry=reg).labels(**lab).set(2)
        return generate_latest(reg).decode()

    a, b = server_metrics.parse(text(10, 1, 4)), server_metrics.parse(text(109, 4, 34))
    assert a.engine == b.engine == "sglang" and b.running == 2
    iv = server_metrics.delta(a, b)
    assert (iv.drafts, iv.accepted, iv.requests) == (30, 66, 3)
    assert iv.acceptance(4).tau == pytest.approx(3.2)


# ---------------------------------------------------------------------------- a replay server


class Replay:
    """Serves recorded vLLM responses: /v1/completions -> a recorded stream's bytes (chunk by chunk), /metrics ->
    the next of `scrapes` (in a cycle: a level scrapes before and after, so [a, b] gives every level the delta b - a),
    /v1/models, /version, /health. `fail_after`: completions after
    that many answer HTTP 500 (a server that broke)."""

    def __init__(self, stream: str, scrapes: list[str], fail_after: int | None = None):
        self.stream, self.scrapes, self.fail_after = stream.encode(), scrapes, fail_after
        self.completions = self.metrics = 0
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/metrics":
                    text = outer.scrapes[outer.metrics % len(outer.scrapes)]
                    outer.metrics += 1
                    self._send(200, text.encode(), "text/plain")
                elif self.path == "/v1/models":
                    self._send(200, b'{"data": [{"id": "toy"}]}')
                elif self.path == "/version":
                    self._send(200, b'{"version": "0.24.0"}')
                else:
                    self._send(200, b"")

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.completions += 1
                if outer.fail_after is not None and outer.completions > outer.fail_after:
                    self._send(500, b'{"error": "engine dead"}')
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for part in outer.stream.split(b"\n\n"):
                    if part.strip():
                        data = part + b"\n\n"
                        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                        self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

            def log_message(self, *a) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _stream(i: int = 0) -> tuple[dict, str]:
    d = json.loads((DATA / "streams" / f"vllm_0.24.0_stream_{i}.json").read_text())
    return d["request"], d["response"]


def _recorded_counts(response: str) -> tuple[int, int, list[int]]:
    """Tokens, token-carrying chunks and the token ids as the recorded stream holds them."""
    ids, chunks = [], 0
    for line in response.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            new = [t for ch in json.loads(line[6:])["choices"] for t in ch.get("token_ids") or []]
            ids += new
            chunks += bool(new)
    return len(ids), chunks, ids


def test_client_reads_a_recorded_vllm_stream() -> None:
    req, resp = _stream(0)
    tokens, chunks, ids = _recorded_counts(resp)
    srv = Replay(resp, [_text("idle")])
    try:
        res, seconds = run_level("vllm", srv.url, [req["prompt"]] * 3, [0, 1, 2], 2, req["max_tokens"], model="toy")
    finally:
        srv.close()
    assert seconds > 0 and all(r.error is None for r in res)
    r = res[0]
    assert r.output_tokens == tokens == req["max_tokens"]          # ignore_eos: exactly max_tokens
    assert r.chunks == chunks and r.drafts == chunks - 1 and r.accepted == tokens - chunks
    assert r.max_chunk <= 5                                        # K=4: at most K+1 tokens a step
    assert r.ttft is not None and r.latency >= r.ttft and len(r.itl) == chunks - 1
    from backend.load_client import _hash
    assert r.output_hash == _hash(ids)


# ---------------------------------------------------------------------------- whole runs


@pytest.fixture
def toy_target(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("toy")
    with tarfile.open(TOY) as t:
        t.extractall(d, filter="data")
    return d / "target"


def _settings(target: Path, drafter_url: str, base_url: str, **kw) -> LoadSettings:
    return LoadSettings(engine="vllm", target=str(target), prompts=str(PROMPTS), limit=4, num_spec_tokens=[4],
                        concurrency=[1, 2], requests=4, max_tokens=32, repeats=3, server_url=drafter_url,
                        baseline_url=base_url, **kw)


def test_load_run_against_replayed_servers_resumes_after_a_failure(toy_target: Path, data_root: Path) -> None:
    _, resp = _stream(1)
    after, end = _text("after_bench"), _text("end")
    base = Replay(resp, [_text("idle")])
    bad = Replay(resp, [after, end], fail_after=10)     # the warm-up (2) and two drafter levels (4 + 4) succeed
    try:
        s = _settings(toy_target, bad.url, base.url)
        with pytest.raises(SpecLensError, match="every request to .* failed"):
            run_load(s, name="ld", data=DataRoot(data_root), progress=False)
        m = json.loads((data_root / "runs" / "ld" / "manifest.json").read_text())
        assert m["status"] == "failed" and m["progress"]["done"] >= 1
        journal = (data_root / "runs" / "ld" / "journal.jsonl").read_text().splitlines()
        assert 3 <= len(journal) < 12
        good = Replay(resp, [after, end])
        try:
            r = run_load(_settings(toy_target, good.url, base.url), name="ld", data=DataRoot(data_root), progress=False)
        finally:
            good.close()
    finally:
        base.close()
        bad.close()
    assert r.status == "complete"
    lv = pd.read_parquet(r.path / "levels.parquet")
    assert len(lv) == 2 * 2 * 3                      # concurrency x sides x repeats (the journal's cells kept)
    assert set(lv.side) == {"baseline", "drafter"}
    # sides alternate: the first level of each (concurrency, repeat) is not always the same side
    first = lv.sort_values("order").groupby(["concurrency", "repeat"]).side.first()
    assert set(first) == {"baseline", "drafter"}
    d = lv[lv.side == "drafter"]
    iv = server_metrics.delta(server_metrics.parse(after), server_metrics.parse(end))
    assert d.tau_server.iloc[-1] == pytest.approx(iv.acceptance(4).tau)   # the delta of the scrapes served
    assert d.tau_client.notna().all() and (d.merged_requests == 0).all()
    assert (r.path / "scrapes").is_dir() and len(list((r.path / "scrapes").iterdir())) == 2 * len(lv)
    assert not (r.path / "journal.jsonl").exists()
    cells = r.summary["cells"]
    assert {c["concurrency"] for c in cells} == {1, 2} and all(c["speedup"]["ci_low"] <= c["speedup"]["value"]
                                                               <= c["speedup"]["ci_high"] for c in cells)


@pytest.mark.parametrize("together", [True, False])
def test_servers_started_for_a_sweep(toy_target: Path, data_root: Path, monkeypatch, together: bool) -> None:
    """Servers SpecLens starts (replayed here): all at once, or one baseline kept for the whole run beside one drafter
    server at a time, so that a target the GPU holds only twice (an MoE shape on 80 GB) still gets every pairing."""
    from backend.engines import server_process
    _, resp = _stream(1)
    events: list[tuple[str, tuple[str, ...]]] = []
    alive: set[str] = set()
    most = [0]

    class Group:
        def __init__(self, specs, log_dir, **kw):
            self.labels = tuple(s.label for s in specs)

        def __enter__(self):
            events.append(("start", self.labels))
            alive.update(self.labels)
            most[0] = max(most[0], len(alive))
            self.servers = [Replay(resp, [_text("after_bench"), _text("end")]) for _ in self.labels]
            for srv in self.servers:
                srv.start_seconds = 0.1
            return self.servers

        def __exit__(self, *exc):
            events.append(("stop", self.labels))
            alive.difference_update(self.labels)
            for srv in self.servers:
                srv.close()

    monkeypatch.setattr(server_process, "ServerGroup", Group)
    s = LoadSettings(engine="vllm", target=str(toy_target), drafter=str(toy_target), prompts=str(PROMPTS), limit=4,
                     num_spec_tokens=[1, 2], concurrency=[1, 2], requests=4, max_tokens=32, start_together=together)
    r = run_load(s, name=f"sw{together}", data=DataRoot(data_root), progress=False)
    assert r.status == "complete" and len(r.summary["cells"]) == 4
    lv = pd.read_parquet(r.path / "levels.parquet").sort_values("order")
    assert len(lv) == 2 * 2 * 2
    if together:    # level by level: every pairing at concurrency 1 before any at 2, so the baseline drifts less
        assert list(lv.concurrency) == [1, 1, 1, 1, 2, 2, 2, 2] and list(lv.config[:4]) == ["K=1", "K=1", "K=2", "K=2"]
        assert list(lv.side[:4]) == ["baseline", "drafter", "drafter", "baseline"]     # who goes first alternates
    else:
        assert list(lv.config) == ["K=1"] * 4 + ["K=2"] * 4
    if together:
        assert events == [("start", ("vllm baseline", "vllm K=1", "vllm K=2")),
                          ("stop", ("vllm baseline", "vllm K=1", "vllm K=2"))] and most[0] == 3
    else:                                   # the baseline starts once and outlives each drafter server
        assert events == [("start", ("vllm baseline",)), ("start", ("vllm K=1",)), ("stop", ("vllm K=1",)),
                          ("start", ("vllm K=2",)), ("stop", ("vllm K=2",)), ("stop", ("vllm baseline",))]
        assert most[0] == 2


def test_one_line_errors(toy_target: Path, data_root: Path) -> None:
    with pytest.raises(SpecLensError, match="needs --baseline-url"):
        run_load(_settings(toy_target, "http://127.0.0.1:9", None), data=DataRoot(data_root), progress=False)
    with pytest.raises(SpecLensError, match="serves one drafter configuration"):
        run_load(LoadSettings(engine="vllm", target=str(toy_target), prompts=str(PROMPTS), num_spec_tokens=[1, 2],
                              server_url="http://127.0.0.1:9", baseline_url="http://127.0.0.1:9"),
                 data=DataRoot(data_root), progress=False)
    with pytest.raises(SpecLensError, match=r"\[1, K\+1\]"):
        run_load(LoadSettings(engine="vllm", target=str(toy_target), prompts=str(PROMPTS), drafter="d",
                              num_spec_tokens=[2], synthetic_tau=[3.5]), data=DataRoot(data_root), progress=False)
    with pytest.raises(SpecLensError, match="unreachable"):
        run_load(_settings(toy_target, "http://127.0.0.1:9", "http://127.0.0.1:9"), name="x", data=DataRoot(data_root),
                 progress=False)
    m = json.loads((data_root / "runs" / "x" / "manifest.json").read_text())
    assert m["status"] == "failed" and "unreachable" in m["error"]


def test_cli_refuses_hf_with_concurrency(capsys) -> None:
    from backend.__main__ import main
    code = main(["bench", "--engine", "hf", "--target", "t", "--prompts", str(PROMPTS), "--concurrency", "1,8"])
    assert code == 2 and "use --engine vllm or sglang" in capsys.readouterr().err


# ---------------------------------------------------------------------------- the H200 runs


MAP_8B = REPO_ROOT / "datasets" / "maps" / "h200-vllm-synthetic-8b"
MAP_MOE = REPO_ROOT / "datasets" / "maps" / "h100-vllm-synthetic-gptoss20b"


@pytest.mark.parametrize("run", ["h200-vllm-sweep", "h200-vllm-pair", "h200-sglang-sweep", "h100-vllm-sweep",
                                 "h100-sglang-sweep", "map", "moe-map"])
def test_recorded_summary_is_what_summarize_computes(run: str) -> None:
    d = {"map": MAP_8B, "moe-map": MAP_MOE}.get(run) or DATA / "load" / run
    s = summarize(pd.read_parquet(d / "levels.parquet"), pd.read_parquet(d / "requests.parquet"))
    assert json.loads(json.dumps(s)) == json.loads((d / "summary.json").read_text())


def test_h200_sweep_findings() -> None:
    """What the recorded sweep says: at concurrency <= 32 the server's counters and the requests' own count agree
    within 1.1% for K=4 (the bar is 2%); at 64 vLLM merged stream chunks for K=1/K=2, so the requests' count
    overstates tau there; the baseline's own throughput moved between configurations at c >= 8 (noise flag)."""
    s = json.loads((DATA / "load" / "h200-vllm-sweep" / "summary.json").read_text())
    cell = {(c["config"], c["concurrency"]): c for c in s["cells"]}
    for c in (1, 8, 32):
        assert cell[("K=4", c)]["tau_agreement"] < 0.02
    assert cell[("K=1", 64)]["tau_client"] > 2.0 > cell[("K=1", 64)]["tau_server"]   # > K+1 = 2: merged chunks
    assert set(s["baseline_noise"]) == {"8", "32", "64"} and s["best"]["1"]["noisy"] is False
    assert s["best"]["1"]["within_interval"] == ["K=1", "K=2"]                        # no clear winner at c=1
    lv = pd.read_parquet(DATA / "load" / "h200-vllm-sweep" / "levels.parquet")
    assert metrics.relative_spread(lv[(lv.side == "baseline") & (lv.concurrency == 64)].output_tps) > 0.4


def test_level_speedup_interval_covers_the_point() -> None:
    est = metrics.level_speedup([10, 12, 11, 9], [1.0, 1.1, 1.0, 0.9], 2.0, [10, 10, 10, 10], [2.0, 2.1, 2.0, 1.9], 4.0)
    assert est.value == pytest.approx((42 / 2.0) / (40 / 4.0))
    assert est.ci_low <= est.value <= est.ci_high
    assert metrics.percentiles([1, 2, 3, None, float("nan")]) == {"p50": 2.0, "p90": pytest.approx(2.8),
                                                                    "p99": pytest.approx(2.98)}
    assert metrics.relative_spread([1.0]) is None and metrics.agreement(1.0, None) is None


# ---------------------------------------------------------------------------- the real watch


def test_real_watch_scrapes_give_the_drift_at_the_switch(data_root: Path, tmp_path: Path, capsys) -> None:
    """The 45 `/metrics` texts scraped every 15 s from the H200 watch (vLLM 0.24, toy pair K=4, load turned to token
    soup after 7 minutes), replayed: the watch finds the same drift at the switch and exits 1, and nothing before."""
    from tests.test_watch import MetricsServer

    with tarfile.open(METRICS / "vllm_0.24.0_watch_h200.tar.gz") as t:
        t.extractall(tmp_path, filter="data")
    texts = [p.read_text() for p in sorted((tmp_path / "watch_raw").glob("*.txt"))]
    assert len(texts) == 45
    from backend.__main__ import main
    with MetricsServer(texts) as srv:
        code = main(["watch", "--server-url", srv.url, "--interval", "0.05", "--windows", "44", "--name", "real",
                     "--quiet"])
    out = capsys.readouterr().out
    assert code == 1, out
    m = json.loads((data_root / "runs" / "real" / "manifest.json").read_text())
    drift = m["watch"]["verdict"]["drift_windows"]
    recorded = json.loads((DATA / "load" / "h200-vllm-watch" / "manifest.json").read_text())
    assert drift == recorded["watch"]["verdict"]["drift_windows"]        # the same windows as on the H200
    assert min(drift) >= 26                                               # the switch came after 7 of 11 minutes


# ---------------------------------------------------------------------------- the job queue


def test_load_job_spec_and_split(toy_target: Path, data_root: Path, monkeypatch) -> None:
    from backend.jobs import spec as specs

    monkeypatch.setenv("SPECLENS_MODEL_ROOTS", str(toy_target.parent))
    base = {"kind": "load", "engine": "vllm", "target": str(toy_target), "drafter": str(toy_target.parent /
            "drafter-matched"), "prompts": str(PROMPTS), "num_spec_tokens": [1, 2, 4], "concurrency": [1, 8]}
    (one,) = specs.validate(base)
    assert one["kind"] == "load" and one["num_gpus"] == 1.0 and one["settings"]["num_spec_tokens"] == [1, 2, 4]
    jobs = specs.validate({**base, "name": "sw", "split": True, "synthetic_tau": [1.5, 2.0]})
    assert [j["name"] for j in jobs] == ["K-1-tau-1.5", "K-1-tau-2", "K-2-tau-1.5", "K-2-tau-2", "K-4-tau-1.5",
                                         "K-4-tau-2"]
    assert {j["sweep"] for j in jobs} == {"sw"} and jobs[0]["settings"]["synthetic_tau"] == [1.5]
    with pytest.raises(SpecLensError, match="concurrency"):
        specs.validate({**base, "concurrency": [0]})
    with pytest.raises(SpecLensError, match="outside the allowed roots"):
        specs.validate({**base, "target": "/etc"})
    with pytest.raises(SpecLensError, match="engine"):
        specs.validate({**base, "engine": "hf"})


def test_load_job_runs_on_the_worker(toy_target: Path, data_root: Path, monkeypatch) -> None:
    from backend.jobs import queue
    from backend.jobs import spec as specs
    from backend.jobs.worker import run_worker

    monkeypatch.setenv("SPECLENS_MODEL_ROOTS", str(toy_target.parent))
    _, resp = _stream(2)
    base, spec = Replay(resp, [_text("idle")]), Replay(resp, [_text("after_bench"), _text("end")])
    try:
        jobs = specs.validate({"kind": "load", "engine": "vllm", "target": str(toy_target), "prompts": str(PROMPTS),
                               "limit": 2, "concurrency": [1], "requests": 2, "max_tokens": 32,
                               "server_url": spec.url, "baseline_url": base.url, "name": "ldjob"})
        assert jobs[0]["num_gpus"] == 0.0                     # servers of someone else: no GPU taken here
        queue.enqueue(jobs, DataRoot(data_root))
        run_worker(DataRoot(data_root), once=True, log=lambda *_: None)
    finally:
        base.close()
        spec.close()
    runs = DataRoot(data_root).catalog.read.list_runs(kind="load")
    assert runs.set_index("run_id").loc["ldjob", "status"] == "complete"
    m = json.loads((data_root / "runs" / "ldjob" / "manifest.json").read_text())
    assert m["job"]["kind"] == "load" and m["load"]["levels"] == 2


# ---------------------------------------------------------------------------- what a better drafter is worth


def _map_cells() -> list[dict]:
    """A speedup map's summary cells, built here (no synthetic-acceptance run was recorded on the H200 yet: the
    numbers are invented for the interpolation logic only)."""
    pts = {1: [(1.0, 0.80), (2.0, 1.40), (3.0, 1.90), (4.0, 2.30)], 64: [(1.0, 0.70), (2.0, 0.95), (3.0, 1.10),
                                                                         (4.0, 1.20)]}
    return [{"k": 3, "concurrency": c, "synthetic_tau": t, "tau_server": t + 0.01, "config": f"K=3 tau*={t:g}",
             "speedup": {"value": v}} for c, p in pts.items() for t, v in p]


def test_worth_interpolates_and_never_extrapolates() -> None:
    from backend.drafter_worth import worth, worth_by_concurrency

    cells = _map_cells()
    w = worth(cells, 1.51, 2.51, 1)
    assert w.speedup_from == pytest.approx(1.10) and w.speedup_to == pytest.approx(1.65)
    assert w.gain == pytest.approx(1.65 / 1.10 - 1)
    assert worth(cells, 1.51, 2.51, 8) is None                    # a concurrency the map did not measure
    assert worth(cells, 0.9, 2.0, 1) is None                      # below the map's lowest tau
    assert worth(cells + [{"k": 3, "concurrency": 1, "synthetic_tau": None, "tau_server": 9, "speedup": {"value": 9}}],
                 1.51, 2.51, 1) == w                              # a real drafter's cell is not on the map
    assert [x.concurrency for x in worth_by_concurrency(cells, 1.5, 3.0)] == [1, 64]
    assert worth(cells, 1.5, 3.0, 64).gain < worth(cells, 1.5, 3.0, 1).gain   # worth less at load


def test_worth_cli(data_root: Path, capsys) -> None:
    from backend.__main__ import main

    d = data_root / "runs" / "map1"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"cells": _map_cells()}))
    assert main(["worth", "--map", "map1", "--tau-from", "1.21", "--tau-to", "2.09"]) == 0
    out = capsys.readouterr().out
    assert "concurrency    1: raising tau from 1.21 to 2.09 is worth" in out and "concurrency   64" in out
    assert main(["worth", "--map", "map1", "--tau-from", "0.5", "--tau-to", "2"]) == 1
    assert main(["worth", "--map", "nope", "--tau-from", "1", "--tau-to", "2"]) == 2
    assert "not a complete load run" in capsys.readouterr().err


def test_a_level_with_a_merged_stream_has_no_own_count() -> None:
    """vLLM under load merges a slow reader's stream chunks; a merge within K+1 tokens looks like one step, so once
    any request of a level shows a merge (a chunk of more than K+1 tokens) the level's own count is not used."""
    from backend.load_bench import own_count
    from backend.load_client import RequestResult

    def req(i, drafts, accepted, max_chunk):
        return RequestResult(index=i, prompt_index=i, prompt_tokens=8, sent=0.0, drafts=drafts, accepted=accepted,
                             max_chunk=max_chunk)

    clean = [req(0, 10, 12, 3), req(1, 10, 8, 2)]
    c = own_count(clean, "vllm", 2)
    assert c["merged_requests"] == 0 and c["tau_client"] == pytest.approx(1 + 20 / 20)
    one_merged = clean + [req(2, 4, 10, 6)]
    c = own_count(one_merged, "vllm", 2)
    assert c["merged_requests"] == 1 and c["tau_client"] is None and c["drafts_client"] is None
    assert own_count(one_merged, "sglang", 2)["tau_client"] is not None   # SGLang counts per request itself
    assert own_count(clean, "vllm", 0)["merged_requests"] is None           # a baseline level has no drafts


def test_agreement_note_names_the_levels_without_own_count() -> None:
    from dashboard.load_charts import agreement_note

    cells = pd.DataFrame([
        {"config": "K=2", "k": 2, "concurrency": 8, "tau_client": 2.0, "tau_server": 2.01, "tau_agreement": 0.005,
         "merged_requests": 0},
        {"config": "K=2", "k": 2, "concurrency": 64, "tau_client": None, "tau_server": 2.08, "tau_agreement": None,
         "merged_requests": 37}])
    kind, text = agreement_note(cells)
    assert kind == "caption" and "within 2% at every level where both exist" in text
    assert "No own count for K=2 at concurrency 64" in text and "37 request(s)" in text
    kind, text = agreement_note(cells.iloc[1:])
    assert "from the server's counters only" in text


def test_h200_sglang_sweep_findings() -> None:
    """SGLang 0.5.15 serving the toy pair (K 1, 2, 4 x concurrency 1, 8, 32, 64, each with its paired baseline): the
    server's counters and the requests' own count (SGLang returns each request's verification steps) agree within
    2% in every cell; on this toy target the drafter never pays (the target is as cheap as the drafter)."""
    s = json.loads((DATA / "load" / "h200-sglang-sweep" / "summary.json").read_text())
    cells = s["cells"]
    assert {(c["k"], c["concurrency"]) for c in cells} == {(k, c) for k in (1, 2, 4) for c in (1, 8, 32, 64)}
    assert all(c["tau_agreement"] is not None and c["tau_agreement"] < 0.02 for c in cells)
    assert all(c["speedup"]["ci_high"] < 1.1 for c in cells)
    tau = {(c["k"], c["concurrency"]): c["tau_server"] for c in cells}
    assert all(tau[(1, c)] < tau[(2, c)] < tau[(4, c)] for c in (1, 8, 32, 64))      # more drafts, longer accepts
    assert set(s["best"]) == {"1", "8", "32", "64"}


def test_h200_synthetic_map_on_the_8b_shape() -> None:
    """vLLM 0.24.0 on a Llama-3.1-8B shape (dummy weights, K=3) with synthetic acceptance at tau 1, 2.5 and 4 over
    concurrency 1-64: the map covers tau 1.0-4.0 at four levels, the server measures the tau it was set to, the
    speedup falls with concurrency at every tau, and a drafter at tau 1 (every draft rejected) only costs."""
    s = json.loads((MAP_8B / "summary.json").read_text())
    cells = [c for c in s["cells"] if c["synthetic_tau"] is not None]
    assert {c["concurrency"] for c in cells} == {1, 8, 32, 64}
    assert min(c["synthetic_tau"] for c in cells) == 1.0 and max(c["synthetic_tau"] for c in cells) == 4.0
    for c in cells:
        assert c["tau_server"] == pytest.approx(c["synthetic_tau"], abs=0.05)
    for t in (1.0, 2.5, 4.0):
        sp = [c["speedup"]["value"] for c in sorted(cells, key=lambda c: c["concurrency"]) if c["synthetic_tau"] == t]
        assert sp == sorted(sp, reverse=True)
    assert all(c["speedup"]["ci_high"] < 1 for c in cells if c["synthetic_tau"] == 1.0)


def test_what_a_better_drafter_is_worth_on_the_h200_map() -> None:
    """The demo's slot-shift drafter (tau 1.21) and its fix (tau 2.09) placed on the 8B map: the gain shrinks as
    concurrency grows, and is positive at every level."""
    from backend.drafter_worth import worth_by_concurrency

    cells = json.loads((MAP_8B / "summary.json").read_text())["cells"]
    ws = worth_by_concurrency(cells, 1.21, 2.09)
    assert [w.concurrency for w in ws] == [1, 8, 32, 64]
    gains = [w.speedup_to / w.speedup_from - 1 for w in ws]
    assert all(g > 0.2 for g in gains) and gains == sorted(gains, reverse=True)


def test_h100_sweep_with_k6() -> None:
    """vLLM 0.24.0 serving the toy pair on the H100 (2026-12-06), K 1, 2, 4, 6 x concurrency 1, 8, 32, 64, each cell
    with its paired baseline: tau from the server's counters rises with K at every level; wherever the requests' own
    count exists it agrees with the counters within 2%; and the baseline's own tok/s moved between its four pairings
    at every level by more than the intervals absorb, so no level's best K is a verdict."""
    s = json.loads((DATA / "load" / "h100-vllm-sweep" / "summary.json").read_text())
    cells = {(c["k"], c["concurrency"]): c for c in s["cells"]}
    assert set(cells) == {(k, c) for k in (1, 2, 4, 6) for c in (1, 8, 32, 64)}
    for c in (1, 8, 32, 64):
        taus = [cells[(k, c)]["tau_server"] for k in (1, 2, 4, 6)]
        assert taus == sorted(taus) and len(set(taus)) == 4
    own = [c for c in cells.values() if c["tau_agreement"] is not None]
    assert len(own) >= 10 and all(c["tau_agreement"] < 0.02 for c in own)
    assert all(cells[(k, 64)]["tau_agreement"] is None for k in (1, 2, 6))     # merged streams: counters only
    assert set(s["baseline_noise"]) == {"1", "8", "32", "64"}
    assert all(b["noisy"] for b in s["best"].values())


def test_h100_sglang_sweep_with_k6() -> None:
    """SGLang 0.5.15 serving the toy pair on the H100 (2026-12-06, the DSA stand-in of gpu/stubs on the path), K 1, 2,
    4, 6 x concurrency 1, 8, 32, 64, each cell with its paired baseline: tau from the server's counters rises with K
    at every level; SGLang returns each request's verify steps, so every cell has the requests' own count, within 2%
    of the counters; the baseline moved at 8, 32 and 64 beyond the intervals (no verdict there); at concurrency 1 the
    best K (K=6, K=4 within its interval) is a verdict, and the drafter does not pay there on this engine."""
    s = json.loads((DATA / "load" / "h100-sglang-sweep" / "summary.json").read_text())
    cells = {(c["k"], c["concurrency"]): c for c in s["cells"]}
    assert set(cells) == {(k, c) for k in (1, 2, 4, 6) for c in (1, 8, 32, 64)}
    for c in (1, 8, 32, 64):
        taus = [cells[(k, c)]["tau_server"] for k in (1, 2, 4, 6)]
        assert taus == sorted(taus) and len(set(taus)) == 4
    assert all(c["tau_agreement"] is not None and c["tau_agreement"] < 0.02 for c in cells.values())
    assert all(c["errors"] == 0 and c["merged_requests"] == 0 for c in cells.values())
    assert set(s["baseline_noise"]) == {"8", "32", "64"}
    best = s["best"]["1"]
    assert (best["config"], best["noisy"], best["within_interval"]) == ("K=6", False, ["K=4"])
    assert cells[(6, 1)]["speedup"]["ci_high"] < 1.0


def test_h100_synthetic_map_on_an_moe_shape() -> None:
    """vLLM 0.24.0 on the gpt-oss-20b shape (MXFP4 experts, dummy weights; SpecForge's EAGLE-3 config; K=3) with
    synthetic acceptance at tau 1, 2.5 and 4: the server measures the tau it was set to; at concurrency 1 and 8 a
    drafter at tau 1 halves the throughput, tau 2.5 is about break-even and tau 4 gains; the dense 8B map (recorded
    on an H200, so across cards) gains far more at the same tau, as verifying K+1 tokens wakes more experts."""
    s = json.loads((MAP_MOE / "summary.json").read_text())
    cells = {(c["synthetic_tau"], c["concurrency"]): c for c in s["cells"]}
    assert set(cells) == {(t, c) for t in (1.0, 2.5, 4.0) for c in (1, 8, 32, 64)}
    for (t, _), c in cells.items():
        assert c["tau_server"] == pytest.approx(t, abs=0.05)
    sp = {k: c["speedup"] for k, c in cells.items()}
    for c in (1, 8):
        assert sp[(1.0, c)]["ci_high"] < 0.55
        assert sp[(2.5, c)]["ci_low"] < 1.0 < sp[(2.5, c)]["ci_high"]
        assert sp[(4.0, c)]["ci_low"] > 1.5
    dense = {(c["synthetic_tau"], c["concurrency"]): c["speedup"]["value"]
             for c in json.loads((MAP_8B / "summary.json").read_text())["cells"]}
    assert all(dense[(t, c)] > sp[(t, c)]["value"] + 0.25 for t in (1.0, 2.5) for c in (1, 8))
    assert set(s["baseline_noise"]) == {"32", "64"}                      # those levels carry no verdict


def test_the_map_follows_the_target(capsys) -> None:
    """A drafter of an MoE target is read on the MoE map, any other on the dense one; the label names the card."""
    from backend.__main__ import main
    from backend.drafter_worth import find_map

    assert find_map().run_id == "h200-vllm-synthetic-8b" and "on an H200" in find_map().label
    moe = find_map(model_type="gpt_oss")
    assert moe.run_id == MAP_MOE.name and "on an H100" in moe.label and "gpt_oss, 24 layers x 2880" in moe.label
    assert moe.left_out == (32, 64) and {c["concurrency"] for c in moe.cells} == {1, 8}    # noisy levels: no reading
    assert find_map(model_type="qwen3").run_id == "h200-vllm-synthetic-8b"
    assert main(["worth", "--map", MAP_MOE.name, "--tau-from", "1.5", "--tau-to", "3.5"]) == 0
    out = capsys.readouterr().out
    assert MAP_MOE.name in out and "concurrency    1: raising tau from 1.50 to 3.50" in out
    assert "concurrency   32" not in out and "concurrency 32, 64 left out: its baseline was noisy" in out
