"""Streaming per-boundary hidden-state statistics and a bounded raw token sample.

Memory is O(boundaries x hidden) for the statistics plus O(boundaries x sample_tokens x hidden) for the
sample, whatever the number of tokens captured. Updates run where the tensors are (GPU when there is
one) and never synchronise with the host: per-batch sums are taken in fp32 and accumulated in fp64,
moments around a per-dimension reference (the first batch's mean) to keep kurtosis stable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

# token-norm histogram: log10(norm) in [NORM_LO, NORM_HI) in NORM_BINS bins
NORM_LO, NORM_HI, NORM_BINS = -3.0, 6.0, 180
TOP_DIMS = 8


@dataclass
class StatsState:
    """Accumulators for B boundaries of hidden size H (all tensors, easy to checkpoint)."""

    count: torch.Tensor      # [B]      finite tokens seen
    nonfinite: torch.Tensor  # [B]      tokens holding NaN or inf (excluded from every figure)
    ref: torch.Tensor        # [B, H]   shift for the moments (first batch's mean)
    m1: torch.Tensor         # [B, H]   sum of (x - ref)
    m2: torch.Tensor         # [B, H]   sum of (x - ref)^2
    m3: torch.Tensor         # [B, H]
    m4: torch.Tensor         # [B, H]
    max_abs: torch.Tensor    # [B, H]
    norm_sum: torch.Tensor   # [B]
    norm_sq: torch.Tensor    # [B]
    norm_min: torch.Tensor   # [B]
    norm_max: torch.Tensor   # [B]
    norm_hist: torch.Tensor  # [B, NORM_BINS]
    has_ref: torch.Tensor    # [B] bool

    @classmethod
    def zeros(cls, n_boundaries: int, hidden: int, device: torch.device | str = "cpu") -> "StatsState":
        B, H = n_boundaries, hidden
        f64 = dict(dtype=torch.float64, device=device)
        return cls(
            count=torch.zeros(B, **f64), nonfinite=torch.zeros(B, **f64),
            ref=torch.zeros(B, H, dtype=torch.float32, device=device),
            m1=torch.zeros(B, H, **f64), m2=torch.zeros(B, H, **f64),
            m3=torch.zeros(B, H, **f64), m4=torch.zeros(B, H, **f64),
            max_abs=torch.zeros(B, H, dtype=torch.float32, device=device),
            norm_sum=torch.zeros(B, **f64), norm_sq=torch.zeros(B, **f64),
            norm_min=torch.full((B,), float("inf"), **f64), norm_max=torch.zeros(B, **f64),
            norm_hist=torch.zeros(B, NORM_BINS, **f64),
            has_ref=torch.zeros(B, dtype=torch.bool, device=device),
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.__dict__.items()}

    @classmethod
    def from_tensors(cls, t: dict[str, torch.Tensor], device: torch.device | str = "cpu") -> "StatsState":
        return cls(**{k: t[k].to(device) for k in cls.__dataclass_fields__})


class StreamingStats:
    """Per-boundary statistics over every token passed to `update`."""

    def __init__(self, labels: list[str], hidden: int, device: torch.device | str = "cpu",
                 state: StatsState | None = None):
        self.labels = list(labels)
        self.hidden = hidden
        self.state = state or StatsState.zeros(len(labels), hidden, device)

    def update(self, i: int, x: torch.Tensor) -> None:
        """Add tokens x [T, H] (any dtype) to boundary i. No host synchronisation."""
        s = self.state
        x = x.reshape(-1, x.shape[-1]).float()
        if x.shape[0] == 0:
            return
        bad = ~torch.isfinite(x).all(dim=-1)                     # [T]
        good = (~bad).to(torch.float32)
        x = torch.where(bad[:, None], torch.zeros((), device=x.device), x)
        n_good = good.sum()
        # the first batch that has finite tokens fixes the reference (kept on device, no branch on host)
        batch_mean = x.sum(0) / n_good.clamp_min(1.0)
        take = (~s.has_ref[i]) & (n_good > 0)
        s.ref[i] = torch.where(take, batch_mean, s.ref[i])
        s.has_ref[i] = s.has_ref[i] | take
        d = (x - s.ref[i]) * good[:, None]
        d2 = d * d
        s.m1[i] += d.sum(0).double()
        s.m2[i] += d2.sum(0).double()
        s.m3[i] += (d2 * d).sum(0).double()
        s.m4[i] += (d2 * d2).sum(0).double()
        s.count[i] += n_good.double()
        s.nonfinite[i] += bad.sum().double()
        s.max_abs[i] = torch.maximum(s.max_abs[i], x.abs().amax(0))
        norms = torch.linalg.vector_norm(x, dim=-1)              # [T]
        s.norm_sum[i] += (norms * good).sum().double()
        s.norm_sq[i] += (norms * norms * good).sum().double()
        big = torch.full_like(norms, float("inf"))
        s.norm_min[i] = torch.minimum(s.norm_min[i], torch.where(bad, big, norms).min().double())
        s.norm_max[i] = torch.maximum(s.norm_max[i], norms.max().double())
        logn = torch.where(bad, torch.full_like(norms, -1e9), torch.log10(norms.clamp_min(1e-30)))
        s.norm_hist[i] += torch.histc(logn, bins=NORM_BINS, min=NORM_LO, max=NORM_HI).double()

    # ------------------------------------------------------------------ results
    def vectors(self) -> dict[str, np.ndarray]:
        """Per-dimension mean, variance and max-abs: {label: {...}} flattened for safetensors."""
        s = self.state
        n = s.count.clamp_min(1)[:, None]
        mean_d = s.m1 / n
        var = (s.m2 / n - mean_d ** 2).clamp_min(0)
        mean = s.ref.double() + mean_d
        return {"mean": mean.cpu().numpy(), "var": var.cpu().numpy(), "max_abs": s.max_abs.double().cpu().numpy(),
                "norm_hist": s.norm_hist.cpu().numpy()}

    def table(self) -> pd.DataFrame:
        """One row per boundary: the headline figures the catalog and the pages use."""
        s = self.state
        v = self.vectors()
        cnt = s.count.cpu().numpy()
        rows = []
        for i, lbl in enumerate(self.labels):
            n = max(cnt[i], 1.0)
            c = s.ref[i].double().cpu()
            # central moments per dimension from moments around ref
            a1 = (s.m1[i] / n).cpu()
            a2, a3, a4 = (s.m2[i] / n).cpu(), (s.m3[i] / n).cpu(), (s.m4[i] / n).cpu()
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
            nm = float(s.norm_sum[i]) / n
            nstd = max(float(s.norm_sq[i]) / n - nm ** 2, 0.0) ** 0.5
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
                "kurtosis": kurt, "max_dim_kurtosis": float(np.nanmax(kurt_d)) if np.isfinite(kurt_d).any() else float("nan"),
                "outlier_ratio": float(ma.max() / (rms + 1e-30)) if cnt[i] else float("nan"),
                "top_dims": [int(d) for d in top], "top_dims_max_abs": [float(ma[d]) for d in top],
            })
        return pd.DataFrame(rows)


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

    Deterministic, so two captures of the same prompts keep the same tokens and can be compared.
    """

    def __init__(self, labels: list[str], hidden: int, capacity: int, per_seq: int,
                 dtype: torch.dtype = torch.float32):
        self.labels = list(labels)
        self.capacity, self.per_seq = capacity, per_seq
        self.hidden = hidden
        self.data = torch.zeros(len(labels), capacity, hidden, dtype=dtype)
        self.token_ids = torch.zeros(capacity, dtype=torch.int64)
        self.ctx_hash = torch.zeros(capacity, dtype=torch.int64)
        self.position = torch.zeros(capacity, dtype=torch.int64)
        self.n = 0

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
        self.n += k

    def tensors(self) -> dict[str, torch.Tensor]:
        n = self.n
        out = {lbl: self.data[i, :n] for i, lbl in enumerate(self.labels)}
        out.update(token_ids=self.token_ids[:n], ctx_hash=self.ctx_hash[:n], position=self.position[:n])
        return out

    def load(self, t: dict[str, torch.Tensor]) -> None:
        n = int(t["token_ids"].shape[0])
        for i, lbl in enumerate(self.labels):
            self.data[i, :n] = t[lbl].to(self.data.dtype)
        self.token_ids[:n], self.ctx_hash[:n], self.position[:n] = t["token_ids"], t["ctx_hash"], t["position"]
        self.n = n


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
