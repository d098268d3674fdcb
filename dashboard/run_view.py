"""What the run page (`/run?id=RUN`) shows about one run, in its words: its settings (the manifest flattened), what
the engine fed the drafter, its findings (backend/findings.py, worded here), a capture's headline, the files of its
run directory, the tail of its log, the per-prompt table of a bench run (filtered and sorted as the URL says) and the
views that show the run, with their labels and query parameters.

No SQL here (the rows come from catalog queries: get_run, bench_prompt_table, bench_index, list_runs) and no
Streamlit: pages/run.py draws what these functions return. A manifest is read typed (backend/runs/manifest.py
`StoredManifest`; a catalog row's through `StoredManifest.indexed`); the settings table and the manifest.json download
take the dict it gives back (`to_json()`), every key. tau and the acceptance rate come from backend/metrics.py;
what `python -m backend runs` prints is backend/runs_text.py's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import pandas as pd

from backend import metrics
from backend.compare import NOT_CONFIG, flatten
from backend.findings import Finding, reproduced_release
from backend.options import engine_label
from backend.runs.manifest import (
    Bench,
    CheckInfo,
    Headline,
    LoadInfo,
    StoredLoadSettings,
    StoredManifest,
    StoredWatchSettings,
)
from dashboard import severity
from dashboard.compare_words import mismatch_line
from dashboard.watch_charts import stored_verdict, stored_watch

PROMPT_TEXT_MAX = 80                # characters of a prompt's text the per-prompt table shows (the rest: "…")
# the settings a reader looks for first, in this order (the rest follows alphabetically)
KEY_SETTINGS = ["engine", "engine_version", "model.path", "model.model_type", "model.n_layers", "drafter.path",
                "drafter.format", "dataset", "num_spec_tokens", "temperature", "repeats", "settings.seed",
                "settings.max_new_tokens", "dtype", "device", "baseline_run"]
# per-prompt table: ?sort= values, the column each sorts by and its direction
SORTS = {"order": ("#", True), "tau": ("tau", True), "-tau": ("tau", False), "tokens_per_s": ("tokens/s", True),
         "-tokens_per_s": ("tokens/s", False), "ttft": ("TTFT ms", True), "-ttft": ("TTFT ms", False),
         "acceptance": ("acceptance", True), "-acceptance": ("acceptance", False)}
SORT_LABELS = {"order": "prompt order", "tau": "tau, lowest first", "-tau": "tau, highest first",
               "tokens_per_s": "tokens/s, slowest first", "-tokens_per_s": "tokens/s, fastest first",
               "ttft": "TTFT, shortest first", "-ttft": "TTFT, longest first",
               "acceptance": "acceptance, lowest first", "-acceptance": "acceptance, highest first"}
PROMPT_COLUMNS = ["#", "prompt", "text", "category", "repeats", "accepted", "drafted", "acceptance", "tau", "tokens/s",
                  "TTFT ms", "TPOT ms", "output tokens", "output hash", "same as baseline"]


# ---------------------------------------------------------------------------- settings and feeds

def settings_table(manifest: dict) -> pd.DataFrame:
    """What ran, one row per setting: the manifest flattened (`settings.max_new_tokens`, `drafter.path`, ...), its
    outcome and bookkeeping left out (compare.NOT_CONFIG: the same keys the Compare page leaves out of its diff);
    the key settings (engine, versions, model, drafter, dataset, K, temperature, seed) first."""
    flat = flatten({k: v for k, v in manifest.items() if k not in NOT_CONFIG and k not in ("aux", "check")})
    first = [k for k in KEY_SETTINGS if k in flat]
    keys = first + sorted(k for k in flat if k not in first)
    return pd.DataFrame({"setting": keys, "value": [flat[k] for k in keys]}, columns=["setting", "value"])


@dataclass
class Fed:
    """What the engine fed the drafter (a bench run), would feed it (a drafter check) or what was captured."""

    summary: str                                         # one line
    rows: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["what", "value"]))
    warning: str | None = None


def _labels(v) -> str:
    return ", ".join(str(x) for x in v) if isinstance(v, (list, tuple)) else ("-" if v is None else str(v))


def fed(manifest: StoredManifest | dict) -> Fed:
    """The boundaries (S_b / F labels, backend/coords.py) the engine fed the drafter, as the manifest records them:
    a bench run's `aux` (the engine reading, the ids and where they were read, the boundaries fed, those predicted
    from the config when the running engine reported its own), a check's `check.feeds`, a capture's boundaries."""
    m = StoredManifest.indexed(manifest)
    kind = m.kind
    if kind == "bench":
        aux = m.aux
        if aux is None or not aux.to_json():
            return Fed("Plain decoding (no drafter): the engine fed nothing; this run is the baseline that drafter "
                       "runs of the same prompts and settings are measured against.")
        reading = " ".join(str(x) for x in (aux.producer, aux.version) if x)
        runner = f", runner {aux.runner}" if aux.runner else ""
        summary = (f"{reading or 'The engine'}{runner} read aux ids [{_labels(aux.ids)}] from "
                   f"{aux.ids_from or 'its default'} and fed the drafter {_labels(aux.boundaries)}.")
        hf = reading_note(m)
        if hf:
            summary += f" HF transformers reproduced {engine_fact(m)}'s reading: this run did not run inside it."
        rows = [("engine reading", f"{reading}{runner}" if reading else None),
                ("decoded by", f"{hf_name(m)}, reproducing this reading" if hf else None),
                ("why this runner", aux.runner_reason),
                ("aux layer ids", f"[{_labels(aux.ids)}]"), ("ids read from", aux.ids_from),
                ("boundaries fed", _labels(aux.boundaries)),
                ("predicted from the config", _labels(aux.predicted) if aux.predicted else None),
                ("ids the engine reported", _labels(aux.engine_ids) if aux.engine_ids else None)]
        return Fed(summary, _rows(rows), aux.warning)
    if kind == "check":
        c = m.check or CheckInfo()
        engine = " ".join(str(x) for x in (c.engine, c.engine_version) if x) or "the engine"
        runner = f" (runner {c.runner})" if c.runner else ""
        summary = (f"{engine}{runner} would feed {_labels(c.feeds)}; "
                   + (f"the drafter matches {_labels(c.best)} best." if c.best else "no drafter run (lint only)."))
        rows = [("engine", engine), ("runner", c.runner), ("boundaries fed", _labels(c.feeds)),
                ("best candidate", _labels(c.best) if c.best else None), ("mode", c.mode),
                ("severity", c.severity)]
        return Fed(summary, _rows(rows))
    if kind == "load":
        st = m.settings_as(StoredLoadSettings)
        eng = " ".join(str(x) for x in (engine_label(m.engine, ""), m.engine_version) if x) \
            or "the engine"
        ks = ", ".join(f"K={k}" for k in st.num_spec_tokens or [])
        syn = (f" at synthetic acceptance lengths tau* {', '.join(f'{t:g}' for t in st.synthetic_tau)}"
               if st.synthetic_tau else "")
        rows = [("engine", eng), ("drafter configs", ks + syn if ks else None),
                ("concurrency", ", ".join(str(c) for c in st.concurrency or []) or None),
                ("repeats", st.repeats), ("max output tokens", st.max_tokens),
                ("servers", "attached (--server-url)" if st.server_url else "started by SpecLens"),
                ("load format", st.load_format)]
        return Fed(f"A serving-load run through {eng}'s OpenAI-compatible server: the drafter ({ks or '?'}{syn}) at "
                   "each concurrency level against a baseline server of the same target (same prompts, same order, "
                   "same max tokens); acceptance from the server's counters. What the server fed the drafter is not "
                   "read here (`check-drafter` says it).", _rows(rows))
    if kind == "watch":
        w = stored_watch(m)
        st = m.settings_as(StoredWatchSettings)
        eng = " ".join(str(x) for x in (engine_label(m.engine, ""), m.engine_version) if x) or "a server"
        rows = [("server", w.metrics_url or w.server_url or st.server_url), ("engine", eng),
                ("interval", f"{st.interval:g} s" if st.interval is not None else None),
                ("--min-tau", st.min_tau), ("stopped by", w.stopped_by)]
        return Fed(f"A watch of a live {eng} server: its speculative-decoding counters (`/metrics`) scraped every "
                   "interval, tau per window against the first windows' band. SpecLens sees the counters only, not "
                   "what the server feeds the drafter.", _rows(rows))
    labels = m.boundaries or []
    return Fed(f"A capture: no drafter is fed; it recorded {len(labels)} boundaries ({_labels(labels)}).")


def reading_note(manifest: StoredManifest | dict) -> str | None:
    """A drafter bench run on the HF engine that fed the drafter what a serving engine's release reads from its
    config (backend/findings.py `reproduced_release`), in one line: HF reproduced that release's reading, so the
    acceptance is HF's decoding of those boundaries, not a measurement inside that engine. None otherwise."""
    m = StoredManifest.indexed(manifest)
    release = reproduced_release(m)
    if not release:
        return None
    aux = m.aux                                          # reproduced_release: a bench with an aux section
    runner = f" ({aux.runner} runner)" if aux.runner else ""
    ids = f"ids [{_labels(aux.ids)}]" if aux.ids else "its default ids"
    return (f"Run on {hf_name(m)}, reproducing {release}{runner}'s reading: the drafter was fed "
            f"{_labels(aux.boundaries)}, what {release} feeds it from {ids}; tau and speed are HF's decoding of "
            f"that feed, not measured inside {release}.")


