"""Serving load on a GPU node, for real: `python gpu/load_suite.py STEP --out DIR [--root DATA]`.

STEPs (each writes DIR/<step>.json and leaves its runs under the data root):
  pair       the toy pair served by vLLM or SGLang (--engine): a baseline server and a K=4 drafter server started
             here, a SpecLens load bench against them (`bench --server-url/--baseline-url`) at --concurrency, then
             `vllm bench serve` (vLLM only) on the same two servers at the same concurrencies, same prompts file
             (spec_bench dataset, ignore_eos, the same output length), and recordings for the CPU tests: /metrics
             texts before and after a level, a few raw streamed responses (DIR/recorded/).
  sweep      the toy pair, K x concurrency (`python -m backend sweep`), every server started at once.
  synthetic  a target of a real model's --shape (Llama-3.1-8B; gpt-oss-20b, an MoE) and an EAGLE-3 drafter for it,
             weights random (load_format dummy), vLLM's synthetic acceptance at --taus x --concurrency: the speedup
             ceiling for a better drafter.
  watch      a K=4 toy-pair vLLM server under a load generator for --minutes; `python -m backend watch` on it (and
             the raw /metrics text every --interval s, for the CPU tests); after --switch-after minutes the load
             changes to prompts the drafter was not trained on (token soup), a real drop of acceptance.

Needs vLLM 0.24 (or SGLang 0.5.15 for --engine sglang) and a CUDA GPU; the toy pair is models/toy-pair.tar.gz.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import traceback
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from backend.options import SERVING_ENGINES  # noqa: E402  (the repository is on sys.path now)

os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                          if p and p != str(REPO)])
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
PROMPTS = REPO / "datasets" / "spec_bench" / "question.jsonl"


def toy_pair(root: Path) -> Path:
    out = root / "models" / "toy-pair"
    if not (out / "target" / "config.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        with tarfile.open(REPO / "models" / "toy-pair.tar.gz") as t:
            t.extractall(out)
    return out


def env_info() -> dict:
    import platform

    info = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "host": platform.node(), "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        import torch
        info.update(torch=torch.__version__, gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    except Exception as e:  # noqa: BLE001
        info["torch"] = f"unavailable: {e}"
    for mod in SERVING_ENGINES:                  # each engine's package is named as the engine
        try:
            from importlib.metadata import version
            info[mod] = version(mod)
        except Exception:  # noqa: BLE001
            pass
    return info


def save(out: Path, name: str, obj: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{name}.tmp"
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, out / name)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode(errors="replace")


def pair(a, out: Path, root: Path) -> dict:
    from backend.engines.server_process import ServerGroup, sglang_spec, vllm_spec
    from backend.load_bench import LoadSettings, run_load
    from backend.store.data_root import DataRoot

    tp = toy_pair(root)
    target, drafter = str(tp / "target"), str(tp / "drafter-matched")
    mk = vllm_spec if a.engine == "vllm" else sglang_spec
    kw = {"gpu_memory_utilization": a.memory} if a.engine == "vllm" else {"mem_fraction": a.memory}
    kw["options"] = a.opts
    res: dict = {"env": env_info(), "engine": a.engine}
    rec = out / "recorded"
    rec.mkdir(parents=True, exist_ok=True)
    with ServerGroup([mk(target, None, **kw), mk(target, drafter, 4, **kw)], root / "servers-pair") as (base, spec):
        res["start_seconds"] = [base.start_seconds, spec.start_seconds]
        res["urls"] = [base.url, spec.url]
        (rec / f"{a.engine}_metrics_idle.txt").write_text(_get(spec.url + "/metrics"))
        s = LoadSettings(engine=a.engine, target=target, drafter=drafter, prompts=str(PROMPTS),
                         num_spec_tokens=[4], concurrency=a.concurrency, max_tokens=a.max_tokens, repeats=a.repeats,
                         server_url=spec.url, baseline_url=base.url, requests=a.requests)
        t0 = time.time()
        r = run_load(s, name=f"{gpu_tag()}-{a.engine}-pair", data=DataRoot(root), progress=False)
        res["speclens"] = {"run_id": r.run_id, "seconds": time.time() - t0, "summary": r.summary}
        (rec / f"{a.engine}_metrics_after_bench.txt").write_text(_get(spec.url + "/metrics"))
        _record_streams(a.engine, spec.url, target, rec)
        if a.engine == "vllm":
            res["vllm_bench_serve"] = _vllm_bench_serve(base.url, spec.url, target, a, out)
        (rec / f"{a.engine}_metrics_end.txt").write_text(_get(spec.url + "/metrics"))
    return res


def _record_streams(engine: str, url: str, target: str, rec: Path) -> None:
    """Three raw streamed responses of the drafter server (the bytes as sent), for the client's CPU tests."""
    from backend.engines.base import target_info
    from backend.load_client import served_model
    from backend.prompts import encode, load_prompts

    tok = target_info(target).tokenizer
    ps = load_prompts(PROMPTS, 3)
    model = served_model(url) if engine == "vllm" else None
    for i, p in enumerate(ps):
        ids = encode(tok, p.text)
        if engine == "vllm":
            body = {"model": model, "prompt": ids, "max_tokens": 32, "temperature": 0.0, "stream": True,
                    "ignore_eos": True, "return_token_ids": True,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
            path = "/v1/completions"
        else:
            body = {"input_ids": ids, "stream": True,
                    "sampling_params": {"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True}}
            path = "/generate"
        req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
        (rec / f"{engine}_stream_{i}.json").write_text(json.dumps({"request": body, "path": path,
                                                                   "response": raw.decode(errors="replace")}))


def _vllm_bench_serve(base_url: str, spec_url: str, target: str, a, out: Path) -> dict:
    """`vllm bench serve` on the same servers: spec_bench prompts, the same output length, ignore_eos."""
    res: dict = {}
    for side, url in (("baseline", base_url), ("drafter", spec_url)):
        for c in a.concurrency:
            n = a.requests or max(16, 4 * c)
            fn = f"vbs_{side}_c{c}.json"
            cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
                   "--base-url", url, "--endpoint", "/v1/completions", "--model", _model(url), "--tokenizer", target,
                   "--dataset-name", "spec_bench", "--dataset-path", str(PROMPTS), "--spec-bench-output-len",
                   str(a.max_tokens), "--num-prompts", str(n), "--max-concurrency", str(c), "--ignore-eos",
                   "--save-result", "--result-dir", str(out / "vbs"), "--result-filename", fn,
                   "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,90,99", "--seed", "0"]
            t0 = time.time()
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            entry: dict = {"rc": p.returncode, "seconds": time.time() - t0, "cmd": " ".join(cmd)}
            try:
                d = json.loads((out / "vbs" / fn).read_text())
                entry.update({k: d.get(k) for k in ("output_throughput", "request_throughput", "median_ttft_ms",
                                                    "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms",
                                                    "completed", "total_output_tokens", "duration",
                                                    "spec_decode_acceptance_length", "spec_decode_acceptance_rate")})
                entry["keys"] = sorted(d)[:80]
            except (OSError, json.JSONDecodeError):
                entry["stderr_tail"] = p.stderr[-1500:]
                entry["stdout_tail"] = p.stdout[-1500:]
            res[f"{side}_c{c}"] = entry
    return res


def _model(url: str) -> str:
    return json.loads(_get(url + "/v1/models"))["data"][0]["id"]


def sweep(a, out: Path, root: Path) -> dict:
    from backend.load_bench import LoadSettings, run_load
    from backend.store.data_root import DataRoot

    tp = toy_pair(root)
    s = LoadSettings(engine=a.engine, target=str(tp / "target"), drafter=str(tp / "drafter-matched"),
                     prompts=str(PROMPTS), num_spec_tokens=a.ks, concurrency=a.concurrency, max_tokens=a.max_tokens,
                     repeats=a.repeats, memory=a.memory, requests=a.requests, engine_options=a.opts)
    t0 = time.time()
    r = run_load(s, name=f"{gpu_tag()}-{a.engine}-sweep", data=DataRoot(root), progress=False)
    return {"env": env_info(), "run_id": r.run_id, "seconds": time.time() - t0, "summary": r.summary}


# Real public configs of targets served with EAGLE-3 (weights: vLLM's dummy ones). gpt-oss-20b: the MoE shape
# (24 layers, 32 experts, 4 active, MXFP4 experts as published); deepseek-v2-lite: an MLA + MoE fallback.
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "pad_token_id": 199999, "experts_per_token": 4, "num_experts_per_tok": 4,
    "num_local_experts": 32, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 2880,
    "initial_context_length": 4096, "initializer_range": 0.02,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "num_attention_heads": 64, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "output_router_logits": False, "rms_norm_eps": 1e-5, "rope_theta": 150000, "sliding_window": 128,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "router_aux_loss_coef": 0.9, "swiglu_limit": 7.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 201088,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                      "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}}
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 2048,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2,
    "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512, "q_lora_rank": None,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 102400, "n_group": 1,
    "topk_group": 1, "topk_method": "greedy", "scoring_func": "softmax", "norm_topk_prob": False,
    "routed_scaling_factor": 1.0, "aux_loss_alpha": 0.001, "max_position_embeddings": 163840, "rms_norm_eps": 1e-6,
    "rope_theta": 10000, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                                          "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                                          "type": "yarn"},
    "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 100000,
    "eos_token_id": 100001}
LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001}
LLAMA_8B_EAGLE3 = {
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 1,
    "vocab_size": 128256, "draft_vocab_size": 32000, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "target_hidden_size": 4096}
