"""vLLM on a GPU node, for real: `python gpu/vllm_suite.py toy|speed|all --out DIR`.

toy   (the toy pair shipped in models/toy-pair.tar.gz; minutes)
      1. HF capture vs vLLM capture of the same target weights and prompts: alignment verdict, per-boundary cosine,
         and the aux ids vLLM's running model adds up mapped to boundaries; vLLM's own `extract_hidden_states`
         of ids [2, 4, 5, 8] against the same HF capture;
      2. the toy pair through vLLM against the HF reference engine (same GPU, bf16): tau at K=4, greedy, on the
         held-out Spec-Bench prompts, per-position rates side by side, lossless check;
      3. a drafter config with nested ids only: what vLLM really feeds it (read from the live model), with the V2
         runner (default) and the V1 runner, next to what SpecLens predicted from the config.
speed (a Llama-3.1-8B-shaped target with random bf16 weights, load_format="dummy"; 64 prompts x 2048 tokens)
      plain prefill (compiled, max_tokens=1) vs the same in eager mode vs SpecLens capture with streaming statistics
      of the EAGLE set (S_2, S_16, S_29, S_32) and of all 33 boundaries S_0..S_32; bytes written per token;
      then the same captures in the compiled engine (`--engine-option compiled=true`: vLLM's aux outputs armed at
      load, no CUDA graphs) against plain compiled prefill, both engines up at once and their runs interleaved,
      with the compiled capture's statistics compared to the eager hooks' of the same tokens.

Every experiment (step) runs on its own: an exception is recorded as `{"error": ..., "traceback": ...}` under the
step's key and the suite goes on; DIR/vllm_<section>.json is rewritten after every step, so a run killed at its
time limit still leaves what finished. `--only a,b` runs only the named steps (names: see STEPS), `--budget-s S`
skips the steps that would start after S seconds (the packing at the end always runs).

Writes DIR/vllm_toy.json, DIR/vllm_speed.json, DIR/recorded/* (metric snapshots and engine info for the CPU tests)
and DIR/runs-vllm-<what>.tar.gz (the run directories of this invocation, for the dashboard; split into
`.partNN` files of at most 15 MiB when larger: `cat runs-vllm-<what>.tar.gz.part* > runs.tar.gz`). The speed runs'
sample.safetensors (hundreds of MB of random-weight states) are left out of the tarball. Needs vLLM 0.24 and a
CUDA GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tarfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# the engine core (and its worker, which imports backend.engines.vllm_worker) is a spawned child process
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                          if p and p != str(REPO)])
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")

STEPS = {
    "toy": ["capture_hf", "capture_vllm", "extract", "bench_hf_matched", "bench_hf_after_layer",
            "bench_vllm_matched", "bench_vllm_after_layer", "nested_v2", "nested_v1", "recorded"],
    "speed": ["plain_prefill_compiled", "plain_prefill_eager", "capture_eagle_set", "capture_all_33",
              "capture_eagle_set_compiled_stats", "capture_all_33_compiled_stats",
              "capture_eagle_set_compiled", "capture_all_33_compiled"],
}
PART_BYTES = 15 * 1024 * 1024          # files back from $OUT: at most 8, 16 MiB each, 64 MiB together
MAX_OUT_FILES = 8


def env_info() -> dict:
    info = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "python": platform.python_version(), "command": " ".join(["python"] + sys.argv)}
    for key, get in (("torch", lambda: __import__("torch").__version__),
                     ("gpu", lambda: __import__("torch").cuda.get_device_name(0)),
                     ("transformers", lambda: __import__("transformers").__version__),
                     ("vllm", lambda: __import__("vllm").__version__)):
        try:
            info[key] = get()
        except Exception as e:          # recorded, never fatal
            info[key] = f"unavailable: {type(e).__name__}: {str(e)[:200]}"
    return info


def atomic_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def _gpu_cleanup() -> None:
    gc.collect()
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:
        pass


class Section:
    """One section's results (DIR/vllm_<name>.json), rewritten after every step; a failing step records its error
    and the suite goes on."""

    def __init__(self, name: str, out: Path, only: set[str] | None, deadline: float | None):
        self.name, self.path, self.only, self.deadline = name, out / f"vllm_{name}.json", only, deadline
        self.res: dict = {"env": env_info(), "steps": {}}
        self.save()

    def save(self) -> None:
        try:
            atomic_json(self.path, self.res)
        except Exception as e:          # never lose the run over a results file
            print(f"[{self.name}] could not write {self.path}: {e}", flush=True)

    def wanted(self, step: str) -> bool:
        return self.only is None or step in self.only

    def run(self, step: str, fn, *args, **kwargs):
        """fn's return value (a dict, stored under res[step]), or None when it failed or was skipped."""
        if not self.wanted(step):
            return None
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.res["steps"][step] = {"status": "skipped", "why": "time budget (--budget-s) spent"}
            self.save()
            print(f"[{self.name}] {step}: skipped (time budget)", flush=True)
            return None
        print(f"[{self.name}] {step}: start", flush=True)
        t = time.perf_counter()
        try:
            out = fn(*args, **kwargs)
            self.res["steps"][step] = {"status": "ok", "seconds": round(time.perf_counter() - t, 2)}
            if out is not None:
                self.res[step] = out
            print(f"[{self.name}] {step}: ok ({time.perf_counter() - t:.1f} s)", flush=True)
            return out
        except KeyboardInterrupt:
            self.res["steps"][step] = {"status": "interrupted", "seconds": round(time.perf_counter() - t, 2)}
            raise
        except BaseException as e:      # SystemExit from a library too: record it, go on
            tb = traceback.format_exc()
            self.res["steps"][step] = {"status": "error", "seconds": round(time.perf_counter() - t, 2),
                                       "error": f"{type(e).__name__}: {str(e)[:2000]}",
                                       "traceback": tb[-6000:]}
            print(f"[{self.name}] {step}: ERROR {type(e).__name__}: {str(e)[:500]}\n{tb[-3000:]}", flush=True)
            return None
        finally:
            _gpu_cleanup()
            self.save()


