"""The vLLM adapter's logic on CPU (vLLM itself runs only on the GPU node: gpu/vllm_suite.py).

- The worker-side reducer (backend/engines/vllm_worker.py) is the same code that runs inside vLLM's workers;
  here it hooks a real HF model and must give the statistics and sample of the HF capture.
- Metric plumbing is checked against output RECORDED from vLLM 0.24.0 on the H200 (tests/data/recorded/vllm_*),
  labelled as such: get_metrics() snapshots around single requests, /metrics text, engine info.
"""

import json
from pathlib import Path

import pytest
import torch

from backend import coords, metrics
from backend.engines import vllm as V
from backend.engines.vllm_worker import BoundaryReducer, aux_layers_of
from backend.errors import SpecLensError
from backend.store.data_root import DataRoot

RECORDED = Path(__file__).parent / "data" / "recorded"


def test_reducer_matches_hf_capture(tiny_llama, one_torch_thread):
    """Hooks placed the vLLM way (layer outputs, pre-hook for S_0, final norm's first output for F) on a real
    HF model give exactly the HF engine's boundaries: moments and sampled states."""
    from backend.engines import hf
    from backend.stats import StreamingStats, TokenSample

    lm = hf.load(tiny_llama, "cpu", "fp32")
    labels = coords.labels(coords.all_boundaries(lm.n_layers))
    red = BoundaryReducer(lm.model, labels, sample_tokens=64, sample_per_prompt=16)
    seqs = [[5, 6, 7, 8, 9, 10, 11], [3, 4, 5, 100, 200]]
    with torch.no_grad():
        for s in seqs:
            hf.forward(lm, s)
    red.remove()
    got = red.collect()
    assert got["tokens_seen"] == sum(map(len, seqs)) and got["forwards"] == 2

    ref_stats = StreamingStats(labels, lm.hidden_size, "cpu")
    ref_sample = TokenSample(labels, lm.hidden_size, 64, 16)
    with torch.no_grad():
        for s in seqs:
            states = {}
            with hf.BoundaryHooks(lm, coords.all_boundaries(lm.n_layers),
                                  lambda k, x: states.__setitem__(k, x[0] if x.dim() == 3 else x)):  # noqa: B023
                hf.forward(lm, s)
            for k in range(len(labels)):
                ref_stats.update(k, states[k])
            ref_sample.add(torch.tensor(s), states)
    for key, v in ref_stats.state.tensors().items():
        assert torch.allclose(got["state"][key], v, atol=1e-5, rtol=1e-5), key
    for key, v in ref_sample.tensors().items():
        assert torch.allclose(got["sample"][key].float(), v.float(), atol=1e-6), key
    assert red.sample.n == 12


def test_reducer_splits_a_flat_batch_into_sequences():
    """vLLM runs several requests in one flat batch: the sample must keep only sequences that start in it
    (position 0), with their own context hashes, and the statistics must count every token."""
    from backend.stats import context_hashes
    from tests.test_sample_determinism import Outer

    m = Outer(positional=False)      # vLLM-shaped: a flat batch, (hidden, residual) layers
    red = BoundaryReducer(m, ["S_0", "S_1", "S_2"], sample_tokens=100, sample_per_prompt=3)
    ids = torch.tensor([7, 8, 9, 10, 11, 1, 2, 3, 4, 20, 21])
    pos = torch.tensor([5, 6, 7, 8, 9, 0, 1, 2, 3, 0, 1])      # a continuing chunk, then two new sequences
    with torch.no_grad():
        m(ids, pos)
    got = red.collect()
    assert got["tokens_seen"] == 11
    assert got["sample"]["token_ids"].tolist() == [1, 2, 3, 20, 21]
    assert got["sample"]["position"].tolist() == [0, 1, 2, 0, 1]
    assert got["sample"]["ctx_hash"].tolist() == context_hashes([1, 2, 3]).tolist() + context_hashes([20, 21]).tolist()
    emb = m.model.embed(torch.tensor([1, 2, 3, 20, 21]))
    assert torch.allclose(got["sample"]["S_0"], emb.detach())
    assert int(got["state"]["scalars"][0, 0]) == 11          # every token counted at S_0
    assert aux_layers_of(m) is None


