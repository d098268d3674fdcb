"""Which model runner vLLM picks for a target, V1 or V2, decided the way each vLLM release decides it.

The runner matters for EAGLE-3: the V2 runner reads the drafter's aux ids from the top level of its config (0.27+
also `eagle_config.layer_ids`), the V1 runner the top level, then `eagle_config` (0.22+; 0.20-0.21 the top level
only). backend/conventions.yaml holds, per vLLM minor release 0.20..0.33, `runner_choice`: what
`VllmConfig.use_v2_model_runner` (vllm/config/vllm.py) does in that release's wheel, re-derived by
tools/rederive_conventions.py:

- `env_only` (0.20, 0.21): no automatic choice; V2 only with `VLLM_USE_V2_MODEL_RUNNER=1`.
- `listed` (0.24): `VLLM_USE_V2_MODEL_RUNNER` wins if set; else V2 when an architecture is in
  `DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES` and `_get_v2_model_runner_unsupported_features()` is empty.
- `listed_dense_unquantized` (0.22, 0.23): the same, and the target is neither MoE nor quantized.
- `listed_or_dense` (0.25-0.28): listed, or any non-MoE target (hybrid and attention-free targets stay V1);
  0.27+ prefill context parallelism forces V2.
- `all` (0.29+): every target runs V2 unless an unsupported feature is on (ROCm exceptions do not apply here).

Conditions that force V2 (`forces_v2` of the row, `FORCED` here) and what `VLLM_USE_V2_MODEL_RUNNER=0` does to each
(`forces_v2_env0`): prefill context parallelism (0.27, 0.28) is checked after the variable, so =0 still gives V1;
HiSparse (`hisparse_config`, `attention_config.hisparse_config`) and watermarking (`watermark_config`) (0.30+) are
checked before the variable and before the unsupported features: HiSparse with =0 makes vLLM raise (a SpecLensError
here), watermarking overrides =0. In releases without those checks the two options change nothing.

`UNSUPPORTED` maps each feature name a release's `_get_v2_model_runner_unsupported_features()` appends to a
predicate over the engine options (vLLM's own argument names, as given to `LLM(...)` or `--engine-option`); a
release lists which of them it checks. Seen on the H200 (docs/results/vllm_runner_check_*):
0.24.0 and 0.25.1 agree with this module on every case run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from packaging.version import InvalidVersion, Version

from backend.errors import SpecLensError

ENV = "VLLM_USE_V2_MODEL_RUNNER"
RUNNERS = ("auto", "v2", "v1")
SOURCE = "vllm/config/vllm.py: VllmConfig.use_v2_model_runner, _get_v2_model_runner_unsupported_features"
MOE_KEYS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")   # vLLM get_num_experts
HYBRID_LAYER_KINDS = ("mamba", "linear_attention", "ssm", "conv")

@dataclass(frozen=True)
class RunnerChoice:
    runner: str            # "v1" | "v2"
    requested: str         # "auto" | "v1" | "v2"
    reason: str            # why, in words
    version: str

    def to_json(self) -> dict:
        return asdict(self)


def _opt(options: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """An engine option by vLLM's name (dashes or underscores); JSON strings of dicts are parsed."""
    for k in (key, key.replace("_", "-")):
        if k in options:
            v = options[k]
            if isinstance(v, str) and v.strip().startswith("{"):
                try:
                    return json.loads(v)
                except json.JSONDecodeError:
                    raise SpecLensError(f"--engine-option {key}={v}: not valid JSON; write it like "
                                        f"{key}='{{\"key\": value}}'") from None
            return v
    return default


def _int(v: Any, default: int = 1) -> int:
    try:
        return int(v) if v is not None else default
    except (TypeError, ValueError):
        return default


def _true(v: Any) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on") if v is not None else False


def _sub(options: Mapping[str, Any], key: str) -> dict:
    v = _opt(options, key)
    return v if isinstance(v, dict) else {}


