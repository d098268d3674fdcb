"""Figures and tables of the Drafter check page, from a stored check result (backend/check_drafter.py's check.json).

Pure functions: a report dict in, a plotly figure or a DataFrame out (the DataFrame is what the chart's CSV holds).
No Streamlit, no I/O, no tensors.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from backend.align import Alignment
from backend.drafter.fix import where_key
from backend.drafter.lint import SEVERITIES
from backend.options import engine_label
from backend.runs.manifest import StoredManifest
from backend.text.check_text import stored_text
from dashboard import severity

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
    said = [t for t in map(stored_text, rep["findings"]) if t.startswith(r["name"] + " feeds")]
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
    # the z says only whether the sample tells the two apart; how much it matters is the predicted tau cost, on the
    # one severity scale (dashboard/severity.py)
    cost = (severity.tau_cost(best["tau"], c["tau"], sure=z is not None and z >= SURE_Z, what="predicted tau")
            if c["tau"] is not None and best["tau"] is not None else None)
    head = f"what {name} feeds: " if role == "engine feeds" else ""
    said = severity.significance_words(z, SURE_Z, cost)
    parts.insert(0, f"{head}cross-entropy {gap:+.3f} nats over the best ({said})")
    return "; ".join(parts)


def check_cost(rep: dict) -> severity.Cost | None:
    """What feeding the engine's boundaries instead of the trained ones costs, by the check's own prediction: the
    predicted tau of what the engine feeds against the best candidate's, sure when their paired z reaches
    finder.SURE_Z. None when the engine feeds the best, or either is not scored."""
    from backend.drafter.finder import SURE_Z

    best, fed = rep.get("best_candidate"), (rep.get("engine_feeds") or {}).get("accuracy")
    if not best or not fed or fed.get("boundaries") == best.get("boundaries"):
        return None
    if best.get("tau") is None or fed.get("tau") is None:
        return None
    z = fed.get("z_vs_best")
    return severity.tau_cost(best["tau"], fed["tau"], sure=z is not None and z >= SURE_Z, what="predicted tau")


_OF_SEVERITY = {"ok": "ok", "info": "note", "warning": "warning", "error": "error"}


def verdict_level(rep: dict) -> tuple[severity.Level, str]:
    """The verdict banner: its level on the one severity scale and its text. A mismatch is as loud as what it costs
    (the predicted tau of what the engine feeds against the trained set's: 2% is a note, 50% an error); other
    verdicts (match, inconclusive, cannot serve, lint only) keep the check's own severity."""
    text = rep["verdict"]
    cost = check_cost(rep)
    if cost is not None and text.startswith("Mismatch: "):
        size = {"ok": "no cost", "note": "a small mismatch", "warning": "a mismatch that costs",
                "error": "a mismatch that costs much"}[cost.level.key]
        return cost.level, (f"**{cost.level.name}: {size}** ({cost.words}). Mismatch: "
                            f"{text[len('Mismatch: '):]}")
    return severity.LEVELS[_OF_SEVERITY.get(rep.get("verdict_severity"), "warning")], text


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
    # "best" only ever marks the best by the measure shown (the top bar); the check's own pick (lowest
    # cross-entropy) is named as such, in its own colour, wherever it ranks by this measure
    name = {"best": "trained on (the check's pick: lowest cross-entropy)", "engine feeds": "what the engine feeds",
            "best and fed": "trained on and fed", "other": "other"}
    colors = {name["best"]: BEST, name["engine feeds"]: FED, name["best and fed"]: BOTH, name["other"]: OTHER}
    y = [", ".join(c["boundaries"]) for c in cands]
    x = [c[metric] for c in cands]
    roles = [name[_role(c, rep)] for c in cands]
    by = METRICS[metric][0].split(" (")[0]
    labels = [format(v, fmt) if v is not None else "not scored" for v in x]
    if labels and x[0] is not None:
        labels[0] += f"  \u2605 best by {by}"
    fig = go.Figure(go.Bar(
        x=x, y=y, orientation="h", marker_color=[colors[r] for r in roles], customdata=roles,
        text=labels, textposition="outside",
        cliponaxis=False, showlegend=False, hovertemplate="%{y} (%{customdata}): %{x:" + fmt + "}<extra></extra>"))
    for role, col in colors.items():                     # a legend for the colours
        if role in roles:
            fig.add_trace(go.Bar(x=[None], y=[None], orientation="h", marker_color=col, name=role, showlegend=True))
    vals = [v for v in x if v is not None]
    hi = max(vals, default=1.0)
    rng = [0.0, 1.0] if "%" in fmt else [0.0, (hi or 1.0) * 1.15]
    note = "best at the top" + ("" if metric == "cross_entropy" else "; the check itself ranks by cross-entropy")
    fig.update_layout(**{**_LAYOUT, "margin": dict(l=70, r=190, t=70, b=130)}, height=max(390, 190 + 34 * len(cands)),
                      showlegend=True,
                      title=dict(text=f"{title[0].upper()}{title[1:]}" + (" (lower is better)" if lower else "")
                                 + f"<br><sup>candidates ranked by {by}, {note}</sup>"),
                      xaxis=dict(title=title + " (axis from 0)", tickformat=".0%" if "%" in fmt else None, range=rng),
                      yaxis=dict(title="boundaries fed to the drafter", type="category", autorange="reversed",
                                 categoryorder="array", categoryarray=y),
                      legend=dict(orientation="h", yanchor="top", y=-0.16, xanchor="left", x=0.0), bargap=0.25)
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
            said = {"best": "trained on", "best and fed": "trained on and fed"}.get(role, role)
            rows.append({"candidate": f"{', '.join(c['boundaries'])} ({said})", "role": role, "step": j,
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
    """(severity, source, text), most severe first; the verdict is shown on its own and left out here. "Another engine
    feeds something else" is as loud as what that costs (its candidate's predicted tau against the trained set's, on
    the one scale of dashboard/severity.py), like the verdict."""
    from backend.drafter.finder import SURE_Z

    best = rep.get("best_candidate")
    by_set = {tuple(c["boundaries"]): c for c in rep.get("candidates") or []}
    fs = []
    for f in rep["findings"]:
        f = {**f, "text": stored_text(f)}            # worded from its code and figures (an older check: as stored)
        if f["text"] == rep["verdict"]:
            continue
        sev = f["severity"]
        for r in rep.get("lint") or []:
            c = by_set.get(tuple(r.get("boundaries") or ()))
            if (best and c and sev == "warning" and f["text"].startswith(f"{r['name']} feeds ")
                    and c["tau"] is not None and best.get("tau") is not None):
                z = c.get("z_vs_best")
                cost = severity.tau_cost(best["tau"], c["tau"], sure=z is not None and z >= SURE_Z,
                                         what="predicted tau")
                sev = {"ok": "ok", "note": "info"}.get(cost.level.key, cost.level.key)
                f = {**f, "text": f"{f['text']} ({cost.level.name.lower()}: {cost.words})"}
                break
        fs.append((sev, f.get("source", "lint"), f["text"]))
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
    eng = engine_label(p["engine"]) + f" {p['version']}"
    key = where_key(p["where"])
    return "fix", (f"Write `{key}: {p['ids']}` in the drafter's config.json (nothing else changes): {eng} then feeds "
                   f"{', '.join(p['trained_on'])}, what the drafter was trained on, instead of "
                   f"{', '.join(p['fed_before'] or ['nothing'])}.")


def proof_engines(rep: dict) -> dict[str, str]:
    """The engines the fix's proof can run through, with their words: the HF reference bench here (fed as the fix's
    release feeds), or that release's own engine through the job queue (the GPU worker); {} without a fix."""
    fix = (rep.get("fix") or {}).get("plan")
    if not fix:
        return {}
    eng = engine_label(fix["engine"])
    return {"hf": f"HF reference bench on the CPU, fed as {eng} {fix['version']} feeds",
            fix["engine"]: f"{eng} itself on the GPU (the worker runs the queued benches)"}


def fix_command(rep: dict, engine: str = "hf") -> str | None:
    """The command that writes the fix and proves it: on this machine through the HF reference bench (engine "hf"),
    or by queueing the two benches through the fix's own engine for the GPU worker (`--prove-engine`)."""
    fix = (rep.get("fix") or {}).get("plan")
    if not fix:
        return None
    ver = f" --engine-version {fix['version']}"
    through = "" if engine == "hf" else f" --prove-engine {engine}"
    return (f"python -m backend check-drafter --drafter {fix['drafter']} --target {fix['target']} --engine "
            f"{fix['engine']}{ver} --write-fix FIXED_DIR --prove{through}")


def benches_of(manifest: StoredManifest | dict, history: pd.DataFrame) -> pd.DataFrame:
    """The complete bench runs (catalog.bench_history rows) of the checked drafter on the checked target (the check's
    manifest, read typed), matched by fingerprint (else path), as Regression groups them."""
    if history is None or history.empty:
        return pd.DataFrame()
    m = StoredManifest.indexed(manifest)
    d, t = m.drafter_info, m.model
    dkey = (d.fingerprint or d.path) if d is not None else None
    mkey = (t.fingerprint or t.path) if t is not None else None
    if not dkey or not mkey:
        return history.iloc[0:0]
    hit = history[(history["drafter_key"] == dkey) & (history["model_key"] == mkey) & (history["status"] == "complete")
                  & (history["num_spec_tokens"].fillna(0) > 0)]
    return hit


def predicted_vs_measured(rep: dict, benches: pd.DataFrame, speeds: pd.DataFrame) -> pd.DataFrame:
    """One row per bench of the checked drafter and target: the boundaries its engine reading fed, the tau it
    measured (95% bootstrap interval over prompts) and the tau this check predicts for those boundaries (teacher
    forced over the check's sample, at the check's K)."""
    import json

    from backend.regress import tau_interval

    K = (rep.get("sample") or {}).get("num_spec_tokens")
    pred = {tuple(c["boundaries"]): c for c in rep.get("candidates") or []}
    best = tuple((rep.get("best_candidate") or {}).get("boundaries") or [])
    rows = []
    for b in benches.to_dict("records"):
        try:
            fed = tuple(json.loads(b.get("aux_boundaries") or "[]"))
        except (TypeError, ValueError):
            fed = ()
        p = speeds[speeds["run_id"] == b["run_id"]].groupby("prompt_id")[["accepted", "drafts"]].sum()
        tau = lo = hi = None
        if len(p) >= 2 and p["drafts"].sum() > 0:
            tau, lo, hi = tau_interval(p.to_numpy())
        c = pred.get(fed)
        k = int(b["num_spec_tokens"])
        rows.append({"bench run": b["run_id"], "fed": _bounds(list(fed)),
                     "is": "trained on" if fed and fed == best else "not what it was trained on" if fed else DASH,
                     "measured tau [95% CI]": DASH if tau is None else f"{tau:.2f} [{lo:.2f}, {hi:.2f}]",
                     "predicted tau": DASH if not c or c.get("tau") is None else f"{c['tau']:.2f}",
                     "K (bench / check)": f"{k} / {K}" + ("" if k == K else ": not the same K, tau not comparable"),
                     "prompts": int(len(p))})
    return pd.DataFrame(rows, columns=["bench run", "fed", "is", "measured tau [95% CI]", "predicted tau",
                                       "K (bench / check)", "prompts"])
