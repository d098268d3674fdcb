"""dashboard/severity.py: one scale, in proportion to the cost and its certainty (issue 20 item 1), and the Stats
headline's one definition of change (item 5)."""

from __future__ import annotations

import math

import pandas as pd

from dashboard import severity


def test_levels_follow_the_size_of_the_cost() -> None:
    assert severity.tau_cost(2.52, 2.47).level.key == "note"           # the toy after-layer drafter: 2%
    assert severity.tau_cost(2.55, 1.27).level.key == "error"          # the slot-shift drafter: 50%
    assert severity.tau_cost(2.13, 1.80).level.key == "warning"        # 15%
    assert severity.tau_cost(2.13, 2.125).level.key == "ok"            # under 1%
    assert severity.tau_cost(2.0, 2.4).level.key == "ok"               # a gain is no cost
    assert "20% higher" in severity.tau_cost(2.0, 2.4).words


def test_an_uncertain_cost_is_at_most_a_note() -> None:
    c = severity.tau_cost(2.13, 1.21, lo=-0.1, hi=1.9)                 # the interval reaches 0
    assert c.level.key == "note" and not c.sure and "not told apart" in c.words
    sure = severity.tau_cost(2.13, 1.21, lo=0.83, hi=1.01)
    assert sure.level.key == "error" and sure.sure and "95% CI 39% to 47%" in sure.words
    assert severity.tau_cost(2.52, 1.27, sure=False).level.key == "note"


def test_significance_is_never_read_as_size() -> None:
    small = severity.tau_cost(2.52, 2.47, sure=True)
    words = severity.significance_words(13.3, 2.0, small)
    assert "told apart" in words and "but small" in words and "clearly" not in words
    assert "not told apart" in severity.significance_words(1.2, 2.0, small)
    big = severity.tau_cost(2.55, 1.27, sure=True)
    assert "a large cost" in severity.significance_words(20.0, 2.0, big)
    assert severity.significance_words(None, 2.0, None) == "z not computable"


def test_headline_puts_level_and_size_first() -> None:
    assert severity.headline(severity.tau_cost(2.55, 1.27), "x").startswith("**Error** (tau cost 50%): x")
    assert severity.headline(severity.tau_cost(2.0, 2.4), "x") == "**No cost**: x"


def _frame(rows):
    return pd.DataFrame(rows, columns=["run_id", "boundary", "diff", "rel"])


def test_stat_headline_uses_the_charts_change() -> None:
    # S_2 has the largest relative change, S_8 the largest absolute one: diff mode names S_8, rel mode S_2
    f = _frame([("b", "S_2", 0.5, 0.25), ("b", "S_8", -40.0, -0.10), ("b", "S_4", 0.001, 0.0001)])
    level, line = severity.stat_headline(f, "diff", "mean norm", "a", "Largest change: mean norm +25% at S_2 (b vs a).")
    assert "-40 at S_8 (b minus a" in line and level.key == "note"
    assert "Matters from 1% of the reference's value: 2 of 3" in line
    _, rel = severity.stat_headline(f, "rel", "mean norm", "a", "Largest change: mean norm +25% at S_2 (b vs a).")
    assert rel.startswith("Largest change: mean norm +25% at S_2")
    _, values = severity.stat_headline(f, "values", "mean norm", "a", "")
    assert "is +25% at S_2 (b)" in values
    quiet = _frame([("b", "S_2", 0.001, 0.001)])
    level, line = severity.stat_headline(quiet, "diff", "mean norm", "a", "")
    assert level.key == "ok" and "so no change here matters" in line
    level, _ = severity.stat_headline(_frame([("b", "S_2", math.nan, math.nan)]), "diff", "m", "a", "v")
    assert level.key == "ok"


# ---------------------------------------------------------------------------- a bench's wrong feed (issue 20 item 1)

def _feed_case(fed: list[str], k: int = 4) -> tuple[dict, dict]:
    d, t = {"path": "/m/drafter", "fingerprint": "d1"}, {"path": "/m/target", "fingerprint": "t1"}
    run = {"kind": "bench", "engine": "hf", "drafter": d, "model": t, "num_spec_tokens": k,
           "aux": {"boundaries": fed, "producer": "vllm", "version": "0.24.0"}}
    check = {"kind": "check", "drafter": d, "model": t, "check": {"best": ["S_3", "S_5", "S_6"]}}
    return run, check


