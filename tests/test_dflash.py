"""DFlash drafters (issue 23 items 3-4): the block draft step, the finder on DFlash's forward, check-drafter's
verdict and fix, and the HF bench's block drafting (lossless, acceptance by position).

The bar's drafter is tests/data/dflash_toy/ (tools/dflash_toy.py --convention before, its TRAINING.json): its config
writes dflash_config.target_layer_ids [0, 3, 6], which the DFlash trainers (and vLLM 0.24) read as S_1, S_4, S_7, but
it was trained on hidden_states[t], S_0, S_3, S_6, one boundary early.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from backend.drafter.dflash import DFlashConfig, DFlashDrafter, init_random
from backend.store.data_root import DataRoot
from backend.toy.shipped import heldout_prompts, toy_pair

DFLASH_TOY = Path(__file__).parent / "data" / "dflash_toy"


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    return toy_pair(DataRoot(tmp_path_factory.mktemp("toy")))


def _config(**kw) -> DFlashConfig:
    base = dict(hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2, head_dim=8, num_layers=2,
                num_target_layers=4, target_hidden_size=24, target_layer_ids=[0, 2], block_size=4, mask_token_id=0,
                vocab_size=50, rms_norm_eps=1e-6)
    return DFlashConfig(**{**base, **kw})


def test_block_logits_is_the_block_draft_step():
    """Scoring many blocks at once (finder, training) gives what the bench's one-request path drafts."""
    torch.manual_seed(0)
    c = _config()
    d = init_random(DFlashDrafter(c, torch.randn(50, 32), torch.randn(50, 32)), seed=1).eval()
    T = 12
    aux, tokens = torch.randn(T, 2 * 24), torch.randint(1, 50, (T,))
    anchors = torch.tensor([1, 5, 8])
    with torch.no_grad():
        many = d.block_logits(aux, tokens, anchors)                                   # [3, bs-1, V]
    for i, s in enumerate(anchors.tolist()):
        d.reset()
        d.append_context(aux[:s], torch.arange(s))
        one = d.propose_logits(int(tokens[s]), s)
        assert torch.allclose(one, many[i], atol=1e-4), s
    # the context matters: other states give other drafts
    d.reset()
    d.append_context(aux[:5] + 1.0, torch.arange(5))
    assert not torch.allclose(d.propose_logits(int(tokens[5]), 5), many[1], atol=1e-3)