def hf_name(manifest: StoredManifest | dict) -> str:
    """'HF transformers 5.17.0' (the HF engine's version is recorded as 'transformers 5.17.0' or '5.17.0')."""
    v = str(StoredManifest.indexed(manifest).engine_version or "").removeprefix("transformers").strip()
    return f"HF transformers {v}".strip()


def engine_fact(manifest: StoredManifest | dict) -> str | None:
    """The run header's engine words: 'SGLang 0.5.15' for a drafter bench on HF reproducing that reading."""
    return reproduced_release(manifest)


def finding_level(f: Finding) -> severity.Level:
    """The level a finding is drawn at (dashboard/severity.py): a wrong feed's is what it costs (backend/findings.py
    grades it on the same scale; a note when its cost is not known), HF reproducing a reading is a note."""
    return severity.LEVELS.get(f.severity, severity.LEVELS["note"])


def finding_cost(f: Finding) -> severity.Cost | None:
    """A wrong feed's cost on the severity scale: the check's predicted tau of the fed set against the trained set's,
    or the run's measured tau against a reference bench fed the trained set (with its paired interval); None when
    not known."""
    c = f.cost
    if c is None:
        return None
    if c.source == "predicted":
        return severity.tau_cost(c.better, c.worse, sure=c.sure, what="predicted tau")
    return severity.tau_cost(c.better, c.worse, c.lo, c.hi, sure=c.sure, what="measured tau")


