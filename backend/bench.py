"""A speculative-decoding bench run: prompts x repeats through plain decoding or an EAGLE-3 drafter.

Spec-Bench methodology (speedup and acceptance: backend/metrics.py) with the baseline timed beside the drafter: a
drafter bench decodes every (repeat, prompt) unit twice, back to back in this one process, plain decoding and the
drafter, alternating which goes first from one unit to the next, in an order shuffled within each repeat (seeded), so
that a slow or fast moment of the machine hits both sides (`run_benches`: several drafters of the same settings in
one loop, each unit decoding plain once and then every drafter, all paired with that same plain half). speedup = mean
per-prompt tokens/s of the drafter / the same of plain decoding per repeat, from those interleaved pairs only,
reported as mean +- std over repeats with a 95% CI; greedy outputs must equal plain decoding's token for token
(`lossless`). The pairs are stored in the drafter run's prompts.parquet (`base_*` columns). The run also links a
paired baseline run (`baseline_run`, what Compare and the run page show as plain decoding): a complete one with
identical settings from this host when there is one, else one written here from the plain half of the pairs. Every
unit records the machine's load (1-minute load average, CPU utilisation, the cores other processes and other SpecLens
processes used); `bench.speed_noise` says when the speed figures are no verdict (backend/metrics.py: speed_noise).
Numbers come from backend/metrics.py; the loops from backend/engines/hf_spec.py.

Engine benches (vLLM, SGLang) still run their baseline engine before the drafter engine (two engines rarely fit one
GPU): `pairing` "separate", and the noise check compares the two moments' prefill (metrics.moment_ratio).

Files (run directory, see docs/SCHEMA.md): manifest.json (kind "bench"), steps.parquet (run_id, repeat,
prompt_id, step, accepted), prompts.parquet (one row per repeat x prompt), summary.json (histogram,
per-position rates, per-category figures). While running, finished (repeat, prompt) units (both halves of a pair)
are appended to the drafter run's `journal.jsonl`; the same command resumes after the last whole line (the baseline
run it writes resumes with it), and the runs are marked complete only after every file is written, the baseline
first.
"""

from __future__ import annotations

import hashlib
import json
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from backend import metrics
from backend.errors import SpecLensError
from backend.machine_load import LoadProbe  # noqa: F401 (re-exported: tests)
from backend.model_id import fingerprint, identity
from backend.options import SERVING_ENGINES
from backend.prompts import Prompt, encode_all, load_prompts
from backend.runs.lifecycle import Run, RunGuard
from backend.runs.manifest import Bench, Manifest, StoredBenchSettings, StoredManifest
from backend.settings import SPEC_ONLY, BenchSettings  # noqa: F401 (SPEC_ONLY: re-exported)
from backend.store.data_root import DataRoot
from backend.store.rundir import (
    COMPLETE,
    RUNNING,
    RunDir,
    atomic_write_json,
    atomic_write_parquet,
    new_run_id,
    read_journal,
)

JOURNAL = "journal.jsonl"


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


def run_bench(settings: BenchSettings, name: str | None = None, data: DataRoot | None = None, progress: bool = True,
              stop_after: int | None = None, proposer=None) -> BenchResult:
    """Run (or resume) a bench. With a drafter, every unit decodes plain and speculative back to back (the pairs the
    speedup comes from); the paired baseline run is reused or written from the plain half (`_pair_baseline`).
    `stop_after` stops this run after that many (repeat, prompt) units as an interruption would (tests);
    `proposer` replaces the drafter's proposals (tests of the bookkeeping; needs settings.drafter)."""

    s = settings
    data = DataRoot.of(data)
    _validate(s)
    if s.engine != "hf":
        return _run_engine_bench(s, name, data, progress, stop_after)
    return _hf_runs([s], [name], data, progress, stop_after, proposer)[0]


