"""Figures and tables of the Watch page, from a watch run's windows (catalog.watch_windows: backend/watch.py wrote
them, backend/metrics.py defines tau, the rates and the drift band) and its manifest's `watch` section.

Pure functions: a DataFrame (and the verdict dict) in, a plotly figure or a DataFrame out (the DataFrame is what the
chart's CSV holds). No Streamlit, no I/O, no SQL, no statistics: the band and the flags are the watch's own. The
manifest is read typed (backend/runs/manifest.py `StoredManifest`), its `watch` section (`WatchInfo`) through
`stored_watch`.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from backend.options import engine_label
from backend.runs.manifest import StoredManifest, StoredWatchSettings, WatchInfo
from dashboard import severity as scale

_LAYOUT = dict(template="plotly_white", margin=dict(l=70, r=30, t=80, b=90), font=dict(size=13))
_X = "x: the window's end (UTC)"
TAU, BAND, DRIFT, LOW, FEW, RESTART, FLOOR = ("#1f77b4", "rgba(44,160,44,0.18)", "#d62728", "#ff7f0e", "#9e9e9e",
                                              "#7f7f7f", "#9467bd")
POSITIONS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
DASH = "\u2014"
# the verdict's level where no tau cost sizes it: a drift is as loud as what it costs (drift_cost); below the user's own
# --min-tau floor is an error (the bar the user set, on which the watch exits 1); no baseline or no traffic: a note
STATE_LEVEL = {"below_min_tau": "error", "ok": "ok", "no_baseline": "note", "no_traffic": "note"}


def stored_watch(manifest: StoredManifest | dict) -> WatchInfo:
    """A watch run's `watch` section as backend/watch.py wrote it (its server, how it stopped, its verdict), typed;
    an empty one when there is none."""
    w = StoredManifest.indexed(manifest).watch
    return w if w is not None else WatchInfo()


def stored_verdict(manifest: StoredManifest | dict) -> dict:
    """The watch's verdict (`watch.verdict`: its state, line, tau, windows, drafts), {} when there is none."""
    v = stored_watch(manifest).verdict
    return v if isinstance(v, dict) else {}


def drift_cost(df: pd.DataFrame) -> scale.Cost | None:
    """The confirmed drift sized as a tau cost (dashboard/severity.py): the pooled tau of the drifted windows (1 +
    accepted / drafts over them) against their baseline tau (each window's segment baseline, weighted by its drafts).
    Confirmed by the watch's own test, so sure. None when no window drifted."""
    if df is None or df.empty or "drift" not in df:
        return None
    d = df[df["drift"].fillna(False).astype(bool) & df["baseline_tau"].notna() & (df["drafts"] > 0)]
    drafts = float(d["drafts"].sum()) if len(d) else 0.0
    if not drafts:
        return None
    base = float((d["baseline_tau"] * d["drafts"]).sum() / drafts)
    return scale.tau_cost(base, 1 + float(d["accepted"].sum()) / drafts, sure=True)


def verdict_level(verdict: dict | None, df: pd.DataFrame | None = None) -> tuple[scale.Level, str]:
    """The verdict banner's level on the one severity scale and its text: a drift led by its size (drift_cost: 3%
    of tau a note, 50% an error); below --min-tau an error however small the drop (the user's own bar); a clean
    watch ok; no baseline or no traffic a note."""
    v = verdict or {}
    line = v.get("line") or ""
    below_min = bool(v.get("below_min_windows")) or "BELOW --min-tau" in line
    if v.get("state") == "drift":
        cost = drift_cost(df) if df is not None else None
        if cost is None:
            return scale.LEVELS["error" if below_min else "warning"], line
        level = scale.LEVELS["error"] if below_min else cost.level
        head = f"**{level.name}** (tau cost {cost.rel:.0%}" + (", below your --min-tau" if below_min else "") + ")"
        return level, f"{head}: drift, {cost.words} (the drifted windows' tau against their baseline). {line}"
    return scale.LEVELS[STATE_LEVEL.get(v.get("state"), "warning")], line


