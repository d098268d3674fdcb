"""Engine releases: the conventions table over vLLM 0.20..0.33 and SGLang 0.5.1..0.5.23 (derived from the wheels by
tools/rederive_conventions.py), vLLM's runner choice per release, the H200 runs of vLLM 0.24.0 and 0.25.1, and
`python -m backend feeds` (the SGLang 0.5.17 and vLLM 0.25.1 toy runs: tests/test_h200_records.py).
No wheel is downloaded here: docs/results/conventions_derived.json holds what the script
read from them, and the table is checked against it (the script itself re-reads the wheels)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from backend import coords, feeds, vllm_runner
from backend.drafter.aux import drafter_aux_boundaries
from backend.drafter.config import load_config
from backend.errors import SpecLensError

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "tests" / "data" / "real_configs"
RESULTS = REPO / "docs" / "results"
sys.path.insert(0, str(REPO / "tools"))
import rederive_conventions as rc  # noqa: E402

DERIVED = json.loads((RESULTS / "conventions_derived.json").read_text())


# ---------------------------------------------------------------------------------------- the table


def test_table_covers_every_release_with_citations() -> None:
    vllm = coords.releases("vllm")
    assert {".".join(v.split(".")[:2]) for v in vllm} == {f"0.{m}" for m in range(20, 34)}
    assert coords.releases("sglang") == [f"0.5.{i}" for i in range(1, 24)]
    for c in coords.conventions():
        if c.producer not in ("vllm", "sglang"):
            continue
        assert c.wheels and all(len(w["sha256"]) == 64 and w["code"] for w in c.wheels.values())
        assert c.decided_by and all(": " in v for v in c.decided_by.values())          # "file: function"
        if c.producer == "vllm":
            assert c.runner_choice.get("selection") and set(c.ids_from) == {"v1", "v2"}
        if c.status == "seen":
            assert c.seen
    seen = sorted({(c.producer, c.versions) for c in coords.conventions() if c.status == "seen"
                   and c.producer in ("vllm", "sglang")})
    assert seen == [("sglang", ">=0.5.15,<0.5.16"), ("sglang", ">=0.5.17,<0.5.18"), ("vllm", ">=0.24,<0.25"),
                    ("vllm", ">=0.25,<0.26")]


def test_table_agrees_with_what_the_wheels_say() -> None:
    rows = rc.vllm_rows(DERIVED["vllm"]) + rc.sglang_rows(DERIVED["sglang"])
    _, table, _ = rc.table_parts()
    assert rc.compare(rows, table) == []


def test_the_check_fails_on_a_change_the_table_does_not_say() -> None:
    import copy

    facts = copy.deepcopy(DERIVED)
    last = facts["sglang"][-1]
    last["families"]["gpt_oss"]["rule"] = "after"                         # a release whose code says otherwise
    key = next(iter(last["code"]))
    last["code"][key] = "0" * 12                                           # and whose function changed
    _, table, _ = rc.table_parts()
    diffs = rc.compare(rc.vllm_rows(facts["vllm"]) + rc.sglang_rows(facts["sglang"]), table)
    assert any("rule is after in the wheel" in d for d in diffs)
    assert any("code at" in d and "changed" in d for d in diffs)


def test_parsers_on_small_sources(tmp_path: Path) -> None:
    import ast

    src = '''
class X:
    def set_eagle3_layers_to_capture(self, layer_ids=None):
        if layer_ids is None:
            num_layers = self.config.num_hidden_layers
            self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        elif layer_ids and layer_ids[0] == 1:
            self.model.layers_to_capture = [val + 1 for val in layer_ids]
        else:
            self.model.layers_to_capture = list(layer_ids)
'''
    fn = ast.parse(src).body[0].body[0]
    assert rc.sglang_rule(fn) == ("after_if_first_1", ["2", "N//2", "N-3"])
    feats = ast.parse('''
def f(self):
    u = []
    u.append("dual batch overlap")
    u.append(f"logprobs mode '{self.m}'")
    return u
''').body[0]
    assert rc.appended_features(feats) == ["dual batch overlap", "logprobs mode"]


def test_what_changed_between_releases() -> None:
    v = {f["version"]: f for f in DERIVED["vllm"]}
    assert v["0.21.0"]["ids_from"] == {"v1": "top_level", "v2": "top_level"}          # V1 nested from 0.22
    assert v["0.22.0"]["ids_from"]["v1"] == "top_then_nested"
    assert v["0.27.0"]["ids_from"]["v2"] == "top_then_nested_layer_ids"
    assert [v[x]["runner_choice"]["selection"] for x in ("0.20.0", "0.22.0", "0.23.0", "0.24.0", "0.25.0", "0.29.0")] \
        == ["env_only", "listed_dense_unquantized", "listed_dense_unquantized", "listed", "listed_or_dense", "all"]
    s = {f["version"]: f["families"] for f in DERIVED["sglang"]}
    assert s["0.5.4"]["deepseek_v2"]["rule"] == "unsupported" and s["0.5.5"]["deepseek_v2"]["rule"] == "after"
    assert s["0.5.12"]["deepseek_v2"]["rule"] == "after" and s["0.5.13"]["deepseek_v2"]["rule"] == "after_if_first_1"
    assert s["0.5.16"]["gpt_oss"]["rule"] == "after" and s["0.5.17"]["gpt_oss"]["rule"] == "input_if_max_n"


# ---------------------------------------------------------------------------------------- vLLM runner per release

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32}
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 36}
QMOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_hidden_layers": 48,
        "num_experts": 128}
DSV3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": 61,
        "n_routed_experts": 256}
DSV2 = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "num_hidden_layers": 27,
        "n_routed_experts": 64}


@pytest.mark.parametrize("version,cfg,env,want", [
    ("0.20.2", LLAMA, {}, "v1"), ("0.21.0", QWEN3, {}, "v1"),
    ("0.21.0", QWEN3, {"VLLM_USE_V2_MODEL_RUNNER": "1"}, "v2"),
    ("0.22.1", QWEN3, {}, "v2"), ("0.22.1", LLAMA, {}, "v1"),
    ("0.23.0", LLAMA, {}, "v2"), ("0.23.0", {**LLAMA, "quantization_config": {"quant_method": "fp8"}}, {}, "v1"),
    ("0.24.0", LLAMA, {}, "v2"), ("0.24.0", QMOE, {}, "v1"), ("0.24.0", DSV2, {}, "v2"), ("0.24.0", DSV3, {}, "v1"),
    ("0.25.1", LLAMA, {}, "v2"), ("0.25.1", QMOE, {}, "v1"), ("0.25.1", DSV3, {}, "v1"), ("0.25.1", DSV2, {}, "v2"),
    ("0.28.0", QMOE, {}, "v1"), ("0.29.0", QMOE, {}, "v2"), ("0.33.0", DSV3, {}, "v2"),
    ("0.33.0", DSV3, {"VLLM_USE_V2_MODEL_RUNNER": "0"}, "v1"),
])
def test_runner_per_release(version, cfg, env, want) -> None:
    assert vllm_runner.resolve("auto", cfg["architectures"], version, {}, env, target_config=cfg).runner == want


def test_runner_options_per_release() -> None:
    raw = {"logprobs_mode": "raw_logits"}
    assert vllm_runner.resolve("auto", ["LlamaForCausalLM"], "0.25.1", raw, {}, target_config=LLAMA).runner == "v1"
    assert vllm_runner.resolve("auto", ["LlamaForCausalLM"], "0.26.0", raw, {}, target_config=LLAMA).runner == "v2"
    pcp = {"prefill_context_parallel_size": 2}
    assert vllm_runner.resolve("auto", ["Qwen3MoeForCausalLM"], "0.27.1", pcp, {}, target_config=QMOE).runner == "v2"
    assert vllm_runner.resolve("auto", ["LlamaForCausalLM"], "0.24.0", pcp, {}, target_config=LLAMA).runner == "v1"
    with pytest.raises(SpecLensError, match="not known to SpecLens"):
        vllm_runner.resolve("auto", ["LlamaForCausalLM"], "0.34.0", {}, {})


@pytest.mark.parametrize("release", ["0.24.0", "0.25.1"])
def test_h200_runs_match_the_table(release: str) -> None:
    """Every case vLLM ran on the H200 (gpu/runner_check.py): the runner and the aux layers SpecLens predicts
    from the table are what the running engine used."""
    cases = json.loads((RESULTS / f"vllm_runner_check_{release}_h200.json").read_text())["cases"]
    ran = 0
    for name, c in cases.items():
        e = c.get("engine") or {}
        if not e.get("aux_layers"):
            continue                                       # the engine did not start for this case
        t = c["target_config"]
        choice = vllm_runner.resolve("auto", t["architectures"], release, c["options"], c["env"], target_config=t)
        assert choice.runner == ("v2" if e["use_v2_model_runner"] else "v1"), name
        aux = drafter_aux_boundaries(load_config(CONFIGS / c["drafter_config"]), t["num_hidden_layers"],
                                     t["model_type"], "vllm", release, choice.runner)
        assert aux["boundaries"] == [f"S_{i}" for i in e["aux_layers"]], name
        ran += 1
    assert ran >= 4


# ---------------------------------------------------------------------------------------- feeds


def _pair(tmp: Path, config: str, arch: str, model_type: str, n: int, h: int, vocab: int) -> tuple[Path, Path]:
    d, t = tmp / "drafter", tmp / "target"
    d.mkdir()
    t.mkdir()
    shutil.copy(CONFIGS / config, d / "config.json")
    (t / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": model_type,
                                               "num_hidden_layers": n, "hidden_size": h, "vocab_size": vocab}))
    return d, t


def test_feeds_matrix_deepseek(tmp_path: Path, data_root) -> None:
    d, t = _pair(tmp_path, "specforge_deepseek-v3-671b.json", "DeepseekV3ForCausalLM", "deepseek_v3", 61, 7168, 129280)
    m = feeds.matrix(d, t)
    rows = {(r["engine"], r["release"], r["runner"]): r for r in m["rows"]}
    assert (rows[("vllm", "0.24.0", "v1")]["picked"]
            and rows[("vllm", "0.24.0", "v1")]["feeds"] == ["S_1", "S_29", "S_57"])
    assert rows[("vllm", "0.24.0", "v1")]["status"] == "seen" and rows[("vllm", "0.25.0", "v1")]["status"] == "inferred"
    assert rows[("vllm", "0.21.0", "v1")]["feeds"] == ["S_2", "S_30", "S_58"]         # V1 read no nested ids yet
    assert (rows[("vllm", "0.33.0", "v2")]["picked"]
            and rows[("vllm", "0.33.0", "v2")]["feeds"] == ["S_2", "S_30", "S_58"])
    assert rows[("sglang", "0.5.4", None)]["feeds"] is None and "no EAGLE-3" in rows[("sglang", "0.5.4", None)]["error"]
    picked = [c for c in m["changes"] if c["engine"] == "vllm" and c["track"] == "picked"]
    assert [c["release"] for c in picked] == ["0.22.0", "0.29.0"] and picked[0]["first"]
    # marked against what a drafter check found it was trained on
    m2 = feeds.matrix(d, t, trained={"run_id": "check-x", "boundaries": ["S_2", "S_30", "S_58"], "severity": "ok"})
    r2 = {(r["engine"], r["release"], r["runner"]): r for r in m2["rows"]}
    assert r2[("vllm", "0.24.0", "v1")]["trained"] == "differs" and r2[("vllm", "0.33.0", "v2")]["trained"] == "matches"


def test_feeds_cli_json(tmp_path: Path, data_root) -> None:
    d, t = _pair(tmp_path, "specforge_llama3-8b.json", "LlamaForCausalLM", "llama", 32, 4096, 128256)
    out = subprocess.run([sys.executable, "-m", "backend", "feeds", "--drafter", str(d), "--target", str(t), "--json"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)
    assert len(m["rows"]) == 2 * len(coords.releases("vllm")) + len(coords.releases("sglang"))
    assert all(r["feeds"] == ["S_2", "S_16", "S_29"] for r in m["rows"] if r["feeds"])
    bad = subprocess.run([sys.executable, "-m", "backend", "feeds", "--drafter", str(d)], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_feeds_of_the_real_configs_over_every_release(tmp_path: Path, data_root) -> None:
    """docs/results/feeds_real_configs.json (what `feeds` says for the five real configs, picked runner per release)
    is what the table gives now: a change to the table that moves a real config's feeds shows here."""
    stored = json.loads((RESULTS / "feeds_real_configs.json").read_text())["configs"]
    for name, rec in stored.items():
        d, t = tmp_path / name / "drafter", tmp_path / name / "target"
        d.mkdir(parents=True)
        t.mkdir()
        shutil.copy(CONFIGS / name, d / "config.json")
        (t / "config.json").write_text(json.dumps(rec["target"]))
        m = feeds.matrix(d, t, look_up_check=False)
        got = {f"{r['engine']} {r['release']}": (f"{(r['runner'] or '').upper()} " if r["runner"] else "")
               + (", ".join(r["feeds"]) if r["feeds"] else "cannot serve: " + (r["error"] or "")[:140])
               for r in m["rows"] if r["picked"]}
        cut = lambda v: v.split("cannot serve")[0] + "cannot serve" if "cannot serve" in v else v  # noqa: E731 - paths
        assert {k: cut(v) for k, v in got.items()} == {k: cut(v) for k, v in rec["picked"].items()}, name
        assert m["changes"] == rec["changes"], name


