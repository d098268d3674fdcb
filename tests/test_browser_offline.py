"""The dashboard keeps to its own server and to the viewer's theme, in a real browser (Debian chromium through
Playwright) against a real `streamlit` server on a real catalog (tests/conftest.py bench_root: bench runs, their
baseline and a capture):

- every page makes requests to the dashboard's own server only (no favicon from a font CDN, no fonts, no usage
  statistics): each request the browser makes is recorded, and any to another host is refused and fails the test;
- no Deploy button (.streamlit/config.toml next to app.py: client.toolbarMode = "viewer");
- compact layout: a page's title starts near the top navigation, not ~100 px below it;
- charts follow the theme: in dark mode (the browser prefers a dark colour scheme) a chart's background is dark.

Screenshots go to $SPECLENS_SCREENSHOTS (test_browser's `shots`)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from backend.config import REPO_ROOT
from tests import test_browser
from tests.test_browser import CHART, CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, open_view, streamlit_server

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium at /usr/bin/chromium")

shots = test_browser.shots        # the screenshots folder fixture (SPECLENS_SCREENSHOTS or a temp dir)

# every page of app.py with the view it opens and the charts it draws on bench_root
PAGES = [("/runs", 0), ("/compare?runs=spec-oracle,spec-random", 2), ("/alignment?a=cap-tiny&b=cap-tiny", 1),
         ("/stats?runs=cap-tiny", 2), ("/drafter", 0), ("/feeds", 0), ("/regression", 1), ("/new", 0)]
if 'url_path="run"' in (REPO_ROOT / "app.py").read_text():        # the run page (issue 14 item 2), once it exists
    PAGES.append(("/run?id=spec-oracle", 0))
TITLE_TOP_PX = 72          # a page title's top edge at most this far from the window's top (Streamlit's default: 128)
MOSTLY_WHITE = 0.05        # at most this share of a dark-mode chart's pixels may be near-white


@pytest.fixture(scope="module")
def server(bench_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with streamlit_server(bench_root, tmp_path_factory.mktemp("streamlit-offline")) as url:
        yield url


def _context(browser, server: str, scheme: str = "light"):
    """A browser context that records every request and refuses (and records) any to another host."""
    ctx = browser.new_context(viewport={"width": 1440, "height": 1000}, color_scheme=scheme, accept_downloads=True)
    ctx.set_default_timeout(TIMEOUT_MS)
    own = urlsplit(server).netloc
    ctx.requests, ctx.foreign = [], []

    def route(r) -> None:
        if urlsplit(r.request.url).netloc == own or r.request.url.startswith(("data:", "blob:")):
            r.continue_()
        else:
            ctx.foreign.append(r.request.url)
            r.abort()

    ctx.route("**/*", route)
    ctx.on("request", lambda req: ctx.requests.append(req.url))
    return ctx


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


def _foreign(urls: list[str], server: str) -> list[str]:
    own = urlsplit(server).netloc
    return sorted({u for u in urls if not u.startswith(("data:", "blob:")) and urlsplit(u).netloc != own})


def test_every_page_requests_only_its_own_server(browser, server: str, shots: Path) -> None:
    ctx = _context(browser, server)
    page = ctx.new_page()
    page.on("request", lambda req: ctx.requests.append(req.url))
    try:
        for path, charts in PAGES:
            open_view(page, server, path, charts=charts)
            page.wait_for_load_state("networkidle")
            icons = page.evaluate("Array.from(document.querySelectorAll('link[rel~=icon]')).map(l => l.href)")
            assert icons and not _foreign(icons, server), f"{path}: favicon not served by the dashboard: {icons}"
            title = page.locator("h1").first
            if title.count():       # compact layout: no ~100 px of empty space above the title
                assert title.bounding_box()["y"] <= TITLE_TOP_PX, f"{path}: title at {title.bounding_box()}"
            assert page.locator('[data-testid="stAppDeployButton"]').count() == 0, f"{path}: Deploy button shown"
            assert page.get_by_role("button", name="Deploy").count() == 0, f"{path}: Deploy button shown"
            page.screenshot(path=str(shots / f"offline{path.split('?')[0].replace('/', '_')}.png"))
        assert len(ctx.requests) > len(PAGES), "requests were recorded"
        assert any("/media/" in u for u in ctx.requests), "the favicon came from the dashboard's media files"
        assert not ctx.foreign and not _foreign(ctx.requests, server), (
            f"requests to other hosts: {_foreign(ctx.requests + ctx.foreign, server)}")
    finally:
        ctx.close()


def test_menu_has_no_developer_options(browser, server: str) -> None:
    """toolbarMode viewer: the main menu offers no Deploy, Rerun or Clear cache."""
    ctx = _context(browser, server)
    page = ctx.new_page()
    try:
        open_view(page, server, "/runs", charts=0)
        page.locator('[data-testid="stMainMenu"]').click()
        menu = page.locator('[data-testid="stMainMenuList"]')
        menu.wait_for()
        items = menu.inner_text()
        assert "Settings" in items or "Print" in items, items
        for dev in ("Deploy", "Rerun", "Clear cache"):
            assert dev not in items, f"developer option {dev!r} in the menu: {items}"
    finally:
        ctx.close()


def _white_share(png: bytes) -> float:
    import numpy as np
    from PIL import Image

    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    return float((rgb.min(axis=2) >= 235).mean())


@pytest.mark.parametrize("scheme", ["dark", "light"])
def test_charts_follow_the_theme(browser, server: str, shots: Path, scheme: str) -> None:
    """The browser prefers a dark (light) colour scheme, Streamlit follows it, and so do the charts: in dark mode
    almost no chart pixel is white; in light mode most are (the same check can tell them apart)."""
    ctx = _context(browser, server, scheme)
    page = ctx.new_page()
    try:
        open_view(page, server, "/compare?runs=spec-oracle,spec-random", charts=2)
        app_bg = page.evaluate("getComputedStyle(document.querySelector('[data-testid=stApp]')).backgroundColor")
        chart = page.locator('[data-testid="stPlotlyChart"]').first
        chart.scroll_into_view_if_needed()
        png = chart.screenshot(path=str(shots / f"chart-{scheme}.png"))
        white = _white_share(png)
        if scheme == "dark":
            assert app_bg != "rgb(255, 255, 255)", "the app did not switch to its dark theme"
            assert white <= MOSTLY_WHITE, f"dark mode: {white:.0%} of the chart is white (app background {app_bg})"
        else:
            assert white >= 0.5, f"light mode: only {white:.0%} of the chart is white"
        assert page.locator(CHART).count() >= 2
    finally:
        ctx.close()
