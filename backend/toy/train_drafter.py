"""Train an EAGLE-3 drafter for the toy target, TTT-style, on the target's own greedy generations.

    python -m backend.toy.train_drafter --target data/models/toy-pair/target \
        --out data/models/toy-pair/drafter-matched --convention before --steps 1500 --device cuda

1. Self-distillation data: chat prompts (Spec-Bench training turns and offline documents) are
   answered greedily by the target (up to `gen_tokens` new tokens, through its `<|eos|>`).
2. Capture with the HF engine's forward hooks (`backend.engines.hf.BoundaryHooks`): the aux states
   of the chosen convention and F (the final-norm output, whose LM-head logits are the teacher).
   The convention turns the ids into boundaries (`backend.coords.resolve_ids`, docs/CONVENTIONS.md):
     "before": vLLM / EAGLE, id a -> S_a (input of layer a);   ids [2, 4, 5] -> S_2, S_4, S_5
     "after":  speculators <= 0.4, id a -> S_{a+1};            ids [2, 4, 5] -> S_3, S_5, S_6
3. TTT training (`ttt_forward`): `steps` unrolled draft steps over every slot at once. Step 0 is the
   first draft pass (slot t: token x_{t+1}, hidden fc(A_t), position t); step j >= 1 feeds slot t the
   token x_{t+1+j} and the drafter's OWN step j-1 output hidden, at position t+j, and attends to the
   step-0 keys of slots 0..t plus its own chain's keys of steps 1..j (what vLLM's proposer does at
   inference). Loss at step j: soft cross-entropy against the target's distribution at position
   t+1+j (logits = target lm_head(F)), weighted 0.8^j, on slots whose predicted token is generated
   (the prompt's slots count with weight `prompt_weight`).
4. Save in the EAGLE/SpecForge format (`midlayer.*`, nested `eagle_config`) with the ids as the
   producer wrote them, or with no ids at all (`--no-ids`: what speculators <= 0.4 did).

The drafter starts from the target's embedding (frozen, and saved with the drafter), LM head and
final norm (both trained further); fc and the decoder layer start random. It keeps the full target
vocab (d2t all zeros). `simulate_tau` replays greedy chain drafting on held-out text for tau.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from backend.coords import Boundary, resolve_ids
from backend.drafter import DrafterConfig, Eagle3Drafter
from backend.drafter.unroll import shift as _shift
from backend.drafter.unroll import ttt_forward
from backend.engines.hf import generate_greedy as generate

# the two conventions of the toy pair: (producer, version) rows of backend/conventions.yaml
CONVENTIONS = {"before": ("vllm", "0.24.0"), "after": ("speculators", "0.4.0")}
STEP_DECAY = 0.8


def default_ids(n_layers: int) -> list[int]:
    """EAGLE-3's default aux ids [2, N//2, N-3] (distinct for N >= 8)."""
    return [2, n_layers // 2, n_layers - 3]


def training_boundaries(convention: str, ids: list[int], n_layers: int) -> list[Boundary]:
    """The boundaries a producer of `convention` captures for `ids`."""
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown convention {convention!r}; use one of {sorted(CONVENTIONS)}")
    producer, version = CONVENTIONS[convention]
    return resolve_ids(producer, ids, n_layers, version=version)


# ---------------------------------------------------------------- self-distillation data

@dataclass
class Seq:
    """One prompt and the target's greedy continuation, with its captured boundaries."""
    tokens: torch.Tensor                  # [T] prompt + generated ids
    prompt_len: int                       # P: tokens[P:] were generated
    states: dict[str, torch.Tensor]       # boundary label ("S_3", "F") -> [T, H]
    source: str                           # "spec_bench:<question_id>[:<turn>]" or "doc:<index>"


def chat_prompt_ids(tokenizer, text: str, max_tokens: int) -> list[int]:
    """Chat-template prompt ids; an over-long user turn loses its beginning (the template stays whole)."""
    from backend.toy.corpus import chat_text

    head = tokenizer(chat_text(""), add_special_tokens=False)["input_ids"]
    body = tokenizer(text, add_special_tokens=False)["input_ids"]
    keep = max(1, max_tokens - len(head))
    body = body[-keep:]
    full = tokenizer(chat_text(tokenizer.decode(body)), add_special_tokens=False)["input_ids"]
    return full[-max_tokens:] if len(full) > max_tokens else full


def spec_bench_prompts(tokenizer, rows: list[dict], max_prompt_tokens: int,
                       all_turns: bool = False) -> list[tuple[str, list[int]]]:
    out = []
    for r in rows:
        turns = [t for t in r.get("turns", []) if isinstance(t, str) and t.strip()]
        for i, t in enumerate(turns if all_turns else turns[:1]):
            out.append((f"spec_bench:{r['question_id']}" + (f":{i}" if i else ""),
                        chat_prompt_ids(tokenizer, t, max_prompt_tokens)))
    return out


def doc_prompts(tokenizer, texts: list[str], n: int, max_prompt_tokens: int, seed: int,
                max_chars: int = 1200) -> list[tuple[str, list[int]]]:
    """`n` chat prompts whose user turn is an offline document (its first `max_chars` characters),
    picked with `seed`: the target answers them the way it answers Spec-Bench prompts."""
    rng = random.Random(seed)
    idx = sorted(rng.sample(range(len(texts)), min(n, len(texts))))
    return [(f"doc:{i}", chat_prompt_ids(tokenizer, texts[i][:max_chars], max_prompt_tokens)) for i in idx]


@torch.no_grad()
def capture(lm, sequences: list[list[int]], labels: list[str],
            store_dtype: torch.dtype = torch.float32) -> list[dict[str, torch.Tensor]]:
    """Boundaries `labels` (e.g. ["S_2", "S_3", "F"]) of each sequence, through the HF engine's hooks."""
    from backend.coords import parse
    from backend.engines.hf import BoundaryHooks

    bounds = [parse(lbl, lm.n_layers) for lbl in labels]
    out = []
    for ids in sequences:
        got: dict[int, torch.Tensor] = {}
        with BoundaryHooks(lm, bounds, lambda k, t, got=got: got.__setitem__(k, t.detach().to(store_dtype).clone())):
            lm.base(input_ids=torch.tensor([ids], device=lm.device), use_cache=False)
        out.append({lbl: got[k] for k, lbl in enumerate(labels)})
    return out


def build_data(lm, prompts: list[tuple[str, list[int]]], labels: list[str], gen_tokens: int, batch_size: int = 64,
               progress: bool = False) -> list[Seq]:
    seqs = generate(lm, [p for _, p in prompts], gen_tokens, batch_size, progress)
    states = capture(lm, seqs, sorted(set(labels) | {"F"}))
    return [Seq(torch.tensor(s, device=lm.device), len(p), st, src) for (src, p), s, st in zip(prompts, seqs, states)]


# ---------------------------------------------------------------- the drafter and TTT

def drafter_for(target_config, ids: list[int] | None, num_aux: int = 3) -> Eagle3Drafter:
    """A drafter shaped like one target layer (H = H_T, same heads), full target vocab."""
    c = target_config
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    rope = getattr(c, "rope_parameters", None) or {}
    cfg = DrafterConfig(hidden_size=c.hidden_size, target_hidden_size=c.hidden_size, num_aux=num_aux,
                        vocab_size=c.vocab_size, draft_vocab_size=c.vocab_size, num_heads=c.num_attention_heads,
                        num_kv_heads=c.num_key_value_heads, head_dim=hd, intermediate_size=c.intermediate_size,
                        rms_norm_eps=c.rms_norm_eps,
                        rope_theta=float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))),
                        max_position_embeddings=c.max_position_embeddings, aux_layer_ids_nested=ids,
                        num_aux_source="num_aux_hidden_states")
    return Eagle3Drafter(cfg)