def _verdict(al) -> list[dict]:
    return [{"kind": f.kind, "text": f.text} for f in al.verdict]


# ---------------------------------------------------------------------------------------------------- toy

# KV cache sizes fixed up front (`kv_cache_memory_bytes`): vLLM then skips the memory profiling whose check fails
# when another process on the same GPU (a training job, an SGLang server) frees memory meanwhile. 0 GiB: profile.
KV_CACHE: dict = {}
KV_CACHE_SPEED: dict = {}


def toy(sec: Section, out: Path, root: Path, n_capture: int, n_bench: int, max_new: int) -> None:
    from backend import align
    from backend.bench import BenchSettings, run_bench
    from backend.capture import CaptureSettings, run_capture
    from backend.demo import heldout_prompts, toy_pair
    from backend.engines import vllm as V
    from backend.options import IN_PROCESS_ENGINE
    from backend.store.data_root import DataRoot
    from backend.store.rundir import COMPLETE

    data = DataRoot(root)
    pair = toy_pair(data)
    if pair is None:
        sec.res["error"] = "models/toy-pair.tar.gz is missing from the checkout; no toy experiments"
        sec.save()
        return
    prompts = str(heldout_prompts(pair))
    target = str(pair / "target")
    sec.res.update({"pair": str(pair), "prompts": "held-out Spec-Bench rows (TRAINING.json)"})
    # the toy target allows 4096 positions; prompts are cut at 2048 tokens (+ max_new + K + 1 must fit)
    max_len = 4096
    eng_opts = {"gpu_memory_utilization": 0.2, "max_model_len": max_len, **KV_CACHE}
    V.RECORDING = []
    st: dict = {}

    # 1. captures: HF (reference hooks) vs vLLM (hooks inside the worker), same weights, same prompt tokens
    def capture_hf():
        t = time.perf_counter()
        r = run_capture(CaptureSettings(model=target, prompts=prompts, engine="hf", limit=n_capture, device="cuda",
                                        dtype="bf16"), name="h200-toy-capture-hf", data=data, progress=False)
        st["hf_cap"] = r
        return {"run": r.run_id, "tokens": r.tokens, "seconds": round(time.perf_counter() - t, 2)}

    def capture_vllm():
        t = time.perf_counter()
        r = run_capture(CaptureSettings(model=target, prompts=prompts, engine="vllm", limit=n_capture, dtype="bf16"),
                        name="h200-toy-capture-vllm", data=data, progress=False,
                        engine_options=V.VllmOptions(gpu_memory_utilization=0.2, max_model_len=max_len,
                                                       dtype="bfloat16", extra=dict(KV_CACHE)))
        res = {"run": r.run_id, "tokens": r.tokens, "seconds_incl_engine_start": round(time.perf_counter() - t, 2)}
        if "hf_cap" not in st:
            res["alignment"] = "no HF capture to align with (capture_hf failed or was skipped)"
            return res
        al = align.get_alignment(st["hf_cap"].run_id, r.run_id, data)
        res.update({"hf_run": st["hf_cap"].run_id, "verdict": _verdict(al), "offset": al.offset,
                    "per_boundary": al.per_boundary, "shared_tokens": al.tokens})
        print("capture verdict:", [f.text for f in al.verdict], flush=True)
        return res

    def extract():
        t = time.perf_counter()
        ids = [2, 4, 5, 8]
        ex = V.run_extract(CaptureSettings(model=target, prompts=prompts, engine="vllm", limit=n_capture, dtype="bf16"),
                           ids, name="h200-toy-extract-vllm", data=data,
                           opts=V.VllmOptions(gpu_memory_utilization=0.2, max_model_len=max_len, dtype="bfloat16",
                                                extra=dict(KV_CACHE)),
                           progress=False)
        res = {"run": ex.run_id, "ids": ids, "tokens": ex.tokens,
               "seconds_incl_engine_start": round(time.perf_counter() - t, 2)}
        if "hf_cap" in st:
            al = align.get_alignment(st["hf_cap"].run_id, ex.run_id, data)
            res.update({"verdict": _verdict(al), "offset": al.offset, "per_boundary": al.per_boundary})
            print("extract verdict:", [f.text for f in al.verdict], flush=True)
        return res

    sec.run("capture_hf", capture_hf)
    sec.run("capture_vllm", capture_vllm)
    sec.run("extract", extract)

    # 2. benches: HF reference and vLLM, same prompts, K=4, greedy, bf16 (one vLLM baseline shared by all)
    def settings(engine: str, drafter: Path, runner: str = "v2") -> BenchSettings:
        return BenchSettings(target=target, drafter=str(drafter), prompts=prompts, num_spec_tokens=4,
                             temperature=0.0, repeats=1, limit=n_bench, max_new_tokens=max_new, device="cuda",
                             dtype="bf16", engine=engine, runner=runner,
                             engine_options=dict(eng_opts) if engine != "hf" else None)

    def bench(engine: str, drafter: str):
        t = time.perf_counter()
        r = run_bench(settings(engine, pair / drafter), name=f"h200-toy-{engine}-{drafter}", data=data, progress=False)
        if r.status != COMPLETE:
            raise RuntimeError(f"bench {r.run_id} ended with status {r.status} (baseline {r.baseline_run})")
        summ = json.loads((r.path / "summary.json").read_text())
        man = json.loads((r.path / "manifest.json").read_text())
        res = {"run": r.run_id, "baseline_run": r.baseline_run, "tau": r.tau, "acceptance_rate": r.acceptance_rate,
               "per_position_rates": (summ.get("per_position") or {}).get("rates"), "histogram": summ.get("histogram"),
               "lossless": r.lossless, "mismatched_prompts": r.mismatched_prompts, "tokens_per_s": r.tokens_per_s,
               "speedup": r.speedup, "aux": man.get("aux"), "n_layers": (man.get("model") or {}).get("n_layers"),
               "seconds_incl_engine_start": round(time.perf_counter() - t, 1)}
        print(engine, drafter, "tau", r.tau, "lossless", r.lossless, "aux",
              (man.get("aux") or {}).get("boundaries"), flush=True)
        return res

    for engine in (IN_PROCESS_ENGINE, "vllm"):                    # the reference engine, then vLLM
        for drafter, short in (("drafter-matched", "matched"), ("drafter-after-layer", "after_layer")):
            sec.run(f"bench_{engine}_{short}", bench, engine, drafter)
    gaps = {}
    for short in ("matched", "after_layer"):
        h = (sec.res.get(f"bench_hf_{short}") or {}).get("tau")
        v = (sec.res.get(f"bench_vllm_{short}") or {}).get("tau")
        if h and v is not None:
            gaps[short] = {"hf": h, "vllm": v, "relative": (v - h) / h}
    sec.res["tau_gap"] = gaps
    sec.save()

    # 3. nested ids only: what vLLM's V2 (default) and V1 runners really feed (same settings as the benches above,
    #    so their vLLM baseline run is reused instead of starting another engine)
    nested = root / "models" / "drafter-nested-1-3-6"

    def make_nested() -> None:
        if nested.exists():
            shutil.rmtree(nested)
        shutil.copytree(pair / "drafter-matched", nested)
        cfg = json.loads((nested / "config.json").read_text())
        cfg.pop("eagle_aux_hidden_state_layer_ids", None)
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 3, 6], "use_aux_hidden_state": True}
        (nested / "config.json").write_text(json.dumps(cfg, indent=1))

    def nested_run(runner: str):
        if not (nested / "config.json").exists():
            make_nested()
        old = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
        try:
            t = time.perf_counter()
            r = run_bench(settings("vllm", nested, runner), name=f"h200-toy-vllm-nested-{runner}", data=data,
                          progress=False)
            man = json.loads((r.path / "manifest.json").read_text())
            print("nested", runner, man.get("aux"), r.tau, flush=True)
            return {"config": "eagle_config.eagle_aux_hidden_state_layer_ids = [1, 3, 6], none at top level",
                    "run": r.run_id, "status": r.status, "tau": r.tau, "aux": man.get("aux"),
                    "n_layers": (man.get("model") or {}).get("n_layers"),
                    "seconds_incl_engine_start": round(time.perf_counter() - t, 1)}
        finally:
            if old is None:
                os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
            else:
                os.environ["VLLM_USE_V2_MODEL_RUNNER"] = old

    sec.run("nested_v2", nested_run, "v2")
    sec.run("nested_v1", nested_run, "v1")

    # 4. RECORDED fixtures for the CPU tests (tests/test_vllm_adapter.py)
    def recorded():
        rec = out / "recorded"
        rec.mkdir(exist_ok=True)
        units = [u for u in (V.RECORDING or []) if u["k"] == 4][:24]
        if units:       # an empty recording would fail tests/test_vllm_adapter.py once copied there
            atomic_json(rec / "vllm_metrics.json", {"recorded": sec.res["env"], "k": 4, "units": units})
        cases = []
        for key in [k for k in sec.res if k.startswith("bench_vllm_") or k.startswith("nested_")]:
            b = sec.res.get(key)
            if not isinstance(b, dict):
                continue
            aux = b.get("aux") or {}
            if aux.get("engine_ids"):
                cases.append({"case": key, "n_layers": b.get("n_layers") or 8, "aux_layers": aux["engine_ids"],
                              "boundaries": aux["boundaries"], "predicted": aux.get("predicted")})
        if cases:
            atomic_json(rec / "vllm_engine_info.json", {"recorded": sec.res["env"], "cases": cases})
        if not units and not cases:
            raise RuntimeError("nothing to record: no vLLM bench unit or engine info (see the bench/nested steps)")
        return {"metric_units": len(units), "engine_cases": len(cases)}

    sec.run("recorded", recorded)


