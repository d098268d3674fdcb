"""Chart downloads: a plotly figure (and the DataFrame behind it) as PNG, SVG, standalone HTML and CSV bytes, with
the page's verdict written above the chart in the exported files (`with_verdict`); and a view's report bundle (`Report`,
`bundle`): every chart as PNG and SVG, its data as CSV, the verdict and the view's link in one zip.

PNG and SVG need a Chromium (kaleido). Each kaleido export without a running server starts a browser
(2-3 s), so one kaleido server is started per process on the first image and reused (about 0.2 s per
image after that). Kaleido's sync server is not safe for concurrent callers, hence the lock.
"""

from __future__ import annotations

import html
import io
import re
import textwrap
import threading
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache

import pandas as pd
import plotly.graph_objects as go

FORMATS = ("png", "svg", "html", "csv")
MIME = {"png": "image/png", "svg": "image/svg+xml", "html": "text/html", "csv": "text/csv"}
IMAGE_WIDTH, IMAGE_HEIGHT = 1100, 650
VERDICT_PX = 12                  # font size of the verdict lines in an exported chart
TITLE_PX = 16                    # the chart title's font size under them
LINE_SPACING = 1.3               # plotly's line height in multi-line text, in units of the text's font size

_lock = threading.Lock()


@lru_cache(maxsize=1)
def browser_path() -> str | None:
    """The Chromium kaleido would use ($BROWSER_PATH, PATH, typical paths), or None. Never downloads one."""
    try:
        from choreographer.browsers.chromium import Chromium

        return Chromium.find_browser(skip_local=False)
    except Exception:  # noqa: BLE001 - no browser, or kaleido not installed: images are unavailable
        return None


def images_available() -> bool:
    return browser_path() is not None


def _server_ready() -> bool:
    """Start kaleido's sync server once per process; False when it cannot run (then each call is one-shot)."""
    import kaleido
    from kaleido import _global_server  # the singleton behind start_sync_server

    if _global_server.is_running():
        thread = getattr(_global_server, "_thread", None)
        if thread is not None and thread.is_alive():
            return True
        kaleido.stop_sync_server(silence_warnings=True)   # its browser died: a call would wait forever
    kaleido.start_sync_server(silence_warnings=True)
    return _global_server.is_running()


def to_image(fig: go.Figure, fmt: str, scale: float = 2.0) -> bytes:
    """PNG or SVG bytes of a figure, at the figure's size or IMAGE_WIDTH x IMAGE_HEIGHT."""
    if fmt not in ("png", "svg"):
        raise ValueError(f"image format must be png or svg, not {fmt}")
    if not images_available():
        raise RuntimeError("no Chromium found for image export: install Debian `chromium` or set BROWSER_PATH")
    import kaleido

    opts = {"format": fmt, "width": fig.layout.width or IMAGE_WIDTH, "height": fig.layout.height or IMAGE_HEIGHT,
            "scale": scale if fmt == "png" else 1}
    with _lock, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _server_ready()
        out = kaleido.calc_fig_sync(fig.to_dict(), opts=opts)
    return out if isinstance(out, bytes) else str(out).encode()


def to_html(fig: go.Figure) -> bytes:
    """A standalone HTML page (plotly.js inlined: opens offline)."""
    return fig.to_html(full_html=True, include_plotlyjs=True).encode()


def to_csv(df: pd.DataFrame) -> bytes:
    return df.to_csv(index=False).encode()