# ---------------------------------------------------------------------------------------- conditions that force V2

FORCING = {  # the engine options that turn each forced condition on, every spelling resolve() accepts
    "HiSparse": [{"hisparse_config": {}}, {"attention_config.hisparse_config": {"topk": 2048}},
                 {"attention_config": {"hisparse_config": {}}}, {"attention_config": '{"hisparse_config": {}}'}],
    "watermarking": [{"watermark_config": {}}],
}
V1_OPTIONS = {  # one engine option per V2-unsupported feature, to find a case a release runs on V1
    "logprobs mode": {"logprobs_mode": "raw_logits"}, "custom logits processors": {"logits_processors": ["m:P"]},
    "stock torch.compile": {"compilation_config": {"mode": 1}}, "prompt embeds": {"enable_prompt_embeds": True},
    "pipeline parallelism with external_launcher": {"distributed_executor_backend": "external_launcher",
                                                    "pipeline_parallel_size": 2},
}


def _rc(version: str) -> dict:
    return coords.convention_for("vllm", version, "*").runner_choice


def _releases(with_checks: bool) -> list[str]:
    out = []
    for v in coords.releases("vllm"):
        rc = _rc(v)
        has = set(FORCING) <= set(rc.get("forces_v2") or [])
        if has == with_checks and (with_checks or rc.get("selection") != "env_only" or v == "0.21.0"):
            out.append(v)
    return out


