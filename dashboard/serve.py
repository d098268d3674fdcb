"""`python -m dashboard.serve [streamlit options]`: the dashboard server (what `make serve`, `make demo` and the
container run).

It is `streamlit run app.py` in this process (in st.navigation mode from the first visitor on, see main), after
importing the libraries every page needs (pandas, DuckDB,
pyarrow, plotly, the backend modules) and bringing the catalog up to date. Streamlit runs page scripts in the
server's process, so the first visitor after a restart no longer pays about 0.6 s of imports and a catalog
refresh inside the first render (docs/PERFORMANCE.md, "first render after server start").

The page shell (Streamlit's index.html) is served with a few lines more (page_shell): Streamlit fetches the code
that draws a chart (Plotly, 4.7 MB) or a table only when the first one arrives, and evaluating Plotly's takes about
0.8 s on a 2-core machine, so a page waited for it after its script had run. The shell starts that code for the
opened view's first screen (backend/links.py `Page.first`) while the app connects and the page script runs, on a
main thread that is idle then (docs/PERFORMANCE.md, "Pages: the page shell starts the chart code"), all of it at
once. On a view's own URL (/run?id=X) it also tells Streamlit where the server is, which Streamlit otherwise finds by
asking /run/_stcore/health first and retrying at / 100 ms after the 404 (docs/PERFORMANCE.md, "Pages: no probe").

Server options come from `.streamlit/config.toml` next to app.py (Streamlit reads it whatever the working directory):
the viewer's toolbar (no Deploy button) and no usage statistics; flags given here override them. With the favicon
served from dashboard/assets/, a page makes no request beyond this server (tests/test_browser_offline.py).
"""

from __future__ import annotations

import atexit
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app.py"
PRELOAD = ("duckdb", "pandas", "pyarrow", "plotly.graph_objects", "backend.annotations", "dashboard.charts",
           "backend.compare", "dashboard.exports", "dashboard.ui", "backend.store.catalog")


def preload(refresh: bool = True) -> float:
    """Import what pages import, and refresh the catalog once; seconds taken."""
    import importlib

    t = time.perf_counter()
    for mod in PRELOAD:
        importlib.import_module(mod)
    from backend.store.data_root import DataRoot

    if refresh:
        try:
            DataRoot().catalog.write.refresh()
        except Exception as e:  # a broken data root is the pages' to report, not the server's to die of
            print(f"speclens: catalog not refreshed at start ({e})", file=sys.stderr)
    return time.perf_counter() - t


# what Streamlit's frontend names the lazily loaded code of each kind of element a page's first screen draws
CHUNKS = {"chart": "PlotlyChart", "table": "Table", "grid": "DataFrame", "metric": "Metric"}
_SHELL_ANCHOR = '<link rel="stylesheet"'
_SHELL_JS = """<script>
      /* SpecLens (dashboard/serve.py): load the code this view's first screen draws while the page script runs */
      (() => {
        const first = %(first)s, files = %(files)s;
        const parts = location.pathname.replace(/\\/+$/, "").split("/"), view = parts.pop();
        window.speclensFirst = (first[view] || first[%(landing)s]).map((kind) => "./static/js/" + files[kind]);
        /* a view's own URL (/run?id=X): the server is at the path above it. Said here, Streamlit connects at once
           instead of first probing /run/_stcore/health, waiting for its 404 and retrying 100 ms later */
        if (view in first && !window.__streamlit) {
          window.__streamlit = {BACKEND_BASE_URL: location.origin + (parts.join("/") || "/")};
        }
        for (const href of window.speclensFirst) {
          const link = document.createElement("link");
          Object.assign(link, {rel: "modulepreload", crossOrigin: "anonymous", href});
          document.head.appendChild(link);
        }
      })();
    </script>
    <script type="module">
      await Promise.all(window.speclensFirst.map((href) => import(href).catch(() => {})));
    </script>
    """


def page_shell(html: str, js_dir: Path) -> str | None:
    """Streamlit's index.html with the lines that load the opened view's first-screen code early; None when this
    Streamlit release lacks a chunk named in CHUNKS or the anchor (the shell is then served as it is)."""
    from backend.links import PAGES
    from dashboard.page_registry import LANDING

    files = {}
    for kind, chunk in CHUNKS.items():
        found = sorted(js_dir.glob(f"{chunk}.*.js"))
        if len(found) != 1:
            return None
        files[kind] = found[0].name
    if _SHELL_ANCHOR not in html:
        return None
    js = _SHELL_JS % {"first": json.dumps({v: list(p.first) for v, p in PAGES.items()}),
                      "files": json.dumps(files), "landing": json.dumps(LANDING)}
    return html.replace(_SHELL_ANCHOR, js + _SHELL_ANCHOR, 1)


def serve_page_shell() -> str | None:
    """Make Streamlit serve page_shell's index.html: a folder of links to its static files beside the new shell,
    which Streamlit's static route then serves from. The folder made, or None where the shell stays as it is."""
    from streamlit import file_util

    src = Path(file_util.get_static_dir())
    html = page_shell((src / "index.html").read_text(), src / "static" / "js")
    if html is None:
        print("speclens: this Streamlit's page shell is served unchanged (first-screen code loads on demand)",
              file=sys.stderr)
        return None
    dst = Path(tempfile.mkdtemp(prefix="speclens-static-"))
    atexit.register(shutil.rmtree, dst, True)                    # links and one file: gone with the server
    for entry in src.iterdir():
        if entry.name != "index.html":
            (dst / entry.name).symlink_to(entry)
    (dst / "index.html").write_text(html)
    file_util.get_static_dir = lambda: str(dst)
    return str(dst)


def main(argv: list[str] | None = None) -> None:
    from streamlit.runtime.pages_manager import PagesManager
    from streamlit.web import cli

    # app.py routes with st.navigation. Without this, a fresh server whose first visitor deep-links to /compare or
    # /runs runs pages/compare.py as a legacy `pages/` page (no navigation bar, no page config) and keeps every
    # later session in that mode until someone opens a URL that runs app.py (streamlit sets this flag only then).
    PagesManager.uses_pages_directory = False

    serve_page_shell()
    took = preload()
    print(f"speclens: libraries and catalog ready in {took:.2f} s", file=sys.stderr)
    sys.argv = ["streamlit", "run", str(APP), *(sys.argv[1:] if argv is None else argv)]
    cli.main()


if __name__ == "__main__":
    main()
