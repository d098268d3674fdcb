"""Import EAGLE-3 training data written by other tools as a capture run (`python -m backend import-capture`).

Each format's layer ids are turned into boundary labels through the conventions table (backend/coords.py),
so an imported run can be aligned against any other capture. Files are streamed one at a time: memory is
bounded by the statistics and the token sample, whatever the number of files.

- `speculators` (>=0.5), `*.safetensors` (speculators names them `hs_{i}`): `hidden_states [T, L, H]` (ascending,
  L = k aux + teacher S_N), `token_ids [T]`; id a -> S_a.
- `vllm-extract`, the same files (vLLM's own ExampleHiddenStatesConnector names them `{req_id}.safetensors`); the
  ids name all L layers, the last included; id a -> S_a.
  Both read any `*.safetensors` holding `hidden_states` and `token_ids` (others are skipped), in natural name
  order. FP8 files (hs-connectors `FP8HiddenStatesConnector`: `hidden_states` float8_e4m3fn plus
  `hidden_states_scales` fp32 `[T, 1, 1]`, value = fp8 x scale) are dequantised to float32; the run's dtype
  records the stored `fp8_e4m3fn`.
- `speculators-legacy` (<=0.4), `data_*.pt`: `input_ids [T]`, `hidden_states` L x `[T, H]` (teacher S_N last),
  `loss_mask [T]`; id a -> S_{a+1}.
- `specforge` (0.2), `data_*.ckpt` or `data_*.ckpt.gz` (`--compress`: gzip of the torch.save, decompressed in a
  stream to a temporary file), also under `rows_*/`: `input_ids [T]`, `loss_mask [T]`, `hidden_state [1, T, H]`
  (= F), `aux_hidden_state [1, T, k*H]`; id a -> S_{a+1}.

Without a format, `detect_format` reads the first data file's keys and shapes; speculators and vllm-extract share
a layout, so it picks one from the ids given (k aux ids or all L) or the file names, and says how to pick the other.
"""

from __future__ import annotations

import gzip
import re
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from backend import coords
from backend.errors import SpecLensError
from backend.jsonfile import read_object
from backend.runs.capture_run import CaptureResult, write_capture_files
from backend.runs.lifecycle import Run, RunGuard
from backend.runs.manifest import Manifest
from backend.stats import StreamingStats, TokenSample
from backend.store.data_root import DataRoot
from backend.store.rundir import new_run_id

SAMPLE_TOKENS, SAMPLE_PER_SEQ = 4096, 512
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}
FP8 = {getattr(torch, n): n.replace("float8", "fp8") for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                                               "float8_e5m2fnuz") if hasattr(torch, n)}
DTYPE_NAMES.update(FP8)
SCALES_KEY = "hidden_states_scales"          # hs-connectors FP8HiddenStatesConnector: fp32 [T, 1, 1] per-token scales
HS_KEYS = ("hidden_states", "token_ids")
IDS_KEY = "eagle_aux_hidden_state_layer_ids"


@dataclass
class Record:
    """One sequence read from one file."""

    token_ids: torch.Tensor        # [T] int64
    states: list[torch.Tensor]     # L x [T, H], file order: aux ascending, teacher last
    stored: str = ""               # the dtype the file stores ("fp32", "bf16", "fp8_e4m3fn"); states may be wider


