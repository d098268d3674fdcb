"""Write EAGLE-3 training data the way each producer does, from a real HF model (docs/CONVENTIONS.md).

Every format is written by imitating its producer's id convention exactly, with the HF engine's boundary
hooks, so an import of these files can be checked against an HF capture of the same prompts:

| fmt                  | file                                 | id a holds | teacher (last) |
|----------------------|--------------------------------------|------------|----------------|
| `speculators` (>=0.5)| `hs_{i}.safetensors`                 | S_a        | S_N            |
| `vllm-extract`       | `hs_{i}.safetensors`                 | S_a        | (ids list it)  |
| `speculators-legacy` | `data_{i}.pt`                        | S_{a+1}    | S_N            |
| `specforge` (0.2)    | `rows_{a}-{b}/data_{i}.ckpt`         | S_{a+1}    | F              |

`capture_rule` and `teacher` override the convention to write deliberately wrong data for demos and tests
(e.g. a `speculators` file captured "after layer", or a `vllm-extract` file whose last state is F).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from backend.coords import Boundary, S, final
from backend.errors import SpecLensError
from backend.prompts import encode, load_prompts

FORMATS = ("speculators", "vllm-extract", "speculators-legacy", "specforge")
RULE = {"speculators": "input", "vllm-extract": "input", "speculators-legacy": "after", "specforge": "after"}
TEACHER = {"speculators": "S_N", "vllm-extract": None, "speculators-legacy": "S_N", "specforge": "F"}


@dataclass
class Produced:
    out_dir: Path
    fmt: str
    files: list[Path]
    ids: list[int]                  # the ids as the producer would write them down (ascending)
    boundaries: list[str]           # what each stored state really is, in file order (teacher last)
    n_layers: int
    hidden_size: int
    token_ids: list[list[int]] = field(default_factory=list)


def default_ids(fmt: str, n: int) -> list[int]:
    """The ids each producer uses when none are given (docs/CONVENTIONS.md#layer-ids)."""
    if fmt == "specforge":
        return [1, n // 2 - 1, n - 4]
    if fmt == "vllm-extract":
        return [2, n // 2, n - 3, n]
    return [2, n // 2, n - 3]


def _rule(rule: str, a: int) -> Boundary:
    if rule == "input":
        return S(a)
    if rule == "after":
        return S(a + 1)
    raise SpecLensError(f"capture_rule '{rule}': unknown; use 'input' (id a -> S_a) or 'after' (id a -> S_a+1)")


def _teacher(t: str, n: int) -> Boundary:
    if t == "S_N":
        return S(n)
    if t == "F":
        return final(n)
    raise SpecLensError(f"teacher '{t}': unknown; use 'S_N' (pre-norm) or 'F' (post-norm)")


def planned_boundaries(fmt: str, ids: list[int], n: int, capture_rule: str | None = None,
                       teacher: str | None = None) -> list[Boundary]:
    """What the files will really hold, in file order: aux states (ascending ids), then the teacher."""
    rule = capture_rule or RULE[fmt]
    ids = sorted(ids)
    if fmt == "vllm-extract":   # the ids name every captured layer; the last one is the teacher slot
        aux = [_rule(rule, a) for a in ids[:-1]]
        last = _teacher(teacher, n) if teacher else _rule(rule, ids[-1])
        out = aux + [last]
    else:
        out = [_rule(rule, a) for a in ids] + [_teacher(teacher or TEACHER[fmt], n)]
    bad = [b.label for b in out if not b.final and not 0 <= b.index <= n]
    if bad:
        raise SpecLensError(f"ids {ids} with capture rule '{rule}' give {bad}, out of range for a {n}-layer model")
    return out


def write_training_data(model_dir: str | Path, prompts_file: str | Path, fmt: str, out_dir: str | Path,
                        ids: list[int] | None = None, limit: int | None = None, teacher: str | None = None,
                        capture_rule: str | None = None, chat_template: bool = True,
                        max_prompt_tokens: int | None = 2048, dtype: str = "fp32", device: str = "cpu",
                        rows_per_dir: int = 1000, progress: bool = False) -> Produced:
    """Run the prompts through the model and write `fmt` training data under `out_dir`, one file a prompt.

    ids: the producer's layer ids (default: the producer's own defaults); for `vllm-extract` they list
    every captured layer, the last included (e.g. 2,4,5,8). capture_rule: 'input' or 'after' to override
    the producer's id convention. teacher: 'S_N' or 'F' to override the teacher state (for vllm-extract,
    the last state). Token ids come from backend.prompts.encode, as in a capture.
    """
    from backend.engines import hf

    if fmt not in FORMATS:
        raise SpecLensError(f"format '{fmt}': unknown; use one of {', '.join(FORMATS)}")
    lm = hf.load(model_dir, device, dtype)
    n = lm.n_layers
    ids = sorted(ids) if ids else default_ids(fmt, n)
    plan = planned_boundaries(fmt, ids, n, capture_rule, teacher)
    wanted = sorted(set(plan), key=lambda b: b.sort_key())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(prompts_file, limit)
    seqs = [encode(lm.tokenizer, p.text, chat_template, max_prompt_tokens) for p in prompts]

    got: dict[int, torch.Tensor] = {}

    def sink(k: int, x: torch.Tensor) -> None:   # x [T, H]
        got[k] = x.detach().to("cpu", copy=True)

    files = []
    with hf.BoundaryHooks(lm, wanted, sink):
        for i, seq in enumerate(tqdm(seqs, desc=f"write {fmt}", unit="prompt", disable=not progress, file=sys.stderr)):
            got.clear()
            hf.forward(lm, seq)
            states = [got[wanted.index(b)] for b in plan]          # L x [T, H], file order
            files.append(_write(fmt, out, i, torch.tensor(seq, dtype=torch.int64), states, rows_per_dir))
    return Produced(out, fmt, files, ids, [b.label for b in plan], n, lm.hidden_size, seqs)


def _write(fmt: str, out: Path, i: int, tok: torch.Tensor, states: list[torch.Tensor], rows_per_dir: int) -> Path:
    """One sequence: tok [T] int64, states L x [T, H] (aux ascending, teacher last)."""
    from safetensors.torch import save_file

    if fmt in ("speculators", "vllm-extract"):
        p = out / f"hs_{i}.safetensors"
        save_file({"hidden_states": torch.stack(states, dim=1).contiguous(),   # [T, L, H]
                   "token_ids": tok}, str(p))
    elif fmt == "speculators-legacy":
        p = out / f"data_{i}.pt"
        torch.save({"input_ids": tok, "hidden_states": states,                  # list of [T, H]
                    "loss_mask": torch.ones_like(tok)}, p)
    else:  # specforge
        lo = i // rows_per_dir * rows_per_dir
        d = out / f"rows_{lo}-{lo + rows_per_dir}"
        d.mkdir(exist_ok=True)
        p = d / f"data_{i}.ckpt"
        torch.save({"input_ids": tok, "loss_mask": torch.ones_like(tok),
                    "hidden_state": states[-1][None],                          # [1, T, H]
                    "aux_hidden_state": torch.cat(states[:-1], dim=-1)[None]}, p)  # [1, T, k*H]
    return p


def drafter_config(ids: list[int], style: str = "speculators", verifier: str | Path | None = None) -> dict:
    """A minimal drafter config.json carrying ids the way each format writes them down.

    style: 'speculators' (top-level ids, speculators_config with the verifier), 'eagle' (nested
    eagle_config, the EAGLE/SpecForge/SGLang format) or 'top_level' (only the top-level key).
    """
    if style == "eagle":
        return {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids), "use_aux_hidden_state": True}}
    if style == "top_level":
        return {"architectures": ["Eagle3LlamaForCausalLM"], "eagle_aux_hidden_state_layer_ids": list(ids)}
    if style == "speculators":
        return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                "eagle_aux_hidden_state_layer_ids": list(ids),
                "transformer_layer_config": {"model_type": "llama", "num_hidden_layers": 1},
                "speculators_config": {"algorithm": "eagle3",
                                       "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                       "verifier": {"name_or_path": str(verifier) if verifier else None,
                                                    "architectures": ["LlamaForCausalLM"]}}}
    raise SpecLensError(f"drafter config style '{style}': unknown; use speculators, eagle or top_level")
