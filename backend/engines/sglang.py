"""SGLang 0.5.x adapter: server lifecycle, captures through `--forward-hooks`, benches through `/generate`.

SGLang itself is never imported here: the server is a child process (`python -m sglang.launch_server`) started
in its own process group and torn down with it (SIGTERM, then SIGKILL), or a running server given by URL.
The hooks that run inside it live in backend/engines/sglang_hooks.py.

- capture: a server with `--forward-hooks` (capture factory), `--disable-cuda-graph --disable-radix-cache
  --disable-overlap-schedule --skip-tokenizer-init`; prompts go in as token ids with max_new_tokens=1; a reset
  before and a collect after (files dropped into the hook directory, each carried out by a one-token trigger
  request that is left out). The overlap scheduler must be off: with it, SGLang 0.5.15 launches one more decode
  step for a request before it processes the prefill's result (scheduler.py event_loop_overlap; the step's
  output is dropped in batch_result_processor.process_batch_result_decode), so every max_new_tokens=1 request
  would put one extra token through the hooks.
- bench: one `/generate` request at a time with token ids; acceptance from each response's `meta_info`
  (tau = 1 + spec_num_correct_drafts / spec_verify_ct, docs/CONVENTIONS.md; SGLang's own spec_accept_length
  kept raw), per-step accepted lengths from `spec_correct_drafts_histogram`; chains by default
  (`--speculative-num-steps K --speculative-eagle-topk 1 --speculative-num-draft-tokens K+1`, comparable
  with vLLM's num_speculative_tokens=K), trees when `engine_options` ask for them (recorded as given).
- what SGLang feeds the drafter: `layers_to_capture` read from the running target model by an info hook
  (input of layer i for each entry i, so entry i is boundary S_i).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from backend import coords, metrics
from backend.drafter.kinds import serving_method
from backend.engines.base import CaptureSettings, EngineOptions, EngineSettings, Generation, TargetInfo, own_options
from backend.engines.server_process import _LIVE, ServerProcess, log_tail, stop_all  # noqa: F401 (re-exported)
from backend.errors import SpecLensError
from backend.netutil import free_port, port_free  # noqa: F401 (re-exported: tests, callers)
from backend.options import DEFAULT_K, TORCH_DTYPES
from backend.store.data_root import DataRoot

if TYPE_CHECKING:
    import torch

    from backend.runs.lifecycle import Run
    from backend.stats import StatsState, StreamingStats, TokenSample

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_ENV = "SPECLENS_SGLANG_START_TIMEOUT"     # seconds a server may take to become healthy (default 600)
LOG_DIR_ENV = "SPECLENS_SGLANG_LOG_DIR"                 # where servers started without an explicit log write theirs


def require() -> str:
    """The installed SGLang version (without importing it), or a one-line error saying where it runs."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("sglang")
    except PackageNotFoundError:
        raise SpecLensError("SGLang is not installed here; run this on the GPU node (pip install sglang==0.5.15, see "
                            "README 'GPU node'), pass --server-url of a running server, or use --engine hf") from None


def _http(url: str, body: dict | None = None, timeout: float = 30.0) -> dict:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:300].replace("\n", " ")
        raise SpecLensError(f"SGLang server {url} answered HTTP {e.code}: {detail}") from None
    except TimeoutError:
        raise SpecLensError(f"SGLang server {url}: no answer within {timeout:.0f} s; raise the timeout or check the "
                            "server log") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, socket.timeout) or "timed out" in str(reason):
            raise SpecLensError(f"SGLang server {url}: no answer within {timeout:.0f} s; raise the timeout or check "
                                "the server log") from None
        raise SpecLensError(f"SGLang server {url} is unreachable ({reason}); start it or fix --server-url") from None
    return json.loads(raw) if raw.strip() else {}


