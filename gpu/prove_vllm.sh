#!/usr/bin/env bash
# Issue 22's proof through vLLM 0.24 on the GPU node: the demo's slot-shift drafter (trained on S_0, S_3, S_5; vLLM
# 0.24 reads no top-level ids and feeds its default S_2, S_4, S_5), its check and fix written by check-drafter
# (--write-fix, --prove --prove-engine vllm queues the two benches), the matched toy drafter benched the same way as
# the reference, the GPU worker running the three benches (one paired baseline), and the results in OUT.
#   bash gpu/prove_vllm.sh OUT          (PYTHONPATH with vLLM 0.24 and duckdb; run from the repository root)
set -eu
out=$1
export SPECLENS_DATA=/tmp/root_prove SPECLENS_MODEL_ROOTS=/tmp/prove VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
mkdir -p /tmp/prove "$out"
tar xzf models/toy-pair.tar.gz -C /tmp/prove && tar xzf models/toy-slot-shift.tar.gz -C /tmp/prove
P=$PWD/datasets/spec_bench/question.jsonl
t0=$(date +%s)
python3 -m backend check-drafter --drafter /tmp/prove/drafter-slot-shift --target /tmp/prove/target --engine vllm \
  --engine-version 0.24.0 --device cuda --write-fix /tmp/prove/fixed --prove --prove-engine vllm --prove-limit 32 \
  --prompts $P --name prove-h200 | tail -8
cat > /tmp/prove/matched.json <<JSON
{"kind": "bench", "name": "prove-h200-vllm-matched", "engine": "vllm", "target": "/tmp/prove/target",
 "drafter": "/tmp/prove/drafter-matched", "prompts": "$P", "limit": 32, "repeats": 1, "producer": "vllm",
 "producer_version": "0.24.0", "dtype": "bf16"}
JSON
python3 -m backend submit /tmp/prove/matched.json
python3 -m backend worker --once
echo "worker done in $(( $(date +%s) - t0 )) s"
python3 -m backend runs --json > "$out/runs.json"
python3 -m backend jobs --json > "$out/jobs.json"
cp /tmp/prove/fixed/config.json "$out/fixed_config.json"; cp /tmp/prove/fixed/FIX.md "$out/FIX.md"
cp "$SPECLENS_DATA/runs/prove-h200/check.json" "$out/check_report.json" 2>/dev/null || true
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
import pandas as pd
from backend import metrics
root = Path("/tmp/root_prove/runs")
def per_prompt(rid):
    return pd.read_parquet(root / rid / "prompts.parquet").groupby("prompt_id")[["accepted", "drafts"]].sum()
ids = {t: f"prove-h200-vllm-{t}" for t in ("original", "fixed", "matched")}
res = {"runs": {}}
for t, rid in ids.items():
    m = json.loads((root / rid / "manifest.json").read_text())
    res["runs"][t] = m
for a, b in (("fixed", "original"), ("fixed", "matched"), ("matched", "original")):
    x, y = per_prompt(ids[a]), per_prompt(ids[b])
    sh = x.index.intersection(y.index)
    d, lo, hi = metrics.tau_difference(x.loc[sh].to_numpy(), y.loc[sh].to_numpy())
    res[f"{a}-{b}"] = {"diff": d, "ci": [lo, hi], "n_prompts": len(sh)}
Path(sys.argv[1], "prove_vllm_h200.json").write_text(json.dumps(res, indent=1, default=str))
print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=1, default=str))
PY
tar czf "$out/prove_runs.tar.gz" -C /tmp/root_prove runs
echo "prove done in $(( $(date +%s) - t0 )) s"
