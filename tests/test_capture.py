"""HF capture: hooks give the right boundaries for Llama, Qwen3 and DeepSeek-V3; resume; bad input."""


import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from backend.capture import CaptureSettings, run_capture
from backend.errors import SpecLensError
from backend.store.data_root import DataRoot


def _settings(model, prompts, **kw):
    return CaptureSettings(model=str(model), prompts=str(prompts), **kw)


@pytest.mark.parametrize("model_fixture", ["tiny_llama", "tiny_qwen", "tiny_deepseek"])
def test_boundaries_match_output_hidden_states(model_fixture, request, prompts_file, data_root):
    """S_i == hidden_states[i] for i < N, and F == hidden_states[N] (transformers ties it to the normed output)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from backend.prompts import encode, load_prompts

    model_dir = request.getfixturevalue(model_fixture)
    r = run_capture(_settings(model_dir, prompts_file, limit=3), name="c", data=DataRoot(data_root), progress=False)
    sample = load_file(str(r.path / "sample.safetensors"))
    m = DataRoot(data_root).run_dir("c").manifest()
    n = m["model"]["n_layers"]
    assert m["boundaries"] == [f"S_{i}" for i in range(n + 1)] + ["F"]
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = encode(tok, load_prompts(prompts_file, 1)[0].text)
    with torch.no_grad():
        hs = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    k = min(len(ids), int((sample["ctx_hash"] != 0).sum()))
    first = sample["position"][:k]
    k = int((first == torch.arange(k)).sum())  # tokens of the first prompt
    for i in range(n):
        torch.testing.assert_close(sample[f"S_{i}"][:k], hs[i][0, :k], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(sample["F"][:k], hs[n][0, :k], rtol=1e-4, atol=1e-4)
    # S_N is the pre-norm output of the last layer: it differs from F
    assert not torch.allclose(sample[f"S_{n}"][:k], sample["F"][:k])


def test_stats_written_and_cataloged(tiny_llama, prompts_file, data_root):
    r = run_capture(_settings(tiny_llama, prompts_file, limit=5, sample_tokens=100), name="s", data=DataRoot(data_root),
                    progress=False)
    df = pd.read_parquet(r.path / "stats.parquet")
    assert list(df["boundary"]) == [f"S_{i}" for i in range(9)] + ["F"]
    assert (df["n_tokens"] == r.tokens).all() and r.tokens > 100
    assert (df["mean_norm"] > 0).all() and df["kurtosis"].notna().all()
    assert load_file(str(r.path / "sample.safetensors"))["S_0"].shape == (100, 64)
    runs = DataRoot(data_root).catalog.read.list_runs()
    assert runs.loc[0, "run_id"] == "s" and runs.loc[0, "status"] == "complete"
    assert len(DataRoot(data_root).catalog.read.boundary_stats(["s"])) == 10


def test_resume_equals_uninterrupted(tiny_llama, prompts_file, data_root):
    s = _settings(tiny_llama, prompts_file, limit=10, sample_tokens=300, sample_per_prompt=64)
    s.checkpoint_every = 3
    full = run_capture(s, name="full", data=DataRoot(data_root), progress=False)
    run_capture(s, name="part", data=DataRoot(data_root), progress=False, stop_after=4)
    rd = DataRoot(data_root).run_dir("part")
    assert rd.manifest()["status"] == "running" and rd.manifest()["progress"]["done"] == 4
    assert not (rd.path / "stats.parquet").exists()      # never looks complete
    res = run_capture(s, name="part", data=DataRoot(data_root), progress=False)
    assert res.tokens == full.tokens
    a, b = pd.read_parquet(full.path / "stats.parquet"), pd.read_parquet(res.path / "stats.parquet")
    pd.testing.assert_frame_equal(a.drop(columns="run_id"), b.drop(columns="run_id"), rtol=1e-9)
    sa, sb = load_file(str(full.path / "sample.safetensors")), load_file(str(res.path / "sample.safetensors"))
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key
    with pytest.raises(SpecLensError, match="already complete"):
        run_capture(s, name="part", data=DataRoot(data_root), progress=False)


def test_resume_with_other_settings_refused(tiny_llama, prompts_file, data_root):
    s = _settings(tiny_llama, prompts_file, limit=6)
    run_capture(s, name="r", data=DataRoot(data_root), progress=False, stop_after=2)
    with pytest.raises(SpecLensError, match="other settings"):
        run_capture(_settings(tiny_llama, prompts_file, limit=5), name="r", data=DataRoot(data_root), progress=False)


def test_nan_reported_per_boundary(tiny_llama, prompts_file, data_root, tmp_path):
    """A NaN in one layer's weights: the boundaries after it report NaN tokens, the ones before stay clean."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama))
    with torch.no_grad():
        model.model.layers[5].mlp.down_proj.weight[0, 0] = float("nan")
    bad = tmp_path / "nan-model"
    model.save_pretrained(str(bad))
    AutoTokenizer.from_pretrained(str(tiny_llama)).save_pretrained(str(bad))
    r = run_capture(_settings(bad, prompts_file, limit=3), name="nan", data=DataRoot(data_root), progress=False)
    df = pd.read_parquet(r.path / "stats.parquet").set_index("boundary")
    assert (df.loc[["S_0", "S_1", "S_5"], "nonfinite_tokens"] == 0).all()
    assert (df.loc[["S_6", "S_8", "F"], "nonfinite_tokens"] > 0).all()
    assert set(r.nonfinite) >= {"S_6", "S_7", "S_8", "F"}
    assert np.isfinite(df.loc["S_5", "mean_norm"])


