"""Chart downloads: a plotly figure (and the DataFrame behind it) as PNG, SVG, standalone HTML and CSV bytes.

PNG and SVG need a Chromium (kaleido). Each kaleido export without a running server starts a browser
(2-3 s), so one kaleido server is started per process on the first image and reused (about 0.2 s per
image after that). Kaleido's sync server is not safe for concurrent callers, hence the lock.
"""

from __future__ import annotations

import threading
import warnings
from functools import lru_cache

import pandas as pd
import plotly.graph_objects as go

FORMATS = ("png", "svg", "html", "csv")
MIME = {"png": "image/png", "svg": "image/svg+xml", "html": "text/html", "csv": "text/csv"}
IMAGE_WIDTH, IMAGE_HEIGHT = 1100, 650

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


def export(fig: go.Figure, df: pd.DataFrame, fmt: str) -> bytes:
    """Bytes of one download format."""
    if fmt == "csv":
        return to_csv(df)
    if fmt == "html":
        return to_html(fig)
    return to_image(fig, fmt)