@dataclass
class ServerSpec:
    model: str
    drafter: str | None = None
    num_spec_tokens: int = DEFAULT_K
    tp: int = 1
    dtype: str = "bfloat16"
    mem_fraction: float = 0.2
    hooks: list | None = None
    capture: bool = False                      # hooks need eager mode and no prefix cache
    extra: dict | None = None                  # more flags: {"speculative-eagle-topk": 4, ...}
    host: str = "127.0.0.1"
    port: int | None = None

    def argv(self, port: int) -> list[str]:
        a = [sys.executable, "-m", "sglang.launch_server", "--model-path", self.model, "--host", self.host,
             "--port", str(port), "--tp-size", str(self.tp), "--dtype", self.dtype, "--mem-fraction-static",
             str(self.mem_fraction), "--skip-tokenizer-init", "--sampling-backend", "pytorch"]
        if self.capture:
            a += ["--disable-cuda-graph", "--disable-radix-cache", "--disable-overlap-schedule"]
        if self.drafter and serving_method(self.drafter, "sglang") == "DFLASH":
            # one block per step: the verify window is K + 1 tokens (DFLASH takes no steps or topk)
            a += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", self.drafter,
                  "--speculative-num-draft-tokens", str(self.num_spec_tokens + 1)]
        elif self.drafter:
            extra = self.extra or {}
            topk = int(extra.get("speculative-eagle-topk", 1))
            a += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", self.drafter,
                  "--speculative-num-steps", str(self.num_spec_tokens), "--speculative-eagle-topk", str(topk),
                  "--speculative-num-draft-tokens", str(extra.get("speculative-num-draft-tokens",
                                                                  self.num_spec_tokens + 1 if topk == 1 else 8))]
        if self.hooks:
            a += ["--forward-hooks", json.dumps(self.hooks)]
        for k, v in (self.extra or {}).items():
            if k in ("speculative-eagle-topk", "speculative-num-draft-tokens") or v is None or v is False:
                continue
            a += [f"--{k}"] if v is True else [f"--{k}", json.dumps(v) if isinstance(v, (dict, list)) else str(v)]
        return a


class Server(ServerProcess):
    """A launched SGLang server (backend/engines/server_process.py ServerProcess: its own process group, always torn
    down with it); healthy when constructed, or a one-line error with its log's tail and nothing left running."""

    tail_lines = 6

    def __init__(self, spec: ServerSpec, log: Path | None = None, start_timeout: float | None = None):
        self.spec = spec
        if start_timeout is None:
            start_timeout = float(os.environ.get(START_TIMEOUT_ENV) or 600.0)
        port = spec.port or free_port(spec.host)
        if not port_free(spec.host, port):
            raise SpecLensError(f"port {port} on {spec.host} is in use; stop what listens there or pick another port")
        if log is None:
            d = os.environ.get(LOG_DIR_ENV)
            log = (Path(d) / f"server-{time.strftime('%H%M%S')}-{port}.log") if d else \
                Path(tempfile.mkdtemp(prefix="speclens-sglang-")) / "server.log"
        # /health would otherwise run a one-token generation (input_ids [0]) through the model, and so through
        # the hooks; with this off it only says whether the server is up (http_server.py health_generate).
        env = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION":
               os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "false")}
        super().__init__(spec.argv(port), log, "SGLang", spec.host, port, env=env)
        self.wait_healthy(start_timeout)

    def log_tail(self, n: int = 6) -> str:
        return log_tail(self.log, n)


# ---------------------------------------------------------------------- requests

def generate(url: str, ids: list[int], max_new_tokens: int, temperature: float = 0.0, eos: list[int] | None = None,
             seed: int | None = None, timeout: float = 300.0) -> dict:
    sp = {"max_new_tokens": max_new_tokens, "temperature": temperature}
    if eos:
        sp["stop_token_ids"] = eos
    if seed is not None and temperature > 0:
        sp["sampling_seed"] = seed
    return _http(url + "/generate", {"input_ids": ids, "sampling_params": sp}, timeout)


def accepted_lengths(meta: dict, k: int) -> list[int]:
    """Per verify step, how many drafts were accepted, from `spec_correct_drafts_histogram` ([n] = steps with n
    correct drafts); the order of steps is not reported, only their counts."""
    hist = meta.get("spec_correct_drafts_histogram")
    if hist is None:
        return []
    out: list[int] = []
    for n, c in enumerate(hist):
        if n > k and c:
            raise SpecLensError(f"SGLang reports {c} steps with {n} correct drafts but K = {k}: a tree "
                                "(--speculative-eagle-topk > 1) or a K mismatch; pass the server's K")
        out += [n] * int(c)
    return out


