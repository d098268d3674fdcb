"""Figures, tables and words of the Serving load page (/load), from load runs' aggregates: catalog.load_cells (each
run's summary.json: per config x concurrency the speedup over the paired baseline with its 95% interval, both sides'
output and per-user tokens/s, tau from the server's counters and from the requests' own count, the summary's best
config per concurrency, where each config stops paying and the concurrency's baseline-noise flag) and
catalog.load_levels (levels.parquet: per level TTFT/TPOT/ITL percentiles, tau from both sources, the machine's load).

Pure functions: DataFrames (and a manifest) in, plotly figures, DataFrames (what a chart's CSV holds) or words out.
No Streamlit, no I/O, no SQL and no statistics: every interval, the best config, where a config stops paying and
the noise flag are backend/load_bench.py's own (definitions in backend/metrics.py, metrics.SERVING).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import plotly.graph_objects as go

from backend.options import engine_label
from backend.runs.manifest import StoredLoadSettings, StoredManifest
from dashboard.charts import _template
from dashboard.compare_words import speed_words
from dashboard.figure_spec import FigureSpec, axis_name, subplots

# plotly_white with the defaults of the trace types used here only (charts._template: the full template costs ~20 ms
# a figure)
_LAYOUT = dict(template=_template(), margin=dict(l=70, r=30, t=80, b=70), font=dict(size=13))
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
BASELINE = "#8c8c8c"
FRONT = "#222222"
NOISY_FILL = "rgba(140,140,140,0.16)"
AGREEMENT_BAR = 0.02      # issue 19's bar: the server's counters and the requests' own count agree within 2%
PERCENTILES = {"p50": "median (p50)", "p90": "p90", "p99": "p99"}
LATENCY = {"ttft": "TTFT (time to first token)", "tpot": "TPOT (time per later token)",
           "itl": "ITL (between stream chunks)"}
DASH = "\u2014"
MERGED_WHY = ("under load vLLM merges the stream chunks of a request that the client did not read in time, so the "
              "requests' own count misses verification steps (and reads tau too high); the server's counters are the "
              "reference, and every figure on this page uses them")


# ---------------------------------------------------------------------------- helpers

def _ok(v) -> bool:
    try:
        return v is not None and not pd.isna(v) and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _x(v) -> str:
    return f"{float(v):.2f}x" if _ok(v) else DASH


def _ci(lo, hi) -> str:
    return f"[{float(lo):.2f}, {float(hi):.2f}]" if _ok(lo) and _ok(hi) else ""


def _tps(v) -> str:
    return f"{float(v):,.0f}" if _ok(v) else DASH


def _and(items: list[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _levels_text(cs: list[int]) -> str:
    return _and([str(int(c)) for c in cs])


def _flag(v) -> bool:
    return bool(v) if _ok(v) or isinstance(v, bool) else False


def real(cells: pd.DataFrame) -> pd.DataFrame:
    """The configs with the drafter's own acceptance (no synthetic tau*)."""
    return cells[cells["synthetic_tau"].isna()]


def synthetic(cells: pd.DataFrame) -> pd.DataFrame:
    """The configs of a speedup ceiling map: acceptance set to a synthetic mean length tau* (vLLM
    `rejection_sample_method="synthetic"`, SGLang's simulated acceptance)."""
    return cells[cells["synthetic_tau"].notna()]


def of_run(df: pd.DataFrame, run_id: str) -> pd.DataFrame:
    return df[df["run_id"] == run_id]


def series(df: pd.DataFrame, multi: bool) -> pd.Series:
    """The legend name of each row: its config ("K=4", "K=3 tau*=2.5"), with its run when several runs are shown."""
    if multi:
        return df["run_id"].astype(str) + " \u00b7 " + df["config"].astype(str)
    return df["config"].astype(str)


def _colors(names: list[str]) -> dict[str, str]:
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}


def _order(df: pd.DataFrame, multi: bool) -> list[str]:
    """Series names in run, then K, then tau* order."""
    d = df.assign(_s=series(df, multi)).sort_values(["run_id", "k", "synthetic_tau"], na_position="first")
    return list(dict.fromkeys(d["_s"]))


def _conc_axis(values) -> dict:
    """Concurrency on a log2-spaced axis, ticks at the levels measured."""
    ticks = sorted({int(v) for v in values if _ok(v)})
    return dict(title="concurrency (requests in flight)", type="log", tickmode="array", tickvals=ticks,
                ticktext=[str(t) for t in ticks])


# ---------------------------------------------------------------------------- speedup vs concurrency

SPEEDUP_COLUMNS = ["run_id", "config", "k", "synthetic_tau", "concurrency", "speedup", "speedup_ci_low",
                   "speedup_ci_high", "n_requests", "n_repeats", "baseline_tps", "drafter_tps", "best_config",
                   "is_best", "within_best", "stops_paying", "baseline_noisy", "noise_spread", "noise_bar"]


def speedup_frame(cells: pd.DataFrame) -> pd.DataFrame:
    """What the speedup chart shows (its CSV): one row per run x config x concurrency."""
    return cells.reindex(columns=SPEEDUP_COLUMNS).reset_index(drop=True)


