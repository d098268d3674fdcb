"""The slot-shift drafter: the Kimi-K2.5 / DeepSeek-V3 team's failure, rebuilt on the toy pair (issue 15).

What that team did (docs/CONVENTIONS.md, speculators <= 0.4): their training files held, per token,
[embeddings, layer outputs a, b, c]; `standardize_data_v1` fed the first three to the drafter's fc and used the last
as the teacher. So the drafter was trained on fc inputs [S_0, S_{a+1}, S_{b+1}] (the embedding slot first) with
S_{c+1} as the teacher. SGLang then read the ids [a, b, c] written in the drafter config "after layer" (+1) and fed
[S_{a+1}, S_{b+1}, S_{c+1}]: every slot one state later, the embedding slot gone. A patch that wrote id -1
("embeddings") next to the data's own layer-output names [-1, a+1, b+1] still fed every layer slot one state late
([S_0, S_{a+2}, S_{b+2}]), because the files named layer outputs by the boundary they hold, not by SGLang's ids.

On the toy target (Llama, N = 8) with the default ids [2, 4, 5]:

| what                                   | fc input slots      |
|----------------------------------------|---------------------|
| trained on (files [S_0, S_3, S_5, S_6]) | S_0, S_3, S_5       |
| SGLang feeds, ids [2, 4, 5] (+1)        | S_3, S_5, S_6       |
| SGLang feeds, patched ids [-1, 3, 5]    | S_0, S_4, S_6       |
| the fix: ids [-1, 2, 4]                 | S_0, S_3, S_5       |

    python -m backend.toy.slot_shift --out data/models/toy-slot-shift [--pair DIR] [--steps 300]

`build` writes OUT/drafter-slot-shift (EAGLE format, nested ids [2, 4, 5]), OUT/training-data/data_{i}.pt (a few
held-out sequences in the team's layout, for check-drafter --training-data) and OUT/TRAINING.json (command, steps,
held-out tau per feed); `write_variants` adds the patched (ids [-1, 3, 5]) and fixed (ids [-1, 2, 4]) copies.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from backend.toy import train_drafter as td

IDS = [2, 4, 5]                       # the default ids [2, N//2, N-3] of the 8-layer toy target
PATCHED_IDS = [-1, 3, 5]              # "-1 = embeddings" + the files' own names of the layer outputs
FIX_IDS = [-1, 2, 4]                  # what SGLang needs to feed S_0, S_3, S_5
LAYOUT = ["S_0", "S_3", "S_5", "S_6"]  # per token in the files: embeddings, then the layer outputs (after layer a)
TRAINED = LAYOUT[:-1]                 # standardize_data_v1: fc input = all but the last
TEACHER = LAYOUT[-1]                  # ... teacher = the last
FEEDS = {"as trained": TRAINED, "SGLang ids [2, 4, 5]": ["S_3", "S_5", "S_6"],
         "SGLang patched ids [-1, 3, 5]": ["S_0", "S_4", "S_6"]}
MATCHED = ["S_2", "S_4", "S_5"]       # the toy pair's matched drafter


@dataclass
class SlotShiftConfig:
    steps: int = 300
    batch_size: int = 16
    batch_tokens: int = 6144
    lr: float = 5e-4
    warmup: int = 20
    gen_tokens: int = 128
    max_prompt_tokens: int = 512
    train_rows: int | None = None       # Spec-Bench training rows (every turn); None: all 364
    doc_prompts: int = 0                # offline documents as extra prompts
    teacher: str = "layout"             # "layout": norm(S_6) through the target's head (what the team did); "F"
    init: str = "warm-fc"               # "warm-fc": the matched drafter's layer, norms and head with a fresh fc;
                                        # "warm": all of the matched drafter; "cold": fc and layer random
    tau_prompts: int | None = None      # held-out sequences for the tau replay (None: all 116)
    ttt_steps: int = 4                  # unrolled draft steps in training
    init_from: str | None = None        # warm starts: this drafter directory instead of the matched drafter
    device: str = "cpu"                 # "cuda" on a GPU node (bf16 autocast there)
    gen_batch: int = 64
    seed: int = 0
    threads: int | None = None
    max_seconds: float | None = None


def _teacher_states(lm, data: list[td.Seq], teacher: str) -> list[td.Seq]:
    """Seqs whose "F" is the teacher state: the target's final norm of the layout's last slot, or the real F."""
    if teacher == "F":
        return data
    norm = lm.model.model.norm
    out = []
    with torch.no_grad():
        for s in data:
            st = dict(s.states)
            st["F"] = norm(s.states[TEACHER]).float()
            out.append(td.Seq(s.tokens, s.prompt_len, st, s.source))
    return out


def train(cfg: SlotShiftConfig, lm, init_dir: Path | None, data: list[td.Seq], progress: bool = True):
    """TTT training of a drafter on fc inputs TRAINED (warm-started from `init_dir` when given)."""
    from backend.drafter import Eagle3Drafter

    torch.manual_seed(cfg.seed)
    if cfg.init in ("warm", "warm-fc") and init_dir is not None:
        d = Eagle3Drafter.load(init_dir, dtype=torch.float32)
        d.embed_tokens.weight.requires_grad_(False)
        if cfg.init == "warm-fc":
            torch.nn.init.normal_(d.fc.weight, std=1.0 / d.fc.weight.shape[1] ** 0.5)
    else:
        d = td.drafter_for(lm.config, IDS)
        td.init_from_target(d, lm.model)
    dev = torch.device(cfg.device)
    d.to(dev).train()
    head = lm.model.get_output_embeddings().weight.detach().float().to(dev)
    return td.fine_tune(d, data, TRAINED, head, cfg, cfg.ttt_steps, dev.type == "cuda", dev, "slot-shift", progress)


def teacher_agreement(lm, data: list[td.Seq]) -> float:
    """How often the layout's teacher (norm(S_6) through the head) picks the target's own greedy token."""
    head = lm.model.get_output_embeddings().weight.detach().float()
    norm = lm.model.model.norm
    hit = n = 0
    with torch.no_grad():
        for s in data:
            sl = slice(s.prompt_len - 1, len(s.tokens) - 1)
            w = head.to(s.states["F"].device)
            a = (norm(s.states[TEACHER][sl]) @ w.T).argmax(-1)
            b = (s.states["F"][sl] @ w.T).argmax(-1)
            hit += int((a == b).sum())
            n += a.numel()
    return hit / max(1, n)


def write_layout_files(data: list[td.Seq], out: Path, n: int = 2, max_tokens: int = 256) -> list[Path]:
    """`n` training sequences (at most `max_tokens` each) in the team's speculators <= 0.4 layout: data_{i}.pt
    (input_ids, loss_mask, hidden_states = [S_0, S_3, S_5, S_6] fp32), what check-drafter --training-data reads."""
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for i, s in enumerate(data[:n]):
        p = out / f"data_{i}.pt"
        t = min(len(s.tokens), max_tokens)
        torch.save({"input_ids": s.tokens[:t].cpu().to(torch.int64).clone(),
                    "hidden_states": [s.states[lbl][:t].cpu().float().clone() for lbl in LAYOUT],
                    "loss_mask": torch.ones(t, dtype=torch.int64)}, p)
        files.append(p)
    return files


def save(d, out: Path, ids: list[int]) -> Path:
    td.save_drafter(d, out, ids, "bf16")
    raw = json.loads((out / "config.json").read_text())
    raw.pop("eagle_aux_hidden_state_layer_ids", None)
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    return out


VARIANTS = {"drafter-slot-shift-patched": PATCHED_IDS, "drafter-slot-shift-fixed": FIX_IDS}


def write_variants(out: Path, names: tuple[str, ...] | None = None) -> list[Path]:
    """OUT/drafter-slot-shift-patched and -fixed: the same weights with eagle_config ids [-1, 3, 5] (the patch) and
    [-1, 2, 4] (the fix the drafter check names); made when missing, so the tarball ships the weights once. The demo
    makes only the patch this way (`names`): its fix is written by `check-drafter --write-fix` (drafter/fix.py)."""
    made = []
    for name, ids in VARIANTS.items():
        if names is not None and name not in names:
            continue
        dst = out / name
        if (dst / "config.json").is_file():
            continue
        tmp = out / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(out / "drafter-slot-shift", tmp)
        raw = json.loads((tmp / "config.json").read_text())
        raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(ids)
        (tmp / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
        made.append(dst)
    return made


def build(out: Path, pair: Path, cfg: SlotShiftConfig, progress: bool = True, command: str = "",
          data_cache: Path | None = None) -> dict:
    from backend.drafter import Eagle3Drafter
    from backend.engines.hf import load

    t0 = time.time()
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    say = print if progress else (lambda *a, **k: None)
    lm = load(pair / "target", device=cfg.device, dtype="fp32")
    labels = sorted(set(LAYOUT) | set(MATCHED) | {lbl for f in FEEDS.values() for lbl in f})
    dc = td.DataConfig(gen_tokens=cfg.gen_tokens, max_prompt_tokens=cfg.max_prompt_tokens, doc_prompts=cfg.doc_prompts,
                       seed=cfg.seed, train_rows=cfg.train_rows)
    corpus = None
    if cfg.doc_prompts:
        from backend.toy.corpus import build_corpus
        corpus = build_corpus()
    train_prompts = td.training_prompts(lm.tokenizer, dc, corpus)
    held_prompts = td.heldout_prompts(lm.tokenizer, dc)
    say(f"[slot-shift] {len(train_prompts)} training prompts, {len(held_prompts)} held-out", flush=True)
    if data_cache is not None and data_cache.is_file():
        train_data, held = torch.load(data_cache, weights_only=False)
    else:
        train_data = td.build_data(lm, train_prompts, labels, cfg.gen_tokens, cfg.gen_batch)
        held = td.build_data(lm, held_prompts, labels, cfg.gen_tokens, cfg.gen_batch)
        if data_cache is not None:
            torch.save((train_data, held), data_cache)
    t_data = time.time() - t0
    say(f"[slot-shift] data in {t_data:.0f}s ({sum(len(s.tokens) for s in train_data)} training tokens)", flush=True)
    agree = teacher_agreement(lm, held)
    init_dir = Path(cfg.init_from) if cfg.init_from else pair / "drafter-matched"
    d, rec = train(cfg, lm, init_dir, _teacher_states(lm, train_data, cfg.teacher), progress)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    save(d, out / "drafter-slot-shift", IDS)
    write_layout_files(train_data, out / "training-data")
    # held-out tau, replayed (train_drafter.simulate_tau), every feed, and the matched drafter for scale
    tau_data = held if cfg.tau_prompts is None else held[:: max(1, len(held) // cfg.tau_prompts)][: cfg.tau_prompts]
    saved = Eagle3Drafter.load(out / "drafter-slot-shift", dtype=torch.float32)
    matched = Eagle3Drafter.load(pair / "drafter-matched", dtype=torch.float32)
    taus = {name: td.simulate_tau(saved, tau_data, feed, 4)["tau"] for name, feed in FEEDS.items()}
    taus["matched drafter, S_2, S_4, S_5"] = td.simulate_tau(matched, tau_data, MATCHED, 4)["tau"]
    for k, v in taus.items():
        say(f"[slot-shift] held-out tau (K=4, replay) {k:<34} {v:.3f}", flush=True)
    record = {"what": "slot-shift drafter (issue 15): trained on fc inputs S_0, S_3, S_5 from files "
                      "[S_0, S_3, S_5, S_6] (speculators <= 0.4 layout with embeddings first), teacher the last slot",
              "command": command, "config": cfg.__dict__, "layout": LAYOUT, "trained_on": TRAINED,
              "teacher": TEACHER if cfg.teacher == "layout" else "F", "ids_written": IDS, "patched_ids": PATCHED_IDS,
              "fix_ids": FIX_IDS, "feeds": FEEDS, "train_sequences": len(train_data),
              "train_tokens": int(sum(len(s.tokens) for s in train_data)), "heldout_sequences": len(held),
              "tau_sequences": len(tau_data), "teacher_agrees_with_target_greedy": round(agree, 4),
              "heldout_tau_replay": {k: round(v, 3) for k, v in taus.items()}, "train": rec,
              "data_s": round(t_data, 1), "wall_s": round(time.time() - t0, 1),
              "device": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
              "torch": torch.__version__}
    (out / "TRAINING.json").write_text(json.dumps(record, indent=2) + "\n")
    torch.set_num_threads(threads)
    return record


def pack(out: Path, tarball: Path) -> Path:
    """OUT's drafter-slot-shift/, training-data/ and TRAINING.json as the tarball the demo ships
    (models/toy-slot-shift.tar.gz); the patched and fixed copies are made on unpacking (`write_variants`)."""
    import tarfile

    tarball.parent.mkdir(parents=True, exist_ok=True)
    tmp = tarball.with_name(tarball.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tf:
        for name in ("TRAINING.json", "drafter-slot-shift", "training-data"):
            tf.add(out / name, arcname=name)
    tmp.replace(tarball)
    return tarball


def main(argv: list[str] | None = None) -> None:
    from backend.toy.shipped import toy_pair

    p = argparse.ArgumentParser(description="Train the slot-shift drafter (issue 15) for the shipped toy target.")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--pair", type=Path, default=None, help="the unpacked toy pair (default: the demo's)")
    for f in ("steps", "batch_size", "batch_tokens", "train_rows", "doc_prompts", "tau_prompts", "threads",
              "ttt_steps", "gen_batch", "warmup"):
        p.add_argument("--" + f.replace("_", "-"), type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--max-seconds", type=float, default=None)
    p.add_argument("--teacher", choices=("layout", "F"), default=None)
    p.add_argument("--device", default=None, help="cpu (default) or cuda")
    p.add_argument("--init-from", default=None, help="warm start from this drafter directory (with --init warm)")
    p.add_argument("--init", choices=("warm-fc", "warm", "cold"), default=None,
                   help="warm-fc: the matched drafter's layer and head, a fresh fc (default); warm: all of it; "
                        "cold: random")
    p.add_argument("--data-cache", type=Path, default=None, help="reuse (or write) the generated data here")
    p.add_argument("--pack", type=Path, default=None, help="also write the demo tarball here "
                                                            "(e.g. models/toy-slot-shift.tar.gz)")
    a = p.parse_args(argv)
    cfg = SlotShiftConfig()
    over = {k: v for k, v in vars(a).items() if k not in ("out", "pair", "data_cache", "pack") and v is not None}
    cfg = replace(cfg, **over)
    pair = a.pair or toy_pair()
    cmd = "python -m backend.toy.slot_shift " + " ".join(shlex.quote(x) for x in
                                                       (argv if argv is not None else sys.argv[1:]))
    build(a.out, pair, cfg, command=cmd, data_cache=a.data_cache)
    if a.pack:
        print(f"[slot-shift] wrote {pack(a.out, a.pack)} ({a.pack.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
