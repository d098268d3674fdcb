"""The Compare page's Speed and Per category tabs in a real browser (Debian chromium driven by Playwright, a real
`streamlit` server over a real DuckDB catalog of bench runs made by backend.bench.run_bench: tests/conftest.py
build_bench_data). The figures on the page must be the ones backend.metrics computes from the same catalog rows:
both throughput definitions, named and defined, their speedups, TTFT and TPOT, each with its 95% interval; a
drafter slower than decoding without one says so in words; the per-category chart renders and downloads. A run whose
speed figures are not comparable (timing noise, load, another SpecLens process) gets a neutral tile, no verdict in
the headline, and the same notice on its run page.

The data root here is a copy of the bench runs: their stored noise findings cleared (`quiet`: whether this shared
machine was busy while the fixture ran must not decide what a verdict test sees), plus `spec-oracle-noisy`, a copy of
spec-oracle whose units read as the bench reads a CPU-bound process beside it (other processes on 1.5 cores), its
finding recomputed by the bench's own code (backend.bench.load_summary / noise_finding)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect

from backend import metrics
from backend.store.data_root import DataRoot
from dashboard import compare_words
from tests import test_browser
from tests.test_browser import CHART, CHROMIUM, TIMEOUT_MS, open_view, streamlit_server

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium at /usr/bin/chromium")
shots = test_browser.shots          # the screenshots folder fixture (SPECLENS_SCREENSHOTS or a temp dir)
page = test_browser.page          # one browser page per module, on this module's `server`
RUNS = ["spec-random", "spec-oracle"]
BASE = "spec-random-baseline"
NOISY = "spec-oracle-noisy"


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def _write_manifest(run: Path, m: dict) -> None:
    (run / "manifest.json").write_text(json.dumps(m, indent=1))


def plant_load(src: Path, dst: Path, cores: float = 1.5) -> str:
    """A copy of bench run `src` as run `dst` whose units read as if other processes had used `cores` cores while
    each ran; `bench.load` and `bench.speed_noise` recomputed by the bench's own functions. Returns the reason."""
    from backend.bench import load_summary, noise_finding

    shutil.copytree(src, dst)
    rid = dst.name
    for name in ("prompts.parquet", "steps.parquet"):
        df = pd.read_parquet(dst / name).assign(run_id=rid)
        if name == "prompts.parquet":
            df["other_cpu"] = cores
            prompts = df
        df.to_parquet(dst / name, index=False)
    m = _manifest(dst)
    cpus = m["bench"]["load"]["cpus"]
    m["run_id"] = rid
    m["bench"]["load"] = load_summary(prompts, cpus)
    m["bench"]["speed_noise"] = noise_finding(prompts, m["bench"], cpus, interleaved=True)
    _write_manifest(dst, m)
    return m["bench"]["speed_noise"]["reason"]


