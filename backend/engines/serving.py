"""Bench runs through a serving engine (vLLM or SGLang): the same run directories, journal, paired baseline and
metrics as the HF reference bench (backend/bench.py); only the generation of one unit differs.

The target is tokenized here with its own HF tokenizer (and chat template), so every engine sees exactly the
same prompt token ids; engines get token ids, never text. What the engine feeds the drafter is read from the
running engine and recorded next to what SpecLens predicts from the config (`aux.boundaries` vs
`aux.predicted`), so a config the engine reads differently shows up in the run itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from backend.errors import SpecLensError
from backend.model_id import fingerprint


@dataclass
class Generation:
    """One request through a serving engine: what bench.py's loop records (as hf_spec.Generation)."""
    tokens: list[int]
    seconds: float
    ttft: float | None
    accepted: list[int]                  # per verify step, 0..K (only their counts are reported by the engines)
    raw: dict | None = None              # the engine's own figures for the request (counter snapshots, meta_info)


def _engine_module(name: str):
    if name == "vllm":
        from backend.engines import vllm
        return vllm
    if name == "sglang":
        from backend.engines import sglang
        return sglang
    raise SpecLensError(f"--engine {name}: unknown; use hf, vllm or sglang")


def target_info(model: str) -> SimpleNamespace:
    """Tokenizer and shape of a target directory (no weights loaded)."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        cfg = AutoConfig.from_pretrained(model)
        tok = AutoTokenizer.from_pretrained(model)
    except Exception as e:
        raise SpecLensError(f"{model}: not a model directory with a tokenizer transformers can read "
                            f"({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})") from None
    text = getattr(cfg, "text_config", None) or cfg
    eos = getattr(cfg, "eos_token_id", None)
    try:
        from transformers import GenerationConfig
        eos = GenerationConfig.from_pretrained(model).eos_token_id or eos
    except Exception:
        pass
    eos = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(x) for x in eos])
    return SimpleNamespace(config=cfg, tokenizer=tok, n_layers=int(text.num_hidden_layers),
                           hidden_size=int(text.hidden_size), device="cuda", eos=eos,
                           model_type=getattr(cfg, "model_type", None))


def rebuild_capture(res: dict, hidden: int, sample_tokens: int, sample_per_prompt: int):
    """The (StreamingStats, TokenSample) of what an engine's hooks collected (`labels`, `state`, `sample`)."""
    import torch

    from backend.stats import StatsState, StreamingStats, TokenSample

    stats = StreamingStats(res["labels"], hidden, "cpu", StatsState.from_tensors(res["state"], "cpu"), compile=False)
    dt = res["sample"][res["labels"][0]].dtype if res["labels"] else torch.float32
    sample = TokenSample(res["labels"], hidden, sample_tokens, sample_per_prompt, dtype=dt)
    sample.load(res["sample"])
    return stats, sample


def check_hook_tokens(rd, res: dict, expected: int, engine: str, root, hint: str = "", **extra) -> None:
    """Record how many tokens the engine ran through the hooks next to the prompts' count; a difference means
    the statistics are not the prompts' (cached prefixes, padding): the run is failed and the error says so."""
    seen = int(res["tokens_seen"])
    rd.update(engine_check={"tokens_expected": expected, "tokens_seen_by_hooks": seen,
                            "forward_passes": int(res["forwards"]), **extra})
    if seen != expected:
        from backend.store import catalog

        rd.fail(f"{engine} ran {seen} tokens through the hooks, the prompts hold {expected}{hint}")
        catalog.refresh(root)
        raise SpecLensError(f"capture {rd.run_id}: token count mismatch inside {engine} ({seen} != {expected})")


