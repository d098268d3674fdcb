"""Train a small DFlash drafter on the shipped toy target, briefly, on CPU (issue 23 items 3-4).

    python tools/dflash_toy.py --out tests/data/dflash_toy --convention before --minutes 4

Self-distillation as the toy pair's drafters were trained (backend/toy/train_drafter.py): Spec-Bench training
prompts (never the held-out rows) answered greedily by the target; every boundary S_0..S_N captured with the HF
engine's hooks. The drafter (backend/drafter/dflash.py) is fed the states of its `dflash_config.target_layer_ids`
read at one convention:

    after  (z-lab, SpecForge): id t -> HF hidden_states[t + 1] = S_{t+1}   ids [1, 3, 5] -> S_2, S_4, S_6
    before (a trainer that takes hidden_states[t], the "layer offset" mistake): id t -> S_t  -> S_1, S_3, S_5

and trained on random anchors of the answers: block [x_s, M, M, M] over context slots 0..s-1, cross-entropy
against the target's greedy tokens x_{s+1..s+bs-1}, position j weighted 0.8^(j-1). The embedding and lm_head are
the target's (frozen, not saved). Written with the ids as the trainer wrote them, so the config does not say which
convention was used: that is what check-drafter has to find.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.drafter.dflash import DFlashConfig, DFlashDrafter  # noqa: E402

IDS = [1, 3, 5]
CONVENTIONS = {"after": 1, "before": 0}        # boundary index = id + shift


def trained_labels(convention: str, ids: list[int] = IDS) -> list[str]:
    return [f"S_{t + CONVENTIONS[convention]}" for t in ids]


def build_data(lm, n_prompts: int, gen_tokens: int, seed: int = 0) -> list[tuple[torch.Tensor, int, torch.Tensor]]:
    """(tokens [T], start of the scored region, every boundary stacked [N+1, T, H_T], the target's greedy next
    token at every position [T]) per training sequence. gen_tokens > 0: prompts answered greedily by the target
    (slow on a busy CPU); 0: teacher-forced on the prompts themselves (one forward each), labels the target's argmax."""
    from backend.engines.hf import BoundaryHooks, default_boundaries, generate_greedy
    from backend.toy.corpus import split_rows
    from backend.toy.train_drafter import spec_bench_prompts

    t0 = time.time()
    train, _ = split_rows()
    prompts = [p for _, p in spec_bench_prompts(lm.tokenizer, train, 192, all_turns=True)]
    random.Random(seed).shuffle(prompts)
    prompts = prompts[:n_prompts]
    seqs = generate_greedy(lm, prompts, gen_tokens, batch_size=64) if gen_tokens else prompts
    print(f"[dflash] {len(seqs)} sequences in {time.time() - t0:.0f} s", flush=True)
    bounds = default_boundaries(lm)[: lm.n_layers + 1]                                   # S_0..S_N
    out, got = [], {}
    with BoundaryHooks(lm, bounds, lambda k, x: got.__setitem__(k, x.detach().float())), torch.inference_mode():
        for p, s in zip(prompts, seqs):
            got.clear()
            logits = lm.model(input_ids=torch.tensor([s], device=lm.device), use_cache=False).logits[0]
            start = len(p) if gen_tokens else 1
            out.append((torch.tensor(s, device=lm.device), start,
                        torch.stack([got[k] for k in range(len(bounds))]), logits.argmax(-1)))
    return out