def _v1_case(version: str) -> tuple[dict, dict]:
    """A target and engine options `version` runs on V1 (nothing forcing): DeepSeek-V3 where that release keeps it
    on V1, else a V2-unsupported feature the release's row lists."""
    for target in (DSV3, LLAMA):
        for feat in [None, *(_rc(version).get("unsupported") or [])]:
            if feat is not None and feat not in V1_OPTIONS:
                continue
            o = dict(V1_OPTIONS[feat]) if feat else {}
            c = vllm_runner.resolve("auto", target["architectures"], version, o, {}, target_config=target)
            if c.runner == "v1":
                return target, o
    raise AssertionError(f"vLLM {version}: no V1 case found among {sorted(V1_OPTIONS)}")


def test_which_releases_force_v2_for_hisparse_and_watermarking() -> None:
    """As read from each wheel's VllmConfig.use_v2_model_runner (0.30.0's: `if self.attention_config.hisparse_config
    is not None:` raising with VLLM_USE_V2_MODEL_RUNNER=0, then `if getattr(self, "watermark_config", None) is not
    None:` logging that it overrides =0, both before the variable is read)."""
    with_checks = set(_releases(True))
    assert with_checks and all(Version(v) >= Version("0.30") for v in with_checks)
    for f in DERIVED["vllm"]:                              # every wheel read, patch releases included
        rcf = f["runner_choice"]
        has = [n for n in rcf.get("forces_v2") or [] if n in FORCING]
        row_has = set(FORCING) <= set(_rc(f["version"]).get("forces_v2") or [])
        assert (has == list(FORCING)) == row_has, f["version"]
        if has:
            assert rcf["forces_v2_env0"] == {"HiSparse": "error", "watermarking": "overrides"}, f["version"]
        if "prefill context parallelism" in (rcf.get("forces_v2") or []):
            assert rcf["forces_v2_env0"]["prefill context parallelism"] == "env_wins", f["version"]
    note = rc.forced_note(DERIVED["vllm"])
    assert "HiSparse" in note and "watermarking" in note and note in (REPO / "docs" / "RELEASES.md").read_text()


