"""Figures and tables of the Drafter check page, from a stored check result (backend/check_drafter.py's check.json).

Pure functions: a report dict in, a plotly figure or a DataFrame out (the DataFrame is what the chart's CSV holds).
No Streamlit, no I/O, no tensors.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from backend.align import Alignment
from backend.drafter.lint import SEVERITIES

# metric -> (axis title, lower is better, number format)
METRICS: dict[str, tuple[str, bool, str]] = {
    "step1_accuracy": ("step-1 top-1 accuracy (teacher-forced)", False, ".1%"),
    "tau": ("predicted mean acceptance length tau", False, ".2f"),
    "cross_entropy": ("cross-entropy vs the target (nats, mean over steps)", True, ".3f"),
}
BEST, FED, BOTH, OTHER = "#2ca02c", "#d62728", "#1f77b4", "#b0b0b0"
_LAYOUT = dict(template="plotly_white", margin=dict(l=70, r=30, t=70, b=60), font=dict(size=13))


def lint_table(rep: dict) -> pd.DataFrame:
    """One row per engine reading: where it reads ids, the ids, what it feeds (or why it cannot)."""
    focus = rep["engine_feeds"]["name"]
    rows = [{"engine": r["name"], "verdict is about": r["name"] == focus,
             "runs": "yes" if r.get("picked", True) else "no", "reads": r["reads"],
             "ids": "none" if r["ids"] is None else ", ".join(map(str, r["ids"])),
             "ids from": r["ids_from"] or "-", "feeds": ", ".join(r["boundaries"]) if r["boundaries"] else "-",
             "problem": r["error"] or (r.get("why") or "" if not r.get("picked", True) else "")} for r in rep["lint"]]
    return pd.DataFrame(rows)


def _role(c: dict, rep: dict) -> str:
    best = (rep.get("best_candidate") or {}).get("boundaries")
    fed = rep["engine_feeds"]["boundaries"]
    is_best, is_fed = c["boundaries"] == best, c["boundaries"] == fed
    return "best and fed" if is_best and is_fed else "best" if is_best else "engine feeds" if is_fed else "other"


def candidates_table(rep: dict) -> pd.DataFrame:
    """Every candidate, best first: boundaries, role, figures, why it was tried."""
    K = rep["sample"]["num_spec_tokens"]
    rows = []
    for rank, c in enumerate(rep["candidates"], 1):
        row = {"rank": rank, "boundaries": ", ".join(c["boundaries"]), "role": _role(c, rep),
               "cross_entropy": c["cross_entropy"], "z vs best": c["z_vs_best"] if rank > 1 else None}
        for j in range(K):
            row[f"accuracy step {j + 1}"] = c["accuracy"][j] if j < len(c["accuracy"]) else None
        row.update({"tau": c["tau"], "slots": c["tokens"], "why": "; ".join(c["why"])})
        rows.append(row)
    return pd.DataFrame(rows)


def candidate_bars(rep: dict, metric: str = "step1_accuracy") -> go.Figure:
    """One bar per candidate (ranked order, best at the top): the chosen metric; the best and what the engine
    feeds coloured."""
    title, lower, fmt = METRICS[metric]
    cands = rep["candidates"]
    colors = {"best": BEST, "engine feeds": FED, "best and fed": BOTH, "other": OTHER}
    y = [", ".join(c["boundaries"]) for c in cands]
    x = [c[metric] for c in cands]
    roles = [_role(c, rep) for c in cands]
    fig = go.Figure(go.Bar(
        x=x, y=y, orientation="h", marker_color=[colors[r] for r in roles], customdata=roles,
        text=[format(v, fmt) if v is not None else "" for v in x], textposition="outside", cliponaxis=False,
        showlegend=False, hovertemplate="%{y} (%{customdata}): %{x:" + fmt + "}<extra></extra>"))
    for role, col in colors.items():                     # a legend for the colours
        if role in roles:
            fig.add_trace(go.Bar(x=[None], y=[None], orientation="h", marker_color=col, name=role, showlegend=True))
    vals = [v for v in x if v is not None]
    lo, hi = (min(vals), max(vals)) if vals else (0, 1)
    pad = (hi - lo) * 0.25 or abs(hi) * 0.05 or 0.1
    rng = [lo - pad, hi + pad] if metric == "cross_entropy" else [max(0.0, lo - pad) if metric != "tau" else
                                                                   max(1.0, lo - pad), hi + pad]
    fig.update_layout(**_LAYOUT, height=max(320, 120 + 34 * len(cands)), showlegend=True,
                      title=dict(text=f"{title[0].upper()}{title[1:]}" + (" (lower is better)" if lower else "")
                                 + "<br><sup>candidates ranked by cross-entropy, best at the top</sup>"),
                      xaxis=dict(title=title, tickformat=".0%" if "%" in fmt else None, range=rng),
                      yaxis=dict(title="boundaries fed to the drafter", type="category", autorange="reversed"),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0), bargap=0.25)
    return fig


def step_frame(rep: dict) -> pd.DataFrame:
    """Per draft step: top-1 accuracy and acceptance (steps 1..j all right) of the best and the engine's candidate."""
    rows = []
    picks = {}
    for c in rep["candidates"]:
        r = _role(c, rep)
        if r != "other":
            picks[r] = c
    for role, c in picks.items():
        for j, (a, acc) in enumerate(zip(c["accuracy"], c["acceptance"]), 1):
            rows.append({"candidate": f"{', '.join(c['boundaries'])} ({role})", "role": role, "step": j,
                         "accuracy": a, "acceptance": acc})
    return pd.DataFrame(rows, columns=["candidate", "role", "step", "accuracy", "acceptance"])


