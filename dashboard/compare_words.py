"""The Compare page's words, built from backend/compare.py's data and verdict objects: the speedup tiles, the
headline, the warning lines (with their links), the drafter-mismatch lines, the two throughput definitions with each
run's figures and the TTFT/TPOT lines, and the speed-noise reasons the tiles and charts show.

backend/compare.py decides (every number, the verdict kinds "faster" | "slower" | "unclear" | "none", a run's
SpeedNoise, the TauLoss, each Mismatch and its Relation, the CategoryNoise, the Notes); this module only words them.
No Streamlit, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from backend import compare as data
from backend import metrics
from backend.compare import (
    INTERLEAVED,
    SEPARATE,
    Acceptance,
    CategoryNoise,
    Comparison,
    Mismatch,
    Note,
    Relation,
    SpeedNoise,
    TauLoss,
)
from backend.runs.manifest import StoredManifest
from backend.store.data_root import DataRoot

_backend = data                 # backend/compare.py, for compare() below, whose data-root parameter is named data
BASELINE_LABELS = {"paired": "each run's paired baseline", "pinned": "the pinned baseline of the run's target"}
VIEWS = ("Acceptance", "Speed", "Per category", "Settings that differ")   # the Compare page's tabs (?view=)
NOISY_DELTA = "no verdict: timing noise"     # a tile's delta when its speed figures are not comparable


# ---------------------------------------------------------------------- formatting

_num = data._num         # the backend's number coercion (None/NaN/text -> default), not a second copy


def _ok(v) -> bool:
    return not math.isnan(_num(v))


def _k(row) -> int:
    k = row["num_spec_tokens"]
    return 0 if k is None or (isinstance(k, float) and math.isnan(k)) else int(k)


def _x(v) -> str:
    return f"{v:.2f}x"


def _pp(a: float, b: float) -> str:
    """The difference of two speedups in percentage points ("+11 pp"), never as a speedup ("0.11x")."""
    return f"{100 * (a - b):+.0f} pp".replace("-", "\u2212")


def _ci(lo, hi, digits: int = 2) -> str:
    return f" [{_num(lo):.{digits}f}, {_num(hi):.{digits}f}]" if _ok(lo) and _ok(hi) else ""


def _names(ids) -> str:
    return ", ".join(f"`{r}`" for r in ids)


# ---------------------------------------------------------------------- the worded comparison

@dataclass
class Tile:
    """One run's speedup as a tile: `value` ("0.82x"), `delta` ("-18% · slower than without a drafter"), `tone`
    ("slower", "faster", "unclear" when the 95% CI covers 1, "none" without a speedup, "noisy" without a verdict),
    and the lines under it (interval, the other throughput definition, what the figure rests on)."""

    run_id: str
    value: str
    delta: str | None
    tone: str
    lines: list[str]


@dataclass
class View:
    """A Comparison with its words: everything of `data` (figures with each run's speed-noise reason in words, as
    the charts and tables read it), plus the tiles, the headline, the warning lines and the drafter diagnoses
    (run -> line, also among the warnings)."""

    data: Comparison
    figures: pd.DataFrame
    headline: str
    tiles: list[Tile] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    diagnoses: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str):
        if name == "data":
            raise AttributeError(name)
        return getattr(self.data, name)


def view(c: Comparison) -> View:
    """Word a Comparison (backend/compare.py)."""
    diag = {m.run: mismatch_line(m) for m in c.mismatches}
    return View(data=c, figures=worded_figures(c.figures),
                headline=headline(c.figures, loss_gap(c.loss), noise=category_noise_line(c.category_noise)),
                tiles=tiles(c.figures), warnings=[note_line(n) for n in c.notes], diagnoses=diag)


def compare(run_ids: list[str], baseline: str = "paired", data: DataRoot | None = None,
            acceptance: Acceptance | None = None) -> View:
    """backend.compare.compare(...), worded (view); `data` is the data root here (the module is _backend's)."""
    return view(_backend.compare(run_ids, baseline, data=data, acceptance=acceptance))


def loss_gap(loss: TauLoss | None):
    """The paired interval a Comparison's TauLoss carries, as headline's gap(best, worst)."""
    if loss is None or not loss.prompts:
        return None
    return lambda best, worst: ((loss.ci_low, loss.ci_high, loss.prompts)
                                if (best, worst) == (loss.best, loss.worst) else None)


def worded_figures(fig: pd.DataFrame) -> pd.DataFrame:
    """The figures with their `speed_noise` column (SpeedNoise objects) as its reason in one line (None: none)."""
    if "speed_noise" not in fig:
        return fig
    return fig.assign(speed_noise=[noise_line(v) if isinstance(v, SpeedNoise) else v for v in fig["speed_noise"]])


# ---------------------------------------------------------------------- reasons, notes, mismatches

def noise_line(n: SpeedNoise | None) -> str | None:
    """Why a run's speedup is no faster/slower verdict, in one line: the bench's stored reason, then the moment
    that differs (plain decoding then and during the run, or the two sides' prefill)."""
    if n is None:
        return None
    parts = [n.stored.rstrip(".")] if n.stored else []
    m = n.moment
    if m is not None and m.kind == "throughput":
        parts.append(f"baseline `{m.base}` was timed at another moment: plain decoding ran at {m.then:.0f} tokens/s "
                     f"then and {m.during:.0f} during `{m.run}` (x{m.ratio:.2f}, 95% CI {m.ci_low:.2f} to "
                     f"{m.ci_high:.2f})")
    elif m is not None:
        parts.append(f"`{m.run}` and its baseline `{m.base}` were timed at different moments: the target's "
                     f"prefill (TTFT, the same work on both sides) took {1000 * m.during:.0f} ms "
                     f"against {1000 * m.then:.0f} ms (x{m.ratio:.2f} as fast)")
    text = "; ".join(parts)
    return text[:1].upper() + text[1:] + "." if text else None


def note_line(n: Note | Mismatch) -> str:
    """One warning line of a Comparison's notes (a Mismatch: mismatch_line)."""
    if isinstance(n, Mismatch):
        return mismatch_line(n)
    if n.kind == "no_pinned":
        return (f"No pinned baseline for the target of {_names(n.runs)}: their paired baseline is used "
                "(pin one on the Runs page).")
    if n.kind == "baseline_missing":
        r = n.runs[0]
        return f"Baseline `{n.baseline}` of `{r}` is not a complete bench run in the catalog: no speedup for `{r}`."
    if n.kind == "targets":
        return (f"These runs use {n.count} different targets ({', '.join(n.names)}): compare their speedups, not "
                "their tokens/s.")
    if n.kind == "datasets":
        return f"These runs use different prompt sets ({', '.join(n.names)})."
    if n.kind == "not_lossless":
        return (f"`{n.runs[0]}` is not lossless: {n.count} prompts decode to other tokens than its baseline (greedy "
                "outputs must match).")
    if n.kind == "plain":
        return f"{_names(n.runs)}: plain decoding (no drafter), left out of the acceptance charts."
    raise ValueError(f"unknown comparison note kind {n.kind!r} (backend/compare.py NOTE_KINDS)")


def relation_line(rel: Relation) -> str:
    """A Relation in words: 'off by one: it was trained one boundary later' and the like."""
    if rel.kind == "offset":
        k = rel.offset
        if abs(k) == 1:
            return f"off by one: it was trained one boundary {'later' if k > 0 else 'earlier'}"
        return f"off by {abs(k)}: it was trained {abs(k)} boundaries {'later' if k > 0 else 'earlier'}"
    if rel.kind == "slot_shift":
        return ("every slot shifted: its first slot was trained on the embeddings (S_0) and each slot got the state "
                "trained in the next one, the embedding slot gone; speculators <= 0.4 files [embeddings, layer "
                "outputs] whose last state became the teacher do this")
    if rel.kind == "slots":
        return "a different set: " + ", ".join(f"slot {i} got {f} for {t}" for i, f, t in rel.slots)
    return "a different set"


def relation_words(fed: list[str], trained: list[str]) -> str:
    """backend.compare.relation(fed, trained), in words."""
    return relation_line(data.relation(fed, trained))


def mismatch_line(m: Mismatch) -> str:
    """A drafter run fed other boundaries than its drafter check found it was trained on, with the check's link."""
    return (f"`{m.run}`: the engine fed {', '.join(m.fed)}, but drafter check `{m.check}` finds "
            f"{m.drafter} was trained on {', '.join(m.trained)} ({relation_line(m.relation)}); its acceptance here is "
            f"below what it can reach. The [drafter check](/drafter?run={m.check}) gives the config line that "
            "makes the engine feed what it was trained on.")


def drafter_diagnosis(manifests: dict[str, StoredManifest | dict], checks: dict[str, StoredManifest | dict]
                      ) -> list[str]:
    """backend.compare.drafter_mismatches in plain words, one line per run (Compare's warnings); the manifests typed
    or as the catalog holds them (read through StoredManifest.indexed there)."""
    return [mismatch_line(x) for x in data.drafter_mismatches(manifests, checks)]


# ---------------------------------------------------------------------- tiles

def speed_words(mean, lo, hi, plain_baseline: bool | None = True, baseline_run: str | None = None
                ) -> tuple[str, str]:
    """(tone, words) of a speedup (tone: backend.compare.verdict): "slower than without a drafter" below 1,
    "faster ..." above 1, "no clear difference ..." when its 95% CI covers 1; against a baseline that itself drafts,
    "than its baseline `b`"."""
    than = "without a drafter" if plain_baseline or not baseline_run else f"its baseline `{baseline_run}`"
    tone = data.verdict(mean, lo, hi)
    if tone == "none":
        return "none", "no speedup: no baseline to measure it against"
    if tone == "unclear":
        return "unclear", "no clear difference" + ("" if than.startswith("without") else f" from {than}")
    return tone, f"{tone} than {than}"


def _noise(r: dict) -> str | None:
    """The figures row's speed-noise reason in words (why its speedup is no verdict), None when there is none."""
    v = r.get("speed_noise")
    if isinstance(v, SpeedNoise):
        return noise_line(v)
    return v if isinstance(v, str) and v else None


def _first_reason(reason: str) -> str:
    """The first of a noise finding's reasons, lower-cased, without its closing stop ("... and more" when there are
    more): the headline's short form; the tile carries the whole line."""
    first, *rest = reason.rstrip(".").split("; ")
    return first[:1].lower() + first[1:] + (" and more" if rest else "")


def _basis(r: dict) -> str:
    reps, n = _num(r.get("repeats"), 0), _num(r.get("prompts"), 0)
    reps = int(reps) if reps else 1
    return f"{reps} repeat{'s' if reps != 1 else ''} x {int(n)} prompts"


def tiles(fig: pd.DataFrame) -> list[Tile]:
    """One tile per run: its speedup by mean per-prompt tokens/s with the 95% CI and in words, the speedup by total
    tokens over total time, and the repeats x prompts it rests on."""
    out = []
    for r in fig.to_dict("records"):
        if not _ok(r.get("speedup")):
            plain = _k(r) == 0 if "num_spec_tokens" in r else False
            tps = r.get("tokens_per_s")
            out.append(Tile(r["run_id"], "plain decoding" if plain else "no speedup", None, "none",
                            [f"{_num(tps):.1f} tokens/s (mean per-prompt)" if _ok(tps) else "no baseline", _basis(r)]))
            continue
        tone, words = speed_words(r["speedup"], r.get("speedup_ci_low"), r.get("speedup_ci_high"),
                                  r.get("baseline_plain"), r.get("baseline_run"))
        noise = _noise(r)
        lines = [f"95% CI{_ci(r.get('speedup_ci_low'), r.get('speedup_ci_high'))} · mean per-prompt tokens/s"]
        if _ok(r.get("speedup_total")):
            lines.append(f"{_x(r['speedup_total'])}{_ci(r.get('speedup_total_ci_low'), r.get('speedup_total_ci_high'))}"
                         " by total tokens / total time")
        lines.append(f"{_basis(r)}, against `{r.get('baseline_run')}`"
                     + (" (timed back to back, interleaved per prompt)" if r.get("baseline_timing") == INTERLEAVED
                        else " (timed at another moment)" if r.get("baseline_timing") == SEPARATE else ""))
        if _ok(r.get("tau")) and _k(r) > 0:
            lines.insert(0, f"tau {r['tau']:.2f}" + (f" · {r['acceptance_rate']:.0%} of drafts accepted"
                                                     if _ok(r.get("acceptance_rate")) else ""))
        if noise:
            lines.insert(0, f"No faster/slower verdict: {noise}")
            out.append(Tile(r["run_id"], _x(r["speedup"]), NOISY_DELTA, "noisy", lines))
            continue
        out.append(Tile(r["run_id"], _x(r["speedup"]), f"{100 * (r['speedup'] - 1):+.0f}% · {words}", tone, lines))
    return out


# ---------------------------------------------------------------------- the Speed tab's lines

@dataclass
class Definition:
    key: str               # metrics.THROUGHPUT key
    name: str
    definition: str
    lines: list[str]       # one per run: its figure, its baseline's, the speedup, each with its 95% CI


def speed_definitions(fig: pd.DataFrame) -> list[Definition]:
    """Both throughput definitions (metrics.THROUGHPUT), named and defined, with every run's figure under each."""
    out = []
    for key, col, sp in (("per_prompt", "tokens_per_s", "speedup"), ("total", "throughput_total", "speedup_total")):
        name, definition = metrics.THROUGHPUT[key]
        lines = []
        for r in fig.to_dict("records"):
            ci = _ci(r.get(col + "_ci_low"), r.get(col + "_ci_high"), 1)
            line = f"`{r['run_id']}`: **{_num(r.get(col)):.1f}** tokens/s{ci}"
            if r.get("baseline_run") and _ok(r.get(f"baseline_{col}")):
                line += (f" against {_num(r.get(f'baseline_{col}')):.1f}"
                         f"{_ci(r.get(f'baseline_{col}_ci_low'), r.get(f'baseline_{col}_ci_high'), 1)}"
                         f" for `{r['baseline_run']}`")
                if _ok(r.get(sp)):
                    line += f": **{_x(r[sp])}**{_ci(r.get(sp + '_ci_low'), r.get(sp + '_ci_high'))}"
            lines.append(line)
        out.append(Definition(key, name, definition, lines))
    return out


def latency_lines(fig: pd.DataFrame) -> list[str]:
    """Per run: mean TTFT and TPOT over prompts in ms with their 95% intervals, and its baseline's."""
    def ms(r: dict, k: str) -> str:
        if not _ok(r.get(k)):
            return "not recorded"
        lo, hi = _num(r.get(f"{k}_ci_low")) * 1000, _num(r.get(f"{k}_ci_high")) * 1000
        return f"{_num(r[k]) * 1000:.2f} ms{_ci(lo, hi)}"
    out = []
    for r in fig.to_dict("records"):
        line = f"`{r['run_id']}`: TTFT {ms(r, 'ttft')}, TPOT {ms(r, 'tpot')}"
        if r.get("baseline_run") and (_ok(r.get("baseline_ttft")) or _ok(r.get("baseline_tpot"))):
            line += f" (baseline `{r['baseline_run']}`: TTFT {ms(r, 'baseline_ttft')}, TPOT {ms(r, 'baseline_tpot')})"
        out.append(line)
    return out


# ---------------------------------------------------------------------- the headline

def category_noise_line(n: CategoryNoise | None) -> str | None:
    """A CategoryNoise (backend.compare.category_noise) in one sentence."""
    if n is None:
        return None
    if n.kind == "alike":
        (a, b), (ta, tb), (sa, sb) = n.runs, n.taus, n.tokens_per_s
        return (f"Per category, speed is noisy: in {n.category}, `{a}` and `{b}` accept alike (tau "
                f"{ta:.2f} and {tb:.2f}) yet ran at {sa:.0f} and {sb:.0f} "
                "tokens/s; read per-category speeds with their intervals.")
    return (f"The categories disagree: `{n.runs[0]}` is faster on {n.category} ({_x(n.speedup)}) and slower "
            f"on {n.slower_category} ({_x(n.slower_speedup)}).")


def category_noise(cats: pd.DataFrame | None) -> str | None:
    """backend.compare.category_noise(cats), in one sentence (None when the categories agree)."""
    return category_noise_line(data.category_noise(cats))


def headline(fig: pd.DataFrame, gap=None, cats: pd.DataFrame | None = None, noise: str | None = None) -> str:
    """A few short sentences (the tiles above it carry each run's figures): whether the drafters are faster or
    slower than decoding without one, under both throughput definitions; what the weakest drafter run loses in tau
    against the strongest, e.g. "`b` loses 1.26 in tau against `a` (95% CI 1.10 to 1.41 over 80 shared prompts; 48%
    of its tau); its speedup: \u221280 pp (1.10x against 1.90x)"; the repeats and prompts the figures rest on; and
    per-category noise when categories disagree (category_noise).
    gap(best_id, worst_id) -> (ci_low, ci_high, shared prompts) or None: the paired interval of the loss.
    noise: that sentence when the caller has it (category_noise_line of the Comparison's own category_noise), else
    it is computed from cats."""
    recs = fig.to_dict("records")
    parts = []
    sped = [r for r in recs if _ok(r.get("speedup")) and _k(r) > 0]
    noisy = [r for r in sped if _noise(r)]
    sped = [r for r in sped if not _noise(r)]
    if noisy:
        parts.append(f"**No speed verdict for {_names(r['run_id'] for r in noisy)}**: "
                     + "; ".join(f"`{r['run_id']}` {_x(r['speedup'])}, {_first_reason(_noise(r))}" for r in noisy)
                     + " (its tile says all).")
    if sped:
        tones = [speed_words(r["speedup"], r.get("speedup_ci_low"), r.get("speedup_ci_high"), r.get("baseline_plain"),
                             r.get("baseline_run"))[0] for r in sped]
        plain = all(r.get("baseline_plain") is not False for r in sped)
        than = "decoding without one" if plain else "its baseline"
        one, same = len(sped) == 1, len(set(tones)) == 1
        short = {"slower": "slower", "faster": "faster", "unclear": "no clear difference"}
        figs = ", ".join(f"`{r['run_id']}` {_x(r['speedup'])}" + ("" if same else f" ({short[t]})")
                         for r, t in zip(sped, tones, strict=True))
        tot = [r for r in sped if _ok(r.get("speedup_total"))]
        if tot:
            figs += (" by mean per-prompt tokens/s; "
                     + ", ".join(f"{_x(r['speedup_total'])}" for r in tot) + " by total tokens / total time")
        other = " other" if noisy else ""
        subject = f"The{other} drafter" if one else f"Every{other} drafter"
        if same and tones[0] in ("slower", "faster"):
            lead = f"**{subject} here is {tones[0]} than {than}**"
        elif all(t in ("slower", "unclear") for t in tones):
            lead = f"**No{other} drafter here is clearly faster than {than}**"
        else:
            lead = f"Speedup over {than}"
        parts.append(f"{lead}: {figs}.")
    elif recs and not noisy:
        parts.append("No speedup: " + ", ".join(f"`{r['run_id']}`" for r in recs) + " have no baseline.")
    spec = fig[(fig["num_spec_tokens"] > 0) & (fig["drafts"] > 0)]
    if len(spec) >= 2:
        best, worst = spec.loc[spec["tau"].idxmax()], spec.loc[spec["tau"].idxmin()]
        loss = best["tau"] - worst["tau"]
        if loss < 0.005:
            parts.append("Every drafter accepts alike (tau within 0.01).")
        else:
            text = f"`{worst['run_id']}` loses {loss:.2f} in tau against `{best['run_id']}` ("
            ci = gap(best["run_id"], worst["run_id"]) if gap else None
            if ci:
                lo, hi, n = ci
                text += (f"95% CI {lo:.2f} to {hi:.2f} over {n} shared prompts"
                         + (", so not clearly lower; " if lo <= 0 else "; "))
            text += f"{100 * loss / best['tau']:.0f}% of its tau)"
            if _noise(best.to_dict()) or _noise(worst.to_dict()):
                text += "; their speedups are not compared (timing noise, above)"
            elif _ok(best.get("speedup")) and _ok(worst.get("speedup")):
                ds = _pp(worst["speedup"], best["speedup"])
                text += (f"; its speedup: {ds} ({_x(worst['speedup'])} against {_x(best['speedup'])})"
                         if worst["speedup"] <= best["speedup"] else
                         f", yet its speedup is higher: {ds} ({_x(worst['speedup'])} against {_x(best['speedup'])})")
            parts.append(text + ".")
    if recs:
        bases = {_basis(r) for r in recs}
        reps = {int(_num(r.get("repeats"), 1) or 1) for r in recs}
        rest = (f"Each figure rests on {bases.pop()}" if len(bases) == 1 else
                "The figures rest on " + ", ".join(f"`{r['run_id']}` {_basis(r)}" for r in recs))
        rest += "; 95% intervals resample prompts"
        if reps == {1}:
            timed = [r.get("baseline_timing") for r in recs if r.get("baseline_run")]
            rest += (" (one repeat: the machine's timing noise shows only in the noise check)"
                     if timed and all(t == INTERLEAVED for t in timed)
                     else " (one repeat: run-to-run timing noise is not measured)")
        parts.append(rest + ".")
    noise = noise if noise is not None else category_noise(cats)
    if noise:
        parts.append(noise)
    return " ".join(parts)
