"""Issue 22's proof through vLLM 0.24.0 on the H200, as recorded (tests/data/recorded/prove/vllm-0.24.0-h200, made by
gpu/prove_vllm.sh through `gpu/load_h200.sh prove-start`): the demo's slot-shift drafter (trained on S_0, S_3, S_5)
checked against vLLM 0.24.0, its fix written by `check-drafter --write-fix --prove --prove-engine vllm`, the GPU
worker benching the original, the fixed and the toy pair's matched drafter through the real vLLM engine against one
paired baseline. What vLLM fed each drafter is what the running engine's model held (aux ids read from it)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from backend import metrics
from backend.store.data_root import DataRoot

D = Path(__file__).parent / "data" / "recorded" / "prove" / "vllm-0.24.0-h200"
RUNS = {t: f"prove-h200-vllm-{t}" for t in ("original", "fixed", "matched")}


def manifest(run: str) -> dict:
    return json.loads((D / run / "manifest.json").read_text())


def per_prompt(run: str) -> pd.DataFrame:
    return pd.read_parquet(D / run / "prompts.parquet").groupby("prompt_id")[["accepted", "drafts"]].sum()


def diff(a: str, b: str) -> tuple[float, float, float]:
    x, y = per_prompt(RUNS[a]), per_prompt(RUNS[b])
    shared = x.index.intersection(y.index)
    assert len(shared) == 32
    return metrics.tau_difference(x.loc[shared].to_numpy(), y.loc[shared].to_numpy())


def test_the_check_found_the_training_boundaries_and_wrote_the_top_level_ids() -> None:
    plan = json.loads((D / "prove-h200" / "check.json").read_text())["fix"]["plan"]
    assert plan["trained_on"] == ["S_0", "S_3", "S_5"] and plan["fed_before"] == ["S_2", "S_4", "S_5"]
    assert plan["where"] == "top-level" and plan["ids"] == [0, 3, 5]
    fixed = json.loads((D / "fixed_config.json").read_text())
    assert fixed["eagle_aux_hidden_state_layer_ids"] == [0, 3, 5]
    assert fixed["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]   # left as it was


def test_the_running_engine_fed_what_the_conventions_table_predicts() -> None:
    fed = {t: manifest(r)["aux"] for t, r in RUNS.items()}
    assert fed["original"]["boundaries"] == fed["original"]["predicted"] == ["S_2", "S_4", "S_5"]
    assert fed["fixed"]["boundaries"] == fed["fixed"]["predicted"] == ["S_0", "S_3", "S_5"]
    assert fed["fixed"]["engine_ids"] == [0, 3, 5] and fed["fixed"]["runner"] == "v2"
    assert all("read from the running model" in f["ids_from"] for f in fed.values())
    assert {manifest(r)["engine_version"] for r in RUNS.values()} == {"vllm 0.24.0"}


def test_the_fix_recovers_tau_to_the_matched_drafter_and_stays_lossless() -> None:
    """The bar: the fixed drafter's tau within the matched drafter's interval (the paired 95% interval of
    tau(fixed) - tau(matched) holds 0), well above the original's, greedy outputs equal to plain decoding."""
    d, lo, hi = diff("fixed", "matched")
    assert lo <= 0 <= hi and abs(d) < 0.1
    d, lo, hi = diff("fixed", "original")
    assert lo > 0.5
    for run in RUNS.values():
        b = manifest(run)["bench"]
        assert b["lossless"] is True and b["mismatched_prompts"] == 0
        assert manifest(run)["baseline_run"] == "prove-h200-vllm-original-baseline"    # one paired baseline
    taus = {t: manifest(r)["bench"]["tau"] for t, r in RUNS.items()}
    assert taus["original"] < 1.5 < 2.0 < taus["fixed"] == pytest.approx(taus["matched"], abs=0.1)


@pytest.fixture(scope="module")
def proof_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import shutil


    root = tmp_path_factory.mktemp("proof-data")
    for d in D.iterdir():
        if d.is_dir():
            shutil.copytree(d, root / "runs" / d.name)
    DataRoot(root).catalog.write.refresh(full=True)
    return root


def test_the_pages_say_what_the_fix_is_worth_at_serving_load(proof_root: Path, monkeypatch) -> None:
    """Issue 19 item 4 on the pages: the Drafter check (a fix is known) and Compare (original against fixed) read the
    taus on the speedup map recorded on the H200 (datasets/maps) and say the gain per concurrency."""
    from backend.drafter_worth import find_map, worth_by_concurrency
    from tests.test_pages import open_page, texts

    monkeypatch.setenv("SPECLENS_DATA", str(proof_root))
    m = find_map()
    assert m is not None and m.shipped and m.run_id == "h200-vllm-synthetic-8b"
    check = json.loads((D / "prove-h200" / "check.json").read_text())
    gains = worth_by_concurrency(m.cells, check["engine_feeds"]["accuracy"]["tau"], check["best_candidate"]["tau"])
    at = open_page("pages/drafter_check.py", run="prove-h200")
    line = next(ln for ln in texts(at.markdown).splitlines() if ln.startswith("**What the fix is worth"))
    assert f"{gains[0].gain:+.0%} at concurrency 1" in line and f"{gains[-1].gain:+.0%} at concurrency 64" in line
    assert "h200-vllm-synthetic-8b" in line and not at.exception
    at = open_page("pages/compare.py", runs=f"{RUNS['fixed']},{RUNS['original']}")
    line = next(ln for ln in texts(at.markdown).splitlines() if ln.startswith("**What the fix is worth"))
    taus = {t: manifest(r)["bench"]["tau"] for t, r in RUNS.items()}
    assert f"raising tau from {taus['original']:.2f} to {taus['fixed']:.2f}" in line and not at.exception


def test_worth_without_a_map_of_ones_own(capsys) -> None:
    from backend.__main__ import main

    assert main(["worth", "--tau-from", "1.2", "--tau-to", "2.1"]) == 0
    out = capsys.readouterr().out
    assert "shipped with SpecLens" in out and "concurrency   64: raising tau from 1.20 to 2.10" in out
