"""Names, defaults and settings are defined once (issue 21 item 2).

Static checks over backend/ (AST): no second literal list of engine names (backend/options.py ENGINES is the one
registry) or of vLLM runner values (backend/vllm_runner.py RUNNERS), and no K default written as a number anywhere but
backend/options.py; each check is shown to fail on a snippet that repeats the list."""

from __future__ import annotations

import ast
from pathlib import Path

from backend import options

REPO = Path(__file__).resolve().parents[1]
HOMES = {"engines": "backend/options.py", "runners": "backend/vllm_runner.py", "k": "backend/options.py"}


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


def repeats(source: str) -> list[tuple[str, int]]:
    """(what, line) for every second definition in `source`: an engine-name list, a runner list, a K default."""
    engines, runners = set(options.ENGINE_NAMES), set(options.RUNNERS)
    out = []
    for node in ast.walk(ast.parse(source)):
        s = _strings(node)
        if s is not None and set(s) <= engines:
            out.append(("engines", node.lineno))
        if s is not None and set(s) <= runners:
            out.append(("runners", node.lineno))
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal":
            sl = node.slice
            vals = [e.value for e in (sl.elts if isinstance(sl, ast.Tuple) else [sl]) if isinstance(e, ast.Constant)]
            if len(vals) >= 2 and set(vals) <= engines:
                out.append(("engines", node.lineno))
        if _k_default(node):
            out.append(("k", node.lineno))
    return sorted(set(out))


def _found() -> list[str]:
    out = []
    for f in sorted((REPO / "backend").rglob("*.py")):
        rel = str(f.relative_to(REPO))
        out += [f"{rel}:{line} {what}" for what, line in repeats(f.read_text()) if HOMES[what] != rel]
    return out


def test_engine_names_runners_and_k_default_are_defined_once() -> None:
    assert _found() == [], "use backend.options (ENGINE_NAMES, SERVING_ENGINES, RUNNERS, DEFAULT_K) instead"


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
'''
    assert repeats(src) == [("engines", 2), ("engines", 3), ("engines", 5), ("k", 7), ("k", 9), ("k", 10),
                                    ("k", 11), ("runners", 4)]


def test_the_registry_is_the_one_list() -> None:
    from backend.engines import base

    assert base.ENGINES is options.ENGINES
    assert options.ENGINE_NAMES == tuple(options.ENGINES)
    assert set(options.SERVING_ENGINES) == set(options.ENGINES) - {options.IN_PROCESS_ENGINE}
    assert set(options.VLLM_RUNNERS) | {"auto"} == set(options.RUNNERS)
