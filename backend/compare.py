"""What the Compare page shows about two or more bench runs, as data: accepted-length histograms, per-position
acceptance, throughput under both definitions (metrics.THROUGHPUT: mean per-prompt tokens/s as Spec-Bench; total
tokens over total time as `vllm bench serve` and SGLang's scripts), TTFT and TPOT, the speedup against a baseline
under both, each with its 95% interval, per-category figures, the settings that differ, speedup tiles and a short
headline.

This module returns data and verdict objects only: numbers, run ids, verdict kinds (verdict: "faster" | "slower" |
"unclear" | "none"; a SpeedNoise where a run gets no verdict), the TauLoss, each Mismatch with its Relation, the
CategoryNoise and the Notes the page warns with; dashboard/compare_words.py builds the tiles, the headline, the
warning lines and the links from them.

Inputs are catalog aggregates only (GROUP BY in DuckDB: steps per accepted length, per-category sums) and
per-prompt timings (tokens, seconds, tokens/s, TTFT, TPOT: what a bootstrap interval resamples); never the
per-step rows. Every number comes from
backend/metrics.py (tau, per-position rates, speedup and CI, mean/std); this module only selects and pairs.

Baselines: "paired" = each run's own paired baseline (the speedup and CI the bench stored, same seed and
method; for a run benched with interleaved pairs, the baseline's figures are the plain half of those pairs);
"pinned" = the bench run pinned as the baseline of the run's target (backend/annotations.py), the
speedup computed here from the paired per-prompt tokens/s. A run without one shows no speedup.

No verdict from noise: a run whose speed figures are not comparable (its stored `speed_noise` finding, or a
baseline timed at a moment when the machine ran at another speed: `speed_noise` here, metrics.moment_ratio) keeps
its speedup figure, but its tile is "noisy" (no faster/slower words, no colour) with the reason, and the headline
gives no speed verdict for it.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from backend import coords, metrics
from backend.runs.manifest import DrafterInfo, ModelInfo, StoredManifest
from backend.runs.manifest import SpeedNoise as SpeedNoiseFound
from backend.store.data_root import DataRoot

BASELINES = ("paired", "pinned")   # each run's paired baseline; the pinned baseline of the run's target
CATEGORY_BOOT = 500          # bootstrap resamples per category (the whole-run interval uses metrics' default)
# manifest keys that describe the outcome or the bookkeeping of a run, not what ran: left out of the diff
NOT_CONFIG = {"run_id", "created", "updated", "finished", "pid", "status", "error", "progress", "headline", "bench",
              "schema_version", "tags", "notes"}
ABSENT = "(absent)"


@dataclass
class Comparison:
    run_ids: list[str]
    baseline: str                                  # "paired" or "pinned"
    figures: pd.DataFrame                          # one row per run (FIGURE_COLUMNS)
    histogram: pd.DataFrame                        # run_id, accepted, steps, share (0..K for every drafter run)
    positions: pd.DataFrame                        # run_id, position (1..K), accepted_at_pos, drafts, rate
    categories: pd.DataFrame                       # run_id, category, prompts, tau, tokens_per_s, baseline_run, ...
    config: pd.DataFrame                           # setting, then one column per run: only the differing settings
    notes: list[Note | Mismatch] = field(default_factory=list)   # what the page warns of, in order
    loss: TauLoss | None = None                        # the weakest drafter run's tau against the strongest's
    category_noise: CategoryNoise | None = None        # categories that disagree (category_noise)
    verdicts: dict[str, str] = field(default_factory=dict)   # run -> VERDICTS kind of its speedup

    @property
    def mismatches(self) -> list[Mismatch]:
        """The drafter runs fed other boundaries than their check found (drafter_mismatches), among the notes."""
        return [n for n in self.notes if isinstance(n, Mismatch)]


NOTE_KINDS = ("no_pinned", "baseline_missing", "targets", "datasets", "not_lossless", "plain")


@dataclass
class Note:
    """Something the comparison warns of (a NOTE_KINDS kind): no pinned baseline for `runs`' target; `baseline` of
    runs[0] not a complete bench run; `count` different targets (model `names`); different prompt sets (`names`);
    runs[0] not lossless (`count` prompts differ); `runs` plain decoding."""

    kind: str
    runs: list[str] = field(default_factory=list)
    baseline: str | None = None
    count: int = 0
    names: list[str] = field(default_factory=list)


VERDICTS = ("faster", "slower", "unclear", "noisy", "none")   # "none": no speedup (no baseline, plain decoding)


def verdict(mean, lo, hi) -> str:
    """A speedup's kind: "none" without one, "unclear" when its 95% CI covers 1, else "slower" or "faster"."""
    if not _ok(mean):
        return "none"
    if _ok(lo) and _ok(hi) and _num(lo) <= 1.0 <= _num(hi):
        return "unclear"
    return "slower" if _num(mean) < 1.0 else "faster"


@dataclass
class Moment:
    """A speedup against a baseline timed when the machine ran at another speed: kind "throughput" (plain decoding
    then, `then` tokens/s, against plain decoding during `run`, `during`; ratio during/then with its 95% CI) or
    "prefill" (mean TTFT in seconds of `run`, `during`, against its baseline's, `then`; ratio: how fast)."""

    kind: str
    run: str
    base: str
    during: float
    then: float
    ratio: float
    ci_low: float | None = None
    ci_high: float | None = None


