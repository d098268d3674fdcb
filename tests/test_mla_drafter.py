"""EAGLE-3 drafters with MLA attention (kind eagle3_mla, Eagle3DeepseekV2ForCausalLM; issue 23 item 3): the attention
against a written-out float64 reference, the layout the engines load, the finder / check-drafter and the HF bench
on the committed toy drafter.

The committed drafter is tests/data/mla_toy/ (tools/mla_toy.py --convention before, its TRAINING.json): its config
writes the ids [0, 3, 6] nested in eagle_config only, as DeepSeek/Kimi MLA drafter configs do, and it was trained on
S_0, S_3, S_6 (vLLM's V1 reading of those ids). vLLM 0.24's V2 runner, which the toy Llama target gets, ignores
nested ids and feeds the EAGLE-3 default S_2, S_4, S_5; SGLang 0.5.15 feeds S_1, S_4, S_7.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from backend.drafter.config import DrafterConfig
from backend.drafter.mla import MLAAttention
from backend.drafter.model import Eagle3Drafter, KVCache, init_random
from backend.errors import SpecLensError
from backend.store.data_root import DataRoot
from backend.toy.shipped import heldout_prompts, toy_pair

MLA_TOY = Path(__file__).parent / "data" / "mla_toy"
REAL_MLA = Path(__file__).parent / "data" / "real_configs" / "kinds" / "torchspec_kimi-k25-eagle3-mla.json"
TRAINED = MLA_TOY / "model.safetensors"


def _cfg(q_lora_rank: int | None = 16, **kw) -> DrafterConfig:
    base = dict(hidden_size=32, target_hidden_size=24, num_aux=3, vocab_size=50, draft_vocab_size=50, num_heads=4,
                num_kv_heads=4, head_dim=10, intermediate_size=48, kind="eagle3_mla",
                architecture="Eagle3DeepseekV2ForCausalLM", aux_layer_ids_nested=[0, 1, 2], rope_theta=50.0,
                mla=dict(q_lora_rank=q_lora_rank, kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4,
                         v_head_dim=10))
    return DrafterConfig(**{**base, **kw})


def _reference(at: MLAAttention, x: torch.Tensor, pos: list[int]) -> torch.Tensor:
    """MLA written out in float64, one head and one query at a time (causal over slot order)."""
    W = {n: p.detach().double() for n, p in at.named_parameters()}
    x = x.double()
    eps = 1e-5

    def rms(v, w):
        return v / torch.sqrt((v * v).mean(-1, keepdim=True) + eps) * w

    def rot(v, p):                                  # pairs (2i, 2i+1) turned by p * theta^(-2i/d_r)
        out = v.clone()
        for i in range(at.d_r // 2):
            a = p * 50.0 ** (-2 * i / at.d_r)
            c, s = math.cos(a), math.sin(a)
            out[2 * i], out[2 * i + 1] = v[2 * i] * c - v[2 * i + 1] * s, v[2 * i + 1] * c + v[2 * i] * s
        return out

    T, nh, dn, dr, dv, r = x.shape[0], at.nh, at.d_n, at.d_r, at.d_v, at.r_kv
    if at.r_q:
        q = rms(x @ W["q_a_proj.weight"].T, W["q_a_layernorm.weight"]) @ W["q_b_proj.weight"].T
    else:
        q = x @ W["q_proj.weight"].T
    q = q.view(T, nh, dn + dr)
    ckv = x @ W["kv_a_proj_with_mqa.weight"].T
    kv = (rms(ckv[:, :r], W["kv_a_layernorm.weight"]) @ W["kv_b_proj.weight"].T).view(T, nh, dn + dv)
    k_pe = [rot(ckv[t, r:], pos[t]) for t in range(T)]                 # one rope key per slot, shared by the heads
    out = torch.zeros(T, nh, dv, dtype=torch.float64)
    for h in range(nh):
        for t in range(T):
            qt = torch.cat([q[t, h, :dn], rot(q[t, h, dn:], pos[t])])
            scores = torch.stack([qt @ torch.cat([kv[s, h, :dn], k_pe[s]]) for s in range(t + 1)]) / math.sqrt(dn + dr)
            p = torch.softmax(scores, 0)
            out[t, h] = sum(p[s] * kv[s, h, dn:] for s in range(t + 1))
    return out.reshape(T, nh * dv) @ W["o_proj.weight"].T


@pytest.mark.parametrize("q_lora_rank", [16, None])
def test_mla_attention_matches_a_written_out_reference(q_lora_rank, monkeypatch):
    """MLAAttention (low-rank q or one q_proj; interleaved RoPE on the shared rope key) = the float64 reference;
    RoPE in Llama's rotate-half layout would give another result; the KV cache in two chunks = one pass."""
    torch.manual_seed(0)
    c = _cfg(q_lora_rank)
    d = init_random(Eagle3Drafter(c), seed=2)
    at = d.layers[0].self_attn.double()
    T, pos = 6, [3, 4, 5, 9, 10, 11]
    x = torch.randn(T, 2 * c.hidden_size, dtype=torch.float64)
    with torch.no_grad():
        want = _reference(at, x, pos)
        got = at(x, torch.tensor(pos), None)
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()    # RoPE and RMSNorm run in fp32
        cache = KVCache()
        parts = torch.cat([at(x[:2], torch.tensor(pos[:2]), cache), at(x[2:], torch.tensor(pos[2:]), cache)])
        assert torch.allclose(parts, want, atol=1e-5) and len(cache) == T
        from backend.drafter import layers, mla
        monkeypatch.setattr(mla, "apply_rope_interleaved",                      # Llama's halves, not DeepSeek's pairs
                            lambda x, p, f, af=1.0: layers.apply_rope(x, p, f))
        assert (at(x, torch.tensor(pos), None) - want).abs().max() > 1e-2


