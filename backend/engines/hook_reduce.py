"""What the in-engine hooks of vLLM (backend/engines/vllm_worker.py) and SGLang (backend/engines/sglang_hooks.py)
share: a layer output's boundary value and the plan that puts the first tokens of each sequence of a flat batch into
the raw sample. It runs inside the engines' processes, so it imports torch and backend.stats only."""

from __future__ import annotations

import torch

from backend.stats import TokenSample


def layer_out(out) -> torch.Tensor:
    """A decoder layer's boundary value: `hidden + residual` of a fused-residual layer's `(hidden, residual)`
    (vLLM, SGLang), the hidden itself when there is no residual (the first layer's input, HF)."""
    if isinstance(out, tuple):
        h, r = out[0], out[1] if len(out) > 1 else None
        return h if r is None else h + r
    return out


def plan_sample(pos: torch.Tensor, ids: torch.Tensor, sample: TokenSample) -> tuple[torch.Tensor | None, list]:
    """Which rows of a flat batch go to the sample: the first tokens of each sequence that starts in it
    (position 0; a continuing chunk of a longer prompt starts at a later position and is left out), at most
    `per_seq` per sequence, while the sample has room. pos, ids: [T] on the CPU. Returns (row indices or None,
    [(token ids, k)] to commit per sequence, in order)."""
    if pos.numel() == 0:
        return None, []
    starts = [0] + (torch.nonzero(pos[1:] != pos[:-1] + 1).flatten() + 1).tolist()
    ends = starts[1:] + [len(pos)]
    take, segs, room = [], [], sample.capacity - sample.n
    for s, e in zip(starts, ends):
        if int(pos[s]) != 0 or room <= 0:
            continue
        k = min(e - s, sample.per_seq, room)
        take.append(torch.arange(s, s + k))
        segs.append((ids[s:s + k], k))
        room -= k
    return (torch.cat(take) if take else None), segs


def stage_rows(sample: TokenSample, k: int, x: torch.Tensor, take: torch.Tensor) -> None:
    """Copy rows `take` of boundary k's [.., H] into the sample's next free slots (asynchronous from a GPU)."""
    rows = x.reshape(-1, x.shape[-1]).index_select(0, take)
    sample.data[k, sample.n:sample.n + rows.shape[0]].copy_(rows, non_blocking=sample.pinned)
