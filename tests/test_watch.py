"""`python -m backend watch` against a small local HTTP server (http.server in a thread) that serves a sequence of
`/metrics` texts, one per scrape.

The texts are exposition text rendered by prometheus_client itself: a template (a text of a CollectorRegistry with
vLLM's or SGLang's metric names, or a recorded `/metrics` text of a real server from tests/data/recorded/metrics/,
vllm_*.txt / sglang_*.txt) is parsed with prometheus_client's parser and re-rendered with generate_latest, its
speculative-decoding counters set to a simulated history (chain drafting, per-position acceptance alpha), every
other metric as recorded. `MetricsServer` also takes any list of texts as they are (a recorded sequence).

Bars: a planted drop in the acceptance counters gives the drift verdict and exit code 1; a counter reset is reported
as a restart, not a drop (exit 0); an unreachable server gives one line and a nonzero exit, the run kept; a server
without speculative decoding gives one line."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from backend import metrics, server_metrics
from backend.__main__ import main
from backend.store.data_root import DataRoot
from backend.watch import COLUMNS, Tracker, WatchSettings, make_window, metrics_url

RECORDED = Path(os.environ.get("SPECLENS_RECORDED_METRICS") or Path(__file__).parent / "data" / "recorded" / "metrics")
K = 3
DOWN = object()          # a scrape answered by closing the connection (a server that went away mid-watch)


# ---------------------------------------------------------------------------- the local server


class MetricsServer:
    """Serves `texts` at GET /metrics, the i-th scrape the i-th text (DOWN: the connection is closed unanswered);
    once they run out, the last text again (then="repeat") or nothing at all (then="down": the port is closed).
    Every other path is 404 (no /version, /v1/models: the watch records no version then)."""

    def __init__(self, texts: list, then: str = "repeat"):
        self.texts, self.then, self.served = list(texts), then, 0
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                with outer.lock:
                    i = outer.served
                    outer.served += 1
                if i >= len(outer.texts) and outer.then == "down":
                    threading.Thread(target=outer.stop, daemon=True).start()
                    self.close_connection = True
                    return
                text = outer.texts[min(i, len(outer.texts) - 1)]
                if text is DOWN:
                    self.close_connection = True
                    return
                body = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._stopped = False

    def __enter__(self) -> MetricsServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self.httpd.shutdown()
            self.httpd.server_close()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------------------- metrics texts

VLLM = {"drafts": "vllm:spec_decode_num_drafts", "draft_tokens": "vllm:spec_decode_num_draft_tokens",
        "accepted": "vllm:spec_decode_num_accepted_tokens", "per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos",
        "gen": "vllm:generation_tokens", "requests": "vllm:request_success"}
VLLM_GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting"}
SGLANG = {"drafts": "sglang:spec_verify_calls", "gen": "sglang:generation_tokens", "requests": "sglang:num_requests"}
SGLANG_GAUGES = {"running": "sglang:num_running_reqs", "waiting": "sglang:num_queue_reqs"}


def generated_template(engine: str, speculative: bool = True) -> str:
    """A /metrics text with the engine's metric names, from a prometheus_client CollectorRegistry (labels as the
    engines set them; vLLM registers its spec_decode counters only with a drafter)."""
    r = CollectorRegistry()
    if engine == "vllm":
        lab = ["model_name", "engine"]
        for key, name in VLLM.items():
            if key in ("drafts", "draft_tokens", "accepted", "per_pos") and not speculative:
                continue
            extra = ["position"] if key == "per_pos" else ["finished_reason"] if key == "requests" else []
            c = Counter(name, name, lab + extra, registry=r)
            for i in range(K if key == "per_pos" else 1):
                c.labels("toy", "0", *([str(i)] if key == "per_pos" else ["stop"] if extra else []))
        for name in VLLM_GAUGES.values():
            Gauge(name, name, lab, registry=r).labels("toy", "0").set(0)
        Gauge("vllm:kv_cache_usage_perc", "KV-cache usage", lab, registry=r).labels("toy", "0").set(0.1)
    else:
        lab = ["model_name"]
        for name in SGLANG.values():
            Counter(name, name, lab, registry=r).labels("toy")
        for name in SGLANG_GAUGES.values():
            Gauge(name, name, lab, registry=r).labels("toy").set(0)
        Gauge("sglang:spec_accept_length", "last batch", lab, registry=r).labels("toy").set(2.0)
    return generate_latest(r).decode()


class _Replay:
    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self) -> list:
        return self.families


def render(template: str, counts: dict, engine: str) -> str:
    """`template` with the engine's speculative-decoding counters (and gauges) set to `counts` (cumulative values:
    drafts, draft_tokens, accepted, per_pos, gen, requests, running, waiting): parsed with prometheus_client's
    parser, re-rendered with generate_latest. A counter's whole value goes to its first label set."""
    names = {**(VLLM if engine == "vllm" else SGLANG), **(VLLM_GAUGES if engine == "vllm" else SGLANG_GAUGES)}
    by_name = {v: k for k, v in names.items()}
    out = []
    for fam in text_string_to_metric_families(template):
        m = Metric(fam.name, fam.documentation, fam.type, fam.unit)
        key = by_name.get(fam.name)
        first = True
        for s in fam.samples:
            value = s.value
            if key is not None and key in counts and s.name in (fam.name, fam.name + "_total"):
                if key == "per_pos":
                    p = int(s.labels.get("position", 0))
                    value = float(counts["per_pos"][p]) if p < len(counts["per_pos"]) else 0.0
                else:
                    value = float(counts[key]) if first else 0.0
                    first = False
            m.samples.append(s._replace(value=value))
        out.append(m)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Replay(out))
    return generate_latest(reg).decode()


