"""The toy pair's training text: Spec-Bench prompts (minus a fixed held-out set) plus text shipped offline.

Sources, in this order (each is skipped quietly when absent on a machine):

| source              | what                                                                  |
|---------------------|-----------------------------------------------------------------------|
| `spec_bench`        | training Spec-Bench rows as chat: user turn, then the reference answer |
| `pydoc_topics`      | `pydoc_data.topics`: the Python language reference, shipped with Python |
| `stdlib_docstrings` | module/class/function docstrings of the stdlib, read with `ast` (no imports) |
| `debian_docs`       | `/usr/share/common-licenses/*` and `/usr/share/doc/*/README*`          |

The held-out split is fixed: within each Spec-Bench category, ordered by `question_id`, every 4th row
(positions 3, 7, 11, ...) is held out and never used for training (tokenizer, target or drafter).
Everything is deterministic for a given Python/Debian installation; `Corpus.sha256` identifies the text.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import sysconfig
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from backend.config import REPO_ROOT

SPEC_BENCH = REPO_ROOT / "datasets" / "spec_bench" / "question.jsonl"
HOLDOUT_EVERY = 4
SOURCES = ("spec_bench", "pydoc_topics", "stdlib_docstrings", "debian_docs")
_SKIP_DIRS = {"test", "tests", "site-packages", "dist-packages", "idlelib", "lib2to3", "turtledemo", "__pycache__",
              "ensurepip", "config-3", "tkinter"}


@dataclass(frozen=True)
class Doc:
    source: str
    text: str


@dataclass
class Corpus:
    docs: list[Doc]
    heldout_ids: list[int]
    chars: dict[str, int] = field(default_factory=dict)   # source -> characters

    @property
    def sha256(self) -> str:
        h = hashlib.sha256()
        for d in self.docs:
            h.update(d.source.encode() + b"\0" + d.text.encode() + b"\0")
        return h.hexdigest()

    def texts(self, source: str | None = None) -> list[str]:
        return [d.text for d in self.docs if source is None or d.source == source]

    def summary(self) -> dict:
        n = defaultdict(int)
        for d in self.docs:
            n[d.source] += 1
        return {"sha256": self.sha256, "docs": dict(n), "chars": dict(self.chars),
                "heldout_question_ids": len(self.heldout_ids)}


# ---------------------------------------------------------------- Spec-Bench and its split

def spec_bench_rows(path: Path = SPEC_BENCH) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def heldout_ids(path: Path = SPEC_BENCH, every: int = HOLDOUT_EVERY) -> list[int]:
    """question_ids never used for training: every `every`-th row of each category, by question_id."""
    by_cat: dict[str, list[int]] = defaultdict(list)
    for r in spec_bench_rows(path):
        by_cat[r["category"]].append(int(r["question_id"]))
    out = [qid for ids in by_cat.values() for i, qid in enumerate(sorted(ids)) if i % every == every - 1]
    return sorted(out)


def split_rows(path: Path = SPEC_BENCH) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows), each in file order."""
    held = set(heldout_ids(path))
    rows = spec_bench_rows(path)
    return [r for r in rows if int(r["question_id"]) not in held], [r for r in rows if int(r["question_id"]) in held]


def chat_text(user: str, assistant: str | None = None, generation_prompt: bool = True) -> str:
    """The toy tokenizer's chat format (backend.toy.tokenizer.CHAT_TEMPLATE), as plain text: the user
    turn, then `<|assistant|>` and the answer (or nothing, with generation_prompt=False)."""
    s = f"<|user|>\n{user}<|end|>\n"
    if assistant is not None:
        return s + f"<|assistant|>\n{assistant}<|end|>\n"
    return s + ("<|assistant|>\n" if generation_prompt else "")


def _reference(row: dict) -> str | None:
    ref = row.get("reference")
    if isinstance(ref, list) and ref:
        first = ref[0]
        if isinstance(first, list):          # rag: a list of answer strings
            return "; ".join(str(x) for x in first if str(x).strip()) or None
        return str(first) if str(first).strip() else None
    return ref if isinstance(ref, str) and ref.strip() else None


