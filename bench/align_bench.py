"""Alignment speed: 33 x 33 boundaries over 4096 tokens at hidden size 4096 (Llama-3.1-8B shaped).

Random data with a residual-stream structure (S_{b+1} = S_b + update), stored as two real capture runs
(bf16 samples, as an 8B capture keeps them), then timed end to end: load both samples, cosine and
relative-L2 matrices over all 4096 tokens, CKA, path and verdict. Peak memory is the process's max RSS
(CPU) and torch's peak allocation (GPU). The output states the CKA definition: exact on all tokens on a GPU,
the row estimator with its standard error within backend.align.CKA_BUDGET on CPU. `--check-estimator`
also computes both on the same device and reports the estimator's largest error against the exact CKA
on all tokens, in absolute terms and in standard errors (the stated bound is CKA_SE_BOUND).

    python bench/align_bench.py [--device cpu|cuda] [--tokens 4096] [--hidden 4096] [--layers 32]
                                [--check-estimator] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.align import align_runs, load_sample  # noqa: E402  (align_samples/_on imported in main)
from backend.stats import context_hashes  # noqa: E402
from backend.store.data_root import DataRoot  # noqa: E402
from backend.store.rundir import atomic_save_safetensors  # noqa: E402


def fake_run(data: DataRoot, run_id: str, n_layers: int, tokens: int, hidden: int, seed: int, shift: float) -> None:
    g = torch.Generator().manual_seed(seed)
    labels = [f"S_{b}" for b in range(n_layers + 1)]
    t = {}
    base_g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=base_g)
    for lbl in labels:
        t[lbl] = (x + shift * torch.randn(tokens, hidden, generator=g)).to(torch.bfloat16)
        x = x + 0.5 * torch.randn(tokens, hidden, generator=base_g)
    ids = torch.arange(tokens) % 32000
    t.update(token_ids=ids, ctx_hash=context_hashes(ids), position=torch.arange(tokens))
    rd = data.new_run_dir(run_id, {"kind": "capture", "engine": "bench", "boundaries": labels, "dtype": "bf16",
                                   "model": {"n_layers": n_layers, "hidden_size": hidden}})
    atomic_save_safetensors(rd.file("sample.safetensors"), t)
    rd.update(status="complete")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--check-estimator", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    data = DataRoot(tempfile.mkdtemp(prefix="align-bench-"))
    fake_run(data, "A", a.layers, a.tokens, a.hidden, 1, 0.0)
    fake_run(data, "B", a.layers, a.tokens, a.hidden, 2, 0.01)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    from backend.align import CKA_BUDGET, CKA_SE_BOUND, _on, align_samples

    dev = torch.device(a.device)
    staged_equal = None
    if dev.type == "cuda":
        align_runs("A", "B", data, device=dev)        # warm-up (CUDA context, kernels, pinned staging buffers)
        from backend.align import to_device
        plain = load_sample("A", data).states
        staged = to_device(list(plain.values()), dev)
        staged_equal = all(torch.equal(x.cpu(), y) for x, y in zip(staged, plain.values()))
        del staged
        torch.cuda.reset_peak_memory_stats()
    times, compute, load = [], [], []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        A, B = _on(load_sample("A", data), dev), _on(load_sample("B", data), dev)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        al = align_samples(A, B, device=dev)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        times.append(t2 - t0)
        load.append(t1 - t0)
        compute.append(t2 - t1)
    res = {
        "bench": "align", "date": time.strftime("%Y-%m-%d"), "device": a.device,
        "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if a.device.startswith("cuda") else None,
        "boundaries": f"{a.layers + 1}x{a.layers + 1}", "tokens": a.tokens, "hidden": a.hidden,
        "cka_rows": al.cka_tokens, "cka_exact": al.cka_exact, "cka_definition": al.cka_definition,
        "cka_se_max": max((v for row in al.cka_se for v in row if v is not None), default=None),
        "load1_before": os.getloadavg()[0], "seconds_total_best": round(min(times), 3),
        "seconds_compute_best": round(min(compute), 3), "seconds_load_best": round(min(load), 3),
        "seconds_total_all": [round(t, 3) for t in times],
        "staged_copy_equal": staged_equal if dev.type == "cuda" else None,
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "rss_before_gib": round(rss0 / 2**20, 2),
        "gpu_peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if a.device.startswith("cuda") else None,
        "verdict": [f.kind for f in al.verdict],
    }
    if a.check_estimator:
        exact = align_samples(A, B, cka_budget=None, device=dev)
        est = align_samples(A, B, cka_budget=CKA_BUDGET, device=dev)
        ce, cx, se = (np.array(m, dtype=float) for m in (est.cka, exact.cka, est.cka_se))
        err = np.abs(ce - cx)
        res["estimator_check"] = {"rows": est.cka_tokens, "max_abs_error": float(np.nanmax(err)),
                                  "max_se": float(np.nanmax(se)),
                                  "max_error_in_se": float(np.nanmax(err / np.maximum(se, 1e-12))),
                                  "within_bound": bool(np.all(err <= CKA_SE_BOUND * se + 1e-6)),
                                  "same_verdict": [f.kind for f in est.verdict] == [f.kind for f in exact.verdict]}
    res["load1_after"] = os.getloadavg()[0]
    print(json.dumps(res))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
