"""The bench: lossless greedy speculative decoding, acceptance bookkeeping, rejection sampling, resume,
bad input. A tiny random target (4 layers, hidden 64, vocab 512) and a random EAGLE-3 drafter for it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

from backend.bench import BenchSettings, run_bench
from backend.drafter import DrafterConfig, Eagle3Drafter, init_random
from backend.drafter.aux import drafter_aux_boundaries
from backend.engines import hf
from backend.engines.hf_spec import EagleProposer, Sampler, decode_plain, verify
from backend.errors import SpecLensError
from backend.prompts import encode, load_prompts
from backend.store.data_root import DataRoot

K, MAX_NEW, V = 3, 20, 512


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    from backend.toy.target import build_random_target

    return build_random_target(tmp_path_factory.mktemp("bench-models") / "t4", n_layers=4, hidden=64, vocab_size=V)


def drafter_cfg(**kw) -> DrafterConfig:
    base = dict(hidden_size=64, target_hidden_size=64, num_aux=3, vocab_size=V, draft_vocab_size=V, num_heads=4,
                num_kv_heads=2, head_dim=16, intermediate_size=128, aux_layer_ids_nested=[1, 2, 3])
    return DrafterConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def drafter(tmp_path_factory) -> Path:
    return init_random(Eagle3Drafter(drafter_cfg()), 0).save(tmp_path_factory.mktemp("drafters") / "d", "eagle")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    rows = [("writing", "Write a short poem about the sea."), ("math", "What is 12 times 7?"),
            ("writing", "Describe a quiet morning in the city.")]
    p.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [t]}) + "\n"
                         for i, (c, t) in enumerate(rows)))
    return p


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bench-data")


def settings(target, prompts, drafter=None, **kw) -> BenchSettings:
    base = dict(target=str(target), prompts=str(prompts), drafter=str(drafter) if drafter else None,
                num_spec_tokens=K, repeats=1, max_new_tokens=MAX_NEW, device="cpu",
                runner="v1")    # vLLM's V1 reading of the nested ids: V2 (vLLM's pick for Llama) reads none, and its
    return BenchSettings(**{**base, **kw})  # default (2, 2, 1) gives 2 states on 4 layers (test_aux_boundaries_...)


@pytest.fixture(scope="module")
def greedy(target, drafter, prompts, root):
    return run_bench(settings(target, prompts, drafter, repeats=2), name="greedy", data=DataRoot(root), progress=False)


# ---------------------------------------------------------------------- lossless greedy + files


def test_greedy_speculative_equals_plain_decoding(greedy, root):
    assert greedy.status == "complete" and greedy.lossless is True and greedy.mismatched_prompts == 0
    run = pd.read_parquet(greedy.path / "prompts.parquet")
    base = pd.read_parquet(root / "runs" / greedy.baseline_run / "prompts.parquet")
    assert list(run["output_hash"]) == list(base["output_hash"])        # token for token, every repeat x prompt
    assert (run["drafts"] > 0).all()


def test_bench_files_and_manifest(greedy, root):
    m = json.loads((greedy.path / "manifest.json").read_text())
    assert (m["kind"], m["engine"], m["status"], m["num_spec_tokens"], m["repeats"]) == (
        "bench", "hf", "complete", K, 2)
    assert m["baseline_run"] == greedy.baseline_run and m["drafter"]["path"].endswith("/d")
    assert m["aux"]["boundaries"] == ["S_1", "S_2", "S_3"] and m["aux"]["ids_from"] == "eagle_config"
    assert m["bench"]["lossless"] is True and m["bench"]["speedup"]["ci_low"] <= m["bench"]["speedup"]["ci_high"]
    assert m["progress"] == {"done": 6, "total": 6} and not (greedy.path / "journal.jsonl").exists()
    bm = json.loads((root / "runs" / greedy.baseline_run / "manifest.json").read_text())
    assert bm["drafter"] is None and bm["baseline_run"] is None and bm["bench"]["tau"] == 1.0
    steps = pd.read_parquet(greedy.path / "steps.parquet")
    assert list(steps.columns) == ["run_id", "repeat", "prompt_id", "step", "accepted"]
    prompts = pd.read_parquet(greedy.path / "prompts.parquet")
    assert {"category", "output_tokens", "seconds", "tokens_per_s", "ttft", "tpot", "accepted", "drafts",
            "output_hash"} <= set(prompts.columns) and len(prompts) == 6
    assert prompts["drafts"].sum() == len(steps) and prompts["accepted"].sum() == steps["accepted"].sum()
    summ = json.loads((greedy.path / "summary.json").read_text())
    assert len(summ["histogram"]) == K + 1 and sum(summ["histogram"]) == len(steps)
    assert len(summ["per_position"]["rates"]) == K and set(summ["per_category"]) == {"writing", "math"}
    # catalog: the new tables and named queries
    br = DataRoot(root).catalog.read.bench_runs().set_index("run_id")
    assert br.loc["greedy", "lossless"] and br.loc["greedy", "baseline_run"] == greedy.baseline_run
    assert len(DataRoot(root).catalog.read.bench_steps(["greedy"])) == len(steps)
    assert DataRoot(root).catalog.read.bench_histogram(["greedy"])["steps"].sum() == len(steps)
    cats = DataRoot(root).catalog.read.bench_categories([greedy.baseline_run])
    assert set(cats["category"]) == {"writing", "math"} and (cats["tau"] == 1.0).all()


# ---------------------------------------------------------------------- interleaved pairs, load, noise


def test_interleaved_pairs_are_recorded(greedy, root):
    """Each (repeat, prompt) unit holds both halves of its pair, timed back to back in this process: the drafter's
    row and plain decoding's (`base_*`), which went first alternating in execution order, prompts shuffled within
    each repeat; the speedup is the pairs' (metrics.speedup over base_tokens_per_s), and the baseline run this first
    bench wrote holds exactly the pairs' plain half. Every unit records the machine's load."""
    from backend import metrics
    from backend.bench import unit_plan

    run = pd.read_parquet(greedy.path / "prompts.parquet")
    m = json.loads((greedy.path / "manifest.json").read_text())
    assert m["pairing"] == "interleaved" and m["bench"]["pairing"] == "interleaved"
    n, P = len(run), run["prompt_index"].nunique()
    assert sorted(run["unit_order"]) == list(range(n))
    for r, g in run.groupby("repeat"):                       # repeat by repeat, each one's prompts in its own order
        assert sorted(g["unit_order"]) == list(range(r * P, (r + 1) * P))
    plan = unit_plan(0, 2, P)
    assert [(int(a), int(b)) for a, b in run.sort_values("unit_order")[["repeat", "prompt_index"]].to_numpy()] == plan
    assert plan != sorted(plan) or P < 3, "the prompts are shuffled"
    assert (run["first_arm"] == run["unit_order"].map(lambda u: "baseline" if u % 2 == 0 else "drafter")).all()
    assert (run["base_output_hash"] == run["output_hash"]).all()                # greedy: lossless, pair by pair
    assert run["base_tokens_per_s"].notna().all() and (run["base_seconds"] > 0).all()
    R = 2
    tps = [run[run.repeat == r].sort_values("prompt_index")[c].tolist() for c in ("tokens_per_s", "base_tokens_per_s")
           for r in range(R)]
    assert m["bench"]["speedup"]["mean"] == pytest.approx(metrics.speedup(tps[:R], tps[R:], seed=0).mean)
    base = pd.read_parquet(root / "runs" / greedy.baseline_run / "prompts.parquet").set_index(["repeat",
                                                                                                "prompt_index"])
    pair = run.set_index(["repeat", "prompt_index"])
    for c in ("output_tokens", "seconds", "tokens_per_s", "ttft", "output_hash"):
        assert (pair[f"base_{c}"] == base.loc[pair.index, c]).all(), c
    assert (base["unit_order"] == pair["unit_order"]).all() and base["base_tokens_per_s"].isna().all() \
        if "base_tokens_per_s" in base else (base["unit_order"] == pair["unit_order"]).all()
    for c in ("load1", "cpu_util", "other_cpu", "speclens_cpu"):
        assert run[c].notna().all() and (run[c] >= 0).all(), c
    load, noise = m["bench"]["load"], m["bench"]["speed_noise"]
    assert load["units"] == n and load["cpus"] >= 1 and set(load["other_cpu"]) == {"min", "median", "p90", "max"}
    assert noise["units"] == n and set(noise) >= {"noisy", "kinds", "reason", "drift", "drift_limit"}
    assert noise["noisy"] == bool(noise["kinds"]) == (noise["reason"] is not None)
    assert noise["drift"] is None or noise["drift"]["normalised"], "repeats: each unit against its prompt's mean"
    br = DataRoot(root).catalog.read.bench_runs(run_ids=["greedy"]).iloc[0]
    assert br["pairing"] == "interleaved" and (br["speed_noise"] is None or br["speed_noise"] == noise["reason"])
    timings = DataRoot(root).catalog.read.bench_prompt_timings(["greedy"])
    assert timings["base_tokens_per_s"].notna().all() and timings["unit_order"].notna().all()


def test_the_plain_half_runs_without_the_drafters_hooks(target, lm_and_seqs):
    from backend.engines.hf_spec import AuxCapture

    lm, _ = lm_and_seqs
    aux = AuxCapture(lm, ["S_1", "S_2", "S_3"])
    try:
        assert len(aux.hooks.handles) == 3
        with aux.paused():
            assert not aux.hooks.handles and not any(m._forward_hooks for m in lm.layers)
        assert len(aux.hooks.handles) == 3
    finally:
        aux.close()


def test_load_probe_sees_another_speclens_process():
    """A CPU-bound process that imports the backend beside the probe: its cores are counted as another SpecLens
    process's and as other load, its command line named; this process and its ancestors are never counted."""
    import subprocess
    import sys
    import time

    from backend.bench import LoadProbe
    from backend.config import REPO_ROOT

    assert LoadProbe.is_speclens(["python", "-m", "backend", "bench", "--target", "t"])
    assert LoadProbe.is_speclens(["python", "-m", "backend.jobs.child", "root", "j1"])
    assert LoadProbe.is_speclens(["python", "-c", "from multiprocessing.forkserver import main; main(8, 9, "
                                                  "['torch', 'backend.__main__'])"])
    assert not LoadProbe.is_speclens(["python", "-m", "pytest", "tests"])
    assert not LoadProbe.is_speclens(["streamlit", "run", "app.py"])
    # not a child of this process (a bench leaves its own children out): started by a shell that exits at once
    code = "import backend.metrics, time\nt = time.time()\nwhile time.time() - t < 30: pass"
    sh = subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0" >/dev/null 2>&1 & echo $!', code], cwd=REPO_ROOT,
                        capture_output=True, text=True, check=True)
    pid = int(sh.stdout.strip())
    try:
        time.sleep(1.0)                                       # started and importing
        probe = LoadProbe()
        probe.start()
        t = time.time()
        while time.time() - t < 1.0:                          # this process busy too, as a generation is
            pass
        got = probe.stop()
    finally:
        os.kill(pid, 9)
    assert got["speclens_cpu"] >= 0.25 and str(pid) in (got["speclens_procs"] or ""), got
    assert got["other_cpu"] >= 0.25 and 0 <= got["cpu_util"] <= 100 and got["load1"] >= 0
    assert os.getpid() not in probe.others


