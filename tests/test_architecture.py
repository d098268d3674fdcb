"""The flow runs one way (docs/ARCHITECTURE.md): engines -> capture/bench -> run directory -> catalog -> pages.

Static checks over the source (every import, at module level or inside a function): no import cycle inside
backend/; no upward import across the layers of backend/ (base < store < analysis < text < engines/runs < cli); nothing
under backend/ imports Streamlit or the dashboard package; no engine module imports capture or bench; engines/ and
drafter/ do not import each other both ways; one engine registry and one capture loop. The repository stands alone:
no citation of a document outside it, every docs/CONVENTIONS.md anchor cited exists, every third-party module
imported is declared in requirements. The lint runs clean (ruff.toml)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _modules(pkg: str) -> dict[str, Path]:
    out = {}
    for f in (REPO / pkg).rglob("*.py"):
        name = ".".join(f.relative_to(REPO).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = f
    return out


def _imports(f: Path) -> set[str]:
    """Every module name `f` imports (absolute names; `from a import b` counts as a.b when that is a module)."""
    out = set()
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules("backend")
    return {m: {t for t in _imports(f) if t in mods and t != m} for m, f in mods.items()}


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in g:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_in_backend() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_check_can_fail() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_backend_never_imports_the_dashboard_or_streamlit() -> None:
    bad = {m: sorted(t for t in _imports(f) if t.split(".")[0] in ("streamlit", "dashboard", "plotly"))
           for m, f in _modules("backend").items()}
    assert {m: t for m, t in bad.items() if t} == {}


def test_engines_import_neither_capture_nor_bench() -> None:
    bad = {m: sorted(t for t in _imports(f) if t in ("backend.capture", "backend.bench"))
           for m, f in _modules("backend").items() if m.startswith("backend.engines")}
    assert {m: t for m, t in bad.items() if t} == {}


@pytest.mark.skipif(shutil.which("ruff") is None and not (Path(sys.executable).parent / "ruff").exists(),
                    reason="ruff is installed by requirements-dev.txt")
def test_ruff_is_clean() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    out = subprocess.run([ruff, "check", "--output-format", "concise", "."], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:]


# ---------------------------------------------------------------------- the repository's docs stand alone

_OUTSIDE_DOC = re.compile(r"REFER" r"ENCE(?:\.md| section| sections|\b)")     # split so this file does not match itself
_TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".txt", ".toml", ".ini", ".cfg", ".sh", ".json", ".html"}


def _repo_text_files() -> list[Path]:
    """Every text file of the repository that git tracks or would track (tests/data and models aside)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, text=True)
    names = out.stdout.split() if out.returncode == 0 else [str(p.relative_to(REPO)) for p in REPO.rglob("*")]
    files = []
    for n in names:
        p = REPO / n
        if n.startswith(("tests/data/", "models/", "datasets/", "data/", ".venv/")) or not p.is_file():
            continue
        if p.suffix in _TEXT_SUFFIXES or p.name in ("Makefile", "Dockerfile", "Dockerfile.gpu"):
            files.append(p)
    return files


def test_no_citation_of_a_document_outside_the_repository() -> None:
    """What the code and docs rest on is written in the repository (docs/CONVENTIONS.md, the files that hold the
    facts), never in a document the repository does not have."""
    bad = []
    for f in _repo_text_files():
        for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            if _OUTSIDE_DOC.search(line) or "shared/REFER" "ENCE" in line:
                bad.append(f"{f.relative_to(REPO)}:{i}: {line.strip()[:100]}")
    assert bad == [], "cite a docs/CONVENTIONS.md anchor or the repo file that holds the fact:\n" + "\n".join(bad)


def test_the_citation_check_can_fail() -> None:
    assert _OUTSIDE_DOC.search("(REFER" "ENCE section 2)") and not _OUTSIDE_DOC.search("docs/CONVENTIONS.md#metrics")


