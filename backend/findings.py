"""What a reader must know before trusting a bench run's figures, as data: the drafter check's finding that the engine
fed other boundaries than the drafter was trained on (backend/compare.py `drafter_mismatches`, the one place that
decides it; Compare shows the same), and the HF engine reproducing a serving engine release's reading. The run page,
the Runs table, `python -m backend runs` and the exports carry them; their words are dashboard/run_view.py's
(`finding_line`) and, for table cells and the command line, the `short` form here.

A wrong feed is as loud as what it costs, on the one severity scale (backend/tau_scale.py; dashboard/severity.py
words it): its `FeedCost` is the check's predicted tau of the fed set against the trained set's where the check
scored both, else the measured tau of the run against a matched reference (a complete bench of the same drafter, else
of the same weights under another config, and target, same K, fed the trained set; paired over the prompts both
decoded), else unknown: a note that says its cost is not measured (a cost the evidence cannot tell from none is at
most a note), never an error on the feed alone.

A finding follows the weights: what a check found a drafter trained on is a property of its weights, so a bench of a
copy whose config.json alone differs (other aux ids, the fix `--write-fix` writes) is matched to that check by the
weights fingerprint both manifests record (compare.same_weights; manifests written before it match by fingerprint or
path)."""

from __future__ import annotations

from dataclasses import dataclass

from backend import metrics, tau_scale
from backend.compare import Mismatch, _same, drafter_mismatches, same_weights
from backend.options import SERVING_ENGINES, engine_label
from backend.runs.manifest import StoredManifest

# the manifest keys `findings` reads (K: to match a reference bench), and the one a run needs to have any: a finding
# is about what the engine fed (`aux`). Pages over many runs pass only these
# (catalog.read.run_manifest_keys(ids, MANIFEST_KEYS, NEEDS)).
MANIFEST_KEYS = ("kind", "engine", "drafter", "model", "aux", "num_spec_tokens")
NEEDS = "aux"


@dataclass
class FeedCost:
    """What a wrong feed costs in tau. `source` "predicted": the drafter check's predicted tau of the fed set
    (`worse`) against the trained set's (`better`), `sure` when their paired z reaches the finder's SURE_Z;
    "measured": the run's tau (`worse`) against `reference`'s (`better`), a bench of the same drafter and target fed
    the trained set, over `prompts` shared prompts, lo/hi the 95% paired interval of better - worse."""

    source: str                    # "predicted" | "measured"
    better: float
    worse: float
    sure: bool
    lo: float | None = None
    hi: float | None = None
    z: float | None = None
    reference: str | None = None
    prompts: int = 0

    @property
    def rel(self) -> float:
        return tau_scale.relative_cost(self.better, self.worse)

    @property
    def level(self) -> str:
        return tau_scale.level_key(self.rel, self.sure)


@dataclass
class Finding:
    """One problem of one bench run. `kind`: "mismatch" (its figures are not what the drafter can do; `mismatch`
    holds the fed and trained boundaries, `cost` what that costs: severity its level on the one scale, a note when
    the cost is not known) or "hf_reading" (read them knowing HF reproduced `release`'s reading: severity note)."""

    severity: str                  # a level of backend/tau_scale.py: "ok" | "note" | "warning" | "error"
    kind: str                      # "mismatch" | "hf_reading"
    short: str                     # a few words for a table cell or a command-line column
    mismatch: Mismatch | None = None
    release: str | None = None     # hf_reading: the serving engine release whose reading HF reproduced
    cost: FeedCost | None = None   # mismatch: what it costs (None: not known)


def reproduced_release(manifest: StoredManifest | dict) -> str | None:
    """'SGLang 0.5.15' when a drafter bench ran on the HF engine feeding the drafter what that serving engine release
    reads from its config (`aux.producer`/`version`, backend/conventions.yaml): its acceptance is HF's decoding of
    that feed, not a measurement inside that engine. None otherwise (a bench inside vLLM or SGLang measured the
    engine itself; plain decoding feeds nothing)."""
    m = StoredManifest.indexed(manifest)
    if m.kind != "bench" or m.engine != "hf":
        return None
    aux = m.aux
    if aux is None or aux.producer not in SERVING_ENGINES:
        return None
    return " ".join(str(x) for x in (engine_label(aux.producer), aux.version) if x)


def findings(manifests: dict[str, StoredManifest | dict], checks: dict[str, StoredManifest | dict],
             read=None) -> dict[str, list[Finding]]:
    """run_id -> its findings (runs without any left out). `manifests`: catalog.run_manifests; `checks`:
    catalog.check_manifests (newest first); `read` (a catalog reader, catalog.read): where a wrong feed's cost is
    looked up (the check's stored result, a matched reference bench); without it every wrong feed's cost is unknown."""
    checks = {c: StoredManifest.indexed(m) for c, m in checks.items()}
    checked = {x for c in checks.values() if c.drafter_info is not None
               for x in (c.drafter_info.weights_fingerprint, c.drafter_info.fingerprint, c.drafter_info.path) if x}
    manifests = {r: StoredManifest.indexed(m) for r, m in manifests.items() if _may_have_finding(m, checked)}
    out: dict[str, list[Finding]] = {r: [] for r in manifests}
    costs = _Costs(read, manifests)
    for x in drafter_mismatches(manifests, checks):
        cost = costs.of(x)
        level = cost.level if cost is not None else "note"
        out[x.run].append(Finding(level, "mismatch", f"{level}: wrong feed: {','.join(x.fed)}, trained on "
                                  f"{','.join(x.trained)} ({x.check}){_cost_short(cost)}", mismatch=x, cost=cost))
    for r, m in manifests.items():
        release = reproduced_release(m)
        if release:
            out[r].append(Finding("note", "hf_reading", f"{release}'s reading on HF", release=release))
    return {r: f for r, f in out.items() if f}