# DeepSeek YaRN blocks: Kimi K2.5's MLA drafter (torchspec), DeepSeek-V2-Lite's (mscale 0.707), and one whose mscale
# differs from mscale_all_dim, so that the cos/sin attention factor is not 1
KIMI_YARN = json.loads((REAL_MLA).read_text())["rope_scaling"]
V2_LITE_YARN = dict(beta_fast=32.0, beta_slow=1.0, factor=40.0, mscale=0.707, mscale_all_dim=0.707,
                    original_max_position_embeddings=4096, rope_type="yarn")
SKEWED_YARN = dict(beta_fast=32, beta_slow=1, factor=16.0, mscale=1.0, mscale_all_dim=0.5,
                   original_max_position_embeddings=256, type="yarn")


def _yarn_cfg(rs: dict, q_lora_rank: int | None = 16) -> DrafterConfig:
    return _cfg(q_lora_rank, rope_theta=10000.0, rope_scaling=rs, rms_norm_eps=1e-6, max_position_embeddings=8192,
                mla=dict(q_lora_rank=q_lora_rank, kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=16,
                         v_head_dim=10))


def _hf_deepseek_v3(c: DrafterConfig):
    """The same attention as a transformers DeepseekV3Config (its input 2H wide, as the EAGLE-3 layer's)."""
    from transformers import DeepseekV3Config

    m = c.mla
    hf = DeepseekV3Config(hidden_size=2 * c.hidden_size, num_attention_heads=c.num_heads,
                          num_key_value_heads=c.num_heads, q_lora_rank=m["q_lora_rank"],
                          kv_lora_rank=m["kv_lora_rank"], qk_nope_head_dim=m["qk_nope_head_dim"],
                          qk_rope_head_dim=m["qk_rope_head_dim"], v_head_dim=m["v_head_dim"],
                          rope_theta=c.rope_theta, rope_scaling=dict(c.rope_scaling),
                          max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps)
    hf._attn_implementation = "eager"
    return hf


