"""The Serving load page (/load?run= | ?runs=) through streamlit's AppTest, on the load runs recorded on the H200
(tests/data/recorded/load/: vLLM 0.24.0, the toy pair; `h200-vllm-sweep` K 1, 2, 4 x concurrency 1, 8, 32, 64 and
`h200-vllm-pair` K=4 x the same levels; SGLang 0.5.15 `h200-sglang-sweep` K 1, 2, 4 x the same levels) and the
synthetic-acceptance map recorded on a Llama-3.1-8B shape (datasets/maps/h200-vllm-synthetic-8b), indexed by the
catalog (load_cells, load_levels). The words are checked against the runs' own summary.json. The ceiling map's code is
also tested on a DataFrame built in this file (test_ceiling_map_on_a_frame_built_in_this_test)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from backend.store.catalog import LOAD_CELL_COLUMNS
from backend.store.data_root import DataRoot
from dashboard import load_charts as lc
from tests.test_pages import figures, open_page, params, texts, values

RECORDED = Path(__file__).parent / "data" / "recorded" / "load"
MAPS = Path(__file__).parent.parent / "datasets" / "maps"
SWEEP, PAIR, WATCH = "h200-vllm-sweep", "h200-vllm-pair", "h200-vllm-watch"
SGL, MAP = "h200-sglang-sweep", "h200-vllm-synthetic-8b"


def build_load_data(root: Path) -> Path:
    """A data root holding the recorded H200 load runs and watch, as their run directories."""
    for run in (SWEEP, PAIR, WATCH, SGL):
        shutil.copytree(RECORDED / run, root / "runs" / run)
    shutil.copytree(MAPS / MAP, root / "runs" / MAP)
    DataRoot(root).catalog.write.refresh(full=True)
    return root


@pytest.fixture(scope="session")
def load_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_load_data(tmp_path_factory.mktemp("load-data"))


@pytest.fixture
def load(load_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECLENS_DATA", str(load_root))
    return load_root


def summary(run: str) -> dict:
    return json.loads(((MAPS if run == MAP else RECORDED) / run / "summary.json").read_text())


def _x(v: float) -> str:
    return f"{v:.2f}x"


# ---------------------------------------------------------------------------- catalog


def test_catalog_indexes_levels_and_summary_cells_not_requests(load: Path) -> None:
    read = DataRoot(load).catalog.read
    cells, levels = read.load_cells([SWEEP, PAIR]), read.load_levels([SWEEP, PAIR])
    assert len(cells) == 12 + 4 and len(levels) == 24 + 8
    s = summary(SWEEP)
    for c in s["cells"]:
        row = cells[(cells.run_id == SWEEP) & (cells.config == c["config"]) & (cells.concurrency == c["concurrency"])]
        assert row.speedup.item() == pytest.approx(c["speedup"]["value"])
        assert row.speedup_ci_low.item() == pytest.approx(c["speedup"]["ci_low"])
        assert row.tau_server.item() == pytest.approx(c["tau_server"])
        assert row.n_requests.item() == c["speedup"]["n_prompts"]
        best = s["best"][str(c["concurrency"])]
        assert row.is_best.item() == (best["config"] == c["config"])
        assert row.within_best.item() == (c["config"] in best["within_interval"])
        assert row.baseline_noisy.item() == (str(c["concurrency"]) in s["baseline_noise"])
        stop = s["stops_paying"][c["config"]]
        assert (pd.isna(row.stops_paying.item()) if stop is None else row.stops_paying.item() == stop)
    lv = pd.read_parquet(RECORDED / SWEEP / "levels.parquet")
    mine = levels[levels.run_id == SWEEP].reset_index(drop=True)
    assert mine["output_tps"].tolist() == pytest.approx(lv.sort_values("order")["output_tps"].tolist())
    tables = {r[0] for r in read._df("SELECT table_name FROM information_schema.tables", []).itertuples(index=False)}
    assert "load_levels" in tables and "load_cells" in tables and not any("request" in t for t in tables)


def test_a_broken_summary_quarantines_its_run(tmp_path: Path) -> None:
    root = tmp_path / "data"
    shutil.copytree(RECORDED / PAIR, root / "runs" / PAIR)
    (root / "runs" / PAIR / "summary.json").write_text("{not json")
    DataRoot(root).catalog.write.refresh(full=True)
    run = DataRoot(root).catalog.read.get_run(PAIR)
    assert run["status"] == "quarantined" and run["error"].startswith("summary.json: ")
    read = DataRoot(root).catalog.read
    assert read.load_levels([PAIR]).empty and read.load_cells([PAIR]).empty


# ---------------------------------------------------------------------------- the sweep: words against summary.json


def test_sweep_best_k_words_and_tiles(load: Path) -> None:
    at = open_page("pages/load.py", run=SWEEP)
    s = summary(SWEEP)
    cells = {(c["config"], c["concurrency"]): c for c in s["cells"]}
    tiles = {m.label: m for m in at.metric}
    assert list(tiles) == ["concurrency 1", "concurrency 8", "concurrency 32", "concurrency 64"]
    words = texts(at.markdown)
    for c, best in s["best"].items():
        sp = cells[(best["config"], int(c))]["speedup"]
        tile = tiles[f"concurrency {c}"]
        assert tile.value == f"{best['config']} \u00b7 {_x(sp['value'])}"
        line = next(ln for ln in words.splitlines() if ln.startswith(f"**Concurrency {c}**"))
        assert f"{best['config']} measured highest, {_x(sp['value'])} [{sp['ci_low']:.2f}, {sp['ci_high']:.2f}]" in line
        assert ("faster than" in line) == (not best["noisy"]), "no faster/slower words where the baseline was noisy"
        assert " and ".join(best["within_interval"]) in line
        if best["noisy"]:
            assert tile.delta == "no verdict: baseline noisy", "a noisy level's tile is neutral"
            assert "**No verdict on the best K here**" in line and "not a clear winner" not in line
        else:
            assert "**not a clear winner**" in line and "No verdict" not in line
    # concurrency 1: K=4 1.25x [1.10, 1.43], K=1 and K=2 within its interval; green (faster), not a verdict on K
    assert tiles["concurrency 1"].delta == "+25% \u00b7 faster than without a drafter"
    assert "K=4 measured highest, 1.25x [1.10, 1.43] (faster than without a drafter), with K=1 and K=2 within its " \
           "interval: **not a clear winner**" in words
    assert "K=1 and K=2 within its interval: no clear winner" in texts(at.caption)
    assert params(at) == {"run": SWEEP}


def test_sweep_stops_paying_words(load: Path) -> None:
    at = open_page("pages/load.py", run=SWEEP)
    words = texts(at.markdown)
    assert summary(SWEEP)["stops_paying"] == {"K=1": 64, "K=2": None, "K=4": None}
    assert ("**K=1** measured below 1 at concurrency 64: 0.90x [0.88, 0.93]. **Not a verdict**: the baseline was "
            "noisy there (46% apart across its measurements, see below)") in words
    assert "slower than without a drafter" not in words, "no verdict words at a noisy level"
    assert "**K=2** stays above 1 at every concurrency measured, up to 64: 1.12x [1.10, 1.14] there" in words
    assert "**K=4** stays above 1 at every concurrency measured, up to 64: 1.15x [1.11, 1.19] there" in words
    verdict = texts(at.markdown)
    assert "Where speculative decoding stops paying" in verdict


def test_no_faster_or_slower_word_at_a_noisy_level(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's H100 sweep (K 1, 2, 4, 6; its baseline noisy at 8, 32 and 64): K=2 does not pay at concurrency 1 (a
    verdict: the baseline held there) and measured 1.05x [1.01, 1.11] at 64, where the baseline moved 47%; that
    figure is listed without "faster", as its tile says "no verdict"."""
    shutil.copytree(RECORDED / "h100-sglang-sweep", tmp_path / "runs" / "h100-sglang-sweep")
    DataRoot(tmp_path).catalog.write.refresh(full=True)
    monkeypatch.setenv("SPECLENS_DATA", str(tmp_path))
    at = open_page("pages/load.py", run="h100-sglang-sweep")
    words = texts(at.markdown)
    assert summary("h100-sglang-sweep")["stops_paying"] == {"K=1": 1, "K=2": 1, "K=4": 1, "K=6": 1}
    assert ("**K=2** does not pay at concurrency 1, the lowest measured: 0.63x [0.57, 0.69], slower than without a "
            "drafter; at higher concurrency 8: 0.54x [0.51, 0.59] (no verdict: baseline noisy), 32: 0.61x [0.59, "
            "0.63] (no verdict: baseline noisy), 64: 1.05x [1.01, 1.11] (no verdict: baseline noisy)") in words
    assert "(faster)" not in words
    assert [m.delta for m in at.metric][1:] == ["no verdict: baseline noisy"] * 3


