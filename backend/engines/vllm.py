"""vLLM 0.24 adapter: captures and speculative-decoding benches through vLLM's own code path.

vLLM is imported lazily (only the GPU node has it); everything that does not need it (metric snapshots,
Prometheus text, error messages, accepted-length histograms) is plain Python and tested on CPU against
output recorded on the H200 (tests/test_vllm_adapter.py, fixtures under tests/data/recorded/).

- capture: `LLM(enforce_eager=True, enable_prefix_caching=False, worker_extension_cls=SpecLensWorker)`,
  hooks installed in every worker by `collective_rpc("speclens_install")` reduce each boundary to
  streaming statistics on the GPU (backend/engines/vllm_worker.py); prompts go in as token ids with
  max_tokens=1 (prefill only), so the tokens are exactly the HF capture's. With `--engine-option compiled=true`
  the engine stays compiled (no CUDA graphs) and its inner stack hands out the boundaries itself (vLLM's EAGLE-3
  aux outputs, armed at model load: vllm_worker.arm_aux); the same reducer takes them.
- extract: vLLM's own `extract_hidden_states` method + `ExampleHiddenStatesConnector` (what vLLM feeds a
  drafter, aux ids plus the last layer), files read back, reduced and deleted.
- bench: `LLM(speculative_config={"method": "eagle3", ...})`, one request at a time (Spec-Bench, batch 1),
  acceptance from `get_metrics()` deltas around each request; a paired baseline engine without a drafter.
  `ServerEngine` does the same against a running `vllm serve` (OpenAI API + `/metrics`).
- what vLLM really feeds the drafter: `collective_rpc("speclens_model_info")` reads `aux_hidden_state_layers`
  from the live model in the worker, not from the config.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from backend import coords, metrics
from backend.engines.base import CaptureSettings, EngineOptions, EngineSettings, Generation, TargetInfo, own_options
from backend.errors import SpecLensError
from backend.options import DEFAULT_K, TORCH_DTYPES
from backend.store.data_root import DataRoot

if TYPE_CHECKING:
    import torch

    from backend.runs.lifecycle import Run
    from backend.stats import StatsState, StreamingStats, TokenSample

WORKER_EXT = "backend.engines.vllm_worker.SpecLensWorker"
RECORDING: list | None = None      # set to a list to keep every request's counter snapshots (gpu/vllm_suite.py)
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos")


def require() -> str:
    """vLLM's version, or a one-line error saying where it runs."""
    try:
        import vllm
    except ImportError:
        raise SpecLensError("vLLM is not installed here; run this on the GPU node (pip install vllm==0.24.0, see "
                            "README 'GPU node') or use --engine hf") from None
    return vllm.__version__


@dataclass
class VllmOptions(EngineOptions):
    """The vLLM engine's options (base.EngineOptions): what is passed through to `vllm.LLM` (anything in `extra`
    verbatim); `capture_options` builds them from the command line's or a job's."""
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.3
    max_model_len: int | None = None
    dtype: str = "auto"
    load_format: str | None = None
    compiled: bool = False        # a capture in the compiled engine (aux outputs armed at load), not in an eager one
    extra: dict = field(default_factory=dict)


MEMORY_HINTS = ("out of memory", "no available memory for the cache blocks")
SIZE_SETTINGS = ("max_model_len", "max_num_batched_tokens", "max_num_seqs")


def short_error(e: BaseException, cause: str | None = None, settings: dict | None = None) -> str:
    """One line for an engine failure: the root cause a child process printed (`cause`, see
    backend/engines/stderr_tail.py) or the exception's last line; when the GPU memory does not hold these
    settings, which `--engine-option` to lower or raise, with the values used (`settings`: what went to vllm.LLM)
    and vLLM's own estimate of the longest context that fits."""
    text = str(e).strip() or type(e).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    msg = cause or (lines[-1] if lines else text)
    low = f"{text}\n{cause or ''}".lower()
    if not (any(h in low for h in MEMORY_HINTS) or ("kv cache" in low and "memory" in low)):
        return msg[:300] if cause else f"{type(e).__name__}: {msg[:300]}"
    settings = settings or {}
    util = settings.get("gpu_memory_utilization")
    fix = [f"raise --engine-option gpu_memory_utilization (now {util})" if util is not None
           else "raise --engine-option gpu_memory_utilization"]
    est = re.search(r"estimated maximum model length is (\d+)", cause or text)
    if est or "max seq len" in low or "max_model_len" in (cause or ""):
        now = settings.get("max_model_len")
        fix.append(f"lower --engine-option max_model_len={est.group(1) if est else '...'}"
                   + (f" (now {now})" if now else " (the model's context length is the default)"))
    fix += [f"lower --engine-option {k} (now {settings[k]})" for k in SIZE_SETTINGS[1:] if k in settings]
    reason = re.sub(r"\s*(Try|See) .*$", "", msg).strip()[:160]
    return f"GPU memory too small for these settings ({reason}): {' or '.join(fix)}"


