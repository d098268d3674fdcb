"""Names, defaults and settings are defined once (issue 21 item 2).

Static checks over the code (AST over backend/, dashboard/, pages/, gpu/, tools/, bench/ and app.py): no second
literal list of engine names (backend/options.py ENGINES is the one registry), nor a table keyed by them (their labels
included: options.ENGINE_LABELS), nor one of
vLLM runner values (backend/vllm_runner.py RUNNERS), and no K default written as a number anywhere but
backend/options.py; each check is shown to fail on a snippet that repeats the list."""

from __future__ import annotations

import ast
from pathlib import Path

from backend import options

REPO = Path(__file__).resolve().parents[1]
HOMES = {"engines": "backend/options.py", "labels": "backend/options.py", "runners": "backend/vllm_runner.py",
         "k": "backend/options.py"}


def _strings(node: ast.AST) -> list[str] | None:
    """The strings of a literal tuple/list/set made of string constants only (None for anything else)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2 and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return [e.value for e in node.elts]
    return None


def _k_default(node: ast.AST) -> bool:
    """A number other than 0 (no drafter) written as the default of num_spec_tokens: a field, a parameter,
    --num-spec-tokens, a list of one."""
    def number(v: ast.AST | None) -> bool:
        if isinstance(v, ast.Lambda):
            v = v.body
        if isinstance(v, ast.List) and len(v.elts) == 1:
            v = v.elts[0]
        return isinstance(v, ast.Constant) and type(v.value) is int and v.value != 0    # 0: no drafter

    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "num_spec_tokens":
        val = node.value
        if isinstance(val, ast.Call):      # Field(default=...) / Field(default_factory=...)
            return any(k.arg in ("default", "default_factory") and number(k.value) for k in val.keywords) or (
                bool(val.args) and number(val.args[0]))
        return number(val)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = node.args
        pos = a.posonlyargs + a.args
        pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))
        return any(arg.arg == "num_spec_tokens" and number(d) for arg, d in pairs)
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and node.args[0].value == "--num-spec-tokens":
        return any(k.arg == "default" and number(k.value) for k in node.keywords)
    return False


def _rows(node: ast.AST) -> list[set[str]] | None:
    """The string constants of each row of a literal tuple/list of tuples ((1, "vllm"), (2, "sglang")); None for
    anything else."""
    if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) >= 2 and all(
            isinstance(e, ast.Tuple) for e in node.elts):
        return [{x.value for x in e.elts if isinstance(x, ast.Constant) and isinstance(x.value, str)}
                for e in node.elts]
    return None


def _keyed(rows: list[set[str]] | None, names: set[str]) -> bool:
    """Every row names one of `names` and the rows name two or more of them: a table keyed by those names."""
    return rows is not None and all(r & names for r in rows) and len(set().union(*rows) & names) >= 2


def _label_map(node: ast.AST, engines: set[str], labels: set[str]) -> bool:
    """A second table of engine labels: a dict literal keyed by two or more engine names whose values are their
    labels ({"vllm": "vLLM", "sglang": "SGLang"}), or a choice between two labels ("vLLM" if e == "vllm" else
    "SGLang"). A table of other facts per engine (a file each engine reads, a version) is not one."""
    if isinstance(node, ast.Dict) and len(node.keys) >= 2 and all(
            isinstance(k, ast.Constant) and k.value in engines for k in node.keys):
        return all(isinstance(v, ast.Constant) and v.value in labels for v in node.values)
    if isinstance(node, ast.IfExp):
        return all(isinstance(v, ast.Constant) and v.value in labels for v in (node.body, node.orelse))
    return False


def repeats(source: str) -> list[tuple[str, int]]:
    """(what, line) for every second definition in `source`: an engine-name list (or a table of rows keyed by
    engine name), a table of engine labels, a runner list, a K default."""
    engines, runners = set(options.ENGINE_NAMES), set(options.RUNNERS)
    labels = set(options.ENGINE_LABELS.values())
    out = []
    for node in ast.walk(ast.parse(source)):
        s, rows = _strings(node), _rows(node)
        if _label_map(node, engines, labels):
            out.append(("labels", node.lineno))
        if (s is not None and set(s) <= engines) or _keyed(rows, engines):
            out.append(("engines", node.lineno))
        if (s is not None and set(s) <= runners) or _keyed(rows, runners):
            out.append(("runners", node.lineno))
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal":
            sl = node.slice
            vals = [e.value for e in (sl.elts if isinstance(sl, ast.Tuple) else [sl]) if isinstance(e, ast.Constant)]
            if len(vals) >= 2 and set(vals) <= engines:
                out.append(("engines", node.lineno))
        if _k_default(node):
            out.append(("k", node.lineno))
    return sorted(set(out))


# the code that must take these from backend/options.py: the backend, the dashboard and its pages, the GPU scripts
# (they put the repository on sys.path; backend/options.py imports only the standard library, `packaging` and
# backend/errors.py and backend/vllm_runner.py, so it imports on a GPU image too), the tools and the benchmarks
SCANNED = ("backend", "dashboard", "pages", "gpu", "tools", "bench")
# a literal that names engines without defining their list, each with why
EXEMPT = {("bench/pages_bench.py", "engines"): "synthetic catalog rows: the engine and release of each fake run"}


def _found() -> list[str]:
    out = []
    for f in [REPO / "app.py", *sorted(f for d in SCANNED for f in (REPO / d).rglob("*.py"))]:
        rel = str(f.relative_to(REPO))
        out += [f"{rel}:{line} {what}" for what, line in repeats(f.read_text())
                if HOMES[what] != rel and (rel, what) not in EXEMPT]
    return out


def test_engine_names_runners_and_k_default_are_defined_once() -> None:
    assert _found() == [], ("use backend.options (ENGINE_NAMES, SERVING_ENGINES, ENGINE_LABELS / engine_label, "
                            "RUNNERS, DEFAULT_K) instead")


def test_the_check_finds_a_second_list() -> None:
    src = '''
ENGINES = ("vllm", "sglang")
x = engine in ["hf", "vllm", "sglang"]
R = {"v1", "v2"}
engine: Literal["vllm", "sglang"]
class S:
    num_spec_tokens: int = 4
    other: list[int] = Field(default_factory=lambda: [4])
    num_spec_tokens: list[int] = Field(default_factory=lambda: [4])
def f(target, num_spec_tokens: int = 3): ...
p.add_argument("--num-spec-tokens", type=int, default=4)
def g(url, num_spec_tokens: int = 0): ...
ok = ("vllm", "speculators")
for row, engine in ((1, "vllm"), (2, "sglang")): ...
TRACKS = (("vllm", "v1", "V1"), ("vllm", "v2", "V2"), ("sglang", None, "SGLang"))
fine = ((1, "vllm"), (2, "other"))
eng = {"vllm": "vLLM", "sglang": "SGLang"}.get(engine, engine)
eng = "vLLM" if engine == "vllm" else "SGLang"
limits = {"vllm": a.vllm_limit, "sglang": a.sglang_limit}
'''
    assert repeats(src) == [("engines", 2), ("engines", 3), ("engines", 5), ("engines", 14), ("engines", 15),
                            ("k", 7), ("k", 9), ("k", 10), ("k", 11), ("labels", 17), ("labels", 18),
                            ("runners", 4)]


def test_the_registry_is_the_one_list() -> None:
    from backend.engines import base

    assert base.ENGINES is options.ENGINES
    assert options.ENGINE_NAMES == tuple(options.ENGINES)
    assert set(options.SERVING_ENGINES) == set(options.ENGINES) - {options.IN_PROCESS_ENGINE}
    assert set(options.VLLM_RUNNERS) | {"auto"} == set(options.RUNNERS)
    assert set(options.ENGINE_LABELS) == set(options.ENGINES)
    assert options.ENGINE_READINGS == (("vllm", "v2"), ("vllm", "v1"), ("sglang", None))     # the lint's order


def _options(cmd: str) -> dict:
    """dest -> argparse action of a `python -m backend` command."""
    import argparse

    from backend.__main__ import parser

    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in sub.choices[cmd]._actions}


def test_cli_options_and_job_fields_derive_from_the_settings() -> None:
    """Every CLI field of a settings class is an option of its command with the field's default, type and choices;
    a job spec of that kind knows exactly the settings' job fields (plus what only a job gives)."""
    from dataclasses import MISSING

    from backend.jobs import spec
    from backend.settings import BenchSettings, CaptureSettings, CheckSettings, WatchSettings

    for cmd, cls in (("capture", CaptureSettings), ("bench", BenchSettings), ("check-drafter", CheckSettings),
                     ("watch", WatchSettings)):
        acts = _options(cmd)
        for name, f in options.settings_fields(cls, cli=True).items():
            flag = "--no-" + name.replace("_", "-") if f.default is True else None
            md = f.metadata.get("option", {})
            dest = (md.get("flag") or flag or "--" + name.replace("_", "-"))[2:].replace("-", "_")
            assert dest in acts, f"{cmd}: no option for {cls.__name__}.{name}"
            a = acts[dest]
            want = md.get("argparse", {}).get("default", f.default if md.get("parse") is None else None)
            if f.default is not True and f.default is not False:
                assert a.default == (None if want is MISSING else want), (cmd, name)
            assert a.required == (f.default is MISSING and f.default_factory is MISSING), (cmd, name)
        assert set(options.settings_fields(cls, cli=False)) & set(acts) == set(), cmd
    assert set(spec.CAPTURE) - set(options.settings_fields(CaptureSettings)) == {"tensor_parallel_size",
                                                                                 "engine_options"}
    assert set(spec.BENCH) == set(options.settings_fields(BenchSettings, job=True)) | {"batch_size"}
    assert "warmup" not in spec.BENCH
    assert spec.CHOICES["engine"] == options.ENGINE_NAMES and spec.CHOICES["runner"] == options.RUNNERS
    assert spec.REQUIRED["bench"] == ("target", "prompts") and spec.REQUIRED["capture"] == ("model", "prompts")