def run_benches(settings: list[BenchSettings], names: list[str | None], data: DataRoot | None = None,
                progress: bool = True, stop_after: int | None = None) -> list[BenchResult]:
    """Several drafters on one target with the same prompts and decoding settings, benched in one loop (HF engine):
    per unit plain decoding once and every drafter back to back (`_run_arms`), each drafter run paired with that
    shared plain half and all of them linking one baseline run. Each run is the run `run_bench` would write (its own
    directory, journal, resume and figures); the plain half is decoded once per unit instead of once per drafter.
    Other engines, or one drafter: `run_bench` one after another."""

    data = DataRoot.of(data)
    if len(settings) != len(names):
        raise SpecLensError(f"{len(settings)} bench settings but {len(names)} names")
    for s in settings:
        _validate(s)
    if len(settings) < 2 or any(s.engine != "hf" or not s.drafter for s in settings):
        return [run_bench(s, name=n, data=data, progress=progress, stop_after=stop_after)
                for s, n in zip(settings, names)]
    ident = settings[0].baseline().identity()
    odd = [n or s.drafter for s, n in zip(settings, names) if s.baseline().identity() != ident]
    if odd:
        raise SpecLensError(f"bench {odd[0]} differs from {names[0] or settings[0].drafter} in more than its drafter "
                            f"(target, prompts or decoding settings); bench it on its own")
    return _hf_runs(settings, names, data, progress, stop_after)


def _hf_runs(settings: list[BenchSettings], names: list[str | None], data: DataRoot, progress: bool,
             stop_after: int | None, proposer=None) -> list[BenchResult]:
    """Runs of one target, prompts and decoding settings on the HF engine, in one loop (`_run_arms`): the target
    loaded and the prompts encoded once; drafter runs link the first one's paired baseline (reused, or written from
    the shared plain halves); a run without a drafter is a plain-decoding baseline run."""
    from backend.engines import hf

    s0 = settings[0]
    prompts = load_prompts(s0.prompts, s0.limit)
    lm = hf.load(s0.target, s0.device, s0.dtype)
    seqs = _encode_all(lm, prompts, s0)
    arms, base, writer = [], None, None
    for k, (s, name) in enumerate(zip(settings, names)):
        spec = _load_spec(lm, s, proposer) if s.drafter else None
        run_id = new_run_id("bench", name)
        if spec is not None and k == 0:
            base, writer = _pair_baseline(run_id, s, lm, len(prompts), name, data)
        rd, done = _open_or_resume(run_id, s, lm, spec, base, data, len(prompts),
                                   pairing=INTERLEAVED if spec is not None else None)
        arms.append(_Arm(rd, s, spec, done))
    return _run_arms(arms, lm, prompts, seqs, base, data, progress, stop_after, writer)


def _pair_baseline(run_id: str, s: BenchSettings, lm, n_prompts: int, name: str | None, data: DataRoot
                   ) -> tuple[BenchResult, Run | None]:
    """The baseline run a drafter run links (`baseline_run`) and, when this bench writes it from the plain half of its
    pairs, its Run (else None). A resumed drafter run keeps the baseline its manifest names; a new one links a
    complete baseline with identical settings from this host, else one another bench of the same settings is writing
    now (status running: `_await_baseline` waits for it before the run completes; benches of a sweep that start
    together share one), else creates `<name>-baseline` (claimed again when an unfinished one of the same settings is
    there: a kill between the two creations), else a new id. One process decides at a time (a file lock per
    settings under the data root)."""
    bs = s.baseline()
    with _baseline_lock(bs, data):
        if _exists(run_id, data):
            rd = data.run_dir(run_id)
            m = rd.read()
            _check_resumable(rd, m, s)
            b = m.baseline_run
            if b is not None and _exists(b, data):
                got = _link_or_claim(b, lm, bs, n_prompts, data)
                if got is not None:
                    return got
        ident, host, running = StoredBenchSettings.identity_of(bs), socket.gethostname(), None
        for rd in data.run_dirs():
            try:
                m = rd.read()
            except SpecLensError:
                continue
            if m.kind == "bench" and m.settings == ident and m.host == host:
                if m.status == COMPLETE:
                    return _result_of(rd, m), None
                if running is None and rd.effective_status(m) == RUNNING:
                    running = rd
        if running is not None:
            return BenchResult(running.run_id, running.path, RUNNING, None), None
        return _new_baseline(lm, bs, n_prompts, name, data)


def _link_or_claim(run_id: str, lm, bs: BenchSettings, n_prompts: int, data: DataRoot
                   ) -> tuple[BenchResult, Run | None] | None:
    """A named baseline run: complete -> linked; being written by a live process -> linked, waited for; unfinished
    and left (its writer died) with the same settings -> claimed, to be written by this bench; else None."""
    brd = data.run_dir(run_id)
    bm = brd.read()
    if bm.status == COMPLETE:
        return _result_of(brd, bm), None
    if bm.kind != "bench" or bm.settings != StoredBenchSettings.identity_of(bs):
        return None
    if brd.effective_status(bm) == RUNNING:
        return BenchResult(run_id, brd.path, RUNNING, None), None
    writer = Run.open(run_id, data)
    writer.claim(progress={"done": 0, "total": n_prompts * bs.repeats})
    return BenchResult(run_id, writer.path, RUNNING, None), writer


