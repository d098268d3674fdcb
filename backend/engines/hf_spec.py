"""HF decoding loops for the bench: plain decoding, EAGLE-3 chain drafting (docs/CONVENTIONS.md#draft-step) and
DFlash block drafting (docs/CONVENTIONS.md#dflash: `DFlashProposer`, the same verify and rollback).

Shapes: P prompt tokens, K draft tokens per step, V target vocab, H_T target width, k aux boundaries.

One speculative step, with the target's last sampled token x at position `pos` (not yet in its KV):

    propose  d_1..d_K                          drafter: last pass's output, then K-1 `step`s
    verify   target([x, d_1..d_K])             one forward over K+1 tokens with KV -> logits [K+1, V],
                                               hooks capture aux [K+1, k*H_T]
    accept   n = greedy-matching prefix        temperature 0; else Leviathan rejection sampling
             new = d_1..d_n + one target token  (the correction at n < K, the bonus at n = K)
    rollback target KV to pos+1+n slots;  drafter KV to its context (drops the K-1 draft slots)
    append   drafter.prefill(aux[:n+1], new, positions pos..pos+n)  (slot t holds the token x_{t+1})
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch

from backend import coords
from backend.drafter import Eagle3Drafter
from backend.engines.hf import BoundaryHooks, LoadedModel
from backend.errors import SpecLensError

DRAFT_SAMPLING = ("sample", "argmax")   # standard Leviathan (draft from q) | vLLM V1 (argmax at any temperature)


@dataclass
class Generation:
    tokens: list[int]                    # output token ids (prompt excluded)
    seconds: float                       # first forward started -> last token out
    ttft: float                          # first forward started -> first output token
    accepted: list[int] = field(default_factory=list)   # per verify step, 0..K (empty for plain decoding)


class Sampler:
    """Greedy at temperature 0, else sampling from softmax(logits / T) with a seeded generator."""

    def __init__(self, temperature: float, generator: torch.Generator | None = None):
        self.temperature, self.generator = float(temperature), generator

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., V] logits -> [..., V] float32 probabilities at this temperature."""
        return torch.softmax(logits.float() / self.temperature, dim=-1)

    def draw(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def uniform(self, device: torch.device) -> float:
        return float(torch.rand((), generator=self.generator, device=device))

    def pick(self, logits: torch.Tensor) -> int:
        return int(logits.argmax()) if self.greedy else self.draw(self.probs(logits))


def seeded_sampler(temperature: float, seed: int, device: torch.device) -> Sampler:
    return Sampler(temperature, torch.Generator(device=device).manual_seed(seed))


def eos_ids(lm: LoadedModel) -> set[int]:
    eos = getattr(lm.config, "eos_token_id", None)
    ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    tok_eos = getattr(lm.tokenizer, "eos_token_id", None)
    if tok_eos is not None:
        ids.add(int(tok_eos))
    return ids


def _new_cache(lm: LoadedModel):
    from transformers import DynamicCache

    return DynamicCache(config=lm.config)


def _crop(cache, n: int) -> None:
    """Keep the first n slots of an HF DynamicCache (negative crop: transformers >= 5.17 style)."""
    drop = cache.get_seq_length() - n
    if drop > 0:
        cache.crop(-drop)


def _done(out: list[int], max_new: int, eos: set[int]) -> bool:
    return len(out) >= max_new or out[-1] in eos


# ---------------------------------------------------------------------- plain decoding


def _prefill(lm: LoadedModel, prompt: list[int], sampler: Sampler) -> tuple[object, list[int], float, float]:
    """The prompt into a fresh target KV cache and the first output token: (cache, [token], t0, ttft)."""
    cache = _new_cache(lm)
    t0 = time.perf_counter()
    logits = lm.model(input_ids=torch.tensor([prompt], device=lm.device), past_key_values=cache, use_cache=True,
                      logits_to_keep=1).logits[0, -1]                                     # [V]
    out = [sampler.pick(logits)]
    return cache, out, t0, time.perf_counter() - t0


@torch.inference_mode()
def decode_plain(lm: LoadedModel, prompt: list[int], max_new_tokens: int, sampler: Sampler,
                 eos: set[int]) -> Generation:
    """Plain decoding with the target's KV cache: one forward per output token."""
    model, dev = lm.model, lm.device
    cache, out, t0, ttft = _prefill(lm, prompt, sampler)
    while not _done(out, max_new_tokens, eos):
        logits = model(input_ids=torch.tensor([[out[-1]]], device=dev), past_key_values=cache,
                       use_cache=True).logits[0, -1]                                      # [V]
        out.append(sampler.pick(logits))
    return Generation(out, time.perf_counter() - t0, ttft)


# ---------------------------------------------------------------------- aux capture


class AuxCapture:
    """Forward hooks on the target that keep the drafter's aux boundaries of the last forward."""

    def __init__(self, lm: LoadedModel, labels: list[str]):
        self.lm = lm
        self.bs = [coords.parse(lbl, lm.n_layers) for lbl in labels]
        self.buf: list[torch.Tensor | None] = [None] * len(self.bs)
        self.hooks = BoundaryHooks(lm, self.bs, self._sink)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No hooks on the target inside the block (plain decoding timed beside the drafter, as it runs alone)."""
        self.hooks.remove()
        try:
            yield
        finally:
            self.hooks = BoundaryHooks(self.lm, self.bs, self._sink)

    def _sink(self, k: int, x: torch.Tensor) -> None:
        self.buf[k] = x                                  # [T, H_T]

    def take(self) -> torch.Tensor:
        """[T, k*H_T]: the aux states of the last forward, concatenated in ascending boundary order."""
        return torch.cat(self.buf, dim=-1)

    def close(self) -> None:
        self.hooks.remove()

    def __enter__(self) -> AuxCapture:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------- proposers


class Proposer(Protocol):
    """What the speculative loop asks of a drafter. Positions are target positions; slot t holds x_{t+1}."""

    def start(self, aux: torch.Tensor, next_ids: list[int], positions: list[int]) -> None:
        """New request: context aux [P, k*H_T], next_ids [P] (the prompt shifted by one + the first sampled token)."""

    def propose(self, k: int, sampler: Sampler) -> tuple[list[int], torch.Tensor | None]:
        """K draft tokens (target vocab) and their proposal distributions q [K, V] (None: one-hot, argmax)."""

    def advance(self, aux: torch.Tensor, next_ids: list[int], positions: list[int]) -> None:
        """Drop the draft slots and append the accepted tokens' target features aux [n+1, k*H_T]."""


class EagleProposer:
    """An Eagle3Drafter as a chain proposer. draft_sampling "sample" draws d_i ~ q_i = softmax(logits / T)
    (standard speculative sampling), "argmax" takes the argmax at any temperature (vLLM V1, q one-hot)."""

    def __init__(self, drafter: Eagle3Drafter, draft_sampling: str = "sample"):
        if draft_sampling not in DRAFT_SAMPLING:
            raise SpecLensError(f"draft sampling {draft_sampling!r}: unknown; use one of {', '.join(DRAFT_SAMPLING)}")
        self.d, self.mode = drafter, draft_sampling
        self.ctx, self.last_pos, self.out = 0, -1, None

    def start(self, aux, next_ids, positions) -> None:
        self.d.reset()
        self.ctx = 0
        self.advance(aux, next_ids, positions)

    def advance(self, aux, next_ids, positions) -> None:
        self.d.truncate(self.ctx)                                                  # drop draft slots
        self.out = self.d.prefill(aux, torch.tensor(next_ids, device=aux.device),
                                  torch.tensor(positions, device=aux.device))
        self.ctx += len(next_ids)
        self.last_pos = positions[-1]

    def propose(self, k, sampler):
        out, tokens, qs = self.out, [], []
        for i in range(k):
            if sampler.greedy or self.mode == "argmax":
                tok = out.token
            else:
                q = sampler.probs(self.d.target_logits(out.logits))                     # [V]
                tok = sampler.draw(q)
                qs.append(q)
            tokens.append(tok)
            if i < k - 1:
                out = self.d.step(tok, out.hidden, self.last_pos + 1 + i)
        return tokens, (torch.stack(qs) if qs else None)


class DFlashProposer:
    """A DFlash drafter (backend/drafter/dflash.py) as a block proposer: one drafter pass over [x_s, M..M] proposes
    K tokens at once (greedy, its block's argmax; q one-hot, so rejection sampling stays exact at T > 0). The
    context is the target's states at the fed boundaries of every verified position, appended after each verify
    (the verify forward's states of x_s and the accepted drafts), so the next block sees them all."""

    def __init__(self, drafter):
        self.d, self.last, self.pos = drafter, None, -1

    def start(self, aux, next_ids, positions) -> None:
        self.d.reset()
        self.advance(aux, next_ids, positions)

    def advance(self, aux, next_ids, positions) -> None:
        self.d.append_context(aux, torch.tensor(positions, device=aux.device))   # positions with target states
        self.last, self.pos = next_ids[-1], positions[-1] + 1                      # x_s, not yet in the target KV

    def propose(self, k, sampler):
        return self.d.propose(self.last, self.pos, k), None


# ---------------------------------------------------------------------- verification


def verify(logits: torch.Tensor, draft: list[int], q: torch.Tensor | None, sampler: Sampler) -> tuple[int, list[int]]:
    """logits [K+1, V] of the target at [x, d_1..d_K]; q [K, V] or None (one-hot drafts).
    -> (n accepted, new tokens d_1..d_n + correction or bonus: n+1 tokens).
    Greedy: the longest prefix with d_i == argmax. Sampling (Leviathan et al. 2023): accept d_i with
    probability min(1, p_i(d_i) / q_i(d_i)); on rejection draw from norm(max(0, p_i - q_i)); bonus from p_K."""
    K = len(draft)
    if sampler.greedy:
        target = logits.argmax(-1).tolist()                                          # [K+1]
        n = next((i for i in range(K) if draft[i] != target[i]), K)
        return n, draft[:n] + [target[n]]
    p = sampler.probs(logits)                                                        # [K+1, V]
    for i, d in enumerate(draft):
        qd = float(q[i, d]) if q is not None else 1.0
        if sampler.uniform(p.device) * qd < float(p[i, d]):          # u < p/q, without dividing by q = 0
            continue
        if q is not None:
            residual = (p[i] - q[i].to(p.device)).clamp_min(0)
        else:
            residual = p[i].clone()
            residual[d] = 0.0                                         # max(0, p - onehot(d))
        total = float(residual.sum())
        tok = sampler.draw(residual / total) if total > 0 else sampler.draw(p[i])
        return i, draft[:i] + [tok]
    return K, draft + [sampler.draw(p[K])]


# ---------------------------------------------------------------------- speculative decoding


@torch.inference_mode()
def decode_spec(lm: LoadedModel, proposer: Proposer, aux: AuxCapture, prompt: list[int], k: int,
                max_new_tokens: int, sampler: Sampler, eos: set[int]) -> Generation:
    """Chain speculative decoding of one prompt (see the module docstring); records n per verify step."""
    model, dev = lm.model, lm.device
    cache, out, t0, ttft = _prefill(lm, prompt, sampler)
    accepted: list[int] = []
    if _done(out, max_new_tokens, eos):
        return Generation(out, time.perf_counter() - t0, ttft, accepted)
    pos = len(prompt)                                    # position of out[-1], not yet in the target KV
    proposer.start(aux.take(), prompt[1:] + out, list(range(pos)))
    while True:
        draft, q = proposer.propose(k, sampler)
        logits = model(input_ids=torch.tensor([[out[-1]] + draft], device=dev), past_key_values=cache,
                       use_cache=True).logits[0]                                          # [K+1, V]
        feats = aux.take()                                                               # [K+1, k*H_T]
        n, new = verify(logits, draft, q, sampler)
        accepted.append(n)
        for t in new:
            out.append(t)
            if _done(out, max_new_tokens, eos):
                return Generation(out, time.perf_counter() - t0, ttft, accepted)
        _crop(cache, pos + 1 + n)                        # keep x and the accepted drafts
        proposer.advance(feats[: n + 1], new, list(range(pos, pos + n + 1)))
        pos += n + 1