def finding_line(f: Finding, manifest: StoredManifest | dict) -> str:
    """A finding as the run page writes it (markdown, one line, with the link that proves it): a wrong feed led by its
    level and what it costs (severity.headline), then the drafter check's words (dashboard/compare_words.py, as
    Compare says it); HF reproducing a release's reading."""
    if f.kind == "mismatch" and f.mismatch is not None:
        said = mismatch_line(f.mismatch)
        cost = finding_cost(f)
        if cost is None:
            level = finding_level(f)
            return (f"**{level.name}** (cost not measured: the check predicts no tau for the fed set and no bench of "
                    f"this drafter fed the trained set): Fed the wrong boundaries. {said}")
        c = f.cost
        why = ("the check's prediction for the fed set against the trained set" if c.source == "predicted" else
               f"against `{c.reference}`, the same drafter fed the trained set, over {c.prompts} shared prompts")
        return severity.headline(cost, f"Fed the wrong boundaries, {cost.words} ({why}). {said}")
    return reading_note(manifest) or f.short


def plain(line: str) -> str:
    """A markdown line as plain text (for exported files): links as 'text (url)', no emphasis or code marks."""
    return re.sub(r"\[([^\]]+)\]\(([^)]+)\)", r"\1 (\2)", line).replace("**", "").replace("`", "")


