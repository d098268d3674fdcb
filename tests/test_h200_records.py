"""What SGLang 0.5.17 and vLLM 0.25.1 fed on the H200 (2026-12-01, docs/results/sglang_0.5.17_h200.json and
docs/results/vllm_toy_0.25.1_h200.json, read from the running engines) against what the conventions table predicts
for those releases through `backend.feeds.matrix` (what `python -m backend feeds` prints). The drafter and target
configs are rebuilt here the way the suites built them on the GPU; a table row that said otherwise fails here."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

from backend import coords, feeds

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
SGL = json.loads((RESULTS / "sglang_0.5.17_h200.json").read_text())
VLLM = json.loads((RESULTS / "vllm_toy_0.25.1_h200.json").read_text())
sys.path.insert(0, str(REPO / "gpu"))
import runner_check  # noqa: E402  (the shrunken real targets and the drafter-config shrinking, as on the GPU)
import sglang_suite  # noqa: E402


def _row(m: dict, engine: str, release: str, runner: str | None) -> dict:
    return next(r for r in m["rows"] if (r["engine"], r["release"], r["runner"]) == (engine, release, runner))


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    """The shipped toy pair's configs (no weights: feeds reads configs only)."""
    d = tmp_path_factory.mktemp("toy")
    with tarfile.open(REPO / "models" / "toy-pair.tar.gz") as tf:
        for m in tf:
            if m.name.endswith("config.json") and m.name.split("/")[0] in ("target", *sglang_suite.DRAFTERS):
                tf.extract(m, d, filter="data")
    return d


def _real_case(tmp: Path, case: str) -> tuple[Path, Path, dict]:
    tname, cfile, ids = sglang_suite.REAL_CASES[case]
    tcfg = {**runner_check.TARGETS, **sglang_suite.REAL_TARGETS}[tname]
    t, d = tmp / case / "target", tmp / case / "drafter"
    t.mkdir(parents=True)
    d.mkdir()
    (t / "config.json").write_text(json.dumps(tcfg))
    raw = json.loads((runner_check.CONFIGS / cfile).read_text())
    raw.update(hidden_size=tcfg["hidden_size"], intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
               head_dim=64, vocab_size=tcfg["vocab_size"], draft_vocab_size=1024)
    if ids is not None:
        raw.pop("eagle_aux_hidden_state_layer_ids", None)
        raw["eagle_config"] = {**(raw.get("eagle_config") or {}), "eagle_aux_hidden_state_layer_ids": ids,
                               "use_aux_hidden_state": True}
    (d / "config.json").write_text(json.dumps(raw))
    return d, t, tcfg


def _logs(name: str, key=lambda member: member) -> dict[str, str]:
    """The text of every file in docs/results/NAME (a tarball of a GPU run's logs), by key(member name)."""
    with tarfile.open(RESULTS / name) as tf:
        return {key(m.name): io.TextIOWrapper(tf.extractfile(m)).read() for m in tf.getmembers() if m.isfile()}


def _killed_then_resumed_equal(t: dict, gpu_free_s: float) -> None:
    """A fault-suite trial killed mid-capture: shown interrupted and never complete, nothing outliving the kill, its
    GPU memory free within gpu_free_s, the resume complete and equal to the reference."""
    assert t["killed"] and t["status_after_kill"]["catalog"] == {t["name"]: "interrupted"}
    assert t["interrupted_ok"] and t["never_complete_while_unfinished"] and t["resumed_ok"]
    assert t["resume"]["exit"] == 0 and t["equal"] is True and t["differences"] == []
    assert t["outlived_kill"] == [] and t["gpu_after_kill"]["freed"] and t["gpu_after_kill"]["seconds"] <= gpu_free_s


def test_the_records_are_the_releases_named() -> None:
    assert SGL["env"]["sglang"] == "0.5.17" and SGL["env"]["gpu"] == "NVIDIA H200" and SGL["date"] == "2026-12-01"
    assert VLLM["env"]["vllm"] == "0.25.1" and VLLM["env"]["gpu"] == "NVIDIA H200"
    assert set(SGL["real"]) == set(sglang_suite.REAL_CASES)          # every real-config case ran once
    assert all(c["release"] == "0.5.17" for c in SGL["real"].values())