def _anchors(md: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    out = set()
    for line in md.read_text().splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", m.group(1).strip().lower())))
    return out


def test_every_conventions_anchor_cited_exists() -> None:
    conv = REPO / "docs" / "CONVENTIONS.md"
    have = _anchors(conv)
    cited = {}
    for f in _repo_text_files():
        for a in re.findall(r"CONVENTIONS\.md#([\w-]+)", f.read_text(errors="replace")):
            cited.setdefault(a, str(f.relative_to(REPO)))
    assert cited, "nothing cites docs/CONVENTIONS.md"
    assert {a: f for a, f in cited.items() if a not in have} == {}, f"anchors of {conv.name}: {sorted(have)}"


# ---------------------------------------------------------------------- every third-party import is declared

# gpu/: the GPU scripts run on the GPU image (Dockerfile.gpu: requirements.txt but torch, which the image brings), so
# what they import is declared in requirements.txt like the runtime's
CODE = ("backend", "dashboard", "pages", "bench", "tools", "gpu")
FIRST_PARTY = {"backend", "dashboard", "pages", "bench", "tools", "gpu", "tests", "app"}
# imported lazily, each only where that tool runs; never by the CPU path (the reason beside each)
NOT_DECLARED = {
    "vllm": "GPU node only (README 'GPU node'), imported inside backend/engines/vllm*.py functions",
    "sglang": "GPU node only, runs as a child process (backend/engines/sglang.py)",
    "datasets": "tools/peer_fixtures runs in the peers' own venv (tests/data/peers/README.md)",
    "specforge": "tools/peer_fixtures runs in the peers' own venv",
    "speculators": "tools/peer_fixtures runs in the peers' own venv",
}
# declared in requirements-dev.txt, not requirements.txt: the runtime imports it only for an optional feature
OPTIONAL_RUNTIME = {"ray": "python -m backend worker --ray (multi-node jobs)",
                    "triton": "backend/stats_kernel.py, the GPU statistics update (CUDA builds of torch bring it; "
                              "imported only where it is installed; the CPU tests run it in its interpreter)"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(path: Path) -> set[str]:
    out = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            out.add(_norm(re.split(r"[\s;<>=!~\[]", line, maxsplit=1)[0]))
    return out


def _sibling(f: Path, top: str) -> bool:
    """`top` is a script module beside `f` (gpu/vllm_suite.py's `from load_suite import gpu_tag`, sglang_suite's
    `import runner_check`, tools' and bench's helpers): a script runs with its own folder first on sys.path, so the
    name is the repository's own file, never a distribution to declare."""
    return (f.parent / f"{top}.py").is_file() or (f.parent / top / "__init__.py").is_file()


def _third_party_imports(files: list[Path] | None = None) -> dict[str, set[str]]:
    """Top-level module -> files importing it, for every import (module level or inside a function) of the code."""
    if files is None:
        files = [REPO / "app.py", *(f for d in CODE for f in (REPO / d).rglob("*.py"))]
    out: dict[str, set[str]] = {}
    for f in files:
        tree = ast.parse(f.read_text(), filename=str(f))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for n in names:
                top = n.split(".")[0]
                if top in sys.stdlib_module_names or top in FIRST_PARTY or _sibling(f, top):
                    continue
                out.setdefault(top, set()).add(str(f.relative_to(REPO)) if f.is_relative_to(REPO) else str(f))
    return out


def test_every_third_party_import_is_declared_in_requirements() -> None:
    """`pip install -r requirements.txt` (torch first, as the Makefile does) gives every module the dashboard and
    the backend import; bench/ and tools/ may rely on requirements-dev.txt too."""
    from importlib.metadata import packages_distributions

    runtime = _declared(REPO / "requirements.txt")
    dev = runtime | _declared(REPO / "requirements-dev.txt")
    dists = packages_distributions()
    missing = []
    for top, files in sorted(_third_party_imports().items()):
        if top in NOT_DECLARED:
            continue
        names = {_norm(d) for d in dists.get(top, [])}
        if not names:
            missing.append(f"{top} (not installed here; imported by {sorted(files)[0]})")
            continue
        runtime_files = [f for f in files if not f.startswith(("bench/", "tools/"))]
        need = runtime if runtime_files and top not in OPTIONAL_RUNTIME else dev
        if not names & need:
            where = "requirements.txt" if need is runtime else "requirements*.txt"
            missing.append(f"{top}: distribution {sorted(names)} not in {where} (imported by {sorted(files)[0]})")
    assert missing == [], "\n".join(missing)


def test_the_requirements_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "r.txt").write_text("# c\ntorch==2.13.0\nPyYAML  # yaml\nAuthlib>=1.3.2\nprometheus_client==0.26.0\n")
    assert _declared(tmp_path / "r.txt") == {"torch", "pyyaml", "authlib", "prometheus-client"}
    # a sibling script module is the repository's own; a name with no file beside the script is a distribution
    (tmp_path / "suite.py").write_text("import torch\nfrom helper import f\nimport numpy as np\nimport missing_mod\n")
    (tmp_path / "helper.py").write_text("def f(): ...\n")
    tp = _third_party_imports([tmp_path / "suite.py"])
    assert set(tp) == {"torch", "numpy", "missing_mod"}


def test_the_gpu_scripts_are_checked() -> None:
    """gpu/'s imports are in the requirements check: torch from the GPU scripts, and their sibling modules not."""
    tp = _third_party_imports()
    assert any(f.startswith("gpu/") for f in tp.get("torch", ()))
    assert not {"load_suite", "runner_check"} & set(tp)


# ---------------------------------------------------------------------- layers (docs/ARCHITECTURE.md)

# bottom to top; a module may import its own layer and the layers below, never one above
LAYERS = ("base", "store", "analysis", "text", "engines/runs", "cli")
_LAYER_OF = [        # (module prefix, layer): the longest matching prefix wins
    ("backend.errors", "base"), ("backend.config", "base"), ("backend.jsonfile", "base"), ("backend.netutil", "base"),
    ("backend.model_id", "base"), ("backend.metrics", "base"), ("backend.stats", "base"), ("backend.coords", "base"),
    ("backend.stats_kernel", "base"),
    ("backend.prompts", "base"), ("backend.vllm_runner", "base"), ("backend.server_metrics", "base"),
    ("backend.load_client", "base"), ("backend.drafter_worth", "base"), ("backend.links", "base"),
    ("backend.machine_load", "base"), ("backend.tau_scale", "base"),
    ("backend.runs.manifest", "base"), ("backend.options", "base"), ("backend.settings", "base"),
    ("backend.store", "store"),
    ("backend.align", "analysis"), ("backend.annotations", "analysis"), ("backend.compare", "analysis"),
    ("backend.stats_compare", "analysis"), ("backend.drafter", "analysis"), ("backend.feeds", "analysis"),
    ("backend.regress", "analysis"), ("backend.findings", "analysis"), ("backend.runs_text", "analysis"),
    ("backend.run_files", "analysis"), ("backend.hf_model", "analysis"),
    ("backend.text", "text"),
    ("backend.training_data", "engines/runs"),
    ("backend.engines", "engines/runs"), ("backend.runs", "engines/runs"), ("backend.capture", "engines/runs"),
    ("backend.bench", "engines/runs"), ("backend.importers", "engines/runs"), ("backend.check_drafter", "engines/runs"),
    ("backend.load_bench", "engines/runs"), ("backend.watch", "engines/runs"), ("backend.producers", "engines/runs"),
    ("backend.prove_fix", "engines/runs"), ("backend.toy", "engines/runs"), ("backend.jobs", "engines/runs"),
    ("backend.__main__", "cli"), ("backend.bench_cli", "cli"), ("backend.watch_cli", "cli"),
    ("backend.release_cli", "cli"), ("backend.jobs.cli", "cli"), ("backend.demo", "cli"),
]
# upward imports that exist today, each with what removes it; the test fails on any other, and on one of these once
# it is gone (so the list only shrinks)
KNOWN_UPWARD: dict[tuple[str, str], str] = {}      # none left: every import goes down or stays in its layer


def _layer(mod: str) -> str | None:
    best = max((p for p, _ in _LAYER_OF if mod == p or mod.startswith(p + ".")), key=len, default=None)
    return dict(_LAYER_OF)[best] if best else None


def _upward(g: dict[str, set[str]]) -> set[tuple[str, str]]:
    out = set()
    for m, targets in g.items():
        for t in targets:
            lm, lt = _layer(m), _layer(t)
            if lm and lt and LAYERS.index(lt) > LAYERS.index(lm):
                out.add((m, t))
    return out


def test_every_backend_module_has_a_layer() -> None:
    assert sorted(m for m in _modules("backend") if m != "backend" and _layer(m) is None and
                  not m.endswith(("backend.runs", "backend.jobs"))) == []


def test_no_upward_import_across_layers() -> None:
    """store below analysis below text below engines/runs below the CLI (docs/ARCHITECTURE.md 'Layers')."""
    found = _upward(_graph())
    assert sorted(found - set(KNOWN_UPWARD)) == [], "an import goes up a layer (docs/ARCHITECTURE.md)"
    assert sorted(set(KNOWN_UPWARD) - found) == [], "gone: take it off KNOWN_UPWARD"


def test_the_layer_check_can_fail() -> None:
    assert _upward({"backend.store.rundir": {"backend.bench"}, "backend.bench": {"backend.store.rundir"}}) == {
        ("backend.store.rundir", "backend.bench")}


# ---------------------------------------------------------------------- one data root object (issue 21 item 3)

# a parameter is a bare data-root path when it is named `root`, or named like a data root (`data`, `data_root`,
# `root_dir`, `data_path`, `..._root`) and annotated as a path or a string
_ROOT_LIKE = re.compile(r"^(data|data_dir|data_path|root_dir|root_path|\w+_root)$")
_PATH_TYPE = re.compile(r"\b(Path|PurePath|str|PathLike)\b")
# the only places under backend/ that turn a path into a data root (backend/store/data_root.py's DataRoot(path) is
# the constructor; its parameter is `path`), each with why
ROOT_PATH_ALLOWED = {
    ("backend/config.py", "paths"): "the path helper the DataRoot constructor resolves its path with",
    ("backend/jobs/worker.py", "_ray_task"): "a Ray task's entry: the root crosses the process boundary as a string",
}


def _root_params(source: str, filename: str) -> list[str]:
    """'file:line function(parameter)' for each function parameter of `source` that is a bare data-root path."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        a = node.args
        name = getattr(node, "name", "<lambda>")
        for p in [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x)]:
            ann = ast.unparse(p.annotation) if p.annotation is not None else ""
            if p.arg == "root" or (_ROOT_LIKE.search(p.arg) and _PATH_TYPE.search(ann)):
                if (filename, name) not in ROOT_PATH_ALLOWED:
                    out.append((node.lineno, f"{filename}:{node.lineno} {name}({p.arg}{': ' + ann if ann else ''})"))
    return [text for _, text in sorted(out)]


def test_no_backend_function_takes_a_bare_root_path() -> None:
    """Issue 21 item 3's bar: a data root travels as one object (backend/store/data_root.py `DataRoot`, parameter
    `data: DataRoot | None`); only its constructor and the entry points (CLIs, a Ray task) turn a path into one."""
    found = []
    for f in sorted((REPO / "backend").rglob("*.py")):
        found += _root_params(f.read_text(), str(f.relative_to(REPO)))
    assert found == [], "take `data: DataRoot | None = None` (docs/ARCHITECTURE.md, Catalog):\n" + "\n".join(found)


def test_the_root_path_check_can_fail() -> None:
    snippet = ("def a(run_id, root=None): ...\n"
               "def b(x, data_root: Path | None = None): ...\n"
               "def c(data: str, data_cache: Path): ...\n"
               "def d(data: DataRoot | None = None, path: Path | None = None): ...\n"
               "f = lambda root: root\n"
               "class K:\n    def m(self, *, root: Path): ...\n")
    assert _root_params(snippet, "x.py") == ["x.py:1 a(root)", "x.py:2 b(data_root: Path | None)",
                                             "x.py:3 c(data: str)", "x.py:5 <lambda>(root)", "x.py:7 m(root: Path)"]
    assert _root_params("def paths(root=None): ...", "backend/config.py") == []    # the allowed helper


def test_engines_and_drafter_do_not_import_each_other_both_ways() -> None:
    """engines/ runs drafters (engines -> drafter); drafter/ never imports engines/: the HF model primitives the
    finder needs live below both (backend/hf_model.py)."""
    g = _graph()
    assert {(m, t) for m, ts in g.items() for t in ts
            if m.startswith("backend.drafter") and t.startswith("backend.engines")} == set()
    assert any(m.startswith("backend.engines") and t.startswith("backend.drafter") for m, ts in g.items() for t in ts)


def test_engines_are_one_registry_and_implement_the_interface() -> None:
    """Every engine is registered once (backend/engines/base.py ENGINES, HF included) and its module has the
    interface's functions; adding an engine is its module plus that line."""
    import importlib
    import inspect

    from backend.engines import base

    assert set(base.ENGINES) == {"hf", "vllm", "sglang"}
    for modname in base.ENGINES.values():
        mod = importlib.import_module(modname)
        for fn in ("require", "capture_options", "capture_session", "make_engine"):
            assert callable(getattr(mod, fn, None)), f"{modname}.{fn}"
        params = list(inspect.signature(mod.make_engine).parameters)
        assert params[1:3] == ["drafter", "eos"], modname
    loops = [f for f in (REPO / "backend").rglob("*.py") if "for i in range(start, " in f.read_text()]
    assert [str(f.relative_to(REPO)) for f in loops] == ["backend/engines/capture_loop.py"]