@pytest.mark.parametrize("version", [_releases(True)[0], _releases(True)[-1]])
def test_hisparse_and_watermarking_force_v2(version: str) -> None:
    env0 = _rc(version)["forces_v2_env0"]
    target, v1_opts = _v1_case(version)
    archs = target["architectures"]
    for name, spellings in FORCING.items():
        for o in spellings:
            c = vllm_runner.resolve("auto", archs, version, {**v1_opts, **o}, {}, target_config=target)
            assert c.runner == "v2", (name, o, c.reason)
            assert f"{name} forces V2 in vLLM {version}" in c.reason and "use_v2_model_runner" in c.reason
            one = vllm_runner.resolve("auto", archs, version, {**v1_opts, **o}, {"VLLM_USE_V2_MODEL_RUNNER": "1"},
                                      target_config=target)
            assert one.runner == "v2"
            zero = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
            if env0[name] == "error":
                with pytest.raises(SpecLensError, match=f"vLLM {version} refuses {name}") as e:
                    vllm_runner.resolve("auto", archs, version, {**v1_opts, **o}, zero, target_config=target)
                msg = str(e.value)
                assert "\n" not in msg and "remove VLLM_USE_V2_MODEL_RUNNER=0" in msg and "drop hisparse_config" in msg
            else:
                c0 = vllm_runner.resolve("auto", archs, version, {**v1_opts, **o}, zero, target_config=target)
                assert c0.runner == "v2" and "overrides VLLM_USE_V2_MODEL_RUNNER=0" in c0.reason
    # unset / null configs do not count; the variable alone still decides
    assert vllm_runner.resolve("auto", archs, version, {**v1_opts, "watermark_config": None,
                                                        "attention_config": {"hisparse_config": None}}, {},
                               target_config=target).runner == "v1"
    assert vllm_runner.resolve("auto", ["LlamaForCausalLM"], version, {}, {"VLLM_USE_V2_MODEL_RUNNER": "0"},
                               target_config=LLAMA).runner == "v1"
    # --runner given is taken as given (the user says what the engine runs)
    assert vllm_runner.resolve("v1", archs, version, {"watermark_config": {}}, {}).runner == "v1"


