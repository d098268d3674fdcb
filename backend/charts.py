"""Figure builders for the dashboard: pure functions from catalog DataFrames or an Alignment to plotly
figures, plus the tables behind them (what a chart's CSV download holds). No Streamlit, no I/O."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from backend import coords

if TYPE_CHECKING:  # the alignment module imports torch; the statistics page need not
    from backend.align import Alignment

# metric -> (axis/colorbar title, lower is better)
METRICS: dict[str, tuple[str, bool]] = {
    "cosine": ("mean cosine", False),
    "rel_l2": ("mean relative L2 ||a-b||/||b||", True),
    "cka": ("linear CKA", False),
}
# per-boundary statistic (catalog column) -> axis title
STATS: dict[str, str] = {
    "mean_norm": "mean token L2 norm",
    "norm_p99": "token L2 norm, 99th percentile",
    "rms": "RMS over all values",
    "max_abs": "max |value|",
    "kurtosis": "kurtosis (all values pooled)",
    "outlier_ratio": "outlier ratio (max |value| / RMS)",
    "nonfinite_tokens": "tokens holding NaN or inf",
}
_CELL_TEXT_MAX = 24          # write values into heatmap cells up to this many rows/columns
_DASHES = ["solid", "dash", "dot", "dashdot", "longdash"]
_SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x"]
_LAYOUT = dict(template="plotly_white", margin=dict(l=70, r=30, t=70, b=60), font=dict(size=13))


def _matrix(m: list[list[float | None]]) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in m], dtype=float)


# ---------------------------------------------------------------------------- alignment

def alignment_heatmap(al: Alignment, metric: str = "cosine") -> go.Figure:
    """A (rows) x B (columns) matrix of one metric, with the best-match path over it."""
    title, lower_better = METRICS[metric]
    z = _matrix(getattr(al, metric))
    small = max(z.shape) <= _CELL_TEXT_MAX
    fig = go.Figure(go.Heatmap(
        z=z, x=al.b_labels, y=al.a_labels, colorscale="Viridis", reversescale=lower_better,
        colorbar=dict(title=dict(text=title, side="right")),
        texttemplate="%{z:.3g}" if small else None, textfont=dict(size=11),
        hovertemplate=f"A %{{y}} x B %{{x}}<br>{title}: %{{z:.5g}}<extra></extra>"))
    from backend.align import MATCH_COS   # a "best" match below this is noise (e.g. a rotated basis): not drawn

    row = max(14, min(46, 900 // max(1, len(al.a_labels))))      # pixels per A boundary
    path = [p for p in al.path if p["cosine"] is not None and p["cosine"] >= MATCH_COS]
    fig.add_trace(go.Scatter(
        x=[p["b"] for p in path], y=[p["a"] for p in path], mode="markers", name=f"best match (cosine >= {MATCH_COS})",
        marker=dict(symbol="square-open", size=int(row * 0.8), color="#e4002b", line=dict(width=3)),
        hovertemplate="B %{x} best matches A %{y}<extra></extra>"))
    fig.update_layout(
        **_LAYOUT, height=max(380, 170 + row * len(al.a_labels)),
        title=dict(text=f"{title}: A = {al.a} vs B = {al.b} ({al.tokens} shared tokens)"),
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0),
        xaxis=dict(title=f"B: {al.b}", type="category", side="bottom"),
        yaxis=dict(title=f"A: {al.a}", type="category", autorange="reversed"))
    return fig


def alignment_long(al: Alignment) -> pd.DataFrame:
    """Every (A, B) boundary pair with all three metrics and whether it lies on the best-match path."""
    on_path = {(p["a"], p["b"]) for p in al.path}
    cos, rel, cka = _matrix(al.cosine), _matrix(al.rel_l2), _matrix(al.cka)
    rows = [{"a_run": al.a, "a_boundary": a, "b_run": al.b, "b_boundary": b, "cosine": cos[i, j],
             "rel_l2": rel[i, j], "cka": cka[i, j], "on_path": (a, b) in on_path}
            for i, a in enumerate(al.a_labels) for j, b in enumerate(al.b_labels)]
    return pd.DataFrame(rows)


def alignment_table(al: Alignment) -> pd.DataFrame:
    """One row per B boundary: its best match in A (none when even the best cosine is weak) and the
    same-name metrics."""
    from backend.align import MATCH_COS

    cols = ["boundary", "best_match", "best_cosine", "cosine", "rel_l2", "cka", "nonfinite_a", "nonfinite_b"]
    df = pd.DataFrame(al.per_boundary).reindex(columns=cols)
    weak = df["best_cosine"].isna() | (df["best_cosine"] < MATCH_COS)
    df["best_match"] = df["best_match"].where(~weak, f"none (cos < {MATCH_COS})")
    return df.rename(columns={
        "boundary": "B boundary", "best_match": "best match in A", "best_cosine": "best cosine",
        "cosine": "cosine (same name)", "rel_l2": "rel L2 (same name)", "cka": "CKA (same name)",
        "nonfinite_a": "NaN/inf tokens A", "nonfinite_b": "NaN/inf tokens B"})


# ---------------------------------------------------------------------------- per-boundary statistics

def boundary_order(stats: pd.DataFrame) -> list[str]:
    return coords.sort_labels(list(dict.fromkeys(stats["boundary"]))) if len(stats) else []


def stat_frame(stats: pd.DataFrame, stat: str) -> pd.DataFrame:
    return stats.reindex(columns=["run_id", "boundary", "ord", stat]).reset_index(drop=True)


def stat_curves(stats: pd.DataFrame, stat: str, runs: list[str]) -> go.Figure:
    """One line per run: the statistic at each boundary, x in stream order (S_0 ... S_N, F)."""
    fig = go.Figure()
    for k, run in enumerate(runs):
        g = stats[stats["run_id"] == run].sort_values("ord")
        if len(g):   # dashes and symbols keep identical curves (same model twice) tellable apart
            fig.add_trace(go.Scatter(x=g["boundary"], y=g[stat], mode="lines+markers", name=run,
                                     line=dict(dash=_DASHES[k % len(_DASHES)], width=2.5),
                                     marker=dict(symbol=_SYMBOLS[k % len(_SYMBOLS)], size=9),
                                     hovertemplate=f"{run} %{{x}}: %{{y:.5g}}<extra></extra>"))
    fig.update_layout(
        **_LAYOUT, height=460, title=dict(text=f"{STATS[stat]} per boundary"),
        xaxis=dict(title="boundary (stream order)", type="category", categoryorder="array",
                   categoryarray=boundary_order(stats)),
        yaxis=dict(title=STATS[stat], rangemode="tozero" if stat == "nonfinite_tokens" else "normal"),
        legend=dict(title="run"))
    return fig


def outlier_frame(stats: pd.DataFrame, run: str) -> pd.DataFrame:
    """Long table of one run's top dims per boundary: boundary, ord, rank, dim, max_abs, and max_abs in
    units of that boundary's RMS (so depth-wide growth of the stream does not hide an outlier)."""
    g = stats[stats["run_id"] == run].sort_values("ord")
    rows = [{"run_id": run, "boundary": r.boundary, "ord": int(r.ord), "rank": k + 1, "dim": int(d),
             "max_abs": float(v), "x_rms": float(v) / float(r.rms) if r.rms else math.nan}
            for r in g.itertuples() for k, (d, v) in enumerate(zip(list(r.top_dims), list(r.top_dims_max_abs)))]
    return pd.DataFrame(rows, columns=["run_id", "boundary", "ord", "rank", "dim", "max_abs", "x_rms"])