def _interface_hints() -> dict[str, dict]:
    """The resolved annotations of every method of the engine interface (backend/engines/base.py protocols)."""
    import typing

    import torch

    from backend.coords import Boundary
    from backend.engines import base
    from backend.runs.lifecycle import Run
    from backend.stats import StatsState, StreamingStats, TokenSample

    names = {**vars(base), "torch": torch, "Boundary": Boundary, "Run": Run, "StatsState": StatsState,
             "StreamingStats": StreamingStats, "TokenSample": TokenSample}
    out = {}
    for proto in (base.Engine, base.CaptureSession, base.EngineAdapter, base.Target):
        for attr, fn in vars(proto).items():
            fn = fn.fget if isinstance(fn, property) else fn
            if callable(fn) and not attr.startswith("_"):
                out[f"{proto.__name__}.{attr}"] = typing.get_type_hints(fn, globalns=names)
    return out


def _holds_any(tp) -> bool:
    import typing

    return tp is typing.Any or any(_holds_any(a) for a in typing.get_args(tp))


def test_the_engine_interface_is_typed_without_any() -> None:
    """Every parameter and result of the engine interface has a real type (no `Any`, none left out): the run
    (`Run`), the statistics state (`StatsState`), the engine's options (`EngineOptions`), the target (`Target`)."""
    import inspect

    from backend.engines import base
    from backend.runs.lifecycle import Run
    from backend.stats import StatsState

    hints = _interface_hints()
    assert {k: v for k, v in hints.items() if any(_holds_any(t) for t in v.values())} == {}
    for proto in (base.Engine, base.CaptureSession, base.EngineAdapter):
        for attr, fn in vars(proto).items():
            if inspect.isfunction(fn) and not attr.startswith("_"):
                want = [p for p in inspect.signature(fn).parameters if p != "self"] + ["return"]
                assert sorted(want) == sorted(hints[f"{proto.__name__}.{attr}"]), f"{proto.__name__}.{attr}"
    session = hints["CaptureSession.begin"]
    assert session["rd"] is Run and session["state"] == StatsState | None
    assert hints["CaptureSession.target"]["return"] is base.Target
    assert hints["EngineAdapter.capture_session"]["options"] == base.EngineOptions | None
    assert "Any" not in vars(base)


