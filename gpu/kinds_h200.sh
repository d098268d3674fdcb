#!/usr/bin/env bash
# Issue 23 on the lent H200: the toy DFlash drafter (tests/data/dflash_toy: dflash_config.target_layer_ids [0, 3, 6],
# trained on S_0, S_3, S_6) served by vLLM 0.24.0 and SGLang 0.5.15 on the toy target. What each running engine feeds
# it (read from the live model: vLLM's aux_hidden_state_layers, SGLang's layers_to_capture) against the conventions
# table's prediction, tau through the engine against the HF reference bench fed the same way, and for vLLM the fix
# written by check-drafter and proved through the engine (one paired baseline). SGLang 0.5.15 cannot feed S_0 to a
# DFlash drafter (ids must be 0..N-1, captured after the layer), so check-drafter refuses its fix; the script also
# starts SGLang with the ids that fix would need ([-1, 2, 5]) to record SGLang's own refusal.
#   bash gpu/kinds_h200.sh OUT      (PYTHONPATH with vLLM 0.24 or SGLang 0.5.15 set per step below)
set -u
out=$1
export SPECLENS_DATA=/tmp/root_kinds SPECLENS_MODEL_ROOTS=/tmp/kinds:$PWD/tests VLLM_USE_FLASHINFER_SAMPLER=0 \
  PYTHONUNBUFFERED=1
mkdir -p /tmp/kinds "$out"
tar xzf models/toy-pair.tar.gz -C /tmp/kinds
T=/tmp/kinds/target D=$PWD/tests/data/dflash_toy P=$PWD/datasets/spec_bench/question.jsonl
N=${N_PROMPTS:-16}
V="env PYTHONPATH=/tmp/site_vllm" S="env PYTHONPATH=/tmp/site_sgl"
t0=$(date +%s)
# SGLang in the background (its own server, 15% of the GPU), vLLM in the foreground (30%)
(
  $S python3 -m backend bench --engine sglang --target $T --drafter $D --prompts $P --limit $N --num-spec-tokens 3 \
    --dtype bf16 --engine-option attention-backend=triton --engine-option mem-fraction-static=0.15 \
    --name dflash-h200-sglang-original 2>&1 | tail -6
  mkdir -p /tmp/kinds/bad && cp $D/* /tmp/kinds/bad/ && python3 - <<'PY'
import json; p = "/tmp/kinds/bad/config.json"; c = json.load(open(p))
c["dflash_config"]["target_layer_ids"] = [-1, 2, 5]; json.dump(c, open(p, "w"), indent=1)
PY
  $S timeout 240 python3 -m backend bench --engine sglang --target $T --drafter /tmp/kinds/bad --prompts $P --limit 2 \
    --num-spec-tokens 3 --dtype bf16 --engine-option attention-backend=triton --engine-option mem-fraction-static=0.1 \
    --name dflash-h200-sglang-minus1 2>&1 | tail -4
  echo "sglang part done in $(( $(date +%s) - t0 )) s"
) > "$out/sglang.log" 2>&1 &
sg=$!
$V python3 -m backend check-drafter --drafter $D --target $T --engine vllm --engine-version 0.24.0 --device cuda \
  --num-prompts 8 --new-tokens 40 --no-search --write-fix /tmp/kinds/fixed_vllm --prove --prove-engine vllm \
  --prove-limit $N --prompts $P --name dflash-h200 2>&1 | tail -6
$V python3 -m backend worker --once 2>&1 | tail -8
echo "vllm proof done in $(( $(date +%s) - t0 )) s"
# the HF reference benches on the GPU, fed as each release feeds (same prompts, K = 3, greedy)
for spec in "vllm 0.24.0 $D original" "vllm 0.24.0 /tmp/kinds/fixed_vllm fixed" "sglang 0.5.15 $D original"; do
  set -- $spec
  $V python3 -m backend bench --engine hf --device cuda --dtype bf16 --target $T --drafter $3 --prompts $P --limit $N \
    --num-spec-tokens 3 --max-new-tokens 64 --producer $1 --producer-version $2 --name dflash-h200-hf-$1-$4 2>&1 | tail -2
done
wait $sg
cat "$out/sglang.log"
echo "all done in $(( $(date +%s) - t0 )) s"
$V python3 -m backend runs --json > "$out/runs.json"
$V python3 -m backend jobs --json > "$out/jobs.json"
cp /tmp/kinds/fixed_vllm/config.json "$out/fixed_vllm_config.json" 2>/dev/null
cp /tmp/kinds/fixed_vllm/FIX.md "$out/FIX_vllm.md" 2>/dev/null
$V python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
root = Path("/tmp/root_kinds/runs")
res = {}
for d in sorted(root.iterdir()):
    f = d / "manifest.json"
    if not f.exists():
        continue
    m = json.loads(f.read_text())
    if m.get("kind") != "bench":
        continue
    res[d.name] = {k: m.get(k) for k in ("status", "engine", "engine_version", "aux", "drafter", "headline",
                                          "num_spec_tokens", "baseline_run", "error")}
Path(sys.argv[1], "kinds_h200.json").write_text(json.dumps(res, indent=1, default=str))
for k, v in res.items():
    aux = v.get("aux") or {}
    print(k, v["status"], (v.get("headline") or {}).get("tau"), aux.get("boundaries"), aux.get("predicted"),
          aux.get("engine_ids"))
PY
tar czf "$out/kinds_runs.tar.gz" -C /tmp/root_kinds runs --exclude='*.safetensors' 2>/dev/null
ls -la "$out"
