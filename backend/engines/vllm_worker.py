"""Runs inside vLLM's GPU workers: forward hooks that reduce boundaries to streaming statistics on the GPU.

Installed with `LLM(..., worker_extension_cls="backend.engines.vllm_worker.SpecLensWorker")` and driven by
`llm.collective_rpc("speclens_install", ...)`; needs `enforce_eager=True` (hooks do not fire inside CUDA
graphs or compiled regions) and `enable_prefix_caching=False` (cached prefixes are never recomputed, so
their tokens would pass no hook). Nothing here imports vLLM: the hooks sit on plain torch modules.

Where each boundary is read (docs/CONVENTIONS.md#boundaries; vLLM's decoder layers return `(hidden, residual)` with the
residual add fused into the next norm):
  S_0      input of decoder layer 0 (the embeddings; residual is None there)
  S_{b+1}  `hidden + residual` of decoder layer b's output (what vLLM's own aux capture adds up)
  F        first output of the final norm (`norm(hidden, residual)` returns `(normed, residual_sum)`)
Each boundary value is computed inside the hook (`hidden + residual` is a new tensor), before the next layer's
fused add-norm overwrites `hidden` and `residual` in place (vLLM's `fused_add_rms_norm` is in-place).

Forward passes are bracketed (token count, sample plan) by hooks on the inner decoder stack for HF, but on the
outer `*ForCausalLM` for vLLM: vLLM 0.24's `@support_torch_compile` replaces the inner stack's `__call__` with one
that calls `forward` directly (vllm/compilation/decorators.py), so hooks on `LlamaModel` itself never fire; hooks
on its layers and final norm do (`entry_module`).

Memory: one StatsState (boundaries x 4 x hidden floats) plus the bounded raw sample; never per token.
The sample keeps the first tokens of the prompts in their order (at most per_seq each), with their context hashes,
so captures by different engines of the same prompts line up token by token. vLLM batches the prompts of one
`generate` as its scheduler finds them (its engine core starts stepping as soon as the first request has arrived),
so the client plans the prompts of each chunk first (`speclens_plan`, TokenSample.plan) and every row goes to the
slot of its prompt, whatever forward pass, order or prefill chunk it comes in (hook_reduce.plan_rows).

Compiled capture (`--engine-option compiled=true`): the hooks above need an eager engine, and on the 8B shape the eager
engine alone costs about 1% over vLLM's compiled one. A compiled engine still runs the outer `*ForCausalLM` in Python;
its inner stack can hand out boundaries itself: vLLM's EAGLE-3 support adds up `hidden + residual` for the ids in
`aux_hidden_state_layers` inside the compiled graph (vllm/model_executor/models/interfaces.py
`_maybe_add_hidden_state`: id i = S_i, 0 = embeddings, ascending) and returns `(final-norm output, [S_i ...])`. When
the engine is started with SPECLENS_VLLM_AUX_IDS set (backend/engines/vllm.py does, for the capture's S_i), the
worker's `load_model` is wrapped (arm_workers_at_load) so that, after the model is built and before its first
forward (which compiles it), the model's aux ids are set and a hook on the outer model strips the pair back to the
final-norm output the runner expects, handing both to the installed reducer (`take_aux`): S_i from the list, F from
the first element. The engine runs with `cudagraph_mode=NONE`: vLLM pads a batch to a captured CUDA-graph size and
the padded rows would reach the statistics (the token count check would fail the run).
"""

from __future__ import annotations

import os

import torch

from backend import coords
from backend.engines.hook_reduce import layer_pair, plan_rows, plan_sample, stage_rows, stage_runs
from backend.stats import StatsState, StreamingStats, TokenSample

AUX_ENV = "SPECLENS_VLLM_AUX_IDS"     # comma-separated aux ids (S_i -> i) a compiled capture engine hands out


def decoder_parts(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.ModuleList, torch.nn.Module | None]:
    """(inner model, decoder layers, final norm) of a vLLM or HF causal LM."""
    inner = model
    for attr in ("model", "language_model", "transformer"):
        cand = getattr(inner, attr, None)
        if isinstance(cand, torch.nn.Module) and hasattr(cand, "layers"):
            inner = cand
            break
        if isinstance(cand, torch.nn.Module) and hasattr(cand, "model") and hasattr(cand.model, "layers"):
            inner = cand.model
            break
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise RuntimeError(f"no decoder layer list found in {type(model).__name__}")
    return inner, layers, getattr(inner, "norm", None)