@pytest.fixture(scope="module")
def data(bench_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("speed-data")
    shutil.copytree(bench_root / "runs", root / "runs")
    for run in (root / "runs").iterdir():             # quiet: no stored finding (see the module docstring)
        m = _manifest(run)
        if isinstance((m.get("bench") or {}).get("speed_noise"), dict):
            m["bench"]["speed_noise"].update(noisy=False, kinds=[], reason=None)
            _write_manifest(run, m)
    reason = plant_load(root / "runs" / "spec-oracle", root / "runs" / NOISY)
    assert reason and "other processes kept 1.5 of" in reason.lower(), reason
    DataRoot(root).catalog.write.refresh()
    return root


@pytest.fixture(scope="module")
def server(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with streamlit_server(data, tmp_path_factory.mktemp("streamlit-speed")) as url:
        yield url


def _grid(rows, run: str, col: str) -> list[list[float]]:
    """One run's column as repeats x prompts (prompts by id, repeats in order), straight from the catalog rows."""
    g = rows[rows["run_id"] == run].pivot(index="repeat", columns="prompt_id", values=col).sort_index()
    return g.sort_index(axis=1).to_numpy(dtype=float).tolist()


@pytest.fixture(scope="module")
def expected(data: Path) -> dict:
    """What backend.metrics computes from the catalog's per-prompt rows of the runs and of the plain-decoding half of
    their interleaved pairs (`base_*`: what each run's speedup is timed against)."""
    rows = DataRoot(data).catalog.read.bench_prompt_timings(RUNS + [BASE])
    est = {}
    for r in RUNS + [BASE]:
        est[r] = {"per_prompt": metrics.mean_estimate(_grid(rows, r, "tokens_per_s")),
                  "total": metrics.total_throughput(_grid(rows, r, "output_tokens"), _grid(rows, r, "seconds")),
                  "ttft": metrics.mean_estimate(_grid(rows, r, "ttft")),
                  "tpot": metrics.mean_estimate(_grid(rows, r, "tpot"))}
        if r != BASE:       # the per-prompt speedup as the bench stored it (metrics.speedup, its own seed and order)
            stored = DataRoot(data).catalog.read.bench_runs(run_ids=[r]).iloc[0]
            est[r]["speedup"] = (stored["speedup"], stored["speedup_ci_low"], stored["speedup_ci_high"])
            assert stored["speedup"] == pytest.approx(
                metrics.speedup(_grid(rows, r, "tokens_per_s"), _grid(rows, r, "base_tokens_per_s")).mean)
            est[r]["baseline"] = metrics.mean_estimate(_grid(rows, r, "base_tokens_per_s"))
            est[r]["speedup_total"] = metrics.speedup_total(
                _grid(rows, r, "output_tokens"), _grid(rows, r, "seconds"),
                _grid(rows, r, "base_output_tokens"), _grid(rows, r, "base_seconds"))
    return est


def _tps(e: metrics.Estimate) -> str:
    return f"{e.value:.1f} tokens/s [{e.ci_low:.1f}, {e.ci_high:.1f}]"


def _text(page, key: str) -> str:
    return page.locator(f".st-key-{key}").inner_text()


def test_speed_tab_names_both_definitions_with_the_metrics_values(page, server: str, shots: Path,
                                                                  expected: dict) -> None:
    open_view(page, server, f"/compare?runs={','.join(RUNS)}&view=Speed", charts=3)
    assert page.get_by_role("tab", name="Speed").get_attribute("aria-selected") == "true"
    per_prompt, total = _text(page, "definition_per_prompt"), _text(page, "definition_total")
    assert per_prompt.startswith("Mean per-prompt tokens/s:") and "Spec-Bench" in per_prompt
    assert total.startswith("Total tokens / total time:") and "vllm bench serve" in total and "SGLang" in total
    for r in RUNS:
        e = expected[r]
        assert f"{r}: {_tps(e['per_prompt'])} against {_tps(e['baseline']).replace(' tokens/s', '')}" \
            in per_prompt.replace("\n", " ")
        assert f"{r}: {_tps(e['total'])}" in total.replace("\n", " ")
        mean, lo, hi = e["speedup"]
        assert f"{mean:.2f}x [{lo:.2f}, {hi:.2f}]" in per_prompt
        st = e["speedup_total"]
        assert f"{st.mean:.2f}x [{st.ci_low:.2f}, {st.ci_high:.2f}]" in total
    latency = _text(page, "latency")
    for r in RUNS:
        t, p = expected[r]["ttft"], expected[r]["tpot"]
        assert (f"{r}: TTFT {t.value * 1000:.2f} ms [{t.ci_low * 1000:.2f}, {t.ci_high * 1000:.2f}], "
                f"TPOT {p.value * 1000:.2f} ms [{p.ci_low * 1000:.2f}, {p.ci_high * 1000:.2f}]") in latency
    want = ("mean per-prompt tokens/s", "total tokens / total time", "TTFT: time to first token",
            "TPOT: time per later token", "Speedup over each run's paired baseline")
    sel = f"{CHART} .gtitle, {CHART} .annotation-text"
    try:                  # every figure draws its own titles; on a loaded machine the last ones come seconds later
        page.wait_for_function("([sel, want]) => { const t = [...document.querySelectorAll(sel)].map(e => "
                               "e.textContent).join(' '); return want.every(w => t.includes(w)); }",
                               arg=[sel, list(want)], timeout=TIMEOUT_MS)
    except PlaywrightTimeout:
        pass
    titles = " ".join(page.locator(sel).all_text_contents())
    for words in want:
        assert words in titles, words
    page.screenshot(path=str(shots / "compare-speed-definitions.png"), full_page=True)


def test_a_slower_drafter_says_so(page, server: str, expected: dict) -> None:
    """The random drafter accepts nothing and drafts 3 tokens a step: slower than decoding without it (0.2-0.7x on
    the 2-core CPU, its interval below 1); its tile says so in words, with its repeats and prompts. On a loaded
    machine the interval may reach 1: then the tile must say "no clear difference" instead."""
    (mean, lo, hi), total = expected["spec-random"]["speedup"], expected["spec-random"]["speedup_total"]
    assert mean < 1 and total.mean < 1
    if "view=Speed" not in page.url:
        open_view(page, server, f"/compare?runs={','.join(RUNS)}&view=Speed", charts=3)
    tile = page.locator('[data-testid="stMetric"]').filter(has_text="spec-random").first.inner_text()
    assert f"{mean:.2f}x" in tile and f"{100 * (mean - 1):+.0f}%" in tile
    if hi < 1:
        assert "slower than without a drafter" in tile
    else:
        assert lo <= 1 and "no clear difference" in tile and "slower" not in tile
    card = page.locator(".stVerticalBlock").filter(has=page.locator('[data-testid="stMetric"]',
                                                                    has_text="spec-random")).last.inner_text()
    assert "2 repeats x 4 prompts" in card and f"{total.mean:.2f}x" in card and "by total tokens / total time" in card
    headline = page.locator('[data-testid="stMarkdownContainer"]').filter(has_text="loses").first.inner_text()
    assert f"spec-random {mean:.2f}x" in headline and " pp (" in headline and "x more speedup" not in headline
    assert "rests on 2 repeats x 4 prompts" in headline


def test_per_category_chart(page, server: str, shots: Path) -> None:
    open_view(page, server, f"/compare?runs={','.join(RUNS)}&view=Per+category", charts=1)
    chart = page.locator('[data-testid="stPlotlyChart"]').first
    text = " ".join(chart.locator(".xtick, .gtitle, .annotation-text, .legendtext").all_text_contents())
    for words in ("tau (mean acceptance length)", "speedup over the baseline", "coding (1)", "writing (2)",
                  "spec-random", "spec-oracle"):
        assert words in text, words
    bars = chart.locator(".bars .point path").count()
    assert bars == 2 * 2 * 3, "tau and speedup, 2 runs, 3 categories"
    button = page.locator('[data-testid="stDownloadButton"] button').filter(has_text="CSV").first
    with page.expect_download(timeout=TIMEOUT_MS) as dl:
        button.click()
    assert Path(dl.value.path()).read_bytes().startswith(b"run_id,category,prompts,tau,tau_ci_low,tau_ci_high")
    assert dl.value.suggested_filename == "per_category_spec-random_spec-oracle.csv"
    page.screenshot(path=str(shots / "compare-per-category.png"), full_page=True)


def test_a_noisy_run_gets_no_verdict(page, server: str, shots: Path, data: Path) -> None:
    """A run whose units ran beside a CPU-bound load: its tile keeps the figure but is grey with no arrow and no
    faster/slower words, says why; the headline gives no speed verdict for it; its run page carries the notice."""
    reason = _manifest(data / "runs" / NOISY)["bench"]["speed_noise"]["reason"]
    open_view(page, server, f"/compare?runs=spec-random,{NOISY}", charts=2)
    tiles = page.locator('[data-testid="stMetric"]')
    noisy = tiles.filter(has_text=NOISY).first
    text = noisy.inner_text()
    assert "no verdict: timing noise" in text and "faster" not in text and "slower" not in text, text
    delta = noisy.locator('[data-testid="stMetricDelta"]')
    assert delta.locator("svg").count() == 0, "no arrow"
    color = delta.evaluate("e => getComputedStyle(e).color")
    clean_delta = tiles.filter(has_text="spec-random").first.locator('[data-testid="stMetricDelta"]')
    clean = clean_delta.evaluate("e => getComputedStyle(e).color")
    assert color != clean, ("grey, not the red of the slower run", color, clean)
    r, g, b = (int(x) for x in color[color.index("(") + 1:color.index(")")].split(",")[:3])
    assert max(r, g, b) - min(r, g, b) < 40, f"a grey, not green or red: {color}"
    card = page.locator(".stVerticalBlock").filter(has=noisy).last.inner_text()
    assert "No faster/slower verdict" in card and "other processes kept 1.5 of" in card.lower(), card
    headline = page.locator('[data-testid="stMarkdownContainer"]').filter(has_text="No speed verdict").first
    words = headline.inner_text()
    assert f"No speed verdict for {NOISY}" in words and compare_words._first_reason(reason) in words, words
    assert "not compared (timing noise" in words, "the tau sentence leaves the speedups out"
    page.screenshot(path=str(shots / "compare-speed-noise.png"), full_page=True)
    open_view(page, server, f"/run?id={NOISY}", charts=0)
    expect(page.locator(".st-key-run_speed_noise")).to_contain_text("No faster/slower verdict", timeout=TIMEOUT_MS)
    notice = page.locator(".st-key-run_speed_noise").inner_text()
    assert "No faster/slower verdict" in notice and "other processes kept 1.5 of" in notice.lower(), notice
    figures = page.locator(".st-key-run_figures")
    # the tiles are drawn after the notice: wait for them, do not read them once
    expect(figures).to_contain_text("no verdict: timing noise", timeout=TIMEOUT_MS)
    page.screenshot(path=str(shots / "run-speed-noise.png"), full_page=True)