def test_sweep_noise_flag(load: Path) -> None:
    """The baseline at c=64 measured 15,216, 13,245 and 9,108 tok/s beside K=1, K=2 and K=4: flagged in words, with
    8 and 32 (summary.json's baseline_noise); those tiles grey."""
    at = open_page("pages/load.py", run=SWEEP)
    warning = texts(at.warning)
    assert "**The baseline's own speed moved between measurements at concurrency 8, 32 and 64.**" in warning
    assert "9,108 to 15,216 tok/s at 64 (46%, the intervals absorb 6%)" in warning
    assert "2,438 to 2,978 tok/s at 8 (22%" in warning and "7,343 to 8,600 tok/s at 32 (16%" in warning
    noise = summary(SWEEP)["baseline_noise"]
    assert {int(c) for c in noise} == {8, 32, 64}
    assert [m.delta for m in at.metric][1:] == ["no verdict: baseline noisy"] * 3
    assert not at.error, "noise is a warning, not an error"


def test_sweep_agreement_note_at_64(load: Path) -> None:
    at = open_page("pages/load.py", run=SWEEP)
    info = texts(at.info)
    assert "**Acceptance: SpecLens's own count disagrees with the server's counters** at concurrency 64 for K=1 " \
           "(tau 3.13 against 1.65, 90% apart) and K=2 (tau 3.34 against 2.08, 60% apart)" in info
    assert "at concurrency 32 for K=2 (tau 2.19 against 2.02, 8.4% apart)" in info
    assert "vLLM merges the stream chunks of a request that the client did not read in time" in info
    assert "the server's counters are the reference" in info
    assert "Elsewhere they agree within 2% (largest 1.6%)" in info
    cells = {(c["config"], c["concurrency"]): c for c in summary(SWEEP)["cells"]}
    assert cells[("K=1", 64)]["tau_agreement"] > 0.02 and cells[("K=4", 64)]["tau_agreement"] < 0.02


