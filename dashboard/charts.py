"""Figure builders for the dashboard: pure functions from catalog DataFrames or an Alignment to plotly
figures, plus the tables behind them (what a chart's CSV download holds). No Streamlit, no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from backend import coords, metrics, stats_compare
from dashboard.figure_spec import FigureSpec, axis_name, axis_names, subplots

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

def _template() -> str:
    """plotly_white's layout with its defaults for the trace types used here only: applying the full template
    copies defaults for two dozen trace types into every figure (about 20 ms each, a page has several)."""
    import plotly.io as pio

    if "speclens" not in pio.templates:
        base = pio.templates["plotly_white"]
        pio.templates["speclens"] = go.layout.Template(
            layout=base.layout, data={t: base.data[t] for t in ("bar", "heatmap", "scatter")})
    return "speclens"


_LAYOUT = dict(template=_template(), margin=dict(l=70, r=30, t=70, b=60), font=dict(size=13))


def _matrix(m: list[list[float | None]]) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in m], dtype=float)


# ---------------------------------------------------------------------------- alignment

@dataclass(frozen=True)
class AlignmentScale:
    """One metric's fixed colour scale: the same for every pair, so two pairs' heatmaps compare and a pair whose
    values all lie near one number (a rotated basis: cosines of +-0.006) is not stretched over the whole range.
    log: the colour is log10 of the value (values below 10**zmin take the lowest colour)."""

    zmin: float
    zmax: float
    colorscale: tuple[tuple[float, str], ...]
    log: bool
    short: str          # under the colorbar title
    note: str           # the page caption's sentence

    def colorbar(self, title: str) -> dict:
        bar = dict(title=dict(text=f"{title}<br><sup>{self.short}</sup>", side="right"))
        if self.log:
            vals = list(range(int(self.zmin), int(self.zmax) + 1))
            text = [f"{10.0 ** v:g}" for v in vals]
            text[0], text[-1] = f"\u2264{text[0]}", f"\u2265{text[-1]}"
            bar.update(tickvals=vals, ticktext=text)
        return bar


def _scale(colors: list[str], reverse: bool = False) -> tuple[tuple[float, str], ...]:
    cs = colors[::-1] if reverse else colors
    return tuple((i / (len(cs) - 1), c) for i, c in enumerate(cs))


# docs/DASHBOARD.md: cosine -1..1 diverging (0 = white: unrelated); relative L2 log10 from 1e-4 (identical) to 10,
# so bf16 rounding (1e-3..1e-2) has its own colours; CKA 0..1
_RDBU = ["#67001f", "#b2182b", "#d6604d", "#f4a582", "#fddbc7", "#f7f7f7", "#d1e5f0", "#92c5de", "#4393c3",
         "#2166ac", "#053061"]
_VIRIDIS = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b",
            "#fde725"]
ALIGNMENT_SCALES: dict[str, AlignmentScale] = {
    "cosine": AlignmentScale(-1.0, 1.0, _scale(_RDBU), False, "fixed scale -1 to 1",
                             "cosine on a fixed scale from -1 (red) through 0 (white: unrelated directions, as in a "
                             "rotated basis) to 1 (blue: same direction)"),
    "rel_l2": AlignmentScale(-4.0, 1.0, _scale(_VIRIDIS, reverse=True), True, "fixed log scale 1e-4 to 10",
                             "relative L2 on a fixed log scale from 1e-4 or less (yellow: identical) to 10 (purple); "
                             "bf16 rounding lies near 1e-3 to 1e-2, unrelated states near 1"),
    "cka": AlignmentScale(0.0, 1.0, _scale(_VIRIDIS), False, "fixed scale 0 to 1",
                          "linear CKA on a fixed scale from 0 (purple: unrelated) to 1 (yellow: same up to rotation "
                          "and scale)"),
}


def alignment_scale_note(metric: str) -> str:
    """The page caption's words for the metric's colour scale (the same for every pair)."""
    return ALIGNMENT_SCALES[metric].note


def alignment_heatmap(al: Alignment, metric: str = "cosine") -> go.Figure:
    """A (rows) x B (columns) matrix of one metric on its fixed colour scale (ALIGNMENT_SCALES), with the
    best-match path over it."""
    title, _ = METRICS[metric]
    sc = ALIGNMENT_SCALES[metric]
    vals = _matrix(getattr(al, metric))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.log10(np.maximum(vals, 10.0 ** sc.zmin)) if sc.log else vals
    small = max(vals.shape) <= _CELL_TEXT_MAX
    text = [["" if np.isnan(v) else format(v, ".2g" if sc.log else ".3g") for v in row] for row in vals]
    fig = go.Figure(go.Heatmap(
        z=z, x=al.b_labels, y=al.a_labels, zmin=sc.zmin, zmax=sc.zmax, zauto=False, colorscale=sc.colorscale,
        colorbar=sc.colorbar(title), customdata=vals, text=text, hoverongaps=False,
        texttemplate="%{text}" if small else None, textfont=dict(size=11),
        hovertemplate=f"A %{{y}} x B %{{x}}<br>{title}: %{{customdata:.5g}}<extra></extra>"))
    from backend.align import MATCH_COS  # a "best" match below this is noise (e.g. a rotated basis): not drawn

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


STAT_MODES: dict[str, str] = {
    "values": "values",
    "diff": "difference (candidate - reference)",
    "rel": "relative difference (%)",
}


def _with_depth(stats: pd.DataFrame) -> pd.DataFrame:
    return stats if "depth" in stats else stats_compare.with_depth(stats, {})


def stat_frame(stats: pd.DataFrame, stat: str) -> pd.DataFrame:
    """What the per-boundary chart shows (its CSV): run, boundary, its depth (S_b at b, F after S_N), the value."""
    return _with_depth(stats).reindex(columns=["run_id", "boundary", "ord", "depth", stat]).reset_index(drop=True)


def _gapped(depth: list[float], *cols: list) -> tuple[list, ...]:
    """Points in depth order with a None between two that are not neighbours (a boundary the capture lacks), so
    plotly leaves a gap there instead of drawing a line through it."""
    out: tuple[list, ...] = ([],) + tuple([] for _ in cols)
    prev = None
    for i, d in enumerate(depth):
        if prev is not None and d - prev > 1:
            for o in out:
                o.append(None)
        out[0].append(d)
        for o, c in zip(out[1:], cols):
            o.append(c[i])
        prev = d
    return out


def _depth_axis(frame: pd.DataFrame, most: int = 34) -> dict:
    """A linear x axis in depth with the boundary labels as ticks (every k-th one when there are many, F kept)."""
    ticks = frame.drop_duplicates("depth").sort_values("depth")
    ticks = ticks[ticks["depth"].notna()]
    if len(ticks) > most:
        step = math.ceil(len(ticks) / most)
        keep = [i % step == 0 or b == "F" for i, b in enumerate(ticks["boundary"])]
        ticks = ticks[keep]
    return dict(title="boundary (x = depth: S_b at b, F after S_N; gaps: boundaries a capture lacks)",
                type="linear", tickmode="array", tickvals=ticks["depth"].tolist(), ticktext=ticks["boundary"].tolist(),
                zeroline=False)


def _stat_style(k: int) -> dict:
    """Colour, dash and symbol of the k-th chosen run, the same in the values and the difference charts."""
    return dict(line=dict(color=_PALETTE[k % len(_PALETTE)], dash=_DASHES[k % len(_DASHES)], width=2.5),
                marker=dict(symbol=_SYMBOLS[k % len(_SYMBOLS)], size=9, color=_PALETTE[k % len(_PALETTE)]))


def stat_curves(stats: pd.DataFrame, stat: str, runs: list[str]) -> go.Figure:
    """One line per run: the statistic at each boundary, x spaced by depth (stats_compare.with_depth); a boundary a
    capture lacks is a gap in its line, never a segment drawn across it."""
    d = _with_depth(stats)
    fig = go.Figure()
    for k, run in enumerate(runs):
        g = d[d["run_id"] == run].sort_values("depth")
        if len(g):   # dashes and symbols keep identical curves (same model twice) tellable apart
            x, y, lbl = _gapped(g["depth"].tolist(), g[stat].tolist(), g["boundary"].tolist())
            fig.add_trace(go.Scatter(x=x, y=y, customdata=lbl, mode="lines+markers", name=run, **_stat_style(k),
                                     hovertemplate=f"{run} %{{customdata}}: %{{y:.5g}}<extra></extra>"))
    fig.update_layout(
        **_LAYOUT, height=460, title=dict(text=f"{STATS[stat]} per boundary"), xaxis=_depth_axis(d),
        yaxis=dict(title=STATS[stat], rangemode="tozero" if stat == "nonfinite_tokens" else "normal"),
        legend=dict(title="run"))
    return fig


def stat_diff_frame(comp: stats_compare.StatComparison) -> pd.DataFrame:
    """What the difference chart shows (its CSV): per candidate and boundary both hold, reference, value, difference
    and relative difference."""
    return comp.frame.reset_index(drop=True)


def stat_diff_curves(comp: stats_compare.StatComparison, mode: str, runs: list[str]) -> go.Figure:
    """Per candidate: the statistic minus the reference's (mode "diff") or the relative difference in % (mode
    "rel") at each boundary both hold, x by depth, gaps where either lacks a boundary."""
    f, fig = comp.frame, go.Figure()
    label = STATS[comp.stat]
    for k, run in enumerate(runs):
        g = f[f["run_id"] == run].sort_values("depth")
        if run == comp.reference or not len(g):
            continue
        y = (g["diff"] if mode == "diff" else 100 * g["rel"]).astype(float)
        y = [None if not math.isfinite(v) else v for v in y]
        x, yy, lbl, ref, val = _gapped(g["depth"].tolist(), y, g["boundary"].tolist(), g["reference"].tolist(),
                                       g["value"].tolist())
        fig.add_trace(go.Scatter(
            x=x, y=yy, customdata=[None if b is None else [b, r, v] for b, r, v in zip(lbl, ref, val)],
            mode="lines+markers", name=f"{run} - {comp.reference}", **_stat_style(k),
            hovertemplate=f"{run} %{{customdata[0]}}: %{{customdata[2]:.5g}} vs %{{customdata[1]:.5g}}: "
                          f"%{{y:+.4g}}{'%' if mode == 'rel' else ''}<extra></extra>"))
    fig.add_hline(y=0, line=dict(color="#555", dash="dash"), annotation_text=f"reference {comp.reference}",
                  annotation_position="bottom right")
    what = "difference" if mode == "diff" else "relative difference"
    fig.update_layout(
        **_LAYOUT, height=480, legend=dict(title="candidate - reference"),
        title=dict(text=f"{label}: {what} from {comp.reference}"),
        xaxis=_depth_axis(f if len(f) else _with_depth(pd.DataFrame(columns=["run_id", "boundary"]))),
        yaxis=dict(title=f"{label}, candidate - reference" if mode == "diff" else
                   f"{label}: (candidate - reference) / |reference|", ticksuffix="%" if mode == "rel" else None))
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
    ratio = cells.pivot_table(index="dim", columns="boundary", values="x_rms",
                              aggfunc="max").reindex(index=dims, columns=order)
    peak = cells.pivot_table(index="dim", columns="boundary", values="max_abs",
                             aggfunc="max").reindex(index=dims, columns=order)
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


def tag_list(tags) -> list[str]:
    """The catalog's comma-separated tags of one run as a list."""
    return [t for t in str(tags).split(",") if t] if isinstance(tags, str) else []