@pytest.mark.parametrize("version", [_releases(False)[-1], "0.25.1", "0.21.0"])
def test_hisparse_and_watermarking_change_nothing_before_the_checks(version: str) -> None:
    assert version in _releases(False)
    target, v1_opts = _v1_case(version)
    archs = target["architectures"]
    for env in ({}, {"VLLM_USE_V2_MODEL_RUNNER": "0"}, {"VLLM_USE_V2_MODEL_RUNNER": "1"}):
        base = vllm_runner.resolve("auto", archs, version, v1_opts, env, target_config=target)
        for spellings in FORCING.values():
            for o in spellings:
                c = vllm_runner.resolve("auto", archs, version, {**v1_opts, **o}, env, target_config=target)
                assert c.runner == base.runner, (version, o, env)
                assert c.reason.startswith(base.reason) and "does not force V2" in c.reason
    assert base.runner == "v2" and vllm_runner.resolve("auto", archs, version, v1_opts, {},
                                                       target_config=target).runner == "v1"


def test_forced_v2_parser_on_small_sources() -> None:
    import ast

    def parse(body: str):
        return rc.forced_v2(ast.parse("class VllmConfig:\n    @property\n    def use_v2_model_runner(self):\n"
                                      + "\n".join("        " + ln for ln in body.strip().splitlines())).body[0].body[0],
                            "x")

    after = '''
u = envs.VLLM_USE_V2_MODEL_RUNNER
if u is not None:
    return u
if self.parallel_config.prefill_context_parallel_size > 1:
    return True
return False
'''
    assert parse(after) == (["prefill context parallelism"], {"prefill context parallelism": "env_wins"})
    before = '''
if self.attention_config.hisparse_config is not None:
    if envs.VLLM_USE_V2_MODEL_RUNNER is False:
        raise ValueError("no")
    return True
if getattr(self, "watermark_config", None) is not None:
    if envs.VLLM_USE_V2_MODEL_RUNNER is False:
        logger.info_once("overrides")
    return True
u = envs.VLLM_USE_V2_MODEL_RUNNER
if u is not None:
    return u
return True
'''
    assert parse(before) == (["HiSparse", "watermarking"], {"HiSparse": "error", "watermarking": "overrides"})
    moved = before.replace("u = envs.VLLM_USE_V2_MODEL_RUNNER\nif u is not None:\n    return u\n", "")
    moved = "u = envs.VLLM_USE_V2_MODEL_RUNNER\nif u is not None:\n    return u\n" + moved
    assert parse(moved)[1] == {"HiSparse": "env_wins", "watermarking": "env_wins"}
    with pytest.raises(rc.Drift, match="watermark"):
        parse("if self.watermark_config:\n    return False\nreturn True")