def test_accepted_lengths_from_per_position_counts():
    st = metrics.AcceptanceStats(drafts=10, draft_tokens=40, accepted=17, per_pos=[7, 5, 3, 2])
    lens = V.accepted_lengths(st, 4)
    assert lens == [0, 0, 0, 1, 1, 2, 2, 3, 4, 4] and sum(lens) == 17
    again = metrics.from_accepted_lengths(lens, 4)
    assert again.per_pos == [7, 5, 3, 2] and again.drafts == 10
    with pytest.raises(SpecLensError, match="chain"):
        V.accepted_lengths(metrics.AcceptanceStats(drafts=2, draft_tokens=8, accepted=3, per_pos=[1, 2, 0, 0]), 4)


def test_prometheus_text_and_snapshot_agree():
    text = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="t"} 12.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="t"} 48.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="t"} 20.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="1"} 6.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="2"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="3"} 2.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="t"} 1.7e9
"""
    d = V.parse_prometheus(text)
    assert d == {"vllm:spec_decode_num_drafts": 12, "vllm:spec_decode_num_draft_tokens": 48,
                 "vllm:spec_decode_num_accepted_tokens": 20,
                 "vllm:spec_decode_num_accepted_tokens_per_pos": [9, 6, 3, 2]}
    st = metrics.from_vllm({}, d)
    assert st.tau == pytest.approx(1 + 20 / 12) and st.per_pos == [9, 6, 3, 2]


def test_unreachable_server_is_one_line():
    with pytest.raises(SpecLensError) as e:
        V.ServerEngine("http://127.0.0.1:9", timeout=2)
    assert "unreachable" in str(e.value) and "\n" not in str(e.value)


def test_engine_errors_are_one_line():
    e = RuntimeError("Engine core initialization failed.\nValueError: No available memory for the cache blocks. "
                     "Try increasing `gpu_memory_utilization`")
    msg = V.short_error(e)
    assert "\n" not in msg and "GPU memory too small" in msg


def test_vllm_absent_on_cpu_path_says_where_it_runs():
    import importlib.util
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM installed here")
    with pytest.raises(SpecLensError, match="GPU node"):
        V.require()


@pytest.mark.skipif(not (RECORDED / "vllm_metrics.json").exists(), reason="no recorded vLLM output")
def test_recorded_vllm_metric_snapshots():
    """RECORDED on the H200 (vLLM 0.24.0, toy pair, K=4): get_metrics() snapshots before/after single
    requests. The snapshot parser must turn them into a valid chain histogram that sums to the counters."""
    rec = json.loads((RECORDED / "vllm_metrics.json").read_text())
    assert rec["units"], "recording holds no requests"
    for u in rec["units"]:
        st = metrics.from_vllm(u["before"], u["after"])
        lens = V.accepted_lengths(st, rec["k"])
        assert len(lens) == st.drafts and sum(lens) == st.accepted
        assert st.draft_tokens == rec["k"] * st.drafts


@pytest.mark.skipif(not (RECORDED / "vllm_engine_info.json").exists(), reason="no recorded vLLM output")
def test_recorded_engine_aux_layers_map_to_boundaries():
    """RECORDED: the aux layer ids vLLM's running model used for the toy pair (8 layers) and the log line."""
    rec = json.loads((RECORDED / "vllm_engine_info.json").read_text())
    for case in rec["cases"]:
        assert V.fed_boundaries(case["aux_layers"], case["n_layers"]) == case["boundaries"]