def _may_have_finding(raw: StoredManifest | dict, checked: set[str]) -> bool:
    """Whether a run as the catalog holds it can have a finding, read from the raw keys before the typed manifest is
    built (a page over 10,000 runs types only these): it records what the engine fed, and it is an HF bench reading
    a serving engine's release or its drafter (weights fingerprint, fingerprint or path: compare.same_weights) is one
    a drafter check looked at (`checked`)."""
    if not isinstance(raw, dict):
        return True
    key = StoredManifest.raw_value
    if key(raw, "engine") == "hf" and key(raw, "aux.producer") in SERVING_ENGINES:
        return True
    return bool(key(raw, "aux.boundaries")) and any(
        isinstance(v, str) and v in checked
        for v in (key(raw, "drafter.weights_fingerprint"), key(raw, "drafter.fingerprint"), key(raw, "drafter.path")))


def _cost_short(cost: FeedCost | None) -> str:
    if cost is None:
        return ", cost not measured"
    rel = cost.rel
    size = f"{rel:.0%} lower" if rel >= tau_scale.NEGLIGIBLE else f"{-rel:.0%} higher" if rel < 0 else "the same"
    what = "predicted tau" if cost.source == "predicted" else f"tau against {cost.reference}"
    return f", {what} {size}" + ("" if cost.sure or rel < tau_scale.NEGLIGIBLE else ", not told apart from none")


class _Costs:
    """A wrong feed's FeedCost (module docstring), each check's stored result and the reference benches read once."""

    def __init__(self, read, manifests: dict[str, StoredManifest]):
        self.read, self.manifests = read, manifests
        self.reports: dict[str, dict | None] = {}
        self.benches: dict[str, StoredManifest] | None = None

    def of(self, x: Mismatch) -> FeedCost | None:
        if self.read is None:
            return None
        return self.predicted(x) or self.measured(x)

    def report(self, check: str) -> dict | None:
        if check not in self.reports:
            try:
                rep = self.read.drafter_check(check)
            except Exception:       # an unreadable check result: no predicted cost, not a failure
                rep = None
            self.reports[check] = rep if isinstance(rep, dict) else None
        return self.reports[check]

    def predicted(self, x: Mismatch) -> FeedCost | None:
        from backend.drafter.finder import SURE_Z

        rep = self.report(x.check)
        if not rep:
            return None
        by_set = {tuple(c.get("boundaries") or ()): c for c in rep.get("candidates") or [] if isinstance(c, dict)}
        best, fed = by_set.get(tuple(x.trained)), by_set.get(tuple(x.fed))
        if best is None or fed is None or not _num(best.get("tau")) or not _num(fed.get("tau")):
            return None
        z = fed.get("z_vs_best")
        z = float(z) if _num(z) else None
        return FeedCost("predicted", float(best["tau"]), float(fed["tau"]), sure=z is not None and z >= SURE_Z, z=z)

    def measured(self, x: Mismatch) -> FeedCost | None:
        run = self.manifests.get(x.run)
        if run is None:
            return None
        k = run.num_spec_tokens
        fits = [(r, m) for r, m in self._benches().items()
                if r != x.run and same_weights(m.drafter_info, run.drafter_info) and _same(m.model, run.model)
                and m.aux is not None and list(m.aux.boundaries or []) == x.trained and m.num_spec_tokens == k]
        # the same drafter first, else the same weights under another config (what they do fed what they learnt)
        ref = next((r for r, m in fits if _same(m.drafter_info, run.drafter_info)), fits[0][0] if fits else None)
        if ref is None:
            return None
        try:
            speeds = self.read.bench_prompt_speeds([ref, x.run])
            a, b = (speeds[speeds["run_id"] == r].groupby("prompt_id")[["accepted", "drafts"]].sum()
                    for r in (ref, x.run))
            shared = a.index.intersection(b.index)
            if len(shared) < 2:
                return None
            A, B = a.loc[shared].to_numpy(), b.loc[shared].to_numpy()
            diff, lo, hi = metrics.tau_difference(A, B)
        except Exception:           # no per-prompt figures: no measured cost
            return None
        better = 1 + float(A[:, 0].sum() / A[:, 1].sum())
        return FeedCost("measured", better, better - diff, sure=lo > 0, lo=lo, hi=hi, reference=ref,
                        prompts=int(len(shared)))

    def _benches(self) -> dict[str, StoredManifest]:
        """The complete drafter benches, newest first, with the keys a reference is matched by."""
        if self.benches is None:
            try:
                runs = self.read.bench_runs(status="complete")
                ids = runs.loc[runs["num_spec_tokens"].fillna(0) > 0, "run_id"].tolist()
                keys = self.read.run_manifest_keys(ids, MANIFEST_KEYS, NEEDS)
                self.benches = {r: StoredManifest.indexed(keys[r]) for r in ids if r in keys}
            except Exception:       # no catalog to look in: no reference
                self.benches = {}
        return self.benches


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def finding_text(found: list[Finding], kind: str | None = None) -> str:
    """A run's findings in one cell (the Runs table, `runs --json`): the short forms, the loudest first; only those
    of `kind` ("mismatch" | "hf_reading") when given."""
    order = tau_scale.KEYS
    return "; ".join(f.short for f in sorted(found, key=lambda f: (-order.index(f.severity), f.kind != "mismatch"))
                     if kind is None or f.kind == kind)