@pytest.mark.parametrize("case", sorted(sglang_suite.REAL_CASES))
def test_sglang_0517_real_configs_match_the_table(case: str, tmp_path: Path, data_root) -> None:
    rec = SGL["real"][case]
    d, t, tcfg = _real_case(tmp_path, case)
    assert rec["target_config"] == tcfg                                # the record is of this case
    fed = [f"S_{i}" for i in sorted(set(rec["layers_to_capture"]))]
    m = feeds.matrix(d, t, look_up_check=False)
    assert _row(m, "sglang", "0.5.17", None)["feeds"] == fed, case


def test_sglang_0517_toy_drafters_match_the_table(toy: Path, data_root) -> None:
    ran = 0
    for drafter in sglang_suite.DRAFTERS:
        aux = SGL["toy"]["experiments"][f"bench/sglang/{drafter}"]["aux"]
        fed = [f"S_{i}" for i in sorted(set(aux["engine_ids"]))]
        m = feeds.matrix(toy / drafter, toy / "target", look_up_check=False)
        assert _row(m, "sglang", "0.5.17", None)["feeds"] == fed, drafter
        ran += 1
    assert ran == 2


def test_the_gpt_oss_record_tells_0517_from_0516(tmp_path: Path, data_root) -> None:
    """The GPT-OSS case is one the releases disagree on: 0.5.16's table row (+1 always) cannot serve ids [1, 11, 24]
    on 24 layers, 0.5.17's (no +1 when max(ids) == N) feeds S_1, S_11, S_24, which is what ran."""
    d, t, _ = _real_case(tmp_path, "gptoss24_nested_1_11_24")
    m = feeds.matrix(d, t, look_up_check=False)
    assert _row(m, "sglang", "0.5.16", None)["feeds"] is None
    assert _row(m, "sglang", "0.5.17", None)["feeds"] == ["S_1", "S_11", "S_24"] \
        == [f"S_{i}" for i in SGL["real"]["gptoss24_nested_1_11_24"]["layers_to_capture"]]
    # and the DeepSeek case with ids not starting at 1: no +1 from 0.5.13 on, +1 before
    d, t, _ = _real_case(tmp_path, "deepseekv3_61_nested_3_30_58")
    m = feeds.matrix(d, t, look_up_check=False)
    assert _row(m, "sglang", "0.5.12", None)["feeds"] == ["S_4", "S_31", "S_59"]
    assert _row(m, "sglang", "0.5.17", None)["feeds"] == ["S_3", "S_30", "S_58"]


def test_vllm_0251_toy_drafters_match_the_table(toy: Path, tmp_path: Path, data_root) -> None:
    run = VLLM["run"]
    for step, drafter in (("bench_vllm_matched", "drafter-matched"), ("bench_vllm_after_layer", "drafter-after-layer")):
        aux = run[step]["aux"]
        m = feeds.matrix(toy / drafter, toy / "target", look_up_check=False)
        row = _row(m, "vllm", "0.25.1", aux["runner"])
        assert row["picked"] and aux["runner"] == "v2"                    # 0.25.1 picks V2 for the Llama toy
        assert row["feeds"] == [f"S_{i}" for i in aux["engine_ids"]], step
    nested = tmp_path / "drafter-nested-1-3-6"                          # as gpu/vllm_suite.py makes it
    nested.mkdir()
    cfg = json.loads((toy / "drafter-matched" / "config.json").read_text())
    cfg.pop("eagle_aux_hidden_state_layer_ids", None)
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 3, 6], "use_aux_hidden_state": True}
    (nested / "config.json").write_text(json.dumps(cfg))
    m = feeds.matrix(nested, toy / "target", look_up_check=False)
    for step, runner in (("nested_v2", "v2"), ("nested_v1", "v1")):
        aux = run[step]["aux"]
        assert aux["runner"] == runner
        assert _row(m, "vllm", "0.25.1", runner)["feeds"] == [f"S_{i}" for i in aux["engine_ids"]], step
    assert run["nested_v2"]["aux"]["engine_ids"] != run["nested_v1"]["aux"]["engine_ids"]   # V2 ignored the nested ids


