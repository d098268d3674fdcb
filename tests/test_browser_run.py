"""The run page (/run?id=), the Runs page's "open" links and ticked rows, and the notices for missing or invalid link
parameters, in a real browser: `streamlit run app.py` over the bench runs of tests/conftest.py (build_bench_data:
spec-oracle and spec-random with their paired baseline spec-random-baseline, and the capture cap-tiny), driven by
Playwright with Debian chromium. Table cells are read from the data grid's accessible cells (role=gridcell).
Screenshots go to $SPECLENS_SCREENSHOTS or a pytest tmp dir."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests import test_browser
from tests.test_browser import CHART, CHROMIUM, TIMEOUT_MS, alerts, open_view, streamlit_server

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium at /usr/bin/chromium")

shots = test_browser.shots        # the screenshots folder fixture (SPECLENS_SCREENSHOTS or a temp dir)
page = test_browser.page          # one browser page per module, on this module's `server`
IDLE = '[data-testid="stApp"][data-test-script-state="notRunning"]'
GRID = '[data-testid="stDataFrame"]'


@pytest.fixture(scope="module")
def server(bench_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with streamlit_server(bench_root, tmp_path_factory.mktemp("streamlit-run")) as url:
        yield url


def open_run(page, server: str, path: str, rid: str | None = None) -> None:
    """Open a view, then wait for its run to be over: the run page's title naming `rid` (else any alert) drawn, then
    the app idle again (a fresh page is briefly idle before its first run starts)."""
    open_view(page, server, path, charts=0)
    if rid is not None:
        page.wait_for_function("t => [...document.querySelectorAll('h1')].some(h => h.innerText.trim() === t)",
                               arg=f"Run {rid}")
    else:
        page.locator('[data-testid="stAlert"]').first.wait_for()
    page.wait_for_selector(IDLE, state="attached")


def grid_rows(page, key: str | None = None) -> list[list[str]]:
    """The cells of a st.dataframe, row by row (header left out): the one in the container with this key, else the
    page's first."""
    grid = page.locator(f".st-key-{key} {GRID}" if key else GRID).first
    grid.locator('[role="row"] [role="gridcell"]').first.wait_for(state="attached")
    rows = grid.locator('[role="row"]')
    return [c for c in (rows.nth(i).locator('[role="gridcell"]').all_inner_texts() for i in range(rows.count())) if c]


def links(page) -> dict[str, str]:
    """Page links in the main block: label -> href."""
    out = {}
    for a in page.locator('[data-testid="stPageLink"] a').all():
        out[a.inner_text().strip()] = a.get_attribute("href") or ""
    return out


def captions(page) -> str:
    return "\n".join(page.locator('[data-testid="stCaptionContainer"]').all_inner_texts())


def markdown(page) -> str:
    return "\n".join(page.locator('[data-testid="stMarkdownContainer"]').all_inner_texts())


# ---------------------------------------------------------------------------- the run page


