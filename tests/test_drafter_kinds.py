"""Issue 23 items 1, 2 and 5: drafter kinds beyond Llama EAGLE-3 (DFlash, DFlash2, P-EAGLE, EAGLE-3 MLA, EAGLE-3.1,
MTP/NextN).

- The kind rows of backend/conventions.yaml against the facts tools/rederive_conventions.py --kinds derived from every
  vLLM 0.20-0.33 and SGLang 0.5.1-0.5.23 wheel (docs/results/kinds_derived.json; offline), and against the wheels
  themselves where their extracted files are cached (SPECLENS_WHEEL_CACHE).
- The id-reader parser on small source trees written here (each shape the wheels hold).
- Real public configs of the new kinds (tests/data/real_configs/kinds, README there) through check-drafter
  --lint-only, feeds and --write-fix, against the truth the README derives from the engines' code.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import rederive_conventions as rc  # noqa: E402

from backend.drafter import kinds as K  # noqa: E402
from backend.errors import SpecLensError  # noqa: E402

KINDS_DIR = REPO / "tests" / "data" / "real_configs" / "kinds"
FACTS = REPO / "docs" / "results" / "kinds_derived.json"


def S(*b: int) -> list[str]:
    return [f"S_{i}" for i in b]


# ---------------------------------------------------------------------------------------- the table and the wheels

def test_the_stored_facts_cover_every_release_and_agree_with_the_table() -> None:
    facts = json.loads(FACTS.read_text())
    assert [f["version"] for f in facts["vllm"]] == rc.VLLM_RELEASES
    assert [f["version"] for f in facts["sglang"]] == rc.SGLANG_RELEASES
    rows = rc.kind_rows(facts)
    _, table, _ = rc.kinds_table_parts()
    assert rc.compare_kinds(rows, table) == []
    for eng, rels in (("vllm", rc.VLLM_RELEASES), ("sglang", rc.SGLANG_RELEASES)):
        for kind in rc.KINDS:                         # every kind and release has exactly one row
            covered = [v for r in table if r["producer"] == eng and r["kind"] == kind for v in r["releases"]]
            assert covered == rels, (eng, kind)


def test_a_changed_fact_fails_the_check() -> None:
    facts = json.loads(FACTS.read_text())
    f = next(x for x in facts["vllm"] if x["version"] == "0.24.0")
    f["reads"]["v1"][1][0]["add"] = 0                     # as if 0.24's V1 took DFlash ids as they are
    diffs = rc.compare_kinds(rc.kind_rows(facts), rc.kinds_table_parts()[1])
    assert diffs and any("0.24" in d for d in diffs)


def test_kinds_cli_offline_check() -> None:
    r = subprocess.run([sys.executable, "tools/rederive_conventions.py", "--kinds", "--facts", str(FACTS)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("OK: vllm 19 release(s), sglang 23 release(s) agree"), r.stdout


def _cache() -> Path:
    return rc.cache_dir(os.environ.get("SPECLENS_WHEEL_CACHE"))


@pytest.mark.parametrize("engine,version", [("vllm", "0.20.0"), ("vllm", "0.24.0"), ("vllm", "0.33.0"),
                                            ("sglang", "0.5.15"), ("sglang", "0.5.23")])
def test_rederived_from_the_wheel(engine: str, version: str) -> None:
    d = _cache() / f"{engine}-{version}"
    if not (d / "KINDS_EXTRACTED").exists():
        pytest.skip(f"no extracted {engine} {version} wheel in {_cache()} (run `python tools/rederive_conventions.py "
                    f"--kinds` once, or set SPECLENS_WHEEL_CACHE)")
    got = rc.derive_kinds_vllm(d, version) if engine == "vllm" else rc.derive_kinds_sglang(d, version)
    stored = next(f for f in json.loads(FACTS.read_text())[engine] if f["version"] == version)
    assert got == stored


def test_what_the_table_says_per_release() -> None:
    """The headline facts, read in the wheels (docs/RELEASES.md): vLLM 0.20-0.21's V1 runner took DFlash ids as they
    are, 0.22+ adds 1; V2 reads dflash_config from 0.24; SGLang serves DFlash from 0.5.11."""
    v1_020 = K.kind_row("vllm", "0.20.0", "dflash")["ids_from"]["v1"]
    v1_022 = K.kind_row("vllm", "0.22.0", "dflash")["ids_from"]["v1"]
    dflash = lambda blocks: [r for b in blocks for r in b if r["in"] == "dflash_config"]  # noqa: E731
    assert dflash(v1_020)[0]["add"] == 0 and dflash(v1_022)[0]["add"] == 1
    assert dflash(K.kind_row("vllm", "0.23.0", "dflash")["ids_from"]["v2"]) == []
    assert dflash(K.kind_row("vllm", "0.24.0", "dflash")["ids_from"]["v2"])[0]["add"] == 1
    assert not K.kind_row("sglang", "0.5.10", "dflash")["served"] and K.kind_row("sglang", "0.5.11", "dflash")["served"]
    assert not K.kind_row("sglang", "0.5.23", "p_eagle")["served"]
    assert K.kind_row("vllm", "0.22.0", "p_eagle")["served"] and not K.kind_row("vllm", "0.21.0", "p_eagle")["served"]
    assert not K.kind_row("vllm", "0.27.0", "dflash2")["served"] and K.kind_row("vllm", "0.28.0", "dflash2")["served"]
    assert K.kind_row("sglang", "0.5.12", "eagle3_mla")["served"] and not K.kind_row("sglang", "0.5.11",
                                                                                      "eagle3_mla")["served"]
    assert K.kind_row("vllm", "0.33.0", "mtp")["feeds"] == ["F"]
    assert "Qwen3_5ForCausalLM" in K.kind_row("sglang", "0.5.18", "dflash")["capture"]["input"]


def test_trainer_rows_say_what_dflash_ids_were_trained_on() -> None:
    rows = {r["producer"]: r for r in K.kind_rows() if r["producer"] in ("speculators", "specforge", "modelopt")}
    assert rows["specforge"]["rule"] == rows["modelopt"]["rule"] == "after" and rows["speculators"]["rule"] == "input"
    assert "extract_context_feature" in rows["specforge"]["decided_by"]["meaning"]
    assert K.trained_boundaries({"dflash_config": {"target_layer_ids": [1, 9]}}, "dflash") == S(2, 10)
    assert K.trained_boundaries({"speculators_config": {}, "aux_hidden_state_layer_ids": [2, 10]}, "dflash") == S(2, 10)


# ---------------------------------------------------------------------------------------- the parser, on small trees

V1_AS_IS = '''
def f(self):
    hf_config = self.speculative_config.draft_model_config.hf_config
    layer_ids = getattr(hf_config, 'eagle_aux_hidden_state_layer_ids', None)
    if not layer_ids:
        dflash_config = getattr(hf_config, 'dflash_config', None)
        if dflash_config and isinstance(dflash_config, dict):
            layer_ids = dflash_config.get('target_layer_ids')
    if layer_ids and isinstance(layer_ids, (list, tuple)):
        return tuple(layer_ids)
    return None
'''
V1_OVERRIDE = '''
def f(self):
    hf_config = self.speculative_config.draft_model_config.hf_config
    layer_ids = getattr(hf_config, 'eagle_aux_hidden_state_layer_ids', None)
    if not layer_ids:
        dflash_config = getattr(hf_config, 'dflash_config', None)
        eagle_config = getattr(hf_config, 'eagle_config', None)
        if dflash_config and isinstance(dflash_config, dict):
            layer_ids = [i + 1 for i in dflash_config.get('target_layer_ids') or []]
        if eagle_config and isinstance(eagle_config, dict):
            layer_ids = eagle_config.get('eagle_aux_hidden_state_layer_ids')
    return None
'''
V2_LOOP = '''
def f(spec_config):
    hf_config = spec_config.draft_model_config.hf_config
    layer_ids = getattr(hf_config, 'eagle_aux_hidden_state_layer_ids', None)
    if not layer_ids:
        target_layer_ids = getattr(hf_config, 'target_layer_ids', None)
        if target_layer_ids:
            layer_ids = [i + 1 for i in target_layer_ids]
    if not layer_ids:
        for config_name in ('dflash_config', 'eagle_config'):
            drafter_config = getattr(hf_config, config_name, None)
            if drafter_config and isinstance(drafter_config, dict):
                layer_ids = drafter_config.get('layer_ids')
                if layer_ids:
                    break
    return None
'''
UNKNOWN = '''
def f(self):
    hf_config = self.hf
    layer_ids = compute(hf_config)
'''


def _fn(src: str) -> ast.AST:
    return ast.parse(src).body[0]


def test_parser_reads_each_shape() -> None:
    top = {"in": "top", "key": "eagle_aux_hidden_state_layer_ids", "add": 0, "assign": "always"}
    assert rc.vllm_id_reads(_fn(V1_AS_IS), "t") == [
        [top], [{"in": "dflash_config", "key": "target_layer_ids", "add": 0, "assign": "container"}]]
    assert rc.vllm_id_reads(_fn(V1_OVERRIDE), "t")[1] == [
        {"in": "dflash_config", "key": "target_layer_ids", "add": 1, "assign": "container"},
        {"in": "eagle_config", "key": "eagle_aux_hidden_state_layer_ids", "add": 0, "assign": "container"}]
    assert rc.vllm_id_reads(_fn(V2_LOOP), "t")[1:] == [
        [{"in": "top", "key": "target_layer_ids", "add": 1, "assign": "value"}],
        [{"in": "dflash_config", "key": "layer_ids", "add": 0, "assign": "value"},
         {"in": "eagle_config", "key": "layer_ids", "add": 0, "assign": "value"}]]
    with pytest.raises(rc.Drift):
        rc.vllm_id_reads(_fn(UNKNOWN), "t")


def test_reads_run_as_the_engine_runs_them() -> None:
    blocks = rc.vllm_id_reads(_fn(V1_OVERRIDE), "t")
    assert K.read_ids(blocks, {"dflash_config": {"target_layer_ids": [1, 5]}})[:2] == (
        [2, 6], "dflash_config.target_layer_ids (+1)")
    # V1's quirk: an eagle_config dict replaces what dflash_config gave, even without ids (then: the default)
    assert K.read_ids(blocks, {"dflash_config": {"target_layer_ids": [1, 5]}, "eagle_config": {"x": 1}})[0] is None
    assert K.read_ids(blocks, {"eagle_aux_hidden_state_layer_ids": [3, 4],
                               "dflash_config": {"target_layer_ids": [1]}})[0] == [3, 4]


def test_dflash_capture_rules_on_a_small_tree(tmp_path: Path) -> None:
    m = tmp_path / "sglang" / "srt" / "models"
    m.mkdir(parents=True)
    (m / "a.py").write_text(
        "class AForCausalLM:\n    def set_dflash_layers_to_capture(self, layer_ids):\n"
        "        self.model.layers_to_capture = [val + 1 for val in layer_ids]\n"
        "class BForCausalLM(AForCausalLM):\n    pass\n"
        "class CForCausalLM:\n    def set_dflash_layers_to_capture(self, layers_to_capture):\n"
        "        self.model.set_dflash_layers_to_capture(layers_to_capture)\n"
        "EntryClass = [AForCausalLM, BForCausalLM, CForCausalLM]\n")
    rules = rc._family_arch_rule(tmp_path, "set_dflash_layers_to_capture", rc._dflash_rule)
    assert {a: d["rule"] for a, d in rules.items()} == {"AForCausalLM": "after", "BForCausalLM": "after",
                                                        "CForCausalLM": "input"}


def test_sglang_default_spread() -> None:
    assert K.sglang_default(36, 5) == [1, 9, 17, 25, 33]          # the ids SpecForge's Qwen3 DFlash configs carry
    assert K.sglang_default(36, 1) == [18]
    with pytest.raises(SpecLensError):
        K.sglang_default(3, 2)


def test_kind_of() -> None:
    assert K.kind_of({"architectures": ["DFlashDraftModel"]}) == "dflash"
    assert K.kind_of({"architectures": ["DFlash2DraftModel"], "dflash_config": {}}) == "dflash2"
    assert K.kind_of({"architectures": ["PEagleDraftModel"]}) == "p_eagle"
    assert K.kind_of({"architectures": ["Eagle3DeepseekV2ForCausalLM"]}) == "eagle3_mla"
    assert K.kind_of({"architectures": ["LlamaForCausalLMEagle3"], "fc_norm": True, "norm_output": True}) == "eagle3_1"
    assert K.kind_of({"architectures": ["LlamaForCausalLMEagle3"]}) == "eagle3"
    assert K.kind_of({"speculators_model_type": "dflash"}) == "dflash"
    assert K.kind_of({"architectures": ["DeepSeekMTPModel"]}) == "mtp"


# ---------------------------------------------------------------------------------------- real configs (README)

Q8 = ("Qwen3ForCausalLM", "qwen3", 36, 4096, 151936)
Q4 = ("Qwen3ForCausalLM", "qwen3", 36, 2560, 151936)
KIMI = ("DeepseekV3ForCausalLM", "kimi_k2", 61, 7168, 163840)
Q30 = ("Qwen3MoeForCausalLM", "qwen3_moe", 48, 2048, 151936)
DSL = ("DeepseekV2ForCausalLM", "deepseek_v2", 27, 2048, 102400)
NOT_SERVED, NO_ARCH = "does not serve", "registers no"
# file -> target, kind, {(engine, release): what the picked runner feeds, or the words of why it cannot}; the
# README's table (derived from the wheels' code, not from SpecLens)
TRUTH = {
    "specforge_qwen3-8b-dflash.json": (Q8, "dflash", {
        ("vllm", "0.24.0"): S(2, 10, 18, 26, 34), ("vllm", "0.20.0"): S(1, 9, 17, 25, 33),
        ("sglang", "0.5.15"): S(2, 10, 18, 26, 34), ("sglang", "0.5.10"): NOT_SERVED}),
    "specforge_qwen3-4b-dflash.json": (Q4, "dflash", {
        ("vllm", "0.24.0"): S(2, 10, 18, 26, 34), ("vllm", "0.21.0"): S(1, 9, 17, 25, 33),
        ("sglang", "0.5.23"): S(2, 10, 18, 26, 34), ("sglang", "0.5.1"): NOT_SERVED}),
    "specforge-hist_kimi-k2.7-code-dflash.json": (KIMI, "dflash", {
        ("vllm", "0.24.0"): S(2, 13, 25, 36, 48, 59), ("vllm", "0.20.0"): S(1, 12, 24, 35, 47, 58),
        ("sglang", "0.5.15"): S(2, 13, 25, 36, 48, 59)}),
    "specforge_qwen3-8b-peagle.json": (Q8, "p_eagle", {
        ("vllm", "0.24.0"): S(2, 18, 33), ("vllm", "0.20.0"): NOT_SERVED, ("sglang", "0.5.15"): NOT_SERVED}),
    "specforge_qwen3-30b-a3b-eagle3.1.json": (Q30, "eagle3_1", {
        ("vllm", "0.24.0"): S(2, 24, 45), ("sglang", "0.5.15"): S(2, 24, 45)}),
    "torchspec_kimi-k25-eagle3-mla.json": (("DeepseekV3ForCausalLM", "deepseek_v3", 61, 7168, 163840), "eagle3_mla", {
        ("vllm", "0.24.0"): S(1, 29, 57), ("vllm", "0.20.0"): S(2, 30, 58), ("sglang", "0.5.15"): S(2, 30, 58),
        ("sglang", "0.5.11"): NOT_SERVED}),
    "specforge-hist_deepseek-v2-lite-dflash.json": (DSL, "dflash", {
        ("vllm", "0.24.0"): NO_ARCH, ("sglang", "0.5.15"): NO_ARCH}),
}


def target_dir(tmp: Path, spec: tuple) -> Path:
    arch, mt, n, h, v = spec
    d = tmp / f"{arch}-{n}-{h}"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": mt, "num_hidden_layers": n,
                                               "hidden_size": h, "vocab_size": v}))
    return d


def cli(*args: str, data_root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "backend", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "SPECLENS_DATA": str(data_root)}, timeout=120)


def test_every_kinds_config_has_its_truth_and_a_readme_row() -> None:
    files = {f.name for f in KINDS_DIR.glob("*.json")}
    assert files == set(TRUTH)
    readme = (REPO / "tests" / "data" / "real_configs" / "README.md").read_text()
    for name in files:
        assert f"| kinds/{name} |" in readme, name
    assert {k for _, k, _ in TRUTH.values()} >= {"dflash", "p_eagle", "eagle3_1", "eagle3_mla"}


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_lint_only_answers_per_release(name: str, tmp_path: Path, data_root) -> None:
    spec, kind, truth = TRUTH[name]
    target = target_dir(tmp_path, spec)
    for (engine, release), want in truth.items():
        r = cli("check-drafter", "--drafter", str(KINDS_DIR / name), "--target", str(target), "--lint-only", "--json",
                "--engine", engine, "--engine-version", release, data_root=data_root)
        assert r.returncode == 0, r.stderr[-1500:]
        rep = json.loads(r.stdout.splitlines()[0])
        picked = next(x for x in rep["lint"] if x["engine"] == engine and x["picked"])
        if isinstance(want, list):
            assert picked["boundaries"] == want and picked["error"] is None, (engine, release, picked)
        else:
            assert picked["boundaries"] is None and want in picked["error"], (engine, release, picked["error"])


def test_vllm_020_v2_cannot_serve_a_dflash_drafter(tmp_path: Path) -> None:
    """0.20's V2 runner reads no dflash_config: it feeds the EAGLE-3 default (3 states) to an fc built for 5."""
    raw = json.loads((KINDS_DIR / "specforge_qwen3-8b-dflash.json").read_text())
    with pytest.raises(SpecLensError, match="fc takes 5 target states"):
        K.kind_feeds(raw, "dflash", 36, "qwen3", ["Qwen3ForCausalLM"], "vllm", "0.20.0", "v2", fc_in=5)
    got = K.kind_feeds(raw, "dflash", 36, "qwen3", ["Qwen3ForCausalLM"], "vllm", "0.24.0", "v2", fc_in=5)
    assert got["boundaries"] == S(2, 10, 18, 26, 34) and got["ids_from"] == "dflash_config.target_layer_ids (+1)"


