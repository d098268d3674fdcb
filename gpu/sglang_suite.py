"""SGLang on a GPU node, for real: `python gpu/sglang_suite.py --out DIR`.

1. HF capture vs SGLang capture (hooks inside the server) of the same target weights and prompt tokens:
   alignment verdict, per-boundary cosine, token counts seen by the hooks.
2. The toy pair through SGLang (chain, K=4, greedy, held-out Spec-Bench prompts) against the HF reference engine
   following SGLang's semantics (its +1 reading of the ids, its embedding substitution), same GPU, bf16: tau,
   per-position rates, lossless check, and the boundaries SGLang's running target model feeds each drafter
   (`layers_to_capture`) next to what SpecLens predicted.
3. Server start, capture and benchmark times. RECORDED fixtures for the CPU tests under DIR/recorded/.
4. `--real`: shrunken targets of real families and depths (`--load-format dummy`, config only) with real public
   drafter configs (tests/data/real_configs, sizes shrunk as gpu/runner_check.py does; ids as written or as the
   case sets them in eagle_config, where SGLang reads them): `layers_to_capture` read from the running target model
   next to what SpecLens predicts for the installed release (backend.drafter.aux.drafter_aux_boundaries).
Ran with SGLang 0.5.15 (transformers 5.12.1) and 0.5.17 (transformers 5.12.1, `--engine-option attention-backend=triton`
because the bundle sent to the H200 left out sgl_kernel's FA3 library) on a CUDA GPU.

Every experiment runs on its own: an exception is recorded (type, message, traceback tail, the tails of the SGLang
server logs it wrote under DIR/logs/<experiment>/) and the suite goes on with the next one; DIR/sglang_results.json
is rewritten after each experiment, so a run cut short still leaves what it measured. The SGLang experiments run
first (they are what only this machine can do); `--budget-s` skips experiments that would start after that many
seconds, and `--only` picks some of them. Each SGLang server start took about 100 s on the H200 (first
runs, 2026-11-30): the whole suite starts four (capture, plain baseline, two drafters).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import sys
import tarfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DRAFTERS = ("drafter-matched", "drafter-after-layer")
# name -> (target: gpu/runner_check.py TARGETS or REAL_TARGETS, drafter config file, eagle_config ids; None: as written)
REAL_CASES = {
    "deepseekv3_61_nested_1_29_57": ("deepseekv3-61", "specforge_deepseek-v3-671b.json", None),
    "deepseekv3_61_nested_3_30_58": ("deepseekv3-61", "specforge_deepseek-v3-671b.json", [3, 30, 58]),
    "llama61_nested_3_30_58": ("llama-61", "specforge_deepseek-v3-671b.json", [3, 30, 58]),
    "llama32_none": ("llama-32", "specforge_llama3-8b.json", None),
    "gptoss24_nested_1_11_24": ("gptoss-24", "specforge_deepseek-v3-671b.json", [1, 11, 24]),
}
REAL_TARGETS = {
    "gptoss-24": {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_hidden_layers": 24,
                  "hidden_size": 256, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "head_dim": 64, "vocab_size": 4096, "num_local_experts": 4, "num_experts_per_tok": 2,
                  "experts_per_token": 2, "sliding_window": 128, "layer_types": ["sliding_attention",
                                                                                  "full_attention"] * 12,
                  "rms_norm_eps": 1e-5, "rope_theta": 150000, "max_position_embeddings": 2048, "swiglu_limit": 7.0,
                  "attention_bias": True, "torch_dtype": "bfloat16", "tie_word_embeddings": False},
}


def env_info() -> dict:
    out: dict = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                 "python": platform.python_version(), "command": " ".join(["python"] + sys.argv)}
    from importlib.metadata import PackageNotFoundError, version
    for pkg in ("sglang", "sglang-kernel", "torch", "transformers", "tokenizers", "flashinfer-python"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    import importlib.util
    out["missing_modules"] = [m for m in ("duckdb", "pandas", "pyarrow", "safetensors", "yaml", "tqdm", "sglang")
                              if importlib.util.find_spec(m) is None]
    try:
        import torch
        out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        out["torch_cuda"] = torch.version.cuda
    except Exception as e:  # noqa: BLE001
        out["gpu"] = f"unknown ({type(e).__name__}: {e})"
    return out


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def _log_tails(d: Path, n: int = 40) -> dict:
    from backend.engines.sglang import log_tail
    return {str(p.relative_to(d.parent.parent)): log_tail(p, n, sep="\n") for p in sorted(d.glob("*.log"))}


class Suite:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.t0 = time.perf_counter()
        self.res: dict = {"env": env_info(), "experiments": {}, "order": [], "budget_s": a.budget_s}
        self.logs = a.out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.recorded_meta: list = []
        self.tag = time.strftime("%H%M%S")        # run names stay new when the suite runs again on the same root

    def save(self) -> None:
        self.res["elapsed_s"] = round(time.perf_counter() - self.t0, 1)
        _write_json(self.a.out / "sglang_results.json", self.res)

    def run(self, name: str, fn) -> dict | None:
        """One experiment: its result or its error goes into the results file, which is rewritten at once."""
        self.res["order"].append(name)
        elapsed = time.perf_counter() - self.t0
        if self.a.only and not any(name.startswith(o) or o in name for o in self.a.only):
            self.res["experiments"][name] = {"status": "skipped", "why": "--only"}
            self.save()
            return None
        if self.a.budget_s and elapsed > self.a.budget_s:
            self.res["experiments"][name] = {"status": "skipped",
                                             "why": f"budget: {elapsed:.0f} s > --budget-s {self.a.budget_s}"}
            print(f"[{name}] skipped (budget)", flush=True)
            self.save()
            return None
        from backend.engines import sglang as S

        logdir = self.logs / name.replace("/", "__")
        logdir.mkdir(parents=True, exist_ok=True)
        os.environ[S.LOG_DIR_ENV] = str(logdir)
        print(f"[{name}] start at {elapsed:.0f} s", flush=True)
        t = time.perf_counter()
        self.res["experiments"][name] = {"status": "running"}   # fn may save partial figures here
        out: dict
        try:
            out = {"status": "ok", **fn(logdir)}
        except BaseException as e:          # noqa: BLE001 - record, go on (SystemExit/KeyboardInterrupt: re-raised)
            partial = {k: v for k, v in (self.res["experiments"].get(name) or {}).items() if k != "status"}
            out = {**partial, "status": "error", "error": f"{type(e).__name__}: {e}"[:2000],
                   "traceback": traceback.format_exc()[-4000:]}
            print(f"[{name}] ERROR {out['error'][:500]}", flush=True)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                out["server_logs"] = _log_tails(logdir)
                self.res["experiments"][name] = out
                self.save()
                raise
        finally:
            S.stop_all()                    # no server outlives its experiment
            os.environ.pop(S.LOG_DIR_ENV, None)
        out["seconds"] = round(time.perf_counter() - t, 1)
        if out["status"] == "error":
            out["server_logs"] = _log_tails(logdir)
        out["server_log_files"] = [str(p.relative_to(self.a.out)) for p in sorted(logdir.glob("*.log"))]
        self.res["experiments"][name] = out
        self.save()
        print(f"[{name}] {out['status']} in {out['seconds']} s", flush=True)
        return out

    # ------------------------------------------------------------------ experiments
    def capture(self, logdir: Path) -> dict:
        from backend import align
        from backend.capture import CaptureSettings, run_capture
        from backend.engines import sglang as S
        from backend.store.data_root import DataRoot
        from backend.store.rundir import COMPLETE

        a, data = self.a, DataRoot(self.a.root)
        hf_id = "h200-toy-capture-hf-sgl"
        try:
            ok = data.run_dir(hf_id).manifest().get("status") == COMPLETE
        except Exception:  # noqa: BLE001
            ok = False
        if not ok:
            hf_id = f"h200-toy-capture-hf-sgl-{self.tag}"
            t = time.perf_counter()
            run_capture(CaptureSettings(model=self.target, prompts=self.prompts, engine="hf", limit=a.capture_prompts,
                                        device=a.device, dtype=a.dtype), name=hf_id, data=data, progress=False)
            print(f"[capture] HF reference in {time.perf_counter() - t:.1f} s", flush=True)
        t = time.perf_counter()
        sg = S.run_capture(CaptureSettings(model=self.target, prompts=self.prompts, engine="sglang",
                                           limit=a.capture_prompts, dtype=a.dtype),
                           name=f"h200-toy-capture-sglang-{self.tag}", data=data, progress=False, log_dir=logdir)
        seconds = round(time.perf_counter() - t, 1)
        man = json.loads((sg.path / "manifest.json").read_text())
        out = {"hf_run": hf_id, "sglang_run": sg.run_id, "tokens": sg.tokens, "seconds_total_incl_server": seconds,
               "server_start_s": (man.get("server") or {}).get("start_seconds"),
               "server_argv": (man.get("server") or {}).get("argv"), "engine_check": man.get("engine_check")}
        self.res["experiments"]["capture"] = {"status": "running", **out}
        self.save()
        al = align.get_alignment(hf_id, sg.run_id, data)
        out.update({"verdict": [{"kind": f.kind, "text": f.text} for f in al.verdict], "offset": al.offset,
                    "per_boundary": al.per_boundary, "shared_tokens": al.tokens, "warnings": al.warnings})
        print("capture verdict:", [f.text for f in al.verdict], flush=True)
        return out

    def bench(self, engine: str, drafter: str, logdir: Path) -> dict:
        from backend.bench import BenchSettings, run_bench
        from backend.store.data_root import DataRoot

        a = self.a
        s = BenchSettings(target=self.target, drafter=str(self.pair / drafter), prompts=self.prompts,
                          num_spec_tokens=4, temperature=0.0, repeats=1, limit=a.bench_prompts,
                          max_new_tokens=a.max_new_tokens, device=a.device, dtype=a.dtype, engine=engine,
                          producer="sglang", producer_version=self.res["env"]["sglang"] or "0.5.15",
                          engine_options={"mem-fraction-static": 0.2, "disable-cuda-graph": True,
                                          **a.engine_option} if engine == "sglang" else None)
        t = time.perf_counter()
        r = run_bench(s, name=f"h200-toy-{engine}-sgl-{drafter}-{self.tag}", data=DataRoot(a.root),
                      progress=False)
        out = {"run": r.run_id, "status_of_run": r.status, "baseline_run": r.baseline_run, "tau": r.tau,
               "acceptance_rate": r.acceptance_rate, "lossless": r.lossless,
               "mismatched_prompts": r.mismatched_prompts, "tokens_per_s": r.tokens_per_s, "speedup": r.speedup,
               "seconds_incl_server_start": round(time.perf_counter() - t, 1)}
        man = json.loads((r.path / "manifest.json").read_text())
        out["aux"] = man.get("aux")
        if r.status != "complete":
            raise RuntimeError(f"bench run {r.run_id} ended {r.status}: {man.get('error')}")
        summ = json.loads((r.path / "summary.json").read_text())
        out["per_position_rates"] = (summ.get("per_position") or {}).get("rates")
        out["histogram"] = summ.get("histogram")
        print(engine, drafter, "tau", r.tau, "lossless", r.lossless, "aux", (out["aux"] or {}).get("boundaries"),
              "engine ids", (out["aux"] or {}).get("engine_ids"), flush=True)
        return out

    def real_case(self, case: str, logdir: Path) -> dict:
        """One real-config case: start SGLang on the shrunken target with dummy weights, read `layers_to_capture`
        from the running target model, and put SpecLens's prediction for the installed release next to it."""
        from backend.drafter.aux import drafter_aux_boundaries
        from backend.drafter.config import load_config
        from backend.engines import sglang as S

        sys.path.insert(0, str(REPO / "gpu"))
        import runner_check as rc

        tname, cfile, ids = REAL_CASES[case]
        tcfg = {**rc.TARGETS, **REAL_TARGETS}[tname]
        work = self.a.root / "real" / case
        t, d = work / tname, work / "drafter"
        for p in (t, d):
            p.mkdir(parents=True, exist_ok=True)
        (t / "config.json").write_text(json.dumps(tcfg, indent=1))
        raw = json.loads((rc.CONFIGS / cfile).read_text())
        raw.update(hidden_size=tcfg["hidden_size"], intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=64, vocab_size=tcfg["vocab_size"], draft_vocab_size=1024)   # sizes only
        if ids is not None:
            raw.pop("eagle_aux_hidden_state_layer_ids", None)
            raw["eagle_config"] = {**(raw.get("eagle_config") or {}), "eagle_aux_hidden_state_layer_ids": ids,
                                   "use_aux_hidden_state": True}
        (d / "config.json").write_text(json.dumps(raw, indent=1))
        version = self.res["env"]["sglang"]
        out: dict = {"target": tname, "target_config": tcfg, "drafter_config": cfile, "eagle_config_ids": ids,
                     "release": version}
        try:
            out["predicted"] = drafter_aux_boundaries(load_config(d), tcfg["num_hidden_layers"], tcfg["model_type"],
                                                      "sglang", version, None)
        except Exception as e:  # noqa: BLE001 - a prediction that fails is a result too
            out["predicted"] = {"error": f"{type(e).__name__}: {e}"[:600]}
        self.res["experiments"][f"real/{case}"] = {"status": "running", **out}
        self.save()
        from backend.engines.base import EngineSettings

        s = EngineSettings(target=str(t), num_spec_tokens=3, tensor_parallel_size=1, dtype="bf16",
                           options={"mem-fraction-static": 0.15, "disable-cuda-graph": True,
                                    "load-format": "dummy", "context-length": 1024, **self.a.engine_option})
        t0 = time.perf_counter()
        eng = S.ServerEngine(s, str(d), eos=[], log_dir=logdir)
        try:
            out["server_start_s"] = round(time.perf_counter() - t0, 1)
            try:                                  # one request, so the info hook has seen a forward pass
                S.generate(eng.url, [1, 2, 3, 4, 5, 6, 7, 8], 2, 0.0, [], 0)
            except Exception as e:  # noqa: BLE001
                out["generate_error"] = f"{type(e).__name__}: {e}"[:600]
            engine_ids = eng.aux_ids()
        finally:
            eng.close()
        if not engine_ids:
            raise RuntimeError("layers_to_capture could not be read from the running model")
        out["layers_to_capture"] = engine_ids
        out["engine_feeds"] = [f"S_{i}" for i in sorted(set(engine_ids))]
        pred = out["predicted"].get("boundaries")
        out["agree"] = out["engine_feeds"] == pred
        print(f"[real/{case}] engine {out['engine_feeds']} predicted {pred} agree {out['agree']}", flush=True)
        return out

    def write_recorded(self) -> None:
        rec = self.a.out / "recorded"
        rec.mkdir(exist_ok=True)
        units = [u for u in self.recorded_meta if "spec_verify_ct" in (u.get("meta_info") or {})]
        _write_json(rec / "sglang_meta_info.json", {"recorded": self.res["env"], "units": units})
        cases = []
        for k, v in self.res["experiments"].items():
            aux = v.get("aux") if isinstance(v, dict) else None
            if k.startswith("bench/sglang/") and aux and aux.get("engine_ids") is not None:
                cases.append({"case": k, "layers_to_capture": aux["engine_ids"], "boundaries": aux["boundaries"],
                              "predicted": aux.get("predicted"), "n_layers": self.n_layers})
        _write_json(rec / "sglang_engine_info.json", {"recorded": self.res["env"], "cases": cases})

    def main(self) -> int:
        a = self.a
        from backend.demo import heldout_prompts, toy_pair
        from backend.engines import sglang as S
        from backend.options import IN_PROCESS_ENGINE
        from backend.store.data_root import DataRoot

        self.pair = toy_pair(DataRoot(a.root))
        if self.pair is None:
            raise SystemExit("models/toy-pair.tar.gz is missing: the suite needs the toy pair")
        self.prompts = str(heldout_prompts(self.pair))
        self.target = str(self.pair / "target")
        self.n_layers = int(json.loads((self.pair / "target" / "config.json").read_text())["num_hidden_layers"])
        self.res["pair"] = str(self.pair)
        self.save()

        orig = S.ServerEngine.generate
        recorded = self.recorded_meta

        def recording(eng, prompt, max_new_tokens, temperature, seed):
            g = orig(eng, prompt, max_new_tokens, temperature, seed)
            if eng.k and len(recorded) < 24:
                recorded.append({"k": eng.k, "meta_info": g.raw, "output_tokens": len(g.tokens)})
            return g
        S.ServerEngine.generate = recording
        try:
            if not a.skip_capture:
                self.run("capture", self.capture)
            if not a.real_only:
                for engine in ("sglang", IN_PROCESS_ENGINE):       # SGLang and the reference engine
                    for d in DRAFTERS:
                        self.run(f"bench/{engine}/{d}", lambda logdir, e=engine, d=d: self.bench(e, d, logdir))
                        self.write_recorded()
            if a.real or a.real_only:
                for case in REAL_CASES:
                    self.run(f"real/{case}", lambda logdir, c=case: self.real_case(c, logdir))
        finally:
            S.ServerEngine.generate = orig
            S.stop_all()

        ex = self.res["experiments"]
        for d in DRAFTERS:
            h, v = (ex.get(f"bench/hf/{d}") or {}).get("tau"), (ex.get(f"bench/sglang/{d}") or {}).get("tau")
            ex[f"tau_gap/{d}"] = {"hf": h, "sglang": v,
                                  "relative": (v - h) / h if isinstance(h, (int, float)) and isinstance(v, (int, float))
                                  and h else None}
        self.write_recorded()
        try:
            runs = a.root / "runs"
            if runs.exists():
                with tarfile.open(a.out / "runs-sglang.tar.gz", "w:gz") as tf:
                    tf.add(runs, arcname="runs")
        except Exception as e:  # noqa: BLE001
            self.res["runs_tarball_error"] = f"{type(e).__name__}: {e}"
        self.save()
        failed = [k for k, v in ex.items() if isinstance(v, dict) and v.get("status") == "error"]
        print("done in", round(time.perf_counter() - self.t0, 1), "s; failed:", failed or "none", flush=True)
        return 1 if failed else 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/speclens-out")))
    p.add_argument("--root", type=Path, default=Path("/tmp/speclens-data"))
    p.add_argument("--capture-prompts", type=int, default=16)
    p.add_argument("--bench-prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--skip-capture", action="store_true")
    p.add_argument("--device", default="cuda", help="HF reference engine device (cpu only for dry runs)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="start no experiment after this many seconds (0: no limit)")
    p.add_argument("--start-timeout", type=float, default=300.0, help="seconds one SGLang server may take to start")
    p.add_argument("--only", type=lambda v: [x for x in v.split(",") if x], default=None,
                   help="comma-separated experiment names or prefixes: capture, bench/sglang, bench/hf/drafter-matched")
    p.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                   help="one more SGLang server flag for every bench/real server, e.g. attention-backend=triton")
    p.add_argument("--real", action="store_true", help="also run the real-config cases (REAL_CASES)")
    p.add_argument("--real-only", action="store_true", help="only the real-config cases (implies --skip-capture)")
    a = p.parse_args()
    a.engine_option = dict(kv.split("=", 1) for kv in a.engine_option)
    a.skip_capture = a.skip_capture or a.real_only
    a.out.mkdir(parents=True, exist_ok=True)
    a.root.mkdir(parents=True, exist_ok=True)
    os.environ["SPECLENS_DATA"] = str(a.root)
    os.environ["SPECLENS_SGLANG_START_TIMEOUT"] = str(a.start_timeout)

    def on_term(signum, frame):             # `timeout` sends SIGTERM: leave through atexit, which stops servers
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)

    try:
        suite = Suite(a)
    except BaseException as e:              # e.g. a package missing here: say so in the results file
        _write_json(a.out / "sglang_results.json", {"fatal": f"{type(e).__name__}: {e}",
                                                    "traceback": traceback.format_exc()[-4000:]})
        raise
    try:
        return suite.main()
    except BaseException as e:
        suite.res["fatal"] = f"{type(e).__name__}: {e}"
        suite.res["traceback"] = traceback.format_exc()[-4000:]
        suite.save()
        raise


if __name__ == "__main__":
    sys.exit(main())
