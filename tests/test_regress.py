"""`python -m backend regress` on the shipped toy pair: a re-run of the same settings passes, a planted drop (the
same drafter fed what SGLang 0.5.15 would feed it, S_3, S_5, S_6 instead of S_2, S_4, S_5, as a release that
changed its reading would) fails with one line; `runs --json` carries the headline figures; the Regression page
groups the runs by release."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backend.bench import BenchSettings, run_bench
from backend.demo import PAIR_TARBALL, heldout_prompts, toy_pair
from backend.errors import SpecLensError
from backend.store.data_root import DataRoot

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.skipif(not PAIR_TARBALL.exists(), reason="needs the toy pair (models/toy-pair.tar.gz)"),
              pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def benches(tmp_path_factory) -> dict:
    pair = toy_pair(DataRoot(tmp_path_factory.mktemp("toy")))
    root = tmp_path_factory.mktemp("regress-data")
    base = dict(target=str(pair / "target"), drafter=str(pair / "drafter-matched"), prompts=str(heldout_prompts(pair)),
                limit=12, num_spec_tokens=3, repeats=1, max_new_tokens=32, device="cpu")
    runs = {
        "baseline": run_bench(BenchSettings(**base), name="rel-old", data=DataRoot(root), progress=False),
        "rerun": run_bench(BenchSettings(**base, seed=1), name="rel-new", data=DataRoot(root), progress=False),
        "dropped": run_bench(BenchSettings(**base, producer="sglang", producer_version="0.5.15"), name="rel-drop",
                             data=DataRoot(root), progress=False),
    }
    plant_drop(root, runs["baseline"].run_id, "rel-planted")
    return {"root": root, "planted": "rel-planted", **{k: v.run_id for k, v in runs.items()}}


def plant_drop(root: Path, src: str, run_id: str, keep: float = 0.4) -> None:
    """A copy of bench run `src` whose drafter kept only `keep` of its accepted tokens on every prompt and step
    (a planted acceptance drop; tokens/s untouched), registered in the catalog as `run_id`."""
    import shutil

    import pandas as pd


    d = root / "runs" / run_id
    shutil.copytree(root / "runs" / src, d)
    for name in ("prompts.parquet", "steps.parquet"):
        df = pd.read_parquet(d / name)
        df["accepted"] = (df["accepted"] * keep).astype(df["accepted"].dtype)
        df.to_parquet(d / name)
    pr = pd.read_parquet(d / "prompts.parquet")
    m = json.loads((d / "manifest.json").read_text())
    m["run_id"] = run_id
    m["bench"]["tau"] = 1 + pr["accepted"].sum() / pr["drafts"].sum()
    m["bench"]["acceptance_rate"] = pr["accepted"].sum() / (pr["drafts"].sum() * m["num_spec_tokens"])
    (d / "manifest.json").write_text(json.dumps(m))
    DataRoot(root).catalog.write.refresh()


def _cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "backend", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "SPECLENS_DATA": str(root)})


def test_regress_passes_on_a_rerun_of_the_same_settings(benches) -> None:
    from backend import regress

    r = regress.compare(benches["baseline"], benches["rerun"], data=DataRoot(benches["root"]))
    assert r["verdict"] == "ok", r["line"]
    assert r["tau_difference"]["prompts"] == 12
    out = _cli(benches["root"], "regress", "--baseline", benches["baseline"], "--candidate", benches["rerun"])
    assert out.returncode == 0 and out.stdout.startswith("ok: "), out.stdout + out.stderr


def test_regress_fails_on_a_planted_drop(benches) -> None:
    from backend import regress

    r = regress.compare(benches["baseline"], benches["planted"], data=DataRoot(benches["root"]))
    assert r["verdict"] == "worse" and r["tau_difference"]["ci_high"] < 0, r["line"]
    out = _cli(benches["root"], "regress", "--baseline", benches["baseline"], "--candidate", benches["planted"])
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout.count("\n") == 1 and out.stdout.startswith("REGRESSION: "), out.stdout
    # a drop the threshold allows is not a regression
    big = regress.compare(benches["baseline"], benches["planted"], max_tau_drop=5.0, data=DataRoot(benches["root"]))
    assert big["verdict"] == "ok"


def test_a_drop_inside_the_interval_is_reported_not_failed(benches) -> None:
    """The toy drafter fed SGLang 0.5.15's reading (S_3, S_5, S_6) loses little on 12 prompts: reported, ok."""
    from backend import regress

    r = regress.compare(benches["baseline"], benches["dropped"], data=DataRoot(benches["root"]))
    assert "sglang 0.5.15 reading" in r["line"] and "vllm 0.24.0 V2 reading" in r["line"]
    d = r["tau_difference"]
    assert r["verdict"] == ("worse" if d["diff"] < -0.02 and d["ci_high"] < 0 else "ok")


def test_regress_refuses_runs_it_cannot_compare(benches) -> None:
    from backend import regress

    with pytest.raises(SpecLensError, match="no bench run"):
        regress.compare(benches["baseline"], "bench-nope", data=DataRoot(benches["root"]))
    out = _cli(benches["root"], "regress", "--baseline", benches["baseline"], "--candidate", "bench-nope")
    assert out.returncode == 2 and out.stderr.count("\n") == 1


def test_runs_json_carries_headline_figures(benches) -> None:
    out = _cli(benches["root"], "runs", "--json", "--kind", "bench")
    assert out.returncode == 0, out.stderr
    rows = {r["run_id"]: r for r in json.loads(out.stdout)}
    b = rows[benches["baseline"]]
    for key in ("tau", "acceptance_rate", "speedup", "speedup_ci_low", "speedup_ci_high", "lossless"):
        assert key in b, key
    assert b["tau"] > 1 and b["lossless"] is True
    assert rows[benches["dropped"]]["tau"] < b["tau"]


def test_history_groups_by_release(benches) -> None:
    from backend import regress

    groups = regress.history(data=DataRoot(benches["root"]))
    assert len(groups) == 1
    g = regress.with_release(next(iter(groups.values())), data=DataRoot(benches["root"]))
    assert set(g["run_id"]) == {benches["baseline"], benches["rerun"], benches["dropped"], benches["planted"]}
    assert any("sglang 0.5.15 reading" in r for r in g["release"])


def test_group_labels_are_the_history_groups_in_order(tmp_path, monkeypatch) -> None:
    """The run page links its Regression group by index from group_labels (one narrow query) instead of building
    every group: same labels, same order as `history`, on a catalog of many targets, drafters and K."""
    from backend import regress

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "bench"))
    from pages_bench import build_root

    root = tmp_path / "data"
    build_root(root, 120, 20_000)
    data = DataRoot(root)
    data.catalog.write.refresh(full=True)
    labels = regress.group_labels(data=data)
    assert len(labels) > 5
    assert labels == list(regress.history(data=data))
