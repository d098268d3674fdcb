"""The DuckDB catalog: an index over run directories, rebuilt from them at any time. All SQL lives here.

Writers never open the catalog file in place: `refresh` builds a new file under a temporary name and
renames it over the old one (under a file lock), so a reader's read-only connection never meets a
writer's lock (DuckDB 2.0 refuses readers while another process writes) and always sees a whole catalog.
Tables and columns: docs/SCHEMA.md.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import duckdb
import pandas as pd

from backend.config import paths
from backend.store.rundir import list_run_dirs

RUN_COLUMNS = ["run_id", "kind", "engine", "status", "model", "model_type", "n_layers", "hidden_size", "dtype",
               "dataset", "boundaries", "n_boundaries", "tokens", "sample_tokens", "prompts", "nonfinite_tokens",
               "progress_done", "progress_total", "created", "updated", "error", "tags", "notes", "path",
               "manifest"]


def _run_row(rd) -> dict | None:
    try:
        m = rd.manifest()
    except Exception:
        return None
    head = m.get("headline") or {}
    model = m.get("model") or {}
    prog = m.get("progress") or {}
    nonfinite = head.get("nonfinite") or {}
    return {
        "run_id": rd.run_id, "kind": m.get("kind"), "engine": m.get("engine"), "status": rd.effective_status(m),
        "model": (Path(model["path"]).name if model.get("path") else model.get("name")
                  or (f"import:{Path((m.get('source') or {}).get('path', '')).name}" if m.get("source") else None)),
        "model_type": model.get("model_type"), "n_layers": model.get("n_layers"),
        "hidden_size": model.get("hidden_size"), "dtype": m.get("dtype"), "dataset": m.get("dataset"),
        "boundaries": ",".join(m.get("boundaries") or []), "n_boundaries": len(m.get("boundaries") or []),
        "tokens": head.get("tokens"), "sample_tokens": head.get("sample_tokens"), "prompts": head.get("prompts"),
        # tokens holding NaN/inf at the worst boundary (each token passes every boundary)
        "nonfinite_tokens": int(max(nonfinite.values(), default=0)) if isinstance(nonfinite, dict) else None,
        "progress_done": prog.get("done"), "progress_total": prog.get("total"),
        "created": m.get("created"), "updated": m.get("updated"), "error": m.get("error"),
        "tags": ",".join(m.get("tags") or []), "notes": m.get("notes") or "", "path": str(rd.path),
        "manifest": json.dumps(m, sort_keys=True, default=str),
    }


@contextmanager
def _lock(root: Path | None) -> Iterator[None]:
    p = paths(root)
    p.root.mkdir(parents=True, exist_ok=True)
    with open(p.root / ".catalog.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def refresh(root: Path | None = None) -> Path:
    """Rebuild the catalog from the run directories and swap it into place atomically."""
    p = paths(root)
    with _lock(root):
        rows, stats = [], []
        for rd in list_run_dirs(root):
            row = _run_row(rd)
            if row is None:
                continue
            rows.append(row)
            sp = rd.file("stats.parquet")
            if row["status"] == "complete" and sp.exists():
                try:
                    df = pd.read_parquet(sp)
                    df["run_id"] = rd.run_id
                    stats.append(df)
                except Exception:
                    continue
        runs_df = pd.DataFrame(rows, columns=RUN_COLUMNS)
        stats_df = pd.concat(stats, ignore_index=True) if stats else None
        tmp = p.catalog.with_name(f".{p.catalog.name}.tmp-{os.getpid()}")
        for f in (tmp, Path(str(tmp) + ".wal")):
            if f.exists():
                f.unlink()
        con = duckdb.connect(str(tmp))
        try:
            con.register("runs_df", runs_df)
            con.execute("CREATE TABLE runs AS SELECT * FROM runs_df")
            if stats_df is not None:
                con.register("stats_df", stats_df)
                con.execute("CREATE TABLE boundary_stats AS SELECT * FROM stats_df")
            else:
                con.execute("""CREATE TABLE boundary_stats (run_id VARCHAR, boundary VARCHAR, ord INTEGER,
                    n_tokens BIGINT, nonfinite_tokens BIGINT, mean_norm DOUBLE, std_norm DOUBLE, norm_min DOUBLE,
                    norm_p01 DOUBLE, norm_p50 DOUBLE, norm_p99 DOUBLE, norm_max DOUBLE, rms DOUBLE,
                    mean_abs_mean DOUBLE, max_abs DOUBLE, kurtosis DOUBLE, max_dim_kurtosis DOUBLE,
                    outlier_ratio DOUBLE, top_dims BIGINT[], top_dims_max_abs DOUBLE[])""")
            _ingest_bench(con, rows)
            con.execute("CHECKPOINT")
        finally:
            con.close()
        os.replace(tmp, p.catalog)
    return p.catalog


@contextmanager
def _read(root: Path | None) -> Iterator[duckdb.DuckDBPyConnection]:
    p = paths(root)
    if not p.catalog.exists():
        refresh(root)
    con = duckdb.connect(str(p.catalog), read_only=True)
    try:
        yield con
    finally:
        con.close()


def _df(sql: str, params: list | None = None, root: Path | None = None) -> pd.DataFrame:
    with _read(root) as con:
        return con.execute(sql, params or []).df()


# ---------------------------------------------------------------------- named queries (pages call these)

def list_runs(kind: str | None = None, status: str | None = None, root: Path | None = None) -> pd.DataFrame:
    """Runs, newest first, optionally filtered by kind and status (bound parameters, never string SQL)."""
    return _df("""SELECT * EXCLUDE (manifest) FROM runs
                  WHERE (? IS NULL OR kind = ?) AND (? IS NULL OR status = ?)
                  ORDER BY created DESC, run_id""", [kind, kind, status, status], root)


def run_ids(kind: str | None = None, status: str | None = "complete", root: Path | None = None) -> list[str]:
    return list_runs(kind, status, root)["run_id"].tolist()


def get_run(run_id: str, root: Path | None = None) -> dict | None:
    df = _df("SELECT * FROM runs WHERE run_id = ?", [run_id], root)
    if df.empty:
        return None
    row = df.iloc[0].to_dict()
    row["manifest"] = json.loads(row["manifest"]) if row.get("manifest") else {}
    return row


def boundary_stats(run_ids: list[str], root: Path | None = None) -> pd.DataFrame:
    """Per-boundary statistics of the given runs, in stream order."""
    if not run_ids:
        return pd.DataFrame()
    return _df("""SELECT * FROM boundary_stats WHERE list_contains(?, run_id) ORDER BY run_id, ord""",
               [list(run_ids)], root)


# ---------------------------------------------------------------------- bench runs (kind "bench")
# Tables: bench_runs (one row per bench run, figures from its manifest), bench_prompts (prompts.parquet of
# complete bench runs) and bench_steps (steps.parquet). Written by backend/bench.py; see docs/SCHEMA.md.

BENCH_RUN_COLUMNS = {
    "run_id": "VARCHAR", "status": "VARCHAR", "model": "VARCHAR", "drafter": "VARCHAR", "dataset": "VARCHAR",
    "baseline_run": "VARCHAR", "num_spec_tokens": "BIGINT", "temperature": "DOUBLE", "repeats": "BIGINT",
    "tau": "DOUBLE", "acceptance_rate": "DOUBLE", "tokens_per_s": "DOUBLE", "ttft": "DOUBLE", "tpot": "DOUBLE",
    "speedup": "DOUBLE", "speedup_std": "DOUBLE", "speedup_ci_low": "DOUBLE", "speedup_ci_high": "DOUBLE",
    "lossless": "BOOLEAN", "mismatched_prompts": "BIGINT", "created": "VARCHAR",
}
BENCH_PROMPT_COLUMNS = {
    "run_id": "VARCHAR", "repeat": "BIGINT", "prompt_index": "BIGINT", "prompt_id": "VARCHAR",
    "category": "VARCHAR", "prompt_tokens": "BIGINT", "output_tokens": "BIGINT", "seconds": "DOUBLE",
    "tokens_per_s": "DOUBLE", "ttft": "DOUBLE", "tpot": "DOUBLE", "accepted": "BIGINT", "drafts": "BIGINT",
    "output_hash": "VARCHAR",
}
BENCH_STEP_COLUMNS = {"run_id": "VARCHAR", "repeat": "BIGINT", "prompt_id": "VARCHAR", "step": "BIGINT",
                      "accepted": "BIGINT"}


def _bench_run_row(row: dict) -> dict:
    m = json.loads(row["manifest"])
    b, sp, d = m.get("bench") or {}, (m.get("bench") or {}).get("speedup") or {}, m.get("drafter") or {}
    return {"run_id": row["run_id"], "status": row["status"], "model": row["model"],
            "drafter": Path(d["path"]).name if d.get("path") else None, "dataset": m.get("dataset"),
            "baseline_run": m.get("baseline_run"), "num_spec_tokens": m.get("num_spec_tokens"),
            "temperature": m.get("temperature"), "repeats": m.get("repeats"), "tau": b.get("tau"),
            "acceptance_rate": b.get("acceptance_rate"), "tokens_per_s": b.get("tokens_per_s"),
            "ttft": b.get("ttft"), "tpot": b.get("tpot"), "speedup": sp.get("mean"), "speedup_std": sp.get("std"),
            "speedup_ci_low": sp.get("ci_low"), "speedup_ci_high": sp.get("ci_high"), "lossless": b.get("lossless"),
            "mismatched_prompts": b.get("mismatched_prompts"), "created": m.get("created")}


def _bench_table(con: duckdb.DuckDBPyConnection, name: str, frames: list[pd.DataFrame], columns: dict) -> None:
    """CREATE TABLE name with exactly `columns` (typed), from the frames (or empty)."""
    con.execute(f"CREATE TABLE {name} ({', '.join(f'{c} {t}' for c, t in columns.items())})")
    if frames:
        df = pd.concat(frames, ignore_index=True)
        for c in columns:
            if c not in df.columns:
                df[c] = None
        con.register(f"{name}_df", df[list(columns)])
        con.execute(f"INSERT INTO {name} SELECT * FROM {name}_df")
        con.unregister(f"{name}_df")


def _ingest_bench(con: duckdb.DuckDBPyConnection, rows: list[dict]) -> None:
    """Called by `refresh`: bench run figures (every bench run) and the per-prompt/per-step tables of the
    complete ones. A run whose Parquet cannot be read is listed in bench_runs but contributes no rows."""
    runs, prompts, steps = [], [], []
    for row in rows:
        if row.get("kind") != "bench":
            continue
        runs.append(pd.DataFrame([_bench_run_row(row)]))
        if row["status"] != "complete":
            continue
        try:
            p = pd.read_parquet(Path(row["path"]) / "prompts.parquet")
            st = pd.read_parquet(Path(row["path"]) / "steps.parquet")
        except Exception:
            continue
        p["run_id"], st["run_id"] = row["run_id"], row["run_id"]
        prompts.append(p)
        steps.append(st)
    _bench_table(con, "bench_runs", runs, BENCH_RUN_COLUMNS)
    _bench_table(con, "bench_prompts", prompts, BENCH_PROMPT_COLUMNS)
    _bench_table(con, "bench_steps", steps, BENCH_STEP_COLUMNS)


def bench_runs(status: str | None = None, root: Path | None = None) -> pd.DataFrame:
    """Bench runs with their headline figures (tau, acceptance, tokens/s, speedup and CI, lossless), newest first."""
    return _df("""SELECT * FROM bench_runs WHERE (? IS NULL OR status = ?) ORDER BY created DESC, run_id""",
               [status, status], root)


def bench_prompts(run_ids: list[str], root: Path | None = None) -> pd.DataFrame:
    """Per repeat x prompt rows of the given bench runs (tokens/s, TTFT, TPOT, accepted, drafts, output hash)."""
    if not run_ids:
        return pd.DataFrame(columns=list(BENCH_PROMPT_COLUMNS))
    return _df("""SELECT * FROM bench_prompts WHERE list_contains(?, run_id)
                  ORDER BY run_id, repeat, prompt_index""", [list(run_ids)], root)


def bench_steps(run_ids: list[str], root: Path | None = None) -> pd.DataFrame:
    """Accepted length of every verify step of the given bench runs."""
    if not run_ids:
        return pd.DataFrame(columns=list(BENCH_STEP_COLUMNS))
    return _df("""SELECT * FROM bench_steps WHERE list_contains(?, run_id)
                  ORDER BY run_id, repeat, prompt_id, step""", [list(run_ids)], root)


def bench_histogram(run_ids: list[str], root: Path | None = None) -> pd.DataFrame:
    """Verify steps per accepted length: run_id, accepted, steps, share (of the run's steps)."""
    if not run_ids:
        return pd.DataFrame(columns=["run_id", "accepted", "steps", "share"])
    return _df("""SELECT run_id, accepted, count(*) AS steps,
                         count(*) / sum(count(*)) OVER (PARTITION BY run_id) AS share
                  FROM bench_steps WHERE list_contains(?, run_id)
                  GROUP BY run_id, accepted ORDER BY run_id, accepted""", [list(run_ids)], root)


def bench_categories(run_ids: list[str], root: Path | None = None) -> pd.DataFrame:
    """Per run and prompt category: prompts, mean tokens/s, mean TTFT/TPOT and tau = 1 + accepted / drafts
    (1.0 for plain decoding; the definition of backend/metrics.py)."""
    if not run_ids:
        return pd.DataFrame(columns=["run_id", "category", "prompts", "tokens_per_s", "ttft", "tpot", "tau"])
    return _df("""SELECT run_id, category, count(DISTINCT prompt_id) AS prompts, avg(tokens_per_s) AS tokens_per_s,
                         avg(ttft) AS ttft, avg(tpot) AS tpot,
                         CASE WHEN sum(drafts) > 0 THEN 1 + sum(accepted) / sum(drafts) ELSE 1.0 END AS tau
                  FROM bench_prompts WHERE list_contains(?, run_id)
                  GROUP BY run_id, category ORDER BY run_id, category""", [list(run_ids)], root)
