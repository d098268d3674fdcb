"""`python -m backend bench ...`: registered by backend/__main__.py through `add_parser(subparsers)`."""

from __future__ import annotations

import argparse

from backend.options import DTYPES, SERVING_ENGINES, add_options, from_args, parse_engine_options
from backend.settings import BenchSettings


def cmd_bench(a: argparse.Namespace) -> int:
    from backend import coords
    from backend.bench import run_bench

    if a.concurrency:
        return cmd_load(a)

    version = a.producer_version or coords.DEFAULT_VERSIONS.get(a.producer)
    s = from_args(BenchSettings, a, producer_version=version)
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


def _ints(flag: str, text: str) -> list[int]:
    from backend.errors import SpecLensError
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecLensError(f"{flag} '{text}': expected comma-separated integers like 1,8,32,64") from None


def _floats(flag: str, text: str | None) -> list[float] | None:
    from backend.errors import SpecLensError
    if not text:
        return None
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecLensError(f"{flag} '{text}': expected comma-separated numbers like 1,2,3") from None


def cmd_load(a: argparse.Namespace) -> int:
    """bench --concurrency ... / sweep: through the engine's OpenAI-compatible servers (backend/load_bench.py)."""
    from pydantic import ValidationError

    from backend.errors import SpecLensError
    from backend.load_bench import LoadSettings, run_load

    if a.engine not in SERVING_ENGINES:
        raise SpecLensError(f"--concurrency runs through a serving engine's server; use --engine vllm or sglang "
                            f"(not {a.engine})")
    k = a.num_spec_tokens if isinstance(a.num_spec_tokens, str) else str(a.num_spec_tokens)
    try:
        s = LoadSettings(engine=a.engine, target=a.target, drafter=a.drafter, prompts=a.prompts,
                         num_spec_tokens=_ints("--num-spec-tokens", k),
                         synthetic_tau=_floats("--synthetic-tau", getattr(a, "synthetic_tau", None)),
                         concurrency=_ints("--concurrency", a.concurrency), requests=a.requests,
                         max_tokens=a.max_new_tokens, repeats=a.repeats, temperature=a.temperature, limit=a.limit,
                         chat_template=not a.no_chat_template, server_url=a.server_url, baseline_url=a.baseline_url,
                         dtype=a.dtype, memory=a.memory, load_format=a.load_format, topk=a.topk,
                         draft_tokens=a.draft_tokens, engine_options=engine_options(a.engine_option),
                         start_together=not a.one_server_at_a_time)
    except ValidationError as e:
        err = e.errors()[0]
        raise SpecLensError(f"--{'-'.join(str(x) for x in err['loc'])}: {err['msg']}") from None
    r = run_load(s, name=a.name, progress=not a.quiet)
    for cell in r.summary["cells"]:
        sp = cell["speedup"]
        print(f"{cell['config']:>14} c={cell['concurrency']:<4} speedup {sp['value']:.2f}x "
              f"[{sp['ci_low']:.2f}, {sp['ci_high']:.2f}]  {cell['drafter_tps']:.0f} vs {cell['baseline_tps']:.0f} "
              f"tok/s  tau {_f(cell['tau_server'])} (server) {_f(cell['tau_client'])} (requests)")
    for c, b in r.summary["best"].items():
        tie = f" (within its interval: {', '.join(b['within_interval'])})" if b["within_interval"] else ""
        print(f"best at concurrency {c}: {b['config']} {b['speedup']:.2f}x{tie}")
    for cfg, c in r.summary["stops_paying"].items():
        print(f"{cfg}: " + (f"slower than the baseline from concurrency {c}" if c else "faster at every level"))
    print(f"load {r.run_id} -> {r.path}")
    return 0


