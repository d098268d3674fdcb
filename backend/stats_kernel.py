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

The norm histogram stays `torch.histc` on the [T] log-norms (StreamingStats.update_pair). Every sum is taken in a
fixed order that depends only on the batch's shape, never on timing or atomics. Memory is the batch's column-block
partial norms and the groups' partial sums: a few MiB for 16,384 tokens x 4096, bounded by the batch, not by the
tokens captured.

Triton comes with CUDA builds of torch; this module imports it at once, so callers import the module lazily and
keep `StreamingStats.update` where it is missing (the CPU build). `TRITON_INTERPRET=1` runs the same kernels on
CPU tensors (the tests do)."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

BLOCK_T, BLOCK_H = 16, 128  # a tile of the batch: rows x columns
ROW_BLOCK = 256             # rows per program when the row norms are finished
MAX_GROUPS = 32             # row groups per batch: enough programs to fill a GPU beside the column blocks
NRB_BLOCK = 64              # row blocks the scalar reduction sums a step (64 x ROW_BLOCK = 16,384 rows in one step)


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
def _group_sums(h_ptr, r_ptr, ref_ptr, sq_ptr, norm_ptr, part_ptr, cols, cmask, cb, g, T, H, sh, sr, rows_per_group,
                HAS_R: tl.constexpr, ROUND: tl.constexpr, MASKED: tl.constexpr, BT: tl.constexpr,
                BH: tl.constexpr):
    """Column sums of d, d^2, d^3, d^4 and max |x| over the rows of group g, elementwise in the tile and reduced once
    at the end; the row partial squares too unless MASKED (then the rows whose norm is not finite are left out)."""
    ref = tl.load(ref_ptr + cols, mask=cmask, other=0.0)
    a1 = tl.zeros([BT, BH], dtype=tl.float32)
    a2 = tl.zeros([BT, BH], dtype=tl.float32)
    a3 = tl.zeros([BT, BH], dtype=tl.float32)
    a4 = tl.zeros([BT, BH], dtype=tl.float32)
    am = tl.zeros([BT, BH], dtype=tl.float32)
    lo = g * rows_per_group
    hi = tl.minimum(lo + rows_per_group, T)
    for t0 in range(lo, hi, BT):
        rows = t0 + tl.arange(0, BT)
        rmask = rows < hi
        if MASKED:
            norm = tl.load(norm_ptr + rows, mask=rmask, other=float("nan"))
            rmask = rmask & (norm == norm) & (norm < float("inf"))
        m = rmask[:, None] & cmask[None, :]
        x = _load(h_ptr, r_ptr, rows, cols, m, sh, sr, HAS_R, ROUND)
        if not MASKED:
            tl.store(sq_ptr + cb * T + rows, tl.sum(x * x, axis=1), mask=rmask)
        d = tl.where(m, x - ref[None, :], 0.0)
        d2 = d * d
        a1 += d
        a2 += d2
        a3 += d2 * d
        a4 += d2 * d2
        am = tl.maximum(am, tl.where(m, tl.abs(x), 0.0))
    base = part_ptr + g * 5 * H + cols
    tl.store(base, tl.sum(a1, axis=0), mask=cmask)
    tl.store(base + H, tl.sum(a2, axis=0), mask=cmask)
    tl.store(base + 2 * H, tl.sum(a3, axis=0), mask=cmask)
    tl.store(base + 3 * H, tl.sum(a4, axis=0), mask=cmask)
    tl.store(base + 4 * H, tl.max(am, axis=0), mask=cmask)


@triton.jit(do_not_specialize=["T", "rows_per_group"])
def _tile_moments(h_ptr, r_ptr, ref_ptr, sq_ptr, part_ptr, T, H, sh, sr, rows_per_group,
                  HAS_R: tl.constexpr, ROUND: tl.constexpr, BT: tl.constexpr, BH: tl.constexpr):
    cb = tl.program_id(0)
    g = tl.program_id(1)
    cols = cb * BH + tl.arange(0, BH)
    _group_sums(h_ptr, r_ptr, ref_ptr, sq_ptr, sq_ptr, part_ptr, cols, cols < H, cb, g, T, H, sh, sr, rows_per_group,
                HAS_R, ROUND, False, BT, BH)