def test_run_page_of_a_bench_run(page, server: str, shots: Path) -> None:
    open_run(page, server, "/run?id=spec-oracle", "spec-oracle")
    assert page.locator("h1").first.inner_text().strip() == "Run spec-oracle"
    body = markdown(page)
    # what the engine fed the drafter: vLLM 0.24's V1 reading of the nested ids [1, 2, 3] on the 4-layer target
    assert "read aux ids [1, 2, 3] from eagle_config and fed the drafter S_1, S_2, S_3" in body
    assert "drafter `drafter-random`".replace("`", "") in body.replace("`", "")
    page.locator('[data-testid="stMetric"]').first.wait_for()   # drawn below the title: later on a loaded machine
    metrics = " ".join(page.locator('[data-testid="stMetric"]').all_inner_texts())
    assert "tau" in metrics and "2.26" in metrics and "speedup over the paired baseline" in metrics
    # the per-prompt table: 4 prompts (2 writing, 1 math, 1 coding), 2 repeats, K = 3 drafted tokens per step
    prompts = grid_rows(page, "run_prompts")
    assert len(prompts) == 4, prompts
    assert sorted(r[2] for r in prompts) == ["coding", "math", "writing", "writing"]
    for r in prompts:
        accepted, drafted, acceptance, tau = int(r[4]), int(r[5]), float(r[6]), float(r[7])
        assert r[3] == "2" and drafted % 3 == 0 and abs(acceptance - accepted / drafted) < 1e-9
        assert abs(tau - (1 + accepted / (drafted / 3))) < 1e-9, r
        assert r[13] == "true", "greedy oracle proposals: outputs equal the baseline's"
    assert "4 of 4 prompts" in captions(page)
    # settings (the manifest flattened) and the run directory's files: closed on a complete run, opened by a click
    assert page.locator(".st-key-run_settings").count() == 0, "sent only once opened"
    page.get_by_text("Settings, files and log").click()
    page.wait_for_url("**details=true**")
    settings = {r[0]: r[1] for r in grid_rows(page, "run_settings")}
    assert settings["engine"] == "hf" and settings["num_spec_tokens"] == "3" and settings["temperature"] == "0.0"
    assert settings["settings.seed"] == "0" and settings["drafter.path"].endswith("drafter-random")
    files = {r[0] for r in grid_rows(page, "run_files")}
    assert {"manifest.json", "prompts.parquet", "steps.parquet", "summary.json"} <= files
    # links to every view that shows it
    ln = links(page)
    assert any("compare?runs=spec-oracle%2Cspec-random-baseline" in h for h in ln.values()), ln
    assert any("feeds?drafter=" in h for h in ln.values()) and any("regression?group=" in h for h in ln.values())
    page.screenshot(path=str(shots / "run-bench.png"), full_page=True)


def test_run_page_filter_from_the_url(page, server: str, shots: Path) -> None:
    open_run(page, server, "/run?id=spec-oracle&category=writing&sort=-tau", "spec-oracle")
    rows = grid_rows(page, "run_prompts")
    assert [r[2] for r in rows] == ["writing", "writing"]
    taus = [float(r[7]) for r in rows]
    assert taus == sorted(taus, reverse=True)
    assert "2 of 4 prompts" in captions(page)
    # the text filter: typed into the box, it goes to the URL, and the URL alone reproduces it
    prompt = rows[0][1]
    page.locator('[data-testid="stPopover"] button').filter(has_text="Prompts:").click()   # the filters' popover
    box = page.locator('[data-testid="stTextInput"] input').first
    box.fill(prompt)
    box.press("Enter")
    page.wait_for_url(f"**q={prompt}**")
    page.wait_for_selector(IDLE, state="attached")
    page.wait_for_function("document.querySelectorAll('.st-key-run_prompts [role=row]').length == 2")
    assert [r[1] for r in grid_rows(page, "run_prompts")] == [prompt]
    url = page.url
    open_run(page, server, url.removeprefix(server), "spec-oracle")
    assert [r[1] for r in grid_rows(page, "run_prompts")] == [prompt] and "1 of 4 prompts" in captions(page)
    page.screenshot(path=str(shots / "run-bench-filtered.png"), full_page=True)


def test_run_page_of_a_capture(page, server: str, shots: Path) -> None:
    open_run(page, server, "/run?id=cap-tiny", "cap-tiny")
    assert page.locator("h1").first.inner_text().strip() == "Run cap-tiny"
    assert "it recorded 6 boundaries (S_0, S_1, S_2, S_3, S_4, F)" in markdown(page)
    metrics = dict([ln for ln in m.splitlines() if ln.strip()][:2]
                   for m in page.locator('[data-testid="stMetric"]').all_inner_texts())
    assert metrics["boundaries"] == "6" and int(metrics["tokens"].replace(",", "")) > 0
    assert [r[0] for r in grid_rows(page, "run_boundaries")] == ["S_0", "S_1", "S_2", "S_3", "S_4", "F"]
    assert page.get_by_text("Per prompt").count() == 0
    ln = links(page)
    assert any("stats?runs=cap-tiny&run=cap-tiny" in h for h in ln.values()), ln
    page.screenshot(path=str(shots / "run-capture.png"), full_page=True)


