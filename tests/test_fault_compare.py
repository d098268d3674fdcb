"""gpu/fault_suite.py's comparison of a resumed capture with its uninterrupted reference: two captures whose
statistics hold no tokens are not "equal" (on 2026-12-07 such a pair was reported bit-equal)."""

import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import fault_suite  # noqa: E402


def _run(path: Path, n_tokens: int) -> Path:
    path.mkdir(parents=True)
    pd.DataFrame({"run_id": [path.name] * 2, "boundary": ["S_2", "F"], "n_tokens": [n_tokens] * 2,
                  "mean_norm": [1.5, 2.5] if n_tokens else [float("nan")] * 2}).to_parquet(path / "stats.parquet")
    (path / "manifest.json").write_text(json.dumps({
        "headline": {"tokens": n_tokens, "prompts": 4, "sample_tokens": 0, "nonfinite": {}},
        "progress": {"done": 4, "total": 4}}))
    return path


def test_two_empty_captures_are_not_equal(tmp_path) -> None:
    diffs = fault_suite.compare_capture(_run(tmp_path / "ref", 0), _run(tmp_path / "got", 0))
    assert diffs and "hold no tokens" in diffs[-1]


def test_two_equal_captures_with_tokens_are_equal(tmp_path) -> None:
    assert fault_suite.compare_capture(_run(tmp_path / "ref", 7560), _run(tmp_path / "got", 7560)) == []
