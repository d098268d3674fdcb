"""Streaming statistics equal the same figures computed on all tokens at once."""

import numpy as np
import torch

from backend.stats import StreamingStats, TokenSample, context_hashes


def _data(seed=0, n=3000, h=16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, generator=g) * torch.linspace(0.5, 3, h) + 5.0   # offset mean: tests the shifted moments
    x[:, 3] += torch.randn(n, generator=g) ** 3 * 4                         # a heavy-tailed "outlier" dim
    return x


def test_streaming_equals_batch():
    x = _data()
    st = StreamingStats(["S_0"], 16)
    for chunk in torch.split(x, [1, 999, 1000, 700, 300]):
        st.update(0, chunk)
    v, t = st.vectors(), st.table().iloc[0]
    xd = x.double().numpy()
    np.testing.assert_allclose(v["mean"][0], xd.mean(0), rtol=1e-6)
    np.testing.assert_allclose(v["var"][0], xd.var(0), rtol=1e-6)
    np.testing.assert_allclose(v["max_abs"][0], np.abs(xd).max(0), rtol=1e-6)
    flat = xd.flatten()
    kurt = ((flat - flat.mean()) ** 4).mean() / flat.var() ** 2
    assert abs(t["kurtosis"] - kurt) / kurt < 1e-6
    norms = np.linalg.norm(xd, axis=1)
    assert abs(t["mean_norm"] - norms.mean()) < 1e-4
    assert abs(t["norm_p50"] - np.median(norms)) / np.median(norms) < 0.06   # histogram resolution
    assert t["top_dims"][0] == 3 and t["n_tokens"] == 3000 and t["nonfinite_tokens"] == 0


def test_nonfinite_tokens_counted_not_averaged():
    x = _data(n=100)
    x[10, 2] = float("nan")
    x[20, 0] = float("inf")
    st = StreamingStats(["S_1"], 16)
    st.update(0, x)
    t = st.table().iloc[0]
    assert t["nonfinite_tokens"] == 2 and t["n_tokens"] == 98
    good = torch.cat([x[:10], x[11:20], x[21:]]).double().numpy()
    np.testing.assert_allclose(st.vectors()["mean"][0], good.mean(0), rtol=1e-6)
    assert np.isfinite(t["mean_norm"]) and np.isfinite(t["max_abs"])


def test_sample_is_bounded_and_deterministic():
    s = TokenSample(["S_0", "F"], 4, capacity=10, per_seq=4)
    for n in (6, 2, 9, 9):
        ids = torch.arange(n)
        s.add(ids, {0: torch.ones(n, 4), 1: torch.zeros(n, 4)})
    t = s.tensors()
    assert t["S_0"].shape == (10, 4) and t["position"].tolist() == [0, 1, 2, 3, 0, 1, 0, 1, 2, 3]
    # same prefix -> same context hash; different prefix -> different
    h = context_hashes([5, 6, 7])
    assert h.tolist()[:2] == context_hashes([5, 6, 9]).tolist()[:2] and h[2] != context_hashes([5, 6, 9])[2]


def test_update_all_equals_per_boundary_updates():
    """The CPU path (all boundaries reduced together) gives the same figures as one update per boundary."""
    import pandas as pd

    g = torch.Generator().manual_seed(0)
    batches = [[torch.randn(37, 16, generator=g) * (i + 1) + i for i in range(3)] for _ in range(4)]
    batches[2][1][5, 3] = float("nan")
    batches[3][2][0] *= 1e7                          # a norm beyond the histogram's range stays out of it
    a, b = StreamingStats(["a", "b", "c"], 16), StreamingStats(["a", "b", "c"], 16)
    for batch in batches:
        for i, x in enumerate(batch):
            a.update(i, x)
        b.update_all(batch)
    pd.testing.assert_frame_equal(a.table(), b.table(), rtol=1e-6)
    assert torch.equal(a.state.norm_hist, b.state.norm_hist)
