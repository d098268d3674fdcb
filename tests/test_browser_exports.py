"""A view's report bundle and the verdict in exported charts, in a real browser (Debian chromium through Playwright)
against a real `streamlit` server on the captures of tests/conftest.py (dash_root): the "Report" download next to the
first chart's downloads is one zip with every chart of the view as PNG and SVG, its data as CSV, verdict.txt and
README.txt with the view's link; a chart's own PNG/SVG carries the page's verdict above the chart. Also the export
functions themselves (dashboard/exports.py) on a real figure."""

from __future__ import annotations

import io
import re
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import test_browser
from tests.test_browser import CHROMIUM, TIMEOUT_MS, open_view, streamlit_server

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium at /usr/bin/chromium")

shots = test_browser.shots        # the screenshots folder fixture (SPECLENS_SCREENSHOTS or a temp dir)
page = test_browser.page          # one browser page per module, on this module's `server`
DRIFT = "/alignment?a=a1&b=b16&metric=cosine"          # fp32 vs bf16 of one model: the numeric-drift verdict


@pytest.fixture(scope="module")
def server(dash_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with streamlit_server(dash_root, tmp_path_factory.mktemp("streamlit-exports")) as url:
        yield url


def _download(page, label: str) -> tuple[str, bytes]:
    button = page.locator('[data-testid="stDownloadButton"] button').filter(has_text=label).first
    with page.expect_download(timeout=TIMEOUT_MS) as dl:
        button.click()
    return dl.value.suggested_filename, Path(dl.value.path()).read_bytes()


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    return struct.unpack(">II", data[16:24])


def _svg_size(data: bytes) -> tuple[float, float]:
    head = data[:2000].decode(errors="replace")
    return float(re.search(r'width="([\d.]+)"', head).group(1)), float(re.search(r'height="([\d.]+)"', head).group(1))


def _verdict_on_page(page) -> str:
    return page.locator('[data-testid="stAlert"]').filter(has_text="Numeric drift").first.inner_text().strip()


def test_report_bundle_of_a_view(page, server: str, shots: Path) -> None:
    open_view(page, server, DRIFT)
    page.screenshot(path=str(shots / "exports-alignment.png"), full_page=True)
    banner = _verdict_on_page(page)
    name, data = _download(page, "Report")
    assert name == "alignment_a1_vs_b16_cosine_report.zip"
    z = zipfile.ZipFile(io.BytesIO(data))
    stem = "alignment_a1_vs_b16_cosine"
    assert sorted(z.namelist()) == sorted([f"{stem}.png", f"{stem}.svg", f"{stem}.csv", "verdict.txt", "README.txt"])
    _png_size(z.read(f"{stem}.png"))
    svg = z.read(f"{stem}.svg").decode()
    assert "<svg" in svg[:400] and "Verdict:" in svg and "Numeric drift" in svg
    assert z.read(f"{stem}.csv").decode().startswith("a_run,a_boundary")
    verdict = z.read("verdict.txt").decode()
    assert verdict.splitlines()[0].startswith("Numeric drift growing with depth")
    assert verdict.splitlines()[0][:60] in banner.replace("\n", " "), (verdict, banner)
    readme = z.read("README.txt").decode()
    link = re.search(r"^View: (\S+)$", readme, re.M).group(1)
    assert link.startswith(f"{server}/alignment?"), link
    assert {"a=a1", "b=b16", "metric=cosine"} <= set(link.split("?", 1)[1].split("&")), link
    assert "Numeric drift growing with depth" in readme and f"{stem}.svg" in readme
    page.goto(link)                              # the bundle's link reproduces the view
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', state="attached")
    assert _verdict_on_page(page) == banner


def test_exported_chart_images_carry_the_verdict(page, server: str) -> None:
    open_view(page, server, DRIFT)
    name, svg = _download(page, "SVG")
    assert name == "alignment_a1_vs_b16_cosine.svg"
    text = svg.decode()
    assert "Verdict:" in text and "Numeric drift growing with depth" in text
    assert "mean cosine: A = a1 vs B = b16" in text, "the chart's own title is still there, under the verdict"
    _, png = _download(page, "PNG")
    w, h = _svg_size(svg)
    assert _png_size(png) == (round(2 * w), round(2 * h)), "the PNG is the same figure (scale 2), verdict band included"


def test_bundle_holds_every_chart_of_the_view(page, server: str) -> None:
    """Stats draws two charts (curves, then outlier dimensions further down): both are in the bundle, each as PNG,
    SVG and CSV, although the Report button comes with the first."""
    open_view(page, server, "/stats?runs=a1,b16&stat=mean_norm&run=b16", charts=2)
    name, data = _download(page, "Report")
    files = zipfile.ZipFile(io.BytesIO(data)).namelist()
    stems = sorted({f.rsplit(".", 1)[0] for f in files if f.endswith(".csv")})
    assert len(stems) == 2 and stems[0].startswith("outliers_b16") and stems[1].startswith("stats_"), files
    assert all(f"{s}.{ext}" in files for s in stems for ext in ("png", "svg", "csv")), files
    assert name == f"{stems[1]}_report.zip"
    readme = zipfile.ZipFile(io.BytesIO(data)).read("README.txt").decode()
    assert "runs=a1,b16" in readme and "run=b16" in readme, readme


def test_with_verdict_adds_a_band_and_keeps_the_plot() -> None:
    """exports.with_verdict on a real chart: the verdict band is added above (height and top margin grow by the
    same amount, so the plot keeps its size), the page's figure is left unchanged, markdown is made plain."""
    import plotly.graph_objects as go

    from dashboard import exports

    fig = go.Figure(go.Bar(x=["a", "b"], y=[1, 2]))
    fig.update_layout(height=420, margin=dict(t=70), title=dict(text="Throughput"))
    long = "**Slower**: `spec-random` runs at " + "0.48x of its baseline, " * 12 + "[why](https://x.y/z)."
    out = exports.with_verdict(fig, ["Aligned: `a` and `b`.", long])
    lines = exports.verdict_lines(["Aligned: `a` and `b`.", long])
    assert len(lines) >= 3 and lines[0] == "Aligned: a and b." and "https://" not in " ".join(lines)
    grew = out.layout.height - 420
    assert grew > 0 and out.layout.margin.t - 70 == grew
    assert "<b>Verdict:</b> Aligned: a and b." in out.layout.title.text and out.layout.title.text.endswith("Throughput")
    assert fig.layout.height == 420 and fig.layout.title.text == "Throughput", "the page's figure is unchanged"
    assert exports.with_verdict(fig, []) is fig
    svg = exports.to_image(out, "svg").decode()
    assert "Verdict:" in svg and "spec-random runs at 0.48x" in svg and "Throughput" in svg
