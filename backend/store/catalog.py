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
        "model": Path(model.get("path", "")).name if model.get("path") else model.get("name"),
        "model_type": model.get("model_type"), "n_layers": model.get("n_layers"),
        "hidden_size": model.get("hidden_size"), "dtype": m.get("dtype"), "dataset": m.get("dataset"),
        "boundaries": ",".join(m.get("boundaries") or []), "n_boundaries": len(m.get("boundaries") or []),
        "tokens": head.get("tokens"), "sample_tokens": head.get("sample_tokens"), "prompts": head.get("prompts"),
        "nonfinite_tokens": int(sum(nonfinite.values())) if isinstance(nonfinite, dict) else None,
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