@dataclass(frozen=True)
class Format:
    name: str
    producer: str                  # conventions.yaml producer
    version: str                   # a version inside the convention's range (for the lookup)
    globs: tuple[str, ...]         # data files (searched recursively)
    read: Callable[[Path], Record]
    ids_name_all: bool = False     # vllm-extract: the ids list every captured layer, the last included

    @property
    def glob(self) -> str:
        return " or ".join(self.globs)


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
    """speculators >= 0.5 / vLLM extract_hidden_states: hidden_states [T, L, H], token_ids [T] (+ fp8 scales)."""
    from safetensors.torch import load_file

    try:
        d = load_file(str(f))
    except Exception as e:  # SafetensorError, OSError, ...: the first line names the problem
        raise _bad(f, f"corrupt safetensors file ({_first_line(e)})") from e
    hs = _tensor(f, d, "hidden_states", 3)                       # [T, L, H]
    tok = _tokens(f, _tensor(f, d, "token_ids", 1), hs.shape[0])
    stored = DTYPE_NAMES.get(hs.dtype, str(hs.dtype).replace("torch.", ""))
    scales = d.get(SCALES_KEY)
    if hs.dtype in FP8:
        if not isinstance(scales, torch.Tensor):
            raise _bad(f, f"hidden_states are {hs.dtype} but there is no '{SCALES_KEY}' tensor, so their values are "
                          f"unknown (hs-connectors' FP8HiddenStatesConnector writes both)",
                       "re-extract with the FP8 connector (it writes the scales) or with the file backend")
        if not scales.is_floating_point() or scales.dim() != 3 or scales.shape[0] != hs.shape[0] or \
                scales.shape[1] not in (1, hs.shape[1]) or scales.shape[2] not in (1, hs.shape[2]):
            raise _bad(f, f"'{SCALES_KEY}' is {scales.dtype} {list(scales.shape)}, expected floats [T, 1, 1] for "
                          f"hidden_states {list(hs.shape)}", "re-extract this file with the FP8 connector")
        hs = hs.to(torch.float32) * scales.to(torch.float32)      # hs-connectors dequantize_fp8_tensor, in fp32
    elif scales is not None:
        raise _bad(f, f"has '{SCALES_KEY}' but hidden_states are {hs.dtype}, not fp8: which values are meant is "
                      f"unclear", "re-extract this file, or remove the scales if the states are already dequantised")
    return Record(tok, list(hs.unbind(dim=1)), stored)


def hs_keys(f: Path) -> set[str] | None:
    """The tensor names in a safetensors file's header (cheap: the data is not read); None when unreadable."""
    from safetensors import safe_open

    try:
        with safe_open(str(f), framework="pt") as sf:
            return set(sf.keys())
    except Exception:  # not safetensors, truncated header: the reader will say so, naming the file
        return None


def _torch_load(f: Path) -> dict:
    try:
        if f.name.endswith(".gz"):
            d = _load_gz(f)
        else:
            d = torch.load(f, map_location="cpu", weights_only=True)
    except SpecLensError:
        raise
    except Exception as e:  # UnpicklingError, RuntimeError, EOFError, zipfile errors
        raise _bad(f, f"corrupt torch.save file ({type(e).__name__}: {_first_line(e)})") from e
    if not isinstance(d, dict):
        raise _bad(f, f"holds a {type(d).__name__}, expected a dict of tensors")
    return d


def _load_gz(f: Path) -> dict:
    """SpecForge --compress: gzip of a torch.save. Decompressed in 1 MiB chunks to a temporary file (torch.load
    needs to seek; seeking back in a gzip stream decompresses it again), so memory holds one record, never the
    compressed and the decompressed bytes together."""
    with tempfile.TemporaryFile(prefix="speclens-gz-") as tmp:
        try:
            with gzip.open(f, "rb") as gz:
                shutil.copyfileobj(gz, tmp, 1 << 20)
        except (gzip.BadGzipFile, EOFError, zlib.error, OSError) as e:
            what = "truncated gzip file" if isinstance(e, EOFError) else f"corrupt gzip file ({_first_line(e)})"
            raise _bad(f, what, "re-create it (SpecForge prepare_hidden_states.py --compress) or remove it") from e
        tmp.seek(0)
        return torch.load(tmp, map_location="cpu", weights_only=True)


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
    return Record(tok, list(hs), DTYPE_NAMES.get(hs[0].dtype, str(hs[0].dtype)))


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
    return Record(tok, list(aux[0].split(h, dim=-1)) + [hid[0]], DTYPE_NAMES.get(hid.dtype, str(hid.dtype)))


