"""The one typed manifest (backend/runs/manifest.py `StoredManifest`): every stored manifest SpecLens has written
(the recorded runs under tests/data, the shipped speed maps, the runs a real small bench and capture write here)
reads into it and gives back the same dict; a read-modify-write through the run's lifecycle changes only the keys it
sets; a key of the wrong type is one line naming the key; and backend/ reads manifests only through it (no raw
`rd.manifest()` dict, no `json.loads` of a manifest.json, no `.get("bench")`-style section reads), dashboard/ and
pages/ too (a catalog row's manifest through `StoredManifest.indexed`, no section read as a dict)."""

from __future__ import annotations

import ast
import copy
import json
import typing
from pathlib import Path

import pytest

from backend.runs.manifest import Bench, DrafterInfo, Headline, Section, StoredManifest, check_stored
from backend.store.data_root import DataRoot

REPO = Path(__file__).resolve().parents[1]
RECORDED = sorted([*(REPO / "tests" / "data").rglob("manifest.json"), *(REPO / "datasets").rglob("manifest.json")])


def _round_trip(raw: dict) -> StoredManifest:
    m = StoredManifest.parse(raw)
    assert m.to_json() == raw
    assert json.dumps(m.to_json(), sort_keys=True) == json.dumps(raw, sort_keys=True)
    assert check_stored(raw) is None
    return m


@pytest.mark.parametrize("path", RECORDED, ids=[str(p.relative_to(REPO)) for p in RECORDED])
def test_every_recorded_manifest_reads_typed_and_round_trips(path: Path) -> None:
    raw = json.loads(path.read_text())
    m = _round_trip(raw)
    assert m.status == raw["status"] and m.kind == raw["kind"] and m.model.path == raw["model"]["path"]
    if raw.get("bench"):
        assert isinstance(m.bench, Bench) and m.bench.tau == raw["bench"]["tau"]
    if isinstance(raw.get("drafter"), dict):
        assert isinstance(m.drafter_info, DrafterInfo) and m.drafter_info.path == raw["drafter"].get("path")


def test_recorded_manifests_are_found() -> None:
    assert len(RECORDED) >= 5


def test_runs_written_here_read_typed_and_round_trip(bench_root: Path) -> None:
    """The manifests a real bench (drafter run and its baseline) and a capture write."""
    data = DataRoot(bench_root)
    seen = set()
    for rd in data.run_dirs():
        raw = rd.manifest()
        m = _round_trip(raw)
        assert rd.read() == m
        seen.add(m.kind)
        if m.kind == "bench" and raw.get("drafter"):
            assert m.bench.speedup.mean == raw["bench"]["speedup"]["mean"]
            assert m.aux.boundaries == raw["aux"]["boundaries"] and m.num_spec_tokens == raw["num_spec_tokens"]
        assert m.headline.tokens == raw["headline"]["tokens"] and m.progress.done == raw["progress"]["done"]
    assert {"bench", "capture"} <= seen


def test_a_lifecycle_write_changes_only_its_keys(bench_root: Path, tmp_path: Path) -> None:
    """Run.record reads the manifest, sets its keys and writes it back: every other key keeps its value, also the
    ones the typed model does not know."""
    import shutil

    from backend.runs.lifecycle import Run

    root = tmp_path / "data"
    shutil.copytree(bench_root / "runs" / "spec-oracle", root / "runs" / "spec-oracle")
    rd = DataRoot(root).run_dir("spec-oracle")
    before = rd.manifest()
    before["unknown_key"] = {"kept": [1, 2.5, None]}
    rd.write_manifest(copy.deepcopy(before))
    before = rd.manifest()
    Run(rd, DataRoot(root)).record(notes="looked at")
    after = rd.manifest()
    assert after.pop("notes") == "looked at" and after.pop("updated") >= before.pop("updated")
    before.pop("notes", None)
    assert after == before
    assert rd.read().model_extra["unknown_key"] == {"kept": [1, 2.5, None]}


