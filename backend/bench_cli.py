"""`python -m backend bench ...`: registered by backend/__main__.py through `add_parser(subparsers)`."""

from __future__ import annotations

import argparse


def cmd_bench(a: argparse.Namespace) -> int:
    from backend import coords
    from backend.bench import BenchSettings, run_bench

    version = a.producer_version or coords.DEFAULT_VERSIONS.get(a.producer)
    s = BenchSettings(engine=a.engine, server_url=a.server_url, tensor_parallel_size=a.tensor_parallel_size,
                      engine_options=engine_options(a.engine_option) or None,
                      target=a.target, drafter=a.drafter, prompts=a.prompts, num_spec_tokens=a.num_spec_tokens,
                      temperature=a.temperature, repeats=a.repeats, limit=a.limit, max_new_tokens=a.max_new_tokens,
                      device=a.device, dtype=a.dtype, seed=a.seed, chat_template=not a.no_chat_template,
                      producer=a.producer, producer_version=version, runner=a.runner,
                      draft_sampling=a.draft_sampling)
    r = run_bench(s, name=a.name, progress=not a.quiet)
    line = f"bench {r.run_id}: {r.tokens_per_s:.1f} tok/s"
    if r.baseline_run:
        sp = r.speedup or {}
        line += (f", tau {r.tau:.2f}, acceptance {r.acceptance_rate:.1%}, speedup {sp.get('mean', float('nan')):.2f}x "
                 f"+- {sp.get('std', float('nan')):.2f} (95% CI {sp.get('ci_low', float('nan')):.2f}-"
                 f"{sp.get('ci_high', float('nan')):.2f}) vs {r.baseline_run}")
        if r.lossless is not None:
            line += ", lossless" if r.lossless else f", NOT lossless ({r.mismatched_prompts} prompts differ)"
    print(f"{line} -> {r.path}")
    return 0


def engine_options(items: list[str] | None) -> dict:
    """--engine-option KEY=VALUE (VALUE parsed as JSON when it is JSON: numbers, true/false, lists)."""
    import json

    from backend.errors import SpecLensError

    out = {}
    for it in items or []:
        if "=" not in it:
            raise SpecLensError(f"--engine-option {it}: expected KEY=VALUE, e.g. gpu_memory_utilization=0.5")
        k, v = it.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


def add_parser(subparsers) -> argparse.ArgumentParser:
    b = subparsers.add_parser("bench", help="speculative-decoding bench: tau, acceptance, tokens/s, speedup "
                                            "against a paired baseline, lossless check")
    b.add_argument("--engine", default="hf", choices=["hf", "vllm", "sglang"])
    b.add_argument("--target", required=True, help="target HF model directory")
    b.add_argument("--drafter", help="EAGLE-3 drafter directory (none: a plain-decoding baseline run)")
    b.add_argument("--prompts", required=True, help="Spec-Bench style JSONL or a text file (one prompt a line)")
    b.add_argument("--num-spec-tokens", type=int, default=4, help="K draft tokens per step (default 4)")
    b.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    b.add_argument("--repeats", type=int, default=3, help="runs over the prompts (default 3)")
    b.add_argument("--limit", type=int, help="first N prompts only")
    b.add_argument("--max-new-tokens", type=int, default=64)
    b.add_argument("--name", help="run id; the same name resumes an interrupted bench")
    b.add_argument("--device", default="auto", help="auto, cpu or cuda[:i]")
    b.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--no-chat-template", action="store_true")
    b.add_argument("--producer", default="vllm", help="whose reading of the drafter's aux layer ids (default vllm)")
    b.add_argument("--producer-version", default=None,
                   help="that producer's release (default: the one SpecLens was checked against, e.g. vllm 0.24.0, "
                        "sglang 0.5.15)")
    b.add_argument("--runner", choices=["auto", "v1", "v2"],
                   help="vLLM model runner whose id reading to apply (default auto: the one vLLM picks for the target)")
    b.add_argument("--draft-sampling", default="sample", choices=["sample", "argmax"],
                   help="at T > 0: draft from q (standard) or argmax (vLLM V1)")
    b.add_argument("--server-url", help="vllm/sglang: bench a running server (OpenAI API) instead of starting one")
    b.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm/sglang: GPUs per engine")
    b.add_argument("--engine-option", action="append", metavar="KEY=VALUE",
                   help="vllm: passed to vllm.LLM (e.g. gpu_memory_utilization=0.5); sglang: a server flag")
    b.add_argument("--quiet", action="store_true")
    b.set_defaults(fn=cmd_bench)
    return b