def test_sglang_input_rule_target_feeds_s_t() -> None:
    """SGLang 0.5.18+'s text Qwen3.5 model passes DFlash ids unchanged to a model capturing each layer's input."""
    raw = json.loads((KINDS_DIR / "specforge_qwen3-8b-dflash.json").read_text())
    got = K.kind_feeds(raw, "dflash", 36, "qwen3_5_text", ["Qwen3_5ForCausalLM"], "sglang", "0.5.18", fc_in=5)
    assert got["boundaries"] == S(1, 9, 17, 25, 33)


def test_feeds_shows_where_dflash_changed_meaning(tmp_path: Path, data_root) -> None:
    target = target_dir(tmp_path, Q8)
    r = cli("feeds", "--drafter", str(KINDS_DIR / "specforge_qwen3-8b-dflash.json"), "--target", str(target),
            "--json", data_root=data_root)
    assert r.returncode == 0, r.stderr[-1500:]
    m = json.loads(r.stdout)
    assert m["drafter_ids"]["kind"] == "dflash"
    v1 = [c for c in m["changes"] if c["engine"] == "vllm" and c["track"] == "v1"]
    assert any(c["release"] == "0.22.0" and c["change"] == "S_1, S_9, S_17, S_25, S_33 -> S_2, S_10, S_18, S_26, S_34"
               for c in v1), v1
    sg = [c for c in m["changes"] if c["engine"] == "sglang"]
    assert sg and sg[0]["release"] == "0.5.11" and sg[0]["change"].endswith("-> S_2, S_10, S_18, S_26, S_34")


