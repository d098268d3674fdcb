"""Train the toy target: a small Llama on the offline corpus (backend/toy/corpus.py), nanoGPT-style.

    python -m backend.toy.train_target --out data/models/toy-pair/target --steps 3000 --device cuda

What it does, top to bottom:
1. builds the corpus (`backend/toy/corpus.py`: Spec-Bench training turns and offline documents as
   chat whose answers quote the prompt's lead, plus plain text shipped with Python/Debian) and trains
   the BPE tokenizer on it (held-out Spec-Bench rows are never seen);
2. packs every document's tokens into one stream; a batch holds `batch_size` windows of
   `block_size + 1` tokens: a share `chat_share` start at a chat document (so the model sees
   `<|user|>` at position 0, as a served prompt is), the rest at random offsets of the plain text;
3. AdamW (decay on matrices only), linear warmup then cosine decay, grad clip, bf16 autocast on CUDA;
4. saves the model (HF format, `save_dtype`) and the tokenizer with its chat template to `out`.

The chat answers make the model's greedy text on unseen prompts low-entropy (it quotes what it was
given), which is what lets a drafter reach a useful acceptance length. Chat documents end with
`<|eos|>`, so generation stops after the answer.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from backend.toy.corpus import SOURCES, Corpus, build_corpus, chat_text, spec_bench_docs, split_rows

SAVE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class TargetConfig:
    # model
    n_layers: int = 8
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    vocab_size: int = 4096
    # data
    block_size: int = 1024
    batch_size: int = 32
    chat_share: float = 0.5              # share of windows that start at a chat document
    max_offline_chars: int | None = None  # cap per offline corpus source (None: all)
    echo_docs: int = 2000                 # offline documents also used as chat (answer quotes the lead)
    sources: tuple[str, ...] = SOURCES
    # optimisation
    steps: int = 3000
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # run
    seed: int = 0
    device: str = "auto"
    amp: bool | None = None              # bf16 autocast; None: on for CUDA, off for CPU
    save_dtype: str = "bf16"
    max_seconds: float | None = None     # stop early (recorded) when training runs past this
    log_every: int = 100
    eval_docs: int = 64                  # held-out Spec-Bench docs for the held-out loss


def lr_at(step: int, cfg: TargetConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def pick_device(device: str) -> torch.device:
    from backend.engines.hf import resolve_device

    return resolve_device(device)


class TokenStream:
    """All documents' tokens in one 1-D tensor, with where each document starts."""

    def __init__(self, tokenizer, corpus: Corpus):
        ids = tokenizer([d.text if d.chat else d.text + "\n\n" for d in corpus.docs],
                        add_special_tokens=False)["input_ids"]
        self.tokens = torch.tensor([t for doc in ids for t in doc], dtype=torch.long)    # [n_tokens]
        lens = torch.tensor([len(doc) for doc in ids])
        starts = torch.cumsum(lens, 0) - lens
        is_chat = torch.tensor([d.chat for d in corpus.docs])
        self.chat_starts = starts[is_chat]                                                # chat doc starts
        off = ~is_chat
        self.offline_lo = int(starts[off].min()) if off.any() else 0                      # offline text region
        self.offline_hi = int((starts + lens)[off].max()) if off.any() else 0

    def __len__(self) -> int:
        return len(self.tokens)

    def batch(self, batch_size: int, block: int, share: float, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y [B, block]: y is x shifted by one."""
        n = len(self.tokens)
        n_chat = int(round(batch_size * share)) if self.offline_hi > self.offline_lo + block + 1 else batch_size
        if len(self.chat_starts) == 0:
            n_chat = 0
        chat = (self.chat_starts[torch.randint(len(self.chat_starts), (n_chat,), generator=g)] if n_chat
                else torch.empty(0, dtype=torch.long))
        span = max(1, self.offline_hi - self.offline_lo - block - 1)
        rand = self.offline_lo + torch.randint(span, (batch_size - n_chat,), generator=g)
        starts = torch.clamp(torch.cat([chat, rand]), max=max(0, n - block - 1))
        idx = starts[:, None] + torch.arange(block + 1)[None, :]                          # [B, block+1]
        w = self.tokens[idx.clamp(max=n - 1)]
        return w[:, :-1], w[:, 1:]


def build_model(cfg: TargetConfig, tokenizer):
    from transformers import LlamaForCausalLM

    from backend.toy.target import llama_config

    torch.manual_seed(cfg.seed)
    mcfg = llama_config(len(tokenizer), n_layers=cfg.n_layers, hidden=cfg.hidden, heads=cfg.heads,
                        kv_heads=cfg.kv_heads, tokenizer=tokenizer)
    return LlamaForCausalLM(mcfg)


@torch.no_grad()
def heldout_answer_stats(model, tokenizer, block: int, device: torch.device, limit: int = 64) -> dict:
    """Does the target quote? Teacher-forced loss and top-1 on the answer span of held-out chat
    documents (never trained on) against the loss on their user span. An answer loss far below the
    user loss means the model copies from its prompt, which is what makes its text predictable."""
    _, held = split_rows()
    ans_id = tokenizer.convert_tokens_to_ids("<|assistant|>")
    user_ce, ans_ce, ans_hit, n_user, n_ans = 0.0, 0.0, 0.0, 0, 0
    model.eval()
    for d in spec_bench_docs(held):
        ids = tokenizer(d.text, add_special_tokens=False)["input_ids"]
        if len(ids) > block + 1 or ans_id not in ids:
            continue
        a = ids.index(ans_id) + 2                                   # first answer token (after "<|assistant|>\n")
        x = torch.tensor([ids], device=device)
        logits = model(input_ids=x[:, :-1]).logits[0].float()        # [T-1, V]: row i predicts ids[i+1]
        ce = F.cross_entropy(logits, x[0, 1:], reduction="none")
        user_ce, n_user = user_ce + float(ce[: a - 2].sum()), n_user + a - 2
        ans_ce, n_ans = ans_ce + float(ce[a - 1:].sum()), n_ans + len(ids) - a
        ans_hit += float((logits[a - 1:].argmax(-1) == x[0, a:]).sum())
        if n_ans >= limit * 40:
            break
    model.train()
    return {"user_loss": user_ce / max(1, n_user), "answer_loss": ans_ce / max(1, n_ans),
            "answer_top1": ans_hit / max(1, n_ans), "answer_tokens": n_ans}


@torch.no_grad()
def heldout_loss(model, tokenizer, block: int, device: torch.device, limit: int = 64) -> float:
    """Mean next-token loss on held-out Spec-Bench chat documents (prompt + quoted answer), never trained on."""
    _, held = split_rows()
    docs = [d.text for d in spec_bench_docs(held)]
    docs = docs[:: max(1, len(docs) // limit)][:limit]                                   # spread over categories
    total, count = 0.0, 0
    model.eval()
    for text in docs:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][: block + 1]
        if len(ids) < 2:
            continue
        x = torch.tensor([ids], device=device)
        logits = model(input_ids=x[:, :-1]).logits.float()
        total += float(F.cross_entropy(logits[0], x[0, 1:], reduction="sum"))
        count += len(ids) - 1
    model.train()
    return total / max(1, count)


def train_target(cfg: TargetConfig, out: Path, corpus: Corpus | None = None, progress: bool = True) -> dict:
    """Train and save the target to `out`; return the training record (losses, timing, corpus)."""
    from backend.toy.tokenizer import build_tokenizer

    t0 = time.time()
    out = Path(out)
    dev = pick_device(cfg.device)
    amp = (dev.type == "cuda") if cfg.amp is None else cfg.amp
    corpus = corpus or build_corpus(cfg.max_offline_chars, cfg.sources, echo=cfg.echo_docs)
    tok = build_tokenizer(out, vocab_size=cfg.vocab_size, texts=corpus.texts())       # writes tokenizer files to out
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True,
                                   tokenize=False) == chat_text("x"), "corpus chat format != tokenizer chat template"
    stream = TokenStream(tok, corpus)
    t_data = time.time() - t0

    model = build_model(cfg, tok).to(dev)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.95), fused=dev.type == "cuda")
    g = torch.Generator().manual_seed(cfg.seed)
    losses: list[tuple[int, float]] = []
    t_train, step, stopped_early = time.time(), 0, False
    for step in range(cfg.steps):
        x, y = stream.batch(cfg.batch_size, cfg.block_size, cfg.chat_share, g)     # [B, block] each
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=x).logits                                             # [B, block, V]
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            lv = loss.item()
            losses.append((step, lv))
            if progress:
                el = time.time() - t_train
                tps = (step + 1) * cfg.batch_size * cfg.block_size / max(el, 1e-9)
                print(f"[target] step {step:5d}/{cfg.steps}  loss {lv:.4f}  lr {lr_at(step, cfg):.2e}  "
                      f"{el:6.1f}s  {tps:,.0f} tok/s", flush=True)
        if cfg.max_seconds is not None and time.time() - t_train > cfg.max_seconds and step < cfg.steps - 1:
            losses.append((step, loss.item()))
            stopped_early = True
            if progress:
                print(f"[target] stopping early at step {step}: --max-seconds {cfg.max_seconds} reached", flush=True)
            break
    steps_done = step + 1
    train_s = time.time() - t_train
    val = heldout_loss(model, tok, cfg.block_size, dev, cfg.eval_docs)
    quoting = heldout_answer_stats(model, tok, cfg.block_size, dev, cfg.eval_docs)
    model.to(SAVE_DTYPES[cfg.save_dtype]).save_pretrained(str(out))
    norms = torch.cat([p.detach().float().flatten().cpu() for n, p in model.named_parameters()
                       if n.endswith("norm.weight")])
    record = {
        "config": {**asdict(cfg), "sources": list(cfg.sources)},
        "device": str(dev), "amp_bf16": amp, "steps_done": steps_done, "stopped_early": stopped_early,
        "losses": losses, "final_loss": losses[-1][1], "heldout_loss": val, "heldout_quoting": quoting,
        "tokens_seen": steps_done * cfg.batch_size * cfg.block_size, "corpus_tokens": len(stream),
        "corpus": corpus.summary(), "params": sum(p.numel() for p in model.parameters()),
        "norm_weight_mean": float(norms.mean()), "norm_weight_std": float(norms.std()),
        "data_s": round(t_data, 2), "train_s": round(train_s, 2), "s_per_step": round(train_s / steps_done, 4),
        "wall_s": round(time.time() - t0, 2),
    }
    if progress:
        print(f"[target] done: {steps_done} steps in {train_s:.1f}s, loss {record['final_loss']:.3f}, "
              f"held-out loss {val:.3f} (answer spans {quoting['answer_loss']:.3f}, "
              f"top-1 {quoting['answer_top1']:.2f}; "
              f"user spans {quoting['user_loss']:.3f}); saved to {out}", flush=True)
    return record


def add_args(p: argparse.ArgumentParser, cfg: TargetConfig, prefix: str = "") -> None:
    for name, default in asdict(cfg).items():
        if name in ("sources",):
            continue
        flag = "--" + prefix + name.replace("_", "-")
        kind = type(default) if default is not None else (float if "seconds" in name else int)
        if isinstance(default, bool) or name == "amp":
            p.add_argument(flag, dest=prefix.replace("-", "_") + name,
                           type=lambda s: s.lower() in ("1", "true", "yes", "on"),
                           default=default, metavar="BOOL")
        else:
            p.add_argument(flag, dest=prefix.replace("-", "_") + name, type=kind, default=default)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Train the toy target (small Llama) on the offline corpus.")
    p.add_argument("--out", required=True, type=Path)
    add_args(p, TargetConfig())
    a = vars(p.parse_args(argv))
    out = a.pop("out")
    rec = train_target(TargetConfig(**a), out)
    (out / "training_record.json").write_text(json.dumps(rec, indent=2) + "\n")


if __name__ == "__main__":
    main()
