"""Import EAGLE-3 training data written by other tools as a capture run (`python -m backend import-capture`).

Each format's layer ids are turned into boundary labels through the conventions table (backend/coords.py),
so an imported run can be aligned against any other capture. Files are streamed one at a time: memory is
bounded by the statistics and the token sample, whatever the number of files.

- `speculators` (>=0.5), `hs_*.safetensors`: `hidden_states [T, L, H]` (ascending, L = k aux + teacher S_N),
  `token_ids [T]`; id a -> S_a.
- `vllm-extract`, `hs_*.safetensors`: the same files; the ids name all L layers, the last included; id a -> S_a.
- `speculators-legacy` (<=0.4), `data_*.pt`: `input_ids [T]`, `hidden_states` L x `[T, H]` (teacher S_N last),
  `loss_mask [T]`; id a -> S_{a+1}.
- `specforge` (0.2), `data_*.ckpt` (also under `rows_*/`): `input_ids [T]`, `loss_mask [T]`,
  `hidden_state [1, T, H]` (= F), `aux_hidden_state [1, T, k*H]`; id a -> S_{a+1}.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from backend import coords
from backend.capture import CaptureResult, write_capture_files
from backend.errors import SpecLensError
from backend.stats import StreamingStats, TokenSample
from backend.store import catalog
from backend.store.rundir import RunDir, new_run_id

SAMPLE_TOKENS, SAMPLE_PER_SEQ = 4096, 512
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
IDS_KEY = "eagle_aux_hidden_state_layer_ids"


@dataclass
class Record:
    """One sequence read from one file."""

    token_ids: torch.Tensor        # [T] int64
    states: list[torch.Tensor]     # L x [T, H], file order: aux ascending, teacher last


@dataclass(frozen=True)
class Format:
    name: str
    producer: str                  # conventions.yaml producer
    version: str                   # a version inside the convention's range (for the lookup)
    glob: str                      # data files (searched recursively)
    read: Callable[[Path], Record]
    ids_name_all: bool = False     # vllm-extract: the ids list every captured layer, the last included


# ---------------------------------------------------------------------------- readers

def _bad(f: Path, what: str, fix: str = "re-create this file or remove it from the directory") -> SpecLensError:
    return SpecLensError(f"{f}: {what}; {fix}")


def _tensor(f: Path, d: dict, key: str, ndim: int) -> torch.Tensor:
    x = d.get(key)
    if not isinstance(x, torch.Tensor):
        raise _bad(f, f"no tensor '{key}' (keys: {', '.join(map(str, d)) or 'none'})")
    if x.dim() != ndim:
        raise _bad(f, f"'{key}' has shape {list(x.shape)}, expected {ndim} dimensions")
    return x


def _tokens(f: Path, tok: torch.Tensor, t: int) -> torch.Tensor:
    if tok.shape[0] != t:
        raise _bad(f, f"{tok.shape[0]} token ids but hidden states for {t} tokens")
    if tok.is_floating_point():
        raise _bad(f, f"token ids are {tok.dtype}, expected integers")
    return tok.to(torch.int64)


def read_hs(f: Path) -> Record:
    """speculators >= 0.5 / vLLM extract_hidden_states: hidden_states [T, L, H], token_ids [T]."""
    from safetensors.torch import load_file

    try:
        d = load_file(str(f))
    except Exception as e:  # SafetensorError, OSError, ...: the first line names the problem
        raise _bad(f, f"corrupt safetensors file ({_first_line(e)})") from e
    hs = _tensor(f, d, "hidden_states", 3)                       # [T, L, H]
    tok = _tokens(f, _tensor(f, d, "token_ids", 1), hs.shape[0])
    return Record(tok, list(hs.unbind(dim=1)))


def _torch_load(f: Path) -> dict:
    try:
        d = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError, RuntimeError, EOFError, zipfile errors
        raise _bad(f, f"corrupt torch.save file ({type(e).__name__}: {_first_line(e)})") from e
    if not isinstance(d, dict):
        raise _bad(f, f"holds a {type(d).__name__}, expected a dict of tensors")
    return d


def read_legacy(f: Path) -> Record:
    """speculators <= 0.4: {input_ids [T], hidden_states list of L x [T, H], loss_mask [T]}."""
    d = _torch_load(f)
    hs = d.get("hidden_states")
    if isinstance(hs, torch.Tensor) and hs.dim() == 3:          # [L, T, H] stacked
        hs = list(hs.unbind(0))
    if not isinstance(hs, (list, tuple)) or not hs or not all(isinstance(x, torch.Tensor) for x in hs):
        raise _bad(f, "'hidden_states' is not a list of [T, H] tensors")
    if any(x.dim() != 2 or x.shape != hs[0].shape for x in hs):
        raise _bad(f, f"'hidden_states' shapes {[list(x.shape) for x in hs]}, expected L tensors of one shape [T, H]")
    tok = _tokens(f, _tensor(f, d, "input_ids", 1), hs[0].shape[0])
    return Record(tok, list(hs))


def read_specforge(f: Path) -> Record:
    """SpecForge 0.2: hidden_state [1, T, H] (= F), aux_hidden_state [1, T, k*H], input_ids [T]."""
    d = _torch_load(f)
    hid = _tensor(f, d, "hidden_state", 3)                       # [1, T, H]
    aux = _tensor(f, d, "aux_hidden_state", 3)                   # [1, T, k*H]
    h = hid.shape[-1]
    if hid.shape[0] != 1 or aux.shape[0] != 1 or aux.shape[1] != hid.shape[1] or h == 0 or aux.shape[-1] % h:
        raise _bad(f, f"hidden_state {list(hid.shape)} and aux_hidden_state {list(aux.shape)} do not fit "
                      f"[1, T, H] and [1, T, k*H]")
    tok = _tokens(f, _tensor(f, d, "input_ids", 1), hid.shape[1])
    return Record(tok, list(aux[0].split(h, dim=-1)) + [hid[0]])


FORMATS = {
    "speculators": Format("speculators", "speculators", "0.5", "hs_*.safetensors", read_hs),
    "vllm-extract": Format("vllm-extract", "vllm", "0.24.0", "hs_*.safetensors", read_hs, ids_name_all=True),
    "speculators-legacy": Format("speculators-legacy", "speculators", "0.4", "data_*.pt", read_legacy),
    "specforge": Format("specforge", "specforge", "0.2", "data_*.ckpt", read_specforge),
}


# ---------------------------------------------------------------------------- inputs

def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def _natural(p: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p))]


def find_data_files(path: Path, fmt: Format) -> list[Path]:
    if not path.exists():
        raise SpecLensError(f"{path}: no such file or directory; pass the directory the producer wrote")
    if path.is_file():
        if not path.match(fmt.glob):
            raise SpecLensError(f"{path}: not a {fmt.name} file ({fmt.glob}); check --format")
        return [path]
    files = sorted((p for p in path.rglob(fmt.glob) if p.is_file()), key=lambda p: _natural(p.relative_to(path)))
    if not files:
        other = [n for n, f in FORMATS.items() if f.glob != fmt.glob and any(path.rglob(f.glob))]
        hint = f" (it holds {other[0]} files: try --format {other[0]})" if other else ""
        raise SpecLensError(f"{path}: no {fmt.glob} files for --format {fmt.name}{hint}; pass the directory "
                            f"the producer wrote")
    return files


def _json(p: Path, what: str) -> dict:
    f = p / "config.json" if p.is_dir() else p
    if not f.exists():
        raise SpecLensError(f"{f}: {what} not found; pass an existing config.json or its directory")
    try:
        d = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecLensError(f"{f}: {what} is not valid JSON ({_first_line(e)}); fix or re-save it") from e
    if not isinstance(d, dict):
        raise SpecLensError(f"{f}: {what} is not a JSON object; pass a config.json")
    return d


def ids_from_config(cfg: dict) -> tuple[list[int] | None, str | None]:
    """A drafter config's aux layer ids and where: top level, nested eagle_config, or speculators sub-configs."""
    for where, d in (("top level", cfg), ("eagle_config", cfg.get("eagle_config")),
                     ("speculators_config", cfg.get("speculators_config")),
                     ("transformer_layer_config", cfg.get("transformer_layer_config"))):
        if isinstance(d, dict) and d.get(IDS_KEY) is not None:
            ids = d[IDS_KEY]
            if not isinstance(ids, list) or not all(isinstance(a, int) for a in ids):
                raise SpecLensError(f"drafter config {where} {IDS_KEY} = {ids!r}: expected a list of integers")
            return list(ids), f"drafter config ({where})"
    return None, None