def test_write_fix_for_dflash(tmp_path: Path, data_root) -> None:
    name = "specforge_qwen3-8b-dflash.json"
    target, trained = target_dir(tmp_path, Q8), S(2, 10, 18, 26, 34)        # SpecForge: hidden_states[t + 1]
    assert K.trained_boundaries(json.loads((KINDS_DIR / name).read_text()), "dflash") == trained
    out = tmp_path / "fixed"
    r = cli("check-drafter", "--drafter", str(KINDS_DIR / name), "--target", str(target), "--lint-only", "--json",
            "--trained-on", ",".join(trained), "--write-fix", str(out), "--engine", "vllm", "--engine-version",
            "0.20.0", data_root=data_root)
    assert r.returncode == 0, r.stderr[-1500:]
    original = json.loads((KINDS_DIR / name).read_text())
    assert json.loads((out / "config.json").read_text()) == {**original,
                                                             "eagle_aux_hidden_state_layer_ids": [2, 10, 18, 26, 34]}
    # SGLang 0.5.15 already feeds what it was trained on
    r = cli("check-drafter", "--drafter", str(KINDS_DIR / name), "--target", str(target), "--lint-only", "--json",
            "--trained-on", ",".join(trained), "--write-fix", str(tmp_path / "f2"), "--engine", "sglang",
            "--engine-version", "0.5.15", data_root=data_root)
    assert r.returncode != 0 and "nothing to fix" in r.stderr
    # trained on other boundaries: SGLang's fix goes to dflash_config.target_layer_ids, one below each boundary
    r = cli("check-drafter", "--drafter", str(KINDS_DIR / name), "--target", str(target), "--lint-only", "--json",
            "--trained-on", "S_3,S_11,S_19,S_27,S_35", "--write-fix", str(tmp_path / "f3"), "--engine", "sglang",
            "--engine-version", "0.5.15", data_root=data_root)
    assert r.returncode == 0, r.stderr[-1500:]
    fixed = json.loads((tmp_path / "f3" / "config.json").read_text())
    assert fixed["dflash_config"] == {**original["dflash_config"], "target_layer_ids": [2, 10, 18, 26, 34]}