def test_the_engine_interface_check_can_fail() -> None:
    import typing

    assert _holds_any(typing.Any) and _holds_any(dict[str, typing.Any] | None) and not _holds_any(int | None)


def test_each_engine_builds_and_takes_only_its_own_options() -> None:
    """An engine's options are its module's (`capture_options` builds them from a capture's tensor-parallel size
    and engine options); another engine's are refused in one line."""
    from backend.engines import base, hf, sglang, vllm
    from backend.errors import SpecLensError
    from backend.settings import CaptureSettings

    s = CaptureSettings(model="/m", prompts="/p", engine="vllm", dtype="bf16")
    v = vllm.capture_options(s, 2, {"gpu_memory_utilization": "0.5", "max_model_len": 4096, "enable_dbo": True})
    assert isinstance(v, vllm.VllmOptions) and isinstance(v, base.EngineOptions)
    assert (v.tensor_parallel_size, v.gpu_memory_utilization, v.max_model_len, v.dtype, v.extra) == (
        2, 0.5, 4096, "bfloat16", {"enable_dbo": True})
    assert isinstance(sglang.capture_options(s), sglang.SGLangOptions) and hf.capture_options(s) is None
    assert base.own_options(vllm.VllmOptions, None) == vllm.VllmOptions()
    with pytest.raises(SpecLensError, match="SGLangOptions given to an engine that takes VllmOptions"):
        base.own_options(vllm.VllmOptions, sglang.SGLangOptions())
    with pytest.raises(SpecLensError, match="takes no engine options"):
        hf.capture_session(s, v)