class _Read:
    """The catalog reads backend.findings makes: a check's stored result, complete benches, per-prompt counts."""

    def __init__(self, rep: dict | None, benches: dict | None = None, speeds: pd.DataFrame | None = None):
        self.rep, self.benches, self.speeds = rep, benches or {}, speeds

    def drafter_check(self, run_id: str) -> dict:
        if self.rep is None:
            raise FileNotFoundError(run_id)
        return self.rep

    def bench_runs(self, status: str | None = None) -> pd.DataFrame:
        return pd.DataFrame({"run_id": list(self.benches), "num_spec_tokens": [4] * len(self.benches)})

    def run_manifest_keys(self, ids, keys, having=None) -> dict:
        return {r: self.benches[r] for r in ids}

    def bench_prompt_speeds(self, ids) -> pd.DataFrame:
        return self.speeds[self.speeds["run_id"].isin(ids)]


def test_a_wrong_feed_is_graded_by_what_it_costs() -> None:
    """backend/findings.py: the check's predicted tau of the fed set against the trained set's sets the level (the
    after-layer drafter's 3% a note, the slot-shift one's 50% an error); with no cost evidence a note that says so;
    with a bench of the same drafter fed the trained set, the measured cost. The run page and `runs` word the same."""
    from backend import findings
    from dashboard import run_view

    run, check = _feed_case(["S_2", "S_4", "S_5"])

    def rep(fed_tau: float, z: float) -> dict:
        return {"candidates": [{"boundaries": ["S_3", "S_5", "S_6"], "tau": 2.27, "z_vs_best": None},
                               {"boundaries": ["S_2", "S_4", "S_5"], "tau": fed_tau, "z_vs_best": z}]}

    small = findings.findings({"b": run}, {"chk": check}, _Read(rep(2.21, 9.0)))["b"]
    f = next(x for x in small if x.kind == "mismatch")
    assert f.severity == "note" and f.cost.source == "predicted" and round(f.cost.rel, 3) == 0.026
    assert f.short.startswith("note: wrong feed: S_2,S_4,S_5, trained on S_3,S_5,S_6 (chk), predicted tau 3% lower")
    line = run_view.finding_line(f, run)
    assert line.startswith("**Note** (tau cost 3%): Fed the wrong boundaries, predicted tau 2.21 against 2.27")
    assert run_view.finding_level(f).key == "note"
    big = findings.findings({"b": run}, {"chk": check}, _Read(rep(1.13, 20.0)))["b"]
    assert big[0].severity == "error" and big[0].short.startswith("error: wrong feed")
    assert findings.finding_text(big).startswith("error: wrong feed") and "reading on HF" in findings.finding_text(big)
    unsure = findings.findings({"b": run}, {"chk": check}, _Read(rep(1.13, 1.0)))["b"][0]
    assert unsure.severity == "note" and "not told apart from none" in unsure.short     # at most a note

    for read in (None, _Read(None)):                     # no cost evidence: a note that says so, never an error
        f = findings.findings({"b": run}, {"chk": check}, read)["b"][0]
        assert f.severity == "note" and f.cost is None and f.short.endswith("(chk), cost not measured")
        assert run_view.finding_line(f, run).startswith("**Note** (cost not measured")

    ref, _ = _feed_case(["S_3", "S_5", "S_6"])           # the same drafter benched fed the trained set
    prompts = [f"p{i}" for i in range(8)]
    speeds = pd.DataFrame({"run_id": ["ref"] * 8 + ["b"] * 8, "prompt_id": prompts * 2,
                           "accepted": [12, 13, 11, 12, 12, 14, 12, 11] + [5, 6, 4, 5, 6, 5, 4, 5],
                           "drafts": [10] * 16})
    f = findings.findings({"b": run}, {"chk": check}, _Read(None, {"ref": ref}, speeds))["b"][0]
    assert f.cost.source == "measured" and f.cost.reference == "ref" and f.cost.prompts == 8
    assert f.severity == "error" and "tau against ref" in f.short and f.cost.lo > 0
    assert "over 8 shared prompts" in run_view.finding_line(f, run)


# ---------------------------------------------------------------------------- a wrong feed follows the weights (item 2)

def _drafter_dir(path, ids: list[int], weights_from=None, shift: float = 0.0):
    """A drafter directory: config.json with `ids` in eagle_config, its weights hard-linked from `weights_from`
    (as `check-drafter --write-fix` links them) or written (`shift` makes other weights of the same shape)."""
    import json
    import os

    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64,
                                                  "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}}))
    if weights_from is not None:
        os.link(weights_from / "model.safetensors", path / "model.safetensors")
    else:
        save_file({"fc.weight": torch.arange(64.0 * 192).reshape(64, 192) + shift}, str(path / "model.safetensors"))
    return path