def bypasses_module_hooks(m: torch.nn.Module) -> bool:
    """True for a module whose class replaces `nn.Module.__call__` with one that calls `forward` directly, so
    hooks registered on the module itself never fire. vLLM 0.24's `@support_torch_compile` does this to the
    inner decoder stack (e.g. `LlamaModel`, vllm/compilation/decorators.py: `cls.__call__ = __call__`, which in
    eager mode returns `self.forward(*args, **kwargs)`); hooks on its children (layers, norm) still fire."""
    call = getattr(type(m), "__call__", None)  # noqa: B004 (the class attribute, not callable())
    return hasattr(m, "do_not_compile") or "_support_torch_compile" in getattr(call, "__qualname__", "")


def entry_module(model: torch.nn.Module, inner: torch.nn.Module) -> torch.nn.Module | None:
    """The module whose pre-/post-forward hooks bracket every forward pass of the decoder stack: the inner stack
    (HF calls it directly) unless vLLM's compile decorator bypasses its hooks, then the outer *ForCausalLM (which
    vLLM's model runners call with input_ids=, positions= keywords); None if both bypass hooks."""
    for m in (inner, model):
        if not bypasses_module_hooks(m):
            return m
    return None


def arm_aux(model: torch.nn.Module, ids: list[int]) -> None:
    """Make a vLLM model return `(final-norm output, [S_i for i in ids])` from its (compiled) inner stack, and put a
    hook on the outer model that hands the pair to `model._speclens_aux_sink` (a reducer's `take_aux`, when one is
    installed) and returns the final-norm output alone, as the runner expects. Must run before the first forward:
    vLLM compiles the inner stack then, with the aux ids it finds."""
    ids = sorted({int(i) for i in ids})
    setter = getattr(model, "set_aux_hidden_state_layers", None)
    if setter is None:
        raise RuntimeError(f"{type(model).__name__} has no set_aux_hidden_state_layers (no EAGLE-3 support in vLLM): "
                           "capture it without --engine-option compiled=true")
    setter(tuple(ids))
    model._speclens_aux_ids = ids
    model._speclens_aux_sink = None

    def strip(module, args, out):
        pair = isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], (list, tuple))
        sink = module._speclens_aux_sink
        if sink is not None:
            sink(out[0] if pair else out, out[1] if pair else None)    # None: this forward handed out nothing
        return out[0] if pair else out

    model.register_forward_hook(strip)


def aux_ids_from_env() -> list[int] | None:
    """The aux ids of an engine started for a compiled capture (AUX_ENV set, possibly empty: F alone), else None."""
    text = os.environ.get(AUX_ENV)
    return None if text is None else [int(x) for x in text.split(",") if x.strip()]