def test_a_baseline_another_bench_writes_is_waited_for_or_replaced(target, drafter, prompts, tmp_path):
    """Two benches of the same settings that start together share one baseline run: the second links the one the
    first is writing and waits for it before it completes; when that writer stops instead, it writes its own from its
    pairs and links that."""
    import threading

    from backend.bench import _manifest
    from backend.runs.lifecycle import Run

    root = tmp_path / "data"
    s = settings(target, prompts, drafter, limit=2, max_new_tokens=6, seed=11)
    lm = hf.load(target, "cpu")
    # live: this process
    other = Run.create("other-baseline", _manifest(s.baseline(), lm, None, None, 2), DataRoot(root))
    threading.Timer(1.0, lambda: other.fail("its drafter run 'other' stopped (killed)")).start()
    r = run_bench(s, name="second", data=DataRoot(root), progress=False)
    assert r.status == "complete" and r.baseline_run == "second-baseline" and r.lossless is True
    m = json.loads((root / "runs" / "second" / "manifest.json").read_text())
    assert m["baseline_run"] == "second-baseline"
    assert json.loads((root / "runs" / "other-baseline" / "manifest.json").read_text())["status"] == "failed"
    third = run_bench(s, name="third", data=DataRoot(root), progress=False)   # now a complete one exists: linked
    assert third.baseline_run == "second-baseline"