def tag_options(runs: pd.DataFrame) -> list[str]:
    return sorted({t for tags in runs["tags"].tolist() for t in tag_list(tags)})


def with_any_tag(runs: pd.DataFrame, tags: list[str]) -> pd.DataFrame:
    """Runs carrying at least one of the tags (every run when the list is empty)."""
    if not tags:
        return runs
    wanted = set(tags)
    return runs[[bool(wanted & set(tag_list(t))) for t in runs["tags"].tolist()]]


def engine_label(engine, version) -> str | None:
    """'vllm' + '0.24.0' -> 'vllm 0.24.0'."""
    if not isinstance(engine, str):
        return None
    return f"{engine} {version}" if isinstance(version, str) and version else engine


def run_links(run_ids: pd.Series) -> pd.Series:
    """The run page's link (`run?id=RUN`) of each run id: what every "open" link goes to."""
    return "run?id=" + run_ids.astype(str).map(lambda r: quote(r, safe=""))


def runs_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs table as shown: one row per run (captures and bench runs), progress of unfinished runs as a
    fraction, a link to the run's page (any status),
    the bench figures (tau, speedup over the paired baseline) and the user's tags, notes and pinned flag."""
    def frac(done, total, status) -> float | None:
        if status == "complete" or _nan(total) or _nan(done) or float(total) <= 0:
            return None
        return float(done) / float(total)

    def col(name: str) -> pd.Series:
        return runs[name] if name in runs else pd.Series([None] * len(runs), index=runs.index, dtype=object)

    def py(name: str) -> list:           # plain lists: iterating Arrow-backed columns element by element is slow
        return col(name).tolist()

    out = pd.DataFrame({          # the bench figures next to the id: on the first screen of a wide table
        "run_id": runs["run_id"],
        "view": run_links(runs["run_id"]),
        "status": runs["status"], "kind": runs["kind"], "tau": col("tau"), "speedup": col("speedup"),
        "drafter": col("drafter"), "model": runs["model"],
        "engine": [engine_label(e, v) for e, v in zip(py("engine"), py("engine_version"))],
        "dataset": col("dataset"), "pinned": col("pinned").fillna(False).astype(bool), "tags": col("tags").fillna(""),
        "dtype": runs["dtype"],
        "boundaries": runs["boundaries"].map(compact_labels), "tokens": runs["tokens"],
        "nonfinite_tokens": runs["nonfinite_tokens"],
        "progress": [frac(d, t, s) for d, t, s in zip(py("progress_done"), py("progress_total"), py("status"))],
        "notes": col("notes").fillna("").map(lambda n: n if len(n) <= 80 else n[:79] + "\u2026"),
        "error": runs["error"].fillna(""), "created": runs["created"],
    })
    return out.reset_index(drop=True)


