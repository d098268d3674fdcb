"""Shared fixtures. Test data is built with the project's own code (toy target, capture, run store)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from backend.config import REPO_ROOT
from backend.store.data_root import DataRoot

PROMPTS = REPO_ROOT / "datasets" / "spec_bench" / "question.jsonl"
DASH_LIMIT = 12          # prompts per capture: enough tokens for the alignment verdicts, a few seconds each


def _poison_token(model_dir: Path, out: Path, token: str) -> Path:
    """A copy of a toy target whose embedding of `token` is NaN: tokens at and after it hold NaN."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    shutil.copytree(model_dir, out)
    tid = AutoTokenizer.from_pretrained(str(model_dir)).convert_tokens_to_ids(token)
    f = out / "model.safetensors"
    t = load_file(str(f))
    key = next(k for k in t if k.endswith("embed_tokens.weight"))
    t[key][tid] = float("nan")
    save_file(t, str(f), metadata={"format": "pt"})
    return out


def _unfinished_runs(root: Path) -> None:
    """A running run (owned by this live process), an interrupted one (dead pid) and a failed one."""

    base = {"kind": "capture", "engine": "hf", "dtype": "fp32", "boundaries": ["S_0", "S_1", "F"],
            "model": {"path": "/models/toy", "n_layers": 8, "hidden_size": 256}}
    DataRoot(root).new_run_dir("live-run", {**base, "progress": {"done": 3, "total": 12}})
    gone = DataRoot(root).new_run_dir("dead-run", {**base, "progress": {"done": 5, "total": 12}})
    gone.update(pid=2**22 + 12345)          # beyond pid_max: never alive
    DataRoot(root).new_run_dir("broken-run", base).update(status="failed", error="OutOfMemoryError: CUDA out of memory")


def build_dashboard_data(root: Path) -> Path:
    """Captures a1, a2 (fp32, identical), b16 (bf16), nan1 (NaN in the prompts holding " travel") and three
    unfinished runs."""
    from backend.capture import CaptureSettings, run_capture
    from backend.toy.target import build_random_target

    model = build_random_target(root / "models" / "toy", n_layers=8, hidden=256, seed=0)
    poisoned = _poison_token(model, root / "models" / "toy-nan", "Ġtravel")
    for name, m, dtype in [("a1", model, "fp32"), ("a2", model, "fp32"), ("b16", model, "bf16"),
                           ("nan1", poisoned, "fp32")]:
        run_capture(CaptureSettings(model=str(m), prompts=str(PROMPTS), limit=DASH_LIMIT, dtype=dtype, device="cpu"),
                    name=name, data=DataRoot(root), progress=False)
    _unfinished_runs(root)
    DataRoot(root).catalog.write.refresh()
    return root


@pytest.fixture(scope="session")
def dash_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root for the dashboard tests (captures of every status, one with NaN tokens)."""
    return build_dashboard_data(tmp_path_factory.mktemp("dash-data"))


# ---------------------------------------------------------------- core fixtures: tiny real models, demo data


def _save_with_tokenizer(model, tok_dir: Path, out: Path) -> Path:
    from transformers import AutoTokenizer

    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(tok_dir)).save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    from backend.toy.target import build_random_target

    return build_random_target(tmp_path_factory.mktemp("models") / "llama", n_layers=8, hidden=64, seed=0,
                               vocab_size=512)


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory, tiny_llama) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(1)
    cfg = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)
    return _save_with_tokenizer(Qwen3ForCausalLM(cfg), tiny_llama, tmp_path_factory.mktemp("models") / "qwen3")


@pytest.fixture(scope="session")
def tiny_deepseek(tmp_path_factory, tiny_llama) -> Path:
    """A tiny random DeepSeek-V3 (Kimi-K2 architecture: MLA attention, MoE with a shared expert)."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(2)
    cfg = DeepseekV3Config(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                           num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                           num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16,
                           q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=2,
                           topk_group=1, max_position_embeddings=1024)
    return _save_with_tokenizer(DeepseekV3ForCausalLM(cfg), tiny_llama, tmp_path_factory.mktemp("models") / "dsv3")


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory) -> Path:
    """The demo data (every verdict case) in its own data root, fewer prompts than `make demo`."""
    from backend.demo import build_demo

    root = tmp_path_factory.mktemp("demo-data")
    build_demo(DataRoot(root), progress=False, limit=16)
    return root


@pytest.fixture
def data_root(tmp_path, monkeypatch) -> Path:
    """An empty data root, also set as SPECLENS_DATA for code that reads the environment."""
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setenv("SPECLENS_DATA", str(root))
    return root


@pytest.fixture
def prompts_file(tmp_path) -> Path:
    import json

    p = tmp_path / "prompts.jsonl"
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()[:12]]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return p


# ---------------------------------------------------------------- bench runs for the Runs and Compare pages

BENCH_K = 3
BENCH_MAX_NEW = 12