# ---------------------------------------------------------------------------------------------------- speed

def speed(sec: Section, root: Path, n_prompts: int, prompt_len: int, repeats: int,
          compiled_alone: bool = False) -> None:
    import torch
    from load_suite import gpu_tag  # gpu/load_suite.py: the card tag its load runs are named with

    from backend.engines import vllm as V
    from backend.engines.base import rebuild_capture
    from backend.runs.capture_run import finish as _finish
    from backend.runs.lifecycle import Run
    from backend.store.data_root import DataRoot

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
    warm = seqs[:12]    # two forward passes: the first sets each boundary's shift, the second compiles the kernels
    opts = V.VllmOptions(gpu_memory_utilization=0.4, max_model_len=prompt_len + 64, dtype="bfloat16",
                           load_format="dummy", extra={"enable_prefix_caching": False, **KV_CACHE_SPEED,
                                                       "jit_monitor_verbose": True})   # every Triton build logged
    sec.res.update({"model": "Llama-3.1-8B shape, random bf16 (load_format=dummy)", "prompts": n_prompts,
                    "prompt_tokens": prompt_len, "tokens": tokens, "repeats": repeats})

    def timed(llm) -> dict:
        V.prefill(llm, warm)                                         # warm-up (and the stats kernel's compile)
        ts = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            ts.append(V.prefill(llm, seqs))
        med = statistics.median(ts)
        return {"seconds": [round(x, 4) for x in ts], "median_s": round(med, 4), "tokens_per_s": round(tokens / med)}

    def compiled_step():
        t = time.perf_counter()
        llm = V.make_llm(str(mdir), opts, eager=False)
        start = time.perf_counter() - t
        try:
            r = timed(llm)
        finally:
            V.shutdown(llm)
            del llm
        r["engine_start_s"] = round(start, 1)
        print("plain_prefill_compiled", r, flush=True)
        return r

    sec.run("plain_prefill_compiled", compiled_step)
    base = (sec.res.get("plain_prefill_compiled") or {}).get("median_s")

    wanted = [s for s in STEPS["speed"][1:] if sec.wanted(s)]
    if not wanted:
        return
    holder: dict = {}
    kept: dict = {}      # each capture step's statistics state, for the compiled captures' comparison

    def eager_engine():
        """The capture-ready engine (enforce_eager, no prefix caching), started once for the steps below."""
        if "llm" not in holder:
            if "failed" in holder:
                raise RuntimeError(f"the eager engine did not start earlier: {holder['failed']}")
            try:
                holder["llm"] = V.make_llm(str(mdir), opts, capture=True)
            except Exception as e:
                holder["failed"] = f"{type(e).__name__}: {str(e)[:500]}"
                raise
        return holder["llm"]

    def eager_step():
        t = time.perf_counter()
        eager_engine()
        start = time.perf_counter() - t
        r = timed(holder["llm"])
        r["engine_start_s"] = round(start, 1)
        if base:
            r["ratio_vs_compiled"] = round(r["median_s"] / base, 4)
        print("plain_prefill_eager", r, flush=True)
        return r

    def capture_step(name: str, labels: list[str], fused: bool = True):
        llm = eager_engine()
        V.install(llm, labels, sample_tokens=512, sample_per_prompt=64)
        path = llm.collective_rpc("speclens_stats_path", args=(fused,))[0]
        try:
            r = timed(llm)
            got = V.collect(llm)
        finally:
            try:
                llm.collective_rpc("speclens_remove")
            except Exception as e:
                print("speclens_remove failed:", e, flush=True)
        kept[name] = got["state"]
        seen = int(got["tokens_seen"])
        # one run's worth of files, written as a capture run writes them: bytes per token
        rd = Run.create(f"{gpu_tag()}-speed-{name}-{int(time.time())}",      # finish() completes a lifecycle Run
                        {"kind": "capture", "engine": "vllm", "boundaries": labels,
                         "model": {"path": str(mdir), "n_layers": 32, "hidden_size": 4096},
                         "progress": {"done": 0, "total": n_prompts * repeats + len(warm)}}, DataRoot(root))
        stats, sample = rebuild_capture(got, 4096, 512, 64)
        _finish(rd, stats, sample, labels, seen, n_prompts * repeats + len(warm), r["median_s"])
        size = sum(f.stat().st_size for f in rd.path.iterdir() if f.is_file())
        r.update({"run": rd.run_id, "boundaries": len(labels), "stats_update": path, "tokens_seen_by_hooks": seen,
                  "forwards_seen_by_hooks": int(got.get("forwards", 0)),
                  "tokens_expected": tokens * repeats + len(warm) * prompt_len,
                  "bytes_written": size, "bytes_per_token": round(size / seen, 3) if seen else None})
        if base:
            r["ratio_vs_compiled"] = round(r["median_s"] / base, 4)
        print(name, r, flush=True)
        return r

    sets = {"eagle_set": ["S_2", "S_16", "S_29", "S_32"], "all_33": [f"S_{i}" for i in range(33)]}
    try:
        sec.run("plain_prefill_eager", eager_step)
        for name, labels in sets.items():
            sec.run(f"capture_{name}", capture_step, name, labels)
        for name, labels in sets.items():     # the same, with the compiled statistics (the path before the kernel)
            sec.run(f"capture_{name}_compiled_stats", capture_step, f"{name}-compiled-stats", labels, False)
    finally:
        if "llm" in holder:
            V.shutdown(holder.pop("llm"))
        _gpu_cleanup()

    plain: dict = {}
    # two engines up at once: 10 GiB of KV cache each (80 prompt-lengths; a forward pass holds 8) fits an 80 GB card
    pair_opts = dataclasses.replace(opts, extra={**opts.extra, "kv_cache_memory_bytes": 10 * 2**30})

    def compiled_capture_engine(labels: list[str], o: V.VllmOptions):
        """(engine, seconds to start, statistics path): the compiled capture engine for these boundaries, its reducer
        installed with the one-pass update."""
        t = time.perf_counter()
        cap = V.make_llm(str(mdir), o, capture=True, aux_ids=V.aux_ids_for(labels, 32))
        start = time.perf_counter() - t
        try:
            V.install(cap, labels, sample_tokens=512, sample_per_prompt=64)
            return cap, start, cap.collective_rpc("speclens_stats_path", args=(True,))[0]
        except BaseException:
            V.shutdown(cap)
            raise

    def compiled_capture_step(name: str, labels: list[str]) -> dict:
        """The capture in the compiled engine (aux outputs armed at load, no CUDA graphs) against plain compiled
        prefill, both engines up at once and their timed runs interleaved (ABAB...: the first of each pair
        alternates), so that a drift of the card or the machine falls on both."""
        if compiled_alone:
            return compiled_alone_step(name, labels)
        if "llm" not in plain:
            plain["llm"] = V.make_llm(str(mdir), pair_opts, eager=False)
            V.prefill(plain["llm"], warm)
        cap, start, path = compiled_capture_engine(labels, pair_opts)
        try:
            V.prefill(cap, warm)
            tp, tc = [], []
            for i in range(repeats):
                for which in (("plain", "cap") if i % 2 == 0 else ("cap", "plain")):
                    torch.cuda.synchronize()
                    (tp if which == "plain" else tc).append(V.prefill(plain["llm"] if which == "plain" else cap, seqs))
            got = V.collect(cap)
        finally:
            V.shutdown(cap)
            del cap
        mp, mc = statistics.median(tp), statistics.median(tc)
        r = {"engine_start_s": round(start, 1), "stats_update": path, "boundaries": len(labels),
             "kv_cache_gib_each": 10, "cudagraph_mode_capture": "NONE", "plain_engine": "compiled, CUDA graphs",
             "plain_seconds": [round(x, 4) for x in tp], "capture_seconds": [round(x, 4) for x in tc],
             "plain_median_s": round(mp, 4), "capture_median_s": round(mc, 4), "ratio": round(mc / mp, 4),
             "paired_ratios": [round(c / q, 4) for q, c in zip(tp, tc)],
             **token_counts(got, tokens * repeats + len(warm) * prompt_len)}
        ref = kept.get(name)                       # the eager hooks' statistics of the same tokens, when measured
        if ref is not None:
            r["against_eager_hooks"] = compare_states(ref, got["state"], labels)
        print(f"capture_{name}_compiled", r, flush=True)
        return r

    def compiled_alone_step(name: str, labels: list[str]) -> dict:
        """The compiled capture engine alone on the card (as the eager steps run): timed with the statistics, then
        with the reducer removed (the aux outputs still materialised, no statistics), against this run's plain
        compiled prefill."""
        cap, start, path = compiled_capture_engine(labels, opts)
        try:
            with_stats = timed(cap)
            got = V.collect(cap)
            cap.collective_rpc("speclens_remove")
            no_stats = timed(cap)
        finally:
            V.shutdown(cap)
            del cap
        r = {"engine_start_s": round(start, 1), "stats_update": path, "boundaries": len(labels), "alone": True,
             "cudagraph_mode_capture": "NONE", "with_statistics": with_stats, "aux_only_no_statistics": no_stats,
             **token_counts(got, tokens * repeats + len(warm) * prompt_len)}
        if base:
            r["ratio_vs_compiled"] = round(with_stats["median_s"] / base, 4)
            r["aux_only_ratio_vs_compiled"] = round(no_stats["median_s"] / base, 4)
        ref = kept.get(name)
        if ref is not None:
            r["against_eager_hooks"] = compare_states(ref, got["state"], labels)
        print(f"capture_{name}_compiled", r, flush=True)
        return r

    try:
        for name, labels in sets.items():
            sec.run(f"capture_{name}_compiled", compiled_capture_step, name, labels)
    finally:
        if "llm" in plain:
            V.shutdown(plain.pop("llm"))
        _gpu_cleanup()