# feature name as vLLM words it (f-strings cut at their placeholder) -> predicate(options, method, target facts)
UNSUPPORTED: dict[str, Callable[[Mapping[str, Any], str, Mapping[str, Any]], bool]] = {
    "prefill context parallelism": lambda o, m, t: _int(_opt(o, "prefill_context_parallel_size")) > 1,
    "stock torch.compile": lambda o, m, t: _int(_sub(o, "compilation_config").get("mode"), 0) == 1,
    "sequence parallelism": lambda o, m, t: _true(_sub(o, "compilation_config").get("pass_config", {}).get("enable_sp"))
    and _int(_opt(o, "tensor_parallel_size")) > 1,
    "pipeline parallelism with external_launcher":
        lambda o, m, t: _opt(o, "distributed_executor_backend") == "external_launcher"
        and _int(_opt(o, "pipeline_parallel_size")) > 1,
    "dynamic speculative decoding":
        lambda o, m, t: _sub(o, "speculative_config").get("num_speculative_tokens_per_batch_size") is not None,
    "parallel drafting for EAGLE speculative decoding":
        lambda o, m, t: _true(_sub(o, "speculative_config").get("parallel_drafting")) and m not in ("dflash", "dspark"),
    "parallel drafting for speculative decoding":
        lambda o, m, t: _true(_sub(o, "speculative_config").get("parallel_drafting")),
    "EAGLE3 with pipeline parallelism": lambda o, m, t: m == "eagle3" and _int(_opt(o, "pipeline_parallel_size")) > 1,
    "dual batch overlap": lambda o, m, t: _true(_opt(o, "enable_dbo")),
    "elastic expert parallelism": lambda o, m, t: _true(_opt(o, "enable_elastic_ep")),
    "routed experts capture": lambda o, m, t: _true(_opt(o, "enable_return_routed_experts")),
    "custom logits processors": lambda o, m, t: bool(_opt(o, "logits_processors")),
    "prompt embeds": lambda o, m, t: _true(_opt(o, "enable_prompt_embeds")),
    "logprobs mode": lambda o, m, t: _opt(o, "logprobs_mode") in ("raw_logits", "processed_logits"),
    "KV sharing fast prefill": lambda o, m, t: _true(_opt(o, "kv_sharing_fast_prefill")),
    "EC transfer": lambda o, m, t: _opt(o, "ec_transfer_config") is not None,
    "ngram/ngram_gpu speculative decoding": lambda o, m, t: m in ("ngram", "ngram_gpu"),
    "speculative method": lambda o, m, t: m not in ("eagle", "eagle3", "mtp", "dflash", "dspark"),
    "hybrid/mamba models": lambda o, m, t: bool(t.get("is_hybrid")),
    "hybrid/mamba models with align cache mode": lambda o, m, t: bool(t.get("is_hybrid"))
    and _opt(o, "mamba_cache_mode") == "align",
    "mamba cache mode": lambda o, m, t: _opt(o, "mamba_cache_mode") == "all",
    "mamba cache mode 'all'": lambda o, m, t: _opt(o, "mamba_cache_mode") == "all",          # 0.30+ wording
    "reasoning budget enforcement": lambda o, m, t: _given(_opt(o, "reasoning_config")),      # 0.22.x
    "heterogeneous-vocabulary draft models":                                                # 0.32+
        lambda o, m, t: _true(_sub(o, "speculative_config").get("use_heterogeneous_vocab")),
    "adaptive verification with LoRA": lambda o, m, t: _true(_sub(o, "speculative_config").get(
        "enable_adaptive_verification")) and _true(_opt(o, "enable_lora")),
    "adaptive verification with enforce_eager/cudagraph_mode=none": lambda o, m, t: _true(_sub(o, "speculative_config")
        .get("enable_adaptive_verification")) and _true(_opt(o, "enforce_eager")),
    "adaptive verification with pipeline parallelism": lambda o, m, t: _true(_sub(o, "speculative_config").get(
        "enable_adaptive_verification")) and _int(_opt(o, "pipeline_parallel_size")) > 1,
}