@torch.no_grad()
def init_from_target(d: Eagle3Drafter, target) -> None:
    """Embedding (frozen), LM head and final norm copied from the target."""
    d.embed_tokens.weight.copy_(target.get_input_embeddings().weight.float())
    d.embed_tokens.weight.requires_grad_(False)
    d.lm_head.weight.copy_(target.get_output_embeddings().weight.float())
    d.norm.weight.copy_(target.model.norm.weight.float())


@dataclass
class Batch:
    tokens: torch.Tensor      # [B, T]
    aux: torch.Tensor         # [B, T, k*H]
    final: torch.Tensor       # [B, T, H]  F, for the teacher
    length: torch.Tensor      # [B]
    prompt_len: torch.Tensor  # [B]


def make_batch(seqs: list[Seq], labels: list[str], device: torch.device) -> Batch:
    T = max(len(s.tokens) for s in seqs)

    def pad(t: torch.Tensor) -> torch.Tensor:
        return F.pad(t, (0, 0, 0, T - t.shape[0])) if t.dim() == 2 else F.pad(t, (0, T - t.shape[0]))
    return Batch(
        tokens=torch.stack([pad(s.tokens) for s in seqs]).to(device),
        aux=torch.stack([pad(torch.cat([s.states[lbl] for lbl in labels], -1)) for s in seqs]).to(device).float(),
        final=torch.stack([pad(s.states["F"]) for s in seqs]).to(device).float(),
        length=torch.tensor([len(s.tokens) for s in seqs], device=device),
        prompt_len=torch.tensor([s.prompt_len for s in seqs], device=device),
    )