def test_aux_layers_from_recorded_log_line(tmp_path):
    """RECORDED on the H200 (vLLM 0.24.0, 2026-11-30, docs/results/vllm_toy_h200.json): a drafter config with nested ids
    [1, 4, 6] on an 8-layer target made the V2 runner log this line: the nested ids were ignored."""
    line = ("(EngineCore_DP0 pid=4711) INFO 11-30 12:00:00 [eagle3_utils.py:31] "
            "Using Eagle3 auxiliary layers from model: (2, 4, 5)")
    assert V.aux_layers_from_log("noise\n" + line + "\nmore") == [2, 4, 5]
    assert V.fed_boundaries(V.aux_layers_from_log(line), 8) == ["S_2", "S_4", "S_5"]
    assert V.aux_layers_from_log("INFO Using auxiliary layers from speculative config: (1, 3, 6)") == [1, 3, 6]
    assert V.aux_layers_from_log("nothing here") is None
    log = tmp_path / "serve.log"
    log.write_text(line + "\n")
    eng = V.ServerEngine.__new__(V.ServerEngine)
    eng.k, eng.server_log = 4, str(log)
    assert eng.fed_boundaries(8) == ["S_2", "S_4", "S_5"]
    eng.server_log = str(tmp_path / "missing.log")
    with pytest.raises(SpecLensError, match="missing.log"):
        eng.aux_ids()


def test_hook_token_count_mismatch_fails_the_run(data_root):
    """An engine whose hooks saw other tokens than the prompts hold (prefix caching, padding) must not leave a
    capture that looks complete: the run is failed with the counts, and the error names them."""
    from backend.engines.base import check_hook_tokens
    from backend.runs.lifecycle import Run

    rd = Run.create("eng-cap", {"kind": "capture", "engine": "vllm", "model": {"path": None},
                                "progress": {"done": 0, "total": 1}}, DataRoot(data_root))
    check_hook_tokens(rd, {"tokens_seen": 12, "forwards": 2}, 12, "vLLM")
    assert rd.manifest()["engine_check"] == {"tokens_expected": 12, "tokens_seen_by_hooks": 12, "forward_passes": 2}
    with pytest.raises(SpecLensError, match=r"mismatch inside vLLM \(9 != 12\)"):
        check_hook_tokens(rd, {"tokens_seen": 9, "forwards": 1}, 12, "vLLM", hint=" (prefix caching?)")
    m = rd.manifest()
    assert m["status"] == "failed" and "9 tokens" in m["error"] and "prefix caching" in m["error"]
    # re-indexed at once
    assert DataRoot(data_root).catalog.read.run_states(["eng-cap"])["status"].tolist() == ["failed"]


def test_prediction_follows_the_runner(tmp_path):
    """Nested ids only (the H200 run of gpu/vllm_suite.py nested_v1/nested_v2, 2026-12-01): V2 ignores them and
    feeds its default S_2,S_4,S_5, V1 reads them (S_1,S_3,S_6). The prediction stored next to what the running
    engine reported must follow the runner the bench asked for."""
    from types import SimpleNamespace

    from backend.engines.serving import predicted_aux

    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
        "vocab_size": 512, "draft_vocab_size": 512, "target_hidden_size": 64, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 1024}
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 3, 6], "use_aux_hidden_state": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    info = SimpleNamespace(hidden_size=64, n_layers=8, model_type="llama",
                           config=SimpleNamespace(vocab_size=512, architectures=["LlamaForCausalLM"]))
    assert predicted_aux(str(tmp_path), info, "vllm")["aux"]["boundaries"] == ["S_2", "S_4", "S_5"]     # auto: V2
    # auto follows vLLM's own choice: a DeepSeek-V3 target runs V1 (seen on the H200), which reads the nested ids
    ds = SimpleNamespace(hidden_size=64, n_layers=8, model_type="deepseek_v3",
                         config=SimpleNamespace(vocab_size=512, architectures=["DeepseekV3ForCausalLM"]))
    pred = predicted_aux(str(tmp_path), ds, "vllm")["aux"]
    assert (pred["boundaries"] == ["S_1", "S_3", "S_6"] and pred["runner"] == "v1"
            and "DeepseekV3" in pred["runner_reason"])
    # an engine option V2 does not support sends a Llama target to V1 too
    pp = predicted_aux(str(tmp_path), info, "vllm", None, {"pipeline_parallel_size": 2})["aux"]
    assert pp["boundaries"] == ["S_1", "S_3", "S_6"] and "pipeline parallelism" in pp["runner_reason"]
    assert predicted_aux(str(tmp_path), info, "vllm", "v2")["aux"]["boundaries"] == ["S_2", "S_4", "S_5"]
    assert predicted_aux(str(tmp_path), info, "vllm", "v1")["aux"]["boundaries"] == ["S_1", "S_3", "S_6"]
    # the prediction is for the release that runs: vLLM 0.21 picks V1 on its own, whose V1 does not read eagle_config
    # yet (from 0.22 on; docs/RELEASES.md), so the nested ids are ignored there too; 0.24 picks V2
    old = predicted_aux(str(tmp_path), info, "vllm", None, None, "0.21.0")["aux"]
    assert old["version"] == "0.21.0" and old["runner"] == "v1" and old["boundaries"] == ["S_2", "S_4", "S_5"]
    assert predicted_aux(str(tmp_path), info, "vllm", None, None, "0.24.0")["aux"]["runner"] == "v2"


