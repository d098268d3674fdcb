"""Every real public drafter config in tests/data/real_configs (31: SpecForge current and from its history,
TorchSpec, AngelSlim, speculators #1065, an SGLang test) through the command line, against the truth in
tests/data/real_configs/README.md:

- `check-drafter --lint-only --json` on a config-only target of the stated architecture and depth: what vLLM 0.24.0
  (with the runner it picks) and SGLang 0.5.15 feed, or that they cannot load it;
- `check-drafter --lint-only --trained-on TRAINED --write-fix OUT --engine E --engine-version V` for both engines,
  TRAINED being what the producer's engine fed the drafter: the ids the written config holds and where (vLLM 0.24.0:
  top level; SGLang 0.5.15: eagle_config), everything else in it unchanged, and the release then feeding TRAINED;
  or the one-line refusal ("nothing to fix" where the release already feeds TRAINED, "no fix written" where no ids
  can).

The truth below is copied from the README's tables, which derive it from the engines' code (the wheels' files named
there) and the H200 runs recorded in docs/RELEASES.md, not from SpecLens's output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_real_configs import CONFIGS, REPO, config_only_target, lint_only
from tests.test_real_configs import TRUTH as FIRST_FIVE

KEY = "eagle_aux_hidden_state_layer_ids"
VERSIONS = {"vllm": "0.24.0", "sglang": "0.5.15"}


def S(*b: int) -> list[str]:
    return [f"S_{i}" for i in b]


# file -> (target: arch, model_type, N, H, vocab[, text_config model_type]), vLLM 0.24.0 feeds (None: cannot load),
# the runner vLLM picks, SGLang 0.5.15 feeds (None: cannot load); README table 1
LINT = {**FIRST_FIVE,
        "specforge_gpt-oss-20b.json": (("GptOssForCausalLM", "gpt_oss", 24, 2880, 201088), S(1, 11, 21), "v1",
                                       S(2, 12, 22)),
        "specforge_gpt-oss-120b.json": (("GptOssForCausalLM", "gpt_oss", 36, 2880, 201088), S(1, 17, 33), "v1",
                                        S(2, 18, 34)),
        "specforge_qwen3-235b-a22b.json": (("Qwen3MoeForCausalLM", "qwen3_moe", 94, 4096, 151936), S(1, 46, 90), "v1",
                                           S(2, 47, 91)),
        "specforge_llama3-70b.json": (("LlamaForCausalLM", "llama", 80, 8192, 128256), S(2, 40, 77), "v2",
                                      S(2, 40, 77)),
        "specforge_qwen3-30b-a3b.json": (("Qwen3MoeForCausalLM", "qwen3_moe", 48, 2048, 151936), S(2, 24, 45), "v1",
                                         S(2, 24, 45)),
        "specforge_qwen2.5-7b.json": (("Qwen2ForCausalLM", "qwen2", 28, 3584, 152064), S(2, 14, 25), "v1",
                                      S(2, 14, 25)),
        "specforge_phi4.json": (("Phi3ForCausalLM", "phi3", 40, 5120, 100352), S(2, 20, 37), "v1", S(2, 20, 37)),
        "specforge_deepseek-v2-lite.json": (("DeepseekV2ForCausalLM", "deepseek_v2", 27, 2048, 102400), S(2, 13, 24),
                                            "v2", S(2, 13, 24)),
        "specforge_qwq-32b.json": (("Qwen2ForCausalLM", "qwen2", 64, 5120, 152064), S(2, 32, 61), "v1",
                                   S(2, 32, 61)),
        "specforge_qwen3-coder-480b-a35b.json": (("Qwen3MoeForCausalLM", "qwen3_moe", 62, 6144, 151936),
                                                 S(2, 31, 59), "v1", S(2, 31, 59)),
        "specforge_llama4-scout-17b-16e.json": (("Llama4ForConditionalGeneration", "llama4", 48, 5120, 202048,
                                                 "llama4_text"), S(2, 24, 45), "v1", S(2, 24, 45)),
        "specforge_qwen3-32b.json": (("Qwen3ForCausalLM", "qwen3", 64, 5120, 151936), S(2, 32, 61), "v2",
                                     S(2, 32, 61)),
        "specforge-pr108_kimi-k2.json": (("DeepseekV3ForCausalLM", "kimi_k2", 61, 7168, 163840), S(2, 30, 58), "v1",
                                         S(2, 30, 58)),
        "specforge-hist_qwen3-next-80b-a3b.json": (("Qwen3NextForCausalLM", "qwen3_next", 48, 2048, 151936),
                                                   S(1, 23, 45), "v1", S(2, 24, 46)),
        "specforge-pr431_qwen3-vl-8b.json": (("Qwen3VLForConditionalGeneration", "qwen3_vl", 36, 4096, 151936,
                                              "qwen3_vl_text"), S(3, 17, 32), "v1", S(4, 18, 33)),
        "torchspec_minimax-m25.json": (("MiniMaxM2ForCausalLM", "minimax_m2", 62, 3072, 200064), S(2, 31, 59), "v1",
                                       S(2, 31, 59)),
        "torchspec_kimi-k25-yarn.json": (("DeepseekV3ForCausalLM", "deepseek_v3", 61, 7168, 163840), S(2, 30, 58),
                                         "v1", S(2, 30, 58)),
        "angelslim_qwen3-8b.json": (("Qwen3ForCausalLM", "qwen3", 36, 4096, 151936), S(2, 18, 33), "v2", None),
        "angelslim_qwen3-30b-a3b.json": (("Qwen3MoeForCausalLM", "qwen3_moe", 48, 2048, 151936), S(2, 24, 45), "v1",
                                         None),
        "angelslim_qwen2.5-7b.json": (("Qwen2ForCausalLM", "qwen2", 28, 3584, 152064), S(2, 14, 25), "v1", None),
        "specforge_qwen3-8b.json": (("Qwen3ForCausalLM", "qwen3", 36, 4096, 151936), S(2, 18, 33), "v2",
                                    S(2, 18, 33)),
        "specforge_qwen3-4b.json": (("Qwen3ForCausalLM", "qwen3", 36, 2560, 151936), S(2, 18, 33), "v2",
                                    S(2, 18, 33)),
        "specforge_qwen2.5-0.5b.json": (("Qwen2ForCausalLM", "qwen2", 24, 896, 151936), S(2, 12, 21), "v1",
                                        S(2, 12, 21)),
        "specforge_qwen3-coder-30b-a3b.json": (("Qwen3MoeForCausalLM", "qwen3_moe", 48, 2048, 151936), S(2, 24, 45),
                                               "v1", S(2, 24, 45)),
        "specforge_qwen3-coder-next.json": (("Qwen3NextForCausalLM", "qwen3_next", 48, 2048, 151936), S(2, 24, 45),
                                            "v1", S(2, 24, 45)),
        "specforge_qwen2.5-vl-7b.json": (("Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl", 28, 3584, 152064),
                                         S(2, 14, 25), "v1", S(2, 14, 25)),
        }

NOTHING, REFUSED = ("nothing", None), ("refused", None)
FORMAT, FC = ("refused", "SGLang loads only the EAGLE/SpecForge format"), ("refused", "fc takes 3 aux states")


def top(*ids: int) -> tuple:
    return ("top-level", list(ids))


# file -> what the producer fed it (trained on), the fix for vLLM 0.24.0 and for SGLang 0.5.15; README table 2
FIX = {
    "specforge_llama3-8b.json": (S(2, 16, 29), NOTHING, NOTHING),
    "specforge_deepseek-v3-671b.json": (S(2, 30, 58), top(2, 30, 58), NOTHING),
    "sglang_test_qwen3-8b-eagle3.json": (S(2, 18, 33), NOTHING, NOTHING),
    "speculators_issue1065_qwen3-235b-a22b.json": (S(2, 46, 91, 93), FC, FORMAT),
    "torchspec_kimi-k25-eagle3.json": (S(2, 30, 58), NOTHING, NOTHING),
    "specforge_gpt-oss-20b.json": (S(2, 12, 22), top(2, 12, 22), NOTHING),
    "specforge_gpt-oss-120b.json": (S(2, 18, 34), top(2, 18, 34), NOTHING),
    "specforge_qwen3-235b-a22b.json": (S(2, 47, 91), top(2, 47, 91), NOTHING),
    "specforge_llama3-70b.json": (S(2, 40, 77), NOTHING, NOTHING),
    "specforge_qwen3-30b-a3b.json": (S(2, 24, 45), NOTHING, NOTHING),
    "specforge_qwen2.5-7b.json": (S(2, 14, 25), NOTHING, NOTHING),
    "specforge_phi4.json": (S(2, 20, 37), NOTHING, NOTHING),
    "specforge_deepseek-v2-lite.json": (S(2, 13, 24), NOTHING, NOTHING),
    "specforge_qwq-32b.json": (S(2, 32, 61), NOTHING, NOTHING),
    "specforge_qwen3-coder-480b-a35b.json": (S(2, 31, 59), NOTHING, NOTHING),
    "specforge_llama4-scout-17b-16e.json": (S(2, 24, 45), NOTHING, NOTHING),
    "specforge_qwen3-32b.json": (S(2, 32, 61), NOTHING, NOTHING),
    "specforge-pr108_kimi-k2.json": (S(2, 30, 58), NOTHING, NOTHING),
    "specforge-hist_qwen3-next-80b-a3b.json": (S(2, 24, 46), top(2, 24, 46), NOTHING),
    "specforge-pr431_qwen3-vl-8b.json": (S(4, 18, 33), top(4, 18, 33), NOTHING),
    "torchspec_minimax-m25.json": (S(2, 31, 59), NOTHING, NOTHING),
    "torchspec_kimi-k25-yarn.json": (S(2, 30, 58), NOTHING, NOTHING),
    "angelslim_qwen3-8b.json": (S(2, 18, 33), NOTHING, FORMAT),
    "angelslim_qwen3-30b-a3b.json": (S(2, 24, 45), NOTHING, FORMAT),
    "angelslim_qwen2.5-7b.json": (S(2, 14, 25), NOTHING, FORMAT),
    "specforge_qwen3-8b.json": (S(2, 18, 33), NOTHING, NOTHING),
    "specforge_qwen3-4b.json": (S(2, 18, 33), NOTHING, NOTHING),
    "specforge_qwen2.5-0.5b.json": (S(2, 12, 21), NOTHING, NOTHING),
    "specforge_qwen3-coder-30b-a3b.json": (S(2, 24, 45), NOTHING, NOTHING),
    "specforge_qwen3-coder-next.json": (S(2, 24, 45), NOTHING, NOTHING),
    "specforge_qwen2.5-vl-7b.json": (S(2, 14, 25), NOTHING, NOTHING),
}


def target_dir(tmp: Path, spec: tuple) -> Path:
    """A config-only target; a multimodal one (6th field: the text model_type) nests its sizes in text_config."""
    arch, mt, n, h, v, *text = spec
    if not text:
        return config_only_target(tmp, arch, mt, n, h, v)
    d = tmp / f"{arch}-{n}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": [arch], "model_type": mt,
        "text_config": {"model_type": text[0], "num_hidden_layers": n, "hidden_size": h, "vocab_size": v}}))
    return d


def check(drafter: Path, target: Path, *extra: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "backend", "check-drafter", "--drafter", str(drafter), "--target",
                           str(target), "--lint-only", "--json", *extra], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)


def test_every_config_has_its_truth() -> None:
    """The bar: at least 20 real configs, each with a row in both README tables and both truths here."""
    files = {f.name for f in CONFIGS.glob("*.json")}
    assert files == set(LINT) == set(FIX) and len(files) >= 20
    readme = (CONFIGS / "README.md").read_text()
    for name in files:
        assert readme.count(f"| {name} |") == 2, name


@pytest.mark.parametrize("name", sorted(LINT))
def test_lint_only_feeds(name: str, tmp_path: Path, data_root) -> None:
    spec, vllm_feeds, runner, sglang_feeds = LINT[name]
    rep = lint_only(CONFIGS / name, target_dir(tmp_path, spec), env={"SPECLENS_DATA": str(data_root)})
    picked = {r["engine"]: r for r in rep["lint"] if r["picked"]}
    assert rep["runner_choice"]["runner"] == runner == picked["vllm"]["runner"]
    assert picked["vllm"]["boundaries"] == vllm_feeds
    assert picked["sglang"]["boundaries"] == sglang_feeds
    for eng, feeds in (("vllm", vllm_feeds), ("sglang", sglang_feeds)):
        assert (picked[eng]["error"] is None) == (feeds is not None), picked[eng]["error"]
    if sglang_feeds is None and name.startswith("angelslim"):
        assert "SGLang loads only the EAGLE/SpecForge format" in picked["sglang"]["error"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("name", sorted(FIX))
def test_write_fix(name: str, engine: str, tmp_path: Path, data_root) -> None:
    trained, fix_vllm, fix_sglang = FIX[name]
    kind, want = fix_vllm if engine == "vllm" else fix_sglang
    target = target_dir(tmp_path, LINT[name][0])
    out = tmp_path / "fixed"
    env = {"SPECLENS_DATA": str(data_root)}
    r = check(CONFIGS / name, target, "--trained-on", ",".join(trained), "--write-fix", str(out), "--engine", engine,
              "--engine-version", VERSIONS[engine], env=env)
    report = json.loads(r.stdout.splitlines()[0])               # the check is printed (and stored) before the fix
    if kind in ("nothing", "refused"):
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode != 0 and len(lines) == 1, r.stderr
        assert not out.exists()
        assert "plan" not in report["fix"] and report["fix"]["refused"] in lines[0]
        if kind == "nothing":
            assert "nothing to fix" in lines[0] and ", ".join(trained) in lines[0]
        else:
            assert "no fix written: no ids make" in lines[0] and want in lines[0]
        return
    assert r.returncode == 0, r.stderr[-2000:]
    original = json.loads((CONFIGS / name).read_text())
    expected = json.loads(json.dumps(original))
    if kind == "top-level":
        expected[KEY] = want
    else:
        expected["eagle_config"] = {**(original.get("eagle_config") or {}), KEY: want}
    assert json.loads((out / "config.json").read_text()) == expected      # the ids, in that place, nothing else
    assert report["fix"]["plan"]["ids"] == want and report["fix"]["plan"]["trained_on"] == trained
    assert "Holds for: " in (out / "FIX.md").read_text()
    again = lint_only(out, target, "--engine", engine, "--engine-version", VERSIONS[engine], env=env)
    assert again["engine_feeds"]["boundaries"] == trained
    if engine == "vllm":                                        # top-level ids: both runners read them
        assert all(row["boundaries"] == trained for row in again["lint"] if row["engine"] == "vllm")