def step_masks(b: Batch, steps: int, prompt_weight: float) -> list[torch.Tensor]:
    """Per step j, weights [B, T]: 1 where slot t predicts a generated token at t+2+j that exists
    (t >= P-1, t+1+j <= L-1), `prompt_weight` on earlier slots, 0 on padding."""
    T = b.tokens.shape[1]
    t = torch.arange(T, device=b.tokens.device)[None, :]
    out = []
    for j in range(steps):
        valid = (t + 1 + j <= b.length[:, None] - 1).float()
        gen = (t >= b.prompt_len[:, None] - 1).float()
        out.append(valid * (gen + prompt_weight * (1 - gen)))
    return out


def ttt_loss(d: Eagle3Drafter, b: Batch, lm_head_w: torch.Tensor, steps: int, prompt_weight: float = 0.0,
             amp: bool = False, stats: bool = True) -> tuple[torch.Tensor, list[float], list[float]]:
    """(loss, per-step soft CE on generated slots, per-step top-1 agreement with the target);
    stats=False skips the two lists (no device sync)."""
    w = step_masks(b, steps, prompt_weight)
    select = [wj > 0 for wj in w]
    with torch.autocast(b.tokens.device.type, dtype=torch.bfloat16, enabled=amp):
        logits = ttt_forward(d, b.aux, b.tokens, steps, select)           # j x [M_j, V]
    loss = b.aux.new_zeros(())
    ces, accs = [], []
    for j in range(steps):
        with torch.no_grad():
            teacher = (_shift(b.final, 1 + j)[select[j]] @ lm_head_w.T).float()   # [M_j, V]: target at t+1+j
        wj = w[j][select[j]]
        gen = wj == 1
        ce = -(torch.softmax(teacher, -1) * torch.log_softmax(logits[j].float(), -1)).sum(-1)   # [M_j]
        loss = loss + STEP_DECAY ** j * (ce * wj).sum() / wj.sum().clamp(min=1e-6)
        if not stats:
            continue
        with torch.no_grad():
            ces.append(float(ce[gen].mean()) if gen.any() else float("nan"))
            accs.append(float((logits[j].argmax(-1) == teacher.argmax(-1))[gen].float().mean()) if gen.any()
                        else float("nan"))
    return loss, ces, accs


