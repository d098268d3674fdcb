"""The SGLang adapter's logic on CPU (SGLang itself runs only on the GPU node: gpu/sglang_suite.py).

Real here: the server lifecycle against a real child process (SGLang absent: `python -m sglang.launch_server`
exits at once, which is exactly a server that fails to start), a real port held by a real socket, a real HTTP
server that never answers. The hook factory is run on a real HF model in SGLang's hook order. Response parsing
is checked against meta_info RECORDED from SGLang 0.5.15 on the H200 (tests/data/recorded/sglang_*), labelled.
"""

import json
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from backend import coords, metrics
from backend.engines import sglang as S
from backend.engines.sglang_hooks import capture, hook_specs
from backend.errors import SpecLensError

RECORDED = Path(__file__).parent / "data" / "recorded"


def test_server_that_fails_to_start_shows_its_log_and_leaves_nothing(tmp_path):
    spec = S.ServerSpec(model=str(tmp_path / "no-model"))
    t0 = time.time()
    with pytest.raises(SpecLensError) as e:
        S.Server(spec, log=tmp_path / "server.log", start_timeout=60)
    msg = str(e.value)
    assert "exited with code" in msg and "\n" not in msg
    assert "sglang" in msg.lower()            # the log tail names what went wrong (no module / bad model)
    assert time.time() - t0 < 60 and S._LIVE == []


def test_port_in_use_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(SpecLensError, match=f"port {port} .* in use"):
            S.Server(S.ServerSpec(model="m", port=port), log=tmp_path / "log")


def test_request_timeout_and_unreachable_are_one_line():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    conns = []
    threading.Thread(target=lambda: conns.append(srv.accept()), daemon=True).start()   # accepts, never answers
    with pytest.raises(SpecLensError, match="no answer within 1 s"):
        S.generate(f"http://127.0.0.1:{port}", [1, 2, 3], 4, timeout=1)
    srv.close()
    with pytest.raises(SpecLensError, match="unreachable"):
        S.generate("http://127.0.0.1:9", [1], 1, timeout=2)


def test_chain_flags_and_tree_flags():
    a = S.ServerSpec(model="t", drafter="d", num_spec_tokens=4).argv(30000)
    i = a.index("--speculative-num-steps")
    assert a[i + 1] == "4" and a[a.index("--speculative-eagle-topk") + 1] == "1"
    assert a[a.index("--speculative-num-draft-tokens") + 1] == "5"      # chain: K + 1
    t = S.ServerSpec(model="t", drafter="d", num_spec_tokens=3,
                     extra={"speculative-eagle-topk": 4, "speculative-num-draft-tokens": 8}).argv(1)
    assert t[t.index("--speculative-eagle-topk") + 1] == "4" and t[t.index("--speculative-num-draft-tokens") + 1] == "8"
    c = S.ServerSpec(model="t", capture=True, hooks=hook_specs("/x", ["S_0", "F"], 8)).argv(1)
    assert "--disable-cuda-graph" in c and "--disable-radix-cache" in c
    hooks = json.loads(c[c.index("--forward-hooks") + 1])
    assert hooks[0]["hook_factory"] == "backend.engines.sglang_hooks:capture"


def test_accepted_lengths_from_histogram():
    meta = {"spec_verify_ct": 6, "spec_num_correct_drafts": 13, "spec_correct_drafts_histogram": [1, 2, 0, 1, 2],
            "spec_accept_length": 20 / 6, "completion_tokens": 20}
    lens = S.accepted_lengths(meta, 4)
    assert lens == [0, 1, 1, 3, 4, 4] and sum(lens) == meta["spec_num_correct_drafts"]
    r = metrics.sglang_request(meta, 4)
    assert r.tau == pytest.approx(1 + 13 / 6) and r.raw_accept_length == pytest.approx(20 / 6)
    assert r.stats.per_pos == [5, 3, 3, 2]
    with pytest.raises(SpecLensError, match="tree"):
        S.accepted_lengths({"spec_correct_drafts_histogram": [0, 0, 0, 1]}, 2)


@pytest.mark.parametrize("exact", [False, True])
def test_hook_factory_in_sglang_order_matches_hf(tiny_llama, tmp_path, one_torch_thread, exact):
    """SGLang calls the factory's hook on embed_tokens, each layer, norm, then the model. Driven in that order by a
    real HF model's own forward hooks, the reducer must give the HF boundaries; reset/collect files work; a capture
    with exact sums (hook_specs(..., exact=True)) keeps them inside the server too."""
    from backend.engines import hf
    from backend.stats import StreamingStats

    lm = hf.load(tiny_llama, "cpu", "fp32")
    labels = coords.labels(coords.all_boundaries(lm.n_layers))
    cfg = hook_specs(str(tmp_path), labels, lm.n_layers, 32, 8, exact)[0]["config"]
    assert ("exact" in cfg) == exact
    h = capture(cfg)
    inner = lm.model.model
    mods = [inner.embed_tokens, *inner.layers, inner.norm, inner]
    handles = [m.register_forward_hook(h) for m in mods]
    try:
        seqs = [[5, 6, 7, 8], [9, 10, 11]]
        with torch.no_grad():
            (tmp_path / "reset.request").write_text("1")
            hf.forward(lm, [1])                      # the trigger: left out
            for s in seqs:
                hf.forward(lm, s)
            (tmp_path / "collect.request").write_text("1")
            hf.forward(lm, [1])
    finally:
        for x in handles:
            x.remove()
    got = torch.load(tmp_path / "state.rank0.pt", weights_only=False)
    assert got["tokens_seen"] == 7 and got["forwards"] == 2
    ref = StreamingStats(labels, lm.hidden_size, "cpu", exact=exact)
    assert ("exact" in got["state"]) == exact
    with torch.no_grad():
        for s in seqs:
            states = {}
            with hf.BoundaryHooks(lm, coords.all_boundaries(lm.n_layers), lambda k, x: states.__setitem__(k, x)):  # noqa: B023
                hf.forward(lm, s)
            for k in range(len(labels)):
                ref.update(k, states[k])
    for key, v in ref.state.tensors().items():
        if v.dtype == torch.int64:       # exact sums: the same tokens, the same integers
            assert torch.equal(got["state"][key], v), key
        else:
            assert torch.allclose(got["state"][key], v, atol=1e-5, rtol=1e-5), key


