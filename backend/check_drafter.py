"""`python -m backend check-drafter`: will the engine feed this drafter the hidden states it was trained on?

    python -m backend check-drafter --drafter D --target T [--engine vllm|sglang] [--engine-version V]
        [--runner v2|v1] [--prompts FILE] [--training-data DIR --training-format FMT] [--json]

Three parts, each in its own module:
  a. static lint (backend/drafter/lint.py): the boundaries vLLM's V2 and V1 runners and SGLang will feed, and
     the config/weights problems each engine will hit;
  b. empirical finder (backend/drafter/finder.py): the target answers a prompt sample, the drafter is fed each
     candidate boundary set, teacher-forced; the best candidate is the convention it was trained on;
  c. with training data (backend/drafter/training_data.py): the files against a fresh capture of their tokens.

The result goes into a run directory (kind "check": manifest.json + check.json, docs/SCHEMA.md) that the Drafter
check page reads; this module imports torch only inside `run_check`, so the page loads a result without it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from backend.config import REPO_ROOT
from backend.errors import SpecLensError
from backend.model_id import fingerprint
from backend.store.rundir import COMPLETE, RunDir, atomic_write_json, new_run_id

RESULT = "check.json"
VERSION = 1
DEFAULT_PROMPTS = REPO_ROOT / "datasets" / "spec_bench" / "question.jsonl"
ENGINES = ("vllm", "sglang")


@dataclass
class CheckSettings:
    drafter: str
    target: str
    engine: str = "vllm"                     # the engine the verdict is about
    engine_version: str | None = None        # default: vLLM 0.24.0 / SGLang 0.5.23
    runner: str = "v2"                       # vLLM model runner (V2 is 0.24's default for Llama, Qwen3, ...)
    prompts: str | None = None               # default: the Spec-Bench questions shipped in datasets/
    num_prompts: int = 16                    # spread evenly over the prompts file
    new_tokens: int = 64                     # the target's greedy answer per prompt
    max_prompt_tokens: int = 256
    num_spec_tokens: int = 3                 # K draft steps scored (vLLM num_speculative_tokens)
    chat_template: bool = True
    search: bool = True                      # search around the best candidate
    device: str = "auto"
    dtype: str = "fp32"
    threads: int | None = None               # torch CPU threads (default 1 on a CPU: fastest for small models)
    training_data: str | None = None
    training_format: str | None = None
    producer_ids: list[int] | None = None
    training_files: int = 4

    def validate(self) -> None:
        if self.engine not in ENGINES:
            raise SpecLensError(f"--engine {self.engine}: unknown; use vllm or sglang")
        if self.runner not in ("v1", "v2"):
            raise SpecLensError(f"--runner {self.runner}: unknown; use v2 (vLLM 0.24's default) or v1")
        for name, v, lo in (("--num-prompts", self.num_prompts, 1), ("--new-tokens", self.new_tokens, 2),
                            ("--num-spec-tokens", self.num_spec_tokens, 1), ("--training-files", self.training_files, 1)):
            if v < lo:
                raise SpecLensError(f"{name} {v}: must be >= {lo}")
        if self.new_tokens <= self.num_spec_tokens:
            raise SpecLensError(f"--new-tokens {self.new_tokens} must exceed --num-spec-tokens {self.num_spec_tokens} "
                                "(each scored slot needs K answer tokens after it)")
        if bool(self.training_data) != bool(self.training_format):
            raise SpecLensError("--training-data and --training-format go together; pass both (formats: speculators, "
                                "vllm-extract, speculators-legacy, specforge)")


@dataclass
class CheckResult:
    run_id: str
    path: Path
    report: dict = field(repr=False)


# ---------------------------------------------------------------------------- the check

def run_check(s: CheckSettings, name: str | None = None, root: Path | None = None, progress: bool = True,
              save: bool = True) -> CheckResult:
    import torch

    s.validate()
    t0 = time.perf_counter()
    from backend.drafter import lint as L

    cfg, target, weights = L.load(s.drafter, s.target)                     # one-line errors for wrong inputs
    versions = {s.engine: s.engine_version} if s.engine_version else {}
    readings = L.engine_readings(cfg, target, versions)
    focus = next(r for r in readings if r.engine == s.engine and (s.engine != "vllm" or r.runner == s.runner))
    findings = L.lint(cfg, target, weights, readings, focus)
    timing = {"lint": time.perf_counter() - t0}

    device_is_cpu = s.device == "cpu" or (s.device == "auto" and not torch.cuda.is_available())
    threads = torch.get_num_threads()
    torch.set_num_threads(s.threads or (1 if device_is_cpu else threads))
    try:
        report = _empirical(s, cfg, target, weights, readings, focus, findings, timing, progress)
    finally:
        torch.set_num_threads(threads)
    timing["total"] = time.perf_counter() - t0
    report["timing"] = {k: round(v, 2) for k, v in timing.items()}
    run_id = new_run_id("check", name)
    report["run_id"] = run_id
    path = _save(run_id, s, report, root) if save else Path()
    return CheckResult(run_id, path, report)


def _prompt_ids(lm, s: CheckSettings) -> tuple[list[list[int]], str]:
    from backend.prompts import encode, load_prompts

    file = s.prompts or str(DEFAULT_PROMPTS)
    rows = load_prompts(file)
    n = min(s.num_prompts, len(rows))
    pick = [rows[i * len(rows) // n] for i in range(n)]                   # spread over the file (all categories)
    chat = s.chat_template and bool(getattr(lm.tokenizer, "chat_template", None))
    ids = [encode(lm.tokenizer, p.text, chat, s.max_prompt_tokens) for p in pick]
    empty = [p.id for p, x in zip(pick, ids) if not x]
    if empty:
        raise SpecLensError(f"{file}: prompt {empty[0]} encodes to zero tokens; remove or fix it")
    return ids, file


def _empirical(s: CheckSettings, cfg, target, weights, readings, focus, findings, timing, progress) -> dict:
    """Load the target and the drafter, sample the target, run the finder (and the training-data comparison)."""
    from backend.drafter import finder as fd
    from backend.drafter import lint as L
    from backend.drafter.model import Eagle3Drafter
    from backend.engines import hf

    t = time.perf_counter()
    lm = hf.load(s.target, s.device, s.dtype)
    semantics = s.engine
    if semantics == "sglang" and cfg.source_format != "eagle":
        semantics = "vllm"
        findings.append(L.Finding("warning", f"SGLang cannot load the {cfg.source_format} format; the finder runs "
                                             f"the drafter with vLLM's semantics instead.", "finder"))
    embed, head = lm.model.get_input_embeddings(), lm.model.get_output_embeddings()
    d = Eagle3Drafter.load(s.drafter, target_embed=embed.weight, target_lm_head=getattr(head, "weight", None),
                           engine=semantics, dtype=lm.dtype).to(lm.device)
    findings.extend(L.embedding_findings(_own_embedding(weights), embed.weight, semantics))
    timing["load"] = time.perf_counter() - t

    t = time.perf_counter()
    prompts, prompts_file = _prompt_ids(lm, s)
    sample = fd.sample_target(lm, prompts, s.new_tokens)
    timing["sample"] = time.perf_counter() - t

    written = [(w, ids) for w, ids in (("top-level", cfg.aux_layer_ids_top), ("eagle_config", cfg.aux_layer_ids_nested))
               if ids]
    candidates: list[fd.Candidate] = []
    t = time.perf_counter()
    d2t_broken = weights.d2t is not None and any(not 0 <= i + o < target.vocab_size for i, o in enumerate(weights.d2t))
    if d2t_broken:
        findings.append(L.Finding("error", "The finder did not run: fix d2t first (draft ids would map outside the "
                                           "target vocab).", "finder"))
    else:
        fed = [(r.name, r.boundaries) for r in readings if r.boundaries]
        sets = fd.candidate_sets(target.n_layers, cfg.num_aux, fed, focus.boundaries, written)
        candidates = fd.find(d, sample, sets, s.num_spec_tokens, s.search, progress)
    timing["finder"] = time.perf_counter() - t

    best = candidates[0] if candidates else None
    by_labels = {tuple(c.boundaries): c for c in candidates}
    fed_c = by_labels.get(tuple(focus.boundaries)) if focus.boundaries else None
    convention = fd.convention_of(best.boundaries, written, target.n_layers) if best else None
    verdict = _verdict(focus, fed_c, best, convention, target, s.num_spec_tokens)
    if best:
        findings.insert(0, verdict)
        findings.extend(_other_engines(readings, focus, best, target))
        findings.extend(_ranking_notes(candidates))

    data = None
    if s.training_data:
        from backend.drafter import training_data as td

        t = time.perf_counter()
        dc = td.compare(lm, s.training_data, s.training_format, s.drafter, s.target, s.producer_ids, s.training_files)
        findings.extend(td.findings(dc, focus.boundaries, focus.name, best.boundaries if best else None))
        data = dc.to_json()
        timing["training_data"] = time.perf_counter() - t

    feeds = {**focus.to_json(), "accuracy": fed_c.to_json() if fed_c else None}
    return {
        "version": VERSION, "drafter": str(Path(s.drafter).resolve()), "target": str(Path(s.target).resolve()),
        "engine": s.engine, "engine_version": focus.version, "runner": focus.runner if s.engine == "vllm" else None,
        "semantics": semantics, "target_info": target.to_json(),
        "drafter_info": {"format": cfg.source_format, "architecture": cfg.architecture, "num_aux": cfg.num_aux,
                         "num_aux_source": cfg.num_aux_source, "hidden_size": cfg.hidden_size,
                         "target_hidden_size": cfg.target_hidden_size, "vocab_size": cfg.vocab_size,
                         "draft_vocab_size": cfg.draft_vocab_size, "ids_top_level": cfg.aux_layer_ids_top,
                         "ids_eagle_config": cfg.aux_layer_ids_nested, "has_embed_tokens": weights.has_embed,
                         "has_lm_head": weights.has_lm_head,
                         "flags": {k: getattr(cfg, k) for k in ("norm_before_fc", "fc_norm", "norm_before_residual",
                                                                 "norm_output", "tie_word_embeddings")}},
        "engine_feeds": feeds,
        "lint": [r.to_json() for r in readings],
        "best_candidate": {**best.to_json(), "convention": convention} if best else None,
        "candidates": [c.to_json() for c in candidates],
        "ranked_by": "cross_entropy",
        "verdict": verdict.text if best else "The finder did not run; see the findings.",
        "verdict_severity": verdict.severity if best else "error",
        "findings": [asdict(f) for f in L.sort_findings(findings)],
        "training_data": data,
        "sample": {"prompts_file": str(Path(prompts_file).resolve()), "prompts": len(prompts),
                   "answer_tokens": sample.answer_tokens, "scored_slots": best.tokens if best else 0,
                   "new_tokens": s.new_tokens, "num_spec_tokens": s.num_spec_tokens, "device": str(lm.device),
                   "dtype": s.dtype, "threads": _threads()},
        "settings": {k: v for k, v in asdict(s).items()},
    }


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _own_embedding(weights):
    """The drafter checkpoint's own embed_tokens [V, H] (None when it has none)."""
    if not weights.has_embed:
        return None
    from safetensors import safe_open

    with safe_open(weights.file, "pt") as f:
        key = next(k for k in f.keys() if k.endswith("embed_tokens.weight"))
        return f.get_tensor(key)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _verdict(focus, fed, best, convention, target, K: int):
    from backend.drafter.finder import SURE_Z
    from backend.drafter.lint import Finding, ids_for, where_to_write

    if best is None:
        return Finding("error", "no candidate could be scored", "finder")
    b = ", ".join(best.boundaries)
    trained = (f"trained on {b} ({convention}): step-1 accuracy {_pct(best.step1)}, steps 1..{K} "
               f"{' / '.join(_pct(a) for a in best.accuracy)}, predicted tau {best.tau:.2f} at k={K}")
    if focus.boundaries is None:
        return Finding("error", f"The drafter was {trained}. {focus.name} cannot serve it as configured: {focus.error}",
                       "finder")
    f = ", ".join(focus.boundaries)
    if fed is best:
        return Finding("ok", f"Match: {focus.name} feeds {f}; the drafter was {trained}.", "finder")
    ids = ids_for(focus, best.boundaries, target)
    fix = (f" Fix: write {where_to_write(focus)}: {ids} in the drafter's config.json." if ids is not None else
           f" No id of {focus.name} captures {b}: retrain the drafter on boundaries the engine can feed.")
    got = (f"step-1 accuracy {_pct(fed.step1)} instead of {_pct(best.step1)}, predicted tau {fed.tau:.2f} instead of "
           f"{best.tau:.2f}" if fed else "not scored")
    if fed is not None and (fed.z is None or not fed.z >= SURE_Z):
        return Finding("warning", f"Inconclusive: the drafter may have been {trained}; {focus.name} feeds {f} "
                                  f"({got}), too close to tell apart on this sample (paired z {fed.z:.1f} < {SURE_Z}); "
                                  f"add prompts with --num-prompts.", "finder")
    return Finding("error", f"Mismatch: the drafter was {trained}, but {focus.name} feeds {f}: {got}.{fix}", "finder")