def verifier_path(cfg: dict | None) -> str | None:
    """speculators_config.verifier.name_or_path of a speculators drafter config (a hub id or a directory)."""
    sc = (cfg or {}).get("speculators_config")
    ver = sc.get("verifier") if isinstance(sc, dict) else None
    p = ver.get("name_or_path") if isinstance(ver, dict) else None
    return str(p) if p else None


def verifier_config(cfg: dict | None) -> dict:
    """The target's config.json named by a speculators drafter config's verifier, when it is a local directory."""
    p = verifier_path(cfg)
    if p and (Path(p) / "config.json").exists():
        return _json(Path(p), "verifier config")
    return {}


@dataclass
class Plan:
    fmt: Format
    files: list[Path]
    n_layers: int
    ids: list[int]                 # as the producer numbered them (ascending), teacher not included
    ids_from: str
    labels: list[str]              # one per stored state, file order (= stream order)
    target: dict                   # the target's config.json when known
    family: str
    dcfg: dict                     # the drafter config ({} when none)


def plan_import(path: str | Path, fmt: str, producer_ids: list[int] | None = None, num_layers: int | None = None,
                drafter_config: str | Path | None = None, model: str | Path | None = None) -> Plan:
    """Everything that can be checked before reading data: files, N, ids and their boundary labels."""
    if fmt not in FORMATS:
        raise SpecLensError(f"--format {fmt}: unknown; use one of {', '.join(FORMATS)}")
    f = FORMATS[fmt]
    p = Path(path)
    files = find_data_files(p, f)
    dcfg = _json(Path(drafter_config), "drafter config") if drafter_config else None
    target = _json(Path(model), "target model config") if model else verifier_config(dcfg)
    n = num_layers or target.get("num_hidden_layers")
    if num_layers and target.get("num_hidden_layers") and int(num_layers) != int(target["num_hidden_layers"]):
        raise SpecLensError(f"{p}: --num-layers {num_layers} but the target config says {target['num_hidden_layers']} "
                            f"layers; drop --num-layers or pass the right --model")
    if not n:
        raise SpecLensError(f"{p}: the target's number of decoder layers N is unknown; pass --num-layers N or "
                            f"--model TARGET_DIR")
    family = coords.family_of(target.get("model_type"))

    try:
        ids, ids_from = (list(producer_ids), "--producer-ids") if producer_ids else ids_from_config(dcfg or {})
    except SpecLensError as e:
        raise SpecLensError(f"{drafter_config}: {e}; fix the drafter config or pass --producer-ids") from e
    conv = coords.convention_for(f.producer, f.version, family)
    try:
        if f.ids_name_all:
            if ids_from and ids_from != "--producer-ids":
                ids = sorted(ids) + [int(n)]             # a drafter config lists aux ids only: the last is S_N
            bs = coords.resolve_ids(f.producer, sorted(ids) if ids else None, n, version=f.version, family=family)
            if not ids:
                bs = bs + [coords.S(int(n))]             # default aux + the last layer
            teacher = []
        else:
            bs = coords.resolve_ids(f.producer, sorted(ids) if ids else None, n, version=f.version, family=family)
            t = coords.teacher_boundary(f.producer, n, version=f.version, family=family)
            teacher = [t] if t else []
    except SpecLensError as e:
        raise SpecLensError(f"{p}: {e}") from e
    labels = coords.labels(bs + teacher)
    dup = sorted({lbl for lbl in labels if labels.count(lbl) > 1})
    if dup:
        hint = f" (the producer appends the teacher {teacher[0].label} itself: do not list it)" if teacher else ""
        raise SpecLensError(f"{p}: ids {sorted(ids or [])} map to {', '.join(dup)} twice ({conv.rule} rule){hint}; "
                            f"fix the ids in --producer-ids or the drafter config")
    return Plan(f, files, int(n), sorted(ids) if ids else [], ids_from or "producer default", labels, target, family,
                dcfg or {})


