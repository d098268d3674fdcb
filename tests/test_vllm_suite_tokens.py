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
    got = {"tokens_seen": 5, "forwards": 2, "state": stats.state.tensors()}
    assert vllm_suite.token_counts(got, 5)["tokens_in_statistics"] == [0, 0]
    assert vllm_suite.token_counts(got, 5)["every_token_in_statistics"] is False
    stats.update(0, torch.randn(5, 8))
    stats.update(1, torch.randn(3, 8))
    stats.update(1, torch.full((2, 8), float("nan")))          # non-finite tokens count too
    got["state"] = stats.state.tensors()
    assert vllm_suite.token_counts(got, 5)["tokens_in_statistics"] == [5, 5]
    assert vllm_suite.token_counts(got, 5)["every_token_in_statistics"] is True