class ServerEngine:
    """Bench units through one SGLang server (launched here, or attached by URL)."""

    engine_name = "sglang"

    def __init__(self, s: EngineSettings, drafter: str | None, eos: list[int], log_dir: Path | None = None):
        self.k = s.num_spec_tokens if drafter else 0
        self.eos, self.server, self.hook_dir = eos, None, None
        if s.server_url:
            self.url = s.server_url.rstrip("/")
            info = _http(self.url + "/server_info", timeout=10)
            self.version = str(info.get("version", "unknown"))
        else:
            self.version = require()
            self.hook_dir = Path(tempfile.mkdtemp(prefix="speclens-sglang-info-"))
            from transformers import AutoConfig
            n = int(AutoConfig.from_pretrained(s.target).num_hidden_layers)
            from backend.engines.sglang_hooks import hook_specs

            extra = dict(s.options)
            mem = float(extra.pop("mem-fraction-static", 0.2))
            spec = ServerSpec(model=s.target, drafter=drafter, num_spec_tokens=s.num_spec_tokens,
                              tp=s.tensor_parallel_size, dtype=s.engine_dtype(), mem_fraction=mem, extra=extra,
                              hooks=hook_specs(str(self.hook_dir), None, n) if drafter else None)
            try:
                self.server = Server(spec, log=(log_dir / "server.log") if log_dir else None)
            except BaseException:
                shutil.rmtree(self.hook_dir, ignore_errors=True)
                raise
            self.url = self.server.url
        self.start_seconds = getattr(self.server, "start_seconds", None)
        self._aux_ids: list[int] | None = None
        self._aux_missing = False

    def generate(self, prompt: list[int], max_new_tokens: int, temperature: float, seed: int) -> Generation:
        t0 = time.perf_counter()
        try:
            r = generate(self.url, prompt, max_new_tokens, temperature, self.eos, seed)
        except SpecLensError as e:
            if self.server is None:
                raise
            raise SpecLensError(str(e) + self.server.death_note()) from None
        seconds = time.perf_counter() - t0
        meta = r.get("meta_info", {})
        acc = accepted_lengths(meta, self.k) if self.k else []
        ttft = None
        return Generation(list(r.get("output_ids", [])), seconds, ttft, acc, meta)

    def aux_ids(self) -> list[int] | None:
        """`layers_to_capture` of the running target model, written by the info hook on the first forward pass
        (the server's own warm-up request runs before /health answers, so it is there once the server is up)."""
        if not self.k or self.hook_dir is None:
            return None
        if self._aux_ids is not None:
            return list(self._aux_ids)
        if self._aux_missing:
            return None
        f = self.hook_dir / "info.rank0.json"
        for _ in range(50):
            if f.exists():
                self._aux_ids = [int(v) for v in json.loads(f.read_text())["layers_to_capture"]]
                return list(self._aux_ids)
            time.sleep(0.1)
        self._aux_missing = True
        err = hook_error(self.hook_dir)
        print(f"speclens: SGLang's layers_to_capture could not be read ({err or 'the info hook never fired'}); "
              "the run records the predicted boundaries", file=sys.stderr)
        return None

    def fed_boundaries(self, n_layers: int) -> list[str] | None:
        ids = self.aux_ids()
        if not ids:
            return None
        return coords.labels(sorted({coords.Boundary(int(i)) for i in ids}, key=lambda b: b.sort_key()))

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        if self.hook_dir is not None:
            shutil.rmtree(self.hook_dir, ignore_errors=True)


def make_engine(s: EngineSettings, drafter: str | None, eos: list[int]) -> ServerEngine:
    return ServerEngine(s, drafter, eos)


# ---------------------------------------------------------------------- captures

def hook_error(hook_dir: Path) -> str | None:
    """The first error a SpecLens hook raised inside the server (sglang_hooks writes it instead of raising)."""
    for f in sorted(Path(hook_dir).glob("error.rank*.txt")):
        try:
            return f.read_text(errors="replace").strip().splitlines()[-1][:500]
        except (OSError, IndexError):
            continue
    return None


def _trigger(url: str, hook_dir: Path, what: str, timeout: float = 120.0) -> None:
    (hook_dir / f"{what}.request").write_text("1")
    generate(url, [1], 1)
    deadline = time.time() + timeout
    while (hook_dir / f"{what}.request").exists():
        err = hook_error(hook_dir)
        if err:
            raise SpecLensError(f"a SpecLens hook failed inside the SGLang server: {err}")
        if time.time() > deadline:
            raise SpecLensError(f"SGLang server did not run the SpecLens hooks ({hook_dir}); was it started with "
                                "--forward-hooks and --disable-cuda-graph?")
        time.sleep(0.05)
    err = hook_error(hook_dir)
    if err:
        raise SpecLensError(f"a SpecLens hook failed inside the SGLang server: {err}")


def collect_state(url: str, hook_dir: Path) -> dict:
    import torch

    _trigger(url, hook_dir, "collect")
    f = hook_dir / "state.rank0.pt"
    return torch.load(f, weights_only=False)


