"""Static lint of an EAGLE-3 drafter against its target: what each engine will feed it, and what it will change.

From the drafter's config.json, the weights' shapes (and `d2t`), the target's config.json and the conventions
table (backend/conventions.yaml), without running anything:

- `readings`: one row per engine reading (vLLM 0.24 V2 runner, V1 runner, SGLang 0.5.x): where it reads the aux
  ids from, the ids it finds and the boundaries it will feed (or why it cannot).
- `lint`: findings (severity error | warning | info | ok) about those readings (nested ids that vLLM's V2 runner
  ignores, top-level ids that SGLang ignores, engines that disagree), flags whose meaning differs between engines,
  `d2t` offsets that leave the target vocab, k other than 3 without the fields the engines need, embeddings and
  LM head an engine will substitute.
- `check_inputs`: the drafter-for-another-target errors (hidden size, vocab, ids out of range), one line each.

docs/CONVENTIONS.md (ids, formats) holds the facts; backend/drafter/config.py and model.py how each flag is read.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from backend import coords
from backend.drafter.config import DrafterConfig, load_config
from backend.errors import SpecLensError
from backend.jsonfile import read_object
from backend.options import ENGINE_READINGS, engine_label

if TYPE_CHECKING:
    from backend.vllm_runner import RunnerChoice

SEVERITIES = ("error", "warning", "info", "ok")
# (producer, runner) of each engine reading the lint reports: backend/options.py ENGINE_READINGS; versions default
# to coords.DEFAULT_VERSIONS
IDS_KEY = "eagle_aux_hidden_state_layer_ids"


@dataclass
class Finding:
    """One finding of the drafter check, as data: backend/text/check_text.py words it (`finding_sentence`, one
    template per `code`) for the command line, check.json and the Drafter check page. `figures` holds what its
    sentence names, JSON-safe (check.json stores them, so a page words a stored finding the same way)."""
    severity: str                 # error | warning | info | ok
    code: str                     # which finding: a key of backend/text/check_text.py's templates
    figures: dict = field(default_factory=dict)
    source: str = "lint"          # lint | finder | training_data


@dataclass
class Reading:
    """What one engine (and runner) will feed this drafter."""
    engine: str                   # "vllm" | "sglang"
    version: str
    runner: str | None            # "v1" | "v2" for vLLM
    ids_rule: str                 # where it reads EAGLE-3 ids from: top_level | top_then_nested | nested
    ids: list[int] | None         # the ids it finds (None: none, so its default)
    ids_from: str | None          # "top level" | "eagle_config" | "<engine> default"
    boundaries: list[str] | None  # what it feeds, ascending (None: it cannot serve this drafter, see error)
    error: str | None = None
    captures: list[str] | None = None  # what it would capture from the ids it reads, even when it cannot serve
    picked: bool = True           # vLLM: the runner vLLM itself picks for this target (backend/vllm_runner.py)
    why: str | None = None        # vLLM: why that runner is (or is not) the one vLLM picks
    reads: str | None = None      # where it reads this kind's ids, in words: backend/text/drafter_text.py
    #                               reading_words, filled in by backend/check_drafter.py (None: not worded)

    @property
    def name(self) -> str:
        eng = engine_label(self.engine)
        return f"{eng} {self.version}" + (f" ({self.runner.upper()} runner)" if self.runner else "")

    def to_json(self) -> dict:
        return {**asdict(self), "name": self.name}


@dataclass
class TargetInfo:
    path: str
    n_layers: int
    hidden_size: int
    vocab_size: int
    model_type: str | None
    family: str
    raw: dict = field(default_factory=dict, repr=False)
    architectures: list[str] = field(default_factory=list)
    config_file: str = ""

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("raw")
        return d


@dataclass
class WeightInfo:
    """What the checkpoint holds, read from the safetensors header (shapes) and the d2t tensor."""
    file: str
    shapes: dict[str, list[int]]
    d2t: list[int] | None = None

    def shape(self, key: str) -> list[int] | None:
        for k, v in self.shapes.items():
            if k == key or k.endswith("." + key) or k.removeprefix("model.") == key:
                return v
        return None

    @property
    def has_embed(self) -> bool:
        return self.shape("embed_tokens.weight") is not None

    @property
    def has_lm_head(self) -> bool:
        return self.shape("lm_head.weight") is not None


# ---------------------------------------------------------------------------- inputs

def target_info(path: str | Path) -> TargetInfo:
    """The target's shape from its config.json (a model directory or the config file itself; multimodal targets:
    the text_config). Reads no weights, so a config-only directory of a 671B target is enough."""
    from backend.vllm_runner import architectures_of

    p = Path(path)
    f = p if p.is_file() else p / "config.json"
    raw = read_object(f, "target config", "no target config; pass --target a model directory holding config.json "
                                          "(saved with save_pretrained), or the config file itself")
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    try:
        n, h, v = int(text["num_hidden_layers"]), int(text["hidden_size"]), int(text["vocab_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise SpecLensError(f"{f}: no {e.args[0] if isinstance(e, KeyError) else 'valid'} num_hidden_layers / "
                            "hidden_size / vocab_size; pass --target a causal LM directory saved with "
                            "save_pretrained") from None
    mt = text.get("model_type") or raw.get("model_type")
    return TargetInfo(str(path), n, h, v, mt, coords.family_of(mt), raw, architectures_of(raw), str(f))


def weight_info(drafter_dir: str | Path, required: bool = True) -> WeightInfo | None:
    """Tensor shapes from the safetensors header (no tensor is read) and the d2t offsets (None: no weights file
    and not `required`, as in a lint of a config alone)."""
    f = Path(drafter_dir) / "model.safetensors"
    if not f.is_file():
        if not required:
            return None
        raise SpecLensError(f"{f}: no drafter weights; put model.safetensors next to config.json")
    try:
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
    except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecLensError(f"{f}: not a safetensors file ({type(e).__name__}); re-download the weights") from None
    shapes = {k: list(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    d2t = None
    if any(k == "d2t" or k.endswith(".d2t") for k in shapes):
        from safetensors import safe_open

        with safe_open(str(f), "numpy") as st:                      # numpy: a lint imports no torch
            key = next(k for k in st.keys() if k == "d2t" or k.endswith(".d2t"))
            d2t = [int(x) for x in st.get_tensor(key).tolist()]
    return WeightInfo(str(f), shapes, d2t)


def _cfg_file(cfg: DrafterConfig) -> str:
    return cfg.config_file or str(Path(cfg.name) / "config.json")


def check_inputs(cfg: DrafterConfig, target: TargetInfo) -> None:
    """One-line errors for a drafter that cannot belong to this target, naming the file and the fix."""
    f, tf = _cfg_file(cfg), target.config_file or str(Path(target.path) / "config.json")
    if cfg.target_hidden_size != target.hidden_size:
        src = "target_hidden_size" if "target_hidden_size" in _raw(cfg) else "hidden_size (no target_hidden_size)"
        raise SpecLensError(f"{f}: {src} {cfg.target_hidden_size} but the target {tf} has hidden_size "
                            f"{target.hidden_size}: this drafter was built for another target; pass the drafter's "
                            f"own target with --target, or a drafter trained for this one")
    if cfg.vocab_size != target.vocab_size:
        raise SpecLensError(f"{f}: vocab_size {cfg.vocab_size} but the target {tf} has vocab_size {target.vocab_size}: "
                            f"this drafter was built for another tokenizer; pass the drafter's own target with "
                            f"--target, or a drafter trained for this one")
    n = target.n_layers
    for where, ids in (("top-level", cfg.aux_layer_ids_top), ("eagle_config", cfg.aux_layer_ids_nested)):
        if ids is None:
            continue
        if not isinstance(ids, list) or not all(isinstance(a, int) and not isinstance(a, bool) for a in ids):
            raise SpecLensError(f"{f}: {where} {IDS_KEY} = {ids!r} is not a list of integers; write layer ids "
                                f"like [2, {n // 2}, {n - 3}]")
        bad = [a for a in ids if not -1 <= a <= n]
        if bad:
            raise SpecLensError(f"{f}: {where} {IDS_KEY} {ids} has id(s) {bad} out of range for the {n}-layer "
                                f"target {target.path} (ids are 0..{n}, -1 = embeddings in SGLang); write ids of "
                                f"this target's layers, or pass the drafter's own target with --target")


def _raw(cfg: DrafterConfig) -> dict:
    try:
        return json.loads(Path(_cfg_file(cfg)).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


# ---------------------------------------------------------------------------- engine readings

def engine_readings(cfg: DrafterConfig, target: TargetInfo, versions: dict[str, str] | None = None,
                    runner: RunnerChoice | None = None) -> list[Reading]:
    """What vLLM (V2 and V1 runners) and SGLang will feed this drafter on this target.

    Both vLLM runners are listed; `picked` marks the one vLLM itself uses for this target (`runner`, default: as
    vLLM decides from the target's architectures and this process's environment, backend/vllm_runner.py)."""
    from backend.drafter.aux import drafter_aux_boundaries
    from backend.vllm_runner import resolve

    versions = {**coords.DEFAULT_VERSIONS, **{k: v for k, v in (versions or {}).items() if v}}
    from backend.drafter.aux import kind_aux
    from backend.drafter.kinds import runner_args
    kind = getattr(cfg, "kind", "eagle3")
    choice = runner or resolve("auto", target.architectures, versions["vllm"], target_config=target.raw or None,
                               **runner_args(kind))
    out = []
    for producer, rn in ENGINE_READINGS:
        version = versions[producer]
        conv = coords.convention_for(producer, version, target.family, rn)   # unknown version: one-line error
        rule = (conv.ids_from.get(rn) if rn else None) or conv.ids_from.get("any") or "top_then_nested"
        row = Reading(producer, version, rn, rule, None, None, None)
        if rn:
            row.picked = rn == choice.runner
            row.why = (choice.reason if row.picked else
                       f"not picked: vLLM uses {choice.runner.upper()} ({choice.reason})")
        try:
            aux = (kind_aux(cfg, target, producer, version, rn) if kind != "eagle3" else
                   drafter_aux_boundaries(cfg, target.n_layers, target.model_type, producer, version, rn))
            row.ids, row.ids_from, row.boundaries = aux["ids"], aux["ids_from"], aux["boundaries"]
            row.captures = row.boundaries
        except SpecLensError as e:
            row.error = str(e)
            top, nested = cfg.aux_layer_ids_top, cfg.aux_layer_ids_nested
            row.ids = {"top_level": top, "nested": nested}.get(rule, top or nested)
            try:                                     # e.g. 4 ids for an fc built for 3: captured, then fails to load
                bs = coords.resolve_ids(producer, row.ids or None, target.n_layers, version=version,
                                        family=target.family, runner=rn)
                row.captures = coords.labels(sorted(set(bs), key=lambda b: b.sort_key()))
            except SpecLensError:
                row.captures = None
        if producer == "sglang" and cfg.source_format not in ("eagle", "dflash", "dflash2", "mtp") \
                and row.error is None:
            row.error = (f"SGLang loads only the EAGLE/SpecForge format (LlamaForCausalLMEagle3); this is "
                         f"{cfg.source_format}; it would feed {', '.join(row.boundaries or [])} once converted")
            row.boundaries = None                    # it feeds nothing: it cannot load the drafter
        out.append(row)
    return out


def picked(readings: list[Reading], engine: str) -> Reading:
    """The reading of `engine` that the engine really uses (vLLM: the runner it picks)."""
    return next(r for r in readings if r.engine == engine and r.picked)


def ids_for(reading: Reading, boundaries: list[str], target: TargetInfo) -> list[int] | None:
    """The ids that make `reading`'s engine feed exactly `boundaries` (None: it cannot, e.g. F)."""
    if any(b == "F" for b in boundaries):
        return None
    idx = [int(coords.label_index(b)) for b in boundaries]
    for shift in (0, -1):
        ids = [a + shift for a in idx]
        try:
            got = coords.resolve_ids(reading.engine, ids, target.n_layers, version=reading.version,
                                     family=target.family, runner=reading.runner)
        except SpecLensError:
            continue
        if sorted(coords.labels(got), key=coords.label_index) == list(boundaries):
            return ids
    return None