def speedup_figure(cells: pd.DataFrame, multi: bool = False) -> go.Figure:
    """Speedup over the paired baseline vs concurrency, a line per config (per run and config for several runs), 95%
    intervals as error bars, y from 0 with 1.0 marked "no gain"; a concurrency whose baseline was noisy (the
    baseline's own output tokens/s moved across the configs' measurements beyond the intervals) is shaded grey and
    its points drawn hollow: no verdict there."""
    d = cells.sort_values("concurrency")
    names = _order(d, multi)
    colors = _colors(names)
    fig = FigureSpec()
    d = d.assign(_s=series(d, multi))
    for name in names:
        g = d[d["_s"] == name]
        noisy = [_flag(v) for v in g["baseline_noisy"]]
        y, lo, hi = g["speedup"], g["speedup_ci_low"], g["speedup_ci_high"]
        note = ["<br>no verdict here: the baseline was noisy at this concurrency" if n else "" for n in noisy]
        fig.add_trace(dict(
            type="scatter", x=g["concurrency"], y=y, mode="lines+markers", name=name,
            line=dict(color=colors[name], width=2),
            marker=dict(size=10, color=colors[name], symbol=["circle-open" if n else "circle" for n in noisy],
                        line=dict(width=2, color=colors[name])),
            error_y=dict(type="data", symmetric=False, array=(hi - y).tolist(), arrayminus=(y - lo).tolist(),
                         thickness=1.5, width=5),
            customdata=list(zip(lo, hi, g["n_requests"], note)),
            hovertemplate=f"{name}, concurrency %{{x}}: %{{y:.2f}}x [%{{customdata[0]:.2f}}, %{{customdata[1]:.2f}}]"
                          " over %{customdata[2]} request pairs%{customdata[3]}<extra></extra>"))
    if not multi:
        noisy_c = sorted({int(c) for c, n in zip(d["concurrency"], d["baseline_noisy"]) if _flag(n)})
        for c in noisy_c:
            fig.add_vrect(x0=c / 1.25, x1=c * 1.25, fillcolor=NOISY_FILL)
        if noisy_c:
            fig.add_trace(dict(type="scatter", x=[None], y=[None], mode="markers", name="baseline noisy: no verdict",
                               marker=dict(symbol="square", size=14, color=NOISY_FILL)))
    fig.add_hline(y=1.0, line=dict(color="#555", dash="dash"), annotation_text="1.0x: no gain")
    top = max([1.0, *[float(v) for v in pd.concat([d["speedup_ci_high"], d["speedup"]]) if _ok(v)]])
    fig.update_layout(**_LAYOUT, height=440,
                      title=dict(text="Speedup vs concurrency (95% interval)<br><sup>drafter output tokens/s over the "
                                      "paired baseline's at the same concurrency, same prompts, same order</sup>"),
                      xaxis=_conc_axis(d["concurrency"]),
                      yaxis=dict(title="speedup (x; below 1 = slower)", range=[0, top * 1.12]),
                      legend=dict(orientation="h", yanchor="top", y=-0.18), hovermode="closest")
    return fig.figure()


# ---------------------------------------------------------------------------- throughput vs per-user speed

PARETO_COLUMNS = ["run_id", "config", "side", "concurrency", "per_user_tps", "output_tps", "on_front"]


def pareto_frame(cells: pd.DataFrame) -> pd.DataFrame:
    """Every measured operating point (its CSV): per run x config x concurrency the drafter side and the baseline it
    was paired with, per-user tokens/s (median over requests) and output tokens/s (the whole level), and whether the
    point lies on the Pareto front (no other point is at least as fast on both axes and faster on one)."""
    rows = []
    for r in cells.itertuples():
        rows.append((r.run_id, r.config, "drafter", int(r.concurrency), r.drafter_per_user_tps, r.drafter_tps))
        rows.append((r.run_id, r.config, "baseline", int(r.concurrency), r.baseline_per_user_tps, r.baseline_tps))
    df = pd.DataFrame(rows, columns=PARETO_COLUMNS[:-1])
    return df.assign(on_front=front(df["per_user_tps"].tolist(), df["output_tps"].tolist()))


def front(x: list[float], y: list[float]) -> list[bool]:
    """Whether each point (x, y) is on the Pareto front of the points, both axes higher = better."""
    pts = [(a, b) if _ok(a) and _ok(b) else None for a, b in zip(x, y)]
    out = []
    for i, p in enumerate(pts):
        if p is None:
            out.append(False)
            continue
        out.append(not any(q is not None and j != i and q[0] >= p[0] and q[1] >= p[1] and (q[0] > p[0] or q[1] > p[1])
                           for j, q in enumerate(pts)))
    return out


def pareto_figure(cells: pd.DataFrame, multi: bool = False) -> go.Figure:
    """Output tokens/s (y: what the server delivers) against per-user tokens/s (x: how fast one answer streams), one
    point per concurrency: each config's drafter (coloured, a line through its concurrencies) and the baseline it
    was paired with (grey), the Pareto front of all points drawn through them (upper right is better)."""
    pts = pareto_frame(cells)
    d = cells.assign(_s=series(cells, multi))
    names = _order(d, multi)
    colors = _colors(names)
    pts = pts.assign(_s=series(pts, multi))
    fig = FigureSpec()
    f = pts[pts["on_front"]].sort_values("per_user_tps")
    if len(f):                       # drawn first: a soft band under the points it joins
        fig.add_trace(dict(
            type="scatter", x=f["per_user_tps"], y=f["output_tps"], mode="lines+markers", name="Pareto front",
            line=dict(color="rgba(255,160,0,0.45)", width=12), marker=dict(size=18, color="rgba(255,160,0,0.45)"),
            customdata=list(zip(f["_s"], f["side"], f["concurrency"])),
            hovertemplate="on the front: %{customdata[0]} (%{customdata[1]}), concurrency %{customdata[2]}"
                          "<extra></extra>"))
    first_base = True
    for name in names:
        b = pts[(pts["_s"] == name) & (pts["side"] == "baseline")].sort_values("concurrency")
        fig.add_trace(dict(
            type="scatter", x=b["per_user_tps"], y=b["output_tps"], mode="lines+markers",
            name="baseline (paired, per config)",
            legendgroup="baseline", showlegend=first_base, line=dict(color=BASELINE, width=1, dash="dot"),
            marker=dict(color=BASELINE, size=8, symbol="x"), customdata=b["concurrency"],
            hovertemplate=f"baseline paired with {name}, concurrency %{{customdata}}: %{{y:,.0f}} tok/s, "
                          "%{x:,.0f} tok/s per user<extra></extra>"))
        first_base = False
    for name in names:
        g = pts[(pts["_s"] == name) & (pts["side"] == "drafter")].sort_values("concurrency")
        fig.add_trace(dict(
            type="scatter", x=g["per_user_tps"], y=g["output_tps"], mode="lines+markers+text", name=name,
            line=dict(color=colors[name], width=2), marker=dict(color=colors[name], size=9),
            text=[f"c={c}" for c in g["concurrency"]], textposition="top center",
            textfont=dict(size=10, color=colors[name]), customdata=g["concurrency"],
            hovertemplate=f"{name}, concurrency %{{customdata}}: %{{y:,.0f}} tok/s, %{{x:,.0f}} tok/s per user"
                          "<extra></extra>"))
    fig.update_layout(**_LAYOUT, height=480,
                      title=dict(text="Throughput vs per-user speed (Pareto front)<br><sup>one point per concurrency; "
                                      "upper right is better; the front: points no other beats on both axes</sup>"),
                      xaxis=dict(title="per-user tokens/s (median over requests)", rangemode="tozero"),
                      yaxis=dict(title="output tokens/s (whole level)", rangemode="tozero"),
                      legend=dict(orientation="h", yanchor="top", y=-0.16), hovermode="closest")
    return fig.figure()