def test_the_table_says_seen_for_what_ran_only() -> None:
    rows = {(c.producer, c.versions, tuple(c.families)): c for c in coords.conventions()}
    for fams in (("*",), ("deepseek_v2", "deepseek_v3", "kimi_k2"), ("gpt_oss",)):
        c = rows[("sglang", ">=0.5.17,<0.5.18", fams)]
        assert c.status == "seen" and "sglang_0.5.17_h200.json" in c.seen and "2026-12-01" in c.seen
    assert rows[("sglang", ">=0.5.17,<0.5.18", ("glm4_moe_lite",))].status == "inferred"    # not run
    assert rows[("sglang", ">=0.5.16,<0.5.17", ("*",))].status == "inferred"
    assert "vllm_toy_0.25.1_h200.json" in rows[("vllm", ">=0.25,<0.26", ("*",))].seen


def test_the_dflash_drafter_through_vllm_alone_reads_what_the_table_says(toy: Path) -> None:
    """The toy DFlash drafter as trained, through vLLM 0.24.0 alone on the GPU node (2026-12-06, an H100,
    docs/results/dflash_vllm_alone_h100.json): the aux layers read from the running engine are what the table
    predicts for its dflash_config.target_layer_ids on that release, and the bench is lossless."""
    rec = json.loads((RESULTS / "dflash_vllm_alone_h100.json").read_text())
    run = rec["runs"]["dflash-vllm-original-alone"]
    assert run["status"] == "complete" and run["engine_version"] == "vllm 0.24.0"
    aux = run["aux"]
    m = feeds.matrix(REPO / "tests" / "data" / "dflash_toy", toy / "target", look_up_check=False)
    row = _row(m, "vllm", "0.24.0", aux["runner"])
    assert row["feeds"] == [f"S_{i}" for i in aux["engine_ids"]] == aux["predicted"] == ["S_1", "S_4", "S_7"]
    assert run["bench"]["lossless"] and 1.2 < run["bench"]["tau"] < 1.4


def test_the_gpu_kill_trials_say_what_reliability_md_says() -> None:
    """docs/RELIABILITY.md's 2026-12-06 GPU kill -9 rows against the suite's own records."""
    def trial(name: str, step: str) -> dict:
        rec = json.loads((RESULTS / f"fault_suite_h100_2026-12-06_{name}.json").read_text())
        return rec["steps"][step]["trials"][0]

    cap, load, reaped = trial("vllm", "vllm-capture"), trial("vllm", "vllm-load"), trial("vllm_reaper", "vllm-load")
    sgl = trial("sglang", "sglang-capture")
    for t in (cap, load, reaped, sgl):
        assert t["killed"] and t["interrupted_ok"] and t["never_complete_while_unfinished"]
    assert cap["resumed_ok"] and cap["equal"] is False and all(d.startswith("stats.") for d in cap["differences"])
    assert sgl["resumed_ok"] and sgl["equal"] is True and sgl["gpu_after_kill"]["freed"]
    assert load["resumed_ok"] and load["equal"] is True and load["figures"]["tau_max_abs_difference"] == 0.0
    engine_cores = [p for p in load["outlived_kill"] if "EngineCore" in p.get("cmd", "")]
    assert len(engine_cores) == 2 and not load["gpu_after_kill"]["freed"]            # before the reaper
    assert not any("EngineCore" in p.get("cmd", "") for p in reaped["outlived_kill"])  # with it: reapers only
    assert all("pgid = int(sys.argv[1])" in p["cmd"] for p in reaped["outlived_kill"])
    assert reaped["gpu_after_kill"]["freed"] and reaped["gpu_after_kill"]["seconds"] < 1


