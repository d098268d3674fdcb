"""`check-drafter --lint-only` end to end (bar: under 2 s), on the five real public drafter configs.

Each config (tests/data/real_configs) against a config-only target of its architecture and depth (a 671B target's
weights are never needed), as a user runs it: a fresh `python -m backend check-drafter --lint-only --json` process,
wall time from start to exit (interpreter start, imports, lint, storing the check run, catalog refresh), and the
child's peak RSS. Median of --repeats runs per config.

    python bench/lint_only_bench.py [--repeats 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.test_real_configs import CONFIGS, TRUTH, config_only_target  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "SPECLENS_DATA": str(tmp / "data")}
        for name, ((arch, mt, n, h, v), *_rest) in TRUTH.items():
            (tmp / name).mkdir()
            target = config_only_target(tmp / name, arch, mt, n, h, v)
            times, rss = [], []
            for _ in range(a.repeats):
                before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
                t0 = time.perf_counter()
                out = subprocess.run([sys.executable, "-m", "backend", "check-drafter",
                                      "--drafter", str(CONFIGS / name),
                                      "--target", str(target), "--lint-only", "--json"], cwd=REPO, env=env,
                                     capture_output=True, text=True)
                times.append(time.perf_counter() - t0)
                rss.append(max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
                if out.returncode:
                    print(out.stderr, file=sys.stderr)
                    return 1
            rep = json.loads(out.stdout)
            rows.append({"config": name, "median_s": round(statistics.median(times), 3),
                         "max_s": round(max(times), 3), "peak_rss_mib": round(max(rss) / 1024, 1),
                         "vllm_runner": rep["runner_choice"]["runner"],
                         "vllm_feeds": rep["engine_feeds"]["boundaries"]})
            print(f"{name:<45} median {rows[-1]['median_s']:.2f} s  max {rows[-1]['max_s']:.2f} s  "
                  f"peak RSS {rows[-1]['peak_rss_mib']:.0f} MiB  vLLM {rows[-1]['vllm_runner']} -> "
                  f"{rows[-1]['vllm_feeds']}")
    res = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "python": platform.python_version(), "repeats": a.repeats, "rows": rows}
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