def test_every_unsupported_feature_the_table_names_has_a_predicate() -> None:
    """A feature a release's `_get_v2_model_runner_unsupported_features()` appends (as the wheels word it) that
    `vllm_runner.UNSUPPORTED` does not know would be skipped silently, and its V1 fallback never predicted."""
    import yaml

    from backend.vllm_runner import UNSUPPORTED

    names: set[str] = set()

    def walk(x) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "unsupported" and isinstance(v, list):
                    names.update(v)
                else:
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(yaml.safe_load((Path(__file__).resolve().parents[1] / "backend" / "conventions.yaml").read_text()))
    assert names and sorted(n for n in names if n not in UNSUPPORTED) == []


def test_newer_feature_wordings_send_a_target_to_v1() -> None:
    from backend.vllm_runner import resolve

    llama = ["LlamaForCausalLM"]
    assert resolve("auto", llama, "0.30.0", env={}).runner == "v2"
    assert resolve("auto", llama, "0.30.0", {"mamba_cache_mode": "all"}, env={}).runner == "v1"
    assert resolve("auto", llama, "0.32.0", {"speculative_config": {"use_heterogeneous_vocab": True}},
                   env={}).runner == "v1"


# ---------------------------------------------------------------------------------------- families per file, env values


def test_entryclass_and_inheritance_on_a_small_source_tree(tmp_path: Path) -> None:
    m = tmp_path / "sglang/srt/models"
    m.mkdir(parents=True)
    (m / "llama.py").write_text('''
class LlamaForCausalLM(nn.Module):
    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.model.layers_to_capture = [val + 1 for val in layer_ids]
class Phi3ForCausalLM(LlamaForCausalLM):
    pass
EntryClass = [LlamaForCausalLM, Phi3ForCausalLM]
''')
    (m / "mistral.py").write_text('''from sglang.srt.models.llama import LlamaForCausalLM
class MistralForCausalLM(LlamaForCausalLM):
    pass
EntryClass = MistralForCausalLM
''')
    (m / "qwen2.py").write_text('''from sglang.srt.models.llama import LlamaForCausalLM as L
class Mixin:
    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.model.layers_to_capture = list(layer_ids)
class Qwen2ForCausalLM(Mixin, L):
    pass
class Plain(nn.Module):
    pass
EntryClass = [Qwen2ForCausalLM, Plain]
''')
    got = rc.sglang_architectures(tmp_path)
    assert got["MistralForCausalLM"]["capture"] == {"file": "llama.py", "class": "LlamaForCausalLM"}
    assert got["Phi3ForCausalLM"]["capture"]["class"] == "LlamaForCausalLM"
    assert got["Qwen2ForCausalLM"]["capture"] == {"file": "qwen2.py", "class": "Mixin"}     # method order: Mixin first
    assert got["Plain"]["capture"] is None and got["Plain"]["entry"] == "qwen2.py"