# ---------------------------------------------------------------------- bookkeeping with scripted proposals


class Scripted:
    """Proposes the target's own greedy continuation, right at the first `right(step)` positions of each
    step and wrong after (token + 1). right = K: every draft accepted; right = 0: none.
    With `inner` (a real EagleProposer) the drafter runs alongside and its KV length is checked after every
    call: context slots only after start/advance (rollback + append), context + K-1 after propose."""

    def __init__(self, lm, seqs: list[list[int]], right, inner: EagleProposer | None = None):
        self.right, self.ref, self.step, self.inner = right, {}, 0, inner
        for p in seqs:   # reference long enough to propose past the last output token
            self.ref[tuple(p[1:])] = p + decode_plain(lm, p, MAX_NEW + K + 2, Sampler(0.0), set()).tokens

    def start(self, aux, next_ids, positions):
        self.seq, self.step, self.last = self.ref[tuple(next_ids[:-1])], 0, positions[-1]
        if self.inner:
            self.inner.start(aux, next_ids, positions)
            assert self.inner.d.cache_len == positions[-1] + 1

    def advance(self, aux, next_ids, positions):
        self.step, self.last = self.step + 1, positions[-1]
        if self.inner:
            self.inner.advance(aux, next_ids, positions)
            assert self.inner.d.cache_len == positions[-1] + 1

    def propose(self, k, sampler):
        if self.inner:
            self.inner.propose(k, sampler)
            assert self.inner.d.cache_len == self.last + 1 + k - 1
        true = self.seq[self.last + 2: self.last + 2 + k]     # slot `last` holds x_{last+1}; drafts x_{last+2}..
        j = self.right(self.step)
        return [t if i < j else (t + 1) % V for i, t in enumerate(true)], None