def test_baseline_run_page_does_not_dead_end(page, server: str) -> None:
    open_run(page, server, "/run?id=spec-random-baseline", "spec-random-baseline")
    assert "Plain decoding (no drafter)" in markdown(page)
    assert len(grid_rows(page, "run_prompts")) == 4
    page.locator('[data-testid="stPageLink"] a').filter(has_text="Compare with the 2 drafter run").click()
    page.wait_for_url("**/compare?runs=**")
    page.wait_for_function(f"document.querySelectorAll('{CHART}').length >= 2", timeout=TIMEOUT_MS)
    assert "Pick at least two" not in alerts(page)


# ---------------------------------------------------------------------------- the Runs page


def test_every_open_link_lands_on_the_run_page(page, server: str) -> None:
    open_view(page, server, "/runs", charts=0)
    rows = grid_rows(page)
    targets = {r[0]: r[1] for r in rows}
    assert set(targets) == {"cap-tiny", "spec-oracle", "spec-random", "spec-random-baseline"}
    assert all(t == f"run?id={rid}" for rid, t in targets.items()), targets
    for rid, target in targets.items():
        open_run(page, server, "/" + target, rid)
        assert page.locator("h1").first.inner_text().strip() == f"Run {rid}"
        # the speed-noise notice is the run's own finding when the fixture bench was timed on a busy machine
        other = [a for a in page.locator('[data-testid="stAlert"]').all_inner_texts()
                 if "No faster/slower verdict from this run's speed figures" not in a]
        assert not other, other
    # a click on an "open" cell (the baseline's row) opens its run page: the row's cells are scanned left to right
    # (the grid draws on a canvas; its column widths are the browser's)
    open_view(page, server, "/runs", charts=0)
    order = [r[0] for r in grid_rows(page)]
    box = page.locator(GRID).first.bounding_box()
    y = box["y"] + 35 + 35 * order.index("spec-random-baseline") + 17
    tab = None
    for dx in range(120, 420, 15):
        try:
            with page.context.expect_page(timeout=1000) as new:
                page.mouse.click(box["x"] + dx, y)
            tab = new.value
            break
        except PlaywrightTimeout:
            continue
    assert tab is not None, "no 'open' cell in the baseline's row opened a page"
    tab.wait_for_selector(IDLE, state="attached")
    assert tab.url.endswith("/run?id=spec-random-baseline"), tab.url
    tab.wait_for_selector("h1")
    assert tab.locator("h1").first.inner_text().strip() == "Run spec-random-baseline"
    tab.close()


def test_ticked_rows_survive_a_reload(page, server: str, shots: Path) -> None:
    open_view(page, server, "/runs?kind=bench", charts=0)
    page.wait_for_selector(f"{GRID} canvas")
    box = page.locator(GRID).first.bounding_box()
    order = [r[0] for r in grid_rows(page)]
    for rid in ("spec-oracle", "spec-random"):            # the row-selection checkboxes (header and rows 35 px)
        page.mouse.click(box["x"] + 16, box["y"] + 35 + 35 * order.index(rid) + 17)
        page.wait_for_selector(IDLE, state="attached")
    def ticks(url: str) -> list[str]:
        return sorted(url.split("ticked=")[1].split("&")[0].replace("%2C", ",").split(",")) if "ticked=" in url else []

    try:                    # the URL follows each tick in its own rerun: wait for the second, not the first
        page.wait_for_url(lambda url: ticks(url) == ["spec-oracle", "spec-random"], timeout=TIMEOUT_MS)
    except PlaywrightTimeout:
        pass
    assert ticks(page.url) == ["spec-oracle", "spec-random"]
    page.get_by_role("link", name="Compare the 2 selected bench runs").wait_for()
    page.reload()                                           # a new session: only the URL carries the ticks
    page.wait_for_selector(IDLE, state="attached")
    page.wait_for_selector(f"{GRID} canvas")
    page.get_by_role("link", name="Compare the 2 selected bench runs").wait_for()
    checked = page.locator(f'{GRID} [role="row"][aria-selected="true"]').count()
    assert checked in (0, 2), checked                      # where the grid exposes it, exactly the two rows
    page.screenshot(path=str(shots / "runs-ticked.png"), full_page=True)
    # and one ticked run: a link to its page
    open_view(page, server, "/runs?ticked=spec-random-baseline", charts=0)
    page.get_by_role("link", name="Open spec-random-baseline").click()
    page.wait_for_url("**/run?id=spec-random-baseline")
    page.wait_for_selector("h1")