def step_curves(rep: dict) -> go.Figure:
    df = step_frame(rep)
    colors = {"best": BEST, "engine feeds": FED, "best and fed": BOTH}
    fig = go.Figure()
    for cand, g in df.groupby("candidate", sort=False):
        col = colors.get(g["role"].iloc[0], OTHER)
        fig.add_trace(go.Scatter(x=g["step"], y=g["accuracy"], mode="lines+markers", name=f"{cand}: top-1",
                                 line=dict(color=col, width=2.5), marker=dict(size=9),
                                 hovertemplate=f"{cand}<br>step %{{x}}: top-1 %{{y:.1%}}<extra></extra>"))
        fig.add_trace(go.Scatter(x=g["step"], y=g["acceptance"], mode="lines+markers", name=f"{cand}: acceptance",
                                 line=dict(color=col, width=2, dash="dash"), marker=dict(size=8, symbol="square"),
                                 hovertemplate=f"{cand}<br>steps 1..%{{x}} all right: %{{y:.1%}}<extra></extra>"))
    fig.update_layout(**_LAYOUT, height=420, title=dict(text="Per draft step: top-1 accuracy and acceptance"),
                      xaxis=dict(title="draft step", dtick=1),
                      yaxis=dict(title="share of scored slots", tickformat=".0%", range=[0, 1.02]),
                      legend=dict(orientation="h", yanchor="top", y=-0.18))
    return fig


def findings(rep: dict) -> list[tuple[str, str, str]]:
    """(severity, source, text), most severe first; the verdict is shown on its own and left out here."""
    fs = [(f["severity"], f.get("source", "lint"), f["text"]) for f in rep["findings"] if f["text"] != rep["verdict"]]
    return sorted(fs, key=lambda f: SEVERITIES.index(f[0]) if f[0] in SEVERITIES else 9)


def findings_frame(rep: dict) -> pd.DataFrame:
    return pd.DataFrame(findings(rep), columns=["severity", "source", "text"])


def training_table(rep: dict) -> pd.DataFrame | None:
    """One row per stored state of the training files: its label by the producer's convention, what it really is."""
    td = rep.get("training_data")
    if not td:
        return None
    n_aux = len(td["aux_holds"])
    per = {p["boundary"]: p for p in td["alignment"]["per_boundary"]}
    rows = [{"stored state": i + 1, "role": "aux" if i < n_aux else "teacher", "labelled": lbl, "really is": held,
             "right": lbl == held, "best cosine": per.get(lbl, {}).get("best_cosine")}
            for i, (lbl, held) in enumerate(zip(td["labels"], td["holds"]))]
    return pd.DataFrame(rows)


def training_alignment(rep: dict) -> Alignment | None:
    td = rep.get("training_data")
    return Alignment.from_json(td["alignment"]) if td else None
