#!/usr/bin/env bash
# One warm stretch on the lent GPU node (2026-12-06, second session of the day), one thing on the GPU at a time:
#   bash gpu/chain_load.sh start            run the chain below in the background (its own session), then return
#   bash gpu/chain_load.sh poll SECONDS     wait for it (at most SECONDS), show its log, copy its results to $OUT
# The chain:
#   1. bench/align_bench.py --device cuda: the 33 x 33 alignment with the pinned staging copy (issue 24 item 1);
#   2. the toy pair's serving-load sweep through vLLM, K 1, 2, 4, 6 x concurrency 1, 8, 32, 64 (issue 19 item 6),
#      every cell paired with its baseline on the same card;
#   3. the synthetic-acceptance map on an MoE shape (issue 19 item 4): gpt-oss-20b (MXFP4 experts as published,
#      dummy weights) with SpecForge's EAGLE-3 drafter config, one baseline server kept beside one drafter server at
#      a time; DeepSeek-V2-Lite instead if gpt-oss does not start;
#   4. gpu/fault_suite.py vllm-capture: kill -9 mid-capture and resume, with the deterministic statistics kernel
#      (issue 24 item 5: the 2026-12-06 morning run was not bit-equal).
# Needs /tmp/site_vllm (`bash gpu/load_h200.sh install-vllm SHA`, with /tmp/whl from the extras bundle).
set -u
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
d=/tmp/out_chain2
V="env PYTHONPATH=/tmp/site_vllm"
case $1 in
  start)
    mkdir -p $d
    setsid nohup bash "$0" chain > $d/suite.log 2>&1 < /dev/null & echo $! > $d/pid
    sleep 3; tail -3 $d/suite.log ;;
  chain)
    t0=$(date +%s)
    el() { echo $(( $(date +%s) - t0 )); }
    echo "chain start $(date -u +%FT%TZ)"
    $V timeout 150 python3 bench/align_bench.py --device cuda --out $d/align.json > $d/align.log 2>&1
    tail -c 600 $d/align.log; echo; echo "align done at $(el) s"
    $V timeout 800 python3 gpu/load_suite.py sweep --engine vllm --ks 1,2,4,6 --out $d/sweep --root /tmp/root_vs \
      --memory 0.06 > $d/sweep.log 2>&1; tail -3 $d/sweep.log
    echo "sweep done at $(el) s"
    $V SPECLENS_SERVER_START_TIMEOUT=400 timeout 900 python3 gpu/load_suite.py synthetic --shape gpt-oss-20b \
      --one-at-a-time --taus 1,2.5,4 --out $d/moe --root /tmp/root_moe --memory 0.40 > $d/moe.log 2>&1; tail -3 $d/moe.log
    if ! grep -q '"run_id"' $d/moe/synthetic_gpt-oss-20b.json 2>/dev/null; then
      echo "gpt-oss-20b failed at $(el) s: DeepSeek-V2-Lite instead"
      tail -40 /tmp/root_moe/runs/*/servers/*.log 2>/dev/null | grep -iE "error|exception" | tail -8
      $V SPECLENS_SERVER_START_TIMEOUT=400 timeout 900 python3 gpu/load_suite.py synthetic --shape deepseek-v2-lite \
        --one-at-a-time --taus 1,2.5,4 --out $d/moe --root /tmp/root_moe2 --memory 0.46 > $d/moe2.log 2>&1; tail -3 $d/moe2.log
    fi
    echo "moe done at $(el) s"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_duck /tmp/whl/*.whl \
      /tmp/stage_v/w/pydantic*.whl /tmp/stage_v/w/annotated_types*.whl /tmp/stage_v/w/typing_inspection*.whl 2>&1 \
      | tail -2
    PYTHONPATH=/tmp/site_duck python3 gpu/fault_suite.py --out $d/fault_v --root /tmp/fault_root --engines vllm \
      --engine-path vllm=/tmp/site_vllm --steps vllm-capture --vllm-option enforce_eager=true --budget-s 400 \
      > $d/fault_v.log 2>&1; tail -5 $d/fault_v.log
    echo "chain done at $(el) s" ;;
  poll)
    end=$(( $(date +%s) + ${2:-500} ))
    while kill -0 "$(cat $d/pid)" 2>/dev/null && [ "$(date +%s)" -lt $end ]; do sleep 5; done
    tail -30 $d/suite.log; kill -0 "$(cat $d/pid)" 2>/dev/null && echo "STILL RUNNING" || echo "FINISHED"
    cp $d/*.log $d/*.json "$OUT/" 2>/dev/null
    for s in sweep moe fault_v; do
      [ -d $d/$s ] && (cd $d && tar czf "$OUT/$s.tar.gz" $s)
    done
    nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; ls -la "$OUT" ;;
esac