def _rows(pairs) -> pd.DataFrame:
    return pd.DataFrame([(k, str(v)) for k, v in pairs if v not in (None, "", [], "-", "[-]")],
                        columns=["what", "value"])


def capture_headline(manifest: StoredManifest | dict) -> list[tuple[str, str]]:
    """A capture's headline figures: boundaries, tokens, prompts, raw-sample tokens, NaN/inf tokens, seconds."""
    m = StoredManifest.indexed(manifest)
    head = m.headline or Headline()
    worst = max(head.nonfinite.values(), default=0) if head.nonfinite else 0
    out = [("boundaries", str(len(m.boundaries or []))), ("tokens", _count(head.tokens)),
           ("prompts", _count(head.prompts)), ("sample tokens", _count(head.sample_tokens)),
           ("NaN/inf tokens", _count(worst))]
    if isinstance(head.seconds, (int, float)):
        out.append(("seconds", f"{head.seconds:.3g}"))
    return out


def _count(v) -> str:
    return f"{int(v):,}" if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def short_text(text: str | None, n: int = PROMPT_TEXT_MAX) -> str:
    """A prompt's text on one line, at most n characters, then an ellipsis."""
    one = " ".join(str(text or "").split())
    return one if len(one) <= n else one[:n - 1].rstrip() + "\u2026"