def train(d: DFlashDrafter, data, labels: list[str], minutes: float, lr: float = 3e-3, anchors: int = 48,
          seed: int = 0, log=print) -> dict:
    idx = [int(lbl.split("_")[1]) for lbl in labels]
    bs = d.cfg.block_size
    w = torch.tensor([0.8 ** j for j in range(bs - 1)], device=d.fc.weight.device)
    opt = torch.optim.AdamW([p for p in d.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    rng, t0, step, losses = random.Random(seed), time.time(), 0, []
    d.train()
    while time.time() - t0 < minutes * 60:
        tok, P, st, greedy = data[rng.randrange(len(data))]
        T = len(tok)
        hi = T - bs + 1
        if hi <= P:
            continue
        a = torch.tensor(sorted(rng.sample(range(P, hi), min(anchors, hi - P))), device=tok.device)
        aux = torch.cat([st[i] for i in idx], -1)                                         # [T, k*H_T]
        logits = d.block_logits(aux, tok, a)                                               # [A, bs-1, V]
        tgt = greedy[a[:, None] + torch.arange(bs - 1, device=tok.device)[None, :]]     # [A, bs-1]: x_{s+j}
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                               reduction="none").view(tgt.shape)
        loss = (ce * w).sum(-1).mean() / w.sum()
        frac = min(1.0, (time.time() - t0) / (minutes * 60))
        for g in opt.param_groups:
            g["lr"] = lr * (0.1 + 0.9 * (1 - frac))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        step += 1
        if step % 200 == 0:
            log(f"[dflash] step {step} loss {sum(losses[-200:]) / 200:.3f} ({time.time() - t0:.0f} s)", flush=True)
    d.eval()
    return {"steps": step, "seconds": round(time.time() - t0, 1), "final_loss": round(sum(losses[-100:]) /
                                                                                       max(1, len(losses[-100:])), 4)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--pair", help="unpacked toy pair (default: the shipped one under the data root)")
    ap.add_argument("--convention", default="before", choices=sorted(CONVENTIONS))
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--prompts", type=int, default=400)
    ap.add_argument("--gen-tokens", type=int, default=0)
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--lr", type=float, default=3e-3)
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    from backend.engines.hf import load
    from backend.toy.shipped import toy_pair

    pair = Path(a.pair) if a.pair else toy_pair()
    lm = load(pair / "target", device=a.device, dtype="fp32")
    t0 = time.time()
    data = build_data(lm, a.prompts, a.gen_tokens)
    print(f"[dflash] {len(data)} sequences, {sum(len(t[0]) for t in data)} tokens in {time.time() - t0:.0f} s",
          flush=True)
    tc = lm.config
    mask = int(tc.pad_token_id if tc.pad_token_id is not None else 0)
    c = DFlashConfig(hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
                     num_heads=tc.num_attention_heads, num_kv_heads=tc.num_key_value_heads, head_dim=tc.head_dim,
                     num_layers=1, num_target_layers=tc.num_hidden_layers, target_hidden_size=tc.hidden_size,
                     target_layer_ids=IDS, block_size=a.block_size, mask_token_id=mask, vocab_size=tc.vocab_size,
                     rms_norm_eps=tc.rms_norm_eps, rope_theta=10000.0, name=a.out)
    emb, head = lm.model.get_input_embeddings().weight, lm.model.get_output_embeddings().weight
    d = DFlashDrafter(c, emb, head).to(lm.device)
    with torch.no_grad():       # fc starts as a mean of the k states (a trained-looking start), the layer at random
        d.fc.weight.copy_(torch.cat([torch.eye(c.hidden_size)] * c.num_aux, 1) / c.num_aux
                          + 0.02 * torch.randn_like(d.fc.weight))
    labels = trained_labels(a.convention)
    rec = train(d, data, labels, a.minutes, lr=a.lr)
    out = d.save(a.out)
    (Path(a.out) / "TRAINING.json").write_text(json.dumps({
        "what": "DFlash drafter for the SpecLens toy target, trained briefly on CPU (tools/dflash_toy.py)",
        "command": "python tools/dflash_toy.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "convention": a.convention, "target_layer_ids": IDS, "trained_on": labels, "block_size": a.block_size,
        "mask_token_id": mask, "device": a.device, "sequences": len(data), "gen_tokens": a.gen_tokens, "lr": a.lr,
        "threads": a.threads,
        "torch": torch.__version__, **rec}, indent=2) + "\n")
    print(f"[dflash] trained on {', '.join(labels)}: {rec} -> {out}", flush=True)


if __name__ == "__main__":
    main()
