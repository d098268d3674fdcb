"""What a better drafter is worth: a drafter's measured acceptance placed on a speedup map.

A map is a serving-load run whose drafter configurations accept draft tokens synthetically at set mean acceptance
lengths (vLLM's `rejection_sample_method="synthetic"`, SGLang's simulated acceptance): at each concurrency it holds
the speedup over the paired baseline as a function of tau, for one target shape, engine release and GPU, with
nothing else changed (the drafter's cost is real, only its acceptance is set). The tau on the map's x axis is the one
the server's counters measured (they follow the setting closely, and it is the same quantity a real drafter's bench
reports), so a drafter's measured tau can be read on it directly.

    worth(map_cells, tau_from=1.21, tau_to=2.09, concurrency=16)
    -> Worth(gain=+0.31, ...)      # "raising tau from 1.21 to 2.09 is worth +31% output tokens/s at concurrency 16"

Between measured points the speedup is interpolated linearly in tau; outside the measured range of tau, or at a
concurrency the map did not measure, there is no answer (None), never an extrapolation. Pure: data in, data out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from backend.errors import SpecLensError
from backend.options import engine_label
from backend.runs.manifest import ModelInfo, StoredManifest


@dataclass(frozen=True)
class Worth:
    concurrency: int
    tau_from: float
    tau_to: float
    speedup_from: float
    speedup_to: float
    k: int

    @property
    def gain(self) -> float:
        """Relative change of output tokens/s: speedup_to / speedup_from - 1 (the baseline is the same server)."""
        return self.speedup_to / self.speedup_from - 1.0


def curves(cells: list[dict]) -> dict[tuple[int, int], list[tuple[float, float]]]:
    """(K, concurrency) -> [(tau measured, speedup)] sorted by tau, from a load run summary's cells that carry a
    synthetic acceptance length (cells without one, or without a measured tau, are left out)."""
    out: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for c in cells:
        if c.get("synthetic_tau") is None or c.get("tau_server") is None:
            continue
        out.setdefault((int(c["k"]), int(c["concurrency"])), []).append((float(c["tau_server"]),
                                                                         float(c["speedup"]["value"])))
    return {key: sorted(v) for key, v in out.items()}


def speedup_at(points: list[tuple[float, float]], tau: float) -> float | None:
    """The speedup at `tau`, linear between the two measured points around it; None outside the measured range."""
    if len(points) < 2:
        return None
    xs, ys = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    if not xs[0] - 1e-9 <= tau <= xs[-1] + 1e-9:
        return None
    return float(np.interp(tau, xs, ys))


def worth(cells: list[dict], tau_from: float, tau_to: float, concurrency: int, k: int | None = None) -> Worth | None:
    """What raising a drafter's tau from `tau_from` to `tau_to` is worth at `concurrency` on the map (the K whose
    curve covers both taus; the given K when one is named); None when the map cannot say."""
    cs = curves(cells)
    for (kk, c), pts in sorted(cs.items()):
        if c != concurrency or (k is not None and kk != k):
            continue
        a, b = speedup_at(pts, tau_from), speedup_at(pts, tau_to)
        if a is not None and b is not None and a > 0:
            return Worth(concurrency, tau_from, tau_to, a, b, kk)
    return None


def worth_by_concurrency(cells: list[dict], tau_from: float, tau_to: float) -> list[Worth]:
    """`worth` at every concurrency the map measured (where it can say)."""
    out = []
    for c in sorted({int(x["concurrency"]) for x in cells if x.get("synthetic_tau") is not None}):
        w = worth(cells, tau_from, tau_to, c)
        if w is not None:
            out.append(w)
    return out


# ---------------------------------------------------------------------- maps: the data root's or the shipped ones

SHIPPED_MAPS = Path(__file__).resolve().parent.parent / "datasets" / "maps"


@dataclass(frozen=True)
class SpeedMap:
    run_id: str
    cells: list
    shape: str              # e.g. "llama, 32 layers x 4096"
    engine: str             # e.g. "vLLM 0.24.0"
    shipped: bool           # True: a map recorded by the project (datasets/maps), not one of this data root
    model_type: str | None = None
    left_out: tuple[int, ...] = ()    # concurrency levels whose baseline was noisy: no reading there

    @property
    def label(self) -> str:
        card = next((c.upper() for c in ("h100", "h200") if self.run_id.startswith(c + "-")), "a GPU")
        card = card if card == "a GPU" else f"an {card}"
        where = f"recorded on {card}, shipped with SpecLens" if self.shipped else "this data root's run"
        out = (f"; concurrency {', '.join(map(str, self.left_out))} left out: its baseline was noisy"
               if self.left_out else "")
        return f"map {self.run_id} ({self.shape}, {self.engine}; {where}{out})"


def _read_map(d: Path, shipped: bool) -> SpeedMap | None:
    import json

    try:
        summary = json.loads((d / "summary.json").read_text())
        noisy = {int(c) for c in summary.get("baseline_noise") or {}}
        cells = [c for c in summary["cells"] if int(c["concurrency"]) not in noisy]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not curves(cells):
        return None
    try:
        m = StoredManifest.parse(json.loads((d / "manifest.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError, SpecLensError):      # the cells alone still make a map
        m = None
    model = (m and m.model) or ModelInfo()
    shape = f"{model.model_type or '?'}, {model.n_layers or '?'} layers x {model.hidden_size or '?'}"
    engine = engine_label(m and m.engine)
    version = (m and m.engine_version) or ""
    return SpeedMap(d.name, cells, shape, f"{engine} {version}".strip(), shipped, model.model_type,
                    tuple(sorted(noisy)))


def shipped_maps() -> list[SpeedMap]:
    """The maps recorded by the project (datasets/maps): a dense Llama-3.1-8B shape and an MoE shape (gpt-oss-20b)."""
    if not SHIPPED_MAPS.is_dir():
        return []
    return [m for d in sorted(SHIPPED_MAPS.iterdir()) if d.is_dir() and (m := _read_map(d, True))]


def find_map(run_id: str | None = None, runs_dir: Path | None = None, model_type: str | None = None) -> SpeedMap | None:
    """The speedup map to read a drafter's tau on: the data root's run `run_id` when one is named, else a map shipped
    under datasets/maps, or the shipped map's own id given as `run_id`: the one of the target's `model_type` where
    there is one (a dense and an MoE target pay for drafts very differently), else the dense Llama one. None when
    there is none."""
    shipped = shipped_maps()
    if run_id:
        own = _read_map(Path(runs_dir) / run_id, False) if runs_dir else None
        return own or next((m for m in shipped if m.run_id == run_id), None)
    same = [m for m in shipped if model_type and m.model_type == model_type]
    dense = [m for m in shipped if m.model_type == "llama"]
    return (same or dense or shipped or [None])[0]