@pytest.fixture(scope="module")
def lm_and_seqs(target, prompts):
    lm = hf.load(target, "cpu")
    return lm, [encode(lm.tokenizer, p.text) for p in load_prompts(prompts)]


@pytest.mark.parametrize("name,right,tau", [("all-right", lambda s: K, K + 1), ("all-wrong", lambda s: 0, 1.0),
                                            ("cycle", lambda s: s % (K + 1), None)])
def test_acceptance_bookkeeping(target, drafter, prompts, root, greedy, lm_and_seqs, name, right, tau):
    lm, seqs = lm_and_seqs
    inner = EagleProposer(Eagle3Drafter.load(drafter)) if name == "cycle" else None
    r = run_bench(settings(target, prompts, drafter, repeats=2), name=name, data=DataRoot(root), progress=False,
                  proposer=Scripted(lm, seqs, right, inner))
    assert r.lossless is True and r.baseline_run == greedy.baseline_run        # baseline reused
    steps = pd.read_parquet(r.path / "steps.parquet")
    for _, g in steps.groupby(["repeat", "prompt_id"]):
        assert list(g["accepted"]) == [right(s) for s in range(len(g))]
    if tau is not None:
        assert r.tau == tau
    assert r.acceptance_rate == pytest.approx(steps["accepted"].sum() / (K * len(steps)))
    hist = json.loads((r.path / "summary.json").read_text())["histogram"]
    assert hist == [int((steps["accepted"] == n).sum()) for n in range(K + 1)]


