"""Watch a live vLLM or SGLang server: scrape its `GET /metrics` every interval and record the speculative-decoding
counters as a time series (a run of kind `watch`), with a drift verdict that cron or CI can act on.

Per window (the interval between two scrapes; docs/SCHEMA.md, `windows.parquet`): drafts, draft tokens, accepted
tokens, tau and acceptance rate (backend/metrics.py definitions), per-position acceptance (vLLM), drafted /
accepted / generated tokens per second, finished requests, running and waiting requests (gauges at the window's
end), and a status. The metrics text is read by backend/server_metrics.py (prometheus_client's parser).

Drift (backend/metrics.drift_band, `metrics.DRIFT_STATISTIC`): the first `baseline_windows` windows with at least
`min_drafts` drafts form the baseline of a segment; every later window with enough drafts is checked against the
baseline's one-sided prediction band for a window of its size. `confirm` such windows below the band in a row (windows
with too few drafts neither count nor break the row) are a drift: verdict `drift`, exit code 1. `--min-tau`: the same
rule against a fixed floor, or the whole watch's tau below it. A server restart (a counter went down) is a note and a
new segment with its own baseline, never a drop.

Failures, each one line (`SpecLensError`, exit 2 through the CLI), the windows recorded so far kept and indexed, the
run failed with that line: the server unreachable at the first scrape or `max_missed` scrapes in a row; text that is
not vLLM/SGLang metrics; no speculative-decoding counters (how to start the server with a drafter).

Stopping: `duration`, `windows`, or Ctrl-C / SIGTERM: the run completes with the whole windows it has (the window in
progress is dropped) and `stopped_by: "signal"`; a second Ctrl-C aborts it (failed, "interrupted"). A process that
dies (kill -9, a crash) leaves the run `running`, which the catalog shows as `interrupted`, never `complete`; its
windows up to the last one are in `windows.parquet` and `journal.jsonl`.

Memory: the previous scrape's counters and the windows (a few hundred bytes each); nothing else grows.
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from backend import metrics, server_metrics
from backend.errors import SpecLensError
from backend.options import engine_label
from backend.runs.lifecycle import Run, RunGuard
from backend.settings import WatchSettings  # the watch's settings (its options derive from them)
from backend.store.data_root import DataRoot
from backend.store.rundir import atomic_write_bytes, new_run_id

JOURNAL = "journal.jsonl"
WINDOWS = "windows.parquet"

# status of a window
IDLE, FEW, BASELINE, OK, LOW = "idle", "too few drafts", "baseline", "ok", "below band"

START_WITH_DRAFTER = {
    "vllm": "vllm serve TARGET --speculative-config '{\"method\": \"eagle3\", \"model\": \"DRAFTER\", "
            "\"num_speculative_tokens\": 3}'",
    "sglang": "python -m sglang.launch_server --model-path TARGET --speculative-algorithm EAGLE3 "
              "--speculative-draft-model-path DRAFTER --speculative-num-steps 3 --speculative-eagle-topk 1 "
              "--speculative-num-draft-tokens 4 --enable-metrics",
}

# windows.parquet / the catalog's watch_windows: column -> (pyarrow type name, what)
COLUMNS = {
    "window": ("int64", "1, 2, ... in time order"),
    "segment": ("int64", "1 + restarts seen before this window's end"),
    "t_start": ("float64", "scrape that opens the window, Unix seconds (UTC)"),
    "t_end": ("float64", "scrape that closes it"),
    "seconds": ("float64", "t_end - t_start"),
    "drafts": ("int64", "verification steps"),
    "draft_tokens": ("int64", "proposed tokens (vLLM; null for SGLang)"),
    "accepted": ("int64", "proposed tokens kept"),
    "tau": ("float64", "1 + accepted / drafts (null without drafts)"),
    "acceptance_rate": ("float64", "accepted / draft_tokens"),
    "per_pos": ("list<int64>", "accepted at draft position i (vLLM)"),
    "per_pos_rate": ("list<float64>", "per_pos / drafts"),
    "drafted_tps": ("float64", "draft tokens per second"),
    "accepted_tps": ("float64", "accepted draft tokens per second"),
    "generation_tps": ("float64", "generated tokens per second (all requests)"),
    "generation_tokens": ("int64", "generated tokens in the window"),
    "finished_requests": ("int64", "requests that finished in the window"),
    "running": ("float64", "requests running at the window's end (gauge)"),
    "waiting": ("float64", "requests waiting at the window's end (gauge)"),
    "restart": ("bool", "the server restarted in this window (counters went down): counts since the restart"),
    "status": ("string", "idle | too few drafts | baseline | ok | below band"),
    "baseline": ("bool", "one of its segment's baseline windows"),
    "baseline_tau": ("float64", "its segment's baseline tau (null until the baseline is complete)"),
    "band_low": ("float64", "the one-sided band for a window of this many drafts"),
    "band_high": ("float64", ""),
    "below_band": ("bool", "tau below band_low"),
    "drift": ("bool", "one of `confirm` windows below the band in a row"),
    "below_min_tau": ("bool", "one of `confirm` windows below --min-tau in a row"),
    "note": ("string", "restart, partial counts, ..."),
}


@dataclass
class WatchResult:
    run_id: str
    path: Path
    status: str
    verdict: dict
    windows: int

    @property
    def exit_code(self) -> int:
        return int(self.verdict.get("exit_code", 0))


def metrics_url(server_url: str) -> str:
    """http://host:port[/prefix] -> http://host:port[/prefix]/metrics (a URL ending in /metrics is kept)."""
    u = urlsplit(server_url.strip())
    if u.scheme not in ("http", "https") or not u.netloc:
        raise SpecLensError(f"--server-url '{server_url}': expected http://HOST:PORT of a vLLM or SGLang server")
    path = u.path.rstrip("/")
    if not path.endswith("/metrics"):
        path += "/metrics"
    return f"{u.scheme}://{u.netloc}{path}"


