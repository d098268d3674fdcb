"""Streaming per-boundary hidden-state statistics and a bounded raw token sample.

Memory is O(boundaries x hidden) for the statistics plus O(boundaries x sample_tokens x hidden) for the
sample, whatever the number of tokens captured. Updates run where the tensors are (GPU when there is
one) and never synchronise with the host: per-batch sums are taken in fp32 and accumulated in fp64,
moments around a per-dimension reference (the first batch's mean) to keep kurtosis stable.

Exact sums (`StreamingStats(..., exact=True)`, a capture's `--exact-sums`): every token's x, x^2, x^3, x^4 and
norm are rounded to a multiple of 2^-32 (in fp64, the same for a token whatever batch it comes in) and summed as
integers, cut into 32-bit slices held in int64 accumulators. Integer sums do not depend on the order or grouping
of the tokens, so a capture resumed after a kill, or run with other batches, gives the same statistics bit for
bit. The per-token norm is formed the same way (the exact sum of the rounded x^2 over dimensions). Tokens with a
value of magnitude 2^23 or more fall outside the slices' range and are counted with the non-finite ones.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np
import pandas as pd
import torch

# token-norm histogram: log10(norm) in [NORM_LO, NORM_HI) in NORM_BINS bins
NORM_LO, NORM_HI, NORM_BINS = -3.0, 6.0, 180
TOP_DIMS = 8


@dataclass
class StatsState:
    """Accumulators for B boundaries of hidden size H (all tensors, easy to checkpoint). Packed so that one
    batch costs a handful of kernel launches per boundary on a GPU."""

    moments: torch.Tensor    # [B, 4, H] fp64  sums of d, d^2, d^3, d^4 with d = x - ref (finite tokens)
    scalars: torch.Tensor    # [B, 4]    fp64  finite tokens, non-finite tokens, sum of norms, sum of norms^2
    ref: torch.Tensor        # [B, H]    fp32  shift for the moments (the first batch's mean)
    max_abs: torch.Tensor    # [B, H]    fp32
    norm_min: torch.Tensor   # [B]       fp32
    norm_max: torch.Tensor   # [B]       fp32
    norm_hist: torch.Tensor  # [B, NORM_BINS] fp64  histogram of log10(token norm)
    has_ref: torch.Tensor    # [B] bool
    # exact sums (empty unless exact): [B, EXACT_ROWS, H] int64 slices of the sums of x^1..x^4 and [B, 2] of the
    # sum of norms, in units of 2^-32 (see the module's docstring)
    exact: torch.Tensor | None = None
    exact_norm: torch.Tensor | None = None

    @classmethod
    def zeros(cls, n_boundaries: int, hidden: int, device: torch.device | str = "cpu",
              exact: bool = False) -> StatsState:
        B, H = n_boundaries, hidden
        f64, f32 = dict(dtype=torch.float64, device=device), dict(dtype=torch.float32, device=device)
        i64 = dict(dtype=torch.int64, device=device)
        return cls(
            moments=torch.zeros(B, 4, H, **f64), scalars=torch.zeros(B, 4, **f64),
            ref=torch.zeros(B, H, **f32), max_abs=torch.zeros(B, H, **f32),
            norm_min=torch.full((B,), float("inf"), **f32), norm_max=torch.zeros(B, **f32),
            norm_hist=torch.zeros(B, NORM_BINS, **f64), has_ref=torch.zeros(B, dtype=torch.bool, device=device),
            exact=torch.zeros(B, EXACT_ROWS, H, **i64) if exact else None,
            exact_norm=torch.zeros(B, EXACT_NORM_SLICES, **i64) if exact else None,
        )

    @property
    def is_exact(self) -> bool:
        return self.exact is not None

    @property
    def count(self) -> torch.Tensor:
        return self.scalars[:, 0]

    @property
    def nonfinite(self) -> torch.Tensor:
        return self.scalars[:, 1]

    def tokens(self) -> list[int]:
        """Tokens each boundary has taken, finite or not: every prompt token passes every boundary."""
        return (self.count + self.nonfinite).round().long().tolist()

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every accumulator by name (the exact sums only where kept: a default checkpoint is unchanged)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if getattr(self, k) is not None}

    @classmethod
    def from_tensors(cls, t: dict[str, torch.Tensor], device: torch.device | str = "cpu") -> StatsState:
        return cls(**{k: t[k].to(device) for k in cls.__dataclass_fields__ if k in t})

    def materialized(self) -> StatsState:
        """The state the results read: itself, or for exact sums the moments (around the mean rounded to fp32),
        the norms' sums and the reference formed from the integer sums, on the CPU, in one fixed order."""
        if not self.is_exact:
            return self
        cpu = {k: v.detach().cpu() for k, v in self.tensors().items()}
        n = cpu["scalars"][:, 0:1].double()                                   # [B, 1] finite tokens
        sums = []                                                             # S_k [B, H] fp64
        for lo, k in zip(_EXACT_OFFSETS, EXACT_SLICES, strict=True):
            sums.append(_combine(cpu["exact"][:, lo:lo + k]))
        s1, s2, s3, s4 = sums
        ref = torch.where(n > 0, s1 / n.clamp_min(1), 0.0).float()
        c = ref.double()
        moments = torch.stack([
            s1 - n * c,
            s2 - 2 * c * s1 + n * c ** 2,
            s3 - 3 * c * s2 + 3 * c ** 2 * s1 - n * c ** 3,
            s4 - 4 * c * s3 + 6 * c ** 2 * s2 - 4 * c ** 3 * s1 + n * c ** 4], dim=1)
        scalars = cpu["scalars"].clone()
        scalars[:, 2] = _combine(cpu["exact_norm"][:, :, None], dim=1)[:, 0]
        scalars[:, 3] = s2.sum(-1)
        return StatsState(moments=moments, scalars=scalars, ref=ref, max_abs=cpu["max_abs"],
                          norm_min=cpu["norm_min"], norm_max=cpu["norm_max"], norm_hist=cpu["norm_hist"],
                          has_ref=n[:, 0] > 0, exact=cpu["exact"], exact_norm=cpu["exact_norm"])