def _markdown_strings(source: str) -> list[tuple[int, str]]:
    """(line, text) of each string literal in `source` that builds markdown: bold ("**") or a page link ("](/"),
    outside a `# --- compat (begin)` ... `# --- compat (end)` block."""
    lines = source.splitlines()
    begin = [i + 1 for i, x in enumerate(lines) if "# --- compat (begin)" in x]
    end = [i + 1 for i, x in enumerate(lines) if "# --- compat (end)" in x]
    spans = list(zip(begin, end, strict=True))
    out = []
    for node in ast.walk(ast.parse(source)):
        text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
        if ("**" in text or "](/" in text) and not any(b <= node.lineno <= e for b, e in spans):
            out.append((node.lineno, text))
    return out


def test_compare_backend_returns_data_not_words() -> None:
    """Issue 21 item 4: backend/compare.py and backend/findings.py build no markdown (no "**", no "](/" link) and
    import nothing from dashboard/; dashboard/compare_words.py and dashboard/run_view.py word their objects (a
    run's wrong feed reads the same on its run page as on Compare). No compat block is left."""
    from backend import compare
    from backend.findings import Finding
    from dashboard import compare_words, run_view

    for name in ("compare.py", "findings.py", "runs_text.py"):
        f = REPO / "backend" / name
        assert not _markdown_strings(f.read_text()), (name, _markdown_strings(f.read_text()))
        assert not [m for m in _imports(f) if m.split(".")[0] == "dashboard"], name
        assert "compat (begin)" not in f.read_text(), name
    assert not (REPO / "backend" / "run_view.py").exists(), "the run page's words live in dashboard/run_view.py"
    for fed, trained in ((["S_2", "S_4", "S_5"], ["S_3", "S_5", "S_6"]), (["S_3", "S_5", "S_6"], ["S_0", "S_3", "S_5"]),
                         (["S_1", "S_5"], ["S_1", "S_7"]), (["S_1"], ["S_1", "S_2"]), (["S_5"], ["S_2"])):
        m = compare.Mismatch("b", "chk", "d", fed, trained, compare.relation(fed, trained))
        line = run_view.finding_line(Finding("note", "mismatch", "x", mismatch=m), {})     # its cost not known
        assert line.startswith("**Note** (cost not measured") and "Fed the wrong boundaries" in line
        assert line.endswith(compare_words.mismatch_line(m))