def test_a_wrong_feed_follows_the_weights_not_the_config(tmp_path) -> None:
    """What a check found a drafter trained on is a property of its weights: a bench of a copy of the checked drafter
    whose config.json alone differs (the demo's patch and the written fix, benched as vLLM 0.24.0 reads it: fed
    S_2,S_4,S_5, trained on S_0,S_3,S_5) gets the wrong-feed finding graded on the one scale, on the run page, `runs`
    and Compare alike (backend/model_id.py `weights_fingerprint`, compare.same_weights); a drafter with other weights
    of the same shape gets none; a copy fed what the weights were trained on gets none."""
    from backend import findings
    from backend.model_id import fingerprint, identity, weights_fingerprint
    from dashboard import compare_words

    checked = _drafter_dir(tmp_path / "drafter-slot-shift", [2, 4, 5])
    fixed = _drafter_dir(tmp_path / "drafter-slot-shift-fixed", [-1, 2, 4], weights_from=checked)
    patched = _drafter_dir(tmp_path / "drafter-slot-shift-patched", [-1, 3, 5], weights_from=checked)
    other = _drafter_dir(tmp_path / "drafter-other", [2, 4, 5], shift=1.0)
    assert fingerprint(fixed) != fingerprint(checked) and weights_fingerprint(fixed) == weights_fingerprint(checked)
    assert weights_fingerprint(other) != weights_fingerprint(checked) and weights_fingerprint(tmp_path) is None
    assert identity(checked) == {"fingerprint": fingerprint(checked),
                                 "weights_fingerprint": weights_fingerprint(checked)}

    tgt = {"path": "/m/target", "fingerprint": "t1"}

    def drafter(p):        # the drafter section bench.py and check_drafter.py record
        return {"path": str(p), "format": "eagle3", **identity(p)}

    def bench(p, fed: list[str], producer: str = "vllm") -> dict:
        return {"kind": "bench", "engine": "hf", "drafter": drafter(p), "model": tgt, "num_spec_tokens": 4,
                "aux": {"boundaries": fed, "producer": producer, "version": "0.24.0"}}

    trained, vllm_feed = ["S_0", "S_3", "S_5"], ["S_2", "S_4", "S_5"]
    runs = {"fixed-vllm": bench(fixed, vllm_feed), "patched": bench(patched, ["S_0", "S_4", "S_6"]),
            "fixed": bench(fixed, trained), "other": bench(other, vllm_feed)}
    checks = {"chk": {"kind": "check", "drafter": drafter(checked), "model": tgt, "check": {"best": trained}}}
    rep = {"candidates": [{"boundaries": trained, "tau": 2.19, "z_vs_best": None},
                          {"boundaries": vllm_feed, "tau": 1.27, "z_vs_best": 20.0}]}

    found = findings.findings(runs, checks, _Read(rep))
    wrong = {r: next((f for f in fs if f.kind == "mismatch"), None) for r, fs in found.items()}
    f = wrong["fixed-vllm"]
    assert f is not None and f.severity == "error" and f.cost.source == "predicted"
    assert round(f.cost.rel, 2) == 0.42 and f.mismatch.check == "chk" and f.mismatch.trained == trained
    assert f.short.startswith("error: wrong feed: S_2,S_4,S_5, trained on S_0,S_3,S_5 (chk), predicted tau 42% lower")
    assert wrong["patched"] is not None and wrong["patched"].mismatch.fed == ["S_0", "S_4", "S_6"]
    assert wrong.get("fixed") is None and wrong.get("other") is None
    # Compare says the same (compare.drafter_mismatches, the one place that decides it)
    lines = compare_words.drafter_diagnosis(runs, checks)
    assert len(lines) == 2 and lines[0].startswith("`fixed-vllm`") and lines[1].startswith("`patched`")

    # the measured cost, without the check's scores: the same weights fed the trained set are the reference
    prompts = [f"p{i}" for i in range(8)]
    speeds = pd.DataFrame({"run_id": ["fixed"] * 8 + ["patched"] * 8, "prompt_id": prompts * 2,
                           "accepted": [12, 13, 11, 12, 12, 14, 12, 11] + [5, 6, 4, 5, 6, 5, 4, 5],
                           "drafts": [10] * 16})
    got = findings.findings({"patched": runs["patched"]}, checks, _Read(None, {"fixed": runs["fixed"]}, speeds))
    f = got["patched"][0]
    assert f.cost.source == "measured" and f.cost.reference == "fixed" and f.severity == "error"

    # manifests written before the weights fingerprint: the fingerprint-or-path rule, as before
    old = {c: {**m, "drafter": {k: v for k, v in m["drafter"].items() if k != "weights_fingerprint"}}
           for c, m in checks.items()}
    before = findings.findings({"fixed-vllm": runs["fixed-vllm"], "again": bench(checked, vllm_feed)}, old, _Read(rep))
    assert [f.kind for f in before["fixed-vllm"]] == ["hf_reading"]
    assert before["again"][0].kind == "mismatch" and before["again"][0].severity == "error"
