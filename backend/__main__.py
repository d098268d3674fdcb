"""`python -m backend ...`: the SpecLens command line. Each command is a thin wrapper over a module."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from backend.errors import SpecLensError
from backend.options import add_options, from_args, parse_engine_options
from backend.settings import CaptureSettings


def _ids(s: str | None) -> list[int] | None:
    if s is None or s == "":
        return None
    try:
        return [int(x) for x in s.split(",") if x.strip() != ""]
    except ValueError:
        raise SpecLensError(f"--producer-ids '{s}': expected comma-separated integers like 2,16,29") from None


def cmd_capture(a: argparse.Namespace) -> int:
    from backend.capture import run_capture
    from backend.engines.base import adapter

    s = from_args(CaptureSettings, a)
    opts = adapter(s.engine).capture_options(s, a.tensor_parallel_size, parse_engine_options(a.engine_option))
    if a.extract_ids:
        if a.engine != "vllm":
            raise SpecLensError("--extract-ids needs --engine vllm (vLLM's own extract_hidden_states)")
        from backend.engines.vllm import run_extract
        r = run_extract(s, _ids(a.extract_ids), name=a.name, opts=opts, progress=not a.quiet)
        print(f"capture {r.run_id}: {r.tokens} tokens from {r.prompts} prompts via vLLM extract_hidden_states "
              f"-> {r.path}")
        return 0
    r = run_capture(s, name=a.name, progress=not a.quiet, engine_options=opts)
    msg = f"capture {r.run_id}: {r.tokens} tokens from {r.prompts} prompts in {r.seconds:.1f} s -> {r.path}"
    print(msg)
    for lbl, k in r.nonfinite.items():
        print(f"warning: {lbl} holds NaN or inf in {k} tokens (left out of its statistics)", file=sys.stderr)
    return 0


def cmd_import(a: argparse.Namespace) -> int:
    from backend.importers import detect_format, import_capture

    if a.format is None:                 # detected from the files' contents; the note says how to choose otherwise
        print(detect_format(a.path, _ids(a.producer_ids), a.drafter_config).note, file=sys.stderr)
    r = import_capture(a.path, a.format, producer_ids=_ids(a.producer_ids), num_layers=a.num_layers,
                       drafter_config=a.drafter_config, name=a.name, model=a.model)
    print(f"import {r.run_id}: {r.tokens} tokens from {r.prompts} sequences -> {r.path}")
    return 0


def cmd_align(a: argparse.Namespace) -> int:
    from backend.align import CKA_SE_BOUND, get_alignment
    from backend.text import align_text

    al = get_alignment(a.run_a, a.run_b)
    if a.json:          # each finding's data, and its sentence as `text`
        d = al.to_json()
        for f, (_, text) in zip(d["verdict"], align_text.verdict_lines(al), strict=True):
            f["text"] = text
        print(json.dumps(d, indent=None if a.compact else 1))
        return 0
    cka = ("CKA exact on all shared tokens" if al.cka_exact else
           f"CKA estimated from {al.cka_tokens} Gram rows over all tokens, within {CKA_SE_BOUND:g} standard errors "
           f"of the exact value (largest standard error {al.cka_se_max:.4f})")
    print(f"A = {al.a}, B = {al.b}: {al.tokens} shared tokens ({cka})")
    for kind, text in align_text.verdict_lines(al):
        print(f"[{kind}] {text}")
    for w in al.warnings:
        print(f"warning: {w}")
    print(f"{'B boundary':>10} {'best A':>7} {'cos':>8} {'same-name cos':>14} {'rel L2':>9} {'CKA':>7}")
    for row in al.per_boundary:
        fmt = lambda v, p=4: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
        print(f"{row['boundary']:>10} {row['best_match']:>7} {fmt(row['best_cosine']):>8} {fmt(row['cosine']):>14} "
              f"{fmt(row['rel_l2']):>9} {fmt(row['cka'], 3):>7}")
    return 0


def cmd_runs(a: argparse.Namespace) -> int:
    from backend import findings, runs_text
    from backend.store.data_root import DataRoot

    catalog = DataRoot().catalog                  # the data root of $SPECLENS_DATA
    catalog.write.refresh()
    cat = catalog.read
    df = cat.runs_overview()       # every run with the headline figures of bench runs (tau, speedup + CI, lossless)
    if a.kind:
        df = df[df["kind"] == a.kind]
    bench = df.loc[df["kind"] == "bench", "run_id"].tolist()
    found = findings.findings(cat.run_manifest_keys(bench, findings.MANIFEST_KEYS, findings.NEEDS),
                             cat.check_manifests(), cat) if bench else {}
    # what a reader must know before trusting a run's figures (the run page and the Runs row say the same), a wrong
    # feed graded by what it costs ("note: wrong feed ..., predicted tau 3% lower")
    df = df.assign(finding=df["run_id"].map({r: findings.finding_text(f) for r, f in found.items()}))
    if a.json:
        print(df.to_json(orient="records", date_format="iso"))
        return 0
    if df.empty:
        print("no runs yet: try `python -m backend demo`")
        return 0
    print(runs_text.runs_text(df))
    return 0


def cmd_db(a: argparse.Namespace) -> int:
    from backend.store.data_root import DataRoot

    catalog = DataRoot().catalog                  # the data root of $SPECLENS_DATA
    p = catalog.write.refresh(full=True)
    n = len(catalog.read.list_runs())
    print(f"catalog rebuilt: {p} ({n} runs)")
    return 0


def cmd_demo(a: argparse.Namespace) -> int:
    from backend.demo import run_demo

    run_demo(force=a.force, progress=not a.quiet)
    return 0


def cmd_build_demo_model(a: argparse.Namespace) -> int:
    from backend.toy.target import build_random_target

    p = build_random_target(Path(a.out), n_layers=a.layers, hidden=a.hidden, seed=a.seed)
    print(f"built {p}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m backend", description="SpecLens: EAGLE-3 hidden-state capture, "
                                "layer alignment and speculative-decoding diagnostics. Data root: $SPECLENS_DATA "
                                "(default ./data).")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    c = sub.add_parser("capture", help="capture every boundary S_0..S_N and F of a model on prompts")
    add_options(c, CaptureSettings)           # every field of the settings: --model, --prompts, --boundaries, ...
    c.add_argument("--name", help="run id; the same name resumes an interrupted capture")
    c.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm: GPUs for the engine")
    c.add_argument("--extract-ids", help="vllm: capture exactly these layer ids through vLLM's own "
                                         "extract_hidden_states (what it feeds a drafter, e.g. 2,16,29,32)")
    c.add_argument("--engine-option", action="append", metavar="KEY=VALUE",
                   help="vllm: passed to vllm.LLM (e.g. gpu_memory_utilization=0.5); compiled=true: capture in "
                        "vLLM's compiled engine (its own aux outputs) instead of an eager one with hooks")
    c.add_argument("--quiet", action="store_true")
    c.set_defaults(fn=cmd_capture)

    i = sub.add_parser("import-capture", help="import existing EAGLE-3 training data as a capture run")
    i.add_argument("path", help="a file or a directory of files")
    i.add_argument("--format", choices=["speculators", "speculators-legacy", "specforge", "vllm-extract"],
                   help="default: detected from the files' contents (keys and shapes); speculators and "
                        "vllm-extract share a layout: k aux ids or hs_{i} names mean speculators, all stored "
                        "layer ids or request-id names vllm-extract")
    i.add_argument("--producer-ids", help="layer ids as the producer numbered them, e.g. 2,16,29")
    i.add_argument("--num-layers", type=int, help="decoder layers N of the target")
    i.add_argument("--drafter-config", help="drafter config.json to take ids (and N) from")
    i.add_argument("--model", help="target model directory (for N and model family)")
    i.add_argument("--name")
    i.set_defaults(fn=cmd_import)

    al = sub.add_parser("align", help="which boundary of run A matches which of run B, with a verdict")
    al.add_argument("run_a")
    al.add_argument("run_b")
    al.add_argument("--json", action="store_true", help="print one JSON object")
    al.add_argument("--compact", action="store_true", help="with --json: one line")
    al.set_defaults(fn=cmd_align)

    r = sub.add_parser("runs", help="list runs with kind, engine, status and headline figures")
    r.add_argument("--kind")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=cmd_runs)

    d = sub.add_parser("db", help="catalog maintenance")
    d.add_argument("action", choices=["rebuild"])
    d.set_defaults(fn=cmd_db)

    dm = sub.add_parser("demo", help="build the demo target and the captures that show each verdict")
    dm.add_argument("--force", action="store_true", help="rebuild even when cached")
    dm.add_argument("--quiet", action="store_true")
    dm.set_defaults(fn=cmd_demo)

    from backend.bench_cli import add_parser as add_bench
    from backend.bench_cli import add_sweep_parser, add_worth_parser

    add_bench(sub)
    add_sweep_parser(sub)
    add_worth_parser(sub)

    from backend.check_drafter import add_parser as add_check_drafter

    add_check_drafter(sub)

    from backend.jobs.cli import add_parsers as add_jobs

    add_jobs(sub)

    from backend.release_cli import add_parsers as add_release

    add_release(sub)

    from backend.watch_cli import add_parser as add_watch

    add_watch(sub)

    b = sub.add_parser("build-demo-model", help="build a small random Llama-shaped target with its tokenizer")
    b.add_argument("--out", required=True)
    b.add_argument("--layers", type=int, default=8)
    b.add_argument("--hidden", type=int, default=256)
    b.add_argument("--seed", type=int, default=0)
    b.set_defaults(fn=cmd_build_demo_model)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except SpecLensError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