_OPTIONAL = {"bench": ["pinned", "drafter", "tau", "speedup", "finding"], "capture": ["boundaries", "nonfinite_tokens"]}


def lint_only(runs: pd.DataFrame) -> pd.Series:
    """The rows that are `check-drafter --lint-only` runs (engine `lint`: config files read, no model loaded, no
    tokens): the Runs page hides them unless asked."""
    return (runs["kind"] == "check") & (runs["engine"] == "lint")


def text_width(values: pd.Series, most: int = 320) -> int:
    """A text column's width in pixels that shows its longest value whole (about 7.5 px a character in the grid's
    font), at most `most`: names like `AngelSlim/Qwen3-8B_eagle3` are read, not cut."""
    longest = max((len(str(v)) for v in values.tolist() if isinstance(v, str)), default=0)
    return int(min(most, max(80, 7.5 * longest + 24)))


def runs_columns(table: pd.DataFrame) -> list[str]:
    """The runs table's columns worth showing: bench columns only when bench runs are shown, capture columns only
    when captures are, progress only for unfinished runs."""
    kinds = set(table["kind"].dropna())
    drop = {c for kind, cols in _OPTIONAL.items() if kind not in kinds for c in cols}
    drop |= {c for c in ("finding", "fed as") if c in table and not (table[c].fillna("") != "").any()}
    if table["progress"].isna().all():
        drop.add("progress")
    return [c for c in table.columns if c not in drop]


