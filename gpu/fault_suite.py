"""Engines under faults (issue 24 item 5): `python gpu/fault_suite.py --out DIR --engines vllm,sglang --budget-s 540`.

For each engine E (vllm, sglang; hf for the CPU dry run) on the toy pair shipped in models/toy-pair.tar.gz, through
the command line (`python -m backend capture|bench --engine E ...`, SPECLENS_DATA=--root), each command a process of
its own:

  capture / bench trial
    a. reference: the command run uninterrupted (ref-E-cap, ref-E-ben; a complete reference of this data root from an
       earlier invocation is reused, fault_refs.json beside the runs says which were uninterrupted);
    b. trial: the same command under another name, started in its own process group; the run's progress is watched
       (manifest progress.done/total, for a bench the journal's whole lines) and the whole group is SIGKILLed
       (os.killpg) once the progress passes a random point between 25% and 75% (an SGLang capture reports no progress
       until it ends: it is killed that far into the reference's work time after its server came up). Recorded: the
       progress at the kill and what the run directory kept, the seconds since start, every process the command had
       started (read from /proc) and which of them outlived the kill (an engine child in another session: a finding),
       the GPU memory (nvidia-smi) until it is back at its value before the run (at most --free-wait-s); whatever
       still holds it is recorded, then killed by pid so that the suite goes on;
    c. the run's status as the catalog shows it after the kill (must be interrupted, never complete), and every
       status the catalog showed while the trial ran;
    d. resume: the same command again (same --name) to the end, then compared with the reference: a capture bit for
       bit (stats.parquet without run_id, sample.safetensors, headline, progress, no checkpoint left), a bench unit for
       unit (prompts.parquet: outputs, accepted, drafts; steps.parquet; tau, acceptance, lossless);
    e. the GPU memory free again after every finished run.
  load trial (vLLM, SGLang): the same for a serving-load sweep (`python -m backend sweep`, K x concurrency, its own
    baseline and drafter servers): killed after a random share of its cells; the resume is compared cell by cell
    (same cells, requests, errors and output tokens; tau from the server's counters side by side);
  OOM at engine start (vLLM, SGLang): commands with settings too large for the memory given (vLLM: context far too
    long for the KV budget, almost no memory, a batch too large for the budget; SGLang: almost no memory); recorded:
    exit code, seconds, the `error:` line and the log's last lines, whether that line is the only error line and which
    setting it names.

DIR/fault_results.json is rewritten (atomic replace) after every step and every phase of a trial, so a run cut short
keeps what it measured; DIR/fault_logs.tar.gz holds each command's output (the last MiB of each) and the SGLang
servers' logs. Order: E's capture and bench for each engine listed, then E's load and OOM cases; `--steps` picks
some (vllm-capture, vllm-bench, vllm-load, vllm-oom, sglang-capture, ...); a step starts only while its estimated time
fits the rest of --budget-s, and every command's time limit is cut to the budget left. Needs vLLM 0.24 / SGLang
0.5.15 and a CUDA GPU for those engines; `--engines hf` runs the same logic on CPU (no GPU memory checks without
nvidia-smi).

`python gpu/fault_suite.py --cli capture|bench ...` is the CLI (`backend.__main__.main`) with extra flags for the
SGLang servers a capture starts, from SPECLENS_FAULT_SGLANG_FLAGS (JSON): `capture --engine sglang` passes no
--engine-option to its server, and the H200's SGLang needs attention-backend=triton.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from backend.options import ENGINE_NAMES, IN_PROCESS_ENGINE  # noqa: E402  (the repository is on sys.path now)

START_ESTIMATE_S = {"hf": 10.0, "vllm": 55.0, "sglang": 100.0}     # one engine start (or, for hf, one interpreter)
SHORT = {"capture": "cap", "bench": "ben", "load": "load"}
SGLANG_FLAGS_ENV = "SPECLENS_FAULT_SGLANG_FLAGS"
PROMPT_COLS = ["repeat", "prompt_index", "prompt_id", "category", "prompt_tokens", "output_tokens", "accepted",
               "drafts", "output_hash"]
SETTING_NAMES = ("max_model_len", "max-model-len", "gpu_memory_utilization", "gpu-memory-utilization",
                 "mem-fraction-static", "mem_fraction_static", "max_num_batched_tokens", "max-num-batched-tokens",
                 "max_num_seqs", "max-num-seqs", "kv_cache_memory_bytes", "--num-spec-tokens", "--memory",
                 "context-length", "tensor parallelism", "tensor-parallel-size")
LOG_KEEP_BYTES = 1 << 20
GPU_FREE_TOLERANCE_MIB = 256


def log(msg: str) -> None:
    print(f"[fault {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def atomic_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def _err(e: BaseException) -> dict:
    return {"error": f"{type(e).__name__}: {str(e)[:1500]}", "traceback": traceback.format_exc()[-4000:]}


# ---------------------------------------------------------------------------------------------- the CLI shim

def cli_shim(argv: list[str]) -> int:
    """backend.__main__.main(argv), with SPECLENS_FAULT_SGLANG_FLAGS added to (or replacing in) every SGLang server
    command line this process builds."""
    flags = json.loads(os.environ.get(SGLANG_FLAGS_ENV) or "{}")
    if flags:
        from backend.engines import sglang as S

        orig = S.ServerSpec.argv

        def argv_with_flags(self, port: int) -> list[str]:
            a = orig(self, port)
            for k, v in flags.items():
                flag = f"--{k}"
                if flag in a:
                    if v is not True:
                        a[a.index(flag) + 1] = str(v)
                elif v is True:
                    a.append(flag)
                elif v is not None and v is not False:
                    a += [flag, str(v)]
            return a

        S.ServerSpec.argv = argv_with_flags
    from backend.__main__ import main as cli_main

    return cli_main(argv)


# ---------------------------------------------------------------------------------------------- processes, GPU

def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, state) of every process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            rest = stat.rsplit(")", 1)[1].split()
            out[int(d)] = (int(rest[1]), rest[0])
        except (OSError, IndexError, ValueError):
            continue
    return out


def descendants(pid: int) -> set[int]:
    table = _proc_table()
    kids: dict[int, list[int]] = {}
    for p, (pp, _) in table.items():
        kids.setdefault(pp, []).append(p)
    out, todo = set(), [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


_OURS: dict[int, str] = {}       # pid -> start time of every process a command of this suite started


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def remember(pid: int) -> None:
    st = _start_time(pid)
    if st is not None:
        _OURS.setdefault(pid, st)


def ours(pid: int) -> bool:
    """Alive, and the very process this suite saw start (not a later one that reused its pid)."""
    return alive(pid) and pid in _OURS and _start_time(pid) == _OURS[pid]


def proc_info(pid: int) -> dict:
    info: dict = {"pid": pid}
    try:
        info["cmd"] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:300]
        info["pgid"], info["sid"] = os.getpgid(pid), os.getsid(pid)
    except (OSError, ProcessLookupError):
        pass
    return info


def is_reaper(info: dict) -> bool:
    """A reaper of backend/engines/lifeline.py (its command line is its own code)."""
    from backend.engines.lifeline import REAPER_CODE

    return REAPER_CODE.strip()[:60] in (info.get("cmd") or "")


def gpu_used_mib() -> float | None:
    """Memory used on the GPUs (MiB, summed), None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=30)
        return float(sum(float(x) for x in r.stdout.split() if x.strip())) if r.returncode == 0 else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def gpu_apps() -> list[str] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        return [ln.strip() for ln in r.stdout.splitlines() if ln.strip()]
    except (OSError, subprocess.SubprocessError):
        return None