def _given(v: Any) -> bool:
    """An option value that sets a config (`{}` does: vLLM's defaults); None, "", "none", "null" do not."""
    return v is not None and not (isinstance(v, str) and v.strip().lower() in ("", "none", "null"))


def _hisparse(o: Mapping[str, Any]) -> bool:
    """HiSparse on: `hisparse_config`, `attention_config.hisparse_config`, or an `attention_config` dict holding it
    (vLLM reads `self.attention_config.hisparse_config`)."""
    return (_given(_opt(o, "hisparse_config")) or _given(_opt(o, "attention_config.hisparse_config"))
            or _given(_sub(o, "attention_config").get("hisparse_config")))


# forces_v2 name in backend/conventions.yaml -> (predicate over the engine options, what turns it on, in words)
FORCED: dict[str, tuple[Callable[[Mapping[str, Any]], bool], str]] = {
    "prefill context parallelism": (lambda o: _int(_opt(o, "prefill_context_parallel_size")) > 1,
                                    "prefill_context_parallel_size > 1"),
    "HiSparse": (_hisparse, "hisparse_config"),
    "watermarking": (lambda o: _given(_opt(o, "watermark_config")), "watermark_config"),
}


def _moe_by_name(architectures: list[str]) -> bool:
    names = " ".join(architectures).lower()
    return any(w in names for w in ("moe", "deepseek", "mixtral", "gptoss", "kimi", "qwen3next", "dbrx"))


def target_facts(config: Mapping[str, Any] | None, architectures: list[str] | None = None) -> dict:
    """is_moe / is_quantized / is_hybrid of a target, read from its config.json as vLLM's ModelConfig reads them
    (is_moe: any of vLLM's expert-count keys > 0; is_hybrid: approximated from `layer_types`). Without a config,
    is_moe is guessed from the architecture name (MoE, DeepSeek, Mixtral, GPT-OSS, Kimi) and said so."""
    if config:
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
        c = {**config, **text}
        if any(k in c for k in MOE_KEYS):
            moe, src = any(_int(c.get(k), 0) > 0 for k in MOE_KEYS), "config"
        else:                                   # a config without vLLM's expert-count keys (a shrunken test target)
            moe, src = (_moe_by_name(architectures or [str(a) for a in c.get("architectures") or []]),
                        "architecture name")
        kinds = [str(x).lower() for x in (c.get("layer_types") or [])]
        hybrid = any(any(h in k for h in HYBRID_LAYER_KINDS) for k in kinds)
        return {"is_moe": moe, "is_quantized": bool(c.get("quantization_config")), "is_hybrid": hybrid,
                "from": src}
    moe = _moe_by_name(architectures or [])
    return {"is_moe": moe, "is_quantized": False, "is_hybrid": False, "from": "architecture name"}


def release_rule(version: str) -> dict:
    """`runner_choice` of the conventions-table row for this vLLM release (backend/conventions.yaml)."""
    from backend import coords
    try:
        Version(version)
    except InvalidVersion:
        raise SpecLensError(f"vLLM version '{version}' is not a version number; pass e.g. --engine-version 0.24.0") \
            from None
    try:
        rc = coords.convention_for("vllm", version, "*").runner_choice
    except SpecLensError:
        rc = {}
    if not rc:
        known = ", ".join(known_releases()) or "none"
        raise SpecLensError(f"vLLM {version}: which model runner it picks is not known to SpecLens (known: {known}); "
                            f"pass --runner v1 or --runner v2, or add the release with tools/rederive_conventions.py")
    return rc


def known_releases() -> list[str]:
    from backend import coords
    return coords.releases("vllm")