def _new_baseline(lm, bs: BenchSettings, n_prompts: int, name: str | None, data: DataRoot) -> tuple[BenchResult, Run]:
    base_id = f"{name}-baseline" if name else new_run_id("bench-baseline", None)
    if _exists(base_id, data):
        try:
            got = _link_or_claim(base_id, lm, bs, n_prompts, data)
        except SpecLensError:
            got = None
        if got is not None and got[1] is not None:
            return got
        base_id = new_run_id("bench-baseline", None)
    writer = Run.create(base_id, _manifest(bs, lm, None, None, n_prompts), data)
    return BenchResult(base_id, writer.path, RUNNING, None), writer


def _baseline_lock(bs: BenchSettings, data: DataRoot):
    """An exclusive file lock per baseline settings on this host (released when the file closes, also if the process
    dies): two benches of the same settings never both decide to write the baseline."""
    import contextlib
    import fcntl

    key = hashlib.blake2b(json.dumps(bs.identity(), sort_keys=True).encode(), digest_size=8).hexdigest()
    lock = data.path / "locks" / f"baseline-{socket.gethostname()}-{key}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def held():
        with open(lock, "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield
    return held()


def _await_baseline(rd: Run, base: BenchResult, lm, s: BenchSettings, n_prompts: int, data: DataRoot, started: float
                    ) -> tuple[BenchResult, Run | None]:
    """Before a drafter run completes: the baseline run it links, being written by another bench of the same settings,
    complete (waited for, at most max(60 s, twice this run's own time)); when its writer died or took too long, this
    bench writes its own from its pairs (`<run>-baseline`) and links that instead."""
    limit = time.monotonic() + max(60.0, 2 * (time.monotonic() - started))
    while time.monotonic() < limit:
        try:
            brd = data.run_dir(base.run_id)
            bm = brd.read()
        except SpecLensError:
            break
        if bm.status == COMPLETE:
            return _result_of(brd, bm), None
        if brd.effective_status(bm) != RUNNING:
            break
        time.sleep(0.5)
    bs = s.baseline()
    with _baseline_lock(bs, data):
        base, writer = _new_baseline(lm, bs, n_prompts, rd.run_id, data)
    rd.record(baseline_run=base.run_id)
    return base, writer


def _run_engine_bench(s: BenchSettings, name: str | None, data: DataRoot, progress: bool,
                      stop_after: int | None) -> BenchResult:
    """The same bench through a serving engine (vLLM or SGLang): the same run directories, journal, paired baseline
    and metrics; only the generation of one unit differs (backend/engines/serving.py binds it). The target is
    tokenized here with its own HF tokenizer, so every engine sees the same prompt token ids."""
    from types import SimpleNamespace

    from backend.drafter.kinds import serving_method
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
                        holder["eng"] = mod.make_engine(s.engine_settings(), drafter=None, eos=info.eos)
                        holder["lm"] = bind(info, holder["eng"], s.engine)
                    return getattr(holder["lm"], k)
                raise AttributeError(k)
        try:
            base = _ensure_baseline(_Lazy(**vars(info)), s.baseline(), prompts, seqs, name, data, progress)
        finally:
            if "eng" in holder:
                holder["eng"].close()
        if base.status != COMPLETE:
            return base

    eng = mod.make_engine(s.engine_settings(), drafter=s.drafter, eos=info.eos)
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
                                           **identity(s.drafter),
                                           "semantics": s.engine, "draft_vocab_size": pred["draft_vocab_size"],
                                           "proposer": f"{s.engine} {serving_method(s.drafter, s.engine).lower()}"})
        run_id = new_run_id("bench", name)
        rd, done = _open_or_resume(run_id, s, lm, spec, base, data, len(prompts), pairing=SEPARATE)
        return _run(rd, lm, s, prompts, seqs, spec, base, done, data, progress, stop_after)
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

    engine = s.producer if s.producer in SERVING_ENGINES else "vllm"
    embed, head = lm.model.get_input_embeddings(), lm.model.get_output_embeddings()
    drafter = Eagle3Drafter.load(s.drafter, target_embed=embed.weight, target_lm_head=getattr(head, "weight", None),
                                 engine=engine, dtype=lm.dtype)
    drafter.check_target(lm.config, s.target)
    if getattr(drafter, "kind", "eagle3") == "dflash":       # block drafting: backend/engines/hf_spec.DFlashProposer
        return _dflash_spec(lm, s, drafter, engine, proposer)
    aux = engine_feeds(drafter.cfg, lm.n_layers, getattr(lm.config, "model_type", None),
                       getattr(lm.config, "architectures", None), s.producer, s.producer_version, s.runner,
                       {"tensor_parallel_size": s.tensor_parallel_size, **(s.engine_options or {})})
    drafter.to(lm.device)
    info = {"path": str(Path(s.drafter).resolve()), **identity(s.drafter),
            "format": drafter.cfg.source_format,
            "semantics": engine, "draft_vocab_size": drafter.cfg.draft_vocab_size,
            "proposer": "eagle3" if proposer is None else type(proposer).__name__}
    return _Spec(proposer or EagleProposer(drafter, s.draft_sampling), aux, info)


