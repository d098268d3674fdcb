"""`python -m backend check-drafter`: will the engine feed this drafter the hidden states it was trained on?

    python -m backend check-drafter --drafter D --target T [--engine vllm|sglang] [--engine-version V]
        [--runner v2|v1] [--prompts FILE] [--training-data DIR --training-format FMT] [--json]

Three parts, each in its own module:
  a. static lint (backend/drafter/lint.py): the boundaries vLLM's V2 and V1 runners and SGLang will feed, and
     the config/weights problems each engine will hit;
  b. empirical finder (backend/drafter/finder.py): the target answers a prompt sample, the drafter is fed each
     candidate boundary set, teacher-forced; the best candidate is the convention it was trained on;
  c. with training data (backend/training_data.py): the files against a fresh capture of their tokens.

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

from backend import links
from backend.config import dashboard_link
from backend.errors import SpecLensError
from backend.model_id import fingerprint, identity
from backend.options import ENGINE_NAMES, SERVING_ENGINES, add_options, from_args
from backend.settings import DEFAULT_PROMPTS, CheckSettings  # noqa: F401 (re-exported: demo, tests)
from backend.store.check_result import RESULT
from backend.store.data_root import DataRoot
from backend.store.rundir import atomic_write_json, new_run_id

VERSION = 1
ENGINES = SERVING_ENGINES


@dataclass
class CheckResult:
    run_id: str
    path: Path
    report: dict = field(repr=False)


# ---------------------------------------------------------------------------- the check

def run_check(s: CheckSettings, name: str | None = None, data: DataRoot | None = None, progress: bool = True,
              save: bool = True) -> CheckResult:
    s.validate()
    t0 = time.perf_counter()
    from backend import vllm_runner
    from backend.coords import DEFAULT_VERSIONS
    from backend.drafter import lint as L

    cfg, target, weights = L.load(s.drafter, s.target, weights_required=not s.lint_only)   # one-line errors
    versions = {s.engine: s.engine_version} if s.engine_version else {}
    choice = vllm_runner.resolve(s.runner, target.architectures, versions.get("vllm") or DEFAULT_VERSIONS["vllm"],
                                 s.engine_options, target_config=target.raw or None)
    readings = L.engine_readings(cfg, target, versions, choice)
    kind = getattr(cfg, "kind", "eagle3")
    from backend.text.drafter_text import reading_words
    for r in readings:                  # where each release reads this kind's ids, in words
        r.reads = reading_words(r.engine, r.version, kind, r.runner, r.ids_rule)
    focus = L.picked(readings, s.engine)
    findings = L.lint(cfg, target, weights, readings, focus)
    timing = {"lint": time.perf_counter() - t0}
    if s.lint_only:
        report = _lint_report(s, cfg, target, weights, readings, focus, findings, choice)
    else:
        report = _run_empirical(s, cfg, target, weights, readings, focus, findings, timing, progress)
        report["runner_choice"] = choice.to_json()
    timing["total"] = time.perf_counter() - t0
    report["timing"] = {k: round(v, 2) for k, v in timing.items()}
    run_id = new_run_id("check", name)
    report["run_id"] = run_id
    report["fix"] = _fix_of(report, s.trained_on if s.lint_only else None)
    path = _save(run_id, s, report, data) if save else Path()
    return CheckResult(run_id, path, report)


def _fix_of(report: dict, trained_on: list[str] | None = None) -> dict:
    """The fix this check supports ({"plan": ..., "config": the fixed config}) or why none can be written
    ({"refused": one line}). `trained_on`: a lint-only check told what the drafter was trained on."""
    from backend.drafter import lint as L
    from backend.drafter.fix import FixRefused, fixed_config, plan_fix, plan_for

    try:
        if trained_on:
            cfg, target, _ = L.load(report["drafter"], report["target"], weights_required=False)
            plan = plan_for(cfg, target, trained_on, report["engine"], report.get("engine_version"),
                            report.get("runner"), check_run=report.get("run_id"),
                            verdict=f"trained on {', '.join(trained_on)} (given with --trained-on)")
        else:
            plan = plan_fix(report)
        raw = json.loads(Path(plan.config_file).read_text())
        return {"plan": plan.to_json(), "config": fixed_config(raw, plan)}
    except FixRefused as e:
        return {"refused": str(e)}
    except (SpecLensError, OSError, json.JSONDecodeError) as e:
        return {"refused": f"no fix written: {e}"}


def _run_empirical(s: CheckSettings, cfg, target, weights, readings, focus, findings, timing, progress) -> dict:
    import torch

    device_is_cpu = s.device == "cpu" or (s.device == "auto" and not torch.cuda.is_available())
    threads = torch.get_num_threads()
    torch.set_num_threads(s.threads or (1 if device_is_cpu else threads))
    try:
        return _empirical(s, cfg, target, weights, readings, focus, findings, timing, progress)
    finally:
        torch.set_num_threads(threads)


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
    from backend.text.check_text import NO_FINDER, finding_sentence

    t = time.perf_counter()
    lm = hf.load(s.target, s.device, s.dtype)
    semantics = s.engine
    if semantics == "sglang" and cfg.source_format not in ("eagle", "dflash", "dflash2"):
        semantics = "vllm"
        findings.append(L.Finding("warning", "sglang_cannot_load", {"format": cfg.source_format}, "finder"))
    embed, head = lm.model.get_input_embeddings(), lm.model.get_output_embeddings()
    d = Eagle3Drafter.load(s.drafter, target_embed=embed.weight, target_lm_head=getattr(head, "weight", None),
                           engine=semantics, dtype=lm.dtype).to(lm.device)
    findings.extend(L.embedding_findings(_own_embedding(weights), embed.weight, semantics))
    timing["load"] = time.perf_counter() - t

    t = time.perf_counter()
    prompts, prompts_file = _prompt_ids(lm, s)
    sample = fd.sample_target(lm, prompts, s.new_tokens)
    timing["sample"] = time.perf_counter() - t

    written = fd.written_ids(cfg)                  # EAGLE-3 ids, and a DFlash drafter's dflash_config ids
    candidates: list[fd.Candidate] = []
    t = time.perf_counter()
    d2t_broken = weights.d2t is not None and any(not 0 <= i + o < target.vocab_size for i, o in enumerate(weights.d2t))
    if d2t_broken:
        findings.append(L.Finding("error", "finder_skipped_d2t", {}, "finder"))
    else:
        fed = [(r.name, r.boundaries) for r in readings if r.boundaries]
        sets = fd.candidate_sets(target.n_layers, cfg.num_aux, fed, focus.boundaries, written)
        candidates = fd.find(d, sample, sets, s.num_spec_tokens, s.search, progress)
    timing["finder"] = time.perf_counter() - t

    best = candidates[0] if candidates else None
    by_labels = {tuple(c.boundaries): c for c in candidates}
    fed_c = by_labels.get(tuple(focus.boundaries)) if focus.boundaries else None
    convention = fd.convention_of(best.boundaries, written, target.n_layers) if best else None
    chance = fd.chance(sample, s.num_spec_tokens) if best else None
    verdict = _verdict(focus, fed_c, best, convention, target, s.num_spec_tokens, chance, candidates, cfg)
    if best:
        findings.insert(0, verdict)
        if verdict.code == "at_chance":
            best = None                      # nothing to name as trained, nor to compare other engines with
        else:
            findings.extend(_other_engines(readings, focus, best, target, cfg))
        findings.extend(_ranking_notes(candidates))

    data = None
    if s.training_data:
        from backend import training_data as td

        t = time.perf_counter()
        dc = td.compare(lm, s.training_data, s.training_format, s.drafter, s.target, s.producer_ids, s.training_files)
        findings.extend(td.findings(dc, focus.boundaries, focus.name, best.boundaries if best else None))
        data = dc.to_json()
        timing["training_data"] = time.perf_counter() - t

    report = _common(s, cfg, target, weights, readings, focus, findings)
    report["engine_feeds"]["accuracy"] = fed_c.to_json() if fed_c else None
    report.update({
        "semantics": semantics, "mode": "full",
        "best_candidate": {**best.to_json(), "convention": convention} if best else None,
        "candidates": [c.to_json() for c in candidates],
        "chance": chance.to_json() if chance else None,
        "ranked_by": "cross_entropy",
        "verdict": finding_sentence(verdict) if candidates else NO_FINDER,
        "verdict_severity": verdict.severity if candidates else "error",
        "verdict_code": verdict.code if candidates else "no_finder",
        "training_data": data,
        "sample": {"prompts_file": str(Path(prompts_file).resolve()), "prompts": len(prompts),
                   "answer_tokens": sample.answer_tokens, "scored_slots": candidates[0].tokens if candidates else 0,
                   "new_tokens": s.new_tokens, "num_spec_tokens": s.num_spec_tokens, "device": str(lm.device),
                   "dtype": s.dtype, "threads": _threads()},
    })
    return report


def _common(s: CheckSettings, cfg, target, weights, readings, focus, findings) -> dict:
    """The parts of a check report that come from the config files alone (a lint-only check is just these)."""
    from backend.drafter import lint as L
    from backend.text.check_text import finding_json

    return {
        "version": VERSION, "drafter": str(Path(s.drafter).resolve()), "target": str(Path(s.target).resolve()),
        "engine": s.engine, "engine_version": focus.version, "runner": focus.runner if s.engine == "vllm" else None,
        "semantics": s.engine, "target_info": target.to_json(),
        "drafter_info": {"format": cfg.source_format, "architecture": cfg.architecture, "num_aux": cfg.num_aux,
                         "num_aux_source": cfg.num_aux_source, "hidden_size": cfg.hidden_size,
                         "target_hidden_size": cfg.target_hidden_size, "vocab_size": cfg.vocab_size,
                         "draft_vocab_size": cfg.draft_vocab_size, "ids_top_level": cfg.aux_layer_ids_top,
                         "ids_eagle_config": cfg.aux_layer_ids_nested,
                         "has_embed_tokens": weights.has_embed if weights else None,
                         "has_lm_head": weights.has_lm_head if weights else None, "config_file": cfg.config_file,
                         "flags": {k: getattr(cfg, k) for k in ("norm_before_fc", "fc_norm", "norm_before_residual",
                                                                 "norm_output", "tie_word_embeddings")}},
        "engine_feeds": focus.to_json(),
        "lint": [r.to_json() for r in readings],
        "findings": [finding_json(f) for f in L.sort_findings(findings)],     # data and words (docs/SCHEMA.md)
        "best_candidate": None, "candidates": [], "training_data": None,
        "settings": {k: v for k, v in asdict(s).items()},
    }


def _lint_report(s: CheckSettings, cfg, target, weights, readings, focus, findings, choice) -> dict:
    """`--lint-only`: what each engine feeds, from config files alone; what the drafter was trained on is open."""
    from backend.drafter import lint as L
    from backend.text.check_text import lint_verdict

    report = _common(s, cfg, target, weights, readings, focus, findings)
    worst = min((f["severity"] for f in report["findings"]), key=L.SEVERITIES.index, default="info")
    report.update({
        "mode": "lint", "runner_choice": choice.to_json(),
        "verdict": lint_verdict(report["lint"], choice.runner, choice.reason, target.architectures),
        "verdict_severity": worst if worst in ("error", "warning") else "info",
        "sample": None,
    })
    return report


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


def _fix_words(cfg, reading, trained: list[str], target) -> tuple[str, list[int]] | str | None:
    """Where to write which ids so that `reading`'s engine feeds `trained`: (where, ids); for a DFlash drafter the
    same plan `--write-fix` writes (backend/drafter/fix.py: its ids and key differ from EAGLE-3's), else the
    EAGLE-3 ids; a string says why no ids can (a DFlash fix refused); None: no id captures those boundaries."""
    from backend.drafter.kinds import DFLASH_LIKE
    from backend.drafter.lint import ids_for, where_to_write

    if cfg is not None and getattr(cfg, "kind", "eagle3") in DFLASH_LIKE:
        from backend.drafter.fix import FixRefused, plan_for, where_key

        try:
            plan = plan_for(cfg, target, trained, reading.engine, reading.version, reading.runner)
        except FixRefused as e:
            return str(e).removeprefix("no fix written: ")
        return where_key(plan.where), plan.ids
    ids = ids_for(reading, trained, target)
    return (where_to_write(reading), ids) if ids is not None else None


def _fix_figure(how) -> dict:
    """`_fix_words`' answer as a finding's figure: where and ids, or why no ids can ({} when no id captures them)."""
    return {"where": how[0], "ids": how[1]} if isinstance(how, tuple) else {"refused": how} if how else {}


def _verdict(focus, fed, best, convention, target, K: int, chance=None, candidates=(), cfg=None):
    """The finder's verdict as a finding (backend/text/check_text.py words it: match, mismatch, inconclusive, ...)."""
    from backend.drafter.finder import SURE_Z
    from backend.drafter.lint import Finding

    if best is None:
        return Finding("error", "no_candidate", {}, "finder")
    if chance is not None and not any(chance.beaten_by(c) for c in candidates):
        top = max(candidates, key=lambda c: c.step1 or 0)
        return Finding("warning", "at_chance", {"candidates": len(candidates), "top_step1": top.step1,
                                                "top": list(top.boundaries), "chance": chance.accuracy,
                                                "slots": best.tokens}, "finder")
    trained = {"best": list(best.boundaries), "convention": convention, "step1": best.step1, "k": K,
               "accuracy": list(best.accuracy), "tau": best.tau, "name": focus.name}
    if focus.boundaries is None:
        return Finding("error", "cannot_serve_trained", {**trained, "error": focus.error}, "finder")
    trained["feeds"] = list(focus.boundaries)
    if fed is best:
        return Finding("ok", "match", trained, "finder")
    g = {**trained, "fed": fed is not None, "fed_step1": fed.step1 if fed else None,
         "fed_tau": fed.tau if fed else None, "fix": _fix_figure(_fix_words(cfg, focus, best.boundaries, target))}
    if fed is not None and (fed.z is None or not fed.z >= SURE_Z):
        return Finding("warning", "inconclusive", {**g, "z": fed.z, "sure_z": SURE_Z}, "finder")
    return Finding("error", "mismatch", g, "finder")


def _other_engines(readings, focus, best, target, cfg=None) -> list:
    from backend.drafter.lint import Finding

    out = []
    for r in readings:
        if r is focus or not r.boundaries or r.error or not r.picked:
            continue
        if r.boundaries == best.boundaries:
            out.append(Finding("ok", "other_engine_matches", {"name": r.name, "feeds": list(r.boundaries)}, "finder"))
        else:
            out.append(Finding("warning", "other_engine_differs", {
                "name": r.name, "feeds": list(r.boundaries), "trained": list(best.boundaries),
                "fix": _fix_figure(_fix_words(cfg, r, best.boundaries, target))}, "finder"))
    return out


def _ranking_notes(cands) -> list:
    from backend.drafter.lint import Finding

    if len(cands) < 2:
        return []
    top_acc = max(cands, key=lambda c: c.step1 or 0)
    if top_acc is not cands[0] and (top_acc.step1 or 0) > (cands[0].step1 or 0) + 0.01:
        return [Finding("info", "ranked_by_step1", {"top": list(top_acc.boundaries), "top_step1": top_acc.step1,
                                                    "first_step1": cands[0].step1}, "finder")]
    return []


# ---------------------------------------------------------------------------- storage

def _save(run_id: str, s: CheckSettings, report: dict, data: DataRoot | None) -> Path:
    from backend.runs.lifecycle import Run

    t = report["target_info"]
    best = report.get("best_candidate") or {}
    sample = report.get("sample") or {}                  # None in a lint-only check: nothing was sampled
    lint_only = report.get("mode") == "lint"
    manifest = {
        "kind": "check", "engine": "lint" if lint_only else "hf",
        "engine_version": None if lint_only else _transformers_version(),
        "model": {"path": report["target"], "model_type": t["model_type"], "n_layers": t["n_layers"],
                  "hidden_size": t["hidden_size"], "vocab_size": t["vocab_size"],
                  "fingerprint": fingerprint(report["target"])},
        "drafter": {"path": report["drafter"], "format": report["drafter_info"]["format"],
                    **identity(report["drafter"])},
        "dtype": None if lint_only else s.dtype, "device": sample.get("device", "none"),
        "dataset": Path(sample["prompts_file"]).name if sample else None,
        "boundaries": best.get("boundaries") or [],
        "check": {"engine": s.engine, "engine_version": report["engine_version"], "runner": report["runner"],
                  "feeds": report["engine_feeds"]["boundaries"], "best": best.get("boundaries"),
                  "severity": report["verdict_severity"], "mode": report.get("mode", "full")},
        "settings": asdict(s), "progress": {"done": 1, "total": 1},
        "headline": {"tokens": sample.get("answer_tokens", 0), "prompts": sample.get("prompts", 0),
                     "seconds": report["timing"]["total"]},
    }
    rd = Run.create(run_id, manifest, data)
    atomic_write_json(rd.file(RESULT), report)
    rd.complete()
    return rd.path


def _transformers_version() -> str | None:
    try:
        import transformers
        return f"transformers {transformers.__version__}"
    except ImportError:  # pragma: no cover
        return None


# ---------------------------------------------------------------------------- command line

def cmd_check(a: argparse.Namespace) -> int:
    s = from_args(CheckSettings, a)
    if a.trained_on and not a.lint_only:
        raise SpecLensError("--trained-on goes with --lint-only: a full check finds what the drafter was trained on")
    if a.prove and not a.write_fix:
        raise SpecLensError("--prove needs --write-fix OUT (the fixed drafter directory to bench)")
    r = run_check(s, name=a.name, progress=not a.quiet and not a.json)
    if a.json:
        print(json.dumps(r.report))
    else:
        print_report(r.report)
        print(f"\ncheck {r.run_id} -> {r.path}\ndashboard: {dashboard_link(links.drafter_check(r.run_id))} "
              "(SPECLENS_URL sets the address)")
    if a.write_fix:
        return _write_and_prove(r.report, a)
    return 0


def _write_and_prove(report: dict, a: argparse.Namespace) -> int:
    """--write-fix OUT [--prove]: the check is saved first, so a refusal loses nothing."""
    from backend.drafter.fix import FixPlan, FixRefused, where_key, write_fix

    fix = report.get("fix") or {}
    if "plan" not in fix:
        raise FixRefused(fix.get("refused") or "no fix written")
    plan = FixPlan(**fix["plan"])
    out = write_fix(plan, a.write_fix)
    print(f"fix: {plan.engine_name} now reads {plan.ids} from {where_key(plan.where)} and feeds "
          f"{', '.join(plan.trained_on)} -> {out} (FIX.md says for which releases it holds)")
    if not a.prove:
        return 0
    prompts = a.prompts or str(DEFAULT_PROMPTS)
    if a.prove_engine in SERVING_ENGINES:
        from backend.prove_fix import engine_jobs
        if a.prove_engine != plan.engine:
            raise SpecLensError(f"--prove-engine {a.prove_engine}: the fix is for {plan.engine_name}; prove it on "
                                f"{plan.engine} (or write the fix for --engine {a.prove_engine})")
        jobs = engine_jobs(plan, out, prompts, a.prove_limit, 1, a.name)
        print("queued " + ", ".join(j["job_id"] for j in jobs) + ": run `python -m backend worker` on the GPU node, "
              "then open Compare on the two runs")
        return 0
    from backend.prove_fix import prove
    pr = prove(plan, out, prompts, limit=a.prove_limit, name=a.name, progress=not a.quiet, device=a.device)
    for line in pr.lines():
        print(line)
    return 0


def print_report(rep: dict, out=None) -> None:
    from backend.text.check_text import pct as _pct
    from backend.text.check_text import stored_text

    out = out or sys.stdout
    w = lambda s="": print(s, file=out)  # noqa: E731
    w(f"[{rep['verdict_severity']}] {rep['verdict']}")
    w()
    w("What each engine feeds (static lint):")
    for r in rep["lint"]:
        fed = ", ".join(r["boundaries"]) if r["boundaries"] else "cannot serve"
        ids = "none" if r["ids"] is None else str(r["ids"])
        mark = "" if r.get("picked", True) else "   [not the runner vLLM picks]"
        w(f"  {r['name']:<26} reads {r['reads']:<34} ids {ids:<12} ({r['ids_from'] or '-'}) -> {fed}{mark}")
    ch = rep.get("runner_choice")
    if ch:
        w(f"  vLLM runner: {ch['runner'].upper()} ({ch['reason']})")
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
        w(f"  [{f['severity']}] {stored_text(f)}")
    w("\ntiming: " + ", ".join(f"{k} {v:.1f} s" for k, v in rep["timing"].items()))


def add_parser(subparsers) -> argparse.ArgumentParser:
    c = subparsers.add_parser("check-drafter", help="will an engine feed this EAGLE-3 drafter the hidden states it "
                                                    "was trained on? (lint, empirical finder, training data)")
    add_options(c, CheckSettings)             # every field of the settings: --drafter, --target, --runner, ...
    c.add_argument("--write-fix", metavar="OUT", help="write a drafter directory whose config makes the engine "
                   "release feed what the check found the drafter was trained on (refused when inconclusive)")
    c.add_argument("--prove", action="store_true", help="with --write-fix: bench the original and the fixed drafter "
                   "against one paired baseline and print what was recovered")
    c.add_argument("--prove-engine", default="hf", choices=ENGINE_NAMES,
                   help="hf: the reference bench here, fed as the release feeds (default); vllm/sglang: queue the two "
                        "benches for the GPU worker")
    c.add_argument("--prove-limit", type=int, default=32, help="prompts of each proof bench (default 32)")
    c.add_argument("--name", help="run id of the stored result")
    c.add_argument("--json", action="store_true", help="print the result as one JSON object")
    c.add_argument("--quiet", action="store_true")
    c.set_defaults(fn=cmd_check)
    return c