@pytest.mark.parametrize("rs", [KIMI_YARN, V2_LITE_YARN, SKEWED_YARN], ids=["kimi", "v2-lite", "skewed"])
def test_yarn_rope_and_attention_match_transformers_deepseek_v3(rs):
    """DeepSeek YaRN: the inverse frequencies, the attention factor on cos/sin and the softmax scale are
    transformers' DeepseekV3RotaryEmbedding / DeepseekV3Attention ones for the same config, and the whole attention
    (weights copied, positions past original_max_position_embeddings) gives transformers' output."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    from backend.drafter.mla import rope_cos_sin

    c = _yarn_cfg(rs)
    at = init_random(Eagle3Drafter(c), seed=4).layers[0].self_attn.eval()
    hf = _hf_deepseek_v3(c)
    rot = DeepseekV3RotaryEmbedding(hf)
    d_r = at.d_r
    plain = 1.0 / c.rope_theta ** (torch.arange(0, d_r, 2, dtype=torch.float64) / d_r)
    assert not torch.allclose(at.inv_freq.double(), plain, rtol=1e-3)          # the YaRN frequencies are in effect
    assert torch.equal(at.inv_freq, rot.inv_freq)
    assert at.attention_factor == rot.attention_scaling
    if rs is SKEWED_YARN:
        assert abs(at.attention_factor - 1.0) > 0.05
    pos = torch.tensor([0, 1, 7, 255, 256, 4095, 4096, 8000])
    cos, sin = rope_cos_sin(pos, at.inv_freq, at.attention_factor)
    hcos, hsin = rot(torch.zeros(1, len(pos), 1), pos[None])                   # [1, T, d_r] = cat(freqs, freqs)
    assert torch.allclose(cos, hcos[0, :, : d_r // 2], atol=1e-6) and torch.allclose(sin, hsin[0, :, : d_r // 2],
                                                                                      atol=1e-6)
    ta = DeepseekV3Attention(hf, layer_idx=0).eval()
    assert ta.scaling == pytest.approx(at.scale, rel=1e-12) and at.scale > 1.05 * at.hd ** -0.5
    missing = ta.load_state_dict({k: v for k, v in at.state_dict().items() if not k.startswith("o_proj")},
                                 strict=False)
    assert missing.missing_keys == ["o_proj.weight"] and not missing.unexpected_keys
    ta.o_proj = at.o_proj                                                      # the drafter's o_proj goes to H, not 2H
    T = 6
    positions = torch.tensor([4093, 4094, 4095, 4096, 6000, 6001])
    x = torch.randn(T, 2 * c.hidden_size, generator=torch.Generator().manual_seed(5))
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        want = ta(x[None], rot(x[None], positions[None]), mask)[0][0]
        got = at(x, positions, None)
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
        at.attention_factor, at.scale = 1.0, at.hd ** -0.5                     # YaRN's scalings left out: visibly off
        assert (at(x, positions, None) - want).abs().max() > 1e-3


def test_yarn_softmax_scale_is_the_engines():
    """The softmax scale is vLLM's DeepseekV2MLAAttention one written out: qk_head_dim ** -0.5 * mscale ** 2 with
    mscale = 0.1 * mscale_all_dim * ln(factor) + 1; without mscale_all_dim it stays qk_head_dim ** -0.5. The
    cos/sin factor is vLLM's DeepseekScalingRotaryEmbedding.mscale written out: (0.1 * mscale * ln f + 1) /
    (0.1 * mscale_all_dim * ln f + 1)."""
    at = MLAAttention(_yarn_cfg(V2_LITE_YARN))                 # d_qk = 6 + 16 = 22, factor 40, mscale_all_dim 0.707
    assert at.scale == pytest.approx(22 ** -0.5 * (0.1 * 0.707 * math.log(40.0) + 1.0) ** 2, rel=1e-12)
    no_all_dim = {k: v for k, v in V2_LITE_YARN.items() if k not in ("mscale", "mscale_all_dim")}
    assert MLAAttention(_yarn_cfg(no_all_dim)).scale == 22 ** -0.5
    skew = MLAAttention(_yarn_cfg(SKEWED_YARN))
    ln16 = math.log(16.0)
    assert skew.attention_factor == pytest.approx((0.1 * 1.0 * ln16 + 1) / (0.1 * 0.5 * ln16 + 1), rel=1e-12)
    assert skew.scale == pytest.approx(22 ** -0.5 * (0.1 * 0.5 * ln16 + 1) ** 2, rel=1e-12)


@pytest.mark.parametrize("rs, says", [
    (dict(V2_LITE_YARN, rope_type="linear"), "'linear'"),
    (dict(V2_LITE_YARN, mscale_all_dim=0, mscale=0.8), "mscale 0.8 without mscale_all_dim"),
    (dict(V2_LITE_YARN, mscale=0), "mscale_all_dim 0.707 without mscale"),
    (dict(V2_LITE_YARN, attention_factor=1.2), "attention_factor"),
    ({k: v for k, v in V2_LITE_YARN.items() if k != "factor"}, "without factor"),
])
def test_yarn_the_engines_and_transformers_read_differently_is_refused(rs, says):
    with pytest.raises(SpecLensError, match=says):
        MLAAttention(_yarn_cfg(rs))


def _shrunk(raw: dict) -> dict:
    """A real MLA drafter config with its dims scaled down; rope_scaling, qk_rope_head_dim and the ids kept."""
    return dict(raw, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=4,
                q_lora_rank=raw["q_lora_rank"] and raw["q_lora_rank"] // 32, kv_lora_rank=raw["kv_lora_rank"] // 16,
                qk_nope_head_dim=raw["qk_nope_head_dim"] // 8, v_head_dim=raw["v_head_dim"] // 8, vocab_size=512,
                draft_vocab_size=512)


def test_real_kimi_mla_config_builds_and_drafts(tmp_path):
    """torchspec's Kimi K2.5 MLA drafter config (DeepSeek YaRN, factor 64, mscale_all_dim 1): its full-size attention
    gets the engines' softmax scale; shrunk, it builds a drafter that drafts finite logits past the original 4096
    positions, saves and loads back with its rope_scaling, and drafts otherwise than with plain RoPE."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_get_mscale

    from backend.drafter.config import config_from_dict
    from backend.drafter.mla import deepseek_yarn

    raw = json.loads(REAL_MLA.read_text())
    full = config_from_dict(raw, "kimi-k25-mla")
    assert full.kind == "eagle3_mla" and full.rope_scaling["factor"] == 64.0
    inv, af, scale = deepseek_yarn(full, raw["qk_rope_head_dim"], raw["qk_nope_head_dim"] + raw["qk_rope_head_dim"])
    assert inv.shape == (raw["qk_rope_head_dim"] // 2,) and af == 1.0
    assert scale == pytest.approx(192 ** -0.5 * yarn_get_mscale(64.0, 1.0) ** 2) and scale > 2 * 192 ** -0.5

    small = _shrunk(raw)
    c = config_from_dict(small, "kimi-k25-mla-small")
    d = init_random(Eagle3Drafter(c), seed=6).eval()
    at = d.layers[0].self_attn
    assert isinstance(at, MLAAttention) and at.d_r == 64 and at.scale == pytest.approx(
        (16 + 64) ** -0.5 * yarn_get_mscale(64.0, 1.0) ** 2)
    g = torch.Generator().manual_seed(7)
    T = 8
    aux, tok = torch.randn(T, c.fc_in, generator=g), torch.randint(512, (T,), generator=g)
    positions = torch.arange(5000, 5000 + T)
    with torch.no_grad():
        out = d.prefill(aux, tok, positions)
        assert torch.isfinite(out.logits).all() and torch.isfinite(out.hidden).all()
        step = d.step(int(out.logits.argmax(-1).view(-1)[-1]), out.hidden.view(-1, c.hidden_size)[-1], 5000 + T)
        assert torch.isfinite(step.logits).all()
        d.save(tmp_path / "kimi")
        back = Eagle3Drafter.load(tmp_path / "kimi").eval()
        assert back.cfg.rope_scaling == c.rope_scaling
        assert torch.equal(back.layers[0].self_attn.inv_freq, at.inv_freq)
        back.reset()
        assert torch.allclose(back.prefill(aux, tok, positions).logits, out.logits, atol=1e-5)
        plain = init_random(Eagle3Drafter(config_from_dict({**small, "rope_scaling": None}, "plain")), seed=6).eval()
        assert (plain.prefill(aux, tok, positions).logits - out.logits).abs().max() > 1e-3


def test_no_rope_scaling_is_plain_rope_unchanged():
    """Without rope_scaling nothing of YaRN is applied: the plain inverse frequencies (float64, then float32), cos/sin
    unmultiplied, the softmax scale d_qk ** -0.5 exactly (the committed mla_toy drafter's tests check its outputs)."""
    from backend.drafter.mla import rope_cos_sin

    at = MLAAttention(_cfg())
    assert at.attention_factor == 1.0 and at.scale == (6 + 4) ** -0.5
    assert torch.equal(at.inv_freq, (1.0 / 50.0 ** (torch.arange(0, 4, 2, dtype=torch.float64) / 4)).float())
    pos = torch.tensor([0, 3, 100])
    freqs = pos.float()[:, None] * at.inv_freq[None, :]
    cos, sin = rope_cos_sin(pos, at.inv_freq, at.attention_factor)
    assert torch.equal(cos, freqs.cos()) and torch.equal(sin, freqs.sin())


def test_mla_layout_round_trip_and_unrolled_scoring(tmp_path):
    """Saved as the engines load it (midlayer.*, the MLA fields at the top level, ids in eagle_config); SGLang's
    layers.0.* names load too; the finder's unrolled steps (ttt_forward) = prefill + step (the bench's path)."""
    from safetensors.torch import load_file, save_file

    from backend.drafter.unroll import ttt_forward

    d = init_random(Eagle3Drafter(_cfg(16)), seed=1).eval()
    d.save(tmp_path / "d")
    raw = json.loads((tmp_path / "d" / "config.json").read_text())
    assert raw["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and raw["model_type"] == "deepseek_v3"
    assert (raw["q_lora_rank"], raw["kv_lora_rank"], raw["qk_nope_head_dim"], raw["qk_rope_head_dim"],
            raw["v_head_dim"]) == (16, 12, 6, 4, 10)
    assert raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    sd = load_file(str(tmp_path / "d" / "model.safetensors"))
    for k in ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"):
        assert f"midlayer.self_attn.{k}.weight" in sd
    assert list(sd["midlayer.self_attn.kv_a_proj_with_mqa.weight"].shape) == [12 + 4, 2 * 32]
    back = Eagle3Drafter.load(tmp_path / "d").eval()
    assert back.cfg.kind == "eagle3_mla" and isinstance(back.layers[0].self_attn, MLAAttention)
    assert all(torch.equal(a, b) for a, b in zip(d.state_dict().values(), back.state_dict().values()))
    sglang_names = {k.replace("midlayer.", "layers.0."): v for k, v in sd.items()}
    save_file(sglang_names, str(tmp_path / "d" / "model.safetensors"))
    assert torch.equal(Eagle3Drafter.load(tmp_path / "d").layers[0].self_attn.kv_b_proj.weight,
                       d.layers[0].self_attn.kv_b_proj.weight)
    del raw["kv_lora_rank"]
    (tmp_path / "d" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(Exception, match="kv_lora_rank"):
        Eagle3Drafter.load(tmp_path / "d")

    g = torch.Generator().manual_seed(0)
    T, K = 10, 3
    aux, tok = torch.randn(T, d.cfg.fc_in, generator=g), torch.randint(50, (T,), generator=g)
    with torch.no_grad():
        out = ttt_forward(d, aux[None], tok[None], K)
        for t in (0, 3, 6):
            d.reset()
            o = d.prefill(aux[: t + 1], tok[1: t + 2], torch.arange(t + 1))
            assert torch.allclose(o.logits, out[0][0, t], atol=1e-4)
            for j in range(1, K):
                o = d.step(int(tok[t + 1 + j]), o.hidden, t + j)
                assert torch.allclose(o.logits, out[j][0, t], atol=1e-4), (t, j)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    return toy_pair(DataRoot(tmp_path_factory.mktemp("toy")))


def _one_thread():
    class _T:
        def __enter__(self):
            self.n = torch.get_num_threads()
            torch.set_num_threads(1)

        def __exit__(self, *a):
            torch.set_num_threads(self.n)
    return _T()


def test_random_mla_drafter_check_is_inconclusive(pair, data_root, tmp_path):
    """A random-init MLA drafter on the toy target: check-drafter loads it, runs the finder and says it cannot tell."""
    from backend.check_drafter import CheckSettings, run_check

    c = _cfg(None, hidden_size=256, target_hidden_size=256, vocab_size=4096, draft_vocab_size=4096,
             intermediate_size=64, aux_layer_ids_nested=[0, 3, 6], rope_theta=10000.0,
             mla=dict(q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16))
    init_random(Eagle3Drafter(c), seed=3).save(tmp_path / "rand")
    with _one_thread():
        r = run_check(CheckSettings(drafter=str(tmp_path / "rand"), target=str(pair / "target"), num_prompts=3,
                                    new_tokens=16, search=False), data=DataRoot(data_root), progress=False)
    rep = r.report
    assert rep["drafter_info"]["architecture"] == "Eagle3DeepseekV2ForCausalLM"
    assert len(rep["candidates"]) >= 5 and rep["verdict"].startswith("Inconclusive"), rep["verdict"]


def _training() -> dict:
    return json.loads((MLA_TOY / "TRAINING.json").read_text())


@pytest.mark.skipif(not TRAINED.is_file(), reason="no trained MLA toy drafter: python tools/mla_toy.py --out "
                                                  "tests/data/mla_toy")
def test_committed_mla_drafter_loads_and_is_small(pair):
    """The committed drafter: under 2 MB, the engines' config, loaded as an MLA drafter with the target's embedding;
    its TRAINING.json says it drafts well above chance fed as trained and clearly lower fed the other reading."""
    from backend.engines.hf import load

    raw = json.loads((MLA_TOY / "config.json").read_text())
    assert raw["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and raw["q_lora_rank"]
    assert "eagle_aux_hidden_state_layer_ids" not in raw and raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert sum(f.stat().st_size for f in MLA_TOY.iterdir()) < 2_000_000
    lm = load(pair / "target", device="cpu", dtype="fp32", tokenizer=False)
    d = Eagle3Drafter.load(MLA_TOY, target_embed=lm.model.get_input_embeddings().weight)
    assert isinstance(d.layers[0].self_attn, MLAAttention) and d.embed_source == "target"
    assert d.cfg.draft_vocab_size < d.cfg.vocab_size and int(d.d2t.abs().sum()) > 0
    d.check_target(lm.config)
    h = _training()["heldout"]
    chance = h["position_1_baselines"]["chance"]
    right, wrong = h["trained_feed"], h["other_convention"]
    assert right["accuracy"][0] > 2 * chance and right["accuracy"][0] > wrong["accuracy"][0] + 0.1
    assert right["tau"]["tau"] > wrong["tau"]["tau"]


@pytest.mark.skipif(not TRAINED.is_file(), reason="no trained MLA toy drafter")
def test_check_names_the_trained_boundaries_and_the_mismatch(pair, data_root, tmp_path):
    """check-drafter on the MLA drafter: the finder names S_0, S_3, S_6 (what it was trained on); vLLM 0.24's V2
    runner feeds S_2, S_4, S_5 (nested ids ignored): a mismatch, with the fix; SGLang 0.5.15 feeds S_1, S_4, S_7."""
    from backend.check_drafter import CheckSettings, run_check

    trained = _training()["trained_on"]
    drafter = tmp_path / "mla"
    shutil.copytree(MLA_TOY, drafter)
    common = dict(drafter=str(drafter), target=str(pair / "target"), num_prompts=6, new_tokens=32, num_spec_tokens=3,
                  search=False)
    with _one_thread():
        r = run_check(CheckSettings(engine="vllm", **common), data=DataRoot(data_root), progress=False)
    rep = r.report
    assert rep["best_candidate"]["boundaries"] == trained, rep["candidates"][:3]
    assert rep["engine_feeds"]["boundaries"] == ["S_2", "S_4", "S_5"]
    assert rep["verdict"].startswith("Mismatch") and ", ".join(trained) in rep["verdict"], rep["verdict"]
    assert "eagle_aux_hidden_state_layer_ids: [0, 3, 6]" in rep["verdict"]
    assert rep["chance"]["accuracy"] < rep["best_candidate"]["step1_accuracy"]
    sg = next(c for c in rep["candidates"] if c["boundaries"] == ["S_1", "S_4", "S_7"])
    assert sg["z_vs_best"] >= 3 and sg["tau"] < rep["best_candidate"]["tau"]


@pytest.mark.skipif(not TRAINED.is_file(), reason="no trained MLA toy drafter")
def test_bench_is_lossless_and_drops_when_fed_wrong(pair, data_root):
    """The HF bench drafts with the MLA drafter, lossless against greedy; fed as trained (vLLM's V1 runner reads the
    nested ids: S_0, S_3, S_6) its tau is above that fed as vLLM's V2 runner feeds it (S_2, S_4, S_5)."""
    from backend.bench import BenchSettings, run_bench

    common = dict(target=str(pair / "target"), prompts=str(heldout_prompts(pair)), drafter=str(MLA_TOY),
                  num_spec_tokens=3, repeats=1, limit=4, max_new_tokens=32, device="cpu", warmup=0)
    data = DataRoot(data_root)
    with _one_thread():
        right = run_bench(BenchSettings(runner="v1", **common), name="mla-v1", data=data, progress=False)
        wrong = run_bench(BenchSettings(runner="v2", **common), name="mla-v2", data=data, progress=False)
    for b in (right, wrong):
        assert b.lossless is True and b.mismatched_prompts == 0
    m_right = json.loads((right.path / "manifest.json").read_text())
    m_wrong = json.loads((wrong.path / "manifest.json").read_text())
    assert m_right["aux"]["boundaries"] == _training()["trained_on"]
    assert m_wrong["aux"]["boundaries"] == ["S_2", "S_4", "S_5"]
    assert right.tau > wrong.tau + 0.1, (right.tau, wrong.tau)
