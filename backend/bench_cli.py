"""`python -m backend bench ...`: registered by backend/__main__.py through `add_parser(subparsers)`."""

from __future__ import annotations

import argparse

from backend.options import SERVING_ENGINES, add_options, from_args, parse_engine_options
from backend.settings import LOAD_ONLY, BenchSettings, LoadSettings


def cmd_bench(a: argparse.Namespace) -> int:
    from backend import coords
    from backend.bench import run_bench

    if a.concurrency:
        return cmd_load(a)

    version = a.producer_version or coords.DEFAULT_VERSIONS.get(a.producer)
    s = from_args(BenchSettings, a, producer_version=version)
    if a.also_drafter:
        for r in _bench_several(s, a):
            _print_result(r)
        return 0
    _print_result(run_bench(s, name=a.name, progress=not a.quiet))
    return 0


def _bench_several(s: BenchSettings, a: argparse.Namespace) -> list:
    """--also-drafter: the drafters in one loop (bench.run_benches), one plain half per prompt shared by all; runs
    named `<name>` and `<name>-<drafter directory name>` (or fresh ids without --name)."""
    import dataclasses
    from pathlib import Path

    from backend.bench import run_benches
    from backend.errors import SpecLensError

    if not s.drafter:
        raise SpecLensError("--also-drafter benches more drafters beside --drafter; pass --drafter too")
    if s.engine != "hf":
        raise SpecLensError(f"--also-drafter shares plain decoding in one HF loop; bench each drafter on its own "
                            f"with --engine {s.engine}")
    others = [dataclasses.replace(s, drafter=d) for d in a.also_drafter]
    names = [a.name] + [f"{a.name}-{Path(d).name}" if a.name else None for d in a.also_drafter]
    return run_benches([s, *others], names, progress=not a.quiet)


def _print_result(r) -> None:
    line = f"bench {r.run_id}: {r.tokens_per_s:.1f} tok/s"
    if r.baseline_run:
        sp = r.speedup or {}
        line += (f", tau {r.tau:.2f}, acceptance {r.acceptance_rate:.1%}, speedup {sp.get('mean', float('nan')):.2f}x "
                 f"+- {sp.get('std', float('nan')):.2f} (95% CI {sp.get('ci_low', float('nan')):.2f}-"
                 f"{sp.get('ci_high', float('nan')):.2f}) vs {r.baseline_run}")
        if r.lossless is not None:
            line += ", lossless" if r.lossless else f", NOT lossless ({r.mismatched_prompts} prompts differ)"
    print(f"{line} -> {r.path}")


def cmd_load(a: argparse.Namespace) -> int:
    """bench --concurrency ... / sweep: through the engine's OpenAI-compatible servers (backend/load_bench.py)."""
    from backend.errors import SpecLensError
    from backend.load_bench import run_load

    if a.engine not in SERVING_ENGINES:
        raise SpecLensError(f"--concurrency runs through a serving engine's server; use --engine vllm or sglang "
                            f"(not {a.engine})")
    s = from_args(LoadSettings, a)       # `sweep`: all its options; `bench --concurrency`: the bench's and LOAD_ONLY
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


def add_sweep_parser(subparsers) -> argparse.ArgumentParser:
    w = subparsers.add_parser("sweep", help="serving-load sweep: K x concurrency (x synthetic acceptance length) "
                                            "through vLLM or SGLang servers, each level against a paired baseline")
    add_options(w, LoadSettings)              # every option of the load settings: --engine, --concurrency, ...
    w.add_argument("--name")
    w.add_argument("--quiet", action="store_true")
    w.set_defaults(fn=cmd_load)
    return w


def cmd_worth(a: argparse.Namespace) -> int:
    """What raising tau from A to B is worth, read on a speedup map (a load run with --synthetic-tau)."""
    from backend.drafter_worth import curves, find_map, shipped_maps, worth_by_concurrency
    from backend.errors import SpecLensError
    from backend.store.data_root import DataRoot

    found = find_map(a.map, DataRoot().runs) if a.map else find_map()
    if a.map and found is None:
        p = DataRoot().runs / a.map / "summary.json"
        if not p.exists():
            raise SpecLensError(f"{p}: not a complete load run; pass the run id of a `sweep --synthetic-tau` run or "
                                f"a shipped map ({', '.join(m.run_id for m in shipped_maps()) or 'none'})")
        raise SpecLensError(f"run '{a.map}' has no synthetic-acceptance configurations; run `python -m backend "
                            "sweep ... --synthetic-tau 1,2,3,4` on the target's shape to make a map")
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
    w.add_argument("--map", help="run id of the map, or a shipped one: h200-vllm-synthetic-8b (a Llama-3.1-8B shape, "
                                 "the default) or h100-vllm-synthetic-gptoss20b (gpt-oss-20b, an MoE)")
    w.add_argument("--tau-from", type=float, required=True, help="the drafter's measured tau today")
    w.add_argument("--tau-to", type=float, required=True, help="the tau after a fix or a better drafter")
    w.set_defaults(fn=cmd_worth)
    return w


engine_options = parse_engine_options        # the name check-drafter and capture use


def add_parser(subparsers) -> argparse.ArgumentParser:
    b = subparsers.add_parser("bench", help="speculative-decoding bench: tau, acceptance, tokens/s, speedup "
                                            "against a paired baseline, lossless check")
    add_options(b, BenchSettings)             # every field of the settings: --target, --num-spec-tokens, ...
    add_options(b, LoadSettings, only=LOAD_ONLY, defaults={"concurrency": None})   # bench --concurrency: load
    b.add_argument("--name", help="run id; the same name resumes an interrupted bench")
    b.add_argument("--also-drafter", action="append", default=[], metavar="DIR",
                   help="another drafter for the same target, benched in the same loop as --drafter: each prompt "
                        "decodes plain once and then every drafter, so all pair with the same plain timings "
                        "(repeatable; runs named NAME-<directory name>)")
    b.add_argument("--quiet", action="store_true")
    b.set_defaults(fn=cmd_bench)
    return b
