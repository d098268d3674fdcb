"""The catalog: rebuilt from run directories; readers never fail while a writer refreshes it."""

import multiprocessing as mp
import time

from backend.store.data_root import DataRoot


def _writer(root, n, stop):
    for i in range(n):
        rd = DataRoot(root).new_run_dir(f"w{i:03d}", {"kind": "capture", "engine": "hf", "boundaries": ["S_0"]})
        rd.update(status="complete", headline={"tokens": i})
        DataRoot(root).catalog.write.refresh()
    stop.set()


def _complete(data: DataRoot, *run_ids: str) -> None:
    for rid in run_ids:
        data.new_run_dir(rid, {"kind": "capture", "engine": "hf"}).update(status="complete")


def _count_opens(monkeypatch) -> list:
    """Every DuckDB file the catalog opens from now on, in order."""
    from backend.store import catalog as store

    opened = []
    real = store._open
    monkeypatch.setattr(store, "_open", lambda path: opened.append(path) or real(path))
    return opened


def test_rebuild_and_status(data_root):
    DataRoot(data_root).new_run_dir("done", {"kind": "capture", "engine": "hf"}).update(status="complete")
    rd = DataRoot(data_root).new_run_dir("dead", {"kind": "capture", "engine": "hf"})
    rd.update(pid=2**22 + 12345)                      # a process that does not exist: the run died
    bad = DataRoot(data_root).new_run_dir("bad", {"kind": "capture", "engine": "hf"})
    bad.update(status="failed", error="boom: one line")
    DataRoot(data_root).catalog.write.refresh()
    df = DataRoot(data_root).catalog.read.list_runs().set_index("run_id")
    assert df.loc["done", "status"] == "complete"
    assert df.loc["dead", "status"] == "interrupted"   # never shown as complete or running
    assert df.loc["bad", "status"] == "failed" and df.loc["bad", "error"] == "boom: one line"
    (data_root / "speclens.duckdb").unlink()
    assert len(DataRoot(data_root).catalog.read.list_runs()) == 3  # rebuilt from the run directories


def test_readers_never_fail_while_writer_refreshes(data_root):
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    DataRoot(data_root).catalog.write.refresh()
    w = ctx.Process(target=_writer, args=(data_root, 40, stop))
    w.start()
    reads, errors, seen = 0, [], 0
    deadline = time.time() + 120
    while not stop.is_set() and time.time() < deadline:
        try:
            seen = max(seen, len(DataRoot(data_root).catalog.read.list_runs()))
            reads += 1
        except Exception as e:  # any error a page would show
            errors.append(repr(e))
    w.join(30)
    assert errors == []
    assert reads > 10
    assert len(DataRoot(data_root).catalog.read.list_runs()) == 40


def test_filters_use_parameters_not_sql(data_root):
    DataRoot(data_root).new_run_dir("r1", {"kind": "capture", "engine": "hf"}).update(status="complete")
    DataRoot(data_root).catalog.write.refresh()
    assert DataRoot(data_root).catalog.read.list_runs(kind="capture' OR '1'='1").empty
    assert len(DataRoot(data_root).catalog.read.list_runs(kind="capture")) == 1


def test_stored_alignment_reads_what_the_write_side_stored(data_root):
    """The read side only reads the alignment kept beside the catalog (None when there is none or it is not JSON);
    the write side stores it; run ids that would leave alignments/ are refused on both sides."""
    import pytest

    from backend.errors import SpecLensError

    cat = DataRoot(data_root).catalog
    assert cat.read.stored_alignment("a1", "b1") is None
    assert not (data_root / "alignments").exists()            # reading wrote nothing
    f = cat.write.store_alignment("a1", "b1", {"tokens": 7, "_key": "k"})
    assert f == data_root / "alignments" / "a1__b1.json"
    assert cat.read.stored_alignment("a1", "b1") == {"tokens": 7, "_key": "k"}
    f.write_text("{not json")
    assert cat.read.stored_alignment("a1", "b1") is None
    for bad in ("../x", "a/b", ""):
        with pytest.raises(SpecLensError, match="not a run id"):
            cat.read.stored_alignment(bad, "b1")
        with pytest.raises(SpecLensError, match="not a run id"):
            cat.write.store_alignment("a1", bad, {})


