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


DASH = "\u2014"         # a table cell with no value (the reason is in the row's problem column)


def _bounds(labels) -> str:
    return ", ".join(labels) if labels else DASH


def _reading_problem(r: dict, rep: dict) -> str:
    """What is wrong with one engine reading, in words: its error, why it does not run, or how what it feeds
    compares with what the finder says the drafter was trained on."""
    if r["error"]:
        return r["error"]
    if not r.get("picked", True):
        return r.get("why") or "not the runner this engine picks"
    best = (rep.get("best_candidate") or {}).get("boundaries")
    fed = _bounds(r["boundaries"])
    if best is None:
        if rep.get("mode") == "lint":
            return f"feeds {fed}; whether the drafter was trained on these is not checked (lint only)"
        return f"feeds {fed}; the finder could not tell what the drafter was trained on (see the verdict)"
    if r["boundaries"] == best:
        return f"none: feeds {fed}, what the drafter was trained on"
    said = [f["text"] for f in rep["findings"] if f["text"].startswith(r["name"] + " feeds")]
    if said:
        return said[0]
    return f"feeds {fed}, not the trained {_bounds(best)}" + (
        "; see the verdict for the fix" if r["name"] == rep["engine_feeds"]["name"] else "")


def lint_table(rep: dict) -> pd.DataFrame:
    """One row per engine reading: where it reads ids, the ids, what it feeds (or why it cannot) and its problem."""
    focus = rep["engine_feeds"]["name"]
    rows = [{"engine": r["name"], "verdict is about": r["name"] == focus,
             "runs": "yes" if r.get("picked", True) else "no", "reads": r["reads"],
             "ids": "none (engine default)" if r["ids"] is None else ", ".join(map(str, r["ids"])),
             "ids from": r["ids_from"] or DASH, "feeds": _bounds(r["boundaries"]),
             "problem": _reading_problem(r, rep)} for r in rep["lint"]]
    return pd.DataFrame(rows)


def _role(c: dict, rep: dict) -> str:
    best = (rep.get("best_candidate") or {}).get("boundaries")
    fed = rep["engine_feeds"]["boundaries"]
    is_best, is_fed = c["boundaries"] == best, c["boundaries"] == fed
    return "best and fed" if is_best and is_fed else "best" if is_best else "engine feeds" if is_fed else "other"


def ranked(rep: dict, metric: str = "cross_entropy") -> list[tuple[int, dict]]:
    """(the check's own rank by cross-entropy, candidate), best by `metric` first; unscored candidates last."""
    lower = METRICS[metric][1]
    cands = list(enumerate(rep["candidates"], 1))
    return sorted(cands, key=lambda rc: (rc[1][metric] is None,
                                         0.0 if rc[1][metric] is None else rc[1][metric] if lower else -rc[1][metric]))


def _candidate_problem(rank: int, c: dict, rep: dict) -> str:
    """What is wrong with one candidate, in words, from the stored figures: how far its cross-entropy lies above the
    best's and whether the sample tells them apart (paired z against finder.SURE_Z), its predicted tau against the
    best's, whether it beats always guessing the most frequent token, and whether it is what the engine feeds."""
    from backend.drafter.finder import SURE_Z, Candidate, Chance

    if c["cross_entropy"] is None or not c["tokens"]:
        return "not scored: no answer slot was long enough for every draft step"
    parts = []
    role = _role(c, rep)
    name = rep["engine_feeds"]["name"]
    ch = rep.get("chance")
    if ch and not Chance(ch["accuracy"], ch["token"], ch["slots"]).beaten_by(
            Candidate(c["boundaries"], c["why"], accuracy=c["accuracy"], tokens=c["tokens"])):
        parts.append(f"no better than chance (step-1 accuracy {_pct(c['step1_accuracy'])} vs {_pct(ch['accuracy'])} "
                     "for always guessing the most frequent token)")
    if rank == 1:
        if rep.get("best_candidate") is None:
            parts.append("lowest cross-entropy, but the check names no trained set (see the verdict)")
        elif role == "best":
            parts.append(f"none: the best fit (lowest cross-entropy); {name} does not feed it")
        else:
            parts.append(f"none: the best fit (lowest cross-entropy), and {name} feeds it")
        return "; ".join(parts[::-1])
    best = rep["candidates"][0]
    gap = c["cross_entropy"] - best["cross_entropy"]
    z = c["z_vs_best"]
    sure = (f"z {z:.1f}: clearly worse" if z is not None and z >= SURE_Z else
            f"z {z:.1f} < {SURE_Z:g}: not told apart on this sample" if z is not None else "z not computable")
    head = f"what {name} feeds: " if role == "engine feeds" else ""
    parts.insert(0, f"{head}cross-entropy {gap:+.3f} nats over the best ({sure})")
    if c["tau"] is not None and best["tau"] is not None:
        parts.append(f"predicted tau {c['tau']:.2f} vs {best['tau']:.2f}")
    return "; ".join(parts)


def _num(v, spec: str) -> str:
    """A figure as table text; a dash, never "None", where there is none."""
    return DASH if v is None or v != v else format(v, spec)


def _pct(x) -> str:
    return DASH if x is None else f"{100 * x:.1f}%"


