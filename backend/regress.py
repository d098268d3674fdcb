"""Regression over engine releases: is a candidate bench run worse than a baseline bench run?

`python -m backend regress --baseline RUN --candidate RUN [--max-tau-drop 0.02]` and the Regression page.

The verdict is paired over the prompts both runs decoded (by prompt id, summed over repeats), with
`metrics.tau_difference` (95% bootstrap interval of tau(candidate) - tau(baseline)):

- `worse` when the candidate's tau is lower by more than `max_tau_drop` AND the whole interval lies below 0
  (the drop is beyond what resampling the prompts explains), or when the baseline was lossless and the
  candidate is not (greedy outputs no longer equal plain decoding);
- `ok` otherwise (a drop inside the interval, or within the allowed drop, is reported, not failed).

Both runs must be bench runs of the same target and drafter (by fingerprint) with the same K; anything else
is an error, not a verdict. Speedups and their intervals are reported next to tau (they depend on the machine,
so they do not decide)."""

from __future__ import annotations

import math

from backend import metrics
from backend.errors import SpecLensError
from backend.store.data_root import DataRoot

MAX_TAU_DROP = 0.02      # the default allowed drop in tau (`--max-tau-drop`)


def _f(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def _run(df, run_id: str) -> dict:
    hit = df[df["run_id"] == run_id]
    if hit.empty:
        raise SpecLensError(f"no bench run '{run_id}'; list them with `python -m backend runs --kind bench`")
    r = hit.iloc[0].to_dict()
    if r.get("status") != "complete":
        raise SpecLensError(f"bench run '{run_id}' is {r.get('status')}, not complete; re-run it to completion")
    return r


def compare(baseline: str, candidate: str, max_tau_drop: float = MAX_TAU_DROP, data: DataRoot | None = None) -> dict:
    """The verdict of `candidate` against `baseline` (see the module docstring) with the figures behind it and
    one line saying why."""
    if max_tau_drop < 0:
        raise SpecLensError(f"--max-tau-drop {max_tau_drop}: must be >= 0")
    cat = DataRoot.of(data).catalog
    cat.write.refresh()
    runs = cat.read.bench_history(run_ids=[baseline, candidate])
    b, c = _run(runs, baseline), _run(runs, candidate)
    for key, what in (("model_key", "target"), ("drafter_key", "drafter"), ("num_spec_tokens", "K")):
        if b.get(key) != c.get(key):
            raise SpecLensError(f"{baseline} and {candidate} differ in {what} ({b.get(key)} vs {c.get(key)}); "
                                f"regress compares runs of one drafter and target")
    if not (b.get("num_spec_tokens") or 0) > 0:
        raise SpecLensError(f"{baseline} is a plain-decoding run (no drafter); pass the speculative runs")
    frames = cat.read.bench_prompt_speeds([baseline, candidate])
    per = {r: frames[frames["run_id"] == r].groupby("prompt_id")[["accepted", "drafts"]].sum()
           for r in (baseline, candidate)}
    shared = per[baseline].index.intersection(per[candidate].index)
    if len(shared) < 2:
        raise SpecLensError(f"{baseline} and {candidate} share {len(shared)} prompt(s); a paired interval needs "
                            f"at least 2: bench both on the same prompts file")
    try:
        diff, lo, hi = metrics.tau_difference(per[candidate].loc[shared].to_numpy(),
                                              per[baseline].loc[shared].to_numpy())
    except ValueError as e:
        raise SpecLensError(f"{baseline} vs {candidate}: {e}") from None
    fig = {}
    for name, r in (("baseline", b), ("candidate", c)):
        fig[name] = {"run_id": r["run_id"], "engine": r.get("engine"), "engine_version": r.get("engine_version"),
                     "release": release_label(r),
                     "created": str(r.get("created")), "tau": _f(r.get("tau")),
                     "acceptance_rate": _f(r.get("acceptance_rate")), "speedup": _f(r.get("speedup")),
                     "speedup_ci_low": _f(r.get("speedup_ci_low")), "speedup_ci_high": _f(r.get("speedup_ci_high")),
                     "lossless": None if r.get("lossless") is None or (isinstance(r.get("lossless"), float)
                                                                      and math.isnan(r["lossless"]))
                     else bool(r["lossless"])}
    tau_worse, lossless_lost = worse(diff, hi, max_tau_drop, fig["baseline"]["lossless"],
                                     fig["candidate"]["lossless"])
    interval = f"{diff:+.3f} (95% CI {lo:+.3f} to {hi:+.3f}, paired over {len(shared)} prompts)"
    if tau_worse:
        line = (f"REGRESSION: {candidate} ({fig['candidate']['release']}) tau {fig['candidate']['tau']:.3f} vs "
                f"{baseline} ({fig['baseline']['release']}) {fig['baseline']['tau']:.3f}: {interval}, "
                f"a drop beyond the "
                f"allowed {max_tau_drop:g} and below 0 over the whole interval")
    elif lossless_lost:
        line = (f"REGRESSION: {candidate} ({fig['candidate']['release']}) is not lossless (greedy outputs differ from "
                f"plain decoding) while {baseline} was")
    else:
        why = ("within the allowed drop" if diff >= -max_tau_drop else "the interval reaches 0") if diff < 0 \
            else "no drop"
        line = (f"ok: {candidate} ({fig['candidate']['release']}) tau {fig['candidate']['tau']:.3f} vs {baseline} "
                f"({fig['baseline']['release']}) {fig['baseline']['tau']:.3f}: {interval}; {why}")
    return {"verdict": "worse" if (tau_worse or lossless_lost) else "ok", "line": line,
            "tau_difference": {"diff": diff, "ci_low": lo, "ci_high": hi, "prompts": int(len(shared))},
            "max_tau_drop": max_tau_drop, **fig}


def worse(diff: float, ci_high: float, max_tau_drop: float = MAX_TAU_DROP, lossless_before=None,
          lossless_after=None) -> tuple[bool, bool]:
    """The rule of the module docstring: (tau worse, lossless lost). diff, ci_high: tau(candidate) - tau(baseline)
    and the upper end of its paired 95% interval."""
    return (diff < -max_tau_drop and ci_high < 0), (lossless_before is True and lossless_after is False)


def release_label(r: dict) -> str:
    """'vllm 0.25.1' for an engine bench; 'hf 5.17.0, sglang 0.5.15 reading' for an HF bench that applied an
    engine's reading of the aux ids (what that release would feed)."""
    def txt(k: str) -> str | None:
        v = r.get(k)
        return None if v is None or v == "" or (isinstance(v, float) and math.isnan(v)) else str(v)
    e, v = txt("engine"), txt("engine_version")
    label = f"{e} {v}" if v else str(e)
    p, pv, rn = txt("aux_producer"), txt("aux_version"), txt("aux_runner")
    if e == "hf" and p:
        label += f", {p} {pv or ''}{(' ' + rn.upper()) if rn else ''} reading".replace("  ", " ")
    return label


def history(data: DataRoot | None = None):
    """Bench runs with a drafter, grouped for the Regression page: one group per (target, drafter, K), oldest first.
    Returns {group label: DataFrame} (no SQL here: catalog.bench_history); `with_release` adds the release labels
    of the runs a page shows."""
    df = DataRoot.of(data).catalog.read.bench_history(reading=False)
    df = df[(df["status"] == "complete") & (df["num_spec_tokens"].fillna(0) > 0)]
    out = {}
    for (model, drafter, k), g in df.groupby(["model", "drafter", "num_spec_tokens"], sort=False, dropna=False):
        out[f"{drafter} on {model} (K={int(k)})"] = g
    return out


def group_labels(data: DataRoot | None = None) -> list[str]:
    """The labels of `history`'s groups in its order (the Regression page's ?group=N), without building the groups: a
    run page needs only where its own group is."""
    keys = DataRoot.of(data).catalog.read.bench_group_keys().drop_duplicates()  # first appearance: groupby's order
    return [f"{drafter} on {model} (K={int(k)})" for model, drafter, k in keys.itertuples(index=False)]


def with_release(g, data: DataRoot | None = None):
    """The runs of `g` with their release label (engine release; for HF benches also the engine reading applied),
    ordered by release, then date."""
    if g.empty:
        return g.assign(release=[])
    full = DataRoot.of(data).catalog.read.bench_history(run_ids=g["run_id"].tolist())
    cols = ["engine", "engine_version", "aux_producer", "aux_version", "aux_runner"]
    keys = full[cols].astype("string").fillna("")
    labels = {tuple(r.values()): release_label(r) for r in keys.drop_duplicates().to_dict("records")}
    full = full.assign(release=[labels[k] for k in zip(*(keys[c] for c in cols))])
    return full.sort_values(["release", "created"], kind="stable")


def tau_interval(acc_drafts) -> tuple[float, float, float]:
    """tau of one run and its 95% bootstrap interval over prompts, rows = (accepted, drafts) per prompt: the
    paired `metrics.tau_difference` against a reference that accepts nothing (tau 1 on every prompt), plus 1."""
    import numpy as np

    a = np.asarray(acc_drafts, dtype=np.float64).reshape(-1, 2)
    ref = np.column_stack([np.zeros(len(a)), np.ones(len(a))])
    d, lo, hi = metrics.tau_difference(a, ref)
    return 1 + d, 1 + lo, 1 + hi


MAX_SHOWN = 40      # runs of one group on the Regression page: the newest, a readable chart (and 2 bootstraps each)


def newest(g, n: int = MAX_SHOWN):
    """The newest `n` runs of a history group, still in release order."""
    if len(g) <= n:
        return g
    keep = set(g.sort_values("created", kind="stable")["run_id"].iloc[-n:])
    return g[g["run_id"].isin(keep)]


def group_table(g, data: DataRoot | None = None):
    """One row per run of a history group (release order): tau [95% CI over prompts], the change in tau against
    the group's first run [95% CI paired over shared prompts], speedup [95% CI], acceptance, lossless."""
    import pandas as pd

    ids = g["run_id"].tolist()
    frames = DataRoot.of(data).catalog.read.bench_prompt_speeds(ids)
    per = {r: f.groupby("prompt_id")[["accepted", "drafts"]].sum() for r, f in frames.groupby("run_id")}
    first = ids[0] if ids else None
    rows = []
    for r in g.to_dict("records"):
        p = per.get(r["run_id"])
        tau = lo = hi = d = dlo = dhi = None
        if p is not None and len(p) >= 2 and p["drafts"].sum() > 0:
            tau, lo, hi = tau_interval(p.to_numpy())
            b = per.get(first)
            shared = p.index.intersection(b.index) if b is not None else []
            if r["run_id"] != first and len(shared) >= 2:
                d, dlo, dhi = metrics.tau_difference(p.loc[shared].to_numpy(), b.loc[shared].to_numpy())
        rows.append({"release": r["release"], "date": str(r["created"])[:16], "run_id": r["run_id"],
                     "tau": _f(r.get("tau")) if tau is None else tau, "tau_ci_low": lo, "tau_ci_high": hi,
                     "tau_change": d, "tau_change_ci_low": dlo, "tau_change_ci_high": dhi,
                     "speedup": _f(r.get("speedup")), "speedup_ci_low": _f(r.get("speedup_ci_low")),
                     "speedup_ci_high": _f(r.get("speedup_ci_high")), "acceptance_rate": _f(r.get("acceptance_rate")),
                     "lossless": r.get("lossless")})
    return pd.DataFrame(rows)
