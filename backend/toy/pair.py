"""The toy pair: a small trained target and two EAGLE-3 drafters for it, one per capture convention.

    python -m backend.toy.pair --out data/models/toy-pair                 # full run (meant for a GPU)
    python -m backend.toy.pair --out data/models/toy-pair --quick         # CPU-sized run
    python -m backend.toy.pair --out /tmp/toy-pair --device cuda --budget-minutes 7

Writes to `out`:

    target/               HF Llama (8 layers, hidden 256) + its tokenizer with chat template
    drafter-matched/      EAGLE/SpecForge format, ids [2, 4, 5] written, trained on S_2, S_4, S_5
                          (vLLM convention: id a -> S_a, the input of layer a)
    drafter-after-layer/  EAGLE/SpecForge format, NO ids written, trained on S_3, S_5, S_6
                          (speculators <= 0.4: id a -> S_{a+1}); vLLM serves it S_2, S_4, S_5
    TRAINING.json         command, seeds, steps, losses, held-out accuracy and tau, timing, device

"Matched" means matched for vLLM (and EAGLE, speculators >= 0.5). SGLang 0.5.23 reads written ids as
"after layer a" (S_{a+1}), so it feeds drafter-matched S_3, S_5, S_6; with no ids it uses its default
S_2, S_4, S_5 (no +1), which is off by one for drafter-after-layer too. TRAINING.json records both.

Every held-out number is on Spec-Bench rows never used for training (`corpus.heldout_ids()`):
the teacher-forced top-1 agreement of draft steps 1..k, and tau (mean acceptance length, K=4,
greedy) replayed with the drafter's inference path (`train_drafter.simulate_tau`), both for the
boundaries each drafter was trained on and for those vLLM 0.24 / SGLang 0.5.23 would feed it.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from backend.config import REPO_ROOT
from backend.coords import resolve_ids
from backend.toy import train_drafter as td
from backend.toy.corpus import build_corpus, heldout_ids
from backend.toy.train_target import TargetConfig, train_target

DRAFTERS = {  # name: (convention the producer used, ids written into config.json or None)
    "drafter-matched": ("before", True),
    "drafter-after-layer": ("after", False),
}
SERVERS = {"vllm": "0.24.0", "sglang": "0.5.23"}


@dataclass
class PairConfig:
    target: TargetConfig = field(default_factory=TargetConfig)
    drafter: td.DrafterTrainConfig = field(default_factory=td.DrafterTrainConfig)
    data: td.DataConfig = field(default_factory=td.DataConfig)
    tau_k: int = 4
    tau_prompts: int | None = 48          # held-out sequences replayed for tau, spread evenly (None: all)
    seed: int = 0
    device: str = "auto"
    threads: int | None = None            # torch CPU threads during the build (None: torch's default)
    budget_minutes: float | None = None   # wall-clock guard for the whole build (training stops early, recorded)


def full_config() -> PairConfig:
    """The shipped pair: sized for one H200 (a few minutes)."""
    return PairConfig()


def quick_config() -> PairConfig:
    """CPU-sized: same shapes, short training. Far from the tau bar; for trying the pipeline."""
    return PairConfig(
        target=TargetConfig(block_size=256, batch_size=8, steps=200, warmup=20, log_every=20, eval_docs=16),
        drafter=td.DrafterTrainConfig(steps=100, batch_size=16, batch_tokens=4096, warmup=10, log_every=20),
        data=td.DataConfig(gen_tokens=48, max_prompt_tokens=256, doc_prompts=64, gen_batch=32, train_rows=96,
                           eval_rows=24),
        tau_prompts=12)


def tiny_config() -> PairConfig:
    """Seconds on a CPU (tests): a small model and a handful of steps and prompts."""
    return PairConfig(
        target=TargetConfig(hidden=64, heads=4, kv_heads=2, vocab_size=512, block_size=64, batch_size=4, steps=6,
                            warmup=2, log_every=2, max_offline_chars=20_000, eval_docs=4, echo_docs=20,
                            sources=("spec_bench", "pydoc_topics")),
        drafter=td.DrafterTrainConfig(steps=4, batch_size=4, batch_tokens=512, warmup=1, log_every=1),
        data=td.DataConfig(gen_tokens=12, max_prompt_tokens=48, doc_prompts=4, gen_batch=16,
                           train_rows=6, eval_rows=4, max_offline_chars=20_000),
        tau_prompts=4, threads=1)


def summary(drafters_rec: dict) -> dict:
    """The headline: held-out tau (K=4, greedy) and step-1..4 top-1 of each drafter, as trained and as vLLM
    serves it."""
    out = {}
    for name, rec in drafters_rec.items():
        for feed in ("as_trained", "as_served_vllm"):
            out[f"{name} {feed}"] = {"boundaries": (rec["train_boundaries"] if feed == "as_trained"
                                                    else rec["served_boundaries"]["vllm"]),
                                     "tau": round(rec["heldout_tau"][feed]["tau"], 3),
                                     "top1_per_step": [round(a, 3) for a in rec["heldout_top1_per_step"][feed]]}
    return out


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def build_toy_pair(out_dir: str | Path, device: str = "auto", steps_target: int | None = None,
                   steps_drafter: int | None = None, seed: int = 0, config: PairConfig | None = None,
                   budget_minutes: float | None = None, progress: bool = True, command: str | None = None,
                   reuse_target: bool = False) -> dict:
    """Train the target and both drafters into `out_dir`; return (and write) the TRAINING.json record.

    config: full_config() (default), quick_config() or tiny_config(); steps_* override its step counts.
    budget_minutes: training phases stop early (recorded as stopped_early) past their share of it.
    reuse_target: keep `out_dir/target` (and its record) and retrain only the drafters."""
    cfg = config or full_config()
    cfg = replace(cfg, seed=seed, device=device,
                  target=replace(cfg.target, seed=seed, device=device, steps=steps_target or cfg.target.steps),
                  drafter=replace(cfg.drafter, seed=seed, steps=steps_drafter or cfg.drafter.steps),
                  data=replace(cfg.data, seed=seed))
    if budget_minutes is not None:   # the target gets 45% of it; the drafters share what is left after the data
        cfg = replace(cfg, budget_minutes=budget_minutes,
                      target=replace(cfg.target, max_seconds=0.45 * budget_minutes * 60))
    out = Path(out_dir)
    old_target = _prepare_out(out, reuse_target)
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return _build(cfg, out, command or f"build_toy_pair({str(out)!r})", old_target, progress)
    finally:
        torch.set_num_threads(threads)


def _prepare_out(out: Path, reuse_target: bool) -> dict | None:
    """Empty `out` (all of it, or all but target/ when reusing); return the reused target's record."""
    if not reuse_target:
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        return None
    if not (out / "target" / "config.json").is_file():
        raise FileNotFoundError(f"{out / 'target'}: no target to reuse; run without --reuse-target first")
    prev = out / "TRAINING.json"
    rec = json.loads(prev.read_text()).get("target", {}) if prev.is_file() else {}
    for p in out.iterdir():
        if p.name != "target":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    return {**rec, "reused": True}


