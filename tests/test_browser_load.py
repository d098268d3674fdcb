"""The Serving load page (/load?run= | ?runs=) in a real browser: `streamlit run app.py` over the load runs recorded on
the H200 (tests/test_load_page.py's load_root: the K 1/2/4 x concurrency 1/8/32/64 sweep, the K=4 pair and a watch),
driven by Playwright with Debian chromium: the charts render, the tiles and words are there, a chart's CSV and the
view's report zip download, and a ?run= link (picker and percentile included) reproduces the view. Screenshots go to
$SPECLENS_SCREENSHOTS or a pytest tmp dir."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import test_browser
from tests.test_browser import CHART, CHROMIUM, TIMEOUT_MS, alerts, choose, open_view, streamlit_server
from tests.test_load_page import load_root  # noqa: F401 - the session fixture this module's server reads

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium at /usr/bin/chromium")

shots = test_browser.shots        # the screenshots folder fixture (SPECLENS_SCREENSHOTS or a temp dir)
page = test_browser.page          # one browser page per module, on this module's `server`
SWEEP, PAIR = "h200-vllm-sweep", "h200-vllm-pair"


@pytest.fixture(scope="module")
def server(load_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:  # noqa: F811
    with streamlit_server(load_root, tmp_path_factory.mktemp("streamlit-load")) as url:
        yield url


def titles(page) -> list[str]:
    return [t or "" for t in page.locator(f"{CHART} .gtitle").all_text_contents()]


def open_load(page, server: str, path: str, charts: int = 4) -> None:
    """open_view, then wait until `charts` figures have drawn their titles (a figure holds several .main-svg)."""
    open_view(page, server, path, charts=1)
    page.wait_for_function(f"document.querySelectorAll('{CHART} .gtitle').length >= {charts}", timeout=TIMEOUT_MS)


def tiles(page) -> list[str]:
    return [t.strip() for t in page.locator('[data-testid="stMetric"]').all_inner_texts()]


def _download(page, label: str, index: int = 0) -> tuple[str, bytes]:
    button = page.locator('[data-testid="stDownloadButton"] button').filter(has_text=label).nth(index)
    with page.expect_download(timeout=TIMEOUT_MS) as dl:
        button.click()
    return dl.value.suggested_filename, Path(dl.value.path()).read_bytes()


def test_load_page_renders_charts_tiles_and_words(page, server: str, shots: Path) -> None:
    page.set_viewport_size({"width": 1440, "height": 4400})     # the whole page in one screenshot
    try:
        open_load(page, server, f"/load?run={SWEEP}")
        got = titles(page)
        for want in ("Speedup vs concurrency", "Throughput vs per-user speed", "Latency per level",
                     "Acceptance: the server's counters"):
            assert any(t.startswith(want) for t in got), got
        t = tiles(page)
        assert len(t) == 4 and "K=4 \u00b7 1.25x" in t[0] and "faster than without a drafter" in t[0]
        assert all("no verdict: baseline noisy" in x for x in t[1:]), t
        text = page.locator('[data-testid="stMain"]').inner_text()
        assert "with K=1 and K=2 within its interval: not a clear winner" in text
        assert "K=1 measured below 1 at concurrency 64: 0.90x [0.88, 0.93]. Not a verdict" in text
        assert "9,108 to 15,216 tok/s at 64" in alerts(page)
        assert "vLLM merges the stream chunks" in alerts(page)
        speed = page.locator('[data-testid="stPlotlyChart"]').first
        assert speed.locator(".legendtext", has_text="baseline noisy: no verdict").count() == 1
        assert speed.locator(".annotation-text", has_text="no gain").count() == 1
        pareto = page.locator('[data-testid="stPlotlyChart"]').nth(1)
        assert pareto.locator(".legendtext", has_text="Pareto front").count() == 1
        assert page.get_by_role("link", name="Serving load").count() >= 1, "in the top navigation"
        page.wait_for_timeout(1000)
        page.screenshot(path=str(shots / "load-sweep.png"), full_page=True)
    finally:
        page.set_viewport_size({"width": 1440, "height": 1700})


def test_load_chart_csv_and_report_downloads(page, server: str) -> None:
    open_load(page, server, f"/load?run={SWEEP}")
    name, data = _download(page, "CSV")
    assert name == f"load_speedup_{SWEEP}.csv"
    head, *rows = data.decode().strip().splitlines()
    assert head.startswith("run_id,config,k,synthetic_tau,concurrency,speedup,speedup_ci_low,speedup_ci_high")
    assert len(rows) == 12 and any(r.startswith(f"{SWEEP},K=1,1,,64,0.9028") for r in rows), rows[:4]
    name, data = _download(page, "Report")
    assert name == f"load_speedup_{SWEEP}_report.zip"
    z = zipfile.ZipFile(io.BytesIO(data))
    csvs = sorted(f for f in z.namelist() if f.endswith(".csv"))
    assert csvs == sorted(f"load_{v}_{SWEEP}.csv" for v in ("speedup", "pareto", "latency", "acceptance")), csvs
    verdict = z.read("verdict.txt").decode()
    assert f"{SWEEP}: Best K per concurrency: 1: K=4 1.25x [1.10, 1.43], no clear winner" in verdict
    assert "8, 32 and 64: no verdict (baseline noisy)" in verdict
    assert f"run={SWEEP}" in z.read("README.txt").decode()


def test_run_link_reproduces_the_view(page, server: str) -> None:
    open_load(page, server, f"/load?run={PAIR}")
    assert "K=4 \u00b7 0.79x" in tiles(page)[0]
    choose(page, "Load run", SWEEP)
    page.wait_for_url(f"**run={SWEEP}**")
    page.wait_for_function(f"document.querySelectorAll('{CHART} .gtitle').length >= 4", timeout=TIMEOUT_MS)
    choose(page, "Latency percentile", "p99")
    page.wait_for_url("**pct=p99**")
    page.wait_for_function("[...document.querySelectorAll('.gtitle')].some(t => t.textContent.startsWith("
                           "'Latency per level, p99'))", timeout=TIMEOUT_MS)
    link = page.url
    assert f"run={SWEEP}" in link and "pct=p99" in link
    shown = tiles(page)
    ctx = page.context.browser.new_context(viewport={"width": 1440, "height": 1700})   # the copied link, afresh
    try:
        fresh = ctx.new_page()
        fresh.set_default_timeout(TIMEOUT_MS)
        fresh.goto(server + "/")                                 # first load of `/` (streamlit issue #8860)
        fresh.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', state="attached")
        open_load(fresh, server, "/" + link.split("/", 3)[3])
        assert tiles(fresh) == shown
        assert any(t.startswith("Latency per level, p99") for t in titles(fresh))
    finally:
        ctx.close()


def test_several_runs_side_by_side(page, server: str) -> None:
    open_load(page, server, f"/load?runs={SWEEP},{PAIR}")
    assert len(tiles(page)) == 8
    speed = page.locator('[data-testid="stPlotlyChart"]').first
    assert speed.locator(".legendtext", has_text=f"{PAIR} \u00b7 K=4").count() == 1


def test_load_page_requests_only_its_own_server(page, server: str) -> None:
    """Nothing leaves the machine (as tests/test_browser_offline.py checks for the other pages): every request of the
    page, its charts and a CSV download goes to the dashboard's own server."""
    from urllib.parse import urlsplit

    ctx = page.context.browser.new_context(viewport={"width": 1440, "height": 1700}, accept_downloads=True)
    urls: list[str] = []
    ctx.on("request", lambda req: urls.append(req.url))
    try:
        fresh = ctx.new_page()
        fresh.set_default_timeout(TIMEOUT_MS)
        fresh.goto(server + "/")
        fresh.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', state="attached")
        open_load(fresh, server, f"/load?run={SWEEP}")
        fresh.wait_for_load_state("networkidle")
        _download(fresh, "CSV")
        own = urlsplit(server).netloc
        foreign = sorted({u for u in urls if not u.startswith(("data:", "blob:")) and urlsplit(u).netloc != own})
        assert urls and not foreign, foreign
    finally:
        ctx.close()
