"""What a serving engine's `GET /metrics` says about speculative decoding, as one typed snapshot per scrape.

Both engines expose Prometheus text; it is parsed with `prometheus_client`'s own parser, never by hand.

vLLM (0.22 and later, `vllm/v1/spec_decode/metrics.py`; labels `model_name`, `engine`, summed here):

    vllm:spec_decode_num_drafts_total                       verification steps
    vllm:spec_decode_num_draft_tokens_total                 proposed tokens
    vllm:spec_decode_num_accepted_tokens_total              proposed tokens kept
    vllm:spec_decode_num_accepted_tokens_per_pos_total      the same per draft position (label `position`)
    vllm:generation_tokens_total, vllm:request_success_total, vllm:num_requests_running / _waiting

SGLang (0.5.x with `--enable-metrics`, `sglang/srt/observability/metrics_collector.py`): counters that the
tokenizer manager increments once per *finished* request, so any interval between two scrapes holds whole requests:

    sglang:spec_verify_calls_total   verification steps (the request's spec_verify_ct)
    sglang:generation_tokens_total   completion tokens
    sglang:num_requests_total        finished requests
    sglang:num_running_reqs, sglang:num_queue_reqs (gauges), sglang:spec_accept_length (gauge, last batch)

A request's completion is its prefill token plus, per verification step, the accepted drafts and one bonus token:
completion = 1 + verify_ct + accepted, hence accepted = generation_tokens - requests - verify_calls over an interval,
and tau = 1 + accepted / verify_calls (the definition of backend/metrics.py). SGLang's counters carry no
per-position counts; its per-request `meta_info` histogram does (backend/metrics.from_sglang).

Counters only grow while a server lives: a counter that went down between two scrapes means the server restarted
(`CounterReset`), never a negative interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from backend import metrics
from backend.options import SERVING_ENGINES

ENGINES = SERVING_ENGINES

_VLLM = {"drafts": "vllm:spec_decode_num_drafts", "draft_tokens": "vllm:spec_decode_num_draft_tokens",
         "accepted": "vllm:spec_decode_num_accepted_tokens", "generation_tokens": "vllm:generation_tokens",
         "requests": "vllm:request_success"}
_VLLM_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
_VLLM_GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting"}
_SGLANG = {"drafts": "sglang:spec_verify_calls", "generation_tokens": "sglang:generation_tokens",
           "requests": "sglang:num_requests"}
_SGLANG_GAUGES = {"running": "sglang:num_running_reqs", "waiting": "sglang:num_queue_reqs",
                  "accept_length_gauge": "sglang:spec_accept_length"}


class MetricsError(ValueError):
    """The text is not Prometheus exposition text, or holds neither engine's counters."""


class CounterReset(ValueError):
    """A counter went down between two scrapes: the server restarted in between."""


@dataclass(frozen=True)
class Counters:
    """One scrape. Counters are cumulative since the server started; None where the server has no such metric."""

    engine: str                                   # "vllm" | "sglang"
    drafts: float | None = None                   # verification steps
    draft_tokens: float | None = None             # proposed tokens (vLLM only)
    accepted: float | None = None                 # proposed tokens kept (vLLM only; SGLang's follows from a delta)
    per_pos: tuple[float, ...] | None = None      # accepted at draft position i (vLLM only)
    generation_tokens: float | None = None
    requests: float | None = None                 # finished requests
    running: float | None = None                  # gauges: requests running / waiting now
    waiting: float | None = None
    accept_length_gauge: float | None = None      # SGLang's last-batch acceptance length (a gauge, not a count)
    extra: dict = field(default_factory=dict)

    @property
    def speculative(self) -> bool:
        """Whether the server exposes speculative-decoding counters at all (vLLM registers them only with a drafter;
        SGLang's verify counter exists either way, so a non-speculative SGLang server is told by a zero delta)."""
        return self.drafts is not None


@dataclass(frozen=True)
class Interval:
    """What happened between two scrapes of one server (counter deltas)."""

    engine: str
    drafts: float
    accepted: float
    draft_tokens: float | None
    per_pos: list[float] | None
    generation_tokens: float | None
    requests: float | None

    def acceptance(self, k: int | None = None) -> metrics.AcceptanceStats:
        """The interval as backend.metrics' AcceptanceStats (tau, acceptance rate, per-position rates)."""
        draft_tokens = self.draft_tokens if self.draft_tokens is not None else (
            self.drafts * k if k else 0)
        per_pos = [int(round(x)) for x in self.per_pos] if self.per_pos is not None else None
        if per_pos is not None and k:
            per_pos = (per_pos + [0] * k)[:k]
        return metrics.AcceptanceStats(int(round(self.drafts)), int(round(draft_tokens)), int(round(self.accepted)),
                                       per_pos)


# every family parse() reads; a server's other families (vLLM: ~40 histograms, ~550 of its ~600 lines) are dropped
# before prometheus_client parses the text
_READ = frozenset([*_VLLM.values(), _VLLM_PER_POS, *_VLLM_GAUGES.values(), *_SGLANG.values(), *_SGLANG_GAUGES.values()])
_SUFFIXES = ("", "_total", "_created")


