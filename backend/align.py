"""Layer alignment of two captures: which boundary of A matches which boundary of B, and why not.

On the tokens both raw samples share (same token in the same context, by context hash), over every
pair of boundaries: mean per-token cosine, mean per-token relative L2 (||a - b|| / ||b||) and linear
CKA; a best-match path; and a verdict in words (aligned, offset, final_norm, rotation, drift).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from backend import coords
from backend.config import paths
from backend.errors import SpecLensError
from backend.store.rundir import COMPLETE, RunDir, atomic_write_json

if TYPE_CHECKING:  # torch is imported where tensors are made, so a cached alignment loads without it
    import torch

CKA_TOKENS = 1024          # CKA on an evenly spaced subset: its cost grows with tokens^2 x hidden
MATCH_COS = 0.9            # below this best cosine a boundary "matches nothing"
ALIGNED_COS = 0.999        # same-label pairs at least this close are numerically the same state
DRIFT_REL_L2 = 0.01        # a same-label relative L2 above this is drift
# ... unless both captures hold the same 16-bit dtype: two engines' kernels round differently (measured on the
# H200, toy target, bf16: vLLM and SGLang hooks vs HF hooks 0.5% at S_1 growing to 1.05% at F, docs/PERFORMANCE.md);
# a dtype or quantization change between the sides keeps the strict limit
DRIFT_REL_L2_SAME_16BIT = 0.03
SIXTEEN_BIT = {"bf16", "bfloat16", "fp16", "float16", "torch.bfloat16", "torch.float16"}
ROTATION_COS, ROTATION_CKA = 0.5, 0.95
_CHUNK = 512
VERSION = 4                # bump when the figures or verdicts change: cached alignments are recomputed


@dataclass
class Sample:
    run_id: str
    labels: list[str]
    states: dict[str, torch.Tensor]   # label -> [n, H]
    ctx_hash: np.ndarray              # [n]
    n_layers: int
    hidden: int
    dtype: str


@dataclass
class Finding:
    kind: str                   # aligned | offset | final_norm | rotation | drift
    text: str
    pairs: list[list[str]] = field(default_factory=list)


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

    def to_json(self) -> dict:
        d = asdict(self)
        d["matrices"] = {"cosine": d.pop("cosine"), "rel_l2": d.pop("rel_l2"), "cka": d.pop("cka")}
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Alignment":
        d = dict(d)
        m = d.pop("matrices")
        d["verdict"] = [Finding(**f) for f in d["verdict"]]
        return cls(cosine=m["cosine"], rel_l2=m["rel_l2"], cka=m["cka"], **d)

    def headline(self) -> str:
        return " ".join(f.text for f in self.verdict)


# ---------------------------------------------------------------------------- loading

def load_sample(run_id: str, root: Path | None = None) -> Sample:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    rd = RunDir.open(run_id, root)
    m = rd.manifest()
    if rd.effective_status(m) != COMPLETE:
        raise SpecLensError(f"run '{run_id}' is {rd.effective_status(m)}, not complete; resume or re-run it "
                            f"before aligning")
    f = rd.file("sample.safetensors")
    if not f.exists():
        raise SpecLensError(f"{f}: missing raw sample; re-run the capture of '{run_id}'")
    try:
        t = load_file(str(f))
    except (SafetensorError, OSError, ValueError) as e:
        raise SpecLensError(f"{f}: corrupt safetensors file ({e}); re-run the capture of '{run_id}'") from e
    labels = [lbl for lbl in m.get("boundaries", []) if lbl in t]
    if not labels or "ctx_hash" not in t:
        raise SpecLensError(f"{f}: no boundary tensors or token hashes in the sample; re-run the capture of '{run_id}'")
    model = m.get("model") or {}
    return Sample(run_id, coords.sort_labels(labels), {lbl: t[lbl] for lbl in labels}, t["ctx_hash"].numpy(),
                  int(model.get("n_layers") or 0), int(t[labels[0]].shape[-1]), str(m.get("dtype")))


# ---------------------------------------------------------------------------- matrices

def stack_states(sample: Sample, idx: torch.Tensor, device: torch.device) -> torch.Tensor:
    """[L, n, H] float32 of the chosen tokens, boundaries in the sample's stream order, converted once
    (a contiguous run of tokens is sliced, not gathered)."""
    import torch

    n = len(idx)
    out = torch.empty(len(sample.labels), n, sample.hidden, dtype=torch.float32, device=device)
    start = int(idx[0]) if n else 0
    contiguous = n > 0 and int(idx[-1]) - start == n - 1
    for i, lbl in enumerate(sample.labels):
        src = sample.states[lbl]
        out[i].copy_(src.narrow(0, start, n) if contiguous else src.index_select(0, idx.to(src.device)))
    return out


def pair_matrices(X: torch.Tensor, Y: torch.Tensor, same: list[tuple[int, int]],
                  chunk: int = _CHUNK) -> dict[str, np.ndarray]:
    """X [p, n, H] and Y [q, n, H] hold the same n tokens; over every boundary pair (i, j):

    cosine[i, j]  mean over tokens of cos(x_it, y_jt)
    rel_l2[i, j]  ||X_i - Y_j||_F / ||Y_j||_F over the tokens (computed exactly for the `same` pairs)
    count[i, j]   tokens finite in both (tokens holding NaN/inf are left out of that pair)

    Every sum is a GEMM over the flattened (token, dim) axis of a chunk of tokens:
    two [p, c*H] x [c*H, q] products per chunk, so memory beyond X and Y is O(L x chunk x H)."""
    import torch

    device = X.device
    p, q, n = X.shape[0], Y.shape[0], X.shape[1]
    acc = {k: torch.zeros(p, q, dtype=torch.float64, device=device) for k in ("cos", "dot", "xx", "yy", "cnt")}
    nfa = torch.zeros(p, dtype=torch.int64, device=device)
    nfb = torch.zeros(q, dtype=torch.int64, device=device)
    all_fin = torch.ones(n, dtype=torch.bool, device=device)        # tokens finite at every boundary of both
    diff2 = torch.zeros(len(same), dtype=torch.float64, device=device)
    for s in range(0, n, chunk):
        x, y = X[:, s:s + chunk], Y[:, s:s + chunk]                  # [p, c, H], [q, c, H] views
        nx, ny = torch.linalg.vector_norm(x, dim=-1), torch.linalg.vector_norm(y, dim=-1)  # [p, c], [q, c]
        fx, fy = torch.isfinite(nx), torch.isfinite(ny)    # a token holding NaN/inf has a non-finite norm
        nfa += (~fx).sum(1)
        nfb += (~fy).sum(1)
        all_fin[s:s + chunk] = fx.all(0) & fy.all(0)
        if not bool(fx.all()):
            x, nx = torch.where(fx[..., None], x, 0.0), torch.where(fx, nx, 0.0)
        if not bool(fy.all()):
            y, ny = torch.where(fy[..., None], y, 0.0), torch.where(fy, ny, 0.0)
        wx, wy = fx.float(), fy.float()
        acc["dot"] += (x.flatten(1) @ y.flatten(1).T).double()
        acc["xx"] += ((nx * nx) @ wy.T).double()
        acc["yy"] += (wx @ (ny * ny).T).double()
        acc["cnt"] += (wx @ wy.T).double()
        clean = bool(fx.all()) and bool(fy.all())
        for k, (i, j) in enumerate(same):             # exact distance for same-named pairs (no cancellation)
            d = x[i] - y[j] if clean else (x[i] - y[j]) * (fx[i] & fy[j]).float()[:, None]
            diff2[k] += (torch.linalg.vector_norm(d) ** 2).double()
        xn = x / nx.clamp_min(1e-30)[..., None]
        yn = y / ny.clamp_min(1e-30)[..., None]
        acc["cos"] += (xn.flatten(1) @ yn.flatten(1).T).double()
        del xn, yn
    cnt = acc["cnt"]
    nan = torch.full_like(cnt, float("nan"))
    cos = torch.where(cnt > 0, acc["cos"] / cnt.clamp_min(1), nan)
    d2 = (acc["xx"] + acc["yy"] - 2 * acc["dot"]).clamp_min(0)
    for k, (i, j) in enumerate(same):
        d2[i, j] = diff2[k]
    rel = torch.where(cnt > 0, d2.sqrt() / acc["yy"].sqrt().clamp_min(1e-30), nan)
    return {"cosine": cos.cpu().numpy(), "rel_l2": rel.cpu().numpy(), "count": cnt.cpu().numpy(),
            "nonfinite_a": nfa.cpu().numpy(), "nonfinite_b": nfb.cpu().numpy(), "all_finite": all_fin}


def cka_matrix(X: torch.Tensor, Y: torch.Tensor, all_finite: torch.Tensor,
               max_tokens: int = CKA_TOKENS) -> tuple[np.ndarray, int]:
    """Linear CKA over boundary pairs on an evenly spaced subset of the tokens finite everywhere.

    CKA(X, Y) = <K_X, K_Y>_F / (||K_X||_F ||K_Y||_F) with K = Xc Xc^T the centred token Gram matrix."""
    import torch

    ok = all_finite.nonzero().flatten()
    if len(ok) > max_tokens:
        ok = ok[torch.linspace(0, len(ok) - 1, max_tokens, device=ok.device).round().long()]
    m = len(ok)
    if m < 3:
        return np.full((X.shape[0], Y.shape[0]), np.nan), m

    def grams(Z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = []
        for z in Z:                                                          # z [n, H]
            z = z.index_select(0, ok)                                        # [m, H]
            z = z - z.mean(0, keepdim=True)
            out.append((z @ z.T).flatten())                                  # [m*m]
        G = torch.stack(out)                                                 # [L, m*m]
        return G, (G.double() ** 2).sum(-1).sqrt()
    GX, nX = grams(X)
    GY, nY = grams(Y)
    hsic = (GX @ GY.T).double()                                              # [p, q]
    return (hsic / (nX[:, None] * nY[None, :]).clamp_min(1e-30)).cpu().numpy(), m


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


def verdict(A: Sample, B: Sample, cos: np.ndarray, rel: np.ndarray, cka: np.ndarray) -> tuple[list[Finding], int | None]:
    findings: list[Finding] = []
    n = A.n_layers or B.n_layers
    same = [(A.labels.index(lbl), B.labels.index(lbl), lbl) for lbl in B.labels if lbl in A.labels]

    if same:
        dcos = np.array([cos[i, j] for i, j, _ in same])
        dcka = np.array([cka[i, j] for i, j, _ in same])
        if np.nanmedian(dcos) < ROTATION_COS and np.nanmedian(dcka) > ROTATION_CKA:
            figs = ", ".join(f"{lbl} cos {cos[i, j]:.2f} CKA {cka[i, j]:.3f}" for i, j, lbl in same[:4])
            findings.append(Finding("rotation", (
                f"Basis rotation: same-named boundaries carry the same information (median CKA {np.nanmedian(dcka):.3f}) "
                f"in a different basis (median cosine {np.nanmedian(dcos):.2f}): {figs}. One target was rotated or "
                f"transformed (e.g. QuaRot/SpinQuant); a drafter trained on one will not work on the other."),
                [[lbl, lbl] for _, _, lbl in same]))
            return findings, None

    # each B boundary's best match in A
    matches = []
    for j, bl in enumerate(B.labels):
        col = np.nan_to_num(cos[:, j], nan=-1.0)
        i = int(np.argmax(col))
        if bl in A.labels and col[A.labels.index(bl)] >= col[i] - 1e-6:
            i = A.labels.index(bl)
        matches.append((j, i, float(col[i])))
    unmatched = [B.labels[j] for j, i, c in matches if c < MATCH_COS]
    fin = [(A.labels[i], B.labels[j]) for j, i, c in matches if c >= MATCH_COS and A.labels[i] != B.labels[j]
           and {A.labels[i], B.labels[j]} == {f"S_{n}", "F"}]
    shifts = [(A.labels[i], B.labels[j], int(round(_num(A.labels[i], n) - _num(B.labels[j], n))))
              for j, i, c in matches if c >= MATCH_COS and B.labels[j] != "F" and A.labels[i] != "F"
              and A.labels[i] != B.labels[j]]
    offset = None
    s_pairs = [(A.labels[i], B.labels[j]) for j, i, c in matches if c >= MATCH_COS and B.labels[j] != "F" and A.labels[i] != "F"]
    if s_pairs:
        ks = [int(round(_num(a, n) - _num(b, n))) for a, b in s_pairs]
        offset = max(set(ks), key=ks.count)
    if shifts:
        k = max({s[2] for s in shifts}, key=[s[2] for s in shifts].count)
        pairs = [[a, b] for a, b, kk in shifts if kk == k]
        bl = ",".join(b for _, b in pairs)
        al = ",".join(a for a, _ in pairs)
        words = {1: "one", 2: "two", 3: "three"}.get(abs(k), str(abs(k)))
        why = ("B was probably captured 'after layer' where A is 'before layer'" if k > 0 else
               "B was probably captured 'before layer' where A is 'after layer'")
        findings.append(Finding("offset", (
            f"Offset by {k:+d}: what B labels {bl} is what A labels {al} (off by {words} boundar{'y' if abs(k) == 1 else 'ies'}); "
            f"{why}. Check each producer's id convention."), pairs))
    if fin:
        a, b = fin[0]
        findings.append(Finding("final_norm", (
            f"Final norm: B's {b} matches A's {a} (cosine {cos[A.labels.index(a), B.labels.index(b)]:.4f}), "
            f"so one side took its last state {'after' if a == 'F' else 'before'} the final norm and the other "
            f"{'before' if a == 'F' else 'after'} it (S_{n} is pre-norm, F = norm(S_{n}))."), [list(p) for p in fin]))
    if findings:
        return findings, offset

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
            findings.append(Finding("drift", (
                f"Numeric drift{' growing with depth' if grow else ''}: the boundaries correspond, but relative L2 goes "
                f"from {rels[0]:.4f} at {first} to {rels[-1]:.4f} at {last} (worst {rels[worst]:.4f} at {same[worst][2]}; "
                f"A {A.dtype}, B {B.dtype}). Different dtype, quantization or kernels."),
                [[lbl, lbl] for _, _, lbl in same]))
        else:
            rounding = (f"; both {A.dtype}: that much is 16-bit rounding of different kernels"
                        if np.nanmax(rels) > DRIFT_REL_L2 else "")
            findings.append(Finding("aligned", (
                f"Aligned: all {len(same)} shared boundaries match their namesakes (cosine >= {np.nanmin(coss):.4f}, "
                f"relative L2 <= {np.nanmax(rels):.2e}{rounding})."), [[lbl, lbl] for _, _, lbl in same]))
        if offset is None:
            offset = 0
    if unmatched:
        findings.append(Finding("drift" if not findings else findings[0].kind,
                                f"No good match (cosine < {MATCH_COS}) for B's {','.join(unmatched)}."))
    if not findings:
        findings.append(Finding("drift", "The captures share no boundary names and no boundary matches well."))
    return findings, offset


# ---------------------------------------------------------------------------- entry points

def _on(sample: Sample, device: torch.device) -> Sample:
    """The sample's states moved to the device once (a no-op on CPU)."""
    if device.type == "cpu":
        return sample
    states = {k: v.to(device, non_blocking=True) for k, v in sample.states.items()}
    return Sample(sample.run_id, sample.labels, states, sample.ctx_hash, sample.n_layers, sample.hidden, sample.dtype)


