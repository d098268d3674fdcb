"""Cost of one boundary update of the in-engine capture hooks: the path before the fusion against StreamingStats now.

  old: `hidden + residual` materialised (what hook_reduce.layer_out did), the compiled statistics (batch_moments),
       then ~7 eager accumulation kernels and torch.histc (StreamingStats.update before issue 24 item 3)
  new: StreamingStats.update(i, hidden, residual): one compiled function adds the residual, reduces, accumulates
       and bins the norms in place (backend/stats.py fused_update)

Both run on the same random bf16 (hidden, residual) batches of a Llama-3.1-8B-shaped boundary (H = 4096) for
`--boundaries` boundaries, one update per boundary per "forward pass", like the hooks inside vLLM. Reported per
device: milliseconds per boundary update (best of `--repeats` timed passes of `--forwards` passes each, after a
warm-up; on CUDA the time until the GPU is done, i.e. the GPU cost) and whether the two paths left the same state bit
for bit (`bit_equal`; NaN and overflowing tokens included), plus the GPU-side checks of the pieces: the written-out bf16
rounding against eager torch's add (`bf16_sum_equal`) and the histogram by comparisons against torch.histc on that
device (`histc_equal`). Prints one JSON object.

    python bench/hook_overhead.py                              # CPU (inductor's C++ backend), and CUDA if present
    python bench/hook_overhead.py --devices cuda --tokens 16384 --boundaries 33 --profile

On the GPU node (vLLM's default batch for the LLM class on an H100/H200 is up to 16384 tokens per forward pass;
64 prompts x 2048 tokens is 8 such passes): run the second line from the repository root; it needs torch with CUDA,
numpy (pandas only if installed: StreamingStats' tables are not used), and compiles each path once (about a minute).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
try:
    import pandas  # noqa: F401
except ImportError:                      # a bare GPU image: backend.stats imports pandas for its tables only
    sys.modules["pandas"] = types.ModuleType("pandas")

from backend.stats import (  # noqa: E402
    NORM_BINS,
    NORM_HI,
    NORM_LO,
    WARM_TOKENS,
    StatsState,
    StreamingStats,
    _bf16_sum,
    batch_moments,
    compile_options,
    histc_edges,
    norm_histogram,
)


class OldPath:
    """StreamingStats.update as it was before the fusion, fed the materialised hidden + residual."""

    def __init__(self, n: int, hidden: int, device: str, ref: torch.Tensor, compile: bool):
        self.state = StatsState.zeros(n, hidden, device)
        self.state.ref.copy_(ref)
        self.state.has_ref.fill_(True)
        self.fn = batch_moments
        if compile:
            self.fn = torch.compile(batch_moments, dynamic=True, options=compile_options() or None)
            self.fn(torch.zeros(WARM_TOKENS, hidden, dtype=torch.bfloat16, device=device), ref[0])   # as it warmed

    def update(self, i: int, h: torch.Tensor, r: torch.Tensor) -> None:
        s, x = self.state, h + r
        moments, max_abs, scalars, nmin, nmax, logn = self.fn(x, s.ref[i])
        s.moments[i] += moments
        s.scalars[i] += scalars
        s.max_abs[i].clamp_min_(max_abs)
        s.norm_min[i:i + 1].clamp_max_(nmin)
        s.norm_max[i:i + 1].clamp_min_(nmax)
        s.norm_hist[i] += torch.histc(logn, bins=NORM_BINS, min=NORM_LO, max=NORM_HI)


class NewPath:
    def __init__(self, n: int, hidden: int, device: str, ref: torch.Tensor, compile: bool):
        st = StatsState.zeros(n, hidden, device)
        st.ref.copy_(ref)
        st.has_ref.fill_(True)
        self.stats = StreamingStats([f"S_{i}" for i in range(n)], hidden, device, state=st, compile=compile)
        self.state = st

    def update(self, i: int, h: torch.Tensor, r: torch.Tensor) -> None:
        self.stats.update(i, h, r)


def batches(n: int, tokens: int, hidden: int, device: str, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """n (hidden, residual) bf16 pairs with a NaN token and a token whose sum overflows, norms spread over decades."""
    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for _ in range(n):
        h = torch.randn(tokens, hidden, generator=g, device=device) * 0.5
        r = torch.randn(tokens, hidden, generator=g, device=device) * 2 + 0.3
        scale = 10.0 ** torch.randint(-1, 3, (tokens, 1), generator=g, device=device).float()
        h, r = (h * scale).to(torch.bfloat16), (r * scale).to(torch.bfloat16)
        h[1, 5] = float("nan")
        h[2], r[2] = 3.3895e38, 3.3895e38
        out.append((h, r))
    return out


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_path(path, data, boundaries: int, forwards: int, repeats: int, device: str) -> float:
    """Best ms per boundary update over `repeats` passes of forwards x boundaries updates."""
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        for f in range(forwards):
            h, r = data[f % len(data)]
            for i in range(boundaries):
                path.update(i, h, r)
        sync(device)
        best = min(best, (time.perf_counter() - t) * 1e3 / (forwards * boundaries))
    return best


def kernel_profile(path, data, boundaries: int, forwards: int, device: str) -> list:
    """GPU kernels of forwards x boundaries updates: [name, launches, device us] per update, busiest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        time_path(path, data, boundaries, forwards, 1, device)
    n = forwards * boundaries
    rows = []
    for ev in prof.key_averages():
        us = getattr(ev, "self_device_time_total", None)
        if us is None:
            us = getattr(ev, "self_cuda_time_total", 0)
        if us and ev.count and getattr(ev, "device_type", None) is not None and "CUDA" in str(ev.device_type):
            rows.append([ev.key[:80], round(ev.count / n, 2), round(us / n, 1)])
    return sorted(rows, key=lambda r: -r[2])[:12]