def progress(done, total) -> tuple[int, int]:
    """(done, total) prompts of a run as ints; missing values count as 0."""
    return (0 if _nan(done) else int(done)), (0 if _nan(total) else int(total))


def _nan(x) -> bool:
    try:
        return math.isnan(float(x))
    except (TypeError, ValueError):
        return True


# ---------------------------------------------------------------------------- bench comparison (backend/compare.py)

_PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
            "#bcbd22"]


def run_colors(run_ids: list[str]) -> dict[str, str]:
    """One colour per run, the same in every chart of the page."""
    return {r: _PALETTE[i % len(_PALETTE)] for i, r in enumerate(run_ids)}


def accepted_histogram(hist: pd.DataFrame, run_ids: list[str]) -> go.Figure:
    """Share of verify steps per accepted length (0..K), one bar series per run on shared axes."""
    colors, fig = run_colors(run_ids), FigureSpec()
    for r in run_ids:
        g = hist[hist["run_id"] == r]
        if len(g):
            fig.add_trace(dict(type="bar", x=g["accepted"].to_numpy(), y=g["share"].to_numpy(), name=r,
                               marker=dict(color=colors[r]), customdata=g["steps"].to_numpy(),
                               hovertemplate=f"{r}: %{{y:.1%}} of verify steps accepted %{{x}} drafts "
                                             "(%{customdata} steps)<extra></extra>"))
    k = int(hist["accepted"].max()) if len(hist) else 0
    fig.update_layout(**_LAYOUT, height=420, barmode="group", bargap=0.15,
                      title=dict(text="Accepted draft tokens per verify step (share of each run's steps)"),
                      xaxis=dict(title="draft tokens accepted in one step", tickmode="array",
                                 tickvals=list(range(k + 1)), dtick=1),
                      yaxis=dict(title="share of verify steps", tickformat=".0%", rangemode="tozero"),
                      legend=dict(title="run"))
    return fig.figure()


def acceptance_curves(pos: pd.DataFrame, run_ids: list[str]) -> go.Figure:
    """Per-position acceptance: the share of verify steps that accepted draft position i (1..K)."""
    colors, fig = run_colors(run_ids), FigureSpec()
    for k, r in enumerate(run_ids):
        g = pos[pos["run_id"] == r].sort_values("position")
        if len(g):
            fig.add_trace(dict(type="scatter", x=g["position"].to_numpy(), y=g["rate"].to_numpy(),
                               mode="lines+markers", name=r,
                               line=dict(color=colors[r], width=2.5, dash=_DASHES[k % len(_DASHES)]),
                               marker=dict(symbol=_SYMBOLS[k % len(_SYMBOLS)], size=9),
                               hovertemplate=f"{r}: position %{{x}} accepted in %{{y:.1%}} of steps"
                                             "<extra></extra>"))
    fig.update_layout(**_LAYOUT, height=420, title=dict(text="Per-position acceptance rate"),
                      xaxis=dict(title="draft position", dtick=1),
                      yaxis=dict(title="steps that accepted this position", tickformat=".0%", range=[0, 1.02]),
                      legend=dict(title="run"))
    return fig.figure()


