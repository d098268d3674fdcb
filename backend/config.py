"""Where SpecLens keeps its files and what it may change. SPECLENS_DATA (default ./data) moves everything;
the dashboard is read-only unless SPECLENS_READONLY=0 (SPECLENS_READONLY=1 refuses annotation writes
everywhere); SPECLENS_ALLOW_JOBS=1 lets it submit
jobs and SPECLENS_MODEL_ROOTS confines the paths job specs may name. SPECLENS_URL is where the dashboard is served,
for the links the command line prints (dashboard_url)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Paths:
    root: Path

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def catalog(self) -> Path:
        return self.root / "speclens.duckdb"

    @property
    def alignments(self) -> Path:
        return self.root / "alignments"

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def queue(self) -> Path:
        """The job queue (backend/jobs/queue.py)."""
        return self.root / "queue"


def data_root() -> Path:
    """The data root: $SPECLENS_DATA if set, else <repo>/data."""
    env = os.environ.get("SPECLENS_DATA")
    return Path(env).expanduser().resolve() if env else REPO_ROOT / "data"


def paths(root: Path | str | None = None) -> Paths:
    return Paths(Path(root).resolve() if root is not None else data_root())


def read_only() -> bool:
    """The dashboard edits nothing unless SPECLENS_READONLY=0 (or false/no/off): read-only by default. Pages hide
    their edit widgets through it (annotations.editable); with [auth] secrets editing also needs a login
    (dashboard/auth.py)."""
    return os.environ.get("SPECLENS_READONLY", "").strip().lower() not in ("0", "false", "no", "off")


def writes_refused() -> bool:
    """SPECLENS_READONLY=1 (or true/yes/on) set explicitly: annotation writes are refused everywhere, library and
    scripts included (backend/annotations.py), not only hidden in the dashboard."""
    return os.environ.get("SPECLENS_READONLY", "").strip().lower() in ("1", "true", "yes", "on")


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def jobs_enabled() -> bool:
    """SPECLENS_ALLOW_JOBS=1: the dashboard's New run page may submit jobs (still refused when read_only())."""
    return _flag("SPECLENS_ALLOW_JOBS")


def model_roots(where: Paths | None = None) -> list[Path]:
    """Where job specs may read models, drafters and prompts from: SPECLENS_MODEL_ROOTS (paths separated by
    os.pathsep), default the data root (`where`'s, else the environment's) and <repo>/models. Prompts may also come
    from <repo>/datasets."""
    env = os.environ.get("SPECLENS_MODEL_ROOTS", "").strip()
    if env:
        return [Path(p).expanduser().resolve() for p in env.split(os.pathsep) if p.strip()]
    return [where.root if where is not None else data_root(), REPO_ROOT / "models"]


DEFAULT_PORT = 8501          # Streamlit's default, what `make demo` and `make serve` use unless PORT= is given


def dashboard_url() -> str:
    """The dashboard's address, for the links the command line prints: SPECLENS_URL (e.g. http://gpu-node:8600/
    behind a proxy), else http://localhost:<port> with the port Streamlit is configured with (STREAMLIT_SERVER_PORT,
    else `[server] port` in .streamlit/config.toml), else 8501."""
    url = os.environ.get("SPECLENS_URL", "").strip()
    if url:
        return url.rstrip("/")
    port = os.environ.get("STREAMLIT_SERVER_PORT", "").strip()
    if not port.isdigit():
        try:
            import tomllib

            with open(REPO_ROOT / ".streamlit" / "config.toml", "rb") as f:
                port = str((tomllib.load(f).get("server") or {}).get("port") or "")
        except (OSError, ValueError):
            port = ""
    return f"http://localhost:{port if port.isdigit() else DEFAULT_PORT}"


def dashboard_link(path: str) -> str:
    """A dashboard path ('/drafter?run=x') as a full link on the configured address (dashboard_url)."""
    return dashboard_url() + "/" + path.lstrip("/")