BAD = {
    "headline": ("many", "headline"),
    "headline.tokens": (1.5, "headline.tokens"),
    "headline.nonfinite": ({"S_0": "x"}, "headline.nonfinite"),
    "progress.total": ("8", "progress.total"),
    "model.path": (5, "model.path"),
    "model.n_layers": (2**65, "model.n_layers"),
    "boundaries": ([1, 2], "boundaries"),
    "created": (20261201, "created"),
    "bench.tau": ("2.2", "bench.tau"),
    "bench.speedup": ([1.4], "bench.speedup"),
    "bench.speedup.mean": ("fast", "bench.speedup.mean"),
    "bench.lossless": ("yes", "bench.lossless"),
    "num_spec_tokens": (3.5, "num_spec_tokens"),
    "drafter": ([1], "drafter"),
    "drafter.path": (5, "drafter.path"),
    "aux.boundaries": ("S_0", "aux.boundaries"),
    "aux.ids": (["2"], "aux.ids"),
    "aux.engine_ids": (2, "aux.engine_ids"),
    "check.feeds": ("S_2", "check.feeds"),
    "load": ([8], "load"),
    "load.levels": ("8", "load.levels"),
    "watch.verdict": ([1], "watch.verdict"),
    "watch.stopped_by": (3, "watch.stopped_by"),
    "job": ("j1", "job"),
    "status": ("done", "status"),
}