REAL_CONFIGS = REPO / "tests" / "data" / "real_configs"
# shape -> (target config, drafter config: a dict or a committed public drafter config, run-name tag)
SHAPES = {
    "llama-3.1-8b": (LLAMA_8B, LLAMA_8B_EAGLE3, "8b"),
    "gpt-oss-20b": (GPT_OSS_20B, REAL_CONFIGS / "specforge_gpt-oss-20b.json", "gptoss20b"),
    "deepseek-v2-lite": (DEEPSEEK_V2_LITE, REAL_CONFIGS / "specforge_deepseek-v2-lite.json", "dsv2lite"),
}


def shaped_pair(root: Path, shape: str) -> tuple[Path, Path]:
    """A target of a real model's shape and an EAGLE-3 drafter for it (configs only: weights are vLLM's dummy ones);
    the toy tokenizer goes beside them for SpecLens's own prompt encoding (the servers skip tokenizer init)."""
    target_cfg, drafter_cfg, _ = SHAPES[shape]
    t, d = root / "models" / f"{shape}-shape", root / "models" / f"{shape}-shape-eagle3"
    for p in (t, d):
        p.mkdir(parents=True, exist_ok=True)
    (t / "config.json").write_text(json.dumps(target_cfg))
    drafter = json.loads(drafter_cfg.read_text()) if isinstance(drafter_cfg, Path) else drafter_cfg
    (d / "config.json").write_text(json.dumps(drafter))
    tp = toy_pair(root) / "target"
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tp / f).exists():
            shutil.copy(tp / f, t / f)
    return t, d


