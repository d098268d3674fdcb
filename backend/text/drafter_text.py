"""Where an engine release reads a drafter kind's ids, in words (the lint table's "reads" column, backend/drafter/
kinds.py's kind rows): the drafter check's report (backend/check_drafter.py) fills each reading's `reads` with it."""

from __future__ import annotations

from backend.drafter.kinds import kind_row


def reads_words(engine: str, version: str, kind: str, runner: str | None) -> str | None:
    """Where this release reads a kind's ids, in words (the lint table's "reads" column); None: the EAGLE-3 words."""
    row = kind_row(engine, version, kind)
    if row is None or not row["served"]:
        return "not served" if row is not None else None
    ids_from = row.get("ids_from")
    if kind == "mtp":
        return "no ids (fed the target's last hidden state)"
    if not isinstance(ids_from, dict):
        return None
    blocks = ids_from.get(runner or "v1") if engine == "vllm" else ids_from.get("any")
    names = [(r["key"] if r["in"] == "top" else f"{r['in']}.{r['key']}") + (" +1" if r["add"] else "")
             for b in blocks or [] for r in b if not r.get("when") and "dspark" not in r["key"]]
    return ", then ".join(names) or None