def _dflash_spec(lm, s: BenchSettings, drafter, engine: str, proposer=None) -> _Spec:
    """A DFlash drafter fed what `s.producer` `s.producer_version` feeds it (backend/drafter/kinds.py)."""
    from backend.drafter.dflash import feeds
    from backend.engines.hf_spec import DFlashProposer

    aux = feeds(s.drafter, lm.config, lm.n_layers, s.producer, s.producer_version, s.runner,
                {"tensor_parallel_size": s.tensor_parallel_size, **(s.engine_options or {})})
    drafter.to(lm.device)
    info = {"path": str(Path(s.drafter).resolve()), **identity(s.drafter), "format": "dflash",
            "semantics": engine, "draft_vocab_size": drafter.cfg.vocab_size, "block_size": drafter.cfg.block_size,
            "proposer": "dflash" if proposer is None else type(proposer).__name__}
    return _Spec(proposer or DFlashProposer(drafter), aux, info)


# ---------------------------------------------------------------------- run directories


INTERLEAVED, SEPARATE = "interleaved", "separate"     # how a drafter run's baseline was timed (manifest `pairing`)


def _manifest(s: BenchSettings, lm, spec: _Spec | None, base: BenchResult | None, n_prompts: int,
              pairing: str | None = None) -> dict:
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
        "pairing": pairing if spec else None,
        "progress": {"done": 0, "total": n_prompts * s.repeats},
    }


def _check_resumable(rd: RunDir, m: StoredManifest, s: BenchSettings) -> None:
    if m.status == COMPLETE:
        raise SpecLensError(f"run '{rd.run_id}' is already complete ({rd.path}); pick another --name")
    if m.kind != "bench" or m.settings != StoredBenchSettings.identity_of(s):
        raise SpecLensError(f"run '{rd.run_id}' was started with other settings ({rd.manifest_path}); "
                            "resume it with the same options or pick another --name")


def _open_or_resume(run_id: str, s: BenchSettings, lm, spec, base, data: DataRoot, n_prompts: int,
                    pairing: str | None = None) -> tuple[Run, list[dict]]:
    manifest = Manifest.of(_manifest(s, lm, spec, base, n_prompts, pairing), run_id)
    try:
        return Run.create(run_id, manifest, data), []
    except SpecLensError:
        rd = Run.open(run_id, data)
    _check_resumable(rd.rd, rd.read(), s)
    done = _read_journal(rd)
    rd.claim(baseline_run=manifest.baseline_run, pairing=manifest.pairing,
             progress={"done": len(done), "total": n_prompts * s.repeats})
    return rd, done


def _read_journal(rd: RunDir) -> list[dict]:
    """Finished units (rundir.read_journal: a torn last line is dropped)."""
    return read_journal(rd.file(JOURNAL))


def _ensure_baseline(lm, bs: BenchSettings, prompts, seqs, name, data: DataRoot, progress) -> BenchResult:
    """Engine benches: reuse a complete baseline with identical settings from this host, resume an unfinished one, or
    run one (before the drafter engine starts). One process at a time per settings (`_baseline_lock`): jobs of a sweep
    that start together share one baseline instead of each running its own."""
    with _baseline_lock(bs, data):
        return _find_or_run_baseline(lm, bs, prompts, seqs, name, data, progress)