# RECORDED on the lent GPU node (H100 80GB, vLLM 0.24.0, 2026-12-05, gpu/fault_suite.py vllm-oom): the output of
# `python -m backend capture --engine vllm` started with settings too large for the memory given. vLLM's parent
# only says "Engine core initialization failed. See root cause above"; the cause is the engine core's stderr.
START_FAILURES = {
    "context": ({"max_model_len": 1000000, "gpu_memory_utilization": 0.02},
                ["max_model_len=319376 (now 1000000)", "gpu_memory_utilization (now 0.02)"]),
    "memory": ({"gpu_memory_utilization": 0.001}, ["gpu_memory_utilization (now 0.001)"]),
    "batch": ({"max_num_batched_tokens": 1000000, "max_num_seqs": 1024, "max_model_len": 4096,
               "gpu_memory_utilization": 0.03},
              ["max_num_batched_tokens (now 1000000)", "max_num_seqs (now 1024)", "gpu_memory_utilization (now 0.03)"]),
}


@pytest.mark.parametrize("case", sorted(START_FAILURES))
def test_recorded_vllm_start_failures_name_the_setting_to_change(case):
    from backend.engines.stderr_tail import root_cause

    text = (RECORDED / "vllm_start" / f"oom_{case}.log").read_text()
    cause = root_cause(text)
    assert cause and cause.startswith("ValueError: ") and "EngineCore" not in cause
    wrapper = RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    assert "--engine-option" not in V.short_error(wrapper)      # without the child's cause there is nothing to name
    settings, named = START_FAILURES[case]
    msg = V.short_error(wrapper, cause, settings)
    assert "\n" not in msg and msg.startswith("GPU memory too small"), msg
    for part in named:
        assert f"--engine-option {part}" in msg, (part, msg)
    assert "--max-model-len" not in msg and "--gpu-memory-utilization" not in msg   # flags the CLI does not take


def test_stderr_tail_keeps_what_a_child_process_printed(monkeypatch):
    """A real child process inherits the redirected fd 2; its last exception line is the root cause, and the
    bytes still reach the real stderr."""
    import subprocess
    import sys

    from backend.engines.stderr_tail import StderrTail, root_cause

    code = ("import sys; sys.stderr.write('(EngineCore pid=7) ERROR 12-05 08:00:01 [core.py:1] torch.OutOfMemoryError:"
            " CUDA out of memory. Tried to allocate 2.00 GiB\\nRuntimeError: Engine core initialization failed\\n')")
    import os
    import time

    import backend.engines.stderr_tail as st_mod

    class SlowForward:              # a loaded machine: the pump forwards each chunk 0.3 s late
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def write(fd, data):
            if fd != 2:
                time.sleep(0.3)
            return os.write(fd, data)

    monkeypatch.setattr(st_mod, "os", SlowForward())
    with StderrTail() as tail:
        subprocess.run([sys.executable, "-c", code], check=True)
        tail.settle(quiet_s=0)      # no quiet wait: only the mark through the pipe makes sure the child's bytes are in
    assert root_cause(tail.text()) == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    msg = V.short_error(RuntimeError("Engine core initialization failed."), root_cause(tail.text()),
                        {"gpu_memory_utilization": 0.3})
    assert "raise --engine-option gpu_memory_utilization (now 0.3)" in msg