def test_the_sglang_bench_kill_trial_and_its_control_say_what_reliability_md_says() -> None:
    """The SGLang bench kill -9 of 2026-12-06 13:41 UTC: shown interrupted, resumed to complete, GPU freed, nothing
    outlived the kill; the resumed run differs from its reference in two prompts, while a second uninterrupted run
    (the control, recorded prompts tables beside it) equals the reference in every prompt."""
    import pandas as pd

    rec = json.loads((RESULTS / "fault_suite_h100_2026-12-06_sglang_bench.json").read_text())
    t = rec["steps"]["sglang-bench"]["trials"][0]
    assert t["killed"] and t["kill"]["done"] == 7 and t["kill"]["total"] == 24
    assert t["interrupted_ok"] and t["never_complete_while_unfinished"] and t["resumed_ok"]
    assert t["outlived_kill"] == [] and t["gpu_after_kill"]["freed"] and t["gpu_after_kill"]["seconds"] < 1
    assert t["equal"] is False and t["figures"]["tau"]["reference"] > t["figures"]["tau"]["resumed"]
    rec_dir = REPO / "tests" / "data" / "recorded" / "sglang_bench_resume"
    cols = ["prompt_index", "output_tokens", "accepted", "drafts", "output_hash"]
    ref, ref2, resumed = (pd.read_parquet(rec_dir / f"{n}.prompts.parquet")[cols].set_index("prompt_index").sort_index()
                          for n in ("ref-sglang-ben", "ref2-sglang-ben", "kill-sglang-ben-134108-0"))
    assert ref.equals(ref2)                                              # the engine repeats itself from a fresh start
    differ = (ref != resumed).any(axis=1)
    assert sorted(differ[differ].index) == [19, 21]                     # after the resume point only
    order = pd.read_parquet(rec_dir / "kill-sglang-ben-134108-0.prompts.parquet").set_index("prompt_index")
    order = order["unit_order"]
    assert (order[[19, 21]] >= t["kill"]["done"]).all()


def test_the_one_pass_statistics_records_say_what_performance_md_says() -> None:
    """Issue 24 item 3 on the H100 (2026-12-06 19:00-19:24 UTC): the one-pass update against the compiled statistics
    (bench/stats_update_bench.py) and three vLLM speed-suite runs, as docs/PERFORMANCE.md quotes them."""
    su = json.loads((RESULTS / "stats_update_h100.json").read_text())
    for key in ("boundaries_4", "boundaries_33"):
        r = su[key]
        assert r["one_pass"]["ms_per_update"] < 0.55 * r["compiled"]["ms_per_update"]
        assert r["one_pass"]["peak_extra_mib"] < 8 < r["compiled"]["peak_extra_mib"]
        agree = r["agreement"]
        assert agree["max_abs_equal"] and agree["norm_hist_equal"]      # the bf16 rounding of hidden + residual
        assert agree["moments_max_rel_diff"] < 1e-5 and agree["scalars_max_rel_diff"] < 1e-6
    runs = json.loads((RESULTS / "vllm_speed_h100_2026-12-06_one_pass.json").read_text())["runs"]
    ratio = {(n, s): r[s]["ratio_vs_compiled"] for n, r in runs.items() for s in r if s.startswith("capture_")}
    assert ratio[("run1_chain", "capture_all_33")] == 1.0187
    assert ratio[("run1_chain", "capture_all_33_compiled_stats")] == 1.0467     # the path before, same engine
    assert ratio[("run1_chain", "capture_eagle_set_compiled_stats")] == 1.0124
    assert ratio[("run2", "capture_eagle_set")] == 1.0037 and ratio[("run2", "capture_all_33")] == 1.0204
    assert ratio[("run3_two_pass_warmup", "capture_eagle_set")] == 1.0109          # over the 1.01 bar
    assert ratio[("run3_two_pass_warmup", "capture_all_33")] == 1.0228
    run3 = runs["run3_two_pass_warmup"]
    assert max(run3["capture_eagle_set"]["seconds"]) < 1.02 * run3["capture_eagle_set"]["median_s"]   # no compile
    assert run3["plain_prefill_eager"]["ratio_vs_compiled"] == 1.0078
    assert all(r[s]["tokens_seen_by_hooks"] == r[s]["tokens_expected"] for r in runs.values() for s in r
               if s.startswith("capture_"))