def _find_or_run_baseline(lm, bs: BenchSettings, prompts, seqs, name, data: DataRoot, progress) -> BenchResult:
    ident, host, unfinished = StoredBenchSettings.identity_of(bs), socket.gethostname(), None
    for rd in data.run_dirs():
        try:
            m = rd.read()
        except SpecLensError:
            continue
        if m.kind != "bench" or m.settings != ident or m.host != host:
            continue
        if m.status == COMPLETE:
            return _result_of(rd, m)
        if rd.effective_status(m) != RUNNING:
            unfinished = rd
    if unfinished is not None:
        run_id = unfinished.run_id
    else:
        run_id = f"{name}-baseline" if name else new_run_id("bench-baseline", None)
        if _exists(run_id, data):
            run_id = new_run_id("bench-baseline", None)
    rd, done = _open_or_resume(run_id, bs, lm, None, None, data, len(prompts))
    return _run(rd, lm, bs, prompts, seqs, None, None, done, data, progress, None)


def _exists(run_id: str, data: DataRoot) -> bool:
    return (data.runs / run_id / "manifest.json").exists()


def _result_of(rd: RunDir, m: StoredManifest) -> BenchResult:
    b = m.bench or Bench()
    return BenchResult(rd.run_id, rd.path, m.status, m.baseline_run, b.tau, b.acceptance_rate, b.tokens_per_s,
                       b.speedup.to_json() if b.speedup is not None else None, b.lossless, b.mismatched_prompts)


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


def unit_plan(seed: int, repeats: int, n_prompts: int) -> list[tuple[int, int]]:
    """(repeat, prompt index) in execution order: repeat by repeat, the prompts of each shuffled (seeded, so a resumed
    run keeps its order). Spec-Bench files list prompts category by category; in their file order a drift of the
    machine and a change of category would look alike (metrics.timing_drift)."""
    import random

    out = []
    for r in range(repeats):
        order = list(range(n_prompts))
        random.Random(f"{seed}:{r}").shuffle(order)
        out += [(r, i) for i in order]
    return out


def _row(run_id: str, r: int, i: int, p: Prompt, n_prompt: int, gen) -> dict:
    t = metrics.RequestTiming(len(gen.tokens), gen.seconds, gen.ttft)
    return {"run_id": run_id, "repeat": r, "prompt_index": i, "prompt_id": p.id, "category": p.category,
            "prompt_tokens": n_prompt, "output_tokens": len(gen.tokens), "seconds": gen.seconds,
            "tokens_per_s": t.tokens_per_s, "ttft": gen.ttft, "tpot": t.tpot, "accepted": int(sum(gen.accepted)),
            "drafts": len(gen.accepted), "output_hash": output_hash(gen.tokens)}


BASE_COLUMNS = ("output_tokens", "seconds", "tokens_per_s", "ttft", "tpot", "output_hash")   # paired: base_<col>
LOAD_COLUMNS = ("load1", "cpu_util", "other_cpu", "speclens_cpu", "speclens_procs")


@dataclass
class _Arm:
    """One run of a bench loop: its run directory, settings, drafter (None: plain decoding) and finished units."""
    rd: Run
    s: BenchSettings
    spec: _Spec | None
    done: list[dict]
    aux: object = None                 # its AuxCapture (hooks on the target only while this arm decodes)
    finished: set | None = None


def _run(rd: Run, lm, s: BenchSettings, prompts, seqs, spec, base, done: list[dict], data: DataRoot, progress,
         stop_after, writer: Run | None = None) -> BenchResult:
    """One run's units (`_run_arms` with one arm)."""
    return _run_arms([_Arm(rd, s, spec, done)], lm, prompts, seqs, base, data, progress, stop_after, writer)[0]


