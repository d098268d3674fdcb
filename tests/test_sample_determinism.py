"""The raw token sample of a vLLM capture depends on the prompts only, not on how vLLM batches them.

vLLM's engine core starts stepping as soon as the first request of a `generate` has arrived, so which prompts share
a forward pass, their order in the flat batch and where a long prompt's prefill is split depend on timing. The
sample must still keep the same tokens in the same slots as the HF engine's in-order fill (the first prompts, at
most per_seq tokens each), uninterrupted or resumed from a checkpoint. Here a fake scheduler batches the same
prompts in different random ways through the real worker-side hooks (backend/engines/vllm_worker.py) and the
real client side (backend/engines/vllm.py VllmCapture: plan, prefill, collect, rebuild)."""

import random
from types import SimpleNamespace

import pytest
import torch

from backend.engines import vllm as V
from backend.engines.vllm_worker import SpecLensWorker
from backend.settings import CaptureSettings
from backend.stats import TokenSample, context_hashes

LABELS = ["S_0", "S_1", "S_2"]
HIDDEN = 4


class Layer(torch.nn.Module):
    def forward(self, positions, hidden_states, residual):
        res = hidden_states if residual is None else hidden_states + residual
        return hidden_states * 0.5, res


class Inner(torch.nn.Module):
    def __init__(self, positional: bool = True):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Embedding(64, HIDDEN)
        self.pos = torch.nn.Embedding(512, HIDDEN) if positional else None
        with torch.no_grad():
            self.embed.weight.copy_(torch.randn(64, HIDDEN, generator=g))
            if self.pos is not None:
                self.pos.weight.copy_(torch.randn(512, HIDDEN, generator=g))
        self.layers = torch.nn.ModuleList([Layer(), Layer()])

    def forward(self, input_ids, positions):
        h, r = self.embed(input_ids) + (self.pos(positions) if self.pos is not None else 0), None
        for layer in self.layers:
            h, r = layer(positions, h, r)
        return h + r


class Outer(torch.nn.Module):
    """A vLLM-shaped model: flat batch of token ids and positions, (hidden, residual) layers; `positional`: a
    position embedding added to the token's (so that the same token at two positions has two states)."""

    def __init__(self, positional: bool = True):
        super().__init__()
        self.model = Inner(positional)

    def forward(self, input_ids, positions):
        return self.model(input_ids=input_ids, positions=positions)


def _prompts(seed: int = 0, n: int = 24) -> list[list[int]]:
    rng = random.Random(seed)
    system = [1, 2, 3, 4, 5]                      # a shared chat-template prefix
    out = []
    for i in range(n):
        body = [rng.randrange(6, 64) for _ in range(rng.randrange(1, 30))]
        out.append(system + body if i % 3 else body)
    out[7] = list(out[4])                          # a duplicate prompt
    out[9] = out[4][:8]                            # a prompt that is a prefix of another
    return out


def _schedule(model: Outer, seqs: list[list[int]], seed: int) -> None:
    """Prefill `seqs` the way a batching engine may: requests arrive a few at a time, a token budget per forward
    pass, long prompts split into chunks at budget-dependent points, requests in any order in the flat batch,
    and a new sequence sometimes right before another's next chunk whose positions run on from it."""
    rng = random.Random(seed)
    pending = list(range(len(seqs)))
    running: dict[int, int] = {}                   # prompt -> next position
    while pending or running:
        for _ in range(rng.randrange(0, 4) if running else rng.randrange(1, 4)):
            if pending:
                running[pending.pop(0)] = 0
        budget = rng.randrange(4, 40)
        chunks = []
        for p in rng.sample(list(running), len(running)):
            if budget <= 0:
                break
            a = running[p]
            b = min(len(seqs[p]), a + rng.randrange(1, budget + 1))
            budget -= b - a
            chunks.append((p, a, b))
        if rng.random() < 0.5:                     # put new sequences right before continuing chunks
            chunks.sort(key=lambda c: c[1] != 0)
        ids = torch.tensor([t for p, a, b in chunks for t in seqs[p][a:b]])
        pos = torch.tensor([t for p, a, b in chunks for t in range(a, b)])
        with torch.no_grad():
            model(ids, pos)
        for p, _a, b in chunks:
            if b == len(seqs[p]):
                del running[p]
            else:
                running[p] = b


def _expected(model: Outer, seqs, capacity, per_seq) -> dict:
    """The HF engine's fill: the prompts in order, each run alone."""
    ref = TokenSample(LABELS, HIDDEN, capacity, per_seq)
    for s in seqs:
        ids, pos = torch.tensor(s), torch.arange(len(s))
        with torch.no_grad():
            h0 = model.model.embed(ids) + model.model.pos(pos)
            h1, r1 = model.model.layers[0](pos, h0, None)
            h2, r2 = model.model.layers[1](pos, h1, r1)
        ref.add(ids, {0: h0, 1: h1 + r1, 2: h2 + r2})
    return ref.tensors()


