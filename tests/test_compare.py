"""Bench runs on the dashboard: the Runs page (filters, annotations, pinned baseline) and the Compare page, through
AppTest and in a real browser, on bench runs made by backend.bench.run_bench (tests/conftest.py build_bench_data);
the annotations module, the incremental catalog refresh and the comparison data they rest on."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import test_browser
from test_browser import CHART, CHROMIUM, TIMEOUT_MS, alerts, browser_page, open_view, streamlit_server
from test_pages import figures, open_page, params, texts, values

from backend import annotations, compare, metrics
from backend.errors import SpecLensError
from backend.store.catalog import CatalogReader
from backend.store.data_root import DataRoot
from dashboard import compare_words

shots = test_browser.shots  # pytest fixture, requested by name below
RUNS = "spec-random,spec-oracle"
INJECTION = "x'); DROP TABLE runs; --"


@pytest.fixture
def bench(bench_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shared bench data root as SPECLENS_DATA (read only: tests that write use `own`)."""
    monkeypatch.setenv("SPECLENS_DATA", str(bench_root))
    return bench_root


@pytest.fixture
def own(bench_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the bench data root (annotations change it), as SPECLENS_DATA, editing enabled
    (SPECLENS_READONLY=0: the dashboard is read-only by default)."""
    root = tmp_path / "data"
    shutil.copytree(bench_root / "runs", root / "runs")
    DataRoot(root).catalog.write.refresh()
    monkeypatch.setenv("SPECLENS_DATA", str(root))
    monkeypatch.setenv("SPECLENS_READONLY", "0")
    return root


# ---------------------------------------------------------------------------- annotations module

def test_tags_are_validated() -> None:
    assert annotations.parse_tags(" fast, k3 fast,v1.2_x ") == ["fast", "k3", "v1.2_x"]
    for bad in (INJECTION, "a,b;c", "x" * 41, "naïve"):
        with pytest.raises(SpecLensError, match="not allowed"):
            annotations.parse_tags(bad)
    with pytest.raises(SpecLensError, match="at most"):
        annotations.parse_tags([f"t{i}" for i in range(annotations.MAX_TAGS + 1)])
    with pytest.raises(SpecLensError, match="at most"):
        annotations.check_notes("n" * (annotations.MAX_NOTES + 1))
    with pytest.raises(SpecLensError, match="NUL"):
        annotations.check_notes("a\x00b")


def test_annotations_round_trip_and_injection_is_literal(own: Path) -> None:
    before = (own / "runs" / "spec-random" / "manifest.json").read_bytes()
    ann = annotations.save("spec-random", tags="fast, k3", notes=INJECTION + "\nsecond line", data=DataRoot(own))
    assert ann.tags == ["fast", "k3"] and ann.notes == INJECTION + "\nsecond line"
    assert (own / "runs" / "spec-random" / "manifest.json").read_bytes() == before, "results stay immutable"
    on_disk = json.loads((own / "runs" / "spec-random" / "annotations.json").read_text())
    assert on_disk["notes"].startswith(INJECTION) and on_disk["tags"] == ["fast", "k3"]
    DataRoot(own).catalog.write.refresh()
    row = DataRoot(own).catalog.read.list_runs().set_index("run_id").loc["spec-random"]
    assert row["tags"] == "fast,k3" and row["notes"] == INJECTION + "\nsecond line"
    read = DataRoot(own).catalog.read
    assert len(read.list_runs()) == 4 and len(read.bench_runs()) == 3   # nothing dropped
    with pytest.raises(SpecLensError, match="not allowed"):
        annotations.save("spec-random", tags=INJECTION, data=DataRoot(own))
    assert annotations.read("spec-random", DataRoot(own)).tags == ["fast", "k3"], "a rejected edit changes nothing"
    for bad in ("../spec-random", "spec-random/../../x", INJECTION):
        with pytest.raises(SpecLensError, match="not a valid run id"):
            annotations.save(bad, notes="x", data=DataRoot(own))
    assert DataRoot(own).catalog.read.list_runs(kind=INJECTION).empty


def test_pin_one_baseline_per_target(own: Path) -> None:
    annotations.save("spec-random-baseline", pinned=True, data=DataRoot(own))
    annotations.save("spec-random", pinned=True, data=DataRoot(own))      # same target: the previous pin goes
    DataRoot(own).catalog.write.refresh()
    assert DataRoot(own).catalog.read.pinned_baselines()["run_id"].tolist() == ["spec-random"]
    assert annotations.read("spec-random-baseline", DataRoot(own)).pinned is False
    with pytest.raises(SpecLensError, match="only bench runs"):
        annotations.save("cap-tiny", pinned=True, data=DataRoot(own))


def test_read_only_refuses_writes(own: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECLENS_READONLY", "1")
    assert not annotations.editable()
    with pytest.raises(SpecLensError, match="read-only"):
        annotations.save("spec-random", notes="x", data=DataRoot(own))
    assert not (own / "runs" / "spec-random" / "annotations.json").exists()


# ---------------------------------------------------------------------------- catalog: incremental refresh

def test_refresh_reads_only_what_changed(own: Path) -> None:
    cat = own / "speclens.duckdb"
    stamp = cat.stat().st_mtime_ns
    DataRoot(own).catalog.write.refresh()
    assert cat.stat().st_mtime_ns == stamp, "nothing changed: nothing written"
    steps = len(DataRoot(own).catalog.read.bench_steps(["spec-oracle"]))
    annotations.save("spec-oracle", notes="edited", data=DataRoot(own))
    DataRoot(own).catalog.write.refresh()
    assert cat.stat().st_mtime_ns != stamp
    assert DataRoot(own).catalog.read.get_run("spec-oracle")["notes"] == "edited"
    assert len(DataRoot(own).catalog.read.bench_steps(["spec-oracle"])) == steps, "its tables re-read once, not twice"
    shutil.rmtree(own / "runs" / "cap-tiny")
    DataRoot(own).catalog.write.refresh()
    assert "cap-tiny" not in DataRoot(own).catalog.read.list_runs()["run_id"].tolist()
    assert DataRoot(own).catalog.read.boundary_stats(["cap-tiny"]).empty
    whole = DataRoot(own).catalog.write.refresh(full=True)
    assert whole == cat and len(DataRoot(own).catalog.read.bench_steps(["spec-oracle"])) == steps


def test_unreadable_manifest_is_quarantined_and_not_reread(own: Path) -> None:
    bad = own / "runs" / "half-written"
    bad.mkdir()
    (bad / "manifest.json").write_text('{"run_id": "half-wr')
    DataRoot(own).catalog.write.refresh()
    row = DataRoot(own).catalog.read.get_run("half-written")
    assert row["status"] == "quarantined" and "unreadable manifest" in row["error"]
    stamp = (own / "speclens.duckdb").stat().st_mtime_ns
    DataRoot(own).catalog.write.refresh()
    assert (own / "speclens.duckdb").stat().st_mtime_ns == stamp


def test_old_catalog_schema_is_rebuilt(own: Path) -> None:
    import duckdb

    con = duckdb.connect(str(own / "speclens.duckdb"))
    con.execute("UPDATE catalog_meta SET value = '1'")
    con.close()
    DataRoot(own).catalog.write.refresh()
    assert len(DataRoot(own).catalog.read.runs_overview()) == 4


# ---------------------------------------------------------------------------- comparison data

def test_comparison_numbers_come_from_aggregates(bench: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CatalogReader, "bench_steps", lambda *a, **k: pytest.fail("per-step rows loaded"))
    monkeypatch.setattr(CatalogReader, "bench_prompts", lambda *a, **k: pytest.fail("all prompt columns loaded"))
    c = compare_words.compare(["spec-random", "spec-oracle"], data=DataRoot(bench))
    f = c.figures.set_index("run_id")
    br = DataRoot(bench).catalog.read.bench_runs().set_index("run_id")
    for r in ("spec-random", "spec-oracle"):
        assert f.loc[r, "tau"] == pytest.approx(br.loc[r, "tau"]), "tau from the histogram = tau as benched"
        assert f.loc[r, "speedup"] == pytest.approx(br.loc[r, "speedup"])
        assert f.loc[r, "speedup_ci_low"] <= f.loc[r, "speedup_ci_high"]
    assert f.loc["spec-oracle", "tau"] > 2 and f.loc["spec-random", "tau"] < f.loc["spec-oracle", "tau"]
    h = c.histogram[c.histogram["run_id"] == "spec-oracle"]
    assert h["accepted"].tolist() == [0, 1, 2, 3] and h["share"].sum() == pytest.approx(1.0)
    pos = c.positions[c.positions["run_id"] == "spec-oracle"]["rate"].tolist()
    assert len(pos) == 3 and pos == sorted(pos, reverse=True), "a chain accepts a prefix: rates fall with position"
    assert set(c.categories["category"]) == {"writing", "math", "coding"}
    assert c.config["setting"].tolist() == ["drafter.proposer"], "only what differs"
    assert "`spec-random` loses 1.26 in tau against `spec-oracle`" in c.headline
    assert "Each figure rests on 2 repeats x 4 prompts" in c.headline


def test_speed_figures_match_numpy_on_the_raw_rows(bench: Path) -> None:
    """Both throughput definitions, TTFT, TPOT and the speedup by total time agree with numpy on the runs' own
    prompts.parquet (not the catalog); the per-prompt figures are those the bench stored. The baseline side is the
    plain half of each run's interleaved pairs (its `base_*` columns); spec-random wrote its pairs' plain half as the
    baseline run both link, spec-oracle reused that run and timed its own pairs."""
    import pandas as pd

    c = compare_words.compare(["spec-random", "spec-oracle"], data=DataRoot(bench))
    f = c.figures.set_index("run_id")
    raw = {r: pd.read_parquet(bench / "runs" / r / "prompts.parquet")
           for r in ("spec-random", "spec-oracle", "spec-random-baseline")}
    written = raw["spec-random-baseline"].set_index(["repeat", "prompt_index"])
    own = raw["spec-random"].set_index(["repeat", "prompt_index"])
    for col in ("output_tokens", "seconds", "tokens_per_s", "output_hash"):
        assert (own[f"base_{col}"] == written.loc[own.index, col]).all(), col
    for r in ("spec-random", "spec-oracle"):
        d = raw[r]
        b = d[["repeat", "prompt_id"]].assign(output_tokens=d["base_output_tokens"], seconds=d["base_seconds"])
        assert f.loc[r, "baseline_timing"] == "interleaved"
        assert f.loc[r, "tokens_per_s"] == pytest.approx(d.groupby("prompt_id")["tokens_per_s"].mean().mean())
        assert f.loc[r, "throughput_total"] == pytest.approx(d["output_tokens"].sum() / d["seconds"].sum())
        assert f.loc[r, "baseline_throughput_total"] == pytest.approx(b["output_tokens"].sum() / b["seconds"].sum())
        assert f.loc[r, "ttft"] == pytest.approx(d.groupby("prompt_id")["ttft"].mean().mean())
        assert f.loc[r, "tpot"] == pytest.approx(d.groupby("prompt_id")["tpot"].mean().mean())
        per_rep = [(g["output_tokens"].sum() / g["seconds"].sum())
                   / (b[b.repeat == k]["output_tokens"].sum() / b[b.repeat == k]["seconds"].sum())
                   for k, g in d.groupby("repeat")]
        assert f.loc[r, "speedup_total"] == pytest.approx(np.mean(per_rep))
        for k in ("tokens_per_s", "throughput_total", "ttft", "tpot", "speedup_total"):
            assert f.loc[r, f"{k}_ci_low"] <= f.loc[r, f"{k}_ci_high"], k
        assert f.loc[r, "tokens_per_s_ci_low"] <= f.loc[r, "tokens_per_s"] <= f.loc[r, "tokens_per_s_ci_high"]
        assert f.loc[r, "prompts"] == 4 and f.loc[r, "repeats"] == 2 and bool(f.loc[r, "baseline_plain"])
    tiles = {t.run_id: t for t in c.tiles}
    # the random drafter accepts nothing and drafts 3 tokens a step: slower than decoding without it (0.2-0.7x
    # here); on a loaded machine its interval may reach 1, and then the tile must say that instead
    lo, hi = f.loc["spec-random", ["speedup_ci_low", "speedup_ci_high"]]
    assert f.loc["spec-random", "speedup"] < 1
    tile = tiles["spec-random"]
    if isinstance(f.loc["spec-random", "speed_noise"], str):       # this machine was busy: no verdict, and why
        assert tile.tone == "noisy" and tile.delta == compare_words.NOISY_DELTA
        assert "No faster/slower verdict" in tile.lines[0]
    elif hi < 1:
        assert tile.tone == "slower" and "slower than without a drafter" in tile.delta
    else:
        assert lo <= 1 and tile.tone == "unclear" and "no clear difference" in tile.delta
    assert tiles["spec-random"].lines[-1].startswith("2 repeats x 4 prompts")
    first = 1 if isinstance(f.loc["spec-oracle", "speed_noise"], str) else 0      # after the no-verdict line
    assert tiles["spec-oracle"].lines[first] == f"tau {f.loc['spec-oracle', 'tau']:.2f} · 42% of drafts accepted"
    lines = {d.key: d for d in compare_words.speed_definitions(c.figures)}
    assert f"**{f.loc['spec-random', 'throughput_total']:.1f}** tokens/s" in lines["total"].lines[0]
    cats = c.categories.set_index(["run_id", "category"])
    w = raw["spec-oracle"][raw["spec-oracle"]["category"] == "writing"]
    assert cats.loc[("spec-oracle", "writing"), "tau"] == pytest.approx(1 + w["accepted"].sum() / w["drafts"].sum())
    few = cats["prompts"] < metrics.MIN_INTERVAL_PROMPTS        # no interval over so few prompts (issue 20 item 4)
    assert cats.loc[few, ["tau_ci_low", "tau_ci_high", "speedup_ci_low", "speedup_ci_high"]].isna().all().all()
    ok = cats[~few]
    assert (ok["tau_ci_low"] <= ok["tau"] + 1e-9).all() and (ok["tau"] <= ok["tau_ci_high"] + 1e-9).all()


def test_speedup_against_the_pinned_baseline(own: Path) -> None:
    c = compare_words.compare(["spec-random", "spec-oracle"], "pinned", data=DataRoot(own))
    assert "No pinned baseline" in " ".join(c.warnings)
    annotations.save("spec-random", pinned=True, data=DataRoot(own))
    DataRoot(own).catalog.write.refresh()
    c = compare_words.compare(["spec-random", "spec-oracle"], "pinned", data=DataRoot(own))
    f = c.figures.set_index("run_id")
    assert f.loc["spec-random", "speedup"] == pytest.approx(1.0)
    assert f.loc["spec-oracle", "baseline_run"] == "spec-random"
    assert f.loc["spec-oracle", "ci_method"].startswith("bootstrap")
    assert f.loc["spec-oracle", "speedup_ci_low"] <= f.loc["spec-oracle", "speedup_ci_high"]   # (timings: the mean
    # over repeats may lie outside a bootstrap interval over 4 prompts)
    assert not c.warnings


def test_a_page_scope_keeps_a_comparison_per_catalog_version(own: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside page scopes (app.py) a comparison is computed once per catalog version and handed out as a copy; the
    pin that changes the catalog is seen at the next page; outside a scope it is computed every time."""
    from backend.store import catalog as store

    ran = []
    real = compare._compare
    monkeypatch.setattr(compare, "_compare", lambda *a: ran.append(1) or real(*a))
    data = DataRoot(own)
    ids = ["spec-random", "spec-oracle"]
    with store.shared_reads():
        first = compare.compare(ids, "pinned", data=data)
        first.figures.loc[0, "speedup"] = -1.0                    # a caller changing its copy
    with store.shared_reads():
        again = compare.compare(ids, "pinned", data=data)
        assert compare.compare(ids, "pinned", data=data, acceptance=compare.load_acceptance(ids, data)
                               ).figures.equals(again.figures)
    assert len(ran) == 2 and not (again.figures["speedup"] == -1.0).any()
    assert "No pinned baseline" in " ".join(compare_words.view(again).warnings)
    annotations.save("spec-random", pinned=True, data=data)
    data.catalog.write.refresh()
    with store.shared_reads():
        pinned = compare.compare(ids, "pinned", data=data)
    assert len(ran) == 3 and pinned.figures.set_index("run_id").loc["spec-oracle", "baseline_run"] == "spec-random"
    compare.compare(ids, "pinned", data=data)
    compare.compare(ids, "pinned", data=data)
    assert len(ran) == 5


def _quiet(root: Path, run: str, edit=None) -> None:
    """Bench run `run` under `root` without its stored noise finding (what this shared machine did while the fixture
    ran must not decide a test), its prompts.parquet changed by `edit` (a frame -> frame), the manifest rewritten so
    the catalog re-reads it."""
    import pandas as pd

    d = root / "runs" / run
    if edit is not None:
        edit(pd.read_parquet(d / "prompts.parquet")).to_parquet(d / "prompts.parquet", index=False)
    m = json.loads((d / "manifest.json").read_text())
    if isinstance(m.get("bench", {}).get("speed_noise"), dict):
        m["bench"]["speed_noise"].update(noisy=False, kinds=[], reason=None)
    (d / "manifest.json").write_text(json.dumps(m, indent=2))


def test_no_verdict_against_a_baseline_timed_at_another_moment(own: Path) -> None:
    """A run benched before interleaving (no pairs) whose prefill took 3x as long as its baseline run's (the issue's
    TTFT 562 vs 207 ms: load, not drafter), and a pinned baseline timed when plain decoding ran at half the speed it
    ran during the drafter run: no faster/slower verdict, and the reason says which moments differ."""
    drop = [f"base_{c}" for c in ("output_tokens", "seconds", "tokens_per_s", "ttft", "tpot", "output_hash")]
    _quiet(own, "spec-random", lambda f: f.drop(columns=drop).assign(ttft=f["ttft"] * 3))
    _quiet(own, "spec-oracle")
    DataRoot(own).catalog.write.refresh()
    c = compare_words.compare(["spec-random", "spec-oracle"], data=DataRoot(own))
    f = c.figures.set_index("run_id")
    assert f.loc["spec-random", "baseline_timing"] == "separate" and f.loc["spec-oracle", "baseline_timing"] == \
        "interleaved"
    why = f.loc["spec-random", "speed_noise"]
    assert "were timed at different moments" in why and "prefill (TTFT" in why, why
    assert not isinstance(f.loc["spec-oracle", "speed_noise"], str)
    tiles = {t.run_id: t for t in c.tiles}
    assert tiles["spec-random"].tone == "noisy" and tiles["spec-oracle"].tone != "noisy"
    assert "No speed verdict for `spec-random`" in c.headline and "No speed verdict for `spec-oracle`" not in c.headline
    # pinned: plain decoding then (the pinned baseline's rows, at half speed) against plain decoding during the run
    import pandas as pd

    during = pd.read_parquet(own / "runs" / "spec-oracle" / "prompts.parquet").set_index(["repeat", "prompt_id"])
    _quiet(own, "spec-random-baseline", lambda f: f.assign(                  # half what it ran at during spec-oracle
        tokens_per_s=during.loc[list(zip(f["repeat"], f["prompt_id"])), "base_tokens_per_s"].to_numpy() / 2))
    annotations.save("spec-random-baseline", pinned=True, data=DataRoot(own))
    DataRoot(own).catalog.write.refresh()
    c = compare_words.compare(["spec-oracle"], "pinned", data=DataRoot(own))
    why = c.figures.set_index("run_id").loc["spec-oracle", "speed_noise"]
    assert "Baseline `spec-random-baseline` was timed at another moment" in why and "(x2.00, 95% CI 2.00" in why, why
    assert c.tiles[0].tone == "noisy" and c.tiles[0].delta == compare_words.NOISY_DELTA


def test_config_diff_and_headline_words() -> None:
    d = compare.config_diff({"a": {"settings": {"k": 4, "t": 0.0}, "created": "x", "drafter": {"path": "/d/a"}},
                             "b": {"settings": {"k": 4, "t": 0.7}, "created": "y"}}, ["a", "b"])
    assert d.to_dict("records") == [{"setting": "drafter.path", "a": "/d/a", "b": compare.ABSENT},
                                    {"setting": "settings.t", "a": "0.0", "b": "0.7"}]
    import pandas as pd

    fig = pd.DataFrame([{"run_id": "drafter-matched", "tau": 2.61, "num_spec_tokens": 4, "drafts": 10, "speedup": 1.9,
                         "speedup_ci_low": 1.7, "speedup_ci_high": 2.1},
                        {"run_id": "drafter-after-layer", "tau": 1.35, "num_spec_tokens": 4, "drafts": 10,
                         "speedup": 1.1, "speedup_ci_low": 1.0, "speedup_ci_high": 1.2}])
    fig = fig.assign(repeats=1, prompts=80, baseline_plain=True)
    assert compare_words.headline(fig) == (
        "Speedup over decoding without one: `drafter-matched` 1.90x (faster), `drafter-after-layer` 1.10x (no clear "
        "difference). `drafter-after-layer` loses 1.26 in tau against `drafter-matched` (48% of its tau); its speedup: "
        "\u221280 pp (1.10x against 1.90x). Each figure rests on 1 repeat x 80 prompts; 95% intervals resample prompts "
        "(one repeat: run-to-run timing noise is not measured).")
    with_ci = compare_words.headline(fig, lambda best, worst: (1.1, 1.4, 80)
                               if (best, worst) == ("drafter-matched", "drafter-after-layer") else None)
    assert "loses 1.26 in tau against `drafter-matched` (95% CI 1.10 to 1.40 over 80 shared prompts; 48% of its tau)" \
        in with_ci
    assert "not clearly lower" in compare_words.headline(fig, lambda b, w: (-0.1, 0.3, 8))
    # the demo figures: both drafters slower; the weaker-tau one faster by 11 percentage points, not "0.11x"
    slow = fig.assign(speedup=[0.82, 0.93], speedup_ci_low=[0.78, 0.88], speedup_ci_high=[0.86, 0.97],
                      speedup_total=[0.54, 0.74], speedup_total_ci_low=[0.5, 0.7], speedup_total_ci_high=[0.58, 0.78])
    h = compare_words.headline(slow)
    assert h.startswith("**Every drafter here is slower than decoding without one**: `drafter-matched` 0.82x, "
                        "`drafter-after-layer` 0.93x by mean per-prompt tokens/s; 0.54x, 0.74x by total tokens / "
                        "total time.")
    assert "yet its speedup is higher: +11 pp (0.93x against 0.82x)" in h and "0.11x" not in h
    assert compare_words.speed_words(0.82, 0.78, 0.86) == ("slower", "slower than without a drafter")
    assert compare_words.speed_words(1.3, 1.1, 1.5)[0] == "faster"
    assert compare_words.speed_words(0.97, 0.9, 1.04) == ("unclear", "no clear difference")
    assert compare_words.speed_words(0.8, 0.7, 0.9, False, "other")[1] == "slower than its baseline `other`"
    assert compare_words.speed_words(None, None, None)[0] == "none"


def test_category_noise_in_words() -> None:
    """Two runs that accept alike in a category (the issue's coding 92 vs 190 tok/s at the same tau) get a sentence;
    categories that agree get none; one run faster on one category and slower on another (intervals excluding 1)
    gets one too."""
    import pandas as pd

    def cats(rows):
        cols = ["run_id", "category", "tau", "tokens_per_s", "speedup", "speedup_ci_low", "speedup_ci_high"]
        return pd.DataFrame(rows, columns=cols).assign(prompts=8)

    noisy = cats([("a", "coding", 2.10, 92.0, 0.6, 0.5, 0.7), ("b", "coding", 2.12, 190.0, 1.2, 1.1, 1.3),
                  ("a", "math", 2.5, 150.0, 0.9, 0.8, 1.0), ("b", "math", 1.5, 140.0, 0.9, 0.8, 1.0)])
    assert compare_words.category_noise(noisy) == (
        "Per category, speed is noisy: in coding, `a` and `b` accept alike (tau 2.10 and 2.12) yet ran at 92 and 190 "
        "tokens/s; read per-category speeds with their intervals.")
    calm = noisy.assign(tokens_per_s=[92.0, 100.0, 150.0, 140.0])
    assert compare_words.category_noise(calm) is None
    split = cats([("a", "coding", 2.0, 90.0, 0.6, 0.5, 0.7), ("a", "writing", 2.6, 150.0, 1.4, 1.2, 1.6)])
    assert compare_words.category_noise(split) == (
        "The categories disagree: `a` is faster on writing (1.40x) and slower on coding (0.60x).")
    assert compare_words.category_noise(split.assign(prompts=1)) is None, "one prompt a category: no interval to read"
    assert "speed is noisy" in compare_words.headline(
        pd.DataFrame([{"run_id": "a", "tau": 2.1, "num_spec_tokens": 3, "drafts": 5, "speedup": None}]), None, noisy)


# ---------------------------------------------------------------------------- Runs page (AppTest)

def table(at):
    return at.dataframe[0].value


def test_runs_page_shows_bench_runs_and_captures(bench: Path) -> None:
    at = open_page("pages/runs.py")
    t = table(at).set_index("run_id")
    assert set(t.index) == {"cap-tiny", "spec-random", "spec-oracle", "spec-random-baseline"}
    assert t.loc["spec-oracle", "kind"] == "bench" and t.loc["cap-tiny", "kind"] == "capture"
    assert t.loc["spec-oracle", "tau"] > 2 and t.loc["spec-oracle", "drafter"] == "drafter-random"
    assert t.loc["spec-oracle", "tags"] == "oracle,demo"
    assert t.loc["spec-oracle", "view"] == "run?id=spec-oracle"          # every "open" link: the run page
    assert t.loc["cap-tiny", "view"] == "run?id=cap-tiny"
    assert params(at) == {}, "defaults stay out of the URL"


@pytest.mark.parametrize("query,expect", [
    ({"kind": "bench", "tag": "oracle"}, ["spec-oracle"]),
    ({"drafter": "drafter-random"}, ["spec-oracle", "spec-random"]),
    ({"kind": "capture", "target": "tiny-target", "engine": "hf"}, ["cap-tiny"]),
    ({"dataset": "spec_bench_mini.jsonl", "tag": "demo,nope"}, ["spec-oracle"]),
    ({"tag": INJECTION}, ["cap-tiny", "spec-oracle", "spec-random", "spec-random-baseline"]),
])
def test_runs_filters_from_the_url(bench: Path, query: dict, expect: list[str]) -> None:
    at = open_page("pages/runs.py", **query)
    assert sorted(table(at)["run_id"]) == expect
    assert set(params(at)) <= set(query)


def test_runs_filter_widgets_write_the_url(bench: Path) -> None:
    at = open_page("pages/runs.py", kind="bench")
    at.multiselect(key="qp_tag").set_value(["oracle"]).run()
    at.multiselect(key="qp_drafter").set_value(["drafter-random"]).run()
    assert params(at) == {"kind": "bench", "tag": "oracle", "drafter": "drafter-random"}
    assert table(at)["run_id"].tolist() == ["spec-oracle"]


def _form(at, rid: str):
    return at.text_input(key=f"tags_{rid}"), at.text_area(key=f"notes_{rid}")


def _save(at):
    (button,) = [b for b in at.button if b.label == "Save"]
    return button.click().run()


def test_annotation_editing_round_trip(own: Path) -> None:
    at = open_page("pages/runs.py", run="spec-random")
    tags, notes = _form(at, "spec-random")
    tags.input("fast, k3")
    notes.input(INJECTION)
    at.checkbox(key="pin_spec-random").check()
    at = _save(at)
    assert not at.exception and not at.error
    assert "Saved the annotations of `spec-random`" in texts(at.success)
    row = table(at).set_index("run_id").loc["spec-random"]
    assert row["tags"] == "fast,k3" and row["notes"] == INJECTION and bool(row["pinned"])
    assert DataRoot(own).catalog.read.get_run("spec-random")["notes"] == INJECTION
    at = open_page("pages/runs.py", tag="k3")
    assert table(at)["run_id"].tolist() == ["spec-random"]


def test_bad_tags_are_refused_on_the_page(own: Path) -> None:
    at = open_page("pages/runs.py", run="spec-oracle")
    tags, _ = _form(at, "spec-oracle")
    tags.input(INJECTION)
    at = _save(at)
    assert "not allowed" in texts(at.error) and not at.exception
    assert annotations.read("spec-oracle", DataRoot(own)).tags == ["oracle", "demo"]
    assert len(DataRoot(own).catalog.read.list_runs()) == 4


def test_read_only_hides_the_editor(bench: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECLENS_READONLY", "1")
    at = open_page("pages/runs.py")
    assert not at.text_input and not at.text_area and not [b for b in at.button if b.label == "Save"]
    assert len(table(at)) == 4


# ---------------------------------------------------------------------------- Compare page (AppTest)

def test_compare_page(bench: Path) -> None:
    at = open_page("pages/compare.py", runs=RUNS)
    assert params(at) == {"runs": RUNS, "baseline": "paired"}
    tiles = {m.label: m.value for m in at.metric}
    assert list(tiles) == ["spec-random", "spec-oracle"], "a speedup tile per run, before the headline"
    captions = texts(at.caption)
    assert "tau 1.00 · 0% of drafts accepted" in captions and "tau 2.26 · 42% of drafts accepted" in captions
    assert "loses 1.26 in tau" in texts(at.markdown)
    hist, pos = figures(at)                    # the Acceptance tab is open; the other tabs are not run
    assert [t["name"] for t in hist["data"]] == ["spec-random", "spec-oracle"] and hist["layout"]["barmode"] == "group"
    assert values(hist["data"][1]["y"]).sum() == pytest.approx(1.0), "normalised"
    rates = values(pos["data"][1]["y"])
    assert len(rates) == 3 and (np.diff(rates) <= 0).all()
    assert not at.dataframe
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels.count("CSV") == 2 and labels.count("PNG") == 2 and labels.count("SVG") == 2

    at = open_page("pages/compare.py", runs=RUNS, view="Speed")
    tput, speed, latency = figures(at)
    assert [t["name"] for t in tput["data"]] == ["run", "its baseline"] * 2, "both definitions, each with a baseline"
    assert [a["text"] for a in tput["layout"]["annotations"]] == ["mean per-prompt tokens/s",
                                                                  "total tokens / total time"]
    assert [t["name"] for t in speed["data"]] == ["mean per-prompt tokens/s (Spec-Bench)",
                                                  "total tokens / total time (vLLM, SGLang benches)"]
    bar = speed["data"][0]
    assert list(bar["x"]) == ["spec-random", "spec-oracle"] and bar["error_y"]["symmetric"] is False
    assert "paired baseline" in speed["layout"]["title"]["text"]
    assert {a["text"] for a in latency["layout"]["annotations"]} >= {"TTFT: time to first token"}
    assert not at.dataframe, "the summary table is sent only once its expander is opened"
    assert [e.proto.label for e in at.expander if e.proto.query_param_key == "summary_table"] and \
        not next(e for e in at.expander if e.proto.query_param_key == "summary_table").proto.expanded
    (summary,) = (d.value for d in open_page("pages/compare.py", runs=RUNS, view="Speed",
                                             summary_table="true").dataframe)    # a link that opens it
    assert summary["run_id"].tolist() == ["spec-random", "spec-oracle"]
    assert {"tok/s per-prompt mean", "tok/s total/time", "TTFT ms", "TPOT ms", "speedup (total)"} <= set(summary)
    md = texts(at.markdown)
    assert "loses 1.26 in tau" in md, "the headline stays above every tab"
    assert "**Mean per-prompt tokens/s**" in md and "**Total tokens / total time**" in md and "TPOT" in md
    tiles = {m.label: m for m in at.metric}
    assert list(tiles) == ["spec-random", "spec-oracle"] and tiles["spec-random"].value.endswith("x")
    tone = {t.run_id: t for t in compare_words.compare(RUNS.split(","),
                                                       data=DataRoot(bench)).tiles}["spec-random"].delta
    assert tiles["spec-random"].proto.delta == tone and (tone.startswith("-") or tone == compare_words.NOISY_DELTA)

    at = open_page("pages/compare.py", runs=RUNS, view="Per category")
    (cats,) = (d.value for d in at.dataframe)
    assert cats["category"].tolist() == ["coding", "math", "writing"] and "spec-oracle · speedup" in cats
    (chart,) = figures(at)
    assert [t["name"] for t in chart["data"]] == ["spec-random"] * 2 + ["spec-oracle"] * 2   # tau, speedup per run
    assert list(chart["data"][2]["x"]) == ["coding (1)", "math (1)", "writing (2)"]
    assert values(chart["data"][2]["y"]) == pytest.approx(cats["spec-oracle · tau"].to_numpy())
    at = open_page("pages/compare.py", runs=RUNS, view="Settings that differ")
    (diff,) = (d.value for d in at.dataframe)
    assert diff["setting"].tolist() == ["drafter.proposer"] and not at.get("plotly_chart")


def test_compare_default_view_and_baseline_switch(own: Path) -> None:
    at = open_page("pages/compare.py")
    assert sorted(params(at)["runs"].split(",")) == ["spec-oracle", "spec-random"]
    at.selectbox(key="qp_baseline").set_value("pinned").run()
    assert params(at)["baseline"] == "pinned" and "No pinned baseline" in texts(at.warning)
    annotations.save("spec-random-baseline", pinned=True, data=DataRoot(own))
    DataRoot(own).catalog.write.refresh()
    at = open_page("pages/compare.py", runs="spec-oracle,spec-random,spec-random-baseline", baseline="pinned",
                   view="Speed")
    assert not at.warning or "plain decoding" in texts(at.warning)
    assert "pinned baseline" in figures(at)[1]["layout"]["title"]["text"]


def test_compare_needs_two_bench_runs(bench: Path) -> None:
    at = open_page("pages/compare.py", runs="spec-random,cap-tiny,ghost")
    w = texts(at.warning)
    assert "`cap-tiny` (from the URL, `runs`) is a capture run" in w and "No run `ghost`" in w and "left out" in w
    assert "at least two" in texts(at.info) and not at.get("plotly_chart")


def test_compare_without_bench_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECLENS_DATA", str(tmp_path / "empty"))
    assert "python -m backend bench" in texts(open_page("pages/compare.py").info)


def test_compare_shows_a_failed_query_in_one_line(bench: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a, **k):
        raise SpecLensError("catalog: the bench tables are missing; run `python -m backend db rebuild`")
    monkeypatch.setattr(compare, "compare", boom)
    at = open_page("pages/compare.py", runs=RUNS)
    assert "db rebuild" in texts(at.error) and len(at.get("plotly_chart")) == 2, "acceptance drawn, then the error"
    monkeypatch.setattr(compare, "load_acceptance", boom)
    at = open_page("pages/compare.py", runs=RUNS)
    assert "db rebuild" in texts(at.error) and not at.get("plotly_chart")


# ---------------------------------------------------------------------------- real browser

@pytest.fixture(scope="module")
def bench_server(bench_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not CHROMIUM.exists():
        pytest.skip("needs Debian chromium at /usr/bin/chromium")
    with streamlit_server(bench_root, tmp_path_factory.mktemp("streamlit-bench"), {"SPECLENS_READONLY": "0"}) as url:
        yield url


@pytest.fixture(scope="module")
def bench_page(bench_server: str):
    with browser_page(bench_server) as pg:
        yield pg


def test_browser_compare(bench_page, bench_server: str, shots: Path) -> None:
    open_view(bench_page, bench_server, f"/compare?runs={RUNS}&baseline=paired", charts=2)
    body = bench_page.locator('[data-testid="stMarkdownContainer"]').all_inner_texts()
    assert any("loses 1.26 in tau" in t for t in body)
    bench_page.screenshot(path=str(shots / "compare.png"), full_page=True)
    button = bench_page.locator('[data-testid="stDownloadButton"] button').filter(has_text="CSV").first
    with bench_page.expect_download(timeout=TIMEOUT_MS) as dl:
        button.click()
    assert Path(dl.value.path()).read_bytes().startswith(b"run_id,accepted,steps,share")
    assert dl.value.suggested_filename == "accepted_hist_spec-random_spec-oracle.csv"
    # another tab runs only when opened, and its view is in the URL
    bench_page.get_by_role("tab", name="Speed").click()
    bench_page.wait_for_url("**view=Speed**")
    bench_page.wait_for_function(f"document.querySelectorAll('{CHART}').length >= 2", timeout=TIMEOUT_MS)
    bench_page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', state="attached")
    assert bench_page.locator('[data-testid="stDataFrame"]').count() == 0, "the summary table waits to be opened"
    bench_page.get_by_text("Summary table: tau").click()            # opening it runs the page with it, in the URL
    bench_page.wait_for_url("**summary_table=true**")
    bench_page.wait_for_selector('[data-testid="stDataFrame"]')
    bench_page.screenshot(path=str(shots / "compare-speed.png"), full_page=True)
    open_view(bench_page, bench_server, f"/compare?runs={RUNS}&view=Per+category", charts=0)
    bench_page.wait_for_selector('[data-testid="stDataFrame"]')
    assert bench_page.get_by_role("tab", name="Per category").get_attribute("aria-selected") == "true"


def test_browser_runs_bench_tag(bench_page, bench_server: str, shots: Path) -> None:
    open_view(bench_page, bench_server, "/runs?kind=bench&tag=oracle", charts=0)
    bench_page.wait_for_selector('[data-testid="stDataFrame"]')
    assert "1 of 4 runs shown" in bench_page.locator('[data-testid="stCaptionContainer"]').first.inner_text()
    assert bench_page.get_by_text("Tags, notes and baseline").count() == 1
    bench_page.screenshot(path=str(shots / "runs-bench-tag.png"), full_page=True)
    open_view(bench_page, bench_server, "/runs?kind=bench", charts=0)
    bench_page.wait_for_selector('[data-testid="stDataFrame"]')
    bench_page.screenshot(path=str(shots / "runs-bench.png"), full_page=True)


def test_browser_navigation_to_compare(bench_page, bench_server: str) -> None:
    open_view(bench_page, bench_server, "/runs", charts=0)
    bench_page.get_by_role("link", name="Compare").first.click()
    bench_page.wait_for_url("**/compare**")
    bench_page.wait_for_function(f"document.querySelectorAll('{CHART}').length >= 4", timeout=TIMEOUT_MS)
    assert "No run" not in alerts(bench_page)


def test_browser_tick_rows_then_compare(bench_page, bench_server: str) -> None:
    open_view(bench_page, bench_server, "/runs?kind=bench", charts=0)
    bench_page.wait_for_selector('[data-testid="stDataFrame"] canvas')
    box = bench_page.locator('[data-testid="stDataFrame"]').first.bounding_box()
    for row in (0, 1):                         # the row-selection checkboxes (header and rows 35 px high)
        bench_page.mouse.click(box["x"] + 16, box["y"] + 35 + 35 * row + 17)
        bench_page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', state="attached")
    link = bench_page.get_by_role("link", name="Compare the 2 selected bench runs")
    link.wait_for()
    link.click()
    bench_page.wait_for_url("**/compare?runs=spec-oracle%2Cspec-random**")
    bench_page.wait_for_function(f"document.querySelectorAll('{CHART}').length >= 4", timeout=TIMEOUT_MS)


def test_same_weights_at_another_path_are_the_same_target(tmp_path):
    """A target read from two paths (a training box, a GPU node) has one fingerprint; other weights of the same
    shape have another; the catalog's model_key follows the fingerprint."""
    import torch
    from safetensors.torch import save_file

    from backend.model_id import fingerprint

    a = tmp_path / "a"
    a.mkdir()
    (a / "config.json").write_text('{"model_type": "llama", "hidden_size": 8}')
    save_file({"w": torch.arange(4096.0).reshape(64, 64)}, str(a / "model.safetensors"))
    b = tmp_path / "elsewhere" / "a"
    shutil.copytree(a, b)
    c = tmp_path / "c"
    shutil.copytree(a, c)
    save_file({"w": torch.arange(4096.0).reshape(64, 64) + 1}, str(c / "model.safetensors"))
    assert fingerprint(a) == fingerprint(b) is not None
    assert fingerprint(c) != fingerprint(a)
    assert fingerprint(tmp_path / "missing") is None


def test_different_targets_warning_follows_the_weights_not_the_path(own: Path) -> None:
    """The runs' manifests carry the target's fingerprint; a run whose target was read from another path is the
    same target, one with other weights is not."""
    ids = ["spec-random", "spec-oracle"]
    fp = {r: json.loads((own / "runs" / r / "manifest.json").read_text())["model"].get("fingerprint") for r in ids}
    assert all(v and v.startswith("sha256-sampled:") for v in fp.values()) and len(set(fp.values())) == 1

    def edit(run: str, **model) -> None:
        p = own / "runs" / run / "manifest.json"
        m = json.loads(p.read_text())
        m["model"].update(model)
        p.write_text(json.dumps(m))
        DataRoot(own).catalog.write.refresh()

    edit("spec-oracle", path="/mnt/gpu-node/models/same-target")
    assert not [w for w in compare_words.compare(ids, "paired",
                                                 data=DataRoot(own)).warnings if "different targets" in w]
    edit("spec-oracle", fingerprint="sha256-sampled:other-weights")
    assert [w for w in compare_words.compare(ids, "paired", data=DataRoot(own)).warnings if "2 different targets" in w]


def test_drafter_diagnosis_in_plain_words() -> None:
    """A bench run whose engine fed S_2,S_4,S_5 to a drafter that the newest check of the same drafter and target
    finds trained on S_3,S_5,S_6 gets one line naming both sets and the offset; a matching run gets none."""
    tgt = {"path": "/a/target", "fingerprint": "sha256-sampled:t"}
    after = {"path": "/a/drafter-after-layer", "fingerprint": "sha256-sampled:d1"}
    matched = {"path": "/a/drafter-matched", "fingerprint": "sha256-sampled:d2"}
    benches = {
        "b-after": {"model": tgt, "drafter": after, "aux": {"boundaries": ["S_2", "S_4", "S_5"]}},
        "b-matched": {"model": tgt, "drafter": matched, "aux": {"boundaries": ["S_2", "S_4", "S_5"]}},
        "b-other-node": {"model": {**tgt, "path": "/gpu/target"}, "drafter": {**after, "path": "/gpu/d"},
                         "aux": {"boundaries": ["S_2", "S_4", "S_5"]}},
        "b-base": {"model": tgt, "drafter": None, "aux": None},
    }
    checks = {   # newest first
        "chk-new": {"model": tgt, "drafter": after, "check": {"best": ["S_3", "S_5", "S_6"]}},
        "chk-old": {"model": tgt, "drafter": after, "check": {"best": ["S_2", "S_4", "S_5"]}},
        "chk-m": {"model": tgt, "drafter": matched, "check": {"best": ["S_2", "S_4", "S_5"]}},
    }
    lines = compare_words.drafter_diagnosis(benches, checks)
    assert len(lines) == 2 and all("`chk-new`" in x for x in lines)
    assert lines[0].startswith("`b-after`: the engine fed S_2, S_4, S_5, but drafter check `chk-new` finds "
                               "drafter-after-layer was trained on S_3, S_5, S_6 (off by one: it was trained one "
                               "boundary later)")
    assert lines[1].startswith("`b-other-node`")           # same weights elsewhere: same fingerprint
    other_target = {"b-after": {**benches["b-after"], "model": {"path": "/x", "fingerprint": "sha256-sampled:u"}}}
    assert compare_words.drafter_diagnosis(other_target, checks) == []
    assert compare_words.drafter_diagnosis(benches, {}) == []
