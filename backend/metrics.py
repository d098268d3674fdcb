"""Acceptance and speed metrics for speculative decoding: one definition, used by every engine and page.

Definitions (docs/CONVENTIONS.md#metrics). A *draft* is one verification step of K proposed tokens; `accepted`
counts proposed tokens the target kept (the bonus token is not a draft token):

    tau (mean acceptance length) = 1 + accepted / drafts        plain decoding = 1.00; includes the bonus
    acceptance rate              = accepted / draft_tokens      draft_tokens = K * drafts for a chain
    per-position rate i          = accepted_at_pos[i] / drafts  i = 0..K-1
    histogram[n]                 = drafts with exactly n accepted tokens, n = 0..K
    accepted_at_pos[i]           = sum_{n > i} histogram[n]     (a chain accepts a prefix)

Sources: our own per-step accepted lengths (`from_accepted_lengths`), vLLM counter deltas (`from_vllm`)
and SGLang per-request meta_info (`from_sglang`). Speed: tokens/s, TTFT, TPOT (`RequestTiming`), and
the Spec-Bench speedup over a paired baseline with a confidence interval (`speedup`). No I/O here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

VLLM_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")


# ---------------------------------------------------------------------- acceptance


def histogram(accepted_lengths: Sequence[int], k: int) -> list[int]:
    """Per-step accepted lengths (each 0..k) -> counts hist[n], n = 0..k."""
    hist = [0] * (k + 1)
    for n in accepted_lengths:
        if not 0 <= n <= k:
            raise ValueError(f"accepted length {n} outside 0..{k}")
        hist[n] += 1
    return hist


def per_position_counts(hist: Sequence[int]) -> list[int]:
    """hist[n] (n = 0..K) -> accepted_at_pos[i] = sum_{n > i} hist[n], i = 0..K-1 (chain drafting)."""
    return [sum(hist[i + 1:]) for i in range(len(hist) - 1)]


@dataclass
class AcceptanceStats:
    drafts: int                                  # verification steps
    draft_tokens: int                            # proposed tokens (K per step for a chain)
    accepted: int                                # proposed tokens kept by the target
    per_pos: list[int] | None = None             # accepted_at_pos[i], i = 0..K-1
    hist: list[int] | None = None                # drafts with n accepted, n = 0..K (None: source has none)

    @property
    def tau(self) -> float:
        """Mean acceptance length, bonus token included; 1.0 when nothing was drafted."""
        return 1.0 + self.accepted / self.drafts if self.drafts else 1.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def per_pos_rate(self) -> list[float] | None:
        if self.per_pos is None or not self.drafts:
            return None
        return [c / self.drafts for c in self.per_pos]

    def __add__(self, other: AcceptanceStats) -> AcceptanceStats:
        def add(a: list[int] | None, b: list[int] | None) -> list[int] | None:
            if a is None or b is None:
                return None
            n = max(len(a), len(b))
            return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]
        return AcceptanceStats(self.drafts + other.drafts, self.draft_tokens + other.draft_tokens,
                               self.accepted + other.accepted, add(self.per_pos, other.per_pos),
                               add(self.hist, other.hist))

    def to_dict(self) -> dict:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted": self.accepted,
                "tau": self.tau, "acceptance_rate": self.acceptance_rate, "per_pos": self.per_pos,
                "per_pos_rate": self.per_pos_rate, "hist": self.hist}


def from_accepted_lengths(accepted_lengths: Sequence[int], k: int) -> AcceptanceStats:
    """Our engines' record: one accepted length (0..k) per verification step of a K-token chain."""
    hist = histogram(accepted_lengths, k)
    return AcceptanceStats(drafts=len(accepted_lengths), draft_tokens=k * len(accepted_lengths),
                           accepted=int(sum(accepted_lengths)), per_pos=per_position_counts(hist), hist=hist)


def _vllm_name(key: str) -> str:
    """'vllm:spec_decode_num_drafts_total' (Prometheus) or 'num_drafts' (offline) -> 'num_drafts'."""
    return key.removeprefix("vllm:").removeprefix("spec_decode_").removesuffix("_total")


def from_vllm(before: Mapping[str, object], after: Mapping[str, object]) -> AcceptanceStats:
    """Deltas of vLLM's spec-decode counters around a workload (vLLM reports no per-request stats).
    Keys: num_drafts, num_draft_tokens, num_accepted_tokens (ints), num_accepted_tokens_per_pos (list);
    Prometheus names (`vllm:spec_decode_..._total`) are accepted too. vLLM has no histogram."""
    b = {_vllm_name(k): v for k, v in before.items()}
    a = {_vllm_name(k): v for k, v in after.items()}
    d = {k: int(a.get(k, 0)) - int(b.get(k, 0)) for k in VLLM_COUNTERS[:3]}
    pa, pb = a.get("num_accepted_tokens_per_pos"), b.get("num_accepted_tokens_per_pos") or []
    per_pos = None
    if pa is not None:
        pa, pb = list(pa), list(pb)
        per_pos = [int(pa[i]) - int(pb[i] if i < len(pb) else 0) for i in range(len(pa))]
    return AcceptanceStats(drafts=d["num_drafts"], draft_tokens=d["num_draft_tokens"],
                           accepted=d["num_accepted_tokens"], per_pos=per_pos)