def test_save_load_round_trip_and_bad_inputs(tmp_path):
    c = _config()
    emb, head = torch.randn(50, 32), torch.randn(50, 32)
    d = init_random(DFlashDrafter(c, emb, head))
    d.save(tmp_path / "d", dtype=torch.float32)
    raw = json.loads((tmp_path / "d" / "config.json").read_text())
    assert raw["dflash_config"]["target_layer_ids"] == [0, 2] and raw["architectures"] == ["DFlashDraftModel"]
    back = DFlashDrafter.load(tmp_path / "d", emb, head)
    assert all(torch.equal(a, b) for a, b in zip(d.state_dict().values(), back.state_dict().values()))
    from backend.drafter.model import Eagle3Drafter  # the kind switch: EAGLE-3's loader hands DFlash over
    assert isinstance(Eagle3Drafter.load(tmp_path / "d", emb, head), DFlashDrafter)
    with pytest.raises(Exception, match="use a drafter for this target"):
        DFlashDrafter.load(tmp_path / "d", torch.randn(60, 32), head)
    del raw["dflash_config"]["mask_token_id"]
    (tmp_path / "d" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(Exception, match="mask_token_id"):
        DFlashDrafter.load(tmp_path / "d", emb, head)
    with pytest.raises(Exception, match="drafts at most 3"):
        d.propose(1, 0, 5)


def test_random_dflash_bench_is_lossless_and_check_says_chance(pair, data_root, tmp_path):
    """The HF bench drafts DFlash blocks fed as vLLM 0.24 feeds them (S_{t+1}), stays lossless against greedy and
    stores acceptance by position; check-drafter runs the finder on DFlash's forward and, for random weights, says
    it cannot tell (no mismatch is claimed) and writes no fix."""
    from backend.bench import BenchSettings, run_bench
    from backend.check_drafter import CheckSettings, run_check
    from backend.engines.hf import load

    lm = load(pair / "target", device="cpu", dtype="fp32", tokenizer=False)
    tc = lm.config
    c = DFlashConfig(hidden_size=tc.hidden_size, intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=64,
                     num_layers=1, num_target_layers=tc.num_hidden_layers, target_hidden_size=tc.hidden_size,
                     target_layer_ids=[1, 3, 5], block_size=4, mask_token_id=0, vocab_size=tc.vocab_size)
    d = init_random(DFlashDrafter(c, lm.model.get_input_embeddings().weight,
                                  lm.model.get_output_embeddings().weight), seed=3)
    d.save(tmp_path / "rand", dtype=torch.float32)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        b = run_bench(BenchSettings(target=str(pair / "target"), prompts=str(heldout_prompts(pair)),
                                    drafter=str(tmp_path / "rand"), num_spec_tokens=3, repeats=1, limit=2,
                                    max_new_tokens=24, device="cpu", warmup=0), name="dflash-rand",
                      data=DataRoot(data_root), progress=False)
        r = run_check(CheckSettings(drafter=str(tmp_path / "rand"), target=str(pair / "target"), num_prompts=3,
                                    new_tokens=16, search=False), data=DataRoot(data_root),
                      progress=False)
    finally:
        torch.set_num_threads(threads)
    assert b.lossless is True and b.mismatched_prompts == 0
    m = json.loads((b.path / "manifest.json").read_text())
    assert m["aux"]["boundaries"] == ["S_2", "S_4", "S_6"] and m["drafter"]["proposer"] == "dflash"
    summary = json.loads((b.path / "summary.json").read_text())
    assert len(summary["per_position"]["rates"]) == 3
    rep = r.report
    assert rep["engine_feeds"]["boundaries"] == ["S_2", "S_4", "S_6"]
    assert {tuple(c["boundaries"]) for c in rep["candidates"]} >= {("S_1", "S_3", "S_5"), ("S_2", "S_4", "S_6")}
    assert rep["verdict"].startswith("Inconclusive") and "plan" not in rep["fix"]


@pytest.mark.slow
@pytest.mark.skipif(not (DFLASH_TOY / "model.safetensors").is_file(),
                    reason="no trained DFlash toy drafter: python tools/dflash_toy.py --out tests/data/dflash_toy")
def test_dflash_trained_at_one_convention_fed_another(pair, data_root, tmp_path):
    """The bar of issue 23: a DFlash drafter trained on the toy target at one layer convention and fed another is
    named as such by check-drafter, with the fix, and its bench shows the drop (lossless, acceptance by position)."""
    from backend.bench import BenchSettings, run_bench
    from backend.check_drafter import CheckSettings, run_check
    from backend.drafter.fix import FixPlan, write_fix

    training = json.loads((DFLASH_TOY / "TRAINING.json").read_text())
    ids, trained_on = training["target_layer_ids"], training["trained_on"]
    assert training["convention"] == "before" and trained_on == [f"S_{t}" for t in ids]     # hidden_states[t]
    fed_by_vllm = [f"S_{t + 1}" for t in ids]                                                # vLLM 0.24: t -> S_{t+1}
    assert json.loads((DFLASH_TOY / "config.json").read_text())["dflash_config"]["target_layer_ids"] == ids
    data = DataRoot(data_root)
    drafter = tmp_path / "dflash"
    shutil.copytree(DFLASH_TOY, drafter)
    target = pair / "target"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        r = run_check(CheckSettings(drafter=str(drafter), target=str(target), engine="vllm", num_prompts=8,
                                    new_tokens=40, num_spec_tokens=3, search=False), data=data, progress=False)
        rep = r.report
        assert rep["engine_feeds"]["boundaries"] == fed_by_vllm
        assert rep["best_candidate"]["boundaries"] == trained_on, rep["candidates"][:3]
        assert rep["verdict"].startswith("Mismatch"), rep["verdict"]
        assert ", ".join(trained_on) in rep["verdict"] and "hidden_states[t]" in rep["verdict"]
        assert rep["chance"]["accuracy"] < rep["best_candidate"]["step1_accuracy"]
        fed = next(c for c in rep["candidates"] if c["boundaries"] == fed_by_vllm)
        assert fed["z_vs_best"] >= 3 and fed["tau"] < rep["best_candidate"]["tau"]
        plan = rep["fix"]["plan"]
        assert plan["ids"] == ids and plan["trained_on"] == trained_on
        assert f"Fix: write top-level eagle_aux_hidden_state_layer_ids: {ids}" in rep["verdict"]
        # the check's words for the other engine are the --write-fix planner's: SGLang 0.5.15 cannot feed S_0 to a
        # DFlash drafter (it refuses id -1), so no config fix, never an EAGLE-3 key
        sglang = " ".join(f["text"] for f in rep["findings"] if f["text"].startswith("SGLang 0.5.15 feeds"))
        assert "No fix in the config" in sglang and "eagle_config" not in sglang, sglang
        fixed = write_fix(FixPlan(**plan), tmp_path / "fixed")

        prompts = heldout_prompts(pair)
        common = dict(target=str(target), prompts=str(prompts), num_spec_tokens=3, repeats=1, limit=6,
                      max_new_tokens=40, device="cpu", warmup=0)
        as_is = run_bench(BenchSettings(drafter=str(drafter), **common), name="dflash-as-is", data=data,
                          progress=False)
        fix = run_bench(BenchSettings(drafter=str(fixed), **common), name="dflash-fixed", data=data, progress=False)
    finally:
        torch.set_num_threads(threads)
    for b in (as_is, fix):
        assert b.lossless is True and b.mismatched_prompts == 0
    assert fix.tau > as_is.tau + 0.1, (as_is.tau, fix.tau)
    m_as_is = json.loads((as_is.path / "manifest.json").read_text())
    m_fix = json.loads((fix.path / "manifest.json").read_text())
    assert m_as_is["aux"]["boundaries"] == fed_by_vllm and m_fix["aux"]["boundaries"] == trained_on
    assert m_fix["drafter"]["proposer"] == "dflash"
    per_pos = json.loads((fix.path / "summary.json").read_text())["per_position"]["rates"]
    assert len(per_pos) == 3 and per_pos[0] >= per_pos[1] >= per_pos[2] > 0            # acceptance by position
    drop = json.loads((as_is.path / "summary.json").read_text())["per_position"]["rates"]
    assert drop[0] < per_pos[0]


def test_engines_serve_a_dflash_drafter_as_dflash_with_k_its_block(pair, tmp_path, monkeypatch):
    """vLLM gets method "dflash", SGLang `--speculative-algorithm DFLASH` with a K + 1 verify window (no steps or
    topk), EAGLE-3 drafters stay EAGLE-3; a proof queues DFlash benches at K = block size - 1; what each release is
    predicted to feed is the DFlash reading of dflash_config.target_layer_ids (vLLM +1 into its input-of-layer ids,
    SGLang as written, captured after the layer)."""
    from backend.drafter.fix import FixPlan
    from backend.drafter.kinds import block_k, serving_method
    from backend.engines.base import target_info
    from backend.engines.serving import predicted_aux
    from backend.engines.sglang import ServerSpec
    from backend.prove_fix import engine_jobs

    matched = pair / "drafter-matched"
    assert (serving_method(DFLASH_TOY, "vllm"), serving_method(DFLASH_TOY, "sglang")) == ("dflash", "DFLASH")
    assert (serving_method(matched, "vllm"), serving_method(matched, "sglang")) == ("eagle3", "EAGLE3")
    assert serving_method(None, "vllm") is None
    argv = ServerSpec(model="T", drafter=str(DFLASH_TOY), num_spec_tokens=3).argv(30000)
    i = argv.index("--speculative-algorithm")
    assert argv[i + 1] == "DFLASH" and argv[argv.index("--speculative-num-draft-tokens") + 1] == "4"
    assert "--speculative-num-steps" not in argv and "--speculative-eagle-topk" not in argv
    eagle = ServerSpec(model="T", drafter=str(matched), num_spec_tokens=3).argv(30000)
    assert eagle[eagle.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert block_k(DFLASH_TOY) == 3 and block_k(matched) is None
    info = target_info(str(pair / "target"))
    v = predicted_aux(str(DFLASH_TOY), info, "vllm", None, {}, "0.24.0")
    s = predicted_aux(str(DFLASH_TOY), info, "sglang", None, {}, "0.5.15")
    assert v["aux"]["boundaries"] == s["aux"]["boundaries"] == ["S_1", "S_4", "S_7"]
    assert v["aux"]["ids"] == [1, 4, 7] and s["aux"]["ids"] == [0, 3, 6] and v["format"] == "dflash"
    monkeypatch.setenv("SPECLENS_MODEL_ROOTS", f"{pair}:{DFLASH_TOY.parent}")
    plan = FixPlan(drafter=str(DFLASH_TOY), target=str(pair / "target"), engine="vllm", version="0.24.0",
                   runner="v2", where="top-level", ids=[0, 3, 6], trained_on=["S_0", "S_3", "S_6"],
                   fed_before=["S_1", "S_4", "S_7"])
    jobs = engine_jobs(plan, DFLASH_TOY, str(Path("datasets/spec_bench/question.jsonl").resolve()), 4,
                       data=DataRoot(tmp_path / "d"), engine="vllm")
    assert len(jobs) == 2
    assert [j["settings"]["num_spec_tokens"] for j in jobs] == [3, 3], jobs


SPECULATORS_DFLASH = Path(__file__).parent / "data" / "peers" / "speculators-dflash"


def test_the_toy_dflash_drafter_as_speculators_own_converter_wrote_it(pair, data_root, tmp_path):
    """tests/data/peers/speculators-dflash/: tests/data/dflash_toy converted by speculators 0.9.0's own DFlashConverter
    (tools/peer_fixtures/speculators_dflash.py; FIXTURE.json). The converter writes aux id t + 1 for z-lab's id t, and
    SpecLens's trainer rows read both as the same states; vLLM 0.24 feeds both S_1, S_4, S_7; SpecLens loads the
    speculators-written weights and layout and drafts exactly as with the source; and the fix for the drafter's real
    training (S_0, S_3, S_6) goes into speculators' own key, which vLLM's speculators reader copies over its own."""
    from backend.bench import BenchSettings, run_bench
    from backend.drafter import kinds as K
    from backend.drafter import lint as L
    from backend.drafter.fix import SPECULATORS_WHERE, FixPlan, plan_for, write_fix
    from backend.drafter.lint import load_config, target_info

    fx = json.loads((SPECULATORS_DFLASH / "FIXTURE.json").read_text())
    assert fx["written_by"]["tool"] == "speculators" and fx["written_by"]["version"] == "0.9.0"
    src = json.loads((DFLASH_TOY / "config.json").read_text())
    conv = json.loads((SPECULATORS_DFLASH / "config.json").read_text())
    assert conv["speculators_model_type"] == "dflash" and "dflash_config" not in conv
    assert conv["aux_hidden_state_layer_ids"] == [t + 1 for t in src["dflash_config"]["target_layer_ids"]]
    truth = fx["truth"]["converted_reads_as"]
    assert K.trained_boundaries(conv, "dflash") == K.trained_boundaries(src, "dflash") == truth == ["S_1", "S_4", "S_7"]
    target = pair / "target"
    tcfg = target_info(target)
    for d in (DFLASH_TOY, SPECULATORS_DFLASH):
        got = L.picked(L.engine_readings(load_config(str(d)), tcfg, {"vllm": "0.24.0"}), "vllm")
        assert got.boundaries == truth, (d.name, got.error)
    # the key named is the one in the user's file, not the one vLLM's converter renames it to
    assert got.ids_from.startswith("aux_hidden_state_layer_ids (speculators format"), got.ids_from

    emb, head = torch.randn(4096, 256), torch.randn(4096, 256)
    a, b = DFlashDrafter.load(DFLASH_TOY, emb, head), DFlashDrafter.load(SPECULATORS_DFLASH, emb, head)
    assert a.cfg.target_layer_ids == b.cfg.target_layer_ids == src["dflash_config"]["target_layer_ids"]
    assert (a.cfg.block_size, a.cfg.mask_token_id) == (b.cfg.block_size, b.cfg.mask_token_id)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)

    data = DataRoot(data_root)
    common = dict(target=str(target), prompts=str(heldout_prompts(pair)), num_spec_tokens=3, repeats=1, limit=2,
                  max_new_tokens=24, device="cpu", warmup=0)
    runs = [run_bench(BenchSettings(drafter=str(d), **common), name=f"df-{i}", data=data, progress=False)
            for i, d in enumerate((DFLASH_TOY, SPECULATORS_DFLASH))]
    assert all(r.lossless for r in runs) and runs[0].tau == runs[1].tau
    m = [json.loads((r.path / "manifest.json").read_text()) for r in runs]
    assert m[0]["aux"]["boundaries"] == m[1]["aux"]["boundaries"] == truth

    trained = json.loads((DFLASH_TOY / "TRAINING.json").read_text())["trained_on"]
    cfg = load_config(str(SPECULATORS_DFLASH))
    plan = plan_for(cfg, tcfg, trained, "vllm", "0.24.0", None)
    assert plan.where == SPECULATORS_WHERE and plan.ids == [0, 3, 6] and plan.fed_before == truth
    out = write_fix(FixPlan(**{**plan.__dict__}), tmp_path / "fixed")
    fixed = json.loads((out / "config.json").read_text())
    assert fixed == {**conv, "aux_hidden_state_layer_ids": [0, 3, 6]}
    got = L.picked(L.engine_readings(load_config(str(out)), tcfg, {"vllm": "0.24.0"}), "vllm")
    assert got.boundaries == trained