# ---------------------------------------------------------------------------- import

def import_capture(path: str | Path, fmt: str, producer_ids: list[int] | None = None, num_layers: int | None = None,
                   drafter_config: str | Path | None = None, name: str | None = None, model: str | Path | None = None,
                   root: Path | None = None, sample_tokens: int = SAMPLE_TOKENS, sample_per_seq: int = SAMPLE_PER_SEQ,
                   progress: bool = True) -> CaptureResult:
    """Import a producer's training data as a complete capture run (kind 'capture', engine 'import:<fmt>').

    The first file is checked before the run directory exists (a wrong --producer-ids leaves no run behind);
    a bad file later on marks the run failed, with the file's name in its error.
    """
    plan = plan_import(path, fmt, producer_ids, num_layers, drafter_config, model)
    run_id = new_run_id("import", name)
    first = plan.files[0]
    shape = _check(plan, first, plan.fmt.read(first), None)     # (H, dtype) every other file must share
    src = Path(path).resolve()
    conv = coords.convention_for(plan.fmt.producer, plan.fmt.version, plan.family)
    verifier = verifier_path(plan.dcfg)
    manifest = {
        "kind": "capture", "engine": f"import:{fmt}", "name": run_id, "device": "cpu",
        "model": {"path": str(Path(model).resolve()) if model else verifier, "name": verifier,
                  "model_type": plan.target.get("model_type"), "n_layers": plan.n_layers, "hidden_size": shape[0],
                  "vocab_size": plan.target.get("vocab_size")},
        "dtype": DTYPE_NAMES.get(shape[1], str(shape[1])), "boundaries": plan.labels, "dataset": src.name,
        "settings": {"path": str(src), "format": fmt, "producer_ids": producer_ids, "num_layers": num_layers,
                     "drafter_config": str(drafter_config) if drafter_config else None,
                     "model": str(model) if model else None, "sample_tokens": sample_tokens,
                     "sample_per_prompt": sample_per_seq},
        "progress": {"done": 0, "total": len(plan.files)},
        "source": {"producer": plan.fmt.producer, "version": conv.versions, "format": fmt, "rule": conv.rule,
                   "ids": plan.ids, "ids_from": plan.ids_from, "labels": plan.labels, "path": str(src),
                   "files": len(plan.files), "first_file": first.name, "last_file": plan.files[-1].name},
    }
    rd = RunDir.create(run_id, manifest, root)
    catalog.refresh(root)
    t0 = time.perf_counter()
    try:
        stats, sample = _stream(plan, rd, shape, sample_tokens, sample_per_seq, progress)
    except BaseException as e:  # the run must never look complete: say why it stopped, in one line
        rd.fail(str(e) if isinstance(e, SpecLensError) else
                "interrupted; import again under a new --name" if isinstance(e, KeyboardInterrupt) else
                f"{type(e).__name__}: {_first_line(e)}")
        catalog.refresh(root)
        raise
    return write_capture_files(rd, stats, sample, plan.labels, len(plan.files), root,
                               seconds=time.perf_counter() - t0)


