"""HF transformers model primitives: load a causal LM (`load` -> `LoadedModel`), find its decoder stack, capture
boundaries S_0..S_N and F with forward hooks (`BoundaryHooks`; S_0 the input of decoder layer 0 through a pre-hook,
S_b the output of layer b-1, F the output of the final norm), and greedy generation. The HF engine
(backend/engines/hf.py) and the drafter checks (backend/drafter/finder.py, backend/training_data.py) both use
them; here, below both, so that drafter/ never imports engines/."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from backend.coords import Boundary, all_boundaries, final
from backend.errors import SpecLensError

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: torch.nn.Module        # the *ForCausalLM
    base: torch.nn.Module         # the decoder stack (model.model); calling it skips the LM head
    layers: torch.nn.ModuleList
    norm: torch.nn.Module
    config: object
    tokenizer: object | None
    device: torch.device
    dtype: torch.dtype

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecLensError(f"--device {device}: no CUDA device here; use --device cpu")
    return torch.device(device)


def model_config(path: str | Path) -> dict:
    p = Path(path) / "config.json"
    if not p.exists():
        raise SpecLensError(f"{p}: no config.json; pass --model a directory saved with save_pretrained")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise SpecLensError(f"{p}: config.json is not valid JSON ({e.msg}); re-save the model") from e


def load(path: str | Path, device: str | None = "auto", dtype: str = "fp32", tokenizer: bool = True) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    model_config(path)
    if dtype not in DTYPES:
        raise SpecLensError(f"--dtype {dtype}: unknown; use fp32 or bf16")
    dev = resolve_device(device)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype])
    except Exception as e:  # safetensors/transformers raise many types; keep the first line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SpecLensError(f"{path}: cannot load model ({first}); check the weights files or re-save the model") from e
    model.to(dev).eval()
    base, layers, norm = find_stack(model)
    tok = None
    if tokenizer:
        try:
            tok = AutoTokenizer.from_pretrained(str(path))
        except Exception as e:
            raise SpecLensError(f"{path}: no usable tokenizer ({type(e).__name__}); "
                                f"save the tokenizer next to the model") from e
    return LoadedModel(model, base, layers, norm, model.config, tok, dev, DTYPES[dtype])


def find_stack(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.ModuleList, torch.nn.Module]:
    """(decoder stack, its layers, its final norm) for Llama/Qwen/DeepSeek/Mistral-style and GPT-style models."""
    base = getattr(model, "model", None) or getattr(model, getattr(model, "base_model_prefix", ""), None)
    if base is None:
        raise SpecLensError(f"{type(model).__name__}: cannot find the decoder stack (model.model)")
    layers = next((getattr(base, n) for n in ("layers", "h", "blocks")
                   if isinstance(getattr(base, n, None), torch.nn.ModuleList)), None)
    norm = next((getattr(base, n) for n in ("norm", "ln_f", "final_layernorm")
                 if getattr(base, n, None) is not None), None)
    if layers is None or norm is None:
        raise SpecLensError(f"{type(model).__name__}: cannot find decoder layers and final norm; this architecture "
                            f"is not supported by the HF engine yet")
    return base, layers, norm


class BoundaryHooks:
    """Forward hooks that hand each wanted boundary's tensor [T, H] to `sink(index_in_list, tensor)`."""

    def __init__(self, lm: LoadedModel, boundaries: list[Boundary], sink: Callable[[int, torch.Tensor], None]):
        self.handles = []
        n = lm.n_layers
        for k, b in enumerate(boundaries):
            if b.final:
                self.handles.append(lm.norm.register_forward_hook(self._post(k, sink)))
            elif b.index == 0:
                self.handles.append(lm.layers[0].register_forward_pre_hook(self._pre(k, sink), with_kwargs=True))
            elif 1 <= b.index <= n:
                self.handles.append(lm.layers[b.index - 1].register_forward_hook(self._post(k, sink)))
            else:
                raise SpecLensError(f"boundary {b.label} is out of range for a {n}-layer model; use S_0..S_{n} or F")

    @staticmethod
    def _pre(k, sink):
        def hook(_mod, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            sink(k, x[0])
        return hook

    @staticmethod
    def _post(k, sink):
        def hook(_mod, _args, out):
            x = out[0] if isinstance(out, (tuple, list)) else out
            sink(k, x[0])
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def forward(lm: LoadedModel, ids: list[int]) -> None:
    """One prompt through the decoder stack (no LM head, no KV cache)."""
    x = torch.tensor([ids], device=lm.device)
    with torch.inference_mode():
        lm.base(input_ids=x, use_cache=False)


def default_boundaries(lm: LoadedModel) -> list[Boundary]:
    return all_boundaries(lm.n_layers)


def boundary_final(lm: LoadedModel) -> Boundary:
    return final(lm.n_layers)


@torch.no_grad()
def generate_greedy(lm, prompts: list[list[int]], gen_tokens: int, batch_size: int = 64,
                    progress: bool = False) -> list[list[int]]:
    """Greedy continuations (at most `gen_tokens` new ids, through the first eos), batched with left padding."""
    from transformers import GenerationConfig

    pad = lm.tokenizer.pad_token_id if lm.tokenizer is not None and lm.tokenizer.pad_token_id is not None else 0
    eos = lm.config.eos_token_id
    gc = GenerationConfig(do_sample=False, max_new_tokens=gen_tokens, pad_token_id=pad, eos_token_id=eos)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[list[int] | None] = [None] * len(prompts)
    for b in range(0, len(order), batch_size):
        chunk = order[b:b + batch_size]
        L = max(len(prompts[i]) for i in chunk)
        x = torch.tensor([[pad] * (L - len(prompts[i])) + prompts[i] for i in chunk], device=lm.device)
        mask = torch.tensor([[0] * (L - len(prompts[i])) + [1] * len(prompts[i]) for i in chunk], device=lm.device)
        y = lm.model.generate(input_ids=x, attention_mask=mask, generation_config=gc)   # [b, L + gen]
        for row, i in enumerate(chunk):
            new = y[row, L:].tolist()
            if eos in new:                                  # keep the eos, drop the padding after it
                new = new[: new.index(eos) + 1]
            out[i] = prompts[i] + new
        if progress:
            print(f"[data] generated {min(b + batch_size, len(order))}/{len(order)}", flush=True)
    return out  # type: ignore[return-value]