def test_the_planned_sample_kill_trial_says_what_reliability_md_says() -> None:
    """The vLLM capture kill of 2026-12-06 19:07 UTC under VLLM_BATCH_INVARIANT=1, with the sample chosen by prompt
    and the one-pass kernel: interrupted, resumed, GPU free; only the sums' last bits differ (no sample, extreme or
    quantile column)."""
    rec = json.loads((RESULTS / "fault_suite_h100_2026-12-06_vllm_capture_planned.json").read_text())
    t = rec["steps"]["vllm-capture"]["trials"][0]
    assert t["killed"] and t["interrupted_ok"] and t["never_complete_while_unfinished"] and t["resumed_ok"]
    assert t["kill"]["done"] == 128 and t["outlived_kill"] == [] and t["gpu_after_kill"]["freed"]
    assert t["equal"] is False
    cols = {d.split(":")[0] for d in t["differences"]}
    assert cols == {"stats.mean_norm", "stats.std_norm", "stats.rms", "stats.mean_abs_mean", "stats.kurtosis",
                    "stats.max_dim_kurtosis", "stats.outlier_ratio"}


def test_the_h200_records_of_the_evening_say_what_the_docs_say() -> None:
    """The H200 chain of 2026-12-06 22:03-22:25 UTC: the alignment bench (item 1), two speed runs (item 3), the
    exact sums' cost and batching check, and the two kill trials (item 5), as PERFORMANCE.md and RELIABILITY.md
    quote them."""
    al = json.loads((RESULTS / "align_33x33_h200_staged.json").read_text())
    assert al["gpu"] == "NVIDIA H200" and al["seconds_total_best"] == 0.158 <= 0.3
    assert al["cka_exact"] and al["staged_copy_equal"] and al["verdict"] == ["aligned"]
    runs = json.loads((RESULTS / "vllm_speed_h200_2026-12-06_one_pass.json").read_text())["runs"]
    assert all("H200" in str(r["env"]["gpu"]) for r in runs.values())
    r1, r2 = runs["run1_chain"], runs["run2"]
    assert r1["capture_all_33"]["ratio_vs_compiled"] == 1.0238 and r2["capture_all_33"]["ratio_vs_compiled"] == 1.0229
    assert r1["capture_eagle_set"]["ratio_vs_compiled"] == 1.0109 > 1.01                 # the bar missed, by 0.09%
    assert r1["plain_prefill_eager"]["ratio_vs_compiled"] == 1.0085                     # most of it: the eager engine
    assert r1["capture_eagle_set"]["median_s"] / r1["plain_prefill_eager"]["median_s"] < 1.003
    assert all(r[s]["tokens_seen_by_hooks"] == r[s]["tokens_expected"] for r in runs.values() for s in r
               if s.startswith("capture_"))
    ex = json.loads((RESULTS / "stats_update_exact_h200.json").read_text())
    assert ex["gpu"] == "NVIDIA H200" and ex["exact_other_batching_bit_equal"] is True
    assert ex["exact"]["ms_per_update"] == 3.9043 and ex["one_pass"]["ms_per_update"] == 0.2434
    assert ex["exact_agreement"]["max_abs_max_rel_diff"] == 0.0 and ex["exact_agreement"]["var_max_rel_diff"] < 1e-7
    for name, step, done in (("vllm_capture_exact", "vllm-capture", 128), ("sglang_bench_deterministic",
                                                                           "sglang-bench", 3)):
        rec = json.loads((RESULTS / f"fault_suite_h200_2026-12-06_{name}.json").read_text())
        assert "H200" in rec["env"]["gpu"][0]
        t = rec["steps"][step]["trials"][0]
        assert t["killed"] and t["kill"]["done"] == done
        assert t["interrupted_ok"] and t["never_complete_while_unfinished"] and t["resumed_ok"]
        assert t["equal"] is True and not t["differences"]
        assert t["outlived_kill"] == [] and t["gpu_after_kill"]["freed"] and t["gpu_after_kill"]["seconds"] < 1
    cap = json.loads((RESULTS / "fault_suite_h200_2026-12-06_vllm_capture_exact.json").read_text())
    assert "--exact-sums" in cap["env"]["command"]
    sgl = json.loads((RESULTS / "fault_suite_h200_2026-12-06_sglang_bench_deterministic.json").read_text())
    assert "enable-deterministic-inference" in str(sgl["args"]["sglang_option"])


