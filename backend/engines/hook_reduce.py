"""What the in-engine hooks of vLLM (backend/engines/vllm_worker.py) and SGLang (backend/engines/sglang_hooks.py)
share: a layer output's boundary value and the plan that puts the first tokens of each sequence of a flat batch into
the raw sample. It runs inside the engines' processes, so it imports torch and backend.stats only."""

from __future__ import annotations

import torch

from backend.stats import _MOD, _MUL, TokenSample


def layer_pair(out) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A decoder layer's output as (hidden, residual) of a fused-residual layer (vLLM, SGLang), (hidden, None) when
    there is no residual (the first layer's input, HF). The boundary value is their sum, rounded to their dtype."""
    if isinstance(out, tuple):
        return out[0], (out[1] if len(out) > 1 else None)
    return out, None


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


def _walk(sample: TokenSample, h: int, P: list[int], Q: list[int], r: int, e: int) -> tuple[int, int, list]:
    """Rows r.. (to the end e of their run of positions) that go on a planned prefix with context hash h:
    (the row after the last one, the hash there, the (position, hash) key of each row)."""
    keys, t = [], r
    while t < e:
        h2 = (h * _MUL + Q[t] + 1) % _MOD
        if (P[t], h2) not in sample.keys:
            break
        keys.append((P[t], h2))
        h, t = h2, t + 1
    return t, h, keys


def _chunk_ends(sample: TokenSample, P: list[int], Q: list[int], t: int, h: int, e: int, depth: int) -> bool:
    """Whether a sequence matched up to row t (hash h) can end its chunk there: at the end of the run of
    positions, where a planned prompt's tokens end, or where another sequence's next chunk starts."""
    return t == e or (P[t - 1], h) in sample.ends or _resume(sample, P, Q, t, e, depth + 1) is not None


def _resume(sample: TokenSample, P: list[int], Q: list[int], r: int, e: int, depth: int = 0):
    """(hash before, row after, hash after, keys) for the sequence whose next prefill chunk starts at row r: one
    seen before up to position P[r] - 1 with planned tokens after it (`sample.open`) whose planned tokens the rows
    follow to the end of this chunk (so a sequence that merely shares a token there is not taken for it); the
    longest such match, None if there is none. Sequences with the same prefix share a hash, so which of them it
    is does not matter."""
    waiting = sample.open.get(P[r])
    if not waiting or depth > 4:
        return None
    best = None
    for h in sorted(waiting):
        t, h2, keys = _walk(sample, h, P, Q, r, e)
        if t > r and (best is None or t > best[1]) and _chunk_ends(sample, P, Q, t, h2, e, depth):
            best = (h, t, h2, keys)
    return best


def plan_rows(pos: torch.Tensor, ids: torch.Tensor, sample: TokenSample) -> list[tuple[int, int, int]]:
    """Where the rows of a flat batch go in a planned sample (TokenSample.plan): [(first row, first slot, count)],
    runs of consecutive rows into consecutive slots. A row's slot follows from its sequence's tokens up to it
    (position and context hash), never from where the sequence sits in the batch or in which forward pass it
    runs, so any batching of the same prompts fills the same slots with the same tokens. A sequence whose prefill
    is split into chunks is followed from one chunk to the next by its context hash (`sample.open`); two
    sequences adjacent in the batch whose positions happen to run on are told apart where the first stops
    following its plan and the second's continues one. pos, ids: [T] on the CPU."""
    T = int(pos.numel())
    if T == 0 or not sample.wants():
        return []
    P, Q = pos.tolist(), ids.tolist()
    pairs: list[tuple[int, int]] = []          # (row, slot)
    s = 0
    while s < T:
        e = s + 1                              # [s, e): a run of consecutive positions
        while e < T and P[e] == P[e - 1] + 1:
            e += 1
        r = s
        while r < e:
            if P[r] == 0:                      # a sequence starts: its prefix is all here
                t, h, keys = _walk(sample, 0, P, Q, r, e)
            else:
                found = _resume(sample, P, Q, r, e)
                if found is None:              # not (the rest of) a planned prompt
                    r += 1
                    continue
                h0, t, h, keys = found
                waiting = sample.open[P[r]]
                waiting[h0] -= 1
                if waiting[h0] == 0:
                    del waiting[h0]
            for row, key in enumerate(keys, start=r):
                pairs += [(row, j) for j in sample.fill(key)]
            if t > r and (P[t - 1], h) in sample.follows and (t == e or _resume(sample, P, Q, t, e) is not None):
                # this chunk of the sequence ends here and its planned tokens go on in a later forward pass
                waiting = sample.open.setdefault(P[t - 1] + 1, {})
                waiting[h] = waiting.get(h, 0) + 1
            r = max(t, r + 1)
        s = e
    runs: list[tuple[int, int, int]] = []
    for row, slot in sorted(pairs, key=lambda p: (p[1], p[0])):
        if runs and runs[-1][0] + runs[-1][2] == row and runs[-1][1] + runs[-1][2] == slot:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((row, slot, 1))
    return runs


def stage_runs(sample: TokenSample, k: int, x: torch.Tensor, runs: list[tuple[int, int, int]]) -> None:
    """Copy boundary k's rows into their planned slots (plan_rows' runs; asynchronous from a GPU)."""
    x = x.reshape(-1, x.shape[-1])
    for row, slot, n in runs:
        sample.data[k, slot:slot + n].copy_(x[row:row + n], non_blocking=sample.pinned)