def simulate(alphas: list[float], drafts: int | list[int] = 1000, restart_at: int | None = None, seed: int = 0,
             k: int = K, running: float = 8) -> list[dict]:
    """Cumulative counters at scrapes 0..n for windows 1..n with per-position acceptance alpha (chain drafting: a
    draft accepts i+1 tokens with probability alpha^(i+1), up to k); the server had already run before scrape 0.
    restart_at=j: the server restarted inside window j, so scrape j holds only the counts since the restart."""
    rng = np.random.default_rng(seed)
    ds = drafts if isinstance(drafts, list) else [drafts] * len(alphas)

    def window(alpha: float, d: int) -> dict:
        n = np.cumprod(rng.random((d, k)) < alpha, axis=1).sum(1)
        per_pos = [int((n > i).sum()) for i in range(k)]
        acc = int(n.sum())
        req = max(1, d // 40)
        return {"drafts": d, "draft_tokens": d * k, "accepted": acc, "per_pos": per_pos, "gen": req + d + acc,
                "requests": req}

    def add(a: dict, b: dict) -> dict:
        return {key: ([x + y for x, y in zip(a[key], b[key])] if key == "per_pos" else a[key] + b[key]) for key in b}

    cum = window(alphas[0], 5 * ds[0])
    out = [{**cum, "running": running, "waiting": 0}]
    for j, (alpha, d) in enumerate(zip(alphas, ds), start=1):
        w = window(alpha, d)
        cum = w if j == restart_at else add(cum, w)
        out.append({**cum, "running": running, "waiting": j % 3})
    return out


def recorded(engine: str) -> list[Path]:
    return sorted(RECORDED.glob(f"{engine}_*.txt")) if RECORDED.is_dir() else []


def speculative(path: Path) -> bool:
    """Whether a recorded text is of a server with speculative decoding (vLLM registers its spec_decode counters only
    with a drafter; SGLang's verify counter exists either way and counts only with one)."""
    try:
        c = server_metrics.parse(path.read_text())
    except server_metrics.MetricsError:
        return False
    return c.drafts is not None and (c.engine == "vllm" or c.drafts > 0)


def k_of(tpl: tuple[str, Path | None]) -> int:
    """Draft positions the template's server reports (vLLM's per-position counter), else K."""
    pp = server_metrics.parse(template_text(tpl)).per_pos
    return len(pp) if pp else K


# the generated templates, and the first recorded text of each engine where there is one
TEMPLATES = [pytest.param(("vllm", None), id="vllm-generated"), pytest.param(("sglang", None), id="sglang-generated")]
TEMPLATES += [pytest.param((e, p), id=f"recorded-{p.stem}") for e in ("vllm", "sglang")
              for p in [q for q in recorded(e) if speculative(q)][:1]]


def template_text(tpl: tuple[str, Path | None]) -> str:
    engine, path = tpl
    return path.read_text() if path else generated_template(engine)


def texts(tpl: tuple[str, Path | None], counts: list[dict]) -> list[str]:
    base = template_text(tpl)
    return [render(base, c, tpl[0]) for c in counts]


def watch(url: str, *args: str, name: str = "w") -> int:
    return main(["watch", "--server-url", url, "--interval", "0.05", "--name", name, "--quiet", *args])


def windows(root: Path, run_id: str) -> pd.DataFrame:
    return DataRoot(root).catalog.read.watch_windows(run_id)


def manifest(root: Path, run_id: str) -> dict:
    return json.loads((root / "runs" / run_id / "manifest.json").read_text())


def last_line(out: str) -> str:
    lines = [x for x in out.strip().splitlines() if x.strip()]
    return lines[-1] if lines else ""


# ---------------------------------------------------------------------------- the bars


@pytest.mark.parametrize("tpl", TEMPLATES)
def test_steady_server_no_drift(tpl, data_root: Path, capsys) -> None:
    counts = simulate([0.7] * 12, k=k_of(tpl))
    with MetricsServer(texts(tpl, counts)) as srv:
        code = watch(srv.url, "--windows", "12")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "no drift" in last_line(out) and "-> " in last_line(out)
    m = manifest(data_root, "w")
    assert m["status"] == "complete" and m["kind"] == "watch" and m["engine"] == tpl[0]
    assert m["watch"]["verdict"]["state"] == "ok" and m["watch"]["stopped_by"] == "windows"
    assert not (data_root / "runs" / "w" / "journal.jsonl").exists()
    df = windows(data_root, "w")
    assert len(df) == 12 and df["window"].tolist() == list(range(1, 13))
    assert (df["status"].iloc[:6] == "baseline").all() and (df["status"].iloc[6:] == "ok").all()
    assert not df["drift"].any() and not df["restart"].any()
    # tau per window is the metrics.py definition over that window's counter deltas
    for j in (1, 7, 12):
        d = counts[j]["drafts"] - counts[j - 1]["drafts"]
        a = counts[j]["accepted"] - counts[j - 1]["accepted"]
        assert df["tau"].iloc[j - 1] == pytest.approx(1 + a / d)
    assert df["band_low"].notna().all() and (df["band_low"] < df["baseline_tau"]).all()
    assert df["generation_tps"].gt(0).all() and df["running"].eq(8).all()
    if tpl[0] == "vllm":
        assert len(df["per_pos_rate"].iloc[0]) == k_of(tpl) and df["acceptance_rate"].notna().all()
        assert df["drafted_tps"].gt(0).all()
    else:
        assert df["per_pos"].isna().all() and df["acceptance_rate"].isna().all()


@pytest.mark.parametrize("tpl", TEMPLATES)
def test_planted_drop_is_drift_with_exit_1(tpl, data_root: Path, capsys) -> None:
    counts = simulate([0.7] * 8 + [0.45] * 4, k=k_of(tpl))
    with MetricsServer(texts(tpl, counts)) as srv:
        code = watch(srv.url, "--windows", "12")
    out = capsys.readouterr().out
    assert code == 1, out
    line = last_line(out)
    assert "DRIFT" in line and "window(s) 9-12" in line, line
    df = windows(data_root, "w")
    assert df.loc[df["drift"], "window"].tolist() == [9, 10, 11, 12]
    assert not df["drift"].iloc[:8].any()
    m = manifest(data_root, "w")
    assert m["status"] == "complete" and m["watch"]["verdict"]["state"] == "drift"
    assert m["watch"]["verdict"]["drift_windows"] == [9, 10, 11, 12]


@pytest.mark.parametrize("tpl", TEMPLATES)
def test_counter_reset_is_a_restart_not_a_drop(tpl, data_root: Path, capsys) -> None:
    # the restarted server accepts less (another drafter, say): a new baseline, not a drop
    counts = simulate([0.7] * 8 + [0.5] * 8, restart_at=9, k=k_of(tpl))
    with MetricsServer(texts(tpl, counts)) as srv:
        code = watch(srv.url, "--windows", "16")
    out = capsys.readouterr().out
    assert code == 0, out
    line = last_line(out)
    assert "restart" in line and "DRIFT" not in line, line
    df = windows(data_root, "w")
    assert df.loc[df["restart"], "window"].tolist() == [9]
    assert "server restarted" in df["note"].iloc[8]
    assert df["segment"].tolist() == [1] * 8 + [2] * 8
    assert (df["status"].iloc[8:14] == "baseline").all()            # the new segment's own baseline
    assert df["generation_tps"].isna().iloc[8]                        # counts since the restart: no rates
    assert df["tau"].iloc[8] == pytest.approx(1 + counts[9]["accepted"] / counts[9]["drafts"])
    assert not df["drift"].any()


def test_unreachable_server_one_line_and_run_kept(data_root: Path, capsys) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]                   # bound, not listening: connection refused
        code = watch(f"http://127.0.0.1:{port}", "--windows", "3", name="gone")
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and f"http://127.0.0.1:{port}/metrics" in err and "--server-url" in err, err
    runs = DataRoot(data_root).catalog.read.list_runs(kind="watch")
    row = runs.set_index("run_id").loc["gone"]
    assert row["status"] == "failed" and "cannot reach" in row["error"]
    ws = pd.read_parquet(data_root / "runs" / "gone" / "windows.parquet")   # written empty before the first scrape
    assert ws.empty and list(ws.columns) == list(COLUMNS)
    assert windows(data_root, "gone").empty


