"""A speculative-decoding bench run: prompts x repeats through plain decoding or an EAGLE-3 drafter.

Spec-Bench methodology (REFERENCE section 5): every drafter run has a paired baseline run (the same
prompts and settings, plain decoding; created here or reused when one with identical settings exists
on this host), speedup = mean per-prompt tokens/s of the method / the same for the baseline per repeat,
reported as mean +- std over repeats with a 95% CI, and greedy outputs must equal the baseline's token for
token (`lossless`). Numbers come from backend/metrics.py; the loops from backend/engines/hf_spec.py.

Files (run directory, see docs/SCHEMA.md): manifest.json (kind "bench"), steps.parquet (run_id, repeat,
prompt_id, step, accepted), prompts.parquet (one row per repeat x prompt), summary.json (histogram,
per-position rates, per-category figures). While running, finished (repeat, prompt) units are appended to
`journal.jsonl`; the same command resumes after the last whole line, and the run is marked complete
only after every file is written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from backend import metrics
from backend.errors import SpecLensError
from backend.model_id import fingerprint
from backend.prompts import Prompt, encode_all, load_prompts
from backend.runs.lifecycle import Run, RunGuard
from backend.store.rundir import (COMPLETE, RUNNING, RunDir, atomic_write_json, atomic_write_parquet,
                                  list_run_dirs, new_run_id)

JOURNAL = "journal.jsonl"
SPEC_ONLY = ("drafter", "num_spec_tokens", "producer", "producer_version", "runner", "draft_sampling")


@dataclass
class BenchSettings:
    target: str
    prompts: str
    drafter: str | None = None
    num_spec_tokens: int = 4                 # K, vLLM num_speculative_tokens (chain)
    temperature: float = 0.0
    repeats: int = 3
    limit: int | None = None
    max_new_tokens: int = 64
    device: str = "auto"
    dtype: str = "fp32"
    seed: int = 0
    chat_template: bool = True
    max_prompt_tokens: int | None = 2048
    producer: str = "vllm"                   # whose reading of the drafter's aux ids to apply
    producer_version: str | None = "0.24.0"
    runner: str | None = None                # vLLM "v1"/"v2"/"auto": whose id reading (None = auto: as vLLM picks)
    draft_sampling: str = "sample"           # T > 0: "sample" (Leviathan) or "argmax" (vLLM V1)
    warmup: int = 1                          # untimed generations before the first unit
    engine: str = "hf"                       # hf (reference, any device) | vllm | sglang (GPU node)
    server_url: str | None = None            # vllm/sglang: a running server instead of an in-process engine
    tensor_parallel_size: int = 1
    engine_options: dict | None = None       # passed through to the engine (vllm.LLM kwargs, sglang flags)

    _ENGINE_DEFAULTS = {"engine": "hf", "server_url": None, "tensor_parallel_size": 1, "engine_options": None}

    def identity(self) -> dict:
        """What a resumed (or reused baseline) run must share; paths absolute, spec-only fields dropped
        for a baseline."""
        d = asdict(self)
        for k, v in self._ENGINE_DEFAULTS.items():   # HF runs keep the identity they had before engines existed
            if d.get(k) == v:
                d.pop(k)
        for k in ("target", "prompts", "drafter"):
            if d[k] is not None:
                d[k] = str(Path(d[k]).resolve())
        if self.drafter is None:
            for k in SPEC_ONLY:
                d.pop(k)
        return d

    def baseline(self) -> "BenchSettings":
        return dataclasses.replace(self, drafter=None)


@dataclass
class BenchResult:
    run_id: str
    path: Path
    status: str
    baseline_run: str | None
    tau: float | None = None
    acceptance_rate: float | None = None
    tokens_per_s: float | None = None
    speedup: dict | None = None
    lossless: bool | None = None
    mismatched_prompts: int | None = None


def run_bench(settings: BenchSettings, name: str | None = None, root: Path | None = None, progress: bool = True,
              stop_after: int | None = None, proposer=None) -> BenchResult:
    """Run (or resume) a bench. With a drafter, first creates or reuses the paired baseline run.
    `stop_after` stops this run after that many (repeat, prompt) units as an interruption would (tests);
    `proposer` replaces the drafter's proposals (tests of the bookkeeping; needs settings.drafter)."""
    from backend.engines import hf

    s = settings
    _validate(s)
    if s.engine != "hf":
        return _run_engine_bench(s, name, root, progress, stop_after)
    prompts = load_prompts(s.prompts, s.limit)
    lm = hf.load(s.target, s.device, s.dtype)
    seqs = _encode_all(lm, prompts, s)
    spec = _load_spec(lm, s, proposer) if s.drafter else None
    base = None
    if s.drafter:
        base = _ensure_baseline(lm, s.baseline(), prompts, seqs, name, root, progress)
        if base.status != COMPLETE:
            return base
    run_id = new_run_id("bench", name)
    rd, done = _open_or_resume(run_id, s, lm, spec, base, root, len(prompts))
    return _run(rd, lm, s, prompts, seqs, spec, base, done, root, progress, stop_after)