# ---------------------------------------------------------------------- rejection sampling


@pytest.mark.parametrize("one_hot", [False, True])
def test_rejection_sampling_preserves_target_distribution(one_hot):
    """Context-free target rows p_i; drafts from q_i (or argmax q_i, vLLM style). Emitted tokens ~ p."""
    p = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8]])    # [K+1=3, V=3]
    q = torch.tensor([[0.2, 0.2, 0.6], [0.7, 0.2, 0.1]])                     # [K=2, V=3]
    g = torch.Generator().manual_seed(0)
    s = Sampler(1.0, g)
    N, first, second = 8000, torch.zeros(3), torch.zeros(3)
    for _ in range(N):
        if one_hot:
            draft, qq = q.argmax(-1).tolist(), None
        else:
            draft, qq = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(2)], q
        n, new = verify(p.log(), draft, qq, s)
        assert len(new) == n + 1 and new[:n] == draft[:n]
        first[new[0]] += 1
        if n >= 1:                 # given position 0 accepted, position 1 is drawn by the same rule from p_1
            second[new[1]] += 1
    for counts, row in ((first, p[0]), (second, p[1])):
        m = counts.sum()
        sigma = (row * (1 - row) / m).sqrt()
        assert ((counts / m - row).abs() < 4.5 * sigma).all(), (counts / m, row)


def test_greedy_verify():
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 9.0]])   # argmax 1, 0, 2
    assert verify(logits, [1, 0], None, Sampler(0.0)) == (2, [1, 0, 2])          # all accepted + bonus
    assert verify(logits, [1, 2], None, Sampler(0.0)) == (1, [1, 0])             # correction at position 1
    assert verify(logits, [0, 0], None, Sampler(0.0)) == (0, [1])


def test_sampling_bench_runs_and_is_seeded(target, drafter, prompts, root):
    s = settings(target, prompts, drafter, temperature=0.8, limit=2, max_new_tokens=12)
    a = run_bench(s, name="sample-a", data=DataRoot(root), progress=False)
    b = run_bench(s, name="sample-b", data=DataRoot(root), progress=False)
    assert a.lossless is None and a.status == "complete" and a.baseline_run == b.baseline_run
    ha = pd.read_parquet(a.path / "prompts.parquet")["output_hash"].tolist()
    assert ha == pd.read_parquet(b.path / "prompts.parquet")["output_hash"].tolist()


# ---------------------------------------------------------------------- resume