@dataclass
class SGLangRequest:
    """One SGLang request's meta_info, converted. `raw_accept_length` is SGLang's own
    spec_accept_length = completion_tokens / verify_ct, biased high by about 1/verify_ct because the
    completion counts the token sampled at prefill (no verify step made it); `tau` = 1 + correct / verify_ct
    is the unbiased figure (e.g. completion 64, verify_ct 63, correct 0: raw 64/63 = 1.0159, tau 1.0)."""

    tau: float
    raw_accept_length: float | None
    stats: AcceptanceStats


def sglang_request(meta: Mapping[str, object], k: int | None = None) -> SGLangRequest:
    """meta_info keys: spec_verify_ct, spec_num_correct_drafts, spec_correct_drafts_histogram
    ([n] = verify steps with n correct drafts, n = 0..K), spec_accept_length (kept raw).
    K is `k` when given (chain: --speculative-num-steps K); the histogram only runs up to the largest count
    seen (H200, 0.5.15: `[63]` for 63 steps with no correct draft), so its length - 1 is only a fallback."""
    verify = int(meta.get("spec_verify_ct") or 0)
    correct = int(meta.get("spec_num_correct_drafts") or 0)
    hist = meta.get("spec_correct_drafts_histogram")
    hist = [int(h) for h in hist] if hist is not None else None
    kk = k if k is not None else (len(hist) - 1 if hist else None)
    stats = AcceptanceStats(drafts=verify, draft_tokens=(kk or 0) * verify, accepted=correct,
                            per_pos=per_position_counts(hist) if hist else None, hist=hist)
    raw = meta.get("spec_accept_length")
    return SGLangRequest(tau=stats.tau, raw_accept_length=float(raw) if raw is not None else None, stats=stats)


def from_sglang(metas: Sequence[Mapping[str, object]], k: int | None = None) -> AcceptanceStats:
    """Sum of the requests' acceptance (each weighted by its verify steps, like vLLM's counters)."""
    total = AcceptanceStats(0, 0, 0, per_pos=[], hist=[])
    for m in metas:
        total = total + sglang_request(m, k).stats
    if total.hist == []:
        total.hist, total.per_pos = None, None
    return total


# ---------------------------------------------------------------------- speed


@dataclass
class RequestTiming:
    output_tokens: int
    seconds: float           # first forward started -> last token out
    ttft: float | None       # first forward started -> first output token (None: the engine does not say)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (seconds - ttft) / (tokens - 1); None without a ttft."""
        if self.output_tokens <= 1 or self.ttft is None:
            return None
        return (self.seconds - self.ttft) / (self.output_tokens - 1)


def throughput(output_tokens: int, seconds: float) -> float:
    """Output tokens per second (NaN for zero time)."""
    return output_tokens / seconds if seconds > 0 else float("nan")


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof 1; 0.0 for a single value)."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    m = sum(values) / n
    return m, (math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0)


# Student t 0.975 quantiles, df 1..30 (two-sided 95%); beyond 30 the normal 1.96 is within 2%.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t_quantile_975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96


@dataclass
class Speedup:
    mean: float                     # mean over repeats of speedup_r
    std: float                      # sample std over repeats (0 for one repeat)
    per_repeat: list[float]
    ci_low: float
    ci_high: float
    ci_method: str                  # "bootstrap" (paired, over prompts) or "t" (over repeats)
    n_repeats: int
    n_prompts: int
    level: float = 0.95
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"mean": self.mean, "std": self.std, "per_repeat": self.per_repeat, "ci_low": self.ci_low,
                "ci_high": self.ci_high, "ci_method": self.ci_method, "level": self.level,
                "n_repeats": self.n_repeats, "n_prompts": self.n_prompts}


@lru_cache(maxsize=16)            # 2000 x 116 int64 indices: 1.9 MB each
def _resamples(n: int, n_boot: int, seed: int) -> np.ndarray:
    """Bootstrap indices (n_boot resamples of n items), the same for the same (n, n_boot, seed): drawn once and
    shared by every interval of a page (drawing them is most of an interval's cost). Read-only."""
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    idx.flags.writeable = False
    return idx