def _run_engine_bench(s: BenchSettings, name: str | None, root: Path | None, progress: bool,
                      stop_after: int | None) -> BenchResult:
    """The same bench through a serving engine (vLLM or SGLang): the same run directories, journal, paired baseline
    and metrics; only the generation of one unit differs (backend/engines/serving.py binds it). The target is
    tokenized here with its own HF tokenizer, so every engine sees the same prompt token ids."""
    from types import SimpleNamespace

    from backend.engines.base import engine_module, target_info
    from backend.engines.serving import bind, predicted_aux

    mod = engine_module(s.engine)
    installed = mod.require() if s.server_url is None else None      # a remote server says its release once up
    prompts = load_prompts(s.prompts, s.limit)
    info = target_info(s.target)
    seqs = _encode_all(info, prompts, s)
    options = {"tensor_parallel_size": s.tensor_parallel_size, **(s.engine_options or {})}
    pred = predicted_aux(s.drafter, info, s.engine, s.runner, options, installed) if s.drafter else None

    base = None
    if s.drafter:
        holder: dict = {}

        class _Lazy(SimpleNamespace):          # the baseline engine starts only if no baseline run can be reused
            def __getattr__(self, k):
                if k in ("engine_unit", "engine_version", "engine"):
                    if "lm" not in holder:
                        holder["eng"] = mod.make_engine(s, drafter=None, eos=info.eos)
                        holder["lm"] = bind(info, holder["eng"], s.engine)
                    return getattr(holder["lm"], k)
                raise AttributeError(k)
        try:
            base = _ensure_baseline(_Lazy(**vars(info)), s.baseline(), prompts, seqs, name, root, progress)
        finally:
            if "eng" in holder:
                holder["eng"].close()
        if base.status != COMPLETE:
            return base

    eng = mod.make_engine(s, drafter=s.drafter, eos=info.eos)
    try:
        lm = bind(info, eng, s.engine)
        spec = None
        if s.drafter:
            if eng.version and eng.version != installed:     # predict for the release that runs, not a default
                pred = predicted_aux(s.drafter, info, s.engine, s.runner, options, eng.version)
            live = eng.fed_boundaries(info.n_layers)
            aux = dict(pred["aux"], predicted=pred["aux"]["boundaries"], boundaries=live or pred["aux"]["boundaries"],
                       ids_from=f"{s.engine} engine (read from the running model)" if live else pred["aux"]["ids_from"],
                       engine_ids=eng.aux_ids())
            if live and live != pred["aux"]["boundaries"]:
                aux["warning"] = (f"{s.engine} feeds {','.join(live)}; SpecLens predicted "
                                  f"{','.join(pred['aux']['boundaries'])} from the config")
            spec = _Spec(None, aux, {"path": str(Path(s.drafter).resolve()), "format": pred["format"],
                                           "fingerprint": fingerprint(s.drafter),
                                           "semantics": s.engine, "draft_vocab_size": pred["draft_vocab_size"],
                                           "proposer": f"{s.engine} eagle3"})
        run_id = new_run_id("bench", name)
        rd, done = _open_or_resume(run_id, s, lm, spec, base, root, len(prompts))
        return _run(rd, lm, s, prompts, seqs, spec, base, done, root, progress, stop_after)
    finally:
        eng.close()