def test_resume_equals_uninterrupted(target, drafter, prompts, root, greedy):
    s = settings(target, prompts, drafter, repeats=2, temperature=0.7, max_new_tokens=12)
    cut = run_bench(s, name="cut", data=DataRoot(root), progress=False, stop_after=2)
    m = json.loads((cut.path / "manifest.json").read_text())
    assert cut.status == "failed" and m["status"] != "complete" and "resume" in m["error"]
    assert m["progress"]["done"] == 2 and len((cut.path / "journal.jsonl").read_text().splitlines()) == 2
    assert DataRoot(root).catalog.read.bench_runs().set_index("run_id").loc["cut", "status"] != "complete"
    with open(cut.path / "journal.jsonl", "a") as f:       # a torn last line, as a kill mid-write leaves
        f.write('{"row": {"repe')
    base = json.loads((root / "runs" / "cut-baseline" / "manifest.json").read_text())
    assert cut.baseline_run == "cut-baseline" and base["status"] == "failed" and "'cut' stopped" in base["error"]
    assert not (root / "runs" / "cut-baseline" / "prompts.parquet").exists(), "written from the pairs at the end"
    resumed = run_bench(s, name="cut", data=DataRoot(root), progress=False)
    whole = run_bench(s, name="whole", data=DataRoot(root), progress=False)
    assert resumed.status == whole.status == "complete"
    assert json.loads((root / "runs" / "cut-baseline" / "manifest.json").read_text())["status"] == "complete"
    assert whole.baseline_run == "cut-baseline", "a complete baseline of the same settings is linked, not rewritten"
    pairs = ["repeat", "prompt_id", "unit_order", "first_arm", "base_output_tokens", "base_output_hash"]
    pd.testing.assert_frame_equal(pd.read_parquet(resumed.path / "prompts.parquet")[pairs],
                                  pd.read_parquet(whole.path / "prompts.parquet")[pairs])
    cols = ["repeat", "prompt_id", "output_tokens", "accepted", "drafts", "output_hash"]
    pd.testing.assert_frame_equal(pd.read_parquet(resumed.path / "prompts.parquet")[cols],
                                  pd.read_parquet(whole.path / "prompts.parquet")[cols])
    pd.testing.assert_frame_equal(pd.read_parquet(resumed.path / "steps.parquet").drop(columns="run_id"),
                                  pd.read_parquet(whole.path / "steps.parquet").drop(columns="run_id"))
    with pytest.raises(SpecLensError, match="already complete"):
        run_bench(s, name="cut", data=DataRoot(root), progress=False)


# ---------------------------------------------------------------------- aux boundaries


def test_aux_boundaries_follow_the_producer():
    cfg = drafter_cfg(name="/drafters/d")                          # nested eagle_config ids [1, 2, 3]
    assert drafter_aux_boundaries(cfg, 8, "llama")["boundaries"] == ["S_1", "S_2", "S_3"]      # vLLM: id a = S_a
    v2 = drafter_aux_boundaries(cfg, 8, "llama", runner="v2")      # vLLM 0.24 V2 reads only top-level ids
    assert v2["boundaries"] == ["S_2", "S_4", "S_5"] and v2["ids"] is None
    sg = drafter_aux_boundaries(cfg, 8, "llama", producer="sglang", version="0.5.23")           # after layer a
    assert sg["boundaries"] == ["S_2", "S_3", "S_4"]
    with pytest.raises(SpecLensError) as e:                          # default (2, 2, 1) on 4 layers: 2 states
        drafter_aux_boundaries(cfg, 4, "llama", runner="v2")
    assert "/drafters/d/config.json" in one_line(e) and "fc takes 3" in str(e.value)


# ---------------------------------------------------------------------- bad input


def one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_drafter_for_another_target(target, prompts, tmp_path):
    for kw, what in ((dict(hidden_size=32, target_hidden_size=32, head_dim=8), "hidden size"),
                     (dict(vocab_size=256, draft_vocab_size=256), "vocab size")):
        d = init_random(Eagle3Drafter(drafter_cfg(**kw)), 0).save(tmp_path / what.replace(" ", "_"), "eagle")
        with pytest.raises(SpecLensError) as e:
            run_bench(settings(target, prompts, d), data=DataRoot(tmp_path / "data"), progress=False)
        msg = one_line(e)
        assert what in msg and str(d) in msg and "use a drafter for this target" in msg