def test_the_h100_records_of_2026_12_07_say_what_the_docs_say() -> None:
    """Issue 24 items 3 and 5 on an H100 (2026-12-07 03:47-04:05 UTC): the capture in vLLM's compiled engine with the
    statistics kernels' fixed constants, twice (and on two more H100s later that day), and the SGLang serving-load
    sweep killed and resumed, as PERFORMANCE.md and RELIABILITY.md quote them."""
    one = json.loads((RESULTS / "vllm_speed_h100_2026-12-07_compiled_alone_fixed.json").read_text())
    two = json.loads((RESULTS / "vllm_speed_h100_2026-12-07_compiled_alone_fixed_2.json").read_text())
    # a third H100, 08:02-08:09 UTC, through gpu/chain_compiled.sh's start3 after its refactor (EAGLE set only)
    three = json.loads((RESULTS / "vllm_speed_h100_2026-12-07_compiled_alone_fixed_3.json").read_text())
    # a fourth H100, 09:52-09:59 UTC (the next session): both sets in one run, start3 with a 280 s suite budget
    four = json.loads((RESULTS / "vllm_speed_h100_2026-12-07_compiled_alone_fixed_4.json").read_text())
    five = json.loads((RESULTS / "vllm_speed_h100_2026-12-07_compiled_alone_fixed_5.json").read_text())   # 10:20
    runs = (one, two, three, four, five)
    for rec in runs:
        assert rec["env"]["gpu"] == "NVIDIA H100 80GB HBM3" and rec["env"]["vllm"] == "0.24.0"
        assert "--compiled-alone" in rec["env"]["command"]
    eagle = [r["capture_eagle_set_compiled"] for r in runs]
    assert [e["ratio_vs_compiled"] for e in eagle] == [1.0044, 1.0027, 1.0035, 0.9981, 1.0006]  # bar 1.01
    all_33 = [r["capture_all_33_compiled"] for r in (one, four, five)]
    assert [e["ratio_vs_compiled"] for e in all_33] == [1.0167, 1.0165, 1.013]              # bar 1.03
    for rec, e in zip(runs, eagle):                                      # every timed run, not only the median
        assert max(e["with_statistics"]["seconds"]) <= 1.006 * rec["plain_prefill_compiled"]["median_s"]
    for e in (*eagle, *all_33):
        assert e["tokens_seen_by_hooks"] == e["tokens_expected"] and e["forwards_without_aux"] == 0
        assert e["cudagraph_mode_capture"] == "NONE" and e["alone"]
    rec = json.loads((RESULTS / "fault_suite_sglang_load_h100_2026-12-07.json").read_text())
    assert "H100" in rec["env"]["gpu"][0] and rec["env"]["sglang_env_sglang"] == "0.5.15"
    t = rec["steps"]["sglang-load"]["trials"][0]
    assert t["killed"] and t["kill"]["done"] == 2 and t["kill"]["total"] == 4
    assert t["status_after_kill"]["catalog"] == {t["name"]: "interrupted"}
    assert t["interrupted_ok"] and t["never_complete_while_unfinished"] and t["resumed_ok"]
    assert t["equal"] is True and not t["differences"] and t["figures"]["tau_max_abs_difference"] == 0.0
    assert t["outlived_kill"] == [] and t["gpu_after_kill"]["freed"] and t["gpu_after_kill"]["seconds"] == 0.55
    assert "enable-deterministic-inference" in str(rec["args"]["sglang_option"])


