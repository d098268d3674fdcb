"""Training data against serving: do the drafter's training files hold what the engine will feed it?

The files are read with the importers' readers (backend/importers.py: speculators/vllm-extract *.safetensors, fp8
ones dequantised, speculators-legacy data_*.pt, specforge data_*.ckpt[.gz]), their states labelled by the producer's
convention; the same token ids go once through the target (HF engine, every boundary hooked), and the two are
aligned token for token with backend/align.py (cosine, relative L2, CKA, best match, verdict). Each stored aux state
is then named by the fresh boundary it really is, and compared with what the engine feeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from backend.align import Alignment, Sample, align_samples
from backend.drafter.lint import Finding
from backend.errors import SpecLensError

if TYPE_CHECKING:
    from backend.hf_model import LoadedModel

MAX_FILES = 4
MAX_TOKENS = 4096


@dataclass
class DataComparison:
    path: str
    format: str
    files: int                      # files read (of files_total)
    files_total: int
    tokens: int
    labels: list[str]               # what the producer's convention says each stored state is (teacher last)
    ids: list[int]
    ids_from: str
    holds: list[str]                # what each stored state really is (best match in the fresh capture)
    aux_holds: list[str]            # the same, aux states only (the teacher left out)
    alignment: Alignment

    def to_json(self) -> dict:
        return {"path": self.path, "format": self.format, "files": self.files, "files_total": self.files_total,
                "tokens": self.tokens, "labels": self.labels, "ids": self.ids, "ids_from": self.ids_from,
                "holds": self.holds, "aux_holds": self.aux_holds, "alignment": self.alignment.to_json()}


def compare(lm: LoadedModel, path: str | Path, fmt: str | None, drafter_dir: str | Path, target_dir: str | Path,
            producer_ids: list[int] | None = None, max_files: int = MAX_FILES,
            max_tokens: int = MAX_TOKENS) -> DataComparison:
    import torch

    from backend import coords
    from backend.hf_model import BoundaryHooks, default_boundaries
    from backend.importers import plan_import

    plan = plan_import(path, fmt, producer_ids, None, Path(drafter_dir) / "config.json", target_dir)
    bounds = default_boundaries(lm)
    fresh_labels = coords.labels(bounds)
    fresh: dict[str, list[torch.Tensor]] = {lbl: [] for lbl in fresh_labels}
    stored: dict[str, list[torch.Tensor]] = {lbl: [] for lbl in plan.labels}
    got: dict[int, torch.Tensor] = {}
    used, tokens, stored_dtype = 0, 0, "fp32"
    with BoundaryHooks(lm, bounds, lambda k, x: got.__setitem__(k, x)), torch.inference_mode():
        for f in plan.files[:max_files]:
            rec = plan.fmt.read(f)
            if len(rec.states) != len(plan.labels):
                raise SpecLensError(f"{f}: holds {len(rec.states)} hidden states per token but the ids {plan.ids} "
                                    f"({plan.ids_from}) give {len(plan.labels)}; pass --producer-ids")
            if rec.states[0].shape[-1] != lm.hidden_size:
                raise SpecLensError(f"{f}: hidden size {rec.states[0].shape[-1]} but the target has {lm.hidden_size}; "
                                    f"pass this drafter's training data (or its target with --target)")
            stored_dtype = rec.stored or stored_dtype        # e.g. fp8_e4m3fn: dequantised, but not 16-bit
            t = min(len(rec.token_ids), max_tokens - tokens)
            if t <= 0:
                break
            got.clear()
            lm.base(input_ids=rec.token_ids[:t][None].to(lm.device), use_cache=False)
            for k, lbl in enumerate(fresh_labels):
                fresh[lbl].append(got[k].float().cpu())
            for lbl, x in zip(plan.labels, rec.states):
                stored[lbl].append(x[:t].float().cpu())
            used, tokens = used + 1, tokens + t
    ctx = np.arange(tokens, dtype=np.int64)          # the same token ids in the same order on both sides
    A = Sample("fresh capture", fresh_labels, {k: torch.cat(v) for k, v in fresh.items()}, ctx, lm.n_layers,
               lm.hidden_size, "fp32")
    B = Sample("training data", coords.sort_labels(plan.labels), {k: torch.cat(v) for k, v in stored.items()}, ctx,
               lm.n_layers, int(stored[plan.labels[0]][0].shape[-1]), stored_dtype)
    al = align_samples(A, B, device="cpu")
    best = {p["boundary"]: p["best_match"] for p in al.per_boundary}
    holds = [best[lbl] for lbl in plan.labels]
    # the last stored state is the teacher (S_N, F, or vllm-extract's last id)
    n_aux = len(plan.labels) - 1
    return DataComparison(str(path), plan.fmt.name, used, len(plan.files), tokens, list(plan.labels), list(plan.ids),
                          plan.ids_from, holds, holds[:n_aux], al)


def findings(dc: DataComparison, feeds: list[str] | None, engine: str, best: list[str] | None) -> list[Finding]:
    """What the comparison says, as findings (backend/text/check_text.py words them): labels right or not, and
    training vs serving."""
    from dataclasses import asdict

    out = []
    kinds = [f.kind for f in dc.alignment.verdict]
    aux_labels = dc.labels[:len(dc.aux_holds)]
    if dc.holds == dc.labels:
        out.append(Finding("ok", "td_labels_right", {"format": dc.format, "labels": list(dc.labels), "ids": dc.ids,
                                                     "ids_from": dc.ids_from, "tokens": dc.tokens}, "training_data"))
    else:
        wrong = [[lbl, h] for lbl, h in zip(dc.labels, dc.holds) if lbl != h]
        out.append(Finding("error", "td_mislabelled", {"format": dc.format, "wrong": wrong, "kinds": kinds,
                                                       "alignment": asdict(dc.alignment.verdict[0])}, "training_data"))
    if "rotation" in kinds:
        out.append(Finding("error", "td_rotated", {}, "training_data"))
        return out
    if feeds is not None:
        g = {"holds": list(dc.aux_holds), "engine": engine, "feeds": list(feeds)}
        if dc.aux_holds == list(feeds):
            out.append(Finding("ok", "td_agree", g, "training_data"))
        else:
            out.append(Finding("error", "td_disagree", {**g, "labels": list(aux_labels)}, "training_data"))
    if best is not None and dc.aux_holds != list(best):
        out.append(Finding("warning", "td_not_best", {"best": list(best), "holds": list(dc.aux_holds)},
                           "training_data"))
    return out
