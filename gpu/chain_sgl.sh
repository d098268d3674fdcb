#!/usr/bin/env bash
# One warm stretch on the lent GPU node, one thing on the GPU at a time (written 2026-12-06; its first run that day
# stopped at step 1: see docs/PERFORMANCE.md "On the GPU node, 2026-12-06 13:19-13:49 UTC"):
#   bash gpu/chain_sgl.sh start [KS]       run the chain below in the background (its own session), then return
#   bash gpu/chain_sgl.sh poll SECONDS     wait for it (at most SECONDS), show its log, copy its results to $OUT
# Keep a poll (or a part move) in flight the whole time: the machine goes back after 30 s without a call, and the
# chain with it.
# The chain:
#   1. the toy pair's serving-load sweep through SGLang 0.5.15, K in KS (default 1,2,4,6) x concurrency 1, 8, 32, 64
#      (issue 19 item 6), every cell paired with its baseline on the same card; gpu/stubs first on PYTHONPATH (an
#      image without the CuTe DSL: its sitecustomize stands in for the DSA module SGLang's EAGLE worker imports);
#   2. once the vLLM bundle's 20 parts lie in /tmp/stage_v (moved in while step 1 runs; /tmp/vllm_sha holds its
#      SHA-256): vLLM 0.24.0 installed, then the same sweep through vLLM, K in KS, the GPU alone again;
#   3. gpu/fault_suite.py sglang-bench under SGLang's --enable-deterministic-inference (the 13:41 trial without it
#      resumed to another result in two prompts), issue 24 item 5, within /tmp/fault_budget seconds (default 300).
# Needs /tmp/site_sgl (`bash gpu/load_h200.sh install-sgl SHA`, with /tmp/whl and /tmp/whl2 from the extras bundle).
set -u
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
d=/tmp/out_chain3
STUBS="$(pwd)/gpu/stubs"
case $1 in
  start)
    mkdir -p $d
    setsid nohup bash "$0" chain "${2:-1,2,4,6}" > $d/suite.log 2>&1 < /dev/null & echo $! > $d/pid
    sleep 3; tail -3 $d/suite.log ;;
  chain)
    t0=$(date +%s)
    el() { echo $(( $(date +%s) - t0 )); }
    echo "chain start $(date -u +%FT%TZ)"
    env PYTHONPATH="$STUBS:/tmp/site_sgl" SPECLENS_SERVER_START_TIMEOUT=500 timeout 1000 python3 gpu/load_suite.py \
      sweep --engine sglang --ks "$2" --out $d/sweep --root /tmp/root_sgl --memory 0.12 --opt attention-backend=triton \
      > $d/sweep.log 2>&1
    tail -3 $d/sweep.log; echo "sglang sweep done at $(el) s $(date -u +%FT%TZ)"
    if [ "$(ls /tmp/stage_v/part* 2>/dev/null | wc -l)" = 20 ]; then
      bash gpu/load_h200.sh install-vllm "$(cat /tmp/vllm_sha)" 2>&1 | tail -4
      env PYTHONPATH=/tmp/site_vllm timeout 900 python3 gpu/load_suite.py sweep --engine vllm --ks "$(cat /tmp/vks 2>/dev/null || echo $2)" \
        --out $d/vsweep --root /tmp/root_vs --memory 0.06 > $d/vsweep.log 2>&1
      tail -3 $d/vsweep.log; echo "vllm sweep done at $(el) s $(date -u +%FT%TZ)"
    else
      echo "vLLM parts missing ($(ls /tmp/stage_v 2>/dev/null | wc -l) files): the vLLM sweep skipped"
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_duck /tmp/whl/*.whl \
      /tmp/stage_s/w/pydantic-2*.whl /tmp/stage_s/w/pydantic_core*.whl /tmp/stage_s/w/annotated_types*.whl \
      /tmp/stage_s/w/typing_inspection*.whl 2>&1 | tail -2
    PYTHONPATH=/tmp/site_duck python3 gpu/fault_suite.py --out $d/fault_s --root /tmp/fault_root_s --engines sglang \
      --engine-path sglang=/tmp/site_sgl --steps sglang-bench \
      --sglang-option attention-backend=triton --sglang-option disable-cuda-graph=true \
      --sglang-option enable-deterministic-inference=true \
      --budget-s "$(cat /tmp/fault_budget 2>/dev/null || echo 300)" > $d/fault_s.log 2>&1; tail -5 $d/fault_s.log
    echo "chain done at $(el) s $(date -u +%FT%TZ)" ;;
  poll)
    end=$(( $(date +%s) + ${2:-500} ))
    while kill -0 "$(cat $d/pid)" 2>/dev/null && [ "$(date +%s)" -lt $end ]; do sleep 5; done
    tail -30 $d/suite.log; kill -0 "$(cat $d/pid)" 2>/dev/null && echo "STILL RUNNING" || echo "FINISHED"
    cp $d/*.log "$OUT/" 2>/dev/null
    for s in sweep vsweep fault_s; do
      [ -d $d/$s ] && (cd $d && tar czf "$OUT/$s.tar.gz" --exclude='*.safetensors' $s)
    done
    nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; ls -la "$OUT" ;;
esac