def where_to_write(reading: Reading) -> str:
    return f"eagle_config.{IDS_KEY}" if reading.engine == "sglang" else f"top-level {IDS_KEY}"


# ---------------------------------------------------------------------------- findings

def lint(cfg: DrafterConfig, target: TargetInfo, weights: WeightInfo | None, readings: list[Reading],
         focus: Reading) -> list[Finding]:
    """Findings about the config, the weights (None: a config alone, so no shape, d2t or embedding checks) and
    the engine readings (most severe first); backend/text/check_text.py words each `code`."""
    out: list[Finding] = []
    f = _cfg_file(cfg)
    by = {(r.engine, r.runner): r for r in readings}
    v2, v1, sg = by.get(("vllm", "v2")), by.get(("vllm", "v1")), by.get(("sglang", None))
    top, nested = cfg.aux_layer_ids_top, cfg.aux_layer_ids_nested

    for r in readings:
        if r.error:
            out.append(Finding("error" if r is focus else "warning", "cannot_serve",
                               {"name": r.name, "error": r.error}))

    # where the ids are written, against where each engine reads them
    if nested and not top and v2 and v1 and v2.boundaries:
        same = v1.boundaries == v2.boundaries
        g = {"file": f, "ids": nested, "key": IDS_KEY, "v1": v1.boundaries, "v2": v2.boundaries, "same": same}
        if v2.picked:
            out.append(Finding("info" if same else "error" if focus is v2 else "warning", "nested_ids_v2_picked",
                               {**g, "version": v2.version, "why": v2.why}))
        else:
            out.append(Finding("info" if same else "warning", "nested_ids_v1_picked",
                               {**g, "version": v1.version, "why": v1.why}))
    if top and not nested and sg and (sg.boundaries or sg.error):
        vl = next((r for r in (v2, v1) if r and r.picked), v2 or v1)
        same = bool(vl and vl.boundaries == sg.boundaries)
        out.append(Finding("info" if same else "error" if focus is sg else "warning", "top_ids_sglang", {
            "file": f, "ids": top, "key": IDS_KEY, "feeds": bool(sg.boundaries), "sglang": sg.boundaries or sg.captures,
            "vllm": vl.boundaries if vl and vl.boundaries else None}))
    if top and nested and top != nested:
        out.append(Finding("info", "top_and_nested_ids_differ", {"file": f, "top": top, "nested": nested}))
    fed = {r.name: tuple(r.boundaries) for r in readings if r.boundaries and not r.error and r.picked}
    if len(set(fed.values())) > 1:
        out.append(Finding("warning", "engines_differ", {"fed": [[name, list(b)] for name, b in fed.items()]}))
    ids_any = top if top is not None else nested
    if ids_any and any(a < 0 for a in ids_any):
        out.append(Finding("warning", "negative_ids", {"file": f, "ids": [a for a in ids_any if a < 0]}))
    if ids_any and list(ids_any) != sorted(ids_any):
        out.append(Finding("info", "ids_not_ascending", {"file": f, "ids": ids_any}))

    if weights is None:
        out.append(Finding("info", "config_only", {"file": f}))
        out.extend(_flag_findings(cfg, f, focus))
        return sort_findings(out)

    # k (aux count) against fc, and the fields vLLM/SGLang need for it
    fc = weights.shape("fc.weight")
    if fc is not None and cfg.target_hidden_size and fc[1] % cfg.target_hidden_size == 0:
        k_w = fc[1] // cfg.target_hidden_size
        if k_w != cfg.num_aux:
            out.append(Finding("error", "fc_k_differs", {
                "weights": weights.file, "k": k_w, "target_hidden_size": cfg.target_hidden_size,
                "num_aux": cfg.num_aux, "num_aux_source": cfg.num_aux_source, "file": f}))
        elif k_w != 3 and cfg.num_aux_source != "num_aux_hidden_states":
            out.append(Finding("warning", "k_from_nested_ids", {"file": f, "k": k_w,
                                                                 "num_aux_source": cfg.num_aux_source}))
    elif fc is not None:
        out.append(Finding("error", "fc_width", {"weights": weights.file, "fc": fc,
                                                 "target_hidden_size": cfg.target_hidden_size}))

    # d2t offsets
    if weights.d2t is not None:
        mapped = [i + o for i, o in enumerate(weights.d2t)]
        bad = [i for i, t in enumerate(mapped) if not 0 <= t < target.vocab_size]
        if bad:
            out.append(Finding("error", "d2t_out_of_range", {
                "weights": weights.file, "count": len(bad), "vocab_size": target.vocab_size, "draft_id": bad[0],
                "target_id": mapped[bad[0]]}))
        elif len(set(mapped)) != len(mapped):
            out.append(Finding("warning", "d2t_collisions", {"weights": weights.file,
                                                             "count": len(mapped) - len(set(mapped))}))
        elif all(o == 0 for o in weights.d2t) and cfg.draft_vocab_size < target.vocab_size:
            out.append(Finding("info", "d2t_zeros", {"weights": weights.file,
                                                     "draft_vocab_size": cfg.draft_vocab_size}))

    out.extend(_flag_findings(cfg, f, focus))

    # embeddings and LM head the engines substitute
    if not weights.has_embed:
        out.append(Finding("info", "no_embed_tokens"))
    if not weights.has_lm_head and not cfg.tie_word_embeddings and not _target_head_kind(cfg):
        out.append(Finding("warning", "no_lm_head", {"weights": weights.file}))
    return sort_findings(out)