def test_lost_connection_keeps_the_windows(data_root: Path, capsys) -> None:
    counts = simulate([0.7] * 5)
    with MetricsServer(texts(("vllm", None), counts), then="down") as srv:
        code = watch(srv.url, "--windows", "20", "--max-missed", "2", name="lost")
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "lost" in err and "5 window(s)" in err, err
    m = manifest(data_root, "lost")
    assert m["status"] == "failed" and m["watch"]["verdict"]["windows"] == 5
    assert len(windows(data_root, "lost")) == 5
    assert (data_root / "runs" / "lost" / "journal.jsonl").read_text().count("\n") == 5


def test_a_missed_scrape_widens_the_window(data_root: Path, capsys) -> None:
    counts = simulate([0.7] * 4)
    seq = texts(("vllm", None), counts)
    with MetricsServer(seq[:2] + [DOWN] + seq[2:]) as srv:
        code = watch(srv.url, "--windows", "4", name="gap")
    assert code == 0, capsys.readouterr()
    df = windows(data_root, "gap")
    assert len(df) == 4 and "1 failed scrape(s) inside" in df["note"].iloc[1]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_server_without_speculative_decoding(engine: str, data_root: Path, capsys) -> None:
    if engine == "vllm":
        base = generated_template("vllm", speculative=False)
        seq = [render(base, {"gen": 100 * i, "requests": i}, "vllm") for i in range(4)]
    else:
        seq = [render(generated_template("sglang"), {"drafts": 0, "gen": 100 * i, "requests": i}, "sglang")
               for i in range(4)]
    with MetricsServer(seq) as srv:
        code = watch(srv.url, "--windows", "3", name="plain")
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "without a drafter" in err and ("--speculative-config" if engine == "vllm" else
                                           "--speculative-algorithm") in err, err
    assert manifest(data_root, "plain")["status"] == "failed"