# ---------------------------------------------------------------------- input checks


def _validate(s: BenchSettings) -> None:
    if s.drafter is not None and s.num_spec_tokens < 1:
        raise SpecLensError(f"--num-spec-tokens {s.num_spec_tokens}: must be >= 1 (tokens drafted per step)")
    if s.repeats < 1:
        raise SpecLensError(f"--repeats {s.repeats}: must be >= 1")
    if s.max_new_tokens < 1:
        raise SpecLensError(f"--max-new-tokens {s.max_new_tokens}: must be >= 1")
    if s.limit is not None and s.limit < 1:
        raise SpecLensError(f"--limit {s.limit}: must be >= 1 (or leave it out for every prompt)")
    if s.temperature < 0:
        raise SpecLensError(f"--temperature {s.temperature}: must be >= 0 (0 = greedy)")


def _encode_all(lm, prompts: list[Prompt], s: BenchSettings) -> list[list[int]]:
    if s.chat_template and not getattr(lm.tokenizer, "chat_template", None):
        raise SpecLensError(f"{s.target}: the tokenizer has no chat template but the prompts are chat turns; add a "
                            "chat_template to the tokenizer or pass --no-chat-template")
    return encode_all(lm.tokenizer, prompts, s.prompts, s.chat_template, s.max_prompt_tokens)


@dataclass
class _Spec:
    proposer: object
    aux: dict                 # ids, ids_from, boundaries, producer, version, runner
    drafter_info: dict


def _load_spec(lm, s: BenchSettings, proposer=None) -> _Spec:
    from backend.drafter import Eagle3Drafter
    from backend.drafter.aux import engine_feeds
    from backend.engines.hf_spec import EagleProposer

    engine = s.producer if s.producer in ("vllm", "sglang") else "vllm"
    embed, head = lm.model.get_input_embeddings(), lm.model.get_output_embeddings()
    drafter = Eagle3Drafter.load(s.drafter, target_embed=embed.weight, target_lm_head=getattr(head, "weight", None),
                                 engine=engine, dtype=lm.dtype)
    drafter.check_target(lm.config, s.target)
    aux = engine_feeds(drafter.cfg, lm.n_layers, getattr(lm.config, "model_type", None),
                       getattr(lm.config, "architectures", None), s.producer, s.producer_version, s.runner,
                       {"tensor_parallel_size": s.tensor_parallel_size, **(s.engine_options or {})})
    drafter.to(lm.device)
    info = {"path": str(Path(s.drafter).resolve()), "fingerprint": fingerprint(s.drafter),
            "format": drafter.cfg.source_format,
            "semantics": engine, "draft_vocab_size": drafter.cfg.draft_vocab_size,
            "proposer": "eagle3" if proposer is None else type(proposer).__name__}
    return _Spec(proposer or EagleProposer(drafter, s.draft_sampling), aux, info)


# ---------------------------------------------------------------------- run directories


def _manifest(s: BenchSettings, lm, spec: _Spec | None, base: BenchResult | None, n_prompts: int) -> dict:
    return {
        "kind": "bench", "engine": getattr(lm, "engine", "hf"),
        "engine_version": getattr(lm, "engine_version", None) or _transformers_version(),
        "model": {"path": str(Path(s.target).resolve()), "model_type": getattr(lm.config, "model_type", None),
                  "n_layers": lm.n_layers, "hidden_size": lm.hidden_size,
                  "vocab_size": int(getattr(lm.config, "vocab_size", 0)), "fingerprint": fingerprint(s.target)},
        "drafter": spec.drafter_info if spec else None, "aux": spec.aux if spec else None,
        "dtype": s.dtype, "device": str(lm.device), "dataset": Path(s.prompts).name,
        "settings": s.identity(), "repeats": s.repeats, "num_spec_tokens": s.num_spec_tokens if spec else 0,
        "temperature": s.temperature, "baseline_run": base.run_id if base else None,
        "progress": {"done": 0, "total": n_prompts * s.repeats},
    }