@dataclass
class SpeedNoise:
    """Why a run's speedup is no faster/slower verdict: the bench's stored finding (`stored`: the reason the bench
    recorded in the manifest) and/or a Moment."""

    stored: str | None = None
    moment: Moment | None = None


@dataclass
class CategoryNoise:
    """Categories that disagree. kind "alike": in `category`, runs (a, b) accept alike (`taus`) yet ran at
    `tokens_per_s`; kind "split": runs[0] is faster on `category` (`speedup`) and slower on `slower_category`
    (`slower_speedup`), intervals excluding 1."""

    kind: str
    category: str
    runs: tuple[str, ...]
    taus: tuple[float, ...] = ()
    tokens_per_s: tuple[float, ...] = ()
    speedup: float | None = None
    slower_category: str | None = None
    slower_speedup: float | None = None


@dataclass
class TauLoss:
    """What the weakest drafter run of a comparison loses in tau against the strongest: the numbers a page levels
    (dashboard/severity.py); ci_low/ci_high: the 95% paired interval of best - worst over `prompts` shared prompts."""

    best: str
    worst: str
    best_tau: float
    worst_tau: float
    ci_low: float | None = None
    ci_high: float | None = None
    prompts: int = 0


FIGURE_COLUMNS = ["run_id", "drafter", "model", "dataset", "num_spec_tokens", "temperature", "repeats", "drafts", "tau",
                  "acceptance_rate", "tokens_per_s", "tokens_per_s_std", "baseline_run", "baseline_source",
                  "baseline_tokens_per_s", "baseline_tokens_per_s_std", "speedup", "speedup_ci_low",
                  "speedup_ci_high", "ci_method", "lossless", "mismatched_prompts",
                  # both throughput definitions (metrics.THROUGHPUT), TTFT and TPOT (seconds), 95% bootstrap intervals
                  "prompts", "tokens_per_s_ci_low", "tokens_per_s_ci_high", "throughput_total",
                  "throughput_total_ci_low", "throughput_total_ci_high", "baseline_tokens_per_s_ci_low",
                  "baseline_tokens_per_s_ci_high", "baseline_throughput_total", "baseline_throughput_total_ci_low",
                  "baseline_throughput_total_ci_high", "baseline_plain", "baseline_repeats",
                  "speedup_total", "speedup_total_ci_low", "speedup_total_ci_high",
                  "ttft", "ttft_ci_low", "ttft_ci_high", "tpot", "tpot_ci_low", "tpot_ci_high",
                  "baseline_ttft", "baseline_ttft_ci_low", "baseline_ttft_ci_high",
                  "baseline_tpot", "baseline_tpot_ci_low", "baseline_tpot_ci_high",
                  # "interleaved" (pairs timed back to back in the run) or "separate"; why the speed is no verdict
                  # (a SpeedNoise or None)
                  "baseline_timing", "speed_noise"]
SPEED_FIGURES = ("tokens_per_s", "throughput_total", "ttft", "tpot")    # per run: metrics.Estimate each


def default_runs(bench: pd.DataFrame, n: int = 3) -> list[str]:
    """Runs for the Compare page without ?runs=: the newest complete drafter runs (up to n) of the target of the
    newest one; their baselines fill up to two runs."""
    done = bench[bench["status"] == "complete"]
    spec = done[done["num_spec_tokens"].fillna(0) > 0]
    if spec.empty:
        return done["run_id"].head(2).tolist()
    same = spec[spec["model_key"] == spec.iloc[0]["model_key"]] if "model_key" in spec else spec
    ids = same["run_id"].head(n).tolist()
    for b in same["baseline_run"].head(n):
        if len(ids) >= 2:
            break
        if isinstance(b, str) and b in set(done["run_id"]) and b not in ids:
            ids.append(b)
    return ids


# ---------------------------------------------------------------------- the comparison


@dataclass
class Acceptance:
    """The acceptance half of a comparison (what the first charts need): two small queries."""

    run_ids: list[str]                                        # the complete bench runs asked for, in that order
    runs: pd.DataFrame                                        # their catalog.bench_runs rows, indexed by run_id
    stats: dict[str, metrics.AcceptanceStats | None]          # None: plain decoding or no steps
    histogram: pd.DataFrame
    positions: pd.DataFrame


def _kept(data: DataRoot, what: str, args: tuple, compute):
    """compute()'s result, computed once per catalog version a page reads and kept per process (a server's page re-runs
    on every tab switch and visit; the Speed tab's comparison is 90 ms on the 10,000-run catalog), as a copy."""
    return copy.deepcopy(data.catalog.read.kept(what, args, compute))


def load_acceptance(run_ids: list[str], data: DataRoot | None = None) -> Acceptance:
    """Accepted-length histograms (GROUP BY in DuckDB) and, from them, tau and per-position rates (metrics)."""
    data = DataRoot.of(data)
    return _kept(data, "compare.acceptance", tuple(run_ids), lambda: _load_acceptance(run_ids, data))


