"""The EAGLE-3 drafter: every config flag pinned, in every format, under both engines' semantics.

Each flag test compares two loads of the same weights that differ only in that flag, so a loader
or model that ignored the flag would fail it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from backend.drafter import DrafterConfig, Eagle3Drafter, init_random, load_config
from backend.errors import SpecLensError

T = 6  # context slots


def tiny_cfg(**kw) -> DrafterConfig:
    base = dict(hidden_size=32, target_hidden_size=32, num_aux=3, vocab_size=64, draft_vocab_size=40, num_heads=4,
                num_kv_heads=2, head_dim=8, intermediate_size=48, aux_layer_ids_nested=[1, 3, 5])
    return DrafterConfig(**{**base, **kw})


def build(tmp_path: Path, fmt: str = "eagle", seed: int = 0, **kw) -> tuple[Eagle3Drafter, Path]:
    m = init_random(Eagle3Drafter(tiny_cfg(**kw)), seed)
    m.d2t.copy_(torch.tensor([i if i < 20 else 23 for i in range(m.cfg.draft_vocab_size)]))  # ids 0..38 even, 43..62
    return m, m.save(tmp_path / f"{fmt}-{seed}", fmt)


def inputs(cfg: DrafterConfig, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, cfg.fc_in, generator=g), torch.randint(cfg.vocab_size, (T,), generator=g), torch.arange(T))


def run(m: Eagle3Drafter) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prefill then one step: (prefill logits, prefill hidden, step logits)."""
    m.reset()
    out = m.prefill(*inputs(m.cfg))
    return out.logits, out.hidden, m.step(out.token, out.hidden, T).logits


def edit(path: Path, fn) -> Path:
    raw = json.loads((path / "config.json").read_text())
    fn(raw)
    (path / "config.json").write_text(json.dumps(raw))
    return path


def edit_weights(path: Path, fn) -> Path:
    sd = load_file(str(path / "model.safetensors"))
    fn(sd)
    save_file(sd, str(path / "model.safetensors"))
    return path


def same(a, b) -> bool:
    return all(torch.allclose(x, y, atol=1e-5) for x, y in zip(a, b))


# ---- formats ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,prefix", [("eagle", "midlayer."), ("speculators", "layers.0."), ("vllm", "layers.0.")])
def test_roundtrip_each_format(tmp_path, fmt, prefix):
    m, path = build(tmp_path, fmt, norm_before_fc=True, fc_norm=True, norm_output=True, norm_before_residual=True)
    keys = load_file(str(path / "model.safetensors")).keys()
    assert any(k.startswith(prefix + "self_attn.q_proj") for k in keys) and "d2t" in keys and "t2d" in keys
    raw = json.loads((path / "config.json").read_text())
    if fmt == "speculators":
        assert raw["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5] and "speculators_config" in raw
    else:
        assert raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]
        assert "eagle_aux_hidden_state_layer_ids" not in raw  # vLLM would read top-level ids with other meaning
    r = Eagle3Drafter.load(path)
    c = r.cfg
    assert (c.source_format, c.norm_before_fc, c.fc_norm, c.norm_output, c.norm_before_residual) == (
        fmt, True, True, True, True)
    assert c.aux_layer_ids_where == ("top-level" if fmt == "speculators" else "eagle_config")
    assert same(run(m), run(r))


def test_aux_ids_recorded_as_written(tmp_path):
    _, path = build(tmp_path)
    edit(path, lambda raw: raw.update(eagle_aux_hidden_state_layer_ids=[2, 4, 6]))
    c = load_config(path)
    assert (c.aux_layer_ids_top, c.aux_layer_ids_nested, c.aux_layer_ids_where) == ([2, 4, 6], [1, 3, 5], "both")


def test_sglang_loads_only_eagle_format(tmp_path):
    _, path = build(tmp_path, "speculators")
    with pytest.raises(SpecLensError, match="only the EAGLE/SpecForge format"):
        Eagle3Drafter.load(path, engine="sglang")


# ---- flags -----------------------------------------------------------------------------------------

def flip(path: Path, key: str, value, engine: str = "vllm", **kw):
    on = run(Eagle3Drafter.load(edit(path, lambda raw: raw.update({key: value})), engine=engine, **kw))
    off = run(Eagle3Drafter.load(edit(path, lambda raw: raw.update({key: not value})), engine=engine, **kw))
    return on, off