def severity(verdict: dict | None, df: pd.DataFrame | None = None) -> str:
    """ok | note | warning | error: the verdict banner's level (verdict_level)."""
    return verdict_level(verdict, df)[0].key


def with_time(df: pd.DataFrame) -> pd.DataFrame:
    """The windows with `time` (the window's end, UTC) and `start` as datetimes."""
    out = df.copy()
    out["time"] = pd.to_datetime(out["t_end"], unit="s", utc=True)
    out["start"] = pd.to_datetime(out["t_start"], unit="s", utc=True)
    return out


def _restarts(fig: go.Figure, df: pd.DataFrame, rows: list[int] | None = None) -> None:
    """A dashed vertical line at each restart window's start, labelled once at the top."""
    for t in df.loc[df["restart"].fillna(False).astype(bool), "start"]:
        x = t.strftime("%Y-%m-%d %H:%M:%S.%f")            # a date string: plotly's date axis, microseconds kept
        for r in rows or [None]:
            kw = dict(row=r, col=1) if r else {}
            fig.add_vline(x=x, line=dict(color=RESTART, dash="dash", width=1.5), **kw)
        fig.add_annotation(x=x, y=1.0, yref="paper", text="restart", showarrow=False, yanchor="bottom",
                           font=dict(color=RESTART, size=12))


def tau_frame(df: pd.DataFrame) -> pd.DataFrame:
    """What the tau chart shows, one row per window (its CSV)."""
    d = with_time(df)
    cols = ["window", "segment", "start", "time", "drafts", "accepted", "tau", "baseline_tau", "band_low", "band_high",
            "status", "baseline", "below_band", "drift", "below_min_tau", "restart", "note"]
    return d[cols].rename(columns={"time": "end"})


def tau_figure(df: pd.DataFrame, min_tau: float | None = None, level: float | None = None) -> go.Figure:
    """tau per window (x: the window's end) with each segment's baseline band and baseline tau; drifted windows
    (confirmed) in red, windows below the band not (yet) confirmed in orange, windows with too few drafts hollow
    grey (not evidence), restarts as dashed lines, --min-tau as a dotted line."""
    d = with_time(df)
    fig = go.Figure()
    lvl = f"one-sided {level:.0%} " if level else ""
    shown = False
    for seg, g in d.groupby("segment", sort=True):
        b = g[g["band_low"].notna()]
        if b.empty:
            continue
        fig.add_trace(go.Scatter(x=b["time"], y=b["band_high"], mode="lines", line=dict(width=0, shape="hvh"),
                                 hoverinfo="skip", showlegend=False, legendgroup="band"))
        fig.add_trace(go.Scatter(x=b["time"], y=b["band_low"], mode="lines", line=dict(width=0, shape="hvh"),
                                 fill="tonexty", fillcolor=BAND, name=f"baseline band ({lvl}per window)",
                                 legendgroup="band", showlegend=not shown,
                                 hovertemplate="band %{y:.3f} and up<extra></extra>"))
        fig.add_trace(go.Scatter(x=b["time"], y=b["baseline_tau"], mode="lines",
                                 line=dict(color="#2ca02c", dash="dash"), name="baseline tau", legendgroup="base",
                                 showlegend=not shown,
                                 hovertemplate=f"segment {seg}: baseline tau %{{y:.3f}}<extra></extra>"))
        shown = True
    ev = d[d["tau"].notna()]
    fig.add_trace(go.Scatter(x=ev["time"], y=ev["tau"], mode="lines", line=dict(color=TAU, width=1.5),
                             connectgaps=False, showlegend=False, hoverinfo="skip"))
    groups = [("window tau", ev[~ev["status"].isin(["too few drafts"]) & ~ev["below_band"].fillna(False).astype(bool)],
               dict(color=TAU, size=8)),
              ("too few drafts (not evidence)", ev[ev["status"] == "too few drafts"],
               dict(color="white", size=8, line=dict(color=FEW, width=2))),
              ("below the band (not confirmed)", ev[ev["below_band"].fillna(False).astype(bool)
                                                    & ~ev["drift"].fillna(False).astype(bool)],
               dict(color=LOW, size=10, symbol="diamond")),
              ("drift (confirmed)", ev[ev["drift"].fillna(False).astype(bool)],
               dict(color=DRIFT, size=12, symbol="x"))]
    for name, g, marker in groups:
        if g.empty and name != "window tau":
            continue
        fig.add_trace(go.Scatter(
            x=g["time"], y=g["tau"], mode="markers", marker=marker, name=name,
            customdata=list(zip(g["window"], g["drafts"], g["status"])),
            hovertemplate="window %{customdata[0]}: tau %{y:.3f} over %{customdata[1]:,} drafts "
                          "(%{customdata[2]})<extra></extra>"))
    if min_tau is not None:
        fig.add_hline(y=min_tau, line=dict(color=FLOOR, dash="dot", width=2))
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line=dict(color=FLOOR, dash="dot", width=2),
                                 name=f"--min-tau {min_tau:g}"))
    _restarts(fig, d)
    vals = pd.concat([ev["tau"], d["band_low"].dropna(), d["band_high"].dropna()])
    lo = min(vals.min() if len(vals) else 1.0, min_tau if min_tau is not None else math.inf)
    hi = max(vals.max() if len(vals) else 2.0, min_tau if min_tau is not None else -math.inf)
    pad = max(0.05, (hi - lo) * 0.1)
    fig.update_layout(**_LAYOUT, height=440,
                      title=dict(text="tau per window against the baseline band<br><sup>tau = 1 + accepted / drafts "
                                      "over each window's counter deltas; band: the first windows with traffic of each "
                                      f"segment; {_X}</sup>"),
                      yaxis=dict(title="tau (mean acceptance length)", range=[max(0.9, lo - pad), hi + pad]),
                      legend=dict(orientation="h", yanchor="top", y=-0.16), hovermode="closest")
    return fig


