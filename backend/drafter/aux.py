"""Which target boundaries an engine feeds a drafter, read from the drafter's config as that engine reads it.

A conventions lookup (backend/conventions.yaml through backend/coords.py); no torch, so the lint and
`check-drafter --lint-only` use it without loading a model."""

from __future__ import annotations

from backend import coords
from backend.drafter.config import DrafterConfig
from backend.errors import SpecLensError


def nested_layer_ids(dcfg: DrafterConfig) -> list[int] | None:
    """`eagle_config.layer_ids` (or `dflash_config.layer_ids`) of the drafter's config file, which vLLM 0.27+'s
    V2 runner reads when the top level has no ids (eagle3_utils.get_eagle3_aux_layers_from_config)."""
    import json
    from pathlib import Path
    f = dcfg.config_file or (str(Path(dcfg.name) / "config.json") if dcfg.name else "")
    try:
        raw = json.loads(Path(f).read_text()) if f else {}
    except (OSError, ValueError):
        return None
    for key in ("dflash_config", "eagle_config"):
        sub = raw.get(key)
        if isinstance(sub, dict) and isinstance(sub.get("layer_ids"), list) and sub["layer_ids"]:
            return [int(x) for x in sub["layer_ids"]]
    return None


def drafter_aux_boundaries(dcfg: DrafterConfig, n_layers: int, model_type: str | None, producer: str = "vllm",
                           version: str | None = "0.24.0", runner: str | None = None) -> dict:
    """The target boundaries the drafter's fc expects, read from its config as `producer` reads it.

    Where the ids are read from follows the conventions table's `ids_from`: with a `runner` ("v1"/"v2" for
    vLLM) exactly that runner's reading (vLLM 0.24 V2 ignores nested eagle_config ids); without one, the top
    level then eagle_config. Returns {ids, ids_from, boundaries (labels, ascending, unique)}."""
    fam = coords.family_of(model_type)
    conv = coords.convention_for(producer, version, fam, runner)
    rule = (conv.ids_from.get(runner) if runner else None) or conv.ids_from.get("any") or "top_then_nested"
    top, nested = dcfg.aux_layer_ids_top, dcfg.aux_layer_ids_nested
    if rule == "top_then_nested_layer_ids":             # vLLM 0.27+ V2: top level, then eagle_config.layer_ids
        other = nested_layer_ids(dcfg)
        ids, where = (top, "top level") if top else (other, "eagle_config.layer_ids")
    else:
        ids, where = {"top_level": (top, "top level"), "nested": (nested, "eagle_config"), "none": (None, None),
                      "top_then_nested": (top, "top level") if top else (nested, "eagle_config"),
                      "nested_then_top": (nested, "eagle_config") if nested else (top, "top level")}[rule]
    if not ids:
        ids, where = None, f"{producer} default"
    bs = sorted(set(coords.resolve_ids(producer, ids, n_layers, version=version, family=fam, runner=runner)),
                key=lambda b: b.sort_key())            # captured once each, in ascending order
    labels = coords.labels(bs)
    if len(bs) != dcfg.num_aux:
        raise SpecLensError(f"{dcfg.name}/config.json: {producer} {version or ''} reads aux ids {ids} ({where}) as "
                            f"{labels} on this {n_layers}-layer target, but fc takes {dcfg.num_aux} aux states; write "
                            f"{dcfg.num_aux} distinct ids where {producer} reads them")
    return {"ids": ids, "ids_from": where, "boundaries": labels, "producer": producer, "version": version,
            "runner": runner}


def engine_feeds(dcfg: DrafterConfig, n_layers: int, model_type: str | None, architectures: list[str] | None,
                 producer: str = "vllm", version: str | None = None, runner: str | None = None,
                 options: dict | None = None, target_config: dict | None = None) -> dict:
    """`drafter_aux_boundaries` with vLLM's model runner decided as vLLM decides it (runner None or "auto": from
    the target's architectures, the engine options and VLLM_USE_V2_MODEL_RUNNER; backend/vllm_runner.py).
    Adds `runner_reason` for vLLM."""
    from backend import vllm_runner

    if producer != "vllm":
        return drafter_aux_boundaries(dcfg, n_layers, model_type, producer, version, None)
    choice = vllm_runner.resolve(runner or "auto", architectures, version or coords.DEFAULT_VERSIONS["vllm"], options,
                                 target_config=target_config)
    aux = drafter_aux_boundaries(dcfg, n_layers, model_type, producer, version, choice.runner)
    aux["runner_reason"] = choice.reason
    return aux


def kind_aux(cfg, target, engine: str, version: str, runner: str | None) -> dict:
    """The lint's and feeds' reading for a drafter of a kind other than eagle3 (backend/drafter/kinds.py): EAGLE-like
    kinds take the EAGLE-3 reading once the release serves them; DFlash and MTP their own (kind_feeds)."""
    from backend.drafter.kinds import DFLASH_LIKE, EAGLE_LIKE, kind_feeds, raw_config, served

    raw = raw_config(cfg)
    if cfg.kind in EAGLE_LIKE:
        why = served(engine, version, cfg.kind, raw)
        if why:
            raise SpecLensError(why)
        return drafter_aux_boundaries(cfg, target.n_layers, target.model_type, engine, version, runner)
    return kind_feeds(raw, cfg.kind, target.n_layers, target.model_type, target.architectures, engine, version, runner,
                      fc_in=cfg.num_aux if cfg.kind in DFLASH_LIKE else None)
