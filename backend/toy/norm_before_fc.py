"""A toy drafter trained with `norm_before_fc: true`, for what a release that ignores the field costs (issue 22).

`norm_before_fc` puts one RMSNorm (`input_norm`, weight [k*H_T]) over the concatenated aux states before fc:
vLLM's llama_eagle3.py builds and applies it; SGLang <= 0.5.16 has no such module, so a drafter trained with it is
fed the un-normed states (backend/drafter_fields.yaml). This trains such a drafter on the toy target, on CPU:

    python -m backend.toy.norm_before_fc --out tests/data/field_cost [--steps 300] [--train-rows 120]

Start: the toy pair's matched drafter (models/toy-pair.tar.gz drafter-matched, fed S_2, S_4, S_5) with the flag set,
`input_norm` at ones and a fresh fc; fc, input_norm, the decoder layer and the final norm are trained (TTT, 4 steps,
backend/toy/train_drafter.ttt_loss) with the norm applied; the embedding and lm_head stay the matched drafter's
(frozen), so only the trained tensors are written: OUT/norm_before_fc_delta.safetensors (bf16) and OUT/TRAINING.json.
`assemble` rebuilds the drafter directory from the matched drafter and the delta (tools/field_cost.py does this).
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from backend.toy import train_drafter as td

FEED = ["S_2", "S_4", "S_5"]            # what the matched drafter (ids [2, 4, 5], vLLM convention) is fed
IDS = [2, 4, 5]
DELTA = "norm_before_fc_delta.safetensors"
FROZEN = ("embed_tokens.", "lm_head.", "d2t")


@dataclass
class NormConfig:
    steps: int = 300
    batch_size: int = 8
    batch_tokens: int = 2048
    lr: float = 1e-3
    warmup: int = 20
    gen_tokens: int = 96
    max_prompt_tokens: int = 256
    train_rows: int = 120               # Spec-Bench training rows (every turn)
    doc_prompts: int = 0
    gen_batch: int = 32
    tau_prompts: int = 24               # held-out sequences for the replayed tau
    seed: int = 0
    max_seconds: float | None = None


def with_norm(matched) -> torch.nn.Module:
    """The matched drafter's weights in a drafter whose config has norm_before_fc: true (input_norm at ones)."""
    from backend.drafter import Eagle3Drafter

    d = Eagle3Drafter(replace(matched.cfg, norm_before_fc=True, norm_before_fc_source="top-level"))
    d.load_state_dict(matched.state_dict(), strict=False)
    with torch.no_grad():
        d.input_norm.weight.fill_(1.0)
    d.embed_source = matched.embed_source
    return d


def trained(name: str) -> bool:
    return not name.startswith(FROZEN)


def train(cfg: NormConfig, lm, matched, data: list[td.Seq], progress: bool = True):
    torch.manual_seed(cfg.seed)
    d = with_norm(matched).float()
    torch.nn.init.normal_(d.fc.weight, std=1.0 / d.fc.weight.shape[1] ** 0.5)
    for n, p in d.named_parameters():
        p.requires_grad_(trained(n))
    assert d.uses_input_norm
    d.train()
    head = lm.model.get_output_embeddings().weight.detach().float()
    return td.fine_tune(d, data, FEED, head, cfg, 4, False, torch.device("cpu"), "norm-before-fc", progress)


def write_delta(d, out: Path) -> Path:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16).contiguous().clone() for k, v in d.state_dict().items() if trained(k)}
    save_file(sd, str(out / DELTA))
    return out / DELTA


def assemble(matched_dir: Path, delta: Path, out: Path) -> Path:
    """The norm_before_fc drafter directory (EAGLE format, bf16): the matched drafter's embedding and lm_head, the
    delta's trained tensors, config norm_before_fc: true."""
    from safetensors.torch import load_file

    from backend.drafter import Eagle3Drafter

    d = with_norm(Eagle3Drafter.load(matched_dir, dtype=torch.float32))
    sd = load_file(str(delta))
    missing = sorted(k for k in d.state_dict() if trained(k) and k not in sd)
    if missing:
        raise SystemExit(f"{delta}: no {', '.join(missing[:4])}; rebuild it with python -m backend.toy.norm_before_fc")
    d.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    td.save_drafter(d, out, IDS, "bf16")
    raw = json.loads((out / "config.json").read_text())
    if raw.get("norm_before_fc") is not True:
        raise SystemExit(f"{out}/config.json: norm_before_fc was not written")
    return out