def unsupported_features(options: Mapping[str, Any] | None, method: str = "eagle3", version: str = "0.24.0",
                         target: Mapping[str, Any] | None = None) -> list[str]:
    """The V2-unsupported features (those release `version` checks) that the engine options turn on."""
    o, t = options or {}, target or {}
    names = release_rule(version).get("unsupported") or []
    return [n for n in names if n in UNSUPPORTED and UNSUPPORTED[n](o, method, t)]


def resolve(requested: str | None, architectures: list[str] | None, version: str = "0.24.0",
            options: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
            method: str = "eagle3", target_config: Mapping[str, Any] | None = None) -> RunnerChoice:
    """The runner vLLM `version` will use for a target with `architectures`, given the engine options and env.

    requested "v1"/"v2" is taken as given (the user says which runner the engine runs); "auto" (or None) decides
    as that release does, reading `VLLM_USE_V2_MODEL_RUNNER` from `env` (default: this process's environment) and
    is_moe / is_quantized from `target_config` (the target's config.json) where the release asks."""
    requested = requested or "auto"
    if requested not in RUNNERS:
        raise SpecLensError(f"--runner {requested}: unknown; use auto (decide as vLLM does), v2 or v1")
    if requested != "auto":
        return RunnerChoice(requested, requested, f"--runner {requested} given", version)
    choice = _auto(architectures, version, options, env, method, target_config)
    rc, o = release_rule(version), options or {}
    moot = [FORCED[n][1] for n in ("HiSparse", "watermarking")
            if FORCED[n][0](o) and n not in (rc.get("forces_v2") or [])]
    if moot:
        return replace(choice, reason=f"{choice.reason} ({' and '.join(moot)} given: vLLM {version}'s "
                                      f"use_v2_model_runner does not check it, so it does not force V2)")
    return choice


def env_value(flag: str | None, rc: Mapping[str, Any], version: str) -> str | None:
    """VLLM_USE_V2_MODEL_RUNNER as release `version` reads it (`env_values` of its row, derived from vllm/envs.py):
    "1" (V2), "0" (V1) or None (unset); a value that release would refuse raises a one-line SpecLensError."""
    if flag is None:
        return None
    how = rc.get("env_values")
    if how != "integer":
        raise SpecLensError(f"vLLM {version}: how it parses {ENV} ('{how}' in backend/conventions.yaml) is not known "
                            f"to backend/vllm_runner.py; unset {ENV} or re-derive the row")
    try:
        return "1" if int(flag) else "0"                     # vllm/envs.py: bool(int(value)), as vLLM reads it
    except ValueError:
        raise SpecLensError(f"{ENV}={flag!r}: vLLM {version} reads it as bool(int(value)) (vllm/envs.py) and would "
                            f"raise ValueError; set {ENV}=1 for V2 or "
                            f"{ENV}=0 for V1, or unset it") from None