# ---------------------------------------------------------------------------- notices for link parameters


def test_missing_run_is_named_and_the_substitute_too(page, server: str, shots: Path) -> None:
    open_run(page, server, "/run?id=ghost-run")
    text = alerts(page).replace("`", "")
    assert "No run ghost-run (from the URL, id)" in text and "nothing is shown in its place" in text
    assert page.locator("h1").count() == 0 or "Run " not in page.locator("h1").first.inner_text(), \
        "no other run's page (and its verdicts) in place of the link's"
    assert "id=ghost-run" in page.url, "the URL keeps what the link asked"
    page.screenshot(path=str(shots / "notice-missing-run.png"), full_page=True)


def test_invalid_parameter_value(page, server: str) -> None:
    open_run(page, server, "/run?id=spec-oracle&sort=worst-first")
    text = alerts(page).replace("`", "")
    assert "sort=worst-first (from the URL) is not one of the choices of “Sort by”" in text
    assert "showing prompt order instead" in text
    assert "sort=worst-first" in page.url, "the URL keeps what the link asked"


def test_pair_of_missing_runs_shows_no_aligned_verdict(page, server: str, shots: Path) -> None:
    """One capture in this catalog: both pickers fall back to it, a run compared with itself. No green banner."""
    open_view(page, server, "/alignment?a=gone&b=gone", charts=1)
    text = alerts(page).replace("`", "")
    assert "No run gone (from the URL, a)" in text and "No run gone (from the URL, b)" in text
    assert "are both cap-tiny" in text and "No verdict" in text
    assert page.locator('[data-testid="stAlertContentSuccess"]').count() == 0
    page.screenshot(path=str(shots / "notice-alignment-pair.png"), full_page=True)


def test_duplicated_id_is_not_compared_with_itself(page, server: str) -> None:
    open_run(page, server, "/compare?runs=spec-oracle,spec-oracle")
    text = alerts(page).replace("`", "")
    assert "runs=spec-oracle,spec-oracle names spec-oracle more than once" in text
    assert "Pick at least two bench runs" in text
    assert page.locator(CHART).count() == 0
    assert "runs=spec-oracle%2Cspec-oracle" in page.url, "the URL keeps what the link asked"


def test_a_100_kb_id_is_cut(page, server: str, shots: Path) -> None:
    """A 50 KB id through the address bar, and a 100 KB one through the app's own navigation (history, as a link
    followed inside the app): this server answers 400 to a request line of 100 KB before any page runs."""
    def check(n: int) -> None:
        notices = page.locator('[data-testid="stAlert"]').all_inner_texts()
        assert notices and len(notices[0]) < 400, [len(t) for t in notices]
        assert "x" * 80 + "…" in notices[0] and "x" * 81 not in notices[0]
        assert "x" * 100 not in page.content(), f"{n} characters: printed beyond the cut"
        assert "id=xxxxxxxx" in page.url, "the URL keeps what the link asked (no other run in its place)"

    open_run(page, server, "/run?id=" + "x" * 50_000)
    check(50_000)
    open_run(page, server, "/run?id=spec-oracle", "spec-oracle")
    page.evaluate("""() => { history.pushState({}, "", "/run?id=" + "x".repeat(100000));
                             window.dispatchEvent(new PopStateEvent("popstate", {state: {}})); }""")
    # wait for the cut id's notice itself: the spec-oracle page's own alerts stay drawn until the rerun replaces them
    page.wait_for_function("[...document.querySelectorAll('[data-testid=stAlert]')]"
                           ".some(a => a.innerText.includes('x'.repeat(80) + '\u2026'))")
    page.wait_for_selector(IDLE, state="attached")
    check(100_000)
    page.screenshot(path=str(shots / "notice-long-id.png"), full_page=False)