@dataclass
class SGLangOptions(EngineOptions):
    """The SGLang engine's capture options (base.EngineOptions): the folder for the server's log (None: a temporary
    one, or $SPECLENS_SGLANG_LOG_DIR)."""
    log_dir: Path | None = None


class SGLangCapture:
    """SGLang's side of the one capture loop (backend/engines/capture_loop.py): a server started with the capture
    hooks, reset, one max_new_tokens=1 request per prompt, the state collected at the end; no checkpoints (a server
    cannot take a resumed state), so a resumed run is refused."""

    label = " (sglang)"
    chunk = 1
    missing_tokens_fix = ""

    def __init__(self, settings: CaptureSettings, options: SGLangOptions | None = None):
        self.settings, self.log_dir = settings, own_options(SGLangOptions, options).log_dir
        self.engine_version = f"sglang {require()}"
        self.server: Server | None = None
        self.hook_dir: Path | None = None
        self.res: dict | None = None

    def target(self) -> TargetInfo:
        from backend.engines.base import target_info

        self.info = target_info(self.settings.model)
        return self.info

    def begin(self, rd: Run, run_id: str, start: int, labels: list[str], wanted: list[coords.Boundary],
              state: StatsState | None, sample: dict[str, torch.Tensor] | None) -> None:
        from backend.engines.sglang_hooks import hook_specs

        if start:
            rd.fail("an SGLang capture cannot resume inside a new server; run it again with another --name")
            raise SpecLensError(f"capture {run_id}: SGLang captures restart from the beginning; use another --name")
        s = self.settings
        self.hook_dir = Path(tempfile.mkdtemp(prefix="speclens-sglang-cap-"))
        self.spec = ServerSpec(model=s.model, capture=True,
                               dtype=TORCH_DTYPES.get(s.dtype, s.dtype),
                               hooks=hook_specs(str(self.hook_dir), labels, self.info.n_layers, s.sample_tokens,
                                                s.sample_per_prompt, s.exact_sums))

    def guard_options(self, run_id: str, where: Callable[[], str], save: Callable[[], None]) -> dict:
        from backend.runs.lifecycle import one_line

        return {"note": lambda: self.server.death_note() if self.server is not None else "",
                "describe": lambda e: f"SGLang capture stopped: {one_line(e)}",
                "interrupted": lambda: "SGLang capture stopped: KeyboardInterrupt: "}

    def start(self, rd: Run) -> None:
        self.server = Server(self.spec, log=(self.log_dir / "server.log") if self.log_dir else None)
        rd.record(server={"start_seconds": round(self.server.start_seconds, 1),
                          "argv": self.spec.argv(self.server.port)[1:]})
        _trigger(self.server.url, self.hook_dir, "reset")

    def run(self, seqs: list[list[int]]) -> None:
        for s in seqs:
            generate(self.server.url, s, 1)

    def checkpoint_due(self, done: int) -> bool:
        return False

    def accumulators(self) -> tuple[StreamingStats, TokenSample]:
        from backend.engines.base import rebuild_capture

        self.res = collect_state(self.server.url, self.hook_dir)
        return rebuild_capture(self.res, self.info.hidden_size, self.settings.sample_tokens,
                               self.settings.sample_per_prompt)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        if self.hook_dir is not None:
            shutil.rmtree(self.hook_dir, ignore_errors=True)

    def verify(self, rd: Run, tokens_expected: int) -> None:
        from backend.engines.base import check_hook_tokens

        check_hook_tokens(rd, self.res, tokens_expected, "SGLang", layers_to_capture=self.res.get("layers_to_capture"))


def capture_options(settings: CaptureSettings, tensor_parallel_size: int = 1,
                    engine_options: dict | None = None) -> SGLangOptions:
    """A capture's options: the server's log in the default place (a capture's server takes no flags of its own)."""
    return SGLangOptions()


def capture_session(settings: CaptureSettings, options: EngineOptions | None = None) -> SGLangCapture:
    return SGLangCapture(settings, own_options(SGLangOptions, options))


def run_capture(settings: CaptureSettings, name: str | None = None, data: DataRoot | None = None, progress: bool = True,
                log_dir: Path | None = None):
    """`capture --engine sglang`: the HF capture's run directory, boundaries read inside an SGLang server."""
    from backend.engines import capture_loop

    return capture_loop.run(SGLangCapture(settings, SGLangOptions(log_dir=log_dir)), settings, name, data, progress)


__all__ = ["Server", "ServerSpec", "ServerEngine", "SGLangCapture", "SGLangOptions", "capture_options",
           "capture_session", "run_capture",
           "accepted_lengths", "metrics"]
