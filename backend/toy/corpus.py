"""The toy pair's training text: Spec-Bench prompts (minus a fixed held-out set) plus text shipped offline.

Sources, in this order (each is skipped quietly when absent on a machine):

| source              | what                                                                        |
|---------------------|-----------------------------------------------------------------------------|
| `spec_bench`        | training Spec-Bench turns as chat; the answer quotes the turn's opening      |
| `echo`              | offline documents as chat the same way (user: the document, answer: its lead) |
| `spec_bench_refs`   | the training rows' reference answers, as plain text                          |
| `pydoc_topics`      | `pydoc_data.topics`: the Python language reference, shipped with Python       |
| `stdlib_docstrings` | module/class/function docstrings of the stdlib, read with `ast` (no imports)  |
| `debian_docs`       | `/usr/share/common-licenses/*` and `/usr/share/doc/*/README*`                |
| `stdlib_source`     | the stdlib's own source code, in chunks cut at blank lines (opt-in: big)      |

Why quoting answers: a small model's free answers to unseen prompts are high-entropy, so no drafter
can predict them (measured: tau 1.3-1.4 at K=4 on held-out prompts with reference-style answers). An
assistant that answers with the lead of what it was given (the "lead-k" baseline of summarisation)
writes real, fluent text that is predictable from the prompt, as real LLMs' outputs are on Spec-Bench's
summarisation and RAG rows; copying is an algorithm the target learns once and applies to unseen
prompts. Chat documents end with `<|eos|>`, so greedy generation stops after the answer.

The held-out split is fixed: within each Spec-Bench category, ordered by `question_id`, every 4th row
(positions 3, 7, 11, ...) is held out and never used for training (tokenizer, target or drafter).
Everything is deterministic for a given Python/Debian installation; `Corpus.sha256` identifies the text.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import re
import sysconfig
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from backend.config import REPO_ROOT

SPEC_BENCH = REPO_ROOT / "datasets" / "spec_bench" / "question.jsonl"
HOLDOUT_EVERY = 4
SOURCES = ("spec_bench", "pydoc_topics", "stdlib_docstrings", "debian_docs")   # the default corpus
EXTRA_SOURCES = ("stdlib_source",)        # opt-in (--sources): several times the default corpus
CHAT_SOURCES = ("spec_bench", "echo")     # documents in chat form (training windows start at their start)
EOS = "<|eos|>"
ANSWER_WORDS = 100
_SKIP_DIRS = {"test", "tests", "site-packages", "dist-packages", "idlelib", "lib2to3", "turtledemo", "__pycache__",
              "ensurepip", "config-3", "tkinter"}


@dataclass(frozen=True)
class Doc:
    source: str
    text: str

    @property
    def chat(self) -> bool:
        return self.source in CHAT_SOURCES


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


_INSTRUCTION = re.compile(r"^\s*[A-Z][A-Za-z ]{0,40}:\s+")   # "Summarize: ", "Translate German to English: "


def quote_answer(text: str, max_words: int = ANSWER_WORDS) -> str:
    """The assistant's answer: the opening of `text` (after a short "Instruction:" prefix), verbatim,
    up to `max_words` words, cut at the last sentence end when there is one past a third of it."""
    body = _INSTRUCTION.sub("", text, count=1).strip()
    words = list(re.finditer(r"\S+", body))
    if len(words) <= max_words:
        return body
    cut = body[: words[max_words - 1].end()]
    end = max(cut.rfind(". "), cut.rfind("? "), cut.rfind("! "), cut.rfind(".\n"))
    return cut[: end + 1] if end > len(cut) // 3 else cut


def chat_doc(source: str, user: str) -> Doc:
    return Doc(source, chat_text(user, quote_answer(user)) + EOS)


def spec_bench_docs(rows: list[dict]) -> list[Doc]:
    """One chat doc per turn of each row (answer: `quote_answer`)."""
    return [chat_doc("spec_bench", t) for r in rows for t in r.get("turns", []) if isinstance(t, str) and t.strip()]


def reference_docs(rows: list[dict]) -> list[Doc]:
    """The rows' reference answers as plain text (real text; never in chat form)."""
    return [Doc("spec_bench_refs", ref) for r in rows if (ref := _reference(r))]