def test_not_metrics_text(data_root: Path, capsys) -> None:
    with MetricsServer(["<html>hello</html>\n"]) as srv:
        code = watch(srv.url, "--windows", "2", name="html")
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "vllm" in err.lower(), err


def test_min_tau(data_root: Path, capsys) -> None:
    counts = simulate([0.7] * 4)                      # tau 1 + 0.7 + 0.49 + 0.343 = 2.53
    with MetricsServer(texts(("vllm", None), counts)) as srv:
        code = watch(srv.url, "--windows", "4", "--min-tau", "2.8", name="floor")
    out = capsys.readouterr().out
    assert code == 1 and "BELOW --min-tau 2.8" in last_line(out), out
    assert windows(data_root, "floor")["below_min_tau"].all()


def test_too_few_drafts_are_not_evidence(data_root: Path, capsys) -> None:
    # two near-idle windows with a very low acceptance between busy ones
    counts = simulate([0.7] * 8 + [0.1, 0.1] + [0.7] * 2, drafts=[1000] * 8 + [30, 30] + [1000] * 2)
    with MetricsServer(texts(("vllm", None), counts)) as srv:
        code = watch(srv.url, "--windows", "12", name="quiet")
    assert code == 0, capsys.readouterr()
    df = windows(data_root, "quiet")
    assert df["status"].iloc[8:10].tolist() == ["too few drafts"] * 2 and not df["drift"].any()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_completes_the_run_with_its_windows(sig, data_root: Path, capsys) -> None:
    counts = simulate([0.7] * 40)
    before = signal.getsignal(signal.SIGINT)      # default, or SIG_IGN when pytest runs in the background
    with MetricsServer(texts(("vllm", None), counts)) as srv:
        timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), sig))
        timer.start()
        try:
            code = watch(srv.url, name="stopped")                       # no --duration / --windows: until Ctrl-C
        finally:
            timer.cancel()
    assert code in (0, 1), capsys.readouterr()
    m = manifest(data_root, "stopped")
    assert m["status"] == "complete" and m["watch"]["stopped_by"] == "signal"
    n = len(windows(data_root, "stopped"))
    assert n >= 3 and m["progress"] == {"done": n, "total": n}
    assert signal.getsignal(signal.SIGINT) is before                    # the watch put the handler back


