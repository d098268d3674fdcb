#!/usr/bin/env bash
# Issue 23: the toy DFlash drafter exactly as trained (tests/data/dflash_toy: dflash_config.target_layer_ids
# [0, 3, 6], no top-level eagle_aux_hidden_state_layer_ids) benched through vLLM 0.24.0 with nothing else on the
# GPU. On 2026-12-05 this bench's engine did not start while an SGLang server came up beside it, and the engine
# core's root cause was lost; the error line now carries the engine core's stderr (backend/engines/stderr_tail.py).
# Either it starts (and the boundaries it reads are recorded from the running engine) or the root cause is kept.
#   PYTHONPATH=<vLLM 0.24 site> bash gpu/dflash_vllm_alone.sh OUTDIR
set -u
out=$1
export SPECLENS_DATA=/tmp/root_dflash SPECLENS_MODEL_ROOTS=/tmp/kinds:$PWD/tests VLLM_USE_FLASHINFER_SAMPLER=0 \
  PYTHONUNBUFFERED=1
mkdir -p /tmp/kinds "$out"
[ -d /tmp/kinds/target ] || tar xzf models/toy-pair.tar.gz -C /tmp/kinds
T=/tmp/kinds/target D=$PWD/tests/data/dflash_toy P=$PWD/datasets/spec_bench/question.jsonl
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
t0=$(date +%s)
python3 -m backend bench --engine vllm --target $T --drafter $D --prompts $P --limit "${N_PROMPTS:-16}" \
  --num-spec-tokens 3 --max-new-tokens 64 --repeats 1 --dtype bf16 --name dflash-vllm-original-alone \
  > "$out/bench.log" 2>&1
echo "bench exit $? in $(( $(date +%s) - t0 )) s"
grep -E "^error|tau|Error|aux|layer" "$out/bench.log" | tail -20
python3 -m backend runs --json > "$out/runs.json" 2>/dev/null
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
res = {}
for d in sorted(Path("/tmp/root_dflash/runs").iterdir()):
    f = d / "manifest.json"
    if f.exists():
        m = json.loads(f.read_text())
        res[d.name] = {k: m.get(k) for k in ("status", "engine", "engine_version", "aux", "drafter", "headline",
                                              "bench", "num_spec_tokens", "baseline_run", "error")}
Path(sys.argv[1], "manifests.json").write_text(json.dumps(res, indent=1, default=str))
for k, v in res.items():
    print(k, v["status"], (v.get("aux") or {}).get("engine_ids"), (v.get("aux") or {}).get("boundaries"),
          (v.get("bench") or {}).get("tau"), str(v.get("error"))[:300])
PY