# ---------------------------------------------------------------------------- latency percentiles

LATENCY_COLUMNS = ["run_id", "config", "concurrency", "repeat", "side", "requests"] + [
    f"{m}_{q}_ms" for m in LATENCY for q in PERCENTILES]


def latency_frame(levels: pd.DataFrame) -> pd.DataFrame:
    """TTFT, TPOT and ITL p50/p90/p99 per level, in milliseconds (its CSV)."""
    out = levels[["run_id", "config", "concurrency", "repeat", "side", "requests"]].copy()
    for m in LATENCY:
        for q in PERCENTILES:
            out[f"{m}_{q}_ms"] = levels[f"{m}_{q}"] * 1000.0
    return out.reset_index(drop=True)


def latency_figure(levels: pd.DataFrame, pct: str = "p50", multi: bool = False) -> go.Figure:
    """TTFT, TPOT and ITL at one percentile (ms) vs concurrency: each config's drafter server (coloured) and the
    baseline paired with it (grey, dotted); repeats of a level: the median of their percentiles."""
    lat = latency_frame(levels)
    lat = lat.assign(_s=series(lat, multi))
    names = list(dict.fromkeys(series(levels.sort_values(["run_id", "k"]), multi))) if len(levels) else []
    names = [n for n in names if n in set(lat["_s"])]
    colors = _colors(names)
    fig = subplots(3, list(LATENCY.values()), 0.07)
    cols = [f"{m}_{pct}_ms" for m in LATENCY]
    med = {key: g for key, g in lat.groupby(["_s", "side", "concurrency"], as_index=False)[cols].median()
           .groupby(["_s", "side"])} if len(lat) else {}           # repeats of a level: their median, per series
    first_base = True
    for i, m in enumerate(LATENCY, start=1):
        col = f"{m}_{pct}_ms"
        for name in names:
            for side in ("baseline", "drafter"):
                g = med.get((name, side))
                if g is None or g.empty:
                    continue
                base = side == "baseline"
                fig.add_trace(dict(
                    type="scatter", x=g["concurrency"].to_numpy(), y=g[col].to_numpy(), mode="lines+markers",
                    name="baseline (paired, per config)" if base else name,
                    legendgroup="baseline" if base else name,
                    showlegend=(i == 1 and (not base or first_base)),
                    line=dict(color=BASELINE if base else colors[name], width=1 if base else 2,
                              dash="dot" if base else "solid"),
                    marker=dict(size=6 if base else 8, symbol="x" if base else "circle",
                                color=BASELINE if base else colors[name]),
                    hovertemplate=f"{'baseline paired with ' if base else ''}{name}, concurrency %{{x}}: "
                                  f"{m.upper()} {pct} %{{y:.2f}} ms<extra></extra>"), row=1, col=i)
                if base and i == 1:
                    first_base = False
        fig.axis(axis_name("x", i), **{**_conc_axis(lat["concurrency"]), "title": dict(text="concurrency" if i == 2
                                                                                        else None)})
        fig.axis(axis_name("y", i), title=dict(text="ms" if i == 1 else None), rangemode="tozero")
    fig.update_layout(**_LAYOUT, height=420,
                      title=dict(text=f"Latency per level, {PERCENTILES.get(pct, pct)}<br><sup>percentiles over a "
                                      "level's requests (ITL: over every gap between stream chunks)</sup>"),
                      legend=dict(orientation="h", yanchor="top", y=-0.2), hovermode="closest")
    return fig.figure()


# ---------------------------------------------------------------------------- acceptance: server vs own count

ACCEPTANCE_COLUMNS = ["run_id", "config", "k", "concurrency", "tau_server", "tau_client", "tau_agreement",
                      "merged_requests"]


def acceptance_frame(cells: pd.DataFrame) -> pd.DataFrame:
    return cells.reindex(columns=ACCEPTANCE_COLUMNS).reset_index(drop=True)