def test_a_killed_watch_is_interrupted_never_complete(data_root: Path) -> None:
    """kill -9 mid-watch: the run stays `running` on disk, the catalog shows it `interrupted`, and the windows it had
    written are indexed."""
    import io
    import subprocess
    import sys
    import time

    from backend.config import REPO_ROOT

    with MetricsServer(texts(("vllm", None), simulate([0.7] * 400))) as srv:
        cmd = [sys.executable, "-m", "backend", "watch", "--server-url", srv.url, "--interval", "0.05", "--name",
               "killed", "--quiet"]
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env={**os.environ, "SPECLENS_DATA": str(data_root)})
        parquet = data_root / "runs" / "killed" / "windows.parquet"
        end = time.monotonic() + 60
        def written() -> int:   # one open: the watch replaces the file while this reads it
            return len(pd.read_parquet(io.BytesIO(parquet.read_bytes()))) if parquet.exists() else 0

        while time.monotonic() < end and written() < 3:
            time.sleep(0.1)
        proc.kill()
        proc.wait(10)
    assert manifest(data_root, "killed")["status"] == "running"
    DataRoot(data_root).catalog.write.refresh()
    row = DataRoot(data_root).catalog.read.list_runs(kind="watch").set_index("run_id").loc["killed"]
    assert row["status"] == "interrupted"
    assert len(windows(data_root, "killed")) >= 3
    assert (data_root / "runs" / "killed" / "journal.jsonl").exists()


def test_duration(data_root: Path, capsys) -> None:
    with MetricsServer(texts(("vllm", None), simulate([0.7] * 30))) as srv:
        assert watch(srv.url, "--interval", "0.1", "--duration", "0.5", name="dur") == 0
    assert len(windows(data_root, "dur")) == 5
    assert manifest(data_root, "dur")["watch"]["stopped_by"] == "duration"