def prompt_speed_chart(frame: pd.DataFrame, run_id: str) -> go.Figure:
    """One bench run's tokens/s per prompt (dashboard/run_view.prompt_speeds: repeats averaged), beside plain decoding's
    on the same prompt when the run has a paired baseline: the prompts where drafting pays and where it does not."""
    fig = FigureSpec()
    text = frame["text"] if "text" in frame else frame["prompt"]
    hover = "prompt %{customdata[0]} (%{customdata[1]}): %{y:.1f} tokens/s<br>%{customdata[2]}<extra>%{fullData.name}"
    data = list(zip(frame["prompt"], frame["category"], text))
    if frame["plain tokens/s"].notna().any():
        fig.add_trace(dict(type="scatter", x=frame["#"].to_numpy(), y=frame["plain tokens/s"].to_numpy(),
                           mode="markers", name="plain decoding",
                           marker=dict(color="#7f7f7f", symbol="circle-open", size=8), customdata=data,
                           hovertemplate=hover + "</extra>"))
    fig.add_trace(dict(type="scatter", x=frame["#"].to_numpy(), y=frame["tokens/s"].to_numpy(), mode="markers",
                       name=run_id, marker=dict(color=_PALETTE[0], size=8), customdata=data,
                       hovertemplate=hover + "</extra>"))
    fig.update_layout(**_LAYOUT, height=420, title=dict(text="Tokens/s per prompt (mean over repeats)"),
                      xaxis=dict(title="prompt (# in the prompts file's order)"),
                      yaxis=dict(title="tokens/s", rangemode="tozero"), legend=dict(title="run"))
    return fig.figure()


def _ci_arrays(values, lo, hi) -> dict:
    """Asymmetric error bars from a value and its interval; none where either is missing (a bar of zero length would
    read as an exact figure: metrics.interval_shown leaves a few prompts' figure without one)."""
    v = pd.to_numeric(pd.Series(list(values)), errors="coerce")
    up = (pd.to_numeric(pd.Series(list(hi)), errors="coerce") - v).clip(lower=0)
    down = (v - pd.to_numeric(pd.Series(list(lo)), errors="coerce")).clip(lower=0)
    return dict(type="data", symmetric=False, array=[None if x != x else x for x in up.tolist()],
                arrayminus=[None if x != x else x for x in down.tolist()], visible=True, thickness=1.5, width=6)


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    return df[name] if name in df else pd.Series([np.nan] * len(df), index=df.index)


_TOTAL_PATTERN = dict(shape="/", fgcolor="#ffffff", size=7, solidity=0.35)   # total tokens / total time: hatched
THROUGHPUT_NAMES = {"tokens_per_s": "mean per-prompt tokens/s (Spec-Bench)",
                    "throughput_total": "total tokens / total time (vLLM, SGLang benches)"}


def _side_by_side(titles: list[str], shared_yaxes: bool = False) -> FigureSpec:
    return subplots(len(titles), titles, 0.08, shared_yaxes=shared_yaxes)


def _categories(fig: FigureSpec, runs: list[str]) -> None:
    """Every x axis a category axis in the runs' order."""
    for ax in axis_names(fig, "x"):
        fig.axis(ax, type="category", categoryorder="array", categoryarray=runs)


