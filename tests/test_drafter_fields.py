"""Drafter config fields a release ignores (issue 22 item 3): backend/drafter_fields.yaml, derived from the wheels by
tools/rederive_conventions.py --fields, and the lint's finding when the chosen release ignores a field the drafter
sets (bar: a drafter trained with `norm_before_fc: true` served by a release that ignores it gets a finding; one
that honours it does not)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import rederive_conventions as rc  # noqa: E402


@pytest.fixture(scope="module")
def toy_configs(tmp_path_factory) -> Path:
    """The toy pair's target and matched-drafter config.json only (a lint reads nothing else)."""
    d = tmp_path_factory.mktemp("toy-configs")
    with tarfile.open(REPO / "models" / "toy-pair.tar.gz") as t:
        for name in ("target/config.json", "drafter-matched/config.json"):
            t.extract(name, d, filter="data")
    return d


def drafter_with(toy: Path, **fields) -> Path:
    """The toy drafter's config with `fields` set, in a directory whose name holds no field name (pytest's tmp_path
    is named after the test, and findings quote the config's path)."""
    raw = json.loads((toy / "drafter-matched" / "config.json").read_text())
    raw.update(fields)
    f = Path(tempfile.mkdtemp(prefix="drafter-", dir=toy)) / "config.json"
    f.write_text(json.dumps(raw, indent=1))
    return f


def lint_only(drafter: Path, target: Path, engine: str, version: str, data: Path) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "backend", "check-drafter", "--drafter", str(drafter), "--target",
                          str(target), "--lint-only", "--engine", engine, "--engine-version", version, "--json"],
                         cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "SPECLENS_DATA": str(data)})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)["findings"]


def test_norm_before_fc_ignored_by_sglang_0_5_15_is_a_finding(toy_configs, tmp_path) -> None:
    d = drafter_with(toy_configs, norm_before_fc=True)
    fs = [f for f in lint_only(d, toy_configs / "target", "sglang", "0.5.15", tmp_path / "data")
          if "norm_before_fc" in f["text"]]
    assert len(fs) == 1 and fs[0]["severity"] == "warning", fs
    assert fs[0]["text"].startswith("SGLang 0.5.15 ignores norm_before_fc: true (sglang/srt/models/llama_eagle3.py "
                                    "builds no input norm): the drafter will be fed un-normed aux states it was not "
                                    "trained on"), fs[0]["text"]


@pytest.mark.parametrize("engine,version", [("vllm", "0.24.0"), ("vllm", "0.20.0"), ("sglang", "0.5.17")])
def test_norm_before_fc_honoured_gives_no_finding(toy_configs, tmp_path, engine, version) -> None:
    d = drafter_with(toy_configs, norm_before_fc=True)
    fs = lint_only(d, toy_configs / "target", engine, version, tmp_path / "data")
    assert not [f for f in fs if "norm_before_fc" in f["text"]], fs


def test_fc_norm_ignored_before_vllm_0_22_and_sglang_0_5_12(toy_configs, tmp_path) -> None:
    d = drafter_with(toy_configs, fc_norm=True)
    tgt, data = toy_configs / "target", tmp_path / "data"
    for engine, old, new in (("vllm", "0.21.0", "0.22.0"), ("sglang", "0.5.11", "0.5.12")):
        assert any(f"{old} ignores fc_norm: true" in f["text"] for f in lint_only(d, tgt, engine, old, data))
        assert not any("fc_norm" in f["text"] for f in lint_only(d, tgt, engine, new, data))


def test_table_rows_cover_every_release_once() -> None:
    rows = yaml.safe_load(rc.FIELDS_TABLE.read_text())
    for eng, rels in (("vllm", rc.VLLM_RELEASES), ("sglang", rc.SGLANG_RELEASES)):
        for field in rc.DRAFTER_FIELDS:
            mine = [r for r in rows if r["engine"] == eng and r["field"] == field
                    and r["file"] == rc.LLAMA_DRAFTER[eng]]
            assert sorted(v for r in mine for v in r["releases"]) == sorted(rels), (eng, field)
            assert all(r["status"] in ("honoured", "ignored") and r["decided_by"] for r in mine)