def default_device() -> torch.device:
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def align_samples(A: Sample, B: Sample, cka_tokens: int | None = None,
                  device: torch.device | str | None = None) -> Alignment:
    """Align two samples. CKA uses `cka_tokens` tokens (default: 1024 on CPU, 4096 on a GPU)."""
    import torch

    device = torch.device(device) if device is not None else default_device()
    if cka_tokens is None:
        cka_tokens = CKA_TOKENS if device.type == "cpu" else 4 * CKA_TOKENS
    if A.hidden != B.hidden:
        raise SpecLensError(f"runs '{A.run_id}' (hidden {A.hidden}) and '{B.run_id}' (hidden {B.hidden}) have "
                            f"different hidden sizes; align captures of the same target")
    _, ia, ib = np.intersect1d(A.ctx_hash, B.ctx_hash, assume_unique=False, return_indices=True)
    if len(ia) == 0:
        raise SpecLensError(f"runs '{A.run_id}' and '{B.run_id}' share no tokens (different prompts, tokenizer or "
                            f"chat template); capture both from the same --prompts file")
    order = np.argsort(ia)
    ia, ib = torch.from_numpy(ia[order]).to(device), torch.from_numpy(ib[order]).to(device)
    X, Y = stack_states(_on(A, device), ia, device), stack_states(_on(B, device), ib, device)
    same = [(A.labels.index(lbl), j) for j, lbl in enumerate(B.labels) if lbl in A.labels]
    mats = pair_matrices(X, Y, same)
    cos, rel, nfa, nfb = mats["cosine"], mats["rel_l2"], mats["nonfinite_a"], mats["nonfinite_b"]
    cka, m = cka_matrix(X, Y, mats["all_finite"], cka_tokens)
    del X, Y
    findings, offset = verdict(A, B, cos, rel, cka)
    path = best_path(cos)
    warnings = []
    for lbl, k in zip(A.labels, nfa):
        if k:
            warnings.append(f"A ({A.run_id}) {lbl}: {int(k)} of {len(ia)} shared tokens hold NaN or inf (left out)")
    for lbl, k in zip(B.labels, nfb):
        if k:
            warnings.append(f"B ({B.run_id}) {lbl}: {int(k)} of {len(ib)} shared tokens hold NaN or inf (left out)")
    bad = [f"A {lbl} ({int(k)})" for lbl, k in zip(A.labels, nfa) if k] + \
          [f"B {lbl} ({int(k)})" for lbl, k in zip(B.labels, nfb) if k]
    if bad:
        findings[0].text += (f" NaN/inf tokens at {', '.join(bad[:6])}{', ...' if len(bad) > 6 else ''}: "
                             f"left out of those boundaries' figures, never averaged in.")
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
        verdict=findings, offset=offset, per_boundary=per, warnings=warnings)


def _f(x) -> float | None:
    x = float(x)
    return None if not np.isfinite(x) else round(x, 6)


def _mat(m: np.ndarray) -> list[list[float | None]]:
    return [[_f(v) for v in row] for row in m]


def align_runs(run_a: str, run_b: str, root: Path | None = None, cka_tokens: int | None = None,
               device: torch.device | str | None = None) -> Alignment:
    return align_samples(load_sample(run_a, root), load_sample(run_b, root), cka_tokens, device)


def get_alignment(run_a: str, run_b: str, root: Path | None = None) -> Alignment:
    """Cached alignment (data/alignments/), recomputed when either run changed."""
    ma, mb = RunDir.open(run_a, root).manifest(), RunDir.open(run_b, root).manifest()
    key = f"{VERSION}|{ma.get('updated')}|{mb.get('updated')}"
    cache = paths(root).alignments / f"{run_a}__{run_b}.json"
    if cache.exists():
        try:
            d = json.loads(cache.read_text())
            if d.get("_key") == key:
                d.pop("_key")
                return Alignment.from_json(d)
        except (json.JSONDecodeError, KeyError, TypeError):
            pass
    al = align_runs(run_a, run_b, root)
    cache.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(cache, {**al.to_json(), "_key": key})
    return al
