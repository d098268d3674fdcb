"""`python -m backend check-drafter` on the shipped toy pair (models/toy-pair.tar.gz), its lint on edited copies of
the toy drafters' configs and weights, the training-data comparison on files written by backend/producers.py, and
the Drafter check page (AppTest and a real browser)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from backend.check_drafter import CheckSettings, run_check
from backend.demo import PAIR_TARBALL, toy_pair
from backend.drafter import lint as L
from backend.errors import SpecLensError
from backend.store.data_root import DataRoot
from backend.text.check_text import finding_sentence as words

pytestmark = pytest.mark.skipif(not PAIR_TARBALL.exists(), reason="needs the toy pair (models/toy-pair.tar.gz)")
ALL = ["S_0", "S_1", "S_2", "S_3", "S_4", "S_5", "S_6", "S_7", "S_8", "F"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    return toy_pair(DataRoot(tmp_path_factory.mktemp("toy")))


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("check-data")


def drafter_copy(pair: Path, tmp: Path, name: str = "drafter-matched", edit=None, weights=None) -> Path:
    out = tmp / f"{name}-edited"
    shutil.copytree(pair / name, out)
    if edit:
        raw = json.loads((out / "config.json").read_text())
        edit(raw)
        (out / "config.json").write_text(json.dumps(raw))
    if weights:
        from safetensors.torch import load_file, save_file

        sd = load_file(str(out / "model.safetensors"))
        weights(sd)
        save_file(sd, str(out / "model.safetensors"))
    return out


def static(drafter: Path, target: Path, engine: str = "vllm", runner: str | None = "v2"):
    cfg, t, w = L.load(drafter, target)
    rows = L.engine_readings(cfg, t)
    focus = next(r for r in rows if r.engine == engine and r.runner == runner)
    return {(r.engine, r.runner): r for r in rows}, L.lint(cfg, t, w, rows, focus)


# ---------------------------------------------------------------------------- the finder on the toy pair

def _heldout(pair: Path) -> Path:
    from backend.demo import heldout_prompts

    return heldout_prompts(pair)


@pytest.fixture(scope="module")
def checks(pair, root, one_torch_thread) -> dict:
    """Both toy drafters checked and stored under `root`: the after-layer one through the command line (--json, with
    speculators <= 0.4 training data written by backend/producers.py), the matched one through run_check."""
    import contextlib
    import io
    import os

    from backend.__main__ import main
    from backend.producers import write_training_data

    data = write_training_data(pair / "target", _heldout(pair), "speculators-legacy", root.parent / "train-legacy",
                               limit=3)
    old = os.environ.get("SPECLENS_DATA")
    os.environ["SPECLENS_DATA"] = str(root)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            rc = main(["check-drafter", "--drafter", str(pair / "drafter-after-layer"), "--target",
                       str(pair / "target"), "--training-data", str(data.out_dir),      # format detected
                       "--name", "chk-after", "--device", "cpu", "--json", "--quiet"])
    finally:
        if old is None:
            os.environ.pop("SPECLENS_DATA")
        else:
            os.environ["SPECLENS_DATA"] = old
    matched = run_check(CheckSettings(drafter=str(pair / "drafter-matched"), target=str(pair / "target"),
                                      device="cpu"), name="chk-matched", data=DataRoot(root), progress=False)
    return {"rc": rc, "after": json.loads(out.getvalue()), "matched": matched}


def test_after_layer_drafter_via_cli_json(checks, root) -> None:
    """Bar: the finder names S_3, S_5, S_6 ('after layer') for the after-layer drafter, vLLM feeds S_2, S_4, S_5; the
    whole check (lint, finder, training data) takes at most 60 s on this CPU; --json has the promised keys."""
    assert checks["rc"] == 0
    rep = checks["after"]
    assert rep["training_data"]["format"] == "speculators-legacy"         # no --training-format: read from the files
    assert rep["engine_feeds"]["boundaries"] == ["S_2", "S_4", "S_5"]
    best = rep["best_candidate"]
    assert best["boundaries"] == ["S_3", "S_5", "S_6"]
    assert "'after layer' reading of the default ids [2, 4, 5]" in best["convention"]
    fed = next(c for c in rep["candidates"] if c["boundaries"] == ["S_2", "S_4", "S_5"])
    assert best["cross_entropy"] < fed["cross_entropy"] and fed["z_vs_best"] > 3
    assert best["step1_accuracy"] > fed["step1_accuracy"]
    assert len(rep["candidates"]) >= 6 and all(len(c["accuracy"]) == 3 for c in rep["candidates"])
    assert rep["verdict_severity"] == "error" and rep["verdict"].startswith("Mismatch")
    assert "top-level eagle_aux_hidden_state_layer_ids: [3, 5, 6]" in rep["verdict"]
    assert all(set(f) >= {"severity", "text"} and f["severity"] in L.SEVERITIES for f in rep["findings"])
    # training data (speculators <= 0.4 files: after layer, labelled so) against serving
    td = rep["training_data"]
    assert td["labels"] == ["S_3", "S_5", "S_6", "S_8"] and td["holds"] == td["labels"]
    assert td["aux_holds"] == ["S_3", "S_5", "S_6"]
    texts = [f["text"] for f in rep["findings"] if f["source"] == "training_data"]
    assert any(t.startswith("Training data and serving disagree") for t in texts), texts
    assert rep["timing"]["total"] <= 60, rep["timing"]
    stored = DataRoot(root).catalog.read.drafter_check("chk-after")
    assert stored["best_candidate"]["boundaries"] == ["S_3", "S_5", "S_6"]


def test_matched_drafter_is_a_match(checks) -> None:
    """Bar: the matched drafter's best candidate is S_2, S_4, S_5 ('before layer' reading of its ids [2, 4, 5]);
    vLLM (V2) feeds exactly that, SGLang feeds S_3, S_5, S_6 and is told to write ids [1, 3, 4]."""
    r = checks["matched"]
    rep = r.report
    assert rep["best_candidate"]["boundaries"] == ["S_2", "S_4", "S_5"]
    assert "'before layer' reading of the eagle_config ids [2, 4, 5]" in rep["best_candidate"]["convention"]
    assert rep["verdict_severity"] == "ok" and rep["verdict"].startswith("Match")
    sg = next(x for x in rep["lint"] if x["engine"] == "sglang")
    assert sg["boundaries"] == ["S_3", "S_5", "S_6"]
    assert any("SGLang" in f["text"] and "eagle_config.eagle_aux_hidden_state_layer_ids: [1, 3, 4]" in f["text"]
               for f in rep["findings"])
    assert rep["timing"]["total"] <= 60, rep["timing"]
    m = json.loads((r.path / "manifest.json").read_text())
    assert m["kind"] == "check" and m["status"] == "complete" and m["boundaries"] == ["S_2", "S_4", "S_5"]


def test_unrolled_scoring_equals_the_inference_path(pair) -> None:
    """The finder's teacher-forced unrolled steps (ttt_forward) give the logits of Eagle3Drafter.prefill + step with the
    same tokens: what it scores is what an engine's proposer would draft."""
    from backend.drafter import Eagle3Drafter
    from backend.drafter.unroll import ttt_forward

    d = Eagle3Drafter.load(pair / "drafter-after-layer")
    g = torch.Generator().manual_seed(0)
    T, K = 12, 3
    aux = torch.randn(T, d.cfg.fc_in, generator=g) * 3
    tok = torch.randint(d.cfg.vocab_size, (T,), generator=g)
    with torch.no_grad():
        out = ttt_forward(d, aux[None], tok[None], K)                     # K x [1, T, V_d]
        for t in (0, 4, 7):
            d.reset()
            o = d.prefill(aux[: t + 1], tok[1: t + 2], torch.arange(t + 1))
            assert torch.allclose(o.logits, out[0][0, t], atol=1e-4)
            for j in range(1, K):
                o = d.step(int(tok[t + 1 + j]), o.hidden, t + j)
                assert torch.allclose(o.logits, out[j][0, t], atol=1e-4), (t, j)