def outlier_heatmap(frame: pd.DataFrame, run: str, max_dims: int = 24) -> go.Figure:
    """Hidden dimensions (rows, most extreme first) x boundaries: max |value| / RMS where the dim is in that
    boundary's top list; blank where it is not."""
    order = coords.sort_labels(list(dict.fromkeys(frame["boundary"])))
    dims = list(frame.groupby("dim")["x_rms"].max().sort_values(ascending=False).index[:max_dims])
    cells = frame[frame["dim"].isin(dims)]
    ratio = cells.pivot_table(index="dim", columns="boundary", values="x_rms", aggfunc="max").reindex(index=dims, columns=order)
    peak = cells.pivot_table(index="dim", columns="boundary", values="max_abs", aggfunc="max").reindex(index=dims, columns=order)
    fig = go.Figure(go.Heatmap(
        z=ratio.to_numpy(dtype=float), customdata=peak.to_numpy(dtype=float), x=order, y=[f"dim {d}" for d in dims],
        colorscale="YlOrRd", colorbar=dict(title=dict(text="max |value| / RMS", side="right")), hoverongaps=False,
        xgap=1, ygap=1,
        hovertemplate="%{y} at %{x}: max |value| %{customdata:.4g} = %{z:.3g} x RMS<extra></extra>"))
    fig.update_layout(
        **_LAYOUT, height=max(360, 130 + 24 * len(dims)),
        title=dict(text=f"{run}: outlier dimensions, max |value| in units of the boundary's RMS "
                        f"(blank: not in that boundary's top {_top_k(frame)})"),
        xaxis=dict(title="boundary (stream order)", type="category", showgrid=False),
        yaxis=dict(title="hidden dimension", type="category", autorange="reversed", showgrid=False))
    return fig