def acceptance_figure(cells: pd.DataFrame, multi: bool = False) -> go.Figure:
    """tau vs concurrency per config: from the server's counters (solid, the reference) and from the requests' own
    count (dotted, hollow); the hover gives their relative difference, red beyond 2%."""
    d = cells[cells["tau_server"].notna() | cells["tau_client"].notna()].sort_values("concurrency")
    names = _order(d, multi) if len(d) else []
    colors = _colors(names)
    d = d.assign(_s=series(d, multi))
    fig = FigureSpec()
    for name in names:
        g = d[d["_s"] == name]
        agree = [f"{a:.1%}" if _ok(a) else DASH for a in g["tau_agreement"]]
        fig.add_trace(dict(
            type="scatter", x=g["concurrency"], y=g["tau_server"], mode="lines+markers",
            name=f"{name}: server's counters",
            legendgroup=name, line=dict(color=colors[name], width=2), marker=dict(size=9, color=colors[name]),
            customdata=list(zip(g["tau_client"], agree)),
            hovertemplate=f"{name}, concurrency %{{x}}: tau %{{y:.3f}} (server), %{{customdata[0]:.3f}} (own count), "
                          "apart %{customdata[1]}<extra></extra>"))
        bad = [_ok(a) and a > AGREEMENT_BAR for a in g["tau_agreement"]]
        fig.add_trace(dict(
            type="scatter", x=g["concurrency"], y=g["tau_client"], mode="lines+markers", name=f"{name}: own count",
            legendgroup=name, line=dict(color=colors[name], width=1.5, dash="dot"),
            marker=dict(size=11, symbol="circle-open", color=["#d62728" if b else colors[name] for b in bad],
                        line=dict(width=2)),
            customdata=agree,
            hovertemplate=f"{name}, concurrency %{{x}}: tau %{{y:.3f}} from the requests' own count (apart from "
                          "the server's: %{customdata})<extra></extra>"))
    vals = [float(v) for v in pd.concat([d["tau_server"], d["tau_client"]]) if _ok(v)] if len(d) else []
    fig.update_layout(**_LAYOUT, height=440,
                      title=dict(text="Acceptance: the server's counters and SpecLens's own count<br><sup>tau = 1 + "
                                      "accepted / drafts; hollow red: more than 2% apart</sup>"),
                      xaxis=_conc_axis(d["concurrency"] if len(d) else []),
                      yaxis=dict(title="tau (mean acceptance length)", range=[1.0, max([2.0, *vals]) * 1.08]),
                      legend=dict(orientation="h", yanchor="top", y=-0.18), hovermode="closest")
    return fig.figure()


# ---------------------------------------------------------------------------- speedup ceiling map (synthetic tau*)

CEILING_COLUMNS = ["run_id", "config", "k", "synthetic_tau", "concurrency", "speedup", "speedup_ci_low",
                   "speedup_ci_high", "tau_server", "n_requests", "baseline_noisy", "noise_spread"]


def ceiling_frame(cells: pd.DataFrame) -> pd.DataFrame:
    return synthetic(cells).reindex(columns=CEILING_COLUMNS).sort_values(
        ["run_id", "k", "concurrency", "synthetic_tau"]).reset_index(drop=True)


def ceiling_x(cells: pd.DataFrame) -> tuple[str, str]:
    """(column, axis title) of the map's x: the tau the server's counters measured when every synthetic config has one
    (what a drafter's own bench reports, so a drafter is read on the same axis: backend/drafter_worth.py), else the
    set tau*."""
    d = synthetic(cells)
    if len(d) and d["tau_server"].notna().all():
        return "tau_server", "tau (server's counters; set as tau*)"
    return "synthetic_tau", "tau* (set mean acceptance length)"