FIELDS_FILE = Path(__file__).resolve().parents[1] / "drafter_fields.yaml"
# the drafter model file each engine loads SpecLens's three formats with (LlamaForCausalLMEagle3 et al.)
LLAMA_DRAFTER = {"vllm": "vllm/model_executor/models/llama_eagle3.py", "sglang": "sglang/srt/models/llama_eagle3.py"}
FIELD_COST_FILE = Path(__file__).resolve().parents[2] / "docs" / "results" / "field_cost_toy.json"


@lru_cache(maxsize=1)
def drafter_fields() -> tuple[dict, ...]:
    """backend/drafter_fields.yaml: which release honours which field (tools/rederive_conventions.py --fields)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # the C loader: the pure-Python one took seconds
    return tuple(yaml.load(FIELDS_FILE.read_text(), Loader=loader) or ()) if FIELDS_FILE.exists() else ()  # noqa: S506


def field_status(engine: str, version: str, field: str) -> dict | None:
    """The drafter_fields.yaml row for the Llama drafter file of this release (None: not derived)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(version)
    except InvalidVersion:
        return None
    return next((r for r in drafter_fields() if r["engine"] == engine and r["field"] == field
                 and r["file"] == LLAMA_DRAFTER.get(engine) and v in SpecifierSet(r["versions"])), None)