def test_shared_reads_open_the_file_once_and_see_this_process_reindex(data_root, monkeypatch):
    """What app.py wraps every page in: the page's queries share one connection (not one open per query), a rescan or
    a run's re-index by this process is seen by the next query, snapshots inside reuse it, and nothing stays open
    after the scope."""
    from backend.store import catalog as store

    data = DataRoot(data_root)
    _complete(data, "a")
    data.catalog.write.refresh()
    opened = _count_opens(monkeypatch)
    read = data.catalog.read
    with store.shared_reads():
        held = store._SHARED.get()
        for _ in range(4):
            assert read.list_runs()["run_id"].tolist() == ["a"]
        assert len(opened) == 1
        with read.snapshot():
            read.run_states(["a"])
        assert len(opened) == 1
        data.new_run_dir("b", {"kind": "capture", "engine": "hf"}).update(status="complete")
        data.catalog.write.refresh()                                # a rescan that wrote: the next query sees it
        n = len(opened)
        assert sorted(read.list_runs()["run_id"]) == ["a", "b"] and len(opened) == n + 1
        data.run_dir("a").update(status="failed", error="x")
        data.catalog.write.refresh_runs(["a"])                      # one run's state change, through the delta
        assert read.run_states(["a"]).loc[0, "status"] == "failed"
    assert held.cons == {} and store._SHARED.get() is None
    n = len(opened)
    read.list_runs()
    read.list_runs()
    assert len(opened) == n + 2                                     # outside a scope: one open per query, as before


def test_page_scopes_share_one_kept_connection_per_catalog_version(data_root, monkeypatch):
    """A server's page scopes read through cursors of one connection kept per process for the catalog's current
    files: a second page opens no file; another process's rebuilt base, or a run's state change through the delta,
    replaces a file, so the next scope opens the new version and sees it."""
    from backend.store import catalog as store

    data = DataRoot(data_root)
    _complete(data, "a")
    data.catalog.write.refresh()
    opened = _count_opens(monkeypatch)
    read = data.catalog.read
    for _ in range(3):                                              # three page runs
        with store.shared_reads():
            assert read.list_runs()["run_id"].tolist() == ["a"]
    assert len(opened) == 1
    data.new_run_dir("b", {"kind": "capture", "engine": "hf"}).update(status="complete")
    store._refresh(data.paths)                                      # as another process would: no scope dropped
    n = len(opened)
    with store.shared_reads():
        assert sorted(read.list_runs()["run_id"]) == ["a", "b"]
    assert len(opened) == n + 1
    data.run_dir("a").update(status="failed", error="x")
    store._refresh_runs(data.paths, ["a"])                          # through the delta
    n = len(opened)
    with store.shared_reads():
        assert read.run_states(["a"]).loc[0, "status"] == "failed"
        assert read.run_states(["b"]).loc[0, "status"] == "complete"
    with store.shared_reads():
        assert read.run_states(["a"]).loc[0, "status"] == "failed"
    assert len(opened) == n + 1


def test_whole_catalog_lists_are_read_once_per_version_and_handed_out_as_copies(data_root):
    """The pickers' lists and the Runs table (keep=True queries) are read once per process and catalog version inside
    page scopes: a caller changing its frame does not change the next page's; a re-index is seen at once."""
    from backend.store import catalog as store

    data = DataRoot(data_root)
    data.new_run_dir("a", {"kind": "capture", "engine": "hf"}).update(status="complete")
    data.catalog.write.refresh()
    read = data.catalog.read
    with store.shared_reads():
        first = read.run_choices()
        first.loc[0, "status"] = "changed by a caller"
    with store.shared_reads():
        again = read.run_choices()
        assert again["status"].tolist() == ["complete"]
        assert read.list_runs()["run_id"].tolist() == ["a"]
    data.run_dir("a").update(status="failed", error="x")
    data.catalog.write.refresh_runs(["a"])
    with store.shared_reads():
        assert read.run_choices()["status"].tolist() == ["failed"]
        assert read.runs_overview()["status"].tolist() == ["failed"]
    data.new_run_dir("b", {"kind": "capture", "engine": "hf"}).update(status="complete")
    with store.shared_reads():
        data.catalog.write.refresh()                                # a page's rescan that wrote
        assert sorted(read.run_choices()["run_id"]) == ["a", "b"]