@dataclass
class DrafterTrainConfig:
    convention: str = "before"
    ids: list[int] | None = None           # None: default_ids(N)
    write_ids: bool = True                 # False: the saved config has no aux ids (speculators <= 0.4)
    steps: int = 1500
    ttt_steps: int = 4
    batch_size: int = 64                   # at most this many sequences a batch...
    batch_tokens: int = 16384              # ...and at most this many (padded) tokens; batches group similar lengths
    lr: float = 1e-3
    min_lr_ratio: float = 0.05
    warmup: int = 50
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    prompt_weight: float = 0.1
    seed: int = 0
    amp: bool | None = None                # bf16 autocast; None: on for CUDA
    save_dtype: str = "bf16"
    max_seconds: float | None = None
    log_every: int = 100


def length_batches(lengths: list[int], max_seqs: int, max_tokens: int, rng: random.Random) -> list[list[int]]:
    """Sequence indices grouped by length (little padding): at most `max_seqs` sequences and
    `max_tokens` padded tokens a batch; ties broken and batches ordered by `rng`."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:                                   # ascending: lengths[i] is the batch's padded length
        if cur and (len(cur) + 1 > max_seqs or (len(cur) + 1) * lengths[i] > max_tokens):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def lr_at(step: int, cfg: DrafterTrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def train_drafter(cfg: DrafterTrainConfig, target, data: list[Seq], device: torch.device,
                  progress: bool = True, name: str = "drafter") -> tuple[Eagle3Drafter, dict]:
    """TTT training on `data` (captured with at least the convention's boundaries and F)."""
    N = target.config.num_hidden_layers
    ids = cfg.ids or default_ids(N)
    labels = [b.label for b in training_boundaries(cfg.convention, ids, N)]
    missing = [lbl for lbl in labels + ["F"] if lbl not in data[0].states]
    if missing:
        raise ValueError(f"data lacks boundaries {missing}; capture them first")
    amp = (device.type == "cuda") if cfg.amp is None else cfg.amp
    torch.manual_seed(cfg.seed)
    d = drafter_for(target.config, ids if cfg.write_ids else None, num_aux=len(ids))
    init_from_target(d, target)
    d.to(device).train()
    lm_head_w = target.get_output_embeddings().weight.detach().float().to(device)       # [V, H] teacher head
    params = [p for p in d.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    rng = random.Random(cfg.seed)
    lengths = [len(s.tokens) for s in data]
    queue: list[list[int]] = []
    log: list[dict] = []
    t0, step, stopped = time.time(), 0, False
    for step in range(cfg.steps):
        if not queue:                                  # a new epoch: regroup and reshuffle
            queue = length_batches(lengths, cfg.batch_size, cfg.batch_tokens, rng)
        b = make_batch([data[i] for i in queue.pop()], labels, device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        logged = step % cfg.log_every == 0 or step == cfg.steps - 1
        loss, ces, accs = ttt_loss(d, b, lm_head_w, cfg.ttt_steps, cfg.prompt_weight, amp, stats=logged)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        if logged:
            log.append({"step": step, "loss": loss.item(), "ce": ces, "acc": accs})
            if progress:
                print(f"[{name}] step {step:5d}/{cfg.steps}  loss {loss.item():.4f}  acc/step "
                      + " ".join(f"{a:.2f}" for a in accs) + f"  {time.time() - t0:6.1f}s", flush=True)
        if cfg.max_seconds is not None and time.time() - t0 > cfg.max_seconds and step < cfg.steps - 1:
            if not logged:
                log.append({"step": step, "loss": loss.item(), "ce": ces, "acc": accs})
            stopped = True
            if progress:
                print(f"[{name}] stopping early at step {step}: max_seconds {cfg.max_seconds} reached", flush=True)
            break
    d.eval()
    rec = {"config": asdict(cfg), "ids": ids, "ids_written": ids if cfg.write_ids else None,
           "train_boundaries": labels, "convention": cfg.convention, "producer": "/".join(CONVENTIONS[cfg.convention]),
           "steps_done": step + 1, "stopped_early": stopped, "log": log, "final_loss": log[-1]["loss"],
           "train_s": round(time.time() - t0, 2), "device": str(device), "amp_bf16": amp,
           "params_trained": sum(p.numel() for p in params)}
    return d, rec


def fine_tune(d: Eagle3Drafter, data: list[Seq], labels: list[str], lm_head_w: torch.Tensor, cfg, ttt_steps: int,
              amp: bool, device: torch.device, tag: str, progress: bool = True) -> tuple[Eagle3Drafter, dict]:
    """The toy experiments' TTT loop (backend/toy/slot_shift.py, backend/toy/norm_before_fc.py) over a drafter already
    built and in train mode: AdamW on its trainable parameters, the cosine schedule, length-grouped batches of fc
    inputs `labels`, a log line every 25 steps. `cfg` gives steps, lr, warmup, seed, batch_size, batch_tokens and
    max_seconds. Returns the drafter in eval mode and {steps_done, train_s, log}."""
    params = [p for p in d.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95))
    tcfg = DrafterTrainConfig(steps=cfg.steps, lr=cfg.lr, warmup=cfg.warmup)
    rng = random.Random(cfg.seed)
    lengths = [len(s.tokens) for s in data]
    queue: list[list[int]] = []
    log, t0, step = [], time.time(), 0
    for step in range(cfg.steps):
        if not queue:
            queue = length_batches(lengths, cfg.batch_size, cfg.batch_tokens, rng)
        b = make_batch([data[i] for i in queue.pop()], labels, device)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, tcfg)
        logged = step % 25 == 0 or step == cfg.steps - 1
        loss, _, accs = ttt_loss(d, b, lm_head_w, ttt_steps, 0.1, amp, stats=logged)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if logged:
            log.append({"step": step, "loss": round(loss.item(), 4), "acc": [round(a, 3) for a in accs]})
            if progress:
                print(f"[{tag}] step {step}/{cfg.steps} loss {loss.item():.3f} acc "
                      + " ".join(f"{a:.2f}" for a in accs) + f" {time.time() - t0:.0f}s", flush=True)
        if cfg.max_seconds is not None and time.time() - t0 > cfg.max_seconds:
            break
    d.eval()
    return d, {"steps_done": step + 1, "train_s": round(time.time() - t0, 1), "log": log}


def save_drafter(d: Eagle3Drafter, out: Path, ids: list[int] | None, save_dtype: str = "bf16") -> Path:
    """EAGLE/SpecForge format; ids=None writes no `eagle_aux_hidden_state_layer_ids` at all."""
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[save_dtype]
    d = d.to("cpu")
    saved = Eagle3Drafter(d.cfg)
    saved.load_state_dict(d.state_dict())
    saved.to(dtype).save(out, format="eagle", aux_layer_ids=ids)
    cfg_file = Path(out) / "config.json"
    raw = json.loads(cfg_file.read_text())
    if ids is None:
        raw["eagle_config"].pop("eagle_aux_hidden_state_layer_ids", None)
    raw["torch_dtype"] = "bfloat16" if save_dtype == "bf16" else "float32"
    cfg_file.write_text(json.dumps(raw, indent=2) + "\n")
    return Path(out)


# ---------------------------------------------------------------- evaluation

@torch.no_grad()
def teacher_forced_accuracy(d: Eagle3Drafter, data: list[Seq], labels: list[str], lm_head_w: torch.Tensor,
                            steps: int = 4, batch_size: int = 16) -> list[float]:
    """Top-1 agreement with the target per draft step (1..steps) on generated slots, with the
    aux states `labels` fed in (those the drafter was trained on, or those an engine would feed it)."""
    dev = lm_head_w.device
    d = d.to(dev).eval()
    hit, n = [0.0] * steps, [0.0] * steps
    for idx in length_batches([len(s.tokens) for s in data], batch_size, 16384, random.Random(0)):
        b = make_batch([data[i] for i in idx], labels, dev)
        w = step_masks(b, steps, 0.0)
        sel = [wj > 0 for wj in w]
        logits = ttt_forward(d, b.aux, b.tokens, steps, sel)
        for j in range(steps):
            teacher = (_shift(b.final, 1 + j)[sel[j]] @ lm_head_w.T).argmax(-1)
            hit[j] += float((logits[j].argmax(-1) == teacher).sum())
            n[j] += float(sel[j].sum())
    return [h / max(1.0, c) for h, c in zip(hit, n)]


@torch.no_grad()
def target_confidence(data: list[Seq], lm_head_w: torch.Tensor) -> dict:
    """How predictable the target's own greedy text is: its greedy-token probability on generated
    positions (mean, and the share above 0.9). A drafter's acceptance tracks this closely."""
    p = torch.cat([(s.states["F"][s.prompt_len - 1:-1].float().to(lm_head_w.device) @ lm_head_w.T)
                   .softmax(-1).max(-1).values
                   for s in data])
    return {"mean_greedy_prob": float(p.mean()), "share_above_0.9": float((p > 0.9).float().mean()),
            "share_below_0.5": float((p < 0.5).float().mean())}


@torch.no_grad()
def simulate_tau(d: Eagle3Drafter, data: list[Seq], labels: list[str], k: int = 4) -> dict:
    """Greedy chain speculative decoding replayed on the target's own greedy text (exact for greedy:
    the verified tokens are the target's greedy continuation). Uses Eagle3Drafter's inference path
    (prefill / step / truncate) on CPU, as vLLM's proposer drafts: tau = 1 + accepted / drafts."""
    d = d.to("cpu").float().eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)        # one-token steps: thread hand-offs cost more than they save (50x on a busy CPU)
    try:
        return _replay(d, data, labels, k)
    finally:
        torch.set_num_threads(threads)


