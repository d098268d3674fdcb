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