EXACT_FRAC = 32                   # the exact sums' unit: 2^-32
EXACT_LIMIT = 2.0 ** 23           # |x| at or over this: outside the slices' range (counted as non-finite)
EXACT_SLICES = (2, 3, 4, 4)       # 32-bit slices of the sums of x, x^2, x^3, x^4 (|x| < 2^23; n < 2^31 tokens)
EXACT_NORM_SLICES = 2             # slices of the sum of norms (norm < 2^29)
EXACT_ROWS = sum(EXACT_SLICES)
_EXACT_OFFSETS = tuple(sum(EXACT_SLICES[:k]) for k in range(len(EXACT_SLICES)))
EXACT_CHUNK = 2048                # tokens per step of the exact update (bounds its fp64 temporaries)


def _slices(r: torch.Tensor, k: int) -> list[torch.Tensor]:
    """An integer-valued fp64 tensor cut into k 32-bit slices (the low ones in [0, 2^32), the top one signed),
    exactly: each step is a power-of-two scaling, a floor and a subtraction whose result is representable."""
    out = []
    for _ in range(k - 1):
        q = torch.floor(r * 2.0 ** -32)
        out.append((r - q * 2.0 ** 32).to(torch.int64))
        r = q
    out.append(r.to(torch.int64))
    return out


