"""The Feeds and Regression pages in a real browser (Debian chromium through Playwright), on the toy-pair release
data of tests/test_release_pages.py: they render inside the app's navigation, draw their chart without an
exception, and the Feeds chart's CSV download holds the matrix. Screenshots go to $SPECLENS_SCREENSHOTS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.demo import PAIR_TARBALL
from tests import test_browser
from tests.test_browser import CHROMIUM, TIMEOUT_MS, open_view, streamlit_server
from tests.test_release_pages import build_release_data

pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium at /usr/bin/chromium"),
              pytest.mark.skipif(not PAIR_TARBALL.exists(), reason="needs the toy pair (models/toy-pair.tar.gz)"),
              pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("release-browser") / "data"
    root.mkdir()
    build_release_data(root)
    with streamlit_server(root, tmp_path_factory.mktemp("streamlit")) as url:
        yield url


shots = test_browser.shots        # the screenshots folder fixture (SPECLENS_SCREENSHOTS or a temp dir)
page = test_browser.page          # one browser page per module, on this module's `server`


def test_feeds_page_in_a_browser(page, server: str, shots: Path) -> None:
    open_view(page, server, "/feeds?check=chk-after")
    nav = " ".join(page.locator('[data-testid="stTopNavLink"]').all_inner_texts())
    assert "Feeds" in nav and "Regression" in nav
    assert "differs from what the drafter was trained on" in page.inner_text("body")
    page.screenshot(path=str(shots / "feeds.png"), full_page=True)
    button = page.locator('[data-testid="stDownloadButton"] button').filter(has_text="CSV").first
    with page.expect_download(timeout=TIMEOUT_MS) as dl:
        button.click()
    data = Path(dl.value.path()).read_text()
    assert data.startswith("engine,release,runner,picked,feeds") and "0.5.23" in data


def test_regression_page_in_a_browser(page, server: str, shots: Path) -> None:
    open_view(page, server, "/regression?group=0")
    body = page.inner_text("body")
    assert "rel-planted" in body and "sglang 0.5.15 reading" in body
    page.screenshot(path=str(shots / "regression.png"), full_page=True)
