"""Runs inside an SGLang server: `--forward-hooks` factories (sglang/srt/model_executor/hook_manager.py).

SGLang registers `factory(config)`'s hook as a forward hook on every module whose name matches the spec's
fnmatch patterns; the hook sees (module, inputs, output) but not the module's name, so one reducer object per
server tells the calls apart by order: `model.embed_tokens` fires first in every forward pass (S_0, and the
start of a pass), then `model.layers.i` in order (S_{i+1} = hidden + residual), then `model.norm` (F, first
output), then `model` (the LlamaModel: the end of the pass, and where SGLang keeps `layers_to_capture`, the
layers whose *input* it feeds an EAGLE-3 drafter). Hooks fire only outside CUDA graphs
(`--disable-cuda-graph`); cached prefixes are never recomputed (`--disable-radix-cache`).

Control without an API: the client drops `reset.request` or `collect.request` into `config["dir"]`; the next
forward pass (a one-token trigger request) resets or writes `state.rank{r}.pt` (atomically) and is itself left
out of the figures. `info` hooks only record `layers_to_capture` into `info.rank{r}.json` (cheap; for benches).

Checked against SGLang 0.5.15 (sglang/srt/model_executor/hook_manager.py, models/llama.py): the factory is
resolved from "module:attr" with importlib and called once per matching spec *per model runner* (the target's
and, with speculative decoding, the draft model's: both get the same `--forward-hooks`), in the scheduler
(TP worker) process, after CUDA-graph capture; `register_forward_hook(hook)` gets positional inputs only.
LlamaDecoderLayer returns `(hidden_states, residual)` and the next layer's fused add-RMSNorm updates both in
place, so S_{i+1} = hidden + residual is computed inside the hook, before the next layer runs; layer 0 takes the
embedding tensor itself as its residual and updates it in place, hence the clone of S_0. `model.norm` is called
as `norm(hidden, residual)` and returns `(normed, residual_sum)`: F is its first output.
`LlamaModel.layers_to_capture` holds the layers whose *input* (`hidden + residual` before layer i, so S_i) is fed
to the drafter; `set_eagle3_layers_to_capture` stores `[id + 1 for id in eagle_aux_hidden_state_layer_ids]`, or
`[2, N // 2, N - 3]` when the drafter config has no ids (no +1 on the default).
A hook that raises would kill the scheduler (and the server) mid-request: every hook here catches its own
exception, writes it to `error.rank{r}.txt` in the hook directory and goes quiet; the client reads that file.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

import torch

from backend import coords
from backend.engines.hook_reduce import layer_pair, plan_sample, stage_rows
from backend.stats import StreamingStats, TokenSample

_REDUCERS: dict[str, ServerReducer] = {}


def _rank() -> int:
    try:
        import torch.distributed as dist
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    except Exception:
        return 0


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


class ServerReducer:
    def __init__(self, config: dict):
        self.dir = Path(config["dir"])
        self.labels = list(config["labels"])
        self.n_layers = int(config["n_layers"])
        self.sample_tokens = int(config.get("sample_tokens", 4096))
        self.per_prompt = int(config.get("sample_per_prompt", 512))
        # torch.compile inside SGLang's scheduler process would compile during the server's warm-up request (and
        # again for new shapes), with SGLang's own dynamo/inductor settings: eager unless asked for.
        self.compile = bool(config.get("compile", False))
        self.exact = bool(config.get("exact", False))
        b = [coords.parse(lbl, self.n_layers) for lbl in self.labels]
        self.slot = {("F" if x.final else x.index): k for k, x in enumerate(b)}   # boundary -> stats row
        self.stats: StreamingStats | None = None
        self.sample: TokenSample | None = None
        self.layer = 0
        self.skip = False
        self.tokens = 0
        self.forwards = 0
        self.layers_to_capture: list[int] | None = None
        self._emb: torch.Tensor | None = None
        self._take: torch.Tensor | None = None
        self._segs: list = []

    def _init(self, x: torch.Tensor) -> None:
        self.stats = StreamingStats(self.labels, x.shape[-1], x.device, compile=self.compile, exact=self.exact)
        self.sample = TokenSample(self.labels, x.shape[-1], self.sample_tokens, self.per_prompt,
                                  dtype=torch.float32 if x.dtype == torch.float32 else torch.bfloat16,
                                  pin=x.device.type == "cuda")

    # ---- the forward pass, in hook order
    def embed(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        self.layer, self._take, self._segs, self._emb = 0, None, [], None
        if self.stats is None:
            self._init(out)
        self.skip = False
        for what in ("reset", "collect"):
            req = self.dir / f"{what}.request"
            if req.exists():
                if what == "collect":
                    self._write()
                else:
                    self._init(out)
                    self.tokens = self.forwards = 0
                try:
                    req.unlink()
                except FileNotFoundError:
                    pass
                self.skip = True       # the trigger request is not part of the capture
        if self.skip:
            return
        self.tokens += int(ids.numel())
        self.forwards += 1
        if 0 in self.slot:
            self.stats.update(self.slot[0], out)
            if self.sample.n < self.sample.capacity:
                self._emb = out.detach().clone()    # layer 0 updates this buffer in place (fused residual add)

    def layer_out(self, inputs: tuple, out) -> None:
        i = self.layer
        self.layer += 1
        if self.skip or self.stats is None:
            return
        if i == 0 and self.sample.n < self.sample.capacity:
            self._plan(inputs[0] if inputs else None)
            if self._take is not None and self._emb is not None:
                self._stage(self.slot[0], self._emb)
            self._emb = None
        if i + 1 in self.slot:
            h, r = layer_pair(out)
            self.stats.update_pair(self.slot[i + 1], h, r)
            if self._take is not None:
                self._stage(self.slot[i + 1], h if r is None else h + r)

    def norm_out(self, out) -> None:
        if self.skip or self.stats is None or "F" not in self.slot:
            return
        x = out[0] if isinstance(out, tuple) else out
        self.stats.update(self.slot["F"], x)
        if self._take is not None:
            self._stage(self.slot["F"], x)

    def model_out(self, module) -> None:
        ltc = getattr(module, "layers_to_capture", None)
        if ltc is not None and self.layers_to_capture is None:
            self.layers_to_capture = [int(v) for v in ltc]
        if not self.skip and self.sample is not None:
            for ids, k in self._segs:
                self.sample.commit(ids, k)
        self._take, self._segs = None, []

    # ---- sample: sequences that start (position 0) in this pass, first tokens of each
    def _plan(self, positions) -> None:
        self._take, self._segs = None, []
        if positions is None or not torch.is_tensor(positions) or self._ids is None:
            return
        pos = positions.reshape(-1).cpu()
        if pos.numel() != self._ids.numel():
            return
        take, self._segs = plan_sample(pos, self._ids, self.sample)
        if take is not None:
            self._take = take.to(positions.device)

    def _stage(self, k: int, x: torch.Tensor) -> None:
        stage_rows(self.sample, k, x, self._take)

    _ids: torch.Tensor | None = None

    def _write(self) -> None:
        if self.stats is None:
            return
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        d = {"labels": self.labels, "state": {k: v.detach().cpu() for k, v in self.stats.state.tensors().items()},
             "sample": {k: v.clone() for k, v in self.sample.tensors().items()}, "tokens_seen": self.tokens,
             "forwards": self.forwards, "layers_to_capture": self.layers_to_capture}
        _atomic_write(self.dir / f"state.rank{_rank()}.pt", lambda p: torch.save(d, p))


def _guard(dir: str | Path, fn):
    """The hook `fn`, made unable to raise into SGLang: the first exception goes to error.rank{r}.txt."""
    state = {"dead": False}

    def hook(module, inputs, output):
        if state["dead"]:
            return None
        try:
            fn(module, inputs, output)
        except Exception as e:          # noqa: BLE001 - anything raised here would take the server down
            state["dead"] = True
            try:
                p = Path(dir) / f"error.rank{_rank()}.txt"
                p.write_text(traceback.format_exc() + f"\n{type(e).__name__} in {type(module).__name__} hook: {e}\n")
            except Exception:
                pass
        return None                    # never replace the module's output
    return hook


def _reducer(config: dict) -> ServerReducer:
    key = str(config["dir"])
    if key not in _REDUCERS:
        _REDUCERS[key] = ServerReducer(config)
    return _REDUCERS[key]


def capture(config: dict):
    """Hook factory for boundary statistics: register on model.embed_tokens, model.layers.N, model.norm, model."""
    r = _reducer(config)

    def hook(module, inputs, output):
        name = type(module).__name__
        if "Embedding" in name:
            r._ids = inputs[0].reshape(-1).cpu() if (
                inputs and torch.is_tensor(inputs[0])
                and r.sample is not None and r.sample.n < r.sample.capacity) else None
            r.embed(inputs[0] if inputs else torch.empty(0), output)
        elif "Norm" in name:
            r.norm_out(output)
        elif hasattr(module, "layers"):
            r.model_out(module)
        else:
            r.layer_out(inputs, output)
    return _guard(config["dir"], hook)


def info(config: dict):
    """Hook factory that only records what SGLang feeds the drafter (`layers_to_capture` of the target model)."""
    out = Path(config["dir"])
    done = {"v": False}

    def hook(module, inputs, output):
        if done["v"]:
            return
        ltc = getattr(module, "layers_to_capture", None)
        if ltc is None:
            return                 # the draft model's `model` module: nothing to record
        done["v"] = True
        rec = {"layers_to_capture": [int(v) for v in ltc], "n_layers": len(getattr(module, "layers", [])),
               "model_class": type(module).__name__}
        _atomic_write(out / f"info.rank{_rank()}.json", lambda p: p.write_text(json.dumps(rec)))
    return _guard(out, hook)


def hook_specs(dir: str, labels: list[str] | None, n_layers: int, sample_tokens: int = 4096,
               sample_per_prompt: int = 512, exact: bool = False) -> list[dict]:
    """The `--forward-hooks` JSON for a capture (labels) or for a bench (labels None: info only); exact: the
    statistics as order-free integer sums (backend/stats.py)."""
    if labels is None:
        return [{"name": "speclens-info", "target_modules": ["model"],
                 "hook_factory": "backend.engines.sglang_hooks:info", "config": {"dir": dir}}]
    digits = ["model.layers." + "[0-9]" * n for n in (1, 2, 3)]   # the layers themselves, not their children
    return [{"name": "speclens-capture", "target_modules": ["model.embed_tokens", *digits, "model.norm", "model"],
             "hook_factory": "backend.engines.sglang_hooks:capture",
             "config": {"dir": dir, "labels": labels, "n_layers": n_layers, "sample_tokens": sample_tokens,
                        "sample_per_prompt": sample_per_prompt, **({"exact": True} if exact else {})}}]


__all__ = ["capture", "info", "hook_specs", "ServerReducer"]