def _metric_name(line: str) -> str:
    """The metric a line of exposition text belongs to: `# HELP name ...` / `# TYPE name ...` or `name{...} value`."""
    if line.startswith("#"):
        parts = line.split(None, 3)
        return parts[2] if len(parts) > 2 and parts[1] in ("HELP", "TYPE") else ""
    end = len(line)
    for stop in "{ \t":
        i = line.find(stop)
        if 0 <= i < end:
            end = i
    return line[:end]


def _wanted(name: str) -> bool:
    return any(name.endswith(suf) and name[: len(name) - len(suf)] in _READ for suf in _SUFFIXES)


def _engine_of(text: str) -> str | None:
    """Which engine's metrics the text holds (a sample line of vllm:* or sglang:*), before anything is dropped."""
    for line in text.splitlines():
        if line.startswith("vllm:"):
            return "vllm"
        if line.startswith("sglang:"):
            return "sglang"
    return None


def _families(text: str) -> dict[str, list]:
    """The families parse() reads, parsed by prometheus_client. Only their lines are handed to the parser: it costs
    ~20 us a line, ~11 ms for vLLM's whole text on an idle core and over a second on a core shared with a busy CPU
    server, where the watch must keep its cadence."""
    kept = "\n".join(x for x in text.splitlines() if _wanted(_metric_name(x))) + "\n"
    out: dict[str, list] = {}
    try:
        for fam in text_string_to_metric_families(kept):
            out.setdefault(fam.name, []).extend(fam.samples)
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise MetricsError(f"not Prometheus text ({str(e)[:80]})") from None
    return out


def _counter(fams: dict[str, list], name: str) -> float | None:
    """Sum over label sets of a counter's `_total` samples (prometheus_client names the family without `_total`)."""
    samples = fams.get(name)
    if samples is None:
        return None
    vals = [s.value for s in samples if s.name in (name + "_total", name)]
    return float(sum(vals)) if vals else None


def _gauge(fams: dict[str, list], name: str) -> float | None:
    samples = fams.get(name)
    if not samples:
        return None
    vals = [s.value for s in samples if s.name == name and not math.isnan(s.value)]
    return float(sum(vals)) if vals else None


def parse(text: str, engine: str | None = None) -> Counters:
    """`/metrics` text -> Counters. `engine` None: told from the metric names (vllm:* or sglang:*)."""
    fams = _families(text)
    if engine is None:
        engine = _engine_of(text)
        if engine is None:
            raise MetricsError("neither vllm:* nor sglang:* metrics (is this a vLLM or SGLang server with metrics "
                               "on? SGLang needs --enable-metrics)")
    if engine == "vllm":
        vals = {k: _counter(fams, n) for k, n in _VLLM.items()}
        per_pos = None
        if _VLLM_PER_POS in fams:
            by_pos: dict[int, float] = {}
            for s in fams[_VLLM_PER_POS]:
                if s.name == _VLLM_PER_POS + "_total" and "position" in s.labels:
                    p = int(s.labels["position"])
                    by_pos[p] = by_pos.get(p, 0.0) + s.value
            if by_pos:
                per_pos = tuple(by_pos.get(i, 0.0) for i in range(max(by_pos) + 1))
        gauges = {k: _gauge(fams, n) for k, n in _VLLM_GAUGES.items()}
        return Counters("vllm", per_pos=per_pos, **vals, **gauges)
    if engine == "sglang":
        vals = {k: _counter(fams, n) for k, n in _SGLANG.items()}
        gauges = {k: _gauge(fams, n) for k, n in _SGLANG_GAUGES.items()}
        return Counters("sglang", **vals, **gauges)
    raise MetricsError(f"engine '{engine}': expected one of {', '.join(ENGINES)}")


def _d(a: float | None, b: float | None, what: str) -> float | None:
    if a is None or b is None:
        return None
    if b < a - 1e-9:
        raise CounterReset(f"{what} went from {a:g} to {b:g}: the server restarted between the two scrapes")
    return b - a


def delta(before: Counters, after: Counters) -> Interval:
    """Counter deltas between two scrapes of one server; `CounterReset` when the server restarted in between."""
    if before.engine != after.engine:
        raise MetricsError(f"scrapes of two engines ({before.engine}, {after.engine})")
    drafts = _d(before.drafts, after.drafts, "drafts")
    gen = _d(before.generation_tokens, after.generation_tokens, "generation tokens")
    req = _d(before.requests, after.requests, "finished requests")
    per_pos = None
    if before.per_pos is not None or after.per_pos is not None:
        a, b = list(before.per_pos or ()), list(after.per_pos or ())
        n = max(len(a), len(b))
        a, b = a + [0.0] * (n - len(a)), b + [0.0] * (n - len(b))
        per_pos = [_d(x, y, f"accepted at position {i}") for i, (x, y) in enumerate(zip(a, b))]
    if after.engine == "vllm":
        accepted = _d(before.accepted, after.accepted, "accepted tokens") or 0.0
        draft_tokens = _d(before.draft_tokens, after.draft_tokens, "draft tokens")
    else:                           # completion = 1 + verify_ct + accepted, summed over finished requests
        accepted = max(0.0, (gen or 0.0) - (req or 0.0) - (drafts or 0.0)) if drafts else 0.0
        draft_tokens = None
    return Interval(after.engine, drafts or 0.0, accepted, draft_tokens, per_pos, gen, req)
