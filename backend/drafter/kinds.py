"""Drafter kinds beyond Llama EAGLE-3 that read the target's hidden states (issue 23): what each engine release feeds
a DFlash, DFlash2, P-EAGLE, EAGLE-3 MLA, EAGLE-3.1 or MTP/NextN drafter, read from the kind rows of
backend/conventions.yaml (derived from the released wheels by `tools/rederive_conventions.py --kinds`).

- kind_of(raw): the kind of a drafter config.json (its architectures, `dflash_config`, `speculators_model_type`,
  EAGLE-3.1's `fc_norm` + `norm_output`); "eagle3" for everything the EAGLE-3 path already reads.
- kind_feeds(...): for one engine release (and vLLM runner), the ids it reads, where from, and the boundaries fed
  (or why it cannot serve the drafter).

How the engines read DFlash ids (the kind rows cite the functions): vLLM reads top-level
`eagle_aux_hidden_state_layer_ids` first (id a = S_a, the input of layer a), then `dflash_config.target_layer_ids`
with +1 (0.22+ V1, 0.24+ V2; 0.20-0.21 V1 took them as they are, so S_t; 0.20-0.23 V2 did not read them at all),
then top-level `target_layer_ids` +1 (0.25+ V2); with none it feeds the target's EAGLE-3 default. SGLang reads
`dflash_config.target_layer_ids`, else top-level `target_layer_ids`, else spreads the draft's num_hidden_layers ids
over [1, N-3] (`build_target_layer_ids`), and the target's `set_dflash_layers_to_capture` maps id t to S_{t+1} for
most architectures (S_t where it passes the ids unchanged). DFlash trainers (z-lab, SpecForge) use HF
`hidden_states[t + 1]`, i.e. S_{t+1}.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from backend import coords
from backend.errors import SpecLensError
from backend.options import engine_label

KINDS = ("eagle3", "eagle3_1", "eagle3_mla", "p_eagle", "dflash", "dflash2", "mtp")
KIND_NAMES = {"eagle3": "EAGLE-3", "eagle3_1": "EAGLE-3.1", "eagle3_mla": "EAGLE-3 (MLA attention)",
              "p_eagle": "P-EAGLE", "dflash": "DFlash", "dflash2": "DFlash2", "mtp": "MTP/NextN"}
# kinds whose ids are the EAGLE-3 ids (eagle_aux_hidden_state_layer_ids): the EAGLE-3 reading applies once served
EAGLE_LIKE = ("eagle3", "eagle3_1", "eagle3_mla", "p_eagle")
DFLASH_LIKE = ("dflash", "dflash2")
MLA_ARCHS = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
SPECULATORS_KINDS = {"eagle3": "eagle3", "peagle": "p_eagle", "dflash": "dflash", "dflash2": "dflash2", "mtp": "mtp"}


def kind_of(raw: dict) -> str:
    """The drafter kind of a config.json dict."""
    smt = raw.get("speculators_model_type")
    if smt:
        return SPECULATORS_KINDS.get(str(smt), str(smt))
    archs = [str(a) for a in raw.get("architectures") or []]
    if any("DFlash2" in a for a in archs):
        return "dflash2"
    if any("dflash" in a.lower() for a in archs) or isinstance(raw.get("dflash_config"), dict):
        return "dflash"
    if any("peagle" in a.lower() for a in archs) or raw.get("parallel_drafting") is True:
        return "p_eagle"
    if any(a in MLA_ARCHS for a in archs):
        return "eagle3_mla"
    if any(("MTP" in a or "NextN" in a) for a in archs):
        return "mtp"
    if raw.get("fc_norm") and raw.get("norm_output"):
        return "eagle3_1"
    return "eagle3"


@lru_cache(maxsize=1)
def kind_rows() -> tuple[dict, ...]:
    """The `kind:` rows of backend/conventions.yaml."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    text = coords.CONVENTIONS_FILE.read_text()
    block = text.split(coords.KINDS_MARK, 1)[1].split("\n", 1)[-1] if coords.KINDS_MARK in text else ""
    rows = yaml.load(block, Loader=loader) or []  # noqa: S506 - a safe loader
    return tuple(r for r in rows if r.get("kind"))


def kind_row(engine: str, version: str, kind: str) -> dict | None:
    """The kind row of this engine release (None: the release was not derived)."""
    try:
        v = Version(version)
    except InvalidVersion:
        return None
    return next((r for r in kind_rows() if r["producer"] == engine and r["kind"] == kind
                 and v in SpecifierSet(r["versions"])), None)


