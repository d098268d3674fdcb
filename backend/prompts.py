"""Prompt files: Spec-Bench style JSONL (`turns` or `prompt`/`text` fields) or plain text (one prompt a line)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from backend.errors import SpecLensError


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str


def load_prompts(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """Read prompts; JSONL rows take the first user turn (Spec-Bench `turns[0]`)."""
    p = Path(path)
    if not p.exists():
        raise SpecLensError(f"{p}: prompt file not found; pass an existing --prompts file")
    try:
        raw = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecLensError(f"{p}: cannot read prompt file ({e}); save it as UTF-8 text or JSONL") from e
    out: list[Prompt] = []
    if p.suffix in (".jsonl", ".json"):
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SpecLensError(f"{p}:{n}: malformed JSONL line ({e.msg}); fix or delete that line") from e
            if not isinstance(row, dict):
                raise SpecLensError(f"{p}:{n}: expected a JSON object per line; fix that line")
            text = _text_of(row)
            if not text:
                raise SpecLensError(f"{p}:{n}: no prompt text (need 'turns', 'prompt' or 'text'); fix that line")
            out.append(Prompt(str(row.get("question_id", row.get("id", n))), str(row.get("category", "")), text))
    else:
        out = [Prompt(str(i), "", line.strip()) for i, line in enumerate(raw.splitlines(), 1) if line.strip()]
    if not out:
        raise SpecLensError(f"{p}: no prompts in file; add one prompt per line (text) or per JSON object (JSONL)")
    return out[:limit] if limit else out


def _text_of(row: dict) -> str:
    turns = row.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        return turns[0]
    for key in ("prompt", "text", "question"):
        if isinstance(row.get(key), str):
            return row[key]
    return ""


def encode_all(tokenizer, prompts: list[Prompt], source: str | Path, use_chat_template: bool = True,
               max_tokens: int | None = None) -> list[list[int]]:
    """Token ids of every prompt (see `encode`); a prompt that encodes to nothing is a one-line error naming
    `source`, the prompts file."""
    seqs = [encode(tokenizer, p.text, use_chat_template, max_tokens) for p in prompts]
    for p, ids in zip(prompts, seqs):
        if not ids:
            raise SpecLensError(f"{source}: prompt {p.id} encodes to zero tokens; remove or fix it")
    return seqs


def encode(tokenizer, text: str, use_chat_template: bool = True, max_tokens: int | None = None) -> list[int]:
    """Token ids of one prompt, through the tokenizer's chat template when it has one."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
    else:
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    ids = list(ids)
    return ids[:max_tokens] if max_tokens else ids