@triton.jit(do_not_specialize=["T"])
def _rows(sq_ptr, norm_ptr, logn_ptr, rs_ptr, T, n_cb, RB: tl.constexpr, NCB: tl.constexpr):
    rb = tl.program_id(0)
    rows = rb * RB + tl.arange(0, RB)
    rmask = rows < T
    cbs = tl.arange(0, NCB)
    sq = tl.load(sq_ptr + cbs[:, None] * T + rows[None, :], mask=(cbs[:, None] < n_cb) & rmask[None, :], other=0.0)
    norm = tl.sqrt(tl.sum(sq, axis=0))
    good = rmask & (norm == norm) & (norm < float("inf"))
    fin = tl.where(good, norm, 0.0)
    tl.store(norm_ptr + rows, norm, mask=rmask)
    tl.store(logn_ptr + rows, tl.where(good, tl.log2(tl.maximum(fin, 1e-30)) * 0.3010299956639812, -1e9), mask=rmask)
    base = rs_ptr + rb * 6
    tl.store(base, tl.sum(good.to(tl.float32), axis=0))
    tl.store(base + 1, tl.sum((rmask & ~good).to(tl.float32), axis=0))
    tl.store(base + 2, tl.sum(fin, axis=0))
    tl.store(base + 3, tl.sum(fin * fin, axis=0))
    tl.store(base + 4, tl.min(tl.where(good, norm, float("inf")), axis=0))
    tl.store(base + 5, tl.max(fin, axis=0))