def piece_checks(device: str) -> dict:
    """The fused pieces on this device, compiled: bf16 rounding against eager add, histogram against histc."""
    g = torch.Generator(device=device).manual_seed(1)
    bits = torch.randint(-32768, 32768, (2, 1 << 20), generator=g, device=device, dtype=torch.int32)
    h, r = bits.to(torch.int16).view(torch.bfloat16)
    want, got = (h + r).float(), torch.compile(_bf16_sum, dynamic=True)(h, r)
    nan = torch.isnan(want)
    bf16_ok = bool(torch.equal(nan, torch.isnan(got))
                   and torch.equal(want[~nan].view(torch.int32), got[~nan].view(torch.int32)))
    e = torch.from_numpy(histc_edges()).to(device)
    vals = [e]
    for direction in (float("inf"), float("-inf")):
        x = e.clone()
        for _ in range(4):
            x = torch.nextafter(x, torch.full_like(x, direction))
            vals.append(x)
    v = torch.cat(vals + [torch.rand(100000, generator=g, device=device) * 11 - 4,
                          torch.tensor([6.0, -3.0, float("inf"), float("nan")], device=device)])
    hist = torch.compile(norm_histogram, dynamic=True)(v, e)
    histc_ok = bool(torch.equal(hist.double(), torch.histc(v, NORM_BINS, NORM_LO, NORM_HI).double()))
    return {"bf16_sum_equal": bf16_ok, "histc_equal": histc_ok}


def run_device(device: str, tokens: int, hidden: int, boundaries: int, forwards: int, repeats: int,
               compile: bool, profile: bool = False) -> dict:
    data = batches(min(forwards, 4), tokens, hidden, device)
    ref = torch.stack([(h + r).float().nan_to_num(0, 0, 0).mean(0) for h, r in data[:1]] * boundaries)
    out: dict = {"device": device, "tokens": tokens, "hidden": hidden, "boundaries": boundaries, "forwards": forwards,
                 "compiled": compile}
    if device.startswith("cuda"):
        out["gpu"] = torch.cuda.get_device_name()
    t = time.perf_counter()
    old, new = OldPath(boundaries, hidden, device, ref, compile), NewPath(boundaries, hidden, device, ref, compile)
    for p in (old, new):                          # warm-up pass (compiles), then the same updates in both paths
        time_path(p, data, boundaries, 1, 1, device)
    out["compile_s"] = round(time.perf_counter() - t, 1)
    same = {k: bool(torch.equal(v, new.state.tensors()[k])) for k, v in old.state.tensors().items()}
    out["bit_equal"] = all(same.values())
    if not out["bit_equal"]:
        out["differs"] = {k: float((old.state.tensors()[k].double() - new.state.tensors()[k].double()).abs().max())
                          for k, ok in same.items() if not ok}
    res = {}
    for _ in range(2):                            # alternate, best of each
        for name, p in (("old", old), ("new", new)):
            ms = time_path(p, data, boundaries, forwards, repeats, device)
            res[name] = min(res.get(name, ms), ms)
    out["ms_per_update"] = {k: round(v, 4) for k, v in res.items()}
    out["speedup"] = round(res["old"] / res["new"], 3)
    if profile and device.startswith("cuda"):
        out["kernels"] = {name: kernel_profile(p, data, boundaries, 2, device)
                          for name, p in (("old", old), ("new", new))}
    if compile:
        out.update(piece_checks(device))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", default=None, help="comma-separated (default: cpu, and cuda when available)")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per forward pass (default: cpu 2048, cuda 16384)")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--boundaries", type=int, default=4)
    ap.add_argument("--forwards", type=int, default=None, help="timed forward passes (default: cpu 2, cuda 8)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--eager", action="store_true", help="no torch.compile (the CPU capture path: both materialise)")
    ap.add_argument("--profile", action="store_true", help="CUDA: the GPU kernels of each path, per update")
    a = ap.parse_args()
    devices = a.devices.split(",") if a.devices else ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    res = []
    for d in devices:
        gpu = d.startswith("cuda")
        res.append(run_device(d, a.tokens or (16384 if gpu else 2048), a.hidden, a.boundaries,
                              a.forwards or (8 if gpu else 2), a.repeats, not a.eager, a.profile))
    print(json.dumps({"bench": "hook_overhead", "torch": torch.__version__, "python": platform.python_version(),
                      "cpu_threads": torch.get_num_threads(), "results": res}, indent=1))


if __name__ == "__main__":
    main()