def _load_acceptance(run_ids: list[str], data: DataRoot) -> Acceptance:
    cat = data.catalog.read
    with cat.snapshot():
        runs = cat.bench_runs(run_ids=run_ids).set_index("run_id")
        ids = [r for r in dict.fromkeys(run_ids) if r in runs.index]
        hist = cat.bench_histogram(ids)
    acc = {r: _acceptance(hist[hist["run_id"] == r], _k(runs.loc[r])) for r in ids}
    return Acceptance(ids, runs, acc, _histogram_frame(acc), _positions_frame(acc))


def compare(run_ids: list[str], baseline: str = "paired", data: DataRoot | None = None,
            acceptance: Acceptance | None = None) -> Comparison:
    """Everything the Compare page shows for these bench runs (complete ones; unknown ids are dropped).
    `acceptance`: load_acceptance(run_ids) when the caller has it already (the page draws it first)."""
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {list(BASELINES)}, not {baseline!r}")
    data = DataRoot.of(data)

    def compute() -> Comparison:
        with data.catalog.read.snapshot():
            return _compare(acceptance or load_acceptance(run_ids, data), baseline, data)
    return _kept(data, "compare.comparison", (tuple(run_ids), baseline, acceptance and tuple(acceptance.run_ids)),
                 compute)


def _compare(ac: Acceptance, baseline: str, data: DataRoot) -> Comparison:
    runs, ids, acc = ac.runs, ac.run_ids, ac.stats
    cat = data.catalog.read
    notes: list[Note | Mismatch] = []
    bases = _baselines(ids, runs, baseline, data, notes)
    need = list(dict.fromkeys(ids + [b for b in bases.values() if b]))
    speeds = cat.bench_prompt_timings(need)
    by_run = {r: g for r, g in speeds.groupby("run_id")}
    base_info = cat.bench_runs(run_ids=[b for b in bases.values() if b]).set_index("run_id")
    stored = cat.run_manifests(ids)                  # as the catalog holds them: config_diff compares every key
    manifests = {r: StoredManifest.indexed(m) for r, m in stored.items()}
    # each run's plain-decoding timings: the pairs timed in the run itself (interleaved) against its own paired
    # baseline; else the baseline run's rows (pinned, or a run benched before interleaving / by an engine)
    own = {r: own_baseline(by_run.get(r)) for r in ids}
    base_frames = {r: (own[r] if _interleaved(r, bases[r], baseline, runs, own) else by_run.get(bases[r]))
                   if bases[r] else None for r in ids}
    est = {r: run_speed(by_run.get(r)) for r in ids}
    base_est = {r: run_speed(f) for r, f in base_frames.items() if f is not None}
    rows = []
    for r in ids:
        row, a, b, bf = runs.loc[r], acc[r], bases[r], base_frames[r]
        tps, tps_std = _mean_std_over_repeats(by_run.get(r))
        btps, btps_std = _mean_std_over_repeats(bf) if b else (math.nan, math.nan)
        sp = _speedup(r, b, baseline, row, by_run)
        tps = est[r]["tokens_per_s"].value if not math.isnan(est[r]["tokens_per_s"].value) else tps
        btps = base_est[r]["tokens_per_s"].value if r in base_est and not math.isnan(
            base_est[r]["tokens_per_s"].value) else btps
        spt = _speedup_total(by_run.get(r), bf)
        timing = (INTERLEAVED if _interleaved(r, b, baseline, runs, own) else SEPARATE) if b else None
        extra = {**_flat("", est[r]), **(_flat("baseline_", base_est[r]) if r in base_est else {}),
                 "prompts": est[r]["tokens_per_s"].n_prompts, "speedup_total": spt.mean if spt else None,
                 "speedup_total_ci_low": spt.ci_low if spt else None,
                 "speedup_total_ci_high": spt.ci_high if spt else None,
                 "baseline_plain": (_k(base_info.loc[b]) == 0) if b and b in base_info.index else None,
                 "baseline_repeats": _num(base_info["repeats"].get(b)) if b else None,
                 "baseline_timing": timing,
                 "speed_noise": speed_noise(r, b, timing, manifests.get(r), by_run.get(r), own[r],
                                            by_run.get(b) if b else None, sp,
                                            b in base_info.index and _k(base_info.loc[b]) == 0)
                 if b and _ok(sp[0]) else None}
        rows.append({**extra,
            "run_id": r, "drafter": row["drafter"], "model": row["model"], "dataset": row["dataset"],
            "num_spec_tokens": _k(row), "temperature": row["temperature"], "repeats": row["repeats"],
            "drafts": a.drafts if a else 0, "tau": a.tau if a else _num(row["tau"], 1.0),
            "acceptance_rate": a.acceptance_rate if a else None,
            "tokens_per_s": tps if not math.isnan(tps) else _num(row["tokens_per_s"]), "tokens_per_s_std": tps_std,
            "baseline_run": b, "baseline_source": (baseline if b else None),
            "baseline_tokens_per_s": btps if not math.isnan(btps) or not b else _num(base_info["tokens_per_s"].get(b)),
            "baseline_tokens_per_s_std": btps_std,
            "speedup": sp[0], "speedup_ci_low": sp[1], "speedup_ci_high": sp[2], "ci_method": sp[3],
            "lossless": row["lossless"], "mismatched_prompts": row["mismatched_prompts"]})
    figures = pd.DataFrame(rows, columns=FIGURE_COLUMNS)
    notes += drafter_mismatches(manifests, cat.check_manifests())
    notes += _notes(figures, runs)
    cats = _categories(ids, bases, by_run, base_frames, data)
    gap = lambda a, b: tau_gap(a, b, by_run)  # noqa: E731
    return Comparison(
        run_ids=ids, baseline=baseline, figures=figures, histogram=ac.histogram,
        positions=ac.positions, categories=cats, config=config_diff(stored, ids),
        notes=notes, loss=tau_loss(figures, gap), category_noise=category_noise(cats),
        verdicts=verdicts(figures))