ARMING_VERSION = 2                 # in a compiled capture engine's compile-cache key (make_llm)


def aux_ids_for(labels: list[str], n_layers: int) -> list[int]:
    """The aux ids a compiled capture engine must hand out for these boundaries: i for S_i (F needs none)."""
    return sorted({b.index for b in (coords.parse(lbl, n_layers) for lbl in labels) if not b.final})


def make_llm(model: str, opts: VllmOptions, *, drafter: str | None = None, num_spec_tokens: int | None = None,
             capture: bool = False, eager: bool = True, extract: dict | None = None,
             aux_ids: list[int] | None = None):
    """A `vllm.LLM` for one purpose. capture: hooks need eager mode and no prefix caching; with aux_ids (a compiled
    capture) the engine stays compiled, without CUDA graphs, and its workers arm those aux outputs at model load."""
    require()
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")   # collective_rpc returns tensors
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")         # 2 minutes of JIT otherwise
    from vllm import LLM

    from backend.engines.vllm_worker import AUX_ENV, arm_workers_at_load

    compiled = aux_ids is not None
    kw = dict(model=model, tensor_parallel_size=opts.tensor_parallel_size, dtype=opts.dtype,
              gpu_memory_utilization=opts.gpu_memory_utilization,
              enforce_eager=(eager or capture) and not compiled,
              disable_log_stats=False, seed=0, skip_tokenizer_init=True, worker_extension_cls=WORKER_EXT)
    if compiled:    # padded CUDA-graph batches would put padding rows into the statistics
        kw["compilation_config"] = {"cudagraph_mode": "NONE"}
        # part of vLLM's compile-cache key: a graph compiled without these aux outputs is never reused here. The
        # arming's version too: before it, an engine core forked from a process that had imported vllm_worker was
        # never armed, and cached a graph without aux outputs under the same ids (docs/RELIABILITY.md)
        kw["additional_config"] = {"speclens_aux_ids": list(aux_ids), "speclens_arming": ARMING_VERSION}
    if opts.max_model_len:
        kw["max_model_len"] = opts.max_model_len
    if opts.load_format:
        kw["load_format"] = opts.load_format
    if capture:
        kw["enable_prefix_caching"] = False
    if drafter:
        from backend.drafter.kinds import serving_method

        kw["speculative_config"] = {"method": serving_method(drafter, "vllm"), "model": str(drafter),
                                    "num_speculative_tokens": num_spec_tokens}
    if extract:
        kw["speculative_config"] = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                    "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids":
                                                                         extract["ids"]}}}
        kw["kv_transfer_config"] = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                                    "kv_connector_extra_config": {"shared_storage_path": extract["path"]}}
        kw["enable_prefix_caching"] = False
    kw.update(opts.extra)
    from backend.engines.stderr_tail import StderrTail, root_cause

    if compiled and not arm_workers_at_load():   # for a worker forked from this process or run in it
        raise SpecLensError("vLLM's worker (vllm.v1.worker.gpu_worker.Worker) is not importable here: a compiled "
                            "capture needs it; run without --engine-option compiled=true")
    before = os.environ.pop(AUX_ENV, None)
    if compiled:                    # read by the workers when they load the model
        os.environ[AUX_ENV] = ",".join(map(str, aux_ids))
    with StderrTail() as tail:      # the engine core is a child process: its root cause is on stderr
        try:
            return LLM(**kw)
        except Exception as e:
            tail.settle()
            what = f"drafter {drafter}" if drafter else f"model {model}"
            raise SpecLensError(f"vLLM could not start with {what}: "
                                f"{short_error(e, root_cause(tail.text()), kw)}") from e
        finally:
            os.environ.pop(AUX_ENV, None)
            if before is not None:
                os.environ[AUX_ENV] = before