def test_the_compiled_capture_kill_trials_say_what_reliability_md_says() -> None:
    """The capture in vLLM's compiled engine killed twice on an H100 (2026-12-07 10:27 and 10:30 UTC): shown
    interrupted, GPU freed, nothing outliving the kill; both resumes failed, the first at `rd.manifest.get`, the second
    in an engine core that vLLM spawned (the resume's process had CUDA initialised), as RELIABILITY.md says."""
    logs = []
    for suffix in ("", "_2"):
        rec = json.loads((RESULTS / f"fault_suite_h100_2026-12-07_vllm_compiled_capture{suffix}.json").read_text())
        assert str(rec["args"]["exact_sums"]) == "True" and rec["args"]["vllm_option"] == "[('compiled', True)]"
        t = rec["steps"]["vllm-capture"]["trials"][0]
        assert t["killed"] and t["kill"]["done"] == 128 and t["kill"]["total"] == 448
        assert t["status_after_kill"]["catalog"] == {t["name"]: "interrupted"}
        assert t["interrupted_ok"] and t["never_complete_while_unfinished"] and not t["resumed_ok"]
        assert t["outlived_kill"] == [] and t["gpu_after_kill"]["freed"] and t["gpu_after_kill"]["seconds"] <= 0.56
        with tarfile.open(RESULTS / f"fault_suite_h100_2026-12-07_vllm_compiled_capture{suffix}_logs.tar.gz") as tf:
            m = next(m for m in tf.getmembers() if m.name.endswith("-resume.log"))
            logs.append(io.TextIOWrapper(tf.extractfile(m)).read())
    assert t["resume"]["exit"] == 2 and rec["steps"]["vllm-capture"]["trials"][0]["resume"]["seconds"] == 49.94
    assert "AttributeError: 'function' object has no attribute 'get'" in logs[0]
    assert "We must use the `spawn` multiprocessing start method" in logs[1]
    assert "error: vLLM could not start with model" in logs[1] and "IndexError: list index out of range" in logs[1]
    assert "spawn" not in logs[0].split("AttributeError")[0]                 # the first resume never got that far


def test_the_compiled_capture_kill_trials_of_13_04_compared_empty_captures() -> None:
    """The same kill trial on an H100 at 13:04-13:08 UTC (code at 420a4ee): killed at 128/448 and 256/448 prompts,
    shown interrupted, GPU freed, nothing outliving the kill, both resumes complete, and the suite said "equal". But
    the reference and both resumes counted 0 tokens (the engine core, forked, was never armed): equal because empty.
    The suite now calls such a comparison a difference (tests/test_fault_compare.py)."""
    rec = json.loads((RESULTS / "fault_suite_h100_2026-12-07_vllm_compiled_capture_3.json").read_text())
    assert rec["env"]["commit"].startswith("420a4ee") and rec["env"]["vllm_env_vllm"] == "0.24.0"
    assert str(rec["args"]["exact_sums"]) == "True" and rec["args"]["vllm_option"] == "[('compiled', True)]"
    trials = rec["steps"]["vllm-capture"]["trials"]
    assert [(t["kill"]["done"], t["kill"]["total"]) for t in trials] == [(128, 448), (256, 448)]
    for t in trials:
        _killed_then_resumed_equal(t, gpu_free_s=0.55)
    logs = _logs("fault_suite_h100_2026-12-07_vllm_compiled_capture_3_logs.tar.gz")
    ends = [line for text in logs.values() for line in text.splitlines() if line.startswith("capture ")]
    assert len(ends) == 3 and all(": 0 tokens from 448 prompts" in line for line in ends), ends
    assert not any("spawn" in text for text in logs.values())          # every engine core was forked


