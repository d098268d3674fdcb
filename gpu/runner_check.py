"""Which model runner vLLM really picks, and what it then feeds an EAGLE-3 drafter:
`python gpu/runner_check.py --out DIR`.

For each case a fresh vLLM engine (its own process, so `VLLM_USE_V2_MODEL_RUNNER` can differ) starts on a shrunken
target of a real family and depth (`load_format="dummy"`, config only) with a real public drafter config whose
sizes are shrunk to the target (tests/data/real_configs; its ids are kept as written), and reports from the running
workers: the model runner class, `use_v2_model_runner`, and the aux layer ids the model adds up for the drafter.
Next to it, what SpecLens predicts for the same files, engine options and environment:
`python -m backend check-drafter --lint-only --json` (backend/vllm_runner.py decides the runner).

The cases are the ones whose runner choice depends on something other than the architecture (engine options that
V2 does not support, the environment variable), which the first H200 runs (0.24.0) did not cover. Writes
DIR/runner_check_<vLLM version>.json after every case. Needs vLLM 0.24 and a CUDA GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "tests" / "data" / "real_configs"
sys.path.insert(0, str(REPO))

TINY = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            vocab_size=4096)
TARGETS = {
    "llama-61": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 61,
                 "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "torch_dtype": "bfloat16", **TINY},
    "qwen3moe-61": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_hidden_layers": 61,
                    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128, "decoder_sparse_step": 1,
                    "mlp_only_layers": [], "norm_topk_prob": True, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
                    "max_position_embeddings": 2048, "torch_dtype": "bfloat16", "tie_word_embeddings": False, **TINY},
    "llama-32": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32,
                 "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "torch_dtype": "bfloat16", **TINY},
    "qwen3-36": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 36,
                 "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 2048, "torch_dtype": "bfloat16",
                 "tie_word_embeddings": False, **TINY},
    "deepseekv3-61": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": 61,
                      "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
                      "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 4096, "n_routed_experts": 8,
                      "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
                      "first_k_dense_replace": 3, "moe_layer_freq": 1, "kv_lora_rank": 64, "q_lora_rank": 96,
                      "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "routed_scaling_factor": 2.5,
                      "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True,
                      "rms_norm_eps": 1e-6, "rope_theta": 10000, "max_position_embeddings": 2048,
                      "torch_dtype": "bfloat16", "tie_word_embeddings": False},
}
# name -> (target, drafter config file, engine options, environment, enforce_eager)
CASES = {
    "llama61_nested_stock_compile": ("llama-61", "specforge_deepseek-v3-671b.json", {"compilation_config": {"mode": 1}},
                                     {}, False),
    "llama61_nested_raw_logits": ("llama-61", "specforge_deepseek-v3-671b.json", {"logprobs_mode": "raw_logits"}, {},
                                  True),
    "llama61_nested_prompt_embeds": ("llama-61", "specforge_deepseek-v3-671b.json", {"enable_prompt_embeds": True}, {},
                                     True),
    "qwen3moe61_nested_env_v2": ("qwen3moe-61", "specforge_deepseek-v3-671b.json", {},
                                 {"VLLM_USE_V2_MODEL_RUNNER": "1"}, True),
    "deepseekv3_61_nested_env_v2": ("deepseekv3-61", "specforge_deepseek-v3-671b.json", {},
                                    {"VLLM_USE_V2_MODEL_RUNNER": "1"}, True),
    "deepseekv3_61_nested": ("deepseekv3-61", "specforge_deepseek-v3-671b.json", {}, {}, True),
    # the architecture-only cases of docs/CONVENTIONS.md#vllm-runner (seen on 0.24.0): for other releases
    "llama61_nested": ("llama-61", "specforge_deepseek-v3-671b.json", {}, {}, True),
    "llama32_none": ("llama-32", "specforge_llama3-8b.json", {}, {}, True),
    "qwen3_36_none": ("qwen3-36", "sglang_test_qwen3-8b-eagle3.json", {}, {}, True),
    "qwen3moe61_nested": ("qwen3moe-61", "specforge_deepseek-v3-671b.json", {}, {}, True),
    "deepseekv3_61_kimi_none": ("deepseekv3-61", "torchspec_kimi-k25-eagle3.json", {}, {}, True),
}
OPTION_CASES = ["llama61_nested_stock_compile", "llama61_nested_raw_logits", "llama61_nested_prompt_embeds",
                "qwen3moe61_nested_env_v2", "deepseekv3_61_nested_env_v2", "deepseekv3_61_nested"]


def make_models(work: Path, case: str) -> tuple[Path, Path]:
    target_name, drafter_file, *_ = CASES[case]
    t = work / target_name
    t.mkdir(parents=True, exist_ok=True)
    (t / "config.json").write_text(json.dumps(TARGETS[target_name], indent=1))
    raw = json.loads((CONFIGS / drafter_file).read_text())
    tcfg = TARGETS[target_name]
    raw.update(hidden_size=tcfg["hidden_size"], intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
               head_dim=64, vocab_size=tcfg["vocab_size"], draft_vocab_size=1024)    # sizes only; ids as written
    d = work / f"drafter-{Path(drafter_file).stem}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(raw, indent=1))
    return t, d


def engine_case(case: str, work: Path) -> dict:
    """In a child process: start vLLM, read what the running workers do, exit."""
    from vllm import LLM

    _, _, opts, _, eager = CASES[case]
    t, d = make_models(work, case)
    t0 = time.perf_counter()
    llm = LLM(model=str(t), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", enforce_eager=eager,
              gpu_memory_utilization=0.15, max_model_len=512, seed=0,
              worker_extension_cls="backend.engines.vllm_worker.SpecLensWorker",
              speculative_config={"method": "eagle3", "model": str(d), "num_speculative_tokens": 3}, **opts)
    start = time.perf_counter() - t0
    info = llm.collective_rpc("speclens_model_info")[0]
    return {"start_s": round(start, 1), **info}


def predicted(case: str, work: Path) -> dict:
    _, _, opts, env, _ = CASES[case]
    t, d = make_models(work, case)
    try:                                    # predict for the installed release (the table covers vLLM 0.20..0.33)
        from importlib.metadata import version as _version
        release = ["--engine-version", _version("vllm")]
    except Exception:  # noqa: BLE001 - no vLLM here: the default release
        release = []
    cmd = [sys.executable, "-m", "backend", "check-drafter", "--drafter", str(d), "--target", str(t), "--lint-only",
           "--json", *release, *sum((["--engine-option", f"{k}={json.dumps(v)}"] for k, v in opts.items()), [])]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "SPECLENS_DATA": str(work / "data"), **env})
    if out.returncode:
        return {"error": out.stderr.strip()[-800:]}
    rep = json.loads(out.stdout)
    return {"runner": rep["runner_choice"]["runner"], "reason": rep["runner_choice"]["reason"],
            "boundaries": rep["engine_feeds"]["boundaries"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results")
    ap.add_argument("--only", help="comma-separated case names (default: the option- and env-dependent ones)")
    ap.add_argument("--case", help=argparse.SUPPRESS)           # child mode
    ap.add_argument("--work", default="/tmp/runner_check")
    ap.add_argument("--timeout", type=int, default=240)
    a = ap.parse_args()
    work = Path(a.work)
    if a.case:
        print("RESULT " + json.dumps(engine_case(a.case, work)), flush=True)
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    import vllm
    res = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "vllm": vllm.__version__, "command": " ".join(["python"] + sys.argv), "cases": {}}
    env0 = {**os.environ, "VLLM_ALLOW_INSECURE_SERIALIZATION": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env0.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    for case in (a.only.split(",") if a.only else OPTION_CASES):
        target, drafter, opts, env, eager = CASES[case]
        row = {"target": target, "drafter_config": drafter, "options": opts, "env": env,
               "target_config": TARGETS[target], "predicted": predicted(case, work)}
        t0 = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, __file__, "--case", case, "--work", str(work)], cwd=REPO,
                               capture_output=True, text=True, timeout=a.timeout, env={**env0, **env})
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
            err = (p.stderr or p.stdout)
            cause = [ln for ln in err.splitlines() if "Error" in ln or "error" in ln][-12:]
            row["engine"] = json.loads(line[7:]) if line else {"error": err[-3000:], "error_lines": cause}
        except subprocess.TimeoutExpired:
            row["engine"] = {"error": f"timed out after {a.timeout} s"}
        row["seconds"] = round(time.perf_counter() - t0, 1)
        eng, pred = row["engine"], row["predicted"]
        if "aux_layers" in eng and eng["aux_layers"] and "boundaries" in pred:
            fed = [f"S_{i}" for i in sorted(eng["aux_layers"])]
            row["engine_feeds"] = fed
            row["agree"] = fed == pred["boundaries"] and (eng.get("use_v2_model_runner") == (pred["runner"] == "v2"))
        res["cases"][case] = row
        print(case, json.dumps({k: row.get(k) for k in ("engine_feeds", "agree", "seconds")}), flush=True)
        tmp = out / f"runner_check_{vllm.__version__}.json.tmp"
        tmp.write_text(json.dumps(res, indent=1))
        os.replace(tmp, out / f"runner_check_{vllm.__version__}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