def predicted_aux(drafter: str, info: SimpleNamespace, engine: str, runner: str | None = None,
                  options: dict | None = None) -> dict:
    """What SpecLens expects the engine to feed, from the drafter config and the conventions table; also the
    one-line checks (hidden size, vocab) before any GPU time is spent."""
    from backend.drafter.config import load_config
    from backend.drafter.aux import engine_feeds

    dcfg = load_config(drafter)
    for what, mine, theirs in (("hidden size", dcfg.target_hidden_size, info.hidden_size),
                               ("vocab size", dcfg.vocab_size, getattr(info.config, "vocab_size", None))):
        if theirs is not None and mine is not None and int(mine) != int(theirs):
            raise SpecLensError(f"{drafter}/config.json: drafter built for {what} {mine}, the target has {theirs}; "
                                "use a drafter trained for this target")
    from backend.coords import DEFAULT_VERSIONS

    version = DEFAULT_VERSIONS[engine]
    aux = engine_feeds(dcfg, info.n_layers, info.model_type, getattr(info.config, "architectures", None), engine,
                       version, runner, options)               # vLLM: the runner vLLM picks for this target
    return {"aux": aux, "format": dcfg.source_format, "draft_vocab_size": dcfg.draft_vocab_size}


def _bind(info: SimpleNamespace, engine, name: str) -> SimpleNamespace:
    """A stand-in for the HF LoadedModel that bench.py's loop and manifest read."""
    def unit(prompt, s, seed):
        return engine.generate(prompt, s.max_new_tokens, s.temperature, seed)
    return SimpleNamespace(**vars(info), engine=name, engine_version=f"{name} {engine.version}", engine_unit=unit)


def run_engine_bench(s, name: str | None, root: Path | None, progress: bool, stop_after: int | None):
    from backend import bench
    from backend.prompts import load_prompts
    from backend.store.rundir import COMPLETE, new_run_id

    mod = _engine_module(s.engine)
    if s.server_url is None:
        mod.require()
    prompts = load_prompts(s.prompts, s.limit)
    info = target_info(s.target)
    seqs = bench._encode_all(info, prompts, s)
    pred = (predicted_aux(s.drafter, info, s.engine, s.runner,
                          {"tensor_parallel_size": s.tensor_parallel_size, **(s.engine_options or {})})
            if s.drafter else None)

    base = None
    if s.drafter:
        holder: dict = {}

        class _Lazy(SimpleNamespace):          # the baseline engine starts only if no baseline run can be reused
            def __getattr__(self, k):
                if k in ("engine_unit", "engine_version", "engine"):
                    if "lm" not in holder:
                        holder["eng"] = mod.make_engine(s, drafter=None, eos=info.eos)
                        holder["lm"] = _bind(info, holder["eng"], s.engine)
                    return getattr(holder["lm"], k)
                raise AttributeError(k)
        try:
            base = bench._ensure_baseline(_Lazy(**vars(info)), s.baseline(), prompts, seqs, name, root, progress)
        finally:
            if "eng" in holder:
                holder["eng"].close()
        if base.status != COMPLETE:
            return base

    eng = mod.make_engine(s, drafter=s.drafter, eos=info.eos)
    try:
        lm = _bind(info, eng, s.engine)
        spec = None
        if s.drafter:
            live = eng.fed_boundaries(info.n_layers)
            aux = dict(pred["aux"], predicted=pred["aux"]["boundaries"], boundaries=live or pred["aux"]["boundaries"],
                       ids_from=f"{s.engine} engine (read from the running model)" if live else pred["aux"]["ids_from"],
                       engine_ids=eng.aux_ids())
            if live and live != pred["aux"]["boundaries"]:
                aux["warning"] = (f"{s.engine} feeds {','.join(live)}; SpecLens predicted "
                                  f"{','.join(pred['aux']['boundaries'])} from the config")
            spec = bench._Spec(None, aux, {"path": str(Path(s.drafter).resolve()), "format": pred["format"],
                                           "fingerprint": fingerprint(s.drafter),
                                           "semantics": s.engine, "draft_vocab_size": pred["draft_vocab_size"],
                                           "proposer": f"{s.engine} eagle3"})
        run_id = new_run_id("bench", name)
        rd, done = bench._open_or_resume(run_id, s, lm, spec, base, root, len(prompts))
        return bench._run(rd, lm, s, prompts, seqs, spec, base, done, root, progress, stop_after)
    finally:
        eng.close()

