"""What every engine adapter shares (backend/engines/vllm.py, sglang.py; hf.py is the in-process reference):
the one Generation type a bench records, the target's shape and tokenizer without its weights, and the way an
engine's hook results become a capture's statistics. Engines are looked up by name (`engine_module`), so neither
capture nor bench imports an engine module statically, and no engine module imports capture or bench.

Adding an engine: one module under backend/engines/ with `require()`, `run_capture(settings, name, root, progress)`
and `make_engine(bench_settings, drafter, eos)` (an object with `generate`, `fed_boundaries`, `aux_ids`, `close`,
`version`), plus its name in ENGINES. docs/ARCHITECTURE.md has the walk-through.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import SimpleNamespace

from backend.errors import SpecLensError

ENGINES = {"vllm": "backend.engines.vllm", "sglang": "backend.engines.sglang"}     # hf: backend.engines.hf, in-process


@dataclass
class Generation:
    """One request through a serving engine: what bench.py's loop records (as hf_spec.Generation)."""
    tokens: list[int]
    seconds: float
    ttft: float | None
    accepted: list[int]                  # per verify step, 0..K (only their counts are reported by the engines)
    raw: dict | None = None              # the engine's own figures for the request (counter snapshots, meta_info)


def engine_module(name: str):
    """The adapter module of a serving engine, by name (imported lazily: vLLM and SGLang live on the GPU node)."""
    if name not in ENGINES:
        raise SpecLensError(f"--engine {name}: unknown; use hf, {', '.join(ENGINES)}")
    return importlib.import_module(ENGINES[name])


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


def check_hook_tokens(rd, res: dict, expected: int, engine: str, hint: str = "", **extra) -> None:
    """Record how many tokens the engine ran through the hooks next to the prompts' count; a difference means
    the statistics are not the prompts' (cached prefixes, padding): the run is failed and the error says so."""
    seen = int(res["tokens_seen"])
    rd.record(engine_check={"tokens_expected": expected, "tokens_seen_by_hooks": seen,
                            "forward_passes": int(res["forwards"]), **extra})
    if seen != expected:
        rd.fail(f"{engine} ran {seen} tokens through the hooks, the prompts hold {expected}{hint}")
        raise SpecLensError(f"capture {rd.run_id}: token count mismatch inside {engine} ({seen} != {expected})")


@dataclass
class CaptureStart:
    """What a serving engine's capture starts from: the prompts as token ids and its (new or resumed) run."""
    info: SimpleNamespace
    seqs: list[list[int]]
    labels: list[str]
    run_id: str
    rd: object                     # backend.runs.lifecycle.Run
    start: int                     # prompts already done (a resumed run)
    state: object | None           # statistics state of the checkpoint
    sample: dict | None            # sample tensors of the checkpoint


def start_capture(settings, name: str | None, root, engine: str, version: str) -> CaptureStart:
    """The target's tokenizer and shape (no weights), the prompts encoded exactly as the HF engine encodes them,
    the boundaries asked for, and the capture run created or resumed (backend/runs/capture_run.py)."""
    from backend import coords
    from backend.prompts import encode_all, load_prompts
    from backend.runs import capture_run as cr
    from backend.store.rundir import new_run_id

    prompts = load_prompts(settings.prompts, settings.limit)
    info = target_info(settings.model)
    seqs = encode_all(info.tokenizer, prompts, settings.prompts, settings.chat_template, settings.max_prompt_tokens)
    labels = coords.labels(cr.boundaries(settings.boundaries, info.n_layers))
    run_id = new_run_id("capture", name)
    rd, start, state, sample_t = cr.open_or_resume(run_id, settings, info, labels, root, len(prompts),
                                                  engine_version=f"{engine} {version}")
    return CaptureStart(info, seqs, labels, run_id, rd, start, state, sample_t)

