"""EAGLE-3 drafter config: one dataclass and loaders for the three on-disk formats.

Formats (docs/CONVENTIONS.md#drafter-formats), told apart by `config.json`:

- "eagle": EAGLE / SpecForge / SGLang-native. A LlamaConfig with
  `architectures: ["LlamaForCausalLMEagle3"]`, `draft_vocab_size`, optional `target_hidden_size`,
  flags at the top level and `eagle_config: {eagle_aux_hidden_state_layer_ids, use_aux_hidden_state}`.
  Weights `midlayer.*`.
- "speculators": `speculators_config` + `transformer_layer_config` (the Llama shape), flags and
  `eagle_aux_hidden_state_layer_ids` at the top level. Weights `layers.0.*`, with `embed_tokens`.
- "vllm": vLLM-native `Eagle3LlamaForCausalLM`: laid out like "eagle"; vLLM maps `midlayer.` to
  `layers.0.` so either weight prefix loads.

How each flag is read (verified in sources, see the notes per field below):

- `norm_before_fc` (one RMSNorm `input_norm [k*H_T]` over the concatenated aux states before fc):
  vLLM `llama_eagle3.py` LlamaModel.__init__ reads `eagle_config["norm_before_fc"]` first, then the
  top level, default False. The speculators converter (vLLM
  `transformers_utils/configs/speculators/algos.py` update_eagle3) copies the top-level value,
  default False (newer copies of that converter also forward `fc_norm` and `norm_output`; older ones
  drop them). SGLang's `llama_eagle3.py` builds no `input_norm` up to 0.5.16 (it ignores this flag) and reads
  and applies it from 0.5.17 (derived per release from the wheels: backend/drafter_fields.yaml, which the lint
  uses).
- `fc_norm` (one RMSNorm `fc_norm.{i} [H_T]` per aux chunk, applied after `input_norm`, before fc):
  vLLM `combine_hidden_states`; SGLang honours it too (also as legacy `use_aux_norm` with weights
  `aux_norm_low/mid/high`).
- `norm_before_residual`: vLLM LlamaDecoderLayer `_norm_before_residual` makes the residual the
  *normed* fc output; default False, but the speculators converter defaults it to True when absent.
  SGLang always uses the un-normed fc output as residual (ignores the flag).
- `norm_output`: vLLM LlamaModel.forward and SGLang LlamaModel.forward return the post-norm state
  as the hidden for the next draft step when set (meaning "next_step"; logits always come from the
  normed state). SpecForge may read it as "apply the final norm before
  lm_head" (meaning "lm_head"); that reading was not found in the SpecForge sources searched, so
  it is offered as an option, not a default.
- aux count k: vLLM and SGLang both use `num_aux_hidden_states`, else the length of the *nested*
  `eagle_config.eagle_aux_hidden_state_layer_ids`, else 3 (top-level ids are not counted).
- `draft_vocab_size` absent: vLLM uses the vocab size with the drafter's own lm_head; SGLang then
  takes the target's lm_head (`load_lm_head_from_target`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from backend.errors import SpecLensError

FORMATS = ("eagle", "speculators", "vllm")
ARCH_EAGLE = "LlamaForCausalLMEagle3"
ARCH_VLLM = "Eagle3LlamaForCausalLM"
ARCH_SPECULATORS = "Eagle3Speculator"
NORM_OUTPUT_MEANINGS = ("next_step", "lm_head")


@dataclass
class DrafterConfig:
    # shapes
    hidden_size: int                      # H, the drafter's width
    target_hidden_size: int               # H_T, width of each target aux state
    num_aux: int                          # k, number of aux states concatenated into fc
    vocab_size: int                       # V, target vocab (embedding rows)
    draft_vocab_size: int                 # V_d, lm_head rows
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None      # e.g. {"rope_type": "llama3", "factor": 8.0, ...}
    max_position_embeddings: int = 4096
    attention_bias: bool = False
    # flags
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_before_residual: bool = False
    norm_output: bool = False
    norm_output_meaning: str = "next_step"  # "next_step" (vLLM, SGLang) or "lm_head" (SpecForge, docs/CONVENTIONS.md)
    tie_word_embeddings: bool = False
    draft_vocab_size_given: bool = True   # False: config had none (SGLang then uses the target's lm_head)
    # where things came from
    num_aux_source: str = "default"       # "num_aux_hidden_states" | "eagle_config ids" | "default"
    norm_before_fc_source: str = "default"  # "eagle_config" | "top-level" | "default"
    norm_before_residual_defaulted: bool = False  # True: absent in a speculators config, taken as True
    aux_layer_ids_top: list[int] | None = None     # top-level eagle_aux_hidden_state_layer_ids, as written
    aux_layer_ids_nested: list[int] | None = None  # eagle_config.eagle_aux_hidden_state_layer_ids, as written
    architecture: str = ARCH_EAGLE
    source_format: str = "eagle"          # one of FORMATS
    speculative_tokens: int | None = None  # speculators proposal_methods[0].speculative_tokens
    verifier: str | None = None           # speculators verifier name_or_path
    name: str = ""                        # where it was loaded from (the directory)
    config_file: str = ""                 # the config file read (config.json, or a file given by name)
    # filled in from the weights at load time (None = not known from the config alone)
    has_embed_tokens: bool | None = None
    has_lm_head: bool | None = None
    kind: str = "eagle3"                  # backend/drafter/kinds.py: eagle3, eagle3_1, eagle3_mla, p_eagle, dflash...
    mla: dict | None = None               # eagle3_mla: the MLA_FIELDS (backend/drafter/mla.py); None: Llama attention

    @property
    def aux_layer_ids_where(self) -> str:
        top, nested = self.aux_layer_ids_top is not None, self.aux_layer_ids_nested is not None
        return {(True, True): "both", (True, False): "top-level",
                (False, True): "eagle_config"}.get((top, nested), "none")

    @property
    def fc_in(self) -> int:
        return self.num_aux * self.target_hidden_size

    def to_dict(self) -> dict:
        return asdict(self)


MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def mla_fields(raw: dict) -> dict:
    """The MLA shape of an Eagle3DeepseekV2/V3 config as written (None where absent; q_lora_rank null: one q_proj).
    The lint reads configs without them; building the attention (backend/drafter/mla.py) needs all but q_lora_rank."""
    return {k: (int(raw[k]) if raw.get(k) else None) for k in MLA_FIELDS}


def _num_aux(raw: dict, nested: dict) -> tuple[int, str]:
    if raw.get("num_aux_hidden_states") is not None:
        return int(raw["num_aux_hidden_states"]), "num_aux_hidden_states"
    if nested.get("eagle_aux_hidden_state_layer_ids"):
        return len(nested["eagle_aux_hidden_state_layer_ids"]), "eagle_config ids"
    return 3, "default"


def _shape_fields(llama: dict, name: str) -> dict:
    """Llama shape fields; `llama` is the LlamaConfig dict (top level, or transformer_layer_config)."""
    try:
        H, heads = int(llama["hidden_size"]), int(llama["num_attention_heads"])
        out = dict(
            hidden_size=H, num_heads=heads, vocab_size=int(llama["vocab_size"]),
            num_kv_heads=int(llama.get("num_key_value_heads") or heads),
            head_dim=int(llama.get("head_dim") or H // heads),
            intermediate_size=int(llama["intermediate_size"]),
        )
    except KeyError as e:
        raise SpecLensError(f"{name}: missing {e.args[0]!r}; a drafter config.json needs the Llama shape "
                            "(hidden_size, num_attention_heads, intermediate_size, vocab_size)") from None
    rope = llama.get("rope_parameters") or llama.get("rope_scaling") or None  # transformers 5 writes rope_parameters
    theta = llama.get("rope_theta", (rope or {}).get("rope_theta", 10000.0))
    if rope and rope.get("rope_type", rope.get("type", "default")) == "default":
        rope = None
    out.update(rms_norm_eps=float(llama.get("rms_norm_eps", 1e-5)), rope_theta=float(theta), rope_scaling=rope,
               max_position_embeddings=int(llama.get("max_position_embeddings", 4096)),
               attention_bias=bool(llama.get("attention_bias", False)),
               tie_word_embeddings=bool(llama.get("tie_word_embeddings", False)))
    return out


def detect_format(raw: dict, name: str) -> str:
    if "speculators_config" in raw or raw.get("speculators_model_type"):
        return "speculators"
    archs = raw.get("architectures")
    if not archs:
        raise SpecLensError(f"{name}: no 'architectures'; add \"architectures\": [\"{ARCH_EAGLE}\"] (EAGLE/SpecForge) "
                            f"or [\"{ARCH_VLLM}\"] (vLLM-native)")
    if ARCH_EAGLE in archs:
        return "eagle"
    if ARCH_VLLM in archs:
        return "vllm"
    from backend.drafter.kinds import EAGLE_LIKE, kind_of
    if kind_of(raw) in EAGLE_LIKE[1:]:               # P-EAGLE, EAGLE-3 MLA: laid out (and their ids read) as EAGLE-3
        return "eagle"
    raise SpecLensError(f"{name}: unknown drafter format (architectures {archs}); expected {ARCH_EAGLE}, "
                        f"{ARCH_VLLM} or a speculators config with speculators_config")


def _kind_config(raw: dict, name: str, kind: str) -> DrafterConfig:
    """A DFlash / DFlash2 / MTP drafter: its shape, and k = the target states its fc takes (drafter/kinds.py)."""
    from backend.drafter.kinds import trained_count

    layer = raw.get("transformer_layer_config") or raw
    shape = _shape_fields({**layer, "head_dim": layer.get("head_dim") or raw.get("head_dim")}, name)
    k = trained_count(raw, kind) or 1
    dvs = raw.get("draft_vocab_size")
    archs = raw.get("architectures") or [kind]
    return DrafterConfig(
        **shape, target_hidden_size=int(raw.get("target_hidden_size") or shape["hidden_size"]), num_aux=k,
        num_aux_source="dflash ids" if kind != "mtp" else "default",
        draft_vocab_size=int(dvs) if dvs is not None else shape["vocab_size"], draft_vocab_size_given=dvs is not None,
        aux_layer_ids_top=raw.get("eagle_aux_hidden_state_layer_ids"), architecture=str(archs[0]),
        source_format=kind, name=name, kind=kind)


def config_from_dict(raw: dict, name: str = "config.json") -> DrafterConfig:
    from backend.drafter.kinds import kind_of

    kind = kind_of(raw)
    cfg = _kind_config(raw, name, kind) if kind in ("dflash", "dflash2", "mtp") else _config_from_dict(raw, name, kind)
    cfg._raw = raw                     # what backend/drafter/kinds.py reads (not a field: not in reports)
    return cfg


def _config_from_dict(raw: dict, name: str, kind: str) -> DrafterConfig:
    fmt = detect_format(raw, name)
    if fmt == "speculators":
        if raw.get("speculators_model_type", "eagle3") not in ("eagle3", "peagle"):
            raise SpecLensError(f"{name}: speculators_model_type {raw.get('speculators_model_type')!r} is not "
                                "an EAGLE-3 drafter; use an eagle3 speculator")
        llama = raw.get("transformer_layer_config") or {}
        shape = _shape_fields(llama, name)
        shape["tie_word_embeddings"] = bool(raw.get("tie_word_embeddings", shape["tie_word_embeddings"]))
        nested: dict = {}
        k, k_src = _num_aux({**llama, **raw}, nested)
        nbr_given = "norm_before_residual" in raw
        nbr = bool(raw["norm_before_residual"]) if nbr_given else True  # vLLM update_eagle3 default
        nbf, nbf_src = (bool(raw["norm_before_fc"]), "top-level") if "norm_before_fc" in raw else (False, "default")
        spec = raw.get("speculators_config") or {}
        methods = spec.get("proposal_methods") or [{}]
        extra = dict(norm_before_residual_defaulted=not nbr_given,
                     speculative_tokens=methods[0].get("speculative_tokens"),
                     verifier=(spec.get("verifier") or {}).get("name_or_path"))
        arch = (raw.get("architectures") or [ARCH_SPECULATORS])[0]
    else:
        shape = _shape_fields(raw, name)
        nested = raw.get("eagle_config") or {}
        if nested.get("use_aux_hidden_state") is False:
            raise SpecLensError(f"{name}: eagle_config.use_aux_hidden_state is false, so this is not an EAGLE-3 "
                                "drafter; use an EAGLE-3 checkpoint")
        k, k_src = _num_aux(raw, nested)
        nbr = bool(raw.get("norm_before_residual", False))
        if "norm_before_fc" in nested:
            nbf, nbf_src = bool(nested["norm_before_fc"]), "eagle_config"
        elif "norm_before_fc" in raw:
            nbf, nbf_src = bool(raw["norm_before_fc"]), "top-level"
        else:
            nbf, nbf_src = False, "default"
        extra = {}
        arch = ARCH_EAGLE if fmt == "eagle" else ARCH_VLLM
    dvs = raw.get("draft_vocab_size")
    if kind != "eagle3":
        extra["kind"] = kind
    if kind == "eagle3_mla":
        extra["mla"] = mla_fields(raw)
        arch = str((raw.get("architectures") or [arch])[0])
    return DrafterConfig(
        **shape,
        target_hidden_size=int(raw.get("target_hidden_size") or shape["hidden_size"]),
        num_aux=k, num_aux_source=k_src,
        draft_vocab_size=int(dvs) if dvs is not None else shape["vocab_size"], draft_vocab_size_given=dvs is not None,
        norm_before_fc=nbf, norm_before_fc_source=nbf_src, fc_norm=bool(raw.get("fc_norm") or raw.get("use_aux_norm")),
        norm_before_residual=nbr, norm_output=bool(raw.get("norm_output", False)),
        aux_layer_ids_top=raw.get("eagle_aux_hidden_state_layer_ids"),
        aux_layer_ids_nested=nested.get("eagle_aux_hidden_state_layer_ids"),
        architecture=arch, source_format=fmt, name=name, **extra,
    )


def load_config(path: str | Path) -> DrafterConfig:
    """Read `<path>/config.json` (or `path` itself if it is a file) into a DrafterConfig."""
    path = Path(path)
    file = path if path.is_file() else path / "config.json"
    if not file.is_file():
        raise SpecLensError(f"{file}: no drafter config; point at the drafter directory holding config.json "
                            "and model.safetensors")
    try:
        raw = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise SpecLensError(f"{file}: not valid JSON ({e.msg} at line {e.lineno}); "
                            f"fix or re-download the file") from None
    cfg = config_from_dict(raw, str(file))
    cfg.name, cfg.config_file = str(file.parent), str(file)
    return cfg


def config_to_dict(cfg: DrafterConfig, fmt: str = "eagle", aux_layer_ids: list[int] | None = None) -> dict[str, Any]:
    """The config.json for `fmt`. Aux ids go where each format's reader looks: nested
    `eagle_config` for "eagle"/"vllm", top level for "speculators"."""
    if fmt not in FORMATS:
        raise SpecLensError(f"unknown drafter format {fmt!r}; use one of {', '.join(FORMATS)}")
    ids = aux_layer_ids if aux_layer_ids is not None else (cfg.aux_layer_ids_nested or cfg.aux_layer_ids_top)
    llama: dict[str, Any] = dict(
        model_type="llama", hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        num_hidden_layers=1, hidden_act="silu", rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        rope_scaling=cfg.rope_scaling, max_position_embeddings=cfg.max_position_embeddings,
        vocab_size=cfg.vocab_size, attention_bias=cfg.attention_bias, tie_word_embeddings=cfg.tie_word_embeddings,
        num_aux_hidden_states=cfg.num_aux,
    )
    flags = dict(draft_vocab_size=cfg.draft_vocab_size, target_hidden_size=cfg.target_hidden_size,
                 norm_before_fc=cfg.norm_before_fc, fc_norm=cfg.fc_norm,
                 norm_before_residual=cfg.norm_before_residual, norm_output=cfg.norm_output)
    if fmt == "speculators":
        return dict(
            architectures=[ARCH_SPECULATORS], speculators_model_type="eagle3", **flags,
            eagle_aux_hidden_state_layer_ids=ids, transformer_layer_config=llama,
            speculators_config=dict(
                algorithm="eagle3", default_proposal_method="greedy",
                proposal_methods=[dict(proposal_type="greedy", speculative_tokens=cfg.speculative_tokens or 3)],
                verifier=dict(name_or_path=cfg.verifier, architectures=["LlamaForCausalLM"])),
        )
    arch = ARCH_EAGLE if fmt == "eagle" else ARCH_VLLM
    if cfg.mla:                                  # Eagle3DeepseekV2ForCausalLM: a DeepSeek-V3 shape, one MLA layer
        arch = cfg.architecture
        llama.pop("head_dim")
        llama.update(model_type="deepseek_v3", num_key_value_heads=cfg.num_heads, **cfg.mla)
    return dict(architectures=[arch], **llama, **flags,
                eagle_config=dict(eagle_aux_hidden_state_layer_ids=ids, use_aux_hidden_state=True))