def _open_or_resume(run_id: str, s: BenchSettings, lm, spec, base, root, n_prompts: int) -> tuple[Run, list[dict]]:
    manifest = _manifest(s, lm, spec, base, n_prompts)
    try:
        return Run.create(run_id, manifest, root), []
    except SpecLensError:
        rd = Run.open(run_id, root)
    m = rd.manifest()
    if m.get("status") == COMPLETE:
        raise SpecLensError(f"run '{run_id}' is already complete ({rd.path}); pick another --name")
    if m.get("kind") != "bench" or m.get("settings") != s.identity():
        raise SpecLensError(f"run '{run_id}' was started with other settings ({rd.manifest_path}); "
                            "resume it with the same options or pick another --name")
    done = _read_journal(rd)
    rd.claim(baseline_run=manifest["baseline_run"], progress={"done": len(done), "total": n_prompts * s.repeats})
    return rd, done


def _read_journal(rd: RunDir) -> list[dict]:
    """Finished units; a torn last line (the process died mid-write) is dropped."""
    p = rd.file(JOURNAL)
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def _ensure_baseline(lm, bs: BenchSettings, prompts, seqs, name, root, progress) -> BenchResult:
    """Reuse a complete baseline with identical settings from this host, resume an unfinished one, or run one.
    One process at a time per settings (a file lock under the data root): jobs of a sweep that start together
    share one baseline instead of each running its own."""
    import fcntl

    from backend.config import paths

    key = hashlib.blake2b(json.dumps(bs.identity(), sort_keys=True).encode(), digest_size=8).hexdigest()
    lock = paths(root).root / "locks" / f"baseline-{socket.gethostname()}-{key}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)          # released when the file closes, also if this process dies
        return _find_or_run_baseline(lm, bs, prompts, seqs, name, root, progress)


def _find_or_run_baseline(lm, bs: BenchSettings, prompts, seqs, name, root, progress) -> BenchResult:
    ident, host, unfinished = bs.identity(), socket.gethostname(), None
    for rd in list_run_dirs(root):
        try:
            m = rd.manifest()
        except SpecLensError:
            continue
        if m.get("kind") != "bench" or m.get("settings") != ident or m.get("host") != host:
            continue
        if m.get("status") == COMPLETE:
            return _result_of(rd, m)
        if rd.effective_status(m) != RUNNING:
            unfinished = rd
    if unfinished is not None:
        run_id = unfinished.run_id
    else:
        run_id = f"{name}-baseline" if name else new_run_id("bench-baseline", None)
        if _exists(run_id, root):
            run_id = new_run_id("bench-baseline", None)
    rd, done = _open_or_resume(run_id, bs, lm, None, None, root, len(prompts))
    return _run(rd, lm, bs, prompts, seqs, None, None, done, root, progress, None)


def _exists(run_id: str, root) -> bool:
    from backend.config import paths

    return (paths(root).runs / run_id / "manifest.json").exists()


def _result_of(rd: RunDir, m: dict) -> BenchResult:
    b = m.get("bench") or {}
    return BenchResult(rd.run_id, rd.path, m.get("status"), m.get("baseline_run"), b.get("tau"),
                       b.get("acceptance_rate"), b.get("tokens_per_s"), b.get("speedup"), b.get("lossless"),
                       b.get("mismatched_prompts"))


# ---------------------------------------------------------------------- the loop


def unit_seed(seed: int, repeat: int, prompt_index: int) -> int:
    """One generator seed per (repeat, prompt): a resumed run draws the same numbers."""
    return (seed * 1_000_003 + repeat * 10_007 + prompt_index) % (2**63)


def output_hash(tokens: list[int]) -> str:
    return hashlib.blake2b(json.dumps(tokens).encode(), digest_size=8).hexdigest()


