"""Small Llama-shaped targets the project builds itself (no downloads)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from backend.toy.tokenizer import build_tokenizer


def llama_config(vocab_size: int, n_layers: int = 8, hidden: int = 256, heads: int = 4, kv_heads: int = 2,
                 intermediate: int | None = None, max_pos: int = 4096, tokenizer=None):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate or int(hidden * 8 / 3) // 8 * 8,
        num_hidden_layers=n_layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_pos, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=getattr(tokenizer, "bos_token_id", 1), eos_token_id=getattr(tokenizer, "eos_token_id", 2),
        pad_token_id=getattr(tokenizer, "pad_token_id", 0),
    )


def randomize_norms(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Non-unit RMSNorm weights, so that S_N and F differ in direction (cosine is blind to unit norms)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(0.4 + 1.2 * torch.rand(p.shape, generator=generator))


def init_random(model: torch.nn.Module, seed: int, residual_std: float = 0.08) -> None:
    """Random weights whose layers visibly move the residual stream (cos(S_b, S_b+1) well below 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                fan_in = p.shape[1]
                std = 1.0 if "embed_tokens" in name else (
                    residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 1 / math.sqrt(fan_in))
                p.copy_(torch.randn(p.shape, generator=g) * std)
    randomize_norms(model, g)


def build_random_target(out: Path, n_layers: int = 8, hidden: int = 256, seed: int = 0, vocab_size: int = 4096) -> Path:
    """A random Llama target with its own BPE tokenizer and chat template, saved in HF format at `out`."""
    from transformers import LlamaForCausalLM

    out = Path(out)
    tok = build_tokenizer(out, vocab_size=vocab_size)
    torch.manual_seed(seed)
    cfg = llama_config(len(tok), n_layers=n_layers, hidden=hidden, tokenizer=tok)
    model = LlamaForCausalLM(cfg)
    init_random(model, seed)
    model.save_pretrained(str(out))
    return out
