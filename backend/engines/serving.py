"""What a bench through a serving engine (vLLM or SGLang) needs from the engine side; the loop is bench.py's.

`predicted_aux`: what SpecLens expects the engine to feed the drafter (config + conventions table), recorded next to
what the running engine reports (`aux.predicted` vs `aux.boundaries`), so a config the engine reads differently
shows up in the run itself. `bind`: the engine's generation as the unit bench.py's loop calls.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

from backend.errors import SpecLensError

if TYPE_CHECKING:
    from backend.engines.base import Engine, TargetInfo


def predicted_aux(drafter: str, info: TargetInfo, engine: str, runner: str | None = None,
                  options: dict | None = None, version: str | None = None) -> dict:
    """What SpecLens expects the engine to feed, from the drafter config and the conventions table row of `version`
    (the engine's release; default: the release SpecLens targets); also the one-line checks (hidden size, vocab)
    before any GPU time is spent."""
    from backend.drafter.aux import engine_feeds
    from backend.drafter.config import load_config

    dcfg = load_config(drafter)
    for what, mine, theirs in (("hidden size", dcfg.target_hidden_size, info.hidden_size),
                               ("vocab size", dcfg.vocab_size, getattr(info.config, "vocab_size", None))):
        if theirs is not None and mine is not None and int(mine) != int(theirs):
            raise SpecLensError(f"{drafter}/config.json: drafter built for {what} {mine}, the target has {theirs}; "
                                "use a drafter trained for this target")
    from backend.coords import DEFAULT_VERSIONS
    from backend.drafter.kinds import DFLASH_LIKE

    version = version or DEFAULT_VERSIONS[engine]
    if dcfg.kind in DFLASH_LIKE:                                # DFlash ids (dflash_config.target_layer_ids)
        from backend.drafter.dflash import feeds

        aux = feeds(drafter, info.config, info.n_layers, engine, version, runner, options)
        return {"aux": aux, "format": "dflash", "draft_vocab_size": dcfg.vocab_size}
    aux = engine_feeds(dcfg, info.n_layers, info.model_type, getattr(info.config, "architectures", None), engine,
                       version, runner, options)               # vLLM: the runner vLLM picks for this target
    return {"aux": aux, "format": dcfg.source_format, "draft_vocab_size": dcfg.draft_vocab_size}


def bind(info: TargetInfo, engine: Engine, name: str) -> SimpleNamespace:
    """A stand-in for the HF LoadedModel that bench.py's loop and manifest read."""
    def unit(prompt, s, seed):
        return engine.generate(prompt, s.max_new_tokens, s.temperature, seed)
    return SimpleNamespace(**vars(info), engine=name, engine_version=f"{name} {engine.version}", engine_unit=unit)
