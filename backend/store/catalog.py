"""The DuckDB catalog: an index over run directories, rebuilt from them at any time. All SQL lives here.

Writers never open a catalog file in place: they write a new file under a temporary name and rename it over
the old one (under a file lock), so a reader's read-only connection never meets a writer's lock (DuckDB 2.0
refuses readers while another process writes) and always sees a whole catalog.

The catalog is a base (speclens.duckdb) and a small delta beside it (speclens.delta.duckdb): the rows of the runs
changed since the base was written, and the list of those runs (`touched`, also the removed ones). A run's state
change (`refresh_runs`, from backend/runs/lifecycle.py) rewrites only the delta: its cost does not grow with the
catalog. Readers see the base's rows of untouched runs plus the delta's rows (views, see `_open`). Each base has a
generation and each delta names its base's; a new base folds the delta in and is followed by an empty delta of
its generation, so a reader that pairs a base with a delta of another generation either ignores the delta (older:
already folded in) or reopens both (newer: the base was replaced after it was opened). A delta holding more than
DELTA_MAX_RUNS runs is folded into a new base.

`refresh` (a scan of every run directory) is incremental: every run directory has a signature (size and mtime of
its manifest and of its annotations file); runs whose signature and status are unchanged are kept, the others
are re-read into a new base that then replaces the old one. When nothing changed it writes nothing (a page can rescan on
every render, also with 10,000 runs); `refresh(full=True)` (`python -m backend db rebuild`) rebuilds from
scratch. Parquet tables are read by DuckDB itself, many files per statement.
Tables and columns: docs/SCHEMA.md.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import duckdb

from backend.config import Paths
from backend.errors import SpecLensError
from backend.runs.manifest import Bench, Headline, ModelInfo, Progress, Speedup, StoredManifest
from backend.store import annotations_file, check_result, validate
from backend.store.rundir import RUNNING, RunDir, atomic_write_json, valid_run_id

if TYPE_CHECKING:  # pandas is imported where frames are made: a run's state change and a config check need none
    import pandas as pd

T = TypeVar("T")

SCHEMA_VERSION = "8"          # 8: catalog_meta generation and a delta beside the base
                              # 7: load_levels gpu_processes, gpu_util; 6: load_levels and load_cells (load runs)
                              # 5: bench_prompts pairs and load columns, bench_runs pairing and speed_noise
RUN_TYPES = {
    "run_id": "VARCHAR", "kind": "VARCHAR", "engine": "VARCHAR", "engine_version": "VARCHAR", "status": "VARCHAR",
    "model": "VARCHAR", "model_path": "VARCHAR", "model_key": "VARCHAR", "model_type": "VARCHAR", "n_layers": "BIGINT",
    "hidden_size": "BIGINT", "dtype": "VARCHAR", "dataset": "VARCHAR", "drafter": "VARCHAR",
    "baseline_run": "VARCHAR", "boundaries": "VARCHAR", "n_boundaries": "BIGINT", "tokens": "BIGINT",
    "sample_tokens": "BIGINT", "prompts": "BIGINT", "nonfinite_tokens": "BIGINT", "progress_done": "BIGINT",
    "progress_total": "BIGINT", "created": "VARCHAR", "updated": "VARCHAR", "error": "VARCHAR", "tags": "VARCHAR",
    "notes": "VARCHAR", "pinned": "BOOLEAN", "path": "VARCHAR", "sig": "VARCHAR", "manifest": "VARCHAR",
}
RUN_COLUMNS = list(RUN_TYPES)
STATS_TYPES = {
    "run_id": "VARCHAR", "boundary": "VARCHAR", "ord": "INTEGER", "n_tokens": "BIGINT", "nonfinite_tokens": "BIGINT",
    "mean_norm": "DOUBLE", "std_norm": "DOUBLE", "norm_min": "DOUBLE", "norm_p01": "DOUBLE", "norm_p50": "DOUBLE",
    "norm_p99": "DOUBLE", "norm_max": "DOUBLE", "rms": "DOUBLE", "mean_abs_mean": "DOUBLE", "max_abs": "DOUBLE",
    "kurtosis": "DOUBLE", "max_dim_kurtosis": "DOUBLE", "outlier_ratio": "DOUBLE", "top_dims": "BIGINT[]",
    "top_dims_max_abs": "DOUBLE[]",
}
_FULL_REBUILD_SHARE = 0.25      # more changed runs than this share (and > 64): rebuild instead of patching
DELTA_MAX_RUNS = 512            # a delta holding more runs is folded into a new base


def _int(x) -> int | None:
    try:
        return None if x is None or isinstance(x, bool) else int(x)
    except (TypeError, ValueError):
        return None


def _broken_row(rd: RunDir, sig: str, error: str) -> dict:
    """A run directory whose manifest cannot be read or indexed: listed as quarantined with the reason (and its
    signature, so that a refresh does not re-read it until the file changes)."""
    row = dict.fromkeys(RUN_COLUMNS)
    row.update(run_id=rd.run_id, status=validate.QUARANTINED,
               error=_line(error) or "unreadable manifest",
               tags="", notes="", pinned=False, path=str(rd.path), sig=sig, boundaries="", n_boundaries=0,
               manifest="{}")
    return row


def _line(text) -> str:
    """The first line of a reason, at most 300 characters."""
    return (str(text).splitlines() or [""])[0][:300]


def _run_row(rd: RunDir, sig: str) -> dict:
    try:
        raw = rd.manifest()
        return _manifest_row(rd, sig, StoredManifest.checked(raw), raw)     # validate.check_manifest's check
    except Exception as e:  # noqa: BLE001 - one bad directory must not hide the others
        why = (str(e).replace(f"{rd.manifest_path}: ", "") if isinstance(e, SpecLensError)
               else f"{type(e).__name__}: {e}")
        return _broken_row(rd, sig, f"manifest.json: {why}")


def _manifest_row(rd: RunDir, sig: str, m: StoredManifest, raw: dict) -> dict:
    """The runs row of a checked manifest (`raw`: the file's dict, kept whole in the `manifest` column)."""
    head = m.headline or Headline()
    model = m.model or ModelInfo()
    prog = m.progress or Progress()
    drafter = m.drafter_info
    source = m.source
    ann = annotations_file.read_path(rd.path)
    tags = ann.tags if ann else [t for t in (m.tags or []) if t]
    return {
        "run_id": rd.run_id, "kind": m.kind, "engine": m.engine,
        "engine_version": m.engine_version or (source.version if source is not None else None),
        "status": rd.effective_status(m),
        "model": (Path(model.path).name if model.path else model.name
                  or (f"import:{Path(source.path or '').name}" if source is not None else None)),
        "model_path": model.path, "model_type": model.model_type,
        # the target's identity across machines and paths (backend/model_id.py); its path where not recorded
        "model_key": model.fingerprint or model.path,
        "n_layers": _int(model.n_layers), "hidden_size": _int(model.hidden_size),
        "dtype": m.dtype, "dataset": m.dataset,
        "drafter": Path(drafter.path).name if drafter is not None and drafter.path else None,
        "baseline_run": m.baseline_run,
        "boundaries": ",".join(m.boundaries or []), "n_boundaries": len(m.boundaries or []),
        "tokens": _int(head.tokens), "sample_tokens": _int(head.sample_tokens),
        "prompts": _int(head.prompts),
        # tokens holding NaN/inf at the worst boundary (each token passes every boundary)
        "nonfinite_tokens": _int(max((head.nonfinite or {}).values(), default=0)),
        "progress_done": _int(prog.done), "progress_total": _int(prog.total),
        "created": m.created, "updated": m.updated, "error": m.error,
        "tags": ",".join(tags), "notes": ann.notes if ann else str(m.notes or ""),
        "pinned": bool(ann.pinned) if ann else False, "path": str(rd.path), "sig": sig,
        "manifest": json.dumps(raw, sort_keys=True, default=str),
    }


@contextmanager
def _lock(p: Paths) -> Iterator[None]:
    p.root.mkdir(parents=True, exist_ok=True)
    with open(p.root / ".catalog.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ---------------------------------------------------------------------- scan and plan


@dataclass
class _Entry:
    run_id: str
    dir: str                         # the run directory (a plain string: scanning 10,000 runs stays cheap)
    sig: str

    @property
    def path(self) -> Path:
        return Path(self.dir)


def _scan(p: Paths) -> list[_Entry]:
    """Run directories (those holding a manifest) with their signatures, taken before any file is read: a
    manifest rewritten after this stat makes the next refresh re-read the run."""
    runs = str(p.runs)
    try:
        names = sorted(e.name for e in os.scandir(runs))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out, stat, ann = [], os.stat, "/" + annotations_file.FILE
    for name in names:
        d = runs + "/" + name
        try:
            ms = stat(d + "/manifest.json")
        except OSError:
            continue
        try:
            st = stat(d + ann)
            a = f"{st.st_mtime_ns}:{st.st_size}"
        except OSError:
            a = "-"
        out.append(_Entry(name, d, f"{ms.st_mtime_ns}:{ms.st_size}:{a}"))
    return out


@dataclass
class _Plan:
    entries: list[_Entry]           # every run directory now
    changed: list[_Entry]           # new, modified, or running with a status that changed (process gone)
    removed: list[str]              # in the catalog, no longer on disk

    @property
    def empty(self) -> bool:
        return not self.changed and not self.removed


def _delta_path(catalog: Path) -> Path:
    """The delta beside the base catalog: speclens.delta.duckdb."""
    return catalog.with_name(f"{catalog.stem}.delta{catalog.suffix}")


def _meta(con: duckdb.DuckDBPyConnection, db: str) -> dict[str, str]:
    return dict(con.execute(f"SELECT key, value FROM {db}.catalog_meta").fetchall())


# catalog file -> (which files it was: base and delta stamps, {run_id: (sig, status)} read from them)
_SIGS: dict[str, tuple[tuple[str, str], dict[str, tuple[str, str]]]] = {}


def _indexed_sigs(p: Paths) -> dict[str, tuple[str, str]] | None:
    """{run_id: (signature, status)} as the catalog holds them; None when it must be rebuilt (unreadable, older
    schema). Kept per process for the files they were read from: the base and the delta are only ever replaced
    whole (os.replace, a new inode), so while both stamps are unchanged so are their rows, and a page's rescan then
    opens no DuckDB file at all (15-25 ms on a 10,000-run catalog)."""
    key = _files_key(p)
    hit = _SIGS.get(str(p.catalog))
    if key is not None and hit is not None and hit[0] == key:
        return hit[1]
    try:
        con = _with_retry(lambda: _open(p.catalog))
        try:
            ver = con.execute("SELECT value FROM catalog_meta WHERE key = 'schema_version'").fetchone()
            if not ver or ver[0] != SCHEMA_VERSION:
                return None
            old = {r[0]: (r[1], r[2]) for r in con.execute("SELECT run_id, sig, status FROM runs").fetchall()}
        finally:
            con.close()
    except duckdb.Error:
        return None
    if key is not None and key == _files_key(p):
        _SIGS[str(p.catalog)] = (key, old)         # only when no swap happened while reading
    return old


def _files_key(p: Paths) -> tuple[str, str] | None:
    """Which base and delta files the catalog is now (their stamps); None when a swap got in the way (then nothing is
    kept or reused)."""
    return _catalog_key(p.catalog)


def _catalog_key(catalog: Path) -> tuple[str, str] | None:
    delta = _delta_path(catalog)
    try:
        return _stamp(catalog), (_stamp(delta) if delta.exists() else "-")
    except OSError:
        return None


def _plan(p: Paths) -> _Plan | None:
    """What changed since the catalog (base and delta) was written; None when it must be rebuilt (missing, older
    schema)."""
    if not p.catalog.exists():
        return None
    old = _indexed_sigs(p)
    if old is None:
        return None
    entries = _scan(p)
    changed = [e for e in entries if _stale(e, old.get(e.run_id))]
    on_disk = {e.run_id for e in entries}
    return _Plan(entries, changed, [r for r in old if r not in on_disk])


def _stale(e: _Entry, indexed: tuple[str, str] | None) -> bool:
    """Whether a run directory differs from its catalog row ((signature, status), None when not indexed): new,
    rewritten, or indexed as running with its process gone."""
    if indexed is None or indexed[0] != e.sig:
        return True
    if indexed[1] != RUNNING:
        return False
    try:                                        # is its process still there?
        return RunDir(e.path).effective_status() != RUNNING
    except Exception:  # noqa: BLE001 - unreadable now: re-read (and quarantine) it
        return True


def _changed_of(p: Paths, run_ids: list[str]) -> list[str] | None:
    """Which of these runs, and of the runs indexed as running, the catalog holds otherwise than their directories
    (new, rewritten, removed, or running with its process gone): _plan for these runs only, a few stats each
    whatever the catalog's size. None when the catalog must be rebuilt."""
    if not p.catalog.exists():
        return None
    old = _indexed_sigs(p)
    if old is None:
        return None
    out = []
    running = [r for r, (_, status) in old.items() if status == RUNNING]
    for rid in dict.fromkeys([*run_ids, *running]):
        e, o = _entry(p, rid), old.get(rid)
        if (o is not None) if e is None else _stale(e, o):        # removed, or as _plan finds it
            out.append(rid)
    return out


def _fresh_tmp(path: Path) -> Path:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    for f in (tmp, Path(str(tmp) + ".wal")):
        if f.exists():
            f.unlink()
    return tmp


def _write_empty_delta(catalog: Path, generation: str) -> None:
    """An empty delta tagged with the base's generation, swapped in (never deleted: a reader holding the old base
    then finds a delta newer than its base and reopens both)."""
    delta = _delta_path(catalog)
    tmp = _fresh_tmp(delta)
    con = duckdb.connect(str(tmp))
    try:
        _create_tables(con, {"base_generation": generation, "base_stamp": _stamp(catalog)})
        con.execute("CHECKPOINT")
    finally:
        con.close()
    st = os.stat(catalog)           # an empty delta carries its base's mtime: readers then need not open it
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, delta)


def _refresh(p: Paths, full: bool = False) -> Path:
    """Bring the catalog up to date with the run directories and swap it into place atomically: only the runs
    that changed are re-read (nothing is written when none did); full=True rebuilds it from scratch. A new base
    folds the delta in (and an empty delta replaces it)."""
    if not full:
        plan = _plan(p)                          # lock-free look first: the common case writes nothing
        if plan is not None and plan.empty:
            return p.catalog
    with _lock(p):
        plan = None if full else _plan(p)
        if plan is not None and plan.empty:
            return p.catalog
        if plan is not None and len(plan.changed) + len(plan.removed) > max(64, _FULL_REBUILD_SHARE
                                                                           * len(plan.entries)):
            plan = None                          # cheaper to rebuild than to patch
        _write_base(p, plan)
    _drop_shared(p.catalog)
    return p.catalog


def _write_base(p: Paths, plan: _Plan | None) -> None:
    """Write a new base catalog (under the lock): the old one with its delta folded in and `plan` applied, or
    (plan None) rebuilt from every run directory; then an empty delta for the new generation."""
    tmp = _fresh_tmp(p.catalog)
    generation = str(time.time_ns())
    if plan is not None:
        shutil.copyfile(p.catalog, tmp)
    con = duckdb.connect(str(tmp))
    try:
        if plan is None:
            _create_tables(con, {"generation": generation})
            _ingest(con, _scan(p))
        else:
            delta = _delta_path(p.catalog)
            gen = _meta(con, "main").get("generation")
            if delta.exists():
                con.execute("ATTACH ? AS d (READ_ONLY)", [str(delta)])
                if _meta(con, "d").get("base_generation") == gen:
                    for table in _TABLES:
                        con.execute(f"DELETE FROM {table} WHERE run_id IN (SELECT run_id FROM d.touched)")
                        con.execute(f"INSERT INTO {table} SELECT * FROM d.{table}")
                con.execute("DETACH d")
            gone = [e.run_id for e in plan.changed] + plan.removed
            if gone:
                for table in _TABLES:
                    con.execute(f"DELETE FROM {table} WHERE list_contains(?, run_id)", [gone])
                _ingest(con, plan.changed)
            con.execute("UPDATE catalog_meta SET value = ? WHERE key = 'generation'", [generation])
        con.execute("CHECKPOINT")
    finally:
        con.close()
    os.replace(tmp, p.catalog)
    _write_empty_delta(p.catalog, generation)


def _entry(p: Paths, run_id: str) -> _Entry | None:
    """One run directory with its signature (as _scan takes it), None when it has no manifest."""
    d = str(p.runs / run_id)
    try:
        ms = os.stat(d + "/manifest.json")
    except OSError:
        return None
    try:
        st = os.stat(d + "/" + annotations_file.FILE)
        a = f"{st.st_mtime_ns}:{st.st_size}"
    except OSError:
        a = "-"
    return _Entry(run_id, d, f"{ms.st_mtime_ns}:{ms.st_size}:{a}")


def _stamp(path: Path) -> str:
    """Which file a path is now (inode, mtime, size): a delta records its base's, so a state change need not open
    the base to know the delta still belongs to it."""
    st = os.stat(path)
    return f"{st.st_ino}:{st.st_mtime_ns}:{st.st_size}"


def _base_generation(catalog: Path) -> str | None:
    """The base's generation; None when it cannot be read or has an older schema (then it is rebuilt)."""
    try:
        con = duckdb.connect()
        try:
            con.execute("ATTACH ? AS b (READ_ONLY)", [str(catalog)])
            meta = _meta(con, "b")
        finally:
            con.close()
    except duckdb.Error:
        return None
    return meta.get("generation") if meta.get("schema_version") == SCHEMA_VERSION else None


def _refresh_runs(p: Paths, run_ids: list[str]) -> Path:
    """Re-index these runs only, whatever the catalog's size: their rows are upserted into the small delta
    (copied, patched, swapped in under the lock; the base is neither copied nor opened while the delta records
    its stamp), a run without a directory is dropped. Once the delta holds more than DELTA_MAX_RUNS runs it is
    folded into a new base (one O(catalog) write per DELTA_MAX_RUNS changes). A missing or older-schema catalog
    is rebuilt."""
    delta = _delta_path(p.catalog)
    with _lock(p):
        try:
            stamp = _stamp(p.catalog)
        except OSError:
            _write_base(p, None)
            _drop_shared(p.catalog)
            return p.catalog
        tmp = _fresh_tmp(delta)
        con = None
        if delta.exists():
            shutil.copyfile(delta, tmp)
            con = duckdb.connect(str(tmp))
            try:
                meta = _meta(con, "main")
            except duckdb.Error:
                meta = {}
            if meta.get("base_stamp") != stamp or meta.get("schema_version") != SCHEMA_VERSION:
                con.close()
                tmp.unlink()
                con = None
        if con is None:
            gen = _base_generation(p.catalog)
            if gen is None:
                _write_base(p, None)
                _drop_shared(p.catalog)
                return p.catalog
            con = duckdb.connect(str(tmp))
            _create_tables(con, {"base_generation": gen, "base_stamp": stamp})
        try:
            ids = sorted(set(run_ids))
            for table in [*_TABLES, "touched"]:
                con.execute(f"DELETE FROM {table} WHERE list_contains(?, run_id)", [ids])
            con.executemany("INSERT INTO touched VALUES (?)", [[r] for r in ids])
            _ingest(con, [e for e in (_entry(p, r) for r in ids) if e is not None])
            touched = con.execute("SELECT count(*) FROM touched").fetchone()[0]
            con.execute("CHECKPOINT")
        finally:
            con.close()
        st, base_mtime = os.stat(tmp), os.stat(p.catalog).st_mtime_ns
        if st.st_mtime_ns == base_mtime:      # the mark of an empty delta (readers skip it): never on this one
            os.utime(tmp, ns=(st.st_atime_ns, base_mtime + 1))
        os.replace(tmp, delta)
        if touched > DELTA_MAX_RUNS:
            _write_base(p, _Plan([], [], []))
    _drop_shared(p.catalog)
    return p.catalog


# ---------------------------------------------------------------------- writing tables


def _ddl(columns: dict[str, str]) -> str:
    return ", ".join(f'"{c}" {t}' for c, t in columns.items())


def _create_tables(con: duckdb.DuckDBPyConnection, meta: dict[str, str]) -> None:
    """Every table, empty; catalog_meta holds the schema version and `meta` (a base's generation, or the
    generation of the base a delta belongs to, with its `touched` table: the runs it overrides)."""
    con.execute("CREATE TABLE catalog_meta (key VARCHAR, value VARCHAR)")
    con.executemany("INSERT INTO catalog_meta VALUES (?, ?)", [["schema_version", SCHEMA_VERSION], *meta.items()])
    for name, columns in _TABLE_COLUMNS.items():
        con.execute(f"CREATE TABLE {name} ({_ddl(columns)})")
    if "base_generation" in meta:
        con.execute("CREATE TABLE touched (run_id VARCHAR)")


def _param(v):
    """A Python value as DuckDB gets it from a DataFrame: NaN is NULL, anything not scalar its JSON text."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return None if v != v else v
    return json.dumps(v, default=str)


def _insert_rows(con: duckdb.DuckDBPyConnection, table: str, rows: list[dict]) -> None:
    """Append rows (dicts) to a table, columns matched by name (missing ones NULL), cast to the table's types. A
    few rows go in as bound parameters (no pandas: a run's state change and a config-only check stay light), many
    through a DataFrame."""
    if not rows:
        return
    if len(rows) > 256:
        import pandas as pd

        _insert_frame(con, table, pd.DataFrame(rows, columns=list(_TABLE_COLUMNS[table])))
        return
    columns = _TABLE_COLUMNS[table]
    marks = ", ".join(f"CAST(? AS {t})" for t in columns.values())
    con.executemany(f"INSERT INTO {table} VALUES ({marks})", [[_param(r.get(c)) for c in columns] for r in rows])


def _insert_frame(con: duckdb.DuckDBPyConnection, table: str, df: pd.DataFrame) -> None:
    """Append a DataFrame to a table, columns matched by name (missing ones NULL), cast to the table's types."""
    if df.empty:
        return
    columns = _TABLE_COLUMNS[table]
    df = df.reindex(columns=list(columns))
    cols = ", ".join(f'CAST("{c}" AS {t})' for c, t in columns.items())
    con.register("_frame", df)
    try:
        con.execute(f"INSERT INTO {table} SELECT {cols} FROM _frame")
    finally:
        con.unregister("_frame")


def _insert_parquet(con: duckdb.DuckDBPyConnection, table: str, files: list[tuple[str, Path]]) -> dict[str, str]:
    """Append Parquet files (run_id, path) to a table in one statement; run_id comes from the run directory.
    When that statement fails (an unreadable or odd file), each file is tried alone; returns {run_id: reason}
    of the files that could not be read (their runs get quarantined)."""
    if not files:
        return {}
    try:
        _insert_parquet_batch(con, table, files)
        return {}
    except duckdb.Error:
        bad = {}
        for f in files:
            for _ in range(2):   # a live watch may replace its file between DuckDB's two opens: try again once
                try:
                    _insert_parquet_batch(con, table, [f])
                    bad.pop(f[0], None)
                    break
                except duckdb.Error as e:
                    bad[f[0]] = f"{f[1].name}: {_line(str(e).replace(str(f[1]), f[1].name))}"
        return bad


def _insert_parquet_batch(con: duckdb.DuckDBPyConnection, table: str, files: list[tuple[str, Path]]) -> None:
    columns = _TABLE_COLUMNS[table]
    names = [str(f) for _, f in files]
    have = {r[0] for r in con.execute("DESCRIBE SELECT * FROM read_parquet(?, union_by_name = true)",
                                      [names]).fetchall()}
    cols = ", ".join("m.run_id" if c == "run_id" else f'CAST(f."{c}" AS {t})' if c in have else f"CAST(NULL AS {t})"
                     for c, t in columns.items())
    con.execute(f"INSERT INTO {table} SELECT {cols} FROM read_parquet(?, union_by_name = true, filename = true) f "
                "JOIN (SELECT unnest(?::VARCHAR[]) AS run_id, unnest(?::VARCHAR[]) AS filename) m "
                "ON f.filename = m.filename", [names, [r for r, _ in files], names])


def _ingest(con: duckdb.DuckDBPyConnection, entries: list[_Entry]) -> None:
    """Read these run directories into every table: their runs rows, the per-boundary statistics of complete
    captures, the figures of bench runs and the per-prompt and per-step tables of complete ones. A run whose
    Parquet cannot be read is listed but contributes no rows."""
    rows = [_run_row(RunDir(e.path), e.sig) for e in entries]
    _insert_rows(con, "runs", rows)
    complete = [r for r in rows if r["status"] == "complete"]
    bad: dict[str, str] = {}                 # run_id -> why its files cannot be indexed (quarantined below)
    for r in complete:
        if r["kind"] == "capture":
            for name in ("stats.safetensors", "sample.safetensors"):
                f = Path(r["path"]) / name
                if f.exists() and (problem := validate.check_safetensors(f)):
                    bad.setdefault(r["run_id"], problem)
    complete = [r for r in complete if r["run_id"] not in bad]
    bad.update(_insert_parquet(con, "boundary_stats", [(r["run_id"], Path(r["path"]) / "stats.parquet")
                                                       for r in complete
                                                       if (Path(r["path"]) / "stats.parquet").exists()]))
    bench = [r for r in rows if r["kind"] == "bench"]
    _insert_rows(con, "bench_runs", [_bench_run_row(r) for r in bench])
    done = [r for r in bench if r["status"] == "complete"]
    for table, name in (("bench_prompts", "prompts.parquet"), ("bench_steps", "steps.parquet")):
        for rid, why in _insert_parquet(con, table, [(r["run_id"], Path(r["path"]) / name) for r in done
                                                     if (Path(r["path"]) / name).exists()]).items():
            bad.setdefault(rid, why)
    watch = [r for r in rows if r["kind"] == "watch" and (Path(r["path"]) / "windows.parquet").exists()]
    for rid, why in _insert_parquet(con, "watch_windows", [(r["run_id"], Path(r["path"]) / "windows.parquet")
                                                           for r in watch]).items():   # any status: a live watch
        bad.setdefault(rid, why)
    for rid, why in _ingest_load(con, [r for r in rows if r["kind"] == "load" and r["status"] == "complete"]).items():
        bad.setdefault(rid, why)
    for rid, why in _check_tables(con, [r for r in rows
                                        if r["status"] == "complete" and r["run_id"] not in bad]).items():
        bad.setdefault(rid, why)
    _quarantine(con, bad)


_KEYS = {"boundary_stats": ("stats.parquet", ("boundary", "ord")),
         "bench_prompts": ("prompts.parquet", ("repeat", "prompt_index", "prompt_id")),
         "bench_steps": ("steps.parquet", ("repeat", "prompt_id", "step", "accepted")),
         "watch_windows": ("windows.parquet", ("window", "t_start", "t_end")),
         "load_levels": ("levels.parquet", ("config", "concurrency", "side"))}


def _check_tables(con: duckdb.DuckDBPyConnection, rows: list[dict]) -> dict[str, str]:
    """Complete runs whose tables are readable but not whole: rows without their key columns, a capture with
    another number of boundary rows than its manifest's boundaries, a bench run with another number of prompt
    rows than its progress total."""
    ids = [r["run_id"] for r in rows]
    bad: dict[str, str] = {}
    if not ids:
        return bad
    for table, (name, keys) in _KEYS.items():
        null = " OR ".join(f'"{k}" IS NULL' for k in keys)
        for (rid,) in con.execute(f"SELECT DISTINCT run_id FROM {table} WHERE list_contains(?, run_id) AND ({null})",
                                  [ids]).fetchall():
            bad.setdefault(rid, f"{name}: rows without {', '.join(keys)}")
    counts = {"boundary_stats": dict(con.execute("SELECT run_id, count(*) FROM boundary_stats WHERE list_contains(?, "
                                                 "run_id) GROUP BY run_id", [ids]).fetchall()),
              "bench_prompts": dict(con.execute("SELECT run_id, count(*) FROM bench_prompts WHERE list_contains(?, "
                                                "run_id) GROUP BY run_id", [ids]).fetchall())}
    for r in rows:
        path = Path(r["path"])
        if r["kind"] == "capture" and r["n_boundaries"] and (path / "stats.parquet").exists():
            n = counts["boundary_stats"].get(r["run_id"], 0)
            if n != r["n_boundaries"]:
                bad.setdefault(r["run_id"], f"stats.parquet: {n} rows for {r['n_boundaries']} boundaries")
        if r["kind"] == "bench" and r["progress_total"] and (path / "prompts.parquet").exists():
            n = counts["bench_prompts"].get(r["run_id"], 0)
            if n != r["progress_total"]:
                bad.setdefault(r["run_id"], f"prompts.parquet: {n} rows, the manifest counts {r['progress_total']}")
    return bad


def _quarantine(con: duckdb.DuckDBPyConnection, bad: dict[str, str]) -> None:
    """Mark runs quarantined with their reason and drop their rows from the data tables (pages show complete
    runs only; the Runs page lists these with the reason)."""
    if not bad:
        return
    ids = list(bad)
    for table in ("boundary_stats", "bench_prompts", "bench_steps", "watch_windows", "load_levels", "load_cells"):
        con.execute(f"DELETE FROM {table} WHERE list_contains(?, run_id)", [ids])
    for rid, why in bad.items():
        con.execute("UPDATE runs SET status = ?, error = ? WHERE run_id = ?", [validate.QUARANTINED, _line(why), rid])
        con.execute("UPDATE bench_runs SET status = ? WHERE run_id = ?", [validate.QUARANTINED, rid])


# ---------------------------------------------------------------------- bench tables (kind "bench")
# bench_runs (one row per bench run, figures from its manifest), bench_prompts (prompts.parquet of complete
# bench runs) and bench_steps (steps.parquet). Written by backend/bench.py; see docs/SCHEMA.md.

BENCH_RUN_COLUMNS = {
    "run_id": "VARCHAR", "status": "VARCHAR", "model": "VARCHAR", "drafter": "VARCHAR", "dataset": "VARCHAR",
    "baseline_run": "VARCHAR", "num_spec_tokens": "BIGINT", "temperature": "DOUBLE", "repeats": "BIGINT",
    "tau": "DOUBLE", "acceptance_rate": "DOUBLE", "tokens_per_s": "DOUBLE", "ttft": "DOUBLE", "tpot": "DOUBLE",
    "speedup": "DOUBLE", "speedup_std": "DOUBLE", "speedup_ci_low": "DOUBLE", "speedup_ci_high": "DOUBLE",
    "lossless": "BOOLEAN", "mismatched_prompts": "BIGINT", "created": "VARCHAR",
    "pairing": "VARCHAR", "speed_noise": "VARCHAR",   # interleaved|separate; why the speed figures are no verdict
}
BENCH_PROMPT_COLUMNS = {
    "run_id": "VARCHAR", "repeat": "BIGINT", "prompt_index": "BIGINT", "prompt_id": "VARCHAR",
    "category": "VARCHAR", "prompt_tokens": "BIGINT", "output_tokens": "BIGINT", "seconds": "DOUBLE",
    "tokens_per_s": "DOUBLE", "ttft": "DOUBLE", "tpot": "DOUBLE", "accepted": "BIGINT", "drafts": "BIGINT",
    "output_hash": "VARCHAR",
    # execution order and the plain-decoding half of each interleaved pair (NULL in older runs), the machine's load
    "unit_order": "BIGINT", "first_arm": "VARCHAR", "started": "DOUBLE", "base_output_tokens": "BIGINT",
    "base_seconds": "DOUBLE", "base_tokens_per_s": "DOUBLE", "base_ttft": "DOUBLE", "base_tpot": "DOUBLE",
    "base_output_hash": "VARCHAR", "load1": "DOUBLE", "cpu_util": "DOUBLE", "other_cpu": "DOUBLE",
    "speclens_cpu": "DOUBLE",
}
BENCH_STEP_COLUMNS = {"run_id": "VARCHAR", "repeat": "BIGINT", "prompt_id": "VARCHAR", "step": "BIGINT",
                      "accepted": "BIGINT"}
# watch_windows: windows.parquet of watch runs (backend/watch.py, any status: a running watch is shown live)
WATCH_WINDOW_COLUMNS = {
    "run_id": "VARCHAR", "window": "BIGINT", "segment": "BIGINT", "t_start": "DOUBLE", "t_end": "DOUBLE",
    "seconds": "DOUBLE", "drafts": "BIGINT", "draft_tokens": "BIGINT", "accepted": "BIGINT", "tau": "DOUBLE",
    "acceptance_rate": "DOUBLE", "per_pos": "BIGINT[]", "per_pos_rate": "DOUBLE[]", "drafted_tps": "DOUBLE",
    "accepted_tps": "DOUBLE", "generation_tps": "DOUBLE", "generation_tokens": "BIGINT", "finished_requests": "BIGINT",
    "running": "DOUBLE", "waiting": "DOUBLE", "restart": "BOOLEAN", "status": "VARCHAR", "baseline": "BOOLEAN",
    "baseline_tau": "DOUBLE", "band_low": "DOUBLE", "band_high": "DOUBLE", "below_band": "BOOLEAN", "drift": "BOOLEAN",
    "below_min_tau": "BOOLEAN", "note": "VARCHAR",
}
# load_levels: levels.parquet of complete serving-load runs (backend/load_bench.py: one row per config x concurrency
# x repeat x side); load_cells: their summary.json, one row per config x concurrency, with the summary's best config
# per concurrency, where each config stops paying and the baseline-noise flag of its concurrency. Never the requests.
LOAD_LEVEL_COLUMNS = {
    "run_id": "VARCHAR", "config": "VARCHAR", "k": "BIGINT", "synthetic_tau": "DOUBLE", "concurrency": "BIGINT",
    "repeat": "BIGINT", "side": "VARCHAR", "order": "BIGINT", "requests": "BIGINT", "errors": "BIGINT",
    "first_error": "VARCHAR", "output_tokens": "BIGINT", "seconds": "DOUBLE", "output_tps": "DOUBLE",
    "req_per_s": "DOUBLE", "per_user_tps": "DOUBLE", "load1": "DOUBLE", "cpu_percent": "DOUBLE",
    "other_speclens": "BIGINT", "gpu_processes": "DOUBLE", "gpu_util": "DOUBLE",   # NVML; NULL without it
    **{f"{m}_{q}": "DOUBLE" for m in ("ttft", "tpot", "itl") for q in ("p50", "p90", "p99")},
    "tpot_mean": "DOUBLE", "drafts_server": "DOUBLE", "accepted_server": "DOUBLE", "tau_server": "DOUBLE",
    "acceptance_rate_server": "DOUBLE", "per_pos_server": "VARCHAR", "drafts_client": "DOUBLE",
    "accepted_client": "DOUBLE", "tau_client": "DOUBLE", "tau_agreement": "DOUBLE", "merged_requests": "DOUBLE",
    "started": "DOUBLE",
}
LOAD_CELL_COLUMNS = {
    "run_id": "VARCHAR", "config": "VARCHAR", "k": "BIGINT", "synthetic_tau": "DOUBLE", "concurrency": "BIGINT",
    "speedup": "DOUBLE", "speedup_ci_low": "DOUBLE", "speedup_ci_high": "DOUBLE", "n_requests": "BIGINT",
    "n_repeats": "BIGINT", "baseline_tps": "DOUBLE", "drafter_tps": "DOUBLE", "baseline_per_user_tps": "DOUBLE",
    "drafter_per_user_tps": "DOUBLE", "tau_server": "DOUBLE", "tau_client": "DOUBLE", "tau_agreement": "DOUBLE",
    "merged_requests": "BIGINT", "load1_max": "DOUBLE", "errors": "BIGINT",
    # summary.json's `best` (NULL for synthetic-acceptance configs, which it does not rank) and `stops_paying`
    "best_config": "VARCHAR", "is_best": "BOOLEAN", "within_best": "BOOLEAN", "stops_paying": "BIGINT",
    # summary.json's `baseline_noise` at this concurrency; noise_checked false: a summary written before the check
    "noise_checked": "BOOLEAN", "baseline_noisy": "BOOLEAN", "noise_spread": "DOUBLE", "noise_bar": "DOUBLE",
    "noise_min_tps": "DOUBLE", "noise_max_tps": "DOUBLE", "noise_measurements": "BIGINT",
}
_TABLE_COLUMNS = {"runs": RUN_TYPES, "boundary_stats": STATS_TYPES, "bench_runs": BENCH_RUN_COLUMNS,
                  "bench_prompts": BENCH_PROMPT_COLUMNS, "bench_steps": BENCH_STEP_COLUMNS,
                  "watch_windows": WATCH_WINDOW_COLUMNS, "load_levels": LOAD_LEVEL_COLUMNS,
                  "load_cells": LOAD_CELL_COLUMNS}
_TABLES = list(_TABLE_COLUMNS)


def _bench_run_row(row: dict) -> dict:
    m = StoredManifest.parse(json.loads(row["manifest"]))    # checked when its runs row was made
    b = m.bench or Bench()
    sp = b.speedup or Speedup()
    return {"run_id": row["run_id"], "status": row["status"], "model": row["model"], "drafter": row["drafter"],
            "dataset": row["dataset"], "baseline_run": row["baseline_run"],
            "num_spec_tokens": m.num_spec_tokens, "temperature": m.temperature,
            "repeats": m.repeats, "tau": b.tau, "acceptance_rate": b.acceptance_rate,
            "tokens_per_s": b.tokens_per_s, "ttft": b.ttft, "tpot": b.tpot,
            "speedup": sp.mean, "speedup_std": sp.std, "speedup_ci_low": sp.ci_low,
            "speedup_ci_high": sp.ci_high, "lossless": b.lossless,
            "mismatched_prompts": b.mismatched_prompts, "created": row["created"],
            "pairing": b.pairing,
            # the one-line reason of a bench run's `speed_noise` finding (backend/bench.py), None when there is none
            "speed_noise": b.speed_noise.reason if b.speed_noise is not None else None}


def _load_cell_rows(run_id: str, summary: dict) -> list[dict]:
    """The rows of load_cells from one summary.json (backend/load_bench.summarize)."""
    best = summary.get("best") if isinstance(summary.get("best"), dict) else {}
    stops = summary.get("stops_paying") if isinstance(summary.get("stops_paying"), dict) else {}
    checked = isinstance(summary.get("baseline_noise"), dict)
    noise = summary["baseline_noise"] if checked else {}
    rows = []
    for c in summary["cells"]:
        sp = c.get("speedup") if isinstance(c.get("speedup"), dict) else {}
        b = best.get(str(c["concurrency"])) if c.get("synthetic_tau") is None else None
        b = b if isinstance(b, dict) else None
        n = noise.get(str(c["concurrency"]))
        n = n if isinstance(n, dict) else {}
        rows.append({**{k: c.get(k) for k in LOAD_CELL_COLUMNS if k in c}, "run_id": run_id,
                     "speedup": sp.get("value"), "speedup_ci_low": sp.get("ci_low"),
                     "speedup_ci_high": sp.get("ci_high"), "n_requests": sp.get("n_prompts"),
                     "n_repeats": sp.get("n_repeats"), "best_config": b.get("config") if b else None,
                     "is_best": (b.get("config") == c["config"]) if b else None,
                     "within_best": (c["config"] in (b.get("within_interval") or [])) if b else None,
                     "stops_paying": stops.get(c["config"]), "noise_checked": checked,
                     "baseline_noisy": bool(n) if checked else None, "noise_spread": n.get("spread"),
                     "noise_bar": n.get("bar"), "noise_min_tps": n.get("min_tps"), "noise_max_tps": n.get("max_tps"),
                     "noise_measurements": n.get("measurements")})
    return rows


def _ingest_load(con: duckdb.DuckDBPyConnection, rows: list[dict]) -> dict[str, str]:
    """levels.parquet and summary.json of complete load runs into load_levels and load_cells; returns {run_id: why}
    for the runs whose files cannot be read (quarantined)."""
    bad = _insert_parquet(con, "load_levels", [(r["run_id"], Path(r["path"]) / "levels.parquet") for r in rows
                                               if (Path(r["path"]) / "levels.parquet").exists()])
    cells = []
    for r in rows:
        f = Path(r["path"]) / "summary.json"
        if r["run_id"] in bad or not f.exists():
            continue
        try:
            cells += _load_cell_rows(r["run_id"], json.loads(f.read_text()))
        except Exception as e:  # noqa: BLE001 - one unreadable summary must not hide the other runs
            bad[r["run_id"]] = f"summary.json: {_line(f'{type(e).__name__}: {e}')}"
    _insert_rows(con, "load_cells", cells)
    return bad


# ---------------------------------------------------------------------- reading


def _pd():
    import pandas as pd

    return pd


class _StaleBase(duckdb.IOException):
    """The delta belongs to a newer base than the one opened (a new base was swapped in between): reopen."""


def _open(catalog: Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection to the catalog as it is now: the base file and its delta (the runs changed since
    the base was written), both ATTACHed read-only to a private in-memory database: `duckdb.connect(path)` would
    hand out the process's cached instance of that path, which still shows the old catalog after a refresh
    swapped in a new file while any connection to it was open. An empty delta (its mtime its base's) is not
    opened. With a non-empty delta of this base, every table
    is a view: the base's rows of the runs the delta does not touch, plus the delta's rows. A delta of an older
    base is already folded into this one (ignored); of a newer base, the base was replaced after it was opened:
    _StaleBase (an IOException, so reads retry on the new files)."""
    con = duckdb.connect()
    try:
        con.execute("ATTACH ? AS speclens (READ_ONLY)", [str(catalog)])
        delta = _delta_path(catalog)
        use = "speclens"
        try:                             # an empty delta carries its base's mtime (_write_empty_delta): skip it
            empty = os.stat(delta).st_mtime_ns == os.stat(catalog).st_mtime_ns
        except OSError:
            empty = not delta.exists()
        if not empty:
            try:
                con.execute("ATTACH ? AS d (READ_ONLY)", [str(delta)])
            except duckdb.IOException:
                con.execute("ATTACH ? AS d (READ_ONLY)", [str(delta)])    # swapped while opening: once more
            base, dbase, touched = con.execute(
                "SELECT (SELECT value FROM speclens.catalog_meta WHERE key = 'generation'), "
                "(SELECT value FROM d.catalog_meta WHERE key = 'base_generation'), "
                "(SELECT count(*) FROM d.touched)").fetchone()
            if base is not None and dbase is not None and dbase != base:
                if int(dbase) > int(base):
                    raise _StaleBase(f"{catalog}: replaced while opening")
            elif base is not None and touched:
                use = "memory"
                con.execute("USE memory; CREATE VIEW catalog_meta AS SELECT * FROM speclens.catalog_meta; " + "; ".join(
                    f"CREATE VIEW {t} AS SELECT * FROM speclens.{t} WHERE run_id NOT IN (SELECT run_id FROM "
                    f"d.touched) UNION ALL SELECT * FROM d.{t}" for t in _TABLES))
        if use == "speclens":
            con.execute("USE speclens")
    except Exception:
        con.close()
        raise
    return con


class _Snap:
    """The catalog file and the connection a `snapshot` reads through (replaced if a swap broke it)."""

    def __init__(self, catalog: Path):
        self.catalog = catalog
        self.con = _open(catalog)

    def reopen(self) -> None:
        self.con.close()
        self.con = _open(self.catalog)


# the innermost `snapshot` of this thread/context, if any
_SNAPSHOT: ContextVar[_Snap | None] = ContextVar("catalog_snapshot", default=None)


# catalog file -> (which files it is: base and delta stamps, an open connection to that version, the database its
# queries USE): the catalog version a page's `shared_reads` scope reads through a cursor of, kept per process
_OPENED: dict[Path, tuple[tuple[str, str], duckdb.DuckDBPyConnection, str]] = {}
_OPENED_LOCK = threading.Lock()
_OPENED_MAX = 4                    # catalogs kept open (a server has one; a test process makes many)


def _version_cursor(catalog: Path) -> tuple[duckdb.DuckDBPyConnection, tuple[str, str] | None]:
    """A connection (a cursor of one kept per process) to the catalog as it is now. The base and the delta are only
    ever replaced whole (os.replace: a new inode), so while both stamps are the ones a kept connection was opened
    at, it reads the same files: a page then opens no DuckDB file (15-25 ms on a 10,000-run catalog) and reads
    through DuckDB's warm buffers. A connection is kept only when no swap happened while it was opened; an old
    version's connection closes when its last cursor does. Returns the cursor and the version it reads (None: a
    connection of this scope's own, not kept)."""
    key = _catalog_key(catalog)
    with _OPENED_LOCK:
        hit = _OPENED.get(catalog)
        if key is not None and hit is not None and hit[0] == key:
            cur = hit[1].cursor()
            use = hit[2]
        else:
            hit = None
    if hit is None:
        con = _open(catalog)
        use = con.execute("SELECT current_database()").fetchone()[0]
        if key is not None and key == _catalog_key(catalog):
            with _OPENED_LOCK:
                _OPENED.pop(catalog, None)
                _OPENED[catalog] = (key, con, use)
                while len(_OPENED) > _OPENED_MAX:
                    _OPENED.pop(next(iter(_OPENED)))
                cur = con.cursor()
        else:
            return con, None                    # a swap got in the way: this scope's own connection, not kept
    try:
        cur.execute(f"USE {use}")
    except Exception:
        cur.close()
        raise
    return cur, key


# (catalog file, version, what, arguments) -> a result computed from that version's rows (CatalogReader.kept)
_KEPT: dict[tuple, object] = {}
_KEPT_MAX = 64
_MISSING = object()

# (catalog file, version, query, parameters) -> result: whole-catalog queries a page makes on every visit (the run
# pickers' lists, the Runs table), kept per process for the catalog version they were read from
_RESULTS: dict[tuple, pd.DataFrame] = {}
_RESULTS_MAX = 32


def _keep(store: dict, most: int, catalog: Path, version: tuple[str, str], what: tuple, compute: Callable[[], T]) -> T:
    """compute()'s result under (catalog, version, *what) in `store`, computed once per process; results of this
    catalog's other versions are dropped, and the oldest beyond `most`."""
    key = (catalog, version, *what)
    with _OPENED_LOCK:
        hit = store.get(key, _MISSING)
    if hit is _MISSING:
        hit = compute()
        with _OPENED_LOCK:
            for k in [k for k in store if k[0] == catalog and k[1] != version]:
                del store[k]
            store[key] = hit
            while len(store) > most:
                store.pop(next(iter(store)))
    return hit


def _kept_result(catalog: Path, version: tuple[str, str], sql: str, params: list, read) -> pd.DataFrame:
    """`read()`'s result for this query on this catalog version, read once per process (a copy each time: callers
    may change theirs)."""
    return _keep(_RESULTS, _RESULTS_MAX, catalog, version, (sql, json.dumps(params)), read).copy()


def _forget_version(catalog: Path) -> None:
    """Stop handing out the kept connection of this catalog (a read through it failed: a swap broke it)."""
    with _OPENED_LOCK:
        _OPENED.pop(catalog, None)


class _Shared:
    """The connection the queries of one `shared_reads` scope go through: a cursor of the process's connection to
    the catalog's current version (_version_cursor), taken at the first query, per catalog file; dropped when this
    process re-indexes that catalog (the next query then reads the new version)."""

    def __init__(self):
        self.cons: dict[Path, duckdb.DuckDBPyConnection] = {}
        self.versions: dict[Path, tuple[str, str] | None] = {}

    def con(self, catalog: Path) -> duckdb.DuckDBPyConnection:
        if catalog not in self.cons:
            self.cons[catalog], self.versions[catalog] = _version_cursor(catalog)
        return self.cons[catalog]

    def version(self, catalog: Path) -> tuple[str, str] | None:
        """The catalog version this scope's connection reads (None: not a kept one)."""
        self.con(catalog)
        return self.versions.get(catalog)

    def drop(self, catalog: Path) -> None:
        self.versions.pop(catalog, None)
        con = self.cons.pop(catalog, None)
        if con is not None:
            con.close()


_SHARED: ContextVar[_Shared | None] = ContextVar("catalog_shared_reads", default=None)


@contextmanager
def shared_reads() -> Iterator[None]:
    """Inside this scope (a dashboard page's script run) the catalog's queries share one connection, opened at the
    first query, instead of opening the file once per query (15-25 ms each on a 10,000-run catalog). A re-index by
    this process drops it, so a query after a rescan sees the rescan; another process's swap is seen at the next
    scope, as a snapshot would. Per thread."""
    shared = _Shared()
    token = _SHARED.set(shared)
    try:
        yield
    finally:
        _SHARED.reset(token)
        for catalog in list(shared.cons):
            shared.drop(catalog)


def _drop_shared(catalog: Path) -> None:
    shared = _SHARED.get()
    if shared is not None:
        shared.drop(catalog)


_READ_ATTEMPTS = 4


def _with_retry(fn):
    """Run a read; a refresh that swaps the file in while DuckDB opens or reads it can surface as an IO error
    (seen on a loaded CI machine: "could not read enough bytes"): the read is retried on the new file."""
    for attempt in range(_READ_ATTEMPTS):
        try:
            return fn()
        except duckdb.IOException:
            if attempt == _READ_ATTEMPTS - 1:
                raise
            time.sleep(0.02 * (attempt + 1))


def _alignment_file(p: Paths, run_a: str, run_b: str) -> Path:
    """Where the alignment of A and B is kept; the ids are checked first, so the name stays inside alignments/."""
    for r in (run_a, run_b):
        if not valid_run_id(str(r)):
            raise SpecLensError(f"'{str(r)[:80]}' is not a run id (letters, digits, '.', '_' or '-')")
    return p.alignments / f"{run_a}__{run_b}.json"


def _ids(run_ids) -> list[str]:
    return [str(r) for r in run_ids]


# ---------------------------------------------------------------------- the catalog object


class CatalogReader:
    """The read side, which only reads: named queries (pages and CLIs call these; values always travel as bound
    parameters, never as SQL text), and the derived results that live beside the catalog as their owners stored
    them (alignments from backend/align.py, drafter checks from backend/check_drafter.py), so that pages read
    through the catalog only."""

    def __init__(self, where: Paths):
        self.paths = where

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Run several named queries on one connection and one version of the catalog (a page's figures then agree
        with each other, and it opens the file once). Nests; per thread."""
        p = self.paths
        cur = _SNAPSHOT.get()
        if cur is not None and cur.catalog == p.catalog:
            yield
            return
        if not p.catalog.exists():
            _refresh(p)
        if _SHARED.get() is not None:        # its one connection already reads one version
            yield
            return
        snap = _with_retry(lambda: _Snap(p.catalog))
        token = _SNAPSHOT.set(snap)
        try:
            yield
        finally:
            _SNAPSHOT.reset(token)
            snap.con.close()

    def kept(self, what: str, args: tuple, compute: Callable[[], T]) -> T:
        """compute()'s result for (what, args), computed once per version of this catalog that a page scope reads
        (`version`) and kept per process: for results made from the catalog's rows alone (a comparison, a page's
        figures and words), the same on every visit until the catalog changes. The kept object itself is returned:
        callers that may change theirs copy it. Outside a page scope compute() runs every time."""
        version = self.version()
        if version is None:
            return compute()
        return _keep(_KEPT, _KEPT_MAX, self.paths.catalog, version, (what, args), compute)

    def version(self) -> tuple[str, str] | None:
        """Which version of the catalog this page scope reads (its base and delta files' stamps): results computed
        from this catalog's rows alone may be kept under it (backend/compare.py). None outside a `shared_reads`
        scope, or when the scope reads through a connection of its own (a swap got in the way)."""
        shared = _SHARED.get()
        p = self.paths
        if shared is None or not p.catalog.exists():
            return None
        return _with_retry(lambda: shared.version(p.catalog))

    def _df(self, sql: str, params: list | None = None, keep: bool = False) -> pd.DataFrame:
        """The query's result; keep=True (a whole-catalog query a page makes on every visit): inside a page's scope,
        read once per process and catalog version (_kept_result)."""
        p = self.paths
        cur = _SNAPSHOT.get()
        if cur is not None and cur.catalog == p.catalog:
            def in_snapshot() -> pd.DataFrame:
                try:
                    return cur.con.execute(sql, params or []).df()
                except duckdb.IOException:
                    cur.reopen()
                    raise
            return _with_retry(in_snapshot)
        if not p.catalog.exists():
            _refresh(p)
        shared = _SHARED.get()
        if shared is not None:
            def through_shared() -> pd.DataFrame:
                try:
                    version = shared.version(p.catalog) if keep else None
                    if version is not None:
                        return _kept_result(p.catalog, version, sql, params or [],
                                            lambda: shared.con(p.catalog).execute(sql, params or []).df())
                    return shared.con(p.catalog).execute(sql, params or []).df()
                except duckdb.IOException:
                    shared.drop(p.catalog)           # a swap broke it: the retry opens the new file
                    _forget_version(p.catalog)
                    raise
            return _with_retry(through_shared)

        def once() -> pd.DataFrame:
            con = _open(p.catalog)
            try:
                return con.execute(sql, params or []).df()
            finally:
                con.close()
        return _with_retry(once)

    # ------------------------------------------------------------------ derived results beside the catalog

    def stored_alignment(self, run_a: str, run_b: str):
        """The alignment of captures A and B as backend/align.py stored it beside the catalog (data/alignments/,
        `CatalogWriter.store_alignment`), whatever its key: None when none is stored or the file is not JSON.
        Computing one, and telling whether a stored one is still current, is backend/align.py's (get_alignment)."""
        f = _alignment_file(self.paths, run_a, run_b)
        if not f.exists():
            return None
        try:
            return json.loads(f.read_text())
        except json.JSONDecodeError:
            return None

    def drafter_check(self, run_id: str) -> dict:
        """The stored result of a complete drafter check run (backend/store/check_result.py)."""
        return check_result.load_check(run_id, self.paths)

    def check_runs(self) -> pd.DataFrame:
        """Complete drafter check runs, newest first."""
        return self.list_runs(kind="check", status="complete")

    # ------------------------------------------------------------------ named queries


    def list_runs(self, kind: str | None = None, status: str | None = None) -> pd.DataFrame:
        """Runs, newest first, optionally filtered by kind and status (bound parameters, never string SQL)."""
        return self._df("""SELECT * EXCLUDE (manifest, sig) FROM runs
                      WHERE (? IS NULL OR kind = ?) AND (? IS NULL OR status = ?)
                      ORDER BY created DESC, run_id""", [kind, kind, status, status], keep=True)

    def run_states(self, run_ids: list[str]) -> pd.DataFrame:
        """run_id, kind and status of the given runs (those in the catalog)."""
        return self._df("SELECT run_id, kind, status FROM runs WHERE list_contains(?, run_id)", [_ids(run_ids)])

    def runs_overview(self) -> pd.DataFrame:
        """Every run (as list_runs) with the headline figures of bench runs: tau, acceptance rate, tokens/s and
        the speedup over the paired baseline with its CI (NULL for captures)."""
        return self._df("""SELECT r.* EXCLUDE (manifest, sig), b.num_spec_tokens, b.tau, b.acceptance_rate,
                             b.tokens_per_s, b.speedup, b.speedup_ci_low, b.speedup_ci_high, b.lossless,
                             b.pairing, b.speed_noise
                      FROM runs r LEFT JOIN bench_runs b USING (run_id)
                      ORDER BY r.created DESC, r.run_id""", [], keep=True)

    def run_ids(self, kind: str | None = None, status: str | None = "complete") -> list[str]:
        return self.list_runs(kind, status)["run_id"].tolist()

    def get_run(self, run_id: str) -> dict | None:
        df = self._df("SELECT * FROM runs WHERE run_id = ?", [run_id])
        if df.empty:
            return None
        row = df.iloc[0].to_dict()
        row["manifest"] = json.loads(row["manifest"]) if row.get("manifest") else {}
        return row

    def run_manifests(self, run_ids: list[str]) -> dict[str, dict]:
        """run_id -> manifest (as the run directory holds it) for the given runs that are in the catalog."""
        if not run_ids:
            return {}
        df = self._df("SELECT run_id, manifest FROM runs WHERE list_contains(?, run_id)", [_ids(run_ids)])
        return {r: json.loads(m) if m else {} for r, m in zip(df["run_id"], df["manifest"])}

    def run_manifest_keys(self, run_ids: list[str], keys: tuple[str, ...], having: str | None = None
                          ) -> dict[str, dict]:
        """run_id -> only these top-level manifest keys (those present) of the given runs in the catalog; `having`:
        only runs whose manifest holds that key as an object. DuckDB extracts the keys, so that a page over 10,000
        runs does not parse 10,000 whole manifests (the Runs page's findings read five keys: backend/findings.py)."""
        if not run_ids or not keys:
            return {}
        where = " AND json_type(manifest, ?) = 'OBJECT'" if having else ""
        params = [[f"$.{k}" for k in keys], _ids(run_ids)] + ([f"$.{having}"] if having else [])
        df = self._df(f"SELECT run_id, json_extract(manifest, ?) AS vals FROM runs "
                      f"WHERE list_contains(?, run_id){where}", params)
        return {r: {k: json.loads(v) for k, v in zip(keys, vals, strict=True) if v is not None}
                for r, vals in zip(df["run_id"], df["vals"], strict=True)}

    def check_manifests(self) -> dict[str, dict]:
        """run_id -> manifest of every complete drafter check run (backend/check_drafter.py), newest first."""
        df = self._df("""SELECT run_id, manifest FROM runs WHERE kind = 'check' AND status = 'complete'
                    ORDER BY created DESC, run_id""", [], keep=True)
        return {r: json.loads(m) if m else {} for r, m in zip(df["run_id"], df["manifest"])}

    def pinned_baselines(self) -> pd.DataFrame:
        """Bench runs pinned as the baseline of their target (backend/annotations.py): run_id, model, model_path,
        model_key."""
        return self._df("""SELECT run_id, model, model_path, model_key FROM runs WHERE pinned AND kind = 'bench'
                      ORDER BY created DESC, run_id""", [], keep=True)

    def boundary_stats(self, run_ids: list[str]) -> pd.DataFrame:
        """Per-boundary statistics of the given runs, in stream order."""
        if not run_ids:
            return _pd().DataFrame()
        return self._df("""SELECT * FROM boundary_stats WHERE list_contains(?, run_id) ORDER BY run_id, ord""",
                   [_ids(run_ids)])

    def bench_runs(self, status: str | None = None, run_ids: list[str] | None = None) -> pd.DataFrame:
        """Bench runs with their headline figures (tau, acceptance, tokens/s, speedup and CI, lossless), the target's
        path and the pinned flag, newest first; only `run_ids` when given."""
        ids = None if run_ids is None else _ids(run_ids)
        return self._df("""SELECT b.*, r.model_path, r.model_key, r.pinned FROM bench_runs b JOIN runs r USING (run_id)
                      WHERE (? IS NULL OR b.status = ?)
                        AND (?::VARCHAR[] IS NULL OR list_contains(?::VARCHAR[], b.run_id))
                      ORDER BY b.created DESC, b.run_id""", [status, status, ids, ids])

    def bench_history(self, run_ids: list[str] | None = None, reading: bool = True) -> pd.DataFrame:
        """Bench runs with their headline figures and what the Regression page groups them by: engine, engine_version,
        model (name), model_key, drafter (name), drafter_key (the drafter's fingerprint, else its path), the engine
        reading the drafter's aux ids was benched with (aux_producer, aux_version, aux_runner, aux_boundaries: a JSON
        list), created; oldest first; only `run_ids` when given; reading=False leaves out the manifest fields
        (drafter_key, aux_*)."""
        ids = None if run_ids is None else _ids(run_ids)
        if not reading:         # without the manifest fields (JSON reads of every manifest: ~0.2 s on 10,000 runs)
            return self._df("""SELECT b.*, r.engine, r.engine_version, r.model_path, r.model_key
                          FROM bench_runs b JOIN runs r USING (run_id)
                          WHERE (?::VARCHAR[] IS NULL OR list_contains(?::VARCHAR[], b.run_id))
                          ORDER BY b.created, b.run_id""", [ids, ids])
        return self._df("""SELECT b.*, r.engine, r.engine_version, r.model_path, r.model_key,
                             coalesce(json_extract_string(r.manifest, '$.drafter.fingerprint'),
                                      json_extract_string(r.manifest, '$.drafter.path')) AS drafter_key,
                             json_extract_string(r.manifest, '$.aux.producer') AS aux_producer,
                             json_extract_string(r.manifest, '$.aux.version') AS aux_version,
                             json_extract_string(r.manifest, '$.aux.runner') AS aux_runner,
                             json_extract_string(r.manifest, '$.aux.boundaries') AS aux_boundaries
                      FROM bench_runs b JOIN runs r USING (run_id)
                      WHERE (?::VARCHAR[] IS NULL OR list_contains(?::VARCHAR[], b.run_id))
                      ORDER BY b.created, b.run_id""", [ids, ids])

    def bench_group_keys(self) -> pd.DataFrame:
        """model, drafter, num_spec_tokens of the complete bench runs with drafts, oldest first (bench_history's
        order): what the Regression page's group labels are made of, without the rest of each row."""
        return self._df("""SELECT model, drafter, num_spec_tokens FROM bench_runs
                      WHERE status = 'complete' AND coalesce(num_spec_tokens, 0) > 0
                      ORDER BY created, run_id""", [], keep=True)

    def bench_index(self) -> pd.DataFrame:
        """Every bench run, newest first, with what a run picker needs: run_id, status, num_spec_tokens, model_path,
        model_key, baseline_run."""
        return self._df("""SELECT b.run_id, b.status, b.num_spec_tokens, r.model_path, r.model_key, b.baseline_run
                      FROM bench_runs b JOIN runs r USING (run_id) ORDER BY b.created DESC, b.run_id""", [],
                        keep=True)

    def bench_prompts(self, run_ids: list[str]) -> pd.DataFrame:
        """Per repeat x prompt rows of the given bench runs (tokens/s, TTFT, TPOT, accepted, drafts, output hash)."""
        if not run_ids:
            return _pd().DataFrame(columns=list(BENCH_PROMPT_COLUMNS))
        return self._df("""SELECT * FROM bench_prompts WHERE list_contains(?, run_id)
                      ORDER BY run_id, repeat, prompt_index""", [_ids(run_ids)])

    def bench_prompt_speeds(self, run_ids: list[str]) -> pd.DataFrame:
        """Tokens/s, accepted draft tokens and drafts of every repeat x prompt of the given bench runs, with the
        prompt's category: what a speedup, a tau difference and their bootstrap intervals are computed from
        (backend/metrics.py)."""
        cols = ["run_id", "repeat", "prompt_index", "prompt_id", "category", "tokens_per_s", "accepted", "drafts"]
        if not run_ids:
            return _pd().DataFrame(columns=cols)
        return self._df(f"""SELECT {', '.join(cols)} FROM bench_prompts WHERE list_contains(?, run_id)
                       ORDER BY run_id, repeat, prompt_index""", [_ids(run_ids)])

    def bench_steps(self, run_ids: list[str]) -> pd.DataFrame:
        """Accepted length of every verify step of the given bench runs (raw rows: for export and tests; pages
        use the aggregates below)."""
        if not run_ids:
            return _pd().DataFrame(columns=list(BENCH_STEP_COLUMNS))
        return self._df("""SELECT * FROM bench_steps WHERE list_contains(?, run_id)
                      ORDER BY run_id, repeat, prompt_id, step""", [_ids(run_ids)])

    def bench_histogram(self, run_ids: list[str]) -> pd.DataFrame:
        """Verify steps per accepted length: run_id, accepted, steps, share (of the run's steps)."""
        if not run_ids:
            return _pd().DataFrame(columns=["run_id", "accepted", "steps", "share"])
        return self._df("""SELECT run_id, accepted, count(*) AS steps,
                             count(*) / sum(count(*)) OVER (PARTITION BY run_id) AS share
                      FROM bench_steps WHERE list_contains(?, run_id)
                      GROUP BY run_id, accepted ORDER BY run_id, accepted""", [_ids(run_ids)])

    def bench_categories(self, run_ids: list[str]) -> pd.DataFrame:
        """Per run and prompt category: prompts, mean tokens/s, mean TTFT/TPOT and tau = 1 + accepted / drafts
        (1.0 for plain decoding; the definition of backend/metrics.py)."""
        if not run_ids:
            return _pd().DataFrame(columns=["run_id", "category", "prompts", "tokens_per_s", "ttft", "tpot", "tau"])
        return self._df("""SELECT run_id, category, count(DISTINCT prompt_id) AS prompts,
                             avg(tokens_per_s) AS tokens_per_s, avg(ttft) AS ttft, avg(tpot) AS tpot,
                             CASE WHEN sum(drafts) > 0 THEN 1 + sum(accepted) / sum(drafts) ELSE 1.0 END AS tau
                      FROM bench_prompts WHERE list_contains(?, run_id)
                      GROUP BY run_id, category ORDER BY run_id, category""", [_ids(run_ids)])

    def bench_prompt_timings(self, run_ids: list[str]) -> pd.DataFrame:
        """Per repeat x prompt timings of the given bench runs: output tokens, seconds, tokens/s, TTFT, TPOT, accepted
        draft tokens and drafts, with the prompt's category: what both throughput definitions, TTFT/TPOT, the
        speedups and their bootstrap intervals are computed from (backend/metrics.py; the Compare page's Speed tab);
        the plain-decoding half of interleaved pairs (`base_*`, NULL in older runs), the unit's execution order and
        the cores other (SpecLens) processes used while it ran. The prompt text and the output hash are left out."""
        cols = ["run_id", "repeat", "prompt_index", "prompt_id", "category", "output_tokens", "seconds", "tokens_per_s",
                "ttft", "tpot", "accepted", "drafts", "unit_order", "base_output_tokens", "base_seconds",
                "base_tokens_per_s", "base_ttft", "base_tpot", "other_cpu", "speclens_cpu"]
        if not run_ids:
            return _pd().DataFrame(columns=cols)
        return self._df(f"""SELECT {', '.join(cols)} FROM bench_prompts WHERE list_contains(?, run_id)
                                           ORDER BY run_id, repeat, prompt_index""", [_ids(run_ids)])

    def run_choices(self) -> pd.DataFrame:
        """run_id, kind and status of every run, newest first: what the run page's picker lists (no other columns, so
        that it stays light on a 10,000-run catalog)."""
        return self._df("SELECT run_id, kind, status FROM runs ORDER BY created DESC, run_id", [], keep=True)

    def bench_prompt_table(self, run_id: str, baseline_run: str | None = None) -> pd.DataFrame:
        """One row per prompt of a bench run, its repeats pooled: prompt_index, prompt_id, category, repeats, accepted
        and drafts (sums), output_tokens and seconds (sums), tokens_per_s, ttft and tpot (means over repeats),
        output_hash (the smallest) and hashes (distinct output hashes over repeats), and same_as_baseline: whether
        every repeat's output hash equals the `baseline_run`'s for the same prompt and repeat (NULL without baseline
        rows). The run page's per-prompt table (dashboard/run_view.py); at most one row per prompt, never the per-step
        rows."""
        return self._df("""
            SELECT p.prompt_index, p.prompt_id, p.category, count(*) AS repeats, sum(p.accepted) AS accepted,
                   sum(p.drafts) AS drafts, sum(p.output_tokens) AS output_tokens, sum(p.seconds) AS seconds,
                   avg(p.tokens_per_s) AS tokens_per_s, avg(p.ttft) AS ttft, avg(p.tpot) AS tpot,
                   min(p.output_hash) AS output_hash, count(DISTINCT p.output_hash) AS hashes,
                   bool_and(p.output_hash = b.output_hash) AS same_as_baseline
            FROM bench_prompts p
            LEFT JOIN bench_prompts b ON b.run_id = ? AND b.prompt_id = p.prompt_id AND b.repeat = p.repeat
            WHERE p.run_id = ?
            GROUP BY p.prompt_index, p.prompt_id, p.category ORDER BY p.prompt_index""", [baseline_run, run_id])

    def load_cells(self, run_ids: list[str]) -> pd.DataFrame:
        """Per load run x config x concurrency (summary.json of backend/load_bench.py): the speedup over the paired
        baseline with its 95% interval, both sides' output and per-user tokens/s, tau from the server's counters and
        from the requests' own count with their relative difference, the summary's best config at the concurrency
        (is_best, within_best), where the config stops paying and the concurrency's baseline-noise flag."""
        if not run_ids:
            return _pd().DataFrame(columns=list(LOAD_CELL_COLUMNS))
        return self._df("""SELECT * FROM load_cells WHERE list_contains(?, run_id)
                      ORDER BY run_id, synthetic_tau NULLS FIRST, k, concurrency""", [_ids(run_ids)])

    def load_levels(self, run_ids: list[str]) -> pd.DataFrame:
        """Per load run x config x concurrency x repeat x side: the level's figures (levels.parquet: output tokens/s,
        requests/s, per-user tokens/s, TTFT/TPOT/ITL percentiles in seconds, tau from both sources, the machine's
        load), in the order they ran. Aggregates only: the per-request rows stay in requests.parquet."""
        if not run_ids:
            return _pd().DataFrame(columns=list(LOAD_LEVEL_COLUMNS))
        return self._df('SELECT * FROM load_levels WHERE list_contains(?, run_id) ORDER BY run_id, "order"',
                        [_ids(run_ids)])

    def watch_windows(self, run_id: str) -> pd.DataFrame:
        """The windows of a watch run (backend/watch.py; any status, so a running watch shows what it has), in time
        order: counts, tau, rates, gauges, status, its segment's baseline band and the drift flags (docs/SCHEMA.md)."""
        return self._df('SELECT * FROM watch_windows WHERE run_id = ? ORDER BY "window"', [run_id])


class CatalogWriter:
    """The write side: brings the index up to date with the run directories. A run's own state changes reach it
    through one place, `backend.runs.lifecycle.Run` (create, claim, checkpoint, fail, complete)."""

    def __init__(self, where: Paths):
        self.paths = where

    def refresh(self, full: bool = False) -> Path:
        """Bring the catalog up to date with the run directories and swap it into place atomically: only the runs
        that changed are re-read (nothing is written when none did); full=True rebuilds it from scratch."""
        return _refresh(self.paths, full)

    def store_alignment(self, run_a: str, run_b: str, payload: dict) -> Path:
        """Keep an alignment backend/align.py computed (its JSON form and key) beside the catalog, written
        atomically; `CatalogReader.stored_alignment` reads it back."""
        f = _alignment_file(self.paths, run_a, run_b)
        f.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(f, payload)
        return f

    def refresh_changed(self, run_ids: list[str]) -> list[str]:
        """Bring these runs' rows, and those of the runs indexed as running, up to date with their directories where
        they differ: what `refresh` does for every run directory, for these only (a page about one run needs no scan
        of 10,000 others; a run's own state changes re-index it, so only a process gone or a hand edit is left to
        find). Returns the run ids re-indexed; a catalog that must be rebuilt is rebuilt (then the ids asked)."""
        ids = [str(r) for r in run_ids if valid_run_id(str(r))]
        changed = _changed_of(self.paths, ids)
        if changed is None:
            _refresh(self.paths)
            return ids
        if changed:
            _refresh_runs(self.paths, changed)
        return changed

    def refresh_runs(self, run_ids: list[str]) -> Path:
        """Re-index these runs only (a run's state change): its cost does not grow with the catalog (no scan of the
        other run directories, no copy of the base), and readers see the change at once, whole."""
        return _refresh_runs(self.paths, list(run_ids))


class Catalog:
    """The DuckDB index of one data root: `data.catalog.read` (queries) and `data.catalog.write` (re-index), built
    once by the data root (backend/store/data_root.py `DataRoot.catalog`) from its paths, never from a path of its
    own."""

    def __init__(self, where: Paths):
        self.paths = where
        self.path = where.catalog
        self.read = CatalogReader(where)
        self.write = CatalogWriter(where)
