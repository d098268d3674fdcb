"""The dashboard in a real browser: `streamlit run app.py` in a subprocess, driven by Playwright with
Debian's chromium. Every page is opened by its URL (query parameters included), charts must render,
downloads must produce real files. Screenshots go to $SPECLENS_SCREENSHOTS or a pytest tmp dir."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from backend.config import REPO_ROOT
from backend.netutil import free_port

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
                 "--no-first-run", "--disable-component-update", "--disable-sync"]
CHART = '[data-testid="stPlotlyChart"] .js-plotly-plot .main-svg'
TIMEOUT_MS = 60_000

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium at /usr/bin/chromium "
                                "(apt-get install -y chromium chromium-driver)")




def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 90) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"streamlit did not answer at {url} within {timeout_s} s:\n{log.read_text()[-3000:]}")


@contextmanager
def streamlit_server(data_root: Path, log_dir: Path, extra_env: dict[str, str] | None = None) -> Iterator[str]:
    """`streamlit run app.py` on a free port over `data_root` (read-only unless extra_env enables editing); yields
    its URL and stops it afterwards."""
    port = free_port()
    log = log_dir / "server.log"
    env = {**os.environ, "SPECLENS_DATA": str(data_root)}
    env.pop("SPECLENS_READONLY", None)
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "dashboard.serve", "--server.headless", "true", "--server.port", str(port),
           "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def browser_page(url: str):
    """A Debian-chromium page that has loaded `/` once (streamlit issue #8860)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        ctx = browser.new_context(viewport={"width": 1440, "height": 1700}, accept_downloads=True)
        ctx.set_default_timeout(TIMEOUT_MS)
        pg = ctx.new_page()
        pg.goto(url + "/")
        pg.wait_for_selector('[data-testid="stDataFrame"]')
        yield pg
        browser.close()


@pytest.fixture(scope="module")
def server(dash_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with streamlit_server(dash_root, tmp_path_factory.mktemp("streamlit")) as url:
        yield url


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = Path(os.environ["SPECLENS_SCREENSHOTS"]) if os.environ.get("SPECLENS_SCREENSHOTS") else \
        tmp_path_factory.mktemp("screenshots")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def page(server: str):
    with browser_page(server) as pg:
        yield pg


def open_view(page, server: str, path: str, charts: int = 1) -> None:
    page.goto(server + path)
    # The app reads "notRunning" before its script has even started on a fresh load: wait for the script to have drawn
    # something in the main block and then to have finished, not for the initial state.
    page.wait_for_function(
        "document.querySelector('[data-testid=\"stMain\"] [data-testid=\"stElementContainer\"]') !== null"
        " && document.querySelector('[data-testid=\"stApp\"]')?.dataset.testScriptState === 'notRunning'",
        timeout=TIMEOUT_MS)
    if charts:
        try:
            page.wait_for_function(f"document.querySelectorAll('{CHART}').length >= {charts}", timeout=TIMEOUT_MS)
        except Exception as e:  # say what the page showed instead, for a CI log
            drawn = page.locator(CHART).count()
            body = page.locator('[data-testid="stMain"]').inner_text()[:1500]
            raise AssertionError(f"{path}: {drawn} of {charts} charts drawn after {TIMEOUT_MS} ms; "
                                 f"the page read:\n{body}") from e
    assert not page.locator('[data-testid="stException"]').count(), (
        page.locator('[data-testid="stException"]').inner_text())


def choose(page, label: str, option: str) -> None:
    """Pick `option` in the selectbox labelled `label` (in the page's pickers popover if it is not on the page) once
    the page has stopped moving. A rerun still drawing (its charts from the last view stay in the DOM until replaced)
    shifts a box after it was scrolled to, and its list then opens outside the viewport where no click lands: wait
    for the script, then for the box to hold still."""
    page.wait_for_function("document.querySelector('[data-testid=\"stApp\"]')?.dataset.testScriptState"
                           " === 'notRunning'", timeout=TIMEOUT_MS)
    box = page.locator('[data-testid="stSelectbox"]').filter(has_text=label)
    if not box.count():                  # a page's run pickers sit in a popover (ui.pickers_popover): open it
        page.locator('[data-testid="stPopover"] button').first.click()
        box.wait_for(timeout=TIMEOUT_MS)
    last = None
    for _ in range(50):
        box.scroll_into_view_if_needed()
        now = box.bounding_box()
        if now == last:
            break
        last = now
        page.wait_for_timeout(100)
    box.click()
    page.get_by_role("option", name=option).click()


def alerts(page) -> str:
    return "\n".join(page.locator('[data-testid="stAlert"]').all_inner_texts())


def test_runs_page(page, server: str, shots: Path) -> None:
    open_view(page, server, "/runs", charts=0)
    page.wait_for_selector('[data-testid="stDataFrame"]')
    assert page.locator('[data-testid="stProgress"]').count() >= 1, "live-run shows a progress bar"
    assert "dead-run" in alerts(page)
    page.screenshot(path=str(shots / "runs.png"), full_page=True)
    open_view(page, server, "/runs?status=failed", charts=0)
    page.wait_for_selector('[data-testid="stDataFrame"]')
    assert "1 of" in page.locator('[data-testid="stCaptionContainer"]').first.inner_text()


def test_alignment_page(page, server: str, shots: Path) -> None:
    open_view(page, server, "/alignment?a=a1&b=a2&metric=cosine")
    assert "Aligned" in page.locator('[data-testid="stAlertContentSuccess"]').inner_text()
    page.wait_for_selector('[data-testid="stDataFrame"]')
    page.screenshot(path=str(shots / "alignment-aligned.png"), full_page=True)
    open_view(page, server, "/alignment?a=a1&b=nan1&metric=rel_l2")
    assert "NaN or inf" in alerts(page)
    page.screenshot(path=str(shots / "alignment-nan.png"), full_page=True)
    open_view(page, server, "/alignment?a=a1&b=b16&metric=cka")
    assert "Numeric drift" in alerts(page)
    page.screenshot(path=str(shots / "alignment-drift.png"), full_page=True)


def test_alignment_unknown_run(page, server: str) -> None:
    open_view(page, server, "/alignment?a=nope&b=a2")
    assert "No run `nope`".replace("`", "") in alerts(page).replace("`", "")


def test_stats_page(page, server: str, shots: Path) -> None:
    open_view(page, server, "/stats?runs=a1,b16,nan1&stat=mean_norm&run=nan1", charts=2)
    page.screenshot(path=str(shots / "stats.png"), full_page=True)


def test_widget_change_updates_url(page, server: str) -> None:
    open_view(page, server, "/alignment?a=a1&b=a2&metric=cosine")
    choose(page, "Metric", "linear CKA")
    page.wait_for_url("**metric=cka**")
    page.wait_for_function(f"document.querySelectorAll('{CHART}').length >= 1")


def test_root_forwards_to_runs_with_its_params(page, server: str) -> None:
    page.goto(server + "/?status=failed")
    page.wait_for_url("**/runs?status=failed")
    page.wait_for_selector('[data-testid="stDataFrame"]')


def test_navigation_between_pages(page, server: str) -> None:
    open_view(page, server, "/runs", charts=0)
    page.get_by_role("link", name="Hidden-state stats").first.click()
    page.wait_for_url("**/stats**")
    page.wait_for_function(f"document.querySelectorAll('{CHART}').length >= 2")


@pytest.mark.parametrize("fmt,magic", [("PNG", b"\x89PNG"), ("SVG", b"<svg"), ("HTML", b"<html"),
                                       ("CSV", b"a_run,a_boundary")])
def test_chart_downloads(page, server: str, fmt: str, magic: bytes) -> None:
    if page.url.split("?")[0] != server + "/alignment" or "b=a2" not in page.url:
        open_view(page, server, "/alignment?a=a1&b=a2&metric=cosine")
    button = page.locator('[data-testid="stDownloadButton"] button').filter(has_text=fmt).first
    with page.expect_download(timeout=TIMEOUT_MS) as dl:
        button.click()
    data = Path(dl.value.path()).read_bytes()
    assert magic in data[:400], data[:200]
    assert dl.value.suggested_filename == f"alignment_a1_vs_a2_cosine.{fmt.lower()}"


def test_fresh_server_deep_link_uses_the_app_navigation(page, dash_root: Path, tmp_path: Path) -> None:
    """The first visitor of a fresh server opens /compare directly (a shared link): the page must run inside
    app.py's navigation (top bar, wide layout), not as streamlit's legacy `pages/` page, which would also leave
    every later session without the navigation bar (dashboard/serve.py). Uses the module's browser (one sync
    Playwright per thread) against a server of its own."""
    with streamlit_server(dash_root, tmp_path) as url:
        ctx = page.context.browser.new_context(viewport={"width": 1440, "height": 1000})
        ctx.set_default_timeout(TIMEOUT_MS)
        pg = ctx.new_page()
        for path in ("/compare", "/stats"):          # the first and a later session, each on a deep link
            pg.goto(url + path)
            pg.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', state="attached")
            pg.wait_for_selector('[data-testid="stTopNavLink"]')
            assert pg.locator('[data-testid="stSidebarNav"]').count() == 0, f"{path}: legacy pages/ navigation"
            assert "Drafter check" in " ".join(pg.locator('[data-testid="stTopNavLink"]').all_inner_texts())
        ctx.close()


def test_page_shell_loads_the_first_screens_code_ahead(page, server: str) -> None:
    """dashboard/serve.py's page shell: a chart view has Plotly's code fetched before the page script has drawn
    anything (Streamlit alone fetches it once the first chart arrives); the Runs page, whose first screen is a table,
    has the grid's code fetched as early and never loads Plotly's."""
    ctx = page.context.browser.new_context(viewport={"width": 1440, "height": 1000})
    ctx.set_default_timeout(TIMEOUT_MS)
    ctx.add_init_script("""new MutationObserver((_, obs) => {
        if (document.querySelector('[data-testid="stMain"] [data-testid="stElementContainer"]')) {
          window.firstElementAt = performance.now(); obs.disconnect(); }
      }).observe(document, {subtree: true, childList: true});""")
    pg = ctx.new_page()
    js = ("performance.getEntriesByType('resource').filter(e => /\\/(PlotlyChart|DataFrame)\\.[^/]*\\.js$/"
          ".test(e.name)).map(e => [e.name.split('/').pop().split('.')[0], e.startTime])")
    try:
        open_view(pg, server, "/alignment?a=a1&b=a2&metric=cosine")
        fetched, drawn = dict(pg.evaluate(js)), pg.evaluate("window.firstElementAt")
        assert fetched["PlotlyChart"] < drawn, (fetched, drawn)
        open_view(pg, server, "/runs", charts=0)
        pg.wait_for_selector('[data-testid="stDataFrame"] canvas')
        fetched, drawn = dict(pg.evaluate(js)), pg.evaluate("window.firstElementAt")
        assert "PlotlyChart" not in fetched and fetched["DataFrame"] < drawn, (fetched, drawn)
    finally:
        ctx.close()


def test_page_shell_connects_a_deep_link_without_probing(page, server: str) -> None:
    """A view's own URL (/alignment?..., /run?id=X): the page shell tells Streamlit that the server is at the path
    above the view, so it asks /_stcore/health once instead of /alignment/_stcore/health first (a 404, then a retry
    100 ms later: streamlit issue #7074). A path that names no view keeps Streamlit's own probe and lands on Runs."""
    ctx = page.context.browser.new_context(viewport={"width": 1440, "height": 1000})
    ctx.set_default_timeout(TIMEOUT_MS)
    pg = ctx.new_page()
    asked: list[str] = []
    pg.on("request", lambda r: asked.append(r.url[len(server):]) if "/_stcore/health" in r.url else None)
    try:
        open_view(pg, server, "/alignment?a=a1&b=a2&metric=cosine")
        assert asked == ["/_stcore/health"], asked
        asked.clear()
        open_view(pg, server, "/no-such-view", charts=0)
        assert asked == ["/no-such-view/_stcore/health", "/_stcore/health"], asked
        pg.wait_for_url("**/runs*")
    finally:
        ctx.close()