def _other_engines(readings, focus, best, target) -> list:
    from backend.drafter.lint import Finding, ids_for, where_to_write

    out = []
    for r in readings:
        if r is focus or not r.boundaries or r.error:
            continue
        if r.boundaries == best.boundaries:
            out.append(Finding("ok", f"{r.name} feeds {', '.join(r.boundaries)}: what the drafter was trained on.",
                               "finder"))
        else:
            ids = ids_for(r, best.boundaries, target)
            fix = f" Fix: write {where_to_write(r)}: {ids}." if ids is not None else ""
            out.append(Finding("warning", f"{r.name} feeds {', '.join(r.boundaries)}, not the trained "
                                          f"{', '.join(best.boundaries)}.{fix}", "finder"))
    return out


def _ranking_notes(cands) -> list:
    from backend.drafter.lint import Finding

    if len(cands) < 2:
        return []
    top_acc = max(cands, key=lambda c: c.step1 or 0)
    if top_acc is not cands[0] and (top_acc.step1 or 0) > (cands[0].step1 or 0) + 0.01:
        return [Finding("info", f"By step-1 accuracy alone {', '.join(top_acc.boundaries)} ranks first "
                                f"({_pct(top_acc.step1)} vs {_pct(cands[0].step1)}); the ranking uses the "
                                f"cross-entropy against the target's distribution, which tells candidates apart with "
                                f"far fewer tokens.", "finder")]
    return []


