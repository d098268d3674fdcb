"""Boundary coordinates and what each producer's layer ids mean (docs/CONVENTIONS.md#boundaries).

S_0 is the residual stream entering layer 0 (the embeddings), S_b (1 <= b <= N) the output of decoder
layer b-1 before any final norm, and F = final_norm(S_N). Every captured tensor carries one of these
labels; bare layer ids are turned into boundaries here and nowhere else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from backend.errors import SpecLensError

CONVENTIONS_FILE = Path(__file__).with_name("conventions.yaml")
KINDS_MARK = "# ---- BEGIN kind rows"
_LABEL = re.compile(r"^(?:S_(\d+)|F)$")


@dataclass(frozen=True, order=True)
class Boundary:
    """A point of the residual stream: S_b (index=b) or F (final=True, after S_N)."""

    index: int
    final: bool = False

    @property
    def label(self) -> str:
        return "F" if self.final else f"S_{self.index}"

    def sort_key(self) -> float:
        return self.index + (0.5 if self.final else 0.0)

    def __str__(self) -> str:  # pragma: no cover - convenience
        return self.label


def S(b: int) -> Boundary:
    return Boundary(b)


def final(n_layers: int) -> Boundary:
    return Boundary(n_layers, final=True)


def parse(label: str, n_layers: int | None = None) -> Boundary:
    """'S_3' -> S(3); 'F' -> final(N) (needs n_layers when F's position matters)."""
    m = _LABEL.match(label.strip())
    if not m:
        raise SpecLensError(f"'{label}' is not a boundary label; use S_0..S_N or F")
    if m.group(1) is None:
        return final(n_layers if n_layers is not None else 10**6)
    return S(int(m.group(1)))


def all_boundaries(n_layers: int) -> list[Boundary]:
    """S_0..S_N and F, in stream order."""
    return [S(b) for b in range(n_layers + 1)] + [final(n_layers)]


def sort_labels(labels: list[str]) -> list[str]:
    """Stream order for labels: S_0 < S_1 < ... < S_N < F."""
    def key(lbl: str) -> float:
        m = _LABEL.match(lbl)
        return float("inf") if m is None or m.group(1) is None else int(m.group(1))
    return sorted(labels, key=key)


def label_index(label: str) -> float:
    """Numeric position of a label in the stream (F counts as +inf; use with known N for offsets)."""
    m = _LABEL.match(label)
    if not m:
        raise SpecLensError(f"'{label}' is not a boundary label; use S_0..S_N or F")
    return float("inf") if m.group(1) is None else float(m.group(1))


# ---------------------------------------------------------------- conventions table


@dataclass(frozen=True)
class Convention:
    producer: str
    versions: str
    families: tuple[str, ...]
    rule: str
    valid: tuple[str, str]
    default: tuple[str, ...]
    teacher: str
    ids_from: dict = field(hash=False, compare=False, default_factory=dict)
    runner: tuple[str, ...] = ()
    status: str = "inferred"
    note: str = ""
    seen: str = ""                 # the runs that showed the rule (status seen): what, where, when
    # vLLM/SGLang rows derived from the wheels (tools/rederive_conventions.py): how vLLM picks its runner in this
    # release, the file and function deciding each fact, and the wheels (sha256, function hashes) read
    runner_choice: dict = field(hash=False, compare=False, default_factory=dict)
    decided_by: dict = field(hash=False, compare=False, default_factory=dict)
    wheels: dict = field(hash=False, compare=False, default_factory=dict)

    def matches(self, producer: str, version: str | None, family: str, runner: str | None) -> bool:
        if producer != self.producer:
            return False
        if self.versions != "*" and version is not None:
            if Version(version) not in SpecifierSet(self.versions):
                return False
        if self.runner and runner is not None and runner not in self.runner:
            return False
        return "*" in self.families or family in self.families


@lru_cache(maxsize=1)
def conventions() -> tuple[Convention, ...]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)    # the C loader: 125 rows in ~40 ms, not ~300 ms
    text = CONVENTIONS_FILE.read_text().split(KINDS_MARK)[0]     # the kind rows (last) are backend/drafter/kinds.py's
    rows = yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader
    out = []
    for r in rows:
        if r.get("kind"):                  # the drafter-kind rows (DFlash, MTP, ...): backend/drafter/kinds.py
            continue
        out.append(Convention(
            producer=r["producer"], versions=str(r["versions"]), families=tuple(r["families"]),
            rule=r["rule"], valid=tuple(str(v) for v in r["valid"]),
            default=tuple(str(d) for d in r["default"]), teacher=str(r["teacher"]),
            ids_from=dict(r.get("ids_from", {})), runner=tuple(r.get("runner", ())),
            status=r.get("status", "inferred"), note=r.get("note", ""), seen=r.get("seen", ""),
            runner_choice=dict(r.get("runner_choice") or {}), decided_by=dict(r.get("decided_by") or {}),
            wheels=dict(r.get("wheels") or {}),
        ))
    return tuple(out)