def _top_k(frame: pd.DataFrame) -> int:
    return int(frame["rank"].max()) if len(frame) else 0


# ---------------------------------------------------------------------------- runs

def filter_runs(runs: pd.DataFrame, **wanted: list[str]) -> pd.DataFrame:
    """Rows whose column value is in the wanted list, per column; an empty list keeps every row."""
    keep = pd.Series(True, index=runs.index)
    for col, values in wanted.items():
        if values:
            keep &= runs[col].isin(values)
    return runs[keep]


def compact_labels(labels: str | list[str]) -> str:
    """'S_0,S_1,S_2,S_3,F' -> 'S_0..S_3,F': consecutive boundaries as ranges."""
    items = labels.split(",") if isinstance(labels, str) else list(labels)
    groups: list[list[tuple[str, int | None]]] = []
    for lbl in filter(None, items):
        i = int(lbl[2:]) if lbl.startswith("S_") and lbl[2:].isdigit() else None
        if groups and i is not None and groups[-1][-1][1] is not None and groups[-1][-1][1] + 1 == i:
            groups[-1].append((lbl, i))
        else:
            groups.append([(lbl, i)])
    return ",".join(g[0][0] if len(g) == 1 else f"{g[0][0]}..{g[-1][0]}" if len(g) > 2 else f"{g[0][0]},{g[1][0]}"
                    for g in groups)


def runs_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs table as shown: one row per run, progress of unfinished runs as a fraction, a link to the
    statistics of complete ones."""
    def frac(done, total, status) -> float | None:
        if status == "complete" or _nan(total) or _nan(done) or float(total) <= 0:
            return None
        return float(done) / float(total)

    out = pd.DataFrame({
        "run_id": runs["run_id"],
        "stats": [f"stats?runs={r}&run={r}" if s == "complete" else None for r, s in zip(runs["run_id"], runs["status"])],
        "status": runs["status"], "kind": runs["kind"], "model": runs["model"],
        "engine": runs["engine"], "dtype": runs["dtype"], "boundaries": runs["boundaries"].map(compact_labels),
        "tokens": runs["tokens"], "nonfinite_tokens": runs["nonfinite_tokens"],
        "progress": [frac(d, t, s) for d, t, s in zip(runs["progress_done"], runs["progress_total"], runs["status"])],
        "error": runs["error"].fillna(""), "created": runs["created"],
    })
    return out.reset_index(drop=True)


def progress(done, total) -> tuple[int, int]:
    """(done, total) prompts of a run as ints; missing values count as 0."""
    return (0 if _nan(done) else int(done)), (0 if _nan(total) else int(total))


def _nan(x) -> bool:
    try:
        return math.isnan(float(x))
    except (TypeError, ValueError):
        return True