def test_sweep_charts(load: Path) -> None:
    at = open_page("pages/load.py", run=SWEEP)
    figs = figures(at)
    titles = [f["layout"]["title"]["text"].split("<br>")[0] for f in figs]
    assert titles == ["Speedup vs concurrency (95% interval)", "Throughput vs per-user speed (Pareto front)",
                      "Latency per level, median (p50)", "Acceptance: the server's counters and SpecLens's own count"]
    speed = figs[0]
    assert speed["layout"]["yaxis"]["range"][0] == 0, "speedup from 0"
    assert any(s.get("y0") == 1.0 and s.get("y1") == 1.0 for s in speed["layout"]["shapes"]), "1.0 marked"
    assert any("no gain" in a.get("text", "") for a in speed["layout"]["annotations"])
    k4 = next(t for t in speed["data"] if t.get("name") == "K=4")
    assert values(k4["y"]).tolist() == pytest.approx([1.2456, 1.3261, 1.1645, 1.1487], abs=1e-3)
    assert k4["marker"]["symbol"] == ["circle", "circle-open", "circle-open", "circle-open"], "noisy points hollow"
    assert sum(s.get("type") == "rect" for s in speed["layout"]["shapes"]) == 3, "8, 32, 64 shaded"
    pareto = figs[1]
    names = [t.get("name") for t in pareto["data"]]
    assert {"Pareto front", "baseline (paired, per config)", "K=1", "K=2", "K=4"} <= set(names)
    front = next(t for t in pareto["data"] if t.get("name") == "Pareto front")
    assert len(values(front["x"])) >= 2
    assert pareto["layout"]["xaxis"]["title"]["text"].startswith("per-user tokens/s")
    assert pareto["layout"]["yaxis"]["title"]["text"].startswith("output tokens/s")
    assert not at.dataframe, "the tables are sent only once their expander is opened"
    tables = open_page("pages/load.py", run=SWEEP, tables="true").dataframe      # a link that opens them
    assert len(tables) == 2
    assert "None" not in tables[0].value.astype(str).to_numpy().ravel().tolist()