def plain(text: str) -> str:
    """A markdown verdict line as plain text: no `code` marks, bold, icons or link targets."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)          # [label](url) -> label
    text = re.sub(r":material/[a-z_]+:", "", text)
    return " ".join(text.replace("**", "").replace("`", "").split())


def verdict_lines(verdict: Sequence[str], width: int = IMAGE_WIDTH) -> list[str]:
    """The verdict as plain lines wrapped to an image `width` pixels wide."""
    chars = max(40, int((width - 40) / (0.5 * VERDICT_PX)))
    return [w for v in verdict for w in textwrap.wrap(plain(v), chars)]


def with_verdict(fig: go.Figure, verdict: Sequence[str]) -> go.Figure:
    """A copy of `fig` with the verdict lines in a band above its title (exported files only; the chart on the page
    is left as it is). The band is added to the top margin and the height, so the plot keeps its size."""
    lines = verdict_lines(verdict, fig.layout.width or IMAGE_WIDTH)
    if not lines:
        return fig
    out = go.Figure(fig)
    top = fig.layout.margin.t if fig.layout.margin.t is not None else 100
    extra = round(LINE_SPACING * TITLE_PX * len(lines)) + 6     # the verdict's lines, in the title's line height
    band = "<br>".join(f"<span style='font-size:{VERDICT_PX}px'>{'<b>Verdict:</b> ' if i == 0 else ''}"
                       f"{html.escape(line, quote=False)}</span>" for i, line in enumerate(lines))
    title = fig.layout.title.text or ""
    height = (fig.layout.height or IMAGE_HEIGHT) + extra
    out.update_layout(
        height=height, margin=dict(t=top + extra),
        title=dict(text=band + ("<br>" + title if title else ""), font=dict(size=TITLE_PX), x=0.01, xanchor="left",
                   xref="container", y=1 - 12 / height, yanchor="top", yref="container"))
    return out


def export(fig: go.Figure, df: pd.DataFrame, fmt: str, verdict: Sequence[str] = ()) -> bytes:
    """Bytes of one download format; PNG, SVG and HTML carry the verdict lines above the chart."""
    if fmt == "csv":
        return to_csv(df)
    fig = with_verdict(fig, verdict)
    if fmt == "html":
        return to_html(fig)
    return to_image(fig, fmt)


# ---------------------------------------------------------------------------- report bundle

@dataclass
class Report:
    """What one view shows, gathered while its page runs (dashboard.ui): the verdict lines, every chart with the data
    behind it (by file stem, in page order) and the view's link."""

    verdict: list[str] = field(default_factory=list)
    charts: dict[str, tuple[go.Figure, pd.DataFrame]] = field(default_factory=dict)
    link: str = ""

    def note_verdict(self, text: str) -> None:
        if text and text not in self.verdict:
            self.verdict.append(text)


def readme(report: Report, files: Sequence[str], images: bool) -> str:
    """README.txt of a bundle: the link, the verdict, what each file is."""
    verdict = "\n".join(plain(v) for v in report.verdict) or "(this view states no verdict)"
    kinds = "PNG and SVG (the verdict above each chart), CSV (the data behind it)" if images else \
        "CSV (the data behind it); PNG/SVG left out: no Chromium on the server for image export"
    return (f"SpecLens report\n\nView: {report.link or '(link unknown)'}\n"
            "(open it on the same dashboard to see this view again)\n\n"
            f"Verdict:\n{verdict}\n\nCharts: {kinds}\n" + "".join(f"  {f}\n" for f in files)
            + f"\nMade {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.\n")


def bundle(report: Report) -> bytes:
    """The report bundle of a view as zip bytes: per chart `<stem>.png`, `<stem>.svg` and `<stem>.csv`, then
    verdict.txt (the verdict lines and the link) and README.txt."""
    images = images_available()
    buf, files = io.BytesIO(), []
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for stem, (fig, df) in list(report.charts.items()):
            for fmt in ("png", "svg", "csv") if images else ("csv",):
                z.writestr(f"{stem}.{fmt}", export(fig, df, fmt, report.verdict))
                files.append(f"{stem}.{fmt}")
        z.writestr("verdict.txt", "\n".join(plain(v) for v in report.verdict) + f"\n\n{report.link}\n")
        z.writestr("README.txt", readme(report, files, images))
    return buf.getvalue()