def wait_gpu_free(pre: float | None, timeout: float, give_up_when=None) -> dict:
    """Poll until the GPU memory used is back at `pre` (+ a tolerance): seconds it took, or what still holds it."""
    if pre is None:
        return {"gpu": None, "note": "no nvidia-smi here: GPU memory not checked"}
    t0 = time.monotonic()
    used = gpu_used_mib()
    while used is not None and used > pre + GPU_FREE_TOLERANCE_MIB and time.monotonic() - t0 < timeout:
        if give_up_when is not None and give_up_when(time.monotonic() - t0):
            break
        time.sleep(0.5)
        used = gpu_used_mib()
    freed = used is not None and used <= pre + GPU_FREE_TOLERANCE_MIB
    res = {"pre_mib": pre, "used_mib": used, "freed": freed, "seconds": round(time.monotonic() - t0, 2)}
    if not freed:
        res["compute_apps"] = gpu_apps()
    return res


def kill_pids(pids: list[int]) -> list[int]:
    """SIGKILL each (processes this suite started, directly or not, never a pid reused since); the ones still alive
    after 10 s."""
    pids = [p for p in pids if ours(p)]
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


# ---------------------------------------------------------------------------------------------- run directories

def _manifest(root: Path, rid: str) -> dict | None:
    try:
        return json.loads((root / "runs" / rid / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def _journal_units(root: Path, rid: str) -> int:
    try:
        text = (root / "runs" / rid / "journal.jsonl").read_text()
    except OSError:
        return 0
    return text.count("\n")                     # whole lines only (a unit being written has no newline yet)


def progress(root: Path, rid: str) -> dict:
    """done/total of a run as its directory says (the manifest; for a bench the journal, which is written per unit
    while the manifest's progress is saved every 2 s), whether a checkpoint exists and whether the engine is up."""
    m = _manifest(root, rid)
    if m is None:
        return {"exists": False}
    pr = m.get("progress") or {}
    done = int(pr.get("done") or 0)
    if m.get("kind") in ("bench", "load"):
        done = max(done, _journal_units(root, rid))
    total = pr.get("total")
    out = {"exists": True, "status": m.get("status"), "done": done, "total": total,
           "checkpoint": (root / "runs" / rid / "checkpoint.safetensors").exists(), "server": "server" in m}
    if total:
        out["fraction"] = round(done / total, 3)
    return out


def catalog_states(root: Path, ids: list[str]) -> dict:
    from backend.store.data_root import DataRoot

    data = DataRoot(root)
    data.catalog.write.refresh()
    st = data.catalog.read.run_states(ids)
    return dict(zip(st["run_id"], st["status"]))


def catalog_rows(root: Path, rid: str, kind: str) -> dict:
    from backend.store.data_root import DataRoot

    read = DataRoot(root).catalog.read
    row = read.get_run(rid)
    out = {"status": row and row["status"]}
    try:
        if kind == "load":
            import pandas as pd

            out["rows"] = len(pd.read_parquet(root / "runs" / rid / "levels.parquet"))
        else:
            out["rows"] = len(read.boundary_stats([rid]) if kind == "capture" else read.bench_prompts([rid]))
    except Exception as e:  # noqa: BLE001 - recorded
        out["rows_error"] = f"{type(e).__name__}: {e}"
    return out


# ---------------------------------------------------------------------------------------------- comparisons

def _frame_diffs(what: str, a, b) -> list[str]:
    """Exact (bit-level for floats, NaN equal to NaN) comparison of two frames; one line per difference."""
    import numpy as np

    if list(a.columns) != list(b.columns):
        return [f"{what}: columns differ: {sorted(set(a.columns) ^ set(b.columns))}"]
    if len(a) != len(b):
        return [f"{what}: {len(a)} rows in the reference, {len(b)} after the resume"]
    out = []
    for c in a.columns:
        x, y = a[c].to_numpy(), b[c].to_numpy()
        if x.dtype.kind == "f" and y.dtype.kind == "f":
            same = np.array_equal(x, y, equal_nan=True)
            if not same:
                d = np.nanmax(np.abs(x.astype("float64") - y.astype("float64")))
                out.append(f"{what}.{c}: {int((x != y).sum())} values differ, max abs difference {d:.3g}")
        elif not all(_same_value(u, v) for u, v in zip(x, y)):
            n = sum(not _same_value(u, v) for u, v in zip(x, y))
            out.append(f"{what}.{c}: {n} values differ")
    return out


def _same_value(u, v) -> bool:
    import numpy as np

    if isinstance(u, np.ndarray) or isinstance(v, np.ndarray):
        return np.array_equal(np.asarray(u), np.asarray(v))
    if isinstance(u, float) and isinstance(v, float) and u != u and v != v:
        return True
    return bool(u == v)


def compare_capture(ref: Path, got: Path) -> list[str]:
    """What differs between a capture and its uninterrupted reference (empty: bit-equal)."""
    import pandas as pd
    import torch
    from safetensors.torch import load_file

    ref_stats = pd.read_parquet(ref / "stats.parquet").drop(columns="run_id")
    diffs = _frame_diffs("stats", ref_stats, pd.read_parquet(got / "stats.parquet").drop(columns="run_id"))
    if (ref / "sample.safetensors").exists() or (got / "sample.safetensors").exists():
        sa, sb = load_file(str(ref / "sample.safetensors")), load_file(str(got / "sample.safetensors"))
        if sa.keys() != sb.keys():
            diffs.append(f"sample: tensors {sorted(sa)} vs {sorted(sb)}")
        for k in sorted(set(sa) & set(sb)):
            if sa[k].shape != sb[k].shape:
                diffs.append(f"sample.{k}: shape {tuple(sa[k].shape)} vs {tuple(sb[k].shape)}")
            elif not torch.equal(sa[k], sb[k]):
                d = (sa[k].double() - sb[k].double()).abs().max().item() if sa[k].is_floating_point() else None
                diffs.append(f"sample.{k}: {int((sa[k] != sb[k]).sum())} values differ (max abs {d})")
    ma, mb = json.loads((ref / "manifest.json").read_text()), json.loads((got / "manifest.json").read_text())
    for k in ("tokens", "prompts", "sample_tokens", "nonfinite"):
        if (ma.get("headline") or {}).get(k) != (mb.get("headline") or {}).get(k):
            diffs.append(f"headline.{k}: {(ma.get('headline') or {}).get(k)} vs {(mb.get('headline') or {}).get(k)}")
    pr = mb.get("progress") or {}
    if pr.get("done") != pr.get("total") or pr.get("total") != (ma.get("progress") or {}).get("total"):
        diffs.append(f"progress {pr} (reference {ma.get('progress')})")
    if (got / "checkpoint.safetensors").exists():
        diffs.append("checkpoint.safetensors left in the finished run")
    counted = ref_stats["n_tokens"]
    if not len(counted) or int(counted.min()) == 0:     # two empty captures are equal and prove nothing
        diffs.append(f"the reference's statistics hold no tokens (n_tokens {counted.tolist()}): nothing to compare")
    return diffs


def compare_bench(ref: Path, got: Path, spec: bool) -> tuple[list[str], dict]:
    """What differs between a bench run and its uninterrupted reference, and the figures side by side."""
    import pandas as pd

    a, b = pd.read_parquet(ref / "prompts.parquet"), pd.read_parquet(got / "prompts.parquet")
    diffs = []
    if b.duplicated(["repeat", "prompt_index"]).any():
        diffs.append("prompts: a unit recorded twice")
    cols = [c for c in PROMPT_COLS if c in a.columns]
    if [c for c in PROMPT_COLS if c in b.columns] != cols:
        diffs.append(f"prompts: columns {cols} vs {[c for c in PROMPT_COLS if c in b.columns]}")
    else:
        key = ["repeat", "prompt_index"]
        diffs += _frame_diffs("prompts", a[cols].sort_values(key).reset_index(drop=True),
                              b[cols].sort_values(key).reset_index(drop=True))
    if (ref / "steps.parquet").exists() or (got / "steps.parquet").exists():
        diffs += _frame_diffs("steps", pd.read_parquet(ref / "steps.parquet").drop(columns="run_id"),
                              pd.read_parquet(got / "steps.parquet").drop(columns="run_id"))
    ma, mb = json.loads((ref / "manifest.json").read_text()), json.loads((got / "manifest.json").read_text())
    figures = {}
    for k in ("tau", "acceptance_rate", "lossless", "mismatched_prompts") if spec else ("tau",):
        x, y = (ma.get("bench") or {}).get(k), (mb.get("bench") or {}).get(k)
        figures[k] = {"reference": x, "resumed": y}
        if x != y:
            diffs.append(f"bench.{k}: {x} vs {y}")
    return diffs, figures


LOAD_KEY = ["config", "concurrency", "repeat", "side"]


def compare_load(ref: Path, got: Path) -> tuple[list[str], dict]:
    """What differs between a serving-load run (resumed after a kill) and its uninterrupted reference: the same cells
    (config x concurrency x repeat x side), each with the same requests, errors and output tokens; acceptance per
    drafter cell from the server's counters side by side (batching on a GPU in bf16 may move it a little, so it is
    reported, with its largest difference, and counted as a difference only beyond 0.05 of tau)."""
    import pandas as pd

    a, b = pd.read_parquet(ref / "levels.parquet"), pd.read_parquet(got / "levels.parquet")
    diffs = []
    if b.duplicated(LOAD_KEY).any():
        diffs.append("levels: a cell recorded twice")
    ka, kb = set(map(tuple, a[LOAD_KEY].to_numpy())), set(map(tuple, b[LOAD_KEY].to_numpy()))
    if ka != kb:
        diffs.append(f"levels: cells {sorted(ka ^ kb)[:6]} in one run only")
    m = a.merge(b, on=LOAD_KEY, suffixes=("_ref", "_got"))
    for c in ("requests", "errors", "output_tokens"):
        n = int((m[f"{c}_ref"] != m[f"{c}_got"]).sum())
        if n:
            diffs.append(f"levels.{c}: {n} cells differ")
    d = m[m["side"] == "drafter"]
    taus = {f"{r.config} c={r.concurrency}": {"reference": r.tau_server_ref, "resumed": r.tau_server_got}
            for r in d.itertuples()}
    gap = (d["tau_server_ref"] - d["tau_server_got"]).abs().max() if len(d) else None
    if gap is not None and gap > 0.05:
        diffs.append(f"levels.tau_server: largest difference {gap:.3f}")
    ma, mb = json.loads((ref / "manifest.json").read_text()), json.loads((got / "manifest.json").read_text())
    if not (got / "summary.json").exists():
        diffs.append("summary.json missing after the resume")
    pr = mb.get("progress") or {}
    if pr.get("done") != pr.get("total") or pr.get("total") != (ma.get("progress") or {}).get("total"):
        diffs.append(f"progress {pr} (reference {ma.get('progress')})")
    return diffs, {"tau_server": taus, "tau_max_abs_difference": None if gap is None else round(float(gap), 4),
                   "cells": len(m)}


def cli_flags(command: str) -> set[str]:
    """The flags `python -m backend COMMAND` takes."""
    from backend.__main__ import parser

    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {o for act in sub.choices[command]._actions for o in act.option_strings}


def one_line_verdict(text: str, expect: tuple[str, ...], flags: set[str] | None = None) -> dict:
    """From a failed command's output: its `error:` lines, whether there is exactly one and it is the last line of
    the CLI's own, which settings it names, whether those include the one expected, and which `--flags` it names
    that the SpecLens command does not take (an engine's own flag: with SpecLens it is --engine-option KEY=VALUE)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.startswith("error: ")]
    last = errs[-1] if errs else None
    named = [s for s in SETTING_NAMES if last and s in last]
    dashed = sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", last or "")))
    return {"error_lines": [e[:1000] for e in errs[-3:]], "n_error_lines": len(errs), "one_line": len(errs) == 1,
            "error_is_last_line": bool(lines) and last == lines[-1], "names_settings": named,
            "names_expected_setting": any(e in (last or "") for e in expect),
            "flags_named": dashed, "flags_not_in_the_cli": None if flags is None else [f for f in dashed
                                                                                        if f not in flags],
            "tracebacks_in_output": text.count("Traceback (most recent call last)"),
            "tail": [ln[:400] for ln in lines[-15:]]}


# ---------------------------------------------------------------------------------------------- the suite

class Suite:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.t0 = time.monotonic()
        self.deadline = self.t0 + a.budget_s if a.budget_s > 0 else None
        self.root: Path = a.root
        self.logs = self.root / "fault-logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(a.seed)
        self.stamp = datetime.datetime.now().strftime("%H%M%S")
        self.current: subprocess.Popen | None = None
        self.res: dict = {"env": self.env_info(), "args": {k: str(v) for k, v in vars(a).items()},
                          "root": str(self.root), "steps": {}, "summary": {}}
        self.refs_file = self.root / "fault_refs.json"
        self.save()

    # ------------------------------------------------------------------ bookkeeping
    def env_info(self) -> dict:
        from importlib.metadata import PackageNotFoundError, distributions, version

        info = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "host": socket.gethostname(), "python": platform.python_version(),
                "command": " ".join(["python"] + sys.argv)}
        for pkg in ("torch", "transformers", "vllm", "sglang"):
            try:
                info[pkg] = version(pkg)
            except PackageNotFoundError:
                info[pkg] = None
        for engine, path in dict(self.a.engine_path).items():          # what that engine's commands import
            for pkg in ("torch", "transformers", engine):
                d = next(iter(distributions(name=pkg, path=[path])), None)
                if d is not None:
                    info[f"{engine}_env_{pkg}"] = d.version
        if shutil.which("nvidia-smi"):
            try:
                r = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                    "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
                info["gpu"] = [ln.strip() for ln in r.stdout.splitlines() if ln.strip()]
            except (OSError, subprocess.SubprocessError) as e:
                info["gpu"] = f"nvidia-smi failed: {e}"
        else:
            info["gpu"] = None
        try:
            info["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                            timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            info["commit"] = None
        return info

    def save(self) -> None:
        self.res["seconds"] = round(time.monotonic() - self.t0, 1)
        try:
            atomic_json(self.a.out / "fault_results.json", self.res)
        except Exception as e:  # noqa: BLE001 - never lose the suite over its results file
            log(f"could not write the results: {e}")

    def left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def limit(self, want: float) -> float:
        """A command's time limit: what it needs, cut to the budget left (+30 s to end it cleanly)."""
        return max(5.0, min(want, self.left() + 30))

    # ------------------------------------------------------------------ commands
    def env(self, engine: str) -> dict:
        env = dict(os.environ)
        env["SPECLENS_DATA"] = str(self.root)
        env["PYTHONUNBUFFERED"] = "1"
        extra = [dict(self.a.engine_path)[engine]] if engine in dict(self.a.engine_path) else []
        env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + extra + [
            p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO) and p not in extra])
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        env.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        env["SPECLENS_SGLANG_LOG_DIR"] = str(self.logs / "sglang")
        if engine == "hf" and self.a.hf_threads:
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.a.hf_threads)
        if engine == "sglang":
            env[SGLANG_FLAGS_ENV] = json.dumps(self.sglang_options())
        return env

    def sglang_options(self) -> dict:
        return {"mem-fraction-static": self.a.sglang_mem, **dict(self.a.sglang_option)}

    def engine_options(self, engine: str) -> list[str]:
        if engine == "vllm":
            opts = {"gpu_memory_utilization": self.a.vllm_mem, "max_model_len": 4096}
            if self.a.vllm_kv_gib > 0:
                opts["kv_cache_memory_bytes"] = int(self.a.vllm_kv_gib * 2**30)
            opts.update(dict(self.a.vllm_option))
        elif engine == "sglang":
            opts = self.sglang_options()
        else:
            return []
        out = []
        for k, v in opts.items():
            out += ["--engine-option", f"{k}={json.dumps(v) if isinstance(v, bool) else v}"]
        return out

    def argv(self, engine: str, kind: str, name: str) -> tuple[list[str], str]:
        """The command (after the interpreter) and how it is launched."""
        a, pair = self.a, self.pair
        common = ["--engine", engine, "--name", name, "--quiet"]
        common += ["--device", a.hf_device] if engine == "hf" else ["--dtype", "bf16"]
        if kind == "capture":
            cli = ["capture", "--model", str(pair / "target"), "--prompts", str(self.cap_prompts),
                   "--limit", str(self.cap_limit(engine)), "--sample-tokens", str(a.sample_tokens), *common]
            if a.exact_sums:
                cli += ["--exact-sums"]
            if engine == "vllm":
                cli += self.engine_options(engine)
        elif kind == "load":                            # a serving-load sweep: its own servers, K x concurrency
            cli = ["sweep", "--target", str(pair / "target"), "--drafter", str(pair / "drafter-matched"),
                   "--prompts", str(self.bench_prompts), "--num-spec-tokens", a.load_ks, "--concurrency",
                   a.load_concurrency, "--requests", str(a.load_requests), "--max-new-tokens", str(a.max_new_tokens),
                   "--memory", str(a.load_mem), "--engine", engine, "--name", name, "--quiet", "--dtype", "bf16"]
            for k, v in self.load_server_options(engine).items():
                cli += ["--engine-option", f"{k}={v}"]
        else:
            cli = ["bench", "--target", str(pair / "target"), "--drafter", str(pair / "drafter-matched"),
                   "--prompts", str(self.bench_prompts), "--num-spec-tokens", str(a.k), "--temperature", "0",
                   "--repeats", "1", "--limit", str(a.bench_limit if engine != "hf" else a.hf_bench_limit),
                   "--max-new-tokens", str(a.max_new_tokens if engine != "hf" else a.hf_max_new_tokens),
                   "--seed", str(a.bench_seed), *common, *self.engine_options(engine)]
            if engine == "sglang":
                cli += ["--producer", "sglang"]
        if engine == "sglang" and kind == "capture":    # its server takes no --engine-option: the shim adds them
            return [str(Path(__file__).resolve()), "--cli", *cli], "gpu/fault_suite.py --cli (backend.__main__.main)"
        return ["-m", "backend", *cli], "python -m backend"

    def load_server_options(self, engine: str) -> dict:
        """Server flags of the load step's servers: --vllm-option / --sglang-option as flags (memory: --load-mem)."""
        opts = dict(self.a.vllm_option) if engine == "vllm" else dict(self.a.sglang_option)
        return {k.replace("_", "-"): (json.dumps(v) if isinstance(v, bool) else v) for k, v in opts.items()}

    def cap_limit(self, engine: str) -> int:
        return {"vllm": self.a.vllm_cap_limit, "sglang": self.a.sglang_cap_limit, "hf": self.a.hf_cap_limit}[engine]

    def launch(self, args: list[str], engine: str, logname: str) -> tuple[subprocess.Popen, Path]:
        logf = self.logs / f"{logname}.log"
        fh = open(logf, "w")
        try:
            p = subprocess.Popen([sys.executable, *args], cwd=REPO, env=self.env(engine), stdout=fh,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            fh.close()
        remember(p.pid)
        self.current = p
        return p, logf

    def watch(self, p: subprocess.Popen, ids: list[str], timeout: float, kill_when=None) -> dict:
        """Follow a command to its end (or kill it when `kill_when(elapsed, progress) -> reason` says so, or at its
        time limit): the moments its run appeared, its engine came up, its progress first moved and it ended;
        every process it started; the catalog statuses seen meanwhile."""
        t0 = time.monotonic()
        main_id = ids[-1]
        tl: dict = {}
        seen: dict[str, list[str]] = {}
        procs: dict[int, dict] = {}
        last_scan = last_cat = 0.0
        killed = None
        while True:
            now = time.monotonic()
            el = now - t0
            pr = progress(self.root, main_id)
            if pr.get("exists") and "run_created_s" not in tl:
                tl["run_created_s"] = round(el, 2)
            if (pr.get("server") or (pr.get("done") or 0) > 0) and "ready_s" not in tl:
                tl["ready_s"] = round(el, 2)                 # engine up (SGLang capture) or first progress
            if (pr.get("done") or 0) > 0 and "first_progress_s" not in tl:
                tl["first_progress_s"] = round(el, 2)
            if pr.get("status") == "complete" and "complete_s" not in tl:
                tl["complete_s"] = round(el, 2)
            if now - last_scan > 0.5:
                for d in descendants(p.pid):
                    if d not in procs:
                        procs[d] = proc_info(d)
                        remember(d)
                last_scan = now
            if now - last_cat > 1.0:
                try:
                    for r, s in catalog_states(self.root, ids).items():
                        if s not in seen.setdefault(r, []):
                            seen[r].append(s)
                except Exception as e:  # noqa: BLE001 - a reader must never fail; recorded
                    seen.setdefault("_errors", []).append(f"{type(e).__name__}: {str(e)[:200]}")
                last_cat = now
            if p.poll() is not None:
                break
            reason = kill_when(el, pr, tl) if kill_when else None
            if reason is None and el > timeout:
                reason = f"time limit of {timeout:.0f} s"
            if reason:
                for d in descendants(p.pid):                  # the last look before the kill
                    if d not in procs:
                        procs[d] = proc_info(d)
                        remember(d)
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                killed = {"reason": reason, "seconds_since_start": round(el, 2), "progress_seen": pr}
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    pass
                break
            time.sleep(0.05)
        tl["end_s"] = round(time.monotonic() - t0, 2)
        self.current = None
        return {"exit": p.poll(), "seconds": tl["end_s"], "timeline": tl, "killed": killed,
                "processes": list(procs.values()), "catalog_seen": seen}

    def run_to_end(self, engine: str, kind: str, name: str, ids: list[str], timeout: float, phase: str) -> dict:
        args, how = self.argv(engine, kind, name)
        pre = gpu_used_mib()
        p, logf = self.launch(args, engine, f"{name}-{phase}")
        log(f"{phase} {name}: {' '.join(['python', *args])[:400]}")
        w = self.watch(p, ids, self.limit(timeout))
        w["log"] = logf.name
        w["launcher"] = how
        w["command"] = " ".join(["python", *args])
        if w["exit"] != 0:
            w["log_tail"] = _tail(logf, 12)
        left = [d["pid"] for d in w["processes"] if ours(d["pid"])]
        if left:                                   # a finished command should leave nothing behind
            w["left_running"] = [proc_info(d) for d in left]
            w["left_running_killed"] = not kill_pids(left)
        w["gpu_after"] = wait_gpu_free(pre, self.a.free_wait_s)
        log(f"{phase} {name}: exit {w['exit']} in {w['seconds']} s; GPU {w['gpu_after']}")
        if w["exit"] == 0 and kind != "load":
            self.learn(engine, kind, w["timeline"], engines_started=2 if kind == "bench" and phase == "reference"
                       else 1)
        return w

    def learn(self, engine: str, kind: str, tl: dict, engines_started: int) -> None:
        """One engine start as measured (a capture: until its engine is up; a bench: until its drafter run exists),
        for the budget's estimates of the steps still to come."""
        seen = tl.get("ready_s") if kind == "capture" else tl.get("run_created_s")
        if seen:
            START_ESTIMATE_S[engine] = max(5.0, seen / engines_started + 5)
            self.res.setdefault("start_estimates_s", {})[engine] = round(START_ESTIMATE_S[engine], 1)

    # ------------------------------------------------------------------ steps
    def setup(self) -> None:
        from backend.demo import heldout_prompts, toy_pair
        from backend.store.data_root import DataRoot

        self.pair = toy_pair(DataRoot(self.root))
        if self.pair is None:
            raise RuntimeError("models/toy-pair.tar.gz is missing from the checkout")
        self.bench_prompts = heldout_prompts(self.pair)
        self.cap_prompts = REPO / "datasets" / "spec_bench" / "question.jsonl"
        self.res["pair"] = str(self.pair)

    def refs(self) -> dict:
        try:
            return json.loads(self.refs_file.read_text())
        except (OSError, ValueError):
            return {}

    def reference(self, engine: str, kind: str) -> dict:
        """The uninterrupted reference run of (engine, kind): an earlier one of this root when it ended whole with
        the same command, else run now."""
        short = SHORT[kind]
        base = f"ref-{engine}-{short}"
        known = self.refs().get(base)
        if known and (_manifest(self.root, known["name"]) or {}).get("status") == "complete" and \
                known.get("argv") == self.argv(engine, kind, known["name"])[0]:
            log(f"reference {known['name']}: reused (complete, uninterrupted, same command)")
            return {**known["record"], "reused": True, "name": known["name"]}
        name = base if not (self.root / "runs" / base).exists() else f"{base}-{self.stamp}"
        ids = [f"{name}-baseline", name] if kind == "bench" else [name]
        w = self.run_to_end(engine, kind, name, ids, self.a.run_timeout_s, "reference")
        w["name"] = name
        status = (_manifest(self.root, name) or {}).get("status")
        w["status"] = status
        if w["exit"] == 0 and status == "complete":
            refs = self.refs()
            refs[base] = {"name": name, "argv": self.argv(engine, kind, name)[0], "record": w}
            atomic_json(self.refs_file, refs)
        return w

    def trial_step(self, engine: str, kind: str) -> dict:
        step: dict = {"engine": engine, "kind": kind, "trials": []}
        self.res["steps"][f"{engine}-{kind}"] = step
        ref = self.reference(engine, kind)
        step["reference"] = ref
        self.save()
        if ref.get("exit") != 0 or ref.get("status") != "complete":
            step["status"] = "error"
            step["error"] = f"the reference run did not finish (exit {ref.get('exit')}, status {ref.get('status')})"
            return step
        for i in range(self.a.trials):
            if self.left() < self.trial_estimate(engine):
                step["trials"].append({"status": "skipped", "why": "time budget (--budget-s) nearly spent"})
                break
            t = {"trial": i}
            step["trials"].append(t)
            try:
                self.trial(engine, kind, ref, t)
                t.setdefault("status", "ok")
            except Exception as e:  # noqa: BLE001 - recorded, the suite goes on
                t.update(status="error", **_err(e))
                log(f"trial {engine} {kind} {i}: ERROR {t['error']}")
            finally:
                self.sweep()
                self.save()
        step["status"] = "ok" if all(t.get("status") == "ok" for t in step["trials"]) else "incomplete"
        return step

    def trial_estimate(self, engine: str) -> float:
        return 2 * START_ESTIMATE_S[engine] + 20

    def trial(self, engine: str, kind: str, ref: dict, t: dict) -> None:
        short = SHORT[kind]
        name = f"kill-{engine}-{short}-{self.stamp}-{t['trial']}"
        ids = [name]
        t["name"] = name
        target = round(self.rng.uniform(self.a.kill_from, self.a.kill_to), 3)
        ref_tl = ref.get("timeline") or {}
        by_time = (engine == "sglang" and kind == "capture") if self.a.kill_mode == "auto" else \
            self.a.kill_mode == "time"                         # an SGLang capture: no progress until it ends
        work = max(0.5, ref_tl.get("complete_s", ref.get("seconds", 0)) - ref_tl.get("ready_s", 0)) if by_time \
            else None
        t["kill_plan"] = ({"mode": "time after the server came up", "fraction_of_reference_work": target,
                           "reference_work_s": round(work, 2)} if by_time else
                          {"mode": "progress", "at_fraction": target})

        def kill_when(el: float, pr: dict, tl: dict) -> str | None:
            if by_time:
                if "ready_s" in tl and el - tl["ready_s"] >= target * work:
                    return f"{el - tl['ready_s']:.2f} s after the server came up"
                return None
            total, done = pr.get("total"), pr.get("done") or 0
            if total and done / total >= target and done < total:
                return f"progress {done}/{total}"
            return None

        args, how = self.argv(engine, kind, name)
        t["command"] = " ".join(["python", *args])
        t["launcher"] = how
        pre = gpu_used_mib()
        t["gpu_before_mib"] = pre
        shm_before = _shm()
        p, logf = self.launch(args, engine, f"{name}-trial")
        log(f"trial {name}: started, kill plan {t['kill_plan']}")
        w = self.watch(p, ids, self.limit(self.a.run_timeout_s), kill_when)
        t["trial_log"] = logf.name
        kill = w.pop("killed")
        t["run"] = {k: v for k, v in w.items()}
        own_baseline = (self.root / "runs" / f"{name}-baseline").exists()
        if own_baseline:
            ids = [f"{name}-baseline", name]
        t["ids"] = ids
        if kill is None:
            t["killed"] = False
            t["status"] = "not killed"
            t["why"] = f"the command ended (exit {w['exit']}) before the kill point"
            log(f"trial {name}: ended before the kill point (exit {w['exit']})")
        else:
            t["killed"] = True
            at = kill["progress_seen"]
            t["kill"] = {"reason": kill["reason"], "seconds_since_start": kill["seconds_since_start"],
                         "done": at.get("done"), "total": at.get("total"), "fraction": at.get("fraction"),
                         "exit": w["exit"], "kept": {r: progress(self.root, r) for r in ids}}
            log(f"trial {name}: killed ({kill['reason']}) after {kill['seconds_since_start']} s")
        # what outlived the kill of the process group, and the GPU memory
        survivors = [d["pid"] for d in w["processes"] if ours(d["pid"])]
        reapers = [x for x in survivors if is_reaper(proc_info(x))]   # SpecLens's own watchdogs: they outlive the
        survivors = [x for x in survivors if x not in reapers]         # kill by design, kill the servers, then exit
        t["reapers"] = [proc_info(x) for x in reapers]
        t["outlived_kill"] = [proc_info(x) for x in survivors]
        t_kill = time.monotonic()
        t["gpu_after_kill"] = wait_gpu_free(
            pre, self.a.free_wait_s,
            give_up_when=lambda s: bool(survivors) and s > self.a.survivor_wait_s and any(ours(x) for x in survivors))
        still = [x for x in survivors if ours(x)]
        t["outlived_kill_after_wait"] = [proc_info(x) for x in still]
        if survivors:
            log(f"trial {name}: {len(survivors)} processes outlived the group kill "
                f"({len(still)} after {time.monotonic() - t_kill:.1f} s): {[proc_info(x) for x in still][:4]}")
        if still:
            t["cleanup"] = {"killed": still, "not_dying": kill_pids(still),
                            "gpu": wait_gpu_free(pre, self.a.free_wait_s)}
        from backend.engines.lifeline import LINGER_S

        end = time.monotonic() + LINGER_S + 2
        while reapers and any(ours(x) for x in reapers) and time.monotonic() < end:
            time.sleep(0.1)
        t["reapers_left"] = [proc_info(x) for x in reapers if ours(x)]    # past their linger: a finding
        if shm_before is not None:
            new_shm = sorted(set(_shm() or []) - set(shm_before))
            t["dev_shm_left"] = {"count": len(new_shm), "names": new_shm[:20]}
        self.save()
        # the status the catalog shows now
        try:
            after = catalog_states(self.root, ids)
        except Exception as e:  # noqa: BLE001
            after = {"_error": f"{type(e).__name__}: {e}"}
        t["status_after_kill"] = {"catalog": after, "manifest": {r: (_manifest(self.root, r) or {}).get("status")
                                                                 for r in ids}}
        if kill is not None:
            t["interrupted_ok"] = all(after.get(r) in (None, "interrupted") for r in ids) and \
                after.get(name) == "interrupted"
            t["never_complete_while_unfinished"] = "complete" not in w["catalog_seen"].get(name, [])
        self.save()
        # resume: the same command to the end
        if kill is not None:
            r = self.run_to_end(engine, kind, name, ids, self.a.run_timeout_s, "resume")
            t["resume"] = r
            t["resumed_ok"] = r["exit"] == 0 and (_manifest(self.root, name) or {}).get("status") == "complete"
        # the result against the reference (also when the trial ended before its kill point)
        if (_manifest(self.root, name) or {}).get("status") == "complete":
            try:
                runs = self.root / "runs"
                if kind == "capture":
                    diffs, figures = compare_capture(runs / ref["name"], runs / name), None
                elif kind == "load":
                    diffs, figures = compare_load(runs / ref["name"], runs / name)
                else:
                    diffs, figures = compare_bench(runs / ref["name"], runs / name, spec=True)
                    rb = (_manifest(self.root, ref["name"]) or {}).get("baseline_run")
                    tb = (_manifest(self.root, name) or {}).get("baseline_run")
                    t["baseline_runs"] = {"reference": rb, "trial": tb}
                    if rb and tb and rb != tb:
                        d2, _ = compare_bench(runs / rb, runs / tb, spec=False)
                        diffs += [f"baseline {x}" for x in d2]
                t["equal"] = not diffs
                t["differences"] = diffs[:40]
                if figures:
                    t["figures"] = figures
                t["catalog_after_resume"] = {"trial": catalog_rows(self.root, name, kind),
                                             "reference": catalog_rows(self.root, ref["name"], kind)}
            except Exception as e:  # noqa: BLE001
                t["equal"] = None
                t["compare_error"] = _err(e)
        else:
            t["equal"] = None
        log(f"trial {name}: interrupted_ok={t.get('interrupted_ok')} resumed_ok={t.get('resumed_ok')} "
            f"equal={t.get('equal')} {t.get('differences', [])[:3]}")

    def oom_step(self, engine: str) -> dict:
        step: dict = {"engine": engine, "cases": {}}
        self.res["steps"][f"{engine}-oom"] = step
        pair = self.pair
        if engine == "vllm":
            cap = ["capture", "--model", str(pair / "target"), "--prompts", str(self.cap_prompts), "--limit", "4",
                   "--engine", "vllm", "--dtype", "bf16", "--quiet"]
            cases = {
                "context": (cap + ["--engine-option", "max_model_len=1000000",
                                   "--engine-option", "gpu_memory_utilization=0.02"],
                            {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}, ("max_model_len", "max-model-len")),
                "memory": (cap + ["--engine-option", "gpu_memory_utilization=0.001"], {},
                           ("gpu_memory_utilization", "gpu-memory-utilization")),
                "batch": (cap + ["--engine-option", "max_num_batched_tokens=1000000",
                                 "--engine-option", "max_num_seqs=1024", "--engine-option", "max_model_len=4096",
                                 "--engine-option", "gpu_memory_utilization=0.03"], {},
                          ("max_num_batched_tokens", "max-num-batched-tokens", "max_num_seqs")),
            }
        elif engine == "sglang":
            ben = ["bench", "--target", str(pair / "target"), "--drafter", str(pair / "drafter-matched"),
                   "--prompts", str(self.bench_prompts), "--limit", "2", "--max-new-tokens", "8", "--repeats", "1",
                   "--engine", "sglang", "--dtype", "bf16", "--producer", "sglang", "--quiet"]
            flags = [x for k, v in dict(self.a.sglang_option).items()
                     for x in ("--engine-option", f"{k}={json.dumps(v) if isinstance(v, bool) else v}")]
            cases = {"memory": (ben + flags + ["--engine-option", "mem-fraction-static=0.001"], {},
                                ("mem-fraction-static", "--memory"))}
        else:
            step["status"] = "skipped"
            step["why"] = f"no OOM case for engine {engine}"
            return step
        for case, (cli, extra_env, expect) in cases.items():
            if case not in self.a.oom_cases.split(","):
                continue
            if self.left() < START_ESTIMATE_S[engine]:
                step["cases"][case] = {"status": "skipped", "why": "time budget (--budget-s) nearly spent"}
                continue
            name = f"oom-{engine}-{case}-{self.stamp}"
            cli = cli + ["--name", name]
            c: dict = {"command": " ".join(["python", "-m", "backend", *cli]), "env": extra_env}
            step["cases"][case] = c
            try:
                pre = gpu_used_mib()
                env = {**self.env(engine), **extra_env}
                logf = self.logs / f"{name}.log"
                with open(logf, "w") as fh:
                    t = time.monotonic()
                    p = subprocess.Popen([sys.executable, "-m", "backend", *cli], cwd=REPO, env=env, stdout=fh,
                                         stderr=subprocess.STDOUT, start_new_session=True)
                    remember(p.pid)
                    self.current = p
                    w = self.watch(p, [name], self.limit(self.a.oom_timeout_s))
                c.update(exit=w["exit"], seconds=round(time.monotonic() - t, 1), log=logf.name,
                         killed_at_time_limit=w["killed"] is not None)
                try:
                    flags = cli_flags(cli[0])
                except Exception:  # noqa: BLE001 - the check is optional
                    flags = None
                c.update(one_line_verdict(logf.read_text(errors="replace"), expect, flags))
                try:
                    c["run_status"] = catalog_states(self.root, [name]).get(name)
                except Exception as e:  # noqa: BLE001
                    c["run_status"] = f"catalog: {type(e).__name__}: {e}"
                left = [d["pid"] for d in w["processes"] if ours(d["pid"])]
                if left:
                    c["left_running"] = [proc_info(x) for x in left]
                    kill_pids(left)
                c["gpu_after"] = wait_gpu_free(pre, self.a.free_wait_s)
                c["status"] = "ok"
                log(f"oom {engine} {case}: exit {c['exit']} in {c['seconds']} s: {(c['error_lines'] or ['-'])[-1]}")
            except Exception as e:  # noqa: BLE001
                c.update(status="error", **_err(e))
                log(f"oom {engine} {case}: ERROR {c['error']}")
            finally:
                self.sweep()
                self.save()
        step["status"] = "ok" if all(c.get("status") == "ok" for c in step["cases"].values()) else "incomplete"
        return step

    def sweep(self) -> list[dict]:
        """Kill whatever this suite started that still runs (an engine child left by a kill, a command at the
        suite's own end); recorded."""
        if self.current is not None and self.current.poll() is None:
            try:
                os.killpg(self.current.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        left = [p for p in sorted(_OURS) if ours(p) and p != os.getpid()]
        if not left:
            return []
        info = [proc_info(p) for p in left]
        kill_pids(left)
        self.res.setdefault("swept", []).append({"at_s": round(time.monotonic() - self.t0, 1), "processes": info})
        return info

    def summarize(self) -> None:
        trials = [dict(t, engine=s["engine"], kind=s["kind"]) for s in self.res["steps"].values()
                  for t in s.get("trials", []) if t.get("name")]
        killed = [t for t in trials if t.get("killed")]
        per = {}
        for t in trials:
            per.setdefault(f"{t['engine']}-{t['kind']}", []).append({
                "killed_at": f"{(t.get('kill') or {}).get('done')}/{(t.get('kill') or {}).get('total')}",
                "kill_s": (t.get("kill") or {}).get("seconds_since_start"),
                "status_after_kill": (t.get("status_after_kill") or {}).get("catalog", {}).get(t["name"]),
                "resumed_ok": t.get("resumed_ok"), "equal": t.get("equal"),
                "gpu_freed_s": (t.get("gpu_after_kill") or {}).get("seconds")
                if (t.get("gpu_after_kill") or {}).get("freed") else None,
                "outlived_kill": len(t.get("outlived_kill") or []),
                "reference_s": (self.res["steps"][f"{t['engine']}-{t['kind']}"].get("reference") or {}).get("seconds"),
            })
        ooms = [dict(c, engine=s["engine"], case=k) for s in self.res["steps"].values()
                for k, c in s.get("cases", {}).items() if c.get("status") == "ok"]
        self.res["summary"] = {
            "trials": len(trials), "killed_mid_run": len(killed),
            "interrupted_after_kill": sum(bool(t.get("interrupted_ok")) for t in killed),
            "complete_seen_while_unfinished": sum(t.get("never_complete_while_unfinished") is False for t in killed),
            "resumed_ok": sum(bool(t.get("resumed_ok")) for t in killed),
            "equal_to_reference": sum(t.get("equal") is True for t in trials),
            "different_from_reference": sum(t.get("equal") is False for t in trials),
            "gpu_freed_after_kill": sum(bool((t.get("gpu_after_kill") or {}).get("freed")) for t in killed),
            "gpu_checked": sum((t.get("gpu_after_kill") or {}).get("gpu", 0) is not None for t in killed),
            "trials_with_processes_outliving_the_kill": sum(bool(t.get("outlived_kill")) for t in killed),
            "gpu_freed_only_after_killing_those": sum(bool(((t.get("cleanup") or {}).get("gpu") or {}).get("freed"))
                                                      for t in killed),
            "per_step": per,
            "oom_cases": len(ooms),
            "oom_one_line": sum(bool(c.get("one_line")) for c in ooms),
            "oom_names_expected_setting": sum(bool(c.get("names_expected_setting")) for c in ooms),
            "oom": {f"{c['engine']}-{c['case']}": {"exit": c.get("exit"), "one_line": c.get("one_line"),
                                                   "names": c.get("names_settings"),
                                                   "error": (c.get("error_lines") or [None])[-1]} for c in ooms},
        }

    def pack_logs(self) -> dict:
        name = self.a.out / "fault_logs.tar.gz"
        tmp = self.a.out / "fault_logs.tar.gz.tmp"
        with tarfile.open(tmp, "w:gz") as tf:
            for f in sorted(self.logs.rglob("*")):
                if not f.is_file():
                    continue
                data = f.read_bytes()[-LOG_KEEP_BYTES:]
                info = tarfile.TarInfo(str(f.relative_to(self.logs)))
                info.size, info.mtime = len(data), int(f.stat().st_mtime)
                tf.addfile(info, io.BytesIO(data))
        os.replace(tmp, name)
        return {"file": name.name, "bytes": name.stat().st_size}

    def main(self) -> int:
        a = self.a
        try:
            self.setup()
        except Exception as e:  # noqa: BLE001
            self.res["fatal"] = _err(e)
            self.save()
            return 1
        engines = [e for e in a.engines.split(",") if e]
        plan = [(f"{e}-{k}", e, k) for e in engines for k in ("capture", "bench")] + \
               [(f"{e}-{k}", e, k) for e in engines if e != IN_PROCESS_ENGINE for k in ("load", "oom")]
        wanted = set(a.steps.split(",")) if a.steps else None
        if a.steps:  # the order given (e.g. one bench trial per engine before any capture)
            plan = [p for s in a.steps.split(",") for p in plan if p[0] == s]
        estimates = {"capture": lambda e: 3 * START_ESTIMATE_S[e] + 30, "bench": lambda e: 4 * START_ESTIMATE_S[e] + 40,
                     "load": lambda e: 3 * START_ESTIMATE_S[e] + 60,
                     "oom": lambda e: START_ESTIMATE_S[e]}
        for step, engine, kind in plan:
            if wanted is not None and step not in wanted:
                continue
            need = estimates[kind](engine)
            if self.left() < need:
                self.res["steps"][step] = {"engine": engine, "kind": kind, "status": "skipped",
                                           "why": f"time budget: {self.left():.0f} s left, about {need:.0f} s needed"}
                log(f"{step}: skipped ({self.left():.0f} s left, about {need:.0f} s needed)")
                self.save()
                continue
            log(f"{step}: start ({self.left():.0f} s of budget left)")
            try:
                if kind == "oom":
                    self.oom_step(engine)
                else:
                    self.trial_step(engine, kind)
            except Exception as e:  # noqa: BLE001 - recorded, the suite goes on
                self.res["steps"].setdefault(step, {"engine": engine, "kind": kind}).update(status="error", **_err(e))
                log(f"{step}: ERROR {type(e).__name__}: {e}")
            finally:
                self.sweep()
                self.summarize()
                self.save()
        return 0


def _shm() -> list[str] | None:
    try:
        return os.listdir("/dev/shm")
    except OSError:
        return None


def _tail(f: Path, n: int) -> list[str]:
    try:
        return [ln[:400] for ln in f.read_text(errors="replace").splitlines() if ln.strip()][-n:]
    except OSError:
        return []


def _kv(text: str) -> tuple[str, object]:
    k, _, v = text.partition("=")
    try:
        return k, json.loads(v)
    except ValueError:
        return k, v


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="kill -9 / resume / OOM trials of vLLM and SGLang engines "
                                            "(see the module docstring)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/speclens-fault-out")),
                   help="results folder (fault_results.json, fault_logs.tar.gz)")
    p.add_argument("--root", type=Path, default=None,
                   help="data root (default: a fresh /tmp/speclens-fault/<time>); never the default data root")
    p.add_argument("--engines", default="vllm,sglang", help="comma-separated: vllm, sglang, hf (the CPU dry run)")
    p.add_argument("--steps", default=None,
                   help="only these steps, comma-separated: ENGINE-capture, ENGINE-bench, ENGINE-load, ENGINE-oom")
    p.add_argument("--budget-s", type=float, default=540.0, help="start no step after this (0: no limit)")
    p.add_argument("--trials", type=int, default=1, help="kill trials per step (each against the same reference)")
    p.add_argument("--seed", type=int, default=20261205, help="for the kill points")
    p.add_argument("--kill-from", type=float, default=0.25, help="kill once the progress passes a random point ...")
    p.add_argument("--kill-to", type=float, default=0.75, help="... between these fractions")
    p.add_argument("--kill-mode", choices=("auto", "progress", "time"), default="auto",
                   help="auto: by progress, an SGLang capture by time after its server came up")
    p.add_argument("--vllm-cap-limit", type=int, default=448, help="capture prompts (vLLM checkpoints every 64)")
    p.add_argument("--sglang-cap-limit", type=int, default=256)
    p.add_argument("--hf-cap-limit", type=int, default=48, help="(HF checkpoints every 16)")
    p.add_argument("--sample-tokens", type=int, default=1024)
    p.add_argument("--exact-sums", action="store_true", help="captures with order-free statistics sums")
    p.add_argument("--bench-limit", type=int, default=24)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--hf-bench-limit", type=int, default=6)
    p.add_argument("--hf-max-new-tokens", type=int, default=24)
    p.add_argument("--k", type=int, default=4, help="draft tokens per step")
    p.add_argument("--bench-seed", type=int, default=7,
                   help="the same for reference and trials, so the trial links the reference's baseline run")
    p.add_argument("--hf-device", default="cpu")
    p.add_argument("--hf-threads", type=int, default=1, help="OMP_NUM_THREADS of hf commands (0: leave)")
    p.add_argument("--vllm-mem", type=float, default=0.08, help="vLLM gpu_memory_utilization")
    p.add_argument("--vllm-kv-gib", type=float, default=2.0,
                   help="vLLM kv_cache_memory_bytes (GiB; skips the memory profiling, which fails when another "
                        "process frees memory meanwhile); 0: let vLLM profile")
    p.add_argument("--vllm-option", action="append", type=_kv, default=[], metavar="KEY=VALUE")
    p.add_argument("--sglang-mem", type=float, default=0.08, help="SGLang mem-fraction-static")
    p.add_argument("--sglang-option", action="append", type=_kv, default=None, metavar="KEY=VALUE",
                   help="SGLang server flags (default: attention-backend=triton, disable-cuda-graph=true)")
    p.add_argument("--engine-path", action="append", type=lambda v: tuple(v.split("=", 1)), default=[],
                   metavar="ENGINE=DIR", help="put DIR first on PYTHONPATH for that engine's commands, e.g. "
                   "vllm=/tmp/site_vllm sglang=/tmp/site_sgl (one invocation for both engines)")
    p.add_argument("--oom-cases", default="context,memory,batch")
    p.add_argument("--load-ks", default="2,4", help="the load step's K values (a sweep: K x concurrency)")
    p.add_argument("--load-concurrency", default="1,8")
    p.add_argument("--load-requests", type=int, default=32, help="requests per level and side")
    p.add_argument("--load-mem", type=float, default=0.06, help="GPU memory fraction of each server it starts")
    p.add_argument("--run-timeout-s", type=float, default=300.0, help="one command's limit")
    p.add_argument("--oom-timeout-s", type=float, default=240.0)
    p.add_argument("--free-wait-s", type=float, default=60.0, help="wait at most this for the GPU memory")
    p.add_argument("--survivor-wait-s", type=float, default=10.0,
                   help="stop waiting for the GPU memory this long after a kill when processes outlived it")
    a = p.parse_args(argv)
    if a.sglang_option is None:
        a.sglang_option = [("attention-backend", "triton"), ("disable-cuda-graph", True)]
    bad = [e for e in a.engines.split(",") if e and e not in ENGINE_NAMES]
    if bad:
        p.error(f"--engines: unknown {bad}")
    if not 0 < a.kill_from <= a.kill_to < 1:
        p.error("--kill-from/--kill-to: 0 < from <= to < 1")
    return a


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--cli":
        return cli_shim(sys.argv[2:])
    a = parse_args()
    if a.root is None:
        a.root = Path("/tmp/speclens-fault") / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    a.out.mkdir(parents=True, exist_ok=True)
    a.root.mkdir(parents=True, exist_ok=True)
    suite = Suite(a)

    def on_term(signum, frame):             # `timeout` sends SIGTERM: clean up through the finally below
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)
    rc = 1
    try:
        rc = suite.main()
    except BaseException as e:
        suite.res["fatal"] = _err(e)
        raise
    finally:
        suite.sweep()
        suite.summarize()
        try:
            suite.res["logs"] = suite.pack_logs()
        except Exception as e:  # noqa: BLE001
            suite.res["logs"] = {"error": f"{type(e).__name__}: {e}"}
        suite.save()
        log(f"summary: {json.dumps({k: v for k, v in suite.res['summary'].items() if k != 'per_step'})}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
