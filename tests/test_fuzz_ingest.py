"""Property-based fuzzing (hypothesis) of every file the catalog ingests, on real run directories.

Seed runs come from the project's own code (tests/conftest.py build_bench_data: a capture `cap-tiny` and the bench
runs `spec-oracle`, `spec-random` and its baseline; plus an interrupted capture with its checkpoint and an
interrupted bench with its journal). Each example copies one seed run under a new name and damages one of its
files: the manifest (truncation, random bytes, a key deleted or given a value of the wrong type, NaN, huge
numbers), a Parquet table (truncation, random bytes, a column dropped or turned into text, rows dropped or
duplicated, NaN/inf/huge values), a safetensors file (truncation, random bytes, a lying header, flipped data
bytes), annotations.json, summary.json, journal.jsonl and checkpoint.safetensors. Properties:

- `catalog.refresh` never raises;
- a run whose damage makes it unindexable is `quarantined` with a one-line reason; every other run keeps a
  known status, and a run shown `complete` has whole tables (one stats row per boundary, one prompt row per unit);
- the good seed runs stay present and complete with all their rows;
- afterwards every page (Runs, Compare, Layer alignment, Hidden-state stats) opened with the damaged runs selected
  through its query parameters shows no exception.

SPECLENS_FUZZ_EXAMPLES (default 4) sets the number of examples per damaged file (13 files); `make soak` runs many
more, with random seeds (SPECLENS_FUZZ_SOAK=1).
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.store import validate
from backend.store.data_root import DataRoot

EXAMPLES = int(os.environ.get("SPECLENS_FUZZ_EXAMPLES", "4"))
GOOD = ("cap-tiny", "spec-oracle", "spec-random", "spec-random-baseline")
KNOWN = {"complete", "running", "interrupted", "failed", "quarantined"}
PARQUET_KEYS = {"stats.parquet": {"boundary", "ord"}, "prompts.parquet": {"repeat", "prompt_index", "prompt_id"},
                "steps.parquet": {"repeat", "prompt_id", "step", "accepted"}}
COUNTED = {"stats.parquet", "prompts.parquet"}       # the catalog checks their row counts against the manifest
# seed run -> files the fuzzer may damage
FILES = {
    "cap-tiny": ["manifest.json", "stats.parquet", "stats.safetensors", "sample.safetensors", "annotations.json"],
    "spec-oracle": ["manifest.json", "prompts.parquet", "steps.parquet", "summary.json", "annotations.json"],
    "cap-part": ["manifest.json", "checkpoint.safetensors"],
    "bench-part": ["manifest.json", "journal.jsonl"],
}
# manifest keys (dotted) -> values of a wrong type for them
WRONG = {
    "status": [5, None, "done", "COMPLETE", ["complete"]],
    "kind": [3, ["capture"], {"k": 1}],
    "headline": ["many", 7, [1, 2]],
    "headline.tokens": ["210", [1], 2**70, -(2**70), float("nan"), float("inf"), True, 1.5],
    "headline.nonfinite": ["x", [1], {"S_0": "many"}, {"S_0": 2**80}],
    "progress": ["half", 3],
    "progress.total": ["8", float("nan"), 2**64, {"n": 1}],
    "model": ["llama", 1],
    "model.path": [5, ["a"], {"p": 1}],
    "model.n_layers": ["four", 4.5, 2**65],
    "boundaries": ["S_0,S_1", [1, 2], {"S_0": 1}],
    "tags": ["fast", [1]],
    "created": [20261201, ["2026"]],
    "bench": ["fast", [1.5]],
    "bench.tau": ["2.2", [2.2], {"v": 1}],
    "bench.speedup": [1.4, "1.4x", [1.4]],
    "bench.speedup.mean": ["fast", [1]],
    "bench.lossless": ["yes", 1],
    "num_spec_tokens": ["3", 3.5, 2**70],
    "repeats": ["two", [2]],
    "drafter": [5, [1]],
}
# manifest keys (dotted) -> odd values of the right type: never quarantined, pages must cope
ODD = {
    "bench.tau": [float("nan"), float("inf"), -1e308, 1e308, 0],
    "bench.speedup.mean": [float("nan"), float("-inf"), 1e300],
    "bench.acceptance_rate": [float("nan"), 5.0, -3.0],
    "headline.tokens": [0, 2**62, -5],
    "progress.done": [-1, 2**62],
    "baseline_run": ["../../etc/passwd", "no-such-run", "x'); DROP TABLE runs; --", ""],
    "model.path": ["/etc/passwd", "../../..", "", "x'; DROP TABLE runs; --"],
    "dataset": ["<script>alert(1)</script>", "x" * 5000, ""],
    "notes": ["'; DROP TABLE runs; --", "\x00\x01"],
    "temperature": [float("nan"), 1e308],
}
# keys whose deletion leaves a run indexable (status deleted: quarantined)
DELETABLE = ["headline", "progress", "model", "boundaries", "bench", "created", "kind", "engine", "dtype",
             "baseline_run", "drafter", "headline.tokens", "bench.speedup", "model.path", "status"]


# ---------------------------------------------------------------------------- seed data


def _interrupted_bench(root: Path) -> None:
    """`bench-part`: the baseline run as it looks after a crash half-way (journal of half its units, no tables)."""
    src, dst = root / "runs" / "spec-random-baseline", root / "runs" / "bench-part"
    dst.mkdir()
    m = json.loads((src / "manifest.json").read_text())
    rows = pq.read_table(src / "prompts.parquet").to_pylist()
    half = rows[: len(rows) // 2]
    (dst / "journal.jsonl").write_text("".join(json.dumps({"row": r, "accepted": []}) + "\n" for r in half))
    m.update(status="running", pid=2**22 + 4321, progress={"done": len(half), "total": len(rows)}, run_id="bench-part")
    for k in ("bench", "headline", "finished"):
        m.pop(k, None)
    (dst / "manifest.json").write_text(json.dumps(m, indent=2))


@pytest.fixture(scope="module")
def seed(bench_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seed runs: bench_root's four, an interrupted capture (with its checkpoint) and an interrupted bench."""
    from backend.capture import CaptureSettings, run_capture

    root = tmp_path_factory.mktemp("fuzz-seed") / "data"
    shutil.copytree(bench_root / "runs", root / "runs")
    models = bench_root.parent / f"{bench_root.name}-models"
    s = CaptureSettings(model=str(models / "tiny-target"), prompts=str(models / "spec_bench_mini.jsonl"), limit=3,
                        device="cpu", sample_tokens=64)
    s.checkpoint_every = 1
    run_capture(s, name="cap-part", data=DataRoot(root), progress=False, stop_after=1)
    DataRoot(root).run_dir("cap-part").update(pid=2**22 + 1234)         # its process is gone
    _interrupted_bench(root)
    (root / "runs" / "cap-tiny" / "annotations.json").write_text(json.dumps({"tags": ["seed"], "notes": "n"}))
    DataRoot(root).catalog.write.refresh()
    return root