# ---------------------------------------------------------------------------- lint

def test_lint_nested_ids_for_vllm_v2_runner(pair, tmp_path) -> None:
    """Bar: nested ids only -> vLLM 0.24's V2 runner ignores them and feeds its default; the finding names it."""
    def nested(raw):
        raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 4, 6]
    rows, fs = static(drafter_copy(pair, tmp_path, edit=nested), pair / "target")
    assert rows[("vllm", "v2")].boundaries == ["S_2", "S_4", "S_5"] and rows[("vllm", "v2")].ids is None
    assert rows[("vllm", "v1")].boundaries == ["S_1", "S_4", "S_6"]
    assert rows[("sglang", None)].boundaries == ["S_2", "S_5", "S_7"]
    hit = [(f, words(f)) for f in fs if "V2 model runner" in words(f)]
    assert hit and hit[0][0].severity == "error" and hit[0][0].code == "nested_ids_v2_picked"
    assert "feeds its default S_2, S_4, S_5" in hit[0][1] and "S_1, S_4, S_6" in hit[0][1]
    assert "top-level eagle_aux_hidden_state_layer_ids: [1, 4, 6]" in hit[0][1]


def test_lint_top_level_ids_for_sglang(pair, tmp_path) -> None:
    """Bar: top-level ids only -> SGLang reads only eagle_config and feeds its default; the finding names it."""
    def top(raw):
        raw["eagle_config"].pop("eagle_aux_hidden_state_layer_ids")
        raw["eagle_aux_hidden_state_layer_ids"] = [1, 3, 6]
    rows, fs = static(drafter_copy(pair, tmp_path, edit=top), pair / "target", engine="sglang", runner=None)
    assert rows[("sglang", None)].boundaries == ["S_2", "S_4", "S_5"]
    assert rows[("vllm", "v2")].boundaries == ["S_1", "S_3", "S_6"] == rows[("vllm", "v1")].boundaries
    hit = [(f, words(f)) for f in fs if "SGLang reads only eagle_config" in words(f)]
    assert hit and hit[0][0].severity == "error" and hit[0][0].figures["sglang"] == ["S_2", "S_4", "S_5"]
    assert "feeds its default S_2, S_4, S_5" in hit[0][1] and "vLLM feeds S_1, S_3, S_6" in hit[0][1]


