"""tools/run_files_digest.py: a run's digest ignores when, where and how long (timestamps, pid, host, git commit,
durations, the data root's path, timing columns) and changes with anything the run says."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import run_files_digest as rfd  # noqa: E402


def _safetensors(path: Path, data: bytes, meta: str) -> None:
    header = json.dumps({"__metadata__": {"written": meta},
                         "x": {"dtype": "U8", "shape": [len(data)], "data_offsets": [0, len(data)]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def _root(tmp: Path, name: str, *, when: str = "2026-12-01", tau: float = 2.5, secs: float = 1.0,
          stats: bytes = b"\x01\x02") -> Path:
    root = tmp / name
    d = root / "runs" / "r1"
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({
        "run_id": "r1", "created": when, "updated": when, "host": when, "pid": len(when), "git_commit": when,
        "model": {"path": str(root / "models" / "t")}, "headline": {"seconds": secs, "tokens": 9}, "tau": tau}))
    pd.DataFrame({"prompt_id": [1, 2], "tau": [tau, 1.0], "seconds": [secs, secs], "ttft_s": [secs, 0.1]}) \
        .to_parquet(d / "prompts.parquet")
    _safetensors(d / "stats.safetensors", stats, when)
    (d / "run.log").write_text(when)
    return root


def test_same_run_elsewhere_and_later_has_the_same_digest(tmp_path: Path) -> None:
    a = rfd.run_digests(_root(tmp_path, "a"))
    b = rfd.run_digests(_root(tmp_path, "b", when="2027-01-02T03:04", secs=7.0))
    assert rfd.digest(a["r1"]) == rfd.digest(b["r1"]) and rfd.differences(a["r1"], b["r1"]) == []
    assert a["r1"]["run.log"][0] == rfd.SKIPPED


def test_what_a_run_says_changes_its_digest(tmp_path: Path) -> None:
    a = rfd.run_digests(_root(tmp_path, "a"))
    b = rfd.run_digests(_root(tmp_path, "b", tau=2.75))
    c = rfd.run_digests(_root(tmp_path, "c", stats=b"\x01\x03"))
    assert rfd.digest(a["r1"]) != rfd.digest(b["r1"]) != rfd.digest(c["r1"])
    assert rfd.differences(a["r1"], b["r1"]) == ["manifest.json: tau", "prompts.parquet: tau"]
    assert rfd.differences(a["r1"], c["r1"]) == ["stats.safetensors: x"]
