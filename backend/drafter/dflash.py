"""A plain-PyTorch DFlash drafter (block drafting from the target's hidden states), readable end to end.

DFlash (docs/CONVENTIONS.md#dflash) drafts a whole block in one pass instead of a chain of K passes:

    ctx_t  = hidden_norm(fc(A_t))                A_t = [S_a(t) | S_b(t) | ...] [k*H_T] -> [H]: context slot t
    block  = [x_s, M, M, ..., M]                  bs tokens at positions s..s+bs-1: the last verified token x_s
                                                  (not yet in the target KV) then bs-1 mask tokens M
    h      = embed(block)                         the TARGET's embedding (M's row must not be zero: then every mask
                                                  slot's first-layer query is 0 and all attend alike)
    per layer: x = input_layernorm(h)
             q = q_norm(q_proj(x)); keys/values = [k_norm(k_proj(ctx)), v_proj(ctx)] for the context slots
                                                 + [k_norm(k_proj(x)), v_proj(x)] for the block (RoPE on q, k)
             h = h + o_proj(attn(q, keys, values))     NOT causal: every block slot sees the whole block
             h = h + mlp(post_attention_layernorm(h))
    logits = lm_head(norm(h))[1:]                 the TARGET's lm_head: bs-1 draft tokens d_1..d_{bs-1}

The context keys and values of each layer are kept per request (`DFlashCache`); the target's verify forward over
[x_s, d_1..d_K] gives the accepted tokens' states, whose context slots are appended before the next block (the
z-lab `spec_generate` loop: the draft cache is cropped to the verified length, then the new target hidden appended).
What `dflash_config.target_layer_ids` t means: the trainers (z-lab, SpecForge) take HF `hidden_states[t + 1]`, the
output of layer t, i.e. boundary S_{t+1} (backend/drafter/kinds.py says how each engine release reads the ids).

Here the drafter's modules are named as in z-lab's `DFlashDraftModel` (fc, hidden_norm, layers.i.*, norm), the
checkpoint holds no embedding or lm_head (both are the target's), and `block_logits` scores many blocks of one
sequence in one pass (the finder and the toy trainer; checked against `propose` in tests/test_dflash.py).

Shapes: T context slots, bs block size (K = bs - 1 draft tokens), H width, H_T target width, k target states,
nh/nkv heads, hd head dim, V target vocab, A blocks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from backend.drafter.layers import MLP, RMSNorm, apply_rope
from backend.errors import SpecLensError

WEIGHTS = "model.safetensors"
ARCH = "DFlashDraftModel"


def zlab_layout(raw: dict) -> dict:
    """A speculators-format DFlash config (`speculators_model_type: dflash`, as speculators' trainer and its
    DFlashConverter write it: the draft transformer's keys under `transformer_layer_config`, top-level
    `aux_hidden_state_layer_ids` where id a is the input of target layer a, S_a) in z-lab's layout (flat keys,
    `dflash_config.target_layer_ids` where id t is the output of layer t, S_(t+1)): t = a - 1, which is how vLLM's
    speculators config reader hands it to its DFlash model. Any other config is returned as it is."""
    if not isinstance(raw, dict) or raw.get("speculators_model_type") != "dflash":
        return raw
    body = raw.get("transformer_layer_config")
    out = dict(body) if isinstance(body, dict) else {}
    for key in ("block_size", "mask_token_id", "target_hidden_size", "architectures"):
        if raw.get(key) is not None:
            out[key] = raw[key]
    aux = raw.get("aux_hidden_state_layer_ids")
    out["dflash_config"] = {"target_layer_ids": [int(a) - 1 for a in aux] if isinstance(aux, list) else None,
                            "mask_token_id": raw.get("mask_token_id")}
    return out


@dataclass
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_layers: int                 # draft decoder layers
    num_target_layers: int
    target_hidden_size: int
    target_layer_ids: list[int]     # as written (t: the output of target layer t, S_{t+1}, for the trainers)
    block_size: int                 # bs: one anchor token + bs-1 drafted
    mask_token_id: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    name: str = ""

    @property
    def num_aux(self) -> int:
        return len(self.target_layer_ids)

    @property
    def fc_in(self) -> int:
        return self.num_aux * self.target_hidden_size

    @classmethod
    def from_dict(cls, raw: dict, name: str = "config.json") -> DFlashConfig:
        raw = zlab_layout(raw)
        dc = raw.get("dflash_config") or {}
        ids = dc.get("target_layer_ids") or raw.get("target_layer_ids")
        missing = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size") if k not in raw]
        if missing or not ids:
            what = ", ".join(missing) if missing else "dflash_config.target_layer_ids"
            raise SpecLensError(f"{name}: DFlash config has no {what}; use the config.json that came with the weights")
        H, nh = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        mask = dc.get("mask_token_id", raw.get("mask_token_id"))
        if mask is None:
            raise SpecLensError(f"{name}: DFlash config has no dflash_config.mask_token_id; write the id of the "
                                "mask token the drafter was trained with")
        rope = raw.get("rope_theta") or (raw.get("rope_parameters") or {}).get("rope_theta") or 10000.0
        return cls(hidden_size=H, intermediate_size=int(raw["intermediate_size"]), num_heads=nh,
                   num_kv_heads=int(raw.get("num_key_value_heads") or nh), head_dim=int(raw.get("head_dim") or H // nh),
                   num_layers=int(raw.get("num_hidden_layers") or 1),
                   num_target_layers=int(raw.get("num_target_layers") or 0),
                   target_hidden_size=int(raw.get("target_hidden_size") or H), target_layer_ids=[int(t) for t in ids],
                   block_size=int(raw.get("block_size") or dc.get("block_size") or 16), mask_token_id=int(mask),
                   vocab_size=int(raw["vocab_size"]), rms_norm_eps=float(raw.get("rms_norm_eps") or 1e-6),
                   rope_theta=float(rope), name=name)

    def to_dict(self) -> dict:
        """config.json in z-lab's layout (dflash_config.target_layer_ids, block_size, num_target_layers)."""
        return {"architectures": [ARCH], "model_type": "qwen3", "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size, "num_attention_heads": self.num_heads,
                "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
                "num_hidden_layers": self.num_layers, "num_target_layers": self.num_target_layers,
                "target_hidden_size": self.target_hidden_size, "vocab_size": self.vocab_size,
                "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta, "block_size": self.block_size,
                "tie_word_embeddings": False,
                "dflash_config": {"target_layer_ids": list(self.target_layer_ids),
                                  "mask_token_id": self.mask_token_id}}


