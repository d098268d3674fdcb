"""The slot-shift case of the demo (issue 15): a drafter trained on speculators <= 0.4 files [embeddings, layer
outputs] (fc slots S_0, S_3, S_5) served by SGLang (S_3, S_5, S_6), patched (S_0, S_4, S_6) and fixed (S_0, S_3, S_5).
The shipped drafter is checked and benched; the drop, the check's names and the first screen's story are asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend import coords
from backend.demo import PAIR_TARBALL, SLOT_TARBALL
from backend.drafter.finder import candidate_sets, convention_of
from backend.store.data_root import DataRoot
from backend.toy import slot_shift as ss
from dashboard.compare_words import relation_words as _relation

pytestmark = pytest.mark.usefixtures("one_torch_thread")
need_models = pytest.mark.skipif(not (PAIR_TARBALL.exists() and SLOT_TARBALL.exists()),
                                 reason="models/toy-pair.tar.gz or models/toy-slot-shift.tar.gz missing")


def test_what_sglang_feeds_each_config():
    def feeds(ids):
        return coords.labels(coords.resolve_ids("sglang", ids, 8, version="0.5.15"))

    assert ss.FEEDS["SGLang ids [2, 4, 5]"] == feeds(ss.IDS) == ["S_3", "S_5", "S_6"]
    assert ss.FEEDS["SGLang patched ids [-1, 3, 5]"] == feeds(ss.PATCHED_IDS) == ["S_0", "S_4", "S_6"]
    assert feeds(ss.FIX_IDS) == ss.TRAINED == ["S_0", "S_3", "S_5"]
    assert ss.LAYOUT[0] == "S_0" and ss.TEACHER == "S_6"


def test_finder_tries_the_embeddings_first_sets():
    sets = candidate_sets(8, 3, [("SGLang", ["S_3", "S_5", "S_6"])], ["S_3", "S_5", "S_6"], [("nested", [2, 4, 5])])
    assert ("S_0", "S_3", "S_5") in sets
    patched = candidate_sets(8, 3, [("SGLang", ["S_0", "S_4", "S_6"])], ["S_0", "S_4", "S_6"], [("nested", [-1, 3, 5])])
    assert ("S_0", "S_3", "S_5") in patched
    words = convention_of(["S_0", "S_3", "S_5"], [("eagle_config", [2, 4, 5])], 8)
    assert "embeddings" in words and "standardize_data_v1" in words


def test_compare_names_the_slot_shift():
    assert "every slot shifted" in _relation(["S_3", "S_5", "S_6"], ["S_0", "S_3", "S_5"])
    assert _relation(["S_0", "S_4", "S_6"], ["S_0", "S_3", "S_5"]) == \
        "a different set: slot 2 got S_4 for S_3, slot 3 got S_6 for S_5"
    assert _relation(["S_2", "S_4", "S_5"], ["S_3", "S_5", "S_6"]).startswith("off by one")


def test_variants_carry_the_patch_and_the_fix(tmp_path):
    d = tmp_path / "drafter-slot-shift"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 4, 5]}}))
    (d / "model.safetensors").write_bytes(b"x")
    made = ss.write_variants(tmp_path)
    assert len(made) == 2 and ss.write_variants(tmp_path) == []
    ids = {p.name: json.loads((p / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
           for p in made}
    assert ids == {"drafter-slot-shift-patched": [-1, 3, 5], "drafter-slot-shift-fixed": [-1, 2, 4]}


@need_models
def test_drafter_check_names_the_trained_slots_and_the_fix(tmp_path):
    from backend.check_drafter import CheckSettings, run_check
    from backend.demo import slot_shift_models, toy_pair

    pair, slot = toy_pair(DataRoot(tmp_path)), slot_shift_models(DataRoot(tmp_path))
    rep = run_check(CheckSettings(drafter=str(slot / "drafter-slot-shift"), target=str(pair / "target"),
                                  engine="sglang", device="cpu", training_data=str(slot / "training-data"),
                                  training_format="speculators-legacy"), data=DataRoot(tmp_path), progress=False).report
    assert rep["best_candidate"]["boundaries"] == ["S_0", "S_3", "S_5"]      # S_0 first: the embedding slot
    assert rep["verdict_severity"] == "error" and "Mismatch" in rep["verdict"]
    assert "S_3, S_5, S_6" in rep["verdict"] and "[-1, 2, 4]" in rep["verdict"]
    data = [f["text"] for f in rep["findings"] if f.get("source") == "training_data"]
    assert any("trained on S_0, S_3, S_5" in t and "feeds S_3, S_5, S_6" in t for t in data), data


@need_models
def test_demo_shows_the_drop_and_tells_the_story(tmp_path, monkeypatch):
    """On 40 held-out prompts: the slot-shift drafter as SGLang feeds it is clearly below the matched drafter and below
    itself fed what it was trained on (paired intervals above zero; the issue's 25% bar is not met on this toy, see
    docs/PERFORMANCE.md), the patch in between; the Runs page's three lines link the proof."""
    import numpy as np

    from backend import metrics
    from backend.bench import BenchSettings, run_bench
    from backend.demo import build_slot_shift_demo, heldout_prompts, story, toy_pair

    pair = toy_pair(DataRoot(tmp_path))
    run_bench(BenchSettings(target=str(pair / "target"), drafter=str(pair / "drafter-matched"),
                            prompts=str(heldout_prompts(pair)), num_spec_tokens=4, limit=40, max_new_tokens=48,
                            repeats=1, device="cpu"), name="demo-bench-matched", data=DataRoot(tmp_path),
              progress=False)
    assert story(DataRoot(tmp_path)) is None                                   # not until the slot-shift runs exist
    from backend import prove_fix

    proofs, real = [], prove_fix.prove             # the benches go through the proof path of check-drafter --prove
    monkeypatch.setattr(prove_fix, "prove", lambda *a, **k: proofs.append(real(*a, **k)) or proofs[-1])
    build_slot_shift_demo(DataRoot(tmp_path), progress=False, limit=40)
    assert [(pr.original, pr.fixed) for pr in proofs] == [("demo-bench-slot-shift", "demo-bench-slot-shift-fixed")]
    assert proofs[0].lossless is True and proofs[0].gain_ci is not None and proofs[0].gain_ci[0] > 0
    manifests = {r: json.loads((tmp_path / "runs" / r / "manifest.json").read_text()) for r in
                 ("demo-bench-slot-shift", "demo-bench-slot-shift-patched", "demo-bench-slot-shift-fixed")}
    assert {m["baseline_run"] for m in manifests.values()} == {proofs[0].baseline}     # one paired baseline
    DataRoot(tmp_path).catalog.write.refresh()
    runs = DataRoot(tmp_path).catalog.read.bench_runs().set_index("run_id")
    tau = runs["tau"].to_dict()
    assert tau["demo-bench-matched"] >= 2.0
    # the shifted feed costs clearly: below the matched drafter and below the same drafter fed what it was trained on
    assert tau["demo-bench-slot-shift"] <= 0.92 * tau["demo-bench-matched"], tau
    assert (tau["demo-bench-slot-shift"] < tau["demo-bench-slot-shift-patched"]
            <= tau["demo-bench-slot-shift-fixed"] + 0.05)
    spec = [r for r in runs.index if r in tau and r.startswith("demo-bench-") and not r.endswith("-baseline")]
    assert len(spec) == 5 and all(bool(runs.loc[r, "lossless"]) for r in spec)    # 4 + the regression pair's run
    sp = DataRoot(tmp_path).catalog.read.bench_prompt_speeds(spec)
    per = {r: g.groupby("prompt_id")[["accepted", "drafts"]].sum() for r, g in sp.groupby("run_id")}
    for better in ("demo-bench-matched", "demo-bench-slot-shift-fixed"):
        a, b = per[better], per["demo-bench-slot-shift"]
        _, lo, hi = metrics.tau_difference(a.to_numpy(), b.loc[a.index].to_numpy())
        assert lo > 0 and np.isfinite(hi), (better, lo, hi)
    told = story(DataRoot(tmp_path))
    assert told is not None and told.trained_on == ["S_0", "S_3", "S_5"] and told.broken < told.matched
    from dashboard import demo_story

    lines = demo_story.lines(told)
    assert len(lines) == 3
    assert "/compare?runs=demo-bench-matched,demo-bench-slot-shift" in lines[0]
    assert "/drafter?run=demo-check-slot-shift" in lines[2] and "S_0, S_3, S_5" in lines[2]
    # Compare explains the shifted run from the stored check; the Runs page (the first screen) shows the three lines
    from streamlit.testing.v1 import AppTest

    from dashboard.compare_words import compare

    why = " ".join(compare(["demo-bench-matched", "demo-bench-slot-shift"], data=DataRoot(tmp_path)).warnings)
    assert "every slot shifted" in why and "S_0, S_3, S_5" in why and "demo-check-slot-shift" in why, why
    monkeypatch.setenv("SPECLENS_DATA", str(tmp_path))
    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"), default_timeout=120)
    at.switch_page("pages/runs.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    shown = "\n".join(m.value for m in at.markdown)
    assert "**The failure.**" in shown and "/drafter?run=demo-check-slot-shift" in shown, shown[:500]


@need_models
def test_a_reconfigured_drafter_keeps_its_checks_finding(tmp_path):
    """Issue 20 item 2 with the demo's own builders on a small root: the slot-shift drafter's check finds it trained
    on S_0, S_3, S_5; its patch and its written fix (other ids in config.json, the weights linked) are other files
    with the same weights (model_id.weights_fingerprint), so their benches carry that check's finding through the
    catalog as `runs` reads it: the fix as vLLM 0.24.0 reads it (fed S_2, S_4, S_5) an error graded by the check's
    predicted tau, the patch (fed S_0, S_4, S_6) a wrong feed; the fix as SGLang feeds it none."""
    import dataclasses

    from backend import findings
    from backend.bench import BenchSettings, run_bench
    from backend.check_drafter import CheckSettings, run_check
    from backend.demo import SLOT_CHECK_RUN, SLOT_ENGINE, heldout_prompts, slot_shift_models, toy_pair
    from backend.drafter.fix import plan_fix, write_fix
    from backend.model_id import identity

    data = DataRoot(tmp_path / "data")
    pair, slot = toy_pair(data), slot_shift_models(data)
    r = run_check(CheckSettings(drafter=str(slot / "drafter-slot-shift"), target=str(pair / "target"),
                                engine=SLOT_ENGINE[0], engine_version=SLOT_ENGINE[1], device="cpu", num_prompts=4,
                                new_tokens=24, training_data=str(slot / "training-data"),
                                training_format="speculators-legacy"), name=SLOT_CHECK_RUN, data=data, progress=False)
    fixed = slot / "drafter-slot-shift-fixed"
    write_fix(dataclasses.replace(plan_fix(r.report), drafter=str(slot / "drafter-slot-shift"),
                                  target=str(pair / "target")), fixed)
    ids = {d: identity(slot / d) for d in ("drafter-slot-shift", "drafter-slot-shift-patched", fixed.name)}
    assert len({i["fingerprint"] for i in ids.values()}) == 3
    assert len({i["weights_fingerprint"] for i in ids.values()}) == 1
    common = dict(target=str(pair / "target"), prompts=str(heldout_prompts(pair)), num_spec_tokens=4, limit=2,
                  max_new_tokens=8, repeats=1, device="cpu")
    for run_id, drafter, engine in (("patched", slot / "drafter-slot-shift-patched", SLOT_ENGINE),
                                    ("fixed-vllm", fixed, ("vllm", "0.24.0")), ("fixed", fixed, SLOT_ENGINE)):
        run_bench(BenchSettings(drafter=str(drafter), producer=engine[0], producer_version=engine[1], **common),
                  name=run_id, data=data, progress=False)
    data.catalog.write.refresh()
    cat = data.catalog.read
    bench = ["patched", "fixed-vllm", "fixed"]
    found = findings.findings(cat.run_manifest_keys(bench, findings.MANIFEST_KEYS, findings.NEEDS),
                              cat.check_manifests(), cat)
    wrong = {run: [f for f in fs if f.kind == "mismatch"] for run, fs in found.items()}
    vllm = wrong["fixed-vllm"][0]
    assert vllm.mismatch.fed == ["S_2", "S_4", "S_5"] and vllm.mismatch.trained == ["S_0", "S_3", "S_5"]
    assert vllm.cost is not None and vllm.cost.source == "predicted" and vllm.severity == "error", vllm.short
    patched = wrong["patched"][0].mismatch
    assert patched.fed == ["S_0", "S_4", "S_6"] and patched.trained == ["S_0", "S_3", "S_5"]
    assert patched.check == SLOT_CHECK_RUN
    assert not wrong.get("fixed")
