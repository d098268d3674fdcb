"""The drafter's unrolled forward over every slot at once (training-time test: TTT), as vLLM's proposer drafts.

Used by the finder (backend/drafter/finder.py: a drafter fed a candidate boundary set, teacher-forced over the
target's answers) and by the toy trainers (backend/toy/). `tests/test_check_drafter.py` checks it against
`Eagle3Drafter.prefill/step`, the inference path.
"""

from __future__ import annotations

import torch

from backend.drafter.model import Eagle3Drafter


def shift(x: torch.Tensor, n: int, fill: float = 0) -> torch.Tensor:
    """x[:, t] -> x[:, t + n] along dim 1, padded with `fill` at the end."""
    if n == 0:
        return x
    pad = x.new_full((x.shape[0], n, *x.shape[2:]), fill)
    return torch.cat([x[:, n:], pad], dim=1)


def ttt_forward(d: Eagle3Drafter, aux: torch.Tensor, tokens: torch.Tensor, steps: int,
                select: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Unrolled draft steps over all slots at once.

    aux [B, T, k*H_T] target aux states, tokens [B, T] (right-padded). Returns per step j the draft
    logits [B, T, V_d] (or [M_j, V_d] at `select[j]`, a bool mask [B, T], to save memory).
    Slot t at step j: token tokens[t+1+j], position t+j, hidden = fc(aux[t]) (j=0) or the step j-1
    output at slot t; attention over step-0 keys of slots <= t and this slot's keys of steps 1..j.
    """
    layer, at = d.layers[0], d.layers[0].self_attn      # Llama attention, or MLA (backend/drafter/mla.py)
    B, T = tokens.shape
    nh, nkv = at.nh, at.nkv
    rep, scale = nh // nkv, at.scale
    pos = torch.arange(T, device=tokens.device)
    causal = pos[None, :] <= pos[:, None]                                  # [T_q, T_k]
    hidden = d.combine(aux)                                                # [B, T, H]
    keys, vals, out = [], [], []
    for j in range(steps):
        e = layer.input_layernorm(d.embed_tokens(shift(tokens, 1 + j)))  # [B, T, H]
        h = layer.hidden_norm(hidden)
        residual = h if d.residual_normed else hidden
        x = torch.cat([e, h], dim=-1)                                      # [B, T, 2H]: embedding first
        q, k, v = (t.view(B, T, *t.shape[1:]) for t in at.qkv(x.view(B * T, -1), (pos + j).repeat(B)))
        q = q.transpose(1, 2)                                              # [B, nh, T, hd]
        keys.append(k.repeat_interleave(rep, 2).transpose(1, 2))          # [B, nh, T, hd]
        vals.append(v.repeat_interleave(rep, 2).transpose(1, 2))
        s0 = (q @ keys[0].transpose(-1, -2)) * scale                       # [B, nh, T, T]: context keys
        s0 = s0.masked_fill(~causal, float("-inf"))
        diag = [(q * keys[i]).sum(-1, keepdim=True) * scale for i in range(1, j + 1)]  # j x [B, nh, T, 1]
        p = torch.softmax(torch.cat([s0, *diag], dim=-1).float(), dim=-1).to(q.dtype)
        o = p[..., :T] @ vals[0]
        for i in range(1, j + 1):
            o = o + p[..., T + i - 1:T + i] * vals[i]
        o = o.transpose(1, 2).reshape(B, T, -1)
        xr = residual + at.o_proj(o)
        pre = xr + layer.mlp(layer.post_attention_layernorm(xr))          # [B, T, H]
        post = d.norm(pre)
        head_in = pre if (d.cfg.norm_output_meaning == "lm_head" and not d.cfg.norm_output) else post
        out.append(d.lm_head(head_in if select is None else head_in[select[j]]))
        hidden = post if (d.cfg.norm_output and d.cfg.norm_output_meaning == "next_step") else pre
    return out
