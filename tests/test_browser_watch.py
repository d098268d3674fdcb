"""The Watch page (/watch?run=) in a real browser: `streamlit run app.py` over watch runs recorded by backend/watch.py
against a local metrics server (tests/test_watch.py's watch_root: a drift after a restart, a steady vLLM and SGLang
server, a lost connection), driven by Playwright with Debian chromium. Screenshots go to $SPECLENS_SCREENSHOTS or a
pytest tmp dir."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import test_browser
from tests.test_browser import CHART, CHROMIUM, TIMEOUT_MS, alerts, choose, open_view, streamlit_server
from tests.test_watch import watch_root  # noqa: F401 - the session fixture this module's server reads

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium at /usr/bin/chromium")

shots = test_browser.shots        # the screenshots folder fixture (SPECLENS_SCREENSHOTS or a temp dir)
page = test_browser.page          # one browser page per module, on this module's `server`


@pytest.fixture(scope="module")
def server(watch_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:  # noqa: F811
    with streamlit_server(watch_root, tmp_path_factory.mktemp("streamlit-watch")) as url:
        yield url


def titles(page) -> list[str]:
    """The plotly figures' titles (their first line), in page order."""
    return [t or "" for t in page.locator(f"{CHART} .gtitle").all_text_contents()]


def test_watch_page_shows_tau_chart_and_drift_verdict(page, server: str, shots: Path) -> None:
    open_view(page, server, "/watch?run=watch-drift", charts=3)
    error = page.locator('[data-testid="stAlertContentError"]').first.inner_text()
    assert "watch watch-drift: 20 window(s)" in error and "Error (tau cost" in error, error
    verdict = alerts(page)
    assert "DRIFT: window(s) 17-20" in verdict and "restart" in verdict
    assert any(t.startswith("tau per window") for t in titles(page)), titles(page)
    tau = page.locator('[data-testid="stPlotlyChart"]').first
    assert tau.locator(".legendtext", has_text="drift (confirmed)").count() == 1
    assert tau.locator(".legendtext", has_text="baseline band").count() == 1
    assert tau.locator(".annotation-text", has_text="restart").count() == 1
    page.wait_for_selector('[data-testid="stDataFrame"]')
    page.screenshot(path=str(shots / "watch-drift.png"), full_page=True)


def test_watch_page_sizes_a_small_drift_as_a_note(page, server: str, shots: Path) -> None:
    """A confirmed drop of about 3% of tau is a blue note on the one severity scale, not a red error."""
    open_view(page, server, "/watch?run=watch-small-drift", charts=3)
    assert not page.locator('[data-testid="stAlertContentError"]').count()
    note = page.locator('[data-testid="stAlertContentInfo"]').first.inner_text()
    assert "Note (tau cost" in note and "DRIFT: window(s)" in note, note
    page.screenshot(path=str(shots / "watch-small-drift.png"), full_page=True)


def test_watch_page_steady_sglang_and_lost(page, server: str, shots: Path) -> None:
    open_view(page, server, "/watch?run=watch-sglang", charts=2)
    assert "no drift" in page.locator('[data-testid="stAlertContentSuccess"]').first.inner_text()
    assert "No per-position acceptance" in alerts(page)
    page.screenshot(path=str(shots / "watch-sglang.png"), full_page=True)
    open_view(page, server, "/watch?run=watch-lost", charts=3)
    assert "This watch is failed: lost" in alerts(page)


def test_watch_page_picker_writes_the_url(page, server: str) -> None:
    open_view(page, server, "/watch?run=watch-ok", charts=3)
    choose(page, "Watch run", "watch-drift")
    page.wait_for_url("**run=watch-drift**")
    page.wait_for_function(f"document.querySelectorAll('{CHART}').length >= 3", timeout=TIMEOUT_MS)


def test_watch_chart_csv_download(page, server: str) -> None:
    open_view(page, server, "/watch?run=watch-drift", charts=3)
    button = page.locator('[data-testid="stDownloadButton"] button').filter(has_text="CSV").first
    with page.expect_download(timeout=TIMEOUT_MS) as dl:
        button.click()
    assert dl.value.suggested_filename == "watch_watch-drift_tau.csv"
    assert Path(dl.value.path()).read_bytes().startswith(b"window,segment,start,end,drafts")