def gpu_tag() -> str:
    """"h100" / "h200" from the device name: the run names say which card measured them."""
    try:
        import torch
        name = torch.cuda.get_device_name(0).lower()
    except Exception:  # noqa: BLE001
        return "gpu"
    return next((t for t in ("h200", "h100", "a100", "l40s") if t in name), "gpu")


def synthetic(a, out: Path, root: Path) -> dict:
    from backend.load_bench import LoadSettings, run_load
    from backend.store.data_root import DataRoot

    t, d = shaped_pair(root, a.shape)
    s = LoadSettings(engine="vllm", target=str(t), drafter=str(d), prompts=str(PROMPTS), num_spec_tokens=[a.k],
                     synthetic_tau=a.taus, concurrency=a.concurrency, max_tokens=a.max_tokens, repeats=a.repeats,
                     memory=a.memory, load_format="dummy", requests=a.requests, start_together=not a.one_at_a_time,
                     engine_options={"skip-tokenizer-init": True, "max-model-len": 4096, **a.opts})
    t0 = time.time()
    r = run_load(s, name=f"{gpu_tag()}-vllm-synthetic-{SHAPES[a.shape][2]}", data=DataRoot(root), progress=False)
    return {"env": env_info(), "shape": a.shape, "run_id": r.run_id, "seconds": time.time() - t0,
            "summary": r.summary}


