"""Where an engine release reads a drafter kind's ids, in words (the lint table's "reads" column: an EAGLE-3
reading's `ids_rule`, backend/drafter/lint.py; another kind's rows of backend/drafter/kinds.py): the drafter check's
report (backend/check_drafter.py) fills each reading's `reads` with it."""

from __future__ import annotations

from backend.drafter.kinds import kind_row

# where an EAGLE-3 reading takes its ids from (backend/drafter/lint.py `Reading.ids_rule`, conventions.yaml ids_from)
EAGLE3_READS = {"top_level": "top-level ids only", "top_then_nested": "top-level ids, then eagle_config",
                "nested": "eagle_config ids only"}


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


def reading_words(engine: str, version: str, kind: str, runner: str | None, ids_rule: str) -> str:
    """The lint table's "reads" column for one engine reading: the kind's own words, else the EAGLE-3 ones."""
    return ((reads_words(engine, version, kind, runner) if kind != "eagle3" else None)
            or EAGLE3_READS.get(ids_rule, ids_rule))