def test_norm_before_fc_honoured_by_vllm_ignored_by_sglang(tmp_path):
    _, path = build(tmp_path, norm_before_fc=True)
    on, off = flip(path, "norm_before_fc", True)
    assert not same(on, off)
    assert same(*flip(path, "norm_before_fc", True, engine="sglang"))
    # vLLM reads eagle_config.norm_before_fc before the top level
    edit(path, lambda raw: raw.update(norm_before_fc=False,
                                      eagle_config={**raw["eagle_config"], "norm_before_fc": True}))
    c = load_config(path)
    assert (c.norm_before_fc, c.norm_before_fc_source) == (True, "eagle_config")
    assert same(run(Eagle3Drafter.load(path)), on)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_fc_norm_per_aux_chunk(tmp_path, engine):
    m, path = build(tmp_path, fc_norm=True)
    r = Eagle3Drafter.load(path, engine=engine)
    assert same(run(m), run(r))
    with torch.no_grad():
        r.fc_norm[1].weight.fill_(1.0)  # the flag's weights are live
    assert not same(run(m), run(r))


def test_norm_before_residual_honoured_by_vllm_ignored_by_sglang(tmp_path):
    _, path = build(tmp_path)
    assert not same(*flip(path, "norm_before_residual", True))
    assert same(*flip(path, "norm_before_residual", True, engine="sglang"))


def test_speculators_defaults_norm_before_residual_true(tmp_path):
    _, path = build(tmp_path, "speculators", norm_before_residual=True)
    explicit = run(Eagle3Drafter.load(path))
    edit(path, lambda raw: raw.pop("norm_before_residual"))
    c = load_config(path)
    assert c.norm_before_residual and c.norm_before_residual_defaulted
    assert same(run(Eagle3Drafter.load(path)), explicit)
    _, eagle = build(tmp_path, "eagle", norm_before_residual=True)
    edit(eagle, lambda raw: raw.pop("norm_before_residual"))
    assert not load_config(eagle).norm_before_residual  # absent means False in the EAGLE format


def test_norm_output_next_step_meaning(tmp_path):
    _, path = build(tmp_path)
    on, off = flip(path, "norm_output", True)
    assert torch.allclose(on[0], off[0])            # logits of the first pass: always from the normed state
    m = Eagle3Drafter.load(path)
    assert torch.allclose(on[1], m.norm(off[1]), atol=1e-5)  # the next step gets norm(pre) instead of pre
    assert not torch.allclose(on[2], off[2])        # so step-2 logits differ


def test_norm_output_lm_head_meaning(tmp_path):
    _, path = build(tmp_path)
    on, off = flip(path, "norm_output", True, norm_output_meaning="lm_head")
    assert not torch.allclose(on[0], off[0])        # the flag gates the final norm before lm_head
    assert torch.allclose(on[1], off[1])            # next step always gets the pre-norm state
    assert torch.allclose(on[0], run(Eagle3Drafter.load(path))[0], atol=1e-5)  # norm_output on == next_step logits


def test_d2t_offsets_map_ids_as_written(tmp_path):
    m, path = build(tmp_path)
    r = Eagle3Drafter.load(path)
    ids = torch.arange(40)
    want = torch.tensor([2 * i if i < 20 else i + 23 for i in range(40)])
    assert torch.equal(r.draft_to_target(ids), want)
    out = r.prefill(*inputs(r.cfg))
    assert out.token == int(want[out.logits.argmax()])
    full = r.target_logits(out.logits)
    assert torch.equal(torch.isfinite(full).nonzero().flatten(), want.sort().values)
    assert torch.equal(load_file(str(path / "model.safetensors"))["t2d"].nonzero().flatten(), want.sort().values)


def test_missing_d2t_with_small_draft_vocab_is_an_error(tmp_path):
    _, path = build(tmp_path)
    edit_weights(path, lambda sd: sd.pop("d2t"))
    with pytest.raises(SpecLensError) as e:
        Eagle3Drafter.load(path)
    assert "\n" not in str(e.value) and "model.safetensors" in str(e.value) and "d2t" in str(e.value)


def test_embeddings_sglang_substitutes_target_vllm_keeps_own(tmp_path):
    _, path = build(tmp_path)
    target_embed = torch.randn(64, 32, generator=torch.Generator().manual_seed(7))
    own = run(Eagle3Drafter.load(path))
    assert same(run(Eagle3Drafter.load(path, target_embed=target_embed)), own)  # vLLM: own embed_tokens wins
    sg = Eagle3Drafter.load(path, engine="sglang", target_embed=target_embed)
    assert sg.embed_source == "target" and not same(run(sg), own)
    ref = Eagle3Drafter.load(path)
    ref.embed_tokens.weight.data.copy_(target_embed)
    assert same(run(sg), run(ref))
    edit_weights(path, lambda sd: sd.pop("embed_tokens.weight"))  # no own embedding: vLLM takes the target's too
    assert same(run(Eagle3Drafter.load(path, target_embed=target_embed)), run(ref))