def test_latency_percentile_from_the_url(load: Path) -> None:
    at = open_page("pages/load.py", run=SWEEP, pct="p99")
    lat = figures(at)[2]
    assert lat["layout"]["title"]["text"].startswith("Latency per level, p99")
    lv = pd.read_parquet(RECORDED / SWEEP / "levels.parquet")
    want = lv[(lv.config == "K=4") & (lv.side == "drafter")].sort_values("concurrency")["ttft_p99"] * 1000
    k4 = next(t for t in lat["data"] if t.get("name") == "K=4" and t.get("xaxis", "x") == "x")
    assert values(k4["y"]).tolist() == pytest.approx(want.tolist())
    at = open_page("pages/load.py", run=SWEEP, pct="p42")
    assert "`pct=p42`" in texts(at.warning)


# ---------------------------------------------------------------------------- the pair, several runs, substitutes


def test_pair_one_config(load: Path) -> None:
    at = open_page("pages/load.py", run=PAIR)
    words = texts(at.markdown)
    assert ("**Concurrency 1**: K=4, the only configuration: 0.79x [0.69, 0.89] (slower than without a "
            "drafter).") in words
    assert "**K=4** does not pay at concurrency 1, the lowest measured: 0.79x [0.69, 0.89], slower than without a " \
           "drafter; at higher concurrency 8: 1.03x [0.96, 1.11] (no clear difference), 32: 1.13x [1.09, 1.17] " \
           "(faster), 64: 0.98x [0.94, 1.01] (no clear difference)." in words
    assert "One baseline measurement per concurrency" in texts(at.caption)
    tones = {m.label: m.delta for m in at.metric}
    assert tones["concurrency 1"].startswith("-21%") and tones["concurrency 32"].startswith("+13%")
    assert not at.warning


def test_several_runs(load: Path) -> None:
    at = open_page("pages/load.py", runs=f"{SWEEP},{PAIR}")
    assert [s.value for s in at.subheader][:2] == [SWEEP, PAIR]
    names = {t.get("name") for t in figures(at)[0]["data"]}
    assert {f"{SWEEP} \u00b7 K=4", f"{PAIR} \u00b7 K=4", f"{SWEEP} \u00b7 K=1"} <= names
    assert len(at.metric) == 8 and params(at) == {"runs": f"{SWEEP},{PAIR}"}


def test_a_substitute_run_gets_no_tiles_or_verdict(load: Path) -> None:
    at = open_page("pages/load.py", run=WATCH)
    assert f"Run `{WATCH}` (from the URL, `run`) is a watch run, not a complete load run" in texts(at.warning)
    assert not at.metric, "no tiles for a run the link did not ask for"
    assert "No verdict" in texts(at.info) and "Best K" not in texts(at.markdown)
    assert len(figures(at)) >= 4          # the newest load run is shown (charts only)
    at = open_page("pages/load.py", runs=f"{PAIR},ghost")
    assert "`ghost`" in texts(at.warning) and len(at.metric) == 4, "the runs asked for keep their verdicts"


def test_no_load_runs(data_root: Path) -> None:
    at = open_page("pages/load.py")
    assert "No load runs yet" in texts(at.info)


# ---------------------------------------------------------------------------- run page and Runs page


def test_run_page_describes_load_and_watch_runs(load: Path) -> None:
    at = open_page("pages/run.py", id=SWEEP)
    md = texts(at.markdown)
    assert "A serving-load run through vLLM 0.24.0's OpenAI-compatible server" in md and "A capture" not in md
    assert ("load", f"run={SWEEP}") in [(p.proto.page, p.proto.query_string) for p in at.get("page_link")]
    assert {m.label: m.value for m in at.metric}["requests"] == "2,592"
    at = open_page("pages/run.py", id=WATCH)
    md = texts(at.markdown)
    assert "A watch of a live vLLM 0.24.0 server" in md and "A capture" not in md
    assert ("watch", f"run={WATCH}") in [(p.proto.page, p.proto.query_string) for p in at.get("page_link")]
    # a drift is as loud as its tau cost (dashboard/severity.py): 2.42 -> 1.95 is 19% lower, a warning
    assert "DRIFT: window(s) 29-44" in texts(at.warning) and "Warning** (tau cost 19%)" in texts(at.warning)


