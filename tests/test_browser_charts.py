"""Issue 14 items 3-5 in a real browser (Debian chromium through Playwright, a real `streamlit` server, a real DuckDB
catalog): the alignment heatmaps' fixed colour scales, the Drafter check charts (axes from zero, re-ranked by the
chosen metric, no "None" cell, a filled problem column) and the Stats difference mode (verdict line, gaps where a
capture lacks a boundary, x by depth). Figures are read from the page's plotly graph divs. Data: the dashboard
captures of tests/conftest.py (a1, a2 identical fp32, b16 bf16) copied, plus a capture of a rotated copy of the same
target, a sparse bf16 capture (S_0, S_3, S_6, F) and a drafter check of the shipped after-layer toy drafter.
Screenshots go to $SPECLENS_SCREENSHOTS."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.demo import PAIR_TARBALL
from backend.store.data_root import DataRoot
from tests import test_browser
from tests.conftest import PROMPTS
from tests.test_browser import CHART, CHROMIUM, alerts, choose, open_view, streamlit_server

pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium at /usr/bin/chromium"),
              pytest.mark.usefixtures("one_torch_thread")]

SPARSE = ["S_0", "S_3", "S_6", "F"]
CHECK = "chk-after"


def build_chart_data(root: Path, dash_root: Path) -> Path:
    """dash_root's runs and catalog copied to `root`, then: `rot1` (a capture of a rotated copy of dash_root's toy
    target), `sparse16` (bf16, only SPARSE), and, when the toy pair ships, the drafter check `chk-after`."""
    from backend.capture import CaptureSettings, run_capture
    from backend.toy.rotate import write_rotated

    shutil.copytree(dash_root / "runs", root / "runs")
    model = dash_root / "models" / "toy"
    rotated = write_rotated(model, root / "models" / "toy-rotated")
    run_capture(CaptureSettings(model=str(rotated), prompts=str(PROMPTS), limit=12, device="cpu"), name="rot1",
                data=DataRoot(root), progress=False)
    run_capture(CaptureSettings(model=str(model), prompts=str(PROMPTS), limit=12, device="cpu", dtype="bf16",
                                boundaries=SPARSE), name="sparse16", data=DataRoot(root), progress=False)
    if PAIR_TARBALL.exists():
        from backend.check_drafter import CheckSettings, run_check
        from backend.demo import heldout_prompts, toy_pair

        pair = toy_pair(DataRoot(root))
        run_check(CheckSettings(drafter=str(pair / "drafter-after-layer"), target=str(pair / "target"), device="cpu",
                                num_prompts=4, new_tokens=24, prompts=str(heldout_prompts(pair))), name=CHECK,
                  data=DataRoot(root), progress=False)
    DataRoot(root).catalog.write.refresh()
    return root


@pytest.fixture(scope="module")
def chart_root(dash_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chart_data(tmp_path_factory.mktemp("charts-data") / "data", dash_root)


@pytest.fixture(scope="module")
def server(chart_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with streamlit_server(chart_root, tmp_path_factory.mktemp("streamlit")) as url:
        yield url


shots = test_browser.shots        # the screenshots folder fixture (SPECLENS_SCREENSHOTS or a temp dir)
page = test_browser.page          # one browser page per module, on this module's `server`


def figures(page) -> list[dict]:
    """Every plotly figure on the page as plotly.js holds it (data and layout of each graph div)."""
    return page.evaluate("""() => [...document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')]
        .map(g => JSON.parse(JSON.stringify({data: g.data, layout: g.layout},
                                            (k, v) => ArrayBuffer.isView(v) ? Array.from(v) : v)))""")


def values(v) -> list:
    """A figure array as a (nested) list: plotly sends numpy arrays as {dtype, bdata (base64), shape}."""
    if isinstance(v, dict) and "bdata" in v:
        import base64

        import numpy as np

        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"])
        shape = v.get("shape")
        if shape:
            a = a.reshape([int(n) for n in str(shape).split(",")])
        return a.tolist()
    return v


def heatmap(page) -> dict:
    hm = next(t for t in figures(page)[0]["data"] if t["type"] == "heatmap")
    return {**hm, "z": values(hm["z"]), "customdata": values(hm.get("customdata"))}


def table_cells(page, i: int) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the i-th st.dataframe, from the grid's accessible table."""
    grid = page.locator('[data-testid="stDataFrame"]').nth(i)
    grid.locator("thead th").first.wait_for(state="attached", timeout=30_000)    # the grid fills in after it mounts
    head = grid.locator("thead th").all_text_contents()
    cells = grid.locator("tbody td").all_text_contents()
    return head, [cells[k:k + len(head)] for k in range(0, len(cells), len(head))]


# ---------------------------------------------------------------------------- alignment colour scales

def test_alignment_colour_scale_is_fixed_for_every_pair(page, server: str, shots: Path) -> None:
    scales = {}
    for b in ("a2", "rot1"):
        open_view(page, server, f"/alignment?a=a1&b={b}&metric=cosine")
        hm = heatmap(page)
        scales[b] = (hm["zmin"], hm["zmax"], json.dumps(hm["colorscale"]))
        assert "fixed scale -1 to 1" in hm["colorbar"]["title"]["text"]
        assert "fixed scale from -1" in page.locator('[data-testid="stCaptionContainer"]').first.inner_text()
        page.screenshot(path=str(shots / f"charts-alignment-cosine-{b}.png"), full_page=True)
        if b == "rot1":      # the rotated pair's cosines are near 0: the scale is not stretched over them
            vals = [abs(v) for row in hm["customdata"] for v in row if v == v]
            assert max(vals) < 0.05
    assert scales["a2"] == scales["rot1"]
    assert scales["a2"][:2] == (-1, 1)


def test_alignment_rel_l2_scale_is_fixed_and_shows_bf16_drift(page, server: str, shots: Path) -> None:
    diag = {}
    for b in ("a2", "b16"):
        open_view(page, server, f"/alignment?a=a1&b={b}&metric=rel_l2")
        hm = heatmap(page)
        assert (hm["zmin"], hm["zmax"]) == (-4, 1)
        assert hm["colorbar"]["ticktext"][0].endswith("0.0001") and hm["colorbar"]["ticktext"][-1].endswith("10")
        diag[b] = [hm["z"][i][i] for i in range(len(hm["z"]))]
        page.screenshot(path=str(shots / f"charts-alignment-rel_l2-{b}.png"), full_page=True)
    assert all(z == -4 for z in diag["a2"]), diag["a2"]                   # identical captures: the floor colour
    # bf16 rounding: same-name rel L2 between 1e-3 and 1e-1, well clear of the floor (1e-4) and of unrelated (~1)
    assert all(-3.0 <= z <= -1.0 for z in diag["b16"]), diag["b16"]


def test_alignment_cka_scale_is_0_to_1(page, server: str) -> None:
    open_view(page, server, "/alignment?a=a1&b=rot1&metric=cka")
    hm = heatmap(page)
    assert (hm["zmin"], hm["zmax"]) == (0, 1)


# ---------------------------------------------------------------------------- drafter check

def _stored_check(chart_root: Path) -> dict:
    return json.loads((chart_root / "runs" / CHECK / "check.json").read_text())


def _expected_order(rep: dict, metric: str, lower: bool) -> list[str]:
    cands = [c for c in rep["candidates"] if c[metric] is not None]
    return [", ".join(c["boundaries"]) for c in sorted(cands, key=lambda c: c[metric] if lower else -c[metric])]


def _bars(page) -> tuple[list[str], list]:
    # the bars are the page's first chart; on a loaded machine a later chart can draw before it
    page.wait_for_function("""() => { const c = document.querySelector('[data-testid="stPlotlyChart"]');
                                      return c && c.querySelector('.js-plotly-plot .main-svg'); }""")
    fig = figures(page)[0]
    bars = fig["data"][0]
    return bars["y"], fig["layout"]["xaxis"]["range"]


@pytest.mark.skipif(not PAIR_TARBALL.exists(), reason="needs the toy pair (models/toy-pair.tar.gz)")
def test_drafter_check_axes_from_zero_and_rank_by_metric(page, server: str, chart_root: Path, shots: Path) -> None:
    rep = _stored_check(chart_root)
    by_acc, by_ce = _expected_order(rep, "step1_accuracy", False), _expected_order(rep, "cross_entropy", True)
    assert by_acc != by_ce, "the check's data must rank differently by accuracy and by cross-entropy"

    open_view(page, server, f"/drafter?run={CHECK}&metric=step1_accuracy", charts=2)
    y, rng = _bars(page)
    assert y == by_acc and rng == [0, 1]
    page.screenshot(path=str(shots / "charts-drafter-accuracy.png"), full_page=True)

    choose(page, "Rank chart by", "cross-entropy vs the target (nats, mean over steps)")
    page.wait_for_url("**metric=cross_entropy**")
    page.wait_for_function(f"document.querySelectorAll('{CHART}').length >= 2")
    page.wait_for_function("() => { const g = document.querySelector('.js-plotly-plot');"
                           " return g && g.layout.xaxis.title.text.startsWith('cross-entropy'); }")
    y, rng = _bars(page)
    assert y == by_ce and rng[0] == 0 and rng[1] >= max(c["cross_entropy"] for c in rep["candidates"])
    head, rows = table_cells(page, 1)          # the candidates table keeps the check's order (by cross-entropy)
    assert [r[head.index("boundaries")] for r in rows] == [", ".join(c["boundaries"]) for c in rep["candidates"]][
        :len(rows)]

    open_view(page, server, f"/drafter?run={CHECK}&metric=tau", charts=2)
    y, rng = _bars(page)
    assert y == _expected_order(rep, "tau", False) and rng[0] == 0


@pytest.mark.skipif(not PAIR_TARBALL.exists(), reason="needs the toy pair (models/toy-pair.tar.gz)")
def test_drafter_check_tables_have_no_none_and_a_filled_problem_column(page, server: str, chart_root: Path,
                                                                        shots: Path) -> None:
    rep = _stored_check(chart_root)
    open_view(page, server, f"/drafter?run={CHECK}&metric=cross_entropy", charts=2)
    lint_head, lint_rows = table_cells(page, 0)
    head, rows = table_cells(page, 1)
    assert rows and lint_rows
    for r in [*lint_rows, *rows]:    # the grid's DOM holds a missing value as an empty cell (drawn as "None")
        assert all(cell.strip() for cell in r) and "None" not in r and "nan" not in r, r
    for h, rs in ((lint_head, lint_rows), (head, rows)):
        assert all(r[h.index("problem")].strip() for r in rs), rs
    best = rows[0]
    assert best[head.index("boundaries")] == ", ".join(rep["best_candidate"]["boundaries"])
    assert best[head.index("problem")].startswith("none: the best fit")
    assert best[head.index("z vs best")].startswith("\u2014")
    fed = ", ".join(rep["engine_feeds"]["boundaries"])
    fed_row = next(r for r in rows if r[head.index("boundaries")] == fed)
    assert fed_row[head.index("problem")].startswith(f"what {rep['engine_feeds']['name']} feeds: cross-entropy +")
    focus = next(r for r in lint_rows if r[lint_head.index("engine")] == rep["engine_feeds"]["name"])
    assert f"not the trained {', '.join(rep['best_candidate']['boundaries'])}" in focus[lint_head.index("problem")]
    page.screenshot(path=str(shots / "charts-drafter-tables.png"), full_page=True)


# ---------------------------------------------------------------------------- statistics

def _trace(fig: dict, name: str) -> dict:
    return next(t for t in fig["data"] if t.get("name") == name)


def test_stats_x_is_depth_and_a_sparse_capture_has_gaps(page, server: str, shots: Path) -> None:
    open_view(page, server, "/stats?runs=a1,sparse16&stat=mean_norm", charts=2)
    fig = figures(page)[0]
    assert _trace(fig, "a1")["x"] == list(range(10))                  # S_0..S_8 at 0..8, F after S_8 at 9
    assert _trace(fig, "sparse16")["x"] == [0, None, 3, None, 6, None, 9]
    axis = fig["layout"]["xaxis"]
    assert axis["type"] == "linear" and dict(zip(axis["ticktext"], axis["tickvals"]))["F"] == 9
    page.screenshot(path=str(shots / "charts-stats-values.png"), full_page=True)


def test_stats_difference_mode_verdict_and_gaps(page, server: str, shots: Path) -> None:
    open_view(page, server, "/stats?runs=b16,sparse16&stat=mean_norm&mode=rel&ref=a1", charts=2)
    text = alerts(page)
    line = next(s for s in text.splitlines() if s.startswith("Largest change: mean token L2 norm"))
    assert "vs a1)" in line and "elsewhere within" in line and "sparse16: S_1, S_2" in line
    fig = figures(page)[0]
    b16, sparse = _trace(fig, "b16 - a1"), _trace(fig, "sparse16 - a1")
    assert sparse["x"] == [0, None, 3, None, 6, None, 9] and len(b16["x"]) == 10
    # the verdict names the largest |relative difference| drawn, at its boundary
    pts = [(abs(y), c[0], t["name"]) for t in (b16, sparse) for y, c in zip(t["y"], t["customdata"]) if y is not None]
    top = max(pts)
    assert f"at {top[1]} ({top[2].split(' - ')[0]} vs a1)" in line
    assert "a1" in page.url and "mode=rel" in page.url
    page.screenshot(path=str(shots / "charts-stats-rel.png"), full_page=True)

    open_view(page, server, "/stats?runs=a1,a2&stat=mean_norm&mode=diff&ref=a1", charts=2)
    assert "No change: mean token L2 norm is identical at all 10 boundaries compared (a2 vs a1)" in alerts(page)