def watch(a, out: Path, root: Path) -> dict:
    from backend.engines.base import target_info
    from backend.engines.server_process import ServerGroup, vllm_spec
    from backend.load_client import run_level, served_model
    from backend.prompts import encode_all, load_prompts

    tp = toy_pair(root)
    target = str(tp / "target")
    tok = target_info(target).tokenizer
    ps = load_prompts(PROMPTS)
    good = encode_all(tok, ps, PROMPTS)
    rng = random.Random(0)
    soup = [[rng.randrange(10, 4000) for _ in range(64)] for _ in range(64)]     # not text: the drafter guesses
    res: dict = {"env": env_info(), "minutes": a.minutes, "switch_after_min": a.switch_after}
    raw = out / "watch_raw"
    raw.mkdir(parents=True, exist_ok=True)
    with ServerGroup([vllm_spec(target, str(tp / "drafter-matched"), 4, gpu_memory_utilization=a.memory)],
                     root / "servers-watch") as (srv,):
        model = served_model(srv.url)
        stop = time.time() + a.minutes * 60
        switch = time.time() + a.switch_after * 60
        sent = {"good": 0, "soup": 0}

        def load() -> None:
            while time.time() < stop:
                which = "soup" if time.time() > switch else "good"
                seqs = soup if which == "soup" else good
                c = rng.choice([1, 4, 8, 16])
                order = [rng.randrange(len(seqs)) for _ in range(2 * c)]
                run_level("vllm", srv.url, seqs, order, c, 96, 0.0, model)
                sent[which] += len(order)

        def scrape() -> None:
            i = 0
            while time.time() < stop + a.interval:
                try:
                    (raw / f"vllm_metrics_{i:04d}.txt").write_text(_get(srv.url + "/metrics"))
                except OSError:
                    pass
                i += 1
                time.sleep(a.interval)

        th = [threading.Thread(target=load, daemon=True), threading.Thread(target=scrape, daemon=True)]
        for x in th:
            x.start()
        cmd = [sys.executable, "-m", "backend", "watch", "--server-url", srv.url, "--interval", str(a.interval),
               "--duration", str(a.minutes * 60), "--name", "h200-vllm-watch"]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, SPECLENS_DATA=str(root)), cwd=str(REPO))
        for x in th:                     # the load and the raw scrapes run their full time whatever watch does
            x.join()
        try:
            so, se = p.communicate(timeout=a.interval * 3 + 30)
        except subprocess.TimeoutExpired:
            p.terminate()
            so, se = p.communicate()
        res.update(watch_rc=p.returncode, watch_stdout=so[-4000:], watch_stderr=se[-4000:], sent=sent)
    return res


def pack(out: Path, root: Path, name: str) -> None:
    """The run directories (no server logs bigger than 2 MB) as one tarball in DIR."""
    with tarfile.open(out / f"{name}.tar.gz", "w:gz") as t:
        runs = root / "runs"
        if runs.exists():
            for rd in runs.iterdir():
                for f in rd.rglob("*"):
                    if f.is_file() and f.stat().st_size < 2 * 2**20:
                        t.add(f, arcname=str(f.relative_to(root)))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("step", choices=["pair", "sweep", "synthetic", "watch"])
    p.add_argument("--out", required=True)
    p.add_argument("--root", default="/tmp/speclens-load")
    p.add_argument("--engine", default="vllm", choices=list(SERVING_ENGINES))
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--ks", default="1,2,4,6")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--taus", default="1,2,3,4")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--requests", type=int)
    p.add_argument("--memory", type=float, default=0.08)
    p.add_argument("--minutes", type=float, default=11)
    p.add_argument("--switch-after", type=float, default=7)
    p.add_argument("--interval", type=float, default=15)
    p.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES), help="synthetic: the target's shape")
    p.add_argument("--one-at-a-time", action="store_true", help="one baseline kept beside one drafter server at a time")
    p.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help="a server flag (all servers)")
    a = p.parse_args()
    from backend.bench_cli import engine_options
    a.opts = engine_options(a.opt)
    a.concurrency = [int(x) for x in a.concurrency.split(",")]
    a.ks = [int(x) for x in a.ks.split(",")]
    a.taus = [float(x) for x in a.taus.split(",")]
    out, root = Path(a.out), Path(a.root)
    os.environ["SPECLENS_DATA"] = str(root)
    fn = {"pair": pair, "sweep": sweep, "synthetic": synthetic, "watch": watch}[a.step]
    name = {"pair": f"pair_{a.engine}", "sweep": f"sweep_{a.engine}", "synthetic": f"synthetic_{a.shape}"}.get(a.step,
                                                                                                   a.step)
    t0 = time.time()
    try:
        res = fn(a, out, root)
    except BaseException as e:  # noqa: BLE001 - record and go on: the device time is spent either way
        res = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-6000:]}
    res["wall_s"] = time.time() - t0
    save(out, f"{name}.json", res)
    pack(out, root, f"runs_{name}")
    print(json.dumps({k: v for k, v in res.items() if k in ("error", "wall_s", "run_id", "watch_rc")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