@pytest.mark.skipif(not (RECORDED / "sglang_meta_info.json").exists(), reason="no recorded SGLang output")
def test_recorded_sglang_meta_info():
    """RECORDED on the H200 (SGLang 0.5.15, toy pair, chain K=4, 2026-12-01): per-request meta_info. Our tau is
    1 + correct/verify_ct. SGLang's spec_accept_length = completion/verify_ct counts the prefill's token (biased
    high by 1/verify_ct) but not the accepted drafts cut at max_new_tokens or the stop token, which SGLang still
    counts as correct (as vLLM and the HF engine do): completion = 1 + verify_ct + correct - cut, 0 <= cut <= K.
    Recorded: cut was 0 on 7 of 24 requests (raw above tau) and 1 to 4 on the others (raw at or below tau)."""
    rec = json.loads((RECORDED / "sglang_meta_info.json").read_text())
    assert rec["units"]
    for u in rec["units"]:
        m, k = u["meta_info"], u["k"]
        lens = S.accepted_lengths(m, k)
        assert len(lens) == m["spec_verify_ct"] and sum(lens) == m["spec_num_correct_drafts"]
        r = metrics.sglang_request(m, k)
        assert r.raw_accept_length == pytest.approx(m["completion_tokens"] / m["spec_verify_ct"])
        cut = 1 + m["spec_verify_ct"] + m["spec_num_correct_drafts"] - m["completion_tokens"]
        assert 0 <= cut <= k
        assert r.tau == pytest.approx(1 + m["spec_num_correct_drafts"] / m["spec_verify_ct"])
        assert (r.raw_accept_length > r.tau) == (cut == 0)
    cuts = [1 + u["meta_info"]["spec_verify_ct"] + u["meta_info"]["spec_num_correct_drafts"]
            - u["meta_info"]["completion_tokens"] for u in rec["units"]]
    assert 0 in cuts and max(cuts) > 0          # both cases are in the recording


@pytest.mark.skipif(not (RECORDED / "sglang_engine_info.json").exists(), reason="no recorded SGLang output")
def test_recorded_sglang_layers_to_capture():
    rec = json.loads((RECORDED / "sglang_engine_info.json").read_text())
    for c in rec["cases"]:
        assert c["boundaries"] == [f"S_{i}" for i in sorted(c["layers_to_capture"])]


def test_recorded_reference_meta_info():
    """RECORDED on the H200 (SGLang 0.5.15, 2026-11-30, sglang_toy_h200.json): a dummy-weight drafter, chain of 3
    steps; each response's meta_info. SGLang's own spec_accept_length 1.0159 = 64/63 is the prefill-token bias;
    SpecLens's tau is 1.0 (no draft accepted)."""
    meta = {"spec_verify_ct": 63, "completion_tokens": 64, "spec_num_correct_drafts": 0, "spec_accept_length": 1.0159,
            "spec_correct_drafts_histogram": [63], "spec_accept_histogram": [63]}
    r = metrics.sglang_request(meta, 3)
    assert r.tau == 1.0 and r.raw_accept_length == pytest.approx(64 / 63, abs=1e-4)
    assert r.stats.draft_tokens == 3 * 63 and r.stats.accepted == 0 and not any(r.stats.per_pos or [])
    assert S.accepted_lengths(meta, 3) == [0] * 63


def test_bench_engines_are_built_from_typed_settings(tmp_path):
    """BenchSettings -> EngineSettings -> each registered engine's make_engine, attached to a running server by URL
    (a local HTTP server answering /server_info, /v1/models and /version as SGLang and vLLM do)."""
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from backend.bench import BenchSettings
    from backend.engines.base import EngineSettings, adapter

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"version": "0.5.15"} if self.path == "/server_info"
                              else {"data": [{"id": "served"}], "version": "0.24.0"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_port}"
        s = BenchSettings(target=str(tmp_path), prompts="p", drafter="d", engine="sglang", server_url=url,
                          num_spec_tokens=3, dtype="bf16", engine_options={"speculative-eagle-topk": 1})
        es = s.engine_settings()
        assert isinstance(es, EngineSettings) and es.engine_dtype() == "bfloat16" and es.options == {
            "speculative-eagle-topk": 1}
        sg = adapter("sglang").make_engine(es, drafter="d", eos=[2])
        assert (sg.version, sg.k, sg.url) == ("0.5.15", 3, url)
        vl = adapter("vllm").make_engine(es, drafter=None, eos=[2])
        assert (vl.version, vl.k, vl.model) == ("0.24.0", 0, "served")
        with pytest.raises(SpecLensError, match="in-process"):
            adapter("hf").make_engine(es, drafter="d", eos=[])
        with pytest.raises(SpecLensError, match="unknown; use hf, vllm, sglang"):
            adapter("trt")
    finally:
        srv.shutdown()