def shutdown(llm) -> None:
    """Free the engine's GPU memory now (the engine core is a child process)."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass
    import gc
    gc.collect()


def model_info(llm) -> dict:
    """From the running engine: decoder layers and the aux layer ids vLLM adds up for the drafter."""
    return llm.collective_rpc("speclens_model_info")[0]


def fed_boundaries(aux_layers: list[int] | None, n_layers: int) -> list[str] | None:
    """vLLM adds up layer i's input for aux id i (`_maybe_add_hidden_state(idx)`, idx 0 = embeddings):
    aux id i is boundary S_i (docs/CONVENTIONS.md#layer-ids)."""
    if not aux_layers:
        return None
    return coords.labels(coords.resolve_ids("vllm", list(aux_layers), n_layers, version="0.24.0"))


_AUX_LOG = re.compile(r"Using (?:Eagle3 )?auxiliary layers from (?:model|config|speculative config): \(([\d,\s]*)\)")


def aux_layers_from_log(text: str) -> list[int] | None:
    """What a running vLLM (engine core or `vllm serve`) logged it adds up for the drafter, e.g.
    "Using Eagle3 auxiliary layers from model: (2, 4, 5)" (the last such line wins)."""
    found = _AUX_LOG.findall(text)
    if not found:
        return None
    return [int(x) for x in found[-1].replace(" ", "").split(",") if x]


# ---------------------------------------------------------------------- metrics

def snapshot(metric_list) -> dict:
    """The spec-decode counters of `LLM.get_metrics()` as {name: int | list[int]} (summed over engines)."""
    out: dict = {}
    for m in metric_list:
        name = getattr(m, "name", "")
        if not name.startswith("vllm:spec_decode"):
            continue
        if hasattr(m, "values"):
            vals = [int(v) for v in m.values]
            prev = out.get(name) or [0] * len(vals)
            out[name] = [a + b for a, b in zip(prev + [0] * (len(vals) - len(prev)), vals)]
        elif hasattr(m, "value"):
            out[name] = out.get(name, 0) + int(m.value)
    return out


_PROM_LINE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')


def parse_prometheus(text: str) -> dict:
    """`GET /metrics` text of a vLLM server -> the same dict as `snapshot` (per-position counters as a list)."""
    out: dict = {}
    per_pos: dict[int, int] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _PROM_LINE.match(line)
        if not m or not m.group("name").startswith("vllm:spec_decode"):
            continue
        name = m.group("name").removesuffix("_total")
        if name.endswith("_created"):
            continue
        value = int(float(m.group("value")))
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            pos = re.search(r'position="(\d+)"', m.group("labels") or "")
            if pos:
                per_pos[int(pos.group(1))] = per_pos.get(int(pos.group(1)), 0) + value
            continue
        out[name] = out.get(name, 0) + value
    if per_pos:
        out["vllm:spec_decode_num_accepted_tokens_per_pos"] = [per_pos.get(i, 0) for i in range(max(per_pos) + 1)]
    return out


def accepted_lengths(stats: metrics.AcceptanceStats, k: int) -> list[int]:
    """vLLM counts per position, not per step; for a chain the per-step multiset follows exactly:
    steps that accepted >= i tokens = per_pos[i-1], so hist[n] = per_pos[n-1] - per_pos[n]."""
    if stats.drafts == 0:
        return []
    pp = list(stats.per_pos or [])[:k] + [0] * max(0, k - len(stats.per_pos or []))
    ge = [stats.drafts] + pp + [0]
    out: list[int] = []
    for n in range(k + 1):
        c = ge[n] - ge[n + 1]
        if c < 0:
            raise SpecLensError(f"vLLM counters are not a chain's (per-position {pp}, drafts {stats.drafts}); "
                                "tree speculation has no per-step histogram")
        out += [n] * c
    return out


# ---------------------------------------------------------------------- generation (bench units)

class OfflineEngine:
    """One vLLM engine (target, optionally with an EAGLE-3 drafter) for bench units of one request each."""

    engine_name = "vllm"

    def __init__(self, target: str, opts: VllmOptions, drafter: str | None = None, num_spec_tokens: int = DEFAULT_K,
                 eos: list[int] | None = None):
        self.version = require()
        self.k = num_spec_tokens if drafter else 0
        self.eos = eos or []
        self.llm = make_llm(target, opts, drafter=drafter, num_spec_tokens=num_spec_tokens, eager=False)
        self.info = model_info(self.llm)

    def generate(self, prompt: list[int], max_new_tokens: int, temperature: float, seed: int) -> Generation:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        sp = SamplingParams(max_tokens=max_new_tokens, temperature=temperature, seed=seed if temperature > 0 else None,
                            stop_token_ids=self.eos, detokenize=False)
        before = snapshot(self.llm.get_metrics()) if self.k else {}
        t0 = time.perf_counter()
        out = self.llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)[0]
        seconds = time.perf_counter() - t0
        after = snapshot(self.llm.get_metrics()) if self.k else {}
        ttft = getattr(out.metrics, "first_token_latency", None) if out.metrics is not None else None
        acc = accepted_lengths(metrics.from_vllm(before, after), self.k) if self.k else []
        if RECORDING is not None and self.k:
            RECORDING.append({"k": self.k, "before": before, "after": after,
                              "output_tokens": len(out.outputs[0].token_ids)})
        return Generation(list(out.outputs[0].token_ids), seconds, ttft or None, acc,
                   {"before": before, "after": after} if self.k else None)

    def aux_ids(self) -> list[int] | None:
        return self.info.get("aux_layers") if self.k else None

    def fed_boundaries(self, n_layers: int) -> list[str] | None:
        return fed_boundaries(self.aux_ids(), n_layers)

    def close(self) -> None:
        shutdown(self.llm)