class OracleProposer:
    """Proposes the target's own greedy continuation, right at the first `step % (K+1)` drafts of each verify step
    and wrong after: a drafter with a known, varied acceptance (the random drafter accepts almost nothing)."""

    def __init__(self, lm, seqs: list[list[int]], k: int, max_new: int, vocab: int):
        from backend.engines.hf_spec import Sampler, decode_plain

        self.vocab, self.ref = vocab, {}
        for p in seqs:
            self.ref[tuple(p[1:])] = p + decode_plain(lm, p, max_new + k + 2, Sampler(0.0), set()).tokens

    def start(self, aux, next_ids, positions):
        self.seq, self.step, self.last = self.ref[tuple(next_ids[:-1])], 0, positions[-1]

    def advance(self, aux, next_ids, positions):
        self.step, self.last = self.step + 1, positions[-1]

    def propose(self, k, sampler):
        true = self.seq[self.last + 2: self.last + 2 + k]
        right = self.step % (k + 1)
        return [t if i < right else (t + 1) % self.vocab for i, t in enumerate(true)], None


def build_bench_data(root: Path) -> Path:
    """A tiny target (4 layers, hidden 64, vocab 512), a random EAGLE-3 drafter for it, and with them: the bench
    runs `spec-random` (the random drafter) and `spec-oracle` (scripted proposals with varied acceptance), their
    shared paired baseline `spec-random-baseline`, a capture `cap-tiny`, and tags on `spec-oracle`."""
    import json

    import torch

    from backend import annotations
    from backend.bench import BenchSettings, run_bench
    from backend.capture import CaptureSettings, run_capture
    from backend.drafter import DrafterConfig, Eagle3Drafter, init_random
    from backend.engines import hf
    from backend.prompts import encode, load_prompts
    from backend.toy.target import build_random_target

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        models = root.parent / f"{root.name}-models"
        target = build_random_target(models / "tiny-target", n_layers=4, hidden=64, vocab_size=512)
        cfg = DrafterConfig(hidden_size=64, target_hidden_size=64, num_aux=3, vocab_size=512, draft_vocab_size=512,
                            num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                            aux_layer_ids_nested=[1, 2, 3])
        drafter = init_random(Eagle3Drafter(cfg), 0).save(models / "drafter-random", "eagle")
        rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
        pick = [r for r in rows if r["category"] == "writing"][:2] + [r for r in rows if r["category"] == "math"][:1] \
            + [r for r in rows if r["category"] == "coding"][:1]
        prompts = models / "spec_bench_mini.jsonl"
        prompts.write_text("".join(json.dumps(r) + "\n" for r in pick))
        # runner v1: vLLM's V1 reading of the nested ids [1, 2, 3]; V2 (what vLLM picks for a Llama target) reads
        # none, and its default (2, 2, 1) gives only 2 states on 4 layers
        s = BenchSettings(target=str(target), prompts=str(prompts), drafter=str(drafter), num_spec_tokens=BENCH_K,
                          repeats=2, max_new_tokens=BENCH_MAX_NEW, device="cpu", runner="v1")
        run_bench(s, name="spec-random", data=DataRoot(root), progress=False)
        lm = hf.load(target, "cpu")
        seqs = [encode(lm.tokenizer, p.text) for p in load_prompts(prompts)]
        run_bench(s, name="spec-oracle", data=DataRoot(root), progress=False,
                  proposer=OracleProposer(lm, seqs, BENCH_K, BENCH_MAX_NEW, 512))
        run_capture(CaptureSettings(model=str(target), prompts=str(prompts), limit=2, device="cpu"), name="cap-tiny",
                    data=DataRoot(root), progress=False)
        annotations.save("spec-oracle", tags="oracle,demo", notes="scripted proposals", data=DataRoot(root))
        DataRoot(root).catalog.write.refresh()
    finally:
        torch.set_num_threads(threads)
    return root


@pytest.fixture(scope="session")
def bench_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root with bench runs (tests/conftest.py build_bench_data). Tests that annotate copy it first."""
    return build_bench_data(tmp_path_factory.mktemp("bench-dash") / "data")


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module: on two shared cores it is many times faster for small models than two
    threads fighting for them, and repeatable."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ---------------------------------------------------------------------- markers (registered in pytest.ini)

SLOW_FILES = {"test_reliability", "test_fuzz_ingest", "test_ray", "test_security", "test_vllm_cpu_serve"}
GPU_RECORD_FILES = {"test_h200_records", "test_vllm_adapter", "test_sglang_adapter", "test_load", "test_real_configs"}
_BROWSER_WORDS = ("chromium", "playwright")


def _drives_a_browser(item: pytest.Item, seen: dict) -> bool:
    """A browser test file, or a test whose own code or any fixture it uses (transitively) starts chromium."""
    import inspect

    if item.path.stem.startswith(("test_browser", "test_release_browser")):
        return True
    funcs = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        defs = info.name2fixturedefs.get(name) if info is not None else None
        if defs:
            funcs.append(defs[-1].func)
    for f in funcs:
        if f is None:
            continue
        if f not in seen:
            try:
                seen[f] = any(w in inspect.getsource(f).lower() for w in _BROWSER_WORDS)
            except (OSError, TypeError):
                seen[f] = False
        if seen[f]:
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seen: dict = {}
    for item in items:
        stem = item.path.stem
        if _drives_a_browser(item, seen):
            item.add_marker(pytest.mark.browser)
        if stem in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
        if stem in GPU_RECORD_FILES:
            item.add_marker(pytest.mark.gpu_records)