def _auto(architectures: list[str] | None, version: str, options: Mapping[str, Any] | None,
          env: Mapping[str, str] | None, method: str, target_config: Mapping[str, Any] | None) -> RunnerChoice:
    """resolve() for --runner auto."""
    rc = release_rule(version)
    env = os.environ if env is None else env
    flag = env.get(ENV)
    sel = rc.get("selection")
    o = options or {}
    v = env_value(flag, rc, version)
    forced = [n for n in rc.get("forces_v2") or [] if n in FORCED]
    env0 = rc.get("forces_v2_env0") or {}
    where = "vllm/config/vllm.py: VllmConfig.use_v2_model_runner"
    if forced:
        from backend import coords
        where = coords.convention_for("vllm", version, "*").decided_by.get("runner") or where
    # checked before the variable is read (vLLM 0.30+: HiSparse, watermarking), in the release's order
    for n in forced:
        if env0.get(n) not in ("error", "overrides") or not FORCED[n][0](o):
            continue
        what = FORCED[n][1]
        if v == "0":
            if env0[n] == "error":
                raise SpecLensError(f"vLLM {version} refuses {n} with {ENV}={flag} ({where} raises '{n} requires Model "
                                    f"Runner V2'); remove {ENV}=0 or drop {what}")
            return RunnerChoice("v2", "auto", f"{what} is set: {n} forces V2 in vLLM {version} and overrides "
                                              f"{ENV}={flag} ({where})", version)
        return RunnerChoice("v2", "auto", f"{what} is set: {n} forces V2 in vLLM {version}, before {ENV} and the "
                                          f"unsupported features are looked at ({where})", version)
    if v is not None:
        runner = "v2" if v == "1" else "v1"
        return RunnerChoice(runner, "auto", f"{ENV}={flag} is set", version)
    if sel == "env_only":
        return RunnerChoice("v1", "auto", f"vLLM {version} runs V1 unless {ENV}=1 (no automatic choice before "
                                          f"0.22)", version)
    if "prefill context parallelism" in forced and FORCED["prefill context parallelism"][0](o):
        return RunnerChoice("v2", "auto", f"prefill context parallelism forces V2 in vLLM {version}", version)
    names = list(architectures or [])
    t = target_facts(target_config, names)
    archs = set(rc.get("v2_architectures") or [])
    hit = [a for a in names if a in archs]
    guess = "" if t["from"] == "config" else " (MoE guessed from the architecture name)"
    if sel == "all":
        why = f"vLLM {version} runs every target on V2"
    elif not names:
        return RunnerChoice("v1", "auto", "the target config names no architectures (vLLM picks V2 only for "
                                          "listed ones)", version)
    elif sel == "listed":
        if not hit:
            return RunnerChoice("v1", "auto", f"{'/'.join(names)} is not one of vLLM {version}'s default V2 "
                                              f"architectures", version)
        why = f"{hit[0]} is one of vLLM {version}'s default V2 architectures"
    elif sel == "listed_dense_unquantized":
        if not hit:
            return RunnerChoice("v1", "auto", f"{'/'.join(names)} is not one of vLLM {version}'s default V2 "
                                              f"architectures", version)
        if t["is_moe"] or t["is_quantized"]:
            what = "MoE" if t["is_moe"] else "quantized"
            return RunnerChoice("v1", "auto", f"{hit[0]} is listed for V2 in vLLM {version}, but the target is "
                                              f"{what}{guess}, and {version} keeps those on V1", version)
        why = f"{hit[0]} is one of vLLM {version}'s default V2 architectures (dense, unquantized)"
    elif sel == "listed_or_dense":
        if t["is_hybrid"] and not hit:
            return RunnerChoice("v1", "auto", f"vLLM {version} keeps hybrid targets on V1", version)
        if hit:
            why = f"{hit[0]} is one of vLLM {version}'s default V2 architectures"
        elif not t["is_moe"]:
            why = f"vLLM {version} runs every non-MoE target on V2 ({'/'.join(names)} is dense{guess})"
        else:
            return RunnerChoice("v1", "auto", f"{'/'.join(names)} is MoE{guess} and not one of vLLM {version}'s "
                                              f"default V2 architectures", version)
    else:
        raise SpecLensError(f"vLLM {version}: runner selection '{sel}' in backend/conventions.yaml is not known to "
                            f"backend/vllm_runner.py")
    off = unsupported_features(o, method, version, t)
    if off:
        return RunnerChoice("v1", "auto", f"{why}, but V2 does not support {', '.join(off)} (from the engine "
                                          f"options)", version)
    return RunnerChoice("v2", "auto", why, version)


def architectures_of(config: Mapping[str, Any]) -> list[str]:
    """The target's architectures from its config.json (multimodal targets: the top level, as vLLM reads it)."""
    archs = config.get("architectures")
    if not archs and isinstance(config.get("text_config"), dict):
        archs = config["text_config"].get("architectures")
    return [str(a) for a in archs or []]