def test_missing_d2t(target, prompts, tmp_path):
    m = init_random(Eagle3Drafter(drafter_cfg(draft_vocab_size=256)), 0)
    m.d2t.copy_(torch.arange(256))                                  # draft id i -> target id 2i
    d = m.save(tmp_path / "d", "eagle")
    sd = load_file(str(d / "model.safetensors"))
    sd.pop("d2t")
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(SpecLensError) as e:
        run_bench(settings(target, prompts, d), data=DataRoot(tmp_path / "data"), progress=False)
    assert "model.safetensors" in one_line(e) and "d2t" in str(e.value)


def test_bad_k_and_empty_dataset(target, drafter, prompts, tmp_path, capsys):
    with pytest.raises(SpecLensError) as e:      # the settings model refuses it when built (backend/settings.py)
        run_bench(settings(target, prompts, drafter, num_spec_tokens=0), data=DataRoot(tmp_path), progress=False)
    assert "num_spec_tokens: 0 must be >= 1" in one_line(e)
    from backend.__main__ import main

    assert main(["bench", "--target", str(target), "--prompts", str(prompts), "--num-spec-tokens", "0"]) == 2
    assert capsys.readouterr().err == "error: --num-spec-tokens 0 must be >= 1\n"      # the CLI names its option
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(SpecLensError) as e:
        run_bench(settings(target, empty, drafter), data=DataRoot(tmp_path), progress=False)
    assert str(empty) in one_line(e) and "no prompts" in str(e.value)