def run_unit(lm, s: BenchSettings, spec: _Spec | None, aux_capture, prompt: list[int], seed: int):
    """One generation, plain or speculative (the only code between the bench and the decoding loop)."""
    if getattr(lm, "engine_unit", None) is not None:        # vLLM / SGLang: one request through the engine
        return lm.engine_unit(prompt, s, seed)
    from backend.engines.hf_spec import decode_plain, decode_spec, eos_ids, seeded_sampler

    sampler = seeded_sampler(s.temperature, seed, lm.device)
    if spec is None:
        return decode_plain(lm, prompt, s.max_new_tokens, sampler, eos_ids(lm))
    return decode_spec(lm, spec.proposer, aux_capture, prompt, s.num_spec_tokens, s.max_new_tokens, sampler,
                       eos_ids(lm))


def _row(run_id: str, r: int, i: int, p: Prompt, n_prompt: int, gen) -> dict:
    t = metrics.RequestTiming(len(gen.tokens), gen.seconds, gen.ttft)
    return {"run_id": run_id, "repeat": r, "prompt_index": i, "prompt_id": p.id, "category": p.category,
            "prompt_tokens": n_prompt, "output_tokens": len(gen.tokens), "seconds": gen.seconds,
            "tokens_per_s": t.tokens_per_s, "ttft": gen.ttft, "tpot": t.tpot, "accepted": int(sum(gen.accepted)),
            "drafts": len(gen.accepted), "output_hash": output_hash(gen.tokens)}


def _run(rd: Run, lm, s: BenchSettings, prompts, seqs, spec, base, done: list[dict], root, progress,
         stop_after) -> BenchResult:
    from backend.engines.hf_spec import AuxCapture

    units = [(r, i) for r in range(s.repeats) for i in range(len(prompts))]
    finished = {(u["row"]["repeat"], u["row"]["prompt_index"]) for u in done}
    aux = AuxCapture(lm, spec.aux["boundaries"]) if spec and spec.proposer is not None else None
    t_manifest, ran = time.monotonic(), 0
    what = "speculative" if spec else "baseline"
    guard = RunGuard(rd, save=lambda: rd.progress(len(done), len(units), checkpoint=True),
                     save_on_error=False, keep_interrupt=stop_after is not None,
                     interrupted=lambda: f"interrupted after {len(done)}/{len(units)} generations; run the same "
                                         f"command again to resume")
    try:
        with guard:
            for _ in range(s.warmup):
                run_unit(lm, s, spec, aux, seqs[0], s.seed)
            with open(rd.file(JOURNAL), "a") as journal:
                bar = tqdm(total=len(units), initial=len(finished), desc=f"bench {rd.run_id} ({what})", unit="gen",
                           disable=not progress, file=sys.stderr)
                for r, i in units:
                    if (r, i) in finished:
                        continue
                    gen = run_unit(lm, s, spec, aux, seqs[i], unit_seed(s.seed, r, i))
                    unit = {"row": _row(rd.run_id, r, i, prompts[i], len(seqs[i]), gen), "accepted": gen.accepted}
                    journal.write(json.dumps(unit) + "\n")
                    journal.flush()
                    done.append(unit)
                    ran += 1
                    bar.update(1)
                    if time.monotonic() - t_manifest > 2.0:
                        rd.progress(len(done), len(units))
                        t_manifest = time.monotonic()
                    if stop_after is not None and ran >= stop_after and len(done) < len(units):
                        raise KeyboardInterrupt
                bar.close()
    finally:
        if aux is not None:
            aux.close()
    if guard.interrupted:                 # stop_after reached (tests of resume): the run stays failed, resumable
        return BenchResult(rd.run_id, rd.path, "failed", base.run_id if base else None)
    return _finish(rd, s, spec, base, done, root)


# ---------------------------------------------------------------------- results