@triton.jit(do_not_specialize=["T", "rows_per_group", "n_rb"])
def _fixup(h_ptr, r_ptr, ref_ptr, norm_ptr, rs_ptr, part_ptr, T, H, sh, sr, rows_per_group, n_rb,
           HAS_R: tl.constexpr, ROUND: tl.constexpr, BT: tl.constexpr, BH: tl.constexpr, RB: tl.constexpr):
    cb = tl.program_id(0)
    g = tl.program_id(1)
    bad = 0.0
    for rb in range(g * (rows_per_group // RB), tl.minimum((g + 1) * (rows_per_group // RB), n_rb)):
        bad += tl.load(rs_ptr + rb * 6 + 1)
    if bad > 0:
        cols = cb * BH + tl.arange(0, BH)
        _group_sums(h_ptr, r_ptr, ref_ptr, norm_ptr, norm_ptr, part_ptr, cols, cols < H, cb, g, T, H, sh, sr,
                    rows_per_group, HAS_R, ROUND, True, BT, BH)


@triton.jit(do_not_specialize=["n_g", "n_rb"])
def _reduce(part_ptr, rs_ptr, mom_ptr, maxabs_ptr, scal_ptr, nmin_ptr, nmax_ptr, H, n_g, n_cb, n_rb,
            BH: tl.constexpr, NG: tl.constexpr, NRB: tl.constexpr):
    cb = tl.program_id(0)
    if cb < n_cb:
        cols = cb * BH + tl.arange(0, BH)
        gi = tl.arange(0, NG)
        m = (gi[:, None] < n_g) & (cols[None, :] < H)
        at = part_ptr + gi[:, None] * 5 * H + cols[None, :]
        for k in tl.static_range(4):
            p = tl.load(at + k * H, mask=m, other=0.0).to(tl.float64)
            old = tl.load(mom_ptr + k * H + cols, mask=cols < H, other=0.0)
            tl.store(mom_ptr + k * H + cols, old + tl.sum(p, axis=0), mask=cols < H)
        mx = tl.max(tl.load(at + 4 * H, mask=m, other=0.0), axis=0)
        old = tl.load(maxabs_ptr + cols, mask=cols < H, other=0.0)
        tl.store(maxabs_ptr + cols, tl.maximum(old, mx), mask=cols < H)
    else:
        for s in range(0, n_rb, NRB):          # NRB row blocks at a time: no constant depends on the batch size
            ri = s + tl.arange(0, NRB)
            rm = ri < n_rb
            for k in tl.static_range(4):
                v = tl.load(rs_ptr + ri * 6 + k, mask=rm, other=0.0).to(tl.float64)
                tl.store(scal_ptr + k, tl.load(scal_ptr + k) + tl.sum(v, axis=0))
            lo = tl.min(tl.load(rs_ptr + ri * 6 + 4, mask=rm, other=float("inf")), axis=0)
            hi = tl.max(tl.load(rs_ptr + ri * 6 + 5, mask=rm, other=0.0), axis=0)
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
    """Rows per group for a batch of t tokens: at most MAX_GROUPS groups, each a whole number of ROW_BLOCKs."""
    per = -(-t // MAX_GROUPS)
    return max(ROW_BLOCK, -(-per // ROW_BLOCK) * ROW_BLOCK)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def update(state, i: int, h: torch.Tensor, r: torch.Tensor | None) -> torch.Tensor | None:
    """Add the tokens of `h + r` (or h) [T, H] to boundary i of a StatsState whose reference shift is set, all but the
    norm histogram: returns the tokens' log10 norms (non-finite ones far below the histogram's range) for the caller
    to bin, None for an empty batch. The sum is rounded to h's dtype before anything is read from it, as the engine's
    own `hidden + residual` is."""
    h = h.reshape(-1, h.shape[-1])
    if h.stride(-1) != 1:
        h = h.contiguous()
    if r is not None:
        r = r.reshape(-1, r.shape[-1])
        if r.stride(-1) != 1 or r.dtype != h.dtype:
            r = r.to(h.dtype).contiguous()
    T, H = h.shape
    if T == 0:
        return None
    per = rows_per_group(T)
    n_g, n_cb, n_rb = -(-T // per), -(-H // BLOCK_H), -(-T // ROW_BLOCK)
    dev = h.device
    sq = torch.empty(n_cb, T, dtype=torch.float32, device=dev)
    part = torch.empty(n_g, 5, H, dtype=torch.float32, device=dev)
    norm = torch.empty(T, dtype=torch.float32, device=dev)
    logn = torch.empty(T, dtype=torch.float32, device=dev)
    rs = torch.empty(n_rb, 6, dtype=torch.float32, device=dev)
    rr = h if r is None else r
    has_r, rnd = r is not None, _round_code(h.dtype)
    ref = state.ref[i]
    _tile_moments[(n_cb, n_g)](h, rr, ref, sq, part, T, H, h.stride(0), rr.stride(0), per,
                               HAS_R=has_r, ROUND=rnd, BT=BLOCK_T, BH=BLOCK_H)
    _rows[(n_rb,)](sq, norm, logn, rs, T, n_cb, RB=ROW_BLOCK, NCB=_pow2(n_cb))
    _fixup[(n_cb, n_g)](h, rr, ref, norm, rs, part, T, H, h.stride(0), rr.stride(0), per, n_rb,
                        HAS_R=has_r, ROUND=rnd, BT=BLOCK_T, BH=BLOCK_H, RB=ROW_BLOCK)
    # the block sizes are fixed (at most MAX_GROUPS groups; NRB_BLOCK row blocks a step), not powers of two of this
    # batch's counts: a constant that followed the batch size would make Triton build the kernel again for each new
    # size class, inside an engine's timed forward passes (the likely cause of the 0.2-1 s excursions of timed runs
    # on an H100 on 2026-12-07; vLLM's JIT monitor logs only the first build of each kernel)
    _reduce[(n_cb + 1,)](part, rs, state.moments[i], state.max_abs[i], state.scalars[i], state.norm_min[i:i + 1],
                         state.norm_max[i:i + 1], H, n_g, n_cb, n_rb, BH=BLOCK_H, NG=MAX_GROUPS, NRB=NRB_BLOCK)
    return logn