def _replay(d: Eagle3Drafter, data: list[Seq], labels: list[str], k: int) -> dict:
    drafts, accepted, per_pos = 0, 0, [0] * k
    for s in data:
        toks = s.tokens.cpu()
        aux = torch.cat([s.states[lbl] for lbl in labels], -1).cpu().float()   # [T, k*H]
        T, P = len(toks), s.prompt_len
        d.reset()
        out = d.prefill(aux[:P], toks[1:P + 1], torch.arange(P))        # slots 0..P-1; slot P-1 holds x_P
        t = P - 1
        while t + 1 + k <= T - 1:
            chain, o = [out.token], out
            for i in range(1, k):
                o = d.step(o.token, o.hidden, t + i)
                chain.append(o.token)
            truth = toks[t + 2:t + 2 + k].tolist()
            n = 0
            while n < k and chain[n] == truth[n]:
                per_pos[n] += 1
                n += 1
            drafts, accepted = drafts + 1, accepted + n
            if t + 2 + n > T - 1:                                        # the bonus token is past the text
                break
            d.truncate(t + 1)                                            # drop the draft slots
            new = torch.arange(t + 1, t + 2 + n)                          # accepted tokens + the bonus token
            out = d.prefill(aux[new], toks[new + 1], new)
            t = t + 1 + n
    d.reset()
    return {"k": k, "tau": 1 + accepted / max(1, drafts), "drafts": drafts, "accepted": accepted,
            "per_position": [c / max(1, drafts) for c in per_pos]}