def position_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Long table: window, time, position (1-based draft position), acceptance rate (accepted at that position /
    drafts). Empty when the server gives no per-position counts (SGLang)."""
    d = with_time(df)
    rows = []
    for w, t, rates, drafts in zip(d["window"], d["time"], d["per_pos_rate"], d["drafts"]):
        if rates is None or (isinstance(rates, float) and math.isnan(rates)):
            continue
        for i, r in enumerate(list(rates)):
            rows.append({"window": int(w), "time": t, "position": i + 1, "acceptance": float(r), "drafts": int(drafts)})
    return pd.DataFrame(rows, columns=["window", "time", "position", "acceptance", "drafts"])


def position_figure(df: pd.DataFrame) -> go.Figure:
    """Per-position acceptance over time, one line per draft position."""
    p = position_frame(df)
    d = with_time(df)
    fig = go.Figure()
    for pos, g in p.groupby("position"):
        fig.add_trace(go.Scatter(x=g["time"], y=g["acceptance"], mode="lines+markers", name=f"position {pos}",
                                 line=dict(color=POSITIONS[(pos - 1) % len(POSITIONS)], width=2),
                                 marker=dict(size=5), customdata=g["window"],
                                 hovertemplate=f"position {pos}, window %{{customdata}}: %{{y:.1%}}<extra></extra>"))
    _restarts(fig, d)
    fig.update_layout(**_LAYOUT, height=380,
                      title=dict(text="Acceptance per draft position<br><sup>accepted at position i / drafts, per "
                                      f"window (a chain accepts a prefix: position 1 >= 2 >= ...); {_X}</sup>"),
                      yaxis=dict(title="acceptance", tickformat=".0%", range=[0, 1.02]),
                      legend=dict(orientation="h", yanchor="top", y=-0.2))
    return fig


RATES = {"drafted_tps": ("drafted tokens/s", "#9467bd"), "accepted_tps": ("accepted tokens/s", "#2ca02c"),
         "generation_tps": ("generated tokens/s", "#1f77b4")}
GAUGES = {"running": ("running requests", "#ff7f0e"), "waiting": ("waiting requests", "#8c564b")}


def rates_frame(df: pd.DataFrame) -> pd.DataFrame:
    d = with_time(df)
    return d[["window", "start", "time", "seconds", *RATES, "finished_requests", *GAUGES]].rename(
        columns={"time": "end"})


def rates_figure(df: pd.DataFrame) -> go.Figure:
    """Drafted, accepted and generated tokens/s per window (top) and running / waiting requests at each window's
    end (bottom). A restart window has counts but no rates (the restart moment is not known): a gap."""
    d = with_time(df)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.62, 0.38], vertical_spacing=0.08)
    for col, (name, color) in RATES.items():
        if d[col].notna().any():
            fig.add_trace(go.Scatter(x=d["time"], y=d[col], mode="lines+markers", name=name,
                                     line=dict(color=color, width=2), marker=dict(size=4), connectgaps=False,
                                     hovertemplate=f"{name}: %{{y:,.1f}}<extra></extra>"), row=1, col=1)
    for col, (name, color) in GAUGES.items():
        if d[col].notna().any():
            fig.add_trace(go.Scatter(x=d["time"], y=d[col], mode="lines", name=name, line=dict(color=color, width=2,
                                                                                                shape="hv"),
                                     hovertemplate=f"{name}: %{{y:g}}<extra></extra>"), row=2, col=1)
    _restarts(fig, d, rows=[1, 2])
    fig.update_layout(**_LAYOUT, height=460,
                      title=dict(text="Throughput and load<br><sup>tokens/s: counter deltas over each window; "
                                      f"requests: the server's gauges at the window's end; {_X}</sup>"),
                      legend=dict(orientation="h", yanchor="top", y=-0.15), hovermode="x unified")
    fig.update_yaxes(title_text="tokens/s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="requests", rangemode="tozero", row=2, col=1)
    return fig


def windows_table(df: pd.DataFrame) -> pd.DataFrame:
    """The windows for the page's table: time, counts, tau with its band, rates, status and note."""
    d = with_time(df)

    def num(v, f: str) -> str:          # no cell reads "None": a missing figure is a dash
        return DASH if v is None or pd.isna(v) else format(v, f)
    return pd.DataFrame({
        "window": d["window"], "end (UTC)": d["time"].dt.strftime("%H:%M:%S"), "segment": d["segment"],
        "drafts": d["drafts"], "accepted": d["accepted"], "tau": [num(v, ".3f") for v in d["tau"]],
        "band": [DASH if pd.isna(lo) else f"{lo:.3f} - {hi:.3f}" for lo, hi in zip(d["band_low"], d["band_high"])],
        "acceptance": [num(v, ".1%") for v in d["acceptance_rate"]],
        "generated tok/s": [num(v, ",.1f") for v in d["generation_tps"]],
        "running": [num(v, "g") for v in d["running"]],
        "status": [s + (" + drift" if dr else "") + (" + below --min-tau" if m else "")
                   for s, dr, m in zip(d["status"], d["drift"].fillna(False), d["below_min_tau"].fillna(False))],
        "note": d["note"].fillna("")})


