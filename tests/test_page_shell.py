"""The page shell dashboard/serve.py serves: Streamlit's own index.html plus the lines that start the code the opened
view's first screen draws (Plotly's chart, the data grid) while the page script runs. Checked on the installed
Streamlit's real static files; in a browser in tests/test_browser.py."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from streamlit import file_util

from backend.links import PAGES
from dashboard import serve

STATIC = Path(file_util.get_static_dir())
JS = STATIC / "static" / "js"


def _shell() -> str:
    html = serve.page_shell((STATIC / "index.html").read_text(), JS)
    assert html is not None, f"this Streamlit ({STATIC}) lacks a chunk of {serve.CHUNKS} or the shell's anchor"
    return html


def test_every_page_says_what_its_first_screen_draws() -> None:
    for view, page in PAGES.items():
        assert page.first and set(page.first) <= set(serve.CHUNKS), (view, page.first)
    # a page without a chart on its first screen waits on no chart code; the run page's small HTML table comes first
    assert PAGES["runs"].first == ("grid",) and PAGES["compare"].first == ("metric", "chart")
    assert PAGES["run"].first == ("metric", "table", "chart")     # the tiles and the table are drawn before the charts


def test_shell_names_this_streamlits_chunks_per_view() -> None:
    html = _shell()
    first = json.loads(re.search(r"const first = (\{.*?\}), files", html).group(1))
    files = json.loads(re.search(r"files = (\{.*?\});", html).group(1))
    assert first == {v: list(p.first) for v, p in PAGES.items()}
    for kind, name in files.items():
        assert (JS / name).is_file() and name.startswith(serve.CHUNKS[kind] + "."), name
    # Streamlit's own shell is all there, the added lines before its stylesheet and after its app bundle
    original = (STATIC / "index.html").read_text()
    assert html.replace(html[html.index("<script>\n      /* SpecLens"):html.index(serve._SHELL_ANCHOR)], "") == original
    assert html.index('src="./static/js/index.') < html.index("SpecLens")


def test_another_streamlit_gets_its_shell_unchanged(tmp_path: Path) -> None:
    """A release whose chunks are named otherwise (or whose shell has no stylesheet link) is served as it is."""
    original = (STATIC / "index.html").read_text()
    shutil.copy(next(JS.glob("PlotlyChart.*.js")), tmp_path)           # no Table or DataFrame chunk here
    assert serve.page_shell(original, tmp_path) is None
    assert serve.page_shell(original.replace(serve._SHELL_ANCHOR, "<link rel='style'"), JS) is None


def test_served_folder_links_every_static_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_util, "get_static_dir", lambda: str(STATIC))
    made = Path(serve.serve_page_shell())
    try:
        assert file_util.get_static_dir() == str(made)
        assert sorted(p.name for p in made.iterdir()) == sorted(p.name for p in STATIC.iterdir())
        assert (made / "index.html").read_text() == _shell()
        assert (made / "static" / "js" / next(JS.glob("PlotlyChart.*.js")).name).is_file()
    finally:
        shutil.rmtree(made)
