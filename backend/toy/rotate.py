"""A rotated copy of a Llama target (QuaRot-style): same function, hidden states in another basis.

RMSNorm weights are folded into the linears that read the normed state, then every residual-stream
read is multiplied by Q and every write by Q^T (row-vector convention, x_rot = x Q). Logits are
unchanged, S_b becomes S_b Q: linear CKA against the original stays 1 while cosine collapses.
"""

from __future__ import annotations

from pathlib import Path

import torch


def random_orthogonal(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()


@torch.no_grad()
def rotate_llama(model: torch.nn.Module, Q: torch.Tensor) -> torch.nn.Module:
    base = model.model

    def fold(norm: torch.nn.Module, readers: list[torch.nn.Linear]) -> None:
        for lin in readers:
            lin.weight.mul_(norm.weight[None, :])          # W [out, H] * w [H]
        norm.weight.fill_(1.0)

    def read(lin: torch.nn.Linear) -> None:                 # y = x W^T, x -> x Q  =>  W -> W Q
        lin.weight.copy_(lin.weight @ Q)

    def write(lin: torch.nn.Linear) -> None:                # out -> out Q  =>  W -> Q^T W
        lin.weight.copy_(Q.T @ lin.weight)
        if lin.bias is not None:
            lin.bias.copy_(lin.bias @ Q)

    for layer in base.layers:
        at, mlp = layer.self_attn, layer.mlp
        fold(layer.input_layernorm, [at.q_proj, at.k_proj, at.v_proj])
        fold(layer.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj])
        for lin in (at.q_proj, at.k_proj, at.v_proj, mlp.gate_proj, mlp.up_proj):
            read(lin)
        write(at.o_proj)
        write(mlp.down_proj)
    fold(base.norm, [model.lm_head])
    read(model.lm_head)
    base.embed_tokens.weight.copy_(base.embed_tokens.weight @ Q)   # E [V, H] -> E Q
    return model


def write_rotated(src: Path, dst: Path, seed: int = 1234) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    if model.config.tie_word_embeddings:
        raise ValueError(f"{src}: tied embeddings cannot be rotated independently; untie them first")
    rotate_llama(model, random_orthogonal(model.config.hidden_size, seed))
    model.save_pretrained(str(dst))
    AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(dst))
    return dst
