"""Cost of one boundary update inside an engine's hooks: the compiled statistics against the one-pass Triton update.

  compiled: `hidden + residual` materialised, the compiled statistics (stats.batch_moments) and the eager
            accumulation kernels and torch.histc (StreamingStats.update, SPECLENS_FUSED=0)
  one-pass: StreamingStats.update_pair(i, hidden, residual) -> backend/stats_kernel.update (four Triton kernels over
            the pair, then torch.histc)

Both run on the same random bf16 (hidden, residual) batches of a Llama-3.1-8B-shaped boundary (H = 4096), one update
per boundary per forward pass, as the hooks do inside vLLM and SGLang. Reported: milliseconds per boundary update on
the GPU (best of `--repeats` timed passes of `--forwards` forward passes each, after a warm-up, timed until the GPU is
done), peak GPU memory each path allocated beyond its inputs, and how the two states agree (largest difference of
the moments and scalars, each relative to the largest value of its row, and of the norm extremes; max |x| and the
histogram compared exactly; NaN and overflowing tokens included in the batches). One JSON object on stdout.

    python bench/stats_update_bench.py --tokens 16384 --boundaries 4 --forwards 8
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
try:
    import pandas  # noqa: F401
except ImportError:                      # a bare GPU image: backend.stats imports pandas for its tables only
    sys.modules["pandas"] = types.ModuleType("pandas")

from backend.stats import StreamingStats  # noqa: E402


def batches(n: int, tokens: int, hidden: int, device: str, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for k in range(n):
        h = torch.randn(tokens, hidden, generator=g, device=device).mul_(2).to(torch.bfloat16)
        r = torch.randn(tokens, hidden, generator=g, device=device).mul_(30).to(torch.bfloat16)
        r[:, 7] *= 100                                      # a massive-activation dimension
        if k == 1:
            h[3, 5] = float("nan")                          # a non-finite token
            h[tokens - 2, 9] = float("inf")
        out.append((h, r))
    return out


def make(fused: bool, n: int, hidden: int, device: str, first: tuple, exact: bool = False) -> StreamingStats:
    s = StreamingStats([f"S_{i}" for i in range(n)], hidden, device, compile=True, fused=fused, exact=exact)
    if fused and not s.use_one_pass(True):
        raise SystemExit("the one-pass update does not run here (needs CUDA and Triton)")
    for i in range(n):
        s.update(i, first[0] + first[1])                    # the first batch sets the reference shift, both paths
    return s


def run(s: StreamingStats, data: list, n: int, forwards: int) -> None:
    for f in range(forwards):
        h, r = data[f % len(data)]
        for i in range(n):
            s.update_pair(i, h, r)


def timed(s: StreamingStats, data: list, n: int, forwards: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        run(s, data, n, forwards)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best / (forwards * n) * 1e3


def agreement(a: StreamingStats, b: StreamingStats) -> dict:
    out = {}
    for k in ("moments", "scalars", "norm_min", "norm_max"):
        u, v = getattr(a.state, k).double(), getattr(b.state, k).double()
        scale = u.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) if u.dim() > 1 else u.abs().clamp_min(1e-12)
        out[f"{k}_max_rel_diff"] = float(((u - v).abs() / scale).max())   # relative to the largest of its row
    out["max_abs_equal"] = bool(torch.equal(a.state.max_abs, b.state.max_abs))
    out["norm_hist_equal"] = bool(torch.equal(a.state.norm_hist, b.state.norm_hist))
    out["norm_hist_tokens_moved"] = float((a.state.norm_hist - b.state.norm_hist).abs().sum() / 2)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--boundaries", type=int, default=4)
    p.add_argument("--forwards", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--exact", action="store_true", help="also time the exact (order-free integer) sums")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    dev = "cuda"
    data = batches(3, a.tokens, a.hidden, dev, 0)
    res: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": torch.cuda.get_device_name(),
                 "torch": torch.__version__, "python": platform.python_version(), "tokens": a.tokens,
                 "hidden": a.hidden, "boundaries": a.boundaries, "forwards": a.forwards, "repeats": a.repeats,
                 "command": " ".join(sys.argv)}
    try:
        import triton
        res["triton"] = triton.__version__
    except ImportError:
        res["triton"] = None
    states = {}
    paths = [("compiled", False, False), ("one_pass", True, False)] + ([("exact", False, True)] if a.exact else [])
    for name, fused, exact in paths:
        s = make(fused, a.boundaries, a.hidden, dev, data[0], exact)
        run(s, data, a.boundaries, 3)                       # warm-up: compiles, autotunes nothing
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        ms = timed(s, data, a.boundaries, a.forwards, a.repeats)
        res[name] = {"ms_per_update": round(ms, 4),
                     "peak_extra_mib": round((torch.cuda.max_memory_allocated() - base) / 2 ** 20, 1)}
        # the same updates from a fresh state for the agreement check
        s2 = make(fused, a.boundaries, a.hidden, dev, data[0], exact)
        run(s2, data, a.boundaries, len(data))
        states[name] = s2
    res["speedup"] = round(res["compiled"]["ms_per_update"] / res["one_pass"]["ms_per_update"], 2)
    res["agreement"] = agreement(states["compiled"], states["one_pass"])
    if a.exact:
        va, vb = states["compiled"].vectors(), states["exact"].vectors()
        res["exact_agreement"] = {f"{k}_max_rel_diff": float(np.max(np.abs(va[k] - vb[k]) / np.maximum(
            np.abs(va[k]).max(axis=-1, keepdims=True), 1e-12))) for k in ("mean", "var", "max_abs")}
        sa, sb = states["compiled"].state, states["exact"].state.materialized()
        res["exact_agreement"].update({f"{k}_max_rel_diff": float(((getattr(sa, k).cpu().double() - getattr(
            sb, k).double()).abs() / getattr(sb, k).double().abs().clamp_min(1e-12)).max())
            for k in ("scalars", "norm_min", "norm_max")})
        # the same tokens in other batches (thirds, in another order of batches): the same bits
        s3 = make(False, a.boundaries, a.hidden, dev, data[0], True)
        for h, r in reversed(data):
            for part in range(3):
                sl = slice(part * a.tokens // 3, (part + 1) * a.tokens // 3)
                for i in range(a.boundaries):
                    s3.update_pair(i, h[sl], r[sl])
        t2, t3 = states["exact"].state.tensors(), s3.state.tensors()
        res["exact_other_batching_bit_equal"] = all(torch.equal(t2[k], t3[k]) for k in t2)
    print(json.dumps(res, indent=1))
    if a.out:
        a.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