def test_feeds_and_align_return_data_not_words() -> None:
    """Issue 21 item 4: backend/feeds.py and backend/align.py build no markdown and import nothing of dashboard/;
    they return data (feeds.summary a `Summary`, an `Alignment`'s CKA figures and findings) and backend/text/ words
    it for the command line and the pages alike (dashboard/feeds_words.py the Feeds page's summary lines,
    dashboard/align_words.py the alignment's CKA words and verdict)."""
    import dataclasses

    from backend import align, feeds
    from backend.stats_compare import StatComparison

    for name in ("feeds.py", "align.py", "stats_compare.py"):
        f = REPO / "backend" / name
        assert not _markdown_strings(f.read_text()), (name, _markdown_strings(f.read_text()))
        assert not [m for m in _imports(f) if m.split(".")[0] == "dashboard"], name
    assert "verdict" not in {f.name for f in dataclasses.fields(StatComparison)}     # dashboard/stats_words.py words it
    assert not hasattr(align.Alignment, "cka_words") and not hasattr(align.Alignment, "headline")
    assert not hasattr(feeds, "print_text")
    assert feeds.summary.__annotations__["return"] in ("Summary", feeds.Summary)
    pages = {p: (REPO / "pages" / p).read_text() for p in ("feeds.py", "alignment.py")}
    assert "feeds_words.summary_lines(feeds.summary(m))" in pages["feeds.py"]
    assert "align_words.cka_words(al)" in pages["alignment.py"]


# sentences backend/text/ words from the analysis' verdict objects: no other module under backend/ or dashboard/
# writes one (so the terminal and the pages read the same words, and the analysis returns data)
_SENTENCES = {
    "align": ("Offset by ", "Mislabelled: the ids differ", "Basis rotation: ", "Numeric drift", "Aligned: all ",
              "Final norm: ", "No good match (cosine", "NaN/inf tokens at ", "F has no namesake in ",
              "The captures share no boundary names"),
    "feeds": ("first change", "the same over every release in the table", "no full drafter check of this pair",
              "ids and releases read from the kind rows"),
    "drafter": ("not served", "no ids (fed the target's last hidden state)", "top-level ids only",
                "eagle_config ids only", "top-level ids, then eagle_config"),
    "check": ("cannot serve this drafter as configured", "are written only in eagle_config", "d2t maps ",
              "does not take a multiple of the target hidden", "Training data and serving", "Lint only (config files",
              "the drafter predicts no better than chance", "Mismatch: the drafter was", "Match: ",
              "the finder runs the drafter with", "The finder did not run", "files are mislabelled by their convention",
              "Measured on the toy pair", "is true: vLLM", "what the drafter was trained on."),
    "stats": ("Largest change: ", "No change: ", "No boundary in common between", "Pick a capture other than"),
}
_WORDED_IN = {"align": "backend/text/align_text.py", "feeds": "backend/text/feeds_text.py",
              "drafter": "backend/text/drafter_text.py", "check": "backend/text/check_text.py",
              "stats": "dashboard/stats_words.py"}      # the Stats page's verdict: page words only (no command)
# the drafter check's findings are data (backend/drafter/lint.py `Finding`: severity, code, figures, source): the
# modules that build them pass no sentence, only a code and its figures (backend/text/check_text.py words them)
_FINDINGS_BUILT_IN = ("backend/drafter/lint.py", "backend/check_drafter.py", "backend/training_data.py")