def test_from_args_builds_the_settings_the_options_describe() -> None:
    from backend.__main__ import parser
    from backend.settings import BenchSettings, CaptureSettings

    a = parser().parse_args(["bench", "--target", "t", "--prompts", "p", "--num-spec-tokens", "3", "--runner", "v1",
                             "--no-chat-template", "--engine-option", "x=1", "--engine-option", "y=[1, 2]"])
    s = options.from_args(BenchSettings, a, producer_version="0.24.0")
    assert s == BenchSettings(target="t", prompts="p", num_spec_tokens=3, runner="v1", chat_template=False,
                              engine_options={"x": 1, "y": [1, 2]})
    a = parser().parse_args(["capture", "--model", "m", "--prompts", "p", "--boundaries", "S_2,F", "--limit", "5"])
    assert options.from_args(CaptureSettings, a) == CaptureSettings(model="m", prompts="p", boundaries=["S_2", "F"],
                                                                     limit=5)
    assert options.from_args(BenchSettings, parser().parse_args(["bench", "--target", "t", "--prompts", "p"]),
                             producer_version=None).engine_options is None


def test_check_and_watch_settings_from_their_options() -> None:
    from backend.__main__ import parser
    from backend.settings import CheckSettings, WatchSettings

    a = parser().parse_args(["check-drafter", "--drafter", "d", "--target", "t", "--lint-only", "--no-search",
                             "--producer-ids", "2,16,29", "--trained-on", "S_5,S_0",
                             "--engine-option", "enable_dbo=true"])
    assert options.from_args(CheckSettings, a) == CheckSettings(
        drafter="d", target="t", lint_only=True, search=False, producer_ids=[2, 16, 29], trained_on=["S_0", "S_5"],
        engine_options={"enable_dbo": True})
    a = parser().parse_args(["watch", "--server-url", "http://x:1", "--interval", "2", "--engine", "sglang"])
    assert options.from_args(WatchSettings, a) == WatchSettings("http://x:1", interval=2.0, engine="sglang")