def _eng(engine: str) -> str:
    return engine_label(engine)


def served(engine: str, version: str, kind: str, raw: dict | None = None) -> str | None:
    """None when the release serves this kind (and the config's architecture); else the one-line reason."""
    if kind == "eagle3":
        return None
    row = kind_row(engine, version, kind)
    if row is None:
        return (f"{_eng(engine)} {version}: what it does with {KIND_NAMES.get(kind, kind)} drafters is not derived "
                f"(tools/rederive_conventions.py --kinds covers vLLM 0.20-0.33 and SGLang 0.5.1-0.5.23)")
    if not row["served"]:
        return (f"{_eng(engine)} {version} does not serve {KIND_NAMES[kind]} drafters: none of "
                f"{', '.join(_arch_list(kind))} is registered ({row['decided_by']['served']})")
    archs = [str(a) for a in (raw or {}).get("architectures") or []]
    if kind in DFLASH_LIKE + ("p_eagle", "eagle3_mla") and archs and "speculators_config" not in (raw or {}) \
            and not any(a in row["architectures"] for a in archs):
        return (f"{_eng(engine)} {version} registers no {'/'.join(archs)} ({KIND_NAMES[kind]} architectures it "
                f"serves: {', '.join(row['architectures'])}); it cannot load this drafter")
    return None


def _arch_list(kind: str) -> list[str]:
    return {"dflash": ["DFlashDraftModel"], "dflash2": ["DFlash2DraftModel"],
            "p_eagle": ["PEagleDraftModel", "PeagleLlamaForCausalLM", "PeagleQwen3ForCausalLM"],
            "eagle3_mla": list(MLA_ARCHS), "eagle3_1": ["LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"],
            "mtp": ["DeepSeekMTPModel", "DeepseekV3ForCausalLMNextN"]}.get(kind, [])


def _lookup(raw: dict, where: str, key: str) -> tuple[bool, Any]:
    """(container present as a non-empty dict, value) for a read of the kind rows."""
    if where == "top":
        return True, raw.get(key)
    sub = raw.get(where)
    if not isinstance(sub, dict) or not sub:
        return False, None
    return True, sub.get(key)


def read_ids(blocks: list[list[dict]], raw: dict) -> tuple[list[int] | None, str | None, int]:
    """Run a kind row's ordered reads over the config: (ids after the release's +1, where they came from, the +1)."""
    ids, src, add = None, None, 0
    for block in blocks:
        if ids:
            break
        for r in block:
            if r.get("when"):
                continue                               # a reading for another model type (DSpark's deepseek_v41)
            present, v = _lookup(raw, r["in"], r["key"])
            how = r["assign"]
            if how == "present":
                present = r["key"] in (raw.get(r["in"]) or {}) if r["in"] != "top" else r["key"] in raw
            if how == "always" or (how in ("container", "present") and present) or (how == "value" and v):
                vals = list(v) if isinstance(v, (list, tuple)) else None
                ids = [int(x) + int(r["add"]) for x in vals] if vals else None
                src = (r["key"] if r["in"] == "top" else f"{r['in']}.{r['key']}") + (
                    " (+1)" if r["add"] else " (as written, no +1)" if r["key"] == "target_layer_ids" else "")
                add = int(r["add"])
    return (ids, src, add) if ids else (None, None, 0)


SPECULATORS_IDS = "aux_hidden_state_layer_ids"       # a speculators-format config's own id key (id a = S_a)


def speculators_view(raw: dict, engine: str) -> dict:
    """A speculators-format DFlash config as vLLM's converter hands it over (transformers_utils/configs/speculators/
    algos.py update_dflash: aux_hidden_state_layer_ids -> eagle_aux_hidden_state_layer_ids and
    dflash_config.target_layer_ids = id - 1)."""
    if "speculators_config" not in raw or engine != "vllm":
        return raw
    aux = raw.get(SPECULATORS_IDS)
    out = dict(raw)
    if aux:
        out["eagle_aux_hidden_state_layer_ids"] = list(aux)
        out["dflash_config"] = {**(raw.get("dflash_config") or {}), "target_layer_ids": [int(i) - 1 for i in aux]}
    return out


def trained_count(raw: dict, kind: str) -> int | None:
    """How many target states the drafter's fc takes: DFlash: len(target_layer_ids), else its num_hidden_layers."""
    if kind not in DFLASH_LIKE:
        return None
    ids = (raw.get("dflash_config") or {}).get("target_layer_ids") or raw.get("target_layer_ids") \
        or raw.get("aux_hidden_state_layer_ids")
    if ids:
        return len(ids)
    n = raw.get("num_hidden_layers") or (raw.get("transformer_layer_config") or {}).get("num_hidden_layers")
    return int(n) if n else None


