#!/usr/bin/env bash
# One warm stretch on the lent GPU node, one thing on the GPU at a time (written 2026-12-06; its first run that day
# stopped at step 1: see docs/PERFORMANCE.md "On the GPU node, 2026-12-06 13:19-13:49 UTC"):
#   bash gpu/chain_sgl.sh start [KS]       run the chain below in the background (its own session), then return
#   bash gpu/chain_sgl.sh poll SECONDS     wait for it (at most SECONDS), show its log, copy its results to $OUT
# Keep a poll in flight the whole time: the machine goes back after 30 s without a call, and the chain with it.
# The chain:
#   1. the toy pair's serving-load sweep through SGLang 0.5.15, K in KS (default 1,2,4,6) x concurrency 1, 8, 32, 64
#      (issue 19 item 6), every cell paired with its baseline on the same card; gpu/stubs first on PYTHONPATH (an
#      image without the CuTe DSL: its sitecustomize stands in for the DSA module SGLang's EAGLE worker imports);
#   2. gpu/fault_suite.py sglang-bench (under SGLang's --enable-deterministic-inference: the 13:41 trial without it
#      resumed to another result in two prompts) and sglang-load (kill -9 of a serving-load sweep), issue 24 item 5;
#   3. once /tmp/site_vllm is installed (its parts moved in while step 1 runs): gpu/fault_suite.py vllm-capture
#      (kill -9 mid-capture, resumed: bit-equal with the deterministic statistics kernel?).
# Needs /tmp/site_sgl (`bash gpu/load_h200.sh install-sgl SHA`, with /tmp/whl and /tmp/whl2 from the extras bundle).
# /tmp/fault_budget: step 2's --budget-s (default 600).
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
    tail -3 $d/sweep.log; echo "sweep done at $(el) s"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_duck /tmp/whl/*.whl \
      /tmp/stage_s/w/pydantic-2*.whl /tmp/stage_s/w/pydantic_core*.whl /tmp/stage_s/w/annotated_types*.whl \
      /tmp/stage_s/w/typing_inspection*.whl 2>&1 | tail -2
    PYTHONPATH=/tmp/site_duck python3 gpu/fault_suite.py --out $d/fault_s --root /tmp/fault_root_s --engines sglang \
      --engine-path sglang=/tmp/site_sgl --steps sglang-bench,sglang-load --load-ks 4 --load-concurrency 1,8 \
      --sglang-option attention-backend=triton --sglang-option disable-cuda-graph=true \
      --sglang-option enable-deterministic-inference=true \
      --budget-s "$(cat /tmp/fault_budget 2>/dev/null || echo 600)" > $d/fault_s.log 2>&1; tail -5 $d/fault_s.log
    echo "sglang faults done at $(el) s"
    if [ -f /tmp/site_vllm/.done ]; then
      PYTHONPATH=/tmp/site_duck python3 gpu/fault_suite.py --out $d/fault_v --root /tmp/fault_root_v --engines vllm \
        --engine-path vllm=/tmp/site_vllm --steps vllm-capture --budget-s 300 > $d/fault_v.log 2>&1
      tail -5 $d/fault_v.log; echo "vllm fault done at $(el) s"
    else
      echo "no /tmp/site_vllm: the vLLM capture kill skipped"
    fi
    echo "chain done at $(el) s" ;;
  poll)
    end=$(( $(date +%s) + ${2:-500} ))
    while kill -0 "$(cat $d/pid)" 2>/dev/null && [ "$(date +%s)" -lt $end ]; do sleep 5; done
    tail -30 $d/suite.log; kill -0 "$(cat $d/pid)" 2>/dev/null && echo "STILL RUNNING" || echo "FINISHED"
    cp $d/*.log "$OUT/" 2>/dev/null
    for s in sweep fault_s fault_v; do
      [ -d $d/$s ] && (cd $d && tar czf "$OUT/$s.tar.gz" --exclude='*.safetensors' $s)
    done
    nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; ls -la "$OUT" ;;
esac