def _set_fields(cfg: DrafterConfig) -> list[str]:
    """The fields of drafter_fields.yaml this config sets to a non-default (true) value."""
    raw = _raw(cfg)
    out = ["norm_before_fc"] if cfg.norm_before_fc else []
    if raw.get("fc_norm"):
        out.append("fc_norm")
    elif raw.get("use_aux_norm"):
        out.append("use_aux_norm")
    if cfg.norm_before_residual and not cfg.norm_before_residual_defaulted:
        out.append("norm_before_residual")
    return out + [k for k in _more_fields_set(cfg, raw)]


def _more_fields_set(cfg: DrafterConfig, raw: dict) -> list[str]:
    """The other table fields the config gives a value that matters: a draft vocab smaller than the vocab (and so
    its d2t), a target width other than its own, a rope base or scaling, a window, tied embeddings, a head width
    other than hidden_size / num_attention_heads."""
    out = []
    if raw.get("draft_vocab_size") and int(raw["draft_vocab_size"]) < int(raw.get("vocab_size") or 0):
        out += ["draft_vocab_size", "d2t"]
    if raw.get("target_hidden_size") and raw["target_hidden_size"] != raw.get("hidden_size"):
        out.append("target_hidden_size")
    out += [k for k in ("rope_theta", "rope_scaling", "sliding_window", "tie_word_embeddings") if raw.get(k)]
    heads = raw.get("num_attention_heads")
    if raw.get("head_dim") and heads and raw.get("hidden_size") and raw["head_dim"] != raw["hidden_size"] // heads:
        out.append("head_dim")
    return out


