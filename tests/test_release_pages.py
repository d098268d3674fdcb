"""The Feeds and Regression pages through streamlit's AppTest, on the shipped toy pair: bench runs under two engine
readings and a planted drop, and a full drafter check of the after-layer drafter (what it was trained on)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from backend.config import REPO_ROOT
from backend.demo import PAIR_TARBALL, heldout_prompts, toy_pair
from backend.store.data_root import DataRoot

APP = str(REPO_ROOT / "app.py")
pytestmark = [pytest.mark.skipif(not PAIR_TARBALL.exists(), reason="needs the toy pair (models/toy-pair.tar.gz)"),
              pytest.mark.usefixtures("one_torch_thread")]


def build_release_data(root: Path) -> dict:
    """Benches of the matched toy drafter (vLLM 0.24.0 reading, SGLang 0.5.15 reading, a planted drop) and a
    drafter check of the after-layer drafter, all in data root `root` (the toy pair unpacked under it)."""
    from backend.bench import BenchSettings, run_bench
    from backend.check_drafter import CheckSettings, run_check
    from tests.test_regress import plant_drop

    pair = toy_pair(DataRoot(root))
    base = dict(target=str(pair / "target"), drafter=str(pair / "drafter-matched"), prompts=str(heldout_prompts(pair)),
                limit=8, num_spec_tokens=3, repeats=1, max_new_tokens=24, device="cpu")
    run_bench(BenchSettings(**base), name="rel-vllm", data=DataRoot(root), progress=False)
    run_bench(BenchSettings(**base, producer="sglang", producer_version="0.5.15"), name="rel-sglang",
              data=DataRoot(root), progress=False)
    plant_drop(root, "rel-vllm", "rel-planted")
    run_check(CheckSettings(drafter=str(pair / "drafter-after-layer"), target=str(pair / "target"), device="cpu",
                            num_prompts=6, new_tokens=32, prompts=str(heldout_prompts(pair))), name="chk-after",
              data=DataRoot(root), progress=False)
    return {"pair": pair}


@pytest.fixture(scope="module")
def rel_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("release-data")
    build_release_data(root)
    return root


@pytest.fixture
def rel(rel_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECLENS_DATA", str(rel_root))
    return rel_root


def open_page(page: str, **params: str) -> tuple[AppTest, float]:
    at = AppTest.from_file(APP, default_timeout=120)
    for k, v in params.items():
        at.query_params[k] = v
    at.switch_page(page)
    t = time.perf_counter()
    at.run()
    took = time.perf_counter() - t
    assert not at.exception, [e.value for e in at.exception]
    return at, took


def text(at: AppTest) -> str:
    return "\n".join(e.value for e in [*at.markdown, *at.caption, *at.warning, *at.info, *at.error])


def test_feeds_page_from_a_check(rel: Path) -> None:
    at, _ = open_page("pages/feeds.py")
    body = text(at)
    assert not at.error, [e.value for e in at.error]
    assert "trained on S_3, S_5, S_6 (drafter check chk-after)" in body          # what the finder found
    assert "vllm 0.33.0 (V2) feeds S_2, S_4, S_5 - differs" in body
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(figs) == 1 and "chk-after" in figs[0]["layout"]["title"]["text"]
    table = at.dataframe[-1].value
    assert set(table["trained"]) >= {"differs"} and len(table) == 2 * 19 + 23
    sg = table[(table["engine"] == "sglang") & (table["release"] == "0.5.15")].iloc[0]
    assert sg["feeds"] == "S_2, S_4, S_5" and sg["trained"] == "differs" and sg["status"] == "seen"   # no ids: default
    assert at.query_params["check"] == "chk-after"
    assert len(at.get("download_button")) == 5           # PNG, SVG, HTML, CSV and the view's report zip


def test_feeds_page_by_url_and_refusals(rel: Path) -> None:
    pair = rel / "models" / "toy-pair"
    at, _ = open_page("pages/feeds.py", drafter=str(pair / "drafter-matched"), target=str(pair / "target"))
    assert not at.error and "S_2, S_4, S_5" in text(at)
    at, _ = open_page("pages/feeds.py", drafter="/etc", target="/usr")
    assert at.error and "not under SPECLENS_MODEL_ROOTS" in at.error[0].value
    at, _ = open_page("pages/feeds.py", check="chk-nope")
    assert "`check=chk-nope`" in text(at) and not at.get("plotly_chart"), "no matrix of another check in its place"
    assert at.query_params["check"] == "chk-nope", "the URL keeps what the link asked for"


def test_regression_page(rel: Path) -> None:
    at, _ = open_page("pages/regression.py")
    assert not at.error, [e.value for e in at.error]
    t = at.dataframe[0].value
    assert set(t["run"]) == {"rel-vllm", "rel-sglang", "rel-planted"}
    assert any("sglang 0.5.15 reading" in r for r in t["release"])
    planted = t[t["run"] == "rel-planted"].iloc[0]
    assert planted["tau change vs first [paired 95% CI]"].startswith("-")
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(figs) == 1 and len(figs[0]["data"]) == 2
    assert at.query_params["group"] == "0"


def test_first_render_is_fast(rel: Path) -> None:
    """A warm render of each page in at most 1 s (0.27-0.30 s on a quiet 2-core CPU); the best of three tries, since
    one try right after the browser tests' servers and browsers have run took 1.23 s on a clean-clone CI run."""
    open_page("pages/feeds.py")                                                  # imports warm, as on a server
    open_page("pages/regression.py")
    feeds_s = min(open_page("pages/feeds.py")[1] for _ in range(3))
    reg_s = min(open_page("pages/regression.py")[1] for _ in range(3))
    assert feeds_s <= 1.0 and reg_s <= 1.0, (feeds_s, reg_s)