class ServerEngine:
    """A running `vllm serve` (OpenAI API): completions with token-id prompts, acceptance from `/metrics`
    deltas around each request (run one request at a time so the deltas are that request's)."""

    engine_name = "vllm-server"

    def __init__(self, url: str, model: str | None = None, num_spec_tokens: int = 0, eos: list[int] | None = None,
                 timeout: float = 300.0, server_log: str | None = None):
        self.url = url.rstrip("/")
        self.server_log = server_log
        self.k, self.eos, self.timeout = num_spec_tokens, eos or [], timeout
        models = self._get_json("/v1/models")
        ids = [m.get("id") for m in models.get("data", [])]
        self.model = model or (ids[0] if ids else None)
        if self.model is None:
            raise SpecLensError(f"vLLM server {self.url} serves no model; start it with `vllm serve MODEL`")
        self.version = self._get_json("/version").get("version", "unknown")

    def _request(self, path: str, body: dict | None = None, timeout: float | None = None) -> bytes:
        req = urllib.request.Request(self.url + path, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as r:
                return r.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:300].replace("\n", " ")
            raise SpecLensError(f"vLLM server {self.url}{path} answered HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise SpecLensError(f"vLLM server {self.url} is unreachable ({reason}); start it (`vllm serve ...`) or fix "
                                "--server-url") from None

    def _get_json(self, path: str) -> dict:
        return json.loads(self._request(path, timeout=10))

    def counters(self) -> dict:
        return parse_prometheus(self._request("/metrics", timeout=10).decode())

    def generate(self, prompt: list[int], max_new_tokens: int, temperature: float, seed: int) -> Generation:
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_new_tokens, "temperature": temperature,
                "stream": True, "stop_token_ids": self.eos, "return_token_ids": True}
        if temperature > 0:
            body["seed"] = seed
        before = self.counters() if self.k else {}
        req = urllib.request.Request(self.url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        ttft, tokens = None, []
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                for raw in r:                       # server-sent events, one chunk per line
                    line = raw.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    for ch in json.loads(line[6:]).get("choices", []):
                        new = ch.get("token_ids") or []
                        if new and ttft is None:
                            ttft = time.perf_counter() - t0
                        tokens += new
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:300].replace("\n", " ")
            raise SpecLensError(f"vLLM server {self.url}/v1/completions answered HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            raise SpecLensError(f"vLLM server {self.url}: request failed ({getattr(e, 'reason', e)}); check the "
                                "server log, or raise --timeout") from None
        seconds = time.perf_counter() - t0
        after = self.counters() if self.k else {}
        acc = accepted_lengths(metrics.from_vllm(before, after), self.k) if self.k else []
        return Generation(tokens, seconds, ttft, acc, {"before": before, "after": after} if self.k else None)

    def aux_ids(self) -> list[int] | None:
        """From the server's log when given (engine option server_log=PATH): the API does not expose it."""
        if not (self.k and self.server_log):
            return None
        try:
            return aux_layers_from_log(Path(self.server_log).read_text(errors="replace"))
        except OSError as e:
            raise SpecLensError(f"{self.server_log}: cannot read the vLLM server log ({e.strerror}); fix the "
                                "server_log engine option or leave it out") from None

    def fed_boundaries(self, n_layers: int) -> list[str] | None:
        return fed_boundaries(self.aux_ids(), n_layers)

    def close(self) -> None:
        pass


