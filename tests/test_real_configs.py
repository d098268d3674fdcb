"""Real public EAGLE-3 drafter configs (tests/data/real_configs, copied unedited from ../shared/real_configs) on
config-only targets of the stated architecture and depth: `check-drafter --lint-only --json`, with no --runner,
names what each engine really feeds (the README's table: vLLM 0.24.0 seen on the H200 for the DeepSeek-V3 and
Llama cases, read in the released code for the others; SGLang 0.5.15 likewise).

Also vLLM 0.24.0's runner choice itself (backend/vllm_runner.py) against the H200 runs (docs/CONVENTIONS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend import vllm_runner
from backend.errors import SpecLensError

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "tests" / "data" / "real_configs"
SHARED = REPO.parent / "shared" / "real_configs"

# file -> (target architecture, model_type, N, H, vocab), what vLLM 0.24.0 feeds (None: cannot load) and the
# runner it picks, what SGLang 0.5.15 feeds (None: cannot load); from tests/data/real_configs/README.md
TRUTH = {
    "specforge_llama3-8b.json": (("LlamaForCausalLM", "llama", 32, 4096, 128256),
                                 ["S_2", "S_16", "S_29"], "v2", ["S_2", "S_16", "S_29"]),
    "specforge_deepseek-v3-671b.json": (("DeepseekV3ForCausalLM", "deepseek_v3", 61, 7168, 129280),
                                        ["S_1", "S_29", "S_57"], "v1", ["S_2", "S_30", "S_58"]),
    "sglang_test_qwen3-8b-eagle3.json": (("Qwen3ForCausalLM", "qwen3", 36, 4096, 151936),
                                         ["S_2", "S_18", "S_33"], "v2", ["S_2", "S_18", "S_33"]),
    "speculators_issue1065_qwen3-235b-a22b.json": (("Qwen3MoeForCausalLM", "qwen3_moe", 94, 4096, 151936),
                                                   None, "v1", None),
    "torchspec_kimi-k25-eagle3.json": (("DeepseekV3ForCausalLM", "deepseek_v3", 61, 7168, 163840),
                                       ["S_2", "S_30", "S_58"], "v1", ["S_2", "S_30", "S_58"]),
}


def config_only_target(tmp: Path, arch: str, model_type: str, n: int, h: int, vocab: int) -> Path:
    """A target directory holding only config.json: nothing of the 671B weights is needed for the lint."""
    d = tmp / f"{arch}-{n}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": model_type,
                                               "num_hidden_layers": n, "hidden_size": h, "vocab_size": vocab}))
    return d


def lint_only(drafter: Path, target: Path, *extra: str, env: dict | None = None) -> dict:
    import os

    out = subprocess.run([sys.executable, "-m", "backend", "check-drafter", "--drafter", str(drafter), "--target",
                          str(target), "--lint-only", "--json", *extra], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, **(env or {})}, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_copies_are_unedited() -> None:
    if not SHARED.is_dir():
        pytest.skip("../shared/real_configs not beside this checkout")
    for f in SHARED.glob("*.json"):        # the configs; the README here grew rows for the configs added since
        assert (CONFIGS / f.name).read_bytes() == f.read_bytes(), f.name


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_lint_only_names_what_each_engine_feeds(name: str, tmp_path: Path, data_root) -> None:
    (arch, mt, n, h, v), vllm_feeds, runner, sglang_feeds = TRUTH[name]
    target = config_only_target(tmp_path, arch, mt, n, h, v)
    t0 = time.perf_counter()
    rep = lint_only(CONFIGS / name, target, env={"SPECLENS_DATA": str(data_root)})
    assert time.perf_counter() - t0 < 10          # the bar is 2 s for the command itself (bench/lint_only_bench.py)
    assert rep["mode"] == "lint" and rep["candidates"] == [] and rep["best_candidate"] is None
    assert rep["runner_choice"]["runner"] == runner and rep["runner_choice"]["requested"] == "auto"
    picked = {(r["engine"]): r for r in rep["lint"] if r["picked"]}
    assert set(picked) == {"vllm", "sglang"}
    assert picked["vllm"]["runner"] == runner
    assert picked["vllm"]["boundaries"] == vllm_feeds
    assert picked["sglang"]["boundaries"] == sglang_feeds
    assert rep["engine_feeds"]["boundaries"] == vllm_feeds      # the verdict is about vLLM by default
    if vllm_feeds is None:                                        # speculators #1065: 4 ids, fc built for 3
        assert picked["vllm"]["captures"] == ["S_2", "S_46", "S_91", "S_93"]
        assert "fc takes 3 aux states" in picked["vllm"]["error"]
        assert rep["verdict_severity"] == "error"
        assert "SGLang loads only the EAGLE/SpecForge format" in picked["sglang"]["error"]
    assert "no model loaded" in rep["verdict"]


def test_lint_only_sglang_verdict_and_forced_runner(tmp_path: Path, data_root) -> None:
    """--engine sglang makes SGLang the verdict's engine; VLLM_USE_V2_MODEL_RUNNER=1 flips DeepSeek-V3 to V2, which
    ignores the nested ids (and the lint says so)."""
    (arch, mt, n, h, v), *_ = TRUTH["specforge_deepseek-v3-671b.json"]
    target = config_only_target(tmp_path, arch, mt, n, h, v)
    env = {"SPECLENS_DATA": str(data_root)}
    rep = lint_only(CONFIGS / "specforge_deepseek-v3-671b.json", target, "--engine", "sglang", env=env)
    assert rep["engine_feeds"]["boundaries"] == ["S_2", "S_30", "S_58"] and rep["engine"] == "sglang"
    forced = lint_only(CONFIGS / "specforge_deepseek-v3-671b.json", target,
                       env={**env, "VLLM_USE_V2_MODEL_RUNNER": "1"})
    assert (forced["runner_choice"]["runner"] == "v2"
            and "VLLM_USE_V2_MODEL_RUNNER=1" in forced["runner_choice"]["reason"])
    assert forced["engine_feeds"]["boundaries"] == ["S_2", "S_30", "S_58"]
    assert any("ignores them" in f["text"] and f["severity"] == "error" for f in forced["findings"])
    pp = lint_only(CONFIGS / "specforge_llama3-8b.json", config_only_target(tmp_path, "LlamaForCausalLM", "llama", 32,
                                                                            4096, 128256),
                   "--engine-option", "pipeline_parallel_size=2", env=env)
    assert pp["runner_choice"]["runner"] == "v1" and "EAGLE3 with pipeline parallelism" in pp["runner_choice"]["reason"]


def test_lint_only_is_stored_and_shown(tmp_path: Path, data_root) -> None:
    """A lint-only check is a check run the Drafter check page can open (AppTest; the browser test screenshots it)."""
    from streamlit.testing.v1 import AppTest

    (arch, mt, n, h, v), *_ = TRUTH["torchspec_kimi-k25-eagle3.json"]
    rep = lint_only(CONFIGS / "torchspec_kimi-k25-eagle3.json", config_only_target(tmp_path, arch, mt, n, h, v),
                    env={"SPECLENS_DATA": str(data_root)})
    at = AppTest.from_file(str(REPO / "pages" / "drafter_check.py"), default_timeout=30)
    at.query_params["run"] = rep["run_id"]
    at.run()
    assert not at.exception, at.exception
    text = " ".join(c.value for c in at.caption)
    assert "Lint only" in text and "V1" in text
    assert any("S_2, S_30, S_58" in str(df.value.to_dict()) for df in at.dataframe)


def test_bad_config_files_give_one_line_errors(tmp_path: Path, data_root) -> None:
    import os

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    target = config_only_target(tmp_path, "LlamaForCausalLM", "llama", 32, 4096, 128256)
    for drafter, tgt, want in ((bad, target, "bad.json: not valid JSON"),
                               (CONFIGS / "specforge_llama3-8b.json", tmp_path / "nowhere", "nowhere/config.json: no"),
                               (CONFIGS / "specforge_deepseek-v3-671b.json", target, "(no target_hidden_size) 7168")):
        out = subprocess.run([sys.executable, "-m", "backend", "check-drafter", "--drafter", str(drafter), "--target",
                              str(tgt), "--lint-only"], cwd=REPO, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "SPECLENS_DATA": str(data_root)})
        assert out.returncode != 0
        lines = [ln for ln in out.stderr.strip().splitlines() if ln.strip()]
        assert len(lines) == 1 and want in lines[0], out.stderr


# ---------------------------------------------------------------------------- the runner choice itself

@pytest.mark.parametrize("archs,env,opts,want", [
    # docs/CONVENTIONS.md#vllm-runner, seen on the H200 (vLLM 0.24.0, aux layers read from the running model)
    (["DeepseekV3ForCausalLM"], {}, {}, "v1"),
    (["Qwen3MoeForCausalLM"], {}, {}, "v1"),
    (["Qwen3ForCausalLM"], {}, {}, "v2"),
    (["LlamaForCausalLM"], {}, {}, "v2"),
    (["GptOssForCausalLM"], {}, {}, "v1"),
    (["LlamaForCausalLM"], {"VLLM_USE_V2_MODEL_RUNNER": "0"}, {}, "v1"),
    # read in vllm/config/vllm.py of 0.24.0 (not run)
    (["DeepseekV3ForCausalLM"], {"VLLM_USE_V2_MODEL_RUNNER": "1"}, {}, "v2"),
    (["LlamaForCausalLM"], {}, {"pipeline_parallel_size": 2}, "v1"),
    (["LlamaForCausalLM"], {}, {"enable_dbo": True}, "v1"),
    (["LlamaForCausalLM"], {}, {"compilation_config": {"mode": 1}}, "v1"),
    (["LlamaForCausalLM"], {}, {"compilation_config": '{"mode": 3}'}, "v2"),
    (["LlamaForCausalLM"], {}, {"tensor_parallel_size": 2, "compilation_config": {"pass_config": {"enable_sp": True}}},
     "v1"),
    (["LlamaForCausalLM"], {}, {"tensor_parallel_size": 4}, "v2"),
    (["MistralForCausalLM"], {}, {"logprobs_mode": "raw_logits"}, "v1"),
    ([], {}, {}, "v1"),
])
def test_runner_choice(archs, env, opts, want) -> None:
    c = vllm_runner.resolve("auto", archs, "0.24.0", opts, env)
    assert c.runner == want, c.reason
    assert c.reason


def test_runner_errors() -> None:
    with pytest.raises(SpecLensError, match="not known to SpecLens"):
        vllm_runner.resolve("auto", ["LlamaForCausalLM"], "0.19.0", {}, {})
    with pytest.raises(SpecLensError, match=r"reads it as bool\(int\(value\)\).*set VLLM_USE_V2_MODEL_RUNNER=1 for V2"):
        vllm_runner.resolve("auto", ["LlamaForCausalLM"], "0.24.0", {}, {"VLLM_USE_V2_MODEL_RUNNER": "maybe"})
    assert vllm_runner.resolve("v1", ["LlamaForCausalLM"], "0.19.0").runner == "v1"     # given: taken as is