def test_write_fix_refuses_where_no_ids_can(tmp_path: Path, data_root) -> None:
    target = target_dir(tmp_path, Q8)
    r = cli("check-drafter", "--drafter", str(KINDS_DIR / "specforge_qwen3-8b-peagle.json"), "--target", str(target),
            "--lint-only", "--json", "--trained-on", "S_3,S_19,S_34", "--write-fix", str(tmp_path / "x"), "--engine",
            "sglang", "--engine-version", "0.5.15", data_root=data_root)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0 and len(lines) == 1 and "does not serve P-EAGLE" in lines[0], r.stderr


def test_a_dflash_config_gets_no_lm_head_or_draft_vocab_warning(tmp_path: Path, data_root) -> None:
    """DFlash always uses the target's LM head: no "no draft_vocab_size" finding for it (an EAGLE-3 config without
    draft_vocab_size still gets one)."""
    name = next(n for n, (_, kind, _) in sorted(TRUTH.items()) if kind == "dflash")
    spec = TRUTH[name][0]
    dflash = {k: v for k, v in json.loads((KINDS_DIR / name).read_text()).items() if k != "draft_vocab_size"}
    (tmp_path / "df").mkdir()
    (tmp_path / "df" / "config.json").write_text(json.dumps(dflash))
    r = cli("check-drafter", "--drafter", str(tmp_path / "df"), "--target", str(target_dir(tmp_path, spec)),
            "--lint-only", "--json", data_root=data_root)
    assert r.returncode == 0, r.stderr[-1500:]
    texts = " ".join(f["text"] if isinstance(f, dict) and "text" in f else str(f)
                     for f in json.loads(r.stdout.splitlines()[0])["findings"])
    assert "no draft_vocab_size" not in texts and "no lm_head.weight" not in texts
    eagle = json.loads((KINDS_DIR / name).read_text())
    eagle = {k: v for k, v in eagle.items() if k not in ("dflash_config", "draft_vocab_size", "block_size")}
    eagle["architectures"] = ["LlamaForCausalLMEagle3"]
    (tmp_path / "e3").mkdir()
    (tmp_path / "e3" / "config.json").write_text(json.dumps(eagle))
    r = cli("check-drafter", "--drafter", str(tmp_path / "e3"), "--target", str(target_dir(tmp_path, spec)),
            "--lint-only", "--json", data_root=data_root)
    assert "no draft_vocab_size" in r.stdout, r.stderr[-800:]