def candidates_table(rep: dict, metric: str = "cross_entropy") -> pd.DataFrame:
    """Every candidate, best by `metric` first: the check's rank (by cross-entropy), boundaries, role, what is wrong
    with it, its figures (empty where there is none: the problem says why) and why it was tried. The CSV's table."""
    K = rep["sample"]["num_spec_tokens"]
    rows = []
    for rank, c in ranked(rep, metric):
        row = {"rank": rank, "boundaries": ", ".join(c["boundaries"]), "role": _role(c, rep),
               "problem": _candidate_problem(rank, c, rep), "cross_entropy": c["cross_entropy"],
               "z vs best": c["z_vs_best"] if rank > 1 else None}
        for j in range(K):
            row[f"accuracy step {j + 1}"] = c["accuracy"][j] if j < len(c["accuracy"]) else None
        row.update({"tau": c["tau"], "slots": c["tokens"], "why": "; ".join(c["why"])})
        rows.append(row)
    return pd.DataFrame(rows)


def candidates_display(rep: dict, metric: str = "cross_entropy") -> pd.DataFrame:
    """candidates_table as shown on the page: figures as text, a dash (never "None") where a figure is missing,
    "best" in the z column of the best."""
    df = candidates_table(rep, metric)
    out = df.copy().astype(object)
    out["cross_entropy"] = [_num(v, ".4f") for v in df["cross_entropy"]]
    out["z vs best"] = [f"{DASH} (best)" if r == 1 else _num(v, ".1f") for r, v in zip(df["rank"], df["z vs best"])]
    out["tau"] = [_num(v, ".2f") for v in df["tau"]]
    for c in df.columns:
        if c.startswith("accuracy"):
            out[c] = [_num(v, ".1%") for v in df[c]]
    return out.rename(columns={"cross_entropy": "cross-entropy"})


def candidate_bars(rep: dict, metric: str = "step1_accuracy") -> go.Figure:
    """One bar per candidate, ranked by `metric` (best at the top), on an axis from zero (accuracy 0..100%); the
    best and what the engine feeds coloured."""
    title, lower, fmt = METRICS[metric]
    order = ranked(rep, metric)
    cands = [c for _, c in order]
    colors = {"best": BEST, "engine feeds": FED, "best and fed": BOTH, "other": OTHER}
    y = [", ".join(c["boundaries"]) for c in cands]
    x = [c[metric] for c in cands]
    roles = [_role(c, rep) for c in cands]
    fig = go.Figure(go.Bar(
        x=x, y=y, orientation="h", marker_color=[colors[r] for r in roles], customdata=roles,
        text=[format(v, fmt) if v is not None else "not scored" for v in x], textposition="outside",
        cliponaxis=False, showlegend=False, hovertemplate="%{y} (%{customdata}): %{x:" + fmt + "}<extra></extra>"))
    for role, col in colors.items():                     # a legend for the colours
        if role in roles:
            fig.add_trace(go.Bar(x=[None], y=[None], orientation="h", marker_color=col, name=role, showlegend=True))
    vals = [v for v in x if v is not None]
    hi = max(vals, default=1.0)
    rng = [0.0, 1.0] if "%" in fmt else [0.0, (hi or 1.0) * 1.15]
    by = METRICS[metric][0].split(" (")[0]
    note = "best at the top" + ("" if metric == "cross_entropy" else "; the check itself ranks by cross-entropy")
    fig.update_layout(**_LAYOUT, height=max(320, 120 + 34 * len(cands)), showlegend=True,
                      title=dict(text=f"{title[0].upper()}{title[1:]}" + (" (lower is better)" if lower else "")
                                 + f"<br><sup>candidates ranked by {by}, {note}</sup>"),
                      xaxis=dict(title=title + " (axis from 0)", tickformat=".0%" if "%" in fmt else None, range=rng),
                      yaxis=dict(title="boundaries fed to the drafter", type="category", autorange="reversed",
                                 categoryorder="array", categoryarray=y),
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
             "right": lbl == held, "best cosine": _num(per.get(lbl, {}).get("best_cosine"), ".4f")}
            for i, (lbl, held) in enumerate(zip(td["labels"], td["holds"]))]
    return pd.DataFrame(rows)


def training_alignment(rep: dict) -> Alignment | None:
    td = rep.get("training_data")
    return Alignment.from_json(td["alignment"]) if td else None


def fix_words(rep: dict) -> tuple[str, str | None]:
    """(severity, words) for the check's fix: what to write where and what the release then feeds, or why no fix can
    be written; ("none", None) for a check stored before fixes were planned."""
    fix = rep.get("fix")
    if not fix:
        return "none", None
    if "refused" in fix:
        return "info", fix["refused"][0].upper() + fix["refused"][1:]
    p = fix["plan"]
    eng = {"vllm": "vLLM", "sglang": "SGLang"}.get(p["engine"], p["engine"]) + f" {p['version']}"
    key = ("eagle_config.eagle_aux_hidden_state_layer_ids" if p["where"] == "eagle_config"
           else "top-level eagle_aux_hidden_state_layer_ids")
    return "fix", (f"Write `{key}: {p['ids']}` in the drafter's config.json (nothing else changes): {eng} then feeds "
                   f"{', '.join(p['trained_on'])}, what the drafter was trained on, instead of "
                   f"{', '.join(p['fed_before'] or ['nothing'])}.")


def fix_command(rep: dict) -> str | None:
    """The command that writes the fix and proves it on this machine."""
    fix = (rep.get("fix") or {}).get("plan")
    if not fix:
        return None
    ver = f" --engine-version {fix['version']}"
    return (f"python -m backend check-drafter --drafter {fix['drafter']} --target {fix['target']} --engine "
            f"{fix['engine']}{ver} --write-fix FIXED_DIR --prove")
