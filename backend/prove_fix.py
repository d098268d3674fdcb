"""Prove a written fix: bench the original and the fixed drafter as the named engine release feeds them, against one
paired baseline, and say what was recovered.

    python -m backend check-drafter --drafter D --target T --engine sglang --engine-version 0.5.15 \
        --write-fix OUT --prove [--prompts FILE --limit 32 --repeats 1]

On a CPU (or any machine with the target), the HF reference bench decodes with each drafter fed exactly what that
release would feed it (`bench --producer ENGINE --producer-version V`), both in one loop (backend/bench.py
`run_benches`: per prompt plain decoding once, then each drafter), so both pair with the very same plain halves and
link one baseline run. `engine_jobs` queues the same two benches through the real engine (vLLM or SGLang, `kind:
bench` jobs for the GPU worker) instead. The result names both runs, tau of each with the paired 95% interval of the
difference over prompts (backend/metrics.tau_difference), whether greedy outputs stayed equal to plain decoding, and
the Compare link of the pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from backend import links, metrics
from backend.config import dashboard_link
from backend.drafter.fix import FixPlan
from backend.drafter.kinds import block_k
from backend.errors import SpecLensError
from backend.store.data_root import DataRoot


@dataclass
class Proof:
    original: str                    # bench run ids
    fixed: str
    baseline: str | None
    tau_original: float
    tau_fixed: float
    gain_ci: tuple[float, float] | None     # 95% paired interval of tau(fixed) - tau(original)
    lossless: bool | None
    compare: str                     # the dashboard path of the pair

    def lines(self) -> list[str]:
        ci = f" (95% CI {self.gain_ci[0]:+.2f} to {self.gain_ci[1]:+.2f})" if self.gain_ci else ""
        out = [f"original {self.original}: tau {self.tau_original:.2f}",
               f"fixed    {self.fixed}: tau {self.tau_fixed:.2f}, {self.tau_fixed - self.tau_original:+.2f}{ci}"]
        if self.lossless is not None:
            out.append("lossless: greedy outputs equal plain decoding" if self.lossless else
                       "NOT lossless: some greedy outputs differ from plain decoding")
        out.append(f"compare: {dashboard_link(self.compare)}")
        return out


def _per_prompt(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path / "prompts.parquet").groupby("prompt_id")[["accepted", "drafts"]].sum()


def prove(plan: FixPlan, fixed_dir: str | Path, prompts: str, limit: int | None = 32, repeats: int = 1,
          name: str | None = None, data: DataRoot | None = None, progress: bool = True, device: str = "auto",
          max_new_tokens: int = 64, num_spec_tokens: int | None = None, run_ids: tuple[str, str] | None = None,
          also: dict[str, str | Path] | None = None) -> Proof:
    """Bench the original and the fixed drafter through the HF reference engine as `plan`'s release feeds them.
    `run_ids`: the (original, fixed) run ids instead of `<name>-original` and `<name>-fixed`; `also`: more drafters
    of the same target (run id -> directory, e.g. a hand-made patch), benched between the two in the same loop, fed
    the same way and paired with the same plain halves (the demo's slot-shift case)."""
    from backend.bench import BenchSettings, run_benches

    base = name or f"prove-{Path(plan.drafter).name}"
    names = list(run_ids or (f"{base}-original", f"{base}-fixed"))
    extra = dict(also or {})
    drafters = [plan.drafter, *map(str, extra.values()), str(fixed_dir)]
    names = [names[0], *extra, names[1]]
    settings = []
    for drafter in drafters:
        k = num_spec_tokens or block_k(drafter)
        settings.append(BenchSettings(target=plan.target, drafter=drafter, prompts=prompts, limit=limit,
                                      repeats=repeats, producer=plan.engine, producer_version=plan.version,
                                      runner=plan.runner, device=device, max_new_tokens=max_new_tokens,
                                      **({"num_spec_tokens": k} if k else {})))
    ident = settings[0].baseline().identity()
    if all(s.baseline().identity() == ident for s in settings):       # one loop, one plain half per unit
        results = run_benches(settings, names, data=data, progress=progress)
    else:
        results = [run_benches([s], [n], data=data, progress=progress)[0] for s, n in zip(settings, names)]
    runs = {"original": results[0], "fixed": results[-1]}
    a, b = _per_prompt(runs["fixed"].path), _per_prompt(runs["original"].path)
    shared = a.index.intersection(b.index)
    ci = None
    if len(shared) >= 2:
        _, lo, hi = metrics.tau_difference(a.loc[shared].to_numpy(), b.loc[shared].to_numpy())
        ci = (lo, hi)
    ll = [r.lossless for r in runs.values()]
    lossless = None if any(x is None for x in ll) else all(ll)
    ids = [runs["fixed"].run_id, runs["original"].run_id]
    return Proof(runs["original"].run_id, runs["fixed"].run_id, runs["fixed"].baseline_run,
                 float(runs["original"].tau), float(runs["fixed"].tau), ci, lossless,
                 links.compare(ids))


def engine_jobs(plan: FixPlan, fixed_dir: str | Path, prompts: str, limit: int | None = 32, repeats: int = 1,
                name: str | None = None, data: DataRoot | None = None, engine: str | None = None) -> list[dict]:
    """Queue the two benches for a worker (`kind: bench`): through the real engine (the plan's; GPU worker) or, with
    engine="hf", the reference bench fed as that release feeds; the second reuses the first's paired baseline."""
    from backend.jobs import queue
    from backend.jobs import spec as specs

    engine = engine or plan.engine
    base = name or f"prove-{Path(plan.drafter).name}"
    jobs = []
    for tag, drafter in (("original", plan.drafter), ("fixed", str(fixed_dir))):
        spec = {"kind": "bench", "name": f"{base}-{engine}-{tag}", "engine": engine, "target": plan.target,
                "drafter": drafter, "prompts": prompts, "limit": limit, "repeats": repeats,
                "producer": plan.engine, "producer_version": plan.version}
        if block_k(drafter):                                     # DFlash: K = its block size - 1
            spec["num_spec_tokens"] = block_k(drafter)
        if engine == "hf":
            spec["device"] = "cpu"
            if plan.runner:
                spec["runner"] = plan.runner
        else:
            spec["dtype"] = "bf16"
        jobs += specs.validate(spec)
    return queue.enqueue(jobs, data)


def queue_proof(report: dict, data: DataRoot | None = None, prompts: str | None = None, limit: int = 32,
                engine: str = "hf") -> dict:
    """The Drafter check page's button: write the check's fix under <data>/models/fixes/<check run> and queue the
    two proof benches (`engine_jobs`) through `engine`: "hf", the reference bench on the CPU fed as the fix's release
    feeds, or that release's own engine (vLLM or SGLang, for the GPU worker), as `check-drafter --prove
    --prove-engine` does; {"fixed": dir, "jobs": [ids], "compare": path}. One-line errors (FixRefused, another
    engine than the fix's, and the job spec's) go up."""
    from backend.config import REPO_ROOT
    from backend.drafter.fix import FixRefused, write_fix

    fix = report.get("fix") or {}
    if "plan" not in fix:
        raise FixRefused(fix.get("refused") or "no fix written")
    plan = FixPlan(**fix["plan"])
    if engine not in ("hf", plan.engine):
        raise SpecLensError(f"engine {engine}: the fix is for {plan.engine_name}; prove it on hf or {plan.engine}")
    data = DataRoot.of(data)
    out = data.paths.models / "fixes" / (report.get("run_id") or "check")
    if not (out / "config.json").exists():
        write_fix(plan, out)
    prompts = prompts or str(REPO_ROOT / "datasets" / "spec_bench" / "question.jsonl")
    jobs = engine_jobs(plan, out, prompts, limit, 1, f"prove-{report.get('run_id') or 'check'}", data, engine=engine)
    ids = [j["job_id"] for j in jobs]
    return {"fixed": str(out), "jobs": ids, "compare": links.compare(list(reversed(ids)))}
