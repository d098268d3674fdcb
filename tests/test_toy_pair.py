"""The toy pair pipeline at a tiny step count: files load, seeds repeat, held-out rows stay out,
the after-layer drafter says (and was trained on) what it should, and TTT matches inference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from backend.drafter import DrafterConfig, Eagle3Drafter, init_random, load_config
from backend.drafter.unroll import ttt_forward
from backend.toy import corpus as C
from backend.toy import train_drafter as td
from backend.toy.pair import build_toy_pair, tiny_config
from backend.toy.train_target import train_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("toy") / "toy-pair"
    rec = build_toy_pair(out, device="cpu", seed=0, config=tiny_config(), progress=False)
    return out, rec


def test_files_exist_and_load(pair):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, rec = pair
    for f in ("target/config.json", "target/model.safetensors", "target/tokenizer.json", "TRAINING.json",
              "drafter-matched/config.json", "drafter-matched/model.safetensors",
              "drafter-after-layer/config.json", "drafter-after-layer/model.safetensors"):
        assert (out / f).is_file(), f
    target = AutoModelForCausalLM.from_pretrained(str(out / "target"), dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(out / "target"))
    assert target.config.num_hidden_layers == 8 and target.config.vocab_size == len(tok)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                   tokenize=False) == C.chat_text("hi")
    for name in ("drafter-matched", "drafter-after-layer"):
        d = Eagle3Drafter.load(out / name)
        d.check_target(target.config)
        assert d.cfg.source_format == "eagle" and d.cfg.num_aux == 3
        assert d.embed_tokens is not None and torch.equal(d.embed_tokens.weight,
                                                          target.get_input_embeddings().weight.to(torch.bfloat16).float())
    saved = json.loads((out / "TRAINING.json").read_text())
    assert saved["seed"] == 0 and saved["target"]["steps_done"] == tiny_config().target.steps
    for name in ("drafter-matched", "drafter-after-layer"):
        acc = saved["drafters"][name]["heldout_top1_per_step"]["as_trained"]
        assert len(acc) == 4 and all(0.0 <= a <= 1.0 for a in acc)
        tau = saved["drafters"][name]["heldout_tau"]["as_served_vllm"]
        assert 1.0 <= tau["tau"] <= 5.0 and tau["drafts"] > 0


def test_conventions_of_the_two_drafters(pair):
    out, rec = pair
    matched = json.loads((out / "drafter-matched/config.json").read_text())
    after = json.loads((out / "drafter-after-layer/config.json").read_text())
    assert matched["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert "eagle_aux_hidden_state_layer_ids" not in after["eagle_config"]      # speculators <= 0.4 wrote none
    assert "eagle_aux_hidden_state_layer_ids" not in after and "eagle_aux_hidden_state_layer_ids" not in matched
    assert load_config(out / "drafter-after-layer").aux_layer_ids_where == "none"
    m, a = rec["drafters"]["drafter-matched"], rec["drafters"]["drafter-after-layer"]
    assert m["train_boundaries"] == ["S_2", "S_4", "S_5"] and m["ids_written"] == [2, 4, 5]
    assert a["train_boundaries"] == ["S_3", "S_5", "S_6"] and a["ids_written"] is None
    assert a["served_boundaries"]["vllm"] == ["S_2", "S_4", "S_5"]        # what vLLM feeds it: off by one
    assert m["served_boundaries"]["vllm"] == ["S_2", "S_4", "S_5"]
    assert m["served_boundaries"]["sglang"] == ["S_3", "S_5", "S_6"]      # SGLang reads written ids as "after"


def test_training_boundaries_follow_the_conventions():
    assert [b.label for b in td.training_boundaries("before", [2, 4, 5], 8)] == ["S_2", "S_4", "S_5"]
    assert [b.label for b in td.training_boundaries("after", [2, 4, 5], 8)] == ["S_3", "S_5", "S_6"]
    assert td.default_ids(8) == [2, 4, 5] and len(set(td.default_ids(12))) == 3


def test_heldout_rows_never_trained_on(pair):
    out, rec = pair
    held = C.heldout_ids()
    rows = C.spec_bench_rows()
    cats = {r["category"] for r in rows}
    for cat in cats:   # every 4th row of each category, by question_id
        ids = sorted(int(r["question_id"]) for r in rows if r["category"] == cat)
        assert [q for q in ids if q in held] == ids[3::4]
    assert rec["heldout_question_ids"] == held
    train, heldout = C.split_rows()
    assert ({int(r["question_id"]) for r in heldout} == set(held)
            and not {int(r["question_id"]) for r in train} & set(held))
    corpus = C.build_corpus(20_000, ("spec_bench", "pydoc_topics"))
    text = "\n".join(corpus.texts())
    assert not [t for t in C.heldout_texts() if t in text]
    tok_dir = out / "target"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    prompts = td.training_prompts(tok, td.DataConfig(doc_prompts=0, max_prompt_tokens=32))
    assert prompts and not [s for s, _ in prompts if int(s.split(":")[1]) in held]


def test_same_seed_same_losses(pair, tmp_path):
    out, rec = pair
    cfg = tiny_config().target
    again = train_target(cfg, tmp_path / "t", progress=False)
    assert again["losses"] == rec["target"]["losses"]
    other = train_target(cfg.__class__(**{**cfg.__dict__, "seed": 1, "steps": 2}), tmp_path / "t1", progress=False)
    assert other["losses"][0][1] != rec["target"]["losses"][0][1]

    from backend.engines.hf import load

    lm = load(out / "target", device="cpu", dtype="fp32")
    prompts = td.spec_bench_prompts(lm.tokenizer, C.split_rows()[0][:3], 24)
    data = td.build_data(lm, prompts, ["S_2", "S_4", "S_5"], gen_tokens=6)
    dcfg = td.DrafterTrainConfig(steps=2, batch_size=2, warmup=1, log_every=1)
    losses = [td.train_drafter(dcfg, lm.model, data, torch.device("cpu"), progress=False)[1]["log"] for _ in range(2)]
    assert [r["loss"] for r in losses[0]] == [r["loss"] for r in losses[1]]


@pytest.mark.parametrize("flags", [{}, {"norm_output": True, "norm_before_residual": True}])
def test_ttt_forward_is_the_inference_chain(flags):
    """Step j of the unrolled training pass == the drafter's prefill + (j) steps with the same tokens."""
    cfg = DrafterConfig(hidden_size=32, target_hidden_size=32, num_aux=3, vocab_size=64, draft_vocab_size=64,
                        num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48, **flags)
    d = init_random(Eagle3Drafter(cfg), 0).eval()
    g = torch.Generator().manual_seed(0)
    B, T, K = 2, 9, 4
    aux, tok = torch.randn(B, T, 96, generator=g), torch.randint(64, (B, T), generator=g)
    with torch.no_grad():
        outs = ttt_forward(d, aux, tok, K)
        for b in range(B):
            for t in range(T - K):
                d.reset()
                logits, hid = d.forward(tok[b, 1:t + 2], d.combine(aux[b, :t + 1]), torch.arange(t + 1))
                assert torch.allclose(logits[-1], outs[0][b, t], atol=1e-4)
                for j in range(1, K):
                    logits, hid = d.forward(tok[b, t + 1 + j:t + 2 + j], hid[-1:], torch.tensor([t + j]))
                    assert torch.allclose(logits[-1], outs[j][b, t], atol=1e-4)


