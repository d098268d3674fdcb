"""One owner of a run's life (backend/runs/lifecycle.py): every state change is re-indexed there, in one place, and
a malformed manifest is refused before anything is written; the dashboard reads through the catalog object only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from backend.errors import SpecLensError
from backend.runs.lifecycle import Run, RunGuard
from backend.store.data_root import DataRoot

REPO = Path(__file__).resolve().parents[1]
MANIFEST = {"kind": "capture", "engine": "hf", "model": {"path": "/m", "n_layers": 2, "hidden_size": 8},
            "boundaries": ["S_0", "S_1"], "progress": {"done": 0, "total": 3}}


def _status(root: Path, run_id: str) -> str | None:
    df = DataRoot(root).catalog.read.run_states([run_id])
    return df["status"].iloc[0] if len(df) else None


def test_each_state_change_is_indexed_at_once(tmp_path: Path) -> None:
    run = Run.create("r1", MANIFEST, DataRoot(tmp_path))
    assert _status(tmp_path, "r1") == "running"                       # no refresh call by the caller
    run.fail("boom: one line")
    assert _status(tmp_path, "r1") == "failed"
    assert DataRoot(tmp_path).catalog.read.get_run("r1")["error"] == "boom: one line"
    run.claim(progress={"done": 1, "total": 3})
    assert _status(tmp_path, "r1") == "running"
    run.progress(2, 3, checkpoint=True)
    assert DataRoot(tmp_path).catalog.read.get_run("r1")["progress_done"] == 2
    run.complete(headline={"tokens": 5, "prompts": 3})
    row = DataRoot(tmp_path).catalog.read.get_run("r1")
    assert row["status"] == "complete" and row["tokens"] == 5
    Run.remove("r1", DataRoot(tmp_path))
    assert _status(tmp_path, "r1") is None


def test_progress_between_checkpoints_is_not_reindexed_every_time(tmp_path: Path) -> None:
    run = Run.create("r2", MANIFEST, DataRoot(tmp_path))
    run.progress(1, 3)                                  # just indexed by create: not due yet
    assert Run.open("r2", DataRoot(tmp_path)).manifest()["progress"]["done"] == 1
    assert DataRoot(tmp_path).catalog.read.get_run("r2")["progress_done"] == 0


def test_guard_fails_the_run_and_indexes_it(tmp_path: Path) -> None:
    run = Run.create("r3", MANIFEST, DataRoot(tmp_path))
    with pytest.raises(ValueError):
        with RunGuard(run):
            raise ValueError("bad value\nsecond line")
    assert _status(tmp_path, "r3") == "failed"
    assert DataRoot(tmp_path).catalog.read.get_run("r3")["error"] == "ValueError: bad value"


@pytest.mark.parametrize("bad, field", [({**MANIFEST, "kind": "train"}, "kind"),
                                        ({**MANIFEST, "progress": {"done": -1, "total": 3}}, "progress.done"),
                                        ({k: v for k, v in MANIFEST.items() if k != "model"}, "model")])
def test_malformed_manifest_is_refused_before_anything_is_written(tmp_path: Path, bad: dict, field: str) -> None:
    with pytest.raises(SpecLensError, match=rf"manifest field '{field}'"):
        Run.create("r4", bad, DataRoot(tmp_path))
    assert not (tmp_path / "runs" / "r4").exists()


def _calls(f: Path, attr: str) -> list[int]:
    return [n.lineno for n in ast.walk(ast.parse(f.read_text()))
            if isinstance(n, ast.Attribute) and n.attr == attr]


def test_runs_are_reindexed_in_one_place() -> None:
    """No producer (capture, bench, import, check, engines, jobs, demo) refreshes the catalog itself: only the
    lifecycle, the catalog and the maintenance CLI (`runs`, `db rebuild`) and regress (reads what is on disk) do."""
    allowed = {"backend/runs/lifecycle.py", "backend/store/catalog.py", "backend/__main__.py", "backend/regress.py"}
    found = {str(f.relative_to(REPO)): _calls(f, "refresh") for f in (REPO / "backend").rglob("*.py")}
    assert {f for f, lines in found.items() if lines} <= allowed, found


def test_pages_read_through_the_catalog_only() -> None:
    """Pages and the dashboard never open run directories, the alignment cache or stored checks themselves."""
    banned = ("backend.store.rundir", "backend.align", "backend.store.check_result", "backend.check_drafter",
              "duckdb")
    for f in list((REPO / "pages").glob("*.py")) + list((REPO / "dashboard").glob("*.py")) + [REPO / "app.py"]:
        for n in ast.walk(ast.parse(f.read_text())):
            mods = ([a.name for a in n.names] if isinstance(n, ast.Import)
                    else [n.module or ""] if isinstance(n, ast.ImportFrom) else [])
            for m in mods:
                names = {a.name for a in n.names} if isinstance(n, ast.ImportFrom) else set()
                if m == "backend.align" and names <= {"MATCH_COS", "CKA_SE_BOUND", "Alignment", "get_alignment"}:
                    continue                     # constants, the result type and its owner (reads and stores
                                                 # through the catalog: backend/store/catalog.py)
                assert not m.startswith(banned), f"{f.relative_to(REPO)} imports {m}"


def test_complete_drops_resume_files_before_it_reindexes(tmp_path: Path) -> None:
    """The checkpoint/journal goes right after the manifest says complete, before the (slower) re-index: a kill
    in between must not leave a complete run with a checkpoint (tests/test_reliability.py kills at random)."""
    run = Run.create("r5", MANIFEST, DataRoot(tmp_path))
    run.file("checkpoint.safetensors").write_bytes(b"x")
    seen = []
    run._changed = lambda: seen.append(run.file("checkpoint.safetensors").exists())      # what the re-index sees
    run.complete(drop=("checkpoint.safetensors",), headline={"tokens": 1})
    assert seen == [False] and run.manifest()["status"] == "complete"
