"""backend/run_files.py: a run's prompt texts are looked up under the data root the caller gives (issue 21 item 3),
not the environment's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend import run_files
from backend.store.data_root import DataRoot


def test_prompt_texts_come_from_the_given_data_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    moved, other = tmp_path / "moved", tmp_path / "env"
    f = moved / "models" / "toy-pair" / "heldout.jsonl"
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps({"question_id": 7, "category": "writing", "turns": ["Write a haiku."]}) + "\n")
    other.mkdir()
    monkeypatch.setenv("SPECLENS_DATA", str(other))
    monkeypatch.delenv("SPECLENS_MODEL_ROOTS", raising=False)
    # recorded where the data root was when the bench ran; the root was moved since
    m = {"run_id": "b", "kind": "bench", "status": "complete",
         "settings": {"prompts": "/gone/data/models/toy-pair/heldout.jsonl"}}
    assert run_files.prompt_texts(m, DataRoot(moved)) == {"7": "Write a haiku."}
    assert run_files.prompt_texts(m) == {}, "the environment's data root does not hold it"
    monkeypatch.setenv("SPECLENS_MODEL_ROOTS", str(other))
    assert run_files.prompt_texts(m, DataRoot(moved)) == {}, "SPECLENS_MODEL_ROOTS, when set, is what is allowed"