def test_simulated_tau_matches_a_naive_replay():
    """simulate_tau (KV rolled back and extended) == re-prefilling the whole context every round, on a
    sequence whose every next token is the drafter's own first-pass guess (so step 1 always accepts)."""
    cfg = DrafterConfig(hidden_size=32, target_hidden_size=32, num_aux=3, vocab_size=16, draft_vocab_size=16,
                        num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48)
    d = init_random(Eagle3Drafter(cfg), 3).eval()
    g = torch.Generator().manual_seed(3)
    T0, P, K = 40, 6, 4
    aux = torch.randn(T0, 96, generator=g)
    toks = torch.randint(16, (T0,), generator=g)
    for t in range(P - 1, T0 - 2):           # x_{t+2} := the drafter's first-pass guess at slot t
        d.reset()
        toks[t + 2] = d.prefill(aux[:t + 1], toks[1:t + 2], torch.arange(t + 1)).token
    for T in range(T0 - 6, T0 + 1):          # every way the text can end within a round
        _replay_matches(d, toks[:T], aux[:T], P, K)


def _replay_matches(d, toks, aux, P, K):
    T = len(toks)
    states = {"S_2": aux[:, :32], "S_4": aux[:, 32:64], "S_5": aux[:, 64:]}
    r = td.simulate_tau(d, [td.Seq(toks, P, states, "x")], ["S_2", "S_4", "S_5"], k=K)
    drafts = accepted = 0
    t = P - 1
    while t + 1 + K <= T - 1:
        d.reset()
        o = d.prefill(aux[:t + 1], toks[1:t + 2], torch.arange(t + 1))
        chain = [o.token]
        for i in range(1, K):
            o = d.step(o.token, o.hidden, t + i)
            chain.append(o.token)
        n = 0
        while n < K and chain[n] == int(toks[t + 2 + n]):
            n += 1
        drafts, accepted, t = drafts + 1, accepted + n, t + 1 + n
    assert (r["drafts"], r["accepted"]) == (drafts, accepted)
    assert r["per_position"][0] == 1.0 and r["tau"] >= 2.0
    assert all(a >= b for a, b in zip(r["per_position"], r["per_position"][1:]))


