"""`python -m dashboard.serve [streamlit options]`: the dashboard server (what `make serve`, `make demo` and the
container run).

It is `streamlit run app.py` in this process (in st.navigation mode from the first visitor on, see main), after
importing the libraries every page needs (pandas, DuckDB,
pyarrow, plotly, the backend modules) and bringing the catalog up to date. Streamlit runs page scripts in the
server's process, so the first visitor after a restart no longer pays about 0.6 s of imports and a catalog
refresh inside the first render (docs/PERFORMANCE.md, "first render after server start").

Server options come from `.streamlit/config.toml` next to app.py (Streamlit reads it whatever the working directory):
the viewer's toolbar (no Deploy button) and no usage statistics; flags given here override them. With the favicon
served from dashboard/assets/, a page makes no request beyond this server (tests/test_browser_offline.py).
"""

from __future__ import annotations

import sys
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


def main(argv: list[str] | None = None) -> None:
    from streamlit.runtime.pages_manager import PagesManager
    from streamlit.web import cli

    # app.py routes with st.navigation. Without this, a fresh server whose first visitor deep-links to /compare or
    # /runs runs pages/compare.py as a legacy `pages/` page (no navigation bar, no page config) and keeps every
    # later session in that mode until someone opens a URL that runs app.py (streamlit sets this flag only then).
    PagesManager.uses_pages_directory = False

    took = preload()
    print(f"speclens: libraries and catalog ready in {took:.2f} s", file=sys.stderr)
    sys.argv = ["streamlit", "run", str(APP), *(sys.argv[1:] if argv is None else argv)]
    cli.main()


if __name__ == "__main__":
    main()
