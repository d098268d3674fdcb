"""What every engine release feeds a drafter: engine x release x runner -> boundaries, from config files alone.

`python -m backend feeds --drafter D --target T [--json]` and the Feeds page. Each row is one vLLM release
(runners V1 and V2, the one vLLM itself picks for this target marked) or SGLang release, read through
backend/conventions.yaml (rows derived from the released wheels by tools/rederive_conventions.py; `status` says
whether a run on real hardware showed it). When a stored drafter check (backend/check_drafter.py, a full check,
not lint-only) of this drafter and target found what it was trained on, each row is marked `matches` or `differs`.
`changes` lists, per engine, the first release where the boundaries fed with the picked runner changed.
No torch, no model loaded."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from backend import coords
from backend.errors import SpecLensError
from backend.options import ENGINE_LABELS, RUNNER_ENGINE, SERVING_ENGINES, VLLM_RUNNERS
from backend.runs.manifest import CheckInfo, DrafterInfo, ModelInfo, StoredManifest
from backend.store.data_root import DataRoot

ENGINES = SERVING_ENGINES


def engine_name(engine: str) -> str:
    return ENGINE_LABELS.get(engine, engine)


@dataclass
class FeedRow:
    engine: str
    release: str
    runner: str | None              # "v1" | "v2" for vLLM
    picked: bool                    # the runner this vLLM release picks for the target (SGLang: always)
    why: str                        # why that runner (vLLM); where ids are read (SGLang)
    ids: list[int] | None           # ids read from the drafter config (None: the engine's default)
    ids_from: str | None
    feeds: list[str] | None         # boundaries fed (None: cannot serve, see error)
    error: str | None = None
    status: str = "inferred"        # seen | inferred (the conventions row)
    decided_by: dict = field(default_factory=dict)
    trained: str | None = None      # matches | differs | None (no drafter check)

    def to_json(self) -> dict:
        return asdict(self)


def trained_on(drafter: str | Path, target: str | Path, data: DataRoot | None = None) -> dict | None:
    """The newest complete full drafter check of this drafter and target that found trained-on boundaries:
    {run_id, boundaries, severity}; None when there is none."""
    d, t = str(Path(drafter).resolve()), str(Path(target).resolve())
    for run_id, raw in DataRoot.of(data).catalog.read.check_manifests().items():
        m = StoredManifest.indexed(raw)
        chk = m.check or CheckInfo()
        if chk.mode == "lint" or not chk.best:
            continue
        if _path(m.drafter_info) == d and _path(m.model) == t:
            return {"run_id": run_id, "boundaries": list(chk.best), "severity": chk.severity}
    return None


def _path(section: DrafterInfo | ModelInfo | None) -> str | None:
    return section.path if section is not None else None


def check_pair(run_id: str, data: DataRoot | None = None) -> tuple[str, str]:
    """(drafter, target) paths of a stored drafter check run."""
    raw = DataRoot.of(data).catalog.read.check_manifests().get(run_id)
    if raw is None:
        raise SpecLensError(f"no complete drafter check run '{run_id}'; list them with `python -m backend runs`")
    m = StoredManifest.indexed(raw)
    drafter, target = _path(m.drafter_info), _path(m.model)
    if not drafter or not target:
        raise SpecLensError(f"drafter check '{run_id}' records no drafter or target path; run the check again")
    return drafter, target


def matrix(drafter: str | Path, target: str | Path, data: DataRoot | None = None, trained: dict | None = None,
           look_up_check: bool = True, env: dict | None = None) -> dict:
    """The feeds matrix of a drafter on a target (see the module docstring). `env` is the environment vLLM would
    see (default: none set, i.e. VLLM_USE_V2_MODEL_RUNNER unset)."""
    from backend import vllm_runner
    from backend.drafter import lint as L
    from backend.drafter.aux import drafter_aux_boundaries, kind_aux
    from backend.drafter.kinds import runner_args

    cfg, tgt, _ = L.load(drafter, target, weights_required=False)
    kind = getattr(cfg, "kind", "eagle3")
    if trained is None and look_up_check:
        trained = trained_on(drafter, target, data)
    want = trained["boundaries"] if trained else None
    rows: list[FeedRow] = []
    for engine in ENGINES:
        for rel in coords.releases(engine):
            choice = None
            if engine == "vllm":
                choice = vllm_runner.resolve("auto", tgt.architectures, rel, env=env or {},
                                             target_config=tgt.raw or None, **runner_args(kind))
            for rn in (VLLM_RUNNERS if engine == "vllm" else (None,)):
                conv = coords.convention_for(engine, rel, tgt.family, rn)
                picked = choice is None or rn == choice.runner
                why = choice.reason if choice and picked else (
                    f"not picked: vLLM {rel} uses {choice.runner.upper()}" if choice else
                    f"ids read from {conv.ids_from.get('any', '?')}")
                seen = conv.status == "seen" and f"{engine_name(engine)} {rel} " in conv.seen  # row seen for rel?
                row = FeedRow(engine, rel, rn, picked, why, None, None, None, status="seen" if seen else "inferred",
                              decided_by=dict(conv.decided_by))
                try:
                    aux = (kind_aux(cfg, tgt, engine, rel, rn) if kind != "eagle3" else
                           drafter_aux_boundaries(cfg, tgt.n_layers, tgt.model_type, engine, rel, rn))
                    row.ids, row.ids_from, row.feeds = aux["ids"], aux["ids_from"], aux["boundaries"]
                    if engine == "sglang" and cfg.source_format not in ("eagle", "dflash", "dflash2", "mtp"):
                        row.error = (f"SGLang loads only the EAGLE/SpecForge format; this is {cfg.source_format} "
                                     f"(it would feed {', '.join(row.feeds)} once converted)")
                        row.feeds = None
                except SpecLensError as e:
                    row.error = str(e)
                if want is not None and row.feeds is not None:
                    row.trained = "matches" if row.feeds == want else "differs"
                rows.append(row)
    return {"drafter": str(Path(drafter).resolve()), "target": str(Path(target).resolve()),
            "target_info": {"architectures": tgt.architectures, "model_type": tgt.model_type,
                            "n_layers": tgt.n_layers, "family": tgt.family},
            "drafter_ids": {"top_level": cfg.aux_layer_ids_top, "eagle_config": cfg.aux_layer_ids_nested,
                            "format": cfg.source_format, "kind": kind},
            "trained_on": trained, "rows": [r.to_json() for r in rows], "changes": changes(rows)}


def _fed(r: FeedRow) -> str:
    return ", ".join(r.feeds) if r.feeds else "cannot serve"


def changes(rows: list[FeedRow]) -> list[dict]:
    """Per engine (and per vLLM runner, and for the runner vLLM picks): each release where what is fed changed
    from the release before; `first` marks the first such change."""
    out = []
    tracks = [*((e, None) for e in SERVING_ENGINES if e != RUNNER_ENGINE), (RUNNER_ENGINE, "picked"),
              *((RUNNER_ENGINE, r) for r in VLLM_RUNNERS)]
    for engine, track in tracks:
        seq = [r for r in rows if r.engine == engine and
               (track is None or (r.picked if track == "picked" else r.runner == track))]
        first = True
        for prev, cur in zip(seq, seq[1:]):
            if prev.feeds != cur.feeds:                # what is fed; a runner switch alone changes nothing fed
                what = f"{_fed(prev)} -> {_fed(cur)}"
                if track == "picked" and prev.runner != cur.runner:
                    what += f" (runner {prev.runner.upper()} -> {cur.runner.upper()})"
                out.append({"engine": engine, "track": track or "-", "from": prev.release, "release": cur.release,
                            "first": first, "change": what})
                first = False
    return out


@dataclass
class Newest:
    """What the newest release of one engine feeds on the runner it picks (`row`), and each release where the
    answer on that runner changed (`changes`: `changes()` rows of its picked track, oldest first)."""

    engine: str
    row: FeedRow
    changes: list[dict]


@dataclass
class Summary:
    """What a matrix says in short, as data (backend/text/feeds_text.py words it, for the Feeds page and the
    command line alike): the drafter's kind when it is not EAGLE-3, each serving engine's newest release,
    and the drafter check the rows are marked against (`trained_on`: boundaries and run_id; None: no full check)."""

    kind: str | None
    newest: list[Newest]
    trained_on: dict | None


def summary(m: dict) -> Summary:
    """The matrix `m` (matrix()) in short: see `Summary`."""
    kind = (m.get("drafter_ids") or {}).get("kind", "eagle3")
    rows = [FeedRow(**r) for r in m["rows"]]
    newest = []
    for engine in ENGINES:
        picked = [r for r in rows if r.engine == engine and r.picked]
        if picked:
            ch = [c for c in m["changes"] if c["engine"] == engine and c["track"] in ("picked", "-")]
            newest.append(Newest(engine, picked[-1], ch))
    return Summary(kind if kind != "eagle3" else None, newest, m.get("trained_on"))


def page_pair(drafter: str | None, target: str | None, check: str | None,
              data: DataRoot | None = None) -> tuple[str, str]:
    """The (drafter, target) a Feeds page URL names: a stored drafter check's pair (?check=RUN), or directories
    (?drafter=&target=) that lie under SPECLENS_MODEL_ROOTS (default: the data root and <repo>/models) or belong
    to a stored drafter check; anything else is refused with one line (a URL must not read arbitrary files)."""
    from backend.config import model_roots

    data = DataRoot.of(data)
    if check:
        return check_pair(check, data)
    if not drafter or not target:
        raise SpecLensError("name a drafter and a target (?drafter=DIR&target=DIR) or a drafter check (?check=RUN)")
    checks = [StoredManifest.indexed(m) for m in data.catalog.read.check_manifests().values()]
    known = {p for m in checks for p in (_path(m.drafter_info), _path(m.model))}
    roots = model_roots()
    for p in (drafter, target):
        rp = Path(p).expanduser().resolve()
        if str(rp) not in known and not any(rp == r or r in rp.parents for r in roots):
            raise SpecLensError(f"{p}: not under SPECLENS_MODEL_ROOTS ({', '.join(map(str, roots))}) and not part of a "
                                f"stored drafter check; run `python -m backend feeds --drafter D --target T` instead")
    return str(Path(drafter).expanduser().resolve()), str(Path(target).expanduser().resolve())
