#!/usr/bin/env bash
# One warm stretch on the lent GPU node for issue 24 item 5 (written 2026-12-06, second session):
#   bash gpu/chain_exact.sh start BUDGET_S  run the chain below in the background (its own session), then return
#   bash gpu/chain_exact.sh poll SECONDS    wait for it (at most SECONDS), show its log, copy its results to $OUT
#   bash gpu/chain_exact.sh part DIR PART   move a wheel-bundle part brought by `carry` into DIR (made if missing)
# Keep a poll or a part move in flight the whole time: the machine goes back after 30 s without a call.
# The chain, one thing on the GPU at a time:
#   1. bench/stats_update_bench.py --exact: one boundary update, compiled / one-pass / exact (order-free integer)
#      sums, and the exact sums of the same tokens in other batches compared bit for bit (no engine);
#   2. once the vLLM bundle's parts (as many as /tmp/stage_v/NPARTS says) lie in /tmp/stage_v and the extras in
#      /tmp/whl: vLLM 0.24.0 installed, then gpu/fault_suite.py vllm-capture --exact-sums under VLLM_BATCH_INVARIANT=1
#      (kill -9 mid-capture, resume, compare with the uninterrupted reference: bit-equal expected, sums included);
#   3. once SGLang's parts (/tmp/stage_s/NPARTS) lie in /tmp/stage_s: SGLang 0.5.15 installed, then
#      gpu/fault_suite.py sglang-bench under --enable-deterministic-inference on a short bench (8 prompts x 32 new
#      tokens), the time left allowing;
#   4. the vLLM speed suite (issue 24 item 3) if 330 s are left.
set -u
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
d=/tmp/out_exact
case $1 in
  part)
    mkdir -p "$2" && mv "$3" "$2/" && ls "$2" | grep -c part ;;
  start)
    mkdir -p $d
    setsid nohup bash "$0" chain "${2:-1400}" > $d/suite.log 2>&1 < /dev/null & echo $! > $d/pid
    sleep 15; tail -5 $d/suite.log ;;
  chain)
    budget=$2 t0=$(date +%s)
    el() { echo $(( $(date +%s) - t0 )); }
    left() { echo $(( budget - ($(date +%s) - t0) )); }
    echo "chain start $(date -u +%FT%TZ), budget $budget s"
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
    timeout 240 python3 bench/stats_update_bench.py --tokens 16384 --boundaries 4 --forwards 8 --exact \
      --out $d/stats_update_exact.json > $d/stats_update_exact.log 2>&1
    tail -40 $d/stats_update_exact.log
    echo "stats bench done at $(el) s"
    while [ "$(ls /tmp/stage_v/part* 2>/dev/null | wc -l)" != "$(cat /tmp/stage_v/NPARTS)" ] || [ ! -d /tmp/whl ]; do
      [ "$(left)" -lt 400 ] && { echo "vLLM parts not all here in time"; exit 0; }; sleep 3; done
    bash gpu/load_h200.sh install-vllm "$(cat /tmp/stage_v/SHA256)" 2>&1 | tail -4
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_duck /tmp/whl/*.whl \
      /tmp/stage_v/w/pydantic*.whl /tmp/stage_v/w/annotated_types*.whl /tmp/stage_v/w/typing_inspection*.whl 2>&1 | tail -2
    echo "vllm installed at $(el) s"
    VLLM_BATCH_INVARIANT=1 PYTHONPATH=/tmp/site_duck python3 gpu/fault_suite.py --out $d/fault_v --root /tmp/fault_root_v \
      --engines vllm --engine-path vllm=/tmp/site_vllm --steps vllm-capture --exact-sums --budget-s 320 > $d/fault_v.log 2>&1
    tail -8 $d/fault_v.log; echo "vllm capture kill done at $(el) s"
    while [ "$(ls /tmp/stage_s/part* 2>/dev/null | wc -l)" != "$(cat /tmp/stage_s/NPARTS)" ] && [ "$(left)" -gt 480 ]; do sleep 3; done
    if [ "$(ls /tmp/stage_s/part* 2>/dev/null | wc -l)" = "$(cat /tmp/stage_s/NPARTS)" ] && [ "$(left)" -gt 450 ]; then
      bash gpu/load_h200.sh install-sgl "$(cat /tmp/stage_s/SHA256)" 2>&1 | tail -3
      echo "sglang installed at $(el) s"
      PYTHONPATH=/tmp/site_duck python3 gpu/fault_suite.py --out $d/fault_s --root /tmp/fault_root_s --engines sglang \
        --engine-path sglang=/tmp/site_sgl --steps sglang-bench --bench-limit 8 --max-new-tokens 32 \
        --sglang-option attention-backend=triton --sglang-option disable-cuda-graph=true \
        --sglang-option enable-deterministic-inference=true --budget-s $(( $(left) - 60 )) > $d/fault_s.log 2>&1
      tail -8 $d/fault_s.log; echo "sglang bench kill done at $(el) s"
    else
      echo "SGLang bench kill not run: $(left) s left, $(ls /tmp/stage_s/part* 2>/dev/null | wc -l) parts"
    fi
    if [ "$(left)" -gt 330 ]; then
      env PYTHONPATH=/tmp/site_vllm timeout $(( $(left) - 20 )) python3 gpu/vllm_suite.py speed --out $d/speed \
        --root /tmp/data-speed > $d/speed.log 2>&1
      grep -E "^(plain_|capture_|eagle_set|all_33)" $d/speed.log | cut -c1-400; tail -3 $d/speed.log
      echo "speed done at $(el) s"
    fi
    echo "chain done at $(el) s $(date -u +%FT%TZ)" ;;
  poll)
    end=$(( $(date +%s) + ${2:-500} ))
    while kill -0 "$(cat $d/pid)" 2>/dev/null && [ "$(date +%s)" -lt $end ]; do sleep 3; done
    tail -40 $d/suite.log; kill -0 "$(cat $d/pid)" 2>/dev/null && echo "STILL RUNNING" || echo "FINISHED"
    cp $d/*.json "$OUT/" 2>/dev/null; cp $d/suite.log "$OUT/" 2>/dev/null
    [ -f $d/speed/vllm_speed.json ] && cp $d/speed/vllm_speed.json "$OUT/"
    for s in fault_v fault_s; do
      [ -d $d/$s ] && (cd $d && tar czf "$OUT/$s.tar.gz" --exclude='*.safetensors' $s $s.log 2>/dev/null)
    done
    nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; ls -la "$OUT" ;;
esac