# ---------------------------------------------------------------- CLI

@dataclass
class DataConfig:
    gen_tokens: int = 128
    max_prompt_tokens: int = 512
    doc_prompts: int = 4000
    gen_batch: int = 256
    seed: int = 0
    train_rows: int | None = None          # limit Spec-Bench training rows (None: all)
    eval_rows: int | None = None           # limit held-out rows (None: all)
    max_offline_chars: int | None = None   # corpus cap for doc prompts


def training_prompts(tokenizer, dc: DataConfig, corpus=None) -> list[tuple[str, list[int]]]:
    """Spec-Bench training rows (every turn) + `dc.doc_prompts` offline documents, all as chat prompts."""
    from backend.toy.corpus import build_corpus, split_rows

    train, _ = split_rows()
    rows = train[: dc.train_rows] if dc.train_rows is not None else train
    prompts = spec_bench_prompts(tokenizer, rows, dc.max_prompt_tokens, all_turns=True)
    if dc.doc_prompts:
        corpus = corpus if corpus is not None else build_corpus(dc.max_offline_chars)
        offline = [d.text for d in corpus.docs if not d.chat and d.source != "spec_bench_refs"]
        prompts += doc_prompts(tokenizer, offline, dc.doc_prompts, dc.max_prompt_tokens, dc.seed)
    return prompts


