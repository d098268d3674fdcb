"""`python -m backend demo`: the project's own demo data, one capture pair per alignment verdict.

Builds (once, cached under <data>/models/) a small Llama-shaped target with non-unit norm weights and
its rotated copy, then captures and imports:

| pair (A vs B)                         | shows       |
|---------------------------------------|-------------|
| demo-fp32 vs demo-fp32-again          | aligned     |
| demo-fp32 vs demo-after-layer         | offset +1   |
| demo-fp32 vs demo-final-norm          | final_norm  |
| demo-fp32 vs demo-rotated             | rotation    |
| demo-fp32 vs demo-bf16                | drift       |

and, with the toy pair (models/toy-pair.tar.gz, trained on the H200 by `python -m backend.toy.pair --device cuda
--steps-target 400 --steps-drafter 2000 --budget-minutes 8.3`; unpacked under <data>/models/toy-pair), two
speculative-decoding benches on held-out Spec-Bench prompts: the matched drafter and the drafter trained on "after
layer" captures (the speculators <= 0.4 convention) served with vLLM's reading of its ids, each timed against plain
decoding interleaved per prompt (backend/bench.py; the first writes the paired baseline run the others link).

Every bench runs in this one process: a bench timed beside another (the slot-shift benches used to run in a second
process) reads the other's load as its own speed. Drafters benched on the same prompts and settings run in one loop
(backend/bench.py `run_benches`): each unit decodes plain once and then every drafter, so the matched and after-layer
drafters share one plain half per prompt, and so do the three slot-shift drafters. One repeat of the 116 held-out
prompts for the two toy-pair benches: tau needs the 116 (the two toy drafters differ by about 4%); timing noise is
exposed without repeats by the interleaved pairs and each run's noise check (plain decoding's drift over the run in a
shuffled prompt order, the load); a second repeat would add about a minute per bench for a tighter speedup interval
the demo does not need.

A regression pair (the Regression page and `python -m backend regress`): the slot-shift drafter with its fix (ids
only in eagle_config) benched a second time as vLLM 0.24.0 reads it: its V2 runner reads only top-level ids, so it
feeds its default S_2, S_4, S_5 and the fix is lost; on the first REGRESS_LIMIT of the same held-out prompts (one
short bench: the pair is paired over the prompts both decoded). Same drafter, same target, two engine releases'
readings: `regress --baseline demo-bench-slot-shift-fixed --candidate demo-bench-slot-shift-fixed-vllm`.

Then the slot-shift case (issue 15, models/toy-slot-shift.tar.gz, `python -m backend.toy.slot_shift`): a drafter for
the same target trained on speculators <= 0.4 files [embeddings, layer outputs] whose last state was the teacher, so
its fc slots are S_0, S_3, S_5; benched as SGLang feeds it (ids [2, 4, 5] read after layer: S_3, S_5, S_6), with the
"-1 = embeddings" patch (ids [-1, 3, 5]: S_0, S_4, S_6) and with the fix the drafter check names (ids [-1, 2, 4]:
S_0, S_3, S_5), and its drafter check against SGLang with its training files. Its three benches run the first
SLOT_LIMIT (40) held-out prompts, not all 116: the gaps they show (about 0.9 tau between the shifted feed and the
matched or fixed one) are ten times the 4% that needs the 116, and on 40 prompts their paired intervals stay far
above zero (tests/test_slot_shift.py asserts the story's claims on exactly these 40); the story compares every run on
the prompts all its runs decoded. A fresh `make demo` decodes 376 prompts speculatively and 180 plainly (one plain
half per prompt of each loop; bench/demo_bench.py times it).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from backend import links
from backend.config import REPO_ROOT, dashboard_link
from backend.runs.lifecycle import Run
from backend.runs.manifest import StoredManifest
from backend.store.data_root import DataRoot
from backend.store.rundir import COMPLETE
from backend.toy.shipped import PAIR_TARBALL, PROMPTS, heldout_prompts, toy_pair

LIMIT = 40
BENCH_RUNS = ("demo-bench-matched", "demo-bench-after-layer")
BASELINE_RUN = f"{BENCH_RUNS[0]}-baseline"      # the name bench.py gives the paired baseline of the first bench
REPEATS = 1                                     # see the module docstring: tau needs prompts, not repeats
REGRESS_RUN = "demo-bench-slot-shift-fixed-vllm"   # the fixed slot-shift drafter as vLLM 0.24 reads it (regression)
REGRESS_LIMIT = 24                              # its prompts: the first 24 held-out ones (one short bench)
SLOT_LIMIT = 40                                 # the slot-shift benches: the first 40 held-out prompts (docstring)
DEMO_PAIRS = [
    ("demo-fp32", "demo-fp32-again", "aligned"),
    ("demo-fp32", "demo-after-layer", "offset"),
    ("demo-fp32", "demo-final-norm", "final_norm"),
    ("demo-fp32", "demo-rotated", "rotation"),
    ("demo-fp32", "demo-bf16", "drift"),
]


def demo_models(data: DataRoot | None = None, force: bool = False) -> tuple[Path, Path]:
    from backend.toy.rotate import write_rotated
    from backend.toy.target import build_random_target

    models = DataRoot.of(data).paths.models
    target, rotated = models / "demo-target", models / "demo-target-rotated"
    if force or not (target / "config.json").exists():
        shutil.rmtree(target, ignore_errors=True)
        build_random_target(target, n_layers=8, hidden=256, seed=0)
    if force or not (rotated / "config.json").exists():
        shutil.rmtree(rotated, ignore_errors=True)
        write_rotated(target, rotated)
    return target, rotated


def _complete(run_id: str, data: DataRoot) -> bool:
    try:
        rd = data.run_dir(run_id)
        return rd.effective_status() == COMPLETE
    except Exception:
        return False


def _fresh(run_id: str, data: DataRoot, force: bool) -> bool:
    """True when the run must be (re)built; removes a stale or incomplete run directory."""
    if not force and _complete(run_id, data):
        return False
    Run.remove(run_id, data)
    return True


def build_demo(data: DataRoot | None = None, force: bool = False, progress: bool = True,
               limit: int = LIMIT) -> list[str]:
    from backend.capture import CaptureSettings, run_capture
    from backend.importers import import_capture
    from backend.producers import write_training_data

    data = DataRoot.of(data)
    target, rotated = demo_models(data, force)
    made = []

    def capture(run_id: str, model: Path, dtype: str = "fp32") -> None:
        if _fresh(run_id, data, force):
            run_capture(CaptureSettings(model=str(model), prompts=str(PROMPTS), limit=limit, dtype=dtype),
                        name=run_id, data=data, progress=progress)
            made.append(run_id)

    capture("demo-fp32", target)
    capture("demo-fp32-again", target)
    capture("demo-bf16", target, "bf16")
    capture("demo-rotated", rotated)
    files = data.path / "training-data"
    for run_id, fmt, kw in [
        ("demo-after-layer", "speculators", {"capture_rule": "after"}),   # captured after layer a, labelled S_a
        ("demo-final-norm", "vllm-extract", {"teacher": "F"}),          # last state after the final norm
    ]:
        if _fresh(run_id, data, force):
            out = files / run_id
            shutil.rmtree(out, ignore_errors=True)
            write_training_data(target, PROMPTS, fmt, out, limit=limit, **kw)
            import_capture(out, fmt, num_layers=8, name=run_id, data=data)
            made.append(run_id)
    return made


def build_bench_demo(data: DataRoot | None = None, force: bool = False, progress: bool = True, limit: int | None = None,
                     max_new_tokens: int = 48, repeats: int = REPEATS) -> list[str]:
    """The matched drafter and the after-layer drafter on the held-out prompts (all 116 by default: the two drafters
    differ by about 4% in tau, which takes that many prompts to tell apart; K=4, greedy), each interleaved with plain
    decoding; the first writes the paired baseline run (`BASELINE_RUN`), the rest link it."""
    import torch

    from backend.bench import BenchSettings, run_benches

    # a toy target decodes fastest on one thread; two threads collapse when anything else uses a core
    torch.set_num_threads(1)
    data = DataRoot.of(data)
    pair = toy_pair(data)
    if pair is None:
        print(f"no toy pair ({PAIR_TARBALL} missing): skipping the benchmark demo")
        return []
    prompts = heldout_prompts(pair)
    todo = []
    for run_id, drafter in zip(BENCH_RUNS, ("drafter-matched", "drafter-after-layer")):
        if not _fresh(run_id, data, force):
            continue
        if run_id == BENCH_RUNS[0] and force:       # rebuilt with its pairs, not linked to the old one
            Run.remove(BASELINE_RUN, data)
        todo.append((run_id, BenchSettings(target=str(pair / "target"), drafter=str(pair / drafter),
                                           prompts=str(prompts), num_spec_tokens=4, limit=limit,
                                           max_new_tokens=max_new_tokens, repeats=repeats, device="cpu")))
    if not todo:
        return []
    return [r.run_id for r in run_benches([s for _, s in todo], [n for n, _ in todo], data=data, progress=progress)]


CHECK_RUN = "demo-check-after-layer"


def build_check_demo(data: DataRoot | None = None, force: bool = False, progress: bool = True) -> list[str]:
    """The drafter check of the after-layer drafter against vLLM 0.24 (what the Drafter check page opens on)."""
    from backend.check_drafter import CheckSettings, run_check

    data = DataRoot.of(data)
    pair = toy_pair(data)
    if pair is None or not _fresh(CHECK_RUN, data, force):
        return []
    r = run_check(CheckSettings(drafter=str(pair / "drafter-after-layer"), target=str(pair / "target"),
                                device="cpu"), name=CHECK_RUN, data=data, progress=progress)
    return [r.run_id]


SLOT_TARBALL = REPO_ROOT / "models" / "toy-slot-shift.tar.gz"
# run id: (drafter directory under toy-slot-shift/, what SGLang feeds it)
SLOT_RUNS = {"demo-bench-slot-shift": "drafter-slot-shift",                 # ids [2, 4, 5]: S_3, S_5, S_6
             "demo-bench-slot-shift-patched": "drafter-slot-shift-patched",  # ids [-1, 3, 5]: S_0, S_4, S_6
             "demo-bench-slot-shift-fixed": "drafter-slot-shift-fixed"}      # ids [-1, 2, 4]: S_0, S_3, S_5
SLOT_CHECK_RUN = "demo-check-slot-shift"
SLOT_ENGINE = ("sglang", "0.5.15")


def slot_shift_models(data: DataRoot | None = None) -> Path | None:
    """models/toy-slot-shift.tar.gz unpacked once under <data>/models/toy-slot-shift, with the patched and fixed
    copies of the drafter (same weights, other ids in eagle_config); None when the tarball is absent."""
    import tarfile

    from backend.toy.slot_shift import write_variants

    out = DataRoot.of(data).paths.models / "toy-slot-shift"
    if not (out / "drafter-slot-shift" / "config.json").exists():
        if not SLOT_TARBALL.exists():
            return None
        out.mkdir(parents=True, exist_ok=True)
        with tarfile.open(SLOT_TARBALL) as tf:
            tf.extractall(out, filter="data")
    write_variants(out, ("drafter-slot-shift-patched",))     # the user's patch; the fix comes from the check
    return out


def build_slot_shift_demo(data: DataRoot | None = None, force: bool = False, progress: bool = True,
                          limit: int | None = SLOT_LIMIT, max_new_tokens: int = 48, benches: bool = True,
                          check: bool = True) -> list[str]:
    """The slot-shift drafter's check against SGLang 0.5.15 first; its fix written as `check-drafter --write-fix`
    writes it (backend/drafter/fix.py: eagle_config ids [-1, 2, 4], the weights linked); then proved as `check-drafter
    --write-fix OUT --prove` proves it (backend/prove_fix.py `prove`, with the demo's run names): the drafter as
    written and the written fix, with the user's patch between them, benched as SGLang 0.5.15 feeds them on the
    held-out prompts in one loop, each interleaved with plain decoding (linking the matched drafter's paired baseline
    run when it is there). `limit`: the first SLOT_LIMIT held-out prompts by default (None: all 116)."""
    import dataclasses

    import torch

    from backend.bench import BenchSettings, run_bench
    from backend.check_drafter import CheckSettings, run_check
    from backend.drafter.fix import plan_fix, write_fix
    from backend.prove_fix import prove

    torch.set_num_threads(1)
    data = DataRoot.of(data)
    pair, slot = toy_pair(data), slot_shift_models(data)
    if pair is None or slot is None:
        print(f"no slot-shift drafter ({SLOT_TARBALL} missing): skipping the slot-shift demo")
        return []
    prompts = heldout_prompts(pair)
    made: list[str] = []
    report = None
    if check and _fresh(SLOT_CHECK_RUN, data, force):
        r = run_check(CheckSettings(drafter=str(slot / "drafter-slot-shift"), target=str(pair / "target"),
                                    engine=SLOT_ENGINE[0], engine_version=SLOT_ENGINE[1], device="cpu",
                                    training_data=str(slot / "training-data"), training_format="speculators-legacy"),
                      name=SLOT_CHECK_RUN, data=data, progress=progress)
        made.append(r.run_id)
        report = r.report
    fixed = slot / SLOT_RUNS["demo-bench-slot-shift-fixed"]
    stale = [run_id for run_id in SLOT_RUNS if benches and _fresh(run_id, data, force)]
    if stale or (benches and not (fixed / "config.json").exists()):
        if report is None:
            report = (data.catalog.read.drafter_check(SLOT_CHECK_RUN) if _complete(SLOT_CHECK_RUN, data) else
                      run_check(CheckSettings(drafter=str(slot / "drafter-slot-shift"), target=str(pair / "target"),
                                              engine=SLOT_ENGINE[0], engine_version=SLOT_ENGINE[1], device="cpu"),
                                save=False, progress=progress).report)
        # the check's plan, on this data root's copies (a stored check may name another root's)
        plan = dataclasses.replace(plan_fix(report), drafter=str(slot / "drafter-slot-shift"),
                                   target=str(pair / "target"))
        if not (fixed / "config.json").exists():
            write_fix(plan, fixed)
    if stale:                   # the proof pairs all three in one loop: rebuild them together
        for run_id in SLOT_RUNS:
            Run.remove(run_id, data)
        original, patched, fixed_run = SLOT_RUNS
        proof = prove(plan, fixed, str(prompts), limit=limit, repeats=REPEATS, data=data, progress=progress,
                      device="cpu", max_new_tokens=max_new_tokens, num_spec_tokens=4, run_ids=(original, fixed_run),
                      also={patched: slot / SLOT_RUNS[patched]})
        made += [original, patched, fixed_run]
        if progress:
            print("\n".join(["slot-shift proof (as `check-drafter --write-fix --prove`):", *proof.lines()]))
    if benches and _fresh(REGRESS_RUN, data, force):     # the regression pair's second half (module docstring)
        s = BenchSettings(target=str(pair / "target"), drafter=str(fixed), prompts=str(prompts), num_spec_tokens=4,
                          limit=min(limit or REGRESS_LIMIT, REGRESS_LIMIT), max_new_tokens=max_new_tokens,
                          repeats=REPEATS, device="cpu", producer="vllm", producer_version="0.24.0")
        made.append(run_bench(s, name=REGRESS_RUN, data=data, progress=progress).run_id)
    return made


STORY_RUNS = ("demo-bench-matched", *SLOT_RUNS)


@dataclass
class Story:
    """The demo's slot-shift case in figures (dashboard/demo_story.py words it on the Runs page's first screen; the
    demo's log prints `lines()`): tau of each story run over the prompts all of them decoded, the matched-vs-broken
    gap and the fix's gain with their 95% paired intervals, and what the drafter check found."""

    matched: float                     # tau of demo-bench-matched
    broken: float                      # demo-bench-slot-shift: fed S_3, S_5, S_6 by SGLang's reading
    patched: float                     # demo-bench-slot-shift-patched: ids [-1, 3, 5]
    fixed: float                       # demo-bench-slot-shift-fixed: the check's fix, ids [-1, 2, 4]
    gap: tuple[float, float, int] | None       # 95% CI of tau(matched) - tau(broken), prompts
    fix_gain: tuple[float, float, int] | None  # 95% CI of tau(fixed) - tau(broken), prompts
    check: str                         # the drafter check run
    trained_on: list[str] | None       # what it found the drafter was trained on

    def lines(self) -> list[str]:
        """The demo log's plain lines."""
        return [f"matched tau {self.matched:.2f}, slot-shift (fed S_3, S_5, S_6) {self.broken:.2f}, patched "
                f"{self.patched:.2f}, fixed {self.fixed:.2f}",
                f"drafter check {self.check}: trained on {', '.join(self.trained_on or ['?'])}"]


def story(data: DataRoot | None = None) -> Story | None:
    """The demo's slot-shift case from the stored runs; None until the slot-shift benches exist (`make demo`), and
    None rather than an error: the Runs page shows it on top."""
    try:
        return _story(data)
    except Exception:  # noqa: BLE001 - an unreadable catalog must not break the first screen
        return None


def _story(data: DataRoot | None) -> Story | None:
    cat = DataRoot.of(data).catalog.read
    runs = cat.bench_runs(run_ids=list(STORY_RUNS)).set_index("run_id")
    checks = cat.check_manifests()
    if any(r not in runs.index or runs.loc[r, "status"] != COMPLETE for r in STORY_RUNS):
        return None
    from backend.compare import tau_gap

    by_run = {r: g for r, g in cat.bench_prompt_speeds(list(STORY_RUNS)).groupby("run_id")}
    tau = _shared_tau(runs, by_run)
    m, s, p, f = (tau[r] for r in STORY_RUNS)
    chk = SLOT_CHECK_RUN if SLOT_CHECK_RUN in checks else None
    found = StoredManifest.indexed(checks.get(chk)).check if chk else None
    best = found.best if found is not None else None
    return Story(m, s, p, f, tau_gap("demo-bench-matched", "demo-bench-slot-shift", by_run),
                 tau_gap("demo-bench-slot-shift-fixed", "demo-bench-slot-shift", by_run), chk or SLOT_CHECK_RUN,
                 list(best) if best else None)


def _shared_tau(runs, by_run: dict) -> dict[str, float]:
    """Each story run's tau (1 + accepted / drafts) over the prompts all of them decoded (the matched bench runs all
    116 held-out prompts, the slot-shift benches the first SLOT_LIMIT): like against like. The runs' own tau where a
    run has no per-prompt rows."""
    own = {r: float(runs.loc[r, "tau"]) for r in STORY_RUNS}
    if any(r not in by_run or "accepted" not in by_run[r] for r in STORY_RUNS):
        return own
    shared = set.intersection(*(set(by_run[r]["prompt_id"]) for r in STORY_RUNS))
    out = {}
    for r in STORY_RUNS:
        g = by_run[r][by_run[r]["prompt_id"].isin(shared)]
        drafts = float(g["drafts"].sum())
        out[r] = 1.0 + float(g["accepted"].sum()) / drafts if drafts > 0 else own[r]
    return out


def run_demo(force: bool = False, progress: bool = True, data: DataRoot | None = None) -> None:
    import torch

    from backend.align import get_alignment
    from backend.text import align_text

    # one torch thread for the whole demo, captures included: these models are small enough that a second thread
    # buys little alone, and on a 2-core machine with anything else running, two threads wait on each other at every
    # op (a 40-prompt capture took 148 s with two threads and 37 s with one under the same load; docs/PERFORMANCE.md)
    torch.set_num_threads(1)
    data = DataRoot.of(data)
    t0 = time.perf_counter()
    made = build_demo(data, force, progress)
    print(f"demo data ready in {time.perf_counter() - t0:.1f} s ({len(made)} runs built, "
          f"{len(data.run_dirs())} runs in {data.runs})")
    for a, b, _expected in DEMO_PAIRS:
        al = get_alignment(a, b, data)
        kinds = ",".join(f.kind for f in al.verdict)
        print(f"  align {a} {b}: [{kinds}] {align_text.finding_sentence(al.verdict[0])[:110]}")
    t1 = time.perf_counter()
    build_bench_demo(data, force, progress)         # one bench after another, in this process: none times another
    for r in data.catalog.read.bench_runs(run_ids=list(BENCH_RUNS)).itertuples():
        print(f"  bench {r.run_id}: tau {r.tau:.2f}, {r.tokens_per_s:.1f} tok/s, {_speed(r)}, lossless {r.lossless}")
    print(f"benchmark demo ready in {time.perf_counter() - t1:.1f} s; open "
          f"{dashboard_link(links.compare(BENCH_RUNS))}")
    t2 = time.perf_counter()
    if build_check_demo(data, force, progress) or _complete(CHECK_RUN, data):
        print(f"drafter check ready in {time.perf_counter() - t2:.1f} s; open "
              f"{dashboard_link(links.drafter_check(CHECK_RUN))}")
    t3 = time.perf_counter()
    build_slot_shift_demo(data, force, progress)
    for r in data.catalog.read.bench_runs(run_ids=[*SLOT_RUNS, REGRESS_RUN]).itertuples():
        print(f"  bench {r.run_id}: tau {r.tau:.2f}, {_speed(r)}, lossless {r.lossless}")
    fixed_run = "demo-bench-slot-shift-fixed"
    if _complete(REGRESS_RUN, data) and _complete(fixed_run, data):
        from backend.regress import compare as regress

        print("  regress: " + regress(fixed_run, REGRESS_RUN, data=data)["line"])
    print(f"slot-shift demo ready in {time.perf_counter() - t3:.1f} s ({time.perf_counter() - t0:.0f} s in all); "
          f"open {dashboard_link(links.drafter_check(SLOT_CHECK_RUN))}")
    told = story(data)
    for line in told.lines() if told else []:
        print("  " + line)


def _speed(r) -> str:
    """A bench row's speedup for the demo's log: with its interval, or why it is no verdict."""
    if r.speedup is None or r.speedup != r.speedup:
        return "no speedup"
    text = f"speedup {r.speedup:.2f}x [{r.speedup_ci_low:.2f}, {r.speedup_ci_high:.2f}]"
    return text + (f" (no verdict: {r.speed_noise})" if isinstance(r.speed_noise, str) and r.speed_noise else "")
