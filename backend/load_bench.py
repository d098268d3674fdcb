"""A serving-load bench run (kind "load"): speculative decoding through an engine's OpenAI-compatible server at
several concurrency levels, each level paired with a baseline server of the same target without a drafter (same
prompts, same order, same max tokens), for one or more drafter configurations (K, and for the speedup ceiling a
synthetic acceptance length). One K and one level is a bench at that load; K x concurrency is a sweep.

    python -m backend bench --engine vllm --target T --drafter D --prompts P --concurrency 1,8,32,64
    python -m backend sweep --engine vllm --target T --drafter D --prompts P --num-spec-tokens 1,2,4,6 \
        --concurrency 1,8,32,64
    python -m backend sweep --engine vllm --target T8B --drafter D8B --load-format dummy --num-spec-tokens 3 \
        --synthetic-tau 1,1.5,2,2.5,3,3.5,4 --concurrency 1,8,32,64     # what a better drafter is worth

Per level and side: output tokens/s over the level (the `vllm bench serve` figure), requests/s, TTFT, TPOT and
ITL percentiles, and acceptance from the server's own counters (a delta of `/metrics` around the level,
backend/server_metrics.py) next to SpecLens's own per-request count (backend/load_client.py), with their relative
difference. The two sides of a level run back to back, their order alternating from level to level, and the
machine's load is recorded beside each; with every server up, a sweep goes level by level (all configurations at one
concurrency, then the next), so the baseline's pairings at one level lie close together in time.
Cells are journalled as they finish: the same command resumes.

Files (docs/SCHEMA.md): manifest.json (kind "load"), levels.parquet (one row per config x concurrency x repeat x
side), requests.parquet (one row per request), summary.json (per config x concurrency: speedup with its interval,
tau from both sources; best K per concurrency; where speculative decoding stops paying), servers/ (logs).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from backend import metrics, server_metrics
from backend.errors import SpecLensError
from backend.load_client import run_level, scrape, served_model, server_version
from backend.runs.lifecycle import Run, RunGuard
from backend.runs.manifest import Manifest
from backend.settings import Config, LoadSettings  # noqa: F401 (LoadSettings: its home is backend/settings.py)
from backend.store.data_root import DataRoot
from backend.store.rundir import COMPLETE, atomic_write_json, atomic_write_parquet, new_run_id, read_journal

JOURNAL = "journal.jsonl"
SIDES = ("baseline", "drafter")


def _validate(s: LoadSettings) -> None:
    if s.server_url and not s.baseline_url:
        raise SpecLensError("--server-url needs --baseline-url: a server of the same target without a drafter, for the "
                            "paired baseline at each concurrency level")
    if s.server_url and len(s.configs()) > 1:
        raise SpecLensError(f"--server-url serves one drafter configuration; got {len(s.configs())} "
                            f"({', '.join(c.label for c in s.configs())}): leave --server-url out to let SpecLens "
                            "start one server per configuration")
    if not s.server_url and not s.drafter:
        raise SpecLensError("a load bench needs --drafter (or --server-url of a running drafter server)")
    if s.synthetic_tau and any(not 1.0 <= t <= k + 1 for t in s.synthetic_tau for k in s.num_spec_tokens):
        raise SpecLensError(f"--synthetic-tau {s.synthetic_tau}: each must lie in [1, K+1] for every K "
                            f"{s.num_spec_tokens} (vLLM's own bound)")
    if s.max_tokens < 2:
        raise SpecLensError(f"--max-tokens {s.max_tokens}: must be >= 2 (TPOT needs two tokens)")


def _encode(s: LoadSettings) -> tuple[list, list[list[int]], object]:
    from backend.engines.base import target_info
    from backend.prompts import encode_all, load_prompts

    prompts = load_prompts(s.prompts, s.limit)
    info = target_info(s.target)
    if s.chat_template and not getattr(info.tokenizer, "chat_template", None):
        raise SpecLensError(f"{s.target}: the tokenizer has no chat template but the prompts are chat turns; pass "
                            "--no-chat-template")
    seqs = encode_all(info.tokenizer, prompts, s.prompts, s.chat_template, s.max_prompt_tokens)
    return prompts, seqs, info


def _machine_load() -> dict:
    """The load beside a level: 1-minute load average, CPU utilisation, other SpecLens benches running, and on a GPU
    node the compute processes on the GPUs and their utilisation (NVML, when nvidia-ml-py is there: a process that is
    not one of the run's servers shares the GPU with them)."""
    import psutil

    from backend.machine_load import LoadProbe

    others = 0
    me = os.getpid()
    for p in psutil.process_iter(["pid", "cmdline"]):            # SpecLens processes, told apart as the bench does
        cmd = p.info.get("cmdline") or []
        if p.info["pid"] != me and LoadProbe.is_speclens(cmd) and any(w in cmd for w in ("bench", "sweep", "demo")):
            others += 1
    out = {"load1": os.getloadavg()[0], "cpu_percent": psutil.cpu_percent(interval=None), "other_speclens": others,
           "gpu_processes": None, "gpu_util": None}
    try:
        import pynvml
        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        out["gpu_processes"] = sum(len(pynvml.nvmlDeviceGetComputeRunningProcesses(h)) for h in hs)
        out["gpu_util"] = max(pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in hs) if hs else None
    except Exception:  # noqa: BLE001 - no NVML here (a CPU machine, a remote server): not recorded
        pass
    return out


# ---------------------------------------------------------------------- one cell


def _measure(engine: str, url: str, model: str | None, seqs: list[list[int]], c: int, n: int, s: LoadSettings,
             k: int, keep: Path | None = None) -> tuple[dict, list[dict]]:
    """One level on one server: counters before/after, the requests, the figures. `keep`: where the raw /metrics
    texts around the level are kept (gzip), the evidence behind the server's acceptance figures."""
    order = [i % len(seqs) for i in range(n)]
    text_before = scrape(url)
    before = server_metrics.parse(text_before, engine)
    load = _machine_load()
    results, seconds = run_level(engine, url, seqs, order, c, s.max_tokens, s.temperature, model)
    text_after = scrape(url)
    after = server_metrics.parse(text_after, engine)
    if keep is not None:
        import gzip
        keep.parent.mkdir(parents=True, exist_ok=True)
        for tag, text in (("before", text_before), ("after", text_after)):
            with gzip.open(keep.with_name(f"{keep.name}-{tag}.txt.gz"), "wt") as fh:
                fh.write(text)
    ok = [r for r in results if r.error is None]
    errors = [r.error for r in results if r.error is not None]
    if not ok:
        raise SpecLensError(f"every request to {url} failed at concurrency {c} (first: {errors[0]}); check the "
                            "server log")
    out_tokens = sum(r.output_tokens for r in ok)
    row: dict = {"requests": len(ok), "errors": len(errors), "first_error": errors[0] if errors else None,
                 "output_tokens": out_tokens, "seconds": seconds,
                 "output_tps": metrics.throughput(out_tokens, seconds),
                 "req_per_s": len(ok) / seconds if seconds > 0 else None,
                 "per_user_tps": metrics.percentiles([r.output_tokens / r.latency for r in ok if r.latency],
                                                     (50,))["p50"],
                 **load}
    for name, vals in (("ttft", [r.ttft for r in ok]), ("tpot", [r.tpot for r in ok]),
                       ("itl", [x for r in ok for x in r.itl])):
        for q, v in metrics.percentiles(vals).items():
            row[f"{name}_{q}"] = v
    row["tpot_mean"] = metrics.mean_std([r.tpot for r in ok if r.tpot is not None] or [float("nan")])[0]
    try:
        iv = server_metrics.delta(before, after)
    except server_metrics.CounterReset as e:
        raise SpecLensError(f"server {url} restarted during the level at concurrency {c} ({e}); run the same command "
                            "again to redo this level") from None
    acc = iv.acceptance(k) if k else None
    row.update(drafts_server=iv.drafts if k else None, accepted_server=iv.accepted if k else None,
               tau_server=acc.tau if acc and acc.drafts else None,
               acceptance_rate_server=acc.acceptance_rate if acc and acc.drafts else None,
               per_pos_server=json.dumps(acc.per_pos_rate) if acc and acc.per_pos_rate else None)
    row.update(own_count(ok, engine, k))
    row["tau_agreement"] = metrics.agreement(row.get("tau_client"), row.get("tau_server"))
    return row, [r.row() for r in results]


def own_count(ok: list, engine: str, k: int) -> dict:
    """The level's own count of verification steps from its requests' streams: drafts_client, accepted_client,
    tau_client and merged_requests (vLLM requests with a chunk of more than K+1 tokens: merged steps).

    A level where the server coalesced any stream has no own count: a merge of steps that stays within K+1 tokens
    (two steps of one token each read as one step with one accepted) cannot be told from a real step, so the other
    requests' count is biased upward too, and the server's counters stand alone there."""
    own = [r for r in ok if r.drafts is not None]
    merged = [r for r in own if engine == "vllm" and r.max_chunk > k + 1]
    out = {"merged_requests": len(merged) if k else None, "drafts_client": None, "accepted_client": None,
           "tau_client": None}
    if k and own and not merged:
        d, a = sum(r.drafts for r in own), sum(r.accepted or 0 for r in own)
        out.update(drafts_client=d, accepted_client=a, tau_client=1 + a / d if d else None)
    return out


# ---------------------------------------------------------------------- the run


@dataclass
class LoadResult:
    run_id: str
    path: Path
    status: str
    summary: dict | None = None


def _manifest(s: LoadSettings, info, n_cells: int) -> dict:
    from backend.model_id import fingerprint, identity

    drafter = None
    if s.drafter:
        drafter = {"path": str(Path(s.drafter).resolve()), **identity(s.drafter)}
    return {"kind": "load", "engine": s.engine, "engine_version": None,
            "model": {"path": str(Path(s.target).resolve()), "model_type": info.model_type, "n_layers": info.n_layers,
                      "hidden_size": info.hidden_size, "fingerprint": fingerprint(s.target)},
            "drafter": drafter, "dtype": s.dtype, "dataset": Path(s.prompts).name,
            "settings": s.model_dump(mode="json"), "identity": s.identity(),
            "progress": {"done": 0, "total": n_cells}}


def _cells(s: LoadSettings) -> list[tuple[Config, int, int]]:
    return [(cfg, c, r) for cfg in s.configs() for c in s.concurrency for r in range(s.repeats)]


def run_load(s: LoadSettings, name: str | None = None, data: DataRoot | None = None,
             progress: bool = True) -> LoadResult:
    """Run (or resume, same name and settings) a serving-load bench; servers are started here unless URLs are given."""
    _validate(s)
    prompts, seqs, info = _encode(s)
    cells = _cells(s)
    run_id = name or new_run_id("load", None)
    manifest = Manifest.of(_manifest(s, info, len(cells) * 2), run_id)
    try:
        run = Run.create(run_id, manifest, data)
        done: list[dict] = []
    except SpecLensError:
        run = Run.open(run_id, data)
        m = run.read()
        if m.status == COMPLETE:
            raise SpecLensError(f"run '{run_id}' is already complete ({run.path}); pick another --name") from None
        if m.kind != "load" or m.identity != manifest.identity:
            raise SpecLensError(f"run '{run_id}' was started with other settings ({run.manifest_path}); resume it "
                                "with the same options or pick another --name") from None
        done = read_journal(run.file(JOURNAL))
        run.claim(progress={"done": len(done), "total": len(cells) * 2}, settings=manifest.settings.to_json())
    finished = {(d["config"], d["concurrency"], d["repeat"], d["side"]) for d in done}
    guard = RunGuard(run, interrupted=lambda: f"interrupted after {len(done)}/{len(cells) * 2} levels; run the same "
                                              "command again to resume")
    with guard:
        _serve_and_measure(run, s, prompts, seqs, cells, done, finished, progress)
    return _finish(run, s, prompts, done)


def _server_specs(s: LoadSettings, configs: list[Config]) -> list:
    from backend.engines import server_process as sp

    opts = dict(s.engine_options)
    dtype = {"fp32": "float32", "bf16": "bfloat16"}.get(s.dtype, s.dtype)
    if s.load_format:
        opts["load-format"] = s.load_format
    if s.engine == "vllm":
        return [sp.vllm_spec(s.target, None, dtype=dtype, gpu_memory_utilization=s.memory, options=opts)] + [
            sp.vllm_spec(s.target, s.drafter, c.k, c.synthetic_tau, dtype, s.memory, opts) for c in configs]
    if s.load_format:
        opts["speculative-draft-load-format"] = s.load_format
    base_opts = {k: v for k, v in opts.items() if not k.startswith("speculative")}
    return [sp.sglang_spec(s.target, None, dtype=dtype, mem_fraction=s.memory, options=base_opts)] + [
        sp.sglang_spec(s.target, s.drafter, c.k, s.topk, s.draft_tokens, c.synthetic_tau, dtype, s.memory, opts)
        for c in configs]


def _serve_and_measure(run: Run, s: LoadSettings, prompts, seqs, cells, done, finished, progress) -> None:
    """Measure every configuration that has unfinished levels: against the given URLs, or on servers started here
    (all at once by default: one start-up for the whole sweep; else one baseline server kept for the whole run
    beside one drafter server at a time, for targets of which the GPU holds only two servers)."""
    from backend.engines.server_process import ServerGroup

    todo = [cfg for cfg in s.configs() if any((cfg.label, c, r, side) not in finished for c in s.concurrency
                                              for r in range(s.repeats) for side in SIDES)]
    if not todo:
        return
    if s.server_url:
        urls = {"baseline": s.baseline_url.rstrip("/"), todo[0].label: s.server_url.rstrip("/")}
        run.record(engine_version=server_version(s.engine, urls["baseline"]), servers={"urls": urls})
        _measure_configs(run, s, seqs, todo, urls, done, finished, cells, progress)
        return
    specs = _server_specs(s, todo)

    def measure(base, pairs: list) -> None:
        urls = {"baseline": base.url, **{cfg.label: srv.url for cfg, srv in pairs}}
        starts = {"baseline": base.start_seconds, **{cfg.label: srv.start_seconds for cfg, srv in pairs}}
        run.record(engine_version=server_version(s.engine, base.url), servers={"urls": urls, "start_seconds": starts})
        _measure_configs(run, s, seqs, [cfg for cfg, _ in pairs], urls, done, finished, cells, progress)

    if s.start_together:
        with ServerGroup(specs, run.path / "servers") as servers:
            measure(servers[0], list(zip(todo, servers[1:])))
        return
    with ServerGroup(specs[:1], run.path / "servers") as (base,):
        for cfg, spec in zip(todo, specs[1:]):
            with ServerGroup([spec], run.path / "servers") as (srv,):
                measure(base, [(cfg, srv)])


def _measure_configs(run: Run, s: LoadSettings, seqs, configs: list[Config], urls: dict, done: list[dict],
                     finished: set, cells, progress: bool) -> None:
    from tqdm import tqdm

    models = {side: served_model(u) if s.engine == "vllm" else None for side, u in urls.items()}
    total = len(cells) * 2
    bar = tqdm(total=total, initial=len(done), desc=f"load {run.run_id}", unit="level", disable=not progress,
               file=sys.stderr)
    warmed: set[tuple[str, int]] = set()
    # level by level when several configs' servers are up: every pairing of one concurrency runs close in time to
    # the others, so the baseline's drift between them stays small (config by config it spans the whole sweep)
    slots = [(i, cfg, ci, c, r) for ci, c in enumerate(s.concurrency) for r in range(s.repeats)
             for i, cfg in enumerate(configs)]
    with open(run.file(JOURNAL), "a") as journal:
        for i, cfg, ci, c, r in slots:
            sides = SIDES if (ci + r + i) % 2 == 0 else SIDES[::-1]      # alternate who goes first
            for side in sides:
                key = (cfg.label, c, r, side)
                if key in finished:
                    continue
                server = "baseline" if side == "baseline" else cfg.label
                url = urls[server]
                if (server, c) not in warmed:                 # untimed, once per server and concurrency
                    _warm(s, url, seqs, c, models[server])
                    warmed.add((server, c))
                k = cfg.k if side == "drafter" else 0
                keep = run.path / "scrapes" / f"{len(done):04d}-{side}"
                row, reqs = _measure(s.engine, url, models[server], seqs, c, s.per_level(c), s, k, keep)
                cell = {"config": cfg.label, "k": k, "synthetic_tau": cfg.synthetic_tau, "concurrency": c,
                        "repeat": r, "side": side, "order": len(done), "started": time.time(),
                        "level": row, "requests": reqs}
                journal.write(json.dumps(cell) + "\n")
                journal.flush()
                done.append(cell)
                finished.add(key)
                bar.update(1)
                bar.set_postfix_str(f"{cfg.label} c={c} {side} {row['output_tps']:.0f} tok/s")
                run.progress(len(done), total)
    bar.close()


def _warm(s: LoadSettings, url: str, seqs, c: int, model) -> None:
    """An untimed round of `c` short requests before a server's first timed level at concurrency `c`: kernels that an
    engine compiles or tunes at the first sight of a batch shape (e.g. Triton MoE kernels) do not land in the timing
    of whichever side happens to go first."""
    run_level(s.engine, url, seqs, [i % len(seqs) for i in range(max(2, c))], max(2, c), min(16, s.max_tokens),
              s.temperature, model)


# ---------------------------------------------------------------------- results


def summarize(levels: pd.DataFrame, requests: pd.DataFrame) -> dict:
    """Per configuration x concurrency: speedup (metrics.level_speedup over the repeats' requests, paired by index)
    with its interval, tau from the server's counters and from the requests; per concurrency the best
    configuration; per configuration the lowest concurrency where speculative decoding stops paying."""
    cells = []
    for (cfg, c), g in levels.groupby(["config", "concurrency"], sort=False):
        b, d = g[g.side == "baseline"], g[g.side == "drafter"]
        if b.empty or d.empty:
            continue
        rb = requests[(requests.config == cfg) & (requests.concurrency == c) & (requests.side == "baseline")
                      & requests.error.isna()].sort_values(["repeat", "index"])
        rd = requests[(requests.config == cfg) & (requests.concurrency == c) & (requests.side == "drafter")
                      & requests.error.isna()].sort_values(["repeat", "index"])
        sp = metrics.level_speedup(rd.output_tokens.tolist(), rd.latency.tolist(), float(d.seconds.sum()),
                                   rb.output_tokens.tolist(), rb.latency.tolist(), float(b.seconds.sum()))
        drafts, acc = d.drafts_server.sum(), d.accepted_server.sum()
        cd = d.drafts_client.dropna().sum()
        tau_c = 1 + d.accepted_client.dropna().sum() / cd if cd else None
        tau_s = 1 + acc / drafts if drafts else None
        cells.append({"config": cfg, "k": int(d.k.iloc[0]),
                      "synthetic_tau": None if pd.isna(d.synthetic_tau.iloc[0]) else float(d.synthetic_tau.iloc[0]),
                      "concurrency": int(c), "speedup": sp.to_dict(),
                      "baseline_tps": float(b.output_tokens.sum() / b.seconds.sum()),
                      "drafter_tps": float(d.output_tokens.sum() / d.seconds.sum()),
                      "baseline_per_user_tps": float(b.per_user_tps.median()),
                      "drafter_per_user_tps": float(d.per_user_tps.median()),
                      "tau_server": tau_s, "tau_client": tau_c,
                      "tau_agreement": metrics.agreement(tau_c, tau_s),
                      "merged_requests": int(d.merged_requests.fillna(0).sum()) if "merged_requests" in d else None,
                      "load1_max": float(g.load1.max()), "errors": int(g.errors.sum())})
    noise = baseline_noise(levels, cells)
    best: dict[str, dict] = {}
    for c in sorted({x["concurrency"] for x in cells}):
        row = [x for x in cells if x["concurrency"] == c and x["synthetic_tau"] is None]
        if not row:
            continue
        top = max(row, key=lambda x: x["speedup"]["value"])
        ties = [x["config"] for x in row if x is not top and x["speedup"]["ci_high"] >= top["speedup"]["ci_low"]]
        best[str(c)] = {"config": top["config"], "k": top["k"], "speedup": top["speedup"]["value"],
                        "within_interval": ties, "noisy": str(c) in noise}
    stops: dict[str, int | None] = {}
    for cfg in dict.fromkeys(x["config"] for x in cells):
        rows = sorted((x for x in cells if x["config"] == cfg), key=lambda x: x["concurrency"])
        stops[cfg] = next((x["concurrency"] for x in rows if x["speedup"]["value"] < 1.0), None)
    return {"cells": cells, "best": best, "stops_paying": stops, "baseline_noise": noise,
            "definitions": metrics.SERVING}


def baseline_noise(levels: pd.DataFrame, cells: list[dict]) -> dict[str, dict]:
    """Concurrency levels where the baseline server's own output tokens/s moved between its measurements (one per
    configuration and repeat) by more than the speedups' intervals can absorb: there the configurations were timed
    under different conditions and their ranking is not a verdict. Rule: relative spread (max - min) / median of the
    baseline's output tokens/s above max(5%, twice the median relative half-width of the speedup intervals)."""
    out: dict[str, dict] = {}
    base = levels[levels.side == "baseline"]
    for c, g in base.groupby("concurrency"):
        if len(g) < 2:
            continue
        spread = metrics.relative_spread(g.output_tps.tolist())
        halves = [(x["speedup"]["ci_high"] - x["speedup"]["ci_low"]) / 2 / x["speedup"]["value"]
                  for x in cells if x["concurrency"] == c and x["speedup"]["value"]]
        bar = max(0.05, 2 * float(pd.Series(halves).median())) if halves else 0.05
        if spread is not None and spread > bar:
            out[str(int(c))] = {"spread": spread, "bar": bar, "min_tps": float(g.output_tps.min()),
                                "max_tps": float(g.output_tps.max()), "measurements": int(len(g))}
    return out


def _finish(run: Run, s: LoadSettings, prompts, done: list[dict]) -> LoadResult:
    lv, rq = [], []
    for cell in done:
        base = {k: cell[k] for k in ("config", "k", "synthetic_tau", "concurrency", "repeat", "side", "order")}
        lv.append({**base, **cell["level"], "started": cell["started"]})
        for r in cell["requests"]:
            p = prompts[r["prompt_index"]]
            rq.append({**base, **r, "prompt_id": p.id, "category": p.category})
    levels = pd.DataFrame(lv).sort_values("order").reset_index(drop=True)
    requests = pd.DataFrame(rq)
    levels.insert(0, "run_id", run.run_id)
    requests.insert(0, "run_id", run.run_id)
    summary = summarize(levels, requests)
    atomic_write_parquet(run.file("levels.parquet"), levels)
    atomic_write_parquet(run.file("requests.parquet"), requests)
    atomic_write_json(run.file("summary.json"), summary)
    head = {"levels": int(len(levels)), "requests": int(len(requests)),
            "tokens": int(requests.output_tokens.sum()), "best": summary["best"],
            "stops_paying": summary["stops_paying"]}
    run.complete(drop=(JOURNAL,), progress={"done": len(done), "total": len(done)}, headline={"tokens": head["tokens"]},
                 load=head)
    return LoadResult(run.run_id, run.path, COMPLETE, summary)