def _build(cfg: PairConfig, out: Path, command: str, old_target: dict | None, progress: bool) -> dict:
    from backend.engines.hf import load, resolve_device

    t0 = time.time()
    dev = resolve_device(cfg.device)
    say = print if progress else (lambda *a, **k: None)

    # 1. target ------------------------------------------------------------------------------------
    corpus = build_corpus(cfg.target.max_offline_chars, cfg.target.sources, echo=cfg.target.echo_docs)
    target_rec = (old_target if old_target is not None
                  else train_target(cfg.target, out / "target", corpus, progress=progress))

    # 2. self-distillation data: generate with the saved target, capture every boundary either convention needs
    t1 = time.time()
    lm = load(out / "target", device=str(dev), dtype="fp32")
    N = lm.n_layers
    ids = td.default_ids(N)
    labels = {name: [b.label for b in td.training_boundaries(conv, ids, N)] for name, (conv, _) in DRAFTERS.items()}
    served = {name: {srv: [b.label for b in resolve_ids(srv, ids if write else None, N, version=v)]
                     for srv, v in SERVERS.items()} for name, (_, write) in DRAFTERS.items()}
    wanted = sorted({lbl for d in labels.values() for lbl in d}
                    | {lbl for s in served.values() for v in s.values() for lbl in v})
    train_prompts = td.training_prompts(lm.tokenizer, cfg.data, corpus)
    eval_prompts = td.heldout_prompts(lm.tokenizer, cfg.data)
    held = set(heldout_ids())
    leaked = [s for s, _ in train_prompts if s.startswith("spec_bench:") and int(s.split(":")[1]) in held]
    assert not leaked, f"held-out prompts in the drafter training data: {leaked[:5]}"
    say(f"[data] {len(train_prompts)} training prompts, {len(eval_prompts)} held-out; "
        f"capturing {', '.join(wanted)} + F", flush=True)
    train_data = td.build_data(lm, train_prompts, wanted, cfg.data.gen_tokens, cfg.data.gen_batch, progress)
    eval_data = td.build_data(lm, eval_prompts, wanted, cfg.data.gen_tokens, cfg.data.gen_batch)
    data_rec = {"train_sequences": len(train_data), "heldout_sequences": len(eval_data),
                "train_tokens": int(sum(len(s.tokens) for s in train_data)),
                "generated_tokens_per_sequence": cfg.data.gen_tokens, "captured": wanted + ["F"],
                "wall_s": round(time.time() - t1, 2)}
    data_rec["heldout_target_confidence"] = td.target_confidence(
        eval_data, lm.model.get_output_embeddings().weight.detach().float())
    sample = eval_data[0]
    data_rec["sample_heldout_generation"] = {
        "source": sample.source, "prompt": lm.tokenizer.decode(sample.tokens[:sample.prompt_len].tolist())[-300:],
        "generation": lm.tokenizer.decode(sample.tokens[sample.prompt_len:].tolist())}

    # 3. drafters ----------------------------------------------------------------------------------
    lm_head_w = lm.model.get_output_embeddings().weight.detach().float()
    stride = max(1, len(eval_data) // cfg.tau_prompts) if cfg.tau_prompts else 1
    tau_data = eval_data[::stride][: cfg.tau_prompts]     # evenly spread over the held-out categories
    drafters_rec = {}
    drafter_cfg = cfg.drafter
    if cfg.budget_minutes is not None:   # each drafter: half of what is left, less 15% of the budget for evaluation
        left = cfg.budget_minutes * 60 - (time.time() - t0) - 0.15 * cfg.budget_minutes * 60
        drafter_cfg = replace(drafter_cfg, max_seconds=max(10.0, left / len(DRAFTERS)))
        say(f"[pair] {left:.0f}s of the budget left for the drafters", flush=True)
    for name, (conv, write) in DRAFTERS.items():
        dcfg = replace(drafter_cfg, convention=conv, ids=ids, write_ids=write)
        d, rec = td.train_drafter(dcfg, lm.model, train_data, dev, progress=progress, name=name)
        td.save_drafter(d, out / name, ids if write else None, dcfg.save_dtype)
        t2 = time.time()
        feeds = {"as_trained": labels[name], **{f"as_served_{srv}": b for srv, b in served[name].items()}}
        rec["served_boundaries"] = served[name]
        rec["heldout_top1_per_step"] = {}
        rec["heldout_tau"] = {}
        done: dict[tuple, dict] = {}
        for feed, bl in feeds.items():
            rec["heldout_top1_per_step"][feed] = td.teacher_forced_accuracy(d, eval_data, bl, lm_head_w,
                                                                            cfg.drafter.ttt_steps)
            key = tuple(bl)
            if key not in done:
                done[key] = td.simulate_tau(d, tau_data, bl, cfg.tau_k)
            rec["heldout_tau"][feed] = done[key]
        rec["eval_s"] = round(time.time() - t2, 2)
        drafters_rec[name] = rec
        say(f"[{name}] trained on {', '.join(labels[name])}; "
            f"held-out top-1 per draft step / tau (K={cfg.tau_k}):", flush=True)
        for feed in feeds:
            acc = rec["heldout_top1_per_step"][feed]
            say(f"    fed {', '.join(feeds[feed]):<16} ({feed:<17}) top-1 " + " ".join(f"{a:.3f}" for a in acc)
                + f"   tau {rec['heldout_tau'][feed]['tau']:.3f}", flush=True)

    record = {
        "what": "SpecLens toy pair: target + EAGLE-3 drafters trained on two capture conventions",
        "command": command, "seed": cfg.seed, "device": str(dev),
        "device_name": (torch.cuda.get_device_name(dev) if dev.type == "cuda"
                        else platform.processor() or platform.machine()),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": __import__("transformers").__version__},
        "git_commit": _git_commit(),
        "config": asdict(cfg),
        "heldout_question_ids": sorted(held),
        "summary": summary(drafters_rec),
        "target": target_rec, "data": data_rec, "drafters": drafters_rec,
        "files": {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()},
        "wall_s": round(time.time() - t0, 2),
    }
    (out / "TRAINING.json").write_text(json.dumps(record, indent=2) + "\n")
    conf = data_rec["heldout_target_confidence"]
    say(f"[pair] target on held-out prompts: greedy-token prob {conf['mean_greedy_prob']:.2f} on average, "
        f"> 0.9 at {conf['share_above_0.9']:.0%} of generated positions", flush=True)
    for key, v in record["summary"].items():
        say(f"[pair] {key:<34} fed {', '.join(v['boundaries'])}: tau {v['tau']:.3f}, top-1 "
            + " ".join(f"{a:.3f}" for a in v["top1_per_step"]), flush=True)
    say(f"[pair] wrote {out} in {record['wall_s']:.0f}s ({sum(record['files'].values()) / 1e6:.1f} MB)", flush=True)
    return record


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Build the toy target + matched and after-layer EAGLE-3 drafters.")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "data" / "models" / "toy-pair")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:i]")
    p.add_argument("--quick", action="store_true", help="CPU-sized run (short training, few prompts)")
    p.add_argument("--tiny", action="store_true", help="seconds-long smoke run (what the tests use)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps-target", type=int, default=None)
    p.add_argument("--steps-drafter", type=int, default=None)
    p.add_argument("--budget-minutes", type=float, default=None,
                   help="stop training phases early so the whole run stays near this many minutes")
    p.add_argument("--reuse-target", action="store_true", help="keep OUT/target, retrain only the drafters")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 is fastest on a busy CPU)")
    p.add_argument("--sources", default=None,
                   help="comma-separated corpus sources (backend/toy/corpus.py), e.g. add stdlib_source for more text")
    p.add_argument("--echo-docs", type=int, default=None, help="offline documents also used as quoting chat")
    a = p.parse_args(argv)
    cfg = tiny_config() if a.tiny else quick_config() if a.quick else full_config()
    if a.threads:
        cfg = replace(cfg, threads=a.threads)
    if a.sources:
        cfg = replace(cfg, target=replace(cfg.target,
                                          sources=tuple(s.strip() for s in a.sources.split(",") if s.strip())))
    if a.echo_docs is not None:
        cfg = replace(cfg, target=replace(cfg.target, echo_docs=a.echo_docs))
    cmd = "python -m backend.toy.pair " + " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))
    build_toy_pair(a.out, a.device, a.steps_target, a.steps_drafter, a.seed, cfg, a.budget_minutes, command=cmd,
                   reuse_target=a.reuse_target)


if __name__ == "__main__":
    main()