def test_derivation_reads_honoured_and_ignored(tmp_path) -> None:
    """The rule on two small drafter files: read and applied -> honoured; never read -> ignored, citing the
    function that builds fc."""
    root = tmp_path / "sglang-x"
    models = root / rc.MODELS_DIR["sglang"]
    models.mkdir(parents=True)
    (models / "llama_eagle3.py").write_text(
        "class M:\n"
        "    def __init__(self, config):\n"
        "        self.fc = Linear()\n"
        "        self.input_norm = RMSNorm() if getattr(config, 'norm_before_fc', False) else None\n"
        "    def forward(self, h):\n"
        "        if self.input_norm is not None:\n"
        "            h = self.input_norm(h)\n"
        "        return self.fc(h)\n"
        "EntryClass = [M]\n")
    facts = {f["field"]: f for f in rc.derive_fields("sglang", root, "0.0.1")}
    assert facts["norm_before_fc"]["status"] == "honoured"
    assert facts["norm_before_fc"]["reads"] == ["M.__init__"] and facts["norm_before_fc"]["applies"] == ["M.forward"]
    assert facts["fc_norm"]["status"] == "ignored" and list(facts["fc_norm"]["code"]) == [
        "sglang/srt/models/llama_eagle3.py:M.__init__"]


def _cached(eng: str, v: str, cache: Path) -> bool:
    d = cache / f"{eng}-{v}"
    mark = d / "EXTRACTED"
    return (d / "WHEEL_SHA256").exists() and mark.exists() and mark.read_text().strip() == rc.CACHE_MARK[eng]


def test_table_agrees_with_the_cached_wheels() -> None:
    """Re-derive from the wheels already extracted by the tool (no download here) and compare with the table."""
    cache = rc.cache_dir(None)
    have = [(e, v) for e, rels in (("vllm", rc.VLLM_RELEASES), ("sglang", rc.SGLANG_RELEASES)) for v in rels
            if _cached(e, v, cache)]
    if not have:
        pytest.skip(f"no extracted wheels in {cache} (run `python tools/rederive_conventions.py --fields` once to "
                    f"download and extract them)")
    facts = [f for e, v in have for f in rc.derive_fields(e, cache / f"{e}-{v}", v)]
    table = yaml.safe_load(rc.FIELDS_TABLE.read_text())
    assert rc.compare_fields(facts, table) == []


# ---------------------------------------------------------------------------- the other fields (MORE_FIELDS)

def test_more_fields_rows_cover_every_release_once() -> None:
    """draft_vocab_size, d2t, target_hidden_size, rope, sliding window, tied embeddings, head_dim: one row per
    release of the Llama drafter file, each citing the functions (file:function) that decide it, with their hashes."""
    rows = yaml.safe_load(rc.FIELDS_TABLE.read_text())
    for eng, rels in (("vllm", rc.VLLM_RELEASES), ("sglang", rc.SGLANG_RELEASES)):
        for field in rc.MORE_FIELDS:
            mine = [r for r in rows if r["engine"] == eng and r["field"] == field]
            assert sorted(v for r in mine for v in r["releases"]) == sorted(rels), (eng, field)
            for r in mine:
                assert r["file"] == rc.LLAMA_DRAFTER[eng] and r["status"] in ("honoured", "ignored")
                cited = {c for w in r["wheels"].values() for c in w}
                assert cited and all(c.split(":", 1)[1] in r["decided_by"] for c in cited), r["decided_by"]


def test_more_fields_what_the_wheels_say() -> None:
    """The facts the lint's new findings rest on, as the table holds them."""
    rows = yaml.safe_load(rc.FIELDS_TABLE.read_text())

    def status(eng: str, field: str, v: str) -> str:
        return next(r["status"] for r in rows if r["engine"] == eng and r["field"] == field
                    and r["file"] == rc.LLAMA_DRAFTER[eng] and v in r["releases"])

    for v in rc.VLLM_RELEASES:
        assert status("vllm", "tie_word_embeddings", v) == "ignored"
        assert status("vllm", "rope_theta", v) == status("vllm", "d2t", v) == "honoured"
    for v in rc.SGLANG_RELEASES:
        assert status("sglang", "sliding_window", v) == "ignored"
        assert status("sglang", "tie_word_embeddings", v) == status("sglang", "draft_vocab_size", v) == "honoured"


