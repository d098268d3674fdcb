"""Per-boundary statistics of captures against a reference capture: where each boundary sits in depth, the candidate
minus the reference at every boundary both hold, the relative change, and where the largest change is. The Stats
page's difference mode (`/stats?runs=...&ref=RUN&mode=diff|rel`) shows these and words the verdict from them
(dashboard/stats_words.py); no Streamlit and no words here.

Depth: S_b sits at b (the input of layer b), F one step after S_N (N = the run's number of layers), so a capture of
S_0, S_3, S_6, F is drawn at 0, 3, 6, N + 1 and the boundaries it lacks stay gaps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from backend import coords

DIFF_COLUMNS = ["run_id", "reference_run", "boundary", "depth", "reference", "value", "diff", "rel"]


def depth(label: str, n_layers: int | None) -> float:
    """x position of a boundary: S_b -> b, F -> N + 1 (N unknown: NaN for F)."""
    b = coords.label_index(label)
    if math.isinf(b):
        return float(n_layers + 1) if n_layers is not None else math.nan
    return b


def with_depth(stats: pd.DataFrame, n_layers: Mapping[str, int | None]) -> pd.DataFrame:
    """The catalog's boundary_stats rows with a `depth` column. A run whose number of layers is unknown puts F one
    step after the deepest S_b among all the given runs."""
    out = stats.copy()
    if out.empty:
        out["depth"] = pd.Series(dtype=float)
        return out
    s_idx = [coords.label_index(b) for b in out["boundary"]]
    deepest = max((b for b in s_idx if not math.isinf(b)), default=0.0)
    known = {r: (int(n) if n is not None and not _nan(n) else None) for r, n in n_layers.items()}
    out["depth"] = [depth(b, known.get(r)) if known.get(r) is not None or not math.isinf(i) else deepest + 1
                    for r, b, i in zip(out["run_id"], out["boundary"], s_idx)]
    return out


@dataclass
class StatComparison:
    stat: str
    reference: str
    frame: pd.DataFrame          # DIFF_COLUMNS: one row per (candidate, boundary both hold), in depth order
    missing: dict[str, list[str]]    # candidate -> boundaries the reference holds and the candidate lacks, and back
    candidates: list[str]        # the runs compared with the reference, in the order given
    label: str                   # how the statistic is named (the column name unless told)

    def largest(self) -> tuple[pd.Series | None, float | None]:
        """The row of the largest relative change, with its `size` (|rel|; a change from 0 is infinite, an unknown
        one -1; ties: the first in depth order), and the largest change among the other rows (None: no other row
        with a known change)."""
        if self.frame.empty:
            return None, None
        size = self.frame["rel"].abs().where(self.frame["rel"].notna(), -1.0)
        order = size.sort_values(ascending=False, kind="stable").index
        rest = size.loc[order[1:]]
        rest = rest[rest >= 0]
        top = self.frame.loc[order[0]].copy()
        top["size"] = size.loc[order[0]]
        return top, (None if rest.empty else float(rest.max()))


def compare(stats: pd.DataFrame, stat: str, reference: str, runs: list[str], n_layers: Mapping[str, int | None],
            label: str | None = None) -> StatComparison:
    """Every run of `runs` other than `reference` against it, boundary by boundary, on one statistic (a
    boundary_stats column). `label` names the statistic in the verdict (default: the column name)."""
    label = label or stat
    d = with_depth(stats, n_layers)
    ref = d[d["run_id"] == reference].set_index("boundary")
    frames, missing = [], {}
    cands = [r for r in dict.fromkeys(runs) if r != reference]
    for run in cands:
        g = d[d["run_id"] == run].set_index("boundary")
        both = [b for b in g.index if b in ref.index]
        missing[run] = sorted(set(ref.index) ^ set(g.index), key=lambda b: coords.label_index(b))
        if not both:
            continue
        v = g.loc[both, stat].astype(float)
        r = ref.loc[both, stat].astype(float)
        diff = v - r
        rel = [_rel(a, b) for a, b in zip(v, r)]
        frames.append(pd.DataFrame({"run_id": run, "reference_run": reference, "boundary": both,
                                    "depth": g.loc[both, "depth"].astype(float).to_numpy(), "reference": r.to_numpy(),
                                    "value": v.to_numpy(), "diff": diff.to_numpy(), "rel": rel}))
    frame = (pd.concat(frames, ignore_index=True).sort_values(["run_id", "depth"], kind="stable")
             .reset_index(drop=True) if frames else pd.DataFrame(columns=DIFF_COLUMNS))
    return StatComparison(stat, reference, frame[DIFF_COLUMNS], missing, cands, label)


def _rel(value: float, ref: float) -> float:
    """(value - ref) / |ref|; 0 when both are 0; +-inf when only the reference is 0; NaN when either is missing."""
    if _nan(value) or _nan(ref):
        return math.nan
    if ref == 0:
        return 0.0 if value == 0 else math.copysign(math.inf, value)
    return (value - ref) / abs(ref)


def _nan(x) -> bool:
    try:
        return math.isnan(float(x))
    except (TypeError, ValueError):
        return True