def _check(plan: Plan, f: Path, rec: Record, shape: tuple[int, torch.dtype] | None) -> tuple[int, torch.dtype]:
    """One file's states against the plan (L) and the first file (H); returns (H, dtype)."""
    if not rec.states or rec.states[0].numel() == 0:
        raise _bad(f, "holds no hidden states (zero layers or zero tokens)")
    if not rec.states[0].is_floating_point():
        raise _bad(f, f"hidden states are {rec.states[0].dtype}, expected floating point")
    L, H = len(rec.states), int(rec.states[0].shape[-1])
    if L != len(plan.labels):
        raise _bad(f, f"holds {L} hidden states per token but the ids {plan.ids} ({plan.ids_from}) give "
                      f"{len(plan.labels)}: {', '.join(plan.labels)}", fix=_ids_fix(plan, L))
    if shape is None:
        want = plan.target.get("hidden_size")
        if want and H != int(want):
            raise _bad(f, f"hidden size {H} but the target config says {want}", "pass the right --model")
        return H, rec.states[0].dtype
    if H != shape[0]:
        raise _bad(f, f"hidden size {H} but {plan.files[0].name} has {shape[0]}",
                   "import files of one target only (move the others out)")
    return shape


def _stream(plan: Plan, rd: RunDir, shape: tuple[int, torch.dtype], sample_tokens: int, sample_per_seq: int,
            progress: bool) -> tuple[StreamingStats, TokenSample]:
    """Read the files one at a time into streaming statistics and the token sample (bounded memory)."""
    H, dtype = shape
    stats = StreamingStats(plan.labels, H, "cpu")
    sample = TokenSample(plan.labels, H, sample_tokens, sample_per_seq,
                         dtype=dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32)
    last_update = time.monotonic()
    bar = tqdm(plan.files, desc=f"import {rd.run_id}", unit="file", disable=not progress, file=sys.stderr)
    for done, f in enumerate(bar, 1):
        rec = plan.fmt.read(f)
        _check(plan, f, rec, shape)
        for i, x in enumerate(rec.states):                        # x [T, H]
            stats.update(i, x)
        if sample.room(int(rec.token_ids.shape[0])):
            sample.add(rec.token_ids, dict(enumerate(rec.states)))
        if time.monotonic() - last_update > 2.0:
            rd.update(progress={"done": done, "total": len(plan.files)})
            last_update = time.monotonic()
    bar.close()
    return stats, sample


def _ids_fix(plan: Plan, L: int) -> str:
    if plan.fmt.ids_name_all:
        return f"pass --producer-ids with all {L} captured layer ids, the last included (e.g. 2,16,29,32)"
    if plan.fmt.name == "specforge":
        return f"pass --producer-ids with the {L - 1} aux layer ids (the teacher F is hidden_state)"
    return f"pass --producer-ids with the {L - 1} aux layer ids (the last state is the teacher)"
