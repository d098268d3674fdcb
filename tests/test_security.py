"""Security of the dashboard, on real runs (tests/conftest.py build_bench_data) through streamlit's AppTest:

- read-only by default: no edit widget and no write unless SPECLENS_READONLY=0; SPECLENS_READONLY=1 refuses writes
  in the library too;
- URL parameters never reach files outside the data root: every parameter of every page gets `..` traversals,
  absolute paths and encoded variants; a Python audit hook records every file the process opens or lists, and
  none lies in a sentinel run directory next to the data root (nor /etc/passwd), whose secret never shows;
- URL parameters, tags and notes never build SQL: every statement DuckDB receives in the process is recorded, and
  the injection marker appears in none of them (values travel as bound parameters); the catalog stays whole;
- optional OIDC login (dashboard/auth.py): with an [auth] secrets section, editing needs st.user.is_logged_in.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import duckdb
import pytest
from streamlit.testing.v1 import AppTest

from backend import annotations
from backend.config import REPO_ROOT
from backend.errors import SpecLensError
from backend.store.data_root import DataRoot
from dashboard import auth

APP = str(REPO_ROOT / "app.py")
SECRET = "SENTINEL-5d1c-outside-the-data-root"
MARK = "INJ7q"
INJECTIONS = [f"{MARK}' OR '1'='1", f"{MARK}'); DROP TABLE runs; --", f'{MARK}" OR 1=1 --',
              f"{MARK}'; COPY runs TO '/tmp/{MARK}.csv'; --",
              f"{MARK}' UNION SELECT * FROM read_text('/etc/passwd') --",
              f"{MARK}\\'; ATTACH '/tmp/{MARK}.db'; --"]
PAGE_PARAMS = {
    "pages/runs.py": ["run", "kind", "status", "engine", "version", "target", "drafter", "dataset", "tag", "lint"],
    "pages/compare.py": ["runs", "baseline"],
    "pages/alignment.py": ["a", "b", "metric"],
    "pages/stats.py": ["runs", "stat", "run"],
    "pages/run.py": ["id", "category", "q", "sort"],
    "pages/load.py": ["run", "runs", "pct"],
}
AUTH = {"redirect_uri": "http://localhost:8501/oauth2callback", "cookie_secret": "x" * 32, "client_id": "speclens",
        "client_secret": "s", "server_metadata_url": "https://idp.example/.well-known/openid-configuration"}


# ---------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture
def world(bench_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """A data root with the bench runs and a capture, and next to it (outside it) a run directory holding a
    secret: `<tmp>/outside/runs/evil`. SPECLENS_READONLY unset: the default."""
    root = tmp_path / "data"
    shutil.copytree(bench_root / "runs", root / "runs")
    shutil.copytree(REPO_ROOT / "tests" / "data" / "recorded" / "load" / "h200-vllm-pair",   # for the load page
                    root / "runs" / "h200-vllm-pair")
    DataRoot(root).catalog.write.refresh()
    evil = tmp_path / "outside" / "runs" / "evil"
    evil.mkdir(parents=True)
    m = json.loads((root / "runs" / "cap-tiny" / "manifest.json").read_text())
    (evil / "manifest.json").write_text(json.dumps({**m, "run_id": "evil", "notes": SECRET, "dataset": SECRET}))
    for f in ("stats.parquet", "stats.safetensors", "sample.safetensors"):
        shutil.copy(root / "runs" / "cap-tiny" / f, evil / f)
    (evil / "annotations.json").write_text(json.dumps({"tags": ["stolen"], "notes": SECRET}))
    monkeypatch.setenv("SPECLENS_DATA", str(root))
    monkeypatch.delenv("SPECLENS_READONLY", raising=False)
    monkeypatch.delenv("SPECLENS_REQUIRE_LOGIN", raising=False)
    return {"root": root, "outside": tmp_path / "outside", "evil": evil}


def traversals(world: dict) -> list[str]:
    evil, outside = world["evil"], world["outside"]
    return ["../../outside/runs/evil", "..%2F..%2Foutside%2Fruns%2Fevil", "../evil", "..", "../..", str(evil),
            f"file://{evil}", "/etc/passwd", "../../../../../../etc/passwd", "..%2F..%2F..%2Fetc%2Fpasswd",
            "%2e%2e%2f%2e%2e%2fetc%2fpasswd", "....//....//etc/passwd", "cap-tiny/../../../outside/runs/evil",
            "..\\..\\outside\\runs\\evil", "cap-tiny\x00../../etc/passwd", f"{outside}/runs/evil/manifest.json",
            "~/.ssh/id_rsa", "cap-tiny,../../outside/runs/evil,/etc/passwd"]


class FileLog:
    """Every path this process opens or lists while active (a Python audit hook: sys.addaudithook)."""

    installed: FileLog | None = None

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.active = False

    @classmethod
    def get(cls) -> FileLog:
        if cls.installed is None:
            log = cls()

            def hook(event: str, args: tuple) -> None:
                if log.active and event in ("open", "os.listdir", "os.scandir", "os.symlink", "os.rename",
                                             "os.remove", "shutil.copyfile", "shutil.rmtree"):
                    if args and isinstance(args[0], (str, bytes, Path)):
                        log.paths.append(str(args[0]))
            sys.addaudithook(hook)
            cls.installed = log
        return cls.installed

    def __enter__(self) -> FileLog:
        self.paths, self.active = [], True
        return self

    def __exit__(self, *exc) -> None:
        self.active = False


def outside_touches(paths: list[str], world: dict) -> list[str]:
    out = str(world["outside"].resolve())
    return [p for p in paths if p.startswith(out) or str(Path(p).resolve()).startswith(out)
            or p in ("/etc/passwd", "/etc/shadow") or ".ssh" in p]


def run_page(page: str, params: dict[str, str], *, user: dict | None = None, secrets: dict | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    for k, v in params.items():
        at.query_params[k] = v
    if user is not None:
        at.user = user
    if secrets:
        at.secrets = secrets
    at.switch_page(page)
    at.run()
    assert not at.exception, (page, params, [e.value for e in at.exception])
    return at


def shown_text(at: AppTest) -> str:
    """Everything a page shows as text (alerts, markdown, captions, table cells)."""
    parts = []
    for kind in ("markdown", "caption", "error", "warning", "info", "success", "title", "subheader", "text"):
        parts += [str(e.value) for e in at.get(kind)]
    for df in at.dataframe:
        parts.append(df.value.to_csv())
    return "\n".join(parts)


class SqlLog:
    """Every SQL statement any DuckDB connection of this process receives (duckdb.connect wrapped)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sql: list[str] = []
        real = duckdb.connect
        log = self

        class Con:
            def __init__(self, con):
                self._con = con

            def execute(self, sql, params=None):
                log.sql.append(str(sql))
                return self._con.execute(sql, params) if params is not None else self._con.execute(sql)

            def sql(self, query, *a, **k):
                log.sql.append(str(query))
                return self._con.sql(query, *a, **k)

            def __getattr__(self, name):
                return getattr(self._con, name)

        monkeypatch.setattr(duckdb, "connect", lambda *a, **k: Con(real(*a, **k)))