def throughput_bars(fig_df: pd.DataFrame) -> go.Figure:
    """Both throughput definitions side by side (backend.metrics.THROUGHPUT), each run beside its baseline (grey),
    error bars: 95% bootstrap intervals over prompts."""
    runs = list(fig_df["run_id"])
    colors = run_colors(runs)
    fig = _side_by_side(["mean per-prompt tokens/s", "total tokens / total time"], shared_yaxes=True)
    for i, key in enumerate(THROUGHPUT_NAMES, start=1):
        fig.add_trace(dict(type="bar", x=runs, y=_col(fig_df, key).to_numpy(), name="run", legendgroup="run",
                           showlegend=i == 1, marker=dict(color=[colors[r] for r in runs]),
                           error_y=_ci_arrays(_col(fig_df, key), _col(fig_df, f"{key}_ci_low"),
                                              _col(fig_df, f"{key}_ci_high")),
                           hovertemplate=f"%{{x}}: %{{y:.1f}} tokens/s ({THROUGHPUT_NAMES[key]})<extra></extra>"),
                      row=1, col=i)
        base = _col(fig_df, f"baseline_{key}")
        if base.notna().any():
            fig.add_trace(dict(type="bar", x=runs, y=base.to_numpy(), name="its baseline", legendgroup="base",
                               showlegend=i == 1, marker=dict(color="#b0b0b0"),
                               customdata=fig_df["baseline_run"].fillna("-").to_numpy(),
                               error_y=_ci_arrays(base, _col(fig_df, f"baseline_{key}_ci_low"),
                                                  _col(fig_df, f"baseline_{key}_ci_high")),
                               hovertemplate="baseline %{customdata}: %{y:.1f} tokens/s<extra></extra>"),
                          row=1, col=i)
    fig.update_layout(**_LAYOUT, height=440, barmode="group", title=dict(text="Throughput, two definitions (95% CI)"),
                      legend=dict(orientation="h", yanchor="bottom", y=1.08, xanchor="right", x=1.0))
    _categories(fig, runs)
    fig.axis("yaxis", title=dict(text="tokens/s"), rangemode="tozero")
    return fig.figure()


def speedup_chart(fig_df: pd.DataFrame, against: str) -> go.Figure:
    """Speedup over the baseline under both throughput definitions (solid: mean per-prompt tokens/s; hatched: total
    tokens / total time), 95% CI as error bars, a line at 1.0 (as fast as the baseline): below it, slower."""
    d = fig_df[fig_df["speedup"].notna() | _col(fig_df, "speedup_total").notna()]
    runs = list(fig_df["run_id"])
    colors = run_colors(runs)
    # a run whose speed figures are no verdict (backend/compare.py speed_noise) is drawn faint, its hover says why
    noisy = [isinstance(v, str) and bool(v) for v in _col(d, "speed_noise")]
    note = ["<br>no verdict: timing noise" if n else "" for n in noisy]
    fig = FigureSpec()
    for key, name, pattern in (("speedup", THROUGHPUT_NAMES["tokens_per_s"], None),
                               ("speedup_total", THROUGHPUT_NAMES["throughput_total"], _TOTAL_PATTERN)):
        y = pd.to_numeric(_col(d, key), errors="coerce")
        lo, hi = _col(d, f"{key}_ci_low"), _col(d, f"{key}_ci_high")
        marker = dict(color=[colors[r] for r in d["run_id"]], opacity=[0.35 if n else 1.0 for n in noisy])
        if pattern is not None:
            marker["pattern"] = pattern
        fig.add_trace(dict(
            type="bar", x=d["run_id"].to_numpy(), y=y.to_numpy(), name=name, marker=marker,
            customdata=list(zip(lo, hi, d["baseline_run"].fillna("-"), note)),
            error_y=_ci_arrays(y, lo, hi),
            hovertemplate=f"%{{x}}: %{{y:.2f}}x [%{{customdata[0]:.2f}}, %{{customdata[1]:.2f}}] over "
                          f"%{{customdata[2]}}, {name}%{{customdata[3]}}<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="#555", dash="dash"), annotation_text="as fast as the baseline",
                  annotation_position="top left")
    highs = pd.to_numeric(pd.concat([_col(d, "speedup_ci_high"), _col(d, "speedup_total_ci_high"), _col(d, "speedup"),
                                     _col(d, "speedup_total")]), errors="coerce").dropna().tolist()
    top = max([1.0, *highs])
    fig.update_layout(**_LAYOUT, height=440, barmode="group",
                      title=dict(text=f"Speedup over {against} (95% confidence interval)"),
                      xaxis=dict(title="run", type="category", categoryorder="array", categoryarray=runs),
                      yaxis=dict(title="speedup (x; below 1 = slower)", range=[0, top * 1.15]),
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1.0))
    return fig.figure()