def test_compiled_capture_options_and_aux_ids():
    """`--engine-option compiled=true` makes a compiled capture (not a vllm.LLM keyword); the aux ids its engine arms
    are the S_i asked for (F needs none); anything but true/false is a one-line error."""
    from backend.settings import CaptureSettings

    s = CaptureSettings(model="m", prompts="p", engine="vllm")
    o = V.capture_options(s, 1, {"compiled": True, "gpu_memory_utilization": 0.5})
    assert o.compiled is True and "compiled" not in o.extra and o.gpu_memory_utilization == 0.5
    assert V.capture_options(s, 1, {}).compiled is False
    with pytest.raises(SpecLensError, match="compiled=yes: expected true or false"):
        V.capture_options(s, 1, {"compiled": "yes"})
    assert V.aux_ids_for(["S_29", "S_2", "F", "S_16", "S_32"], 32) == [2, 16, 29, 32]
    assert V.aux_ids_for(["F"], 32) == []


def test_a_resumed_capture_keeps_its_engine_mode():
    """A capture started in the compiled engine resumes only in it, and an eager one only in the eager engine: the
    error names the option; the same mode, or a run of another engine, passes."""
    V.check_same_mode("r", "vllm 0.24.0, compiled", True)
    V.check_same_mode("r", "vllm 0.24.0", False)
    V.check_same_mode("r", "transformers 5.17.0", False)
    with pytest.raises(SpecLensError, match="compiled engine; resume it with --engine-option compiled=true"):
        V.check_same_mode("r", "vllm 0.24.0, compiled", False)
    with pytest.raises(SpecLensError, match="eager engine; resume it without --engine-option compiled=true"):
        V.check_same_mode("r", "vllm 0.24.0", True)


def test_a_resumed_vllm_capture_reads_its_manifest_and_keeps_its_state_off_the_gpu(tiny_llama, prompts_file,
                                                                                    data_root, one_torch_thread):
    """What the first kill trial of a compiled vLLM capture found on the GPU (2026-12-07): its resume died at
    `rd.manifest.get` (a method, not a dict); fixed, the resume loaded the checkpoint's statistics onto the GPU in
    the command's own process, vLLM then spawned its engine core instead of forking it, and that engine failed. Here:
    a real interrupted capture (HF engine, CPU) resumed through the vLLM session's own `begin`, and the loop's
    `open_or_resume` for a target on cuda: the state it hands on stays on the CPU."""
    import dataclasses

    from backend.capture import run_capture
    from backend.engines.base import CaptureSettings
    from backend.engines.hf import HFCapture
    from backend.runs.capture_run import open_or_resume
    from backend.runs.lifecycle import Run

    s = CaptureSettings(model=str(tiny_llama), prompts=str(prompts_file), limit=3, device="cpu", sample_tokens=64)
    s.checkpoint_every = 1
    data = DataRoot(data_root)
    cut = run_capture(s, name="cut", data=data, progress=False, stop_after=1)
    rd = Run.open(cut.run_id, data)
    session = V.VllmCapture.__new__(V.VllmCapture)          # without vLLM: begin() and its options only
    session.opts = V.VllmOptions(compiled=True)
    rd.record(engine_version="vllm 0.24.0")                   # as if started in vLLM's eager engine
    with pytest.raises(SpecLensError, match="eager engine; resume it without --engine-option compiled=true"):
        session.begin(rd, cut.run_id, 1, [], [], None, None)
    session.opts = V.VllmOptions(compiled=False)
    session.begin(rd, cut.run_id, 1, [], [], None, None)      # the same mode: it resumes

    target = dataclasses.replace(HFCapture(s).target(), device="cuda")
    _, start, state, sample = open_or_resume(cut.run_id, s, target, rd.manifest()["boundaries"], data, 3)
    assert start == 1 and state is not None and sample
    assert {str(t.device) for t in state.tensors().values()} == {"cpu"}