def test_subset_of_boundaries(tiny_llama, prompts_file, data_root):
    run_capture(_settings(tiny_llama, prompts_file, limit=2, boundaries=["F", "S_2", "S_4"]), name="sub",
                data=DataRoot(data_root), progress=False)
    assert DataRoot(data_root).run_dir("sub").manifest()["boundaries"] == ["S_2", "S_4", "F"]
    with pytest.raises(SpecLensError, match="out of range"):
        run_capture(_settings(tiny_llama, prompts_file, boundaries=["S_9"]), name="x", data=DataRoot(data_root),
                    progress=False)


@pytest.mark.parametrize("content,match", [
    ("", "no prompts in file"),
    ('{"turns": ["hi"]}\n{not json\n', r"prompts.jsonl:2: malformed JSONL line"),
    ('{"foo": 1}\n', r"prompts.jsonl:1: no prompt text"),
])
def test_bad_prompt_files(tiny_llama, tmp_path, data_root, content, match):
    p = tmp_path / "prompts.jsonl"
    p.write_text(content)
    with pytest.raises(SpecLensError, match=match):
        run_capture(_settings(tiny_llama, p), name="bad", data=DataRoot(data_root), progress=False)


def test_bad_model_dirs(tiny_llama, prompts_file, tmp_path, data_root):
    with pytest.raises(SpecLensError, match="no config.json"):
        run_capture(_settings(tmp_path / "nowhere", prompts_file), name="m", data=DataRoot(data_root), progress=False)
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_llama.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "model.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(SpecLensError, match=r"broken: cannot load model"):
        run_capture(_settings(broken, prompts_file), name="m", data=DataRoot(data_root), progress=False)


def test_cli_one_line_error(tmp_path, data_root):
    import subprocess
    import sys

    p = tmp_path / "empty.txt"
    p.write_text("\n\n")
    out = subprocess.run([sys.executable, "-m", "backend", "capture", "--model", str(tmp_path), "--prompts", str(p)],
                         capture_output=True, text=True,
                         env={**__import__("os").environ, "SPECLENS_DATA": str(data_root)})
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(p) in lines[0]


def test_a_boundary_that_never_reaches_the_statistics_fails_the_run(tiny_llama, prompts_file, data_root, monkeypatch):
    """The engine runs every token (its own count agrees) but one boundary's states never reach the statistics, as
    when vLLM's compiled engine was not armed (its layer hooks never fire): the run fails with one line naming the
    boundary and its count; it is never complete with statistics of no tokens."""
    from backend.stats import StreamingStats

    orig = StreamingStats.update                     # F's states never reach the statistics
    monkeypatch.setattr(StreamingStats, "update",
                        lambda self, i, x: None if self.labels[i] == "F" else orig(self, i, x))
    monkeypatch.setattr(StreamingStats, "update_all", lambda self, xs: [self.update(i, x) for i, x in enumerate(xs)])
    with pytest.raises(SpecLensError, match=r"hf ran all \d+ prompt tokens but the statistics hold F 0 of \d+"):
        run_capture(_settings(tiny_llama, prompts_file, limit=3), name="lost", data=DataRoot(data_root),
                    progress=False)
    m = DataRoot(data_root).run_dir("lost").manifest()
    assert m["status"] == "failed" and "F 0 of" in m["error"]
    assert not (DataRoot(data_root).run_dir("lost").path / "stats.parquet").exists()
