"""Train a small MLA EAGLE-3 drafter (Eagle3DeepseekV2ForCausalLM) on the shipped toy target, on one CPU core
(issue 23 item 3).

    python tools/mla_toy.py --out tests/data/mla_toy --convention before --minutes 8

The drafter is `backend.drafter.model.Eagle3Drafter` of the kind `eagle3_mla`: the EAGLE-3 layer with DeepSeek MLA
attention (`backend/drafter/mla.py`; q_a_proj / q_b_proj with q_lora_rank, kv_a_proj_with_mqa, kv_a_layernorm,
kv_b_proj, o_proj). Its config is what vLLM and SGLang read for that architecture: the MLA fields at the top level
and the aux ids nested in `eagle_config.eagle_aux_hidden_state_layer_ids` only, as DeepSeek/Kimi MLA drafter configs
write them (tests/data/real_configs/kinds/torchspec_kimi-k25-eagle3-mla.json). It is fed the states of those ids read
at one convention (`tools/dflash_toy.py` `trained_labels`):

    before (vLLM's V1 reading of the nested ids): id a -> S_a        ids [0, 3, 6] -> S_0, S_3, S_6
    after  (SGLang's reading on a Llama target):  id a -> S_{a+1}    ids [0, 3, 6] -> S_1, S_4, S_7

Why [0, 3, 6]: S_1..S_7 of the toy target are close to one another and an EAGLE-3 drafter leans on the token
embedding, so a drafter fed a neighbour set drafts almost as well (docs/PERFORMANCE.md, drafter sensitivity); S_0
(the embeddings) differs from S_1 by ~20x in RMS, so with S_0 among the states the other reading hurts.

Data and training reuse the toy pair's pieces: the prompts of `tools/dflash_toy.py` (Spec-Bench training turns and
offline documents as chat prompts), answered greedily by the target and captured with `backend.toy.train_drafter`
(`build_data`, with F for the teacher), TTT over `ttt_steps` unrolled draft steps (`backend.drafter.unroll`
`ttt_forward`, as vLLM's proposer drafts), batches by length (`length_batches`, `make_batch`, `step_masks`). What
differs from `train_drafter.ttt_loss`: the draft vocab is the `draft_vocab` most frequent tokens of the target's
answers (d2t), so the teacher is the target's distribution over those tokens only, and the checkpoint holds neither
embedding nor full-vocab lm_head (it stays under 2 MB). The embedding is the target's (frozen; vLLM and SGLang both
use the target's when the checkpoint has none); lm_head rows and the final norm start from the target's.

At the end the drafter is scored on held-out Spec-Bench prompts: teacher-forced top-1 agreement per draft step fed
as trained, fed the other convention and fed EAGLE-3's default [2, N//2, N-3] (what vLLM 0.24's V2 runner feeds
when a config has nested ids only), tau replayed with the inference path (`train_drafter.simulate_tau`), beside
chance and the bigram (`tools/dflash_toy.py` `baselines`).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.drafter.config import DrafterConfig  # noqa: E402
from backend.drafter.kinds import MLA_ARCHS  # noqa: E402
from backend.drafter.model import Eagle3Drafter  # noqa: E402
from backend.drafter.unroll import shift, ttt_forward  # noqa: E402
from backend.toy.train_drafter import STEP_DECAY, Seq, length_batches, make_batch, step_masks  # noqa: E402
from tools.dflash_toy import CONVENTIONS, baselines, heldout_prompts, other_convention, trained_labels  # noqa: E402

IDS = [0, 3, 6]


def build_data(lm, prompts: list[list[int]], labels: list[str], gen_tokens: int, chunk: int = 64) -> list[Seq]:
    """The toy pair's self-distillation data (`train_drafter.build_data`): greedy answers, `labels` and F, captured
    `chunk` prompts at a time and kept in bfloat16."""
    from backend.toy.train_drafter import build_data as capture

    out = []
    for i in range(0, len(prompts), chunk):
        for s in capture(lm, [(f"p{i + j}", p) for j, p in enumerate(prompts[i:i + chunk])], labels, gen_tokens, 32):
            s.states = {k: v.bfloat16() for k, v in s.states.items()}
            out.append(s)
    return out


def draft_vocab(data: list[Seq], size: int) -> torch.Tensor:
    """[V_d] target ids, ascending: the `size` most frequent tokens of the target's answers (and prompts)."""
    c = Counter()
    for s in data:
        c.update(s.tokens[s.prompt_len:].tolist())
    for s in data:                                     # fill up with prompt tokens if the answers hold too few
        if len(c) >= size:
            break
        c.update({t: 0 for t in s.tokens.tolist() if t not in c})
    return torch.tensor(sorted(t for t, _ in c.most_common(size)))


