"""One boundary's statistics update on the GPU in one pass over the batch (Triton), for the engines' hooks.

`StreamingStats.update` materialises `hidden + residual`, then runs a compiled reduction and about eight small kernels
per boundary and forward pass. Here the layer's `(hidden, residual)` pair is read once, in tiles of whole columns
over a group of rows, and everything the statistics need comes out of that one read:

1. `_tile_moments` (grid: column blocks x row groups) rounds `hidden + residual` to the layer's dtype as the engine
   does, then keeps, per row group, the column sums of d, d^2, d^3, d^4 (d = x - ref) and max |x|, and per row the
   partial sum of squares of its column block;
2. `_rows` (grid: row groups) adds each row's partial sums of squares in a fixed order into its norm, writes
   log10(norm) for the histogram (as log2(norm) x log10(2): a token within an ulp of a bin edge may fall in the
   neighbouring bin, against torch.log10) and the group's token count, norm sums, minimum and maximum, and whether
   the group holds a non-finite token;
3. `_fixup` (same grid as 1) redoes, for a group that holds a non-finite token only, its column sums without that
   token (every other group leaves at once), so a NaN never reaches the moments;
4. `_reduce` (grid: column blocks, plus one program for the scalars) adds the groups' partial sums in a fixed order,
   in fp64, into the boundary's running state.

The norm histogram stays `torch.histc` on the [T] log-norms. Every sum is taken in a fixed order that depends only on
the batch's shape, never on timing or atomics. Memory is the batch's column-block partial norms and the groups'
partial sums: a few MiB for 16,384 tokens x 4096, bounded by the batch, not by the tokens captured.

Triton comes with CUDA builds of torch; this module imports it at once, so callers import the module lazily and
keep `StreamingStats.update` where it is missing (the CPU build). `TRITON_INTERPRET=1` runs the same kernels on
CPU tensors (the tests do)."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

BLOCK_T, BLOCK_H = 32, 128
MAX_GROUPS = 16           # row groups per batch: enough programs to fill a GPU beside the column blocks


@triton.jit
def _load(h_ptr, r_ptr, rows, cols, m, sh, sr, HAS_R: tl.constexpr, ROUND: tl.constexpr):
    x = tl.load(h_ptr + rows[:, None] * sh + cols[None, :], mask=m, other=0.0).to(tl.float32)
    if HAS_R:
        r = tl.load(r_ptr + rows[:, None] * sr + cols[None, :], mask=m, other=0.0).to(tl.float32)
        x = x + r
        if ROUND == 1:
            x = x.to(tl.bfloat16).to(tl.float32)
        elif ROUND == 2:
            x = x.to(tl.float16).to(tl.float32)
    return x

@triton.jit
def _tile_moments(h_ptr, r_ptr, ref_ptr, sq_ptr, part_ptr, T, H, sh, sr, rows_per_group,
                  HAS_R: tl.constexpr, ROUND: tl.constexpr, BT: tl.constexpr, BH: tl.constexpr):
    cb = tl.program_id(0)
    g = tl.program_id(1)
    cols = cb * BH + tl.arange(0, BH)
    cmask = cols < H
    ref = tl.load(ref_ptr + cols, mask=cmask, other=0.0)
    s1 = tl.zeros([BH], dtype=tl.float32)
    s2 = tl.zeros([BH], dtype=tl.float32)
    s3 = tl.zeros([BH], dtype=tl.float32)
    s4 = tl.zeros([BH], dtype=tl.float32)
    mx = tl.zeros([BH], dtype=tl.float32)
    lo = g * rows_per_group
    hi = tl.minimum(lo + rows_per_group, T)
    for t0 in range(lo, hi, BT):
        rows = t0 + tl.arange(0, BT)
        rmask = rows < hi
        m = rmask[:, None] & cmask[None, :]
        x = _load(h_ptr, r_ptr, rows, cols, m, sh, sr, HAS_R, ROUND)
        tl.store(sq_ptr + cb * T + rows, tl.sum(x * x, axis=1), mask=rmask)
        d = tl.where(m, x - ref[None, :], 0.0)
        d2 = d * d
        s1 += tl.sum(d, axis=0)
        s2 += tl.sum(d2, axis=0)
        s3 += tl.sum(d2 * d, axis=0)
        s4 += tl.sum(d2 * d2, axis=0)
        mx = tl.maximum(mx, tl.max(tl.where(m, tl.abs(x), 0.0), axis=0))
    base = part_ptr + g * 5 * H + cols
    tl.store(base, s1, mask=cmask)
    tl.store(base + H, s2, mask=cmask)
    tl.store(base + 2 * H, s3, mask=cmask)
    tl.store(base + 3 * H, s4, mask=cmask)
    tl.store(base + 4 * H, mx, mask=cmask)

@triton.jit
def _rows(sq_ptr, norm_ptr, logn_ptr, gs_ptr, T, n_cb, rows_per_group, BT: tl.constexpr):
    g = tl.program_id(0)
    lo = g * rows_per_group
    hi = tl.minimum(lo + rows_per_group, T)
    n_good = tl.zeros([BT], dtype=tl.float32)
    n_bad = tl.zeros([BT], dtype=tl.float32)
    s_n = tl.zeros([BT], dtype=tl.float32)
    s_n2 = tl.zeros([BT], dtype=tl.float32)
    n_min = tl.full([BT], float("inf"), dtype=tl.float32)
    n_max = tl.zeros([BT], dtype=tl.float32)
    for t0 in range(lo, hi, BT):
        rows = t0 + tl.arange(0, BT)
        rmask = rows < hi
        acc = tl.zeros([BT], dtype=tl.float32)
        for cb in range(0, n_cb):
            acc += tl.load(sq_ptr + cb * T + rows, mask=rmask, other=0.0)
        norm = tl.sqrt(acc)
        good = rmask & (norm == norm) & (norm < float("inf"))
        fin = tl.where(good, norm, 0.0)
        tl.store(norm_ptr + rows, norm, mask=rmask)
        logn = tl.where(good, tl.log2(tl.maximum(fin, 1e-30)) * 0.3010299956639812, -1e9)
        tl.store(logn_ptr + rows, logn, mask=rmask)
        n_good += good.to(tl.float32)
        n_bad += (rmask & ~good).to(tl.float32)
        s_n += fin
        s_n2 += fin * fin
        n_min = tl.minimum(n_min, tl.where(good, norm, float("inf")))
        n_max = tl.maximum(n_max, fin)
    base = gs_ptr + g * 6
    tl.store(base, tl.sum(n_good, axis=0))
    tl.store(base + 1, tl.sum(n_bad, axis=0))
    tl.store(base + 2, tl.sum(s_n, axis=0))
    tl.store(base + 3, tl.sum(s_n2, axis=0))
    tl.store(base + 4, tl.min(n_min, axis=0))
    tl.store(base + 5, tl.max(n_max, axis=0))

@triton.jit
def _fixup(h_ptr, r_ptr, ref_ptr, norm_ptr, gs_ptr, part_ptr, T, H, sh, sr, rows_per_group,
           HAS_R: tl.constexpr, ROUND: tl.constexpr, BT: tl.constexpr, BH: tl.constexpr):
    cb = tl.program_id(0)
    g = tl.program_id(1)
    if tl.load(gs_ptr + g * 6 + 1) > 0:
        cols = cb * BH + tl.arange(0, BH)
        cmask = cols < H
        ref = tl.load(ref_ptr + cols, mask=cmask, other=0.0)
        s1 = tl.zeros([BH], dtype=tl.float32)
        s2 = tl.zeros([BH], dtype=tl.float32)
        s3 = tl.zeros([BH], dtype=tl.float32)
        s4 = tl.zeros([BH], dtype=tl.float32)
        mx = tl.zeros([BH], dtype=tl.float32)
        lo = g * rows_per_group
        hi = tl.minimum(lo + rows_per_group, T)
        for t0 in range(lo, hi, BT):
            rows = t0 + tl.arange(0, BT)
            norm = tl.load(norm_ptr + rows, mask=rows < hi, other=float("nan"))
            good = (rows < hi) & (norm == norm) & (norm < float("inf"))
            m = good[:, None] & cmask[None, :]
            x = _load(h_ptr, r_ptr, rows, cols, m, sh, sr, HAS_R, ROUND)
            d = tl.where(m, x - ref[None, :], 0.0)
            d2 = d * d
            s1 += tl.sum(d, axis=0)
            s2 += tl.sum(d2, axis=0)
            s3 += tl.sum(d2 * d, axis=0)
            s4 += tl.sum(d2 * d2, axis=0)
            mx = tl.maximum(mx, tl.max(tl.where(m, tl.abs(x), 0.0), axis=0))
        base = part_ptr + g * 5 * H + cols
        tl.store(base, s1, mask=cmask)
        tl.store(base + H, s2, mask=cmask)
        tl.store(base + 2 * H, s3, mask=cmask)
        tl.store(base + 3 * H, s4, mask=cmask)
        tl.store(base + 4 * H, mx, mask=cmask)

@triton.jit
def _reduce(part_ptr, gs_ptr, mom_ptr, maxabs_ptr, scal_ptr, nmin_ptr, nmax_ptr, H, n_g, n_cb,
            BH: tl.constexpr, BG: tl.constexpr):
    cb = tl.program_id(0)
    if cb < n_cb:
        cols = cb * BH + tl.arange(0, BH)
        cmask = cols < H
        for k in range(0, 4):
            acc = tl.zeros([BH], dtype=tl.float64)
            for g in range(0, n_g):
                acc += tl.load(part_ptr + g * 5 * H + k * H + cols, mask=cmask, other=0.0).to(tl.float64)
            old = tl.load(mom_ptr + k * H + cols, mask=cmask, other=0.0)
            tl.store(mom_ptr + k * H + cols, old + acc, mask=cmask)
        mx = tl.load(maxabs_ptr + cols, mask=cmask, other=0.0)
        for g in range(0, n_g):
            mx = tl.maximum(mx, tl.load(part_ptr + g * 5 * H + 4 * H + cols, mask=cmask, other=0.0))
        tl.store(maxabs_ptr + cols, mx, mask=cmask)
    else:
        gi = tl.arange(0, BG)
        gm = gi < n_g
        for k in range(0, 4):
            acc = tl.zeros([BG], dtype=tl.float64)
            acc += tl.load(gs_ptr + gi * 6 + k, mask=gm, other=0.0).to(tl.float64)
            tl.store(scal_ptr + k, tl.load(scal_ptr + k) + tl.sum(acc, axis=0))
        lo = tl.min(tl.load(gs_ptr + gi * 6 + 4, mask=gm, other=float("inf")), axis=0)
        hi = tl.max(tl.load(gs_ptr + gi * 6 + 5, mask=gm, other=0.0), axis=0)
        tl.store(nmin_ptr, tl.minimum(tl.load(nmin_ptr), lo))
        tl.store(nmax_ptr, tl.maximum(tl.load(nmax_ptr), hi))


def available(device: torch.device | str) -> bool:
    """Whether the one-pass update runs here: a CUDA device with Triton (or Triton's interpreter, for tests), unless
    SPECLENS_FUSED=0."""
    if os.environ.get("SPECLENS_FUSED", "1") == "0":
        return False
    dev = torch.device(device)
    if dev.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    return True


def _round_code(dtype: torch.dtype) -> int:
    return {torch.bfloat16: 1, torch.float16: 2}.get(dtype, 0)


def rows_per_group(t: int) -> int:
    """Rows per group for a batch of t tokens: at most MAX_GROUPS groups, each a whole number of row tiles."""
    per = -(-t // MAX_GROUPS)
    return max(BLOCK_T, -(-per // BLOCK_T) * BLOCK_T)


def update(state, i: int, h: torch.Tensor, r: torch.Tensor | None) -> None:
    """Add the tokens of `h + r` (or h) [T, H] to boundary i of a StatsState whose reference shift is set. The sum is
    rounded to h's dtype before anything is read from it, as the engine's own `hidden + residual` is."""
    from backend.stats import NORM_BINS, NORM_HI, NORM_LO

    h = h.reshape(-1, h.shape[-1])
    if h.stride(-1) != 1:
        h = h.contiguous()
    if r is not None:
        r = r.reshape(-1, r.shape[-1])
        if r.stride(-1) != 1 or r.dtype != h.dtype:
            r = r.to(h.dtype).contiguous()
    T, H = h.shape
    if T == 0:
        return
    per = rows_per_group(T)
    n_g = -(-T // per)
    n_cb = -(-H // BLOCK_H)
    dev = h.device
    sq = torch.empty(n_cb, T, dtype=torch.float32, device=dev)
    part = torch.empty(n_g, 5, H, dtype=torch.float32, device=dev)
    norm = torch.empty(T, dtype=torch.float32, device=dev)
    logn = torch.empty(T, dtype=torch.float32, device=dev)
    gs = torch.empty(n_g, 6, dtype=torch.float32, device=dev)
    rr = h if r is None else r
    has_r, rnd = r is not None, _round_code(h.dtype)
    ref = state.ref[i]
    _tile_moments[(n_cb, n_g)](h, rr, ref, sq, part, T, H, h.stride(0), rr.stride(0), per,
                      HAS_R=has_r, ROUND=rnd, BT=BLOCK_T, BH=BLOCK_H)
    _rows[(n_g,)](sq, norm, logn, gs, T, n_cb, per, BT=256)
    _fixup[(n_cb, n_g)](h, rr, ref, norm, gs, part, T, H, h.stride(0), rr.stride(0), per,
                       HAS_R=has_r, ROUND=rnd, BT=BLOCK_T, BH=BLOCK_H)
    _reduce[(n_cb + 1,)](part, gs, state.moments[i], state.max_abs[i], state.scalars[i], state.norm_min[i:i + 1],
                        state.norm_max[i:i + 1], H, n_g, n_cb, BH=BLOCK_H, BG=MAX_GROUPS)
    state.norm_hist[i] += torch.histc(logn, bins=NORM_BINS, min=NORM_LO, max=NORM_HI)