def verdicts(fig: pd.DataFrame) -> dict[str, str]:
    """run -> the kind of its speedup (VERDICTS): "noisy" when its speed figures are not comparable."""
    out = {}
    for r in fig.to_dict("records"):
        v = verdict(r.get("speedup"), r.get("speedup_ci_low"), r.get("speedup_ci_high"))
        out[r["run_id"]] = "noisy" if v != "none" and r.get("speed_noise") is not None else v
    return out


def tau_loss(fig: pd.DataFrame, gap=None) -> TauLoss | None:
    """The weakest drafter run's tau against the strongest's with the paired interval (None with fewer than two
    drafter runs, or when they accept alike)."""
    spec = fig[(fig["num_spec_tokens"] > 0) & (fig["drafts"] > 0)]
    if len(spec) < 2:
        return None
    best, worst = spec.loc[spec["tau"].idxmax()], spec.loc[spec["tau"].idxmin()]
    if best["tau"] - worst["tau"] < 0.005:
        return None
    ci = gap(best["run_id"], worst["run_id"]) if gap else None
    return TauLoss(best["run_id"], worst["run_id"], float(best["tau"]), float(worst["tau"]),
                   *(ci if ci else (None, None, 0)))


INTERLEAVED, SEPARATE = "interleaved", "separate"     # how a run's speedup was timed (the figures' baseline_timing)
BASE_TIMINGS = ("output_tokens", "seconds", "tokens_per_s", "ttft", "tpot")


def own_baseline(frame: pd.DataFrame | None) -> pd.DataFrame | None:
    """The plain-decoding half of a drafter run's interleaved pairs (its `base_*` columns, backend/bench.py) as a
    run's per-prompt timings (the same columns as the run's own); None when the run has none (a run benched before
    interleaving, an engine bench, plain decoding)."""
    if frame is None or frame.empty or "base_tokens_per_s" not in frame or frame["base_tokens_per_s"].isna().any():
        return None
    out = frame.drop(columns=[c for c in BASE_TIMINGS if c in frame]).rename(
        columns={f"base_{c}": c for c in BASE_TIMINGS})
    return out.assign(accepted=0, drafts=0)


def _interleaved(run: str, base: str | None, mode: str, runs: pd.DataFrame, own: dict) -> bool:
    """The run's speedup comes from its interleaved pairs: its own paired baseline, and pairs stored."""
    return bool(base) and mode == "paired" and own.get(run) is not None and base == runs.loc[run, "baseline_run"]


def speed_noise(run: str, base: str, timing: str | None, manifest: StoredManifest | dict | None,
                frame: pd.DataFrame | None,
                own: pd.DataFrame | None, base_frame: pd.DataFrame | None, sp: tuple,
                base_plain: bool = True) -> SpeedNoise | None:
    """Why this run's speedup is no faster/slower verdict (a SpeedNoise), or None. The run's stored finding (the bench's
    `speed_noise`: plain decoding drifted during the run beyond the interval, load, another SpecLens process); and,
    for a speedup against a baseline timed at another moment (a pinned baseline, a run benched before interleaving,
    an engine bench), whether the machine ran at another speed then (metrics.moment_ratio / moments_differ): plain
    decoding during the run (its pairs' plain half) against plain decoding then (the baseline's rows, or the plain
    half of its pairs when the baseline drafts too), same prompts; without both, the two sides' prefill (TTFT: the
    same work on both sides)."""
    b = StoredManifest.indexed(manifest).bench
    stored = (b.speed_noise if b is not None else None) or SpeedNoiseFound()
    reason = stored.reason or None
    moment = None
    if timing == SEPARATE and frame is not None and base_frame is not None and not base_frame.empty:
        ci = (sp[0], sp[1], sp[2]) if _ok(sp[0]) and _ok(sp[1]) and _ok(sp[2]) else None
        then = base_frame if base_plain else own_baseline(base_frame)
        if own is not None and then is not None:
            x, y = _per_prompt(own, then, "tokens_per_s")
            ratio = metrics.moment_ratio(x, y)
            if metrics.moments_differ(ratio, metrics.MOMENT_FLOOR, ci):
                moment = Moment("throughput", run, base, _num(np.mean(x)), _num(np.mean(y)), ratio.value,
                                ratio.ci_low, ratio.ci_high)
        elif stored.moment_ttft_ratio is None:       # else the bench checked it already
            x, y = _per_prompt(frame, base_frame, "ttft")
            ratio = metrics.moment_ratio(1 / np.asarray(x, float), 1 / np.asarray(y, float))
            if metrics.moments_differ(ratio, metrics.PREFILL_FLOOR):
                moment = Moment("prefill", run, base, _num(np.mean(x)), _num(np.mean(y)), ratio.value)
    return SpeedNoise(reason, moment) if reason or moment else None