FORMATS = {
    "speculators": Format("speculators", "speculators", "0.5", ("*.safetensors",), read_hs),
    "vllm-extract": Format("vllm-extract", "vllm", "0.24.0", ("*.safetensors",), read_hs, ids_name_all=True),
    "speculators-legacy": Format("speculators-legacy", "speculators", "0.4", ("data_*.pt",), read_legacy),
    "specforge": Format("specforge", "specforge", "0.2", ("data_*.ckpt", "data_*.ckpt.gz"), read_specforge),
}
HS_FORMATS = ("speculators", "vllm-extract")


# ---------------------------------------------------------------------------- inputs

def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def _natural(p: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p))]


def _rglob(path: Path, fmt: Format) -> list[Path]:
    found = {p for g in fmt.globs for p in path.rglob(g) if p.is_file()}
    return sorted(found, key=lambda p: _natural(p.relative_to(path)))


def _matches(f: Path, fmt: Format) -> bool:
    return any(f.match(g) for g in fmt.globs)


@dataclass
class Found:
    files: list[Path]
    skipped: list[str]             # candidates left out, with why (first few)
    n_skipped: int


def find_data_files(path: Path, fmt: Format) -> list[Path]:
    return find_data(path, fmt).files


def find_data(path: Path, fmt: Format) -> Found:
    """The format's data files under `path` in natural name order. Safetensors files whose header lacks
    hidden_states and token_ids are skipped (a model's weights, a run's sample); an unreadable one is kept so
    that its reader names it. A SpecForge data_i.ckpt.gz next to its data_i.ckpt twin is skipped."""
    if not path.exists():
        raise SpecLensError(f"{path}: no such file or directory; pass the directory the producer wrote")
    if path.is_file():
        if not _matches(path, fmt):
            raise SpecLensError(f"{path}: not a {fmt.name} file ({fmt.glob}); check --format")
        return Found([path], [], 0)
    files, skipped = _rglob(path, fmt), []
    if fmt.name in HS_FORMATS:
        keep = []
        for f in files:
            keys = hs_keys(f)
            if keys is None or all(k in keys for k in HS_KEYS):
                keep.append(f)
            else:
                skipped.append(f"{f.relative_to(path)} (no {' or '.join(k for k in HS_KEYS if k not in keys)})")
        files = keep
    elif fmt.name == "specforge":
        names = {str(f) for f in files}
        skipped = [f"{f.relative_to(path)} (its .ckpt twin is read)" for f in files
                   if f.name.endswith(".gz") and str(f)[:-3] in names]
        files = [f for f in files if not (f.name.endswith(".gz") and str(f)[:-3] in names)]
    if not files:
        other = [n for n, f in FORMATS.items() if f.globs != fmt.globs and _rglob(path, f)]
        hint = f" (it holds {other[0]} files: try --format {other[0]})" if other else ""
        left = f"; {len(skipped)} other .safetensors files left out, e.g. {skipped[0]}" if skipped else ""
        what = "*.safetensors files holding hidden_states and token_ids" if fmt.name in HS_FORMATS else \
            f"{fmt.glob} files"
        raise SpecLensError(f"{path}: no {what} for --format {fmt.name}{hint}{left}; pass the directory "
                            f"the producer wrote")
    return Found(files, skipped[:5], len(skipped))


# ---------------------------------------------------------------------------- format detection

@dataclass
class Detected:
    format: str
    note: str                      # one line: what was seen, and how to choose the other reading when one fits


