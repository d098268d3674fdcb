"""Requests at a set concurrency against a running vLLM or SGLang server: what one level of a serving-load bench
sends and times. No run directories here (backend/load_bench.py owns those), no statistics (backend/metrics.py).

vLLM: `POST /v1/completions` (OpenAI API) with the prompt as token ids, streamed, `ignore_eos` so every request
generates exactly `max_tokens` (paired requests are then the same work), usage in every chunk
(`stream_options.continuous_usage_stats`). A chunk is one engine step of that request, so the request's own
count of verification steps is its chunks after the first, and its accepted draft tokens are tokens - chunks
(vLLM merges the chunks of steps that the client did not read in time, so under load this count misses steps; a
chunk of more than K+1 tokens proves a merge and the request's own count is then left out; the server's counters
are the reference).

SGLang: its native `POST /generate` with `input_ids`, streamed; the last chunk's `meta_info` holds the request's
own `spec_verify_ct`, `spec_num_correct_drafts` (older releases: derived from completion_tokens) and
`spec_correct_drafts_histogram`.

Timing (as `vllm bench serve`): TTFT = first token's arrival after the request was sent; ITL = gaps between
chunks that carry tokens; TPOT = (latency - TTFT) / (output tokens - 1); a level's duration runs from the first
request sent to the last one finished.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field

import aiohttp

from backend.errors import SpecLensError


@dataclass
class RequestResult:
    index: int                      # position in the level's request order (the same order on both sides)
    prompt_index: int
    prompt_tokens: int
    sent: float                     # seconds since the level started
    ttft: float | None = None
    latency: float | None = None
    output_tokens: int = 0
    chunks: int = 0                 # chunks that carried tokens
    max_chunk: int = 0              # most tokens in one chunk (vLLM: more than K+1 means merged steps)
    itl: list[float] = field(default_factory=list)
    drafts: int | None = None       # the request's own count of verification steps, where the engine gives one
    accepted: int | None = None     # its accepted draft tokens
    hist: list[int] | None = None   # SGLang: verification steps with n correct drafts
    output_hash: str | None = None
    error: str | None = None
    last: float = field(default=0.0, repr=False)   # perf_counter of the last chunk that carried tokens

    def arrived(self, new: int, t0: float) -> None:
        """A chunk with `new` tokens arrived now (the request was sent at perf_counter `t0`): TTFT, the gap since the
        last chunk (ITL), chunk count, largest chunk, tokens so far."""
        now = time.perf_counter()
        if self.ttft is None:
            self.ttft = now - t0
        else:
            self.itl.append(now - self.last)
        self.last = now
        self.output_tokens += new
        self.chunks += 1
        self.max_chunk = max(self.max_chunk, new)

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.latency is None or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    def row(self) -> dict:
        d = asdict(self)
        d.pop("itl")
        d.pop("last")
        d["tpot"] = self.tpot
        d["hist"] = json.dumps(self.hist) if self.hist is not None else None
        return d


def _hash(ids: list[int]) -> str | None:
    return hashlib.blake2b(json.dumps(ids).encode(), digest_size=8).hexdigest() if ids else None


async def _sse(resp: aiohttp.ClientResponse):
    """The `data:` payloads of a server-sent-event stream, as dicts; stops at [DONE]."""
    buf = b""
    async for chunk in resp.content.iter_any():
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            try:
                yield json.loads(data)
            except json.JSONDecodeError:
                continue


async def _vllm_request(session: aiohttp.ClientSession, url: str, model: str, r: RequestResult, ids: list[int],
                        max_tokens: int, temperature: float, t_level: float) -> None:
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": temperature, "stream": True,
            "ignore_eos": True, "return_token_ids": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    t0 = time.perf_counter()
    r.sent = t0 - t_level
    out_ids: list[int] = []
    async with session.post(url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            r.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
            return
        async for ev in _sse(resp):
            new = 0
            for ch in ev.get("choices") or []:
                tid = ch.get("token_ids") or []
                out_ids += tid
                new += len(tid)
            usage = ev.get("usage") or {}
            if usage.get("completion_tokens") is not None:
                new = max(new, int(usage["completion_tokens"]) - r.output_tokens)
            if new > 0:
                r.arrived(new, t0)
    r.latency = time.perf_counter() - t0
    r.output_hash = _hash(out_ids)
    if r.chunks >= 2:
        r.drafts = r.chunks - 1                       # the first chunk is the prefill's token
        r.accepted = max(0, r.output_tokens - r.chunks)


async def _sglang_request(session: aiohttp.ClientSession, url: str, r: RequestResult, ids: list[int],
                          max_tokens: int, temperature: float, t_level: float) -> None:
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": temperature, "ignore_eos": True}}
    t0 = time.perf_counter()
    r.sent = t0 - t_level
    meta: dict = {}
    out_ids: list[int] = []
    async with session.post(url + "/generate", json=body) as resp:
        if resp.status != 200:
            r.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
            return
        async for ev in _sse(resp):
            meta = ev.get("meta_info") or meta
            total = int(meta.get("completion_tokens") or 0)
            oi = ev.get("output_ids")
            if isinstance(oi, list):
                out_ids = oi if len(oi) >= len(out_ids) and total == len(oi) else out_ids + oi
            if total > r.output_tokens:
                r.arrived(total - r.output_tokens, t0)
    r.latency = time.perf_counter() - t0
    r.output_hash = _hash(out_ids[:r.output_tokens])
    vc = meta.get("spec_verify_ct")
    if vc:
        r.drafts = int(vc)
        correct = meta.get("spec_num_correct_drafts")
        r.accepted = int(correct) if correct is not None else max(0, r.output_tokens - 1 - int(vc))
        hist = meta.get("spec_correct_drafts_histogram")
        r.hist = [int(x) for x in hist] if isinstance(hist, list) else None


async def _level(engine: str, url: str, model: str | None, prompts: list[list[int]], order: list[int],
                 concurrency: int, max_tokens: int, temperature: float, timeout: float) -> tuple[list, float]:
    sem = asyncio.Semaphore(concurrency)
    results = [RequestResult(i, p, len(prompts[p]), 0.0) for i, p in enumerate(order)]
    conn = aiohttp.TCPConnector(limit=concurrency + 4, force_close=False)
    tmo = aiohttp.ClientTimeout(total=timeout)
    t_level = time.perf_counter()

    async def one(r: RequestResult) -> None:
        async with sem:
            try:
                if engine == "vllm":
                    await _vllm_request(session, url, model or "", r, prompts[r.prompt_index], max_tokens,
                                        temperature, t_level)
                else:
                    await _sglang_request(session, url, r, prompts[r.prompt_index], max_tokens, temperature,
                                          t_level)
            except TimeoutError:
                r.error = f"no answer within {timeout:.0f} s"
            except aiohttp.ClientError as e:
                r.error = f"{type(e).__name__}: {str(e)[:160]}"

    async with aiohttp.ClientSession(connector=conn, timeout=tmo) as session:
        await asyncio.gather(*(one(r) for r in results))
    return results, time.perf_counter() - t_level


def run_level(engine: str, url: str, prompts: list[list[int]], order: list[int], concurrency: int, max_tokens: int,
              temperature: float = 0.0, model: str | None = None, timeout: float = 600.0) -> tuple[list, float]:
    """Send `order` (indices into `prompts`) with at most `concurrency` in flight; (results, level seconds)."""
    return asyncio.run(_level(engine, url.rstrip("/"), model, prompts, order, concurrency, max_tokens, temperature,
                              timeout))


# ---------------------------------------------------------------------- small server calls

def _get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:300]
    except (urllib.error.URLError, OSError) as e:
        raise SpecLensError(f"server {url} is unreachable ({getattr(e, 'reason', e)}); start it or fix "
                            "--server-url") from None


def scrape(url: str) -> str:
    """`GET /metrics` text (a one-line error when the server has none: SGLang needs --enable-metrics)."""
    status, text = _get(url.rstrip("/") + "/metrics")
    if status != 200:
        raise SpecLensError(f"server {url} has no /metrics (HTTP {status}); start SGLang with --enable-metrics")
    return text


def served_model(url: str) -> str | None:
    """The first model id of `GET /v1/models` (vLLM needs it in every request), None when the server has none."""
    status, text = _get(url.rstrip("/") + "/v1/models")
    if status != 200:
        return None
    try:
        data = json.loads(text).get("data") or []
    except (json.JSONDecodeError, AttributeError):
        return None
    return data[0].get("id") if data else None


def server_version(engine: str, url: str) -> str | None:
    path = "/version" if engine == "vllm" else "/server_info"
    try:
        status, text = _get(url.rstrip("/") + path)
        return str(json.loads(text).get("version")) if status == 200 else None
    except (SpecLensError, json.JSONDecodeError, AttributeError):
        return None