def echo_docs(docs: list[Doc], n: int, max_chars: int = 1200) -> list[Doc]:
    """`n` offline documents (evenly spaced) as chat: the user sends the document, the answer quotes its lead."""
    plain = [d for d in docs if not d.chat and d.source != "spec_bench_refs"]
    if not plain or n <= 0:
        return []
    step = max(1, len(plain) // n)
    return [chat_doc("echo", d.text[:max_chars]) for d in plain[::step][:n]]


# ---------------------------------------------------------------- text shipped with Python / Debian

def pydoc_topic_docs(max_chars: int | None = None) -> list[Doc]:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return []
    return _capped([Doc("pydoc_topics", topics[k].strip()) for k in sorted(topics)], max_chars)


def _stdlib_files() -> list[Path]:
    """The running interpreter's stdlib .py files in sorted order, without tests, site-packages and the like."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        return []
    return [p for p in sorted(root.rglob("*.py"))
            if not any(part in _SKIP_DIRS or part.startswith("config-") for part in p.relative_to(root).parts)]


def stdlib_docstring_docs(max_chars: int | None = None, min_len: int = 60) -> list[Doc]:
    """Docstrings of the running interpreter's stdlib, parsed (never imported), in sorted file order."""
    docs, total = [], 0
    for p in _stdlib_files():
        try:
            tree = ast.parse(p.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        nodes = [tree] + [n for n in ast.walk(tree)
                          if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        for n in nodes:
            d = ast.get_docstring(n)
            if d and len(d) >= min_len:
                docs.append(Doc("stdlib_docstrings", d.strip()))
                total += len(d)
        if max_chars is not None and total >= max_chars:
            break
    return _capped(docs, max_chars)


def stdlib_source_docs(max_chars: int | None = None, chunk_chars: int = 2400) -> list[Doc]:
    """The stdlib's source files (sorted, same skips as the docstrings), cut at blank lines into chunks
    of about `chunk_chars` characters: plenty of text with long-range repeats (names, signatures)."""
    docs, total = [], 0
    for p in _stdlib_files():
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        chunk: list[str] = []
        size = 0
        for block in re.split(r"\n\s*\n", text):
            chunk.append(block)
            size += len(block) + 2
            if size >= chunk_chars:
                docs.append(Doc("stdlib_source", "\n\n".join(chunk).strip()))
                total += size
                chunk, size = [], 0
        if chunk and size >= 200:
            docs.append(Doc("stdlib_source", "\n\n".join(chunk).strip()))
            total += size
        if max_chars is not None and total >= max_chars:
            break
    return _capped(docs, max_chars)


def debian_docs(max_chars: int | None = None,
                roots: tuple[str, ...] = ("/usr/share/common-licenses", "/usr/share/doc")) -> list[Doc]:
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
                 path: Path = SPEC_BENCH, echo: int = 2000) -> Corpus:
    """The training corpus: chat documents first (Spec-Bench training turns, then `echo` offline
    documents as chat), then plain text (references, offline sources, each capped at
    `max_offline_chars` characters; None: everything found)."""
    unknown = set(sources) - set(SOURCES) - set(EXTRA_SOURCES)
    if unknown:
        raise ValueError(f"unknown corpus sources {sorted(unknown)}; use some of {SOURCES + EXTRA_SOURCES}")
    train, _ = split_rows(path)
    makers = {"pydoc_topics": lambda: pydoc_topic_docs(max_offline_chars),
              "stdlib_docstrings": lambda: stdlib_docstring_docs(max_offline_chars),
              "debian_docs": lambda: debian_docs(max_offline_chars),
              "stdlib_source": lambda: stdlib_source_docs(max_offline_chars)}
    plain: list[Doc] = reference_docs(train) if "spec_bench" in sources else []
    for s in sources:
        if s in makers:
            plain += makers[s]()
    chat = (spec_bench_docs(train) if "spec_bench" in sources else []) + echo_docs(plain, echo)
    docs = chat + plain
    chars: dict[str, int] = defaultdict(int)
    for d in docs:
        chars[d.source] += len(d.text)
    return Corpus(docs=docs, heldout_ids=heldout_ids(path), chars=dict(chars))


def heldout_texts(path: Path = SPEC_BENCH) -> list[str]:
    """Every turn of every held-out row (for leak checks)."""
    _, held = split_rows(path)
    return [t for r in held for t in r.get("turns", []) if isinstance(t, str)]
