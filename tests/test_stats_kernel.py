"""backend/stats_kernel: the one-pass update the engines' hooks use on a GPU, against StreamingStats.update.

Triton's interpreter runs the same kernels on CPU tensors here (TRITON_INTERPRET=1, read when the kernels are
defined, so in a child process). It rounds to bf16 otherwise than a GPU does, so this compares fp32 and fp16 batches;
bf16 and the speed are checked on the GPU node by bench/stats_update_bench.py."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")

CHILD = r"""
import json, sys, torch
from backend import stats_kernel
from backend.stats import StreamingStats

out = {}
for name in ("float32", "float16"):
    dt = getattr(torch, name)
    torch.manual_seed(0)
    T, H = 1100, 300                       # several row groups and a ragged last column block
    h = (torch.randn(T, H) * 3).to(dt)
    r = (torch.randn(T, H) * 2).to(dt)
    r[:, 7] *= 50                          # a massive-activation dimension
    h[205, 7] = float("nan")               # non-finite tokens in two groups, none in the others
    h[990, 2] = float("inf")
    x = h + r
    a = StreamingStats(["S_1"], H, "cpu", compile=False, fused=False)
    b = StreamingStats(["S_1"], H, "cpu", compile=False, fused=True)
    assert b._fused is stats_kernel.update, "the one-pass update is not used"
    assert b.use_one_pass(False) is False and b._fused is None           # the side-by-side switch (vllm_worker)
    assert b.use_one_pass(True) is True and b._fused is stats_kernel.update
    for s in (a, b):
        s.update_pair(0, h[:100], r[:100])          # the first batch sets the shift through update, both
    a.update(0, x[100:])
    b.update_pair(0, h[100:], r[100:])
    res = {}
    for k in ("moments", "scalars", "norm_min", "norm_max"):
        u, v = getattr(a.state, k).double(), getattr(b.state, k).double()
        res[k] = float(((u - v).abs() / u.abs().amax().clamp_min(1e-12)).max())
    res["max_abs_equal"] = bool(torch.equal(a.state.max_abs, b.state.max_abs))
    res["hist_equal"] = bool(torch.equal(a.state.norm_hist, b.state.norm_hist))
    res["nonfinite"] = [float(a.state.nonfinite[0]), float(b.state.nonfinite[0])]
    res["finite"] = [float(a.state.count[0]), float(b.state.count[0])]
    res["moments_finite"] = bool(torch.isfinite(b.state.moments).all())
    out[name] = res
print(json.dumps(out))
"""


def test_one_pass_update_equals_the_torch_update():
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    p = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    for name, res in got.items():
        assert res["moments_finite"], (name, "a NaN token reached the moments")
        assert res["nonfinite"] == [2.0, 2.0] and res["finite"][0] == res["finite"][1] == 1098.0, (name, res)
        assert res["max_abs_equal"] and res["hist_equal"], (name, res)
        for k in ("moments", "scalars", "norm_min", "norm_max"):
            assert res[k] < 1e-5, (name, k, res[k])      # fp32 sums taken in another order


CHILD_SHAPES = r"""
import json, torch
from backend import stats_kernel
from backend.stats import StreamingStats

seen = {}


class Recorder:                            # records each launch's compile-time constants, then launches
    def __init__(self, name, kernel):
        self.name, self.kernel = name, kernel

    def __getitem__(self, grid):
        def launch(*args, **consts):
            seen.setdefault(self.name, set()).add(json.dumps(consts, sort_keys=True))
            return self.kernel[grid](*args, **consts)
        return launch


for name in ("_tile_moments", "_rows", "_fixup", "_reduce"):
    setattr(stats_kernel, name, Recorder(name, getattr(stats_kernel, name)))
H = 40
a = StreamingStats(["S_1"], H, "cpu", compile=False, fused=False)
b = StreamingStats(["S_1"], H, "cpu", compile=False, fused=True)
torch.manual_seed(0)
first = torch.randn(64, H)
a.update(0, first)
b.update(0, first)                         # sets the shift; the batches below go through the kernels
for T in (100, 1100, 5000, 20000):         # 20,000 rows: 79 row blocks, more than one step of the scalar reduction
    x = torch.randn(T, H) * 2 + 0.5
    a.update(0, x)
    b.update_pair(0, x, None)
res = {k: float(((getattr(a.state, k).double() - getattr(b.state, k).double()).abs()
                 / getattr(a.state, k).double().abs().amax().clamp_min(1e-12)).max())
       for k in ("moments", "scalars", "norm_min", "norm_max")}
print(json.dumps({"consts": {k: sorted(v) for k, v in seen.items()}, "diff": res,
                  "count": [float(a.state.count[0]), float(b.state.count[0])]}))
"""


def test_no_kernel_constant_follows_the_batch_size():
    """Every kernel launch gets the same compile-time constants whatever the batch's token count (100 to 20,000), so
    a GPU builds each kernel once, in the warm-up, never inside an engine's timed forward passes (a constant that
    followed the batch size made Triton build `_reduce` again for each new size class: 0.2-1 s on an H100). The
    batches of more than one step of the scalar reduction still give the torch update's statistics."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    p = subprocess.run([sys.executable, "-c", CHILD_SHAPES], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert set(got["consts"]) == {"_tile_moments", "_rows", "_fixup", "_reduce"}
    for name, variants in got["consts"].items():
        assert len(variants) == 1, (name, variants)
    assert got["count"][0] == got["count"][1] == 64 + 100 + 1100 + 5000 + 20000
    for k, v in got["diff"].items():
        assert v < 1e-5, (k, v)