def make_engine(s: EngineSettings, drafter: str | None, eos: list[int]) -> OfflineEngine | ServerEngine:
    """The engine for a bench: a running `vllm serve` when `s.server_url` is set, else an offline `vllm.LLM`."""
    if s.server_url:
        return ServerEngine(s.server_url, num_spec_tokens=s.num_spec_tokens if drafter else 0, eos=eos,
                            server_log=s.options.get("server_log"))
    extra = dict(s.options)
    extra.pop("server_log", None)                 # a ServerEngine option, never a vllm.LLM keyword
    opts = VllmOptions(tensor_parallel_size=s.tensor_parallel_size,
                         gpu_memory_utilization=float(extra.pop("gpu_memory_utilization", 0.3)),
                         max_model_len=extra.pop("max_model_len", None), dtype=s.engine_dtype(), extra=extra)
    return OfflineEngine(s.target, opts, drafter=drafter, num_spec_tokens=s.num_spec_tokens, eos=eos)


# ---------------------------------------------------------------------- captures

def prefill(llm, seqs: list[list[int]]) -> float:
    """Every sequence through the engine once (max_tokens=1: prefill only); seconds."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    t0 = time.perf_counter()
    llm.generate([TokensPrompt(prompt_token_ids=s) for s in seqs], sp, use_tqdm=False)
    return time.perf_counter() - t0


def _tensors_to_bytes(d: dict | None) -> bytes | None:
    """collective_rpc's request side (msgpack) turns a tensor inside `args` into a bare [dtype, shape, data] list
    in the worker (only results are decoded with type info, vllm/v1/serial_utils.py), so resume state travels as
    torch.save bytes (vllm_worker.SpecLensWorker.speclens_install loads them)."""
    if d is None:
        return None
    import io

    import torch

    buf = io.BytesIO()
    torch.save({k: v.detach().cpu().contiguous() for k, v in d.items()}, buf)
    return buf.getvalue()


def install(llm, labels: list[str], sample_tokens: int = 4096, sample_per_prompt: int = 512,
            state: dict | None = None, sample: dict | None = None, exact: bool = False) -> None:
    llm.collective_rpc("speclens_install", args=(list(labels), int(sample_tokens), int(sample_per_prompt),
                                                 _tensors_to_bytes(state), _tensors_to_bytes(sample), bool(exact)))


def plan(llm, seqs: list[list[int]], per_prompt: int) -> int:
    """Give the workers' samples the prompts about to run, in their order (vllm_worker.SpecLensWorker.speclens_plan):
    which tokens the sample keeps then depends on the prompts only, not on how vLLM batches them. Room left."""
    return int(llm.collective_rpc("speclens_plan", args=([list(s[:per_prompt]) for s in seqs],))[0])


def collect(llm) -> dict:
    """Rank 0's statistics and sample (after the all-reduce every rank holds the full hidden state)."""
    return llm.collective_rpc("speclens_collect")[0]


COMPILED_MARK = ", compiled"       # the engine_version suffix of a capture run in the compiled engine


def check_same_mode(run_id: str, stored_version: str, compiled: bool) -> None:
    """A resumed capture keeps the engine mode it started in: the compiled engine's final norm rounds differently
    from the eager engine's, so the two halves would not add up to either run."""
    was = stored_version.endswith(COMPILED_MARK)
    if stored_version.startswith("vllm") and was != compiled:
        mode = "compiled" if was else "eager"
        raise SpecLensError(f"capture {run_id} was started in vLLM's {mode} engine; resume it "
                            f"{'with' if was else 'without'} --engine-option compiled=true, or pick another --name")