def build(out: Path, pair: Path, cfg: NormConfig, progress: bool = True, command: str = "") -> dict:
    from backend.drafter import Eagle3Drafter
    from backend.engines.hf import load

    t0 = time.time()
    torch.set_num_threads(1)
    say = print if progress else (lambda *a, **k: None)
    lm = load(pair / "target", device="cpu", dtype="fp32")
    dc = td.DataConfig(gen_tokens=cfg.gen_tokens, max_prompt_tokens=cfg.max_prompt_tokens, doc_prompts=cfg.doc_prompts,
                       seed=cfg.seed, train_rows=cfg.train_rows)
    train_prompts = td.training_prompts(lm.tokenizer, dc)
    held_prompts = td.heldout_prompts(lm.tokenizer, dc)
    held_prompts = held_prompts[:: max(1, len(held_prompts) // cfg.tau_prompts)][: cfg.tau_prompts]
    say(f"[norm-before-fc] {len(train_prompts)} training prompts, {len(held_prompts)} held-out", flush=True)
    train_data = td.build_data(lm, train_prompts, FEED, cfg.gen_tokens, cfg.gen_batch)
    held = td.build_data(lm, held_prompts, FEED, cfg.gen_tokens, cfg.gen_batch)
    t_data = time.time() - t0
    say(f"[norm-before-fc] data in {t_data:.0f}s ({sum(len(s.tokens) for s in train_data)} training tokens)",
        flush=True)
    matched = Eagle3Drafter.load(pair / "drafter-matched", dtype=torch.float32)
    d, rec = train(cfg, lm, matched, train_data, progress)
    delta = write_delta(d, out)
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        saved = Eagle3Drafter.load(assemble(pair / "drafter-matched", delta, Path(tmp) / "d"), dtype=torch.float32)
        dropped = Eagle3Drafter.load(Path(tmp) / "d", engine="sglang", dtype=torch.float32)
        taus = {"as trained (norm applied)": td.simulate_tau(saved, held, FEED, 4)["tau"],
                "norm ignored (SGLang semantics)": td.simulate_tau(dropped, held, FEED, 4)["tau"],
                "matched drafter": td.simulate_tau(matched, held, FEED, 4)["tau"]}
    for k, v in taus.items():
        say(f"[norm-before-fc] held-out tau (K=4, replay) {k:<32} {v:.3f}", flush=True)
    record = {"what": "toy drafter trained with norm_before_fc: true (issue 22 item 3)", "command": command,
              "config": cfg.__dict__, "feed": FEED, "ids": IDS, "init": "drafter-matched, fresh fc, input_norm ones",
              "trained": sorted(k for k in d.state_dict() if trained(k)), "frozen": list(FROZEN),
              "train_sequences": len(train_data), "train_tokens": int(sum(len(s.tokens) for s in train_data)),
              "heldout_sequences": len(held), "heldout_tau_replay": {k: round(v, 3) for k, v in taus.items()},
              "train": rec, "data_s": round(t_data, 1), "wall_s": round(time.time() - t0, 1),
              "device": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
              "torch": torch.__version__}
    (out / "TRAINING.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def main(argv: list[str] | None = None) -> None:
    from backend.toy.shipped import toy_pair

    p = argparse.ArgumentParser(description="Train the toy norm_before_fc drafter (issue 22 item 3) on CPU.")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--pair", type=Path, default=None, help="the unpacked toy pair (default: the demo's)")
    for f in ("steps", "batch_size", "batch_tokens", "train_rows", "doc_prompts", "gen_tokens", "tau_prompts",
              "gen_batch", "warmup"):
        p.add_argument("--" + f.replace("_", "-"), type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--max-seconds", type=float, default=None)
    a = p.parse_args(argv)
    cfg = NormConfig(**{k: v for k, v in vars(a).items() if k in NormConfig.__dataclass_fields__ and v is not None})
    pair = a.pair or toy_pair()
    if pair is None:
        raise SystemExit("no toy pair: models/toy-pair.tar.gz is missing")
    cmd = "python -m backend.toy.norm_before_fc " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:]))
    build(a.out, Path(pair), cfg, command=cmd)


if __name__ == "__main__":
    main()
