"""What a reader must know before trusting a bench run's figures, as data: the drafter check's finding that the engine
fed other boundaries than the drafter was trained on (backend/compare.py `drafter_mismatches`, the one place that
decides it; Compare shows the same), and the HF engine reproducing a serving engine release's reading. The run page,
the Runs table, `python -m backend runs` and the exports carry them; their words are dashboard/run_view.py's
(`finding_line`) and, for table cells and the command line, the `short` form here."""

from __future__ import annotations

from dataclasses import dataclass

from backend.compare import Mismatch, drafter_mismatches
from backend.runs.manifest import StoredManifest

ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}      # how a serving engine's releases are named
# the manifest keys `findings` reads, and the one a run needs to have any: a finding is about what the engine fed
# (`aux`). Pages over many runs pass only these (catalog.read.run_manifest_keys(ids, MANIFEST_KEYS, NEEDS)).
MANIFEST_KEYS = ("kind", "engine", "drafter", "model", "aux")
NEEDS = "aux"


@dataclass
class Finding:
    """One problem of one bench run. `kind`: "mismatch" (its figures are not what the drafter can do: severity
    error; `mismatch` holds the fed and trained boundaries) or "hf_reading" (read them knowing HF reproduced
    `release`'s reading: severity note)."""

    severity: str                  # "error" | "note"
    kind: str                      # "mismatch" | "hf_reading"
    short: str                     # a few words for a table cell or a command-line column
    mismatch: Mismatch | None = None
    release: str | None = None     # hf_reading: the serving engine release whose reading HF reproduced


def reproduced_release(manifest: StoredManifest | dict) -> str | None:
    """'SGLang 0.5.15' when a drafter bench ran on the HF engine feeding the drafter what that serving engine release
    reads from its config (`aux.producer`/`version`, backend/conventions.yaml): its acceptance is HF's decoding of
    that feed, not a measurement inside that engine. None otherwise (a bench inside vLLM or SGLang measured the
    engine itself; plain decoding feeds nothing)."""
    m = StoredManifest.indexed(manifest)
    if m.kind != "bench" or m.engine != "hf":
        return None
    aux = m.aux
    if aux is None or aux.producer not in ENGINE_NAMES:
        return None
    return " ".join(str(x) for x in (ENGINE_NAMES[aux.producer], aux.version) if x)


def findings(manifests: dict[str, StoredManifest | dict], checks: dict[str, StoredManifest | dict]
             ) -> dict[str, list[Finding]]:
    """run_id -> its findings (runs without any left out). `manifests`: catalog.run_manifests; `checks`:
    catalog.check_manifests (newest first)."""
    checks = {c: StoredManifest.indexed(m) for c, m in checks.items()}
    checked = {x for c in checks.values() if c.drafter_info is not None
               for x in (c.drafter_info.fingerprint, c.drafter_info.path) if x}
    manifests = {r: StoredManifest.indexed(m) for r, m in manifests.items() if _may_have_finding(m, checked)}
    out: dict[str, list[Finding]] = {r: [] for r in manifests}
    for x in drafter_mismatches(manifests, checks):
        out[x.run].append(Finding("error", "mismatch",
                                  f"wrong feed: {','.join(x.fed)}, trained on {','.join(x.trained)} ({x.check})",
                                  mismatch=x))
    for r, m in manifests.items():
        release = reproduced_release(m)
        if release:
            out[r].append(Finding("note", "hf_reading", f"{release}'s reading on HF", release=release))
    return {r: f for r, f in out.items() if f}


def _may_have_finding(raw: StoredManifest | dict, checked: set[str]) -> bool:
    """Whether a run as the catalog holds it can have a finding, read from the raw keys before the typed manifest is
    built (a page over 10,000 runs types only these): it records what the engine fed, and it is an HF bench reading
    a serving engine's release or its drafter (fingerprint or path) is one a drafter check looked at (`checked`)."""
    if not isinstance(raw, dict):
        return True
    key = StoredManifest.raw_value
    if key(raw, "engine") == "hf" and key(raw, "aux.producer") in ENGINE_NAMES:
        return True
    return bool(key(raw, "aux.boundaries")) and any(isinstance(v, str) and v in checked for v in
                                                     (key(raw, "drafter.fingerprint"), key(raw, "drafter.path")))


def finding_text(found: list[Finding], severity: str | None = None) -> str:
    """A run's findings in one cell (the Runs table, `runs --json`): the short forms, errors first; only those of
    `severity` when given."""
    return "; ".join(f.short for f in sorted(found, key=lambda f: f.severity != "error")
                     if severity is None or f.severity == severity)
