#!/usr/bin/env bash
# One warm stretch on the lent GPU node, issue 24 item 5 and issue 23's open vLLM start:
#   bash gpu/faults_h200.sh start BUDGET_S   run the chain below in the background (its own session), then return
#   bash gpu/faults_h200.sh poll SECONDS     wait for it (at most SECONDS), show its log, copy its results to $OUT
# The chain, one thing on the GPU at a time (the fault suite checks that the GPU memory is free again by the total
# in use, so nothing may run beside it):
#   1. the toy DFlash drafter as trained (dflash_config.target_layer_ids only) through vLLM 0.24.0 alone: on
#      2026-12-05 its engine did not start while an SGLang server came up on the same GPU (gpu/dflash_vllm_alone.sh);
#   2. gpu/fault_suite.py, vLLM: kill -9 mid-capture and mid serving-load sweep (the vLLM bench trial ran on
#      2026-12-05), enforce_eager to shorten each engine start;
#   3. once SGLang is installed (/tmp/site_sgl/.done, by `bash gpu/load_h200.sh install-sgl SHA`): the fault suite on
#      SGLang: capture, OOM at start, bench, serving-load sweep, while the budget lasts.
# Needs /tmp/site_vllm (bash gpu/load_h200.sh install-vllm SHA) and /tmp/site_duck (duckdb for the suite itself;
# `start` adds pydantic from the vLLM bundle). Seen on 2026-12-06: an SGLang server takes 150-170 s to come up, so an
# SGLang kill trial (reference, trial, resume) needs about 500 s; the suite's output goes to fault_v.log / fault_s.log.
set -u
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
d=/tmp/out_chain
case $1 in
  start)
    mkdir -p $d /tmp/out_align
    # the suite's own process needs duckdb and pydantic (the image has neither): from the vLLM bundle's wheels
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_duck /tmp/stage_v/w/pydantic*.whl \
      /tmp/stage_v/w/annotated_types*.whl /tmp/stage_v/w/typing_inspection*.whl 2>&1 | tail -2
    PYTHONPATH=/tmp/site_duck timeout 120 python3 bench/align_bench.py --device cuda --out /tmp/out_align/align.json \
      > /tmp/out_align/log 2>&1; tail -2 /tmp/out_align/log; cp /tmp/out_align/align.json "$OUT/" 2>/dev/null
    setsid nohup bash "$0" chain "$2" > $d/suite.log 2>&1 < /dev/null & echo $! > $d/pid
    sleep 3; tail -3 $d/suite.log ;;
  chain)
    budget=$2 t0=$(date +%s)
    left() { echo $(( budget - ($(date +%s) - t0) )); }
    echo "chain start $(date -u +%FT%TZ), budget $budget s"
    PYTHONPATH=/tmp/site_vllm timeout 300 bash gpu/dflash_vllm_alone.sh $d/dflash
    echo "dflash done at $(( $(date +%s) - t0 )) s"
    PYTHONPATH=/tmp/site_duck python3 gpu/fault_suite.py --out $d/fault_v --root /tmp/fault_root --engines vllm \
      --engine-path vllm=/tmp/site_vllm --steps vllm-capture,vllm-load --vllm-option enforce_eager=true --load-ks 4 \
      --budget-s "$(left)" > $d/fault_v.log 2>&1; tail -5 $d/fault_v.log
    echo "vllm faults done at $(( $(date +%s) - t0 )) s"
    while [ ! -f /tmp/site_sgl/.done ] && [ "$(left)" -gt 200 ]; do sleep 5; done
    PYTHONPATH=/tmp/site_duck python3 gpu/fault_suite.py --out $d/fault_s --root /tmp/fault_root --engines sglang \
      --engine-path sglang=/tmp/site_sgl --steps sglang-capture,sglang-oom,sglang-bench,sglang-load \
      --budget-s "$(left)" > $d/fault_s.log 2>&1; tail -5 $d/fault_s.log
    echo "chain done at $(( $(date +%s) - t0 )) s" ;;
  poll)
    end=$(( $(date +%s) + ${2:-500} ))
    while kill -0 "$(cat $d/pid)" 2>/dev/null && [ "$(date +%s)" -lt $end ]; do sleep 5; done
    tail -40 $d/suite.log; kill -0 "$(cat $d/pid)" 2>/dev/null && echo "STILL RUNNING" || echo "FINISHED"
    cp $d/suite.log $d/fault_v.log $d/fault_s.log "$OUT/" 2>/dev/null
    for s in dflash fault_v fault_s; do
      [ -d $d/$s ] && (cd $d && tar czf "$OUT/$s.tar.gz" $s)
    done
    nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; ls -la "$OUT" ;;
esac