class ScrapeError(Exception):
    """One scrape failed (connection, timeout, HTTP status): the reason in a few words."""


def scrape(url: str, timeout: float) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        hint = " (SGLang serves /metrics only with --enable-metrics)" if e.code == 404 else ""
        raise ScrapeError(f"HTTP {e.code} {e.reason}{hint}") from None
    except urllib.error.URLError as e:
        raise ScrapeError(str(getattr(e, "reason", e))) from None
    except (OSError, ValueError) as e:         # timeouts, resets, a closed connection mid-answer
        raise ScrapeError(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None


def _server_info(base: str, timeout: float) -> tuple[str | None, str | None]:
    """(engine version, served model id) from the OpenAI-compatible server, best effort (None when it says nothing):
    vLLM's GET /version, SGLang's GET /get_server_info, either's GET /v1/models."""
    def get(path: str) -> dict | None:
        try:
            with urllib.request.urlopen(base + path, timeout=min(timeout, 2.0)) as r:
                out = json.loads(r.read(1 << 20).decode("utf-8", "replace"))
                return out if isinstance(out, dict) else None
        except (OSError, ValueError, urllib.error.URLError):
            return None
    version = None
    for path in ("/version", "/get_server_info"):
        d = get(path)
        if d and isinstance(d.get("version"), str):
            version = d["version"]
            break
    models = get("/v1/models")
    model = None
    if models and isinstance(models.get("data"), list) and models["data"] and isinstance(models["data"][0], dict):
        model = models["data"][0].get("id") if isinstance(models["data"][0].get("id"), str) else None
    return version, model


# ---------------------------------------------------------------------- the verdict over windows


@dataclass
class _Segment:
    index: int
    first_window: int
    counts: list[tuple[float, float, float | None]] = field(default_factory=list)   # baseline windows' counts
    baseline_ids: list[int] = field(default_factory=list)
    band: metrics.DriftBand | None = None
    low_row: list[int] = field(default_factory=list)        # windows below the band in a row
    min_row: list[int] = field(default_factory=list)        # windows below --min-tau in a row


class Tracker:
    """The windows of one watch and their verdict, updated one window at a time (no I/O)."""

    def __init__(self, s: WatchSettings):
        self.s = s
        self.windows: list[dict] = []
        self.segments: list[_Segment] = [_Segment(1, 1)]
        self.drift: list[int] = []                 # windows of confirmed drift
        self.below_min: list[int] = []             # windows of confirmed tau < min_tau
        self.restarts: list[int] = []

    def add(self, w: dict) -> dict:
        """Classify a new window (its counts filled in) and update the verdict; returns it."""
        s, seg = self.s, self.segments[-1]
        if w["restart"]:
            self.restarts.append(w["window"])
            seg = _Segment(len(self.segments) + 1, w["window"])
            self.segments.append(seg)
        w["segment"] = seg.index
        w.update(baseline=False, below_band=False, drift=False, below_min_tau=False, baseline_tau=None,
                 band_low=None, band_high=None)
        d, a, sq = w["drafts"], w["accepted"], w.pop("_sq", None)
        self.windows.append(w)
        if d == 0:
            w["status"] = IDLE
            return w
        if d < s.min_drafts:
            w["status"] = FEW
            return w
        if s.min_tau is not None:
            if w["tau"] < s.min_tau:
                seg.min_row.append(w["window"])
                if len(seg.min_row) >= s.confirm:
                    self._mark(seg.min_row, "below_min_tau", self.below_min)
            else:
                seg.min_row = []
        if seg.band is None:
            w["status"], w["baseline"] = BASELINE, True
            seg.counts.append((a, d, sq))
            seg.baseline_ids.append(w["window"])
            if len(seg.counts) >= s.baseline_windows:
                seg.band = metrics.drift_band(seg.counts, s.level)
                for b in self.windows:
                    if b["segment"] == seg.index and b["drafts"] > 0:
                        self._band(b, seg.band)
            return w
        self._band(w, seg.band)
        if seg.band.below(a, d):
            w["status"], w["below_band"] = LOW, True
            seg.low_row.append(w["window"])
            if len(seg.low_row) >= s.confirm:
                self._mark(seg.low_row, "drift", self.drift)
        else:
            w["status"] = OK
            seg.low_row = []
        return w

    @staticmethod
    def _band(w: dict, band: metrics.DriftBand) -> None:
        w["baseline_tau"] = band.tau
        w["band_low"], w["band_high"] = band.band(w["drafts"])

    def _mark(self, ids: list[int], flag: str, into: list[int]) -> None:
        for i in ids:
            self.windows[i - 1][flag] = True
            if i not in into:
                into.append(i)

    def verdict(self, run_id: str = "watch") -> dict:
        """{state, line, exit_code, ...}: drift / below_min_tau (exit 1), ok, no_baseline or no_traffic (exit 0)."""
        s, ws = self.s, self.windows
        traffic = [w for w in ws if w["drafts"] >= s.min_drafts]
        A, D = sum(w["accepted"] for w in ws), sum(w["drafts"] for w in ws)
        tau = 1 + A / D if D else None
        span = (ws[-1]["t_end"] - ws[0]["t_start"]) if ws else 0.0
        head = f"watch {run_id}: {len(ws)} window(s) over {_dur(span)}"
        if tau is not None:
            head += f", tau {tau:.3f} over {int(D):,} drafts"
        notes = []
        if self.restarts:
            notes.append(f"{len(self.restarts)} restart(s) (window {', '.join(map(str, self.restarts))}: counters "
                         "went down; a new baseline each time, not a drop)")
        bands = [seg for seg in self.segments if seg.band is not None]
        parts, state = [], "ok"
        if self.drift:
            state = "drift"
            parts.append(f"DRIFT: {self._describe(self.drift)}")
        pooled_low = s.min_tau is not None and tau is not None and D >= s.min_drafts and tau < s.min_tau
        if self.below_min or pooled_low:
            state = "drift" if self.drift else "below_min_tau"
            what = (self._describe(self.below_min, band=False) if self.below_min
                    else f"the whole watch's tau {tau:.3f}")
            parts.append(f"BELOW --min-tau {s.min_tau:g}: {what}")
        if not parts:
            if not traffic:
                state = "no_traffic"
                parts.append(f"no verdict: no window had {s.min_drafts}+ drafts (no traffic with speculative "
                             "decoding; send requests, or lower --min-drafts)")
            elif not bands:
                state = "no_baseline"
                n = max(len(seg.counts) for seg in self.segments)
                parts.append(f"no drift verdict: {n} of the {s.baseline_windows} baseline windows with "
                             f"{s.min_drafts}+ drafts (watch longer)")
            else:
                b = bands[-1].band
                parts.append(f"no drift: no {s.confirm} window(s) in a row below the baseline band (baseline tau "
                             f"{b.tau:.3f} over windows {_ids(bands[-1].baseline_ids)}, one-sided {s.level:.0%})")
        line = "; ".join([head] + parts + notes)
        return {"state": state, "line": line, "exit_code": 1 if state in ("drift", "below_min_tau") else 0,
                "windows": len(ws), "tau": tau, "drafts": int(D), "restarts": list(self.restarts),
                "drift_windows": list(self.drift), "below_min_windows": list(self.below_min),
                "segments": [{"segment": seg.index, "first_window": seg.first_window,
                              "baseline_windows": list(seg.baseline_ids),
                              "band": seg.band.to_dict() if seg.band else None} for seg in self.segments],
                "statistic": metrics.DRIFT_STATISTIC, "level": s.level, "confirm": s.confirm,
                "min_drafts": s.min_drafts, "min_tau": s.min_tau}

    def _describe(self, ids: list[int], band: bool = True) -> str:
        ws = [self.windows[i - 1] for i in ids]
        taus = ", ".join(f"{w['tau']:.2f}" for w in ws[:6]) + (" ..." if len(ws) > 6 else "")
        first = ws[0]
        text = f"window(s) {_ids(ids)} from {_clock(first['t_start'])} UTC, tau {taus}"
        if band:
            seg = self.segments[first["segment"] - 1]
            text += (f" below the baseline band (lower bound {first['band_low']:.3f} for window {first['window']}; "
                     f"baseline tau {seg.band.tau:.3f} over windows {_ids(seg.baseline_ids)})")
        return text


def _ids(ids: list[int]) -> str:
    """[3, 4, 5, 9] -> '3-5, 9'."""
    out, run = [], []
    for i in sorted(ids):
        if run and i != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(i)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def _dur(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


# ---------------------------------------------------------------------- one window from two scrapes


def make_window(i: int, t0: float, t1: float, prev: server_metrics.Counters, cur: server_metrics.Counters) -> dict:
    """The window between two scrapes: counter deltas, or, when a counter went down (a restart), the counts since
    the restart (the current values; rates left empty: the restart moment is not known)."""
    note, restart = "", False
    try:
        iv = server_metrics.delta(prev, cur)
    except server_metrics.CounterReset as e:
        restart = True
        note = f"server restarted: {e}".replace(": the server restarted between the two scrapes", "")
        note += "; counts since the restart, no rates"
        zero = server_metrics.Counters(cur.engine, drafts=0.0 if cur.drafts is not None else None,
                                       draft_tokens=0.0 if cur.draft_tokens is not None else None,
                                       accepted=0.0 if cur.accepted is not None else None,
                                       per_pos=tuple(0.0 for _ in cur.per_pos) if cur.per_pos is not None else None,
                                       generation_tokens=0.0 if cur.generation_tokens is not None else None,
                                       requests=0.0 if cur.requests is not None else None)
        iv = server_metrics.delta(zero, cur)
    acc = iv.acceptance()
    sec = t1 - t0
    rate = (lambda x: None) if restart or sec <= 0 else (lambda x: None if x is None else x / sec)
    d = int(acc.drafts)
    per_pos = acc.per_pos if iv.per_pos is not None else None
    w = {"window": i, "t_start": t0, "t_end": t1, "seconds": sec, "drafts": d,
         "draft_tokens": int(acc.draft_tokens) if iv.draft_tokens is not None else None,
         "accepted": int(acc.accepted), "tau": acc.tau if d else None,
         "acceptance_rate": acc.acceptance_rate if iv.draft_tokens is not None else None,
         "per_pos": per_pos, "per_pos_rate": acc.per_pos_rate if per_pos is not None else None,
         "drafted_tps": rate(iv.draft_tokens), "accepted_tps": rate(iv.accepted),
         "generation_tps": rate(iv.generation_tokens),
         "generation_tokens": None if iv.generation_tokens is None else int(round(iv.generation_tokens)),
         "finished_requests": None if iv.requests is None else int(round(iv.requests)),
         "running": cur.running, "waiting": cur.waiting, "restart": restart, "note": note}
    if per_pos is not None and d:
        w["_sq"] = metrics.accepted_sq(per_pos)
    return w


def windows_table(windows: list[dict]):
    """The windows as a pyarrow table with the fixed schema of COLUMNS (list columns typed even when all null)."""
    import pyarrow as pa

    types = {"int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(), "string": pa.string(),
             "list<int64>": pa.list_(pa.int64()), "list<float64>": pa.list_(pa.float64())}
    schema = pa.schema([(c, types[t]) for c, (t, _) in COLUMNS.items()])
    return pa.Table.from_pylist([{c: w.get(c) for c in COLUMNS} for w in windows], schema=schema)


def _write_windows(run: Run, windows: list[dict]) -> None:
    import io

    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(windows_table(windows), buf)
    atomic_write_bytes(run.file(WINDOWS), buf.getvalue())


# ---------------------------------------------------------------------- signals


class _Stop:
    """Ctrl-C / SIGTERM set `event` (the watch completes with what it has); a second one raises KeyboardInterrupt.
    Handlers are installed only in the main thread and restored on exit."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._old: dict[int, object] = {}

    def __enter__(self) -> _Stop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.event.is_set():
            raise KeyboardInterrupt
        self.event.set()

    def __exit__(self, *exc) -> bool:
        for sig, h in self._old.items():
            signal.signal(sig, h)
        return False

    def sleep_until(self, t: float) -> None:
        while not self.event.is_set():
            left = t - time.monotonic()
            if left <= 0:
                return
            self.event.wait(min(left, 0.2))


# ---------------------------------------------------------------------- the watch


def _window_line(w: dict) -> str:
    tau = "   -  " if w["tau"] is None else f"{w['tau']:6.3f}"
    band = "" if w["band_low"] is None else f" [band {w['band_low']:.3f}-{w['band_high']:.3f}]"
    tps = "" if w["generation_tps"] is None else f", {w['generation_tps']:,.0f} tok/s"
    run = "" if w["running"] is None else f", {w['running']:g} running"
    flags = [w["status"]] + (["RESTART"] if w["restart"] else []) + (["DRIFT"] if w["drift"] else []) + (
        ["below --min-tau"] if w["below_min_tau"] else [])
    return (f"window {w['window']:>4} {_clock(w['t_end'])[11:]}  tau {tau}{band}  {w['drafts']:,} drafts{tps}{run}  "
            f"{', '.join(flags)}")


def run_watch(s: WatchSettings, name: str | None = None, data: DataRoot | None = None,
              echo: Callable[[str], None] | None = print) -> WatchResult:
    """Watch the server until `duration` / `windows` / Ctrl-C; returns the run and its verdict (exit code 0 or 1).
    Raises SpecLensError (one line, the run failed and kept) when the server cannot be watched."""
    s.check()
    url = metrics_url(s.server_url)
    base = url[: -len("/metrics")]
    run_id = new_run_id("watch", name)
    planned = s.windows or (math.ceil(s.duration / s.interval) if s.duration else 0)
    run = Run.create(run_id, {
        "kind": "watch", "engine": s.engine or "unknown", "model": {"path": None}, "dataset": None,
        "settings": s.to_json(), "progress": {"done": 0, "total": planned},
        "watch": {"server_url": s.server_url, "metrics_url": url, "verdict": None, "stopped_by": None}}, data)
    tracker = Tracker(s)
    stop = _Stop()
    section = {"server_url": s.server_url, "metrics_url": url, "verdict": None, "stopped_by": None}

    def save() -> None:
        _write_windows(run, tracker.windows)
        section["verdict"] = tracker.verdict(run_id)
        run.record(watch=section)

    guard = RunGuard(run, save=save,
                     interrupted=lambda: f"interrupted (a second Ctrl-C) after {len(tracker.windows)} window(s); "
                                         f"they are kept in {WINDOWS}")
    with stop, guard, open(run.file(JOURNAL), "a") as journal:
        _write_windows(run, [])     # pyarrow's import and the first write before the first scrape, not inside window 2
        t_scrape = time.monotonic()
        try:
            text = scrape(url, s.timeout)
            t_prev_wall = time.time()          # the counters' moment: the scrape's answer, before parsing or more calls
        except ScrapeError as e:
            raise SpecLensError(f"cannot reach {url} ({e}): is the server up on that host and port? Start it "
                                f"(e.g. `{START_WITH_DRAFTER['vllm']}`) or pass its address with --server-url; the "
                                f"run {run_id} is kept as failed") from None
        prev = _parse(text, s.engine, url)
        engine = prev.engine
        version, model = _server_info(base, s.timeout)
        run.record(engine=engine, engine_version=version, model={"path": model})
        if not prev.speculative:
            raise SpecLensError(_no_spec(engine, url))
        missed, i, stopped_by, t_begin, tick = 0, 0, None, t_scrape, 0
        while True:
            if s.windows is not None and i >= s.windows:
                stopped_by = "windows"
                break
            tick = max(tick + 1, int((time.monotonic() - t_begin) / s.interval))   # on the grid; a slow scrape
            next_t = t_begin + tick * s.interval                                    # skips ticks, never piles up
            if s.duration is not None and next_t - t_begin > s.duration + 1e-6:
                stopped_by = "duration"
                break
            stop.sleep_until(next_t)
            if stop.event.is_set():
                stopped_by = "signal"
                break
            try:
                text = scrape(url, s.timeout)
                t_wall = time.time()
            except ScrapeError as e:
                missed += 1
                if missed >= s.max_missed:
                    save()
                    raise SpecLensError(
                        f"lost {url} after {len(tracker.windows)} window(s): {missed} scrapes in a row failed ({e}); "
                        f"is the server still up? The run {run_id} keeps its windows (failed); start a new watch "
                        "when it is back") from None
                continue
            cur = _parse(text, engine, url)
            if not cur.speculative:
                save()
                raise SpecLensError(_no_spec(engine, url, after=len(tracker.windows)))
            i += 1
            w = tracker.add(make_window(i, t_prev_wall, t_wall, prev, cur))
            if missed:
                w["note"] = "; ".join(x for x in (w["note"], f"{missed} failed scrape(s) inside") if x)
            if engine == "sglang" and w["drafts"] == 0 and (w["generation_tokens"] or 0) > 0 \
                    and (w["finished_requests"] or 0) > 0:
                save()
                raise SpecLensError(_no_spec(engine, url, after=len(tracker.windows) - 1))
            journal.write(json.dumps({k: v for k, v in w.items() if not k.startswith("_")}) + "\n")
            journal.flush()
            _write_windows(run, tracker.windows)
            section["verdict"] = tracker.verdict(run_id)
            run.record(watch=section)
            run.progress(len(tracker.windows), max(planned, len(tracker.windows)))
            if echo:
                echo(_window_line(w))
            prev, t_prev_wall, missed = cur, t_wall, 0
        section["stopped_by"] = stopped_by
        save()
    ws = tracker.windows
    span = ws[-1]["t_end"] - ws[0]["t_start"] if ws else 0.0
    run.complete(drop=(JOURNAL,), watch=section, progress={"done": len(ws), "total": len(ws)},
                 headline={"windows": len(ws), "seconds": round(span, 3)})
    return WatchResult(run_id, run.path, "complete", section["verdict"], len(ws))


def _parse(text: str, engine: str | None, url: str) -> server_metrics.Counters:
    try:
        return server_metrics.parse(text, engine)
    except server_metrics.MetricsError as e:
        raise SpecLensError(f"{url}: {e}; point --server-url at a vLLM or SGLang server") from None


def _no_spec(engine: str, url: str, after: int | None = None) -> str:
    name = engine_label(engine)
    what = ("serves no speculative-decoding counters (vllm:spec_decode_*)" if engine == "vllm"
            else "generates tokens without verification steps (sglang:spec_verify_calls_total stays 0)")
    when = "" if after is None else f" (after {after} window(s), kept in the run)"
    return (f"{url}: this {name} server {what}{when}: it runs without a drafter; start it with one, e.g. "
            f"`{START_WITH_DRAFTER[engine]}`")