def _f(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _load_options(b: argparse.ArgumentParser) -> None:
    b.add_argument("--concurrency", help="vllm/sglang: requests in flight, e.g. 1,8,32,64 (a serving-load bench "
                                         "through the engine's OpenAI-compatible server, paired baseline server)")
    b.add_argument("--requests", type=int, help="with --concurrency: requests per level and side (default "
                                                "max(16, 4 x concurrency))")
    b.add_argument("--baseline-url", help="with --server-url: a running server of the target without a drafter")
    b.add_argument("--memory", type=float, default=0.15, help="GPU memory fraction of each server SpecLens starts")
    b.add_argument("--load-format", help="e.g. dummy: random weights of the target's shape (speed only)")
    b.add_argument("--topk", type=int, default=1, help="sglang: --speculative-eagle-topk (1 = a chain)")
    b.add_argument("--draft-tokens", type=int, help="sglang: --speculative-num-draft-tokens (default K+1 for a chain)")
    b.add_argument("--one-server-at-a-time", action="store_true",
                   help="start the baseline and one drafter server at a time (default: all at once)")


def add_sweep_parser(subparsers) -> argparse.ArgumentParser:
    w = subparsers.add_parser("sweep", help="serving-load sweep: K x concurrency (x synthetic acceptance length) "
                                            "through vLLM or SGLang servers, each level against a paired baseline")
    w.add_argument("--engine", required=True, choices=SERVING_ENGINES)
    w.add_argument("--target", required=True)
    w.add_argument("--drafter")
    w.add_argument("--prompts", required=True)
    w.add_argument("--num-spec-tokens", default="1,2,4,6", help="K values, e.g. 1,2,4,6")
    w.add_argument("--synthetic-tau", help="accept drafts synthetically at these mean acceptance lengths (vLLM "
                                           "0.22+: rejection_sample_method synthetic; SGLang SGLANG_SIMULATE_ACC_LEN)")
    w.add_argument("--temperature", type=float, default=0.0)
    w.add_argument("--repeats", type=int, default=1)
    w.add_argument("--limit", type=int)
    w.add_argument("--max-new-tokens", type=int, default=128)
    w.add_argument("--name")
    w.add_argument("--dtype", default="bf16", choices=DTYPES)
    w.add_argument("--no-chat-template", action="store_true")
    w.add_argument("--server-url")
    w.add_argument("--engine-option", action="append", metavar="KEY=VALUE",
                   help="a server flag, e.g. max-model-len=4096")
    w.add_argument("--quiet", action="store_true")
    _load_options(w)
    w.set_defaults(fn=cmd_load, concurrency="1,8,32,64")
    return w


def cmd_worth(a: argparse.Namespace) -> int:
    """What raising tau from A to B is worth, read on a speedup map (a load run with --synthetic-tau)."""
    import json

    from backend.drafter_worth import curves, find_map, worth_by_concurrency
    from backend.errors import SpecLensError
    from backend.store.data_root import DataRoot

    if a.map:
        p = DataRoot().runs / a.map / "summary.json"
        try:
            cells = json.loads(p.read_text())["cells"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError):
            raise SpecLensError(f"{p}: not a complete load run; pass the run id of a `sweep --synthetic-tau` run") \
                from None
        if not curves(cells):
            raise SpecLensError(f"run '{a.map}' has no synthetic-acceptance configurations; run `python -m backend "
                                "sweep ... --synthetic-tau 1,2,3,4` on the target's shape to make a map")
    else:
        found = find_map()
        if found is None:
            raise SpecLensError("no speedup map: pass --map RUN (a `sweep --synthetic-tau` run of your target's shape)")
        cells = found.cells
        print(f"reading {found.label}; pass --map RUN for a map of your own target's shape")
    ws = worth_by_concurrency(cells, a.tau_from, a.tau_to)
    if not ws:
        taus = sorted({round(t, 2) for pts in curves(cells).values() for t, _ in pts})
        print(f"the map covers tau {taus[0]}-{taus[-1]}: it cannot say what {a.tau_from} -> {a.tau_to} is worth")
        return 1
    for w in ws:
        print(f"concurrency {w.concurrency:>4}: raising tau from {w.tau_from:.2f} to {w.tau_to:.2f} is worth "
              f"{w.gain:+.0%} output tokens/s (speedup {w.speedup_from:.2f}x -> {w.speedup_to:.2f}x, K={w.k})")
    return 0


def add_worth_parser(subparsers) -> argparse.ArgumentParser:
    w = subparsers.add_parser("worth", help="what a higher acceptance length is worth in tokens/s, read on a speedup "
                                            "map (a `sweep --synthetic-tau` run)")
    w.add_argument("--map", help="run id of the map (default: the map shipped with SpecLens, a Llama-3.1-8B shape "
                                 "served by vLLM 0.24.0 on an H200)")
    w.add_argument("--tau-from", type=float, required=True, help="the drafter's measured tau today")
    w.add_argument("--tau-to", type=float, required=True, help="the tau after a fix or a better drafter")
    w.set_defaults(fn=cmd_worth)
    return w


engine_options = parse_engine_options        # the name check-drafter and capture use


def add_parser(subparsers) -> argparse.ArgumentParser:
    b = subparsers.add_parser("bench", help="speculative-decoding bench: tau, acceptance, tokens/s, speedup "
                                            "against a paired baseline, lossless check")
    add_options(b, BenchSettings)             # every field of the settings: --target, --num-spec-tokens, ...
    b.add_argument("--name", help="run id; the same name resumes an interrupted bench")
    b.add_argument("--quiet", action="store_true")
    _load_options(b)
    b.set_defaults(fn=cmd_bench)
    return b
