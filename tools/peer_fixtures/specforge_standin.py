"""Run SpecForge 0.2.0's own `scripts/prepare_hidden_states.py` on a CPU, HF transformers standing in for SGLang.

    python tools/peer_fixtures/specforge_standin.py SPECFORGE_CHECKOUT/scripts/prepare_hidden_states.py -- ARGS...

(run with the peers' venv, where the `specforge==0.2.0` wheel is installed; ARGS are the script's own arguments).

SGLang's capture does not run on a CPU, so one function is replaced: the script's `build_target_model`, which would
load SGLang (`specforge.offline_capture.load_offline_capture`). In its place the script gets SpecForge's own
`OfflineSGLangCapture` wrapped around `HFCaptureBackend` below, whose `capture()` returns what SpecForge's SGLang
backend (`offline_capture/sglang_backend/capture.py: capture_eagle3`) returns: per request the row's
(input_ids, attention_mask, loss_mask), the aux states and the last states, computed by transformers in float32:
- aux = cat over the capture ids a of S_{a+1} (SGLang's Llama captures `hidden_states + residual` at the input of
  layer a+1: "after layer a"), [T, k*H];
- last = F, the final-norm output (SGLang's `pruned_states`), [T, H].
Everything else is SpecForge's code, unchanged: argument parsing, the capture plan (`resolve_offline_capture`:
the eagle3 default ids), dataset building with its chat template, the vocabulary mapping, the data loader, and
`HiddenStatesGenerator` (rows_* folders, data_{i}.ckpt, `--compress`: gzip.open + torch.save).

CPU shims (the script asks for CUDA in three places): `Tensor.cuda` returns the tensor, the script's
`torch.tensor(..., device="cuda")` makes a CPU tensor (only in the script module: a global wrapper breaks
transformers' rotary-buffer initialisation), `torch.cuda.empty_cache` is a no-op; `SPECFORGE_DEVICE=cpu` makes
`specforge.distributed` use gloo. The states match a plain HF forward of the stored input_ids (tests check it).
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch


class HFCaptureBackend:
    """What SpecForge's SGLang capture backend returns, computed by HF transformers on the CPU."""

    def __init__(self, path: str):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.layer_ids: list[int] | None = None

    def set_capture_layers(self, layer_ids, *, capture_method: str = "eagle3") -> None:
        if capture_method != "eagle3":
            raise NotImplementedError(f"stand-in captures eagle3 only, not {capture_method}")
        self.layer_ids = list(layer_ids)

    @torch.no_grad()
    def capture(self, *, input_ids, attention_mask, loss_mask):
        base = self.model.model
        n = len(base.layers)
        final = {}
        hook = base.norm.register_forward_hook(lambda m, i, o: final.__setitem__("F", o))
        data, aux_rows, last_rows = [], [], []
        try:
            for row, att, lm in zip(input_ids.split(1), attention_mask.split(1), loss_mask.split(1)):
                out = base(input_ids=row, output_hidden_states=True, use_cache=False)
                hs = out.hidden_states                     # hs[i] = S_i for i < N (hs[N] is F in transformers 5)
                ids = [a + 1 for a in self.layer_ids]      # SGLang Llama: "after layer a" = S_{a+1}
                if max(ids) > n - 1:
                    raise ValueError(f"capture id {max(ids) - 1} needs S_{max(ids)}, past the stand-in's reach")
                aux_rows.append(torch.cat([hs[i][0] for i in ids], dim=-1))
                last_rows.append(final["F"][0])
                data.append((row, att, lm))
        finally:
            hook.remove()
        return data, aux_rows, last_rows


def _cpu_shims(mod) -> None:
    """Only the script's own CUDA calls are redirected (a global torch.tensor wrapper would break transformers'
    rotary-buffer initialisation): the script module sees a torch whose tensor(device="cuda") is a CPU tensor."""
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.cuda.empty_cache = lambda: None

    class _ScriptTorch:
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def tensor(*a, device=None, **k):
            if device is not None and str(device).startswith("cuda"):
                device = "cpu"
            return torch.tensor(*a, device=device, **k)
    mod.torch = _ScriptTorch()


def main(argv: list[str]) -> None:
    script, rest = argv[0], argv[1:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    os.environ.setdefault("SPECFORGE_DEVICE", "cpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    spec = importlib.util.spec_from_file_location("prepare_hidden_states", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _cpu_shims(mod)

    from specforge.offline_capture import OfflineSGLangCapture

    def build_target_model(args, model_config, capture_layers, capture_method="eagle3"):
        target = OfflineSGLangCapture(HFCaptureBackend(args.target_model_path))
        target.set_capture_layers(capture_layers, capture_method=capture_method)
        print(f"[stand-in] HF transformers capture for SGLang, layer ids {list(capture_layers)}", flush=True)
        return target

    mod.build_target_model = build_target_model
    sys.argv = [script] + rest
    mod.main()


if __name__ == "__main__":
    main(sys.argv[1:])