def _candidates(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    pats = ("*.safetensors", "*.pt", "*.ckpt", "*.ckpt.gz")
    return sorted({p for g in pats for p in path.rglob(g) if p.is_file()}, key=lambda p: _natural(p.relative_to(path)))


def _kind(f: Path) -> tuple[str | None, str]:
    """What one file's contents are: 'hs' (speculators / vllm-extract layout), 'legacy', 'specforge', or None."""
    if f.name.endswith(".safetensors"):
        keys = hs_keys(f)
        if keys is None:
            raise _bad(f, "corrupt safetensors file (its header does not read)")
        if all(k in keys for k in HS_KEYS):
            return "hs", "fp8 " if SCALES_KEY in keys else ""
        return None, f"keys {', '.join(sorted(keys)) or 'none'}"
    d = _torch_load(f)
    if "hidden_state" in d and "aux_hidden_state" in d:
        return "specforge", "hidden_state + aux_hidden_state"
    if isinstance(d.get("hidden_states"), (list, tuple, torch.Tensor)) and "input_ids" in d:
        return "legacy", "input_ids + a list of hidden_states"
    return None, f"keys {', '.join(map(str, d)) or 'none'}"


def detect_format(path: str | Path, producer_ids: list[int] | None = None,
                  drafter_config: str | Path | None = None) -> Detected:
    """Which format `path` holds, from the contents of its data files (keys and shapes), not only names.

    Per file type (.safetensors headers, one torch.save of each of .pt, .ckpt, .ckpt.gz) the first readable file
    decides; two kinds in one folder is an error. Files of the speculators/vllm-extract layout fit both: k aux ids
    (--producer-ids or a drafter config) mean speculators, all L stored layers vllm-extract; with no ids, hs_{i}
    names (speculators renames vLLM's files so) mean speculators, vLLM's request-id names vllm-extract. With
    default ids both give the same labels.
    """
    p = Path(path)
    if not p.exists():
        raise SpecLensError(f"{p}: no such file or directory; pass the directory the producer wrote")
    groups: dict[str, list[Path]] = {}
    for f in _candidates(p):
        groups.setdefault(".ckpt.gz" if f.name.endswith(".ckpt.gz") else f.suffix, []).append(f)
    kinds: dict[str, tuple[Path, str]] = {}
    bad: list[SpecLensError] = []
    for ext, files in groups.items():
        tries = files if ext == ".safetensors" else files[:3]       # headers are cheap; torch.save files are not
        for f in tries:
            try:
                kind, what = _kind(f)
            except SpecLensError as e:
                bad.append(e)
                continue
            if kind:
                kinds.setdefault(kind, (f, what))
                break
    if not kinds:
        if bad:
            raise SpecLensError(f"{bad[0]} (no other file told the format: pass --format)")
        raise SpecLensError(f"{p}: no EAGLE-3 training data recognised (speculators/vLLM *.safetensors with "
                            f"hidden_states + token_ids, SpecForge data_*.ckpt[.gz], speculators<=0.4 data_*.pt); "
                            f"pass the directory the producer wrote, or --format")
    if len(kinds) > 1:
        (k1, (f1, _)), (k2, (f2, _)) = list(kinds.items())[:2]
        raise SpecLensError(f"{p}: holds two kinds of training data ({f1.name}: {k1}, {f2.name}: {k2}); import "
                            f"one folder per producer, or pass --format")
    kind, (f, what) = next(iter(kinds.items()))
    rel = f.relative_to(p) if p.is_dir() else f.name
    if kind == "legacy":
        return Detected("speculators-legacy", f"{p}: detected speculators-legacy ({rel}: {what})")
    if kind == "specforge":
        return Detected("specforge", f"{p}: detected specforge ({rel}: {what})")
    from safetensors import safe_open

    with safe_open(str(f), framework="pt") as sf:
        shape = sf.get_slice("hidden_states").get_shape()
    L = int(shape[1]) if len(shape) == 3 else 0
    if producer_ids and len(producer_ids) == L:
        fmt, why = "vllm-extract", f"{len(producer_ids)} --producer-ids name all {L} stored layers"
    elif producer_ids and len(producer_ids) == L - 1:
        fmt, why = "speculators", f"{len(producer_ids)} --producer-ids name the aux layers, the last is the teacher"
    elif drafter_config and not producer_ids:
        fmt, why = "speculators", "a drafter config lists the aux layers, the last is the teacher"
    else:
        names = [x.name for x in _rglob(p, FORMATS["speculators"])] if p.is_dir() else [p.name]
        hs_names = bool(names) and all(re.fullmatch(r"hs_\d+\.safetensors", x) for x in names)
        fmt, why = ("speculators", "hs_{i} names, as speculators writes them") if hs_names else \
            ("vllm-extract", "request-id names, as vLLM's connector writes them")
    other = "vllm-extract" if fmt == "speculators" else "speculators"
    how = ("if --producer-ids lists all stored layers, the last included" if other == "vllm-extract" else
           "if the ids are the aux layers only and the last stored layer is the teacher S_N")
    return Detected(fmt, f"{p}: detected {fmt} ({rel}: {what}hidden_states [T, {L}, H] + token_ids; {why}); {other} "
                         f"reads the same files: pass --format {other} {how}")


def _json(p: Path, what: str) -> dict:
    f = p / "config.json" if p.is_dir() else p
    return read_object(f, what, f"{what} not found; pass an existing config.json or its directory")


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
    skipped: list[str] = field(default_factory=list)   # candidate files left out, with why (first few)
    n_skipped: int = 0
    detected: str | None = None    # detect_format's one-line note when no format was given


def plan_import(path: str | Path, fmt: str | None, producer_ids: list[int] | None = None,
                num_layers: int | None = None, drafter_config: str | Path | None = None,
                model: str | Path | None = None) -> Plan:
    """Everything that can be checked before reading data: format (detected when None), files, N, ids and their
    boundary labels."""
    detected = None
    if fmt is None:
        det = detect_format(path, producer_ids, drafter_config)
        fmt, detected = det.format, det.note
    if fmt not in FORMATS:
        raise SpecLensError(f"--format {fmt}: unknown; use one of {', '.join(FORMATS)}")
    f = FORMATS[fmt]
    p = Path(path)
    found = find_data(p, f)
    files = found.files
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
                dcfg or {}, found.skipped, found.n_skipped, detected)