def sglang_default(n_target: int, n_draft: int) -> list[int]:
    """SGLang's build_target_layer_ids: one draft layer -> [N//2]; else n_draft ids spread over [1, N-3]."""
    if n_draft == 1:
        return [n_target // 2]
    start, end = 1, n_target - 3
    if end < start:
        raise SpecLensError(f"SGLang's DFlash default needs a target of at least 4 layers (this one has {n_target})")
    return [int(round(start + (i * (end - start)) / (n_draft - 1))) for i in range(n_draft)]


def _sglang_rule(row: dict, architectures: list[str]) -> str | None:
    for rule, archs in (row.get("capture") or {}).items():
        if any(a in archs for a in architectures):
            return {"delegates": "after", "dspark_taps": "after"}.get(rule, rule)
    return None


def kind_feeds(raw: dict, kind: str, n_layers: int, model_type: str | None, architectures: list[str], engine: str,
               version: str, runner: str | None = None, fc_in: int | None = None) -> dict:
    """What `engine` `version` (vLLM: `runner`) feeds a drafter of `kind` (not eagle3) on this target:
    {ids, ids_from, boundaries} or raises SpecLensError (one line) when it cannot serve it. `fc_in`: how many
    target states the drafter takes (DFlash: from its config)."""
    why = served(engine, version, kind, raw)
    if why:
        raise SpecLensError(why)
    row = kind_row(engine, version, kind)
    if kind == "mtp":
        return {"ids": None, "ids_from": "none (an MTP/NextN head reads no ids)", "boundaries": list(row["feeds"])}
    view = speculators_view(raw, engine)
    fam = coords.family_of(model_type)
    if engine == "vllm":
        blocks = (row["ids_from"] or {}).get(runner or "v1") if isinstance(row["ids_from"], dict) else None
        if blocks is None:                       # EAGLE-like kinds: the EAGLE-3 reading (lint's own path)
            raise SpecLensError(f"{kind}: read through the EAGLE-3 path")
        ids, src, _ = read_ids(blocks, view)
        bs = coords.resolve_ids("vllm", ids, n_layers, version=version, family=fam, runner=runner)
        labels = coords.labels(sorted(set(bs), key=lambda b: b.sort_key()))
        where = src or "the target's EAGLE-3 default"
        if view is not raw and src and src.split(" ")[0] not in raw and raw.get(SPECULATORS_IDS):
            where = f"{SPECULATORS_IDS} (speculators format; vLLM's converter hands it over as {src})"
    else:
        if kind not in DFLASH_LIKE:
            raise SpecLensError(f"{kind}: read through the EAGLE-3 path")
        if "speculators_config" in raw:
            raise SpecLensError(f"SGLang {version} loads no speculators-format config; convert it to the DFlash "
                                f"format (dflash_config.target_layer_ids)")
        ids, src, _ = read_ids(row["ids_from"]["any"], view)
        if ids is None:
            nd = int(raw.get("num_hidden_layers") or 1)
            ids, src = sglang_default(n_layers, nd), f"SGLang default (build_target_layer_ids, {nd} draft layers)"
        bad = [t for t in ids if not 0 <= t < n_layers]
        if bad:
            raise SpecLensError(f"SGLang {version} rejects DFlash target_layer_ids {bad} on a {n_layers}-layer target "
                                f"(valid 0..{n_layers - 1}; dflash_utils.resolve_target_layer_ids)")
        rule = _sglang_rule(row, architectures)
        if rule is None:
            raise SpecLensError(f"SGLang {version} has no DFlash capture for target {'/'.join(architectures) or '?'} "
                                f"(no set_dflash_layers_to_capture; {row['decided_by']['meaning']})")
        shift = 1 if rule == "after" else 0
        labels = coords.labels(sorted({coords.S(t + shift) for t in ids}, key=lambda b: b.sort_key()))
        where = (src or "").replace(" (as written, no +1)", "") + (
            "; the target captures S_(t+1)" if shift else "; the target captures S_t (no +1)")
    k = fc_in if fc_in is not None else trained_count(raw, kind)
    if k is not None and len(labels) != k:
        read = f"reads {ids} ({where})" if ids else f"finds no ids where it looks, so uses {where}"
        raise SpecLensError(f"{_eng(engine)} {version} {read} and feeds {', '.join(labels)}, but the drafter's fc "
                            f"takes {k} target states; write {k} ids where it reads them")
    return {"ids": ids, "ids_from": where, "boundaries": labels}


def trained_boundaries(raw: dict, kind: str) -> list[str] | None:
    """What a DFlash drafter was trained on according to its own config: the trainers (z-lab, SpecForge) capture HF
    hidden_states[t + 1] for target_layer_ids t, i.e. S_{t+1}; speculators' aux ids a are S_a."""
    if kind not in DFLASH_LIKE:
        return None
    if "speculators_config" in raw and raw.get("aux_hidden_state_layer_ids"):
        return [f"S_{int(a)}" for a in sorted(raw["aux_hidden_state_layer_ids"])]
    ids = (raw.get("dflash_config") or {}).get("target_layer_ids") or raw.get("target_layer_ids")
    return [f"S_{int(t) + 1}" for t in sorted(ids)] if ids else None


def fix_ids(kind: str, engine: str, version: str, trained: list[str],
            architectures: list[str]) -> tuple[str, list[int]]:
    """Where to write which ids so that the release feeds `trained` (DFlash kinds): (key path, ids)."""
    if kind not in DFLASH_LIKE:
        raise SpecLensError(f"no fix written: --write-fix supports EAGLE-3 and DFlash drafters; a "
                            f"{KIND_NAMES.get(kind, kind)} drafter's ids are its EAGLE-3 ids (fix those by hand)")
    idx = [int(coords.label_index(b)) for b in trained if b != "F"]
    if len(idx) != len(trained):
        raise SpecLensError("no fix written: F (the final-norm output) cannot be captured as a DFlash target state")
    if engine == "vllm":                        # top-level ids win in every release and mean S_a
        return "eagle_aux_hidden_state_layer_ids", idx
    row = kind_row(engine, version, kind)
    rule = _sglang_rule(row or {}, architectures) if row else None
    if rule is None:
        raise SpecLensError(f"no fix written: SGLang {version} does not serve this DFlash drafter on this target")
    return "dflash_config.target_layer_ids", [b - (1 if rule == "after" else 0) for b in idx]


def runner_args(kind: str) -> dict:
    """What vLLM's runner choice sees for this kind (backend/vllm_runner.resolve): DFlash runs method "dflash" with
    parallel drafting on (config/speculative.py sets it), P-EAGLE is EAGLE-3 with parallel drafting."""
    if kind in DFLASH_LIKE:
        return {"method": "dflash", "options": {"speculative_config": {"parallel_drafting": True}}}
    if kind == "p_eagle":
        return {"method": "eagle3", "options": {"speculative_config": {"parallel_drafting": True}}}
    if kind == "mtp":
        return {"method": "mtp"}
    return {}


def serving_method(drafter: str | Path | None, engine: str) -> str | None:
    """The speculative method an engine serves this drafter with: vLLM's `speculative_config.method`
    ("eagle3" or "dflash"), SGLang's `--speculative-algorithm` ("EAGLE3" or "DFLASH"); None without a drafter."""
    if not drafter:
        return None
    import json

    f = Path(drafter) / "config.json" if Path(drafter).is_dir() else Path(drafter)
    try:
        kind = kind_of(json.loads(f.read_text()))
    except (OSError, ValueError):
        kind = "eagle3"                          # the engine's own error names an unreadable config
    if kind in DFLASH_LIKE:
        return "DFLASH" if engine == "sglang" else "dflash"
    return "EAGLE3" if engine == "sglang" else "eagle3"


def block_k(drafter: str | Path) -> int | None:
    """K for a block drafter (DFlash): its block size - 1 (the block is [x_s, M..M]); None for chain drafters, whose
    K is the bench's."""
    import json

    f = Path(drafter) / "config.json" if Path(drafter).is_dir() else Path(drafter)
    try:
        raw = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    if kind_of(raw) not in DFLASH_LIKE:
        return None
    bs = (raw.get("dflash_config") or {}).get("block_size", raw.get("block_size"))
    return int(bs) - 1 if isinstance(bs, int) and bs > 1 else None


def raw_config(cfg) -> dict:
    import json
    from pathlib import Path

    if isinstance(getattr(cfg, "_raw", None), dict):
        return cfg._raw
    f = cfg.config_file or (str(Path(cfg.name) / "config.json") if cfg.name else "")
    try:
        return json.loads(Path(f).read_text()) if f else {}
    except (OSError, ValueError):
        return {}