# ---------------------------------------------------------------------------- storage

def _save(run_id: str, s: CheckSettings, report: dict, root: Path | None) -> Path:
    from backend.store import catalog

    t = report["target_info"]
    best = report.get("best_candidate") or {}
    manifest = {
        "kind": "check", "engine": "hf", "engine_version": _transformers_version(),
        "model": {"path": report["target"], "model_type": t["model_type"], "n_layers": t["n_layers"],
                  "hidden_size": t["hidden_size"], "vocab_size": t["vocab_size"],
                  "fingerprint": fingerprint(report["target"])},
        "drafter": {"path": report["drafter"], "format": report["drafter_info"]["format"],
                    "fingerprint": fingerprint(report["drafter"])},
        "dtype": s.dtype, "device": report["sample"]["device"], "dataset": Path(report["sample"]["prompts_file"]).name,
        "boundaries": best.get("boundaries") or [],
        "check": {"engine": s.engine, "engine_version": report["engine_version"], "runner": report["runner"],
                  "feeds": report["engine_feeds"]["boundaries"], "best": best.get("boundaries"),
                  "severity": report["verdict_severity"]},
        "settings": asdict(s), "progress": {"done": 1, "total": 1},
        "headline": {"tokens": report["sample"]["answer_tokens"], "prompts": report["sample"]["prompts"],
                     "seconds": report["timing"]["total"]},
    }
    rd = RunDir.create(run_id, manifest, root)
    atomic_write_json(rd.file(RESULT), report)
    rd.complete()
    catalog.refresh(root)
    return rd.path