def test_lint_flags_weights_and_engine_specific_flags(pair, tmp_path) -> None:
    def cfg(raw):
        raw.update(norm_before_residual=True, tie_word_embeddings=True, num_aux_hidden_states=4)
        raw.pop("draft_vocab_size")

    def w(sd):
        sd["d2t"][7] = 5000                      # draft id 7 -> target id 5007: outside the 4096-token vocab
    _, fs = static(drafter_copy(pair, tmp_path, edit=cfg, weights=w), pair / "target")
    text = {f.severity: [] for f in fs}
    for f in fs:
        text[f.severity].append(words(f))
    errors = " ".join(text.get("error", []))
    assert "d2t maps 1 draft id(s) outside the target vocab" in errors and "7 -> 5007" in errors
    assert "fc.weight takes 3 aux states" in errors and "num_aux_hidden_states: 3" in errors
    warnings = " ".join(text.get("warning", []))
    for needle in ("norm_before_residual is true", "tie_word_embeddings is true", "no draft_vocab_size"):
        assert needle in warnings


def test_clean_config_has_no_errors(pair) -> None:
    _, fs = static(pair / "drafter-matched", pair / "target")
    assert not [f for f in fs if f.severity == "error"], fs


@pytest.mark.parametrize("case", ["other_target", "vocab", "no_architecture", "ids_out_of_range"])
def test_bad_input_is_one_line_naming_file_and_fix(pair, tiny_llama, tmp_path, capsys, case) -> None:
    from backend.__main__ import main

    target = pair / "target"
    drafter = pair / "drafter-matched"
    if case == "other_target":
        target = tiny_llama                                   # hidden 64, vocab 512
        want = ["config.json", "target_hidden_size 256", "hidden_size 64", "--target"]
    elif case == "vocab":
        drafter = drafter_copy(pair, tmp_path, edit=lambda r: r.update(vocab_size=32000))
        want = ["config.json", "vocab_size 32000", "--target"]
    elif case == "no_architecture":
        drafter = drafter_copy(pair, tmp_path, edit=lambda r: r.pop("architectures"))
        want = [str(drafter / "config.json"), "no 'architectures'", "add \"architectures\""]
    else:
        drafter = drafter_copy(pair, tmp_path, edit=lambda r: r["eagle_config"].update(
            eagle_aux_hidden_state_layer_ids=[2, 4, 40]))
        want = [str(drafter / "config.json"), "[40] out of range for the 8-layer target", "write ids"]
    rc = main(["check-drafter", "--drafter", str(drafter), "--target", str(target), "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: ") and "\n" not in err, err
    for w in want:
        assert w in err, (w, err)
    with pytest.raises(SpecLensError):
        L.load(drafter, target)


# ---------------------------------------------------------------------------- training data

def test_mislabelled_training_data_is_found(pair, tmp_path, one_torch_thread) -> None:
    """speculators (>= 0.5) files captured 'after layer' but labelled S_a: the comparison names what they hold."""
    from backend import training_data as td
    from backend.engines import hf
    from backend.producers import write_training_data

    out = write_training_data(pair / "target", _heldout(pair), "speculators", tmp_path / "hs", limit=2,
                              capture_rule="after", ids=[2, 4, 5])
    lm = hf.load(pair / "target", "cpu")
    dc = td.compare(lm, out.out_dir, "speculators", pair / "drafter-matched", pair / "target")
    assert dc.labels == ["S_2", "S_4", "S_5", "S_8"]
    assert dc.holds == ["S_3", "S_5", "S_6", "S_8"] and dc.aux_holds == ["S_3", "S_5", "S_6"]
    fs = td.findings(dc, ["S_2", "S_4", "S_5"], "vLLM 0.24.0 (V2 runner)", ["S_2", "S_4", "S_5"])
    assert fs[0].severity == "error" and "S_2 is really S_3" in words(fs[0])
    assert any(words(f).startswith("Training data and serving disagree") for f in fs)


# ---------------------------------------------------------------------------- the page

def _app(root: Path, monkeypatch, **params):
    from streamlit.testing.v1 import AppTest

    from backend.config import REPO_ROOT

    monkeypatch.setenv("SPECLENS_DATA", str(root))
    at = AppTest.from_file(str(REPO_ROOT / "app.py"), default_timeout=120)
    for k, v in params.items():
        at.query_params[k] = v
    at.switch_page("pages/drafter_check.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_page_shows_a_stored_check(checks, root, monkeypatch) -> None:
    at = _app(root, monkeypatch, run="chk-after", metric="tau")
    # the verdict is as loud as its predicted tau cost (dashboard/severity.py): a few % is a note, not an error
    verdict = next(e.value for e in [*at.info, *at.warning, *at.error] if "Mismatch: " in e.value)
    assert "Mismatch: the drafter was trained on S_3, S_5, S_6" in verdict and "predicted tau" in verdict
    lint, cands, training = (d.value for d in at.dataframe)
    assert list(lint["feeds"]) == ["S_2, S_4, S_5"] * 3
    assert cands.iloc[0]["boundaries"] == "S_3, S_5, S_6" and cands.iloc[0]["role"] == "best"
    assert list(training["really is"]) == ["S_3", "S_5", "S_6", "S_8"]
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(figs) == 3 and "tau" in figs[0]["layout"]["title"]["text"]
    assert at.query_params["run"] == "chk-after" and at.query_params["metric"] == "tau"
    at.selectbox(key="qp_run").set_value("chk-matched").run()
    assert at.query_params["run"] == "chk-matched" and at.success[0].value.startswith("Match")


def test_page_without_checks_says_how(tmp_path, monkeypatch) -> None:
    at = _app(tmp_path, monkeypatch)
    assert "python -m backend check-drafter" in at.info[0].value


def test_page_in_a_browser(checks, root, tmp_path) -> None:
    """The page by its URL in Debian chromium: verdict, the charts drawn; a screenshot to look at."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_browser import CHROMIUM, browser_page, open_view, streamlit_server

    if not CHROMIUM.exists():
        pytest.skip("needs Debian chromium")
    import os

    shots = Path(os.environ.get("SPECLENS_SCREENSHOTS") or tmp_path)
    with streamlit_server(root, tmp_path) as url, browser_page(url) as page:
        page.set_viewport_size({"width": 1440, "height": 2600})
        open_view(page, url, "/drafter?run=chk-after", charts=3)
        assert "Mismatch" in page.locator('[data-testid="stAlert"]').first.inner_text()
        page.screenshot(path=str(shots / "drafter_check.png"), full_page=True)
        open_view(page, url, "/drafter?run=chk-matched&metric=cross_entropy", charts=2)
        assert "Match" in page.locator('[data-testid="stAlert"]').first.inner_text()


def test_compare_names_the_mismatch_from_the_check(pair, root, checks) -> None:
    """Real benches of both toy drafters next to the stored checks: Compare says in plain words that the
    after-layer drafter was fed S_2, S_4, S_5 but trained on S_3, S_5, S_6, and says nothing of the matched one."""
    from backend.bench import BenchSettings, run_bench
    from dashboard import compare_words as compare

    ids = []
    for d in ("drafter-matched", "drafter-after-layer"):
        s = BenchSettings(target=str(pair / "target"), drafter=str(pair / d), prompts=str(_heldout(pair)),
                          num_spec_tokens=4, repeats=1, limit=1, max_new_tokens=8, device="cpu")
        ids.append(run_bench(s, name=f"cmp-{d}", data=DataRoot(root), progress=False).run_id)
    lines = [w for w in compare.compare(ids, data=DataRoot(root)).warnings if "drafter check" in w]
    assert len(lines) == 1, lines
    assert lines[0].startswith("`cmp-drafter-after-layer`: the engine fed S_2, S_4, S_5, but drafter check "
                               "`chk-after` finds drafter-after-layer was trained on S_3, S_5, S_6 (off by one")


# ---------------------------------------------------------------------------- evidence too weak to tell

def _randomise(sd: dict) -> None:
    g = torch.Generator().manual_seed(7)
    for k, v in sd.items():
        if v.is_floating_point():
            sd[k] = torch.randn(v.shape, generator=g) * (0.5 if v.dim() < 2 else 1 / max(v.shape[-1], 1) ** 0.5)


def test_random_drafter_is_inconclusive_never_match(pair, tmp_path, data_root, one_torch_thread) -> None:
    """Bar: a drafter with random weights (top-1 near 0% on every candidate) never gets Match or Mismatch."""
    d = drafter_copy(pair, tmp_path, weights=_randomise)
    rep = run_check(CheckSettings(drafter=str(d), target=str(pair / "target"), device="cpu", num_prompts=6,
                                  new_tokens=32, prompts=str(_heldout(pair))), data=DataRoot(data_root),
                    progress=False).report
    assert rep["verdict"].startswith("Inconclusive: the drafter predicts no better than chance"), rep["verdict"]
    assert rep["verdict_severity"] == "warning" and rep["best_candidate"] is None
    assert "Match" not in rep["verdict"] and "Mismatch" not in rep["verdict"]
    assert rep["chance"]["accuracy"] >= max(c["step1_accuracy"] for c in rep["candidates"]) - 0.05
    assert not any(f["text"].startswith(("Match", "Mismatch")) for f in rep["findings"])


def test_trained_drafter_beats_chance(checks) -> None:
    """The chance check must not fire on a real drafter: the matched toy drafter is far above its chance level."""
    rep = checks["matched"].report
    assert rep["chance"]["accuracy"] + 0.2 < rep["best_candidate"]["step1_accuracy"]
    assert rep["verdict"].startswith("Match")


def test_search_stays_inside_the_stack(pair, tmp_path, data_root, one_torch_thread) -> None:
    """Ids that put S_0 first and S_N last: the candidates and the neighbour search never leave S_0..S_N, F."""
    from backend.drafter import finder as fd

    assert all("S_-1" not in nb and "S_9" not in nb for nb in fd.neighbours(("S_0", "S_4", "S_8"), 8))
    assert ("S_0", "S_4", "F") in fd.neighbours(("S_0", "S_4", "S_8"), 8)
    d = drafter_copy(pair, tmp_path, edit=lambda raw: raw.update(eagle_aux_hidden_state_layer_ids=[0, 4, 8]))
    rep = run_check(CheckSettings(drafter=str(d), target=str(pair / "target"), device="cpu", num_prompts=4,
                                  new_tokens=24, prompts=str(_heldout(pair))), data=DataRoot(data_root),
                    progress=False).report
    seen = {b for c in rep["candidates"] for b in c["boundaries"]}
    assert seen <= set(ALL), seen
    assert rep["engine_feeds"]["boundaries"] == ["S_0", "S_4", "S_8"]


# ---------------------------------------------------------------------------- --write-fix (issue: fix and prove)


def test_write_fix_of_the_after_layer_drafter(checks, pair, tmp_path) -> None:
    """The after-layer drafter (trained on S_3, S_5, S_6; vLLM's V2 runner feeds S_2, S_4, S_5): the fix writes the
    top-level ids [3, 5, 6], the weights unchanged, and the fixed config makes vLLM feed what it was trained on."""
    import filecmp

    from backend.drafter.fix import FixPlan, write_fix

    fix = checks["after"]["fix"]
    assert "plan" in fix, fix
    plan = FixPlan(**fix["plan"])
    assert (plan.engine, plan.where, plan.ids) == ("vllm", "top-level", [3, 5, 6])
    out = write_fix(plan, tmp_path / "fixed")
    raw, orig = (json.loads((d / "config.json").read_text()) for d in (out, pair / "drafter-after-layer"))
    assert raw["eagle_aux_hidden_state_layer_ids"] == [3, 5, 6]
    assert {k: v for k, v in raw.items() if k != "eagle_aux_hidden_state_layer_ids"} == \
        {k: v for k, v in orig.items() if k != "eagle_aux_hidden_state_layer_ids"}          # nothing else changed
    assert filecmp.cmp(out / "model.safetensors", pair / "drafter-after-layer" / "model.safetensors", shallow=False)
    rows, _ = static(out, pair / "target", "vllm", "v2")
    assert rows[("vllm", "v2")].boundaries == ["S_3", "S_5", "S_6"]
    text = (out / "FIX.md").read_text()
    assert "from absent to [3, 5, 6]" in text and "Holds for" in text and "vLLM 0.24.0" in text
    with pytest.raises(SpecLensError, match="not empty"):
        write_fix(plan, out)


def test_no_fix_for_a_match_a_lint_only_or_an_inconclusive_check(checks, pair, data_root, tmp_path,
                                                                  one_torch_thread) -> None:
    assert checks["matched"].report["fix"]["refused"].startswith("nothing to fix: vLLM 0.24.0")
    lint = run_check(CheckSettings(drafter=str(pair / "drafter-matched"), target=str(pair / "target"), lint_only=True),
                     data=DataRoot(data_root), progress=False).report
    assert "lint-only check does not know" in lint["fix"]["refused"]
    d = drafter_copy(pair, tmp_path, weights=_randomise)
    rnd = run_check(CheckSettings(drafter=str(d), target=str(pair / "target"), device="cpu", num_prompts=6,
                                  new_tokens=32, prompts=str(_heldout(pair))), data=DataRoot(data_root),
                    progress=False).report
    assert rnd["fix"]["refused"].startswith("no fix written: the check is inconclusive")
    assert rnd["verdict_code"] in ("inconclusive", "at_chance")
    # the planner reads the verdict's code, not its words; a check.json from before the code reads by its words
    from backend.drafter.fix import FixRefused, plan_fix
    with pytest.raises(FixRefused, match="inconclusive"):
        plan_fix({**rnd, "verdict": "Reworded: a verdict whose words changed"})
    old = {k: v for k, v in rnd.items() if k != "verdict_code"}
    with pytest.raises(FixRefused, match="inconclusive"):
        plan_fix(old)


def test_write_fix_cli_refuses_in_one_line_and_keeps_the_check(pair, data_root, tmp_path, capsys,
                                                               one_torch_thread) -> None:
    from backend.__main__ import main

    rc = main(["check-drafter", "--drafter", str(pair / "drafter-matched"), "--target", str(pair / "target"),
               "--device", "cpu", "--num-prompts", "4", "--new-tokens", "24", "--name", "chk-fix-cli",
               "--write-fix", str(tmp_path / "out"), "--quiet"])
    err = [x for x in capsys.readouterr().err.strip().splitlines() if not x.startswith("Loading weights")]
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: nothing to fix"), err
    assert not (tmp_path / "out").exists()
    assert (data_root / "runs" / "chk-fix-cli" / "manifest.json").exists()       # the check itself is kept
    assert main(["check-drafter", "--drafter", "x", "--target", "y", "--prove"]) == 2
    assert "--prove needs --write-fix" in capsys.readouterr().err


def test_prove_recovers_tau(checks, pair, tmp_path, data_root, one_torch_thread) -> None:
    """The proof bench of the after-layer drafter's vLLM fix on the held-out prompts: fed what it was trained on, its
    tau rises; both against one paired baseline; greedy outputs stay equal to plain decoding."""
    from backend.drafter.fix import FixPlan, write_fix
    from backend.prove_fix import prove

    plan = FixPlan(**checks["after"]["fix"]["plan"])
    out = write_fix(plan, tmp_path / "fixed")
    pr = prove(plan, out, str(_heldout(pair)), limit=6, name="pv", data=DataRoot(data_root), progress=False,
               device="cpu", max_new_tokens=32)
    assert pr.tau_fixed > pr.tau_original and pr.lossless is True
    assert pr.baseline is not None and pr.compare == f"/compare?runs={pr.fixed},{pr.original}"
    m = json.loads((data_root / "runs" / pr.original / "manifest.json").read_text())
    assert m["baseline_run"] == pr.baseline


def test_page_shows_the_fix_and_its_button_writes_and_queues(checks, pair, root, tmp_path, monkeypatch) -> None:
    at = _app(root, monkeypatch, run="chk-after")
    md = " ".join(m.value for m in at.markdown)
    assert "Write `top-level eagle_aux_hidden_state_layer_ids: [3, 5, 6]`" in md and "then feeds S_3, S_5, S_6" in md
    assert "--write-fix FIXED_DIR --prove" in at.code[0].value
    assert not at.button and "read-only" in " ".join(c.value for c in at.caption)       # no button by default
    work = tmp_path / "data"
    shutil.copytree(root, work)
    monkeypatch.setenv("SPECLENS_READONLY", "0")
    monkeypatch.setenv("SPECLENS_ALLOW_JOBS", "1")
    monkeypatch.setenv("SPECLENS_MODEL_ROOTS", f"{pair}:{work}")
    at = _app(work, monkeypatch, run="chk-after")
    at.button(key="prove").click().run()
    ok = " ".join(x.value for x in at.success)
    assert "Queued prove-chk-after-hf-original, prove-chk-after-hf-fixed" in ok, [e.value for e in at.error]
    fixed = work / "models" / "fixes" / "chk-after"
    assert json.loads((fixed / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [3, 5, 6]
    from backend.jobs import queue
    assert queue.find("prove-chk-after-hf-fixed", DataRoot(work))[0] == "pending"
    at = _app(root, monkeypatch, run="chk-matched")
    assert any(i.value.startswith("Nothing to fix: vLLM 0.24.0") for i in at.info)
    at = _app(work, monkeypatch, run="chk-after")                  # the fix's own engine, through the job queue
    assert [o for o in at.radio(key="prove_engine").options] == [
        "HF reference bench on the CPU, fed as vLLM 0.24.0 feeds",
        "vLLM itself on the GPU (the worker runs the queued benches)"]
    at.radio(key="prove_engine").set_value("vllm").run()
    assert at.code[0].value.endswith("--write-fix FIXED_DIR --prove --prove-engine vllm")
    at.button(key="prove").click().run()
    ok = " ".join(x.value for x in at.success)
    assert "Queued prove-chk-after-vllm-original, prove-chk-after-vllm-fixed" in ok, [e.value for e in at.error]
    assert queue.find("prove-chk-after-vllm-fixed", DataRoot(work))[1]["settings"]["engine"] == "vllm"


def _sglang_fix_report(pair: Path) -> dict:
    """A check report whose fix is for SGLang 0.5.15: the after-layer drafter (trained on S_3, S_5, S_6) as the user
    knows it (`--trained-on`), SGLang's ids in eagle_config."""
    from backend.drafter.fix import plan_for

    cfg, t, _ = L.load(pair / "drafter-after-layer", pair / "target")
    plan = plan_for(cfg, t, ["S_3", "S_5", "S_6"], "sglang", "0.5.15", check_run="chk-sg")
    plan.drafter, plan.target = str(pair / "drafter-after-layer"), str(pair / "target")
    return {"run_id": "chk-sg", "fix": {"plan": plan.to_json()}}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_page_button_proves_through_the_checks_engine(engine, checks, pair, tmp_path, monkeypatch) -> None:
    """The button's proof through vLLM or SGLang (the engine the fix is for) queues the same two GPU bench jobs as
    `check-drafter --prove --prove-engine E`: built by prove_fix.engine_jobs, valid job specs through E in bf16, the
    fixed one on the written fix, and the shown command says --prove-engine E; another engine is refused in one line.
    (Before, the button always queued HF reference benches.)"""
    from backend import prove_fix
    from backend.jobs import queue
    from backend.jobs import spec as specs
    from dashboard.check_charts import fix_command

    monkeypatch.setenv("SPECLENS_MODEL_ROOTS", f"{pair}:{tmp_path}")
    rep = checks["after"] if engine == "vllm" else _sglang_fix_report(pair)
    assert rep["fix"]["plan"]["engine"] == engine
    calls = []
    real = prove_fix.engine_jobs
    monkeypatch.setattr(prove_fix, "engine_jobs", lambda *a, **k: calls.append(k) or real(*a, **k))
    data = DataRoot(tmp_path / "data")
    res = prove_fix.queue_proof(rep, data, engine=engine)
    assert [k["engine"] for k in calls] == [engine]
    run = rep["run_id"]
    assert res["jobs"] == [f"prove-{run}-{engine}-original", f"prove-{run}-{engine}-fixed"]
    assert res["compare"] == f"/compare?runs=prove-{run}-{engine}-fixed,prove-{run}-{engine}-original"
    plan_version = rep["fix"]["plan"]["version"]
    for tag, drafter in (("original", rep["fix"]["plan"]["drafter"]), ("fixed", res["fixed"])):
        state, job = queue.find(f"prove-{run}-{engine}-{tag}", data)
        st = job["settings"]
        assert state == "pending" and job["kind"] == "bench" and st["engine"] == engine and st["dtype"] == "bf16"
        assert "device" not in st and (st["producer"], st["producer_version"]) == (engine, plan_version)
        assert Path(st["drafter"]).resolve() == Path(drafter).resolve()
        again = specs.validate({"kind": "bench", "name": job["name"], **st})           # a valid job spec as stored
        assert again[0]["settings"] == st
    fixed_cfg = json.loads((Path(res["fixed"]) / "config.json").read_text())
    if engine == "sglang":
        assert fixed_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    else:
        assert fixed_cfg["eagle_aux_hidden_state_layer_ids"] == [3, 5, 6]
    assert fix_command(rep, engine).endswith(f"--prove --prove-engine {engine}")
    assert fix_command(rep).endswith("--write-fix FIXED_DIR --prove")                      # HF: no --prove-engine
    other = "sglang" if engine == "vllm" else "vllm"
    with pytest.raises(SpecLensError, match=f"engine {other}: the fix is for"):
        prove_fix.queue_proof(rep, data, engine=other)