def _finish(rd: Run, s: BenchSettings, spec, base: BenchResult | None, done: list[dict], root) -> BenchResult:
    done = sorted(done, key=lambda u: (u["row"]["repeat"], u["row"]["prompt_index"]))
    prompts_df = pd.DataFrame([u["row"] for u in done])
    steps_df = pd.DataFrame(
        [(rd.run_id, u["row"]["repeat"], u["row"]["prompt_id"], k, n)
         for u in done for k, n in enumerate(u["accepted"])],
        columns=["run_id", "repeat", "prompt_id", "step", "accepted"]).astype({"repeat": "int64", "step": "int64",
                                                                                 "accepted": "int64"})
    K = s.num_spec_tokens if spec else 0
    acc = metrics.from_accepted_lengths(steps_df["accepted"].tolist(), K) if spec else None
    tps = float(prompts_df["tokens_per_s"].mean())
    fig = {"tau": acc.tau if acc else 1.0, "acceptance_rate": acc.acceptance_rate if acc else None,
           "tokens_per_s": tps, "throughput": metrics.throughput(int(prompts_df["output_tokens"].sum()),
                                                                 float(prompts_df["seconds"].sum())),
           "ttft": float(prompts_df["ttft"].mean()), "tpot": _mean(prompts_df["tpot"]),
           "speedup": None, "lossless": None, "mismatched_prompts": None}
    per_cat_speedup: dict[str, float] = {}
    if base is not None:
        bdf = pd.read_parquet(base.path / "prompts.parquet")
        key = ["repeat", "prompt_index"]
        pair = prompts_df.merge(bdf[key + ["tokens_per_s", "output_hash"]], on=key, suffixes=("", "_base"))
        R = s.repeats
        m_tps = [pair[pair.repeat == r]["tokens_per_s"].tolist() for r in range(R)]
        b_tps = [pair[pair.repeat == r]["tokens_per_s_base"].tolist() for r in range(R)]
        fig["speedup"] = metrics.speedup(m_tps, b_tps, seed=s.seed).to_dict()
        for cat, g in pair.groupby("category"):
            per_cat_speedup[str(cat)] = float(g["tokens_per_s"].mean() / g["tokens_per_s_base"].mean())
        if s.temperature == 0.0:
            bad = pair[pair["output_hash"] != pair["output_hash_base"]]["prompt_id"].nunique()
            fig["lossless"], fig["mismatched_prompts"] = bool(bad == 0), int(bad)
    atomic_write_parquet(rd.file("steps.parquet"), steps_df)
    atomic_write_parquet(rd.file("prompts.parquet"), prompts_df)
    atomic_write_json(rd.file("summary.json"), _summary(prompts_df, steps_df, K, acc, fig, per_cat_speedup))
    headline = {"tokens": int(prompts_df["output_tokens"].sum()), "prompts": int(prompts_df["prompt_id"].nunique()),
                "seconds": round(float(prompts_df["seconds"].sum()), 3)}
    rd.complete(drop=(JOURNAL,), progress={"done": len(done), "total": len(done)}, headline=headline, bench=fig)
    return BenchResult(rd.run_id, rd.path, COMPLETE, base.run_id if base else None, fig["tau"],
                       fig["acceptance_rate"], tps, fig["speedup"], fig["lossless"], fig["mismatched_prompts"])


def _mean(col: pd.Series) -> float | None:
    col = col.dropna()
    return float(col.mean()) if len(col) else None


def _summary(prompts_df: pd.DataFrame, steps_df: pd.DataFrame, K: int, acc, fig: dict,
             per_cat_speedup: dict[str, float]) -> dict:
    cats = {}
    for cat, g in prompts_df.groupby("category"):
        a = metrics.from_accepted_lengths(steps_df[steps_df.prompt_id.isin(g.prompt_id)]["accepted"].tolist(), K) \
            if acc else None
        cats[str(cat)] = {"prompts": int(g["prompt_id"].nunique()), "output_tokens": int(g["output_tokens"].sum()),
                          "tokens_per_s": float(g["tokens_per_s"].mean()), "ttft": float(g["ttft"].mean()),
                          "tpot": _mean(g["tpot"]), "tau": a.tau if a else 1.0,
                          "acceptance_rate": a.acceptance_rate if a else None,
                          "speedup": per_cat_speedup.get(str(cat))}
    return {"num_spec_tokens": K, "histogram": acc.hist if acc else None,
            "per_position": {"counts": acc.per_pos, "rates": acc.per_pos_rate} if acc else None,
            "acceptance": acc.to_dict() if acc else None, "figures": fig, "per_category": cats}


def _transformers_version() -> str | None:
    try:
        import transformers
        return f"transformers {transformers.__version__}"
    except ImportError:  # pragma: no cover
        return None
