"""SGLang on a GPU node, for real: `python gpu/sglang_suite.py --out DIR`.

1. HF capture vs SGLang capture (hooks inside the server) of the same target weights and prompt tokens:
   alignment verdict, per-boundary cosine, token counts seen by the hooks.
2. The toy pair through SGLang (chain, K=4, greedy, held-out Spec-Bench prompts) against the HF reference engine
   following SGLang's semantics (its +1 reading of the ids, its embedding substitution), same GPU, bf16: tau,
   per-position rates, lossless check, and the boundaries SGLang's running target model feeds each drafter
   (`layers_to_capture`) next to what SpecLens predicted.
3. Server start, capture and benchmark times. RECORDED fixtures for the CPU tests under DIR/recorded/.
Needs SGLang 0.5.15 (with transformers 5.12.1) and a CUDA GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def env_info() -> dict:
    import torch
    import transformers
    from importlib.metadata import version
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(0), "sglang": version("sglang"), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "command": " ".join(["python"] + sys.argv)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/speclens-out")))
    p.add_argument("--root", type=Path, default=Path("/tmp/speclens-data"))
    p.add_argument("--capture-prompts", type=int, default=16)
    p.add_argument("--bench-prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--skip-capture", action="store_true")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    a.root.mkdir(parents=True, exist_ok=True)
    os.environ["SPECLENS_DATA"] = str(a.root)

    from backend import align
    from backend.bench import BenchSettings, run_bench
    from backend.capture import CaptureSettings, run_capture
    from backend.demo import heldout_prompts, toy_pair
    from backend.store.rundir import RunDir

    pair = toy_pair(a.root)
    prompts = str(heldout_prompts(pair))
    target = str(pair / "target")
    res: dict = {"env": env_info(), "pair": str(pair)}
    logs = a.out / "logs"
    logs.mkdir(exist_ok=True)

    if not a.skip_capture:
        hf_id = "h200-toy-capture-hf-sgl"
        try:
            RunDir.open(hf_id, a.root)
        except Exception:
            run_capture(CaptureSettings(model=target, prompts=prompts, engine="hf", limit=a.capture_prompts,
                                        device="cuda", dtype="bf16"), name=hf_id, root=a.root, progress=False)
        t = time.perf_counter()
        from backend.engines import sglang as S
        sg = S.run_capture(CaptureSettings(model=target, prompts=prompts, engine="sglang", limit=a.capture_prompts,
                                           dtype="bf16"), name="h200-toy-capture-sglang", root=a.root, progress=False,
                           log_dir=logs / "capture")
        man = json.loads((sg.path / "manifest.json").read_text())
        al = align.get_alignment(hf_id, sg.run_id, a.root)
        res["capture"] = {"hf_run": hf_id, "sglang_run": sg.run_id, "tokens": sg.tokens,
                          "seconds_total_incl_server": round(time.perf_counter() - t, 1),
                          "server_start_s": man.get("server", {}).get("start_seconds"),
                          "engine_check": man.get("engine_check"),
                          "verdict": [{"kind": f.kind, "text": f.text} for f in al.verdict], "offset": al.offset,
                          "per_boundary": al.per_boundary, "shared_tokens": al.tokens}
        print("capture verdict:", [f.text for f in al.verdict], flush=True)
        (a.out / "sglang_results.json").write_text(json.dumps(res, indent=1, default=str))

    from backend.engines import sglang as S
    recorded_meta: list = []
    orig = S.ServerEngine.generate

    def recording(self, prompt, max_new_tokens, temperature, seed):
        g = orig(self, prompt, max_new_tokens, temperature, seed)
        if self.k and len(recorded_meta) < 24:
            recorded_meta.append({"k": self.k, "meta_info": g.raw, "output_tokens": len(g.tokens)})
        return g
    S.ServerEngine.generate = recording

    res["bench"] = {}
    for engine in ("hf", "sglang"):
        for drafter in ("drafter-matched", "drafter-after-layer"):
            s = BenchSettings(target=target, drafter=str(pair / drafter), prompts=prompts, num_spec_tokens=4,
                              temperature=0.0, repeats=1, limit=a.bench_prompts, max_new_tokens=a.max_new_tokens,
                              device="cuda", dtype="bf16", engine=engine, producer="sglang",
                              producer_version="0.5.15",
                              engine_options={"mem-fraction-static": 0.2, "disable-cuda-graph": True}
                              if engine == "sglang" else None)
            t = time.perf_counter()
            r = run_bench(s, name=f"h200-toy-{engine}-sgl-{drafter}", root=a.root, progress=False)
            summ = json.loads((r.path / "summary.json").read_text())
            man = json.loads((r.path / "manifest.json").read_text())
            res["bench"][f"{engine}/{drafter}"] = {
                "run": r.run_id, "baseline_run": r.baseline_run, "tau": r.tau, "acceptance_rate": r.acceptance_rate,
                "per_position_rates": summ["per_position"]["rates"], "histogram": summ["histogram"],
                "lossless": r.lossless, "mismatched_prompts": r.mismatched_prompts, "tokens_per_s": r.tokens_per_s,
                "speedup": r.speedup, "aux": man.get("aux"),
                "seconds_incl_server_start": round(time.perf_counter() - t, 1)}
            print(engine, drafter, "tau", r.tau, "lossless", r.lossless, "aux", (man.get("aux") or {}).get("boundaries"),
                  flush=True)
            (a.out / "sglang_results.json").write_text(json.dumps(res, indent=1, default=str))
    for d in ("drafter-matched", "drafter-after-layer"):
        h, v = res["bench"][f"hf/{d}"]["tau"], res["bench"][f"sglang/{d}"]["tau"]
        res["bench"][f"tau_gap/{d}"] = {"hf": h, "sglang": v, "relative": (v - h) / h}
    (a.out / "sglang_results.json").write_text(json.dumps(res, indent=1, default=str))

    rec = a.out / "recorded"
    rec.mkdir(exist_ok=True)
    (rec / "sglang_meta_info.json").write_text(json.dumps({"recorded": res["env"], "units": recorded_meta}, indent=1))
    cases = [{"case": k, "layers_to_capture": v["aux"].get("engine_ids"), "boundaries": v["aux"]["boundaries"],
              "predicted": v["aux"].get("predicted"), "n_layers": 8}
             for k, v in res["bench"].items() if k.startswith("sglang/") and v.get("aux")]
    (rec / "sglang_engine_info.json").write_text(json.dumps({"recorded": res["env"], "cases": cases}, indent=1))
    with tarfile.open(a.out / "runs-sglang.tar.gz", "w:gz") as tf:
        tf.add(a.root / "runs", arcname="runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