def test_sglang_families_are_checked_against_the_wheel() -> None:
    import copy

    facts = copy.deepcopy(DERIVED["sglang"])
    last = facts[-1]
    last["architectures"]["DeepseekV3ForCausalLM"]["capture"] = "llama.py: LlamaForCausalLM"
    with pytest.raises(rc.Drift, match="DeepseekV3ForCausalLM .model_type deepseek_v3. takes"):
        rc.sglang_rows([last])
    # SGLang 0.5.1 registers Qwen2ForCausalLM without a capture: a row of its own, and coords finds it
    first = rc.sglang_rows(DERIVED["sglang"][:1])
    assert [r["families"] for r in first if r["rule"] == "unsupported" and r["families"] == ["qwen2"]]
    assert coords.convention_for("sglang", "0.5.1", "qwen2").rule == "unsupported"
    assert coords.convention_for("sglang", "0.5.2", "qwen2").rule == "after"
    # 0.5.8+: Glm4MoeLiteForCausalLM inherits DeepseekV2ForCausalLM's capture
    assert coords.convention_for("sglang", "0.5.8", "glm4_moe_lite").rule == \
        coords.convention_for("sglang", "0.5.8", "deepseek_v3").rule


def test_vllm_deepseek_architectures_from_inheritance(tmp_path: Path) -> None:
    p = tmp_path / "deepseek_v2.py"
    p.write_text('''
class DeepseekV2ForCausalLM(nn.Module):
    def get_eagle3_aux_hidden_state_layers(self):
        return (2, 3)
class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    pass
class Own(DeepseekV2ForCausalLM):
    def get_eagle3_aux_hidden_state_layers(self):
        return (1,)
''')
    assert rc.deepseek_architectures(p) == ["DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"]
    for f in DERIVED["vllm"]:
        assert {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"} <= set(f["deepseek_architectures"])


def test_env_values_per_release_drive_resolve() -> None:
    for v in ("0.20.0", "0.29.0", "0.30.0", "0.33.0"):
        assert coords.convention_for("vllm", v, "*").runner_choice["env_values"] == "integer"
    archs = ["LlamaForCausalLM"]
    for v in ("0.29.0", "0.30.0"):
        assert vllm_runner.resolve("auto", archs, v, {}, {"VLLM_USE_V2_MODEL_RUNNER": "0"}).runner == "v1"
        assert vllm_runner.resolve("auto", archs, v, {}, {"VLLM_USE_V2_MODEL_RUNNER": " 2 "}).runner == "v2"
        for bad in ("true", "false", ""):
            with pytest.raises(SpecLensError) as e:
                vllm_runner.resolve("auto", archs, v, {}, {"VLLM_USE_V2_MODEL_RUNNER": bad})
            assert "\n" not in str(e.value) and f"vLLM {v}" in str(e.value) and "=1 for V2" in str(e.value)


def test_env_values_parser(tmp_path: Path) -> None:
    p = tmp_path / "envs.py"
    p.write_text('''
def maybe_convert_bool(value):
    if value is None:
        return None
    return bool(int(value))
environment_variables = {"VLLM_USE_V2_MODEL_RUNNER": lambda: maybe_convert_bool(
    os.getenv("VLLM_USE_V2_MODEL_RUNNER", None))}
''')
    assert rc.env_values(p, "x")[0] == "integer"
    p.write_text(p.read_text().replace("return bool(int(value))", "return value.lower() in ('1', 'true')"))
    with pytest.raises(rc.Drift):
        rc.env_values(p, "x")