def latency_chart(fig_df: pd.DataFrame) -> go.Figure:
    """TTFT and TPOT in milliseconds (mean over prompts), each run beside its baseline, 95% bootstrap intervals."""
    runs = list(fig_df["run_id"])
    colors = run_colors(runs)
    fig = _side_by_side(["TTFT: time to first token", "TPOT: time per later token"])
    for i, key in enumerate(("ttft", "tpot"), start=1):
        for prefix, name, col in (("", "run", [colors[r] for r in runs]), ("baseline_", "its baseline", "#b0b0b0")):
            ms = pd.to_numeric(_col(fig_df, f"{prefix}{key}"), errors="coerce") * 1000
            if not ms.notna().any():
                continue
            lo = pd.to_numeric(_col(fig_df, f"{prefix}{key}_ci_low"), errors="coerce") * 1000
            hi = pd.to_numeric(_col(fig_df, f"{prefix}{key}_ci_high"), errors="coerce") * 1000
            fig.add_trace(dict(type="bar", x=runs, y=ms.to_numpy(), name=name, legendgroup=name,
                               showlegend=i == 1, marker=dict(color=col), error_y=_ci_arrays(ms, lo, hi),
                               hovertemplate=f"%{{x}} ({name}): %{{y:.2f}} ms<extra></extra>"), row=1, col=i)
        fig.axis(axis_name("y", i), title=dict(text="ms"), rangemode="tozero")
    fig.update_layout(**_LAYOUT, height=400, barmode="group", title=dict(text="Latency (95% CI)"),
                      legend=dict(orientation="h", yanchor="bottom", y=1.08, xanchor="right", x=1.0))
    _categories(fig, runs)
    return fig.figure()


SPEED_COLUMNS = ["run_id", "repeats", "prompts", "tokens_per_s", "tokens_per_s_ci_low", "tokens_per_s_ci_high",
                 "throughput_total", "throughput_total_ci_low", "throughput_total_ci_high", "baseline_run",
                 "baseline_source", "baseline_tokens_per_s", "baseline_tokens_per_s_ci_low",
                 "baseline_tokens_per_s_ci_high", "baseline_throughput_total", "baseline_throughput_total_ci_low",
                 "baseline_throughput_total_ci_high", "speedup", "speedup_ci_low", "speedup_ci_high", "ci_method",
                 "speedup_total", "speedup_total_ci_low", "speedup_total_ci_high", "ttft", "ttft_ci_low",
                 "ttft_ci_high", "tpot", "tpot_ci_low", "tpot_ci_high", "baseline_ttft", "baseline_tpot", "lossless",
                 "baseline_timing", "speed_noise"]


def speed_frame(fig_df: pd.DataFrame) -> pd.DataFrame:
    """What the throughput, speedup and latency charts show (their CSV): both throughput definitions, speedups,
    TTFT and TPOT (seconds), each with its 95% interval."""
    return fig_df.reindex(columns=SPEED_COLUMNS).reset_index(drop=True)


def summary_table(fig_df: pd.DataFrame) -> pd.DataFrame:
    """One row per compared run: acceptance, both throughputs, both speedups, TTFT/TPOT in ms, intervals as text."""
    f = fig_df
    out = pd.DataFrame({
        "run_id": f["run_id"], "drafter": _col(f, "drafter"), "K": _col(f, "num_spec_tokens"), "tau": f["tau"],
        "acceptance": _col(f, "acceptance_rate"), "repeats": _col(f, "repeats"), "prompts": _col(f, "prompts"),
        "tok/s per-prompt mean": _col(f, "tokens_per_s"),
        "95% CI (per-prompt)": _cis(_col(f, "tokens_per_s_ci_low"), _col(f, "tokens_per_s_ci_high"), 1),
        "tok/s total/time": _col(f, "throughput_total"),
        "95% CI (total)": _cis(_col(f, "throughput_total_ci_low"), _col(f, "throughput_total_ci_high"), 1),
        "baseline": _col(f, "baseline_run"),
        "speedup (per-prompt)": _col(f, "speedup"), "95% CI": _cis(_col(f, "speedup_ci_low"),
                                                                  _col(f, "speedup_ci_high")),
        "speedup (total)": _col(f, "speedup_total"),
        "95% CI (speedup total)": _cis(_col(f, "speedup_total_ci_low"), _col(f, "speedup_total_ci_high")),
        "TTFT ms": pd.to_numeric(_col(f, "ttft"), errors="coerce") * 1000,
        "95% CI (TTFT)": _cis(_col(f, "ttft_ci_low") * 1000, _col(f, "ttft_ci_high") * 1000),
        "TPOT ms": pd.to_numeric(_col(f, "tpot"), errors="coerce") * 1000,
        "95% CI (TPOT)": _cis(_col(f, "tpot_ci_low") * 1000, _col(f, "tpot_ci_high") * 1000),
        "lossless": _col(f, "lossless"),
        "baseline timed": _col(f, "baseline_timing"),
        "speed verdict": ["no verdict: timing noise" if isinstance(v, str) and v else "" if pd.isna(sp) else "yes"
                          for v, sp in zip(_col(f, "speed_noise"), pd.to_numeric(_col(f, "speedup"),
                                                                                 errors="coerce"))]})
    return out.reset_index(drop=True)