def ceiling_figure(cells: pd.DataFrame, measured: pd.DataFrame | None = None) -> go.Figure:
    """The speedup ceiling map: speedup vs the mean acceptance length (x: as the server's counters measured it for
    the synthetic setting tau*, ceiling_x), a line per concurrency (and K when several), 95% intervals, 1.0 marked;
    configs measured with the drafter's own acceptance (`measured`, same K) placed on it at their tau (stars)."""
    d = ceiling_frame(cells)
    xcol, xtitle = ceiling_x(cells)
    ks = sorted({int(k) for k in d["k"]})
    conc = sorted({int(c) for c in d["concurrency"]})
    colors = {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(conc)}
    dashes = ["solid", "dash", "dot", "dashdot"]
    fig = go.Figure()
    for ki, k in enumerate(ks):
        for c in conc:
            g = d[(d["k"] == k) & (d["concurrency"] == c)]
            if g.empty:
                continue
            noisy = any(_flag(v) for v in g["baseline_noisy"])
            name = f"concurrency {c}" + (f", K={k}" if len(ks) > 1 else "") + (" (baseline noisy: no verdict)"
                                                                                if noisy else "")
            y, lo, hi = g["speedup"], g["speedup_ci_low"], g["speedup_ci_high"]
            fig.add_trace(go.Scatter(
                x=g[xcol], y=y, mode="lines+markers", name=name, opacity=0.4 if noisy else 1.0,
                line=dict(color=colors[c], width=2, dash="dot" if noisy else dashes[ki % len(dashes)]),
                marker=dict(size=8, symbol="circle-open" if noisy else "circle"),
                error_y=dict(type="data", symmetric=False, array=(hi - y).tolist(), arrayminus=(y - lo).tolist(),
                             thickness=1.2, width=4),
                customdata=list(zip(lo, hi, g["synthetic_tau"], g["tau_server"].fillna(float("nan")))),
                hovertemplate=f"{name}, tau* %{{customdata[2]:g}} (measured %{{customdata[3]:.2f}}): %{{y:.2f}}x "
                              "[%{customdata[0]:.2f}, %{customdata[1]:.2f}]<extra></extra>"))
    if measured is not None and len(measured) and xcol == "tau_server":
        m = measured[measured["k"].isin(ks) & measured["tau_server"].notna() & measured["concurrency"].isin(conc)]
        for c, g in m.groupby("concurrency"):
            fig.add_trace(go.Scatter(
                x=g["tau_server"], y=g["speedup"], mode="markers", name=f"measured drafter, concurrency {int(c)}",
                marker=dict(symbol="star", size=15, color=colors[int(c)], line=dict(color=FRONT, width=1)),
                customdata=list(zip(g["config"], g["speedup_ci_low"], g["speedup_ci_high"])),
                hovertemplate="%{customdata[0]} (its own acceptance), concurrency " + str(int(c)) +
                              ": tau %{x:.2f}, %{y:.2f}x [%{customdata[1]:.2f}, %{customdata[2]:.2f}]<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="#555", dash="dash"), annotation_text="1.0x: no gain",
                  annotation_position="bottom left")
    top = max([1.0, *[float(v) for v in pd.concat([d["speedup_ci_high"], d["speedup"]]) if _ok(v)]])
    fig.update_layout(**_LAYOUT, height=460,
                      title=dict(text="Speedup ceiling map: speedup vs acceptance length<br><sup>draft tokens "
                                      "accepted synthetically at a set mean acceptance length tau*; a line per "
                                      "concurrency</sup>"),
                      xaxis=dict(title=xtitle),
                      yaxis=dict(title="speedup (x; below 1 = slower)", range=[0, top * 1.12]),
                      legend=dict(orientation="h", yanchor="top", y=-0.18), hovermode="closest")
    return fig


def ceiling_lines(cells: pd.DataFrame, measured: pd.DataFrame | None = None) -> list[str]:
    """Per concurrency (and K): the speedup at the lowest and the highest tau* measured, and where the drafter's own
    acceptance (a measured config of the same K) sits."""
    d = ceiling_frame(cells)
    out = []
    ks = sorted({int(k) for k in d["k"]})
    for (k, c), g in d.groupby(["k", "concurrency"], sort=True):
        g = g.sort_values("synthetic_tau")
        lo, hi = g.iloc[0], g.iloc[-1]
        words = (f"**Concurrency {int(c)}**" + (f" (K={int(k)})" if len(ks) > 1 else "") +
                 f": {_x(lo.speedup)} {_ci(lo.speedup_ci_low, lo.speedup_ci_high)} at tau* {lo.synthetic_tau:g}, "
                 f"{_x(hi.speedup)} {_ci(hi.speedup_ci_low, hi.speedup_ci_high)} at tau* {hi.synthetic_tau:g}")
        pays = g[g["speedup_ci_low"] > 1.0]
        noisy = [float(v) if _ok(v) else 0.0 for n, v in zip(g["baseline_noisy"], g["noise_spread"]) if _flag(n)]
        if noisy:
            words += (f"; **no verdict**: the baseline's own tok/s moved {max(noisy):.0%} between its measurements "
                      "at this concurrency (faded on the chart)")
        else:
            words += (f"; it pays (interval above 1) from tau* {pays['synthetic_tau'].min():g}" if len(pays)
                      else "; no tau* measured pays (no interval lies above 1)")
        if measured is not None and len(measured):
            m = measured[(measured["k"] == k) & (measured["concurrency"] == c) & measured["tau_server"].notna()]
            for r in m.itertuples():
                words += (f"; the drafter's own acceptance ({r.config}) measured tau {r.tau_server:.2f} and "
                          f"{_x(r.speedup)} {_ci(r.speedup_ci_low, r.speedup_ci_high)}")
        out.append(words + ".")
    return out


# ---------------------------------------------------------------------------- words: tiles, best K, stops paying


@dataclass
class Tile:
    """One concurrency level as a tile: the best config's speedup there (`value`), `delta` in words, `tone`
    (faster, slower, unclear: its interval covers 1, noisy: the baseline moved, none), the lines under it."""

    label: str
    value: str
    delta: str | None
    tone: str
    lines: list[str] = field(default_factory=list)


NOISY_DELTA = "no verdict: baseline noisy"


def _noise_text(r) -> str:
    return (f"the baseline's own output tokens/s moved {r.noise_spread:.0%} across its measurements here "
            f"({_tps(r.noise_min_tps)} to {_tps(r.noise_max_tps)} tok/s)")


def _best_row(g: pd.DataFrame):
    """The summary's best config at one concurrency (its row), else the highest speedup."""
    b = g[g["is_best"].fillna(False).astype(bool)]
    if len(b):
        return b.iloc[0]
    return g.sort_values("speedup", ascending=False).iloc[0] if len(g) else None


def tiles(cells: pd.DataFrame) -> list[Tile]:
    """One tile per concurrency of one run (configs with their own acceptance): the best config's speedup with its
    interval and in words; grey without an arrow where the baseline was noisy (no verdict)."""
    out = []
    d = real(cells)
    n_cfg = d["config"].nunique()
    for c, g in d.groupby("concurrency", sort=True):
        r = _best_row(g)
        tone, words = speed_words(r.speedup, r.speedup_ci_low, r.speedup_ci_high)
        lines = [f"95% CI {_ci(r.speedup_ci_low, r.speedup_ci_high)} \u00b7 {int(r.n_requests)} request pairs"
                 if _ok(r.n_requests) else f"95% CI {_ci(r.speedup_ci_low, r.speedup_ci_high)}"]
        ties = g[g["within_best"].fillna(False).astype(bool)]["config"].tolist()
        if n_cfg == 1:
            lines.append("one configuration: nothing to rank")
        elif ties:
            lines.append(f"{_and(ties)} within its interval: no clear winner")
        else:
            lines.append("the other configs' intervals lie below it")
        if _flag(r.baseline_noisy):
            lines.insert(0, "No verdict: " + _noise_text(r))
            out.append(Tile(f"concurrency {int(c)}", f"{r.config} \u00b7 {_x(r.speedup)}", NOISY_DELTA, "noisy",
                            lines))
            continue
        delta = f"{100 * (r.speedup - 1):+.0f}% \u00b7 {words}" if _ok(r.speedup) else None
        out.append(Tile(f"concurrency {int(c)}", f"{r.config} \u00b7 {_x(r.speedup)}", delta, tone, lines))
    return out


def best_lines(cells: pd.DataFrame) -> list[str]:
    """The best K at each concurrency of one run, in words: a clear winner, or the configs within its interval (not
    a clear winner), or no verdict where the baseline was noisy."""
    d = real(cells)
    n_cfg = d["config"].nunique()
    out = []
    for c, g in d.groupby("concurrency", sort=True):
        r = _best_row(g)
        _, words = speed_words(r.speedup, r.speedup_ci_low, r.speedup_ci_high)
        fig = f"{_x(r.speedup)} {_ci(r.speedup_ci_low, r.speedup_ci_high)} ({words})"
        head = f"**Concurrency {int(c)}**: "
        ties = g[g["within_best"].fillna(False).astype(bool)]["config"].tolist()
        noisy = (f"the baseline was noisy ({r.noise_spread:.0%} apart across its measurements, see below)"
                 if _flag(r.baseline_noisy) else "")
        if noisy:                           # no faster/slower words either: the tile is grey
            fig = f"{_x(r.speedup)} {_ci(r.speedup_ci_low, r.speedup_ci_high)}"
        if n_cfg == 1:
            out.append(f"{head}{r.config}, the only configuration: {fig}" + (f". **No verdict**: {noisy}." if noisy
                                                                             else "."))
            continue
        if noisy:
            with_ties = f", with {_and(ties)} within its interval" if ties else ""
            out.append(f"{head}{r.config} measured highest, {fig}{with_ties}. **No verdict on the best K here**: "
                       f"{noisy}.")
        elif ties:
            out.append(f"{head}{r.config} measured highest, {fig}, with {_and(ties)} within its interval: "
                       "**not a clear winner**.")
        else:
            out.append(f"{head}**{r.config} is the best**, {fig}; the other configs' intervals lie below it.")
    return out


def _short(r) -> str:
    """`concurrency: speedup [interval] (its word)`; a level whose baseline was noisy gets no faster/slower word."""
    tone, _ = speed_words(r.speedup, r.speedup_ci_low, r.speedup_ci_high)
    word = {"faster": "faster", "slower": "slower", "unclear": "no clear difference"}.get(tone, "")
    if word and _flag(getattr(r, "baseline_noisy", False)):
        word = "no verdict: baseline noisy"
    return f"{int(r.concurrency)}: {_x(r.speedup)} {_ci(r.speedup_ci_low, r.speedup_ci_high)}" + (
        f" ({word})" if word else "")


def stops_lines(cells: pd.DataFrame) -> list[str]:
    """Per config of one run (its own acceptance): the lowest concurrency where speculative decoding stops paying
    (the summary's `stops_paying`: speedup below 1), with its interval, or that it pays up to the highest level
    measured; a level whose baseline was noisy is no verdict."""
    out = []
    d = real(cells)
    for cfg, g in d.sort_values(["k", "concurrency"]).groupby("config", sort=False):
        g = g.sort_values("concurrency")
        stop = g["stops_paying"].iloc[0]
        top = g.iloc[-1]
        noisy = [int(r.concurrency) for r in g.itertuples() if _flag(r.baseline_noisy)]
        if not _ok(stop):
            unclear = [int(r.concurrency) for r in g.itertuples()
                       if _ok(r.speedup_ci_low) and _ok(r.speedup_ci_high) and r.speedup_ci_low <= 1.0
                       <= r.speedup_ci_high]
            text = (f"**{cfg}** stays above 1 at every concurrency measured, up to {int(top.concurrency)}: "
                    f"{_x(top.speedup)} {_ci(top.speedup_ci_low, top.speedup_ci_high)} there")
            if unclear:
                text += f"; its interval covers 1 at {_levels_text(unclear)}"
            if noisy:
                text += f"; at {_levels_text(noisy)} the baseline was noisy: not a verdict there"
            out.append(text + ".")
            continue
        r = g[g["concurrency"] == stop].iloc[0]
        tone, _ = speed_words(r.speedup, r.speedup_ci_low, r.speedup_ci_high)
        fig = f"{_x(r.speedup)} {_ci(r.speedup_ci_low, r.speedup_ci_high)}"
        lowest = int(stop) == int(g["concurrency"].min())
        at = f"at concurrency {int(stop)}" + (", the lowest measured" if lowest else "")
        if _flag(r.baseline_noisy):
            text = f"**{cfg}** measured below 1 {at}: {fig}"
        elif tone == "slower":
            text = (f"**{cfg}** {'does not pay' if lowest else 'stops paying'} {at}: {fig}, slower than without a "
                    "drafter")
        else:
            text = f"**{cfg}** falls below 1 {at} ({fig}), but its interval covers 1: no clear difference there"
        later = g[g["concurrency"] > stop]
        if (later["speedup"] >= 1.0).any():
            text += "; at higher concurrency " + ", ".join(_short(x) for x in later.itertuples())
        if _flag(r.baseline_noisy):
            text += (f". **Not a verdict**: the baseline was noisy there ({r.noise_spread:.0%} apart across its "
                     "measurements, see below); measure again (repeats) before reading this as where it stops paying")
        out.append(text + ".")
    return out


def noise_note(cells: pd.DataFrame, levels: pd.DataFrame) -> tuple[str, str] | None:
    """("warning" | "caption", text) about the baseline's stability across one run's measurements: which
    concurrencies were noisy and by how much; that one measurement per concurrency cannot be checked; or that the
    run's summary predates the check. None when the check ran and found nothing."""
    if cells.empty:
        return None
    if not cells["noise_checked"].fillna(False).astype(bool).all():
        return ("caption", "This run's summary was written before the baseline-noise check: whether the baseline's "
                           "own speed moved between the configs' measurements was not checked.")
    noisy = cells[cells["baseline_noisy"].fillna(False).astype(bool)].drop_duplicates("concurrency")
    noisy = noisy.sort_values("concurrency")
    if len(noisy):
        parts = [f"{_tps(r.noise_min_tps)} to {_tps(r.noise_max_tps)} tok/s at {int(r.concurrency)} "
                 f"({r.noise_spread:.0%}, the intervals absorb {r.noise_bar:.0%})" for r in noisy.itertuples()]
        n = int(noisy["noise_measurements"].max()) if noisy["noise_measurements"].notna().any() else None
        return ("warning",
                f"**The baseline's own speed moved between measurements at concurrency "
                f"{_levels_text(noisy['concurrency'].tolist())}.** The same baseline server on the same requests, "
                f"measured {f'{n} times' if n else 'once per config'} (once per config and repeat), gave "
                f"{_and(parts)}: more than the speedups' intervals absorb (twice their median half-width, at least "
                "5%). The configs were timed under different conditions there, so which K is best is no verdict at "
                "those levels, and their tiles are grey; each speedup is still paired with a baseline timed next to "
                "it. More repeats (`--repeats 3`) or a quieter machine settle it.")
    base = levels[levels["side"] == "baseline"] if len(levels) else levels
    if len(base) and base.groupby("concurrency").size().max() < 2:
        return ("caption", "One baseline measurement per concurrency: whether the machine's speed moved between "
                           "measurements cannot be checked here (a sweep over several K, or repeats, would show it).")
    return None


def agreement_note(cells: pd.DataFrame) -> tuple[str, str] | None:
    """("info" | "caption", text): where the server's counters and SpecLens's own per-request count disagree by more
    than 2%, and why; or that they agree within 2% everywhere. None without both figures."""
    d = cells[cells["tau_agreement"].notna()]
    co = cells[cells["merged_requests"].fillna(0) > 0] if "merged_requests" in cells else cells.iloc[:0]
    coalesced = ""
    if len(co):
        items = [f"{r.config} at concurrency {int(r.concurrency)}" for r in co.sort_values(["concurrency", "k"])
                 .itertuples()]
        coalesced = (f" No own count for {_and(items)}: the server merged steps into one stream chunk there "
                     f"({int(co['merged_requests'].sum())} request(s) with a chunk of more than K+1 tokens), which "
                     "hides steps, so the server's counters stand alone.")
    if d.empty:
        return ("caption", "Acceptance: from the server's counters only." + coalesced) if coalesced else None
    bad = d[d["tau_agreement"] > AGREEMENT_BAR].sort_values(["concurrency", "k"], ascending=[False, True])
    good = d[d["tau_agreement"] <= AGREEMENT_BAR]
    if bad.empty:
        return ("caption", f"Acceptance: the server's counters and SpecLens's own count of the requests agree within "
                           f"2% at every level where both exist (largest difference {d['tau_agreement'].max():.1%})."
                           + coalesced)
    parts = []
    for c, g in bad.groupby("concurrency", sort=False):
        items = [f"{r.config} (tau {r.tau_client:.2f} against {r.tau_server:.2f}, {r.tau_agreement:.0%} apart)"
                 if r.tau_agreement >= 0.1 else
                 f"{r.config} (tau {r.tau_client:.2f} against {r.tau_server:.2f}, {r.tau_agreement:.1%} apart)"
                 for r in g.itertuples()]
        parts.append(f"at concurrency {int(c)} for {_and(items)}")
    rest = (f" Elsewhere they agree within 2% (largest {good['tau_agreement'].max():.1%})." if len(good) else "")
    return ("info", f"**Acceptance: SpecLens's own count disagrees with the server's counters** {_and(parts)}: "
                    f"{MERGED_WHY}.{rest}{coalesced}")


def headline(run_id: str, cells: pd.DataFrame) -> str:
    """The view's verdict in one line (above exported charts, in the report bundle): the best K per concurrency and
    where each config stops paying, no verdict where the baseline was noisy."""
    d = real(cells)
    if d.empty:
        s = synthetic(cells)
        return (f"{run_id}: speedup ceiling map over tau* {s['synthetic_tau'].min():g} to "
                f"{s['synthetic_tau'].max():g} at concurrency {_levels_text(sorted(s['concurrency'].unique()))}."
                if len(s) else f"{run_id}: no results.")
    parts, noisy = [], []
    n_cfg = d["config"].nunique()
    for c, g in d.groupby("concurrency", sort=True):
        r = _best_row(g)
        if _flag(r.baseline_noisy) and n_cfg > 1:
            noisy.append(int(c))
            continue
        ties = g[g["within_best"].fillna(False).astype(bool)]["config"].tolist()
        tail = (f", no clear winner ({_and(ties)} within its interval)" if ties else
                "" if n_cfg == 1 else ", the clear best")
        parts.append(f"{int(c)}: {r.config} {_x(r.speedup)} {_ci(r.speedup_ci_low, r.speedup_ci_high)}{tail}")
    if noisy:
        parts.append(f"{_levels_text(noisy)}: no verdict (baseline noisy)")
    stops = []
    for cfg, g in d.sort_values(["k", "concurrency"]).groupby("config", sort=False):
        s = g["stops_paying"].iloc[0]
        if _ok(s):
            r = g[g["concurrency"] == s].iloc[0]
            stops.append(f"{cfg} below 1 at {int(s)} ({_x(r.speedup)}"
                         + (", not a verdict: baseline noisy)" if _flag(r.baseline_noisy) else ")"))
        else:
            stops.append(f"{cfg} above 1 up to {int(g['concurrency'].max())}")
    what = "Best K per concurrency" if n_cfg > 1 else "Speedup per concurrency"
    return f"{run_id}: {what}: {'; '.join(parts)}. Where it stops paying: {'; '.join(stops)}."


def run_caption(manifest: StoredManifest | dict, levels: pd.DataFrame, cells: pd.DataFrame) -> str:
    """What ran, in one line: engine and version, target, drafter, configs x concurrency, repeats, requests per
    level, max tokens, dataset, date (the manifest read typed: backend/runs/manifest.py `StoredManifest`)."""
    m = StoredManifest.indexed(manifest)
    s = m.settings_as(StoredLoadSettings)
    eng = engine_label(m.engine)
    ver = f" {m.engine_version}" if m.engine_version else ""
    model = m.model.path if m.model is not None else None
    drafter = m.drafter_info.path if m.drafter_info is not None else None
    configs = list(dict.fromkeys(cells.sort_values(["k", "synthetic_tau"], na_position="first")["config"]))
    conc = sorted({int(c) for c in cells["concurrency"]})
    reqs = levels.groupby("concurrency")["requests"].max() if len(levels) else pd.Series(dtype=float)
    req_text = (f"{int(reqs.min())} to {int(reqs.max())} requests per level and side" if len(reqs) > 1
                else f"{int(reqs.iloc[0])} requests per level and side" if len(reqs) else "")
    def name(path) -> str:
        return str(path).rstrip("/").split("/")[-1]

    parts = [f"{eng}{ver}", f"target `{name(model)}`" if model else None,
             f"drafter `{name(drafter)}`" if drafter else None,
             f"{len(configs)} config(s) ({', '.join(configs[:6])}{' ...' if len(configs) > 6 else ''}) x concurrency "
             f"{', '.join(map(str, conc))}",
             f"{1 if s.repeats is None else s.repeats} repeat(s)", req_text or None,
             f"max {s.max_tokens} output tokens" if s.max_tokens else None,
             f"temperature {s.temperature:g}" if s.temperature is not None else None,
             f"load format `{s.load_format}`" if s.load_format else None,
             f"dataset `{m.dataset}`" if m.dataset else None,
             f"{m.created[:16].replace('T', ' ')} UTC" if m.created else None]
    return " \u00b7 ".join(p for p in parts if p) + ". Each level's drafter and baseline ran back to back (which " \
        "went first alternating), same prompts, same order, same max tokens."


# ---------------------------------------------------------------------------- tables


def cells_table(cells: pd.DataFrame, multi: bool = False) -> pd.DataFrame:
    """One row per run x config x concurrency as the page's table shows it (no cell reads "None")."""
    def num(v, f: str) -> str:
        return format(float(v), f) if _ok(v) else DASH

    d = cells.sort_values(["run_id", "k", "synthetic_tau", "concurrency"], na_position="first")
    verdict = []
    for r in d.itertuples():
        v = []
        if _flag(r.is_best):
            v.append("best")
        if _flag(r.within_best):
            v.append(f"within {r.best_config}'s interval")
        if _flag(r.baseline_noisy):
            v.append("baseline noisy: no verdict")
        verdict.append("; ".join(v))
    out = pd.DataFrame({
        "run": d["run_id"], "config": d["config"], "concurrency": d["concurrency"].astype(int),
        "speedup": [num(v, ".2f") + "x" if _ok(v) else DASH for v in d["speedup"]],
        "95% CI": [_ci(lo, hi) or DASH for lo, hi in zip(d["speedup_ci_low"], d["speedup_ci_high"])],
        "note": verdict,
        "baseline tok/s": [num(v, ",.0f") for v in d["baseline_tps"]],
        "drafter tok/s": [num(v, ",.0f") for v in d["drafter_tps"]],
        "baseline per-user tok/s": [num(v, ",.0f") for v in d["baseline_per_user_tps"]],
        "drafter per-user tok/s": [num(v, ",.0f") for v in d["drafter_per_user_tps"]],
        "tau (server)": [num(v, ".3f") for v in d["tau_server"]],
        "tau (own count)": [num(v, ".3f") for v in d["tau_client"]],
        "apart": [num(v, ".1%") for v in d["tau_agreement"]],
        "requests": [str(int(v)) if _ok(v) else DASH for v in d["n_requests"]]})
    return out if multi else out.drop(columns=["run"])


def levels_table(levels: pd.DataFrame, multi: bool = False) -> pd.DataFrame:
    """One row per level (config x concurrency x repeat x side) in the order they ran: requests, output tokens/s,
    requests/s, per-user tokens/s, TTFT/TPOT/ITL p50/p90/p99 (ms), tau from both sources, the machine's load."""
    def num(v, f: str) -> str:
        return format(float(v), f) if _ok(v) else DASH

    d = levels.sort_values(["run_id", "order"])
    out = pd.DataFrame({"run": d["run_id"], "config": d["config"], "concurrency": d["concurrency"].astype(int),
                        "repeat": d["repeat"].astype(int), "side": d["side"], "requests": d["requests"].astype(int),
                        "errors": d["errors"].astype(int),
                        "output tok/s": [num(v, ",.0f") for v in d["output_tps"]],
                        "req/s": [num(v, ",.1f") for v in d["req_per_s"]],
                        "per-user tok/s": [num(v, ",.0f") for v in d["per_user_tps"]]})
    for m in LATENCY:
        for q in PERCENTILES:
            out[f"{m.upper()} {q} ms"] = [num(v * 1000.0 if _ok(v) else None, ".2f") for v in d[f"{m}_{q}"]]
    out["tau (server)"] = [num(v, ".3f") for v in d["tau_server"]]
    out["tau (own count)"] = [num(v, ".3f") for v in d["tau_client"]]
    out["load1"] = [num(v, ".2f") for v in d["load1"]]
    out["CPU %"] = [num(v, ".0f") for v in d["cpu_percent"]]
    if "gpu_processes" in d and d["gpu_processes"].notna().any():       # recorded where NVML was there
        out["GPU processes"] = [num(v, ".0f") for v in d["gpu_processes"]]
        out["GPU util %"] = [num(v, ".0f") for v in d["gpu_util"]]
    out = out.reset_index(drop=True)
    return out if multi else out.drop(columns=["run"])


def worth_line(tau_from: float | None, tau_to: float | None, speed_map=None,
               model_type: str | None = None) -> str | None:
    """One sentence for the Drafter check and Compare pages where a fix (or a better drafter) is known: what raising
    tau from `tau_from` to `tau_to` is worth in output tokens/s at each concurrency of a speedup map
    (backend/drafter_worth.py; when none is given, the shipped map of the target's model type, else the dense one).
    None when the map cannot say."""
    from backend.drafter_worth import find_map, worth_by_concurrency

    if tau_from is None or tau_to is None or tau_to <= tau_from:
        return None
    m = speed_map or find_map(model_type=model_type)
    if m is None:
        return None
    ws = worth_by_concurrency(m.cells, tau_from, tau_to)
    if not ws:
        return None
    parts = [f"{w.gain:+.0%} at concurrency {w.concurrency}" for w in ws]
    return (f"**What the fix is worth at serving load**: raising tau from {tau_from:.2f} to {tau_to:.2f} gives "
            f"{_and(parts)} in output tokens/s (speedup {ws[0].speedup_from:.2f}x -> {ws[0].speedup_to:.2f}x at "
            f"concurrency {ws[0].concurrency}), read on the {m.label}, K={ws[0].k}. A map of your own target's shape "
            "(`python -m backend sweep ... --synthetic-tau 1,2,3,4`) gives your figures.")


def worth_for_check(rep: dict) -> str | None:
    """worth_line for a drafter check with a fix: from the tau predicted as the chosen release feeds the drafter to
    the tau predicted for the boundaries it was trained on."""
    fed = ((rep.get("engine_feeds") or {}).get("accuracy") or {}).get("tau")
    best = (rep.get("best_candidate") or {}).get("tau")
    if not (rep.get("fix") or {}).get("plan"):
        return None
    return worth_line(fed, best, model_type=(rep.get("target_info") or {}).get("model_type"))