def prompt_table(agg: pd.DataFrame, k: int, greedy: bool, texts: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per prompt (its repeats pooled) from catalog.bench_prompt_table: accepted and drafted draft tokens,
    the acceptance rate and tau (backend/metrics.py: tau = 1 + accepted / verify steps), mean tokens/s, TTFT and
    TPOT (ms), output tokens, the output hash ("(n differ)" when repeats disagree) and, for a greedy run with a
    baseline, whether every repeat's output equals the baseline's; `texts` (prompt_texts): each prompt's text, cut to
    PROMPT_TEXT_MAX characters."""
    stats = [metrics.AcceptanceStats(drafts=int(d), draft_tokens=int(d) * k, accepted=int(a))
             for a, d in zip(agg["accepted"].fillna(0).tolist(), agg["drafts"].fillna(0).tolist())]
    hashes = [h if n <= 1 else f"{h} ({n} differ)" for h, n in zip(agg["output_hash"].fillna("").tolist(),
                                                                      agg["hashes"].fillna(0).astype(int).tolist())]
    same = agg["same_as_baseline"] if greedy else pd.Series([None] * len(agg), index=agg.index, dtype=object)
    return pd.DataFrame({
        "#": agg["prompt_index"].astype("Int64"), "prompt": agg["prompt_id"].astype(str),
        "text": [short_text((texts or {}).get(str(p), "")) for p in agg["prompt_id"].tolist()],
        "category": agg["category"].fillna(""), "repeats": agg["repeats"].astype("Int64"),
        "accepted": agg["accepted"].astype("Int64"), "drafted": [s.draft_tokens for s in stats],
        "acceptance": [s.acceptance_rate for s in stats], "tau": [s.tau for s in stats],
        "tokens/s": agg["tokens_per_s"], "TTFT ms": agg["ttft"] * 1000.0, "TPOT ms": agg["tpot"] * 1000.0,
        "output tokens": agg["output_tokens"], "output hash": hashes, "same as baseline": same,
    }, columns=PROMPT_COLUMNS).reset_index(drop=True)


PROMPT_SPEED_COLUMNS = ["#", "prompt", "category", "text", "tokens/s", "plain tokens/s", "speedup"]


def prompt_speeds(timings: pd.DataFrame, base: pd.DataFrame | None = None,
                  texts: dict[str, str] | None = None) -> pd.DataFrame:
    """Per prompt of a bench run (catalog.bench_prompt_timings of the run; repeats averaged): its tokens/s, plain
    decoding's on the same prompt (the interleaved pair's own half, `base_tokens_per_s`, else `base`: the baseline
    run's timings) and their ratio; what the run page's per-prompt speed chart draws and exports."""
    if timings is None or timings.empty:
        return pd.DataFrame(columns=PROMPT_SPEED_COLUMNS)
    g = timings.groupby(["prompt_index", "prompt_id", "category"], dropna=False, sort=True)
    out = g["tokens_per_s"].mean().rename("tokens/s").reset_index()
    plain = pd.to_numeric(g["base_tokens_per_s"].mean(), errors="coerce").reset_index(drop=True) \
        if "base_tokens_per_s" in timings else pd.Series([float("nan")] * len(out))
    if plain.isna().all() and base is not None and not base.empty:
        by_id = base.groupby("prompt_id")["tokens_per_s"].mean()
        plain = out["prompt_id"].astype(str).map({str(k): v for k, v in by_id.items()}).astype(float)
    out["plain tokens/s"] = plain.to_numpy()
    out["speedup"] = out["tokens/s"] / out["plain tokens/s"]
    out = out.rename(columns={"prompt_index": "#", "prompt_id": "prompt"})
    out["prompt"] = out["prompt"].astype(str)
    out["category"] = out["category"].fillna("")
    out["text"] = [short_text((texts or {}).get(p, "")) for p in out["prompt"]]
    return out.reindex(columns=PROMPT_SPEED_COLUMNS)


def prompt_columns(table: pd.DataFrame, k: int, greedy_with_baseline: bool) -> list[str]:
    """The per-prompt columns worth showing: no acceptance figures for plain decoding, no baseline check without a
    greedy baseline, no text column when no prompt's text was found."""
    drop = set() if k > 0 else {"accepted", "drafted", "acceptance", "tau"}
    if not (table["text"] != "").any():
        drop.add("text")
    if not greedy_with_baseline:
        drop.add("same as baseline")
    return [c for c in table.columns if c not in drop]


def filter_prompts(table: pd.DataFrame, categories: list[str], text: str, sort: str) -> pd.DataFrame:
    """The rows of these categories (all when none) holding `text` (case-insensitive) in the prompt id, its text (as
    shown), category or output hash, sorted by `sort` (SORTS; missing values last)."""
    out = table
    if categories:
        out = out[out["category"].isin(categories)]
    needle = (text or "").strip().lower()
    if needle:
        hay = (out["prompt"].str.lower() + "\n" + out["text"].str.lower() + "\n" + out["category"].str.lower() + "\n"
               + out["output hash"].str.lower())
        out = out[hay.str.contains(needle, regex=False)]
    col, ascending = SORTS.get(sort, SORTS["order"])
    return out.sort_values([col, "#"], ascending=[ascending, True], na_position="last", kind="stable")


# ---------------------------------------------------------------------------- views that show the run

@dataclass
class Link:
    view: str                      # compare | stats | alignment | drafter | feeds | regression | runs | run | load
                                   # | watch
    label: str
    params: dict[str, str]


def links(run: dict, bench: pd.DataFrame | None = None, captures: pd.DataFrame | None = None,
          checks: pd.DataFrame | None = None, groups: list[str] | None = None) -> list[Link]:
    """The views that show this run, each with the query parameters that open it on this run. `run`: a
    catalog.get_run row (its manifest parsed); `bench`: catalog.bench_index (bench runs and their baselines);
    `captures`: complete captures (catalog.list_runs) for an alignment partner of the same target; `checks`:
    complete drafter checks (drafter and target names); `groups`: the Regression page's group labels
    (regress.group_labels, `regress.history`'s order). Views need a complete run; the Runs page always lists it."""
    rid, kind, m = run["run_id"], run.get("kind"), StoredManifest.indexed(run.get("manifest"))
    out = [Link("runs", "Runs (this run's row ticked)", {"ticked": rid})]
    if kind == "watch":                 # the Watch page shows a running, failed or interrupted watch too
        out.append(Link("watch", "Watch: tau per window and the drift verdict", {"run": rid}))
    if run.get("status") != "complete":
        return out
    if kind == "load":
        out.append(Link("load", "Serving load: speedup vs concurrency, best K, where it stops paying", {"run": rid}))
    if kind == "capture":
        out.append(Link("stats", "Hidden-state stats", {"runs": rid, "run": rid}))
        other = _partner(rid, run.get("model_key"), captures)
        if other:
            out.append(Link("alignment", f"Layer alignment with `{other}` (same target)", {"a": other, "b": rid}))
    elif kind == "check":
        out += [Link("drafter", "Drafter check", {"run": rid}), Link("feeds", "Feeds across releases", {"check": rid})]
    elif kind == "bench":
        out += _bench_links(run, m, bench, checks, groups)
    return out


def _partner(rid: str, model_key, captures: pd.DataFrame | None) -> str | None:
    """The newest other complete capture of the same target (else none)."""
    if captures is None or captures.empty or not isinstance(model_key, str):
        return None
    same = captures[(captures["model_key"] == model_key) & (captures["run_id"] != rid)]
    return str(same["run_id"].iloc[0]) if len(same) else None


def _bench_links(run: dict, m: StoredManifest, bench: pd.DataFrame | None, checks: pd.DataFrame | None,
                 groups: list[str] | None) -> list[Link]:
    rid, out = run["run_id"], []
    base = run.get("baseline_run")
    done = bench[bench["status"] == "complete"] if bench is not None and not bench.empty else None
    if isinstance(base, str) and base:
        out.append(Link("compare", f"Compare with its paired baseline `{base}`", {"runs": f"{rid},{base}"}))
    elif done is not None:
        users = done[done["baseline_run"] == rid]["run_id"].tolist()
        if users:
            shown = users[:5]
            out.append(Link("compare", f"Compare with the {len(shown)} drafter run(s) measured against it",
                            {"runs": ",".join(shown + [rid])}))
    drafter, model = m.drafter_info, m.model
    if drafter is not None and drafter.path and model is not None and model.path:
        out.append(Link("feeds", "Feeds across releases (this drafter on this target)",
                        {"drafter": str(drafter.path), "target": str(model.path)}))
    if checks is not None and not checks.empty and run.get("drafter"):
        mine = checks[(checks["drafter"] == run.get("drafter")) & (checks["model"] == run.get("model"))]
        if len(mine):
            out.append(Link("drafter", f"Drafter check `{mine['run_id'].iloc[0]}` (same drafter and target)",
                            {"run": str(mine["run_id"].iloc[0])}))
    k = m.num_spec_tokens
    if groups and run.get("drafter") and isinstance(k, int) and k > 0:
        label = f"{run.get('drafter')} on {run.get('model')} (K={k})"
        if label in groups:
            out.append(Link("regression", "Regression over engine releases", {"group": str(groups.index(label))}))
    return out


def bench_figures(manifest: StoredManifest | dict) -> list[tuple[str, str]]:
    """A bench run's stored headline (the manifest's `bench`, backend/metrics.py definitions) as (label, value)."""
    m = StoredManifest.indexed(manifest)
    b = m.bench or Bench()
    sp = b.speedup

    def num(v, f: str) -> str:
        return format(v, f) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else "-"
    out = [("tau", num(b.tau, ".2f")), ("acceptance", num(b.acceptance_rate, ".1%")),
           ("tokens/s (mean per prompt)", num(b.tokens_per_s, ",.1f")),
           ("tokens/s (total tokens / total time)", num(b.throughput, ",.1f")),
           ("TTFT ms", num(b.ttft * 1000 if isinstance(b.ttft, (int, float)) else None, ".1f")),
           ("TPOT ms", num(b.tpot * 1000 if isinstance(b.tpot, (int, float)) else None, ".2f"))]
    if sp is not None and sp.to_json():
        ci = f" (95% CI {num(sp.ci_low, '.2f')} to {num(sp.ci_high, '.2f')})" if sp.ci_low is not None else ""
        out.append((f"speedup over the paired baseline{ci}" + (", no verdict: timing noise" if speed_notice(m) else ""),
                    f"{num(sp.mean, '.2f')}x"))
    if b.lossless is not None:
        out.append(("outputs equal the baseline's", "yes" if b.lossless else
                    f"no ({b.mismatched_prompts} prompts differ)"))
    return [(label, value) for label, value in out if value not in ("-", "-x")]


def load_figures(manifest: StoredManifest | dict) -> list[tuple[str, str]]:
    """A load run's counts as (label, value): configs, concurrency levels, levels measured, requests, output tokens.
    Its verdicts (best K, where it stops paying, the noise and agreement notes) are the Serving load page's."""
    m = StoredManifest.indexed(manifest)
    st = m.settings_as(StoredLoadSettings)
    load = m.load or LoadInfo()
    n_cfg = len(st.num_spec_tokens or []) * max(1, len(st.synthetic_tau or []))
    out = [("drafter configs", str(n_cfg) if n_cfg else "-"),
           ("concurrency", ", ".join(str(c) for c in st.concurrency or []) or "-"),
           ("levels measured", _count(load.levels)), ("requests", _count(load.requests)),
           ("output tokens", _count(load.tokens))]
    return [(label, value) for label, value in out if value != "-"]


def watch_figures(manifest: StoredManifest | dict) -> list[tuple[str, str]]:
    """A watch run's headline as (label, value): windows, the span, tau over all windows and its drafts, the verdict's
    state."""
    m = StoredManifest.indexed(manifest)
    v = stored_verdict(m)
    head = m.headline or Headline()
    secs = head.seconds
    span = (f"{secs / 60:.1f} min" if secs >= 120 else f"{secs:.0f} s") if isinstance(secs, (int, float)) else "-"
    tau = v.get("tau")
    out = [("windows", _count(v.get("windows", head.windows))), ("span", span),
           ("tau", f"{tau:.3f}" if isinstance(tau, (int, float)) else "-"), ("drafts", _count(v.get("drafts"))),
           ("verdict", str(v["state"]).replace("_", " ") if v.get("state") else "-")]
    return [(label, value) for label, value in out if value != "-"]


def speed_notice(manifest: StoredManifest | dict) -> str | None:
    """Why a bench run's speed figures are no faster/slower verdict (its stored `bench.speed_noise` finding,
    backend/bench.py from backend/metrics.py), in one line; None when they are one (or were not checked)."""
    b = StoredManifest.indexed(manifest).bench
    n = b.speed_noise if b is not None else None
    return n.reason if n is not None and n.reason else None


def timing_lines(manifest: StoredManifest | dict) -> list[str]:
    """How a bench run was timed, in words: against what (plain decoding interleaved per prompt in this run, or a
    baseline run timed at another moment) and the machine's load while it ran (its stored `bench.load`)."""
    m = StoredManifest.indexed(manifest)
    b = m.bench or Bench()
    out = []
    pairing, base = b.pairing, m.baseline_run
    if pairing == "interleaved":
        out.append(f"Timed against plain decoding run back to back with each unit in this run (which of the two went "
                   f"first alternating); `{base}` holds plain decoding's outputs.")
    elif pairing == "separate" or (base and m.num_spec_tokens):
        out.append(f"Timed against the baseline run `{base}`, which ran at another moment.")
    load = b.load if isinstance(b.load, dict) else {}
    if load:
        def rng(k: str) -> str:
            q = load.get(k) if isinstance(load.get(k), dict) else {}
            return (f"{q.get('min', 0):.1f} to {q.get('max', 0):.1f} (median {q.get('median', 0):.1f})"
                    if q else "not recorded")
        procs = load.get("speclens_processes") or []
        out.append(f"Load while it ran ({load.get('units')} units, {load.get('cpus')} CPU cores): 1-minute load "
                   f"average {rng('load1')}; other processes used {rng('other_cpu')} cores, "
                   f"{load.get('contended_units')} unit(s) contended; other SpecLens processes: "
                   + (f"{load.get('speclens_units')} unit(s) shared with {', '.join(f'`{p}`' for p in procs[:2])}"
                      if procs else "none seen") + ".")
    return out


def manifest_text(manifest: dict) -> str:
    """The manifest.json download: every key as read (a StoredManifest's `to_json()`)."""
    return json.dumps(manifest, indent=1, sort_keys=True, default=str)