# ---------------------------------------------------------------------------- import

def import_capture(path: str | Path, fmt: str | None = None, producer_ids: list[int] | None = None,
                   num_layers: int | None = None,
                   drafter_config: str | Path | None = None, name: str | None = None, model: str | Path | None = None,
                   data: DataRoot | None = None, sample_tokens: int = SAMPLE_TOKENS,
                   sample_per_seq: int = SAMPLE_PER_SEQ, progress: bool = True) -> CaptureResult:
    """Import a producer's training data as a complete capture run (kind 'capture', engine 'import:<fmt>').

    `fmt` None: detected from the files' contents (detect_format; its note lands in the manifest's source).
    The first file is checked before the run directory exists (a wrong --producer-ids leaves no run behind);
    a bad file later on marks the run failed, with the file's name in its error and the fix.
    """
    plan = plan_import(path, fmt, producer_ids, num_layers, drafter_config, model)
    fmt = plan.fmt.name
    run_id = new_run_id("import", name)
    first = plan.files[0]
    rec = plan.fmt.read(first)
    shape = _check(plan, first, rec, None)     # (H, dtype, stored dtype) every other file must share
    src = Path(path).resolve()
    conv = coords.convention_for(plan.fmt.producer, plan.fmt.version, plan.family)
    verifier = verifier_path(plan.dcfg)
    source = {"producer": plan.fmt.producer, "version": conv.versions, "format": fmt, "rule": conv.rule,
              "ids": plan.ids, "ids_from": plan.ids_from, "labels": plan.labels, "path": str(src),
              "files": len(plan.files), "first_file": first.name, "last_file": plan.files[-1].name,
              "stored_dtype": shape[2]}
    if shape[2] in FP8.values():
        source["dequantised"] = f"hidden_states x {SCALES_KEY} (per token), kept as float32"
    if plan.detected:
        source["detected"] = plan.detected
    if plan.n_skipped:
        source["skipped"] = {"files": plan.n_skipped, "examples": plan.skipped}
    manifest = Manifest.of({
        "kind": "capture", "engine": f"import:{fmt}", "name": run_id, "device": "cpu",
        "model": {"path": str(Path(model).resolve()) if model else verifier, "name": verifier,
                  "model_type": plan.target.get("model_type"), "n_layers": plan.n_layers, "hidden_size": shape[0],
                  "vocab_size": plan.target.get("vocab_size")},
        "dtype": shape[2], "boundaries": plan.labels, "dataset": src.name,
        "settings": {"path": str(src), "format": fmt, "producer_ids": producer_ids, "num_layers": num_layers,
                     "drafter_config": str(drafter_config) if drafter_config else None,
                     "model": str(model) if model else None, "sample_tokens": sample_tokens,
                     "sample_per_prompt": sample_per_seq},
        "progress": {"done": 0, "total": len(plan.files)},
        "source": source,
    }, run_id)
    rd = Run.create(run_id, manifest, data)
    t0 = time.perf_counter()
    with RunGuard(rd, interrupted=lambda: "interrupted; import again under a new --name",
                  describe=lambda e: f"{type(e).__name__}: {_first_line(e)}"):
        stats, sample = _stream(plan, rd, shape, sample_tokens, sample_per_seq, progress)
    return write_capture_files(rd, stats, sample, plan.labels, len(plan.files),
                               seconds=time.perf_counter() - t0)