def arm_workers_at_load() -> bool:
    """Wrap vLLM's worker `load_model` once in this process: after the model is built, in an engine started for a
    compiled capture (AUX_ENV set in the worker's environment), `arm_aux` it, before the profiling forward compiles
    it. vLLM offers no hook between building and compiling a model, and a worker extension cannot override a method
    of the worker class (vllm/v1/worker/worker_base.py appends it to the worker's bases).

    It must have run in the process the worker's class is taken from: a spawned worker imports this module afresh
    (the import below runs it when AUX_ENV is set); a worker forked from the caller, or run in it, inherits the
    caller's modules, where this module was imported before AUX_ENV was set, so backend.engines.vllm.make_llm calls
    it before it starts such an engine. False where vLLM's worker is not importable."""
    try:
        from vllm.v1.worker.gpu_worker import Worker
    except ImportError:                       # not inside vLLM (tests without it)
        return False
    if getattr(Worker.load_model, "_speclens_armed", False):
        return True
    orig = Worker.load_model

    def load_model(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        ids = aux_ids_from_env()
        if ids is None:                       # an engine not started for a compiled capture
            return
        mr = self.model_runner
        m = mr.get_model() if hasattr(mr, "get_model") else mr.model
        arm_aux(getattr(m, "module", m), ids)

    load_model._speclens_armed = True
    Worker.load_model = load_model
    return True


if aux_ids_from_env() is not None:            # imported in a spawned worker of a compiled capture engine
    arm_workers_at_load()


def aux_layers_of(model: torch.nn.Module) -> list[int] | None:
    """The ids vLLM's model adds up for the drafter (`aux_hidden_state_layers`), read from the live model."""
    for m in model.modules():
        v = getattr(m, "aux_hidden_state_layers", None)
        if v is not None and len(v) > 0:
            return [int(x) for x in v]
    return None


class BoundaryReducer:
    """Hooks on one model that feed StreamingStats (every token) and a TokenSample (bounded)."""

    def __init__(self, model: torch.nn.Module, labels: list[str], sample_tokens: int, sample_per_prompt: int,
                 state: dict | None = None, sample: dict | None = None, exact: bool = False):
        self.inner, self.layers, self.norm = decoder_parts(model)
        n = len(self.layers)
        self.bounds = [coords.parse(lbl, n) for lbl in labels]
        self.labels = list(labels)
        p = next(model.parameters())
        self.device = p.device
        hidden = int(getattr(getattr(model, "config", None), "hidden_size", 0) or p.shape[-1])
        st = StatsState.from_tensors(state, self.device) if state else None
        self.stats = StreamingStats(self.labels, hidden, self.device, st, exact=exact)
        self.sample = TokenSample(self.labels, hidden, sample_tokens, sample_per_prompt,
                                  dtype=torch.float32 if p.dtype == torch.float32 else torch.bfloat16,
                                  pin=self.device.type == "cuda")
        if sample:
            self.sample.load(sample)
        self.tokens = 0
        self.forwards = 0
        self._take: torch.Tensor | None = None   # rows of this forward that go to the sample
        self._runs: list[tuple[int, int, int]] = []   # planned sample: (row, slot, count) of this forward
        self._segs: list[tuple[torch.Tensor, int]] = []
        self._pending_ids: torch.Tensor | None = None
        self._handles = []
        self._armed: torch.nn.Module | None = None     # the compiled engine's model whose aux pair comes here
        self._aux_pos: list[int | None] = []
        self._aux_ids: list[int] = []
        self.aux_missing = 0          # forwards of a compiled engine that handed out no boundaries
        self._install(model)

    # -------------------------------------------------------------- hooks
    def _install(self, model: torch.nn.Module) -> None:
        entry = entry_module(model, self.inner)
        ids = getattr(model, "_speclens_aux_ids", None)
        if ids is not None:                      # a compiled engine armed at load (arm_aux): no layer hooks
            self._install_aux(model, entry, list(ids))
            return
        if entry is not None:
            self._handles.append(entry.register_forward_pre_hook(self._begin, with_kwargs=True))
            self._handles.append(entry.register_forward_hook(self._end))
        else:
            # fallback: token ids from the embedding's input, positions from decoder layer 0's first argument
            # (vLLM: layer(positions, hidden_states, residual)); registered before any boundary hook on layer 0
            embed = getattr(self.inner, "embed_tokens", None)
            if isinstance(embed, torch.nn.Module):
                self._handles.append(embed.register_forward_pre_hook(self._embed_ids))
            self._handles.append(self.layers[0].register_forward_pre_hook(self._begin_layer0, with_kwargs=True))
        for k, b in enumerate(self.bounds):
            if b.final:
                if self.norm is None:
                    raise RuntimeError("no final norm found for boundary F")
                self._handles.append(self.norm.register_forward_hook(self._post(k)))
            elif b.index == 0:
                self._handles.append(self.layers[0].register_forward_pre_hook(self._pre0(k), with_kwargs=True))
            else:
                self._handles.append(self.layers[b.index - 1].register_forward_hook(self._post(k)))

    def _install_aux(self, model: torch.nn.Module, entry: torch.nn.Module | None, ids: list[int]) -> None:
        """Boundaries from the pair the armed model's strip hook hands over (arm_aux): S_i at its place among the
        aux ids, F the final-norm output. The forward is bracketed on the outer model, as in hook mode."""
        if entry is not model:
            raise RuntimeError(f"{type(model).__name__}: its forward hooks do not fire; a compiled capture needs them")
        missing = [lbl for lbl, b in zip(self.labels, self.bounds) if not b.final and b.index not in ids]
        if missing:
            have = ", ".join(f"S_{i}" for i in ids) or "no S_i"
            raise RuntimeError(f"this engine was started to hand out {have} only, not {', '.join(missing)}; "
                               "start it for these boundaries")
        self._aux_pos = [None if b.final else ids.index(b.index) for b in self.bounds]
        self._aux_ids = ids
        self._handles.append(model.register_forward_pre_hook(self._begin, with_kwargs=True))
        self._handles.append(model.register_forward_hook(self._end))
        model._speclens_aux_sink = self.take_aux
        self._armed = model

    def take_aux(self, final: torch.Tensor, aux: list[torch.Tensor] | None) -> None:
        """One forward's boundaries from a compiled engine: `final` (F) and `aux` (S_i in ascending id order). aux
        None: the compiled graph returned no aux states (built without them, e.g. a compile cache of another engine);
        counted, so that the capture fails instead of missing those tokens."""
        if (aux is None and self._aux_ids) or (aux is not None and len(aux) != len(self._aux_ids)):
            self.aux_missing += 1
            return
        for k, pos in enumerate(self._aux_pos):
            self._sink(k, final if pos is None else aux[pos])

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        armed = getattr(self, "_armed", None)
        if armed is not None and armed._speclens_aux_sink == self.take_aux:
            armed._speclens_aux_sink = None
        self._armed = None

    def _begin(self, module, args, kwargs):
        ids = kwargs["input_ids"] if "input_ids" in kwargs else (args[0] if args else None)
        pos = kwargs.get("positions")
        if pos is None:
            pos = kwargs.get("position_ids")
        if pos is None and len(args) > 1 and isinstance(args[1], torch.Tensor):
            pos = args[1]
        embeds = kwargs.get("inputs_embeds")
        self._start(ids, pos, embeds)

    def _embed_ids(self, module, args):
        self._pending_ids = args[0] if args and isinstance(args[0], torch.Tensor) else None

    def _begin_layer0(self, module, args, kwargs):
        pos = kwargs.get("positions", args[0] if args and isinstance(args[0], torch.Tensor)
                         and not args[0].is_floating_point() else None)
        floats = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
        h = kwargs.get("hidden_states", floats[0] if floats else None)
        ids, self._pending_ids = getattr(self, "_pending_ids", None), None
        self._start(ids, pos, h)

    def _start(self, ids, pos, embeds=None):
        self._flush()                            # a forward whose end hook did not fire (fallback path)
        if not isinstance(ids, torch.Tensor):
            ids = None
        if not isinstance(pos, torch.Tensor):
            pos = None
        if ids is not None and pos is None:      # HF called without position ids: one sequence from 0
            pos = torch.arange(ids.shape[-1], device=ids.device)
        self.forwards += 1
        if ids is not None:
            self.tokens += int(ids.numel())
        elif isinstance(embeds, torch.Tensor):   # prompt embeddings instead of ids: count their rows
            self.tokens += int(embeds.reshape(-1, embeds.shape[-1]).shape[0])
        self._take, self._segs, self._runs = None, [], []
        if ids is None or pos is None or not self.sample.wants():
            return
        if pos.dim() > 1 and pos.shape[0] != ids.reshape(-1).shape[0]:
            pos = pos[0]                          # M-RoPE [3, T]: the first row is the text position
        # a host sync, only while the sample has room
        pos, ids = pos.reshape(-1).cpu(), ids.reshape(-1).cpu()
        if self.sample.planning:
            self._runs = plan_rows(pos, ids, self.sample)
            return
        take, self._segs = plan_sample(pos, ids, self.sample)
        if take is not None:
            self._take = take.to(self.device, non_blocking=True)

    def _end(self, module, args, out):
        self._flush()

    def _flush(self) -> None:
        """Commit this forward's staged sample rows (their token ids, context hashes, positions)."""
        for ids, k in self._segs:
            self.sample.commit(ids, k)
        self._take, self._segs, self._runs = None, [], []

    def _sink(self, k: int, h: torch.Tensor, r: torch.Tensor | None = None) -> None:
        """Boundary k's value is h + r (h alone when r is None): into the statistics in one pass over the pair, and
        summed only while this forward stages sample rows."""
        h = h.reshape(-1, h.shape[-1])
        r = None if r is None else r.reshape(-1, r.shape[-1])
        self.stats.update_pair(k, h, r)
        if self._take is None and not self._runs:
            return
        x = h if r is None else h + r
        if self._take is not None:
            stage_rows(self.sample, k, x, self._take)
        else:
            stage_runs(self.sample, k, x, self._runs)

    def _post(self, k: int):
        def hook(module, args, out):
            if self.bounds[k].final:
                self._sink(k, out[0] if isinstance(out, tuple) else out)
            else:
                self._sink(k, *layer_pair(out))
        return hook

    def _pre0(self, k: int):
        def hook(module, args, kwargs):
            # vLLM: layer(positions, hidden_states, residual); HF: layer(hidden_states, ...)
            floats = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
            h = kwargs.get("hidden_states", floats[0] if floats else None)
            r = kwargs.get("residual", floats[1] if len(floats) > 1 else None)
            self._sink(k, h, r)
        return hook

    # -------------------------------------------------------------- results
    def collect(self) -> dict:
        self._flush()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return {"labels": self.labels, "state": {k: v.detach().cpu() for k, v in self.stats.state.tensors().items()},
                "sample": {k: v.clone() for k, v in self.sample.tensors().items()},
                "tokens_seen": self.tokens, "forwards": self.forwards, "aux_missing": self.aux_missing}


def _tensors(d: dict | bytes | None) -> dict | None:
    if isinstance(d, (bytes, bytearray, memoryview)):
        import io
        return torch.load(io.BytesIO(bytes(d)), map_location="cpu", weights_only=True)
    return d or None


class SpecLensWorker:
    """vLLM worker extension (mixed into the GPU worker class by vLLM; `self.model_runner` is the worker's)."""

    def _speclens_model(self) -> torch.nn.Module:
        mr = self.model_runner
        m = mr.get_model() if hasattr(mr, "get_model") else mr.model
        return getattr(m, "module", m)

    def speclens_install(self, labels: list[str], sample_tokens: int = 4096, sample_per_prompt: int = 512,
                         state: dict | bytes | None = None, sample: dict | bytes | None = None,
                         exact: bool = False) -> int:
        """state / sample (resume): dicts of tensors, or their torch.save bytes (what backend.engines.vllm.install
        sends, since collective_rpc does not rebuild tensors inside its arguments); exact: order-free sums (a
        resumed state keeps its own mode)."""
        old = getattr(self, "_speclens", None)
        if old is not None:
            old.remove()
        self._speclens = None
        self._speclens = BoundaryReducer(self._speclens_model(), list(labels), int(sample_tokens),
                                         int(sample_per_prompt), _tensors(state), _tensors(sample), exact)
        return len(self._speclens.layers)

    def speclens_plan(self, seqs: list[list[int]]) -> int:
        """The prompts the next `generate` runs, in their order (their first sample_per_prompt tokens are enough):
        their sample slots (TokenSample.plan). Returns the room left in the sample."""
        r = getattr(self, "_speclens", None)
        if r is None:
            raise RuntimeError("speclens_plan before speclens_install: no SpecLens hooks in this worker")
        return r.sample.plan([list(map(int, s)) for s in seqs])

    def speclens_stats_path(self, fused: bool) -> str:
        """Which statistics update the installed hooks use: the one-pass kernel (fused, where it runs) or the compiled
        StreamingStats.update (the side-by-side speed test, gpu/vllm_suite.py). Returns the one now in use."""
        r = getattr(self, "_speclens", None)
        if r is None:
            raise RuntimeError("speclens_stats_path before speclens_install: no SpecLens hooks in this worker")
        return "one_pass" if r.stats.use_one_pass(fused) else "compiled"

    def speclens_collect(self) -> dict:
        r = getattr(self, "_speclens", None)
        if r is None:
            raise RuntimeError("speclens_collect before speclens_install: no SpecLens hooks in this worker")
        return r.collect()

    def speclens_remove(self) -> None:
        r = getattr(self, "_speclens", None)
        if r is not None:
            r.remove()
        self._speclens = None

    def speclens_model_info(self) -> dict:
        """What the running engine really does: decoder layers, hidden size, and the aux layer ids it adds
        up for an EAGLE-3 drafter (None without one)."""
        m = self._speclens_model()
        _, layers, _ = decoder_parts(m)
        return {"n_layers": len(layers), "aux_layers": aux_layers_of(m), "model_class": type(m).__name__,
                "use_v2_model_runner": getattr(self, "use_v2_model_runner", None),
                "model_runner_class": type(self.model_runner).__name__}
