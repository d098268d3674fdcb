"""Layer alignment of two captures: which boundary of A matches which boundary of B, and why not.

On the tokens both raw samples share (same token in the same context, by context hash), over every
pair of boundaries: mean per-token cosine, mean per-token relative L2 (||a - b|| / ||b||) and linear
CKA; a best-match path; and a verdict (aligned, offset, mislabelled, final_norm, rotation, drift) as `Finding`
objects, which backend/text/align_text.py words for the command line and the pages.

Final norm without F on the other side: a state y is named F when a per-dimension weight w fitted by least squares
(w_d = sum_t y_td z_td / sum_t z_td^2, z = RMSNorm(x), x the other side's S_N) gives y ~ w * z to a small relative
L2, clearly better than the same fit without the norm (y ~ w * x). That comparison is scale-aware: cosine alone is
blind to a unit-weight RMSNorm (docs/CONVENTIONS.md#boundaries), and a genuine S_N is fitted by w * x exactly. With the
target's model directory in a manifest, the fitted weight is checked against its own final norm weight.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from backend import coords
from backend.errors import SpecLensError
from backend.runs.manifest import ModelInfo
from backend.store.data_root import DataRoot
from backend.store.rundir import COMPLETE

if TYPE_CHECKING:  # torch is imported where tensors are made, so a cached alignment loads without it
    import torch

# CKA on all tokens costs tokens^2 x hidden x boundaries multiply-adds (4.5e12 for 33 + 33 boundaries x 4096 tokens
# x 4096 dims): exact on a GPU and wherever it fits this budget, else estimated from CKA_BUDGET / (tokens x hidden x
# boundaries) Gram rows (136 at that size), with its standard error (cka_matrix)
CKA_BUDGET = 1.5e11
CKA_MIN_ROWS = 64
_CKA_BLOCK_BYTES = {True: 1 << 28, False: 1 << 30}   # Gram rows held at once (fp32), on CPU / on a GPU
CKA_SE_BOUND = 4.0         # stated bound: |estimate - CKA on all tokens| <= CKA_SE_BOUND x its standard error
MATCH_COS = 0.9            # below this best cosine a boundary "matches nothing"
ALIGNED_COS = 0.999        # same-label pairs at least this close are numerically the same state
DRIFT_REL_L2 = 0.01        # a same-label relative L2 above this is drift
# ... unless both captures hold the same 16-bit dtype: two engines' kernels round differently (measured on the
# H200, toy target, bf16: vLLM and SGLang hooks vs HF hooks 0.5% at S_1 growing to 1.05% at F, docs/PERFORMANCE.md);
# a dtype or quantization change between the sides keeps the strict limit
DRIFT_REL_L2_SAME_16BIT = 0.03
SIXTEEN_BIT = {"bf16", "bfloat16", "fp16", "float16", "torch.bfloat16", "torch.float16"}
ROTATION_COS, ROTATION_CKA = 0.5, 0.95
NORM_FIT_REL_L2 = 0.05     # y ~ w * RMSNorm(S_N) to at most this relative L2 (bf16 vs fp32 F: about 0.015) ...
NORM_FIT_MARGIN = 0.5      # ... and at most this fraction of the fit without the norm (y ~ w * S_N)
NORM_WEIGHT_REL = 0.05     # a fitted weight within this relative L2 of the target's final norm weight equals it
DEFAULT_NORM_EPS = 1e-6
_CHUNK = 512
VERSION = 7                # bump when the figures or verdicts change: cached alignments are recomputed


@dataclass
class Sample:
    run_id: str
    labels: list[str]
    states: dict[str, torch.Tensor]   # label -> [n, H]
    ctx_hash: np.ndarray              # [n]
    n_layers: int
    hidden: int
    dtype: str
    model_path: str | None = None     # the manifest's model.path (the target's HF directory, when local)


@dataclass
class Finding:
    """One finding of the verdict, as data: backend/text/align_text.py words it (`finding_sentence`) for the command
    line and the page. `case` says which finding of its kind it is, `figures` what its sentence names:
      rotation: median_cka, median_cosine, shown ([label, cosine, CKA] of the first four same-named boundaries)
      offset: offset (B's boundaries minus A's, one for every pair)
      mislabelled: offsets (one per pair, in pair order)
      final_norm: cosine (of pairs[0]), n_layers
      final_norm_fit: fit (a final_norm_fits entry), weight_is_target (the fitted weight equals the target's own
        final norm weight; None: not compared)
      drift: grow, first, last, worst (labels), rel_first, rel_last, rel_worst, dtype_a, dtype_b
      aligned: boundaries, min_cosine, max_rel_l2, rounding (within the same-16-bit limit only), dtype
      unmatched: unmatched (B's labels matching nothing; `kind` is the first finding's, else drift)
      no_match: nothing
    `notes` (an F labelled F, with no namesake on the other side: side, x, rel_l2_norm_fit) and `nonfinite` ([side,
    label, tokens] of each boundary holding NaN/inf tokens) are noted beside the first finding."""
    kind: str                   # aligned | offset | mislabelled | final_norm | rotation | drift
    pairs: list[list[str]] = field(default_factory=list)
    case: str = ""              # the kind, or final_norm_fit | unmatched | no_match
    figures: dict = field(default_factory=dict)
    notes: list[dict] = field(default_factory=list)
    nonfinite: list[list] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.case = self.case or self.kind


@dataclass
class Alignment:
    a: str
    b: str
    tokens: int
    cka_tokens: int
    a_labels: list[str]
    b_labels: list[str]
    cosine: list[list[float]]
    rel_l2: list[list[float]]
    cka: list[list[float]]
    path: list[dict]
    verdict: list[Finding]
    offset: int | None
    per_boundary: list[dict]
    warnings: list[str]
    norm_fits: list[dict] = field(default_factory=list)   # y ~ w * RMSNorm(S_N) fits (final_norm_fits)
    cka_se: list[list[float]] = field(default_factory=list)   # standard error of each CKA (0 where exact)
    cka_exact: bool = True                                     # CKA on all tokens (else the row estimator)
    cka_definition: str = ""

    @property
    def cka_se_max(self) -> float:
        """The largest standard error of an estimated CKA (0 when every CKA is exact): with `cka_exact`,
        `cka_tokens` (the Gram rows) and CKA_SE_BOUND, how the CKA figures were computed (the page words it in
        dashboard/align_words.py, the command line in backend/__main__.py)."""
        return max((v for row in self.cka_se for v in row if v is not None), default=0.0)

    def to_json(self) -> dict:
        d = asdict(self)
        d["matrices"] = {"cosine": d.pop("cosine"), "rel_l2": d.pop("rel_l2"), "cka": d.pop("cka")}
        return d

    @classmethod
    def from_json(cls, d: dict) -> Alignment:
        d = dict(d)
        m = d.pop("matrices")
        d["verdict"] = [Finding(**f) for f in d["verdict"]]
        return cls(cosine=m["cosine"], rel_l2=m["rel_l2"], cka=m["cka"], **d)


# ---------------------------------------------------------------------------- loading

def load_sample(run_id: str, data: DataRoot | None = None) -> Sample:
    from safetensors import SafetensorError, safe_open

    rd = DataRoot.of(data).run_dir(run_id)
    m = rd.read()
    if rd.effective_status(m) != COMPLETE:
        raise SpecLensError(f"run '{run_id}' is {rd.effective_status(m)}, not complete; resume or re-run it "
                            f"before aligning")
    f = rd.file("sample.safetensors")
    if not f.exists():
        raise SpecLensError(f"{f}: missing raw sample; re-run the capture of '{run_id}'")
    try:
        with safe_open(str(f), framework="pt") as sf:
            keys = set(sf.keys())
            labels = coords.sort_labels([lbl for lbl in m.boundaries or [] if lbl in keys])
            if not labels or "ctx_hash" not in keys:
                raise SpecLensError(f"{f}: no boundary tensors or token hashes in the sample; re-run the capture of "
                                    f"'{run_id}'")
            ctx = sf.get_tensor("ctx_hash").numpy()
            states = _map_states(f, labels) or {lbl: sf.get_tensor(lbl) for lbl in labels}
    except (SafetensorError, OSError, ValueError, json.JSONDecodeError, KeyError) as e:
        raise SpecLensError(f"{f}: corrupt safetensors file ({e}); re-run the capture of '{run_id}'") from e
    model = m.model or ModelInfo()
    return Sample(run_id, labels, states, ctx, int(model.n_layers or 0), int(states[labels[0]].shape[-1]),
                  str(m.dtype), model.path)


_ST_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}


def _map_states(f: Path, labels: list[str]) -> dict[str, torch.Tensor] | None:
    """The labels' [n, H] tensors as views of one private memory map of the file: nothing is copied and no fresh
    memory is touched (the pages stay the page cache's; a write to one would copy that page, never reach the file).
    None when one is not a 2-D tensor of a float dtype or the file cannot be mapped (then they are read one by one)."""
    import mmap
    import os

    import torch

    with open(f, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(size))
        metas = [header[lbl] for lbl in labels]
        if any(len(x["shape"]) != 2 or x["dtype"] not in _ST_DTYPES for x in metas):
            return None
        total = os.fstat(fh.fileno()).st_size
        try:
            mm = mmap.mmap(fh.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError):               # a file system without memory maps: read them instead
            return None
    if hasattr(mm, "madvise") and hasattr(mmap, "MADV_WILLNEED"):
        mm.madvise(mmap.MADV_WILLNEED)              # read ahead what is not in the page cache yet
    out = {}
    for lbl, x in zip(labels, metas):
        dt = getattr(torch, _ST_DTYPES[x["dtype"]])
        (n, H), (b, e) = x["shape"], x["data_offsets"]
        if e - b != n * H * dt.itemsize or 8 + size + e > total:
            raise ValueError(f"tensor '{lbl}' is truncated or its shape does not match its bytes")
        out[lbl] = (torch.frombuffer(mm, dtype=dt, count=n * H, offset=8 + size + b).view(n, H) if n * H
                    else torch.empty(n, H, dtype=dt))
    return out


# ---------------------------------------------------------------------------- matrices

def compute_dtype(A: Sample, B: Sample) -> torch.dtype:
    """bf16 when both samples hold bf16 (the products then see the stored values exactly; GEMMs accumulate in fp32),
    else fp32."""
    import torch

    dts = {v.dtype for s in (A, B) for v in s.states.values()}
    return torch.bfloat16 if dts == {torch.bfloat16} else torch.float32


def select_states(sample: Sample, idx: torch.Tensor, device: torch.device,
                  dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """Per boundary, in the sample's stream order, the chosen tokens' [len(idx), H] states on the device in dtype
    (float32 unless given). Views of the sample's tensors (load_sample: of the memory-mapped file, no copy) when the
    tokens are a contiguous run and nothing needs converting; else each is sliced or gathered and converted once."""
    import torch

    dtype = dtype or torch.float32
    n = len(idx)
    start = int(idx[0]) if n else 0
    contiguous = n > 0 and int(idx[-1]) - start == n - 1 and bool((idx[1:] > idx[:-1]).all())
    out = []
    for lbl in sample.labels:
        src = sample.states[lbl]
        z = src.narrow(0, start, n) if contiguous else src.index_select(0, idx.to(src.device))
        out.append(z.to(device=device, dtype=dtype))
    return out


def _parts(X: torch.Tensor | list[torch.Tensor]) -> list[torch.Tensor]:
    """Per boundary [n, H]: X given as such a list (align_samples) or as one token-major [n, L, H] tensor."""
    return list(X) if isinstance(X, (list, tuple)) else list(X.unbind(1))


def _bmm32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b batched, as float32: on CUDA 16-bit inputs give a float32 output directly, on CPU the fp32-accumulated
    product is rounded to the input dtype (relative 2^-9 for bf16) and then widened."""
    import torch

    if a.is_cuda and a.dtype != torch.float32:
        try:
            return torch.bmm(a, b, out_dtype=torch.float32)
        except (TypeError, RuntimeError):
            pass
    return torch.bmm(a, b).float()


def pair_matrices(X: torch.Tensor | list[torch.Tensor], Y: torch.Tensor | list[torch.Tensor],
                  same: list[tuple[int, int]], chunk: int | None = None) -> dict[str, np.ndarray]:
    """X (p boundaries) and Y (q boundaries), each a list of [n, H] per boundary or one token-major [n, L, H]
    tensor, hold the same n tokens; over every boundary pair (i, j):

    cosine[i, j]  mean over tokens of cos(x_it, y_jt)
    rel_l2[i, j]  ||X_i - Y_j||_F / ||Y_j||_F over the tokens (computed exactly for the `same` pairs)
    count[i, j]   tokens finite in both (tokens holding NaN/inf are left out of that pair)

    Per chunk of tokens (gathered token-major into a buffer reused by every chunk) one batched GEMM gives every
    pair's per-token dot product D[t, i, j] = x_it . y_jt ([c, p, H] x [c, H, q], fp32 accumulation) into one
    [n, p, q] array and the token norms go into [n, p] and [n, q]; cosine, dot and norm sums are then a few whole-array
    operations. No normalised copy is made, and the operations per chunk are few (on a busy machine each one waits
    for its threads). Also returns the per-token norms (norms_a [p, n], norms_b [q, n], float32) for the CKA row
    selection and each boundary's mean over the tokens finite everywhere (means: ([p, H], [q, H]) float32) for its
    centring."""
    import torch

    xs, ys = _parts(X), _parts(Y)
    device, dt_x, dt_y = xs[0].device, xs[0].dtype, ys[0].dtype
    n, p, q, H = xs[0].shape[0], len(xs), len(ys), xs[0].shape[-1]
    c = chunk or max(1, (1 << (24 if device.type == "cpu" else 28)) // ((p + q) * H))
    f32 = torch.float32
    D = torch.empty(n, p, q, dtype=f32, device=device)
    nx = torch.empty(n, p, dtype=f32, device=device)
    ny = torch.empty(n, q, dtype=f32, device=device)
    fin_a = torch.ones(n, p, dtype=torch.bool, device=device)
    fin_b = torch.ones(n, q, dtype=torch.bool, device=device)
    sum_a = torch.zeros(p, H, dtype=f32, device=device)             # over the tokens finite everywhere
    sum_b = torch.zeros(q, H, dtype=f32, device=device)
    diff2 = torch.zeros(len(same), dtype=torch.float64, device=device)
    si = torch.tensor([i for i, _ in same], dtype=torch.long, device=device)
    sj = torch.tensor([j for _, j in same], dtype=torch.long, device=device)
    consecutive = same and all(a == (same[0][0] + t, same[0][1] + t) for t, a in enumerate(same))
    ranges = same[0] if consecutive else None
    # buffers reused by every chunk: the chunk token-major, its fp32 copy when 16-bit (reductions on it need no
    # hidden casts) and the same-named differences (a fresh allocation per chunk costs page faults on every pass)
    x16buf, y16buf = torch.empty(c, p, H, dtype=dt_x, device=device), torch.empty(c, q, H, dtype=dt_y, device=device)
    xbuf = None if dt_x == f32 else torch.empty(c, p, H, dtype=f32, device=device)
    ybuf = None if dt_y == f32 else torch.empty(c, q, H, dtype=f32, device=device)
    dbuf = torch.empty(c, len(same), H, dtype=f32, device=device) if same else None
    ebuf = torch.empty(c, len(same), H, dtype=f32, device=device) if same and ranges is None else None
    tmp_a, tmp_b = torch.empty(p, H, dtype=f32, device=device), torch.empty(q, H, dtype=f32, device=device)
    for s in range(0, n, c):
        k = min(c, n - s)
        x16 = torch.stack([z[s:s + k] for z in xs], 1, out=x16buf[:k])      # [k, p, H]
        y16 = torch.stack([z[s:s + k] for z in ys], 1, out=y16buf[:k])      # [k, q, H]
        x = x16 if xbuf is None else xbuf[:k].copy_(x16)
        y = y16 if ybuf is None else ybuf[:k].copy_(y16)
        torch.linalg.vector_norm(x, dim=-1, out=nx[s:s + k])
        torch.linalg.vector_norm(y, dim=-1, out=ny[s:s + k])
        fx, fy = torch.isfinite(nx[s:s + k]), torch.isfinite(ny[s:s + k])   # NaN/inf in a token: its norm
        clean = bool(fx.all()) and bool(fy.all())
        if clean:
            sum_a += torch.sum(x, 0, out=tmp_a)
            sum_b += torch.sum(y, 0, out=tmp_b)
            D[s:s + k] = _bmm32(x16, y16.transpose(1, 2))            # bf16 products where both are bf16
            if same:                              # exact distance for same-named pairs (no cancellation)
                if ranges is not None:            # the same-named boundaries are runs of both sides: views
                    (i0, j0), m = ranges, len(same)
                    d = torch.sub(x[:, i0:i0 + m], y[:, j0:j0 + m], out=dbuf[:k])
                else:
                    d = torch.index_select(x, 1, si, out=dbuf[:k])
                    d -= torch.index_select(y, 1, sj, out=ebuf[:k])
                # per token then over tokens: a reduction over the last dim is several times faster than over (0, 2)
                diff2 += (torch.linalg.vector_norm(d, dim=-1) ** 2).sum(0, dtype=torch.float64)
            continue
        fin_a[s:s + k], fin_b[s:s + k] = fx, fy           # zero what is not finite (fp32 copies), then go on
        x = torch.where(fx[..., None], x.float(), 0.0)
        y = torch.where(fy[..., None], y.float(), 0.0)
        nx[s:s + k].masked_fill_(~fx, 0.0)
        ny[s:s + k].masked_fill_(~fy, 0.0)
        okc = (fx.all(1) & fy.all(1)).to(f32)[:, None, None]
        sum_a += (x * okc).sum(0)
        sum_b += (y * okc).sum(0)
        D[s:s + k] = torch.bmm(x, y.transpose(1, 2))
        if same:
            d = (x[:, si] - y[:, sj]) * (fx[:, si] & fy[:, sj])[..., None]
            diff2 += (torch.linalg.vector_norm(d, dim=(0, 2)) ** 2).double()
    wx, wy = fin_a.double(), fin_b.double()
    nx2, ny2 = nx.double() ** 2, ny.double() ** 2
    cnt = wx.T @ wy
    dot = D.sum(0, dtype=torch.float64)
    xx, yy = nx2.T @ wy, wx.T @ ny2
    D /= (nx[:, :, None] * ny[:, None, :]).clamp_min(1e-30)
    cos_sum = D.sum(0, dtype=torch.float64)
    del D
    nan = torch.full_like(cnt, float("nan"))
    cos = torch.where(cnt > 0, cos_sum / cnt.clamp_min(1), nan)
    d2 = (xx + yy - 2 * dot).clamp_min(0)
    for k, (i, j) in enumerate(same):
        d2[i, j] = diff2[k]
    rel = torch.where(cnt > 0, d2.sqrt() / yy.sqrt().clamp_min(1e-30), nan)
    all_fin = fin_a.all(1) & fin_b.all(1)
    return {"cosine": cos.cpu().numpy(), "rel_l2": rel.cpu().numpy(), "count": cnt.cpu().numpy(),
            "nonfinite_a": (~fin_a).sum(0).cpu().numpy(), "nonfinite_b": (~fin_b).sum(0).cpu().numpy(),
            "all_finite": all_fin, "norms_a": nx.T, "norms_b": ny.T,
            "means": (sum_a / all_fin.sum().clamp_min(1), sum_b / all_fin.sum().clamp_min(1))}


def _cka_rows(rows: torch.Tensor, xs: list[torch.Tensor], ys: list[torch.Tensor], ok: torch.Tensor, all_ok: bool,
              mus: list[torch.Tensor], block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For the token rows `rows` (positions in `ok`): per row a, r[a, i, j] = sum_b Kc_i[a, b] Kc_j[a, b] over
    all tokens b in ok, with Kc the centred token Gram of A's boundary i (xs[i]) and B's boundary j (ys[j]), and the
    self sums sa[a, i] = sum_b Kc_i[a, b]^2, sb[a, j] likewise. Each Gram row block is one GEMM of the chosen
    rows against all tokens (fp32 accumulation); the centring is exact algebra on the uncentred product
    (Kc[a, b] = K[a, b] - k_a - k_b + k, k_b = x_b . mean, k = mean . mean), the k_b of all tokens coming from one
    extra row (the mean) of the same GEMM. Buffers are allocated once."""
    import torch

    p, q, m = len(xs), len(ys), len(ok)
    dev, dt, f32 = xs[0].device, xs[0].dtype, torch.float32
    r = torch.empty(len(rows), p, q, dtype=f32, device=dev)
    sa = torch.empty(len(rows), p, dtype=f32, device=dev)
    sb = torch.empty(len(rows), q, dtype=f32, device=dev)
    kbar: list[torch.Tensor | None] = [None] * (p + q)
    bs = min(block, len(rows))
    GA = torch.empty(bs, p, m, dtype=f32, device=dev)
    GB = torch.empty(bs, q, m, dtype=f32, device=dev)
    zr_buf = torch.empty(bs + 1, xs[0].shape[-1], dtype=dt, device=dev)
    g_buf = torch.empty(bs + 1, m, dtype=dt, device=dev)
    everything = all_ok and len(rows) == m and bool((rows == torch.arange(m, device=dev)).all())
    for s in range(0, len(rows), bs):
        rb = rows[s:s + bs]
        b = len(rb)
        for k, Z in enumerate(xs + ys):                              # Z [n, H] one boundary
            z = Z if all_ok else Z.index_select(0, ok)             # [m, H]
            G = GA[:b, k] if k < p else GB[:b, k - p]              # [b, m] view
            if everything and b == m:                              # exact on all tokens: the rows are z itself
                G.copy_(torch.mm(z, z.T, out=g_buf[:m]))
                if kbar[k] is None:
                    kbar[k] = (z.float() @ mus[k]) if dt == f32 else (z @ mus[k].to(dt)).float()
            else:
                torch.index_select(z, 0, rb, out=zr_buf[:b])
                extra = kbar[k] is None
                if extra:
                    zr_buf[b] = mus[k]
                g = torch.mm(zr_buf[:b + extra], z.T, out=g_buf[:b + extra])
                if extra:
                    kbar[k] = g[b].to(f32, copy=True)                  # k_b = x_b . mean (g_buf is reused)
                G.copy_(g[:b])
            kb = kbar[k]
            G -= kb.index_select(0, rb)[:, None]
            G -= kb[None, :]
            G += kb.mean()                                         # mean . mean
        ga, gb = GA[:b], GB[:b]
        torch.bmm(ga, gb.transpose(1, 2), out=r[s:s + b])
        sa[s:s + b] = torch.linalg.vector_norm(ga, dim=-1) ** 2
        sb[s:s + b] = torch.linalg.vector_norm(gb, dim=-1) ** 2
    return r, sa, sb


def cka_matrix(X: torch.Tensor | list[torch.Tensor], Y: torch.Tensor | list[torch.Tensor], all_finite: torch.Tensor,
               budget: float | None = None,
               norms: tuple[torch.Tensor, torch.Tensor] | None = None,
               means: tuple[torch.Tensor, torch.Tensor] | None = None,
               seed: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    """Linear CKA over every boundary pair, on all tokens finite everywhere (n of them):

        CKA(X, Y) = <Kc_X, Kc_Y>_F / (||Kc_X||_F ||Kc_Y||_F),   Kc = Xc Xc^T, Xc = X minus its token mean,

    i.e. HSIC_XY = sum_{a,b} Kc_X[a, b] Kc_Y[a, b] = sum_a r_XY[a] with r the per-token row sums.

    Exact (every row a, standard error 0) when n^2 x H x (p + q) multiply-adds fit in `budget` (None: no limit, the
    GPU path). Else an estimator from m rows (m = budget / (n H (p + q))): the m/4 tokens of largest norm (summed
    over both sides' boundaries) always, the rest a simple random sample without replacement (seeded) of the
    other tokens, weighted N_S / m_S; each row sum r[a] is exact over all n tokens. The three sums (XY, XX, YY)
    are then unbiased; the ratio is consistent, and its standard error is the delta-method one,
        SE = CKA * N_S * sqrt((1 - m_S/N_S) var_S(z) / m_S),  z_a = r_XY[a]/HSIC_XY - r_XX[a]/2HSIC_XX
                                                                    - r_YY[a]/2HSIC_YY.
    The stated bound is |estimate - CKA on all tokens| <= CKA_SE_BOUND x SE (tests/test_align.py checks it
    against the exact computation). Returns (cka [p, q], se [p, q], m)."""
    import torch

    xs, ys = _parts(X), _parts(Y)
    device = xs[0].device
    p, q, H = len(xs), len(ys), xs[0].shape[-1]
    ok = all_finite.nonzero().flatten()
    n = len(ok)
    if n < 3:
        return np.full((p, q), np.nan), np.full((p, q), np.nan), n
    per_row = n * H * (p + q)
    m = n if budget is None else int(min(n, max(CKA_MIN_ROWS, budget // per_row)))
    exact = m >= n
    if exact:
        rows = torch.arange(n, device=device)
        take, sample = rows, rows[:0]
    else:
        if norms is not None:
            na, nb = norms
            w = ((na[:, ok] ** 2 / (na[:, ok] ** 2).sum(1, keepdim=True).clamp_min(1e-30)).sum(0)
                 + (nb[:, ok] ** 2 / (nb[:, ok] ** 2).sum(1, keepdim=True).clamp_min(1e-30)).sum(0))
            take = torch.topk(w, m // 4).indices.sort().values
        else:
            take = torch.arange(0, device=device)
        rest = torch.ones(n, dtype=torch.bool, device=device)
        rest[take] = False
        rest_idx = rest.nonzero().flatten()
        g = torch.Generator().manual_seed(seed)
        pick = torch.randperm(len(rest_idx), generator=g)[:m - len(take)].to(device)
        sample = rest_idx[pick].sort().values
        rows = torch.cat([take, sample])
    block = max(1, _CKA_BLOCK_BYTES[device.type == "cpu"] // (4 * (p + q) * n))
    if means is None:
        means = tuple(torch.stack([z.index_select(0, ok).float().mean(0) for z in Z]) for Z in (xs, ys))
    r, sa, sb = _cka_rows(rows, xs, ys, ok, n == xs[0].shape[0], list(means[0]) + list(means[1]), block)
    r, sa, sb = r.double(), sa.double(), sb.double()
    nt, ms, ns = len(take), len(sample), n - len(take)
    w = torch.ones(len(rows), dtype=torch.float64, device=device)
    if ms:
        w[nt:] = ns / ms
    hs = torch.einsum("a,aij->ij", w, r)
    ha, hb = w @ sa, w @ sb
    den = (ha[:, None] * hb[None, :]).sqrt()
    cka = torch.where(den > 0, hs / den.clamp_min(1e-300), torch.full_like(hs, float("nan")))
    se = torch.zeros_like(cka)
    if ms > 1:
        z = (r[nt:] / hs.clamp_min(1e-300) - sa[nt:, :, None] / (2 * ha[None, :, None].clamp_min(1e-300))
             - sb[nt:, None, :] / (2 * hb[None, None, :].clamp_min(1e-300)))
        se = cka.abs() * ns * ((1 - ms / ns) * z.var(0) / ms).clamp_min(0).sqrt()
    return cka.cpu().numpy(), se.cpu().numpy(), len(rows)


# ---------------------------------------------------------------------------- final norm fit

_NORM_KEYS = ("model.norm.weight", "norm.weight", "model.language_model.norm.weight",
              "language_model.model.norm.weight", "model.final_layernorm.weight", "transformer.ln_f.weight",
              "model.decoder.final_layer_norm.weight")


def target_final_norm(model_path: str | Path | None, hidden: int) -> dict | None:
    """The target's final norm weight, read alone from its safetensors (safe_open, not the model), and its eps.

    {"weight": float32 tensor [H], "key", "file", "eps"}, {"error": why} when the directory cannot give it, or
    None when there is no local model directory (e.g. an import that names its verifier by hub id)."""
    import torch
    from safetensors import SafetensorError, safe_open

    if not model_path or not Path(model_path).is_dir():
        return None
    d = Path(model_path)
    try:
        cfg = json.loads((d / "config.json").read_text()) if (d / "config.json").exists() else {}
    except (OSError, json.JSONDecodeError):
        cfg = {}
    eps = None
    for c in (cfg, cfg.get("text_config") or {}):
        for k in ("rms_norm_eps", "layer_norm_eps", "norm_eps", "layer_norm_epsilon"):
            if eps is None and isinstance(c.get(k), (int, float)):
                eps = float(c[k])
    try:
        index = d / "model.safetensors.index.json"
        if index.exists():
            where = {k: d / f for k, f in json.loads(index.read_text())["weight_map"].items()}
        else:
            where = {}
            for f in sorted(d.glob("*.safetensors")):
                with safe_open(str(f), framework="pt") as sf:
                    where.update({k: f for k in sf.keys()})
        key = next((k for k in _NORM_KEYS if k in where), None)
        if key is None:          # any top-level *norm.weight outside the layers (shortest name first)
            cands = sorted((k for k in where if k.endswith("norm.weight") and ".layers." not in k
                            and not k.startswith(("layers.", "lm_head", "mtp", "model.mtp"))), key=len)
            key = cands[0] if cands else None
        if key is None:
            return {"error": f"no final norm weight (model.norm.weight) in {d}"}
        with safe_open(str(where[key]), framework="pt") as sf:
            w = sf.get_tensor(key).to(torch.float32).flatten()
    except (OSError, SafetensorError, ValueError, KeyError, json.JSONDecodeError) as e:
        return {"error": f"{d}: cannot read the final norm weight ({e})"}
    if w.numel() != hidden:
        return {"error": f"{d}: {key} has {w.numel()} values, the captures have hidden size {hidden}"}
    return {"weight": w, "key": key, "file": str(where[key]), "eps": eps}


def norm_fit(x: torch.Tensor, y: torch.Tensor, eps: float = DEFAULT_NORM_EPS,
             target_weight: torch.Tensor | None = None) -> dict | None:
    """How well y [n, H] is the final norm of x [n, H]: y ~ w * RMSNorm(x) with w [H] fitted per dimension by
    least squares (closed form, w_d = <y_d, z_d> / <z_d, z_d>), against the same fit without the norm
    (y ~ w * x: an identity or per-dimension scaling, which a genuine S_N passes and F does not).

    rel_l2_norm_fit / rel_l2_weight_only: ||y - w * z|| / ||y|| of each fit; with the target's weight g also
    weight_rel (||w - g|| / ||g||, or against 1 + g for norms that add one, e.g. Gemma) and rel_l2_target
    (y against g * RMSNorm(x)). Tokens holding NaN/inf in x or y are left out."""
    import torch

    x, y = x.float(), y.float()
    ok = torch.isfinite(x).all(-1) & torch.isfinite(y).all(-1)
    if not bool(ok.all()):
        x, y = x[ok], y[ok]
    n = int(x.shape[0])
    if n < 2:
        return None
    ny = torch.linalg.vector_norm(y).double()
    if float(ny) == 0.0:
        return None
    z = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    def fit(basis: torch.Tensor) -> tuple[torch.Tensor, float]:
        w = (y * basis).sum(0) / (basis * basis).sum(0).clamp_min(1e-30)
        return w, float(torch.linalg.vector_norm(y - w * basis).double() / ny)

    w, r_norm = fit(z)
    _, r_plain = fit(x)
    out = {"tokens": n, "rel_l2_norm_fit": r_norm, "rel_l2_weight_only": r_plain, "eps": eps}
    if target_weight is not None:
        g = target_weight.to(device=x.device, dtype=torch.float32)
        best = None
        for plus_one in (False, True):
            gg = g + 1 if plus_one else g
            wr = float(torch.linalg.vector_norm(w - gg) / torch.linalg.vector_norm(gg).clamp_min(1e-30))
            if best is None or wr < best[0]:
                best = (wr, plus_one, float(torch.linalg.vector_norm(y - gg * z).double() / ny))
        out.update({"weight_rel": best[0], "weight_plus_one": best[1], "rel_l2_target": best[2]})
    return out


def _top_s(labels: list[str], n: int) -> str | None:
    """The side's S_N (N = n_layers), or its deepest S label when N is unknown."""
    if n:
        return coords.S(n).label if coords.S(n).label in labels else None
    s = [lbl for lbl in labels if lbl != "F"]
    return s[-1] if s else None


def final_norm_fits(A: Sample, B: Sample, X: list[torch.Tensor], Y: list[torch.Tensor], cos: np.ndarray,
                    rel: np.ndarray) -> list[dict]:
    """norm_fit from the other side's S_N of each side's S_N, F and deepest state (where F gets stored, whatever its
    label) that does not match its namesake closely (or has none): at most four fits, a few passes over [n, H] each.

    One dict per fit: side (the side of y), y, x (labels), the figures of norm_fit, and is_final_norm."""
    n = A.n_layers or B.n_layers
    xs, ys = _parts(X), _parts(Y)
    jobs = []          # (side of y, y label, x label, y tensor, x tensor)
    for side, P, Q, PX, QX, pick in (("B", A, B, xs, ys, lambda i, j: (cos[i, j], rel[i, j])),
                                     ("A", B, A, ys, xs, lambda i, j: (cos[j, i], rel[j, i]))):
        xl = _top_s(P.labels, n)
        if xl is None:
            continue
        for j, yl in enumerate(Q.labels):
            if yl not in (coords.S(n).label, "F", Q.labels[-1]):
                continue
            if yl in P.labels:
                c, r = pick(P.labels.index(yl), j)
                if not (np.isfinite(c) and np.isfinite(r)) or (c >= ALIGNED_COS and r <= DRIFT_REL_L2):
                    continue      # matches its namesake closely: never a final-norm question
            jobs.append((side, yl, xl, QX[j], PX[P.labels.index(xl)]))
    if not jobs:
        return []
    tn = target_final_norm(A.model_path, A.hidden) or target_final_norm(B.model_path, B.hidden)
    if tn is not None and "error" in tn and A.model_path != B.model_path:
        tn = target_final_norm(B.model_path, B.hidden) or tn
    weight = tn.get("weight") if tn else None
    eps = (tn or {}).get("eps") or DEFAULT_NORM_EPS
    out = []
    for side, yl, xl, y, x in jobs:
        f = norm_fit(x, y, eps, weight)
        if f is None:
            continue
        f.update({"side": side, "y": yl, "x": xl,
                  "is_final_norm": f["rel_l2_norm_fit"] <= NORM_FIT_REL_L2
                  and f["rel_l2_norm_fit"] < NORM_FIT_MARGIN * f["rel_l2_weight_only"]})
        if tn is not None:
            f.update({"target_norm": {k: v for k, v in tn.items() if k != "weight"}})
        out.append(f)
    return out


# ---------------------------------------------------------------------------- path and verdict

def best_path(cos: np.ndarray) -> list[int]:
    """For each B boundary (columns, stream order) the A boundary (row) on the monotone path of
    highest total cosine (non-decreasing in A's stream order)."""
    p, q = cos.shape
    c = np.nan_to_num(cos, nan=-1.0)
    score = np.full((q, p), -np.inf)
    back = np.zeros((q, p), dtype=int)
    score[0] = c[:, 0]
    for j in range(1, q):
        best_prev = np.maximum.accumulate(score[j - 1])
        arg_prev = np.array([int(np.argmax(score[j - 1][: i + 1])) for i in range(p)])
        score[j] = best_prev + c[:, j]
        back[j] = arg_prev
    path = [int(np.argmax(score[q - 1]))]
    for j in range(q - 1, 0, -1):
        path.append(int(back[j][path[-1]]))
    return path[::-1]


def _num(lbl: str, n_layers: int) -> float:
    return n_layers + 0.5 if lbl == "F" else coords.label_index(lbl)


def verdict(A: Sample, B: Sample, cos: np.ndarray, rel: np.ndarray, cka: np.ndarray,
            fits: list[dict] | None = None) -> tuple[list[Finding], int | None]:
    """The findings (data; backend/text/align_text.py words them), and B's boundary offset (None when there is no
    single one). `fits` are final_norm_fits."""
    findings: list[Finding] = []
    n = A.n_layers or B.n_layers
    same = [(A.labels.index(lbl), B.labels.index(lbl), lbl) for lbl in B.labels if lbl in A.labels]

    if same:
        dcos = np.array([cos[i, j] for i, j, _ in same])
        dcka = np.array([cka[i, j] for i, j, _ in same])
        if np.nanmedian(dcos) < ROTATION_COS and np.nanmedian(dcka) > ROTATION_CKA:
            shown = [[lbl, float(cos[i, j]), float(cka[i, j])] for i, j, lbl in same[:4]]
            findings.append(Finding("rotation", [[lbl, lbl] for _, _, lbl in same], figures={
                "median_cka": float(np.nanmedian(dcka)), "median_cosine": float(np.nanmedian(dcos)), "shown": shown}))
            return findings, None

    # states labelled S_b that are RMSNorm(S_N) x a weight (F stored under an S label), and B's F confirmed as F
    fits = fits or []
    normed = [f for f in fits if f["is_final_norm"] and f["y"] != "F"]
    b_normed = {f["y"] for f in normed if f["side"] == "B"}
    a_normed = {f["y"] for f in normed if f["side"] == "A"}
    # an F labelled F, the final norm of the other side's S_N: honest labels, whatever its cosine to that S_N
    f_ok = {f["side"]: f for f in fits if f["is_final_norm"] and f["y"] == "F"}
    notes = []

    def honest_f(side: str) -> None:
        notes.append({"side": side, "x": f_ok[side]["x"], "rel_l2_norm_fit": f_ok[side]["rel_l2_norm_fit"]})

    def done(offset: int | None) -> tuple[list[Finding], int | None]:
        if notes:
            findings[0].notes += notes
        return findings, offset

    # each B boundary's best match in A
    matches = []
    for j, bl in enumerate(B.labels):
        col = np.nan_to_num(cos[:, j], nan=-1.0)
        i = int(np.argmax(col))
        if bl in A.labels and col[A.labels.index(bl)] >= col[i] - 1e-6:
            i = A.labels.index(bl)
        matches.append((j, i, float(col[i])))
    unmatched = [B.labels[j] for j, i, c in matches if c < MATCH_COS and B.labels[j] not in b_normed
                 and not (B.labels[j] == "F" and "B" in f_ok)]
    fin = [(A.labels[i], B.labels[j]) for j, i, c in matches if c >= MATCH_COS and A.labels[i] != B.labels[j]
           and {A.labels[i], B.labels[j]} == {coords.S(n).label, "F"}]
    if "B" in f_ok and "F" not in A.labels:
        honest_f("B")
    if "A" in f_ok and any(a == "F" for a, _ in fin):
        honest_f("A")
    fin = [(a, b) for a, b in fin if not (b == "F" and "B" in f_ok) and not (a == "F" and "A" in f_ok)]
    # B label -> A label of every matched S state, with its offset in boundaries
    mapped = [(A.labels[i], B.labels[j], int(round(_num(A.labels[i], n) - _num(B.labels[j], n))))
              for j, i, c in matches if c >= MATCH_COS and B.labels[j] != "F" and A.labels[i] != "F"
              and B.labels[j] not in b_normed and A.labels[i] not in a_normed]
    offset = None
    if mapped:
        ks = [k for _, _, k in mapped]
        offset = max(set(ks), key=ks.count)
    top = coords.S(n).label
    # the aux states decide whether one offset holds; S_N (a teacher, often right when the aux states are shifted)
    # counts only when it is shifted itself
    rows = [m for m in mapped if m[1] != top or m[2] != 0]
    shifts = [m for m in mapped if m[2] != 0]
    kset = sorted({k for _, _, k in rows})
    if shifts and len(kset) == 1:
        k = kset[0]
        findings.append(Finding("offset", [[a, b] for a, b, _ in shifts], figures={"offset": k}))
    elif shifts:
        offset = None
        findings.append(Finding("mislabelled", [[a, b] for a, b, _ in rows],
                                figures={"offsets": [k for _, _, k in rows]}))
    if fin:
        a, b = fin[0]
        findings.append(Finding("final_norm", [list(p) for p in fin], figures={
            "cosine": float(cos[A.labels.index(a), B.labels.index(b)]), "n_layers": n}))
    for f in normed:
        if f["y"] in ({b for _, b in fin} if f["side"] == "B" else {a for a, _ in fin}):
            continue          # already named by its cosine to the other side's F
        same_weight = f["weight_rel"] <= NORM_WEIGHT_REL if "weight_rel" in f else None
        findings.append(Finding("final_norm", [[f["x"], f["y"]] if f["side"] == "B" else [f["y"], f["x"]]],
                                "final_norm_fit", {"fit": dict(f), "weight_is_target": same_weight}))
    if findings:
        return done(offset)

    # same labels match: aligned, or drifting numbers
    if same:
        rels = np.array([rel[i, j] for i, j, _ in same])
        coss = np.array([cos[i, j] for i, j, _ in same])
        worst = int(np.nanargmax(rels))
        same16 = str(A.dtype).lower() == str(B.dtype).lower() and str(A.dtype).lower() in SIXTEEN_BIT
        limit = DRIFT_REL_L2_SAME_16BIT if same16 else DRIFT_REL_L2
        if np.nanmax(rels) > limit or np.nanmin(coss) < ALIGNED_COS:
            first, last = same[0][2], same[-1][2]
            s_only = [(lbl, r) for (_, _, lbl), r in zip(same, rels) if lbl != "F"]
            grow = len(s_only) >= 3 and np.corrcoef(np.arange(len(s_only)), [r for _, r in s_only])[0, 1] > 0.5
            findings.append(Finding("drift", [[lbl, lbl] for _, _, lbl in same], figures={
                "grow": bool(grow), "first": first, "last": last, "worst": same[worst][2], "rel_first": float(rels[0]),
                "rel_last": float(rels[-1]), "rel_worst": float(rels[worst]), "dtype_a": str(A.dtype),
                "dtype_b": str(B.dtype)}))
        else:
            findings.append(Finding("aligned", [[lbl, lbl] for _, _, lbl in same], figures={
                "boundaries": len(same), "min_cosine": float(np.nanmin(coss)), "max_rel_l2": float(np.nanmax(rels)),
                "rounding": bool(np.nanmax(rels) > DRIFT_REL_L2), "dtype": str(A.dtype)}))
        if offset is None:
            offset = 0
    if unmatched:
        findings.append(Finding("drift" if not findings else findings[0].kind, case="unmatched",
                                figures={"unmatched": unmatched}))
    if not findings:
        findings.append(Finding("drift", case="no_match"))
    return done(offset)


# ---------------------------------------------------------------------------- entry points

def _on(sample: Sample, device: torch.device) -> Sample:
    """The sample's states moved to the device once (a no-op on CPU)."""
    if device.type == "cpu" or next(iter(sample.states.values())).device == device:
        return sample
    labels = list(sample.states)
    states = dict(zip(labels, to_device([sample.states[k] for k in labels], device)))
    return Sample(sample.run_id, sample.labels, states, sample.ctx_hash, sample.n_layers, sample.hidden, sample.dtype,
                  sample.model_path)


def to_device(tensors: list[torch.Tensor], device: torch.device, buffers: int = 2) -> list[torch.Tensor]:
    """CPU tensors (e.g. views of a memory-mapped sample) copied to a CUDA device through pinned staging buffers:
    while the GPU copies one tensor from its buffer, the CPU (every intra-op thread) copies the next one into another
    buffer. A copy straight from pageable memory is staged by the driver one piece at a time on one thread; on the
    H100 that left 33 x 4096 x 4096 bf16 at about 7.4 GB/s. Same bytes, same order, same dtypes as `.to(device)`."""
    import torch

    if device.type != "cuda" or not tensors:
        return [t.to(device) for t in tensors]
    size = max(t.numel() * t.element_size() for t in tensors)
    stage = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for _ in range(buffers)]
    done: list[torch.cuda.Event | None] = [None] * buffers
    stream = torch.cuda.Stream(device)
    out = []
    for i, src in enumerate(tensors):
        j = i % buffers
        if done[j] is not None:
            done[j].synchronize()                       # the GPU has read this buffer: refill it
        n = src.numel() * src.element_size()
        buf = stage[j][:n].view(src.dtype).view(src.shape)
        buf.copy_(src)
        dst = torch.empty(src.shape, dtype=src.dtype, device=device)
        with torch.cuda.stream(stream):
            dst.copy_(buf, non_blocking=True)
            done[j] = torch.cuda.Event()
            done[j].record(stream)
        out.append(dst)
    torch.cuda.current_stream(device).wait_stream(stream)
    return out


def default_device() -> torch.device:
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def align_samples(A: Sample, B: Sample, cka_budget: float | None | str = "auto",
                  device: torch.device | str | None = None) -> Alignment:
    """Align two samples. CKA is exact on all tokens within `cka_budget` multiply-adds (default "auto":
    CKA_BUDGET on CPU, no limit on a GPU; None: always exact), else the row estimator of cka_matrix."""
    import torch

    device = torch.device(device) if device is not None else default_device()
    if cka_budget == "auto":
        cka_budget = CKA_BUDGET if device.type == "cpu" else None
    if A.hidden != B.hidden:
        raise SpecLensError(f"runs '{A.run_id}' (hidden {A.hidden}) and '{B.run_id}' (hidden {B.hidden}) have "
                            f"different hidden sizes; align captures of the same target")
    _, ia, ib = np.intersect1d(A.ctx_hash, B.ctx_hash, assume_unique=False, return_indices=True)
    if len(ia) == 0:
        raise SpecLensError(f"runs '{A.run_id}' and '{B.run_id}' share no tokens (different prompts, tokenizer or "
                            f"chat template); capture both from the same --prompts file")
    order = np.argsort(ia)
    ia, ib = torch.from_numpy(ia[order]).to(device), torch.from_numpy(ib[order]).to(device)
    dt = compute_dtype(A, B)
    X, Y = select_states(_on(A, device), ia, device, dt), select_states(_on(B, device), ib, device, dt)
    same = [(A.labels.index(lbl), j) for j, lbl in enumerate(B.labels) if lbl in A.labels]
    mats = pair_matrices(X, Y, same)
    cos, rel, nfa, nfb = mats["cosine"], mats["rel_l2"], mats["nonfinite_a"], mats["nonfinite_b"]
    cka, cka_se, m = cka_matrix(X, Y, mats["all_finite"], cka_budget, (mats["norms_a"], mats["norms_b"]),
                                mats["means"])
    exact = bool(np.all(cka_se[np.isfinite(cka_se)] == 0)) and m == int(mats["all_finite"].sum())
    fits = final_norm_fits(A, B, X, Y, cos, rel)
    del X, Y
    findings, offset = verdict(A, B, cos, rel, cka, fits)
    path = best_path(cos)
    warnings = []
    for lbl, k in zip(A.labels, nfa):
        if k:
            warnings.append(f"A ({A.run_id}) {lbl}: {int(k)} of {len(ia)} shared tokens hold NaN or inf (left out)")
    for lbl, k in zip(B.labels, nfb):
        if k:
            warnings.append(f"B ({B.run_id}) {lbl}: {int(k)} of {len(ib)} shared tokens hold NaN or inf (left out)")
    findings[0].nonfinite = [["A", lbl, int(k)] for lbl, k in zip(A.labels, nfa) if k] + \
                            [["B", lbl, int(k)] for lbl, k in zip(B.labels, nfb) if k]
    per = []
    for j, bl in enumerate(B.labels):
        i = A.labels.index(bl) if bl in A.labels else None
        per.append({"boundary": bl, "cosine": _f(cos[i, j]) if i is not None else None,
                    "rel_l2": _f(rel[i, j]) if i is not None else None, "cka": _f(cka[i, j]) if i is not None else None,
                    "best_match": A.labels[path[j]], "best_cosine": _f(cos[path[j], j]),
                    "nonfinite_b": int(nfb[j]), "nonfinite_a": int(nfa[i]) if i is not None else None})
    return Alignment(
        a=A.run_id, b=B.run_id, tokens=int(len(ia)), cka_tokens=m, a_labels=A.labels, b_labels=B.labels,
        cosine=_mat(cos), rel_l2=_mat(rel), cka=_mat(cka),
        path=[{"a": A.labels[i], "b": B.labels[j], "cosine": _f(cos[i, j])} for j, i in enumerate(path)],
        verdict=findings, offset=offset, per_boundary=per, warnings=warnings,
        norm_fits=[{k: (round(v, 6) if isinstance(v, float) else v) for k, v in f.items()} for f in fits],
        cka_se=_mat(cka_se), cka_exact=exact, cka_definition=cka_definition(exact, m, int(mats["all_finite"].sum())))


def cka_definition(exact: bool, rows: int, tokens: int) -> str:
    """The CKA figures' definition in words (the bench prints it; the page and CLI can show it)."""
    text = ("linear CKA(X, Y) = <Kc_X, Kc_Y>_F / (||Kc_X||_F ||Kc_Y||_F), Kc = Xc Xc^T the token Gram of the states "
            f"centred over tokens, on all {tokens} tokens finite at every boundary")
    if exact:
        return text + ": computed exactly"
    return text + (f": estimated from {rows} Gram rows (each exact over all tokens; the largest-norm quarter always, "
                   f"the rest a seeded random sample), |estimate - exact| <= {CKA_SE_BOUND:g} x its standard error")


def _f(x) -> float | None:
    x = float(x)
    return None if not np.isfinite(x) else round(x, 6)


def _mat(m: np.ndarray) -> list[list[float | None]]:
    return [[_f(v) for v in row] for row in m]


def align_runs(run_a: str, run_b: str, data: DataRoot | None = None, cka_budget: float | None | str = "auto",
               device: torch.device | str | None = None) -> Alignment:
    data = DataRoot.of(data)
    return align_samples(load_sample(run_a, data), load_sample(run_b, data), cka_budget, device)


def get_alignment(run_a: str, run_b: str, data: DataRoot | None = None) -> Alignment:
    """The alignment of A and B: the one stored beside the catalog (data/alignments/) while neither run changed,
    else computed here and stored through the catalog's write side."""
    data = DataRoot.of(data)
    ma, mb = data.run_dir(run_a).read(), data.run_dir(run_b).read()
    key = f"{VERSION}|{ma.updated}|{mb.updated}"
    cat = data.catalog
    d = cat.read.stored_alignment(run_a, run_b)
    if d is not None:
        try:
            if d.get("_key") == key:
                d.pop("_key")
                return Alignment.from_json(d)
        except (KeyError, TypeError):
            pass
    al = align_runs(run_a, run_b, data)
    cat.write.store_alignment(run_a, run_b, {**al.to_json(), "_key": key})
    return al