def summary(manifest: StoredManifest | dict, df: pd.DataFrame) -> str:
    """One caption line about the watch: server, engine and version, model, windows and span, settings."""
    m = StoredManifest.indexed(manifest)
    w = stored_watch(m)
    s = m.settings_as(StoredWatchSettings)
    eng = engine_label(m.engine)
    ver = f" {m.engine_version}" if m.engine_version else ""
    model = m.model.path if m.model is not None else None
    span = (df["t_end"].max() - df["t_start"].min()) if len(df) else 0.0
    span_s = f"{span:.1f} s" if span < 120 else f"{span / 60:.1f} min" if span < 7200 else f"{span / 3600:.1f} h"
    return (f"`{w.metrics_url or w.server_url or '?'}`: {eng}{ver}" + (f", model `{model}`" if model else "")
            + f"; {len(df)} window(s) of {_or_unknown(s.interval)} s over {span_s}; baseline: the first "
              f"{_or_unknown(s.baseline_windows)} windows with {_or_unknown(s.min_drafts)}+ drafts; a verdict needs "
              f"{_or_unknown(s.confirm)} window(s) in a row below the band" +
            (f" or below --min-tau {s.min_tau:g}" if s.min_tau is not None else "") + ".")


def _or_unknown(v) -> object:
    return "?" if v is None else v