def test_window_lines_and_summary_line(data_root: Path, capsys) -> None:
    with MetricsServer(texts(("vllm", None), simulate([0.7] * 3))) as srv:
        assert main(["watch", "--server-url", srv.url + "/", "--interval", "0.05", "--windows", "3",
                     "--name", "talk"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and all(x.startswith("window ") for x in lines[:3])
    assert lines[-1].startswith("watch talk: 3 window(s)") and "no drift verdict: 3 of the 6" in lines[-1]


def test_bad_arguments(data_root: Path, capsys) -> None:
    assert main(["watch", "--server-url", "localhost:8000"]) == 2
    assert "http://HOST:PORT" in capsys.readouterr().err
    assert main(["watch", "--server-url", "http://x", "--interval", "0"]) == 2
    assert metrics_url("http://h:8000") == "http://h:8000/metrics" == metrics_url("http://h:8000/metrics")


# ---------------------------------------------------------------------------- the statistic


def test_t_quantile_matches_the_table() -> None:
    for df in (1, 2, 3, 5, 10, 20, 30):
        assert metrics.t_quantile(0.975, df) == pytest.approx(metrics.t_quantile_975(df), abs=2e-3)
    assert metrics.t_quantile(0.99, 5) == pytest.approx(3.365, abs=2e-3)


def test_accepted_sq_from_per_position_counts() -> None:
    n = np.array([0, 1, 3, 3, 2])                 # accepted lengths of five drafts, K = 3
    per_pos = [int((n > i).sum()) for i in range(3)]
    assert metrics.accepted_sq(per_pos) == float((n ** 2).sum())


def test_band_widens_with_window_to_window_spread() -> None:
    steady = [(1500 + e, 1000, 4000) for e in (0, 5, -5, 3, -3, 0)]
    spread = [(1500 + e, 1000, 4000) for e in (0, 120, -120, 90, -90, 0)]
    a, b = metrics.drift_band(steady), metrics.drift_band(spread)
    assert a.between_var == 0 and b.between_var > 0
    assert b.band(1000)[0] < a.band(1000)[0]
    assert a.band(100)[0] < a.band(1000)[0]         # fewer drafts, wider band
    assert a.below(1500 - 300, 1000) and not a.below(1500 - 20, 1000)


def test_false_alarm_rate_of_a_steady_server() -> None:
    """Steady simulated servers (no drift): the one-sided 99% band flags about 1% of later windows, and drift
    (two in a row) is rare."""
    flagged, total, drifts = 0, 0, 0
    for seed in range(40):
        counts = simulate([0.7] * 30, drafts=500, seed=seed)
        tr = Tracker(WatchSettings("http://x"))
        for j in range(1, len(counts)):
            prev = server_metrics.Counters("vllm", drafts=counts[j - 1]["drafts"],
                                           draft_tokens=counts[j - 1]["draft_tokens"],
                                           accepted=counts[j - 1]["accepted"], per_pos=tuple(counts[j - 1]["per_pos"]))
            cur = server_metrics.Counters("vllm", drafts=counts[j]["drafts"], draft_tokens=counts[j]["draft_tokens"],
                                          accepted=counts[j]["accepted"], per_pos=tuple(counts[j]["per_pos"]))
            tr.add(make_window(j, j - 1.0, float(j), prev, cur))
        later = [w for w in tr.windows if not w["baseline"]]
        flagged += sum(w["below_band"] for w in later)
        total += len(later)
        drifts += bool(tr.drift)
    assert flagged / total < 0.04, (flagged, total)
    assert drifts <= 2


# ---------------------------------------------------------------------------- recorded texts of real servers


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for e in ("vllm", "sglang") for p in recorded(e)])
def test_recorded_metrics(path: Path, data_root: Path, capsys) -> None:
    """Every recorded text parses as its engine's; watched as it is (the same text at every scrape): a server with
    speculative decoding gives idle windows and no verdict (exit 0), a vLLM server without it the one-line refusal."""
    c = server_metrics.parse(path.read_text())
    assert c.engine == path.name.split("_")[0]
    with MetricsServer([path.read_text()]) as srv:
        code = watch(srv.url, "--windows", "2", name="rec")
    out = capsys.readouterr()
    if c.drafts is None:
        assert code == 2 and "without a drafter" in out.err, out
    else:
        assert code == 0 and "no verdict" in last_line(out.out), out