def token_counts(got: dict, expected: int) -> dict:
    """What a compiled capture engine's reducer counted (`V.collect`): tokens and forwards its hooks saw, forwards
    whose graph handed out no aux states, and the tokens each boundary's statistics hold, which must all be the
    tokens the hooks saw (an engine whose boundaries never reached the statistics times an empty capture)."""
    from backend.stats import StatsState

    r = {"tokens_seen_by_hooks": int(got["tokens_seen"]), "forwards_seen_by_hooks": int(got.get("forwards", 0)),
         "forwards_without_aux": int(got.get("aux_missing", 0)),
         "tokens_in_statistics": StatsState.from_tensors(got["state"]).tokens(), "tokens_expected": expected}
    r["every_token_in_statistics"] = set(r["tokens_in_statistics"]) == {r["tokens_seen_by_hooks"]}
    return r


def compare_states(ref: dict, got: dict, labels: list[str], hidden: int = 4096) -> dict:
    """Largest difference of two captures' statistics of the same tokens (per-dimension mean, variance, max |x|,
    the norm histogram, ...), per figure and boundary, relative to the largest value of the reference's figure (the
    engines batch the tokens differently, so their fp32 sums differ in the last bits; each state's moments are
    about its own shift, so the raw tensors are not compared)."""
    import numpy as np

    from backend.stats import StatsState, StreamingStats

    def vec(state: dict) -> dict:
        return StreamingStats(labels, hidden, "cpu", StatsState.from_tensors(state, "cpu"), compile=False).vectors()

    a, b = vec(ref), vec(got)
    out = {}
    for k, x in a.items():
        y = b.get(k)
        if y is None or np.shape(x) != np.shape(y):
            out[k] = "missing or other shape"
            continue
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        scale = float(np.nanmax(np.abs(x))) if x.size else 0.0
        out[k] = float(np.nanmax(np.abs(x - y))) / (scale or 1.0) if x.size else 0.0
    return out