def _worker(model: Outer, capacity: int, per_seq: int, state=None, sample=None, exact=False) -> SpecLensWorker:
    w = SpecLensWorker()
    w.model_runner = SimpleNamespace(model=model)
    w.speclens_install(LABELS, capacity, per_seq, state, sample, exact)
    return w


def _same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("capacity,per_seq", [(60, 12), (400, 512), (25, 4)])
def test_sample_does_not_depend_on_batching(capacity, per_seq):
    model = Outer()
    seqs = _prompts()
    want = _expected(model, seqs, capacity, per_seq)
    for seed in range(6):
        w = _worker(model, capacity, per_seq)
        room = None
        for i in range(0, len(seqs), 8):           # the capture loop's chunks of prompts
            if room is None or room > 0:
                room = w.speclens_plan([s[:per_seq] for s in seqs[i:i + 8]])
            _schedule(model, seqs[i:i + 8], seed)
        got = w.speclens_collect()
        assert got["tokens_seen"] == sum(map(len, seqs))
        _same(got["sample"], want)
    k = min(len(seqs[0]), per_seq)
    assert want["ctx_hash"][:k].tolist() == context_hashes(seqs[0][:k]).tolist()


@pytest.mark.parametrize("exact", [False, True])
def test_resumed_capture_keeps_the_sample_of_an_uninterrupted_one(monkeypatch, exact):
    """VllmCapture end to end (client and worker), vLLM replaced by the fake scheduler: interrupted after a chunk
    and resumed from that checkpoint in a new engine that batches differently, the sample is the same, bit for
    bit, as an uninterrupted capture's and the HF fill's; with exact sums, so is every statistic."""
    model = Outer()
    seqs = _prompts(seed=1, n=40)

    class FakeLLM:
        def __init__(self, seed):
            self.seed, self.worker, self.calls = seed, None, 0

        def collective_rpc(self, method, args=()):
            return [getattr(self.worker, method)(*args)]

    def fake_prefill(llm, chunk):
        llm.calls += 1
        _schedule(model, chunk, llm.seed * 100 + llm.calls)
        return 0.0

    def fake_install(llm, labels, sample_tokens, per_prompt, state=None, sample=None, exact=False):
        llm.worker = _worker(model, sample_tokens, per_prompt, V._tensors_to_bytes(state),
                             V._tensors_to_bytes(sample), exact)

    monkeypatch.setattr(V, "require", lambda: "0.24.0")
    monkeypatch.setattr(V, "prefill", fake_prefill)
    monkeypatch.setattr(V, "install", fake_install)
    seeds = iter([1, 2, 3])
    monkeypatch.setattr(V, "make_llm", lambda *a, **k: FakeLLM(next(seeds)))
    settings = CaptureSettings(model="m", prompts="p", sample_tokens=120, checkpoint_every=2, exact_sums=exact)
    per_seq = 16
    settings.sample_per_prompt = per_seq

    def session(state=None, sample=None):
        s = V.VllmCapture(settings)
        s.info = SimpleNamespace(hidden_size=HIDDEN)
        s.begin(None, "r", 0, LABELS, None, state, sample)
        s.start(None)
        return s

    full = session()
    for i in range(0, len(seqs), full.chunk):
        full.run(seqs[i:i + full.chunk])
    stats_full, sample_full = full.accumulators()
    full.llm.worker.speclens_remove()              # the sessions share one model: its hooks must not count on

    first = session()
    first.run(seqs[:first.chunk])                  # killed after the first chunk's checkpoint
    stats, sample = first.accumulators()
    first.llm.worker.speclens_remove()
    resumed = session(stats.state, {k: v.clone() for k, v in sample.tensors().items()})
    for i in range(resumed.chunk, len(seqs), resumed.chunk):
        resumed.run(seqs[i:i + resumed.chunk])
    stats_resumed, sample_resumed = resumed.accumulators()
    resumed.llm.worker.speclens_remove()

    want = _expected(model, seqs, 120, per_seq)
    assert sample.n < 120                          # the sample was not full at the checkpoint
    _same(sample_full.tensors(), want)
    _same(sample_resumed.tensors(), want)
    assert stats_full.state.is_exact == exact
    if exact:   # the sums do not depend on the batches: every statistic is the same, bit for bit
        _same(stats_full.state.tensors(), stats_resumed.state.tensors())
        a, b = stats_full.table(), stats_resumed.table()
        assert a.drop(columns=["top_dims", "top_dims_max_abs"]).equals(b.drop(columns=["top_dims", "top_dims_max_abs"]))
        assert a["n_tokens"].tolist() == [sum(map(len, seqs))] * len(LABELS)