def test_tie_word_embeddings_sglang_only(tmp_path):
    _, path = build(tmp_path, draft_vocab_size=64, tie_word_embeddings=True)
    target_embed = torch.randn(64, 32)
    sg = Eagle3Drafter.load(path, engine="sglang", target_embed=target_embed)
    assert sg.lm_head.weight is sg.embed_tokens.weight and torch.equal(sg.lm_head.weight, target_embed)
    v = Eagle3Drafter.load(path, target_embed=target_embed)
    assert not torch.equal(v.lm_head.weight, v.embed_tokens.weight)


def test_four_aux_states(tmp_path):
    m, spec = build(tmp_path, "speculators", num_aux=4, aux_layer_ids_nested=[1, 2, 3, 4])
    assert load_config(spec).num_aux_source == "num_aux_hidden_states" and same(run(m), run(Eagle3Drafter.load(spec)))
    m, path = build(tmp_path, num_aux=4, aux_layer_ids_nested=[1, 2, 3, 4])
    assert json.loads((path / "config.json").read_text())["num_aux_hidden_states"] == 4
    r = Eagle3Drafter.load(path)
    assert r.fc.weight.shape == (32, 128) and same(run(m), run(r))
    edit(path, lambda raw: raw.pop("num_aux_hidden_states"))  # nested ids still say 4
    assert load_config(path).num_aux_source == "eagle_config ids" and same(run(Eagle3Drafter.load(path)), run(m))
    edit(path, lambda raw: raw.pop("eagle_config"))  # nothing says 4: engines assume 3
    with pytest.raises(SpecLensError, match="set num_aux_hidden_states: 4") as e:
        Eagle3Drafter.load(path)
    assert "\n" not in str(e.value)


def test_target_hidden_size_differs(tmp_path):
    m, path = build(tmp_path, target_hidden_size=48)
    r = Eagle3Drafter.load(path)
    assert r.fc.weight.shape == (32, 144) and same(run(m), run(r))
    with pytest.raises(SpecLensError) as e:
        r.check_target({"hidden_size": 32, "vocab_size": 64}, "tiny-target")
    assert str(e.value) == (f"drafter {path} was built for hidden size 48, target tiny-target has 32; "
                            "use a drafter for this target")
    from transformers import LlamaConfig
    r.check_target(LlamaConfig(hidden_size=48, num_attention_heads=4, vocab_size=64))
    with pytest.raises(SpecLensError, match="vocab size 64, target"):
        r.check_target(LlamaConfig(hidden_size=48, num_attention_heads=4, vocab_size=100))


# ---- the computation itself ---------------------------------------------------------------------

@pytest.mark.parametrize("rope", [None, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}])
def test_rope_matches_transformers(rope):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from backend.drafter.model import apply_rope, rope_inv_freq
    cfg = tiny_cfg(rope_scaling=rope)
    hf = LlamaRotaryEmbedding(LlamaConfig(hidden_size=32, num_attention_heads=4, head_dim=8, rope_theta=10000.0,
                                          rope_scaling=rope))
    q, pos = torch.randn(1, 4, 50, 8), torch.arange(0, 500, 10)
    cos, sin = hf(q, pos[None])
    want, _ = apply_rotary_pos_emb(q, q, cos, sin)
    got = apply_rope(q[0].transpose(0, 1), pos, rope_inv_freq(cfg)).transpose(0, 1)
    assert torch.allclose(got, want[0], atol=1e-4)


