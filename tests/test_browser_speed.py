"""The Compare page's Speed and Per category tabs in a real browser (Debian chromium driven by Playwright, a real
`streamlit` server over a real DuckDB catalog of bench runs made by backend.bench.run_bench: tests/conftest.py
build_bench_data). The figures on the page must be the ones backend.metrics computes from the same catalog rows:
both throughput definitions, named and defined, their speedups, TTFT and TPOT, each with its 95% interval; a
drafter slower than decoding without one says so in words; the per-category chart renders and downloads."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from backend import metrics
from backend.store.catalog import Catalog
from tests import test_browser
from tests.test_browser import CHART, CHROMIUM, TIMEOUT_MS, open_view, streamlit_server

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium at /usr/bin/chromium")
shots = test_browser.shots          # the screenshots folder fixture (SPECLENS_SCREENSHOTS or a temp dir)
page = test_browser.page          # one browser page per module, on this module's `server`
RUNS = ["spec-random", "spec-oracle"]
BASE = "spec-random-baseline"


@pytest.fixture(scope="module")
def server(bench_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with streamlit_server(bench_root, tmp_path_factory.mktemp("streamlit-speed")) as url:
        yield url


def _grid(rows, run: str, col: str) -> list[list[float]]:
    """One run's column as repeats x prompts (prompts by id, repeats in order), straight from the catalog rows."""
    g = rows[rows["run_id"] == run].pivot(index="repeat", columns="prompt_id", values=col).sort_index()
    return g.sort_index(axis=1).to_numpy(dtype=float).tolist()


@pytest.fixture(scope="module")
def expected(bench_root: Path) -> dict:
    """What backend.metrics computes from the catalog's per-prompt rows of the runs and their paired baseline."""
    rows = Catalog(bench_root).read.bench_prompt_timings(RUNS + [BASE])
    est = {}
    for r in RUNS + [BASE]:
        est[r] = {"per_prompt": metrics.mean_estimate(_grid(rows, r, "tokens_per_s")),
                  "total": metrics.total_throughput(_grid(rows, r, "output_tokens"), _grid(rows, r, "seconds")),
                  "ttft": metrics.mean_estimate(_grid(rows, r, "ttft")),
                  "tpot": metrics.mean_estimate(_grid(rows, r, "tpot"))}
        if r != BASE:       # the per-prompt speedup as the bench stored it (metrics.speedup, its own seed and order)
            stored = Catalog(bench_root).read.bench_runs(run_ids=[r]).iloc[0]
            est[r]["speedup"] = (stored["speedup"], stored["speedup_ci_low"], stored["speedup_ci_high"])
            assert stored["speedup"] == pytest.approx(
                metrics.speedup(_grid(rows, r, "tokens_per_s"), _grid(rows, BASE, "tokens_per_s")).mean)
            est[r]["speedup_total"] = metrics.speedup_total(
                _grid(rows, r, "output_tokens"), _grid(rows, r, "seconds"),
                _grid(rows, BASE, "output_tokens"), _grid(rows, BASE, "seconds"))
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
        assert f"{r}: {_tps(e['per_prompt'])} against {_tps(expected[BASE]['per_prompt']).replace(' tokens/s', '')}" \
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
    titles = " ".join(page.locator(f"{CHART} .gtitle, {CHART} .annotation-text").all_text_contents())
    for words in ("mean per-prompt tokens/s", "total tokens / total time", "TTFT: time to first token",
                  "TPOT: time per later token", "Speedup over each run's paired baseline"):
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
