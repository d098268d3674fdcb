"""MLA attention for EAGLE-3 drafters of the kind `eagle3_mla` (Eagle3DeepseekV2ForCausalLM /
Eagle3DeepseekV3ForCausalLM), in plain PyTorch: the attention variant `backend.drafter.model.DecoderLayer` takes
when the config is of that kind. Everything else of the drafter (fc over the fed states, hidden_norm,
input_layernorm, the cat[embedding, hidden] input, the residuals, the SiLU MLP, norm, lm_head, d2t) is the Llama
EAGLE-3 layer's, so the finder, the training-data check and the HF bench load it through `Eagle3Drafter.load`
(docs/CONVENTIONS.md#mla-eagle-3).

Shapes: T slots, H drafter width, nh heads, r_q = q_lora_rank (None: one q_proj), r_kv = kv_lora_rank,
d_n = qk_nope_head_dim, d_r = qk_rope_head_dim, d_v = v_head_dim, d_qk = d_n + d_r.

    x            = cat[input_layernorm(embed), hidden_norm(g)]         [T, 2H]  (embedding first, as EAGLE-3)
    q            = q_b_proj(q_a_layernorm(q_a_proj(x)))   or q_proj(x)   [T, nh, d_qk] = [q_nope | q_pe]
    c, k_pe      = kv_a_proj_with_mqa(x)                   [T, r_kv], [T, d_r]: ONE rope key for all heads
    k_nope, v    = kv_b_proj(kv_a_layernorm(c))                           [T, nh, d_n], [T, nh, d_v]  (k_pe not normed)
    q_pe, k_pe   rotated by RoPE over d_r only, DeepSeek's interleaved pairs (0,1), (2,3), ... (not Llama's halves)
    k            = [k_nope | k_pe broadcast to every head]                [T, nh, d_qk]
    out          = o_proj(softmax(q k^T * scale, causal) v)               [T, nh * d_v] -> [H], scale = d_qk ** -0.5

With DeepSeek YaRN rope_scaling (`deepseek_yarn`): the RoPE inverse frequencies are YaRN's, cos and sin are
multiplied by the attention factor (mscale / mscale_all_dim ratio; 1.0 when the two are equal, as in the Kimi and
DeepSeek configs), and scale = d_qk ** -0.5 * yarn_get_mscale(factor, mscale_all_dim) ** 2 when mscale_all_dim is set.

Here the keys and values are kept expanded per head (the MHA form vLLM also runs at prefill), not as the
compressed latent; the result is the same.

Where each fact comes from (read in the public sources, none imported here):
- Layout and weight names: vLLM `model_executor/models/deepseek_eagle3.py` (DeepseekV2Eagle3DecoderLayer builds
  DeepseekV2MLAAttention with `input_size=2 * hidden_size` for layer 0, then a dense DeepseekV2MLP, input_layernorm,
  hidden_norm, post_attention_layernorm; DeepseekV2Eagle3Model: fc, optional fc_norm, norm; the weights mapper
  renames `midlayer.` -> `layers.0.` and stacks `q_a_proj` + `kv_a_proj_with_mqa` into `fused_qkv_a_proj`,
  gate_proj + up_proj into gate_up_proj; Eagle3DeepseekV2ForCausalLM: lm_head [draft_vocab_size, H], d2t,
  t2d skipped, embed_tokens skipped when the checkpoint has none; Eagle3DeepseekV3ForCausalLM is an alias).
  SGLang `srt/models/deepseek_eagle3.py` (DeepseekEagle3DecoderLayer: with q_lora_rank the fused
  `fused_qkv_a_proj_with_mqa` [q_lora_rank + kv_lora_rank + qk_rope_head_dim, 2H], else `q_proj` and
  `kv_a_proj_with_mqa` over 2H; load_weights renames `layers.0.` -> `midlayer.` and fuses q_a_proj with
  kv_a_proj_with_mqa; one decoder layer only). SpecForge `specforge/modeling/draft/deepseek_eagle3.py`
  (DeepseekMLAAttention: q_a_proj / q_a_layernorm / q_b_proj or q_proj, kv_a_proj_with_mqa, kv_a_layernorm,
  kv_b_proj, o_proj [nh * v_head_dim -> H], all without bias; the trainer saves `midlayer.*`).
- Config fields: q_lora_rank (absent / null: q_proj), kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
  v_head_dim, num_attention_heads, rope_theta, rope_scaling (vLLM DeepseekV2Eagle3DecoderLayer.__init__ reads them
  with getattr(config, ..., 0); SGLang DeepseekEagle3DecoderLayer reads config.<field>).
- The attention math: vLLM `models/deepseek_v2.py` DeepseekV2MLAAttention (q_a_layernorm, kv_a_layernorm over
  kv_lora_rank only, kv_b_proj -> [k_nope | v] per head, scaling qk_head_dim ** -0.5, `get_rope(qk_rope_head_dim,
  ..., is_neox_style=False)`: interleaved pairs); SpecForge `_apply_rotary_pos_emb_interleaved` (the same pairs);
  transformers `models/deepseek_v3/modeling_deepseek_v3.py` DeepseekV3Attention (the same split and expand_kv).
- Where the engines differ from the Llama EAGLE-3 layer (what `Eagle3Drafter` does with `engine=`):
  neither MLA file has `input_norm` (norm_before_fc is not read: `Eagle3Drafter.uses_input_norm` is False for
  this kind); vLLM honours norm_before_residual and fc_norm, SGLang's MLA layer always takes the un-normed fc
  output as residual and has no fc_norm (not modelled: the toy drafter sets neither); SGLang sizes fc from
  len(eagle_config.eagle_aux_hidden_state_layer_ids) or 3 and ignores num_aux_hidden_states (vLLM reads
  num_aux_hidden_states first), so a config that writes the nested ids gets the same k in both.

- DeepSeek YaRN (rope_scaling type / rope_type "yarn"): inverse frequencies and attention factor from transformers'
  own `modeling_rope_utils._compute_yarn_parameters` (ROPE_INIT_FUNCTIONS["yarn"], called here with a config whose
  head_dim is qk_rope_head_dim, as DeepseekV3Config sets it). The same numbers as vLLM
  `layers/rotary_embedding/deepseek_scaling_rope.py` DeepseekScalingRotaryEmbedding (_compute_inv_freq; mscale =
  yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim) * attn_factor; _compute_cos_sin_cache
  multiplies cos and sin by it), which vLLM `models/deepseek_v2.py` DeepseekV2MLAAttention.__init__ selects for any
  non-default rope_type ("deepseek_yarn", over original_max_position_embeddings) and transformers
  DeepseekV3RotaryEmbedding.forward applies as attention_scaling. The softmax scale: vLLM DeepseekV2MLAAttention
  .__init__ (`self.scaling * mscale * mscale`, mscale = yarn_get_mscale(factor, float(mscale_all_dim))); transformers
  `models/deepseek_v3/modeling_deepseek_v3.py` DeepseekV3Attention.__init__ (yarn_apply_mscale: the same, only when
  mscale_all_dim is set); SGLang's DeepseekV2AttentionMLA does the same. `yarn_get_mscale` is imported from that
  transformers module.

Not supported (raises on load): rope_scaling of another type than YaRN; YaRN configs that the engines and
transformers read differently: without factor or original_max_position_embeddings, with attention_factor /
attn_factor / extrapolation_factor / truncate / apply_yarn_scaling, or with exactly one of mscale and mscale_all_dim
set (vLLM defaults mscale 1 and mscale_all_dim 0; transformers falls back to yarn_get_mscale(factor)).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from backend.drafter.config import DrafterConfig
from backend.drafter.layers import RMSNorm
from backend.errors import SpecLensError

YARN_TYPES = ("yarn", "deepseek_yarn")
# keys the engines' DeepseekScalingRotaryEmbedding and transformers' _compute_yarn_parameters read differently:
# attention_factor (transformers only), attn_factor / extrapolation_factor (vLLM / SGLang only), truncate (transformers
# only; the engines always truncate), apply_yarn_scaling (vLLM only: False drops the softmax mscale)
_YARN_NOT_MODELLED = ("attention_factor", "attn_factor", "extrapolation_factor", "truncate", "apply_yarn_scaling")


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor,
                 attention_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, d_r/2] of angle position * inv_freq[i], each times the YaRN attention factor (1.0: plain RoPE,
    left unmultiplied): vLLM DeepseekScalingRotaryEmbedding._compute_cos_sin_cache (cos = freqs.cos() * self.mscale),
    transformers DeepseekV3RotaryEmbedding.forward (cos = emb.cos() * self.attention_scaling)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]          # [T, d_r/2]
    cos, sin = freqs.cos(), freqs.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos, sin


def apply_rope_interleaved(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                           attention_factor: float = 1.0) -> torch.Tensor:
    """x [T, heads, d_r] rotated by `positions` [T] in DeepSeek's layout: dims (2i, 2i+1) form pair i, turned by
    angle position * inv_freq[i] (vLLM is_neox_style=False), scaled by the YaRN attention factor as the engines scale
    cos and sin. The output keeps the interleaved layout."""
    cos, sin = rope_cos_sin(positions, inv_freq, attention_factor)
    cos, sin = cos[:, None, :], sin[:, None, :]                      # [T, 1, d_r/2]
    xf = x.float()
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2).to(x.dtype)


def deepseek_yarn(cfg: DrafterConfig, d_r: int, d_qk: int) -> tuple[torch.Tensor, float, float]:
    """DeepSeek YaRN for an MLA drafter whose config has rope_scaling: (inv_freq [d_r/2], attention factor for
    cos/sin, softmax scale). The first two are transformers' own `modeling_rope_utils._compute_yarn_parameters`
    (ROPE_INIT_FUNCTIONS["yarn"]) over d_r = qk_rope_head_dim (DeepseekV3Config sets head_dim = qk_rope_head_dim);
    the softmax scale is d_qk ** -0.5 * mscale ** 2, mscale = yarn_get_mscale(factor, mscale_all_dim) when
    mscale_all_dim is set (transformers deepseek_v3 `yarn_get_mscale`, as DeepseekV3Attention and vLLM
    DeepseekV2MLAAttention.__init__ apply it). Raises for what the engines read differently from transformers."""
    from transformers import PretrainedConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_get_mscale

    rs = dict(cfg.rope_scaling or {})
    kind = rs.get("rope_type", rs.get("type"))
    if kind not in YARN_TYPES:
        raise SpecLensError(f"drafter {cfg.name}: MLA with rope_scaling {kind!r} is not supported; SpecLens loads MLA "
                            "drafters with plain RoPE or DeepSeek YaRN (rope_type yarn)")
    missing = [k for k in ("factor", "original_max_position_embeddings") if rs.get(k) is None]
    odd = [k for k in _YARN_NOT_MODELLED if k in rs]
    m, m_all = rs.get("mscale"), rs.get("mscale_all_dim")
    if not m_all and m not in (None, 1, 1.0):       # the engines: mscale / 1; transformers: yarn_get_mscale(factor)
        odd.append(f"mscale {m} without mscale_all_dim")
    if m_all and not m:                             # the engines: 1 / mscale_all_dim; transformers: the plain one
        odd.append(f"mscale_all_dim {m_all} without mscale")
    if missing or odd:
        raise SpecLensError(f"drafter {cfg.name}: DeepSeek YaRN rope_scaling "
                            + (f"without {', '.join(missing)} " if missing else "")
                            + (f"with {', '.join(odd)} " if odd else "")
                            + "is not modelled (vLLM / SGLang and transformers would not agree on it)")
    params = {k: v for k, v in rs.items() if k != "type"}
    params.update(rope_type="yarn", rope_theta=cfg.rope_theta)
    hf = PretrainedConfig(head_dim=d_r, hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_heads,
                          max_position_embeddings=cfg.max_position_embeddings, rope_parameters=params)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](hf, None)
    scale = d_qk ** -0.5
    if m_all:
        mscale = yarn_get_mscale(float(rs["factor"]), float(m_all))
        scale = scale * mscale * mscale
    return inv_freq.float(), float(attention_factor), scale


class MLAAttention(nn.Module):
    """The EAGLE-3 layer's attention with DeepSeek MLA; same interface as model.Attention (forward, qkv, scale)."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        m = cfg.mla or {}
        missing = [k for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim") if not m.get(k)]
        if missing:
            raise SpecLensError(f"{cfg.name}: an MLA drafter config needs {', '.join(missing)}; use the config.json "
                                "that came with these weights")
        H, nh = cfg.hidden_size, cfg.num_heads
        self.r_q, self.r_kv = m.get("q_lora_rank"), int(m["kv_lora_rank"])
        self.d_n, self.d_r, self.d_v = int(m["qk_nope_head_dim"]), int(m["qk_rope_head_dim"]), int(m["v_head_dim"])
        self.nh = self.nkv = nh                       # every head has its own k_nope and v; k_pe is shared
        self.hd = self.d_n + self.d_r                 # d_qk
        self.scale = self.hd ** -0.5
        eps = cfg.rms_norm_eps
        if self.r_q:
            self.q_a_proj = nn.Linear(2 * H, self.r_q, bias=False)
            self.q_a_layernorm = RMSNorm(self.r_q, eps)
            self.q_b_proj = nn.Linear(self.r_q, nh * self.hd, bias=False)
        else:
            self.q_proj = nn.Linear(2 * H, nh * self.hd, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(2 * H, self.r_kv + self.d_r, bias=False)
        self.kv_a_layernorm = RMSNorm(self.r_kv, eps)
        self.kv_b_proj = nn.Linear(self.r_kv, nh * (self.d_n + self.d_v), bias=False)
        self.o_proj = nn.Linear(nh * self.d_v, H, bias=False)
        if cfg.rope_scaling:                          # DeepSeek YaRN: scaled frequencies, cos/sin and softmax scale
            inv, self.attention_factor, self.scale = deepseek_yarn(cfg, self.d_r, self.hd)
        else:
            inv = (1.0 / cfg.rope_theta ** (torch.arange(0, self.d_r, 2, dtype=torch.float64) / self.d_r)).float()
            self.attention_factor = 1.0
        self.register_buffer("inv_freq", inv, persistent=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [N, 2H], positions [N] -> q [N, nh, d_qk], k [N, nh, d_qk], v [N, nh, d_v] (RoPE applied)."""
        N = x.shape[0]
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.r_q else self.q_proj(x)
        q_nope, q_pe = q.view(N, self.nh, self.hd).split([self.d_n, self.d_r], dim=-1)
        c, k_pe = self.kv_a_proj_with_mqa(x).split([self.r_kv, self.d_r], dim=-1)
        k_nope, v = self.kv_b_proj(self.kv_a_layernorm(c)).view(N, self.nh, self.d_n + self.d_v).split(
            [self.d_n, self.d_v], dim=-1)
        af = self.attention_factor
        q_pe = apply_rope_interleaved(q_pe, positions, self.inv_freq, af)
        k_pe = apply_rope_interleaved(k_pe[:, None, :], positions, self.inv_freq, af).expand(N, self.nh, self.d_r)
        return torch.cat([q_nope, q_pe], dim=-1), torch.cat([k_nope, k_pe], dim=-1), v

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """x [T, 2H] at positions [T]; `cache` a model.KVCache (keys/values appended, causal over slot order)."""
        T = x.shape[0]
        q, k, v = self.qkv(x, positions)
        past = len(cache) if cache is not None else 0
        if cache is not None:
            k, v = cache.append(k, v)                                    # [past+T, nh, *]
        dev = x.device
        mask = torch.arange(past + T, device=dev)[None, :] <= (past + torch.arange(T, device=dev))[:, None]
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                             attn_mask=mask, scale=self.scale)     # [nh, T, d_v]
        return self.o_proj(out.transpose(0, 1).reshape(T, self.nh * self.d_v))