def test_more_fields_derivation_reads_base_classes(tmp_path) -> None:
    """The rule on a small drafter file and the llama.py it builds on: rope read in the base decoder layer and applied
    by the attention it constructs -> honoured, citing llama.py; a key nobody reads -> ignored, citing the drafter's
    __init__; an overridden base __init__ that the drafter does not call is not read."""
    root = tmp_path / "sglang-x"
    models = root / rc.MODELS_DIR["sglang"]
    models.mkdir(parents=True)
    (models / "llama.py").write_text(
        "class LlamaAttention:\n"
        "    def __init__(self, config, rope_theta):\n"
        "        self.rotary_emb = get_rope(base=rope_theta)\n"
        "class LlamaDecoderLayer:\n"
        "    def __init__(self, config):\n"
        "        self.self_attn = LlamaAttention(config, getattr(config, 'rope_theta', 10000))\n"
        "class LlamaForCausalLM:\n"
        "    def __init__(self, config):\n"
        "        self.tied = config.tie_word_embeddings\n")
    (models / "llama_eagle3.py").write_text(
        "from sglang.srt.models.llama import LlamaDecoderLayer, LlamaForCausalLM\n"
        "class Layer(LlamaDecoderLayer):\n"
        "    def __init__(self, config):\n"
        "        super().__init__(config)\n"
        "class M(LlamaForCausalLM):\n"
        "    def __init__(self, config):\n"
        "        self.layer = Layer(config)\n"
        "        self.lm_head = Head(config.draft_vocab_size)\n"
        "EntryClass = [M]\n")
    facts = {f["field"]: f for f in rc.derive_more_fields("sglang", root, "0.0.1")}
    rope = facts["rope_theta"]
    assert rope["status"] == "honoured"
    assert rope["reads"] == ["sglang/srt/models/llama.py:LlamaDecoderLayer.__init__"]
    assert rope["applies"] == ["sglang/srt/models/llama.py:LlamaAttention.__init__"]
    assert facts["draft_vocab_size"]["status"] == "honoured"
    assert facts["tie_word_embeddings"]["status"] == "ignored"       # LlamaForCausalLM.__init__ never runs
    assert facts["sliding_window"]["status"] == "ignored"
    assert list(facts["sliding_window"]["code"]) == ["sglang/srt/models/llama_eagle3.py:M.__init__"]


def test_sliding_window_ignored_by_sglang_and_by_vllm_without_layer_types(toy_configs, tmp_path) -> None:
    tgt, data = toy_configs / "target", tmp_path / "data"
    d = drafter_with(toy_configs, sliding_window=64)
    fs = [f["text"] for f in lint_only(d, tgt, "sglang", "0.5.15", data) if "sliding_window" in f["text"]]
    assert len(fs) == 1 and fs[0].startswith("SGLang 0.5.15 ignores sliding_window: 64 "), fs
    assert "full attention instead of the 64-token window" in fs[0]
    fs = [f["text"] for f in lint_only(d, tgt, "vllm", "0.24.0", data) if "sliding_window" in f["text"]]
    assert len(fs) == 1 and "layer_types marks sliding_attention, and this config has none" in fs[0], fs
    marked = drafter_with(toy_configs, sliding_window=64, layer_types=["sliding_attention"])
    assert not [f for f in lint_only(marked, tgt, "vllm", "0.24.0", data) if "sliding_window" in f["text"]]


