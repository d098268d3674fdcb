"""Figures and tables of the Feeds and Regression pages (backend/feeds.py matrices, backend/regress.py groups).

Pure functions: a matrix dict or a DataFrame in, a plotly figure or a DataFrame out (the DataFrame is what the
chart's CSV holds). No Streamlit, no I/O, no SQL, no tensors.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from backend.options import ENGINE_LABELS, RUNNER_ENGINE, SERVING_ENGINES, VLLM_RUNNERS

_LAYOUT = dict(template="plotly_white", margin=dict(l=150, r=30, t=60, b=70), font=dict(size=13))
MATCH, DIFFER, CANNOT = "#2ca02c", "#d62728", "#b0b0b0"
PALETTE = ["#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]
# (engine, track, name) of each line of the Feeds matrix: the runner vLLM picks, each vLLM runner, then every other
# serving engine (backend/options.py)
_RE = ENGINE_LABELS[RUNNER_ENGINE]
TRACKS = ((RUNNER_ENGINE, "picked", f"{_RE} (runner it picks)"),
          *((RUNNER_ENGINE, r, f"{_RE} {r.upper()} runner") for r in VLLM_RUNNERS),
          *((e, None, ENGINE_LABELS[e]) for e in SERVING_ENGINES if e != RUNNER_ENGINE))


def feeds_table(m: dict) -> pd.DataFrame:
    """One row per engine x release x runner: what is fed, whether vLLM picks that runner, the training match."""
    rows = []
    for r in m["rows"]:
        rows.append({"engine": r["engine"], "release": r["release"], "runner": (r["runner"] or "-").upper(),
                     "picked": bool(r["picked"]), "feeds": ", ".join(r["feeds"]) if r["feeds"] else "cannot serve",
                     "trained": r["trained"] or "-", "ids from": r["ids_from"] or "-",
                     "status": r["status"], "why": r["error"] or r["why"] or "",
                     "decided by": "; ".join(f"{k}: {v}" for k, v in (r.get("decided_by") or {}).items())})
    return pd.DataFrame(rows)


def changes_table(m: dict) -> pd.DataFrame:
    names = {(e, t or "-"): n for e, t, n in TRACKS}
    rows = [{"engine": names.get((c["engine"], c["track"]), c["engine"]), "from": c["from"], "release": c["release"],
             "change": c["change"]} for c in m["changes"]]
    return pd.DataFrame(rows, columns=["engine", "from", "release", "change"])


def _track(m: dict, engine: str, track: str | None) -> list[dict]:
    return [r for r in m["rows"] if r["engine"] == engine and
            (track is None or (r["picked"] if track == "picked" else r["runner"] == track))]


def short(feeds: list[str] | None) -> str:
    """A square's label: the boundaries fed as their numbers ("2,4,5" = S_2, S_4, S_5; F stays F), "none" when the
    release cannot serve the drafter."""
    if not feeds:
        return "none"
    return ",".join(b[2:] if b.startswith("S_") else b for b in feeds)


def feeds_grid(m: dict) -> go.Figure:
    """Release (x) by engine reading (y), one labelled square per release (short(): the boundaries fed); colour:
    matches / differs from what the drafter was trained on when a drafter check is stored, else one colour per
    distinct set; grey when the release cannot serve the drafter; a black outline on the runner vLLM picks. The
    legend says all of it."""
    trained = m.get("trained_on")
    sets = sorted({", ".join(r["feeds"]) for r in m["rows"] if r["feeds"]})
    colour_of = {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(sets)}
    lines = [sum(e == engine for e, _, _ in TRACKS) for engine in SERVING_ENGINES]     # a row's height: its lines
    fig = make_subplots(rows=len(lines), cols=1, row_heights=[n / sum(lines) for n in lines], vertical_spacing=0.2,
                        subplot_titles=tuple(f"{ENGINE_LABELS[e]} releases" for e in SERVING_ENGINES))
    for row, engine in enumerate(SERVING_ENGINES, 1):
        for e, track, name in reversed(TRACKS):           # the first track drawn last: at the top
            if e != engine:
                continue
            rs = _track(m, engine, track)
            text = [", ".join(r["feeds"]) if r["feeds"] else "cannot serve" for r in rs]
            shown = [short(r["feeds"]) for r in rs]               # a label on every square
            if trained:
                colours = [MATCH if r["trained"] == "matches" else DIFFER if r["trained"] == "differs" else CANNOT
                           for r in rs]
            else:
                colours = [colour_of[t] if r["feeds"] else CANNOT for r, t in zip(rs, text)]
            hover = [f"{engine} {r['release']} {(r['runner'] or '').upper()}<br>feeds {t}<br>{r['status']}"
                     + (f"<br>{r['trained']} training" if r["trained"] else "") for r, t in zip(rs, text)]
            fig.add_trace(go.Scatter(
                x=[r["release"] for r in rs], y=[name] * len(rs), mode="markers+text", text=shown,
                textposition="top center", textfont=dict(size=10), hovertext=hover, hoverinfo="text",
                marker=dict(size=16, symbol="square", color=colours, line=dict(color="#111", width=[
                    2.5 if r["picked"] and r["runner"] else 0 for r in rs])),
                showlegend=False, name=name), row=row, col=1)
    # the legend: what each colour and the outline mean (empty traces, drawn nowhere)
    keys = ([(MATCH, f"feeds what it was trained on ({', '.join(trained['boundaries'])}, check {trained['run_id']})"),
             (DIFFER, "feeds something else")] if trained else
            [(colour_of[s_], f"feeds {s_}") for s_ in sets])
    keys.append((CANNOT, "cannot serve this drafter"))
    for colour, label in keys:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=label, showlegend=True,
                                 marker=dict(size=14, symbol="square", color=colour)), row=1, col=1)
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", showlegend=True,
                             name="outlined: the runner vLLM picks for this target",
                             marker=dict(size=14, symbol="square-open", color="#111", line=dict(width=2.5))),
                  row=1, col=1)
    title = ("What each release feeds" + (f", against what drafter check {trained['run_id']} found it was trained on"
                                          if trained else "")
             + "<br><sup>label on each square: the boundaries fed by number (2,4,5 = S_2, "
             "S_4, S_5; F = after the final norm); hover for the reason</sup>")
    fig.update_layout(**{**_LAYOUT, "margin": dict(l=150, r=30, t=80, b=70)}, title=dict(text=title,
                      font=dict(size=14)), height=600, showlegend=True,
                      legend=dict(orientation="h", yanchor="top", y=-0.22, xanchor="left", x=0))
    fig.update_xaxes(type="category", tickangle=-45)
    fig.update_yaxes(type="category")
    return fig


def regression_figure(t: pd.DataFrame) -> go.Figure:
    """tau (95% CI over prompts) and speedup (95% CI) of each run of one drafter and target, in release order."""
    x = [f"{r.release}<br>{r.date} {r.run_id}" for r in t.itertuples()]       # run id: one point per run
    fig = make_subplots(rows=1, cols=2, subplot_titles=("mean acceptance length tau (95% CI)",
                                                        "speedup over plain decoding (95% CI)"))

    def err(col: str, lo: str, hi: str) -> dict:
        up = [(h - v) if pd.notna(h) and pd.notna(v) else 0 for v, h in zip(t[col], t[hi])]
        dn = [(v - lo_) if pd.notna(lo_) and pd.notna(v) else 0 for v, lo_ in zip(t[col], t[lo])]
        return dict(type="data", symmetric=False, array=up, arrayminus=dn, thickness=1.5, width=6)

    fig.add_trace(go.Scatter(x=x, y=t["tau"], mode="markers+lines", error_y=err("tau", "tau_ci_low", "tau_ci_high"),
                             marker=dict(size=10, color="#1f77b4"), name="tau", hovertext=t["run_id"]), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=t["speedup"], mode="markers+lines",
                             error_y=err("speedup", "speedup_ci_low", "speedup_ci_high"),
                             marker=dict(size=10, color="#ff7f0e"), name="speedup", hovertext=t["run_id"]),
                  row=1, col=2)
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888", row=1, col=2)
    fig.update_layout(**{**_LAYOUT, "margin": dict(l=60, r=30, t=60, b=120)}, showlegend=False, height=430)
    fig.update_xaxes(type="category", tickangle=-30)
    return fig


def regression_rows(t: pd.DataFrame) -> pd.DataFrame:
    """The table under the chart: figures with their intervals as text."""
    def ci(v, lo, hi, fmt="{:.3f}") -> str:
        if v is None or pd.isna(v):
            return "-"
        s = fmt.format(v)
        return s + (f" [{fmt.format(lo)}, {fmt.format(hi)}]" if lo is not None and pd.notna(lo) and pd.notna(hi)
                    else "")
    return pd.DataFrame([{
        "release": r.release, "date": r.date, "run": r.run_id,
        "tau [95% CI]": ci(r.tau, r.tau_ci_low, r.tau_ci_high),
        "tau change vs first [paired 95% CI]": ci(r.tau_change, r.tau_change_ci_low, r.tau_change_ci_high,
                                                  "{:+.3f}"),
        "speedup [95% CI]": ci(r.speedup, r.speedup_ci_low, r.speedup_ci_high, "{:.2f}"),
        "acceptance": "-" if r.acceptance_rate is None or pd.isna(r.acceptance_rate) else f"{r.acceptance_rate:.1%}",
        "lossless": {True: "yes", False: "NO"}.get(r.lossless if isinstance(r.lossless, bool) else None, "-"),
    } for r in t.itertuples()])