def test_runs_page_links_a_ticked_load_or_watch_run(load: Path) -> None:
    for run, page in ((SWEEP, "load"), (WATCH, "watch")):
        at = open_page("pages/runs.py", ticked=run)
        links = [(p.proto.page, p.proto.query_string) for p in at.get("page_link")]
        assert ("run", f"id={run}") in links and (page, f"run={run}") in links


# ---------------------------------------------------------------------------- the synthetic-acceptance view


def synthetic_map_frame() -> pd.DataFrame:
    """A speedup ceiling map built here (no map was recorded): K=3 at tau* 1-4 x concurrency 1, 16, 64, speedup
    rising with tau and falling with concurrency, plus the drafter's own K=3 config at each concurrency."""
    rows = []
    for c, scale in ((1, 1.0), (16, 0.8), (64, 0.6)):
        for t in (1.0, 2.0, 3.0, 4.0):
            v = scale * (0.7 + 0.3 * t)
            rows.append(dict(run_id="built-map", config=f"K=3 tau*={t:g}", k=3, synthetic_tau=t, concurrency=c,
                             speedup=v, speedup_ci_low=v * 0.97, speedup_ci_high=v * 1.03, n_requests=64,
                             tau_server=t * 0.98 + 0.02))
        v = scale * 1.3
        rows.append(dict(run_id="built-map", config="K=3", k=3, synthetic_tau=None, concurrency=c, speedup=v,
                         speedup_ci_low=v * 0.96, speedup_ci_high=v * 1.04, n_requests=64, tau_server=2.0,
                         is_best=True, within_best=False, stops_paying=64 if c == 64 else None,
                         noise_checked=True, baseline_noisy=False))
    df = pd.DataFrame(rows).reindex(columns=list(LOAD_CELL_COLUMNS))
    df["stops_paying"] = 64
    return df


def test_ceiling_map_on_a_frame_built_in_this_test() -> None:
    cells = synthetic_map_frame()
    syn, own = lc.synthetic(cells), lc.real(cells)
    assert len(syn) == 12 and len(own) == 3
    fig = lc.ceiling_figure(syn, own)
    names = [t.name for t in fig.data]
    assert names[:3] == ["concurrency 1", "concurrency 16", "concurrency 64"]
    assert [n for n in names if n.startswith("measured")] == [f"measured drafter, concurrency {c}" for c in (1, 16, 64)]
    assert fig.layout.xaxis.title.text.startswith("tau (server's counters")      # the x a drafter is read on
    assert list(fig.data[0].x) == pytest.approx([1.0, 1.98, 2.96, 3.94])            # measured, not the set tau*
    assert fig.layout.yaxis.range[0] == 0 and any(s.y0 == 1.0 for s in fig.layout.shapes)
    lines = lc.ceiling_lines(syn, own)
    assert lines[0].startswith("**Concurrency 1**: 1.00x [0.97, 1.03] at tau* 1, 1.90x [1.84, 1.96] at tau* 4")
    assert "it pays (interval above 1) from tau* 2" in lines[0]
    assert "the drafter's own acceptance (K=3) measured tau 2.00 and 0.78x" in lines[2]
    frame = lc.ceiling_frame(cells)
    assert len(frame) == 12 and frame["synthetic_tau"].notna().all()
    # a level whose baseline moved: faded on the chart, no verdict in the words
    noisy = syn.assign(baseline_noisy=syn["concurrency"] == 64, noise_spread=0.3)
    fig = lc.ceiling_figure(noisy)
    assert [t.name for t in fig.data][2] == "concurrency 64 (baseline noisy: no verdict)" and fig.data[2].opacity < 1
    words = lc.ceiling_lines(noisy)
    assert "**no verdict**: the baseline's own tok/s moved 30%" in words[2] and "it pays" not in words[2]
    assert "no verdict" not in words[0]
    # without a measured tau the map falls back to the set tau* (and places no star on another axis)
    fig = lc.ceiling_figure(syn.assign(tau_server=None), own)
    assert fig.layout.xaxis.title.text.startswith("tau* (set") and not [t for t in fig.data if "measured" in t.name]
    # the real config's words ignore the map's configs; a map-only run's headline names the map
    assert lc.best_lines(cells)[0].startswith("**Concurrency 1**: K=3, the only configuration")
    assert lc.headline("built-map", syn) == ("built-map: speedup ceiling map over tau* 1 to 4 at concurrency 1, 16 "
                                             "and 64.")


