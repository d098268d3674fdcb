"""Issue 20 ("every page tells the truth at a glance"), items 2, 4, 7 and 8, in a real browser over the demo data:
the `demo_root` captures plus the demo's own benches and checks built by backend/demo.py's code on fewer prompts
(the matched and after-layer drafters on 24 held-out prompts: eight Spec-Bench categories of 2 prompts and
translation of 8; the slot-shift drafter's check and its benches as SGLang 0.5.15 feeds it, on 8), and two
`check-drafter --lint-only` runs against a config-only target `t`, as a team's own checks leave them.

- Item 1 on the run page, the Runs row and `runs`: a wrong feed is as loud as what it costs (dashboard/severity.py):
  the after-layer bench (fed S_2, S_4, S_5; its check, `demo-check-after-layer` here on 6 prompts, predicts a tau a
  few % below the trained set's) reads a note, the slot-shift bench (about 50% lower) an error.
- Item 2: the slot-shift run's problems travel with it: its page opens on the drafter check's finding (fed S_3, S_5,
  S_6, trained on S_0, S_3, S_5), says HF reproduced SGLang 0.5.15's reading, draws its charts, shows the prompts'
  text, and writes the finding into its exported charts; its Runs row and `runs --json` carry it too.
- Item 4: Compare's per-category figures over fewer than metrics.MIN_INTERVAL_PROMPTS prompts have no interval.
- Item 7: Runs hides lint-only checks (?lint=shown brings them back) with tau and speedup next to the id; `runs` in
  text mode prints the headline figures; check-drafter prints its link on the configured address (SPECLENS_URL).
- Item 8: README's first screen: what SpecLens answers, the check-drafter command (lint-only, then full), the demo.
Screenshots go to $SPECLENS_SCREENSHOTS or a pytest tmp dir."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.config import REPO_ROOT
from backend.store.data_root import DataRoot
from tests import test_browser
from tests.test_browser import CHART, CHROMIUM, TIMEOUT_MS, alerts, open_view, streamlit_server
from tests.test_browser_run import GRID, captions, grid_rows, markdown, open_run

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium at /usr/bin/chromium")

shots = test_browser.shots
page = test_browser.page
LINT_RUNS = ("lint-t-matched", "lint-t-after-layer")
SLOT = "demo-bench-slot-shift"
AFTER = "demo-bench-after-layer"
AFTER_CHECK = "demo-check-after-layer"


@pytest.fixture(scope="module")
def truth_root(demo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the demo data with the demo's benches, the after-layer and slot-shift checks and two lint-only
    checks."""
    from backend.check_drafter import CheckSettings, run_check
    from backend.demo import CHECK_RUN, build_bench_demo, build_slot_shift_demo, heldout_prompts, toy_pair

    root = tmp_path_factory.mktemp("truth-a") / "data"
    shutil.copytree(demo_root, root, ignore=shutil.ignore_patterns("speclens.duckdb*"))
    build_bench_demo(DataRoot(root), progress=False, limit=24, max_new_tokens=16)
    build_slot_shift_demo(DataRoot(root), progress=False, limit=8, max_new_tokens=16)
    pair = toy_pair(DataRoot(root))
    run_check(CheckSettings(drafter=str(pair / "drafter-after-layer"), target=str(pair / "target"), device="cpu",
                            num_prompts=6, new_tokens=32, prompts=str(heldout_prompts(pair))), name=CHECK_RUN,
              data=DataRoot(root), progress=False)          # the demo's after-layer check, beside its bench
    t = root / "models" / "t"                   # a config-only target, as a team lints against
    t.mkdir()
    shutil.copy(pair / "target" / "config.json", t / "config.json")
    for rid, drafter in zip(LINT_RUNS, ("drafter-matched", "drafter-after-layer")):
        run_check(CheckSettings(drafter=str(pair / drafter), target=str(t), lint_only=True), name=rid,
                  data=DataRoot(root), progress=False)
    DataRoot(root).catalog.write.refresh()
    return root