def _run_arms(arms: list[_Arm], lm, prompts, seqs, base, data: DataRoot, progress, stop_after,
              writer: Run | None = None) -> list[BenchResult]:
    """The units of one or more runs of the same target, prompts and decoding settings, each unit journaled per run
    as it finishes. Interleaved (drafter runs on the HF engine, `base` given and timed here): per unit plain decoding
    once and every drafter that has not finished it, back to back, plain decoding first and last by turns and the
    drafters' order rotating; each drafter's unit stores that plain half (`base`), and with `writer` the first run's
    plain halves become that baseline run's rows. Several drafters thus share one plain half per unit instead of
    each decoding its own (`run_benches`)."""
    import contextlib

    from backend.engines.hf_spec import AuxCapture

    s, lead = arms[0].s, arms[0]
    interleave = lead.spec is not None and getattr(lm, "engine_unit", None) is None
    plan = unit_plan(s.seed, s.repeats, len(prompts))
    for a in arms:
        if interleave:              # a journal of a run started before interleaving: those units run again
            a.done[:] = [u for u in a.done if "base" in u]
        a.finished = {(u["row"]["repeat"], u["row"]["prompt_index"]) for u in a.done}
        a.aux = AuxCapture(lm, a.spec.aux["boundaries"]) if a.spec and a.spec.proposer is not None else None
    t_manifest, ran = time.monotonic(), 0
    t_start = t_manifest
    what = "baseline + speculative, interleaved" if interleave else "speculative" if lead.spec else "baseline"
    if len(arms) > 1:
        what = f"baseline + {len(arms)} drafters, interleaved"
    probe = LoadProbe()
    total = len(plan)

    def save(checkpoint: bool = False) -> None:
        for a in arms:
            a.rd.progress(len(a.done), total, checkpoint=checkpoint)
        if writer is not None:
            writer.progress(len(lead.done), total, checkpoint=checkpoint)

    def others_paused(arm: _Arm | None) -> contextlib.ExitStack:
        """Only `arm`'s hooks on the target (None: none: plain decoding as it runs alone)."""
        st = contextlib.ExitStack()
        for a in arms:
            if a is not arm and a.aux is not None:
                st.enter_context(a.aux.paused())
        return st

    def plain(prompt, seed):
        with others_paused(None):
            return run_unit(lm, s, None, None, prompt, seed)

    def drafted(a: _Arm, prompt, seed):
        with others_paused(a):
            return run_unit(lm, a.s, a.spec, a.aux, prompt, seed)

    guards = [RunGuard(a.rd, save=lambda: save(True), save_on_error=False, keep_interrupt=stop_after is not None,
                       interrupted=lambda a=a: f"interrupted after {len(a.done)}/{total} units; run the same "
                                               f"command again to resume") for a in arms]
    try:
        try:
            for _ in range(s.warmup):
                if interleave:
                    plain(seqs[0], s.seed)
                for a in arms:
                    drafted(a, seqs[0], s.seed)
            with contextlib.ExitStack() as files:
                journals = [files.enter_context(open(a.rd.file(JOURNAL), "a")) for a in arms]
                initial = sum(all((r, i) in a.finished for a in arms) for r, i in plan)
                bar = tqdm(total=total, initial=initial, desc=f"bench {lead.rd.run_id} ({what})", unit="unit",
                           disable=not progress, file=sys.stderr)
                for pos, (r, i) in enumerate(plan):
                    todo = [k for k, a in enumerate(arms) if (r, i) not in a.finished]
                    if not todo:
                        continue
                    todo = todo[pos % len(todo):] + todo[:pos % len(todo)]
                    seed, first = unit_seed(s.seed, r, i), ("baseline" if pos % 2 == 0 else "drafter")
                    started = time.time()
                    probe.start()
                    if interleave and first == "baseline":
                        g_base = plain(seqs[i], seed)
                    gens = [(k, drafted(arms[k], seqs[i], seed)) for k in todo]
                    if interleave and first == "drafter":
                        g_base = plain(seqs[i], seed)
                    meta = {"unit_order": pos, "first_arm": first if interleave else None, "started": started,
                            **probe.stop()}
                    for k, gen in gens:
                        a = arms[k]
                        row = {**_row(a.rd.run_id, r, i, prompts[i], len(seqs[i]), gen), **meta}
                        unit = {"row": row, "accepted": gen.accepted}
                        if interleave:
                            brow = {**_row(base.run_id, r, i, prompts[i], len(seqs[i]), g_base), **meta}
                            row.update({f"base_{c}": brow[c] for c in BASE_COLUMNS})
                            unit["base"] = brow
                        journals[k].write(json.dumps(unit) + "\n")
                        journals[k].flush()
                        a.done.append(unit)
                    ran += 1
                    bar.update(1)
                    if time.monotonic() - t_manifest > 2.0:
                        save()
                        t_manifest = time.monotonic()
                    if stop_after is not None and ran >= stop_after and len(lead.done) < total:
                        raise KeyboardInterrupt
                bar.close()
        except BaseException as e:      # every run's guard records it (each run fails, or keeps the interruption)
            kept, raised = True, None
            for g in guards:
                try:
                    kept = bool(g.__exit__(type(e), e, e.__traceback__)) and kept
                except BaseException as new:   # a guard's one-line error
                    raised, kept = raised or new, False
            if raised is not None:
                raise raised from raised.__cause__
            if not kept:
                raise
    except BaseException:
        _fail_writer(writer, lead.rd)
        raise
    finally:
        for a in arms:
            if a.aux is not None:
                a.aux.close()
    if any(g.interrupted for g in guards):    # stop_after reached (tests of resume): the runs stay failed, resumable
        _fail_writer(writer, lead.rd)
        return [BenchResult(a.rd.run_id, a.rd.path, "failed", base.run_id if base else None) for a in arms]
    if interleave and writer is None and base.status != COMPLETE:      # another bench writes it: wait, or write
        base, writer = _await_baseline(lead.rd, base, lm, s, len(prompts), data, t_start)
        for a in arms[1:]:
            a.rd.record(baseline_run=base.run_id)
    if writer is not None:                # the baseline first: a kill between the two leaves resumable drafter runs
        base = _finish(writer, s.baseline(), None, None, [{"row": u["base"], "accepted": []} for u in lead.done],
                       data, cpus=probe.cpus)
    return [_finish(a.rd, a.s, a.spec, base, a.done, data, cpus=probe.cpus, interleaved=interleave) for a in arms]