def _check(plan: Plan, f: Path, rec: Record, shape: tuple[int, torch.dtype, str] | None
           ) -> tuple[int, torch.dtype, str]:
    """One file's states against the plan (L) and the first file (H, stored dtype); returns (H, dtype, stored)."""
    if not rec.states or rec.states[0].numel() == 0:
        raise _bad(f, "holds no hidden states (zero layers or zero tokens)")
    if not rec.states[0].is_floating_point():
        raise _bad(f, f"hidden states are {rec.states[0].dtype}, expected floating point")
    L, H = len(rec.states), int(rec.states[0].shape[-1])
    if L != len(plan.labels):
        raise _bad(f, f"holds {L} hidden states per token but the ids {plan.ids} ({plan.ids_from}) give "
                      f"{len(plan.labels)}: {', '.join(plan.labels)}", fix=_ids_fix(plan, L))
    stored = rec.stored or DTYPE_NAMES.get(rec.states[0].dtype, str(rec.states[0].dtype))
    if shape is None:
        want = plan.target.get("hidden_size")
        if want and H != int(want):
            raise _bad(f, f"hidden size {H} but the target config says {want}", "pass the right --model")
        return H, rec.states[0].dtype, stored
    if H != shape[0]:
        raise _bad(f, f"hidden size {H} but {plan.files[0].name} has {shape[0]}",
                   "import files of one target only (move the others out)")
    if stored != shape[2]:
        raise _bad(f, f"stores {stored} but {plan.files[0].name} stores {shape[2]}",
                   "import the files of one extraction only (move the others out)")
    return shape


def _stream(plan: Plan, rd: Run, shape: tuple[int, torch.dtype, str], sample_tokens: int, sample_per_seq: int,
            progress: bool) -> tuple[StreamingStats, TokenSample]:
    """Read the files one at a time into streaming statistics and the token sample (bounded memory)."""
    H, dtype, _ = shape
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
            rd.progress(done, len(plan.files))
            last_update = time.monotonic()
    bar.close()
    return stats, sample


def _ids_fix(plan: Plan, L: int) -> str:
    if plan.fmt.ids_name_all:
        return f"pass --producer-ids with all {L} captured layer ids, the last included (e.g. 2,16,29,32)"
    if plan.fmt.name == "specforge":
        return f"pass --producer-ids with the {L - 1} aux layer ids (the teacher F is hidden_state)"
    return f"pass --producer-ids with the {L - 1} aux layer ids (the last state is the teacher)"