def _all_recorded_texts() -> list[tuple[str, str]]:
    import tarfile
    out = [(f.name, f.read_text()) for f in sorted(RECORDED.glob("*.txt"))]
    for tgz in sorted(RECORDED.glob("*.tar.gz")):
        with tarfile.open(tgz) as t:
            out += [(Path(m.name).name, t.extractfile(m).read().decode()) for m in t.getmembers()
                    if m.isfile() and m.name.endswith(".txt")][:8]
    return out


def test_parsing_only_the_families_read_changes_no_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """parse() hands prometheus_client only the lines of the families it reads (a busy CPU server's core makes the
    whole text cost seconds); on every recorded text of a real server, and on SGLang texts, the Counters equal a
    parse of the whole text."""
    cases = _all_recorded_texts()
    cases += [("sglang", t) for t in texts(("sglang", None), simulate([0.6] * 3, seed=5))]
    assert sum(name.startswith("vllm") for name, _ in cases) >= 10
    whole = {}
    with monkeypatch.context() as m:
        m.setattr(server_metrics, "_wanted", lambda name: True)
        for name, text in cases:
            whole[name, text] = server_metrics.parse(text)
    for name, text in cases:
        c = server_metrics.parse(text)
        assert c == whole[name, text], name
    kept = [x for x in cases[0][1].splitlines() if server_metrics._wanted(server_metrics._metric_name(x))]
    assert 10 < len(kept) < len(cases[0][1].splitlines()) / 5


# ---------------------------------------------------------------------------- watch runs for the page tests


def build_watch_data(root: Path) -> Path:
    """Watch runs made by backend/watch.py against the local server: `watch-drift` (vLLM: a planted drop after a
    restart, about 30% of tau), `watch-small-drift` (vLLM: a confirmed drop of about 3% of tau, heavy traffic),
    `watch-ok` (vLLM, steady), `watch-sglang` (SGLang, steady) and `watch-lost` (the server went away: failed, its
    windows kept)."""
    from backend.errors import SpecLensError
    from backend.watch import run_watch

    def one(name: str, seq: list, n: int, then: str = "repeat", **kw) -> None:
        with MetricsServer(seq, then=then) as srv:
            s = WatchSettings(srv.url, interval=0.03, windows=n, max_missed=1, **kw)
            try:
                run_watch(s, name=name, data=DataRoot(root), echo=None)
            except SpecLensError:
                pass
    vllm, sglang = ("vllm", None), ("sglang", None)
    one("watch-drift", texts(vllm, simulate([0.7] * 8 + [0.6] * 8 + [0.4] * 4, restart_at=9, seed=3)), 20,
        min_tau=1.6)
    one("watch-small-drift", texts(vllm, simulate([0.7] * 8 + [0.68] * 6, drafts=20000, seed=7)), 14)
    one("watch-ok", texts(vllm, simulate([0.7] * 10, seed=4)), 10)
    one("watch-sglang", texts(sglang, simulate([0.6] * 10, seed=5)), 10)
    one("watch-lost", texts(vllm, simulate([0.7] * 4, seed=6)), 10, then="down")
    return root


@pytest.fixture(scope="session")
def watch_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_watch_data(tmp_path_factory.mktemp("watch-data"))


# ---------------------------------------------------------------------------- the page (AppTest)