def test_pareto_front_is_the_undominated_points() -> None:
    assert lc.front([1, 2, 3, 2], [3, 2, 1, 1]) == [True, True, True, False]
    assert lc.front([1, 1], [1, 1]) == [True, True]
    assert lc.front([None, 1], [1, 1]) == [False, True]


def test_a_noisy_level_of_one_config_gives_no_verdict_words(load: Path) -> None:
    """The pair's cells with a noise flag set here at concurrency 32 (the recorded pair has one baseline measurement
    per level: no flag): the tile turns grey and no faster/slower words are said there."""
    cells = DataRoot(load).catalog.read.load_cells([PAIR])
    at32 = cells["concurrency"] == 32
    cells.loc[at32, ["baseline_noisy", "noise_spread", "noise_bar", "noise_min_tps", "noise_max_tps"]] = \
        [True, 0.3, 0.1, 7000.0, 9400.0]
    tile = next(t for t in lc.tiles(cells) if t.label == "concurrency 32")
    assert tile.tone == "noisy" and tile.delta == lc.NOISY_DELTA
    line = next(ln for ln in lc.best_lines(cells) if ln.startswith("**Concurrency 32**"))
    assert line == ("**Concurrency 32**: K=4, the only configuration: 1.13x [1.09, 1.17]. **No verdict**: the "
                    "baseline was noisy (30% apart across its measurements, see below).")
    assert "30%" in lc.noise_note(cells, DataRoot(load).catalog.read.load_levels([PAIR]))[1]


def test_an_unfinished_load_run_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    root = tmp_path / "data"
    shutil.copytree(RECORDED / PAIR, root / "runs" / PAIR)
    m = json.loads((RECORDED / PAIR / "manifest.json").read_text())
    keep = ("kind", "engine", "engine_version", "model", "drafter", "dtype", "dataset", "settings")
    DataRoot(root).new_run_dir("load-live", {**{k: m[k] for k in keep}, "progress": {"done": 3, "total": 8}})
    DataRoot(root).catalog.write.refresh(full=True)
    monkeypatch.setenv("SPECLENS_DATA", str(root))
    at = open_page("pages/load.py", run="load-live")
    assert "Load run `load-live` is running (3 / 8 levels)" in texts(at.info) and not at.metric
    at = open_page("pages/load.py", runs=f"load-live,{PAIR}")
    assert "`load-live` is running" in texts(at.info) and len(at.metric) == 4 and len(figures(at)) == 4


def test_sglang_sweep_page(load: Path) -> None:
    """The SGLang sweep: a tile per concurrency naming the best K by the speedup shown, and the counters/own-count
    agreement within 2% everywhere (SGLang returns each request's verification steps)."""
    at = open_page("pages/load.py", run=SGL)
    s = summary(SGL)
    cells = {(c["config"], c["concurrency"]): c for c in s["cells"]}
    tiles = {m.label: m for m in at.metric}
    assert list(tiles) == ["concurrency 1", "concurrency 8", "concurrency 32", "concurrency 64"]
    for c, best in s["best"].items():
        sp = cells[(best["config"], int(c))]["speedup"]["value"]
        assert tiles[f"concurrency {c}"].value == f"{best['config']} \u00b7 {_x(sp)}"
        top = max((x for x in s["cells"] if x["concurrency"] == int(c)), key=lambda x: x["speedup"]["value"])
        assert best["config"] == top["config"]
    assert "agree within 2% at every level where both exist" in texts(at.caption)
    assert not at.exception


def test_synthetic_map_page_on_the_recorded_8b_map(load: Path) -> None:
    """The recorded map: lines per concurrency from tau* 1 to tau* 4 with the measured speedups."""
    at = open_page("pages/load.py", run=MAP)
    words = texts(at.markdown)
    cells = {(c["synthetic_tau"], c["concurrency"]): c["speedup"] for c in summary(MAP)["cells"]}
    lo, hi = cells[(1.0, 1)], cells[(4.0, 1)]
    assert (f"**Concurrency 1**: {lo['value']:.2f}x [{lo['ci_low']:.2f}, {lo['ci_high']:.2f}] at tau* 1, "
            f"{hi['value']:.2f}x [{hi['ci_low']:.2f}, {hi['ci_high']:.2f}] at tau* 4") in words
    assert "**Concurrency 64**" in words
    assert figures(at) and not at.exception