def _literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of each string literal of `source` (f-string parts included), docstrings left out."""
    tree = ast.parse(source)
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


def _sentences(source: str) -> list[tuple[int, str]]:
    return [(line, text) for line, text in _literals(source)
            if any(t in text for ts in _SENTENCES.values() for t in ts)]


def _worded_findings(source: str) -> list[tuple[int, str]]:
    """(line, text) of each `Finding(...)` call of `source` that passes words: an f-string, or a string literal
    other than a one-word severity, code or source."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and (getattr(node.func, "id", None) == "Finding"
                                                or getattr(node.func, "attr", None) == "Finding")):
            continue
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            words = [n for n in ast.walk(arg) if isinstance(n, ast.JoinedStr) or (
                isinstance(n, ast.Constant) and isinstance(n.value, str) and not re.fullmatch(r"\w+", n.value))]
            if words:
                out.append((arg.lineno, ast.unparse(arg)))
    return sorted(out)


def test_drafter_check_findings_are_data() -> None:
    """Issue 21 item 4: the drafter check's findings (lint, finder, training data) carry a code and its figures, no
    sentence; backend/text/check_text.py words every code, and check.json stores the words beside the data."""
    import dataclasses

    from backend.drafter import lint
    from backend.text import check_text

    assert {f.name for f in dataclasses.fields(lint.Finding)} == {"severity", "code", "figures", "source"}
    found = {f: hits for f in _FINDINGS_BUILT_IN if (hits := _worded_findings((REPO / f).read_text()))}
    assert found == {}, "pass a code and figures; word it in backend/text/check_text.py"
    codes = set()
    for f in _FINDINGS_BUILT_IN:
        for node in ast.walk(ast.parse((REPO / f).read_text())):
            if isinstance(node, ast.Call) and "Finding" in (getattr(node.func, "id", ""),
                                                            getattr(node.func, "attr", "")):
                assert len(node.args) >= 2 and isinstance(node.args[1], ast.Constant), (f, node.lineno)
                codes.add(node.args[1].value)
    assert codes == set(check_text.CODES), codes ^ set(check_text.CODES)      # every code worded, no word unused


def test_the_worded_finding_check_can_fail() -> None:
    snippet = ('out.append(Finding("warning", f"{f}: norm_before_fc is true"))\n'
               'x = L.Finding("info", "no_embed_tokens", {}, "finder")\n'
               'y = L.Finding("error", "The finder did not run", source="finder")\n'
               'z = Finding(sev, "cannot_serve", {"name": r.name, "why": "not " + r.why})\n')
    assert [n for n, _ in _worded_findings(snippet)] == [1, 3, 4]


def test_verdicts_are_worded_once_in_the_text_layer() -> None:
    """Issue 21 item 4: the analysis returns verdict objects (an alignment's `Finding` has a kind, its pairs and its
    figures, no text); backend/text/ words them as plain sentences, once, for the terminal and the pages; dashboard/
    adds markdown, tiles and URLs. No module of backend/ or dashboard/ but the text layer's writes those sentences,
    and the text layer builds no markdown and imports neither Streamlit, plotly nor dashboard/."""
    import dataclasses

    from backend import align
    from backend.drafter import kinds

    assert "text" not in {f.name for f in dataclasses.fields(align.Finding)}
    assert not hasattr(kinds, "reads_words")
    worded = {str(REPO / f) for f in _WORDED_IN.values()}
    found = {}
    for d in ("backend", "dashboard", "pages"):
        for f in sorted((REPO / d).rglob("*.py")):
            if str(f) not in worded and (hits := _sentences(f.read_text())):
                found[str(f.relative_to(REPO))] = hits
    assert found == {}, "word it in backend/text/ (docs/ARCHITECTURE.md, Pages and dashboard)"
    for key, f in _WORDED_IN.items():
        text = "\n".join(t for _, t in _literals((REPO / f).read_text()))
        assert any(t in text for t in _SENTENCES[key]), f     # the check looks where the words are
    for f in (REPO / "backend" / "text").rglob("*.py"):
        assert not _markdown_strings(f.read_text()), f
        assert not [m for m in _imports(f) if m.split(".")[0] in ("streamlit", "plotly", "dashboard")], f
    assert "feeds_text.summary_lines" in (REPO / "dashboard" / "feeds_words.py").read_text()
    assert "summary_lines(summary(m))" in (REPO / "backend" / "release_cli.py").read_text()


def test_the_sentence_check_can_fail() -> None:
    snippet = ('"""Offset by a docstring is fine."""\nA = f"Offset by {k:+d}: what B labels"\n'
               'def f():\n    """Numeric drift in a docstring."""\n    return "not served"\n')
    assert [n for n, _ in _sentences(snippet)] == [2, 5]


