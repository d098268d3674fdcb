"""The names and defaults that options, job specs, settings models and engines share, each defined here once.

- `ENGINES`: the one engine registry (name -> the adapter module, imported lazily by backend/engines/base.py
  `adapter`); `ENGINE_NAMES` and `SERVING_ENGINES` (the engines with their own server, counters and id conventions)
  derive from it. Adding an engine is its module plus one line here (docs/ARCHITECTURE.md "Where to add").
- `RUNNERS`: the vLLM model runners whose id reading SpecLens applies (backend/vllm_runner.py decides `auto`).
- `DTYPES`, `DEFAULT_K` (draft tokens per step for benches and engines), `DRAFT_SAMPLING`.

This module sits in the base layer (it imports nothing of backend/ but vllm_runner), so the engines, the settings
models and the CLI below and above it all read the same lists. tests/test_settings.py checks that no second literal
list of engine names or runner values, and no second K default, appears under backend/.
"""

from __future__ import annotations

from backend.vllm_runner import RUNNERS

# the one registry: engine name -> adapter module (vLLM and SGLang live on the GPU node, so imported only when used)
ENGINES = {"hf": "backend.engines.hf", "vllm": "backend.engines.vllm", "sglang": "backend.engines.sglang"}
IN_PROCESS_ENGINE = "hf"                                  # the reference engine: in this process, any device
ENGINE_NAMES = tuple(ENGINES)
SERVING_ENGINES = tuple(e for e in ENGINES if e != IN_PROCESS_ENGINE)

DTYPES = ("fp32", "bf16")
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}     # the engines' (and torch's) names of DTYPES
DEFAULT_K = 4                                              # K draft tokens per step (vLLM num_speculative_tokens)
CHECK_K = 3                                                # draft steps check-drafter scores by default
DRAFT_SAMPLING = ("sample", "argmax")                      # T > 0: draft from q (Leviathan) or argmax (vLLM V1)
VLLM_RUNNERS = tuple(sorted(r for r in RUNNERS if r != "auto"))   # what `auto` resolves to: v1, v2

__all__ = ["CHECK_K", "DEFAULT_K", "DRAFT_SAMPLING", "DTYPES", "ENGINES", "ENGINE_NAMES", "IN_PROCESS_ENGINE",
           "RUNNERS", "SERVING_ENGINES", "TORCH_DTYPES", "VLLM_RUNNERS"]
