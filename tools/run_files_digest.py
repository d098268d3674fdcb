"""One digest per run of a data root, over what a run's files say rather than when or where they were written: the
record that a change kept behaviour identical (the demo's run files before and after, timings aside).

    python /path/to/tools/run_files_digest.py --build DATA_ROOT # from a checkout's root: the demo's captures, imports,
                                                                # benches and check at a small size, by its builders
    python tools/run_files_digest.py DATA_ROOT                  # run_id, digest, files hashed
    python tools/run_files_digest.py DATA_ROOT --against OTHER  # and, per run, identical or which files/keys differ
        [--repo OTHER_CHECKOUT] [--all]                         # another checkout's path; every differing key

What is hashed, per file of runs/<run_id>/:
- manifest.json and other JSON (a .jsonl line by line): the values, with the keys that say when, where or how long
  dropped at any depth (`VOLATILE_KEYS`: timestamps, pid, host, git commit, durations); the data root's path and the
  repository's path inside text are written as <DATA> and <REPO>, so two roots built from two checkouts compare.
- .parquet: the table's content read with pandas (column names, dtypes, values), the columns that time something
  (`volatile_column`) dropped.
- .safetensors: each tensor's name, dtype, shape and bytes (the header's free-form metadata left out).
- anything else (logs, text) is listed as skipped: it carries timings and paths line by line.
Timing-derived values that are not durations (tokens per second, a speedup, TTFT) are kept, so a bench's manifest
differs between two builds; `--against` names those keys, so the reader sees the difference is only timing."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import struct
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VOLATILE_KEYS = {"created", "updated", "finished", "host", "pid", "git_commit", "seconds", "start_seconds", "timing",
                 "started", "ended", "elapsed", "duration", "duration_s", "wall_s", "wall_seconds"}
_VOLATILE_COL = re.compile(r"(^|_)(time|seconds|secs|wall|elapsed|started|ended|t_start|t_end)($|_)|_s$|_ms$")
SKIPPED = "skipped"


def volatile_column(name: str) -> bool:
    """A parquet column that times something (seconds, a start or end time)."""
    return bool(_VOLATILE_COL.search(name))


class Normaliser:
    def __init__(self, root: Path, repos: tuple[Path, ...] = (REPO,)):
        self.subs = [(str(root.resolve()), "<DATA>"), (str(root), "<DATA>"), *((str(r), "<REPO>") for r in repos)]

    def text(self, s: str) -> str:
        for a, b in self.subs:
            s = s.replace(a, b)
        return s

    def value(self, v):
        if isinstance(v, dict):
            return {self.text(k): self.value(x) for k, x in v.items() if k not in VOLATILE_KEYS}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, str):
            return self.text(v)
        return v


def _json_digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _parquet(path: Path, norm: Normaliser) -> tuple[str, dict]:
    import pandas as pd

    df = pd.read_parquet(path)
    df = df[[c for c in df.columns if not volatile_column(str(c))]]
    h = hashlib.sha256(json.dumps([[str(c), str(t)] for c, t in df.dtypes.items()]).encode())
    cols = {}
    for c in df.columns:
        s = df[c]
        if s.dtype == object:
            s = s.map(lambda x: norm.text(x) if isinstance(x, str) else json.dumps(
                x.tolist() if hasattr(x, "tolist") else x, default=str))
        ch = hashlib.sha256(pd.util.hash_pandas_object(s, index=False).values.tobytes()).hexdigest()
        cols[str(c)] = ch
        h.update(ch.encode())
    return h.hexdigest(), cols


def _safetensors(path: Path) -> tuple[str, dict]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    h, parts = hashlib.sha256(), {}
    for name in sorted(k for k in header if k != "__metadata__"):
        t = header[name]
        a, b = t["data_offsets"]
        th = hashlib.sha256(json.dumps([t["dtype"], t["shape"]]).encode() + body[a:b]).hexdigest()
        parts[name] = th
        h.update(name.encode() + th.encode())
    return h.hexdigest(), parts


def file_digest(path: Path, norm: Normaliser) -> tuple[str, dict]:
    """(digest, its parts: a JSON object's normalised values, a table's column digests, a tensor's digest)."""
    if path.suffix == ".json":
        obj = norm.value(json.loads(path.read_text()))
        return _json_digest(obj), obj if isinstance(obj, dict) else {"": obj}
    if path.suffix == ".jsonl":
        rows = [norm.value(json.loads(x)) for x in path.read_text().splitlines() if x.strip()]
        return _json_digest(rows), {str(i): r for i, r in enumerate(rows)}
    if path.suffix == ".parquet":
        return _parquet(path, norm)
    if path.suffix == ".safetensors":
        return _safetensors(path)
    return SKIPPED, {}


def run_digests(root: Path, repos: tuple[Path, ...] = (REPO,)) -> dict[str, dict[str, tuple[str, dict]]]:
    """run_id -> relative file -> (digest, parts); `repos`: the checkouts whose path the files may name."""
    norm = Normaliser(root, repos)
    out = {}
    for d in sorted(p for p in (root / "runs").iterdir() if (p / "manifest.json").exists()):
        out[d.name] = {str(f.relative_to(d)): file_digest(f, norm) for f in sorted(d.rglob("*")) if f.is_file()}
    return out


def digest(files: dict[str, tuple[str, dict]]) -> str:
    h = hashlib.sha256()
    for name, (dg, _) in sorted(files.items()):
        if dg != SKIPPED:
            h.update(f"{name}\0{dg}\n".encode())
    return h.hexdigest()[:16]


def _flat(obj, prefix: str = "") -> dict:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): obj}


