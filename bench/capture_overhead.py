"""HF capture overhead: hooks + streaming statistics + sample vs a plain forward of the same model and tokens.

Both paths call the decoder stack (no LM head) one prompt at a time with `inference_mode`; the capture
path is the exact hot path of `python -m backend capture` (engines.hf.BoundaryHooks + capture.Capturer).
Passes alternate (plain, capture, plain, capture, ...) and the best of `--repeats` is kept.

    python bench/capture_overhead.py --shape demo                       # the demo target on CPU
    python bench/capture_overhead.py --shape llama8b --device cuda     # Llama-3.1-8B shape, random bf16
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend import coords  # noqa: E402
from backend.capture import Capturer  # noqa: E402
from backend.engines import hf  # noqa: E402
from backend.stats import StreamingStats, TokenSample  # noqa: E402


def llama8b(device: str) -> hf.LoadedModel:
    """Llama-3.1-8B shape with random bf16 weights (non-unit norms), built directly on the device."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                      rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0, 0.02)
    model.eval()
    base, layers, norm = hf.find_stack(model)
    return hf.LoadedModel(model, base, layers, norm, cfg, None, torch.device(device), torch.bfloat16)


def demo_model(device: str) -> tuple[hf.LoadedModel, list[list[int]]]:
    from backend.demo import PROMPTS, demo_models
    from backend.prompts import encode, load_prompts

    target, _ = demo_models()
    lm = hf.load(target, device, "fp32")
    seqs = [encode(lm.tokenizer, p.text) for p in load_prompts(PROMPTS, 64)]
    return lm, seqs


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def clock(dev: torch.device) -> float:
    """Wall time on a GPU; process CPU time on a CPU, where a shared machine makes wall time meaningless."""
    return time.perf_counter() if dev.type == "cuda" else time.process_time()


def plain_pass(lm: hf.LoadedModel, seqs: list[list[int]]) -> float:
    sync(lm.device)
    t0 = clock(lm.device)
    for ids in seqs:
        hf.forward(lm, ids)
    sync(lm.device)
    return clock(lm.device) - t0


def capture_pass(lm: hf.LoadedModel, seqs: list[list[int]], wanted: list[coords.Boundary],
                 sample_tokens: int) -> tuple[float, StreamingStats]:
    labels = coords.labels(wanted)
    stats = StreamingStats(labels, lm.hidden_size, lm.device)
    sample = TokenSample(labels, lm.hidden_size, sample_tokens, 512, dtype=lm.dtype, pin=lm.device.type == "cuda")
    cap = Capturer(stats, sample)
    sync(lm.device)
    t0 = clock(lm.device)
    with hf.BoundaryHooks(lm, wanted, cap.sink):
        for ids in seqs:
            cap.run(lm, ids)
    stats.table()          # the figures and the sample are part of the work
    sample.tensors()
    sync(lm.device)
    return clock(lm.device) - t0, stats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=["demo", "llama8b"], default="demo")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=16, help="llama8b: number of prompts")
    ap.add_argument("--tokens", type=int, default=2048, help="llama8b: tokens per prompt")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sample-tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads (default 1: OpenMP spin-waits make CPU time meaningless on a shared machine)")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.device == "cpu":
        torch.set_num_threads(a.threads)
    if a.shape == "demo":
        lm, seqs = demo_model(a.device)
    else:
        lm = llama8b(a.device)
        g = torch.Generator().manual_seed(0)
        seqs = [torch.randint(0, 128000, (a.tokens,), generator=g).tolist() for _ in range(a.prompts)]
    n = lm.n_layers
    sets = {"all": coords.all_boundaries(n),
            "eagle": [coords.S(2), coords.S(n // 2), coords.S(n - 3), coords.S(n)]}
    plain_pass(lm, seqs[:2])                       # warm-up
    capture_pass(lm, seqs[:2], sets["all"], a.sample_tokens)
    plain, cap = [], {k: [] for k in sets}
    peak_gpu = {}
    for _ in range(a.repeats):
        plain.append(plain_pass(lm, seqs))
        for k, wanted in sets.items():
            if lm.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            cap[k].append(capture_pass(lm, seqs, wanted, a.sample_tokens)[0])
            if lm.device.type == "cuda":
                peak_gpu[k] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    tokens = sum(len(s) for s in seqs)
    best = min(plain)
    res = {
        "bench": "capture_overhead", "date": time.strftime("%Y-%m-%d"), "shape": a.shape, "device": str(lm.device),
        "clock": "wall" if lm.device.type == "cuda" else "process CPU time",
        "load_average": list(__import__("os").getloadavg()),
        "gpu": torch.cuda.get_device_name(0) if lm.device.type == "cuda" else None,
        "cpu": platform.machine(), "threads": torch.get_num_threads(), "dtype": str(lm.dtype).replace("torch.", ""),
        "layers": n, "hidden": lm.hidden_size, "prompts": len(seqs), "tokens": tokens,
        "plain_s": round(best, 4), "plain_tok_s": round(tokens / best, 1),
        **{f"capture_{k}_s": round(min(v), 4) for k, v in cap.items()},
        **{f"ratio_{k}": round(min(v) / best, 4) for k, v in cap.items()},
        "boundaries": {k: len(v) for k, v in sets.items()},
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "peak_gpu_gib": peak_gpu or None, "all_plain_s": [round(x, 4) for x in plain],
    }
    print(json.dumps(res))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