def tau_difference(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], n_boot: int = 2000,
                   seed: int = 0) -> tuple[float, float, float]:
    """tau(a) - tau(b) and its 95% paired bootstrap interval over prompts. a[p], b[p] = (accepted, drafts) of
    prompt p (summed over repeats), prompts paired by index; tau = 1 + sum(accepted) / sum(drafts)."""
    A, B = np.asarray(a, dtype=np.float64).reshape(-1, 2), np.asarray(b, dtype=np.float64).reshape(-1, 2)
    if len(A) == 0 or A.shape != B.shape or A[:, 1].sum() <= 0 or B[:, 1].sum() <= 0:
        raise ValueError("tau_difference needs (accepted, drafts) of the same prompts for both runs, with drafts")
    diff = float(A[:, 0].sum() / A[:, 1].sum() - B[:, 0].sum() / B[:, 1].sum())
    idx = _resamples(len(A), n_boot, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.sort(A[idx, 0].sum(1) / A[idx, 1].sum(1) - B[idx, 0].sum(1) / B[idx, 1].sum(1))
    d = d[np.isfinite(d)]
    return diff, float(d[int(0.025 * (len(d) - 1))]), float(d[int(math.ceil(0.975 * (len(d) - 1)))])


def speedup(method_tps: Sequence[Sequence[float]], baseline_tps: Sequence[Sequence[float]],
            ci: str = "bootstrap", n_boot: int = 2000, seed: int = 0) -> Speedup:
    """Spec-Bench speedup. method_tps[r][p], baseline_tps[r][p]: per-prompt tokens/s, R repeats x P prompts,
    prompts paired by index. speedup_r = mean_p method[r] / mean_p baseline[r]; reported as mean +- std over r.
    95% CI: "bootstrap" resamples prompts (pairs kept together, tokens/s averaged over repeats first),
    "t" is mean +- t(0.975, R-1) * std / sqrt(R) over the repeats (needs R >= 2)."""
    R, P = len(method_tps), len(method_tps[0]) if method_tps else 0
    if R == 0 or P == 0 or len(baseline_tps) != R or any(len(m) != P or len(b) != P
                                                          for m, b in zip(method_tps, baseline_tps)):
        raise ValueError("speedup needs method and baseline tokens/s of the same repeats x prompts shape")
    per_rep = [(sum(m) / P) / (sum(b) / P) for m, b in zip(method_tps, baseline_tps)]
    mean, std = mean_std(per_rep)
    if ci == "t":
        if R < 2:
            raise ValueError("a t interval needs at least 2 repeats; use ci='bootstrap'")
        half = t_quantile_975(R - 1) * std / math.sqrt(R)
        lo, hi = mean - half, mean + half
    elif ci == "bootstrap":
        m_p = np.asarray(method_tps, dtype=np.float64).mean(0)       # [P], tokens/s averaged over repeats
        b_p = np.asarray(baseline_tps, dtype=np.float64).mean(0)
        idx = _resamples(P, n_boot, seed)   # one resample of prompts per row
        ratios = np.sort(m_p[idx].sum(1) / b_p[idx].sum(1))
        lo, hi = float(ratios[int(0.025 * (n_boot - 1))]), float(ratios[int(math.ceil(0.975 * (n_boot - 1)))])
    else:
        raise ValueError(f"unknown ci method {ci!r}; use 'bootstrap' or 't'")
    return Speedup(mean, std, per_rep, lo, hi, ci, R, P)


# ---------------------------------------------------------------------- throughput: two definitions, with intervals

# The two throughput figures people quote differ (the demo: 140.8 against 70.6 tokens/s for one run); the Compare
# page names both. key -> (name, definition)
THROUGHPUT = {
    "per_prompt": ("mean per-prompt tokens/s",
                   "each prompt's output tokens over its own generation time, averaged over the prompts (and repeats); "
                   "every prompt counts the same: Spec-Bench's figure"),
    "total": ("total tokens / total time",
              "all output tokens over all generation time, prompts run one after another; long answers weigh more: "
              "the output throughput that `vllm bench serve` and SGLang's bench scripts print"),
}


@dataclass
class Estimate:
    """A figure with its 95% bootstrap interval over prompts (repeats of a prompt stay together)."""

    value: float
    ci_low: float
    ci_high: float
    n_repeats: int
    n_prompts: int               # prompts the figure rests on (those with a value)
    level: float = 0.95

    def to_dict(self) -> dict:
        return {"value": self.value, "ci_low": self.ci_low, "ci_high": self.ci_high, "n_repeats": self.n_repeats,
                "n_prompts": self.n_prompts, "level": self.level}


NAN_ESTIMATE = Estimate(math.nan, math.nan, math.nan, 0, 0)


def _interval(samples: np.ndarray) -> tuple[float, float]:
    """2.5th and 97.5th percentiles (nearest rank, as `speedup`) of the finite bootstrap samples."""
    d = np.sort(samples[np.isfinite(samples)])
    if not len(d):
        return math.nan, math.nan
    return float(d[int(0.025 * (len(d) - 1))]), float(d[int(math.ceil(0.975 * (len(d) - 1)))])


def _rp(values: Sequence[Sequence[float | None]]) -> np.ndarray:
    """R repeats x P prompts as float64, None -> NaN."""
    return np.asarray(values, dtype=np.float64).reshape(len(values), -1)


def mean_estimate(values: Sequence[Sequence[float | None]], n_boot: int = 2000, seed: int = 0) -> Estimate:
    """Mean over prompts of a per-prompt figure (tokens/s, TTFT, TPOT). values[r][p], R repeats x P prompts, None or
    NaN where a prompt has no value (TPOT of a one-token answer). Each prompt's value is averaged over its repeats
    first; the interval resamples prompts. With every value present this is the mean over repeats of each repeat's
    mean over prompts (the tokens/s the bench stores)."""
    v = _rp(values)
    if v.size == 0:
        return NAN_ESTIMATE
    n = np.isfinite(v).sum(0)
    per_prompt = np.where(np.isfinite(v), v, 0.0).sum(0)[n > 0] / n[n > 0]
    if not len(per_prompt):
        return Estimate(math.nan, math.nan, math.nan, v.shape[0], 0)
    idx = _resamples(len(per_prompt), n_boot, seed)
    lo, hi = _interval(per_prompt[idx].mean(1))
    return Estimate(float(per_prompt.mean()), lo, hi, v.shape[0], len(per_prompt))


def total_throughput(output_tokens: Sequence[Sequence[float]], seconds: Sequence[Sequence[float]],
                     n_boot: int = 2000, seed: int = 0) -> Estimate:
    """Total output tokens over total generation time (`throughput`) of R repeats x P prompts, with a bootstrap
    interval over prompts (each prompt's tokens and seconds summed over its repeats)."""
    t, s = _rp(output_tokens), _rp(seconds)
    if t.size == 0 or t.shape != s.shape:
        raise ValueError("total_throughput needs output tokens and seconds of the same repeats x prompts shape")
    tp, sp = t.sum(0), s.sum(0)
    idx = _resamples(len(tp), n_boot, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        lo, hi = _interval(tp[idx].sum(1) / sp[idx].sum(1))
    return Estimate(throughput(float(tp.sum()), float(sp.sum())), lo, hi, t.shape[0], t.shape[1])


def speedup_total(method_tokens: Sequence[Sequence[float]], method_seconds: Sequence[Sequence[float]],
                  baseline_tokens: Sequence[Sequence[float]], baseline_seconds: Sequence[Sequence[float]],
                  n_boot: int = 2000, seed: int = 0) -> Speedup:
    """Speedup by total tokens over total time: speedup_r = (sum_p tokens / sum_p seconds of the method in repeat r)
    / (the same of the baseline); mean +- std over r. 95% CI: paired bootstrap over prompts (tokens and seconds
    summed over repeats first). Arrays R repeats x P prompts, prompts paired by index (as `speedup`)."""
    mt, ms, bt, bs = (_rp(x) for x in (method_tokens, method_seconds, baseline_tokens, baseline_seconds))
    if mt.size == 0 or not (mt.shape == ms.shape == bt.shape == bs.shape):
        raise ValueError("speedup_total needs tokens and seconds of the same repeats x prompts shape on both sides")
    R, P = mt.shape
    per_rep = [float((mt[r].sum() / ms[r].sum()) / (bt[r].sum() / bs[r].sum())) for r in range(R)]
    mean, std = mean_std(per_rep)
    idx = _resamples(P, n_boot, seed)
    m_t, m_s, b_t, b_s = mt.sum(0), ms.sum(0), bt.sum(0), bs.sum(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lo, hi = _interval((m_t[idx].sum(1) / m_s[idx].sum(1)) / (b_t[idx].sum(1) / b_s[idx].sum(1)))
    return Speedup(mean, std, per_rep, lo, hi, "bootstrap", R, P)


MIN_INTERVAL_PROMPTS = 5     # a figure over fewer prompts (a Spec-Bench category of 2) is shown without an interval


def interval_shown(n_prompts: int, lo: float | None, hi: float | None) -> tuple[float, float]:
    """The 95% interval of a figure over n_prompts prompts as it may be shown: (lo, hi) from MIN_INTERVAL_PROMPTS
    prompts on, else (nan, nan). A bootstrap over 2 prompts draws only 3 distinct resamples and spans what those two
    prompts did (tau 0.94 [0.93, 0.95] over 2 is no statement about the category), so the figure stands alone."""
    if n_prompts < MIN_INTERVAL_PROMPTS or lo is None or hi is None:
        return math.nan, math.nan
    return float(lo), float(hi)


def tau_estimate(per_prompt: Sequence[Sequence[float]], n_boot: int = 2000, seed: int = 0) -> Estimate:
    """tau = 1 + sum(accepted) / sum(drafts) over prompts, with a bootstrap interval over prompts. per_prompt[p] =
    (accepted, drafts) of prompt p summed over its repeats (n_repeats is reported as 0: not known here)."""
    a = np.asarray(per_prompt, dtype=np.float64).reshape(-1, 2)
    if not len(a) or a[:, 1].sum() <= 0:
        return Estimate(1.0, 1.0, 1.0, 0, len(a)) if len(a) else NAN_ESTIMATE
    idx = _resamples(len(a), n_boot, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        lo, hi = _interval(1 + a[idx, 0].sum(1) / a[idx, 1].sum(1))
    return Estimate(float(1 + a[:, 0].sum() / a[:, 1].sum()), lo, hi, 0, len(a))


# ---------------------------------------------------------------------- serving load (many requests in flight)

SERVING = {
    "output_tps": ("output tokens/s", "all output tokens of a level over the level's wall time, first request sent to "
                                      "last one finished: the output throughput of `vllm bench serve`"),
    "per_user_tps": ("per-user tokens/s", "median over requests of output tokens / request latency: how fast one "
                                          "user's answer streams"),
    "speedup": ("speedup", "drafter output tokens/s / paired baseline output tokens/s at the same concurrency, same "
                           "prompts, same order, same max tokens"),
}


def percentiles(values: Sequence[float | None], qs: Sequence[int] = (50, 90, 99)) -> dict[str, float | None]:
    """{'p50': ..} of the finite values (numpy's linear interpolation, as `vllm bench serve`); None when empty."""
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    v = v[np.isfinite(v)]
    return {f"p{q}": (float(np.percentile(v, q)) if len(v) else None) for q in qs}


def level_speedup(method_tokens: Sequence[float], method_latency: Sequence[float], method_seconds: float,
                  baseline_tokens: Sequence[float], baseline_latency: Sequence[float], baseline_seconds: float,
                  n_boot: int = 2000, seed: int = 0) -> Estimate:
    """Speedup of one concurrency level: (sum of method output tokens / method level seconds) / (the same of the
    baseline). Interval: requests are paired by index (same prompt, same position in the order); in steady state
    a level's throughput is concurrency x sum(tokens) / sum(latency), so the bootstrap resamples request pairs and
    scales the point value by the resampled ratio of sum(tokens)/sum(latency) over its full-sample value. It covers
    request-to-request variation, not a drift of the machine between the two levels (repeats and the interleaved
    order do that)."""
    mt, ml = np.asarray(method_tokens, np.float64), np.asarray(method_latency, np.float64)
    bt, bl = np.asarray(baseline_tokens, np.float64), np.asarray(baseline_latency, np.float64)
    n = min(len(mt), len(bt))
    if n == 0 or method_seconds <= 0 or baseline_seconds <= 0:
        return NAN_ESTIMATE
    point = (mt.sum() / method_seconds) / (bt.sum() / baseline_seconds)
    mt, ml, bt, bl = mt[:n], ml[:n], bt[:n], bl[:n]
    full = (mt.sum() / ml.sum()) / (bt.sum() / bl.sum())
    idx = _resamples(n, n_boot, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = (mt[idx].sum(1) / ml[idx].sum(1)) / (bt[idx].sum(1) / bl[idx].sum(1)) / full * point
    lo, hi = _interval(boot)
    return Estimate(float(point), lo, hi, 1, n)


def agreement(a: float | None, b: float | None) -> float | None:
    """Relative difference |a - b| / b (None when either is missing or b is 0): server counters vs own count."""
    if a is None or b is None or b == 0 or not (math.isfinite(a) and math.isfinite(b)):
        return None
    return abs(a - b) / abs(b)


# ---------------------------------------------------------------------- drift of a live server's acceptance (watch)

@lru_cache(maxsize=128)
def t_quantile(p: float, df: int) -> float:
    """Student t quantile for p in (0.5, 1) and df >= 1: bisection on the CDF, 0.5 + the density integrated from 0
    by Simpson's rule (agrees with the 0.975 table above to 3 decimals)."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1 (got p={p}, df={df})")
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(x: float) -> float:
        t = np.linspace(0.0, x, 4001)
        f = c * (1 + t * t / df) ** (-(df + 1) / 2)
        return 0.5 + float((x / 4000 / 3) * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum()))

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def accepted_sq(per_pos: Sequence[float]) -> float:
    """Sum over drafts of (accepted length)^2 from per-position accepted counts of a chain: a draft with n accepted
    tokens is counted at positions 0..n-1, and n^2 = sum_{i<n} (2i + 1)."""
    return float(sum((2 * i + 1) * c for i, c in enumerate(per_pos)))


@dataclass(frozen=True)
class DriftBand:
    """The baseline of a watch (its first windows with traffic) and the one-sided band a later window's tau is
    checked against (`drift_band`)."""

    tau: float                # pooled baseline tau = 1 + sum(accepted) / sum(drafts)
    within_var: float         # per-draft variance of the accepted length (sigma^2)
    between_var: float        # window-to-window variance of accepted per draft (omega^2, DerSimonian-Laird)
    windows: int              # baseline windows B
    drafts: int               # drafts in the baseline
    mean_var: float           # variance of the baseline's pooled accepted-per-draft under the same model
    t: float                  # t quantile (level, B - 1 df)
    level: float              # one-sided
    within_from: str          # "per-position counts" | "dispersion of the windows" (no per-position counts)

    def half_width(self, drafts: float) -> float:
        if drafts <= 0:
            return math.inf
        return self.t * math.sqrt(self.between_var + self.within_var / drafts + self.mean_var)

    def band(self, drafts: float) -> tuple[float, float]:
        """(low, high) of tau for a window of `drafts` drafts: a one-sided `level` prediction bound each side."""
        h = self.half_width(drafts)
        return self.tau - h, self.tau + h

    def below(self, accepted: float, drafts: float) -> bool:
        """Whether a window's tau lies below its band (drift evidence)."""
        return drafts > 0 and 1 + accepted / drafts < self.band(drafts)[0]

    def to_dict(self) -> dict:
        return {"tau": self.tau, "within_var": self.within_var, "between_var": self.between_var,
                "windows": self.windows, "drafts": self.drafts, "mean_var": self.mean_var, "t": self.t,
                "level": self.level, "within_from": self.within_from}


DRIFT_STATISTIC = (
    "baseline = the first B windows with enough drafts (of a segment: a restart starts a new one); per window, "
    "accepted per draft m_i = tau_i - 1 over D_i drafts, modelled as the baseline mean plus a window-to-window "
    "effect (variance omega^2, DerSimonian-Laird moment estimate over the baseline windows) plus draft noise "
    "(sigma^2 / D_i, sigma^2 the per-draft variance of the accepted length from vLLM's per-position counts; "
    "without them, the baseline windows' dispersion, at least the Poisson value m); a window is below the band "
    "when tau_j < tau_base - t(level, B-1) * sqrt(omega^2 + sigma^2 / D_j + Var(baseline mean)), one-sided")


def drift_band(windows: Sequence[tuple[float, float, float | None]], level: float = 0.99) -> DriftBand:
    """The band later windows are checked against, from the baseline windows' (accepted, drafts, accepted_sq or
    None) counts (`accepted_sq` from per-position counts; None where the server has none, as SGLang). A random-effects
    prediction bound (DRIFT_STATISTIC): draft noise shrinks with a window's drafts, the window-to-window spread of
    the baseline does not. Needs at least 2 windows with drafts."""
    w = [(float(a), float(d), s) for a, d, s in windows if d > 0]
    B = len(w)
    if B < 2:
        raise ValueError("drift_band needs at least 2 baseline windows with drafts")
    A = sum(a for a, _, _ in w)
    D = sum(d for _, d, _ in w)
    m = A / D
    pearson = sum(d * (a / d - m) ** 2 for a, d, _ in w)            # sum D_i (m_i - m)^2
    if all(s is not None for _, _, s in w):
        within = max(sum(s for _, _, s in w) / D - m * m, 1e-12)    # E[n^2] - E[n]^2 over the baseline's drafts
        # DerSimonian-Laird: Q = sum w_i (m_i - m)^2 with w_i = D_i / sigma^2; omega^2 = (Q - (B-1)) / (S1 - S2/S1)
        s1 = D / within
        s2 = sum((d / within) ** 2 for _, d, _ in w)
        between = max(0.0, (pearson / within - (B - 1)) / (s1 - s2 / s1))
        source = "per-position counts"
    else:
        within, between, source = max(pearson / (B - 1), m, 1e-12), 0.0, "dispersion of the windows"
    mean_var = sum(d * d * (between + within / d) for _, d, _ in w) / (D * D)
    return DriftBand(1 + m, within, between, B, int(D), mean_var, t_quantile(level, B - 1), level, source)


# ---------------------------------------------------------------------- timing noise: when a speedup is no verdict
# A bench times the baseline and the drafter of each (repeat, prompt) unit back to back, alternating which goes first
# (backend/bench.py), so a slow or fast machine moment hits both. What is left to say is when the speed figures are
# still not a faster/slower verdict: plain decoding's own speed drifted during the run by more than the speedup's
# interval covers, other processes took the CPU the bench needed, another SpecLens process ran beside it, or (runs not
# interleaved: pinned or older baselines) the two sides were timed at moments when the machine ran at other speeds.
# The definitions are here once; the bench stores the finding (manifest `bench.speed_noise`), the pages say it.

DRIFT_PARTS = 3             # the drift compares the first and the last third of a run's units, in execution order
DRIFT_FLOOR = 0.05          # a drift counts beyond max(5%, the speedup interval's relative half-width)
NOISY_UNITS = 0.10          # a run is under load when at least this share of its units (and one) were
CONTENDED_CORES = 0.5       # a unit is contended when other processes used max(0.5, CONTENDED_SHARE x CPUs) cores
CONTENDED_SHARE = 0.25      #   or more while it ran (system busy time minus this process and its children)
SPECLENS_CORES = 0.25       # ... and shared when other SpecLens processes used 0.25 core or more while it ran
PREFILL_FLOOR = 0.25        # the same prompts' prefill timed at two moments: more than 25% apart = other machine speed
MOMENT_FLOOR = DRIFT_FLOOR  # the same plain decoding timed at two moments: beyond max(5%, the speedup's half-width)


@dataclass
class TimingDrift:
    """How a speed changed from the first to the last part of a run: mean(last) / mean(first) - 1 (-0.30: 30% slower
    by the end), with a 95% bootstrap interval (units resampled within each part)."""

    value: float
    ci_low: float
    ci_high: float
    n_first: int
    n_last: int
    normalised: bool             # each unit was divided by its prompt's mean over the run first (repeats >= 2)

    @property
    def significant(self) -> bool:
        """The interval excludes no change."""
        return self.ci_low > 0 or self.ci_high < 0

    def to_dict(self) -> dict:
        return {"value": self.value, "ci_low": self.ci_low, "ci_high": self.ci_high, "n_first": self.n_first,
                "n_last": self.n_last, "normalised": self.normalised}


def timing_drift(speeds: Sequence[float], prompts: Sequence[object] | None = None, parts: int = DRIFT_PARTS,
                 n_boot: int = 2000, seed: int = 0) -> TimingDrift | None:
    """The drift of a speed over a run. speeds[u]: one speed per unit in execution order (plain decoding's tokens/s);
    prompts[u]: the unit's prompt. Where prompts were decoded two times or more (repeats), each unit is divided by
    its prompt's mean first, so a slow prompt early and a fast one late is no drift (prompts decoded once are then left
    out); otherwise the raw speeds are compared (the bench shuffles the prompts of each repeat, so their order holds
    no trend, only noise the interval covers). None when a part would hold fewer than 2 units."""
    v = np.asarray(speeds, dtype=np.float64).ravel()
    keep = np.isfinite(v) & (v > 0)
    normalised = False
    if prompts is not None and len(prompts) == len(v):
        keys = np.asarray([str(p) for p in prompts])
        _, inv, counts = np.unique(keys[keep], return_inverse=True, return_counts=True)
        rep = np.zeros(len(v), dtype=bool)
        rep[np.flatnonzero(keep)] = counts[inv] >= 2
        if rep.sum() >= 2 * parts:
            sel = np.flatnonzero(rep)
            _, inv2 = np.unique(keys[sel], return_inverse=True)
            means = np.bincount(inv2, weights=v[sel]) / np.bincount(inv2)
            v = v.copy()
            v[sel] = v[sel] / means[inv2]
            keep, normalised = rep, True
    v = v[keep]
    n = len(v) // parts
    if n < 2:
        return None
    first, last = v[:n], v[-n:]
    ia, ib = _resamples(n, n_boot, seed), _resamples(n, n_boot, seed + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        lo, hi = _interval(last[ib].mean(1) / first[ia].mean(1) - 1.0)
    return TimingDrift(float(last.mean() / first.mean() - 1.0), lo, hi, n, n, normalised)


def speedup_halfwidth(mean: float | None, ci_low: float | None, ci_high: float | None) -> float:
    """The relative half-width of a speedup's interval, (high - low) / 2 / mean; 0.0 without one."""
    try:
        m, lo, hi = float(mean), float(ci_low), float(ci_high)
    except (TypeError, ValueError):
        return 0.0
    return (hi - lo) / 2 / m if all(math.isfinite(x) for x in (m, lo, hi)) and m > 0 else 0.0


def unit_contended(other_cores: float | None, cpus: int) -> bool:
    """Other processes used max(CONTENDED_CORES, CONTENDED_SHARE x cpus) cores or more while the unit ran."""
    return other_cores is not None and math.isfinite(other_cores) and \
        other_cores >= max(CONTENDED_CORES, CONTENDED_SHARE * max(int(cpus or 1), 1))


def unit_shared(speclens_cores: float | None) -> bool:
    """Other SpecLens processes used SPECLENS_CORES or more while the unit ran."""
    return speclens_cores is not None and math.isfinite(speclens_cores) and speclens_cores >= SPECLENS_CORES


@dataclass
class SpeedNoise:
    """Whether a run's speed figures are a verdict. `kinds`: "drift" (plain decoding's speed changed from the first to
    the last third of the run, interval excluding no change, by more than `drift_limit` = max(DRIFT_FLOOR, the
    speedup interval's relative half-width)), "load" (contended units, unit_contended, in NOISY_UNITS of the units or
    more), "speclens" (units shared with another SpecLens process, unit_shared, as often)."""

    kinds: list[str]
    drift: TimingDrift | None
    drift_limit: float
    units: int
    contended_units: int
    shared_units: int

    @property
    def noisy(self) -> bool:
        return bool(self.kinds)

    def to_dict(self) -> dict:
        return {"noisy": self.noisy, "kinds": list(self.kinds), "drift": self.drift.to_dict() if self.drift else None,
                "drift_limit": self.drift_limit, "units": self.units, "contended_units": self.contended_units,
                "shared_units": self.shared_units}


def _many(k: int, n: int) -> bool:
    return n > 0 and k >= max(1, NOISY_UNITS * n)


def speed_noise(drift: TimingDrift | None, speedup_ci: tuple[float, float, float] | None = None,
                other_cores: Sequence[float | None] = (), speclens_cores: Sequence[float | None] = (),
                cpus: int = 1) -> SpeedNoise:
    """The noise verdict of one run from its drift (timing_drift of plain decoding's speed), its speedup (mean, ci_low,
    ci_high; None for plain decoding) and, per unit, the cores other processes and other SpecLens processes used."""
    limit = max(DRIFT_FLOOR, speedup_halfwidth(*speedup_ci) if speedup_ci else 0.0)
    kinds = []
    if drift is not None and drift.significant and abs(drift.value) > limit:
        kinds.append("drift")
    contended = sum(unit_contended(c, cpus) for c in other_cores)
    shared = sum(unit_shared(c) for c in speclens_cores)
    if _many(contended, len(other_cores)):
        kinds.append("load")
    if _many(shared, len(speclens_cores)):
        kinds.append("speclens")
    return SpeedNoise(kinds, drift, limit, len(other_cores), contended, shared)


def moment_ratio(a: Sequence[float], b: Sequence[float], n_boot: int = 2000, seed: int = 0) -> Estimate:
    """The same work timed at two moments: a[p], b[p] the same prompts' speeds (tokens/s, or 1 / TTFT for a prefill)
    at moment A and moment B, paired by index. Ratio sum(a) / sum(b) with a paired bootstrap interval over prompts
    (pairs where either is missing are left out)."""
    A, B = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if A.shape != B.shape:
        raise ValueError("moment_ratio needs the same prompts at both moments")
    ok = np.isfinite(A) & np.isfinite(B) & (A > 0) & (B > 0)
    A, B = A[ok], B[ok]
    if len(A) < 2:
        return Estimate(math.nan, math.nan, math.nan, 1, len(A))
    idx = _resamples(len(A), n_boot, seed)
    lo, hi = _interval(A[idx].sum(1) / B[idx].sum(1))
    return Estimate(float(A.sum() / B.sum()), lo, hi, 1, len(A))


def moments_differ(ratio: Estimate, floor: float = MOMENT_FLOOR,
                   speedup_ci: tuple[float, float, float] | None = None) -> bool:
    """Two moments ran the machine at other speeds: the ratio's interval excludes 1 and the ratio is more than
    max(floor, the speedup interval's relative half-width) away from 1 (either way: x0.5 and x2 count alike)."""
    if not all(math.isfinite(x) for x in (ratio.value, ratio.ci_low, ratio.ci_high)) or ratio.value <= 0:
        return False
    limit = max(floor, speedup_halfwidth(*speedup_ci) if speedup_ci else 0.0)
    return (ratio.ci_low > 1 or ratio.ci_high < 1) and abs(math.log(ratio.value)) > math.log1p(limit)


def relative_spread(values: Sequence[float]) -> float | None:
    """(max - min) / median of the finite values; None for fewer than two."""
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    v = v[np.isfinite(v)]
    if len(v) < 2 or np.median(v) == 0:
        return None
    return float((v.max() - v.min()) / np.median(v))