def mla_drafter(lm, ids: list[int], vocab: torch.Tensor, a) -> Eagle3Drafter:
    """An MLA EAGLE-3 drafter as wide as the toy target, its embedding (frozen), lm_head rows and norm from it."""
    tc = lm.config
    rope = getattr(tc, "rope_theta", None) or (getattr(tc, "rope_parameters", None) or {}).get("rope_theta", 1e4)
    cfg = DrafterConfig(hidden_size=tc.hidden_size, target_hidden_size=tc.hidden_size, num_aux=len(ids),
                        vocab_size=tc.vocab_size, draft_vocab_size=len(vocab), num_heads=a.heads, num_kv_heads=a.heads,
                        head_dim=a.rope_dim + a.nope_dim, intermediate_size=a.intermediate,
                        rms_norm_eps=tc.rms_norm_eps, rope_theta=float(rope),
                        max_position_embeddings=tc.max_position_embeddings, aux_layer_ids_nested=ids,
                        num_aux_source="eagle_config ids", kind="eagle3_mla", architecture=MLA_ARCHS[0],
                        mla=dict(q_lora_rank=a.q_lora_rank, kv_lora_rank=a.kv_lora_rank, qk_nope_head_dim=a.nope_dim,
                                 qk_rope_head_dim=a.rope_dim, v_head_dim=a.v_dim))
    d = Eagle3Drafter(cfg)
    with torch.no_grad():
        d.embed_tokens.weight.copy_(lm.model.get_input_embeddings().weight.float())
        d.embed_tokens.weight.requires_grad_(False)
        d.lm_head.weight.copy_(lm.model.get_output_embeddings().weight.float()[vocab])
        d.norm.weight.copy_(lm.model.model.norm.weight.float())
        d.d2t.copy_(vocab - torch.arange(len(vocab)))
    return d


def init_fc(d: Eagle3Drafter, data: list[Seq], labels: list[str], seed: int = 0) -> None:
    """fc at random, each fed state's block scaled by 1 / that state's RMS over the data (S_0 is ~20x smaller)."""
    g = torch.Generator().manual_seed(seed)
    H_T, k = d.cfg.target_hidden_size, d.cfg.num_aux
    with torch.no_grad():
        for i, lbl in enumerate(labels):
            rms = float(torch.cat([s.states[lbl] for s in data[:64]]).float().pow(2).mean().sqrt())
            w = torch.randn(d.cfg.hidden_size, H_T, generator=g) / (H_T * k) ** 0.5 / rms
            d.fc.weight[:, i * H_T:(i + 1) * H_T] = w


def _step_logits(d: Eagle3Drafter, b, head_d: torch.Tensor, steps: int) -> tuple[list, list, list]:
    """Per draft step j on the weighted slots: (drafter logits [M_j, V_d], teacher logits over the draft vocab
    [M_j, V_d] from the target's F at t+1+j, weights [M_j])."""
    w = step_masks(b, steps, 0.0)
    sel = [wj > 0 for wj in w]
    logits = ttt_forward(d, b.aux, b.tokens, steps, sel)
    teach = [(shift(b.final, 1 + j)[sel[j]] @ head_d.T).float() for j in range(steps)]
    return logits, teach, [w[j][sel[j]] for j in range(steps)]


