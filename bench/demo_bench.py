"""`make demo`'s data, fresh and cached: wall time and peak RSS of `python -m backend demo --quiet` on an empty data
root, then the same command again on that root (everything in place: it must take seconds).

    python bench/demo_bench.py [--root DIR] [--keep] [--json OUT]
    python bench/demo_bench.py --cached-only --root DIR     # only the cached run, on a root a demo already built

Each run goes through `/usr/bin/time -v` (peak RSS as the kernel reports it for the process); the load average is
printed before and after each run, because on a shared machine the wall time measures the load as much as the demo;
the process's CPU time (user + system) is printed beside it: the demo decodes on one torch thread, so on a loaded
machine its CPU time is close to the wall time it would take alone (a lower bound: cache and memory contention
still inflate it a little).
The demo's own stage timings (captures, benchmark demo, drafter check, slot-shift demo) are taken from its output.
Exit status 1 when either run fails. Bars (issue 24 item 4): fresh <= 300 s on a quiet 2-core CPU, cached in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGES = {"captures": r"demo data ready in ([\d.]+) s", "benchmark demo": r"benchmark demo ready in ([\d.]+) s",
          "drafter check": r"drafter check ready in ([\d.]+) s",
          "slot-shift demo": r"slot-shift demo ready in ([\d.]+) s"}


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def timed(root: Path) -> dict:
    """One `python -m backend demo --quiet` on root under /usr/bin/time -v."""
    if not Path("/usr/bin/time").exists():
        sys.exit("bench/demo_bench.py: /usr/bin/time is missing; install GNU time (apt-get install time)")
    env = {**os.environ, "SPECLENS_DATA": str(root), "PYTHONPATH": str(REPO)}
    before = load()
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "backend", "demo", "--quiet"], cwd=REPO, env=env,
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    cpu = [float(m.group(1)) for k in ("User", "System")
           if (m := re.search(rf"{k} time \(seconds\): ([\d.]+)", p.stderr))]
    stages = {k: float(m.group(1)) for k, rx in STAGES.items() if (m := re.search(rx, p.stdout))}
    return {"rc": p.returncode, "wall_s": round(wall, 1), "cpu_s": round(sum(cpu), 1),
            "peak_rss_mib": round(int(rss.group(1)) / 1024, 1) if rss else None, "load_before": before,
            "load_after": load(), "stages_s": stages,
            "tail": (p.stdout + p.stderr)[-2000:] if p.returncode else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", help="data root to build in (must be empty or absent; default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the data root afterwards")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--cached-only", action="store_true", help="time only the cached run on --root (built before)")
    a = ap.parse_args()
    if a.cached_only and not a.root:
        sys.exit("bench/demo_bench.py: --cached-only needs --root DIR, a data root a demo already built")
    root = Path(a.root) if a.root else Path(tempfile.mkdtemp(prefix="demo_bench_")) / "data"
    if not a.cached_only and root.exists() and any(root.iterdir()):
        sys.exit(f"bench/demo_bench.py: {root} is not empty; pass an empty or absent --root (a fresh build needs one)")
    out = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "root": str(root)}
    try:
        for what in ("cached",) if a.cached_only else ("fresh", "cached"):
            r = out[what] = timed(root)
            print(f"{what}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU (user + system), peak RSS "
                  f"{r['peak_rss_mib']} MiB, rc {r['rc']}, load average "
                  f"{r['load_before']} before / {r['load_after']} after; stages "
                  + ", ".join(f"{k} {v:.1f} s" for k, v in r["stages_s"].items()), flush=True)
            if r["rc"]:
                print(r["tail"], file=sys.stderr)
                break
    finally:
        if not a.keep and not a.root:
            shutil.rmtree(root.parent, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 1 if any(out.get(w, {}).get("rc", 1) for w in (("cached",) if a.cached_only else ("fresh", "cached"))) else 0


if __name__ == "__main__":
    sys.exit(main())