def _fail_writer(writer: Run | None, rd: Run) -> None:
    """The baseline run written from a drafter run's pairs stops with it (resumed with it, by the same command)."""
    if writer is None:
        return
    try:
        why = rd.read().error or "stopped"
    except SpecLensError:
        why = "stopped"
    writer.fail(f"its drafter run '{rd.run_id}' stopped ({why})")


# ---------------------------------------------------------------------- results


def _finish(rd: Run, s: BenchSettings, spec, base: BenchResult | None, done: list[dict], data: DataRoot, cpus: int = 1,
            interleaved: bool = False) -> BenchResult:
    done = sorted(done, key=lambda u: (u["row"]["repeat"], u["row"]["prompt_index"]))
    prompts_df = pd.DataFrame([u["row"] for u in done])
    if "first_arm" in prompts_df:
        prompts_df["first_arm"] = prompts_df["first_arm"].astype("string")
    if "speclens_procs" in prompts_df:
        prompts_df["speclens_procs"] = prompts_df["speclens_procs"].astype("string")
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
    moment = None
    if base is not None:
        key = ["repeat", "prompt_index"]
        if interleaved:               # the pairs timed in this run, back to back
            pair = prompts_df.rename(columns={f"base_{c}": f"{c}_base" for c in BASE_COLUMNS})
        else:                         # an engine bench: the baseline run timed before
            bdf = pd.read_parquet(base.path / "prompts.parquet")
            pair = prompts_df.merge(bdf[key + ["tokens_per_s", "output_hash", "ttft"]], on=key,
                                    suffixes=("", "_base"))
            moment = metrics.moment_ratio(1 / pair["ttft"].to_numpy(float), 1 / pair["ttft_base"].to_numpy(float))
        pair = pair.sort_values(key)
        R = s.repeats
        m_tps = [pair[pair.repeat == r]["tokens_per_s"].tolist() for r in range(R)]
        b_tps = [pair[pair.repeat == r]["tokens_per_s_base"].tolist() for r in range(R)]
        fig["speedup"] = metrics.speedup(m_tps, b_tps, seed=s.seed).to_dict()
        for cat, g in pair.groupby("category"):
            per_cat_speedup[str(cat)] = float(g["tokens_per_s"].mean() / g["tokens_per_s_base"].mean())
        if s.temperature == 0.0:
            bad = pair[pair["output_hash"] != pair["output_hash_base"]]["prompt_id"].nunique()
            fig["lossless"], fig["mismatched_prompts"] = bool(bad == 0), int(bad)
    fig["pairing"] = (INTERLEAVED if interleaved else SEPARATE) if base is not None else None
    fig["load"] = load_summary(prompts_df, cpus)
    fig["speed_noise"] = noise_finding(prompts_df, fig, cpus, interleaved, moment)
    atomic_write_parquet(rd.file("steps.parquet"), steps_df)
    atomic_write_parquet(rd.file("prompts.parquet"), prompts_df)
    atomic_write_json(rd.file("summary.json"), _summary(prompts_df, steps_df, K, acc, fig, per_cat_speedup))
    headline = {"tokens": int(prompts_df["output_tokens"].sum()), "prompts": int(prompts_df["prompt_id"].nunique()),
                "seconds": round(float(prompts_df["seconds"].sum()), 3)}
    rd.complete(drop=(JOURNAL,), progress={"done": len(done), "total": len(done)}, headline=headline, bench=fig)
    return BenchResult(rd.run_id, rd.path, COMPLETE, base.run_id if base else None, fig["tau"],
                       fig["acceptance_rate"], tps, fig["speedup"], fig["lossless"], fig["mismatched_prompts"])