def train(d: Eagle3Drafter, data: list[Seq], labels: list[str], head_d: torch.Tensor, a, log=print) -> dict:
    """TTT on the draft vocab; AdamW, warm-up then linear decay to lr/10 over `a.minutes`."""
    params = [p for p in d.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng, t0, step, losses, queue = random.Random(a.seed), time.time(), 0, [], []
    lengths = [len(s.tokens) for s in data]
    d.train()
    while time.time() - t0 < a.minutes * 60:
        if not queue:
            queue = length_batches(lengths, a.batch_size, a.batch_tokens, rng)
        b = make_batch([data[i] for i in queue.pop()], labels, torch.device("cpu"))
        logits, teach, w = _step_logits(d, b, head_d, a.ttt_steps)
        loss = b.aux.new_zeros(())
        for j in range(a.ttt_steps):
            ce = -(torch.softmax(teach[j], -1) * torch.log_softmax(logits[j].float(), -1)).sum(-1)
            loss = loss + STEP_DECAY ** j * (ce * w[j]).sum() / w[j].sum().clamp(min=1e-6)
        frac = min(1.0, (time.time() - t0) / (a.minutes * 60))
        for g in opt.param_groups:
            g["lr"] = a.lr * min(1.0, (step + 1) / 30) * (0.1 + 0.9 * (1 - frac))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        step += 1
        if step % 100 == 0:
            log(f"[mla] step {step} loss {sum(losses[-100:]) / 100:.3f} ({time.time() - t0:.0f} s)", flush=True)
    d.eval()
    tail = losses[-50:]
    return {"steps": step, "seconds": round(time.time() - t0, 1), "final_loss": round(sum(tail) / max(1, len(tail)), 4)}


@torch.no_grad()
def accuracy(d: Eagle3Drafter, data: list[Seq], labels: list[str], head: torch.Tensor, steps: int) -> list[float]:
    """Teacher-forced top-1 agreement with the target's greedy token (over its whole vocab, `head` [V, H]) per draft
    step, fed `labels`; the drafter's choice mapped through d2t."""
    head_d = head[d.draft_to_target(torch.arange(d.cfg.draft_vocab_size))]
    hit, n = [0.0] * steps, [0.0] * steps
    for idx in length_batches([len(s.tokens) for s in data], 16, 8192, random.Random(0)):
        b = make_batch([data[i] for i in idx], labels, torch.device("cpu"))
        logits, _, _ = _step_logits(d, b, head_d, steps)
        sel = [wj > 0 for wj in step_masks(b, steps, 0.0)]
        for j in range(steps):
            want = (shift(b.final, 1 + j)[sel[j]] @ head.T).argmax(-1)                 # target vocab
            got = d.draft_to_target(logits[j].argmax(-1))
            hit[j] += float((got == want).sum())
            n[j] += float(sel[j].sum())
    return [round(h / max(1.0, c), 4) for h, c in zip(hit, n)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--pair", help="unpacked toy pair (default: the shipped one under the data root)")
    ap.add_argument("--convention", default="before", choices=sorted(CONVENTIONS))
    ap.add_argument("--ids", default=",".join(map(str, IDS)), help="eagle_config.eagle_aux_hidden_state_layer_ids")
    ap.add_argument("--minutes", type=float, default=8.0, help="training time (data and scoring come on top)")
    ap.add_argument("--docs", type=int, default=300, help="offline documents added to the Spec-Bench prompts")
    ap.add_argument("--gen-tokens", type=int, default=96)
    ap.add_argument("--max-prompts", type=int, default=None, help="use only the first N training prompts")
    ap.add_argument("--heldout", type=int, default=48, help="held-out Spec-Bench prompts the drafter is scored on")
    ap.add_argument("--draft-vocab", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--q-lora-rank", type=int, default=64)
    ap.add_argument("--kv-lora-rank", type=int, default=64)
    ap.add_argument("--nope-dim", type=int, default=32)
    ap.add_argument("--rope-dim", type=int, default=32)
    ap.add_argument("--v-dim", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=256)
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    t_all = time.time()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    from backend.engines.hf import load
    from backend.toy.shipped import toy_pair
    from backend.toy.train_drafter import default_ids, simulate_tau
    from tools.dflash_toy import training_prompts

    pair = Path(a.pair) if a.pair else toy_pair()
    lm = load(pair / "target", device="cpu", dtype="fp32")
    ids = [int(t) for t in a.ids.split(",")]
    labels, wrong = trained_labels(a.convention, ids), trained_labels(other_convention(a.convention), ids)
    default = [f"S_{t}" for t in default_ids(lm.n_layers)]
    t0 = time.time()
    data = build_data(lm, training_prompts(lm.tokenizer, a.docs, seed=a.seed)[:a.max_prompts], labels, a.gen_tokens)
    held = build_data(lm, heldout_prompts(lm.tokenizer, a.heldout), sorted(set(labels + wrong + default)),
                      a.gen_tokens)
    t_data = time.time() - t0
    print(f"[mla] {len(data)} training answers ({sum(len(s.tokens) - s.prompt_len for s in data)} tokens), "
          f"{len(held)} held-out, in {t_data:.0f} s", flush=True)
    vocab = draft_vocab(data, a.draft_vocab)
    head = lm.model.get_output_embeddings().weight.detach().float()
    head_d = head[vocab]                                                  # [V_d, H]: the teacher over the draft vocab
    d = mla_drafter(lm, ids, vocab, a)
    init_fc(d, data, labels, a.seed)
    rec = train(d, data, labels, head_d, a)
    d.embed_source = "target"                                             # the checkpoint holds no embedding
    d.to(torch.bfloat16).save(a.out, format="eagle", aux_layer_ids=ids)
    raw = json.loads((Path(a.out) / "config.json").read_text())
    raw.pop("num_aux_hidden_states")                    # k from the nested ids, as SGLang's MLA file reads it
    raw["torch_dtype"] = "bfloat16"
    (Path(a.out) / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    emb = lm.model.get_input_embeddings().weight
    back = Eagle3Drafter.load(a.out, target_embed=emb, dtype=torch.float32)          # scored as saved (bf16)
    feeds = {"trained_feed": labels, "other_convention": wrong, "eagle3_default": default}
    scores = {k: {"boundaries": v, "accuracy": accuracy(back, held, v, head, a.ttt_steps),
                  "tau": simulate_tau(back, held, v, k=a.ttt_steps)} for k, v in feeds.items()}
    greedy = [(s.tokens, s.prompt_len, None, (s.states["F"].float() @ head.T).argmax(-1)) for s in data]
    held_g = [(s.tokens, s.prompt_len, None, (s.states["F"].float() @ head.T).argmax(-1)) for s in held]
    scores["position_1_baselines"] = baselines(greedy, held_g, 2)
    total = round(time.time() - t_all, 1)
    (Path(a.out) / "TRAINING.json").write_text(json.dumps({
        "what": "MLA EAGLE-3 drafter (Eagle3DeepseekV2ForCausalLM) for the SpecLens toy target, trained on one CPU "
                "core (tools/mla_toy.py)",
        "command": "python tools/mla_toy.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "convention": a.convention, "eagle_aux_hidden_state_layer_ids": ids, "trained_on": labels,
        "mla": back.cfg.mla, "num_heads": a.heads, "intermediate_size": a.intermediate,
        "draft_vocab_size": len(vocab), "ttt_steps": a.ttt_steps, "threads": a.threads,
        "training_answers": len(data), "heldout_answers": len(held), "gen_tokens": a.gen_tokens, "docs": a.docs,
        "lr": a.lr, "batch_size": a.batch_size, "batch_tokens": a.batch_tokens, "seed": a.seed,
        "torch": torch.__version__, "data_seconds": round(t_data, 1), "total_seconds": total, **rec,
        "heldout": scores}, indent=2) + "\n")
    print(f"[mla] trained on {', '.join(labels)}: {rec}; {total} s in all -> {a.out}", flush=True)
    for k in feeds:
        print(f"[mla] fed {', '.join(scores[k]['boundaries'])}: accuracy by step {scores[k]['accuracy']}, "
              f"replayed tau {scores[k]['tau']['tau']:.3f}", flush=True)
    print(f"[mla] position 1 without the states: {scores['position_1_baselines']}", flush=True)


if __name__ == "__main__":
    main()