def test_simulated_tau_when_every_draft_is_accepted():
    """An all-zero drafter always guesses token 0: on a text of zeros tau = K+1, whatever the length."""
    cfg = DrafterConfig(hidden_size=16, target_hidden_size=16, num_aux=3, vocab_size=8, draft_vocab_size=8,
                        num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=16)
    d = Eagle3Drafter(cfg).eval()
    with torch.no_grad():
        for p in d.parameters():
            p.zero_()
    for T in range(12, 20):
        states = {lbl: torch.randn(T, 16) for lbl in ("S_2", "S_4", "S_5")}
        r = td.simulate_tau(d, [td.Seq(torch.zeros(T, dtype=torch.long), 3, states, "z")], ["S_2", "S_4", "S_5"], k=4)
        assert r["tau"] == 5.0 and r["per_position"] == [1.0] * 4 and r["drafts"] == (T - 3) // 5


def test_length_batches_cover_every_sequence_once_within_limits():
    import random

    lengths = [random.Random(i).randint(5, 300) for i in range(200)]
    batches = td.length_batches(lengths, max_seqs=16, max_tokens=2048, rng=random.Random(0))
    assert sorted(i for b in batches for i in b) == list(range(200))
    assert all(len(b) <= 16 and (len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 2048) for b in batches)


def test_chat_answers_quote_the_prompt_and_end_in_eos():
    assert C.quote_answer("Summarize: The cat sat. It was warm.") == "The cat sat. It was warm."
    assert C.quote_answer("Translate German to English: Guten Tag , Welt") == "Guten Tag , Welt"
    long = " ".join(f"w{i}." if i % 10 == 9 else f"w{i}" for i in range(300))
    q = C.quote_answer(long, max_words=55)
    assert long.startswith(q) and q.endswith("w49.")              # cut at the last sentence end
    corpus = C.build_corpus(5_000, ("spec_bench", "pydoc_topics"), echo=3)
    chat = [d for d in corpus.docs if d.chat]
    assert chat and corpus.docs[: len(chat)] == chat               # chat documents first, then plain text
    assert {d.source for d in chat} == {"spec_bench", "echo"} and all(d.text.endswith("<|end|>\n<|eos|>") for d in chat)


def test_stdlib_source_is_opt_in_chunked_code():
    from backend.toy.corpus import EXTRA_SOURCES, SOURCES, build_corpus, stdlib_source_docs

    assert "stdlib_source" in EXTRA_SOURCES and "stdlib_source" not in SOURCES
    docs = stdlib_source_docs(max_chars=50_000)
    assert docs and all(d.source == "stdlib_source" for d in docs)
    assert sum(len(d.text) for d in docs) >= 50_000 and any("def " in d.text for d in docs)
    assert all(len(d.text) >= 200 for d in docs)
    c = build_corpus(20_000, ("spec_bench", "stdlib_source"), echo=5)
    assert c.chars.get("stdlib_source", 0) > 0 and sum(d.source == "echo" for d in c.docs) == 5
    with pytest.raises(ValueError, match="unknown corpus sources"):
        build_corpus(1000, ("no_such_source",))