class VllmCapture:
    """vLLM's side of the one capture loop (backend/engines/capture_loop.py): an eager `LLM` without prefix caching,
    hooks installed in every worker (with the resumed state), prompts prefilled `4 x checkpoint_every` at a time and
    the state collected from rank 0 for each checkpoint and at the end; the hooks' token count is checked."""

    label = " (vllm)"

    def __init__(self, settings: CaptureSettings, opts: VllmOptions | None = None):
        self.settings, self.opts = settings, own_options(VllmOptions, opts)
        self.engine_version = f"vllm {require()}{COMPILED_MARK if self.opts.compiled else ''}"
        # the compiled engine hands out boundaries through its own aux outputs; the eager hooks are the way round
        self.missing_tokens_fix = "; run it without --engine-option compiled=true" if self.opts.compiled else ""
        self.chunk = max(1, settings.checkpoint_every) * 4
        self.llm = None
        self.res: dict | None = None
        self.room: int | None = None           # the sample's room after the prompts planned so far

    def target(self) -> TargetInfo:
        from backend.engines.base import target_info

        self.info = target_info(self.settings.model)
        return self.info

    def begin(self, rd: Run, run_id: str, start: int, labels: list[str], wanted: list[coords.Boundary],
              state: StatsState | None, sample: dict[str, torch.Tensor] | None) -> None:
        if start > 0:
            check_same_mode(run_id, str(rd.read().engine_version or ""), self.opts.compiled)
        self.labels, self.state, self.sample = labels, state, sample

    def guard_options(self, run_id: str, where: Callable[[], str], save: Callable[[], None]) -> dict:
        return {"describe": lambda e: f"vLLM: {short_error(e)}",
                "wrap": lambda e: SpecLensError(f"capture {run_id} failed in vLLM: {short_error(e)}"),
                "interrupted": lambda: f"interrupted after {where()}; run the same command again to resume"}

    def start(self, rd: Run) -> None:
        s = self.settings
        self.llm = make_llm(s.model, self.opts, capture=True,
                            aux_ids=aux_ids_for(self.labels, self.info.n_layers) if self.opts.compiled else None)
        install(self.llm, self.labels, s.sample_tokens, s.sample_per_prompt,
                {k: v.cpu() for k, v in self.state.tensors().items()} if self.state is not None else None,
                self.sample, s.exact_sums)

    def run(self, seqs: list[list[int]]) -> None:
        if self.room is None or self.room > 0:
            self.room = plan(self.llm, seqs, self.settings.sample_per_prompt)
        prefill(self.llm, seqs)

    def checkpoint_due(self, done: int) -> bool:
        return True                            # after every chunk

    def accumulators(self) -> tuple[StreamingStats, TokenSample]:
        from backend.engines.base import rebuild_capture

        self.res = collect(self.llm)
        return rebuild_capture(self.res, self.info.hidden_size, self.settings.sample_tokens,
                               self.settings.sample_per_prompt)

    def close(self) -> None:
        if self.llm is not None:
            shutdown(self.llm)

    def verify(self, rd: Run, tokens_expected: int) -> None:
        from backend.engines.base import check_hook_tokens

        check_hook_tokens(rd, self.res, tokens_expected, "vLLM",
                          hint=" (prefix caching or padding on?); the statistics would not be the prompts'")
        missing = int(self.res.get("aux_missing") or 0)
        if missing:
            rd.fail(f"{missing} forward passes of vLLM's compiled engine handed out no boundaries")
            raise SpecLensError(f"capture {rd.run_id}: {missing} forward passes of vLLM's compiled engine handed out "
                                "no boundaries (its graph was built without them); run it without "
                                "--engine-option compiled=true")