def differences(a: dict[str, tuple[str, dict]], b: dict[str, tuple[str, dict]], most: int = 12) -> list[str]:
    """What differs between two runs' files: a file only on one side, and per differing file its keys (JSON),
    columns (parquet) or tensors."""
    out = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            out.append(f"{name}: only in {'the first' if name in a else 'the second'}")
            continue
        (da, pa), (db, pb) = a[name], b[name]
        if da == db:
            continue
        fa, fb = _flat(pa), _flat(pb)
        keys = sorted(k for k in set(fa) | set(fb) if fa.get(k, "<absent>") != fb.get(k, "<absent>"))
        out.append(f"{name}: " + ", ".join(keys[:most]) + (f" (+{len(keys) - most})" if len(keys) > most else ""))
    return out


def build_small_demo(root: Path, limit: int = 4, max_new_tokens: int = 16) -> None:
    """The demo's runs at a small size (`limit` prompts, one torch thread) into `root`, built by the builders of the
    checkout this is run from (the current directory), before or after a change: backend/demo.py build_demo,
    build_bench_demo, build_check_demo (older checkouts take the root as a path, newer ones a DataRoot)."""
    import os

    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    os.environ["SPECLENS_DATA"] = str(root)
    sys.path.insert(0, os.getcwd())
    import torch

    torch.set_num_threads(1)
    from backend import demo

    try:
        from backend.store.data_root import DataRoot
        where = DataRoot(root)
    except ImportError:
        where = root
    demo.build_demo(where, progress=False, limit=limit)
    demo.build_bench_demo(where, progress=False, limit=limit, max_new_tokens=max_new_tokens)
    demo.build_check_demo(where, progress=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--against", type=Path, help="a second data root: say per run what differs")
    ap.add_argument("--repo", type=Path, action="append", default=[],
                    help="a checkout that built a root (its path in the files reads <REPO>; this one always)")
    ap.add_argument("--all", action="store_true", help="name every differing key, not the first 12 of a file")
    ap.add_argument("--build", action="store_true", help="first build the demo's runs at a small size into ROOT with "
                                                         "the builders of the checkout in the current directory")
    a = ap.parse_args(argv)
    if a.build:
        build_small_demo(a.root)
    repos = (REPO, *a.repo)
    mine = run_digests(a.root, repos)
    other = run_digests(a.against, repos) if a.against else None
    out = io.StringIO()
    for run_id, files in mine.items():
        hashed = sum(1 for dg, _ in files.values() if dg != SKIPPED)
        line = f"{run_id}  {digest(files)}  {hashed} files hashed"
        skipped = [n for n, (dg, _) in files.items() if dg == SKIPPED]
        if skipped:
            line += f" (skipped: {', '.join(skipped)})"
        if other is not None:
            if run_id not in other:
                line += "  | not in the other root"
            else:
                diff = differences(files, other[run_id], 10**6 if a.all else 12)
                line += "  | identical" if not diff else "  | differs: " + "; ".join(diff)
        print(line, file=out)
    if other is not None:
        for run_id in sorted(set(other) - set(mine)):
            print(f"{run_id}  | only in the other root", file=out)
    sys.stdout.write(out.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
