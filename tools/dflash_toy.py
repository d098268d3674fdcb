"""Train a small DFlash drafter on the shipped toy target, on one CPU core (issue 23 items 3-4).

    python tools/dflash_toy.py --out tests/data/dflash_toy --convention before --minutes 10

Self-distillation as the toy pair's drafters were trained (backend/toy/train_drafter.py): Spec-Bench training
prompts (every turn, never the held-out rows) and offline documents as chat prompts, answered greedily by the
target; the boundaries the drafter is fed captured with the HF engine's hooks. The drafter (backend/drafter/dflash.py)
is fed the states of its `dflash_config.target_layer_ids` read at one convention:

    after  (z-lab, SpecForge): id t -> HF hidden_states[t + 1] = S_{t+1}   ids [0, 3, 6] -> S_1, S_4, S_7
    before (a trainer that takes hidden_states[t], the "layer offset" mistake): id t -> S_t  -> S_0, S_3, S_6

Training: random answers; one block per anchor s of the answer, [x_s, M, M, M] over context slots 0..s-1 (the block
draft step, `block_logits`); cross-entropy against the target's greedy tokens x_{s+1..s+bs-1}, position j weighted
0.8^(j-1). The embedding and lm_head are the target's (frozen, not saved). Written with the ids as the trainer wrote
them, so the config does not say which convention was used: that is what check-drafter has to find. At the end the
drafter is scored on held-out Spec-Bench prompts fed both ways, beside chance and two trivial predictors.

The ids are [0, 3, 6], not z-lab's own choice for 8 layers ([1, 3, 5], `build_target_layer_ids`): S_1..S_7 of this
toy target are close to one another (cosine 0.94-0.96 between neighbours) and a drafter trained on S_1, S_3, S_5
drafts about as well fed S_2, S_4, S_6 (`--ids 1,3,5`: docs/PERFORMANCE.md); S_0 (the embeddings) and S_1 differ
(cosine 0.16, RMS ~20x apart), so a drafter trained with S_0 among its states is hurt when fed S_1 instead.

What kept earlier runs at chance, and what is done instead:
- The mask token was `<|pad|>`, whose embedding in the toy target is all zeros: every mask slot then enters the first
  draft layer as 0, its query is 0 (RMSNorm of 0), its attention uniform and the same in every slot, so all block
  positions draft the same token from an average of the context. The mask token is now a special token the data
  never uses whose embedding is not zero (`pick_mask_token`).
- One draft layer: a mask slot's query carries no content before the first layer, so one layer can only look at the
  context by position. Two layers (the first brings x_s into the mask slots, the second looks up by content).
- `fc` started as a mean of the fed states and the data were the prompts only: the states differ in scale by ~20x
  (S_0, the embeddings, against the layers' outputs), so each state's block of `fc` starts scaled by 1 / its RMS; the
  data are the target's own greedy answers (what the finder and the bench score).
- Few steps: the block logits [A, bs-1, H] x lm_head went through a broadcast batched product; `DFlashDrafter.logits`
  now makes it one 2-D product (a step 0.17 -> 0.10 s on one core), and the training runs on one thread.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.drafter.dflash import DFlashConfig, DFlashDrafter  # noqa: E402

IDS = [0, 3, 6]
CONVENTIONS = {"after": 1, "before": 0}        # boundary index = id + shift
STEP_DECAY = 0.8


def trained_labels(convention: str, ids: list[int] = IDS) -> list[str]:
    return [f"S_{t + CONVENTIONS[convention]}" for t in ids]


def other_convention(convention: str) -> str:
    return next(c for c in CONVENTIONS if c != convention)


def training_prompts(tokenizer, docs: int, max_prompt_tokens: int = 192, seed: int = 0) -> list[list[int]]:
    """Spec-Bench training rows (every turn) and `docs` offline documents, as chat prompts, shuffled."""
    from backend.toy.corpus import split_rows
    from backend.toy.train_drafter import DataConfig, spec_bench_prompts
    from backend.toy.train_drafter import training_prompts as prompts_of

    train, _ = split_rows()
    if docs:
        dc = DataConfig(doc_prompts=docs, max_prompt_tokens=max_prompt_tokens, seed=seed)
        out = [p for _, p in prompts_of(tokenizer, dc)]
    else:
        out = [p for _, p in spec_bench_prompts(tokenizer, train, max_prompt_tokens, all_turns=True)]
    random.Random(seed).shuffle(out)
    return out


def heldout_prompts(tokenizer, n: int, max_prompt_tokens: int = 192) -> list[list[int]]:
    """The first turn of the first `n` held-out Spec-Bench rows (the rows the bench and check-drafter use)."""
    from backend.toy.corpus import split_rows
    from backend.toy.train_drafter import spec_bench_prompts

    _, held = split_rows()
    return [p for _, p in spec_bench_prompts(tokenizer, held[:n], max_prompt_tokens)]


def build_data(lm, prompts: list[list[int]], gen_tokens: int, keep: list[int]) -> list[tuple]:
    """Per prompt answered greedily: (tokens [T], prompt length P, the kept boundaries S_i stacked [len(keep), T, H_T]
    in float16, the target's greedy next token at every position [T])."""
    from backend.engines.hf import BoundaryHooks, default_boundaries, generate_greedy

    seqs = generate_greedy(lm, prompts, gen_tokens, batch_size=32)
    bounds = [default_boundaries(lm)[i] for i in keep]
    out, got = [], {}
    with BoundaryHooks(lm, bounds, lambda k, x: got.__setitem__(k, x.detach())), torch.inference_mode():
        for p, s in zip(prompts, seqs):
            if len(s) - len(p) < 2:
                continue
            got.clear()
            logits = lm.model(input_ids=torch.tensor([s], device=lm.device), use_cache=False).logits[0]
            out.append((torch.tensor(s, device=lm.device), len(p),
                        torch.stack([got[k].float() for k in range(len(bounds))]).half(), logits.argmax(-1)))
    return out


def pick_mask_token(lm, data: list[tuple]) -> int:
    """The first special token of the tokenizer, other than bos, eos and pad, that no training sequence holds and
    whose target embedding is not zero (a zero mask embedding gives every mask slot the same zero query in the first
    draft layer)."""
    emb = lm.model.get_input_embeddings().weight.detach()
    tk = lm.tokenizer
    used = set(torch.cat([t[0] for t in data]).tolist()) | {tk.bos_token_id, tk.eos_token_id, tk.pad_token_id}
    special = sorted(set(tk.all_special_ids) | set(getattr(tk, "added_tokens_decoder", {}) or {}))
    for t in special:
        if t not in used and float(emb[t].float().norm()) > 0:
            return int(t)
    raise SystemExit("no unused special token with a non-zero embedding to use as the DFlash mask token")


def init_fc(d: DFlashDrafter, data: list[tuple], seed: int = 0) -> None:
    """fc at random, each fed state's block scaled by 1 / that state's RMS over the data (the states differ ~20x)."""
    g = torch.Generator().manual_seed(seed)
    H_T, k = d.cfg.target_hidden_size, d.cfg.num_aux
    rms = torch.cat([t[2].float() for t in data[:64]], 1).pow(2).mean((1, 2)).sqrt()       # [k]
    with torch.no_grad():
        for i in range(k):
            w = torch.randn(d.cfg.hidden_size, H_T, generator=g) / (H_T * k) ** 0.5 / float(rms[i])
            d.fc.weight[:, i * H_T:(i + 1) * H_T] = w.to(d.fc.weight)


def _anchors(T: int, P: int, bs: int, device) -> torch.Tensor:
    return torch.arange(P, T - bs + 1, device=device)          # every draft position has its label x_{s+j}


def train(d: DFlashDrafter, data: list[tuple], minutes: float, lr: float = 3e-3, seed: int = 0, log=print) -> dict:
    """One answer per step, a block at every anchor; AdamW, warm-up then linear decay to lr/10 over `minutes`."""
    bs = d.cfg.block_size
    dev = d.fc.weight.device
    w = torch.tensor([STEP_DECAY ** j for j in range(bs - 1)], device=dev)
    params = [p for p in d.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng, t0, step, losses = random.Random(seed), time.time(), 0, []
    d.train()
    while time.time() - t0 < minutes * 60:
        tok, P, st, greedy = data[rng.randrange(len(data))]
        a = _anchors(len(tok), P, bs, tok.device)
        if a.numel() == 0:
            continue
        aux = st.float().permute(1, 0, 2).reshape(len(tok), -1)                           # [T, k*H_T]
        logits = d.block_logits(aux, tok, a)                                               # [A, bs-1, V]
        tgt = greedy[a[:, None] + torch.arange(bs - 1, device=dev)[None, :]]             # [A, bs-1]: x_{s+j}
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none").view(tgt.shape)
        loss = (ce * w).sum(-1).mean() / w.sum()
        frac = min(1.0, (time.time() - t0) / (minutes * 60))
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * (1 - frac))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        step += 1
        if step % 500 == 0:
            log(f"[dflash] step {step} loss {sum(losses[-500:]) / 500:.3f} ({time.time() - t0:.0f} s)", flush=True)
    d.eval()
    tail = losses[-200:]
    return {"steps": step, "seconds": round(time.time() - t0, 1), "final_loss": round(sum(tail) / max(1, len(tail)), 4)}


@torch.no_grad()
def score(d: DFlashDrafter, data: list[tuple], which: list[int]) -> dict:
    """Top-1 agreement with the target's greedy tokens per draft position, and tau = 1 + sum of the acceptance by
    position (positions 1..j all right), over every anchor of the held-out answers; `which` picks the stored
    boundaries fed (their order in the stacked states)."""
    bs, hits = d.cfg.block_size, []
    for tok, P, st, greedy in data:
        a = _anchors(len(tok), P, bs, tok.device)
        if a.numel() == 0:
            continue
        aux = st[which].float().permute(1, 0, 2).reshape(len(tok), -1)
        lg = d.block_logits(aux, tok, a)
        hits.append(lg.argmax(-1) == greedy[a[:, None] + torch.arange(bs - 1, device=tok.device)[None, :]])
    H = torch.cat(hits).float()                                                            # [A, bs-1]
    return {"accuracy": [round(x, 4) for x in H.mean(0).tolist()],
            "tau": round(1 + H.cumprod(1).mean(0).sum().item(), 4), "blocks": int(H.shape[0])}


def baselines(train_data: list[tuple], held: list[tuple], bs: int) -> dict:
    """Draft position 1 (x_{s+1}) by predictors that ignore the target's states: chance (always the most frequent
    answer token of the training data), repeat-the-last-token (x_s), and the bigram (the most frequent successor of
    x_s in the training answers)."""
    freq, succ = Counter(), defaultdict(Counter)
    for tok, P, _, greedy in train_data:
        for s in range(P, len(tok)):
            freq[int(greedy[s - 1])] += 1
            succ[int(tok[s])][int(greedy[s])] += 1
    top = freq.most_common(1)[0][0]
    n = ch = rep = big = 0
    for tok, P, _, greedy in held:
        for s in _anchors(len(tok), P, bs, tok.device).tolist():
            want, last = int(greedy[s]), int(tok[s])
            n += 1
            ch += want == top
            rep += want == last
            big += want == (succ[last].most_common(1)[0][0] if succ[last] else top)
    return {"chance": round(ch / n, 4), "repeat_last": round(rep / n, 4), "bigram": round(big / n, 4), "blocks": n}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--pair", help="unpacked toy pair (default: the shipped one under the data root)")
    ap.add_argument("--convention", default="before", choices=sorted(CONVENTIONS))
    ap.add_argument("--ids", default=",".join(map(str, IDS)), help="dflash_config.target_layer_ids to write")
    ap.add_argument("--minutes", type=float, default=10.0, help="training time (data and scoring come on top)")
    ap.add_argument("--docs", type=int, default=400, help="offline documents added to the Spec-Bench prompts")
    ap.add_argument("--gen-tokens", type=int, default=96)
    ap.add_argument("--heldout", type=int, default=48, help="held-out Spec-Bench prompts the drafter is scored on")
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    t_all = time.time()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    from backend.engines.hf import load
    from backend.toy.shipped import toy_pair

    pair = Path(a.pair) if a.pair else toy_pair()
    lm = load(pair / "target", device=a.device, dtype="fp32")
    ids = [int(t) for t in a.ids.split(",")]
    labels, wrong = trained_labels(a.convention, ids), trained_labels(other_convention(a.convention), ids)
    keep = sorted({int(x[2:]) for x in labels + wrong})                 # boundaries stored for the held-out scores
    pick = lambda lbls: [keep.index(int(x[2:])) for x in lbls]         # noqa: E731
    t0 = time.time()
    data = build_data(lm, training_prompts(lm.tokenizer, a.docs, seed=a.seed), a.gen_tokens,
                      [int(x[2:]) for x in labels])
    held = build_data(lm, heldout_prompts(lm.tokenizer, a.heldout), a.gen_tokens, keep)
    t_data = time.time() - t0
    print(f"[dflash] {len(data)} training answers ({sum(len(t[0]) - t[1] for t in data)} tokens), {len(held)} "
          f"held-out, in {t_data:.0f} s", flush=True)
    tc = lm.config
    mask = pick_mask_token(lm, data)
    rope = getattr(tc, "rope_theta", None) or (getattr(tc, "rope_parameters", None) or {}).get("rope_theta", 1e4)
    c = DFlashConfig(hidden_size=tc.hidden_size, intermediate_size=a.intermediate,
                     num_heads=tc.num_attention_heads, num_kv_heads=tc.num_key_value_heads, head_dim=tc.head_dim,
                     num_layers=a.layers, num_target_layers=tc.num_hidden_layers, target_hidden_size=tc.hidden_size,
                     target_layer_ids=ids, block_size=a.block_size, mask_token_id=mask, vocab_size=tc.vocab_size,
                     rms_norm_eps=tc.rms_norm_eps, rope_theta=float(rope), name=a.out)
    emb, head = lm.model.get_input_embeddings().weight, lm.model.get_output_embeddings().weight
    d = DFlashDrafter(c, emb, head).to(lm.device)
    init_fc(d, data, a.seed)
    rec = train(d, data, a.minutes, lr=a.lr, seed=a.seed)
    out = d.save(a.out)
    back = DFlashDrafter.load(out, emb, head)                            # scored as saved (bf16 weights)
    scores = {"trained_feed": {"boundaries": labels, **score(back, held, pick(labels))},
              "other_feed": {"boundaries": wrong, **score(back, held, pick(wrong))},
              "position_1_baselines": baselines(data, held, a.block_size)}
    total = round(time.time() - t_all, 1)
    (Path(a.out) / "TRAINING.json").write_text(json.dumps({
        "what": "DFlash drafter for the SpecLens toy target, trained on one CPU core (tools/dflash_toy.py)",
        "command": "python tools/dflash_toy.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "convention": a.convention, "target_layer_ids": ids, "trained_on": labels, "block_size": a.block_size,
        "num_layers": a.layers, "intermediate_size": a.intermediate, "mask_token_id": mask, "device": a.device,
        "threads": a.threads, "training_answers": len(data), "heldout_answers": len(held), "gen_tokens": a.gen_tokens,
        "docs": a.docs, "lr": a.lr, "seed": a.seed, "torch": torch.__version__, "data_seconds": round(t_data, 1),
        "total_seconds": total, **rec, "heldout": scores}, indent=2) + "\n")
    print(f"[dflash] trained on {', '.join(labels)}: {rec}; {total} s in all -> {out}", flush=True)
    for k in ("trained_feed", "other_feed"):
        print(f"[dflash] fed {', '.join(scores[k]['boundaries'])}: accuracy by position {scores[k]['accuracy']}, "
              f"tau {scores[k]['tau']}", flush=True)
    print(f"[dflash] position 1 without the states: {scores['position_1_baselines']}", flush=True)


if __name__ == "__main__":
    main()