@pytest.fixture(scope="module")
def fuzz_root(seed: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root holding the seed runs; each example adds one damaged copy (the catalog refreshes incrementally,
    as under a dashboard)."""
    root = tmp_path_factory.mktemp("fuzz") / "data"
    shutil.copytree(seed / "runs", root / "runs")
    DataRoot(root).catalog.write.refresh()
    return root


# ---------------------------------------------------------------------------- mutations


@dataclass
class Damage:
    source: str
    file: str
    op: str
    bad: bool | None            # True: must be quarantined; False: must not be; None: either (one-line reason)


def _set(d: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        if not isinstance(d.get(k), dict):
            d[k] = {}
        d = d[k]
    d[keys[-1]] = value


def _delete(d: dict, dotted: str) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        d = d.get(k) if isinstance(d.get(k), dict) else {}
    d.pop(keys[-1], None)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8)


@st.composite
def byte_damage(draw, data: bytes) -> tuple[bytes, str]:
    """Truncation, random bytes, or a few bytes overwritten."""
    kind = draw(st.sampled_from(["truncate", "random", "overwrite"]))
    if kind == "truncate":
        n = draw(st.integers(0, max(0, len(data) - 1)))
        return data[:n], f"truncate to {n} of {len(data)} bytes"
    if kind == "random":
        return draw(st.binary(max_size=256)), "random bytes"
    out = bytearray(data)
    pos = draw(st.lists(st.integers(0, len(data) - 1), min_size=1, max_size=8))
    for p in pos:
        out[p] = draw(st.integers(0, 255))
    return bytes(out), f"overwrite bytes at {sorted(pos)[:4]}"


@st.composite
def manifest_damage(draw, data: bytes) -> tuple[bytes, str, bool | None]:
    m = json.loads(data)
    kind = draw(st.sampled_from(["bytes", "wrong", "odd", "delete", "any", "not_object"]))
    if kind == "bytes":
        out, op = draw(byte_damage(data))
        try:
            ok = validate.check_manifest(json.loads(out)) is None
        except ValueError:
            ok = False
        return out, op, None if ok else True
    if kind == "not_object":
        v = draw(st.sampled_from([[], [m], "complete", 1, None]))
        return json.dumps(v).encode(), f"manifest replaced by {json.dumps(v)[:30]}", True
    m2 = copy.deepcopy(m)
    if kind == "wrong":
        key = draw(st.sampled_from(sorted(WRONG)))
        value = draw(st.sampled_from(WRONG[key]))
        _set(m2, key, value)
        return json.dumps(m2).encode(), f"{key} = {value!r:.40}", True
    if kind == "odd":
        key = draw(st.sampled_from(sorted(ODD)))
        value = draw(st.sampled_from(ODD[key]))
        _set(m2, key, value)
        return json.dumps(m2).encode(), f"{key} = {value!r:.40}", False
    if kind == "delete":
        key = draw(st.sampled_from(DELETABLE))
        _delete(m2, key)
        return json.dumps(m2).encode(), f"delete {key}", key == "status"
    key = draw(st.sampled_from(sorted(set(WRONG) | set(ODD))))
    value = draw(json_values)
    _set(m2, key, value)
    return json.dumps(m2).encode(), f"{key} = {json.dumps(value)[:40]}", None


def _column_as_text(t: pa.Table, name: str) -> pa.Table:
    i = t.schema.get_field_index(name)
    return t.set_column(i, name, pa.array([f"x!{j}" for j in range(t.num_rows)], pa.string()))


def _numeric_odd(t: pa.Table, name: str, value) -> pa.Table:
    i = t.schema.get_field_index(name)
    typ = t.schema.field(name).type
    if pa.types.is_integer(typ):
        # an odd value an int64 column can hold (1e308 cannot: the largest int64 stands in for it)
        value = max(min(int(value), 2**63 - 1), -2**63) if math.isfinite(value) else 2**62
        return t.set_column(i, name, pa.array([value] * t.num_rows, pa.int64()))
    return t.set_column(i, name, pa.array([value] * t.num_rows, pa.float64()))


@st.composite
def parquet_damage(draw, path: Path) -> tuple[bytes | None, pa.Table | None, str, bool | None]:
    name = path.name
    data = path.read_bytes()
    t = pq.read_table(path)
    cols = [c for c in t.column_names if c != "run_id"]
    numeric = [c for c in cols
               if pa.types.is_integer(t.schema.field(c).type) or pa.types.is_floating(t.schema.field(c).type)]
    kind = draw(st.sampled_from(["bytes", "drop_column", "as_text", "odd_values", "drop_rows", "dup_rows", "empty"]))
    keys, counted = PARQUET_KEYS[name], name in COUNTED
    if kind == "bytes":
        out, op = draw(byte_damage(data))
        return out, None, op, True if len(out) < len(data) or op == "random bytes" else None
    if kind == "drop_column":
        c = draw(st.sampled_from(cols))
        return None, t.drop_columns([c]), f"drop column {c}", True if c in keys else None
    if kind == "as_text":
        c = draw(st.sampled_from(numeric))
        return None, _column_as_text(t, c), f"column {c} as text", True
    if kind == "odd_values":
        c = draw(st.sampled_from([c for c in numeric if c not in keys] or numeric))
        v = draw(st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 0.0]))
        return None, _numeric_odd(t, c, v), f"column {c} = {v}", None if c in keys else False
    if kind == "drop_rows":
        k = draw(st.integers(0, t.num_rows - 1))
        return None, t.slice(0, k), f"keep {k} of {t.num_rows} rows", True if counted else None
    if kind == "dup_rows":
        return None, pa.concat_tables([t, t.slice(0, 1)]), "one row duplicated", True if counted else None
    return None, t.slice(0, 0), "no rows", True if counted else None


def _library_rejects(data: bytes) -> bool:
    """The oracle: does the safetensors library itself refuse these bytes?"""
    from safetensors import deserialize

    try:
        deserialize(data)
        return False
    except Exception:  # noqa: BLE001 - SafetensorError, or a panic surfaced as another type
        return True


@st.composite
def safetensors_damage(draw, data: bytes) -> tuple[bytes, str, bool]:
    """Truncation, random bytes, a lying header (length, JSON, dtype, offsets) or garbage tensor data; the run must
    be quarantined exactly when the safetensors library refuses the file."""
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    kind = draw(st.sampled_from(["bytes", "header_len", "header_json", "dtype", "offsets", "flip_data"]))
    if kind == "bytes":
        out, op = draw(byte_damage(data))
    elif kind == "header_len":
        v = draw(st.sampled_from([2**63, len(data), n + 1, 0]))
        out, op = struct.pack("<Q", v) + data[8:], f"header length {v}"
    elif kind == "header_json":
        junk = draw(st.sampled_from([b"[1,2]", b"{", b"\xff\xfe", b'{"a": 1}', b"null"]))
        out, op = struct.pack("<Q", len(junk)) + junk + data[8 + n:], f"header {junk!r}"
    elif kind == "flip_data":
        buf = bytearray(data)
        for p in draw(st.lists(st.integers(8 + n, len(data) - 1), min_size=1, max_size=16)):
            buf[p] = draw(st.integers(0, 255))
        out, op = bytes(buf), "data bytes overwritten (values become garbage, NaN or inf)"
    else:
        k = draw(st.sampled_from([k for k in header if k != "__metadata__"]))
        h = copy.deepcopy(header)
        if kind == "dtype":
            h[k]["dtype"] = draw(st.sampled_from(["F64", "I8", "Q4", "", 3]))
            op = f"{k}.dtype = {h[k]['dtype']!r}"
        else:
            a, b = h[k]["data_offsets"]
            h[k]["data_offsets"] = draw(st.sampled_from([[a, b + 4], [b, a], [-1, b], [a, 2**70], "x"]))
            op = f"{k}.data_offsets = {h[k]['data_offsets']!r}"
        hb = json.dumps(h).encode()
        hb += b" " * (-len(hb) % 8)
        out = struct.pack("<Q", len(hb)) + hb + data[8 + n:]
    return out, op, _library_rejects(out)


@st.composite
def text_damage(draw, data: bytes) -> tuple[bytes, str]:
    kind = draw(st.sampled_from(["bytes", "json", "lines"]))
    if kind == "bytes":
        return draw(byte_damage(data))
    if kind == "json":
        v = draw(json_values)
        return json.dumps(v).encode(), f"replaced by {json.dumps(v)[:40]}"
    extra = draw(st.lists(st.sampled_from([b"{", b"[]", b"5", b'{"row": 1}', b"\xff", b'{"row": {"repeat": "x"}}']),
                          min_size=1, max_size=4))
    return data + b"\n".join(extra), f"lines appended {extra!r:.60}"


PAIRS = [(s, f) for s in sorted(FILES) for f in FILES[s]]


@st.composite
def damage(draw, seed_root: Path, source: str, name: str) -> tuple[Damage, dict[str, bytes | pa.Table]]:
    path = seed_root / "runs" / source / name
    data = path.read_bytes() if path.exists() else b'{"tags": ["x"], "notes": ""}'
    if name == "manifest.json":
        out, op, bad = draw(manifest_damage(data))
    elif name.endswith(".parquet"):
        raw, table, op, bad = draw(parquet_damage(path))
        return Damage(source, name, op, bad), {name: raw if table is None else table}
    elif name == "checkpoint.safetensors":
        (out, op), bad = draw(byte_damage(data)), False          # the catalog never reads a checkpoint
    elif name.endswith(".safetensors"):
        out, op, bad = draw(safetensors_damage(data))
    else:                                                        # annotations, summary, journal: never quarantine
        (out, op), bad = draw(text_damage(data)), False
    return Damage(source, name, op, bad), {name: out}


# ---------------------------------------------------------------------------- the property

_counter = itertools.count()
DAMAGED: list[tuple[str, Damage]] = []        # every damaged run of this session, for the page test


def _good_runs_whole(root: Path) -> None:
    runs = DataRoot(root).catalog.read.list_runs().set_index("run_id")
    for rid in GOOD:
        assert runs.loc[rid, "status"] == "complete", (rid, runs.loc[rid, "error"])
    assert len(DataRoot(root).catalog.read.boundary_stats(["cap-tiny"])) == 6
    assert len(DataRoot(root).catalog.read.bench_prompts(["spec-oracle"])) == 8
    assert len(DataRoot(root).catalog.read.bench_steps(["spec-random"])) > 0


def _complete_is_whole(row: dict, root: Path) -> None:
    """A run the catalog shows complete has whole tables and readable files."""
    rid = row["run_id"]
    if row["kind"] == "capture" and row["n_boundaries"]:
        assert len(DataRoot(root).catalog.read.boundary_stats([rid])) == row["n_boundaries"], rid
        for name in ("stats.safetensors", "sample.safetensors"):
            f = Path(row["path"]) / name
            assert not f.exists() or validate.check_safetensors(f) is None, (rid, name)
    if row["kind"] == "bench" and row["progress_total"] and (Path(row["path"]) / "prompts.parquet").exists():
        assert len(DataRoot(root).catalog.read.bench_prompts([rid])) == row["progress_total"], rid


@pytest.mark.parametrize("source,name", PAIRS, ids=[f"{s}/{f}" for s, f in PAIRS])
@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=not os.environ.get("SPECLENS_FUZZ_SOAK"),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_damaged_run_is_quarantined_and_others_stay(fuzz_root: Path, seed: Path, source: str, name: str, data) -> None:
    n = next(_counter)
    dmg, files = data.draw(damage(seed, source, name))
    rid = f"fz-{n:04d}-{dmg.source}"
    dst = fuzz_root / "runs" / rid
    shutil.copytree(seed / "runs" / dmg.source, dst)
    for name, content in files.items():
        if isinstance(content, pa.Table):
            pq.write_table(content, dst / name)
        else:
            (dst / name).write_bytes(content)
    DAMAGED.append((rid, dmg))

    DataRoot(fuzz_root).catalog.write.refresh()                                  # never raises
    row = DataRoot(fuzz_root).catalog.read.get_run(rid)
    assert row is not None, f"{rid} ({dmg}) is missing from the catalog"
    assert row["status"] in KNOWN, (row["status"], dmg)
    if dmg.bad is True:
        assert row["status"] == "quarantined", f"{dmg} not quarantined: {row['status']}"
    if dmg.bad is False:
        assert row["status"] != "quarantined", f"{dmg} quarantined for {row['error']}"
    if row["status"] == "quarantined":
        reason = row["error"]
        assert reason and "\n" not in reason and len(reason) <= 300, (dmg, reason)
        assert (DataRoot(fuzz_root).catalog.read.boundary_stats([rid]).empty
                and DataRoot(fuzz_root).catalog.read.bench_prompts([rid]).empty)
    if row["status"] == "complete":
        _complete_is_whole(row, fuzz_root)
    _good_runs_whole(fuzz_root)


def test_full_rebuild_agrees_with_incremental(fuzz_root: Path) -> None:
    """After the examples: a full rebuild gives each run the status the incremental refreshes gave it."""
    if not DAMAGED:
        pytest.skip("no damaged runs (the property test did not run)")
    before = DataRoot(fuzz_root).catalog.read.list_runs().set_index("run_id")[["status", "error"]]
    DataRoot(fuzz_root).catalog.write.refresh(full=True)
    after = DataRoot(fuzz_root).catalog.read.list_runs().set_index("run_id")[["status", "error"]]
    assert sorted(before.index) == sorted(after.index)
    assert (before["status"] == after.loc[before.index, "status"]).all()
    _good_runs_whole(fuzz_root)
    if os.environ.get("SPECLENS_FUZZ_REPORT"):                 # figures for docs/RELIABILITY.md
        rows = [{"run": r, "file": d.file, "op": d.op, "expect": d.bad, "status": after.loc[r, "status"],
                 "reason": after.loc[r, "error"]} for r, d in DAMAGED]
        Path(os.environ["SPECLENS_FUZZ_REPORT"]).write_text(json.dumps(rows, indent=1, default=str))


# ---------------------------------------------------------------------------- the pages with damaged runs selected


def test_pages_never_crash_on_damaged_runs(fuzz_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_pages import open_page

    if not DAMAGED:
        pytest.skip("no damaged runs (the property test did not run)")
    monkeypatch.setenv("SPECLENS_DATA", str(fuzz_root))
    runs = DataRoot(fuzz_root).catalog.read.list_runs()
    status = dict(zip(runs["run_id"], runs["status"]))
    caps = [r for r, d in DAMAGED if d.source.startswith("cap")]
    benches = [r for r, d in DAMAGED if d.source.startswith(("spec", "bench"))]
    complete_caps = [r for r in caps if status.get(r) == "complete"]

    at = open_page("pages/runs.py")                            # open_page asserts no exception element
    assert set(at.dataframe[0].value["run_id"]) == set(runs["run_id"])
    if "quarantined" in status.values():
        at = open_page("pages/runs.py", status="quarantined")
        shown = at.dataframe[0].value
        assert set(shown["status"]) == {"quarantined"} and shown["error"].notna().all()
        assert "Quarantined" in "\n".join(w.value for w in at.warning)
    if caps:
        open_page("pages/stats.py", runs=",".join(caps + ["cap-tiny"]), run=caps[0])
        for rid in caps[:8] + complete_caps[:8]:
            open_page("pages/alignment.py", a=rid, b="cap-tiny")
    for group in (benches[:12], benches[12:24]):
        if group:
            open_page("pages/compare.py", runs=",".join(group + ["spec-oracle", "spec-random"]))