def test_the_compiled_capture_kill_trials_of_21_18_held_every_token_and_resumed_bit_equal() -> None:
    """The capture in vLLM's compiled engine (exact sums, VLLM_BATCH_INVARIANT=1, 448 prompts) killed twice on an H100
    at 21:18 and 21:20 UTC, 2026-12-07, through the CLI that fails a capture whose statistics hold no token: the
    reference held 162,810 tokens; each trial was killed at 128/448 prompts, shown interrupted, its GPU memory free
    within 0.56 s, nothing outliving the kill; each resume completed with the same 162,810 tokens, bit-equal to the
    reference (--exact-sums), as RELIABILITY.md says."""
    for n in (4, 5):
        rec = json.loads((RESULTS / f"fault_suite_h100_2026-12-07_vllm_compiled_capture_{n}.json").read_text())
        assert rec["env"]["vllm_env_vllm"] == "0.24.0"
        assert str(rec["args"]["exact_sums"]) == "True" and rec["args"]["vllm_option"] == "[('compiled', True)]"
        step = rec["steps"]["vllm-capture"]
        assert step["reference"]["reused"] and step["reference"]["seconds"] == 132.6    # the 21:15 reference
        [t] = step["trials"]
        assert (t["kill"]["done"], t["kill"]["total"]) == (128, 448) and t["kill"]["exit"] == -9
        _killed_then_resumed_equal(t, gpu_free_s=0.56)
        assert t["catalog_after_resume"]["trial"] == {"status": "complete", "rows": 10}
    logs = _logs("fault_suite_h100_2026-12-07_vllm_compiled_capture_5_logs.tar.gz")
    ends = sorted(line.split(" -> ")[0].split(" in ")[0] for text in logs.values() for line in text.splitlines()
                  if line.startswith("capture "))
    assert ends == ["capture kill-vllm-cap-211814-0: 162810 tokens from 448 prompts",
                    "capture kill-vllm-cap-211956-0: 162810 tokens from 448 prompts",
                    "capture ref-vllm-cap: 162810 tokens from 448 prompts"], ends
    assert not any("spawn" in text for text in logs.values())          # every engine core was forked


def test_the_fork_and_spawn_captures_of_13_36_say_what_reliability_md_says() -> None:
    """The same compiled capture (64 prompts, batch-invariant, exact sums) on an H100 at 13:36-13:44 UTC: the forked
    engine core's run completed with 0 tokens in every boundary's statistics though the hooks saw all 7,560; the two
    spawned ones counted all 7,560 in every boundary."""
    import pandas as pd

    with tarfile.open(RESULTS / "vllm_compiled_capture_fork_spawn_h100_2026-12-07.tar.gz") as tf:
        files = {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}
    runs = sorted({Path(n).parent.name for n in files if n.endswith("stats.parquet")})
    assert runs == ["fork-141", "spawn-268", "spawn-378"]
    for run in runs:
        stats = pd.read_parquet(io.BytesIO(files[f"spawn/data/runs/{run}/stats.parquet"]))
        man = json.loads(files[f"spawn/data/runs/{run}/manifest.json"])
        assert man["status"] == "complete" and man["engine_check"]["tokens_seen_by_hooks"] == 7560
        assert set(stats["n_tokens"]) == ({0} if run.startswith("fork") else {7560}), run


def test_the_spawned_core_logs_say_what_reliability_md_says() -> None:
    """The narrowing-down on the same H100 (13:08-13:11 UTC): a spawned engine core in batch-invariant mode failed
    with IndexError on the forked cores' cached graph; without batch-invariant mode, or with the cache disabled, the
    same capture completed, all 7,560 tokens of its 64 prompts."""
    logs = _logs("vllm_spawned_core_compile_cache_h100_2026-12-07_logs.tar.gz", key=lambda name: Path(name).stem)
    failed = logs.pop("spawn_batch_invariant_forked_cache")
    assert "error: vLLM could not start with model" in failed and "IndexError: list index out of range" in failed
    assert sorted(logs) == ["spawn_batch_invariant_cache_disabled", "spawn_no_batch_invariant_forked_cache"]
    for text in logs.values():
        assert "IndexError" not in text and "7560 tokens from 64 prompts" in text
