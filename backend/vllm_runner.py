"""Which model runner vLLM picks for a target, V1 or V2, decided the way vLLM decides it.

The runner matters for EAGLE-3: vLLM 0.24's V2 runner reads the drafter's aux ids from the top level of its
config only, the V1 runner reads the top level, then `eagle_config` (backend/conventions.yaml, `ids_from`).
vLLM 0.24.0 decides in `vllm/config/vllm.py`, `VllmConfig.use_v2_model_runner`:

1. `VLLM_USE_V2_MODEL_RUNNER` set (1/0, true/false) wins;
2. otherwise V2 only when the target's `architectures` holds one of `DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`,
   Triton is present (always on a CUDA node), and `_get_v2_model_runner_unsupported_features()` is empty;
3. else V1.

`UNSUPPORTED` below mirrors `_get_v2_model_runner_unsupported_features()` of 0.24.0, each feature as the engine
option (vLLM's own argument names, as given to `LLM(...)` or `--engine-option`) that turns it on. Seen on the H200
(REFERENCE section 9): DeepseekV3, Qwen3-MoE and GPT-OSS targets run V1; Llama and Qwen3 run V2; Llama with
`VLLM_USE_V2_MODEL_RUNNER=0` runs V1.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from backend.errors import SpecLensError

ENV = "VLLM_USE_V2_MODEL_RUNNER"
RUNNERS = ("auto", "v2", "v1")
SOURCE = "vllm/config/vllm.py: VllmConfig.use_v2_model_runner, _get_v2_model_runner_unsupported_features"

# vLLM releases whose runner rule is in this module: version range -> the V2 default architectures
V2_ARCHITECTURES = {
    ">=0.24,<0.25": frozenset({"Qwen3ForCausalLM", "DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM",
                               "GraniteMoeForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"}),
}


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


# (feature as vLLM 0.24.0 words it, predicate over the engine options with the speculative method)
UNSUPPORTED: tuple[tuple[str, Callable[[Mapping[str, Any], str], bool]], ...] = (
    ("prefill context parallelism", lambda o, m: _int(_opt(o, "prefill_context_parallel_size")) > 1),
    ("stock torch.compile", lambda o, m: _int(_sub(o, "compilation_config").get("mode"), 0) == 1),
    ("sequence parallelism", lambda o, m: _true(_sub(o, "compilation_config").get("pass_config", {}).get("enable_sp"))
     and _int(_opt(o, "tensor_parallel_size")) > 1),
    ("pipeline parallelism with external_launcher",
     lambda o, m: _opt(o, "distributed_executor_backend") == "external_launcher"
     and _int(_opt(o, "pipeline_parallel_size")) > 1),
    ("dynamic speculative decoding",
     lambda o, m: _sub(o, "speculative_config").get("num_speculative_tokens_per_batch_size") is not None),
    ("parallel drafting for EAGLE speculative decoding",
     lambda o, m: _true(_sub(o, "speculative_config").get("parallel_drafting")) and m != "dflash"),
    ("EAGLE3 with pipeline parallelism", lambda o, m: m == "eagle3" and _int(_opt(o, "pipeline_parallel_size")) > 1),
    ("dual batch overlap", lambda o, m: _true(_opt(o, "enable_dbo"))),
    ("elastic expert parallelism", lambda o, m: _true(_opt(o, "enable_elastic_ep"))),
    ("routed experts capture", lambda o, m: _true(_opt(o, "enable_return_routed_experts"))),
    ("custom logits processors", lambda o, m: bool(_opt(o, "logits_processors"))),
    ("prompt embeds", lambda o, m: _true(_opt(o, "enable_prompt_embeds"))),
    ("logprobs mode", lambda o, m: _opt(o, "logprobs_mode") in ("raw_logits", "processed_logits")),
    ("KV sharing fast prefill", lambda o, m: _true(_opt(o, "kv_sharing_fast_prefill"))),
    ("EC transfer", lambda o, m: _opt(o, "ec_transfer_config") is not None),
)


def _rule(version: str) -> frozenset[str]:
    try:
        v = Version(version)
    except InvalidVersion:
        raise SpecLensError(f"vLLM version '{version}' is not a version number; pass e.g. --engine-version 0.24.0") \
            from None
    for spec, archs in V2_ARCHITECTURES.items():
        if v in SpecifierSet(spec):
            return archs
    known = ", ".join(V2_ARCHITECTURES)
    raise SpecLensError(f"vLLM {version}: which model runner it picks is not known to SpecLens (known: {known}); "
                        f"pass --runner v1 or --runner v2, or add the release to backend/vllm_runner.py")


def unsupported_features(options: Mapping[str, Any] | None, method: str = "eagle3") -> list[str]:
    """The V2-unsupported features the engine options turn on (vLLM's own words)."""
    o = options or {}
    return [name for name, on in UNSUPPORTED if on(o, method)]


def resolve(requested: str | None, architectures: list[str] | None, version: str = "0.24.0",
            options: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
            method: str = "eagle3") -> RunnerChoice:
    """The runner vLLM `version` will use for a target with `architectures`, given the engine options and env.

    requested "v1"/"v2" is taken as given (the user says which runner the engine runs); "auto" (or None) decides
    as vLLM does, reading `VLLM_USE_V2_MODEL_RUNNER` from `env` (default: this process's environment)."""
    requested = requested or "auto"
    if requested not in RUNNERS:
        raise SpecLensError(f"--runner {requested}: unknown; use auto (decide as vLLM does), v2 or v1")
    if requested != "auto":
        return RunnerChoice(requested, requested, f"--runner {requested} given", version)
    env = os.environ if env is None else env
    flag = env.get(ENV)
    if flag is not None and flag.strip() != "":
        v = flag.strip().lower()
        if v not in ("1", "0", "true", "false"):
            raise SpecLensError(f"{ENV}={flag}: vLLM reads 1/0 or true/false; fix the variable")
        runner = "v2" if v in ("1", "true") else "v1"
        return RunnerChoice(runner, "auto", f"{ENV}={flag} is set", version)
    archs = _rule(version)
    names = list(architectures or [])
    if not names:
        return RunnerChoice("v1", "auto", "the target config names no architectures (vLLM picks V2 only for "
                                          "listed ones)", version)
    hit = [a for a in names if a in archs]
    if not hit:
        return RunnerChoice("v1", "auto", f"{'/'.join(names)} is not one of vLLM {version}'s default V2 "
                                          f"architectures", version)
    off = unsupported_features(options, method)
    if off:
        return RunnerChoice("v1", "auto", f"{hit[0]} defaults to V2, but V2 does not support "
                                          f"{', '.join(off)} (from the engine options)", version)
    return RunnerChoice("v2", "auto", f"{hit[0]} is one of vLLM {version}'s default V2 architectures", version)


def architectures_of(config: Mapping[str, Any]) -> list[str]:
    """The target's architectures from its config.json (multimodal targets: the top level, as vLLM reads it)."""
    archs = config.get("architectures")
    if not archs and isinstance(config.get("text_config"), dict):
        archs = config["text_config"].get("architectures")
    return [str(a) for a in archs or []]