@pytest.mark.parametrize("nbr", [False, True])
@torch.no_grad()
def test_layer_follows_the_written_step(tmp_path, nbr):
    """cat[embedding FIRST, hidden], residual = normed or raw fc output, norm before lm_head."""
    _, path = build(tmp_path, norm_before_residual=nbr)
    m = Eagle3Drafter.load(path)
    aux, ids, pos = inputs(m.cfg)
    L, a = m.layers[0], m.layers[0].self_attn
    g = m.fc(aux)
    e, h = L.input_layernorm(m.embed_tokens(ids)), L.hidden_norm(g)
    x = torch.cat([e, h], dim=-1)
    q, k, v = (p(x).view(T, -1, 8).transpose(0, 1) for p in (a.q_proj, a.k_proj, a.v_proj))  # [heads, T, 8]
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    cos, sin = LlamaRotaryEmbedding(LlamaConfig(hidden_size=32, num_attention_heads=4, head_dim=8))(q, pos[None])
    q, k = apply_rotary_pos_emb(q[None], k[None], cos, sin)
    k, v = k[0].repeat_interleave(2, 0), v.repeat_interleave(2, 0)
    att = (q[0] @ k.transpose(1, 2) / 8 ** 0.5).masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
    o = a.o_proj((att.softmax(-1) @ v).transpose(0, 1).reshape(T, 32))
    x1 = (h if nbr else g) + o
    pre = x1 + L.mlp(L.post_attention_layernorm(x1))
    logits, hidden = m.forward(ids, g, pos, use_cache=False)
    assert torch.allclose(logits, m.lm_head(m.norm(pre)), atol=1e-5) and torch.allclose(hidden, pre, atol=1e-5)


# ---- KV cache ------------------------------------------------------------------------------------

@torch.no_grad()
def test_prefill_and_steps_equal_full_recomputation(tmp_path):
    _, path = build(tmp_path, norm_before_residual=True, norm_output=True)
    m = Eagle3Drafter.load(path)
    aux, ids, pos = inputs(m.cfg)
    out = m.prefill(aux, ids, pos)
    toks, hid, p = ids, m.combine(aux), pos
    ref_logits, ref_hidden = m.forward(toks, hid, p, use_cache=False)
    assert (torch.allclose(out.logits, ref_logits[-1], atol=1e-5)
            and torch.allclose(out.hidden, ref_hidden[-1], atol=1e-5))
    for i in range(3):  # steps 2..4, each against a no-cache pass over every slot so far
        toks, hid, p = (torch.cat([toks, torch.tensor([out.token])]), torch.cat([hid, out.hidden[None]]),
                        torch.cat([p, torch.tensor([T + i])]))
        out = m.step(out.token, out.hidden, T + i)
        ref_logits, ref_hidden = m.forward(toks, hid, p, use_cache=False)
        assert (torch.allclose(out.logits, ref_logits[-1], atol=1e-5)
                and torch.allclose(out.hidden, ref_hidden[-1], atol=1e-5))
    assert m.cache_len == T + 3


def test_chunked_prefill_equals_one_pass(tmp_path):
    _, path = build(tmp_path)
    m = Eagle3Drafter.load(path)
    aux, ids, pos = inputs(m.cfg)
    whole = m.prefill(aux, ids, pos)
    m.reset()
    m.prefill(aux[:4], ids[:4], pos[:4])
    part = m.prefill(aux[4:], ids[4:], pos[4:])
    assert torch.allclose(whole.logits, part.logits, atol=1e-5)


def test_rollback_then_append_accepted_features(tmp_path):
    _, path = build(tmp_path)
    m, fresh = Eagle3Drafter.load(path), Eagle3Drafter.load(path)
    aux, ids, pos = inputs(m.cfg)
    n = 4
    m.draft(aux[:n], ids[:n], pos[:n], num_tokens=3)     # 3 drafts: KV holds n + 2 slots
    assert m.cache_len == n + 2
    m.truncate(n)                                          # verification rejected the drafts
    out = m.prefill(aux[n:], ids[n:], pos[n:])             # target features of the accepted tokens
    ref = fresh.prefill(aux, ids, pos)
    assert torch.allclose(out.logits, ref.logits, atol=1e-5) and torch.allclose(m.cache.k, fresh.cache.k, atol=1e-6)
    with pytest.raises(SpecLensError):
        m.truncate(100)


# ---- load errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["no_config", "no_arch", "unknown_arch", "missing_key", "extra_key", "bad_shape"])
def test_load_errors_are_one_line_and_name_the_file(tmp_path, case):
    _, path = build(tmp_path)
    if case == "no_config":
        (path / "config.json").unlink()
    elif case == "no_arch":
        edit(path, lambda raw: raw.pop("architectures"))
    elif case == "unknown_arch":
        edit(path, lambda raw: raw.update(architectures=["MedusaModel"]))
    elif case == "missing_key":
        edit_weights(path, lambda sd: sd.pop("midlayer.mlp.up_proj.weight"))
    elif case == "extra_key":
        edit_weights(path, lambda sd: sd.update({"midlayer.extra.weight": torch.zeros(2)}))
    elif case == "bad_shape":
        edit(path, lambda raw: raw.update(intermediate_size=64))
    with pytest.raises(SpecLensError) as e:
        Eagle3Drafter.load(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg, msg
