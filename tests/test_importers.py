"""import-capture: each producer's format, written from a real (tiny) model, imports with the right labels,
equals an HF capture of the same prompts, and aligns (or shows the expected mislabelling verdict)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from backend.align import align_runs
from backend.capture import CaptureSettings, run_capture
from backend.config import REPO_ROOT
from backend.errors import SpecLensError
from backend.importers import import_capture
from backend.producers import drafter_config, write_training_data
from backend.store.rundir import RunDir, list_run_dirs
from backend.toy.target import build_random_target

N = 8
S_LABELS = ["S_2", "S_4", "S_5", "S_8"]


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return build_random_target(tmp_path_factory.mktemp("model") / "target", n_layers=N, hidden=64, vocab_size=512)


@pytest.fixture(scope="module")
def env(tmp_path_factory, model_dir):
    """A data root with an HF capture (every boundary) of a few Spec-Bench prompts."""
    base = tmp_path_factory.mktemp("imports")
    prompts = base / "prompts.jsonl"
    rows = (REPO_ROOT / "datasets" / "spec_bench" / "question.jsonl").read_text().splitlines()[:5]
    prompts.write_text("\n".join(rows) + "\n")
    root = base / "data"
    run_capture(CaptureSettings(model=str(model_dir), prompts=str(prompts), device="cpu"), name="hf", root=root,
                progress=False)
    return {"model": model_dir, "prompts": prompts, "root": root, "base": base}


def produce(env, fmt: str, tmp: Path, **kw):
    return write_training_data(env["model"], env["prompts"], fmt, tmp / fmt, rows_per_dir=2, **kw)


def imp(env, path, fmt: str, name: str, **kw):
    kw.setdefault("num_layers", N)
    return import_capture(path, fmt, name=name, root=env["root"], progress=False, **kw)


def manifest(env, run_id: str) -> dict:
    return RunDir.open(run_id, env["root"]).manifest()


def sample(env, run_id: str) -> dict[str, torch.Tensor]:
    return load_file(str(RunDir.open(run_id, env["root"]).file("sample.safetensors")))


def kinds(env, run_id: str) -> list[str]:
    return [f.kind for f in align_runs("hf", run_id, env["root"]).verdict]


# ---------------------------------------------------------------------------- correct imports

CASES = [  # format, producer ids, expected labels (file order = stream order)
    ("speculators", [2, 4, 5], S_LABELS),
    ("vllm-extract", [2, 4, 5, 8], S_LABELS),
    ("speculators-legacy", [1, 3, 4], S_LABELS),
    ("specforge", [1, 3, 4], ["S_2", "S_4", "S_5", "F"]),
    ("speculators", None, S_LABELS),                          # defaults: S_2, S_N//2, S_N-3 + S_N
    ("vllm-extract", None, S_LABELS),
    ("speculators-legacy", None, ["S_3", "S_5", "S_6", "S_8"]),
    ("specforge", None, ["S_2", "S_4", "S_5", "F"]),
]


@pytest.mark.parametrize("fmt,ids,labels", CASES)
def test_import_matches_hf_capture(env, tmp_path, fmt, ids, labels):
    prod = produce(env, fmt, tmp_path, ids=ids)
    assert prod.boundaries == labels
    name = f"imp-{fmt}-{'default' if ids is None else 'ids'}"
    r = imp(env, prod.out_dir, fmt, name, producer_ids=ids)
    m = manifest(env, r.run_id)
    assert m["status"] == "complete" and m["engine"] == f"import:{fmt}" and m["kind"] == "capture"
    assert m["boundaries"] == labels
    assert m["source"]["format"] == fmt and m["source"]["files"] == 5
    assert m["model"]["n_layers"] == N and m["model"]["hidden_size"] == 64
    hf_m = manifest(env, "hf")
    assert r.tokens == hf_m["headline"]["tokens"] and r.prompts == 5
    a, b = sample(env, "hf"), sample(env, r.run_id)
    assert torch.equal(a["ctx_hash"], b["ctx_hash"]) and torch.equal(a["token_ids"], b["token_ids"])
    for lbl in labels:
        assert torch.equal(a[lbl], b[lbl]), lbl
    assert kinds(env, r.run_id) == ["aligned"]


@pytest.mark.parametrize("fmt,style,ids,labels", [
    ("speculators", "speculators", [1, 4, 6], ["S_1", "S_4", "S_6", "S_8"]),
    ("speculators", "top_level", [2, 4, 5], S_LABELS),
    ("vllm-extract", "speculators", [2, 4, 5], S_LABELS),     # a drafter config lists aux ids only: + S_N
    ("speculators-legacy", "eagle", [1, 3, 4], S_LABELS),
    ("specforge", "eagle", [1, 3, 4], ["S_2", "S_4", "S_5", "F"]),
])
def test_ids_and_n_from_drafter_config(env, tmp_path, fmt, style, ids, labels):
    prod_ids = ids + [N] if fmt == "vllm-extract" else ids
    prod = produce(env, fmt, tmp_path, ids=prod_ids)
    cfg = tmp_path / "drafter" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(drafter_config(ids, style, verifier=env["model"])))
    # the speculators style names its verifier: N (and hidden size) come from it; others need --model
    kw = {"num_layers": None} if style == "speculators" else {"num_layers": None, "model": str(env["model"])}
    r = imp(env, prod.out_dir, fmt, f"cfg-{fmt}-{style}", drafter_config=str(cfg.parent), **kw)
    m = manifest(env, r.run_id)
    assert m["boundaries"] == labels and m["source"]["ids_from"].startswith("drafter config")
    assert kinds(env, r.run_id) == ["aligned"]


# ---------------------------------------------------------------------------- mislabelled data (the demo)

def test_after_layer_data_imported_as_speculators_is_offset(env, tmp_path):
    prod = produce(env, "speculators", tmp_path, ids=[2, 4, 5], capture_rule="after")
    assert prod.boundaries == ["S_3", "S_5", "S_6", "S_8"]
    r = imp(env, prod.out_dir, "speculators", "wrong-after", producer_ids=[2, 4, 5])
    assert manifest(env, r.run_id)["boundaries"] == S_LABELS
    al = align_runs("hf", r.run_id, env["root"])
    assert al.verdict[0].kind == "offset" and al.offset == 1


def test_f_as_teacher_in_vllm_extract_is_final_norm(env, tmp_path):
    prod = produce(env, "vllm-extract", tmp_path, ids=[2, 4, 5, 8], teacher="F")
    assert prod.boundaries == ["S_2", "S_4", "S_5", "F"]
    r = imp(env, prod.out_dir, "vllm-extract", "wrong-f", producer_ids=[2, 4, 5, 8])
    assert "final_norm" in kinds(env, r.run_id)


def test_nonfinite_values_are_counted_not_averaged(env, tmp_path):
    prod = produce(env, "speculators", tmp_path, ids=[2, 4, 5])
    f = prod.out_dir / "hs_1.safetensors"
    t = load_file(str(f))
    t["hidden_states"][3, 1, 0] = float("nan")                # token 3, S_4
    t["hidden_states"][5, 1, 7] = float("inf")                # token 5, S_4
    save_file(t, str(f))
    r = imp(env, prod.out_dir, "speculators", "nonfinite", producer_ids=[2, 4, 5])
    assert r.nonfinite == {"S_4": 2}
    import pandas as pd
    st = pd.read_parquet(r.path / "stats.parquet").set_index("boundary")
    assert st.loc["S_4", "nonfinite_tokens"] == 2 and st.loc["S_2", "nonfinite_tokens"] == 0
    assert st.loc["S_4", "n_tokens"] == st.loc["S_2", "n_tokens"] - 2
    assert all(pd.notna(st["mean_norm"]))


# ---------------------------------------------------------------------------- bad input

def no_complete_run(env, name: str, failed: bool) -> None:
    """failed: the error came mid-stream and the run is marked failed; else it came before any run existed."""
    runs = {rd.run_id: rd.manifest()["status"] for rd in list_run_dirs(env["root"])}
    if failed:
        assert runs.get(name) == "failed"
        assert manifest(env, name)["error"]
    else:
        assert name not in runs


@pytest.fixture(scope="module")
def good(env, tmp_path_factory):
    """Correct data of every format, copied by each bad-input test before it breaks it."""
    d = tmp_path_factory.mktemp("good")
    return {fmt: produce(env, fmt, d, ids=ids) for fmt, ids, _ in CASES[:4]}


def copy(good, fmt, tmp_path) -> Path:
    return Path(shutil.copytree(good[fmt].out_dir, tmp_path / fmt))


def expect_error(env, path, fmt, name, needle: str, failed: bool, **kw) -> str:
    with pytest.raises(SpecLensError) as e:
        imp(env, path, fmt, name, **kw)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg, msg
    no_complete_run(env, name, failed)
    return msg


def test_missing_path(env, tmp_path):
    expect_error(env, tmp_path / "nowhere", "speculators", "bad-missing", "nowhere", failed=False)


def test_no_matching_files(env, good, tmp_path):
    (tmp_path / "empty").mkdir()
    expect_error(env, tmp_path / "empty", "speculators", "bad-empty", "empty", failed=False)
    d = copy(good, "speculators-legacy", tmp_path)
    msg = expect_error(env, d, "speculators", "bad-wrongfmt", str(d), failed=False)
    assert "--format speculators-legacy" in msg


@pytest.mark.parametrize("fmt,victim,how", [
    ("speculators", "hs_3.safetensors", "garbage"),
    ("vllm-extract", "hs_2.safetensors", "truncate"),
    ("speculators-legacy", "data_2.pt", "garbage"),
    ("specforge", "rows_2-4/data_3.ckpt", "truncate"),
])
def test_corrupt_file_fails_the_run(env, good, tmp_path, fmt, victim, how):
    d = copy(good, fmt, tmp_path)
    f = d / victim
    data = f.read_bytes()
    f.write_bytes(b"not a tensor file at all" if how == "garbage" else data[: len(data) // 2])
    msg = expect_error(env, d, fmt, f"bad-corrupt-{fmt}", f.name, failed=True, producer_ids=good[fmt].ids)
    assert "corrupt" in msg


def test_corrupt_first_file_leaves_no_run(env, good, tmp_path):
    d = copy(good, "specforge", tmp_path)
    (d / "rows_0-2" / "data_0.ckpt").write_bytes(b"\x00" * 64)
    expect_error(env, d, "specforge", "bad-first", "data_0.ckpt", failed=False, producer_ids=[1, 3, 4])


def test_wrong_shapes(env, good, tmp_path):
    d = copy(good, "speculators", tmp_path)
    t = load_file(str(d / "hs_1.safetensors"))
    save_file({"hidden_states": t["hidden_states"][:, 0].contiguous(), "token_ids": t["token_ids"]},
              str(d / "hs_1.safetensors"))                               # [T, H]: no layer axis
    expect_error(env, d, "speculators", "bad-shape-hs", "hs_1.safetensors", failed=True, producer_ids=[2, 4, 5])

    d = copy(good, "vllm-extract", tmp_path)
    t = load_file(str(d / "hs_4.safetensors"))
    save_file({"hidden_states": t["hidden_states"], "token_ids": t["token_ids"][:-1].contiguous()},
              str(d / "hs_4.safetensors"))                               # T mismatch
    expect_error(env, d, "vllm-extract", "bad-shape-tok", "hs_4.safetensors", failed=True, producer_ids=[2, 4, 5, 8])

    d = copy(good, "specforge", tmp_path)
    f = d / "rows_0-2" / "data_1.ckpt"
    t = torch.load(f, weights_only=True)
    t["aux_hidden_state"] = t["aux_hidden_state"][..., :-5]                # not k * H
    torch.save(t, f)
    expect_error(env, d, "specforge", "bad-shape-sf", "data_1.ckpt", failed=True, producer_ids=[1, 3, 4])

    d = copy(good, "speculators-legacy", tmp_path)
    f = d / "data_0.pt"
    t = torch.load(f, weights_only=True)
    t["hidden_states"] = "oops"
    torch.save(t, f)
    expect_error(env, d, "speculators-legacy", "bad-shape-legacy", "data_0.pt", failed=False, producer_ids=[1, 3, 4])


@pytest.mark.parametrize("fmt,ids", [
    ("speculators", [2, 4]),              # files hold 3 aux + teacher
    ("speculators", [2, 4, 5, 7]),        # 4 aux + teacher != the 4 states in the files
    ("vllm-extract", [2, 4, 5]),          # vllm-extract lists every layer, the last included
    ("speculators-legacy", [1, 3]),
    ("specforge", [1, 3, 4, 5]),
])
def test_layer_count_must_match_ids(env, good, tmp_path, fmt, ids):
    d = copy(good, fmt, tmp_path)
    first = good[fmt].files[0].name
    msg = expect_error(env, d, fmt, f"bad-count-{fmt}-{len(ids)}", first, failed=False, producer_ids=ids)
    assert "--producer-ids" in msg


def test_ids_out_of_range_and_duplicates(env, good, tmp_path):
    d = copy(good, "speculators", tmp_path)
    msg = expect_error(env, d, "speculators", "bad-range", str(d), failed=False, producer_ids=[2, 4, 9])
    assert "valid ids are 0..8" in msg
    d2 = copy(good, "specforge", tmp_path)
    expect_error(env, d2, "specforge", "bad-range-sf", str(d2), failed=False, producer_ids=[1, 3, 7])
    expect_error(env, d, "speculators", "bad-dup", "twice", failed=False, producer_ids=[2, 4, 8])


def test_hidden_size_must_agree(env, good, tmp_path):
    d = copy(good, "speculators", tmp_path)
    t = load_file(str(d / "hs_3.safetensors"))
    save_file({"hidden_states": t["hidden_states"][..., :32].contiguous(), "token_ids": t["token_ids"]},
              str(d / "hs_3.safetensors"))
    msg = expect_error(env, d, "speculators", "bad-hidden", "hs_3.safetensors", failed=True, producer_ids=[2, 4, 5])
    assert "hs_0.safetensors" in msg
    big = tmp_path / "big"
    shutil.copytree(env["model"], big)
    cfg = json.loads((big / "config.json").read_text())
    (big / "config.json").write_text(json.dumps({**cfg, "hidden_size": 128}))
    d2 = copy(good, "vllm-extract", tmp_path)
    expect_error(env, d2, "vllm-extract", "bad-hidden-model", "hs_0.safetensors", failed=False,
                 producer_ids=[2, 4, 5, 8], num_layers=None, model=str(big))


def test_num_layers_required(env, good, tmp_path):
    d = copy(good, "speculators", tmp_path)
    msg = expect_error(env, d, "speculators", "bad-n", str(d), failed=False, num_layers=None)
    assert "--num-layers" in msg
    cfg = tmp_path / "bad.json"
    cfg.write_text("{not json")
    expect_error(env, d, "speculators", "bad-cfg", "bad.json", failed=False, drafter_config=str(cfg))
    cfg.write_text(json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids": "2,4,5"}}))
    expect_error(env, d, "speculators", "bad-cfg-ids", "bad.json", failed=False, drafter_config=str(cfg), num_layers=N)