def capture_options(settings: CaptureSettings, tensor_parallel_size: int = 1,
                    engine_options: dict | None = None) -> VllmOptions:
    """`--tensor-parallel-size` and the `--engine-option KEY=VALUE`s of a capture (command line or job):
    gpu_memory_utilization and max_model_len typed, the rest passed to `vllm.LLM` as given; the dtype the capture's."""
    extra = dict(engine_options or {})
    compiled = extra.pop("compiled", False)
    if not isinstance(compiled, bool):
        raise SpecLensError(f"--engine-option compiled={compiled}: expected true or false")
    return VllmOptions(tensor_parallel_size=int(tensor_parallel_size),
                       gpu_memory_utilization=float(extra.pop("gpu_memory_utilization", 0.3)),
                       max_model_len=extra.pop("max_model_len", None),
                       dtype=TORCH_DTYPES.get(settings.dtype, settings.dtype), compiled=compiled, extra=extra)


def capture_session(settings: CaptureSettings, options: EngineOptions | None = None) -> VllmCapture:
    return VllmCapture(settings, own_options(VllmOptions, options))


def run_capture(settings: CaptureSettings, name: str | None = None, data: DataRoot | None = None, progress: bool = True,
                opts: VllmOptions | None = None):
    """`capture --engine vllm`: the same run directory as the HF engine's, boundaries read inside vLLM."""
    from backend.engines import capture_loop

    return capture_loop.run(VllmCapture(settings, opts), settings, name, data, progress)


def run_extract(settings: CaptureSettings, ids: list[int], name: str | None = None, data: DataRoot | None = None,
                opts: VllmOptions | None = None, progress: bool = True):
    """vLLM's own `extract_hidden_states` (+ ExampleHiddenStatesConnector) for exactly the layers vLLM would feed
    a drafter with aux ids `ids` (list the last layer N too for the teacher state): files land in a temporary
    folder (/dev/shm when there is one), are imported as a capture run through the `vllm-extract` reader
    (id a -> S_a) and deleted. Costs 2 bytes x len(ids) x hidden per token on the way; use `run_capture` for
    statistics of many boundaries without per-token files."""
    import shutil
    import tempfile

    from backend.engines.base import target_info
    from backend.importers import import_capture
    from backend.prompts import encode_all, load_prompts

    require()
    opts = own_options(VllmOptions, opts)
    prompts = load_prompts(settings.prompts, settings.limit)
    info = target_info(settings.model)
    for i in ids:
        if not 0 <= int(i) <= info.n_layers:
            raise SpecLensError(f"--extract-ids {i}: vLLM captures ids 0..{info.n_layers} "
                                f"on this {info.n_layers}-layer "
                                "target (0 = embeddings, N = last layer output)")
    seqs = encode_all(info.tokenizer, prompts, settings.prompts, settings.chat_template, settings.max_prompt_tokens)
    shm = Path("/dev/shm")
    tmp = Path(tempfile.mkdtemp(prefix="speclens-vllm-extract-", dir=str(shm) if shm.is_dir() else None))
    try:
        _extract_files(settings, opts, ids, seqs, tmp, progress)
        return import_capture(tmp, "vllm-extract", producer_ids=sorted(int(i) for i in ids), num_layers=info.n_layers,
                              name=name, model=settings.model, data=data, progress=progress)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _extract_files(settings: CaptureSettings, opts: VllmOptions, ids: list[int], seqs: list[list[int]], tmp: Path,
                   progress: bool) -> None:
    """One `hs_{i}.safetensors` per prompt in `tmp`, written by vLLM's ExampleHiddenStatesConnector
    (`hidden_states [T, len(ids), H]` in ascending id order, `token_ids [T]`)."""
    llm = None
    try:
        from vllm import SamplingParams
        from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import load_hidden_states
        from vllm.inputs import TokensPrompt

        llm = make_llm(settings.model, opts, extract={"ids": sorted(int(i) for i in ids), "path": str(tmp)})
        outs = llm.generate([TokensPrompt(prompt_token_ids=s) for s in seqs],
                            SamplingParams(max_tokens=1, detokenize=False), use_tqdm=progress)
        for i, o in enumerate(outs):
            path = (o.kv_transfer_params or {}).get("hidden_states_path")
            if not path:
                raise SpecLensError("vLLM returned no hidden_states_path; is the ExampleHiddenStatesConnector loaded?")
            load_hidden_states(path)                  # waits for the connector's asynchronous write (flock)
            os.replace(path, tmp / f"hs_{i}.safetensors")
    finally:
        if llm is not None:
            shutdown(llm)