def test_one_manifest_schema_for_writing_and_reading() -> None:
    """backend/runs/manifest.py holds the manifest's schema: the typed model a run is created with and the check the
    catalog runs on what it reads (store/validate.py uses it); a manifest the model writes passes the read check, and
    the model a run is created with is the stored model made stricter (its `model` and `progress` too)."""
    from backend.runs import manifest as M
    from backend.store import validate

    assert validate.check_manifest is M.check_stored and validate.STATUSES is M.STATUSES
    assert issubclass(M.Manifest, M.StoredManifest) and issubclass(M.NewModelInfo, M.ModelInfo)
    assert issubclass(M.NewProgress, M.Progress)
    m = M.Manifest(kind="bench", engine="hf", model={"path": "/m", "n_layers": 8}, progress={"done": 0, "total": 3},
                   boundaries=["S_0", "F"]).to_json()
    assert M.check_stored({**m, "status": "running"}) is None
    assert "status" in M.check_stored(m)
    assert "model.n_layers" in M.check_stored({**m, "status": "complete", "model": {"path": "/m", "n_layers": 2**64}})
    assert "progress.total" in M.check_stored({**m, "status": "complete", "progress": {"done": 0, "total": "3"}})


def test_load_options_derive_from_load_settings() -> None:
    """`sweep`'s options are LoadSettings' fields (issue 21 item 2), `bench --concurrency` adds the load-only ones to
    the bench's; both command lines build the same LoadSettings the hand-written parsers built (recorded before the
    change: the flags, defaults and the sweep's K default 1,2,4,6 unchanged)."""
    from backend.__main__ import parser
    from backend.settings import LOAD_ONLY, LoadSettings

    acts = _options("sweep")
    for name in options.settings_fields(LoadSettings, cli=True):
        f = options.settings_fields(LoadSettings)[name]
        flag = (f.metadata.get("option", {}).get("flag") or
                ("--no-" if f.default is True else "--") + name.replace("_", "-"))
        assert flag[2:].replace("-", "_") in acts, name
    assert set(_options("bench")) >= {f.replace("start_together", "one_server_at_a_time") for f in LOAD_ONLY}
    a = parser().parse_args(["sweep", "--engine", "sglang", "--target", "/t", "--prompts", "/p", "--synthetic-tau",
                             "1.5,2.5", "--one-server-at-a-time", "--no-chat-template", "--engine-option", "x=1"])
    s = options.from_args(LoadSettings, a)
    assert s == LoadSettings(engine="sglang", target="/t", prompts="/p", num_spec_tokens=[1, 2, 4, 6],
                             synthetic_tau=[1.5, 2.5], concurrency=[1, 8, 32, 64], start_together=False,
                             chat_template=False, engine_options={"x": 1})
    a = parser().parse_args(["bench", "--engine", "vllm", "--target", "/t", "--prompts", "/p", "--concurrency", "8,1",
                             "--num-spec-tokens", "3"])
    s = options.from_args(LoadSettings, a)
    assert (s.num_spec_tokens, s.concurrency, s.max_tokens, s.repeats, s.dtype) == ([3], [1, 8], 64, 3, "fp32")
    assert parser().parse_args(["bench", "--target", "t", "--prompts", "p"]).concurrency is None