def test_tie_word_embeddings_ignored_by_vllm_honoured_by_sglang(toy_configs, tmp_path) -> None:
    tgt, data = toy_configs / "target", tmp_path / "data"
    d = drafter_with(toy_configs, tie_word_embeddings=True)
    fs = [f["text"] for f in lint_only(d, tgt, "vllm", "0.24.0", data) if "ignores tie_word_embeddings" in f["text"]]
    assert len(fs) == 1 and fs[0].startswith("vLLM 0.24.0 ignores tie_word_embeddings: true "), fs
    assert not [f for f in lint_only(d, tgt, "sglang", "0.5.15", data) if "ignores tie_word_embeddings" in f["text"]]


@pytest.mark.parametrize("engine,version", [("vllm", "0.24.0"), ("vllm", "0.33.0"), ("sglang", "0.5.1"),
                                            ("sglang", "0.5.23")])
def test_honoured_fields_give_no_finding(toy_configs, tmp_path, engine, version) -> None:
    """A drafter with its own draft vocab, target width, rope base and scaling and head width: every release in the
    table honours them, so no 'ignores' finding."""
    d = drafter_with(toy_configs, draft_vocab_size=1024, hidden_size=512, target_hidden_size=256, rope_theta=500000.0,
                     head_dim=32,
                     rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    from backend.drafter.config import load_config
    from backend.drafter.lint import _set_fields

    assert set(_set_fields(load_config(d))) >= {"draft_vocab_size", "d2t", "target_hidden_size", "rope_theta",
                                                 "rope_scaling", "head_dim"}      # the lint looks at each of them
    fs = [f["text"] for f in lint_only(d, toy_configs / "target", engine, version, tmp_path / "data")]
    # the finding's own words ("<release> ignores <field>: ..."), not a field name anywhere in the text: the drafter's
    # random temp path once read ".../drafter-ko8x2d2t/config.json" in another finding that says "ignores"
    assert not [t for t in fs if any(f" ignores {k}:" in t for k in rc.MORE_FIELDS)], fs


def test_the_rederivation_passes_over_every_release() -> None:
    """`rederive_conventions.py --fields` over every release: every field of every release agrees with the table
    (the norm fields and the others). Reads the wheels the tool has extracted (SPECLENS_WHEEL_CACHE, or
    ~/.cache/speclens/wheels); skipped when none are there."""
    cache = rc.cache_dir(None)
    have = [(e, v) for e, rels in (("vllm", rc.VLLM_RELEASES), ("sglang", rc.SGLANG_RELEASES)) for v in rels
            if _cached(e, v, cache) and (e != "vllm" or (cache / f"{e}-{v}" / rc.VLLM_ROPE_LOADER[0]).exists())]
    if len(have) < len(rc.VLLM_RELEASES) + len(rc.SGLANG_RELEASES):
        pytest.skip(f"{len(have)} of {len(rc.VLLM_RELEASES) + len(rc.SGLANG_RELEASES)} releases extracted in {cache} "
                    f"(run `python tools/rederive_conventions.py --fields` once)")
    out = subprocess.run([sys.executable, "tools/rederive_conventions.py", "--fields", "--cache", str(cache)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:]
    assert out.stdout.startswith(f"OK: vllm {len(rc.VLLM_RELEASES)} release(s), sglang {len(rc.SGLANG_RELEASES)} "
                                 f"release(s) agree"), out.stdout


def test_rope_cost_measured_on_the_toy_pair_is_quoted() -> None:
    """docs/results/field_cost_toy.json (tools/field_cost.py): the rope finding quotes tau with and without, and the
    interval of the difference; a field without a measurement gets no cost."""
    from backend.drafter.lint import field_costs
    from backend.text.check_text import field_cost_words

    c = field_costs()["rope_theta"]
    assert c["prompts"] >= 30 and c["ci95"][0] <= c["difference"] <= c["ci95"][1]
    text = field_cost_words("rope_theta", c)
    assert f"tau {c['tau_trained']:.2f} -> {c['tau_dropped']:.2f}" in text and "95% CI" in text
    assert "sliding_window" not in field_costs() and field_cost_words("sliding_window", None) == ""


def test_norm_before_fc_cost_measured_on_the_toy_pair() -> None:
    """The norm_before_fc entry: a drafter trained with the flag, benched as trained and as a release without
    input_norm feeds it, paired on the same prompts, both runs lossless."""
    from backend.drafter.lint import field_costs

    c = field_costs()["norm_before_fc"]
    assert c["trained_with"] == {"norm_before_fc": True} and c["served_with"] == {"norm_before_fc": False}
    assert c["k"] == 4 and c["temperature"] == 0 and c["prompts"] >= 30 and c["lossless"] is True
    assert c["ci95"][0] <= c["difference"] <= c["ci95"][1]
    assert abs(c["tau_dropped"] - c["tau_trained"] - c["difference"]) < 0.0015


def test_norm_before_fc_finding_for_sglang_0_5_15_quotes_the_cost(toy_configs, tmp_path) -> None:
    from backend.drafter.lint import field_costs

    c = field_costs()["norm_before_fc"]
    d = drafter_with(toy_configs, norm_before_fc=True)
    fs = [f for f in lint_only(d, toy_configs / "target", "sglang", "0.5.15", tmp_path / "data")
          if "norm_before_fc" in f["text"]]
    assert len(fs) == 1, fs
    assert (f"Measured on the toy pair (tools/field_cost.py, {c['prompts']} prompts, K=4): trained with norm_before_fc "
            f"true, served with false: tau {c['tau_trained']:.2f} -> {c['tau_dropped']:.2f} "
            f"({c['difference']:+.2f}, 95% CI {c['ci95'][0]:+.2f} to {c['ci95'][1]:+.2f}") in fs[0]["text"], fs
    assert ("the interval includes 0" in fs[0]["text"]) == (c["ci95"][0] <= 0 <= c["ci95"][1])
    # SGLang 0.5.17 honours the flag: no finding, so no cost either
    assert not [f for f in lint_only(d, toy_configs / "target", "sglang", "0.5.17", tmp_path / "data")
                if "norm_before_fc" in f["text"]]


def test_norm_before_fc_toy_drafter_applies_its_norm(tmp_path) -> None:
    """The committed delta rebuilds a drafter with norm_before_fc: true whose input_norm is trained (not ones) and
    applied under vLLM semantics; the dropped copy (flag off, same weights) has none and drafts from other fc inputs."""
    import torch

    from backend.drafter import Eagle3Drafter
    from backend.toy.norm_before_fc import DELTA, assemble

    with tarfile.open(REPO / "models" / "toy-pair.tar.gz") as t:
        for name in ("drafter-matched/config.json", "drafter-matched/model.safetensors"):
            t.extract(name, tmp_path, filter="data")
    out = assemble(tmp_path / "drafter-matched", REPO / "tests" / "data" / "field_cost" / DELTA, tmp_path / "nbf")
    raw = json.loads((out / "config.json").read_text())
    assert raw["norm_before_fc"] is True and raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    d = Eagle3Drafter.load(out)
    assert d.uses_input_norm and not torch.allclose(d.input_norm.weight, torch.ones_like(d.input_norm.weight))
    off = tmp_path / "off"
    off.mkdir()
    (off / "model.safetensors").symlink_to(out / "model.safetensors")
    (off / "config.json").write_text(json.dumps({**raw, "norm_before_fc": False}))
    dropped = Eagle3Drafter.load(off)
    assert dropped.input_norm is None and not dropped.uses_input_norm
    aux = torch.randn(5, d.cfg.fc_in) * 3
    assert torch.equal(dropped.combine(aux), d.fc(aux)) and not torch.allclose(d.combine(aux), dropped.combine(aux))


def test_field_cost_merge_keeps_other_fields(tmp_path) -> None:
    sys.path.insert(0, str(REPO / "tools"))
    import field_cost

    f = tmp_path / "c.json"
    f.write_text(json.dumps({"field": "rope_theta", "tau_trained": 2.0}))
    got = field_cost.merge(f, {"field": "norm_before_fc", "tau_trained": 1.5})
    assert [e["field"] for e in got] == ["rope_theta", "norm_before_fc"]
    f.write_text(json.dumps(got))
    assert field_cost.merge(f, {"field": "norm_before_fc", "tau_trained": 1.7})[-1]["tau_trained"] == 1.7