def catalog_whole(root: Path, n: int) -> None:
    con = duckdb.connect()
    con.execute("ATTACH ? AS c (READ_ONLY)", [str(root / "speclens.duckdb")])
    tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'c'").fetchall()}
    assert {"runs", "boundary_stats", "bench_runs", "bench_prompts", "bench_steps", "catalog_meta"} <= tables
    assert con.execute("SELECT count(*) FROM c.runs").fetchone()[0] == n
    con.close()
    assert not list(Path("/tmp").glob(f"{MARK}*")), "an injected COPY/ATTACH wrote a file"


# ---------------------------------------------------------------------------- read-only by default


def test_dashboard_is_read_only_by_default(world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_page("pages/runs.py", {"run": "spec-oracle"})
    assert not at.text_input and not at.text_area and not [b for b in at.button if b.label == "Save"]
    assert "Tags, notes and baseline" not in shown_text(at)
    assert not annotations.editable()
    before = sorted(p.name for p in (world["root"] / "runs").rglob("*"))
    run_page("pages/compare.py", {"runs": "spec-oracle,spec-random", "baseline": "pinned"})
    assert sorted(p.name for p in (world["root"] / "runs").rglob("*")) == before, "a page wrote into a run directory"

    monkeypatch.setenv("SPECLENS_READONLY", "0")               # enabled explicitly: the editor is there
    at = run_page("pages/runs.py", {"run": "spec-oracle"})
    assert at.text_input(key="tags_spec-oracle") and [b for b in at.button if b.label == "Save"]

    monkeypatch.setenv("SPECLENS_READONLY", "1")               # refused outright, also outside the dashboard
    with pytest.raises(SpecLensError, match="read-only"):
        annotations.save("spec-oracle", notes="x", data=DataRoot(world["root"]))
    assert annotations.read("spec-oracle", DataRoot(world["root"])).notes == "scripted proposals"


# ---------------------------------------------------------------------------- path traversal


@pytest.mark.parametrize("page,editing", [(p, False) for p in sorted(PAGE_PARAMS)] + [("pages/runs.py", True)])
def test_url_params_never_reach_files_outside_the_data_root(world: dict, page: str, editing: bool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Every (parameter, traversal) pair of the page: run i gives parameter j the value (i + j) mod V, so V runs
    cover them all. With editing enabled the Runs page also reads ?run= for its editor."""
    if editing:
        monkeypatch.setenv("SPECLENS_READONLY", "0")
    log, values, params = FileLog.get(), traversals(world), PAGE_PARAMS[page]
    for i in range(len(values)):
        query = {p: values[(i + j) % len(values)] for j, p in enumerate(params)}
        with log:
            at = run_page(page, query)
        touched = outside_touches(log.paths, world)
        assert not touched, (page, query, touched[:3])
        assert SECRET not in shown_text(at) and "stolen" not in shown_text(at), (page, query)
    assert log.paths, "the audit hook records file access"
    with log:                                                  # positive control: a real read outside is seen
        (world["evil"] / "manifest.json").read_text()
    assert outside_touches(log.paths, world)


def test_backend_refuses_run_ids_that_leave_the_runs_folder(world: dict) -> None:
    from backend.align import get_alignment

    root = world["root"]
    log = FileLog.get()
    for value in traversals(world):
        with log:
            for call in (lambda v=value: DataRoot(root).run_dir(v), lambda v=value: annotations.read(v, DataRoot(root)),
                         lambda v=value: get_alignment(v, "cap-tiny", DataRoot(root)),
                         lambda v=value: get_alignment("cap-tiny", v, DataRoot(root))):
                with pytest.raises(SpecLensError):
                    call()
            assert DataRoot(root).catalog.read.get_run(value) is None
            assert DataRoot(root).catalog.read.boundary_stats([value]).empty
        assert not outside_touches(log.paths, world), (value, outside_touches(log.paths, world)[:3])
    monkeypatch_free = world["root"] / "alignments"
    assert not monkeypatch_free.exists() or all(p.parent == monkeypatch_free for p in monkeypatch_free.rglob("*"))
    with pytest.raises(SpecLensError):
        annotations.save("../../outside/runs/evil", notes="x", data=DataRoot(root))
    assert json.loads((world["evil"] / "annotations.json").read_text())["notes"] == SECRET


# ---------------------------------------------------------------------------- SQL injection


def test_url_params_never_build_sql(world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    sql = SqlLog(monkeypatch)
    n = len(DataRoot(world["root"]).catalog.read.list_runs())
    for page, params in PAGE_PARAMS.items():
        for inj in INJECTIONS[:3]:
            run_page(page, {p: inj for p in params})
        run_page(page, {params[0]: ",".join(INJECTIONS)})
    assert sql.sql, "the SQL log records the pages' queries"
    duckdb.connect().execute(f"SELECT '{MARK}'")               # positive control: SQL text with the marker is seen
    assert [s for s in sql.sql if MARK in s]
    sql.sql.clear()
    run_page("pages/runs.py", {"kind": INJECTIONS[0]})
    assert not [s for s in sql.sql if MARK in s], "a URL value became SQL text"
    catalog_whole(world["root"], n)


def test_catalog_calls_bind_injection_strings(world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    root = world["root"]
    sql = SqlLog(monkeypatch)
    n = len(DataRoot(root).catalog.read.list_runs())
    for inj in INJECTIONS:
        read = DataRoot(root).catalog.read
        assert read.list_runs(kind=inj).empty and read.list_runs(status=inj).empty
        assert read.get_run(inj) is None and read.run_manifests([inj]) == {}
        assert read.run_states([inj, "spec-oracle"])["run_id"].tolist() == ["spec-oracle"]
        for fn in (read.boundary_stats, read.bench_prompts, read.bench_steps, read.bench_histogram,
                   read.bench_categories, read.bench_prompt_speeds):
            assert fn([inj]).empty, fn.__name__
        assert read.bench_runs(status=inj).empty and read.bench_runs(run_ids=[inj]).empty
    assert not [s for s in sql.sql if MARK in s]
    catalog_whole(root, n)


def test_tags_and_notes_never_build_sql(world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """With editing enabled: an injection string as notes is stored and shown literally; as tags it is refused;
    neither reaches SQL text, also when the catalog ingests them."""
    root = world["root"]
    monkeypatch.setenv("SPECLENS_READONLY", "0")
    sql = SqlLog(monkeypatch)
    n = len(DataRoot(root).catalog.read.list_runs())
    for i, inj in enumerate(INJECTIONS[:3]):
        at = run_page("pages/runs.py", {"run": "spec-random"})
        at.text_input(key="tags_spec-random").input(inj)
        (save,) = [b for b in at.button if b.label == "Save"]
        at = save.click().run()
        assert not at.exception and "not allowed" in "\n".join(e.value for e in at.error)
        at = run_page("pages/runs.py", {"run": "spec-random"})
        at.text_area(key="notes_spec-random").input(inj)
        at.text_input(key="tags_spec-random").input(f"ok-{i}")
        (save,) = [b for b in at.button if b.label == "Save"]
        at = save.click().run()
        assert not at.exception and not at.error
        row = DataRoot(root).catalog.read.get_run("spec-random")
        assert row["notes"] == inj and row["tags"] == f"ok-{i}"
        at = run_page("pages/runs.py", {"tag": f"ok-{i}"})
        assert at.dataframe[0].value["run_id"].tolist() == ["spec-random"]
    DataRoot(root).catalog.write.refresh(full=True)
    assert DataRoot(root).catalog.read.get_run("spec-random")["notes"] == INJECTIONS[2]
    assert not [s for s in sql.sql if MARK in s]
    catalog_whole(root, n)


# ---------------------------------------------------------------------------- optional OIDC login


def test_without_auth_secrets_login_is_off(world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not auth.configured()                  # no .streamlit/secrets.toml: never raises
    monkeypatch.setenv("SPECLENS_READONLY", "0")
    at = run_page("pages/runs.py", {"run": "spec-oracle"})
    assert at.text_input(key="tags_spec-oracle") and not [b for b in at.button if b.label == "Log in"]
    monkeypatch.setenv("SPECLENS_REQUIRE_LOGIN", "1")             # fail closed when login is required
    at = run_page("pages/runs.py", {"run": "spec-oracle"})
    assert not at.text_input and "no [auth] section" in "\n".join(e.value for e in at.error)


def test_with_auth_secrets_editing_needs_a_login(world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECLENS_READONLY", "0")
    secrets = {"auth": AUTH}
    at = run_page("pages/runs.py", {"run": "spec-oracle"}, user={"is_logged_in": False}, secrets=secrets)
    assert not at.text_input and not at.text_area and not [b for b in at.button if b.label == "Save"]
    assert [b for b in at.button if b.label == "Log in"]
    assert "Log in to edit" in "\n".join(e.value for e in at.info)
    assert len(at.dataframe[0].value) == 5, "reading stays open"          # 4 bench/capture runs + 1 load run

    at = run_page("pages/runs.py", {"run": "spec-oracle"}, user={"is_logged_in": True, "email": "a@b.c"},
                  secrets=secrets)
    assert at.text_input(key="tags_spec-oracle") and not [b for b in at.button if b.label == "Log in"]

    monkeypatch.delenv("SPECLENS_READONLY")                        # logged in, but read-only by default
    at = run_page("pages/runs.py", {"run": "spec-oracle"}, user={"is_logged_in": True, "email": "a@b.c"},
                  secrets=secrets)
    assert not at.text_input


def test_require_login_stops_a_page(tmp_path: Path) -> None:
    """require_login() (for the New run page): logged out with [auth] configured, the page stops after the login
    button; logged in, it goes on."""
    script = tmp_path / "guarded_page.py"
    script.write_text("import streamlit as st\nfrom dashboard import auth\nauth.require_login('submit jobs')\n"
                      "st.write('SECRET-FORM')\n")
    at = AppTest.from_file(str(script))
    at.secrets = {"auth": AUTH}
    at.user = {"is_logged_in": False}
    at.run()
    assert not at.exception and "SECRET-FORM" not in [m.value for m in at.markdown]
    assert [b for b in at.button if b.label == "Log in"]
    at = AppTest.from_file(str(script))
    at.secrets = {"auth": AUTH}
    at.user = {"is_logged_in": True, "email": "a@b.c"}
    at.run()
    assert "SECRET-FORM" in [m.value for m in at.markdown] and "a@b.c" in at.caption[0].value