def _per_prompt(a: pd.DataFrame, b: pd.DataFrame, col: str) -> tuple[list[float], list[float]]:
    """A column of two runs, each prompt's mean over its repeats, for the prompts both decoded (by prompt id)."""
    ma = pd.to_numeric(a[col], errors="coerce").groupby(a["prompt_id"].astype(str)).mean()
    mb = pd.to_numeric(b[col], errors="coerce").groupby(b["prompt_id"].astype(str)).mean()
    shared = ma.index.intersection(mb.index)
    return ma.loc[shared].tolist(), mb.loc[shared].tolist()


def _grids(frame: pd.DataFrame, cols: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Columns of a run's per-prompt rows as R repeats x P prompts (repeats and prompt ids sorted; NaN where a
    repeat lacks a prompt)."""
    reps, r = np.unique(frame["repeat"].to_numpy(), return_inverse=True)
    prompts, p = np.unique(frame["prompt_id"].astype(str).to_numpy(), return_inverse=True)
    out = {}
    for c in cols:
        a = np.full((len(reps), len(prompts)), np.nan)
        a[r, p] = pd.to_numeric(frame[c], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        out[c] = a
    return out


def run_speed(frame: pd.DataFrame | None) -> dict[str, metrics.Estimate]:
    """A run's per-prompt timings -> both throughputs, TTFT and TPOT, each a metrics.Estimate with its interval.
    Total tokens / total time uses the prompts that every repeat decoded."""
    if frame is None or frame.empty:
        return {k: metrics.NAN_ESTIMATE for k in SPEED_FIGURES}
    g = _grids(frame, ("tokens_per_s", "ttft", "tpot", "output_tokens", "seconds"))
    out = {k: metrics.mean_estimate(g[k]) for k in ("tokens_per_s", "ttft", "tpot")}
    tok, sec = g["output_tokens"], g["seconds"]
    whole = np.isfinite(tok).all(0) & np.isfinite(sec).all(0)
    out["throughput_total"] = (metrics.total_throughput(tok[:, whole], sec[:, whole]) if whole.any()
                               else metrics.NAN_ESTIMATE)
    return out


def _flat(prefix: str, est: dict[str, metrics.Estimate]) -> dict[str, float]:
    out = {}
    for k, e in est.items():
        out.update({f"{prefix}{k}": e.value, f"{prefix}{k}_ci_low": e.ci_low, f"{prefix}{k}_ci_high": e.ci_high})
    return out


def _speedup_total(method: pd.DataFrame | None, base: pd.DataFrame | None) -> metrics.Speedup | None:
    """Speedup by total tokens over total time, paired as the per-prompt speedup (paired_speeds)."""
    if method is None or base is None or method.empty or base.empty:
        return None
    tok, sec = paired_speeds(method, base, "output_tokens"), paired_speeds(method, base, "seconds")
    if tok is None or sec is None:
        return None
    return metrics.speedup_total(tok[0], sec[0], tok[1], sec[1])


def _same(a: DrafterInfo | ModelInfo | None, b: DrafterInfo | ModelInfo | None) -> bool:
    """Same weights: by fingerprint when both have one (backend/model_id.py), else by path."""
    if a is None or b is None:
        return False
    if a.fingerprint and b.fingerprint:
        return a.fingerprint == b.fingerprint
    return bool(a.path) and a.path == b.path


def same_weights(a: DrafterInfo | None, b: DrafterInfo | None) -> bool:
    """Same trained weights, whatever their config says: by `weights_fingerprint` when both have one
    (backend/model_id.py; a copy of a drafter with other aux ids in config.json, or the fix `check-drafter
    --write-fix` writes, keeps it), else as `_same` (manifests written before it)."""
    if a is None or b is None:
        return False
    if a.weights_fingerprint and b.weights_fingerprint:
        return a.weights_fingerprint == b.weights_fingerprint
    return _same(a, b)


@dataclass
class Relation:
    """How the boundaries an engine fed relate to those the drafter was trained on (same length lists): kind
    "offset" (every slot off by `offset` boundaries: trained - fed, > 0 trained later), "slot_shift" (its first slot
    was trained on the embeddings S_0 and each slot got the state trained in the next one: speculators <= 0.4
    layout), "slots" (other boundaries: `slots` = (slot number from 1, fed, trained) where they differ) or
    "different" (lists of other lengths)."""

    kind: str
    offset: int = 0
    slots: list[tuple[int, str, str]] = field(default_factory=list)


def relation(fed: list[str], trained: list[str]) -> Relation:
    """The Relation of two boundary lists."""
    try:
        d = {coords.label_index(t) - coords.label_index(f) for f, t in zip(fed, trained, strict=False)}
    except Exception:
        d = set()
    if len(fed) == len(trained) and len(d) == 1:
        return Relation("offset", offset=int(d.pop()))
    if len(fed) == len(trained) > 1 and trained[0] == "S_0" and list(fed[:-1]) == list(trained[1:]):
        return Relation("slot_shift")
    if len(fed) == len(trained):
        return Relation("slots", slots=[(i + 1, f, t) for i, (f, t) in enumerate(zip(fed, trained, strict=True))
                                        if f != t])
    return Relation("different")


@dataclass
class Mismatch:
    """A drafter run fed other boundaries than its drafter check found it was trained on."""

    run: str
    check: str                   # the newest complete drafter check of the same drafter and target
    drafter: str                 # the drafter directory's name
    fed: list[str]
    trained: list[str]
    relation: Relation


def drafter_mismatches(manifests: dict[str, StoredManifest | dict], checks: dict[str, StoredManifest | dict]
                       ) -> list[Mismatch]:
    """Each drafter run whose engine fed other boundaries than the newest drafter check of the same drafter weights
    and target found it was trained on (checks: catalog.check_manifests(), newest first; manifests typed or as the
    catalog holds them). What a drafter was trained on is a property of its weights, so a bench of a drafter whose
    config alone differs from the checked one (other aux ids: the fed boundaries are the bench's own `aux`) is
    matched by `same_weights`."""
    out = []
    checks_read = {chk: StoredManifest.indexed(c) for chk, c in checks.items()}
    for run, raw in manifests.items():
        m = StoredManifest.indexed(raw)
        drafter, fed = m.drafter_info, m.aux.boundaries if m.aux is not None else None
        if drafter is None or not fed:
            continue
        for chk, c in checks_read.items():
            best = c.check.best if c.check is not None else None
            if best and same_weights(c.drafter_info, drafter) and _same(c.model, m.model):
                if list(best) != list(fed):
                    out.append(Mismatch(run, chk, Path(drafter.path or "").name or "the drafter", list(fed),
                                        list(best), relation(fed, list(best))))
                break
    return out


def _k(row) -> int:
    k = row["num_spec_tokens"]
    return 0 if k is None or (isinstance(k, float) and math.isnan(k)) else int(k)


def _num(x, default: float = math.nan) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(v) else v


def _baselines(ids: list[str], runs: pd.DataFrame, baseline: str, data: DataRoot,
               notes: list) -> dict[str, str | None]:
    """run -> the run its speedup is measured against (None: no baseline)."""
    cat = data.catalog.read
    out = {r: (runs.loc[r, "baseline_run"] if isinstance(runs.loc[r, "baseline_run"], str) else None) for r in ids}
    if baseline == "pinned":
        pinned = cat.pinned_baselines()
        by_target = dict(zip(pinned["model_key"][::-1], pinned["run_id"][::-1]))       # newest wins
        missing = []
        for r in ids:
            p = by_target.get(runs.loc[r, "model_key"])
            if p:
                out[r] = p
            else:
                missing.append(r)
        if missing:
            notes.append(Note("no_pinned", runs=missing))
    complete = set(cat.bench_runs(status="complete", run_ids=[b for b in out.values() if b])["run_id"])
    for r, b in out.items():
        if b and b not in complete:
            notes.append(Note("baseline_missing", runs=[r], baseline=b))
            out[r] = None
    return out


def _mean_std_over_repeats(speeds: pd.DataFrame | None) -> tuple[float, float]:
    """Mean per-prompt tokens/s per repeat -> (mean, std over repeats) by metrics.mean_std."""
    if speeds is None or speeds.empty:
        return math.nan, math.nan
    per_repeat = speeds.groupby("repeat")["tokens_per_s"].mean().tolist()
    return metrics.mean_std(per_repeat)


def _speed_map(speeds: pd.DataFrame, col: str = "tokens_per_s") -> dict[tuple[int, str], float]:
    """(repeat, prompt_id) -> tokens/s (plain dicts: pairing dozens of small groups in pandas is slow)."""
    return dict(zip(zip(speeds["repeat"].tolist(), speeds["prompt_id"].tolist()), speeds[col].tolist()))


def _per_prompt_mean(m: dict[tuple[int, str], float]) -> dict[tuple[int, str], float]:
    sums: dict[str, list[float]] = {}
    for (_, p), v in m.items():
        sums.setdefault(p, []).append(v)
    return {(0, p): sum(v) / len(v) for p, v in sums.items()}


def paired_speeds(method: pd.DataFrame, base: pd.DataFrame, col: str = "tokens_per_s"
                  ) -> tuple[list[list[float]], list[list[float]]] | None:
    """Per-prompt tokens/s (or another per-prompt column: output_tokens, seconds) of a run and its baseline as
    metrics.speedup wants them: R repeats x P prompts, paired by prompt. Same repeats on both sides: paired by
    (repeat, prompt); otherwise each prompt's value is first averaged over that run's repeats (R = 1). Prompts
    missing from any repeat of either side are left out. None when they share no prompt."""
    m, b = _speed_map(method, col), _speed_map(base, col)
    if {r for r, _ in m} != {r for r, _ in b}:
        m, b = _per_prompt_mean(m), _per_prompt_mean(b)
    reps = sorted({r for r, _ in m})
    prompts = sorted(p for p in {p for _, p in m} if all((r, p) in m and (r, p) in b for r in reps))
    if not prompts:
        return None
    return [[m[(r, p)] for p in prompts] for r in reps], [[b[(r, p)] for p in prompts] for r in reps]


def _speedup(run: str, base: str | None, mode: str, row, by_run: dict, n_boot: int = 2000
             ) -> tuple[float | None, float | None, float | None, str | None]:
    """(mean, ci_low, ci_high, method) of run over base."""
    if base is None:
        return None, None, None, None
    if mode == "paired" and base == row["baseline_run"] and not math.isnan(_num(row["speedup"])):
        return (float(row["speedup"]), _num(row["speedup_ci_low"], None), _num(row["speedup_ci_high"], None),
                "as benched")
    if run not in by_run or base not in by_run:
        return None, None, None, None
    pairs = paired_speeds(by_run[run], by_run[base])
    if pairs is None:
        return None, None, None, None
    s = metrics.speedup(*pairs, n_boot=n_boot)
    return s.mean, s.ci_low, s.ci_high, f"{s.ci_method} over {s.n_prompts} prompts x {s.n_repeats} repeats"


def _acceptance(hist: pd.DataFrame, k: int) -> metrics.AcceptanceStats | None:
    """Histogram rows (accepted, steps) of one run -> AcceptanceStats (None for plain decoding or no steps)."""
    if k <= 0 or hist.empty:
        return None
    counts = dict(zip(hist["accepted"].astype(int), hist["steps"].astype(int)))
    h = [counts.get(n, 0) for n in range(k + 1)]
    drafts = sum(h)
    return metrics.AcceptanceStats(drafts=drafts, draft_tokens=k * drafts, accepted=sum(n * c for n, c in enumerate(h)),
                                   per_pos=metrics.per_position_counts(h), hist=h)


def _histogram_frame(acc: dict[str, metrics.AcceptanceStats | None]) -> pd.DataFrame:
    rows = [{"run_id": r, "accepted": n, "steps": c, "share": c / a.drafts if a.drafts else 0.0}
            for r, a in acc.items() if a for n, c in enumerate(a.hist)]
    return pd.DataFrame(rows, columns=["run_id", "accepted", "steps", "share"])


def _positions_frame(acc: dict[str, metrics.AcceptanceStats | None]) -> pd.DataFrame:
    rows = [{"run_id": r, "position": i + 1, "accepted_at_pos": c, "drafts": a.drafts, "rate": rate}
            for r, a in acc.items() if a and a.per_pos_rate
            for i, (c, rate) in enumerate(zip(a.per_pos, a.per_pos_rate))]
    return pd.DataFrame(rows, columns=["run_id", "position", "accepted_at_pos", "drafts", "rate"])


CATEGORY_COLUMNS = ["run_id", "category", "prompts", "tau", "tau_ci_low", "tau_ci_high", "tokens_per_s", "baseline_run",
                    "baseline_tokens_per_s", "speedup", "speedup_ci_low", "speedup_ci_high"]


def _categories(ids: list[str], bases: dict, by_run: dict, base_frames: dict, data: DataRoot) -> pd.DataFrame:
    """Per run and Spec-Bench category: prompts, tau and tokens/s (catalog aggregates), tau's bootstrap interval
    over the category's prompts (metrics.tau_estimate), and the speedup over the run's baseline on that category's
    prompts with a bootstrap CI (metrics.speedup); the baseline's timings are `base_frames[run]` (the run's own
    interleaved pairs, else its baseline run's rows). Intervals over fewer than metrics.MIN_INTERVAL_PROMPTS prompts
    are NaN (metrics.interval_shown): the figure is shown alone."""
    cats = data.catalog.read.bench_categories(list(ids))
    split = {run: {c: g for c, g in df.groupby("category")} for run, df in by_run.items()}
    base_split = {r: {c: g for c, g in f.groupby("category")} for r, f in base_frames.items() if f is not None}
    # (accepted, drafts) per prompt summed over repeats, one GROUP BY per run, split by category
    sums = {r: df.groupby(["category", "prompt_id"])[["accepted", "drafts"]].sum()
            for r, df in by_run.items() if r in ids}
    per_prompt = {r: {c: g.to_numpy(dtype=float) for c, g in t.groupby(level=0)} for r, t in sums.items()}
    rows = []
    for r in ids:
        b = bases[r]
        for c in cats[cats["run_id"] == r].itertuples():
            sp, tci = (None, None, None), (None, None)
            m, bb = split.get(r, {}).get(c.category), base_split.get(r, {}).get(c.category)
            a = per_prompt.get(r, {}).get(c.category)
            if a is not None and np.nansum(a[:, 1]) > 0:
                t = metrics.tau_estimate(np.nan_to_num(a), n_boot=CATEGORY_BOOT)
                tci = (t.ci_low, t.ci_high)
            if m is not None and bb is not None:
                pairs = paired_speeds(m, bb)
                if pairs is not None:
                    s = metrics.speedup(*pairs, n_boot=CATEGORY_BOOT)
                    sp = (s.mean, s.ci_low, s.ci_high)
            n = int(c.prompts)         # a category of 2 prompts: its figures without an interval
            tci, sp = metrics.interval_shown(n, *tci), (sp[0], *metrics.interval_shown(n, *sp[1:]))
            rows.append({"run_id": r, "category": c.category, "prompts": int(c.prompts), "tau": c.tau,
                         "tau_ci_low": tci[0], "tau_ci_high": tci[1], "tokens_per_s": c.tokens_per_s, "baseline_run": b,
                         "baseline_tokens_per_s": float(bb["tokens_per_s"].mean()) if bb is not None else None,
                         "speedup": sp[0], "speedup_ci_low": sp[1], "speedup_ci_high": sp[2]})
    return pd.DataFrame(rows, columns=CATEGORY_COLUMNS)


def _notes(fig: pd.DataFrame, runs: pd.DataFrame) -> list[Note]:
    out = []
    targets = runs.loc[fig["run_id"], "model_key"].dropna().unique()     # weights, not paths (model_id.py)
    if len(targets) > 1:
        out.append(Note("targets", count=len(targets), names=sorted(set(fig["model"].dropna()))))
    if fig["dataset"].dropna().nunique() > 1:
        out.append(Note("datasets", names=sorted(fig["dataset"].dropna().unique())))
    for r in fig.itertuples():
        if r.lossless is not None and not pd.isna(r.lossless) and not bool(r.lossless):
            out.append(Note("not_lossless", runs=[r.run_id], count=int(_num(r.mismatched_prompts, 0))))
    plain = fig[fig["num_spec_tokens"] == 0]["run_id"].tolist()
    if plain:
        out.append(Note("plain", runs=plain))
    return out


# ---------------------------------------------------------------------- settings and findings


def _ok(v) -> bool:
    return not math.isnan(_num(v))


def tau_gap(best: str, worst: str, by_run: dict[str, pd.DataFrame]) -> tuple[float, float, int] | None:
    """95% paired bootstrap interval of tau(best) - tau(worst) over the prompts both runs decoded (by prompt id,
    summed over repeats), and how many they share; None when they share fewer than 2 prompts."""
    frames = [by_run.get(r) for r in (best, worst)]
    if any(f is None or f.empty or "accepted" not in f for f in frames):
        return None
    a, b = (f.groupby("prompt_id")[["accepted", "drafts"]].sum() for f in frames)
    shared = a.index.intersection(b.index)
    if len(shared) < 2:
        return None
    try:
        _, lo, hi = metrics.tau_difference(a.loc[shared].to_numpy(), b.loc[shared].to_numpy())
    except ValueError:
        return None
    return lo, hi, len(shared)


SAME_TAU = 0.05          # categories whose tau differ by at most this between two runs "accept alike"
NOISY_RATIO = 1.25       # ... and whose tokens/s differ by this factor or more point at timing noise
MIN_CATEGORY_PROMPTS = metrics.MIN_INTERVAL_PROMPTS   # a category's interval is read and shown from 5 prompts


def category_noise(cats: pd.DataFrame | None) -> CategoryNoise | None:
    """When the categories disagree: two runs accept alike in a category (tau within SAME_TAU) yet their tokens/s
    there differ by NOISY_RATIO or more (the largest such gap: kind "alike"), or one run's category speedups lie on
    both sides of 1 with intervals that exclude it (categories of MIN_CATEGORY_PROMPTS prompts or more: kind
    "split"); None when they agree."""
    if cats is None or cats.empty:
        return None
    best = None
    groups: dict[str, list[dict]] = {}          # per category (sorted below), rows with both figures, in order
    for r in cats.to_dict("records"):            # plain dicts: a groupby per category is 10x slower here
        if not any(pd.isna(r[k]) for k in ("category", "tau", "tokens_per_s")):
            groups.setdefault(r["category"], []).append(r)
    for cat in sorted(groups):
        rows = groups[cat]
        for i, a in enumerate(rows):
            for b in rows[i + 1:]:
                lo, hi = sorted((a["tokens_per_s"], b["tokens_per_s"]))
                if abs(a["tau"] - b["tau"]) <= SAME_TAU and lo > 0 and hi / lo >= NOISY_RATIO:
                    if best is None or hi / lo > best[0]:
                        best = (hi / lo, cat, a, b)
    if best:
        _, cat, a, b = best
        return CategoryNoise("alike", str(cat), (a["run_id"], b["run_id"]), (float(a["tau"]), float(b["tau"])),
                             (float(a["tokens_per_s"]), float(b["tokens_per_s"])))
    for run, g in cats[cats["prompts"] >= MIN_CATEGORY_PROMPTS].groupby("run_id", sort=False):
        up = g[g["speedup_ci_low"].astype(float) > 1.0]
        down = g[g["speedup_ci_high"].astype(float) < 1.0]
        if len(up) and len(down):
            u, d = up.loc[up["speedup"].idxmax()], down.loc[down["speedup"].idxmin()]
            return CategoryNoise("split", str(u["category"]), (run,), speedup=float(u["speedup"]),
                                 slower_category=str(d["category"]), slower_speedup=float(d["speedup"]))
    return None


def flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
    return out


def config_diff(manifests: dict[str, dict], run_ids: list[str]) -> pd.DataFrame:
    """The settings (manifest keys flattened: `settings.max_new_tokens`, `drafter.path`, ...) whose values differ
    between the runs, one row each, one column per run; results and bookkeeping left out (NOT_CONFIG)."""
    flat = {r: flatten({k: v for k, v in (manifests.get(r) or {}).items() if k not in NOT_CONFIG}) for r in run_ids}
    keys = sorted(set().union(*flat.values())) if flat else []
    rows = [{"setting": k, **{r: flat[r].get(k, ABSENT) for r in run_ids}} for k in keys
            if len({flat[r].get(k, ABSENT) for r in run_ids}) > 1]
    return pd.DataFrame(rows, columns=["setting", *run_ids])