def _set(d: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        if not isinstance(d.get(k), dict):
            d[k] = {}
        d = d[k]
    d[keys[-1]] = value


@pytest.mark.parametrize("key", sorted(BAD))
def test_a_wrong_typed_key_is_one_line_naming_it(key: str) -> None:
    raw = json.loads((REPO / "tests/data/recorded/prove/vllm-0.24.0-h200/prove-h200-vllm-fixed/manifest.json")
                     .read_text())
    assert check_stored(raw) is None
    value, named = BAD[key]
    _set(raw, key, value)
    why = check_stored(raw)
    assert why is not None and "\n" not in why and f"manifest key '{named}'" in why, why


def test_the_aux_check_load_and_watch_sections_are_typed() -> None:
    """What a bench's `aux`, a check's `check`, a load run's `load` and a watch's `watch` hold reads as attributes
    (the run page and the Watch and Serving load pages read them so); unknown keys are kept and written back."""
    from backend.runs.manifest import Aux, CheckInfo, LoadInfo, WatchInfo

    raw = {"status": "complete", "kind": "watch", "headline": {"windows": 3}, "bench": {"load": {"units": 2}},
           "watch": {"server_url": "http://x:1", "metrics_url": "http://x:1/metrics", "stopped_by": "windows",
                     "verdict": {"state": "ok", "tau": 2.5}, "later": 1},
           "load": {"levels": 8, "requests": 64, "tokens": 999, "best": {"4": 1.2}, "stops_paying": None},
           "check": {"engine": "vllm", "engine_version": "0.24.0", "runner": "v2", "feeds": ["S_2"], "best": None},
           "aux": {"ids": [-1, 2], "ids_from": "top level", "runner_reason": "why", "predicted": ["S_0"],
                   "engine_ids": [2], "warning": "fed other", "boundaries": ["S_0", "S_3"]}}
    m = _round_trip(raw)
    assert isinstance(m.watch, WatchInfo) and m.watch.verdict == {"state": "ok", "tau": 2.5}
    assert m.watch.stopped_by == "windows" and m.watch.model_extra == {"later": 1}
    assert isinstance(m.load, LoadInfo) and (m.load.levels, m.load.requests, m.load.tokens) == (8, 64, 999)
    assert isinstance(m.check, CheckInfo) and (m.check.engine, m.check.runner, m.check.feeds) == ("vllm", "v2",
                                                                                                    ["S_2"])
    assert isinstance(m.aux, Aux) and m.aux.ids == [-1, 2] and m.aux.engine_ids == [2]
    assert m.aux.warning == "fed other" and m.headline.windows == 3 and m.bench.load == {"units": 2}


def test_a_new_run_writes_its_typed_manifest_and_job(tmp_path: Path) -> None:
    """Run.create builds the typed Manifest (Manifest.of), adds the job inside tagged_runs, and the data root writes
    its `to_json()`: the keys given, the job as the worker tags it."""
    from backend.errors import SpecLensError
    from backend.runs.lifecycle import Run, tagged_runs
    from backend.runs.manifest import Manifest

    fields = {"kind": "watch", "engine": "vllm", "model": {"path": None}, "dataset": None, "settings": {"x": 1},
              "progress": {"done": 0, "total": 2},
              "watch": {"server_url": "u", "metrics_url": "u/metrics", "verdict": None, "stopped_by": None}}
    data = DataRoot(tmp_path / "data")
    with tagged_runs({"id": "job-1", "sweep": None, "kind": "watch"}):
        rd = Run.create("w1", Manifest.of(fields, "w1"), data)
    raw = rd.manifest()
    assert {k: raw[k] for k in fields} == fields and raw["job"] == {"id": "job-1", "sweep": None, "kind": "watch"}
    Run.create("w2", dict(fields), data)
    assert "job" not in data.run_dir("w2").manifest()
    with pytest.raises(SpecLensError, match="manifest field 'progress'"):
        Manifest.of({**fields, "progress": None}, "w3")


def test_odd_values_of_the_right_type_are_kept() -> None:
    raw = {"status": "complete", "headline": {"tokens": -5, "nonfinite": {"S_0": 0}}, "bench": {"tau": float("nan")},
           "drafter": "/models/old-drafter", "temperature": 0, "repeats": 2.0}
    m = _round_trip(raw)
    assert isinstance(m.headline, Headline) and m.headline.tokens == -5 and m.drafter_info is None
    assert m.to_json()["temperature"] == 0 and isinstance(m.to_json()["temperature"], int)
    assert StoredManifest.indexed({}) == StoredManifest() and StoredManifest.indexed({"headline": 5}).headline is None


# ---------------------------------------------------------------------------- settings typed by the run's kind

CAPTURE_IDENTITY = {"model": "/m/tiny", "prompts": "/d/p.jsonl", "engine": "hf", "limit": 4, "dtype": "fp32",
                    "boundaries": None, "sample_tokens": 4096, "sample_per_prompt": 512, "max_prompt_tokens": 2048,
                    "chat_template": True}


def test_a_captures_settings_read_typed() -> None:
    """A capture's `settings` is its stored view: attributes, not a dict; what was read is what is written back."""
    from backend.runs.manifest import StoredCaptureSettings

    m = _round_trip({"status": "complete", "kind": "capture", "engine": "hf", "settings": dict(CAPTURE_IDENTITY)})
    assert isinstance(m.settings, StoredCaptureSettings)
    assert (m.settings.model, m.settings.limit, m.settings.chat_template) == ("/m/tiny", 4, True)
    assert m.settings.boundaries is None and m.settings.prompts == "/d/p.jsonl"
    assert m.to_json()["settings"] == CAPTURE_IDENTITY


@pytest.mark.parametrize("kind,engine,view", [
    ("capture", "hf", "StoredCaptureSettings"), ("capture", "vllm", "StoredCaptureSettings"),
    ("capture", "import:speculators", "StoredImportSettings"), ("bench", "hf", "StoredBenchSettings"),
    ("check", None, "StoredCheckSettings"), ("load", "vllm", "StoredLoadSettings"),
    ("watch", "sglang", "StoredWatchSettings"), (None, None, "StoredSettings"), ("later", "hf", "StoredSettings")])
def test_settings_are_typed_by_kind_and_old_ones_still_read(kind, engine, view) -> None:
    """Written by older code: a key the view lacks is kept, a key it has may be missing; both round-trip."""
    from backend.runs import manifest as M

    raw = {"status": "complete", "kind": kind, "engine": engine, "settings": {"old_key": [1, "x"], "seed": 0}}
    if kind == "load":
        raw["identity"] = {"concurrency": [1, 8], "gone": None}
    m = _round_trip({k: v for k, v in raw.items() if v is not None})
    assert type(m.settings).__name__ == view and m.settings.model_extra["old_key"] == [1, "x"]
    if kind == "load":
        assert isinstance(m.identity, M.StoredLoadSettings) and m.identity.concurrency == [1, 8]
        assert m.settings_as(M.StoredLoadSettings).concurrency is None
    assert m.settings_as(M.StoredWatchSettings).interval is None or kind == "watch"


def test_a_wrong_typed_setting_is_one_line_naming_it() -> None:
    for kind, key, value in (("capture", "limit", "4"), ("bench", "temperature", "hot"),
                             ("load", "concurrency", [1, "8"]), ("watch", "interval", True)):
        why = check_stored({"status": "complete", "kind": kind, "settings": {key: value}})
        assert why is not None and f"manifest key 'settings.{key}'" in why and "\n" not in why, why
    assert check_stored({"status": "complete", "kind": "capture", "settings": [1]}) is not None


def test_a_resume_compares_typed_settings_as_the_dicts_compared() -> None:
    """`identity_of` is what a run of these settings records; equal exactly when the two dicts are."""
    from backend.runs.manifest import StoredBenchSettings, StoredCaptureSettings
    from backend.settings import BenchSettings, CaptureSettings

    s = CaptureSettings(model="/m/tiny", prompts="/d/p.jsonl", limit=4)
    m = StoredManifest.parse({"kind": "capture", "engine": "hf", "settings": s.identity()})
    assert m.settings == StoredCaptureSettings.identity_of(s)
    assert m.settings == StoredCaptureSettings.identity_of(CaptureSettings(model="/m/tiny", prompts="/d/p.jsonl",
                                                                           limit=4, device="cpu"))
    assert m.settings != StoredCaptureSettings.identity_of(CaptureSettings(model="/m/tiny", prompts="/d/p.jsonl"))
    less = {k: v for k, v in s.identity().items() if k != "boundaries"}      # a key missing is not a key = None
    assert StoredCaptureSettings.model_validate(less) != StoredCaptureSettings.identity_of(s)
    b = BenchSettings(target="/m/tiny", prompts="/d/p.jsonl")
    assert StoredBenchSettings.identity_of(b) != StoredCaptureSettings.model_validate(b.identity())
    assert m.settings != s.identity()                                         # typed against typed only


def test_the_settings_views_hold_every_field_their_models_record() -> None:
    """Each kind's view declares every key its settings model writes (so readers get attributes, not extras)."""
    import dataclasses

    from backend.runs import manifest as M
    from backend.settings import BenchSettings, CaptureSettings, CheckSettings, LoadSettings, WatchSettings

    bench = BenchSettings(target="/t", prompts="/p", drafter="/d", engine="vllm", server_url="http://x:1",
                          tensor_parallel_size=2, engine_options={"a": 1})
    load = LoadSettings(engine="vllm", target="/t", prompts="/p")
    written = {M.StoredCaptureSettings: CaptureSettings(model="/m", prompts="/p", exact_sums=True).identity(),
               M.StoredBenchSettings: bench.identity(),
               M.StoredCheckSettings: dataclasses.asdict(CheckSettings(drafter="/d", target="/t")),
               M.StoredLoadSettings: {**load.model_dump(mode="json"), **load.identity()},
               M.StoredWatchSettings: WatchSettings(server_url="http://x:1").to_json()}
    for view, d in written.items():
        assert set(d) <= set(view.model_fields), (view.__name__, sorted(set(d) - set(view.model_fields)))
        assert view.model_validate(json.loads(json.dumps(d))).to_json() == json.loads(json.dumps(d))


def test_a_new_runs_settings_are_written_as_given(tmp_path: Path) -> None:
    """A run created with its settings model's dict writes exactly that dict (same keys, same values)."""
    from backend.runs.lifecycle import Run
    from backend.runs.manifest import Manifest, StoredCaptureSettings

    fields = {"kind": "capture", "engine": "hf", "model": {"path": None}, "settings": dict(CAPTURE_IDENTITY),
              "progress": {"done": 0, "total": 2}}
    man = Manifest.of(fields, "c1")
    assert isinstance(man.settings, StoredCaptureSettings) and man.to_json()["settings"] == CAPTURE_IDENTITY
    rd = Run.create("c1", man, DataRoot(tmp_path / "data"))
    assert rd.manifest()["settings"] == CAPTURE_IDENTITY and rd.read().settings == man.settings


# ---------------------------------------------------------------------------- no raw manifest reads in backend/

# the writers' read-modify-write and the catalog's check: the only places a manifest is read as a dict
RAW_ALLOWED = {("backend/store/rundir.py", "read"), ("backend/store/rundir.py", "update"),
               ("backend/runs/lifecycle.py", "manifest"), ("backend/runs/lifecycle.py", "_write"),
               ("backend/store/catalog.py", "_run_row")}
SECTIONS = ("headline", "bench", "aux", "progress", "source", "identity", "check", "watch")  # no catalog row has them
PARSERS = ("parse", "checked", "indexed")


def raw_manifest_reads(source: str, name: str) -> list[str]:
    """Where this module reads a manifest other than through StoredManifest: `.manifest()` outside RAW_ALLOWED, a
    read of a manifest.json not handed straight to StoredManifest.parse, and `.get("<section>")` of a manifest
    section."""
    tree = ast.parse(source)
    parent_fn: dict[ast.AST, str] = {}
    for fn in ast.walk(tree):                    # outer functions first: an inner one's name wins for its nodes
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                parent_fn[node] = fn.name
    parsed: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PARSERS:
            for arg in node.args:
                parsed.update(ast.walk(arg))
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        attr = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if attr == "manifest" and not node.args and (name, parent_fn.get(node)) not in RAW_ALLOWED:
            out.append(f"{name}:{node.lineno}: .manifest() (use .read())")
        if attr in ("loads", "load", "read", "read_text", "read_bytes") and node not in parsed and any(
                isinstance(c, ast.Constant) and c.value == "manifest.json" for c in ast.walk(node)):
            out.append(f"{name}:{node.lineno}: manifest.json read as a dict (StoredManifest.parse it)")
        if attr == "get" and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in SECTIONS:
            out.append(f"{name}:{node.lineno}: .get({node.args[0].value!r}) of a manifest section")
    out += [f"{name}:{node.lineno}: model_extra (read the typed field of the manifest or its section)"
            for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "model_extra"]
    return out


def test_backend_reads_manifests_only_typed() -> None:
    found = []
    for f in sorted((REPO / "backend").rglob("*.py")):
        name = str(f.relative_to(REPO))
        if name != "backend/runs/manifest.py":
            found += raw_manifest_reads(f.read_text(), name)
    assert found == [], "\n".join(found)


# the dashboard and the pages read the manifests the catalog hands on (a runs row's `manifest`, run_manifests,
# check_manifests) through StoredManifest.indexed; beyond the reads above, they take a row's `manifest` only into
# StoredManifest.indexed, read no typed section as a dict (`m.get("model") or {}`, `isinstance(m.get("drafter"),
# dict)`, `m["aux"]`) and no key of a dict named `manifest` (`manifest.get("engine")`, `manifest["dataset"]`). Where
# every key is shown (the settings table, flattened; the manifest.json download) they take the dict `to_json()`
# gives back.
NOT_MANIFEST = {("dashboard/check_charts.py", "findings")}    # a drafter check's findings: `source` is lint/check


def _holds_object(annotation) -> bool:
    """A field whose value is a section or a JSON object (`model`, `bench`, `settings`, ...), not a scalar or list."""
    return annotation is dict or (isinstance(annotation, type) and issubclass(annotation, Section)) \
        or any(_holds_object(a) for a in typing.get_args(annotation))


TYPED = tuple(k for k, f in StoredManifest.model_fields.items() if _holds_object(f.annotation))


def _key(node: ast.AST) -> str | None:
    """'k' of `x.get('k', ...)` or `x['k']`, else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args \
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return node.args[0].value
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    return None


def dict_section_reads(source: str, name: str) -> list[str]:
    """`raw_manifest_reads`, and where this module takes a catalog row's manifest other than into StoredManifest,
    reads a typed manifest section as a dict or reads a key of a dict named `manifest` (the dashboard's and the
    pages' old reads)."""
    tree = ast.parse(source)
    skip = {line for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (name, fn.name) in NOT_MANIFEST for line in range(fn.lineno, fn.end_lineno + 1)}
    out = [r for r in raw_manifest_reads(source, name) if int(r.split(":")[1]) not in skip]
    parsed: set[ast.AST] = set()
    as_dict: set[ast.AST] = set()                # expressions used as a dict: `x or {}`, isinstance(x, dict), x.get()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PARSERS:
            parsed.update(a for arg in node.args for a in ast.walk(arg))
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and isinstance(node.values[-1], ast.Dict):
            as_dict.update(node.values[:-1])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" \
                and len(node.args) == 2 and isinstance(node.args[1], ast.Name) and node.args[1].id == "dict":
            as_dict.add(node.args[0])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            as_dict.add(node.func.value)
        elif isinstance(node, ast.Subscript):
            as_dict.add(node.value)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("settings", "identity") and node in as_dict \
                and node.lineno not in skip:
            out.append(f"{name}:{node.lineno}: .{node.attr} of a manifest read as a dict (its typed attributes)")
        key = _key(node)
        if key is None or node.lineno in skip:
            continue
        of = node.func.value if isinstance(node, ast.Call) else node.value
        if key == "manifest" and node not in parsed:
            out.append(f"{name}:{node.lineno}: a row's manifest as a dict (StoredManifest.indexed it)")
        elif key in TYPED and node in as_dict:
            out.append(f"{name}:{node.lineno}: {key!r} of a manifest read as a dict (a StoredManifest section)")
        elif isinstance(of, ast.Name) and of.id == "manifest":
            out.append(f"{name}:{node.lineno}: manifest[{key!r}] of a dict (StoredManifest.indexed it)")
    return sorted(set(out), key=lambda s: (s.split(":")[0], int(s.split(":")[1])))


def test_dashboard_and_pages_read_manifests_only_typed() -> None:
    found = []
    for f in sorted([*(REPO / "dashboard").glob("*.py"), *(REPO / "pages").glob("*.py")]):
        found += dict_section_reads(f.read_text(), str(f.relative_to(REPO)))
    assert found == [], "\n".join(found)


@pytest.mark.parametrize("snippet", [
    "def f(m):\n    d, t = m.get('drafter') or {}, m.get('model') or {}\n    return d.get('path'), t.get('path')\n",
    "def f(m):\n    return m.get('drafter') if isinstance(m.get('drafter'), dict) else {}\n",
    "def f(m):\n    return m['aux'].get('runner')\n",
    "def f(m):\n    return (m.get('settings') or {}).get('min_tau')\n",
    "def f(m):\n    s = m.settings or {}\n    return s.get('min_tau')\n",
    "def f(m):\n    return m.settings.get('interval'), m.identity['target']\n",
    "def f(manifest):\n    return manifest.get('engine'), manifest['dataset']\n",
    "def f(row):\n    m = row['manifest'] if row else {}\n    return m\n",
    "def f(run):\n    return (run.get('manifest') or {}).get('num_spec_tokens')\n",
])
def test_the_dashboard_check_flags_dict_reads(snippet: str) -> None:
    """The check above finds the dict reads the dashboard and the pages used to have."""
    assert dict_section_reads(snippet, "dashboard/x.py") and not raw_manifest_reads(snippet, "dashboard/x.py")


def test_the_dashboard_check_passes_typed_reads() -> None:
    ok = ("from backend.runs.manifest import StoredManifest\n"
          "def f(run, rows):\n    m = StoredManifest.indexed(run['manifest'] if run else None)\n"
          "    d = m.drafter_info\n    s = m.settings_as(StoredWatchSettings)\n"
          "    return m.engine, m.model.path, d.path if d else None, s.min_tau, run.get('drafter'),\\\n"
          "        rows.get('model'), m.watch.verdict, m.aux.ids\n")
    assert dict_section_reads(ok, "dashboard/x.py") == []


@pytest.mark.parametrize("snippet", [
    "def f(rd):\n    return rd.manifest().get('status')\n",
    "def f(m):\n    return (m.get('bench') or {}).get('tau')\n",
    "def f(m):\n    return (m.get('headline') or {}).get('tokens')\n",
    "import json\ndef f(d):\n    return json.loads((d / 'manifest.json').read_text())['model']\n",
    "def f(q, data, name):\n    return q.read(data.runs / name / 'manifest.json')\n",
    "def f(m):\n    return (m.model_extra or {}).get('watch'), (m.aux.model_extra or {}).get('ids')\n",
])
def test_the_check_flags_raw_reads(snippet: str) -> None:
    """The check above finds the raw reads backend/ used to have."""
    assert raw_manifest_reads(snippet, "backend/x.py")


def test_the_check_passes_typed_reads() -> None:
    ok = ("import json\nfrom backend.runs.manifest import StoredManifest\n"
          "def f(rd, d):\n    m = rd.read()\n"
          "    s = StoredManifest.parse(json.loads((d / 'manifest.json').read_text()))\n"
          "    return m.bench.tau, s.headline.tokens, (d / 'manifest.json').exists()\n")
    assert raw_manifest_reads(ok, "backend/x.py") == []