def spec_bench_docs(rows: list[dict]) -> list[Doc]:
    """One chat doc per turn: the first turn with the row's reference answer when it has one; turns
    without an answer stop before `<|assistant|>`, so `<|assistant|>` is always followed by an answer."""
    docs = []
    for r in rows:
        turns = [t for t in r.get("turns", []) if isinstance(t, str) and t.strip()]
        for i, t in enumerate(turns):
            ref = _reference(r) if i == 0 else None
            docs.append(Doc("spec_bench", chat_text(t, ref, generation_prompt=False)))
    return docs


# ---------------------------------------------------------------- text shipped with Python / Debian

def pydoc_topic_docs(max_chars: int | None = None) -> list[Doc]:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return []
    return _capped([Doc("pydoc_topics", topics[k].strip()) for k in sorted(topics)], max_chars)


def stdlib_docstring_docs(max_chars: int | None = None, min_len: int = 60) -> list[Doc]:
    """Docstrings of the running interpreter's stdlib, parsed (never imported), in sorted file order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs, total = [], 0
    if not root.is_dir():
        return docs
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).parts
        if any(part in _SKIP_DIRS or part.startswith("config-") for part in rel):
            continue
        try:
            tree = ast.parse(p.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        for n in nodes:
            d = ast.get_docstring(n)
            if d and len(d) >= min_len:
                docs.append(Doc("stdlib_docstrings", d.strip()))
                total += len(d)
        if max_chars is not None and total >= max_chars:
            break
    return _capped(docs, max_chars)


def debian_docs(max_chars: int | None = None, roots: tuple[str, ...] = ("/usr/share/common-licenses", "/usr/share/doc")) -> list[Doc]:
    """License texts and package READMEs, deduplicated by content, in sorted path order."""
    files: list[Path] = []
    lic, doc = Path(roots[0]), Path(roots[1]) if len(roots) > 1 else None
    if lic.is_dir():
        files += sorted(p for p in lic.iterdir() if p.is_file() and not p.is_symlink())
    if doc is not None and doc.is_dir():
        files += sorted(p for p in doc.glob("*/README*") if p.is_file() and not p.is_symlink()
                        and p.suffix in ("", ".gz", ".md", ".txt", ".Debian", ".rst"))
    seen, docs = set(), []
    for p in files:
        try:
            raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
            text = raw.decode("utf-8").strip()
        except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
            continue
        h = hashlib.sha1(text.encode()).hexdigest()
        if len(text) < 200 or h in seen:
            continue
        seen.add(h)
        docs.append(Doc("debian_docs", text[:20000]))
    return _capped(docs, max_chars)


def _capped(docs: list[Doc], max_chars: int | None) -> list[Doc]:
    if max_chars is None:
        return docs
    out, total = [], 0
    for d in docs:
        if total >= max_chars:
            break
        out.append(d)
        total += len(d.text)
    return out


def build_corpus(max_offline_chars: int | None = None, sources: tuple[str, ...] = SOURCES,
                 path: Path = SPEC_BENCH) -> Corpus:
    """The training corpus: Spec-Bench training rows plus offline text, each offline source capped at
    `max_offline_chars` characters (None: everything found)."""
    unknown = set(sources) - set(SOURCES)
    if unknown:
        raise ValueError(f"unknown corpus sources {sorted(unknown)}; use some of {SOURCES}")
    train, _ = split_rows(path)
    makers = {"spec_bench": lambda: spec_bench_docs(train), "pydoc_topics": lambda: pydoc_topic_docs(max_offline_chars),
              "stdlib_docstrings": lambda: stdlib_docstring_docs(max_offline_chars),
              "debian_docs": lambda: debian_docs(max_offline_chars)}
    docs: list[Doc] = []
    chars = {}
    for s in sources:
        part = makers[s]()
        chars[s] = sum(len(d.text) for d in part)
        docs += part
    return Corpus(docs=docs, heldout_ids=heldout_ids(path), chars=chars)


def heldout_texts(path: Path = SPEC_BENCH) -> list[str]:
    """Every turn of every held-out row (for leak checks)."""
    _, held = split_rows(path)
    return [t for r in held for t in r.get("turns", []) if isinstance(t, str)]