def _field_value(raw: dict, key: str):
    return {"d2t": raw.get("draft_vocab_size")}.get(key, raw.get(key))


def field_costs() -> dict[str, dict]:
    """docs/results/field_cost_toy.json (tools/field_cost.py) by field: a list of entries (an old single entry too)."""
    if not FIELD_COST_FILE.exists():
        return {}
    c = json.loads(FIELD_COST_FILE.read_text())
    return {e["field"]: e for e in ([c] if isinstance(c, dict) else c) if isinstance(e, dict) and "field" in e}


def _release_field_findings(cfg: DrafterConfig, f: str, focus: Reading | None) -> tuple[list[Finding], set[str]]:
    """A finding per field the config sets that the chosen release ignores; the fields the table covers for it."""
    out: list[Finding] = []
    covered: set[str] = set()
    if focus is None:
        return out, covered
    for key in _set_fields(cfg):
        row = field_status(focus.engine, focus.version, key)
        if row is None:
            continue                                   # not derived for this release: no release finding
        covered.add(key)
        raw = _raw(cfg)
        gated = (key == "sliding_window" and row["status"] == "honoured" and "layer_types" in row["decided_by"]
                 and "sliding_attention" not in (raw.get("layer_types") or []))
        if row["status"] == "ignored" or gated:
            v = _field_value(raw, key)
            out.append(Finding("warning", "release_ignores_field", {
                "engine": focus.engine, "version": focus.version, "key": key,
                "value": "true" if v is True else json.dumps(v), "model_file": row["file"], "gated": gated,
                "file": f, "decided_by": row["decided_by"], "cost": field_costs().get(key)}))
    return out, covered


