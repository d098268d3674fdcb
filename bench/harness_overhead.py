"""What the bench harness adds over a bare decoding loop (budget: at most 2%).

Same model, same prompts, same tokens (checked): a bare greedy loop (HF forward + DynamicCache + argmax,
nothing else) against the bench's per-generation path (`backend.bench.run_unit`: seeded sampler, timing,
then the prompts.parquet row, the output hash and the journal line). Generations alternate the two and
`overhead` compares the fastest of the rounds per prompt (the usual noise-robust estimator), in process
CPU time (the machine is shared, so wall time is noisier); the median of the paired ratios and the ratio of
the sums are printed too. The harness-only work per generation (sampler, row, hash,
journal line, no forward) is also timed alone, a tight bound that noise cannot hide. The wall time of a
whole `run_bench` (model load, run directory, Parquet files, catalog) is printed for reference.

    python bench/harness_overhead.py [--layers 4] [--hidden 256] [--prompts 4] [--max-new-tokens 64] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend import bench  # noqa: E402
from backend.engines import hf  # noqa: E402
from backend.engines.hf_spec import eos_ids  # noqa: E402
from backend.prompts import encode, load_prompts  # noqa: E402
from backend.store.data_root import DataRoot  # noqa: E402
from backend.toy.target import build_random_target  # noqa: E402

PROMPTS = Path(__file__).resolve().parent.parent / "datasets" / "spec_bench" / "question.jsonl"


@torch.inference_mode()
def bare(model, prompt: list[int], max_new: int, eos: set[int]) -> list[int]:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    logits = model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True,
                   logits_to_keep=1).logits[0, -1]
    out = [int(logits.argmax())]
    while len(out) < max_new and out[-1] not in eos:
        logits = model(input_ids=torch.tensor([[out[-1]]]), past_key_values=cache, use_cache=True).logits[0, -1]
        out.append(int(logits.argmax()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tmp = Path(tempfile.mkdtemp(prefix="harness-overhead-"))
    target = build_random_target(tmp / "target", n_layers=a.layers, hidden=a.hidden, vocab_size=4096)
    lm = hf.load(target, "cpu")
    prompts = load_prompts(PROMPTS, a.prompts)
    seqs = [encode(lm.tokenizer, p.text) for p in prompts]
    s = bench.BenchSettings(target=str(target), prompts=str(PROMPTS), limit=a.prompts, repeats=1,
                            max_new_tokens=a.max_new_tokens, device="cpu", warmup=0)
    eos = eos_ids(lm)
    journal = open(tmp / "journal.jsonl", "a")

    def run_bare(i: int) -> list[int]:
        return bare(lm.model, seqs[i], a.max_new_tokens, eos)

    def run_instrumented(i: int) -> list[int]:        # what bench._run does per (repeat, prompt)
        gen = bench.run_unit(lm, s, None, None, seqs[i], bench.unit_seed(s.seed, 0, i))
        unit = {"row": bench._row("overhead", 0, i, prompts[i], len(seqs[i]), gen), "accepted": gen.accepted}
        journal.write(json.dumps(unit) + "\n")
        journal.flush()
        return gen.tokens

    for i in range(len(seqs)):                         # same tokens; also warms up
        assert run_bare(i) == run_instrumented(i), "the two loops must produce the same tokens"
    # paired, alternating per generation; CPU time of this process (less sensitive to other users' load)
    ratios, t_bare, t_inst = [], 0.0, 0.0
    best = {"run_bare": [float("inf")] * len(seqs), "run_instrumented": [float("inf")] * len(seqs)}
    for r in range(a.rounds):
        for i in range(len(seqs)):
            times = {}
            for fn in ((run_bare, run_instrumented) if (r + i) % 2 == 0 else (run_instrumented, run_bare)):
                t0 = time.process_time()
                fn(i)
                times[fn.__name__] = time.process_time() - t0
                best[fn.__name__][i] = min(best[fn.__name__][i], times[fn.__name__])
            t_bare += times["run_bare"]
            t_inst += times["run_instrumented"]
            ratios.append(times["run_instrumented"] / times["run_bare"])
    from backend.engines.hf_spec import Generation, seeded_sampler

    gen = Generation(run_bare(0), 1.0, 0.1)
    n_alone, t0 = 2000, time.process_time()
    for _ in range(n_alone):                           # everything run_unit and _run add, minus the forwards
        seeded_sampler(s.temperature, bench.unit_seed(s.seed, 0, 0), lm.device), eos_ids(lm)
        unit = {"row": bench._row("overhead", 0, 0, prompts[0], len(seqs[0]), gen), "accepted": gen.accepted}
        journal.write(json.dumps(unit) + "\n")
        journal.flush()
    alone = (time.process_time() - t0) / n_alone
    journal.close()
    tokens = sum(len(run_bare(i)) for i in range(len(seqs)))

    t0 = time.perf_counter()
    bench.run_bench(s, name="overhead-run", data=DataRoot(tmp / "data"), progress=False)
    whole = time.perf_counter() - t0

    shutil.rmtree(tmp, ignore_errors=True)
    overhead = sum(best["run_instrumented"]) / sum(best["run_bare"]) - 1    # min over rounds per prompt
    print(json.dumps({
        "model": {"layers": a.layers, "hidden": a.hidden, "vocab": 4096}, "prompts": a.prompts,
        "tokens_per_round": tokens, "rounds": a.rounds, "threads": a.threads,
        "pairs": len(ratios), "bare_cpu_s": t_bare, "instrumented_cpu_s": t_inst,
        "overhead": overhead, "overhead_median_of_pairs": statistics.median(ratios) - 1,
        "overhead_of_sums": t_inst / t_bare - 1,
        "overhead_p25_p75": [statistics.quantiles(ratios, n=4)[0] - 1, statistics.quantiles(ratios, n=4)[2] - 1],
        "harness_only_us_per_generation": alone * 1e6,
        "harness_only_fraction": alone / (t_bare / len(ratios)),
        "within_2_percent": overhead <= 0.02,
        "run_bench_wall_s": whole,
    }, indent=1))


if __name__ == "__main__":
    main()