def _cis(lo: pd.Series, hi: pd.Series, digits: int = 2) -> list[str]:
    return [_ci_text(a, b, digits) for a, b in zip(pd.to_numeric(lo, errors="coerce"),
                                                   pd.to_numeric(hi, errors="coerce"))]


CATEGORY_FRAME_COLUMNS = ["run_id", "category", "prompts", "tau", "tau_ci_low", "tau_ci_high", "tokens_per_s",
                          "baseline_run", "baseline_tokens_per_s", "speedup", "speedup_ci_low", "speedup_ci_high"]


def category_frame(cats: pd.DataFrame) -> pd.DataFrame:
    """What the per-category chart shows (its CSV)."""
    return cats.reindex(columns=CATEGORY_FRAME_COLUMNS).reset_index(drop=True)


def category_chart(cats: pd.DataFrame, run_ids: list[str]) -> go.Figure:
    """Per Spec-Bench category: tau (left) and speedup over each run's baseline (right), one bar series per run,
    95% bootstrap intervals over the category's prompts; the speedup panel has a line at 1 (below: slower)."""
    colors = run_colors(run_ids)
    cat_order = sorted(cats["category"].dropna().unique()) if len(cats) else []
    n = cats.groupby("category")["prompts"].max() if len(cats) else pd.Series(dtype=float)
    labels = {c: f"{c} ({int(n[c])})" for c in cat_order}
    fig = _side_by_side(["tau (mean acceptance length)", "speedup over the baseline"])
    for r in run_ids:
        g = cats[cats["run_id"] == r].set_index("category").reindex(cat_order)
        x = [labels[c] for c in cat_order]
        for i, (key, fmt) in enumerate((("tau", ".2f"), ("speedup", ".2f")), start=1):
            y = pd.to_numeric(g[key], errors="coerce")
            fig.add_trace(dict(type="bar", x=x, y=y.to_numpy(), name=r, legendgroup=r, showlegend=i == 1,
                               marker=dict(color=colors[r]),
                               error_y=_ci_arrays(y, g[f"{key}_ci_low"], g[f"{key}_ci_high"]),
                               hovertemplate=f"{r}, %{{x}}: {key} %{{y:{fmt}}}<extra></extra>"), row=1, col=i)
    fig.add_hline(y=1.0, line=dict(color="#555", dash="dash"), col=2)
    fig.update_layout(**_LAYOUT, height=440, barmode="group",
                      title=dict(text="Per category (prompts in brackets; 95% CI over the category's prompts, none "
                                      f"under {metrics.MIN_INTERVAL_PROMPTS} prompts)"),
                      legend=dict(title="run", orientation="h", yanchor="bottom", y=1.08, xanchor="right", x=1.0))
    _categories(fig, [labels[c] for c in cat_order])
    fig.axis("yaxis", rangemode="tozero", title=dict(text="tau"))
    fig.axis("yaxis2", rangemode="tozero", title=dict(text="speedup (x)"))
    return fig.figure()


def _ci_text(lo, hi, digits: int = 2) -> str:
    if lo is None or hi is None or _nan(lo) or _nan(hi):
        return ""
    return f"[{float(lo):.{digits}f}, {float(hi):.{digits}f}]"


def _no_interval(n) -> str:
    """The interval cell of a figure over too few prompts to give one (metrics.interval_shown)."""
    if _nan(n) or int(n) >= metrics.MIN_INTERVAL_PROMPTS:
        return ""
    return f"none: {int(n)} prompt{'s' if int(n) != 1 else ''} (< {metrics.MIN_INTERVAL_PROMPTS})"


def category_table(cats: pd.DataFrame, run_ids: list[str]) -> pd.DataFrame:
    """Categories (rows) x runs: tau, tokens/s, speedup over the baseline and its 95% CI, per run; a category of fewer
    than metrics.MIN_INTERVAL_PROMPTS prompts says why it has no interval."""
    if cats.empty:
        return pd.DataFrame(columns=["category"])
    out = pd.DataFrame({"category": sorted(cats["category"].dropna().unique())})
    n = cats.groupby("category")["prompts"].max()
    out["prompts"] = out["category"].map(n)
    for r in run_ids:
        g = cats[cats["run_id"] == r].set_index("category")
        out[f"{r} · tau"] = out["category"].map(g["tau"])
        out[f"{r} · tokens/s"] = out["category"].map(g["tokens_per_s"])
        out[f"{r} · speedup"] = out["category"].map(g["speedup"])
        out[f"{r} · 95% CI"] = out["category"].map(
            {c: _ci_text(lo, hi) or _no_interval(k) for c, lo, hi, k in zip(g.index, g["speedup_ci_low"],
                                                                           g["speedup_ci_high"], g["prompts"])})
    return out
