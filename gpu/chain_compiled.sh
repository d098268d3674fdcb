#!/usr/bin/env bash
# One warm stretch on the lent GPU node for issue 24 items 3 and 5 (written 2026-12-07):
#   bash gpu/chain_compiled.sh start BUDGET_S  run the chain below in the background (its own session), then return
#   bash gpu/chain_compiled.sh poll SECONDS    wait for it (at most SECONDS), show its log, copy its results to $OUT
#   bash gpu/chain_compiled.sh part DIR PART   move a wheel-bundle part brought by `carry` into DIR (made if missing)
# Keep a poll or a part move in flight the whole time: the machine goes back after 30 s without a call.
# Before `start`: /tmp/stage_v/{SHA256,NPARTS} and /tmp/stage_s/{SHA256,NPARTS} (from .stage/SHA256, .stage2/SHA256
# and the part counts); the extras bundle untarred into /tmp (then /tmp/.whl -> /tmp/whl, /tmp/.whl2 -> /tmp/whl2).
# The chain, one thing on the GPU at a time:
#   1. once vLLM's parts and the extras lie here: vLLM 0.24.0 installed, then `gpu/vllm_suite.py speed` with the
#      compiled captures (capture in the compiled engine, interleaved with plain compiled prefill, both engines up)
#      after the eager steps it is compared with;
#   2. once SGLang's parts lie here: SGLang 0.5.15 installed, then gpu/fault_suite.py sglang-load: kill -9 of a
#      serving-load sweep (K = 1, concurrency 1 and 4, 8 requests per level and side) under
#      --enable-deterministic-inference, its resume compared cell by cell with the uninterrupted sweep.
set -u
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
d=/tmp/out_comp
t0=$(date +%s) budget=${2:-0}
el() { echo $(( $(date +%s) - t0 )); }                  # seconds since this invocation began
left() { echo $(( budget - ($(date +%s) - t0) )); }     # of the budget given as the second argument
sglang_sweep_kill() {   # SGLang installed, then the sweep kill trial (item 5) with the budget left
  bash gpu/load_h200.sh install-sgl "$(cat /tmp/stage_s/SHA256)" 2>&1 | tail -3
  [ -f /tmp/site_duck/pydantic/__init__.py ] || python3 -m pip install -q --no-index --no-deps --no-compile \
    --upgrade --target /tmp/site_duck /tmp/whl/*.whl /tmp/stage_v/w/pydantic*.whl /tmp/stage_v/w/annotated_types*.whl \
    /tmp/stage_v/w/typing_inspection*.whl 2>&1 | tail -2     # the backend's own needs (the vLLM bundle holds pydantic)
  echo "sglang installed at $(el) s"
  PYTHONPATH=/tmp/site_duck python3 gpu/fault_suite.py --out $d/fault_s --root /tmp/fault_root_s --engines sglang \
    --engine-path sglang=/tmp/site_sgl --steps sglang-load --load-ks 1 --load-concurrency 1,4 --load-requests 8 \
    --max-new-tokens 32 --sglang-option attention-backend=triton --sglang-option disable-cuda-graph=true \
    --sglang-option enable-deterministic-inference=true --budget-s $(( $(left) - 30 )) > $d/fault_s.log 2>&1
  tail -8 $d/fault_s.log; echo "sglang load kill done at $(el) s"
}
have() { [ "$(ls "$1"/part* 2>/dev/null | wc -l)" = "$(cat "$1"/NPARTS 2>/dev/null)" ]; }   # every bundle part of DIR moved
compiled_alone() {  # vLLM installed once its parts lie here, then the compiled captures alone (suite --budget-s $1)
  while ! have /tmp/stage_v || [ ! -d /tmp/whl ]; do sleep 2; done
  bash gpu/load_h200.sh install-vllm "$(cat /tmp/stage_v/SHA256)" 2>&1 | tail -2
  echo "vllm installed at $(el) s"
  env PYTHONPATH=/tmp/site_vllm timeout 560 python3 gpu/vllm_suite.py speed --out $d/alone --root /tmp/data-speed \
    --compiled-alone --budget-s "$1" --only plain_prefill_compiled,capture_eagle_set_compiled,capture_all_33_compiled \
    > $d/alone.log 2>&1
  grep -E '^(plain_|capture_|\[speed\])' $d/alone.log | cut -c1-1500
  echo "speed done at $(el) s"
}
compiled_kill() {  # the capture in vLLM's compiled engine (exact sums, VLLM_BATCH_INVARIANT=1) killed and resumed, $1 trials
  while ! have /tmp/stage_v || [ ! -d /tmp/whl ]; do sleep 2; done
  [ -d /tmp/site_vllm/vllm ] || bash gpu/load_h200.sh install-vllm "$(cat /tmp/stage_v/SHA256)" 2>&1 | tail -2
  [ -f /tmp/site_duck/pydantic/__init__.py ] || python3 -m pip install -q --no-index --no-deps --no-compile \
    --target /tmp/site_duck /tmp/whl/*.whl /tmp/stage_v/w/pydantic*.whl /tmp/stage_v/w/annotated_types*.whl \
    /tmp/stage_v/w/typing_inspection*.whl 2>&1 | tail -2
  echo "vllm and the backend's needs installed at $(el) s"
  VLLM_BATCH_INVARIANT=1 PYTHONPATH=/tmp/site_duck timeout $(( $(left) - 20 )) python3 gpu/fault_suite.py \
    --out $d/fault_c --root /tmp/fault_root_c --engines vllm --engine-path vllm=/tmp/site_vllm --steps vllm-capture \
    --exact-sums --vllm-option compiled=true --trials "${1:-1}" --budget-s $(( $(left) - 60 )) > $d/fault_c.log 2>&1
  tail -12 $d/fault_c.log; echo "compiled capture kill done at $(el) s"
}
sglang_when_here() {  # the SGLang sweep kill once SGLang's parts lie here, while more than 300 s of the budget are left
  while ! have /tmp/stage_s && [ "$(left)" -gt 300 ]; do sleep 2; done
  if have /tmp/stage_s && [ "$(left)" -gt 300 ]; then
    sglang_sweep_kill
  else
    echo "SGLang load kill not run: $(left) s left, $(ls /tmp/stage_s/part* 2>/dev/null | wc -l) parts"
  fi
}
case $1 in
  part)
    mkdir -p "$2" && mv "$3" "$2/" && ls "$2" | grep -c part ;;
  start)
    mkdir -p $d
    setsid nohup bash "$0" chain "${2:-1400}" > $d/suite.log 2>&1 < /dev/null & echo $! > $d/pid
    sleep 3; tail -5 $d/suite.log ;;
  chain)
    echo "chain start $(date -u +%FT%TZ), budget $budget s"
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
    while ! have /tmp/stage_v || [ ! -d /tmp/whl ]; do
      [ "$(left)" -lt 400 ] && { echo "vLLM parts not all here in time"; break; }; sleep 2; done
    if have /tmp/stage_v; then
      bash gpu/load_h200.sh install-vllm "$(cat /tmp/stage_v/SHA256)" 2>&1 | tail -4
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_duck /tmp/whl/*.whl \
        /tmp/stage_v/w/pydantic*.whl /tmp/stage_v/w/annotated_types*.whl /tmp/stage_v/w/typing_inspection*.whl 2>&1 | tail -2
      echo "vllm installed at $(el) s"
      env PYTHONPATH=/tmp/site_vllm timeout $(( $(left) - 420 > 240 ? $(left) - 420 : 240 )) python3 gpu/vllm_suite.py \
        speed --out $d/speed --root /tmp/data-speed \
        --only plain_prefill_compiled,plain_prefill_eager,capture_eagle_set,capture_all_33,capture_eagle_set_compiled,capture_all_33_compiled \
        > $d/speed.log 2>&1
      grep -E "^(plain_|capture_)" $d/speed.log | cut -c1-600; tail -3 $d/speed.log
      echo "speed done at $(el) s"
    fi
    sglang_when_here
    echo "chain done at $(el) s $(date -u +%FT%TZ)" ;;
  start2)
    mkdir -p $d
    setsid nohup bash "$0" chain2 "${2:-900}" > $d/suite.log 2>&1 < /dev/null & echo $! > $d/pid
    sleep 2; tail -3 $d/suite.log ;;
  chain2)   # a fresh machine with less time: the SGLang sweep kill first, then the compiled EAGLE-set capture alone
    echo "chain2 start $(date -u +%FT%TZ), budget $budget s"
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
    while ! have /tmp/stage_s || [ ! -d /tmp/whl2 ]; do
      sleep 2; done
    sglang_sweep_kill
    if have /tmp/stage_v && [ "$(left)" -gt 260 ]; then
      bash gpu/load_h200.sh install-vllm "$(cat /tmp/stage_v/SHA256)" 2>&1 | tail -2
      env PYTHONPATH=/tmp/site_vllm timeout $(( $(left) - 10 )) python3 gpu/vllm_suite.py speed --out $d/alone \
        --root /tmp/data-speed --compiled-alone --only plain_prefill_compiled,capture_eagle_set_compiled \
        > $d/alone.log 2>&1
      grep -E '^(plain_|capture_)' $d/alone.log | cut -c1-1500
    else
      echo "compiled capture alone not run: $(left) s left"
    fi
    echo "chain2 done at $(el) s $(date -u +%FT%TZ)" ;;
  start3)  # a fresh machine, vLLM only: the compiled captures' engine alone (EAGLE set; all 33 if the time allows)
    mkdir -p $d
    setsid nohup bash "$0" chain3 "${2:-300}" > $d/suite.log 2>&1 < /dev/null & echo $! > $d/pid
    sleep 2; tail -3 $d/suite.log ;;
  chain3)
    echo "chain3 start $(date -u +%FT%TZ)"; nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
    compiled_alone "$2"
    echo "chain3 done at $(el) s $(date -u +%FT%TZ)" ;;
  start4)  # one stretch for both: the compiled captures alone (vLLM, suite budget $2), then the SGLang sweep kill
    mkdir -p $d
    setsid nohup bash "$0" chain4 "${2:-260}" "${3:-1500}" > $d/suite.log 2>&1 < /dev/null & echo $! > $d/pid
    sleep 2; tail -3 $d/suite.log ;;
  chain4)   # $2: the speed suite's --budget-s; $3: seconds from this start by which everything must be done
    budget=${3:-1500}
    echo "chain4 start $(date -u +%FT%TZ), budget $budget s"
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
    compiled_alone "$2"
    sglang_when_here
    echo "chain4 done at $(el) s $(date -u +%FT%TZ)" ;;
  start5)  # a fresh machine, vLLM only: a capture in the compiled engine killed and resumed (exact sums, batch-invariant)
    mkdir -p $d
    setsid nohup bash "$0" chain5 "${2:-600}" "${3:-1}" > $d/suite.log 2>&1 < /dev/null & echo $! > $d/pid
    sleep 2; tail -3 $d/suite.log ;;
  chain5)
    echo "chain5 start $(date -u +%FT%TZ), budget $budget s"
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
    compiled_kill "$3"
    echo "chain5 done at $(el) s $(date -u +%FT%TZ)" ;;
  start6)  # both on one machine: the compiled captures alone (suite budget $2), then start5's kill trial until $3 s
    mkdir -p $d
    setsid nohup bash "$0" chain6 "${2:-280}" "${3:-900}" > $d/suite.log 2>&1 < /dev/null & echo $! > $d/pid
    sleep 2; tail -3 $d/suite.log ;;
  chain6)
    budget=${3:-900}
    echo "chain6 start $(date -u +%FT%TZ), budget $budget s"
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
    compiled_alone "$2"
    if [ "$(left)" -gt 240 ]; then compiled_kill 1; else echo "compiled capture kill not run: $(left) s left"; fi
    echo "chain6 done at $(el) s $(date -u +%FT%TZ)" ;;
  start7)  # a fresh machine, vLLM only: compiled captures (VLLM_BATCH_INVARIANT=1, exact sums) forked, then spawned
    mkdir -p $d
    setsid nohup bash "$0" chain7 "${2:-500}" > $d/suite.log 2>&1 < /dev/null & echo $! > $d/pid
    sleep 2; tail -3 $d/suite.log ;;
  chain7)   # one compile cache: a forked engine core caches the graph, then engine cores vLLM spawns start from it
    echo "chain7 start $(date -u +%FT%TZ), budget $budget s"
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
    while ! have /tmp/stage_v || [ ! -d /tmp/whl ]; do sleep 2; done
    bash gpu/load_h200.sh install-vllm "$(cat /tmp/stage_v/SHA256)" 2>&1 | tail -2
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_duck /tmp/whl/*.whl \
      /tmp/stage_v/w/pydantic*.whl /tmp/stage_v/w/annotated_types*.whl /tmp/stage_v/w/typing_inspection*.whl 2>&1 | tail -2
    echo "vllm installed at $(el) s"
    mkdir -p $d/spawn/toy && tar xzf models/toy-pair.tar.gz -C $d/spawn/toy
    for m in fork spawn spawn; do   # the second spawn: a spawned core from a cache a spawned core wrote
      n=$m-$(el)
      env SPECLENS_DATA=$d/spawn/data PYTHONPATH=$PWD:/tmp/site_vllm:/tmp/site_duck VLLM_CACHE_ROOT=$d/spawn/vllm_cache \
        VLLM_BATCH_INVARIANT=1 VLLM_WORKER_MULTIPROC_METHOD=$m timeout $(( $(left) - 20 )) python3 -m backend capture \
        --engine vllm --model $d/spawn/toy/target --prompts datasets/spec_bench/question.jsonl --limit 64 \
        --sample-tokens 256 --name $n --quiet --dtype bf16 --exact-sums --engine-option gpu_memory_utilization=0.08 \
        --engine-option max_model_len=4096 --engine-option kv_cache_memory_bytes=2147483648 \
        --engine-option compiled=true > $d/spawn/$n.log 2>&1
      echo "$m capture $n: exit $? at $(el) s; $(grep -h 'IndexError\|^error' $d/spawn/$n.log | tail -1)"
      nvidia-smi --query-gpu=memory.used --format=csv,noheader
    done
    ls $d/spawn/vllm_cache/torch_compile_cache/torch_aot_compile 2>/dev/null
    env PYTHONPATH=$PWD:/tmp/site_duck python3 -c "
import glob, pandas as pd
runs = sorted(glob.glob('$d/spawn/data/runs/*/stats.parquet'))
ref = pd.read_parquet(runs[0]).set_index('boundary')
for r in runs: d = pd.read_parquet(r).set_index('boundary'); print(r.split('/')[-2], 'tokens', int(d.n_tokens.iloc[0]), 'bit-equal to', runs[0].split('/')[-2], d.drop(columns=[c for c in d if d[c].dtype == object]).equals(ref.drop(columns=[c for c in ref if ref[c].dtype == object])))
" 2>&1 | tail -5
    echo "chain7 done at $(el) s $(date -u +%FT%TZ)" ;;
  alone)
    setsid nohup bash -c "env PYTHONPATH=/tmp/site_vllm timeout ${2:-400} python3 gpu/vllm_suite.py speed \
      --out $d/alone --root /tmp/data-speed --compiled-alone \
      --only plain_prefill_compiled,capture_eagle_set_compiled,capture_all_33_compiled > $d/alone.log 2>&1; \
      grep -E '^(plain_|capture_)' $d/alone.log | cut -c1-1500 >> $d/suite.log; echo 'alone done' >> $d/suite.log" \
      > /dev/null 2>&1 < /dev/null & echo $! > $d/pid
    sleep 2; echo started ;;
  poll)
    end=$(( $(date +%s) + ${2:-500} ))
    while kill -0 "$(cat $d/pid)" 2>/dev/null && [ "$(date +%s)" -lt $end ]; do sleep 3; done
    tail -40 $d/suite.log; kill -0 "$(cat $d/pid)" 2>/dev/null && echo "STILL RUNNING" || echo "FINISHED"
    cp $d/suite.log "$OUT/" 2>/dev/null
    [ -f $d/speed/vllm_speed.json ] && cp $d/speed/vllm_speed.json "$OUT/"
    [ -f $d/alone/vllm_speed.json ] && cp $d/alone/vllm_speed.json "$OUT/vllm_speed_alone.json"
    [ -f $d/speed.log ] && tail -c 3000000 $d/speed.log > "$OUT/speed.log"
    [ -d $d/fault_s ] && (cd $d && tar czf "$OUT/fault_s.tar.gz" --exclude='*.safetensors' fault_s fault_s.log 2>/dev/null)
    [ -f $d/alone.log ] && tail -c 2000000 $d/alone.log > "$OUT/alone.log"
    [ -d $d/spawn ] && (cd $d && tar czf "$OUT/spawn.tar.gz" --exclude='*.safetensors' --exclude=vllm_cache --exclude=toy spawn)
    [ -d $d/fault_c ] && (cd $d && tar czf "$OUT/fault_c.tar.gz" --exclude='*.safetensors' fault_c fault_c.log 2>/dev/null)
    nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; ls -la "$OUT" ;;
esac
# Second pass (after the chain): the compiled captures' engine alone on the card, with and without statistics:
#   bash gpu/chain_compiled.sh alone BUDGET_S   (in the background; `poll` shows it too)
# The capture in the compiled engine killed and resumed (item 5 on item 3's path): `start5 TOTAL_S [TRIALS]`;
# the compiled captures alone, then that kill trial: `start6 SUITE_BUDGET_S TOTAL_S`.
# Both items in one stretch: `start4 SUITE_BUDGET_S TOTAL_S` (vLLM compiled captures alone, then the SGLang sweep
# kill with what is left of TOTAL_S).
# On a fresh machine with less time: `start2 BUDGET_S` runs the SGLang sweep kill, then the compiled EAGLE-set
# capture alone (both bundles' parts moved as for `start`).
