"""Exact (order-free) statistics sums: the same bits however the tokens are batched, and after a resume."""

import torch

from backend.settings import CaptureSettings
from backend.stats import EXACT_LIMIT, StatsState, StreamingStats

LABELS = ["S_0", "S_1"]
H = 64


def _tokens(seed=0, n=600):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, H, generator=g) * 2 + 0.5
    x[7, 3] = 900.0                                  # a massive activation
    return x.to(torch.bfloat16)


def _run(x, splits, exact=True, state=None):
    s = StreamingStats(LABELS, H, "cpu", state=state, compile=False, fused=False, exact=exact)
    for part in torch.split(x, splits):
        for i in range(len(LABELS)):
            s.update(i, part * (i + 1))
    return s


def _table(s):
    return s.table().drop(columns=["top_dims", "top_dims_max_abs"])


def test_the_same_bits_for_any_batching():
    x = _tokens()
    ref = _table(_run(x, [600]))
    for splits in ([1, 99, 500], [300, 300], [17] * 35 + [5]):
        assert _table(_run(x, splits)).equals(ref), splits
        # the order of the tokens does not matter either
    perm = torch.randperm(600, generator=torch.Generator().manual_seed(3))
    assert _table(_run(x[perm], [250, 350])).equals(ref)


def test_a_resumed_state_continues_the_same_sums():
    x = _tokens(1)
    whole = _run(x, [600])
    first = _run(x[:200], 64)
    t = {k: v.clone() for k, v in first.state.tensors().items()}          # the checkpoint
    resumed = _run(x[200:], 128, exact=False, state=StatsState.from_tensors(t))   # the state keeps its mode
    assert resumed.exact
    for k, v in whole.state.tensors().items():
        assert torch.equal(v, resumed.state.tensors()[k]), k
    assert _table(resumed).equals(_table(whole))


def test_close_to_the_fp64_truth_and_to_the_default_path():
    x = _tokens(2)
    t = _table(_run(x, [100] * 6))
    d = _table(_run(x, [100] * 6, exact=False))
    xd = x.double()
    norms = xd.norm(dim=-1)
    assert abs(t.mean_norm[0] - norms.mean().item()) < 1e-9 * norms.mean().item()
    assert abs(t.std_norm[0] - norms.std(unbiased=False).item()) < 1e-9 * norms.std().item()
    assert abs(t.rms[0] - xd.pow(2).mean().sqrt().item()) < 1e-12
    pooled = xd.flatten()
    kurt = ((pooled - pooled.mean()) ** 4).mean() / pooled.var(unbiased=False) ** 2
    assert abs(t["kurtosis"][0] - kurt.item()) < 1e-9 * kurt.item()
    for col in ("mean_norm", "std_norm", "rms", "kurtosis", "max_dim_kurtosis", "norm_p50", "max_abs"):
        assert abs(t[col][1] - d[col][1]) <= 1e-5 * abs(d[col][1]), col


def test_nonfinite_and_out_of_range_tokens_are_left_out():
    x = _tokens(3, 50).float()
    x[4, 0] = float("nan")
    x[9, 1] = EXACT_LIMIT * 2                       # outside the slices' range
    s = _run(x, [50])
    t = s.table()
    assert t.n_tokens.tolist() == [48, 48] and t.nonfinite_tokens.tolist() == [2, 2]
    keep = torch.ones(50, dtype=torch.bool)
    keep[[4, 9]] = False
    assert _table(_run(x[keep], [48])).drop(columns=["nonfinite_tokens"]).equals(
        _table(s).drop(columns=["nonfinite_tokens"]))


def test_default_checkpoints_and_identity_are_unchanged():
    s = StreamingStats(LABELS, H, "cpu", compile=False)
    assert "exact" not in s.state.tensors() and not s.exact
    c = CaptureSettings(model="m", prompts="p")
    assert "exact_sums" not in c.identity()          # runs made before the setting resume as before
    assert CaptureSettings(model="m", prompts="p", exact_sums=True).identity()["exact_sums"] is True


def test_compiled_update_gives_the_eager_bits():
    """The GPU path compiles exact_batch: compiled here (inductor on the CPU) it must give the eager bits."""
    from backend.stats import exact_batch

    compiled = torch.compile(exact_batch, dynamic=True)
    for n in (512, 300):
        x = _tokens(4, n)
        for u, v in zip(compiled(x), exact_batch(x), strict=True):
            assert torch.equal(u, v)
