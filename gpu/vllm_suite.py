"""vLLM on a GPU node, for real: `python gpu/vllm_suite.py toy|speed|all --out DIR`.

toy   (the toy pair shipped in models/toy-pair.tar.gz; minutes)
      1. HF capture vs vLLM capture of the same target weights and prompts: alignment verdict, per-boundary cosine,
         and the aux ids vLLM's running model adds up mapped to boundaries;
      2. the toy pair through vLLM against the HF reference engine (same GPU, bf16): tau at K=4, greedy, on the
         held-out Spec-Bench prompts, per-position rates side by side, lossless check;
      3. a drafter config with nested ids only: what vLLM really feeds it (read from the live model), with the V2
         runner (default) and the V1 runner, next to what SpecLens predicted from the config.
speed (a Llama-3.1-8B-shaped target with random bf16 weights, load_format="dummy"; 64 prompts x 2048 tokens)
      plain prefill (compiled, max_tokens=1) vs the same in eager mode vs SpecLens capture with streaming statistics
      of the EAGLE set (S_2, S_16, S_29, S_32) and of all 33 boundaries S_0..S_32; bytes written per token.

Writes DIR/vllm_toy.json, DIR/vllm_speed.json, DIR/recorded/* (metric snapshots, engine info, log lines for the
CPU tests) and DIR/runs.tar.gz (the run directories, for the dashboard). Needs vLLM 0.24 and a CUDA GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")


def env_info() -> dict:
    import torch
    import transformers
    import vllm
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(0), "vllm": vllm.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "command": " ".join(["python"] + sys.argv)}


def toy(out: Path, root: Path, n_capture: int, n_bench: int, max_new: int) -> dict:
    from backend import align
    from backend.bench import BenchSettings, run_bench
    from backend.capture import CaptureSettings, run_capture
    from backend.demo import heldout_prompts, toy_pair

    pair = toy_pair(root)
    prompts = str(heldout_prompts(pair))
    target = str(pair / "target")
    res: dict = {"env": env_info(), "pair": str(pair), "prompts": "held-out Spec-Bench rows (TRAINING.json)"}

    # 1. captures: HF (reference hooks) vs vLLM (hooks inside the worker), same weights, same prompt tokens
    t = time.perf_counter()
    hf_cap = run_capture(CaptureSettings(model=target, prompts=prompts, engine="hf", limit=n_capture, device="cuda",
                                         dtype="bf16"), name="h200-toy-capture-hf", root=root, progress=False)
    t_hf = time.perf_counter() - t
    t = time.perf_counter()
    vl_cap = run_capture(CaptureSettings(model=target, prompts=prompts, engine="vllm", limit=n_capture, dtype="bf16"),
                         name="h200-toy-capture-vllm", root=root, progress=False)
    t_vl = time.perf_counter() - t
    al = align.get_alignment(hf_cap.run_id, vl_cap.run_id, root)
    res["capture"] = {"hf_run": hf_cap.run_id, "vllm_run": vl_cap.run_id, "tokens": vl_cap.tokens,
                      "seconds_hf": round(t_hf, 2), "seconds_vllm_incl_engine_start": round(t_vl, 2),
                      "verdict": [{"kind": f.kind, "text": f.text} for f in al.verdict], "offset": al.offset,
                      "per_boundary": al.per_boundary, "shared_tokens": al.tokens}
    print("capture verdict:", [f.text for f in al.verdict], flush=True)
    from backend.engines import vllm as V
    t = time.perf_counter()
    ex = V.run_extract(CaptureSettings(model=target, prompts=prompts, engine="vllm", limit=n_capture, dtype="bf16"),
                       [2, 4, 5, 8], name="h200-toy-extract-vllm", root=root,
                       opts=V.EngineOptions(gpu_memory_utilization=0.2, max_model_len=2048, dtype="bfloat16"),
                       progress=False)
    al2 = align.get_alignment(hf_cap.run_id, ex.run_id, root)
    res["extract"] = {"run": ex.run_id, "ids": [2, 4, 5, 8], "tokens": ex.tokens,
                      "seconds_incl_engine_start": round(time.perf_counter() - t, 2),
                      "verdict": [{"kind": f.kind, "text": f.text} for f in al2.verdict], "offset": al2.offset,
                      "per_boundary": al2.per_boundary}
    print("extract verdict:", [f.text for f in al2.verdict], flush=True)

    # 2. benches: HF reference and vLLM, same prompts, K=4, greedy, bf16
    from backend.engines import vllm as V
    V.RECORDING = []
    res["bench"] = {}
    for engine in ("hf", "vllm"):
        for drafter in ("drafter-matched", "drafter-after-layer"):
            s = BenchSettings(target=target, drafter=str(pair / drafter), prompts=prompts, num_spec_tokens=4,
                              temperature=0.0, repeats=1, limit=n_bench, max_new_tokens=max_new, device="cuda",
                              dtype="bf16", engine=engine, runner="v2",
                              engine_options={"gpu_memory_utilization": 0.2, "max_model_len": 2048}
                              if engine == "vllm" else None)
            t = time.perf_counter()
            r = run_bench(s, name=f"h200-toy-{engine}-{drafter}", root=root, progress=False)
            summ = json.loads((r.path / "summary.json").read_text())
            man = json.loads((r.path / "manifest.json").read_text())
            res["bench"][f"{engine}/{drafter}"] = {
                "run": r.run_id, "baseline_run": r.baseline_run, "tau": r.tau, "acceptance_rate": r.acceptance_rate,
                "per_position_rates": summ["per_position"]["rates"], "histogram": summ["histogram"],
                "lossless": r.lossless, "mismatched_prompts": r.mismatched_prompts, "tokens_per_s": r.tokens_per_s,
                "speedup": r.speedup, "aux": man.get("aux"), "seconds_incl_engine_start": round(time.perf_counter() - t, 1)}
            print(engine, drafter, "tau", r.tau, "lossless", r.lossless, "aux", (man.get("aux") or {}).get("boundaries"),
                  flush=True)
    for d in ("drafter-matched", "drafter-after-layer"):
        h, v = res["bench"][f"hf/{d}"]["tau"], res["bench"][f"vllm/{d}"]["tau"]
        res["bench"][f"tau_gap/{d}"] = {"hf": h, "vllm": v, "relative": (v - h) / h}

    # 3. nested ids only: what vLLM's V2 (default) and V1 runners really feed
    nested = root / "models" / "drafter-nested-1-3-6"
    if nested.exists():
        shutil.rmtree(nested)
    shutil.copytree(pair / "drafter-matched", nested)
    cfg = json.loads((nested / "config.json").read_text())
    cfg.pop("eagle_aux_hidden_state_layer_ids", None)
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 3, 6], "use_aux_hidden_state": True}
    (nested / "config.json").write_text(json.dumps(cfg, indent=1))
    res["nested_ids"] = {"config": "eagle_config.eagle_aux_hidden_state_layer_ids = [1, 3, 6], none at top level"}
    for runner in ("v2", "v1"):
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
        s = BenchSettings(target=target, drafter=str(nested), prompts=prompts, num_spec_tokens=4, repeats=1,
                          limit=min(8, n_bench), max_new_tokens=max_new, dtype="bf16", engine="vllm", runner=runner,
                          engine_options={"gpu_memory_utilization": 0.2, "max_model_len": 2048})
        r = run_bench(s, name=f"h200-toy-vllm-nested-{runner}", root=root, progress=False)
        man = json.loads((r.path / "manifest.json").read_text())
        res["nested_ids"][runner] = {"run": r.run_id, "tau": r.tau, "aux": man.get("aux")}
        print("nested", runner, man.get("aux"), r.tau, flush=True)
    os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)

    rec = out / "recorded"
    rec.mkdir(exist_ok=True)
    units = [u for u in V.RECORDING if u["k"] == 4][:24]
    (rec / "vllm_metrics.json").write_text(json.dumps({"recorded": res["env"], "k": 4, "units": units}, indent=1))
    cases = []
    for key, b in list(res["bench"].items()) + [(f"nested/{k}", v) for k, v in res["nested_ids"].items()
                                                 if isinstance(v, dict)]:
        aux = (b or {}).get("aux") or {}
        if aux.get("engine_ids"):
            cases.append({"case": key, "n_layers": 8, "aux_layers": aux["engine_ids"], "boundaries": aux["boundaries"],
                          "predicted": aux.get("predicted")})
    (rec / "vllm_engine_info.json").write_text(json.dumps({"recorded": res["env"], "cases": cases}, indent=1))
    return res


def speed(out: Path, root: Path, n_prompts: int, prompt_len: int, repeats: int) -> dict:
    import torch

    from backend.capture import _finish
    from backend.engines import vllm as V
    from backend.engines.serving import rebuild_capture
    from backend.store.rundir import RunDir

    mdir = root / "models" / "llama-3.1-8b-shape"
    mdir.mkdir(parents=True, exist_ok=True)
    (mdir / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001}))
    g = torch.Generator().manual_seed(0)
    seqs = torch.randint(1000, 120000, (n_prompts, prompt_len), generator=g).tolist()
    tokens = n_prompts * prompt_len
    opts = V.EngineOptions(gpu_memory_utilization=0.4, max_model_len=prompt_len + 64, dtype="bfloat16",
                           load_format="dummy", extra={"enable_prefix_caching": False})
    res: dict = {"env": env_info(), "model": "Llama-3.1-8B shape, random bf16 (load_format=dummy)",
                 "prompts": n_prompts, "prompt_tokens": prompt_len, "tokens": tokens, "repeats": repeats}

    def timed(llm, label):
        V.prefill(llm, seqs[:4])                                     # warm-up
        ts = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            ts.append(V.prefill(llm, seqs))
        res[label] = {"seconds": [round(x, 4) for x in ts], "median_s": round(statistics.median(ts), 4),
                      "tokens_per_s": round(tokens / statistics.median(ts))}
        print(label, res[label], flush=True)
        return statistics.median(ts)

    compiled = V.make_llm(str(mdir), opts, eager=False)
    base = timed(compiled, "plain_prefill_compiled")
    V.shutdown(compiled)
    del compiled

    eager = V.make_llm(str(mdir), opts, capture=True)
    timed(eager, "plain_prefill_eager")
    sets = {"eagle_set": ["S_2", "S_16", "S_29", "S_32"], "all_33": [f"S_{i}" for i in range(33)]}
    for name, labels in sets.items():
        V.install(eager, labels, sample_tokens=512, sample_per_prompt=64)
        t = timed(eager, f"capture_{name}")
        got = V.collect(eager)
        torch.cuda.synchronize()
        # one run's worth of files, written as a capture run writes them: bytes per token
        rd = RunDir.create(f"h200-speed-{name}", {"kind": "capture", "engine": "vllm", "boundaries": labels,
                                                  "model": {"path": str(mdir), "n_layers": 32, "hidden_size": 4096}},
                           root)
        stats, sample = rebuild_capture(got, 4096, 512, 64)
        _finish(rd, stats, sample, labels, int(got["tokens_seen"]), n_prompts * repeats + 4, t, root)
        size = sum(f.stat().st_size for f in rd.path.iterdir() if f.is_file())
        res[f"capture_{name}"].update({
            "ratio_vs_compiled": round(t / base, 4), "boundaries": len(labels),
            "tokens_seen_by_hooks": int(got["tokens_seen"]),
            "tokens_expected": tokens * repeats + 4 * prompt_len,
            "bytes_written": size, "bytes_per_token": round(size / int(got["tokens_seen"]), 3)})
        eager.collective_rpc("speclens_remove")
        print(name, res[f"capture_{name}"], flush=True)
    V.shutdown(eager)
    return res


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["toy", "speed", "all"])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/speclens-out")))
    p.add_argument("--root", type=Path, default=Path("/tmp/speclens-data"))
    p.add_argument("--capture-prompts", type=int, default=16)
    p.add_argument("--bench-prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--speed-prompts", type=int, default=64)
    p.add_argument("--speed-len", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    a.root.mkdir(parents=True, exist_ok=True)
    os.environ["SPECLENS_DATA"] = str(a.root)
    if a.what in ("toy", "all"):
        r = toy(a.out, a.root, a.capture_prompts, a.bench_prompts, a.max_new_tokens)
        (a.out / "vllm_toy.json").write_text(json.dumps(r, indent=1, default=str))
    if a.what in ("speed", "all"):
        r = speed(a.out, a.root, a.speed_prompts, a.speed_len, a.repeats)
        (a.out / "vllm_speed.json").write_text(json.dumps(r, indent=1, default=str))
    with tarfile.open(a.out / f"runs-vllm-{a.what}.tar.gz", "w:gz") as tf:
        tf.add(a.root / "runs", arcname="runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
