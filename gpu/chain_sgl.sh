#!/usr/bin/env bash
# One warm stretch on the lent GPU node (2026-12-06, third session), one thing on the GPU at a time:
#   bash gpu/chain_sgl.sh start            run the chain below in the background (its own session), then return
#   bash gpu/chain_sgl.sh poll SECONDS     wait for it (at most SECONDS), show its log, copy its results to $OUT
# The chain:
#   1. the toy pair's serving-load sweep through SGLang 0.5.15, K 1, 2, 4, 6 x concurrency 1, 8, 32, 64 (issue 19
#      item 6: the 2026-12-02 SGLang sweep had K 1, 2, 4), every cell paired with its baseline on the same card;
#   2. gpu/fault_suite.py sglang-bench and sglang-load: kill -9 of an SGLang bench and of an SGLang serving-load
#      sweep mid-run, resumed and compared with an uninterrupted run (issue 24 item 5);
#   3. once /tmp/site_vllm is installed (its parts moved in while step 1 runs) and /tmp/go_vllm is there:
#      gpu/vllm_suite.py speed, the capture overhead on the Llama-3.1-8B shape (issue 24 item 3), then
#      gpu/fault_suite.py vllm-capture (kill -9 mid-capture, resumed: bit-equal with the fused statistics kernel?);
#      before step 2 when both are ready by the end of step 1. /tmp/fault_budget: step 2's --budget-s (550).
# Needs /tmp/site_sgl (`bash gpu/load_h200.sh install-sgl SHA`, with /tmp/whl and /tmp/whl2 from the extras bundle).
set -u
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
d=/tmp/out_chain3
S="env PYTHONPATH=/tmp/site_sgl"
V="env PYTHONPATH=/tmp/site_vllm"
case $1 in
  start)
    mkdir -p $d
    setsid nohup bash "$0" chain "${2:-1,2,4,6}" > $d/suite.log 2>&1 < /dev/null & echo $! > $d/pid
    sleep 3; tail -3 $d/suite.log ;;
  chain)
    t0=$(date +%s)
    el() { echo $(( $(date +%s) - t0 )); }
    echo "chain start $(date -u +%FT%TZ)"
    $S SPECLENS_SERVER_START_TIMEOUT=500 timeout 1000 python3 gpu/load_suite.py sweep --engine sglang --ks "$2" \
      --out $d/sweep --root /tmp/root_sgl --memory 0.12 --opt attention-backend=triton > $d/sweep.log 2>&1
    tail -3 $d/sweep.log; echo "sweep done at $(el) s"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_duck /tmp/whl/*.whl \
      /tmp/stage_s/w/pydantic-2*.whl /tmp/stage_s/w/pydantic_core*.whl /tmp/stage_s/w/annotated_types*.whl \
      /tmp/stage_s/w/typing_inspection*.whl 2>&1 | tail -2
    vllm_steps() {
      $V timeout 480 python3 gpu/vllm_suite.py speed --out $d/speed --root /tmp/root_speed --budget-s 450 \
        > $d/speed.log 2>&1; tail -12 $d/speed.log; echo "speed done at $(el) s"
      PYTHONPATH=/tmp/site_duck python3 gpu/fault_suite.py --out $d/fault_v --root /tmp/fault_root_v --engines vllm \
        --engine-path vllm=/tmp/site_vllm --steps vllm-capture --budget-s "${VLLM_FAULT_BUDGET_S:-300}" \
        > $d/fault_v.log 2>&1; tail -5 $d/fault_v.log; echo "vllm fault done at $(el) s"
    }
    sglang_faults() {
      PYTHONPATH=/tmp/site_duck python3 gpu/fault_suite.py --out $d/fault_s --root /tmp/fault_root_s --engines sglang \
        --engine-path sglang=/tmp/site_sgl --steps sglang-bench,sglang-load --load-ks 4 --load-concurrency 1,8 \
        --budget-s "$(cat /tmp/fault_budget 2>/dev/null || echo 550)" > $d/fault_s.log 2>&1; tail -5 $d/fault_s.log
      echo "sglang faults done at $(el) s"
    }
    # the vLLM steps go first once /tmp/site_vllm is installed and /tmp/go_vllm says the code to measure is there
    if [ -f /tmp/site_vllm/.done ] && [ -f /tmp/go_vllm ]; then vllm_steps; sglang_faults
    else
      sglang_faults
      for _ in $(seq 120); do [ -f /tmp/site_vllm/.done ] && [ -f /tmp/go_vllm ] && break; sleep 5; done
      if [ -f /tmp/site_vllm/.done ]; then vllm_steps; else echo "no /tmp/site_vllm: vLLM steps skipped"; fi
    fi
    echo "chain done at $(el) s" ;;
  sweep2)  # the sweep again in the background, gpu/stubs first on PYTHONPATH (an image without `cutlass`: its
           # sitecustomize stands in for the DSA backend module the EAGLE worker imports)
    mkdir -p $d/sweep2; rm -rf /tmp/root_sgl2
    setsid nohup env PYTHONPATH="$(pwd)/gpu/stubs:/tmp/site_sgl" SPECLENS_SERVER_START_TIMEOUT=500 timeout 900 \
      python3 gpu/load_suite.py sweep --engine sglang --ks "${2:-2,4,6}" --out $d/sweep2 --root /tmp/root_sgl2 \
      --memory 0.12 --opt attention-backend=triton > $d/sweep2.log 2>&1 < /dev/null & echo $! > $d/pid2
    sleep 20; tail -3 $d/sweep2.log; ls /tmp/root_sgl2/runs/*/servers/ 2>/dev/null ;;
  poll2)
    end=$(( $(date +%s) + ${2:-500} ))
    while kill -0 "$(cat $d/pid2)" 2>/dev/null && [ "$(date +%s)" -lt $end ]; do sleep 5; done
    tail -5 $d/sweep2.log; kill -0 "$(cat $d/pid2)" 2>/dev/null && echo "STILL RUNNING" || echo "FINISHED"
    tail -3 /tmp/root_sgl2/runs/*/servers/*.log 2>/dev/null | grep -iE "error|ready|fired" | tail -5
    [ -d $d/sweep2 ] && (cd $d && tar czf "$OUT/sweep2.tar.gz" sweep2); cp $d/sweep2.log "$OUT/" ;;
  poll)
    end=$(( $(date +%s) + ${2:-500} ))
    while kill -0 "$(cat $d/pid)" 2>/dev/null && [ "$(date +%s)" -lt $end ]; do sleep 5; done
    tail -30 $d/suite.log; kill -0 "$(cat $d/pid)" 2>/dev/null && echo "STILL RUNNING" || echo "FINISHED"
    cp $d/*.log "$OUT/" 2>/dev/null
    for s in sweep fault_s speed fault_v; do
      [ -d $d/$s ] && (cd $d && tar czf "$OUT/$s.tar.gz" --exclude='*.safetensors' $s)
    done
    nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; ls -la "$OUT" ;;
esac