def _quantiles(col: pd.Series, qs=(0.0, 0.5, 0.9, 1.0)) -> dict | None:
    v = pd.to_numeric(col, errors="coerce").dropna()
    if not len(v):
        return None
    names = {0.0: "min", 0.5: "median", 0.9: "p90", 1.0: "max"}
    return {names[q]: round(float(v.quantile(q)), 3) for q in qs}


def load_summary(df: pd.DataFrame, cpus: int) -> dict | None:
    """The manifest's `bench.load`: per-unit load figures summarised (min, median, p90, max), the units contended by
    other processes and shared with other SpecLens processes (metrics.unit_contended / unit_shared), and which
    SpecLens processes those were."""
    if "other_cpu" not in df:
        return None
    procs = sorted({p.strip() for cell in df.get("speclens_procs", pd.Series(dtype=object)).dropna()
                    for p in str(cell).split(";") if p.strip()})
    return {"cpus": int(cpus), "units": int(len(df)), "load1": _quantiles(df["load1"]),
            "cpu_util": _quantiles(df["cpu_util"]), "other_cpu": _quantiles(df["other_cpu"]),
            "speclens_cpu": _quantiles(df["speclens_cpu"]),
            "contended_units": int(sum(metrics.unit_contended(c, cpus) for c in df["other_cpu"])),
            "speclens_units": int(sum(metrics.unit_shared(c) for c in df["speclens_cpu"])),
            "speclens_processes": procs[:5]}


def noise_finding(df: pd.DataFrame, fig: dict, cpus: int, interleaved: bool,
                  moment: metrics.Estimate | None = None) -> dict:
    """The manifest's `bench.speed_noise`: metrics.speed_noise over plain decoding's tokens/s in execution order (the
    pairs' plain half in a drafter run, the run's own speeds in a baseline run; an engine bench's drafter run has no
    plain half: the load only, and the prefill of its two moments, metrics.moment_ratio) and the per-unit load, with
    `reason`: one line saying why the speed figures are no verdict (None when they are one)."""
    order = df.sort_values("unit_order") if "unit_order" in df else df
    col = "base_tokens_per_s" if interleaved else "tokens_per_s" if fig.get("pairing") is None else None
    drift = metrics.timing_drift(order[col].to_numpy(float), order["prompt_id"].tolist()) if col else None
    sp = fig.get("speedup") or {}
    ci = (sp["mean"], sp["ci_low"], sp["ci_high"]) if sp else None
    nz = metrics.speed_noise(drift, ci, order.get("other_cpu", pd.Series(dtype=float)).tolist(),
                             order.get("speclens_cpu", pd.Series(dtype=float)).tolist(), cpus)
    out = nz.to_dict()
    reasons = []
    if "drift" in nz.kinds:
        d = nz.drift
        covers = ("the speedup's interval covers" if nz.drift_limit > metrics.DRIFT_FLOOR
                  else "a timing may wander unnoticed")
        reasons.append(f"plain decoding ran {abs(d.value):.0%} {'slower' if d.value < 0 else 'faster'} in the last "
                       f"third of the run than in the first (95% CI {d.ci_low:+.0%} to {d.ci_high:+.0%}), beyond the "
                       f"\u00b1{nz.drift_limit:.0%} {covers}")
    if "load" in nz.kinds:
        q = (fig.get("load") or {}).get("other_cpu") or {}
        reasons.append(f"other processes kept {q.get('p90', 0):.1f} of {cpus} CPU cores busy (90th percentile) and "
                       f"{nz.contended_units} of {nz.units} units ran contended")
    if "speclens" in nz.kinds:
        procs = (fig.get("load") or {}).get("speclens_processes") or []
        who = f" ({_cut(procs[0], 70)}{' and others' if len(procs) > 1 else ''})" if procs else ""
        reasons.append(f"another SpecLens process{who} ran beside it in {nz.shared_units} of {nz.units} units")
    if moment is not None:
        out["moment_ttft_ratio"] = moment.to_dict()
        if metrics.moments_differ(moment, metrics.PREFILL_FLOOR):
            out["kinds"].append("moments")
            out["noisy"] = True
            reasons.append(f"its baseline run was timed at another moment, when the target's prefill ran "
                           f"x{moment.value:.2f} as fast (95% CI {moment.ci_low:.2f} to {moment.ci_high:.2f})")
    text = "; ".join(reasons)
    out["reason"] = text[:1].upper() + text[1:] + "." if text else None
    return out


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "\u2026"


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