def _combine(sl: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """The fp64 value of int64 slices along `dim` (slice j weighs 2^(32 j - 32)), added in one fixed order."""
    total = torch.zeros_like(sl.select(dim, 0), dtype=torch.float64)
    for j in range(sl.shape[dim] - 1, -1, -1):
        total = total + sl.select(dim, j).double() * 2.0 ** (32 * j - EXACT_FRAC)
    return total


def exact_batch(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One batch x [T, H] for exact sums -> (slices [EXACT_ROWS, H] int64, norm slices [2] int64, finite tokens,
    other tokens, max_abs [H], norm min, norm max, the tokens' norms [T] (0 where left out) for the histogram).
    Every figure is a sum of per-token integers or an order-free min/max, so it does not depend on how tokens are
    batched; the caller takes the norms' log10 eagerly (a compiled log10 may differ from it in the last bit)."""
    xf = x.float()
    good = torch.isfinite(xf).all(-1) & (xf.abs().amax(-1) < EXACT_LIMIT)     # [T]
    xd = torch.where(good[:, None], xf, 0.0).double()
    p2 = xd * xd                                                              # exact (fp32 squared)
    rows, norm2 = [], None
    for p, k in zip((xd, p2, p2 * xd, p2 * p2), EXACT_SLICES, strict=True):
        sl = _slices(torch.round(p * 2.0 ** EXACT_FRAC), k)
        rows += [t.sum(0) for t in sl]
        if p is p2:          # each token's norm^2: its rounded squares summed exactly over dimensions
            norm2 = _combine(torch.stack([t.sum(-1) for t in sl], dim=1))
    norms = torch.sqrt(norm2)                                                  # [T] fp64
    nsl = _slices(torch.round(norms * 2.0 ** EXACT_FRAC), EXACT_NORM_SLICES)
    n_good = good.sum()
    fin = norms.float()
    max_abs = torch.where(good[:, None], xf.abs(), 0.0).amax(0)
    nmin = torch.where(good, fin, float("inf")).amin()
    nmax = torch.where(good, fin, 0.0).amax()
    return (torch.stack(rows), torch.stack([t.sum() for t in nsl]), n_good, good.numel() - n_good,
            max_abs, nmin, nmax, torch.where(good, fin, 0.0))


def batch_moments(x: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One batch x [..., T, H] around ref [..., H] -> (moments [..., 4, H], max_abs [..., H], scalars [..., 4]
    (finite tokens, non-finite tokens, sum and sum of squares of norms), norm min [...], norm max [...],
    histogram input [..., T]). A token is non-finite when its norm is; it is left out of every figure."""
    x = x.float()
    norms = torch.linalg.vector_norm(x, dim=-1)                      # [..., T]
    good = torch.isfinite(norms)                                     # [..., T]
    g = good[..., None]
    d = torch.where(g, x - ref.unsqueeze(-2), 0.0)                   # [..., T, H]
    d2 = d * d
    moments = torch.stack([d.sum(-2), d2.sum(-2), (d2 * d).sum(-2), (d2 * d2).sum(-2)], dim=-2)
    max_abs = torch.where(g, x.abs(), 0.0).amax(-2)                  # [..., H]
    fin = torch.where(good, norms, 0.0)
    n_good = good.float().sum(-1)
    scalars = torch.stack([n_good, norms.shape[-1] - n_good, fin.sum(-1), (fin * fin).sum(-1)], dim=-1)
    nmin = torch.where(good, norms, float("inf")).amin(-1)
    logn = torch.where(good, torch.log10(fin.clamp_min(1e-30)), -1e9)   # out of the histogram's range
    return moments, max_abs, scalars, nmin, fin.amax(-1), logn


WARM_TOKENS = 1024     # the one batch shape every process compiles the statistics kernel for (see below); small, so
                       # that it never needs more memory than a real batch in an engine worker with little to spare


def compile_options() -> dict:
    """Inductor settings for the statistics kernel: its deterministic mode where this torch has it (no timing-based
    choice of a reduction's kernel, which changes the order of the fp32 sums from one process to the next)."""
    import torch._inductor.config as inductor_config

    return {"deterministic": True} if hasattr(inductor_config, "deterministic") else {}


@lru_cache(maxsize=1)
def _compiled_moments():
    """batch_moments fused into a few kernels by torch.compile (CUDA); eager if compiling is unavailable.

    A resumed capture must give the same statistics, bit for bit, as one that ran through. A compiled reduction's
    kernel is chosen from the first batch it is compiled for (a dynamic-shape kernel takes its size hints from that
    example: whether and how the sum over tokens is split) and, unless inductor is deterministic, by timing on the
    device. So every process compiles it first for the same zero batch of WARM_TOKENS tokens (per dtype, hidden size
    and device), with inductor's deterministic mode: a run resumed at another prompt then sums each batch in the same
    order as the run it continues."""
    try:
        compiled = torch.compile(batch_moments, dynamic=True, options=compile_options() or None)
    except Exception:  # pragma: no cover - depends on the GPU node's toolchain
        return batch_moments
    warmed: set = set()

    def moments(x: torch.Tensor, ref: torch.Tensor):
        key = (x.dtype, x.dim(), x.shape[-1], x.device)
        if key not in warmed:
            warmed.add(key)
            compiled(torch.zeros(*x.shape[:-2], WARM_TOKENS, x.shape[-1], dtype=x.dtype, device=x.device), ref)
        return compiled(x, ref)
    return _eager_on_failure(moments, batch_moments)


def _eager_on_failure(compiled, eager):
    """`compiled`, replaced by `eager` for good the first time it raises (a host process, e.g. an engine worker,
    whose compiler setup fails): the call that failed is made again eagerly."""
    state = {"fn": compiled}

    def call(*args):
        try:
            return state["fn"](*args)
        except Exception:  # pragma: no cover - depends on the host's compiler setup
            state["fn"] = eager
            return eager(*args)
    return call


@cache
def _exact_fn(device_type: str):
    """exact_batch, compiled on CUDA (its sums are integers, so the kernels' order of summation cannot change a
    bit, and every per-token value is one correctly rounded operation either way); eager elsewhere or if compiling
    fails."""
    if device_type != "cuda" or os.environ.get("SPECLENS_COMPILE", "1") == "0":
        return exact_batch
    try:
        compiled = torch.compile(exact_batch, dynamic=True)
    except Exception:  # pragma: no cover - depends on the GPU node's toolchain
        return exact_batch
    return _eager_on_failure(compiled, exact_batch)


def _one_pass_update(device: torch.device | str):
    """backend/stats_kernel's one-pass update where it runs on this device, else None."""
    try:
        from backend import stats_kernel
    except ImportError:          # no Triton (the CPU build of torch)
        return None
    return stats_kernel.update if stats_kernel.available(device) else None


class StreamingStats:
    """Per-boundary statistics over every token passed to `update`."""

    def __init__(self, labels: list[str], hidden: int, device: torch.device | str = "cpu",
                 state: StatsState | None = None, compile: bool | None = None, fused: bool | None = None,
                 exact: bool = False):
        """exact: order-free integer sums (see the module's docstring); a resumed state keeps the mode it has and is
        moved to `device` (a checkpoint is read onto the CPU: only the accumulator knows where it updates)."""
        self.labels = list(labels)
        self.hidden = hidden
        self.state = (StatsState.from_tensors(state.tensors(), device) if state is not None
                      else StatsState.zeros(len(labels), hidden, device, exact=exact))
        self.exact = self.state.is_exact
        if self.exact:
            compile, fused = False, False
        self._ref_set = self.state.has_ref.cpu().tolist()
        if compile is None:
            compile = torch.device(device).type == "cuda" and os.environ.get("SPECLENS_COMPILE", "1") != "0"
        self._moments = _compiled_moments() if compile else batch_moments
        self._fused = _one_pass_update(device) if fused is None or fused else None

    def update(self, i: int, x: torch.Tensor) -> None:
        """Add tokens x [T, H] (any dtype) to boundary i. No host synchronisation."""
        s = self.state
        x = x.reshape(-1, x.shape[-1])
        if x.shape[0] == 0:
            return
        if self.exact:
            for c in range(0, x.shape[0], EXACT_CHUNK):
                self._update_exact(i, x[c:c + EXACT_CHUNK])
            return
        if not self._ref_set[i]:
            # the first batch fixes the shift of the moments (its mean over finite tokens)
            xf = x.float()
            ok = torch.isfinite(xf).all(-1, keepdim=True)
            s.ref[i] = torch.where(ok, xf, 0.0).sum(0) / ok.sum().clamp_min(1)
            s.has_ref[i] = True
            self._ref_set[i] = True
        moments, max_abs, scalars, nmin, nmax, logn = self._moments(x, s.ref[i])
        s.moments[i] += moments
        s.scalars[i] += scalars
        self._add_extremes(i, max_abs, nmin, nmax, logn)

    def _add_extremes(self, i: int, max_abs: torch.Tensor, nmin: torch.Tensor, nmax: torch.Tensor,
                      logn: torch.Tensor) -> None:
        """A batch's order-free figures into boundary i: max |x| per dimension, the norm extremes, the histogram."""
        s = self.state
        s.max_abs[i].clamp_min_(max_abs)
        s.norm_min[i:i + 1].clamp_max_(nmin)
        s.norm_max[i:i + 1].clamp_min_(nmax)
        s.norm_hist[i] += torch.histc(logn, bins=NORM_BINS, min=NORM_LO, max=NORM_HI)

    def _update_exact(self, i: int, x: torch.Tensor) -> None:
        s = self.state
        rows, nrows, n_good, n_bad, max_abs, nmin, nmax, norms = _exact_fn(x.device.type)(x)
        logn = torch.where(norms > 0, torch.log10(norms.clamp_min(1e-30)), -1e9)
        s.exact[i] += rows
        s.exact_norm[i] += nrows
        s.scalars[i, 0] += n_good
        s.scalars[i, 1] += n_bad
        self._add_extremes(i, max_abs, nmin, nmax, logn)

    def use_one_pass(self, on: bool) -> bool:
        """Turn the one-pass update on (where it runs here) or off; returns whether it is in use."""
        self._fused = _one_pass_update(self.state.moments.device) if on and not self.exact else None
        return self._fused is not None

    def update_pair(self, i: int, h: torch.Tensor, r: torch.Tensor | None = None) -> None:
        """Add the tokens of a layer's `hidden + residual` (r None: h alone) to boundary i: in one pass over the pair
        where backend/stats_kernel runs (a CUDA device with Triton), else through `update` on the rounded sum."""
        if self._fused is not None and self._ref_set[i]:
            try:
                logn = self._fused(self.state, i, h, r)
            except Exception as e:  # pragma: no cover - a GPU whose Triton cannot build the kernels
                # it fails before its first write to the state (the compile comes first): the torch path takes over
                warnings.warn(f"SpecLens: the one-pass statistics update failed ({type(e).__name__}: {e}); "
                              "using the compiled torch update instead", RuntimeWarning, stacklevel=2)
                self._fused = None
            else:
                if logn is not None:
                    self.state.norm_hist[i] += torch.histc(logn, bins=NORM_BINS, min=NORM_LO, max=NORM_HI)
                return
        self.update(i, h if r is None else h + r)

    def update_all(self, xs: list[torch.Tensor]) -> None:
        """Add one batch for every boundary at once (xs[i] [T, H], same T): one set of vectorised ops
        instead of one per boundary, which is what costs on a CPU where op overhead dominates."""
        if len(xs) != len(self.labels) or xs[0].shape[0] == 0 or self.exact:
            for i, x in enumerate(xs):
                self.update(i, x)
            return
        if not all(self._ref_set):         # the first batch fixes each boundary's reference shift
            for i, x in enumerate(xs):
                self.update(i, x)
            return
        s = self.state
        X = torch.stack([x.reshape(-1, x.shape[-1]) for x in xs])       # [B, T, H]
        moments, max_abs, scalars, nmin, nmax, logn = batch_moments(X, s.ref)
        s.moments += moments
        s.scalars += scalars
        s.max_abs.clamp_min_(max_abs)
        s.norm_min.clamp_max_(nmin)
        s.norm_max.clamp_min_(nmax)
        # per-boundary histograms in one histc: shift each boundary's values into its own range
        span = NORM_HI - NORM_LO
        offs = torch.arange(len(xs), dtype=logn.dtype, device=logn.device)[:, None] * span
        logn = torch.where((logn >= NORM_LO) & (logn < NORM_HI), logn, -1e9)   # never spill into a neighbour
        flat = torch.histc((logn + offs).flatten(), bins=NORM_BINS * len(xs), min=NORM_LO,
                           max=NORM_LO + span * len(xs))
        s.norm_hist += flat.view(len(xs), NORM_BINS)

    # ------------------------------------------------------------------ results
    def vectors(self) -> dict[str, np.ndarray]:
        """Per-dimension mean, variance and max-abs: {label: {...}} flattened for safetensors."""
        return _vectors(self.state.materialized())

    def table(self) -> pd.DataFrame:
        """One row per boundary: the headline figures the catalog and the pages use."""
        s = self.state.materialized()
        v = _vectors(s)
        cnt = s.count.cpu().numpy()
        rows = []
        for i, lbl in enumerate(self.labels):
            n = max(cnt[i], 1.0)
            c = s.ref[i].double().cpu()
            # central moments per dimension from moments around ref
            a1, a2, a3, a4 = (s.moments[i] / n).cpu()
            var_d = (a2 - a1 ** 2).clamp_min(0)
            mu4_d = a4 - 4 * a1 * a3 + 6 * a1 ** 2 * a2 - 3 * a1 ** 4
            with np.errstate(divide="ignore", invalid="ignore"):
                kurt_d = (mu4_d / var_d ** 2).numpy()
            kurt_d = np.where(var_d.numpy() > 0, kurt_d, np.nan)
            # pooled over all dimensions: raw moments of x = c + d
            raw = [None, a1 + c, a2 + 2 * c * a1 + c ** 2,
                   a3 + 3 * c * a2 + 3 * c ** 2 * a1 + c ** 3,
                   a4 + 4 * c * a3 + 6 * c ** 2 * a2 + 4 * c ** 3 * a1 + c ** 4]
            p1, p2, p3, p4 = (float(r.mean()) for r in raw[1:])
            pvar = max(p2 - p1 ** 2, 0.0)
            pmu4 = p4 - 4 * p1 * p3 + 6 * p1 ** 2 * p2 - 3 * p1 ** 4
            kurt = pmu4 / pvar ** 2 if pvar > 0 else float("nan")
            nm = float(s.scalars[i, 2]) / n
            nstd = max(float(s.scalars[i, 3]) / n - nm ** 2, 0.0) ** 0.5
            q = _hist_quantiles(v["norm_hist"][i], [0.01, 0.5, 0.99])
            ma = v["max_abs"][i]
            top = np.argsort(-ma)[:TOP_DIMS]
            rms = float(np.sqrt(max(p2, 0.0)))
            rows.append({
                "boundary": lbl, "ord": i, "n_tokens": int(cnt[i]), "nonfinite_tokens": int(s.nonfinite[i]),
                "mean_norm": nm if cnt[i] else float("nan"), "std_norm": nstd if cnt[i] else float("nan"),
                "norm_min": float(s.norm_min[i]) if cnt[i] else float("nan"),
                "norm_p01": q[0], "norm_p50": q[1], "norm_p99": q[2],
                "norm_max": float(s.norm_max[i]) if cnt[i] else float("nan"),
                "rms": rms, "mean_abs_mean": float(np.abs(v["mean"][i]).mean()),
                "max_abs": float(ma.max()) if len(ma) else float("nan"),
                "kurtosis": kurt,
                "max_dim_kurtosis": float(np.nanmax(kurt_d)) if np.isfinite(kurt_d).any() else float("nan"),
                "outlier_ratio": float(ma.max() / (rms + 1e-30)) if cnt[i] else float("nan"),
                "top_dims": [int(d) for d in top], "top_dims_max_abs": [float(ma[d]) for d in top],
            })
        return pd.DataFrame(rows)


def _vectors(s: StatsState) -> dict[str, np.ndarray]:
    """Per-dimension mean, variance and max-abs, and the norm histograms, of a (materialized) state."""
    n = s.count.clamp_min(1)[:, None]
    mean_d = s.moments[:, 0] / n
    var = (s.moments[:, 1] / n - mean_d ** 2).clamp_min(0)
    mean = s.ref.double() + mean_d
    return {"mean": mean.cpu().numpy(), "var": var.cpu().numpy(), "max_abs": s.max_abs.double().cpu().numpy(),
            "norm_hist": s.norm_hist.cpu().numpy()}


def _hist_quantiles(hist: np.ndarray, qs: list[float]) -> list[float]:
    total = hist.sum()
    if total <= 0:
        return [float("nan")] * len(qs)
    edges = np.linspace(NORM_LO, NORM_HI, NORM_BINS + 1)
    cdf = np.cumsum(hist) / total
    out = []
    for q in qs:
        k = int(np.searchsorted(cdf, q))
        k = min(k, NORM_BINS - 1)
        prev = cdf[k - 1] if k > 0 else 0.0
        frac = (q - prev) / max(cdf[k] - prev, 1e-12)
        out.append(float(10 ** (edges[k] + frac * (edges[k + 1] - edges[k]))))
    return out


def norm_bin_edges() -> np.ndarray:
    return 10 ** np.linspace(NORM_LO, NORM_HI, NORM_BINS + 1)


class TokenSample:
    """The first `capacity` tokens (at most `per_seq` from one sequence), all boundaries, kept raw.

    Deterministic, so two captures of the same prompts keep the same tokens and can be compared. The HF engine
    adds prompts in their order (`add`, or `stage` + `commit`). An engine that batches prompts itself (vLLM) runs
    them in an order and composition that depend on scheduling timing, so it first `plan`s the prompts it is about
    to run, in their order: prompt p gets the slots the in-order fill would give it, whatever order its tokens
    arrive in (backend/engines/hook_reduce.py plan_rows matches a flat batch's tokens to those slots by position
    and context hash). Slots are filled in any order; `n` is the number of leading filled slots, which is what a
    checkpoint keeps (every planned prompt before a checkpoint has run, so the filled slots are a prefix).
    """

    def __init__(self, labels: list[str], hidden: int, capacity: int, per_seq: int,
                 dtype: torch.dtype = torch.float32, pin: bool = False):
        self.labels = list(labels)
        self.capacity, self.per_seq = capacity, per_seq
        self.hidden = hidden
        # pinned host memory lets a GPU capture copy tokens out without stalling the forward pass
        self.pinned = pin and torch.cuda.is_available()
        self.data = torch.zeros(len(labels), capacity, hidden, dtype=dtype, pin_memory=self.pinned)
        self.token_ids = torch.zeros(capacity, dtype=torch.int64)
        self.ctx_hash = torch.zeros(capacity, dtype=torch.int64)
        self.position = torch.zeros(capacity, dtype=torch.int64)
        self.n = 0
        # planned fill (see plan): slot -> filled, (position, context hash) -> slots, the end of the planned slots,
        # and sequences seen up to a position whose planned tokens go on in a later chunk of prefill:
        # {next position: {context hash so far: count}}
        self.planning = False
        self.filled = bytearray(capacity)
        self.keys: dict[tuple[int, int], list[int]] = {}
        self.follows: set[tuple[int, int]] = set()   # (position, hash) of planned tokens that have a planned successor
        self.ends: set[tuple[int, int]] = set()      # (position, hash) of a planned prompt's last planned token
        self.planned_end = 0
        self.open: dict[int, dict[int, int]] = {}
        self.unfilled = 0

    def room(self, seq_len: int) -> int:
        return max(0, min(seq_len, self.per_seq, self.capacity - self.n))

    def add(self, token_ids: torch.Tensor, states: dict[int, torch.Tensor]) -> None:
        """states: boundary index -> [T, H]; takes the first `room(T)` tokens."""
        k = self.room(int(token_ids.shape[0]))
        if k == 0:
            return
        sl = slice(self.n, self.n + k)
        for i, x in states.items():
            self.data[i, sl] = x[:k].to("cpu", self.data.dtype)
        self.token_ids[sl] = token_ids[:k].cpu()
        self.ctx_hash[sl] = context_hashes(token_ids[:k])
        self.position[sl] = torch.arange(k)
        self._advance_to(self.n + k)

    def stage(self, i: int, x: torch.Tensor, k: int) -> None:
        """Copy the first k tokens of boundary i's [T, H] into the next free slots (asynchronous on GPU)."""
        self.data[i, self.n:self.n + k].copy_(x[:k], non_blocking=self.pinned)

    def commit(self, token_ids: torch.Tensor, k: int) -> None:
        """The staged k tokens belong to this sequence: record their ids, context hashes and positions."""
        if k == 0:
            return
        sl = slice(self.n, self.n + k)
        self.token_ids[sl] = token_ids[:k].cpu()
        self.ctx_hash[sl] = context_hashes(token_ids[:k])
        self.position[sl] = torch.arange(k)
        self._advance_to(self.n + k)

    def _advance_to(self, n: int) -> None:
        self.filled[self.n:n] = b"\x01" * (n - self.n)
        self.n = n
        self.planned_end = max(self.planned_end, n)

    # ------------------------------------------------------------------ planned fill (engines that batch prompts)
    def plan(self, seqs: list[list[int]]) -> int:
        """The prompts about to run, in their order: each gets the next min(len, per_seq) free slots (fewer at
        the end of capacity), recorded with its token ids, positions and context hashes; the rows themselves
        come later, in any order (fill). Returns the room left after them."""
        self.planning = True
        self.open.clear()        # every sequence of the prompts planned before has run to its end
        off = self.planned_end
        for seq in seqs:
            k = max(0, min(len(seq), self.per_seq, self.capacity - off))
            if k == 0:
                continue
            ids = [int(t) for t in seq[:k]]
            hs = context_hashes(ids).tolist()
            self.token_ids[off:off + k] = torch.tensor(ids, dtype=torch.int64)
            self.ctx_hash[off:off + k] = torch.tensor(hs, dtype=torch.int64)
            self.position[off:off + k] = torch.arange(k)
            for t, h in enumerate(hs):
                self.keys.setdefault((t, h), []).append(off + t)
                if t + 1 < k:
                    self.follows.add((t, h))
            self.ends.add((k - 1, hs[-1]))
            off += k
            self.unfilled += k
        self.planned_end = off
        return self.capacity - off

    def wants(self) -> bool:
        """Whether a forward pass may still hold tokens for the sample (False: no host work is needed)."""
        return self.unfilled > 0 if self.planning else self.n < self.capacity

    def fill(self, key: tuple[int, int]) -> list[int]:
        """The free slots planned for the token at (position, context hash), now taken."""
        slots = [j for j in self.keys.get(key, ()) if not self.filled[j]]
        for j in slots:
            self.filled[j] = 1
        self.unfilled -= len(slots)
        if slots:
            n = self.n
            while n < self.planned_end and self.filled[n]:
                n += 1
            self.n = n
        if self.unfilled == 0:
            self.open.clear()
        return slots

    def tensors(self) -> dict[str, torch.Tensor]:
        if self.pinned:
            torch.cuda.synchronize()    # staged copies must have landed
        n = self.n
        out = {lbl: self.data[i, :n] for i, lbl in enumerate(self.labels)}
        out.update(token_ids=self.token_ids[:n], ctx_hash=self.ctx_hash[:n], position=self.position[:n])
        return out

    def load(self, t: dict[str, torch.Tensor]) -> None:
        n = int(t["token_ids"].shape[0])
        for i, lbl in enumerate(self.labels):
            self.data[i, :n] = t[lbl].to(self.data.dtype)
        self.token_ids[:n], self.ctx_hash[:n], self.position[:n] = t["token_ids"], t["ctx_hash"], t["position"]
        self.n = 0
        self._advance_to(n)


_MOD, _MUL = (1 << 61) - 1, 1_000_003


def context_hashes(token_ids: torch.Tensor | list[int]) -> torch.Tensor:
    """hash[t] identifies tokens[0..t]: a causal model's state at t depends on exactly that prefix,
    so two captures hold the same token in the same context iff their context hashes are equal."""
    ids = token_ids.tolist() if isinstance(token_ids, torch.Tensor) else list(token_ids)
    out, h = [], 0
    for tok in ids:
        h = (h * _MUL + int(tok) + 1) % _MOD
        out.append(h)
    return torch.tensor(out, dtype=torch.int64)
