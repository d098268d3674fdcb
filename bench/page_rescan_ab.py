"""The run page's server time with the rescan of the run its link names against the full rescan of every run directory,
in one AppTest process, the two interleaved (the page as `python -m dashboard.serve` serves it: preloaded, in
navigation mode, the component scan done once).

    SPECLENS_DATA=/tmp/pages10k python bench/page_rescan_ab.py pages/run.py id=bench-00002-d14 [--rounds 8]

Prints the median and every round's seconds per variant.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from streamlit.runtime.pages_manager import PagesManager  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

_pm_init = PagesManager.__init__


def _navigation_mode(self, *a, **kw):
    _pm_init(self, *a, **kw)
    PagesManager.uses_pages_directory = False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("page")
    ap.add_argument("params", nargs="*", help="query parameters, NAME=VALUE")
    ap.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args()
    PagesManager.__init__ = _navigation_mode
    from streamlit.components.v2.component_manager import BidiComponentManager

    from dashboard import ui
    from dashboard.serve import preload
    preload()
    components = BidiComponentManager()
    components.discover_and_register_components(start_file_watching=False)
    variants = {"named runs": ui.rescan_named, "every run": lambda *params: ui.rescan()}
    params = dict(x.split("=", 1) for x in a.params)

    def once() -> float:
        at = AppTest.from_file(str(REPO / "app.py"), default_timeout=300)
        at._bidi_component_manager = components
        for k, v in params.items():
            at.query_params[k] = v
        at.switch_page(a.page)
        t = time.perf_counter()
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        return time.perf_counter() - t

    once()
    once()
    res: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(a.rounds):
        for name, fn in variants.items():
            ui.rescan_named = fn
            res[name].append(once())
    for name, v in res.items():
        print(f"{name:12s} median {statistics.median(v):.3f} s  {[round(x, 3) for x in v]}")


if __name__ == "__main__":
    main()