def _transformers_version() -> str | None:
    try:
        import transformers
        return f"transformers {transformers.__version__}"
    except ImportError:  # pragma: no cover
        return None


def load_check(run_id: str, root: Path | None = None) -> dict:
    """The stored result of a complete check run (what the Drafter check page shows)."""
    rd = RunDir.open(run_id, root)
    m = rd.manifest()
    if m.get("kind") != "check":
        raise SpecLensError(f"run '{run_id}' is a {m.get('kind')} run, not a drafter check; pick a check run")
    if rd.effective_status(m) != COMPLETE:
        raise SpecLensError(f"check '{run_id}' is {rd.effective_status(m)}; run `python -m backend check-drafter` again")
    f = rd.file(RESULT)
    try:
        return json.loads(f.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SpecLensError(f"{f}: unreadable check result ({type(e).__name__}); run the check again") from None


def check_runs(root: Path | None = None):
    """Complete check runs, newest first (catalog rows)."""
    from backend.store import catalog

    return catalog.list_runs(kind="check", status=COMPLETE, root=root)


# ---------------------------------------------------------------------------- command line

def _ids(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecLensError(f"--producer-ids '{text}': expected comma-separated integers like 2,16,29") from None


def cmd_check(a: argparse.Namespace) -> int:
    s = CheckSettings(drafter=a.drafter, target=a.target, engine=a.engine, engine_version=a.engine_version,
                      runner=a.runner, prompts=a.prompts, num_prompts=a.num_prompts, new_tokens=a.new_tokens,
                      max_prompt_tokens=a.max_prompt_tokens, num_spec_tokens=a.num_spec_tokens,
                      chat_template=not a.no_chat_template, search=not a.no_search, device=a.device, dtype=a.dtype,
                      threads=a.threads, training_data=a.training_data, training_format=a.training_format,
                      producer_ids=_ids(a.producer_ids), training_files=a.training_files)
    r = run_check(s, name=a.name, progress=not a.quiet and not a.json)
    if a.json:
        print(json.dumps(r.report))
        return 0
    print_report(r.report)
    print(f"\ncheck {r.run_id} -> {r.path} (open http://localhost:8501/drafter?run={r.run_id})")
    return 0


def print_report(rep: dict, out=None) -> None:
    out = out or sys.stdout
    w = lambda s="": print(s, file=out)  # noqa: E731
    w(f"[{rep['verdict_severity']}] {rep['verdict']}")
    w()
    w("What each engine feeds (static lint):")
    for r in rep["lint"]:
        fed = ", ".join(r["boundaries"]) if r["boundaries"] else "cannot serve"
        ids = "none" if r["ids"] is None else str(r["ids"])
        w(f"  {r['name']:<26} reads {r['reads']:<34} ids {ids:<12} ({r['ids_from'] or '-'}) -> {fed}")
    if rep["candidates"]:
        K = rep["sample"]["num_spec_tokens"]
        w()
        w(f"Candidates ({rep['sample']['scored_slots']} scored slots from {rep['sample']['prompts']} prompts; "
          f"ranked by cross-entropy, steps 1..{K}):")
        w(f"  {'boundaries':<18} {'CE':>6} {'z':>6} {'step 1':>7} {'tau':>5}  why")
        for c in rep["candidates"]:
            z = "-" if c["z_vs_best"] in (None, 0) else f"{c['z_vs_best']:.1f}"
            w(f"  {', '.join(c['boundaries']):<18} {c['cross_entropy']:6.3f} {z:>6} {_pct(c['step1_accuracy']):>7} "
              f"{c['tau']:5.2f}  {'; '.join(c['why'])}")
    w()
    w("Findings:")
    for f in rep["findings"]:
        w(f"  [{f['severity']}] {f['text']}")
    w("\ntiming: " + ", ".join(f"{k} {v:.1f} s" for k, v in rep["timing"].items()))


def add_parser(subparsers) -> argparse.ArgumentParser:
    c = subparsers.add_parser("check-drafter", help="will an engine feed this EAGLE-3 drafter the hidden states it "
                                                    "was trained on? (lint, empirical finder, training data)")
    c.add_argument("--drafter", required=True, help="EAGLE-3 drafter directory (config.json + model.safetensors)")
    c.add_argument("--target", required=True, help="target HF model directory")
    c.add_argument("--engine", default="vllm", choices=ENGINES, help="the engine the verdict is about (default vllm)")
    c.add_argument("--engine-version", help="default: vLLM 0.24.0, SGLang 0.5.23")
    c.add_argument("--runner", default="v2", choices=["v2", "v1"], help="vLLM model runner (default v2, as 0.24)")
    c.add_argument("--prompts", help=f"Spec-Bench style JSONL or text (default {DEFAULT_PROMPTS.relative_to(REPO_ROOT)})")
    c.add_argument("--num-prompts", type=int, default=16, help="prompts, spread over the file (default 16)")
    c.add_argument("--new-tokens", type=int, default=64, help="the target's greedy answer per prompt (default 64)")
    c.add_argument("--max-prompt-tokens", type=int, default=256)
    c.add_argument("--num-spec-tokens", type=int, default=3, help="draft steps scored, K (default 3)")
    c.add_argument("--no-chat-template", action="store_true")
    c.add_argument("--no-search", action="store_true", help="score only the listed candidates")
    c.add_argument("--training-data", help="training-data files of this drafter (a directory or one file)")
    c.add_argument("--training-format", choices=["speculators", "vllm-extract", "speculators-legacy", "specforge"])
    c.add_argument("--producer-ids", help="layer ids the training-data producer used (default: from the config)")
    c.add_argument("--training-files", type=int, default=4, help="training files compared (default 4)")
    c.add_argument("--device", default="auto", help="auto, cpu or cuda[:i]")
    c.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    c.add_argument("--threads", type=int, help="torch CPU threads (default 1 on a CPU)")
    c.add_argument("--name", help="run id of the stored result")
    c.add_argument("--json", action="store_true", help="print the result as one JSON object")
    c.add_argument("--quiet", action="store_true")
    c.set_defaults(fn=cmd_check)
    return c
