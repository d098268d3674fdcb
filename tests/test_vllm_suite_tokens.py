"""gpu/vllm_suite.py's count of the tokens each boundary's statistics hold, which its compiled-capture steps record
next to the tokens the hooks saw (an unarmed engine times an empty capture: 0 in every boundary)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import vllm_suite  # noqa: E402

from backend.stats import StreamingStats  # noqa: E402


def test_tokens_in_statistics_counts_each_boundary() -> None:
    stats = StreamingStats(["S_2", "F"], 8, "cpu", compile=False)
    assert vllm_suite.tokens_in_statistics(stats.state.tensors()) == [0, 0]
    stats.update(0, torch.randn(5, 8))
    stats.update(1, torch.randn(3, 8))
    stats.update(1, torch.full((2, 8), float("nan")))          # non-finite tokens count too
    assert vllm_suite.tokens_in_statistics(stats.state.tensors()) == [5, 5]