def test_a_rescan_that_finds_nothing_opens_no_file_and_still_sees_every_change(data_root, monkeypatch):
    """What a page's rescan costs when nothing changed: the indexed signatures are kept per process for the catalog
    files they came from, so the second rescan opens no DuckDB file; a change made through the delta (a run's state
    change), a rebuilt base, or a manifest edited on disk is still found (each replaces a file, or changes a
    signature the scan compares)."""
    from backend.store import catalog as store

    data = DataRoot(data_root)
    _complete(data, "a", "b")
    data.catalog.write.refresh()
    opened = _count_opens(monkeypatch)
    data.catalog.write.refresh()
    n = len(opened)
    for _ in range(3):
        assert store._plan(data.catalog.paths).empty
    assert len(opened) == n                                      # nothing changed: no file opened
    data.run_dir("a").update(status="failed", error="x")         # a state change, indexed through the delta
    data.catalog.write.refresh_runs(["a"])
    assert store._plan(data.catalog.paths).empty and len(opened) > n   # the delta was replaced: read again
    assert data.catalog.read.run_states(["a"]).loc[0, "status"] == "failed"
    time.sleep(0.01)
    data.run_dir("b").update(status="failed", error="edited on disk")   # not re-indexed by its writer
    plan = store._plan(data.catalog.paths)
    assert [e.run_id for e in plan.changed] == ["b"]
    data.catalog.write.refresh(full=True)                        # a new base: the kept signatures are dropped
    m = len(opened)
    assert store._plan(data.catalog.paths).empty and len(opened) == m + 1
    assert data.catalog.read.run_states(["b"]).loc[0, "status"] == "failed"


def test_kept_results_are_computed_once_per_catalog_version(data_root, monkeypatch):
    """CatalogReader.kept (a comparison, a page's figures): once per version inside page scopes, again after a re-index;
    outside a scope every time. ui.kept hands out copies that share the plotly figures."""
    import plotly.graph_objects as go

    from backend.store import catalog as store
    from dashboard import ui

    monkeypatch.setenv("SPECLENS_DATA", str(data_root))
    data = DataRoot(data_root)
    data.new_run_dir("a", {"kind": "capture", "engine": "hf"}).update(status="complete")
    data.catalog.write.refresh()
    read = data.catalog.read
    ran = []
    compute = lambda: ran.append(1) or (go.Figure(), {"words": ["x"]})  # noqa: E731
    assert read.version() is None
    read.kept("t", (1,), compute)
    read.kept("t", (1,), compute)
    assert len(ran) == 2                                            # outside a page scope
    with store.shared_reads():
        first = ui.kept("t", (1,), compute)
        first[1]["words"].append("changed by a caller")
        again = ui.kept("t", (1,), compute)
        assert len(ran) == 3 and again[1] == {"words": ["x"]} and again[0] is first[0]
        ui.kept("t", (2,), compute)
        assert len(ran) == 4
    data.new_run_dir("b", {"kind": "capture", "engine": "hf"}).update(status="complete")
    data.catalog.write.refresh()
    with store.shared_reads():
        ui.kept("t", (1,), compute)
    assert len(ran) == 5


def test_a_rescan_of_one_run_reads_only_that_run_and_sees_what_a_full_rescan_would(data_root, monkeypatch):
    """refresh_changed (the rescan of a page about the runs its link names): a named run is re-indexed when its
    directory changed (rewritten on disk, removed, new), so is any run indexed as running whose process is gone,
    named or not; other runs' hand edits are left to a full rescan, and no other run directory is looked at."""
    import os

    from backend.store import catalog as store

    data = DataRoot(data_root)
    _complete(data, "a", "b", "c")
    data.new_run_dir("live", {"kind": "capture", "engine": "hf"}).update(pid=os.getpid())   # running, process alive
    data.catalog.write.refresh()
    write, read = data.catalog.write, data.catalog.read
    assert write.refresh_changed(["a", "live"]) == []                    # nothing changed: nothing written
    time.sleep(0.01)
    data.run_dir("a").update(status="failed", error="edited on disk")
    data.run_dir("b").update(status="failed", error="edited too")
    stats = []
    real = store._entry
    monkeypatch.setattr(store, "_entry", lambda p, rid: stats.append(rid) or real(p, rid))
    assert write.refresh_changed(["a"]) == ["a"]
    assert set(stats) == {"a", "live"}                       # the named run and the running one, no other
    states = read.run_states(["a", "b"]).set_index("run_id")["status"]
    assert states["a"] == "failed" and states["b"] == "complete"          # b waits for a full rescan
    data.run_dir("live").update(pid=2**22 + 12345)                        # its process is gone
    assert write.refresh_changed(["a"]) == ["live"]                       # found without being named
    assert read.run_states(["live"]).loc[0, "status"] == "interrupted"
    _complete(data, "new")                                                # written beside the catalog, not indexed
    assert write.refresh_changed(["new", "nope", "../x"]) == ["new"]
    assert "new" in read.run_choices()["run_id"].tolist()
    import shutil
    shutil.rmtree(data_root / "runs" / "c")
    assert write.refresh_changed(["c"]) == ["c"]
    assert "c" not in read.run_choices()["run_id"].tolist()
    monkeypatch.setattr(store, "_entry", real)
    write.refresh()                                                       # the full rescan then finds only b
    assert read.run_states(["b"]).loc[0, "status"] == "failed"