def test_the_markdown_check_can_fail() -> None:
    snippet = ('A = "**bold**"\nB = f"see [check](/drafter?run={x})"\n'
               '# --- compat (begin)\nC = "**ok**"\n# --- compat (end)\n')
    assert [n for n, _ in _markdown_strings(snippet)] == [1, 2]


_VIEW_URL = re.compile(r"(^|[\s(])/(compare|drafter|run|feeds|alignment|stats|load|watch|regression|runs)\?\w+=")


def _url_strings(source: str) -> list[tuple[int, str]]:
    """(line, text) of each string literal that starts a dashboard view's URL ('/compare?runs=...'), docstrings
    left out."""
    tree = ast.parse(source)
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs and _VIEW_URL.search(n.value)]


def test_dashboard_urls_are_built_in_one_backend_module() -> None:
    """Issue 21 item 4: a view's URL path is built by backend/links.py (the command line prints it, pages link with
    it); no other module under backend/ writes one."""
    found = {str(f.relative_to(REPO)): _url_strings(f.read_text()) for f in sorted((REPO / "backend").rglob("*.py"))
             if f.name != "links.py"}
    assert {f: v for f, v in found.items() if v} == {}
    assert _url_strings('"""/drafter?run=x in a docstring"""\nx = "/compare?runs=" + ids\n') == [
        (2, "/compare?runs=")]


# ---------------------------------------------------------------------------- one page registry (issue 21 item 4)

PAGE_HOME = "backend/links.py"        # the one page registry (PAGES); dashboard/page_registry.py builds st.Page
NAV_HOME = "dashboard/page_registry.py"
_SCRIPT = re.compile(r"^pages/\w+\.py$")


def _page_lists(source: str, views: set[str]) -> list[tuple[int, str]]:
    """(line, what) for each second registration of pages in `source`: an st.Page(...) call, or a literal list,
    tuple, set or dict (its keys or its values) that names two page scripts ('pages/x.py'), two view URL paths
    ('/compare') or three view names."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "Page":
            out.append((node.lineno, "st.Page"))
        groups = []
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            groups.append(node.elts)
        elif isinstance(node, ast.Dict):
            groups += [[k for k in node.keys if k is not None], node.values]
        for elts in groups:
            s = [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            scripts = [x for x in s if _SCRIPT.match(x)]
            urls = [x for x in s if x.startswith("/") and x[1:] in views]
            names = [x for x in s if x in views]
            if len(scripts) >= 2 or len(urls) >= 2 or len(names) >= 3:
                out.append((node.lineno, "pages listed"))
    return sorted(set(out))


def test_the_pages_are_registered_once() -> None:
    """The pages are one table (backend/links.py PAGES, below the dashboard, so the CLI's links use it too): app.py's
    navigation and the run page's links derive from it (dashboard/page_registry.py); no other module of the code
    lists pages or builds an st.Page, and every page script a module names alone is registered and exists."""
    from backend.links import PAGES

    views = set(PAGES)
    assert {p.script for p in PAGES.values()} == {str(f.relative_to(REPO)) for f in (REPO / "pages").glob("*.py")}
    found, unregistered = [], []
    files = [REPO / "app.py", *(f for d in (*CODE, "gpu") for f in sorted((REPO / d).rglob("*.py")))]
    for f in files:
        rel = str(f.relative_to(REPO))
        src = f.read_text()
        if rel != PAGE_HOME:
            found += [f"{rel}:{n} {what}" for n, what in _page_lists(src, views)
                      if not (rel == NAV_HOME and what == "st.Page")]
        unregistered += [f"{rel}:{n.lineno} {n.value}" for n in ast.walk(ast.parse(src))
                         if isinstance(n, ast.Constant) and isinstance(n.value, str) and _SCRIPT.match(n.value)
                         and n.value not in {p.script for p in PAGES.values()}]
    assert found == [], "register a page in backend/links.py PAGES, link with dashboard/page_registry.py"
    assert unregistered == []


def test_the_page_list_check_can_fail() -> None:
    views = {"runs", "compare", "run", "stats"}
    snippet = ('PAGES = {"runs": "pages/runs.py", "compare": "pages/compare.py"}\n'
               'ICONS = {"runs": ":material/list:", "compare": "x", "stats": "y"}\n'
               'P = st.Page("pages/runs.py", title="Runs")\n'
               'NAV = ["/runs", "/compare"]\n'
               'ok = {"runs": ids, "baseline": "paired"}\nst.page_link("pages/run.py", label="Open")\n')
    assert _page_lists(snippet, views) == [(1, "pages listed"), (2, "pages listed"), (3, "st.Page"),
                                           (4, "pages listed")]
