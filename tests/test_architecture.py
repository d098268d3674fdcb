"""The flow runs one way (docs/ARCHITECTURE.md): engines -> capture/bench -> run directory -> catalog -> pages.

Static checks over the source (every import, at module level or inside a function): no import cycle inside
backend/; nothing under backend/ imports Streamlit or the dashboard package; no engine module imports capture or
bench; the lint runs clean (ruff, line length 120)."""

from __future__ import annotations

import ast
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