def releases(producer: str) -> list[str]:
    """The releases of `producer` whose wheels the table's rows were derived from, oldest first."""
    out = {v for c in conventions() if c.producer == producer for v in c.wheels}
    return sorted(out, key=Version)


PRODUCERS = ("vllm", "sglang", "speculators", "specforge", "hf", "eagle")
# the release of each producer that SpecLens was checked against: what a bare `--producer X` means
DEFAULT_VERSIONS = {"vllm": "0.24.0", "sglang": "0.5.15", "speculators": "0.5.0", "specforge": "0.2.0"}

_FAMILY_ALIASES = {
    # qwen2/qwen3/qwen3_moe stay apart: SGLang 0.5.1 has no EAGLE-3 capture for Qwen2ForCausalLM (a row of its own,
    # derived from the wheel's EntryClass by tools/rederive_conventions.py)
    "llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe",
    "deepseek_v2": "deepseek_v2", "deepseek_v3": "deepseek_v3", "kimi_k2": "kimi_k2",
    "glm4_moe_lite": "glm4_moe_lite", "gpt_oss": "gpt_oss",
}


def family_of(model_type: str | None) -> str:
    """HF config model_type -> the family name the conventions table uses."""
    if not model_type:
        return "llama"
    return _FAMILY_ALIASES.get(model_type, model_type)


def _eval(expr: str, n: int) -> int:
    if not re.fullmatch(r"[0-9N+\-*/ ()]+", expr):
        raise ValueError(f"bad expression in conventions table: {expr}")
    return int(eval(expr, {"__builtins__": {}}, {"N": n}))  # noqa: S307 - vetted by the regex above


def convention_for(producer: str, version: str | None = None, family: str = "llama",
                   runner: str | None = None) -> Convention:
    if producer not in PRODUCERS:
        raise SpecLensError(f"unknown producer '{producer}'; use one of {', '.join(PRODUCERS)}")
    fam = family_of(family)
    for c in conventions():
        if c.matches(producer, version, fam, runner):
            return c
    raise SpecLensError(
        f"no convention known for {producer} {version or ''} ({fam}); "
        f"add a row to {CONVENTIONS_FILE.name} or pass a supported version")


def _apply(rule: str, ids: list[int], n: int) -> list[Boundary]:
    if rule == "input":
        return [S(a) for a in ids]
    if rule == "after":
        return [S(a + 1) for a in ids]
    if rule == "after_if_first_1":
        shift = 1 if ids and ids[0] == 1 else 0
        return [S(a + shift) for a in ids]
    if rule == "input_if_max_n":
        shift = 0 if ids and max(ids) == n else 1
        return [S(a + shift) for a in ids]
    if rule == "hf_hidden_states":
        return [final(n) if a == n else S(a) for a in ids]
    raise ValueError(f"unknown rule {rule}")


def resolve_ids(producer: str, ids: list[int] | None, n_layers: int, *, version: str | None = None,
                family: str = "llama", runner: str | None = None) -> list[Boundary]:
    """Turn a producer's layer ids into boundaries, or refuse ids that producer cannot capture.

    ids=None means "no ids written down": the producer's default set. The teacher state a producer
    appends (S_N or F) is not included; see `teacher_boundary`.
    """
    conv = convention_for(producer, version, family, runner)
    n = int(n_layers)
    if n < 1:
        raise SpecLensError(f"num_layers must be >= 1 (got {n_layers}); pass --num-layers N")
    if conv.rule == "unsupported":
        raise SpecLensError(f"{producer} {version or ''} has no EAGLE-3 aux-state capture for the {family_of(family)} "
                            f"family ({conv.decided_by.get('rule', 'see backend/conventions.yaml')}); use a release "
                            f"that has one")
    if ids is None or len(ids) == 0:
        return [S(_eval(d, n)) for d in conv.default]
    lo, hi = (_eval(v, n) for v in conv.valid)
    bad = [a for a in ids if not lo <= a <= hi]
    if bad:
        raise SpecLensError(
            f"{producer}{' ' + version if version else ''} ({family_of(family)}) cannot capture layer id(s) "
            f"{bad} on a {n}-layer target: valid ids are {lo}..{hi}; fix the ids in the drafter config "
            f"or --producer-ids")
    return _apply(conv.rule, list(ids), n)


def teacher_boundary(producer: str, n_layers: int, *, version: str | None = None,
                     family: str = "llama") -> Boundary | None:
    conv = convention_for(producer, version, family)
    if conv.teacher == "S_N":
        return S(n_layers)
    if conv.teacher == "F":
        return final(n_layers)
    return None


def labels(bs: list[Boundary]) -> list[str]:
    return [b.label for b in bs]