def _flag_findings(cfg: DrafterConfig, f: str, focus: Reading | None = None) -> list[Finding]:
    """Flags whose meaning differs between engines, from the config alone; with `focus`, the fields that release
    ignores (backend/drafter_fields.yaml)."""
    out, covered = _release_field_findings(cfg, f, focus)
    if cfg.norm_before_residual and not any(x.figures.get("key") == "norm_before_residual" for x in out):
        out.append(Finding("warning", "norm_before_residual", {"file": f,
                                                               "defaulted": cfg.norm_before_residual_defaulted}))
    if cfg.norm_before_fc and "norm_before_fc" not in covered:   # the release's own answer is above
        out.append(Finding("warning", "norm_before_fc", {"file": f}))
    if cfg.tie_word_embeddings:
        out.append(Finding("warning", "tie_word_embeddings", {"file": f}))
    if cfg.norm_output:
        out.append(Finding("info", "norm_output", {"file": f}))
    if not cfg.draft_vocab_size_given and not _target_head_kind(cfg):
        out.append(Finding("warning", "no_draft_vocab_size", {"file": f}))
    return out


def embedding_findings(own: object | None, target_embed: object, engine: str) -> list[Finding]:
    """The drafter's own embed_tokens [V, H] against the target's: SGLang substitutes the target's."""
    if own is None or tuple(own.shape) != tuple(target_embed.shape):
        return []
    a, b = own.detach().float(), target_embed.detach().float().to(own.device)
    rel = float((a - b).norm() / b.norm().clamp_min(1e-12))
    if rel < 1e-3:
        return [Finding("ok", "embeddings_equal", {"rel": rel})]
    return [Finding("warning", "embeddings_differ", {"rel": rel, "engine": engine})]


def sort_findings(fs: list[Finding]) -> list[Finding]:
    return sorted(fs, key=lambda x: SEVERITIES.index(x.severity))


def load(drafter: str | Path, target: str | Path,
         weights_required: bool = True) -> tuple[DrafterConfig, TargetInfo, WeightInfo | None]:
    """Config, target shape and weight header, with the drafter-for-another-target errors raised."""
    cfg = load_config(drafter)
    t = target_info(target)
    check_inputs(cfg, t)
    return cfg, t, weight_info(cfg.name, required=weights_required)


def _target_head_kind(cfg) -> bool:
    """A drafter kind that always uses the target's LM head (DFlash: backend/drafter/dflash.py), for which a missing
    lm_head.weight or draft_vocab_size is no finding."""
    from backend.drafter.kinds import DFLASH_LIKE

    return getattr(cfg, "kind", "eagle3") in DFLASH_LIKE
