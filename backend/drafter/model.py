"""A plain-PyTorch EAGLE-3 drafter (one decoder layer), readable end to end.

Shapes: T tokens, H drafter width, H_T target width, k aux states, V target vocab, V_d draft vocab,
nh/nkv query/kv heads, hd head dim.

The draft step (docs/CONVENTIONS.md#draft-step, vLLM `v1/spec_decode/eagle.py` + `llama_eagle3.py`):

    g_t   = fc(fc_norm(input_norm(A_t)))             A_t = [S_a(t) | S_b(t) | ...]  [k*H_T] -> [H]
    e     = input_layernorm(embed(token))             token of slot t is x_{t+1}
    h     = hidden_norm(g)
    r     = h if norm_before_residual else g          (vLLM; SGLang always uses g)
    x     = r + o_proj(attn(q,k,v from cat[e, h]))    embedding FIRST, then hidden; RoPE at `position`
    pre   = x + mlp(post_attention_layernorm(x))
    post  = norm(pre)
    logits = lm_head(post)                            [V_d]; target id = draft id + d2t[draft id]
    next hidden = post if norm_output else pre        (the step-2..k input; no fc there)

An `eagle3_mla` drafter (Eagle3DeepseekV2/V3ForCausalLM) is this layer with DeepSeek MLA attention instead of the
Llama one (backend/drafter/mla.py; `DecoderLayer` picks it by the config's kind); everything else above holds.

`prefill` is the first draft pass over context slots (writes drafter KV from target features),
`step` a later draft step; `truncate` rolls the KV back after verification, and a new `prefill`
over the accepted tokens' target features appends them (what vLLM's next first pass does).

Where the engines differ (`engine=`), as read in vLLM `model_executor/models/llama_eagle3.py` and
`v1/spec_decode/eagle.py` (`_maybe_share_embeddings`, `_maybe_share_lm_head`) and SGLang
`srt/models/llama_eagle3.py` + `speculative/eagle_worker.py` (`set_embed`, `load_lm_head_from_target`):

    flag / part            vllm                                  sglang
    norm_before_residual   honoured                              ignored (residual = g)
    norm_before_fc         honoured (input_norm)                 ignored up to 0.5.16 (no input_norm module;
                                                                 honoured from 0.5.17: backend/drafter_fields.yaml)
    embeddings             own embed_tokens if in checkpoint,    target's always (skipped only when
                           else the target's                     target_hidden_size != hidden_size)
    tie_word_embeddings    ignored (own lm_head [V_d, H])        lm_head = the embedding in use
    no draft_vocab_size    own lm_head over V                    target's lm_head
    formats                eagle, speculators, vllm              eagle only
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from backend.drafter.config import NORM_OUTPUT_MEANINGS, DrafterConfig, config_to_dict, load_config
from backend.drafter.layers import MLP, RMSNorm, apply_rope
from backend.drafter.mla import MLAAttention
from backend.errors import SpecLensError
from backend.options import SERVING_ENGINES

ENGINES = SERVING_ENGINES
WEIGHTS = "model.safetensors"


def rope_inv_freq(cfg: DrafterConfig) -> torch.Tensor:
    """[hd/2] inverse frequencies, with Llama-3 / linear scaling when the config asks for it."""
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
    rs = cfg.rope_scaling
    if not rs:
        return inv.float()
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        return (inv / rs["factor"]).float()
    if kind == "llama3":
        factor, low, high = rs["factor"], rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
        orig = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = (orig / wavelen - low) / (high - low)
        mid = (1 - smooth) * inv / factor + smooth * inv
        return torch.where(wavelen < orig / high, inv, torch.where(wavelen > orig / low, inv / factor, mid)).float()
    raise SpecLensError(f"drafter {cfg.name}: rope type {kind!r} is not supported; use default, linear or llama3 RoPE")


class KVCache:
    """The drafter's keys and values for one request, in slot order: k, v [S, nkv, hd]."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[0]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k])
        self.v = v if self.v is None else torch.cat([self.v, v])
        return self.k, self.v

    def truncate(self, n: int) -> None:
        if not 0 <= n <= len(self):
            raise SpecLensError(f"cannot roll the drafter KV back to {n} slots: it holds {len(self)}")
        self.k, self.v = (self.k[:n], self.v[:n]) if n else (None, None)


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        H, nh, nkv, hd, bias = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.attention_bias
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.scale = 1.0 / math.sqrt(hd)
        self.q_proj = nn.Linear(2 * H, nh * hd, bias=bias)  # input: cat[normed embedding, normed hidden]
        self.k_proj = nn.Linear(2 * H, nkv * hd, bias=bias)
        self.v_proj = nn.Linear(2 * H, nkv * hd, bias=bias)
        self.o_proj = nn.Linear(nh * hd, H, bias=bias)
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [N, 2H], positions [N] -> q [N, nh, hd], k [N, nkv, hd], v [N, nkv, hd] (RoPE applied)."""
        N = x.shape[0]
        q = apply_rope(self.q_proj(x).view(N, self.nh, self.hd), positions, self.inv_freq)
        k = apply_rope(self.k_proj(x).view(N, self.nkv, self.hd), positions, self.inv_freq)
        return q, k, self.v_proj(x).view(N, self.nkv, self.hd)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        T = x.shape[0]                                                   # x [T, 2H]
        q, k, v = self.qkv(x, positions)
        past = len(cache) if cache is not None else 0
        if cache is not None:
            k, v = cache.append(k, v)                                    # [past+T, nkv, hd]
        # query i (slot past+i) sees slots 0..past+i: causal over slot order
        dev = x.device
        # [T, past+T]
        mask = torch.arange(past + T, device=dev)[None, :] <= (past + torch.arange(T, device=dev))[:, None]
        rep = self.nh // self.nkv
        q, k, v = (q.transpose(0, 1), k.repeat_interleave(rep, 1).transpose(0, 1),
                   v.repeat_interleave(rep, 1).transpose(0, 1))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)   # [nh, T, hd]
        return self.o_proj(out.transpose(0, 1).reshape(T, self.nh * self.hd))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(H, eps)          # normalises the token embedding
        self.hidden_norm = RMSNorm(H, eps)              # normalises the incoming hidden (fc output or last step's)
        # kind eagle3_mla (Eagle3DeepseekV2/V3ForCausalLM): DeepSeek MLA attention, backend/drafter/mla.py
        self.self_attn = MLAAttention(cfg) if cfg.kind == "eagle3_mla" else Attention(cfg)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.mlp = MLP(H, cfg.intermediate_size)

    def forward(self, e: torch.Tensor, g: torch.Tensor, positions: torch.Tensor, cache: KVCache | None,
                residual_normed: bool) -> torch.Tensor:
        e = self.input_layernorm(e)                                      # [T, H]
        h = self.hidden_norm(g)                                          # [T, H]
        residual = h if residual_normed else g
        x = residual + self.self_attn(torch.cat([e, h], dim=-1), positions, cache)
        return x + self.mlp(self.post_attention_layernorm(x))            # pre-norm output [T, H]


@dataclass
class DraftOut:
    logits: torch.Tensor  # [V_d] draft-vocab logits of the last slot
    hidden: torch.Tensor  # [H] the hidden the next draft step takes
    token: int            # greedy draft token, in the TARGET vocab (d2t applied)


class Eagle3Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig, engine: str = "vllm", with_embed: bool = True, with_lm_head: bool = True):
        super().__init__()
        if engine not in ENGINES:
            raise SpecLensError(f"unknown engine semantics {engine!r}; use one of {', '.join(ENGINES)}")
        if cfg.norm_output_meaning not in NORM_OUTPUT_MEANINGS:
            raise SpecLensError(f"unknown norm_output meaning {cfg.norm_output_meaning!r}; use one of "
                                f"{', '.join(NORM_OUTPUT_MEANINGS)}")
        self.cfg, self.engine = cfg, engine
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.fc = nn.Linear(cfg.fc_in, H, bias=False)                                     # [H, k*H_T]
        self.input_norm = RMSNorm(cfg.fc_in, eps) if cfg.norm_before_fc else None         # [k*H_T]
        self.fc_norm = (nn.ModuleList(RMSNorm(cfg.target_hidden_size, eps) for _ in range(cfg.num_aux))
                        if cfg.fc_norm else None)                                         # k x [H_T]
        self.layers = nn.ModuleList([DecoderLayer(cfg)])
        self.norm = RMSNorm(H, eps)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H) if with_embed else None      # [V, H]
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False) if with_lm_head else None  # [V_d, H]
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))  # [V_d] offsets
        self.embed_source = "drafter" if with_embed else "none"
        self.cache = KVCache()

    # ---- engine semantics -------------------------------------------------------------------
    @property
    def residual_normed(self) -> bool:
        return self.cfg.norm_before_residual and self.engine == "vllm"

    @property
    def uses_input_norm(self) -> bool:        # the MLA drafter files of both engines have no input_norm
        return self.input_norm is not None and self.engine == "vllm" and self.cfg.kind != "eagle3_mla"

    # ---- the computation ----------------------------------------------------------------------
    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """aux [T, k*H_T] (the target's aux states, concatenated in ascending layer order) -> g [T, H]."""
        if self.uses_input_norm:
            aux = self.input_norm(aux)
        if self.fc_norm is not None:
            aux = torch.cat([n(c) for n, c in zip(self.fc_norm, aux.chunk(self.cfg.num_aux, dim=-1))], dim=-1)
        return self.fc(aux)

    def forward(self, token_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                use_cache: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass of the layer over T slots: token_ids [T] (target vocab), hidden [T, H], positions [T]
        -> (logits [T, V_d], next hidden [T, H]). use_cache=False attends only among these T slots."""
        if self.embed_tokens is None:
            raise SpecLensError(f"drafter {self.cfg.name} has no embed_tokens; load it with target_embed=")
        e = self.embed_tokens(token_ids)                                                  # [T, H]
        pre = self.layers[0](e, hidden, positions, self.cache if use_cache else None, self.residual_normed)
        post = self.norm(pre)
        if self.cfg.norm_output_meaning == "lm_head":  # SpecForge reading: the flag gates the norm before lm_head
            return self.lm_head(post if self.cfg.norm_output else pre), pre
        return self.lm_head(post), (post if self.cfg.norm_output else pre)

    def _out(self, logits: torch.Tensor, hidden: torch.Tensor) -> DraftOut:
        draft_id = int(logits[-1].argmax())
        return DraftOut(logits=logits[-1], hidden=hidden[-1],
                        token=int(self.draft_to_target(torch.tensor(draft_id, device=self.d2t.device))))

    @torch.no_grad()
    def prefill(self, aux_states: torch.Tensor, token_ids_next: torch.Tensor, positions: torch.Tensor) -> DraftOut:
        """First draft pass over context slots, appended to the drafter KV.
        aux_states [T, k*H_T] at positions [T]; token_ids_next [T]: slot t holds x_{t+1} (the last one is the
        target's sampled token). Also the way to append accepted tokens' target features after `truncate`."""
        g = self.combine(torch.as_tensor(aux_states).to(self.fc.weight.dtype))             # [T, H]
        return self._out(*self.forward(torch.as_tensor(token_ids_next).long(), g, torch.as_tensor(positions).long()))

    @torch.no_grad()
    def step(self, token_id: int, prev_hidden: torch.Tensor, position: int) -> DraftOut:
        """Draft steps 2..k: the previous draft token (target vocab), the previous step's hidden [H] (no fc)."""
        dev = prev_hidden.device
        return self._out(*self.forward(torch.tensor([token_id], device=dev), prev_hidden.view(1, -1),
                                       torch.tensor([position], device=dev)))

    def draft(self, aux_states: torch.Tensor, token_ids_next: torch.Tensor, positions: torch.Tensor,
              num_tokens: int) -> list[int]:
        """A greedy chain of `num_tokens` draft tokens (target vocab), as vLLM's proposer makes at any temperature."""
        out = self.prefill(aux_states, token_ids_next, positions)
        tokens, pos = [out.token], int(positions[-1])
        for i in range(1, num_tokens):
            out = self.step(out.token, out.hidden, pos + i)
            tokens.append(out.token)
        return tokens

    # ---- KV cache -----------------------------------------------------------------------------
    @property
    def cache_len(self) -> int:
        return len(self.cache)

    def truncate(self, n: int) -> None:
        """Roll the drafter KV back to its first n slots (drop rejected draft slots)."""
        self.cache.truncate(n)

    def reset(self) -> None:
        self.cache = KVCache()

    # ---- vocab --------------------------------------------------------------------------------
    def draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocab ids -> target-vocab ids: target_id = draft_id + d2t[draft_id]."""
        return ids + self.d2t[ids]

    def target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., V_d] -> [..., V] with -inf off the draft vocab (vLLM compute_logits)."""
        out = logits.new_full((*logits.shape[:-1], self.cfg.vocab_size), float("-inf"))
        out[..., self.draft_to_target(torch.arange(logits.shape[-1], device=logits.device))] = logits
        return out

    def check_target(self, target_config, target_name: str | None = None) -> None:
        """Raise a one-line SpecLensError if this drafter does not fit the target (hidden size or vocab)."""
        get = ((lambda k: target_config.get(k)) if isinstance(target_config, dict)
               else (lambda k: getattr(target_config, k, None)))
        name = target_name or get("_name_or_path") or "the target"
        text = get("text_config")  # multimodal targets keep the language model's shape here
        if text is not None:
            get = (lambda k: text.get(k)) if isinstance(text, dict) else (lambda k: getattr(text, k, None))
        for what, mine, theirs in (("hidden size", self.cfg.target_hidden_size, get("hidden_size")),
                                   ("vocab size", self.cfg.vocab_size, get("vocab_size"))):
            if theirs is not None and int(theirs) != mine:
                raise SpecLensError(f"drafter {self.cfg.name} was built for {what} {mine}, target {name} has "
                                    f"{theirs}; use a drafter for this target")

    # ---- files --------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path, target_embed: torch.Tensor | None = None,
             target_lm_head: torch.Tensor | None = None, engine: str = "vllm",
             norm_output_meaning: str = "next_step", dtype: torch.dtype = torch.float32) -> Eagle3Drafter:
        """Read config.json + model.safetensors (any of the three formats) with `engine`'s semantics.
        target_embed [V, H] / target_lm_head [V, H]: the target's, used where the engine would use them.
        The kind switch: a DFlash config loads a `backend.drafter.dflash.DFlashDrafter` (block drafting; it takes the
        target's embedding and lm_head, and drafts alike in both engines)."""
        from safetensors.torch import load_file

        from backend.drafter.dflash import DFlashDrafter, is_dflash

        if is_dflash(path):
            return DFlashDrafter.load(path, target_embed, target_lm_head, dtype)
        cfg = load_config(path)
        cfg.norm_output_meaning = norm_output_meaning
        file = Path(cfg.name) / WEIGHTS
        if engine == "sglang" and cfg.source_format != "eagle":
            raise SpecLensError(f"{cfg.name}: SGLang loads only the EAGLE/SpecForge format (LlamaForCausalLMEagle3), "
                                f"this is {cfg.source_format}; "
                                f"convert it with Eagle3Drafter.save(path, format='eagle')")
        if not file.is_file():
            raise SpecLensError(f"{file}: no drafter weights; put model.safetensors next to config.json")
        sd = {_canonical(k): v for k, v in load_file(str(file)).items()}
        V, V_d, H = cfg.vocab_size, cfg.draft_vocab_size, cfg.hidden_size
        if "fc.weight" in sd and sd["fc.weight"].shape[1] != cfg.fc_in:
            n = sd["fc.weight"].shape[1]
            raise SpecLensError(f"{file}: fc.weight takes {n} inputs but config resolves k={cfg.num_aux} aux states "
                                f"x {cfg.target_hidden_size} (from {cfg.num_aux_source}); set num_aux_hidden_states: "
                                f"{n // cfg.target_hidden_size} in config.json")
        if V_d < V and "d2t" not in sd:
            raise SpecLensError(f"{file}: no d2t but draft_vocab_size {V_d} < vocab size {V}; add d2t [{V_d}] int64 "
                                "offsets (target_id = draft_id + d2t[draft_id]) to the checkpoint")
        tied = engine == "sglang" and cfg.tie_word_embeddings
        head_from_target = engine == "sglang" and not tied and not cfg.draft_vocab_size_given
        own_head = not tied and not head_from_target
        probe = cls(cfg, engine, with_embed="embed_tokens.weight" in sd, with_lm_head=own_head)
        expected = {k: v.shape for k, v in probe.state_dict().items()}
        if not probe.uses_input_norm:
            expected.pop("input_norm.weight", None)
        optional = {"t2d", "d2t", "embed_tokens.weight", "lm_head.weight", "input_norm.weight"}
        missing = sorted(k for k in expected if k not in sd and k not in ("d2t", "embed_tokens.weight"))
        extra = sorted(k for k in sd if k not in expected and k not in optional)
        if missing or extra:
            what = "; ".join(s for s in (f"missing {', '.join(missing[:4])}" if missing else "",
                                         f"unexpected {', '.join(extra[:4])}" if extra else "") if s)
            raise SpecLensError(f"{file}: weights do not match config.json ({what}); use the config.json that came "
                                "with these weights")
        for k, shape in expected.items():
            if k in sd and sd[k].shape != shape:
                raise SpecLensError(f"{file}: {k} has shape {list(sd[k].shape)}, config.json implies {list(shape)}; "
                                    "use the config.json that came with these weights")
        probe.load_state_dict({k: v for k, v in sd.items() if k in expected}, strict=False)
        model = probe.to(dtype)
        cfg.has_embed_tokens, cfg.has_lm_head = "embed_tokens.weight" in sd, "lm_head.weight" in sd

        # embeddings: vLLM keeps its own if the checkpoint has one; SGLang substitutes the target's
        substitute = target_embed is not None and (engine == "sglang" and cfg.target_hidden_size == H
                                                   or model.embed_tokens is None)
        if substitute:
            if tuple(target_embed.shape) != (V, H):
                raise SpecLensError(f"drafter {cfg.name} needs a target embedding [{V}, {H}], got "
                                    f"{list(target_embed.shape)}; use a drafter for this target")
            model.embed_tokens = nn.Embedding.from_pretrained(target_embed.detach().to(dtype), freeze=True)
            model.embed_source = "target"
        if model.embed_tokens is None:
            raise SpecLensError(f"{file}: no embed_tokens in the checkpoint; pass the target's embedding "
                                "(target_embed=) when loading")
        if tied:  # SGLang: lm_head is the embedding module, so it follows the substitution; logits over V
            model.lm_head = nn.Linear(H, V, bias=False)
            model.lm_head.weight = model.embed_tokens.weight
            model.d2t = torch.zeros(V, dtype=torch.long)
        if head_from_target:
            if target_lm_head is None:
                raise SpecLensError(f"{file}: no draft_vocab_size, so SGLang takes the target's lm_head; pass "
                                    "target_lm_head= when loading")
            if tuple(target_lm_head.shape) != (V, H):
                raise SpecLensError(f"drafter {cfg.name} needs a target lm_head [{V}, {H}], got "
                                    f"{list(target_lm_head.shape)}; use a drafter for this target")
            model.lm_head = nn.Linear(H, V, bias=False).to(dtype)
            model.lm_head.weight.data.copy_(target_lm_head)
        return model.eval()

    def save(self, path: str | Path, format: str = "eagle", aux_layer_ids: list[int] | None = None) -> Path:
        """Write config.json + model.safetensors in `format` ("eagle" writes midlayer.* and nested
        eagle_config.eagle_aux_hidden_state_layer_ids; "speculators" layers.0.* and top-level ids)."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        raw = config_to_dict(self.cfg, format, aux_layer_ids)
        sd = {k: v.detach().contiguous().clone() for k, v in self.state_dict().items()}
        if self.embed_source != "drafter":
            sd.pop("embed_tokens.weight", None)
        if self.lm_head is None or self.lm_head.weight is getattr(self.embed_tokens, "weight", None):
            sd.pop("lm_head.weight", None)
        if self.cfg.draft_vocab_size < self.cfg.vocab_size:
            t2d = torch.zeros(self.cfg.vocab_size, dtype=torch.bool)
            t2d[self.draft_to_target(torch.arange(self.cfg.draft_vocab_size))] = True
            sd["t2d"] = t2d
        if format == "eagle":
            sd = {k.replace("layers.0.", "midlayer.", 1): v for k, v in sd.items()}
        (path / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
        save_file(sd, str(path / WEIGHTS))
        return path


def _canonical(key: str) -> str:
    """Checkpoint key -> this module's name (vLLM maps midlayer. -> layers.0.; SGLang the aux_norm_* names)."""
    key = key.removeprefix("model.")
    key = key.replace("midlayer.", "layers.0.", 1)
    for i, legacy in enumerate(("aux_norm_low", "aux_norm_mid", "aux_norm_high")):
        key = key.replace(legacy, f"fc_norm.{i}")
    return key


@torch.no_grad()
def init_random(model: Eagle3Drafter, seed: int = 0) -> Eagle3Drafter:
    """Random weights with non-unit norm weights, so that every norm flag visibly changes the output."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "norm" in name:
            p.copy_(0.4 + 1.2 * torch.rand(p.shape, generator=g))
        elif p.dim() == 2:
            p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "embed_tokens" in name else 1 / math.sqrt(p.shape[1])))
        else:
            p.copy_(0.02 * torch.randn(p.shape, generator=g))
    return model
