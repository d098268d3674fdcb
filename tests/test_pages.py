"""Every dashboard page through streamlit's AppTest, on captures built by the project's own code
(tests/conftest.py). AppTest cannot see sidebar/top navigation or click links: tests/test_browser.py does."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from backend.config import REPO_ROOT
from backend.store.data_root import DataRoot

APP = str(REPO_ROOT / "app.py")


@pytest.fixture
def dash(dash_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The dashboard data root (tests/conftest.py) as SPECLENS_DATA, for this test only."""
    monkeypatch.setenv("SPECLENS_DATA", str(dash_root))
    return dash_root


@pytest.fixture
def demo(demo_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECLENS_DATA", str(demo_root))
    return demo_root


def open_page(page: str, **params: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    for k, v in params.items():
        at.query_params[k] = v
    at.switch_page(page)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(elements) -> str:
    return "\n".join(e.value for e in elements)


def figures(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def values(v) -> np.ndarray:
    """A trace's x/y as numbers (plotly serializes numeric arrays as typed base64 `bdata`)."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"])
    return np.asarray(v)


def params(at: AppTest) -> dict[str, str]:
    return {k: at.query_params[k] for k in at.query_params}


# ---------------------------------------------------------------------------- runs

def test_runs_lists_every_status(dash: Path) -> None:
    at = open_page("pages/runs.py")
    table = at.dataframe[0].value
    status = dict(zip(table["run_id"], table["status"]))
    assert status["a1"] == "complete" and status["live-run"] == "running"
    assert status["dead-run"] == "interrupted" and status["broken-run"] == "failed"
    assert "CUDA out of memory" in table.set_index("run_id").loc["broken-run", "error"]
    assert table.set_index("run_id").loc["nan1", "nonfinite_tokens"] > 0
    assert at.get("progress"), "a running run shows a progress bar"
    assert "resume" in texts(at.warning)


def test_runs_filters_come_from_and_go_to_the_url(dash: Path) -> None:
    at = open_page("pages/runs.py", status="failed,interrupted")
    assert sorted(at.dataframe[0].value["run_id"]) == ["broken-run", "dead-run"]
    at.multiselect(key="qp_status").set_value(["complete"]).run()
    assert params(at)["status"] == "complete"
    assert set(at.dataframe[0].value["status"]) == {"complete"}


def test_empty_catalog_says_how_to_make_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECLENS_DATA", str(tmp_path / "empty"))
    for page in ("pages/runs.py", "pages/alignment.py", "pages/stats.py"):
        at = open_page(page)
        assert "python -m backend demo" in texts(at.info), page
        assert not at.get("plotly_chart")


# ---------------------------------------------------------------------------- alignment

def test_alignment_of_identical_captures_is_aligned(dash: Path) -> None:
    at = open_page("pages/alignment.py", a="a1", b="a2", metric="cosine")
    assert "Aligned" in texts(at.success)
    assert not at.error
    (fig,) = figures(at)
    heat, path = fig["data"]
    assert heat["type"] == "heatmap" and heat["x"][0] == "S_0" and heat["x"][-1] == "F"
    assert path["type"] == "scatter" and path["x"] == path["y"], "identical captures: the path is the diagonal"
    assert at.dataframe[0].value["best match in A"].tolist() == heat["x"]
    assert params(at) == {"a": "a1", "b": "a2", "metric": "cosine"}


def test_alignment_metric_widget_writes_the_url(dash: Path) -> None:
    at = open_page("pages/alignment.py", a="a1", b="a2")
    at.selectbox(key="qp_metric").set_value("rel_l2").run()
    assert params(at)["metric"] == "rel_l2"
    assert "relative L2" in figures(at)[0]["data"][0]["colorbar"]["title"]["text"]


def test_alignment_bf16_is_drift(dash: Path) -> None:
    at = open_page("pages/alignment.py", a="a1", b="b16", metric="cka")
    assert "Numeric drift" in texts(at.warning)
    assert not at.success
    assert figures(at)


def test_alignment_shows_nonfinite_warnings(dash: Path) -> None:
    at = open_page("pages/alignment.py", a="a1", b="nan1")
    assert "hold NaN or inf" in texts(at.warning)
    assert at.dataframe[0].value["NaN/inf tokens B"].max() > 0


def test_alignment_unknown_or_unfinished_run_in_url(dash: Path) -> None:
    at = open_page("pages/alignment.py", a="no-such-run", b="live-run")
    msgs = texts(at.warning)
    assert "No run `no-such-run`" in msgs and "`live-run` (from the URL, `b`) is running" in msgs
    assert figures(at), "falls back to a default pair"


def test_alignment_backend_error_is_one_line(dash: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for rid in ("a1", "a2"):
        shutil.copytree(dash / "runs" / rid, tmp_path / "runs" / rid)
    (tmp_path / "runs" / "a2" / "sample.safetensors").unlink()
    DataRoot(tmp_path).catalog.write.refresh()
    monkeypatch.setenv("SPECLENS_DATA", str(tmp_path))
    at = open_page("pages/alignment.py", a="a1", b="a2")
    assert "missing raw sample" in texts(at.error)
    assert not at.get("plotly_chart")


def test_alignment_default_pair_without_params(dash: Path) -> None:
    at = open_page("pages/alignment.py")
    p = params(at)
    assert p["a"] != p["b"] and p["metric"] == "cosine"
    assert figures(at)


@pytest.mark.parametrize("b,kind,banner", [
    ("demo-fp32-again", "Aligned", "success"), ("demo-after-layer", "Offset by", "error"),
    ("demo-final-norm", "Final norm", "error"), ("demo-rotated", "Basis rotation", "error"),
    ("demo-bf16", "Numeric drift", "warning")])
def test_alignment_verdicts_on_demo_data(demo: Path, b: str, kind: str, banner: str) -> None:
    at = open_page("pages/alignment.py", a="demo-fp32", b=b)
    assert kind in texts(getattr(at, banner))
    assert figures(at)


def test_alignment_default_view_is_the_demo_offset(demo: Path) -> None:
    at = open_page("pages/alignment.py")
    assert params(at)["a"] == "demo-fp32" and params(at)["b"] == "demo-after-layer"
    assert "Offset by +1" in texts(at.error)


# ---------------------------------------------------------------------------- stats

def test_stats_curves_and_outliers(dash: Path) -> None:
    at = open_page("pages/stats.py", runs="a1,b16", stat="rms")
    curves, outliers = figures(at)
    assert [t["name"] for t in curves["data"]] == ["a1", "b16"]
    x = curves["layout"]["xaxis"]                       # x is depth: S_b at b, F after S_8 at 9
    assert x["ticktext"][:2] == ["S_0", "S_1"] and x["tickvals"][:2] == [0, 1]
    assert x["ticktext"][-1] == "F" and x["tickvals"][-1] == 9
    assert outliers["data"][0]["type"] == "heatmap" and outliers["data"][0]["y"][0].startswith("dim ")
    assert params(at) == {"runs": "a1,b16", "stat": "rms", "run": "a1"}


def test_stats_widgets_write_the_url(dash: Path) -> None:
    at = open_page("pages/stats.py", runs="a1,nan1", stat="nonfinite_tokens")
    assert values(figures(at)[0]["data"][1]["y"]).max() > 0, "nan1 has NaN tokens"
    at.selectbox(key="qp_run").set_value("nan1").run()
    at.selectbox(key="qp_stat").set_value("kurtosis").run()
    assert params(at) == {"runs": "a1,nan1", "stat": "kurtosis", "run": "nan1"}
    assert "nan1" in figures(at)[1]["layout"]["title"]["text"]


def test_stats_unknown_run_in_url(dash: Path) -> None:
    at = open_page("pages/stats.py", runs="a1,ghost")
    assert "No run `ghost`" in texts(at.warning)
    assert [t["name"] for t in figures(at)[0]["data"]] == ["a1"]


def test_stats_values_mode_says_ref_is_not_used(dash: Path) -> None:
    """Issue 20 item 3: `ref=` does nothing in values mode: a notice says so, as for any parameter not shown; the
    difference modes use it without one."""
    at = open_page("pages/stats.py", runs="a1,b16", stat="rms", ref="b16")
    assert "`ref=b16` (from the URL) is not used" in texts(at.warning)
    assert [t["name"] for t in figures(at)[0]["data"]] == ["a1", "b16"]
    at = open_page("pages/stats.py", runs="a1,b16", stat="rms", mode="diff", ref="b16")
    assert "is not used" not in texts(at.warning)


def test_a_long_list_of_unknown_runs_is_named_five_at_a_time(dash: Path) -> None:
    """A pasted 10 KB `runs=` of ids the catalog lacks: the first five are named, the rest counted, in one notice."""
    ghosts = [f"ghost{i:03d}" + "x" * 40 for i in range(220)]
    at = open_page("pages/stats.py", runs=",".join(["a1", *ghosts]))
    notice = texts(at.warning)
    assert notice.count("(from the URL, `runs`)") == 5 and "ghost004" in notice and "ghost005" not in notice
    assert "and 215 more value(s) of `runs` that cannot be shown either" in notice
    assert [t["name"] for t in figures(at)[0]["data"]] == ["a1"]


# ---------------------------------------------------------------------------- run page and link notices (issue 14)

@pytest.fixture
def benchdata(bench_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The bench runs of tests/conftest.py (build_bench_data) as SPECLENS_DATA, for this test only."""
    monkeypatch.setenv("SPECLENS_DATA", str(bench_root))
    return bench_root


def test_runs_open_links_go_to_the_run_page(dash: Path) -> None:
    table = open_page("pages/runs.py").dataframe[0].value
    assert len(table) == 7 and set(table["status"]) >= {"complete", "running", "interrupted", "failed"}
    assert table["view"].tolist() == [f"run?id={r}" for r in table["run_id"]], "every run, of any status"


def test_runs_ticked_rows_come_from_the_url(dash: Path) -> None:
    at = open_page("pages/runs.py", ticked="a2,ghost,a2")
    assert "`ghost`" in texts(at.warning) and "left unticked" in texts(at.warning)
    assert params(at)["ticked"] == "a2", "the URL keeps the rows that are ticked"
    link = at.get("page_link")
    assert [(p.proto.page, p.proto.query_string) for p in link] == [("run", "id=a2")]


def test_run_page_per_prompt_table_equals_the_parquet(benchdata: Path) -> None:
    import pandas as pd

    at = open_page("pages/run.py", id="spec-oracle")
    shown = next(d.value for d in at.dataframe if "tau" in d.value.columns).set_index("prompt")
    raw = pd.read_parquet(benchdata / "runs" / "spec-oracle" / "prompts.parquet")
    g = raw.groupby("prompt_id")
    assert sorted(shown.index) == sorted(raw["prompt_id"].astype(str).unique())
    for pid, rows in g:
        row = shown.loc[str(pid)]
        assert row["repeats"] == len(rows) == 2
        assert row["tau"] == pytest.approx(1 + rows["accepted"].sum() / rows["drafts"].sum())
        assert row["drafted"] == 3 * rows["drafts"].sum()
        assert row["tokens/s"] == pytest.approx(rows["tokens_per_s"].mean())
        assert row["TTFT ms"] == pytest.approx(1000 * rows["ttft"].mean())
    base = pd.read_parquet(benchdata / "runs" / "spec-random-baseline" / "prompts.parquet")
    same = raw.merge(base, on=["prompt_id", "repeat"]).eval("output_hash_x == output_hash_y").all()
    assert shown["same as baseline"].all() == same


def test_run_page_filters_from_the_url(benchdata: Path) -> None:
    at = open_page("pages/run.py", id="spec-oracle", category="writing,ghost", q="8", sort="-tokens_per_s")
    shown = next(d.value for d in at.dataframe if "tau" in d.value.columns)
    assert set(shown["category"]) == {"writing"} and all("8" in p for p in shown["prompt"])
    assert shown["tokens/s"].is_monotonic_decreasing
    assert "`category=writing,ghost` (from the URL): `ghost` is not one of the choices of \u201cCategory\u201d" in \
        texts(at.warning), "an unknown category is named, with what the link asked"
    assert params(at) == {"id": "spec-oracle", "category": "writing,ghost", "q": "8", "sort": "-tokens_per_s"}, \
        "the URL keeps what the link asked (issue 20 item 3)"


def test_run_page_of_a_failed_run_shows_its_error_and_log(dash: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(dash / "runs" / "broken-run", tmp_path / "runs" / "broken-run")
    lines = [f"step {i}: ok" for i in range(100)] + ["RuntimeError: CUDA out of memory (tried 2 GiB)"]
    (tmp_path / "runs" / "broken-run" / "capture.log").write_text("\n".join(lines) + "\n")
    DataRoot(tmp_path).catalog.write.refresh()
    monkeypatch.setenv("SPECLENS_DATA", str(tmp_path))
    at = open_page("pages/run.py", id="broken-run")
    assert "Failed: OutOfMemoryError: CUDA out of memory" in texts(at.error)
    (log,) = at.code
    assert log.value.splitlines() == lines[-40:]
    files = next(d.value for d in at.dataframe if "file" in d.value.columns)
    assert {"manifest.json", "capture.log"} <= set(files["file"])


def test_run_page_shows_a_run_whose_process_died_after_it_was_indexed(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The run page rescans the run its link names only: a run indexed as running whose process is gone since shows
    interrupted with the resume hint, and one copied beside the catalog opens, with no full rescan in between."""
    import os

    data = DataRoot(tmp_path)
    data.new_run_dir("live", {"kind": "capture", "engine": "hf", "progress": {"done": 3, "total": 8}}).update(
        pid=os.getpid())
    data.catalog.write.refresh()
    monkeypatch.setenv("SPECLENS_DATA", str(tmp_path))
    at = open_page("pages/run.py", id="live")
    (bar,) = at.get("progress")
    assert bar.proto.text == "running: 3 / 8" and not at.warning
    data.run_dir("live").update(pid=2**22 + 12345)                      # the process died; nothing re-indexed it
    data.new_run_dir("copied", {"kind": "capture", "engine": "hf"}).update(status="complete")
    at = open_page("pages/run.py", id="live")
    assert "Interrupted at 3 / 8" in texts(at.warning)
    at = open_page("pages/run.py", id="copied")
    assert any("badge[complete]" in m.value for m in at.markdown) and not at.warning
    assert "`None`" not in [m.value for m in at.markdown]          # no stray value written by Streamlit's magic


def test_pair_of_one_run_shows_no_verdict(dash: Path) -> None:
    at = open_page("pages/alignment.py", a="a1", b="a1")
    assert not at.success, "a run compared with itself is no 'Aligned' verdict"
    assert "are both `a1`" in texts(at.warning) and "No verdict" in texts(at.info)


def test_substituted_run_gives_no_verdict_and_the_url_keeps_the_link(dash: Path) -> None:
    at = open_page("pages/alignment.py", a="ghost", b="a2")
    shown = at.selectbox(key="qp_a").value
    assert f"No run `ghost` (from the URL, `a`) in the catalog at {dash}; showing `{shown}` instead." in \
        texts(at.warning)
    assert not at.success and not at.error, "no green or red verdict for runs the link did not ask for"
    assert "No verdict for what the link did not ask for" in texts(at.info)
    assert params(at)["a"] == "ghost", "a copied link shares the run asked for, not the substitute"


def test_invalid_choice_and_long_values_are_named_and_cut(dash: Path) -> None:
    at = open_page("pages/alignment.py", a="a1", b="a2", metric="bogus")
    assert "`metric=bogus` (from the URL) is not one of the choices of \u201cMetric\u201d" in texts(at.warning)
    assert "showing `mean cosine` instead" in texts(at.warning) and params(at)["metric"] == "bogus"
    assert "Aligned" in texts(at.success), "the runs are the link's: their verdict stands"
    long = "y" * 100_000
    at = open_page("pages/stats.py", runs=f"a1,{long}")
    (w,) = at.warning
    assert "y" * 80 + "\u2026" in w.value and len(w.value) < 400


def test_duplicated_id_is_shown_once(dash: Path) -> None:
    at = open_page("pages/stats.py", runs="a1,a1")
    assert "`runs=a1,a1` names `a1` more than once" in texts(at.warning)
    assert [t["name"] for t in figures(at)[0]["data"]] == ["a1"] and params(at)["runs"] == "a1,a1"
