"""`python -m backend runs` in text mode: one line per run with its headline figures in words (a drafter bench's tau
and speedup with its interval, plain decoding's tokens/s, a capture's boundaries and tokens, a check's best
candidate) and its findings (backend/findings.py)."""

from __future__ import annotations

import pandas as pd


def headline_text(row: dict) -> str:
    """One run's headline in words, for `python -m backend runs` (a catalog.runs_overview row): a drafter bench's
    tau and speedup with its 95% CI (no verdict when its speed figures are noise), plain decoding's tokens/s, a
    capture's boundaries and tokens, a check's best candidate (or "lint only")."""
    def ok(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v

    kind = row.get("kind")
    if row.get("status") != "complete":
        done, total = row.get("progress_done"), row.get("progress_total")
        return f"{int(done)}/{int(total)} done" if ok(done) and ok(total) else "-"
    if kind == "bench":
        if not ok(row.get("num_spec_tokens")) or not row["num_spec_tokens"]:
            tps = row.get("tokens_per_s")
            return f"plain decoding, {tps:.1f} tokens/s" if ok(tps) else "plain decoding"
        out = f"tau {row['tau']:.2f}" if ok(row.get("tau")) else "tau -"
        if ok(row.get("speedup")):
            out += f", speedup {row['speedup']:.2f}x"
            if ok(row.get("speedup_ci_low")) and ok(row.get("speedup_ci_high")):
                out += f" [{row['speedup_ci_low']:.2f}, {row['speedup_ci_high']:.2f}]"
            if isinstance(row.get("speed_noise"), str) and row["speed_noise"]:
                out += " (no verdict: timing noise)"
        return out
    if kind == "capture":
        out = f"{int(row['n_boundaries'])} boundaries" if ok(row.get("n_boundaries")) else ""
        if ok(row.get("tokens")):
            out += f", {int(row['tokens']):,} tokens"
        if ok(row.get("nonfinite_tokens")) and row["nonfinite_tokens"]:
            out += f", {int(row['nonfinite_tokens'])} NaN/inf tokens"
        return out or "-"
    if kind == "check":
        if row.get("engine") == "lint":
            return "lint only (config files)"
        best = row.get("boundaries")
        return f"trained on {best}" if isinstance(best, str) and best else "-"
    return "-"


RUNS_TEXT_COLUMNS = ["run_id", "kind", "status", "engine", "model", "drafter", "figures", "finding"]


def runs_text(df: pd.DataFrame) -> str:
    """`python -m backend runs` in text mode: one line per run, its headline figures (headline_text) and findings."""
    rows = df.to_dict("records")
    table = pd.DataFrame({
        "run_id": [r["run_id"] for r in rows], "kind": [r.get("kind") or "-" for r in rows],
        "status": [r.get("status") or "-" for r in rows],
        "engine": [" ".join(str(x) for x in (r.get("engine"), r.get("engine_version")) if isinstance(x, str) and x)
                   or "-" for r in rows],
        "model": [r["model"] if isinstance(r.get("model"), str) else "-" for r in rows],
        "drafter": [r["drafter"] if isinstance(r.get("drafter"), str) else "-" for r in rows],
        "figures": [headline_text(r) for r in rows],
        "finding": [r["finding"] if isinstance(r.get("finding"), str) and r["finding"] else "" for r in rows],
    }, columns=RUNS_TEXT_COLUMNS).rename(columns={"model": "target"})
    if not (table["finding"] != "").any():
        table = table.drop(columns="finding")
    cells = [list(table.columns)] + [[str(v) for v in r] for r in table.itertuples(index=False)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(table.columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)