class DFlashAttention(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        H, nh, nkv, hd = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(H, nh * hd, bias=False)
        self.k_proj = nn.Linear(H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.q_norm = RMSNorm(hd, c.rms_norm_eps)
        self.k_norm = RMSNorm(hd, c.rms_norm_eps)
        inv = 1.0 / c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        self.register_buffer("inv_freq", inv.float(), persistent=False)

    def kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] at positions [N] -> keys, values [N, nkv, hd] (keys normed and rotated)."""
        N = x.shape[0]
        k = apply_rope(self.k_norm(self.k_proj(x).view(N, self.nkv, self.hd)), positions, self.inv_freq)
        return k, self.v_proj(x).view(N, self.nkv, self.hd)

    def attend(self, x: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
        """Queries from x [N, H]; keys/values [M, nkv, hd]; mask [N, M] bool (True = visible) or None (all)."""
        N, rep = x.shape[0], self.nh // self.nkv
        q = apply_rope(self.q_norm(self.q_proj(x).view(N, self.nh, self.hd)), positions, self.inv_freq)
        k, v = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask)
        return self.o_proj(out.transpose(0, 1).reshape(N, self.nh * self.hd))


class DFlashLayer(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DFlashAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c.hidden_size, c.intermediate_size)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor,
                mask_fn) -> torch.Tensor:
        """h [N, H] block slots; ctx_k/ctx_v [T, nkv, hd] context keys; mask_fn(T) -> [N, T + N] or None."""
        x = self.input_layernorm(h)
        bk, bv = self.self_attn.kv(x, positions)
        keys, values = torch.cat([ctx_k, bk]), torch.cat([ctx_v, bv])
        h = h + self.self_attn.attend(x, positions, keys, values, mask_fn(ctx_k.shape[0]))
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashCache:
    """Per layer, the context slots' keys and values for one request: [T, nkv, hd] each."""

    def __init__(self, n_layers: int):
        self.k: list[torch.Tensor | None] = [None] * n_layers
        self.v: list[torch.Tensor | None] = [None] * n_layers

    def __len__(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[0]

    def append(self, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[i] = k if self.k[i] is None else torch.cat([self.k[i], k])
        self.v[i] = v if self.v[i] is None else torch.cat([self.v[i], v])


class DFlashDrafter(nn.Module):
    kind = "dflash"

    def __init__(self, c: DFlashConfig, embed: torch.Tensor, lm_head: torch.Tensor):
        """embed [V, H], lm_head [V, H]: the target's (DFlash drafts in the target's embedding and vocabulary)."""
        super().__init__()
        if tuple(embed.shape) != (c.vocab_size, c.hidden_size) or tuple(lm_head.shape) != (c.vocab_size, c.hidden_size):
            raise SpecLensError(f"DFlash drafter {c.name}: built for vocab {c.vocab_size} x width {c.hidden_size}, the "
                                f"target's embedding is {list(embed.shape)}; use a drafter for this target")
        self.cfg = c
        self.fc = nn.Linear(c.fc_in, c.hidden_size, bias=False)                   # [H, k*H_T]
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.register_buffer("embed_w", embed.detach().clone(), persistent=False)
        self.register_buffer("head_w", lm_head.detach().clone(), persistent=False)
        self.cache = DFlashCache(c.num_layers)
        self.ctx_pos = 0

    # ---- the computation ------------------------------------------------------------------
    def context(self, aux: torch.Tensor) -> torch.Tensor:
        """aux [T, k*H_T] (target states concatenated in ascending boundary order) -> context slots [T, H]."""
        return self.hidden_norm(self.fc(aux.to(self.fc.weight.dtype)))

    def _block_hidden(self, tokens: torch.Tensor, positions: torch.Tensor, ctx_kv, mask_fn) -> torch.Tensor:
        h = F.embedding(tokens, self.embed_w)
        for layer, (ck, cv) in zip(self.layers, ctx_kv):
            h = layer(h, positions, ck, cv, mask_fn)
        return self.norm(h)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., H] -> [..., V]; flattened to one 2-D product (a 3-D input would make torch broadcast the head
        into a batched product, several times slower on CPU)."""
        return (h.reshape(-1, h.shape[-1]) @ self.head_w.T).view(*h.shape[:-1], -1)

    # ---- one request (the bench) ----------------------------------------------------------
    def reset(self) -> None:
        self.cache, self.ctx_pos = DFlashCache(self.cfg.num_layers), 0

    @torch.no_grad()
    def append_context(self, aux: torch.Tensor, positions: torch.Tensor) -> None:
        """The target states of verified positions (aux [n, k*H_T] at positions [n]) become context slots."""
        ctx = self.context(aux)
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.kv(ctx, positions)
            self.cache.append(i, k, v)
        self.ctx_pos = int(positions[-1]) + 1

    @torch.no_grad()
    def propose_logits(self, last_token: int, position: int) -> torch.Tensor:
        """One block: [x_s, M..M] at positions s..s+bs-1 over the context -> draft logits [bs-1, V]."""
        bs, dev = self.cfg.block_size, self.fc.weight.device
        toks = torch.tensor([last_token] + [self.cfg.mask_token_id] * (bs - 1), device=dev)
        pos = torch.arange(position, position + bs, device=dev)
        h = self._block_hidden(toks, pos, list(zip(self.cache.k, self.cache.v)), lambda T: None)
        return self.logits(h[1:])

    def propose(self, last_token: int, position: int, k: int | None = None) -> list[int]:
        """Greedy block draft: the first k (default bs-1) of the block's argmax tokens."""
        k = self.cfg.block_size - 1 if k is None else k
        if not 1 <= k <= self.cfg.block_size - 1:
            raise SpecLensError(f"DFlash drafter {self.cfg.name}: block size {self.cfg.block_size} drafts at most "
                                f"{self.cfg.block_size - 1} tokens per step, asked for {k}; use --num-spec-tokens "
                                f"<= {self.cfg.block_size - 1}")
        return self.propose_logits(last_token, position)[:k].argmax(-1).tolist()

    def check_target(self, target_config, target_name: str | None = None) -> None:
        """A one-line SpecLensError when the target's width or vocab is not the drafter's."""
        get = ((lambda k: target_config.get(k)) if isinstance(target_config, dict)
               else (lambda k: getattr(target_config, k, None)))
        name = target_name or get("_name_or_path") or "the target"
        for what, mine, theirs in (("hidden size", self.cfg.target_hidden_size, get("hidden_size")),
                                   ("vocab size", self.cfg.vocab_size, get("vocab_size"))):
            if theirs is not None and int(theirs) != mine:
                raise SpecLensError(f"DFlash drafter {self.cfg.name} was built for {what} {mine}, target {name} has "
                                    f"{theirs}; use a drafter for this target")

    # ---- many blocks of one sequence at once (finder, training) ---------------------------
    def block_logits(self, aux: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """aux [T, k*H_T], tokens [T] of one sequence, anchors [A] (each s >= 1, s + bs - 1 <= T - 1 not needed):
        block a holds [tokens[s], M..M] at positions s..s+bs-1 and sees context slots 0..s-1 and its own block.
        -> draft logits [A, bs-1, V] (what `propose` gives after `append_context(aux[:s])`)."""
        bs, T, A = self.cfg.block_size, tokens.shape[0], anchors.shape[0]
        dev = tokens.device
        ctx = self.context(aux)                                                          # [T, H]
        ctx_pos = torch.arange(T, device=dev)
        toks = torch.full((A, bs), self.cfg.mask_token_id, dtype=torch.long, device=dev)
        toks[:, 0] = tokens[anchors]
        pos = (anchors[:, None] + torch.arange(bs, device=dev)[None, :]).reshape(-1)        # [A*bs]
        blk = torch.arange(A, device=dev).repeat_interleave(bs)                             # [A*bs] block of a slot
        see_ctx = ctx_pos[None, :] < anchors.repeat_interleave(bs)[:, None]                 # [A*bs, T]
        see_blk = blk[:, None] == blk[None, :]                                              # [A*bs, A*bs]
        mask = torch.cat([see_ctx, see_blk], dim=1)
        ctx_kv = [layer.self_attn.kv(ctx, ctx_pos) for layer in self.layers]
        h = self._block_hidden(toks.reshape(-1), pos, ctx_kv, lambda _T: mask)
        return self.logits(h.view(A, bs, -1)[:, 1:])

    # ---- files ----------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path, target_embed: torch.Tensor, target_lm_head: torch.Tensor,
             dtype: torch.dtype = torch.float32) -> DFlashDrafter:
        from safetensors.torch import load_file

        path = Path(path)
        cfile = path / "config.json" if path.is_dir() else path
        path = cfile.parent
        try:
            raw = json.loads(cfile.read_text())
        except (OSError, ValueError) as e:
            raise SpecLensError(f"{cfile}: cannot read the DFlash config ({e}); point --drafter at its "
                                "directory") from None
        c = DFlashConfig.from_dict(raw, str(path))
        if target_lm_head is None:
            raise SpecLensError(f"{path}: a DFlash drafter drafts through the target's lm_head; the target has none")
        file = path / WEIGHTS
        if not file.is_file():
            raise SpecLensError(f"{file}: no drafter weights; put model.safetensors next to config.json")
        sd = {k.removeprefix("model."): v for k, v in load_file(str(file)).items()}
        sd = {k: v for k, v in sd.items() if k not in ("embed_tokens.weight", "lm_head.weight")}
        d = cls(c, target_embed, target_lm_head)
        want = {k: v.shape for k, v in d.state_dict().items()}
        missing, extra = sorted(set(want) - set(sd)), sorted(set(sd) - set(want))
        bad = [k for k in want if k in sd and tuple(sd[k].shape) != tuple(want[k])]
        if missing or extra or bad:
            raise SpecLensError(f"{file}: weights do not match config.json (missing {missing[:3]}, unexpected "
                                f"{extra[:3]}, shape {bad[:3]}); use the config.json that came with these weights")
        d.load_state_dict(sd)
        return d.to(dtype).eval()

    def save(self, path: str | Path, dtype: torch.dtype = torch.bfloat16, target_layer_ids: list[int] | None = None,
             **extra) -> Path:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        raw = self.cfg.to_dict()
        if target_layer_ids is not None:
            raw["dflash_config"]["target_layer_ids"] = list(target_layer_ids)
        raw.update(extra)
        (path / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
        save_file({k: v.detach().to(dtype).contiguous() for k, v in self.state_dict().items()}, str(path / WEIGHTS))
        return path


def is_dflash(path: str | Path) -> bool:
    """The drafter directory (or config file) holds a DFlash config: a `dflash_config`, a DFlash architecture or
    speculators' `speculators_model_type: dflash` (the kinds backend/drafter/kinds.py `kind_of` calls dflash)."""
    p = Path(path)
    f = p / "config.json" if p.is_dir() else p
    try:
        raw = json.loads(f.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(raw, dict):
        return False
    archs = [str(a).lower() for a in raw.get("architectures") or []]
    return (isinstance(raw.get("dflash_config"), dict) or any("dflash" in a and "dflash2" not in a for a in archs)
            or raw.get("speculators_model_type") == "dflash")


@torch.no_grad()
def init_random(d: DFlashDrafter, seed: int = 0) -> DFlashDrafter:
    g = torch.Generator().manual_seed(seed)
    for name, p in d.named_parameters():
        if "norm" in name:
            p.copy_(0.8 + 0.4 * torch.rand(p.shape, generator=g))
        else:
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    return d


def feeds(drafter: str | Path, lm_config, n_layers: int, producer: str = "vllm", version: str | None = None,
          runner: str | None = None, options: dict | None = None) -> dict:
    """What `producer` `version` feeds this DFlash drafter on the target (backend/drafter/kinds.py kind_aux, vLLM's
    runner decided as vLLM decides it for method "dflash"): {ids, ids_from, boundaries, producer, version, runner}."""
    from types import SimpleNamespace

    from backend import coords, vllm_runner
    from backend.drafter.aux import kind_aux
    from backend.drafter.config import load_config
    from backend.drafter.kinds import runner_args

    cfg = load_config(drafter)
    archs = list(getattr(lm_config, "architectures", None) or [])
    version = version or coords.DEFAULT_VERSIONS[producer]
    target = SimpleNamespace(n_layers=n_layers, model_type=getattr(lm_config, "model_type", None), architectures=archs)
    rn, reason = None, None
    if producer == "vllm":
        ra = runner_args(cfg.kind)
        choice = vllm_runner.resolve(runner or "auto", archs, version,
                                     {**(options or {}), **ra.get("options", {})} if options or ra.get("options")
                                     else None, method=ra.get("method", "dflash"))
        rn, reason = choice.runner, choice.reason
    aux = kind_aux(cfg, target, producer, version, rn)
    return {**aux, "producer": producer, "version": version, "runner": rn,
            **({"runner_reason": reason} if reason else {})}