# ---------------------------------------------------------------------------------------------------- packing

def pack(out: Path, root: Path, what: str, run_ids: list[str]) -> dict:
    """This invocation's run directories as one tar.gz (parts of at most PART_BYTES, within the 8-file limit of
    what comes back from $OUT); the speed runs' sample.safetensors are left out."""
    runs = root / "runs"
    name = f"runs-vllm-{what}.tar.gz"
    for old in out.glob(name + "*"):
        old.unlink()
    dirs = [runs / r for r in run_ids if (runs / r).is_dir()]
    if not dirs:
        return {"tarball": None, "why": "no run directories"}

    def build(skip_samples: bool) -> tuple[Path, list[str]]:
        left = []
        tmp = out / (name + ".tmp")
        with tarfile.open(tmp, "w:gz", compresslevel=1) as tf:
            for d in dirs:
                for f in sorted(d.rglob("*")):
                    if not f.is_file() or f.name.endswith(".lock"):
                        continue
                    if f.name == "sample.safetensors" and (skip_samples or "-speed-" in d.name):
                        left.append(str(f.relative_to(root)))
                        continue
                    tf.add(f, arcname=str(f.relative_to(root)))
        return tmp, left

    others = sum(1 for f in out.rglob("*") if f.is_file() and not f.name.startswith(name))
    slots = max(1, MAX_OUT_FILES - others)
    tmp, left = build(False)
    if tmp.stat().st_size > slots * PART_BYTES:
        tmp.unlink()
        tmp, left = build(True)
    size = tmp.stat().st_size
    if size <= PART_BYTES:
        os.replace(tmp, out / name)
        return {"tarball": name, "bytes": size, "left_out": left}
    parts = []
    with open(tmp, "rb") as fh:
        i = 0
        while len(parts) < slots:
            chunk = fh.read(PART_BYTES)
            if not chunk:
                break
            p = out / f"{name}.part{i:02d}"
            p.write_bytes(chunk)
            parts.append(p.name)
            i += 1
        truncated = bool(fh.read(1))
    tmp.unlink()
    return {"tarball": name, "bytes": size, "parts": parts, "left_out": left,
            "truncated": truncated, "join": f"cat {name}.part* > {name}"}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["toy", "speed", "all"])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/speclens-out")))
    p.add_argument("--root", type=Path, default=None,
                   help="data root (default: a fresh /tmp/speclens-data/<time> per invocation, so run names never "
                        "collide with an earlier invocation on the same machine)")
    p.add_argument("--capture-prompts", type=int, default=16)
    p.add_argument("--bench-prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--speed-prompts", type=int, default=64)
    p.add_argument("--speed-len", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", default=None, help="comma-separated step names: " +
                   ", ".join(STEPS["toy"] + STEPS["speed"]))
    p.add_argument("--budget-s", type=float, default=None, help="start no step after this many seconds")
    p.add_argument("--compiled-alone", action="store_true",
                   help="the compiled captures' engine alone on the card (with and without statistics) instead of "
                        "interleaved with a plain compiled engine up beside it")
    p.add_argument("--kv-cache-gib", type=float, default=4.0,
                   help="toy engines' KV cache (GiB) instead of vLLM's profiling; 0 = let vLLM profile")
    p.add_argument("--kv-cache-gib-speed", type=float, default=24.0, help="the same for the 8B-shape engines")
    a = p.parse_args()
    if a.kv_cache_gib > 0:
        KV_CACHE["kv_cache_memory_bytes"] = int(a.kv_cache_gib * 2**30)
    if a.kv_cache_gib_speed > 0:
        KV_CACHE_SPEED["kv_cache_memory_bytes"] = int(a.kv_cache_gib_speed * 2**30)
    t0 = time.monotonic()
    if a.root is None:
        a.root = Path("/tmp/speclens-data") / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    a.out.mkdir(parents=True, exist_ok=True)
    a.root.mkdir(parents=True, exist_ok=True)
    os.environ["SPECLENS_DATA"] = str(a.root)
    only = {s.strip() for s in a.only.split(",") if s.strip()} if a.only else None
    if only:
        unknown = only - set(STEPS["toy"] + STEPS["speed"])
        if unknown:
            p.error(f"--only: unknown steps {sorted(unknown)}")
    deadline = t0 + a.budget_s if a.budget_s else None
    runs = a.root / "runs"
    before = set(os.listdir(runs)) if runs.is_dir() else set()
    sections = []
    try:
        if a.what in ("toy", "all") and (only is None or only & set(STEPS["toy"])):
            sec = Section("toy", a.out, only, deadline)
            sections.append(sec)
            try:
                toy(sec, a.out, a.root, a.capture_prompts, a.bench_prompts, a.max_new_tokens)
            except Exception as e:      # the setup outside the steps (toy pair, imports)
                sec.res["error"] = f"{type(e).__name__}: {e}"
                sec.res["traceback"] = traceback.format_exc()[-6000:]
                print("toy section failed:", sec.res["error"], flush=True)
            sec.save()
        if a.what in ("speed", "all") and (only is None or only & set(STEPS["speed"])):
            sec = Section("speed", a.out, only, deadline)
            sections.append(sec)
            try:
                speed(sec, a.root, a.speed_prompts, a.speed_len, a.repeats, a.compiled_alone)
            except Exception as e:
                sec.res["error"] = f"{type(e).__name__}: {e}"
                sec.res["traceback"] = traceback.format_exc()[-6000:]
                print("speed section failed:", sec.res["error"], flush=True)
            sec.save()
    finally:
        new = sorted(set(os.listdir(runs)) - before) if runs.is_dir() else []
        try:
            packed = pack(a.out, a.root, a.what, new)
        except Exception as e:
            packed = {"error": f"{type(e).__name__}: {e}"}
        print("packed:", packed, flush=True)
        for sec in sections:
            sec.res["runs_tarball"] = packed
            sec.res["seconds_total"] = round(time.monotonic() - t0, 1)
            sec.save()
    failed = [f"{s.name}/{k}" for s in sections for k, v in s.res["steps"].items() if v.get("status") == "error"]
    print("failed steps:", failed or "none", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