def heldout_prompts(tokenizer, dc: DataConfig) -> list[tuple[str, list[int]]]:
    from backend.toy.corpus import split_rows

    _, held = split_rows()
    rows = held[: dc.eval_rows] if dc.eval_rows is not None else held
    return spec_bench_prompts(tokenizer, rows, dc.max_prompt_tokens, all_turns=False)


def main(argv: list[str] | None = None) -> None:
    from backend.engines.hf import load

    p = argparse.ArgumentParser(description="Train an EAGLE-3 drafter (TTT) on the toy target's own generations.")
    p.add_argument("--target", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--convention", choices=sorted(CONVENTIONS), default="before")
    p.add_argument("--ids", default=None,
                   help="aux layer ids as the producer writes them, e.g. 2,4,5 (default [2, N//2, N-3])")
    p.add_argument("--no-ids", action="store_true", help="write no aux ids into config.json (speculators <= 0.4)")
    p.add_argument("--steps", type=int, default=DrafterTrainConfig.steps)
    p.add_argument("--ttt-steps", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=DrafterTrainConfig.batch_size)
    p.add_argument("--batch-tokens", type=int, default=DrafterTrainConfig.batch_tokens)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--doc-prompts", type=int, default=DataConfig.doc_prompts)
    p.add_argument("--train-rows", type=int, default=None, help="use only the first N Spec-Bench training rows")
    p.add_argument("--eval-rows", type=int, default=None, help="evaluate on only the first N held-out rows")
    p.add_argument("--max-seconds", type=float, default=None)
    a = p.parse_args(argv)
    lm = load(a.target, device=a.device, dtype="fp32")
    torch.manual_seed(a.seed)
    ids = [int(x) for x in a.ids.split(",")] if a.ids else default_ids(lm.n_layers)
    labels = [b.label for b in training_boundaries(a.convention, ids, lm.n_layers)]
    dc = DataConfig(gen_tokens=a.gen_tokens, doc_prompts=a.doc_prompts, seed=a.seed, train_rows=a.train_rows,
                    eval_rows=a.eval_rows)
    data = build_data(lm, training_prompts(lm.tokenizer, dc), labels, dc.gen_tokens, dc.gen_batch, progress=True)
    cfg = DrafterTrainConfig(convention=a.convention, ids=ids, write_ids=not a.no_ids, steps=a.steps,
                             ttt_steps=a.ttt_steps, batch_size=a.batch_size, batch_tokens=a.batch_tokens, lr=a.lr,
                             seed=a.seed, max_seconds=a.max_seconds)
    d, rec = train_drafter(cfg, lm.model, data, lm.device)
    held = build_data(lm, heldout_prompts(lm.tokenizer, dc), labels, dc.gen_tokens, dc.gen_batch)
    w = lm.model.get_output_embeddings().weight.detach().float()
    rec["heldout_top1_per_step"] = teacher_forced_accuracy(d, held, labels, w, cfg.ttt_steps)
    rec["heldout_tau"] = simulate_tau(d, held, labels, k=cfg.ttt_steps)
    print("held-out teacher-forced top-1 per draft step:", " ".join(f"{x:.3f}" for x in rec["heldout_top1_per_step"]),
          f"| tau (K={cfg.ttt_steps}, greedy) {rec['heldout_tau']['tau']:.3f}")
    save_drafter(d, a.out, ids if cfg.write_ids else None, cfg.save_dtype)
    (a.out / "training_record.json").write_text(json.dumps(rec, indent=2) + "\n")


if __name__ == "__main__":
    main()
