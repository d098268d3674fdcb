"""The conventions table: what each producer's ids mean, as boundaries (docs/CONVENTIONS.md#layer-ids)."""

import pytest

from backend import coords
from backend.coords import S, final, resolve_ids, teacher_boundary
from backend.errors import SpecLensError

N = 32


def test_labels_and_order():
    assert [b.label for b in coords.all_boundaries(3)] == ["S_0", "S_1", "S_2", "S_3", "F"]
    assert coords.sort_labels(["F", "S_10", "S_2"]) == ["S_2", "S_10", "F"]
    assert coords.parse("S_7") == S(7) and coords.parse("F", 8) == final(8)
    with pytest.raises(SpecLensError):
        coords.parse("layer7")


def test_vllm_ids_are_inputs_of_layers_and_default():
    assert resolve_ids("vllm", [2, 16, 29], N, version="0.24.0") == [S(2), S(16), S(29)]
    assert resolve_ids("vllm", None, N, version="0.24.0") == [S(2), S(16), S(29)]
    assert resolve_ids("vllm", [0, 32], N, version="0.24.0") == [S(0), S(32)]
    with pytest.raises(SpecLensError, match="valid ids are 0..32"):
        resolve_ids("vllm", [-1, 5], N, version="0.24.0")


def test_vllm_deepseek_refuses_0_and_n():
    assert resolve_ids("vllm", [1, 30], 61, version="0.24.0", family="deepseek_v3") == [S(1), S(30)]
    with pytest.raises(SpecLensError, match="cannot capture"):
        resolve_ids("vllm", [0, 5], 61, version="0.24.0", family="kimi_k2")


def test_sglang_plus_one_and_family_rules():
    assert resolve_ids("sglang", [1, 15, 28], N, version="0.5.15") == [S(2), S(16), S(29)]
    assert resolve_ids("sglang", [-1, 3], N, version="0.5.15") == [S(0), S(4)]
    assert resolve_ids("sglang", None, N, version="0.5.15") == [S(2), S(16), S(29)]  # no +1 on the default
    with pytest.raises(SpecLensError):
        resolve_ids("sglang", [31], N, version="0.5.15")  # S_N impossible
    # DeepSeek-V3: +1 only when ids[0] == 1
    assert resolve_ids("sglang", [1, 29, 57], 61, version="0.5.23", family="deepseek_v3") == [S(2), S(30), S(58)]
    assert resolve_ids("sglang", [2, 30, 58], 61, version="0.5.23", family="deepseek_v3") == [S(2), S(30), S(58)]
    # GPT-OSS: S_a when max(ids) == N, from 0.5.17 (gpt_oss.py in the wheels); 0.5.15 adds 1 unconditionally
    assert resolve_ids("sglang", [2, 12, 24], 24, version="0.5.17", family="gpt_oss") == [S(2), S(12), S(24)]
    assert resolve_ids("sglang", [1, 11, 20], 24, version="0.5.23", family="gpt_oss") == [S(2), S(12), S(21)]
    assert resolve_ids("sglang", [1, 11, 20], 24, version="0.5.15", family="gpt_oss") == [S(2), S(12), S(21)]
    with pytest.raises(SpecLensError):
        resolve_ids("sglang", [2, 12, 24], 24, version="0.5.15", family="gpt_oss")
    # DeepSeek: unconditional +1 in 0.5.5..0.5.12, conditional from 0.5.13, no EAGLE-3 capture before 0.5.5
    assert resolve_ids("sglang", [2, 30, 58], 61, version="0.5.12", family="deepseek_v3") == [S(3), S(31), S(59)]
    assert resolve_ids("sglang", [2, 30, 58], 61, version="0.5.13", family="deepseek_v3") == [S(2), S(30), S(58)]
    with pytest.raises(SpecLensError, match="no EAGLE-3 aux-state capture"):
        resolve_ids("sglang", None, 61, version="0.5.4", family="deepseek_v3")
    assert resolve_ids("sglang", [1, 15, 28], N, version="0.5.15.post1") == [S(2), S(16), S(29)]


def test_training_producers():
    assert resolve_ids("speculators", None, N, version="0.4.1") == [S(3), S(17), S(30)]
    assert resolve_ids("speculators", [2, 16, 29], N, version="0.4.1") == [S(3), S(17), S(30)]
    assert teacher_boundary("speculators", N, version="0.4.1") == S(N)
    assert resolve_ids("speculators", [2, 16, 29], N, version="0.9.0") == [S(2), S(16), S(29)]
    assert resolve_ids("specforge", [1, 15, 28], N, version="0.2.0") == [S(2), S(16), S(29)]
    assert teacher_boundary("specforge", N, version="0.2.0") == final(N)
    with pytest.raises(SpecLensError):
        resolve_ids("specforge", [-1, 3], N, version="0.2.0")


def test_hf_hidden_states_last_is_F():
    assert resolve_ids("hf", [0, 5, 32], N) == [S(0), S(5), final(N)]


def test_unknown_producer_or_version():
    with pytest.raises(SpecLensError, match="unknown producer"):
        resolve_ids("tgi", [1], N)
    with pytest.raises(SpecLensError, match="no convention known"):
        resolve_ids("vllm", [1], N, version="0.34.0")   # the table covers 0.20..0.33
    with pytest.raises(SpecLensError, match="no convention known"):
        resolve_ids("sglang", [1], N, version="0.5.24")


def test_every_default_version_has_a_convention():
    """A bare `bench --producer sglang` used vLLM's version (0.24.0) and failed: each producer now has its own."""
    from backend.coords import DEFAULT_VERSIONS, convention_for

    for producer, version in DEFAULT_VERSIONS.items():
        assert convention_for(producer, version).producer == producer


def test_seen_rows_say_what_ran() -> None:
    """A conventions row is `seen` only with the runs that showed it; the rest stays `inferred`."""
    from backend.coords import conventions

    for c in conventions():
        assert c.status in ("seen", "inferred"), c
        assert (c.status == "seen") == bool(c.seen), f"{c.producer} {c.versions} {c.families}: status vs seen"
        if c.status == "seen":
            assert "H200" in c.seen or "CPU" in c.seen, c.seen