def open_watch(page: str = "pages/watch.py", **params: str):
    from streamlit.testing.v1 import AppTest

    from backend.config import REPO_ROOT

    at = AppTest.from_file(str(REPO_ROOT / "app.py"), default_timeout=120)
    for k, v in params.items():
        at.query_params[k] = v
    at.switch_page(page)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_watch_page(watch_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECLENS_DATA", str(watch_root))
    at = open_watch(run="watch-drift")
    verdict = "\n".join(e.value for e in at.error)
    assert "DRIFT: window(s) 17-20" in verdict and "1 restart(s) (window 9" in verdict
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(figs) == 3
    tau = figs[0]
    assert tau["layout"]["title"]["text"].startswith("tau per window")
    names = {t.get("name") for t in tau["data"]}
    assert {"drift (confirmed)", "window tau", "baseline tau", "--min-tau 1.6"} <= names
    assert any(a.get("text") == "restart" for a in tau["layout"]["annotations"])
    table = at.dataframe[0].value
    assert len(table) == 20 and "None" not in table.astype(str).to_numpy().ravel().tolist()
    assert at.query_params["run"] == "watch-drift"

    assert verdict.startswith("**Error** (tau cost") and "drift, tau " in verdict      # a large drop: an error

    at = open_watch(run="watch-small-drift")           # a confirmed drop of a few % of tau: a note, not red
    assert not at.error and not at.warning, [e.value for e in at.error]
    note = at.info[0].value
    assert note.startswith("**Note** (tau cost ") and "DRIFT: window(s)" in note, note
    assert "Severity follows the tau cost" in "\n".join(c.value for c in at.caption)
    at = open_watch(id="watch-small-drift", page="pages/run.py")     # the run page says it at the same level
    assert not at.error and at.info[0].value.startswith("**Note** (tau cost "), [e.value for e in at.info]

    at = open_watch(run="watch-sglang")
    assert "no drift" in at.success[0].value and len(at.get("plotly_chart")) == 2
    assert "No per-position acceptance" in "\n".join(e.value for e in at.info)

    at = open_watch(run="watch-lost")
    assert "This watch is failed: lost" in "\n".join(e.value for e in at.warning)

    at = open_watch(run="no-such-run")
    assert "No run `no-such-run`" in "\n".join(e.value for e in at.warning)
    assert not at.error and not at.success, "a run shown in place of the link's gets no drift verdict"
    assert "No drift verdict for what the link did not ask for" in "\n".join(e.value for e in at.info)
    assert at.query_params["run"] == "no-such-run", "the URL keeps what was asked"
    at = open_watch(run="x' OR 1=1; DROP TABLE runs; --" + "y" * 500)     # shown as text, cut; never SQL
    notice = "\n".join(e.value for e in at.warning)
    assert "OR 1=1" in notice and "\u2026" in notice and len(at.get("plotly_chart")) == 3


def test_drift_is_sized_as_a_tau_cost() -> None:
    """dashboard/watch_charts.verdict_level: a confirmed drift is as loud as what it costs against the baseline tau
    (the one severity scale); below the user's --min-tau is an error; a clean watch ok, no traffic a note."""
    import pandas as pd

    from dashboard import watch_charts

    def frame(drop: float) -> pd.DataFrame:
        return pd.DataFrame({"drafts": [1000] * 6, "accepted": [1500] * 3 + [int(1000 * (1.5 - drop))] * 3,
                             "baseline_tau": [2.5] * 6, "drift": [False] * 3 + [True] * 3})

    drift = {"state": "drift", "line": "watch w: DRIFT: window(s) 4-6"}
    for drop, key in ((0.07, "note"), (0.3, "warning"), (1.0, "error")):       # 3%, 12%, 40% of tau 2.5
        level, text = watch_charts.verdict_level(drift, frame(drop))
        assert level.key == key and text.endswith(drift["line"]) and "against 2.50" in text, (drop, level, text)
    below = {**drift, "below_min_windows": [5, 6]}
    assert watch_charts.verdict_level(below, frame(0.07))[0].key == "error"
    assert watch_charts.verdict_level({"state": "below_min_tau", "line": "x"}, frame(0.0))[0].key == "error"
    assert watch_charts.verdict_level({"state": "ok", "line": "x"})[0].key == "ok"
    assert watch_charts.verdict_level({"state": "no_traffic", "line": "x"})[0].key == "note"


def test_watch_page_without_watch_runs(data_root: Path) -> None:
    at = open_watch()
    assert "No watch runs yet" in at.info[0].value