def test_tokenizer_without_chat_template(target, prompts, tmp_path):
    t = shutil.copytree(target, tmp_path / "no-template")
    (t / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((t / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (t / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecLensError) as e:
        run_bench(settings(t, prompts), data=DataRoot(tmp_path / "data"), progress=False)
    msg = one_line(e)
    assert str(t) in msg and "--no-chat-template" in msg
    ok = run_bench(settings(t, prompts, chat_template=False, limit=1, max_new_tokens=2),
                   data=DataRoot(tmp_path / "data"), progress=False)
    assert ok.status == "complete"


def test_cli_parser(target, drafter, prompts, root, capsys, monkeypatch):
    import argparse

    from backend.bench_cli import add_parser

    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers(dest="cmd"))
    a = p.parse_args(["bench", "--engine", "hf", "--target", str(target), "--drafter", str(drafter), "--prompts",
                      str(prompts), "--num-spec-tokens", "2", "--repeats", "1", "--limit", "1", "--name", "cli",
                      "--max-new-tokens", "4", "--device", "cpu", "--quiet", "--runner", "v1"])
    assert (a.num_spec_tokens, a.temperature, a.repeats, a.limit) == (2, 0.0, 1, 1)
    monkeypatch.setenv("SPECLENS_DATA", str(root))
    assert a.fn(a) == 0
    assert "bench cli:" in capsys.readouterr().out


# ---------------------------------------------------------------------- several drafters, one plain half


def test_several_drafters_share_one_plain_half(target, drafter, prompts, greedy, tmp_path):
    """run_benches: two drafters in one loop, one plain decoding per unit shared by both pairs. Each run holds what
    run_bench alone gives for its drafter (same acceptance step by step, same outputs), both pair with the very same
    plain halves and link the one baseline run written from them; an interruption leaves both resumable and the
    resumed pair equals the uninterrupted one; a bench that differs in more than its drafter is refused."""
    from backend.bench import run_benches

    other = init_random(Eagle3Drafter(drafter_cfg()), 1).save(tmp_path / "d2", "eagle")
    s1, s2 = settings(target, prompts, drafter, repeats=2), settings(target, prompts, other, repeats=2)
    data, root = DataRoot(tmp_path / "data"), tmp_path / "data"      # no baseline of these settings yet
    a, b = run_benches([s1, s2], ["arm-a", "arm-b"], data=data, progress=False)
    assert a.status == b.status == "complete" and a.lossless and b.lossless
    assert a.baseline_run == b.baseline_run == "arm-a-baseline"
    steps = [pd.read_parquet(r.path / "steps.parquet").drop(columns="run_id") for r in (a, greedy)]
    pd.testing.assert_frame_equal(*steps)                       # the first drafter: as benched alone
    pa, pb = (pd.read_parquet(r.path / "prompts.parquet").set_index(["repeat", "prompt_index"]).sort_index()
              for r in (a, b))
    for c in ("base_seconds", "base_output_hash", "unit_order", "first_arm"):
        assert (pa[c] == pb[c]).all(), c                        # one plain decoding per unit, shared
    base = pd.read_parquet(root / "runs" / "arm-a-baseline" / "prompts.parquet").set_index(
        ["repeat", "prompt_index"]).sort_index()
    assert (base["seconds"] == pa["base_seconds"]).all()
    alone = run_bench(s2, name="arm-b-alone", data=data, progress=False)
    cols = ["repeat", "prompt_id", "output_tokens", "accepted", "drafts", "output_hash"]
    pd.testing.assert_frame_equal(pd.read_parquet(b.path / "prompts.parquet")[cols].sort_values(cols[:2])
                                  .reset_index(drop=True),
                                  pd.read_parquet(alone.path / "prompts.parquet")[cols].sort_values(cols[:2])
                                  .reset_index(drop=True))

    s3, s4 = (settings(target, prompts, d, repeats=2, max_new_tokens=12) for d in (drafter, other))
    cut = run_benches([s3, s4], ["cut-a", "cut-b"], data=data, progress=False, stop_after=2)
    assert [r.status for r in cut] == ["failed", "failed"]
    for r in cut:
        m = json.loads((r.path / "manifest.json").read_text())
        assert m["status"] != "complete" and "resume" in m["error"] and m["progress"]["done"] == 2
    resumed = run_benches([s3, s4], ["cut-a", "cut-b"], data=data, progress=False)
    whole = run_benches([s3, s4], ["whole-a", "whole-b"], data=data, progress=False)
    assert [r.status for r in resumed] == ["complete"] * 2 and resumed[1].baseline_run == "cut-a-baseline"
    for r, w in zip(resumed, whole):
        pd.testing.assert_frame_equal(pd.read_parquet(r.path / "steps.parquet").drop(columns="run_id"),
                                      pd.read_parquet(w.path / "steps.parquet").drop(columns="run_id"))

    with pytest.raises(SpecLensError, match="differs from .* in more than its drafter"):
        run_benches([s1, settings(target, prompts, other, repeats=1)], ["x-a", "x-b"], data=data, progress=False)


def test_cli_also_drafter(target, drafter, prompts, capsys, monkeypatch, tmp_path):
    """`bench --drafter A --also-drafter B --name n`: runs n and n-<B's directory>, one loop, the same plain half."""
    import argparse

    from backend.bench_cli import add_parser

    other = init_random(Eagle3Drafter(drafter_cfg()), 2).save(tmp_path / "second", "eagle")
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers(dest="cmd"))
    args = ["bench", "--engine", "hf", "--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts),
            "--num-spec-tokens", "2", "--repeats", "1", "--limit", "2", "--max-new-tokens", "6", "--device", "cpu",
            "--quiet", "--runner", "v1", "--name", "two", "--also-drafter", str(other)]
    monkeypatch.setenv("SPECLENS_DATA", str(tmp_path / "data"))
    a = p.parse_args(args)
    assert a.fn(a) == 0
    out = capsys.readouterr().out
    assert "bench two:" in out and "bench two-second:" in out and out.count("vs two-baseline") == 2
    pa, pb = (pd.read_parquet(tmp_path / "data" / "runs" / r / "prompts.parquet").sort_values("prompt_index")
              for r in ("two", "two-second"))
    assert list(pa["base_seconds"]) == list(pb["base_seconds"])
    a = p.parse_args([x for x in args if x != str(drafter) and x != "--drafter"])
    with pytest.raises(SpecLensError, match="pass --drafter too"):
        a.fn(a)