@pytest.fixture(scope="module")
def server(truth_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with streamlit_server(truth_root, tmp_path_factory.mktemp("streamlit-truth-a")) as url:
        yield url


def cli(root: Path, *args: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run([sys.executable, "-m", "backend", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                         env={**os.environ, "SPECLENS_DATA": str(root), **(env or {})}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def row_of(rows: list[list[str]], rid: str) -> str:
    found = [r for r in rows if r and r[0] == rid]
    assert found, (rid, [r[0] for r in rows])
    return " | ".join(found[0])


# ---------------------------------------------------------------------------- item 1 on the run page


def finding_banner(page, i: int = 0) -> tuple[str, str]:
    """(Info | Warning | Error | Success, text) of the run page's i-th finding banner."""
    box = page.locator(f".st-key-run_finding_{i}")
    box.wait_for()
    kind = box.locator('[data-testid^="stAlertContent"]').first.get_attribute("data-testid") or ""
    text = box.locator('[data-testid="stMarkdownContainer"]').first.inner_text()      # without the icon's name
    return kind.removeprefix("stAlertContent"), text


def test_item1_a_wrong_feed_is_as_loud_as_it_costs(page, server: str, truth_root: Path, shots: Path) -> None:
    """The after-layer bench was fed S_2, S_4, S_5, its drafter trained on S_3, S_5, S_6: a mismatch whose predicted
    cost is a few % of tau, a note on the Drafter check page, so a note on its run page too; the slot-shift bench
    (about 50%) stays an error. Both name the check and the size."""
    check = DataRoot(truth_root).catalog.read.drafter_check(AFTER_CHECK)
    assert check["best_candidate"]["boundaries"] == ["S_3", "S_5", "S_6"]
    open_run(page, server, f"/run?id={AFTER}", AFTER)
    page.screenshot(path=str(shots / "truth-a-run-after-layer.png"), full_page=True)
    kind, text = finding_banner(page)
    assert kind == "Info" and text.startswith("Note"), (kind, text)
    assert "S_2, S_4, S_5" in text and "S_3, S_5, S_6" in text and AFTER_CHECK in text, text
    assert "predicted tau" in text and "% lower" in text, text
    assert not page.locator('.st-key-run_finding_0 [data-testid="stAlertContentError"]').count()
    open_run(page, server, f"/run?id={SLOT}", SLOT)
    kind, text = finding_banner(page)
    assert kind == "Error" and text.startswith("Error"), (kind, text)
    assert "predicted tau" in text and "demo-check-slot-shift" in text, text


def test_item1_runs_row_and_runs_text_grade_it_the_same(page, server: str, truth_root: Path) -> None:
    open_view(page, server, "/runs?kind=bench", charts=0)
    page.wait_for_selector(f"{GRID} canvas")
    rows = grid_rows(page)
    after, slot = row_of(rows, AFTER), row_of(rows, SLOT)
    assert "note: wrong feed: S_2,S_4,S_5, trained on S_3,S_5,S_6" in after, after
    assert "error: wrong feed: S_3,S_5,S_6, trained on S_0,S_3,S_5" in slot, slot
    text = cli(truth_root, "runs")
    line = next(x for x in text.splitlines() if x.startswith(AFTER + " "))
    assert "note: wrong feed" in line and "error" not in line, line
    runs = {r["run_id"]: r for r in json.loads(cli(truth_root, "runs", "--json"))}
    assert runs[AFTER]["finding"].startswith("note: wrong feed"), runs[AFTER]["finding"]
    assert runs[SLOT]["finding"].startswith("error: wrong feed"), runs[SLOT]["finding"]


# ---------------------------------------------------------------------------- item 2


def test_item2_the_broken_run_carries_its_finding_everywhere(page, server: str, truth_root: Path,
                                                             shots: Path) -> None:
    open_run(page, server, f"/run?id={SLOT}", SLOT)
    page.wait_for_function(f"document.querySelectorAll('{CHART}').length >= 3", timeout=TIMEOUT_MS)
    page.screenshot(path=str(shots / "truth-a-run-slot-shift.png"), full_page=True)
    finding = page.locator(".st-key-run_finding_0").inner_text()
    assert "Fed the wrong boundaries" in finding, finding
    assert "S_3, S_5, S_6" in finding and "S_0, S_3, S_5" in finding and "demo-check-slot-shift" in finding
    assert "every slot shifted" in finding, "the same words as Compare (compare.drafter_mismatches)"
    body = markdown(page)
    assert "engine hf transformers" in body and "reproducing SGLang 0.5.15's reading" in body, body[:600]
    assert "HF transformers reproduced SGLang 0.5.15's reading" in body          # the feed line says it too
    titles = " ".join(t or "" for t in page.locator(f"{CHART} .gtitle").all_text_contents())
    for title in ("Accepted draft tokens per verify step", "Per-position acceptance rate", "Tokens/s per prompt"):
        assert title in titles, titles
    # the per-prompt table: the prompt's text (from the prompts file the bench read), not only its id
    first = json.loads((truth_root / "models" / "toy-pair" / "heldout.jsonl").read_text().splitlines()[0])
    rows = grid_rows(page, "run_prompts")
    assert any(first["turns"][0][:40] in " ".join(r) for r in rows), rows[:2]
    # exports: the chart files carry the finding above the chart
    button = page.locator('[data-testid="stDownloadButton"] button').filter(has_text="HTML").first
    with page.expect_download(timeout=TIMEOUT_MS) as dl:
        button.click()
    html = Path(dl.value.path()).read_text()
    assert "Fed the wrong boundaries" in html and "demo-check-slot-shift" in html
    # a fixed run of the same drafter is fed what it was trained on: no finding, the HF note only
    open_run(page, server, "/run?id=demo-bench-slot-shift-fixed", "demo-bench-slot-shift-fixed")
    assert not page.locator(".st-key-run_finding_0").count()
    assert "reproducing SGLang 0.5.15's reading" in markdown(page)


def test_item2_runs_row_and_runs_json_carry_it(page, server: str, truth_root: Path, shots: Path) -> None:
    open_view(page, server, "/runs?kind=bench", charts=0)
    page.wait_for_selector(f"{GRID} canvas")
    page.screenshot(path=str(shots / "truth-a-runs-bench.png"), full_page=True)
    rows = grid_rows(page)
    slot = row_of(rows, SLOT)
    assert "wrong feed: S_3,S_5,S_6, trained on S_0,S_3,S_5 (demo-check-slot-shift)" in slot, slot
    assert "SGLang 0.5.15's reading on HF" in slot
    assert "wrong feed" not in row_of(rows, "demo-bench-slot-shift-fixed")
    assert "vLLM 0.24.0's reading on HF" in row_of(rows, "demo-bench-matched")
    runs = {r["run_id"]: r for r in json.loads(cli(truth_root, "runs", "--json"))}
    assert "wrong feed" in runs[SLOT]["finding"] and "SGLang 0.5.15's reading on HF" in runs[SLOT]["finding"]
    assert not runs["demo-bench-slot-shift-fixed"]["finding"].startswith("wrong feed")


def test_item2_findings_from_five_keys_equal_findings_from_whole_manifests(truth_root: Path) -> None:
    """The Runs page and `runs` read only the keys findings need (catalog.read.run_manifest_keys, issue 24 item 2:
    a whole manifest per run cost 1.2 s of the page on 10,000 runs); the findings are the same as from the whole
    manifests, on data that holds both kinds."""
    from backend import findings

    cat = DataRoot(truth_root).catalog.read
    ids = cat.bench_runs()["run_id"].tolist()
    checks = cat.check_manifests()
    few = findings.findings(cat.run_manifest_keys(ids, findings.MANIFEST_KEYS, findings.NEEDS), checks)
    whole = findings.findings(cat.run_manifests(ids), checks)
    text = {r: findings.finding_text(f) for r, f in whole.items()}
    assert {r: findings.finding_text(f) for r, f in few.items()} == text
    assert any("wrong feed" in t for t in text.values()) and any("reading on HF" in t for t in text.values())
    keys = cat.run_manifest_keys(ids, findings.MANIFEST_KEYS, findings.NEEDS)
    assert keys and all(set(m) <= set(findings.MANIFEST_KEYS) and isinstance(m.get("aux"), dict) for m in keys.values())


# ---------------------------------------------------------------------------- item 4


def test_item4_no_interval_over_two_prompts(page, server: str, truth_root: Path, shots: Path) -> None:
    from backend import metrics
    from backend.compare import compare

    cats = compare(["demo-bench-matched", "demo-bench-after-layer"], data=DataRoot(truth_root)).categories
    small, big = cats[cats["prompts"] < metrics.MIN_INTERVAL_PROMPTS], cats[cats["prompts"] >= 5]
    assert len(small) >= 8 and set(small["prompts"]) == {2} and set(big["category"]) == {"translation"}
    assert small[["tau_ci_low", "tau_ci_high", "speedup_ci_low", "speedup_ci_high"]].isna().all().all()
    assert big[["tau_ci_low", "tau_ci_high", "speedup_ci_low", "speedup_ci_high"]].notna().all().all()
    open_view(page, server, "/compare?runs=demo-bench-matched,demo-bench-after-layer&view=Per+category", charts=1)
    page.wait_for_selector(f"{GRID} canvas")                # the tab's one table: categories x runs
    page.screenshot(path=str(shots / "truth-a-compare-categories.png"), full_page=True)
    rows = {r[0]: r for r in grid_rows(page)}
    assert "none: 2 prompts (< 5)" in rows["writing"] and "none: 2 prompts (< 5)" in rows["roleplay"], rows["writing"]
    assert any(c.startswith("[") and c.endswith("]") for c in rows["translation"]), rows["translation"]
    title = page.locator(f"{CHART} .gtitle").first.text_content() or ""
    assert "none under 5 prompts" in title, title


# ---------------------------------------------------------------------------- item 7


def test_item7_runs_first_screen(page, server: str, truth_root: Path, shots: Path) -> None:
    open_view(page, server, "/runs", charts=0)
    page.wait_for_selector(f"{GRID} canvas")
    page.screenshot(path=str(shots / "truth-a-runs.png"))        # the first screen only
    ids = [r[0] for r in grid_rows(page)]
    assert not set(LINT_RUNS) & set(ids), "lint-only checks are hidden by default"
    assert SLOT in ids and "demo-check-slot-shift" in ids, "a full check stays"
    assert "2 lint-only drafter checks hidden" in captions(page)
    headers = page.locator(f"{GRID} [role='columnheader']").all_inner_texts()
    assert headers.index("tau") <= 5 and headers.index("speedup") <= 6, headers   # next to the id, not off-screen
    open_view(page, server, "/runs?lint=shown", charts=0)
    page.wait_for_selector(f"{GRID} canvas")
    assert set(LINT_RUNS) <= {r[0] for r in grid_rows(page)}, "the filter brings them back"
    open_view(page, server, "/runs?lint=bogus", charts=0)
    assert "lint=bogus" in alerts(page), "an unknown value gets its notice"


def test_item7_names_are_sized_to_show_whole() -> None:
    import pandas as pd

    from dashboard import charts

    name = "AngelSlim/Qwen3-1.7B_eagle3"
    assert charts.text_width(pd.Series([name, None, "t"])) >= 7 * len(name)
    assert charts.text_width(pd.Series(["x" * 400])) == 320


def test_item7_cli_runs_text_and_links(truth_root: Path) -> None:
    text = cli(truth_root, "runs")
    head, *lines = text.splitlines()
    assert "n_boundaries" not in head and "figures" in head and "finding" in head
    slot = next(line for line in lines if line.startswith(SLOT + " "))
    assert "tau " in slot and "speedup " in slot and "x [" in slot and "wrong feed" in slot, slot
    base = next(line for line in lines if line.startswith("demo-bench-matched-baseline "))
    assert "plain decoding" in base and "tokens/s" in base
    lint = next(line for line in lines if line.startswith(LINT_RUNS[0] + " "))
    assert "lint only" in lint
    pair = truth_root / "models" / "toy-pair"
    out = cli(truth_root, "check-drafter", "--drafter", str(pair / "drafter-matched"), "--target",
              str(truth_root / "models" / "t"), "--lint-only", "--name", "lint-link",
              env={"SPECLENS_URL": "http://gpu-node.example:8622/"})
    assert "http://gpu-node.example:8622/drafter?run=lint-link" in out and "8501" not in out, out[-400:]


# ---------------------------------------------------------------------------- item 8


def test_item8_readme_first_screen() -> None:
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    first = "\n".join(lines[:30])              # a first screen: the title, what it answers, the command, the demo
    assert "SpecLens answers" in first
    lint = first.find("check-drafter --drafter DRAFTER_DIR --target TARGET_DIR --lint-only")
    full = first.find("check-drafter --drafter DRAFTER_DIR --target TARGET_DIR [--engine")
    demo = first.find("make demo")
    assert 0 < lint < full < demo, (lint, full, demo)
    assert lines.index("## Set-up: two commands") < 40, "the rest of the README follows"
