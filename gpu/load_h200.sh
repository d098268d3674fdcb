#!/usr/bin/env bash
# Issue 19 item 6 on the lent H200: the serving-load runs of gpu/load_suite.py, one step per device call.
#   bash gpu/load_h200.sh install-vllm SHA256 | install-sgl SHA256 | watch | sglang | vllm-pair | vllm-sweep |
#        synthetic | collect | prove-start | prove-collect | bg-kinds | bg-fault [BUDGET_S [ENGINES [STEPS]]]
# prove-start / prove-collect: issue 22's proof through vLLM 0.24 (gpu/prove_vllm.sh, in the background).
# bg-sglang | bg-synthetic | bg-vsweep start a step in the background (no 600 s call limit); `poll DIR SECONDS` waits
# for it (or SECONDS), shows its log and copies its results to $OUT.
# Wheel-bundle parts (built here by `bash gpu/bundles.sh`, moved one part per call) lie in /tmp/stage_v (vLLM
# 0.24.0) and /tmp/stage_s (SGLang 0.5.15, sgl_kernel without its FA3
# library: SGLang servers run --attention-backend triton); /tmp/whl holds duckdb, /tmp/whl2 SGLang's own
# transformers 5.12.1 + tokenizers 0.22.2. Each step's results go to $OUT (at most 8 files).
set -u
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
step=$1
install() {  # stage-dir sha256 target
  [ -f "$3/.done" ] && return 0
  (cd "$1" && cat part* > b.tar && test "$(sha256sum b.tar | cut -d' ' -f1)" = "$2" && mkdir -p w && tar xf b.tar -C w \
    && rm b.tar && python3 -m pip install -q --no-index --no-deps --no-compile --target "$3" w/*.whl) \
    && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$3" /tmp/whl/*.whl \
    && touch "$3/.done" && echo "installed $1 into $3" || echo "INSTALL FAILED: $1"
}
V="env PYTHONPATH=/tmp/site_vllm"
S="env PYTHONPATH=/tmp/site_sgl"
case $step in
  install-vllm)
    t0=$(date +%s); install /tmp/stage_v "$2" /tmp/site_vllm; echo "install: $(( $(date +%s) - t0 )) s"
    $V python3 -c "import vllm, duckdb, aiohttp, prometheus_client, psutil; print('vllm', vllm.__version__)" 2>&1 | tail -2
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv ;;
  watch)
    $V python3 -m backend watch --help >/dev/null 2>&1 && echo "watch command present" || echo "NO watch command"
    mkdir -p /tmp/out_watch
    setsid nohup $V python3 gpu/load_suite.py watch --out /tmp/out_watch --root /tmp/root_watch --minutes ${2:-11} \
      --switch-after ${3:-7} --memory 0.04 > /tmp/out_watch/suite.log 2>&1 < /dev/null &
    sleep 60; tail -5 /tmp/out_watch/suite.log; ls /tmp/out_watch /tmp/out_watch/watch_raw 2>/dev/null | tail -3 ;;
  install-sgl)
    t0=$(date +%s); install /tmp/stage_s "$2" /tmp/site_sgl
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site_sgl /tmp/whl2/*.whl
    echo "install: $(( $(date +%s) - t0 )) s"
    $S python3 -c "import sglang, sgl_kernel, transformers; print('sglang', sglang.__version__, transformers.__version__)" \
      2>&1 | tail -2 ;;
  sglang)
    $S timeout 560 python3 gpu/load_suite.py sweep --engine sglang --ks ${2:-1,2,4} --out /tmp/out_sgl \
      --root /tmp/root_sgl --memory 0.06 --opt attention-backend=triton 2>&1 | tail -20
    cp /tmp/out_sgl/*.json /tmp/out_sgl/*.tar.gz "$OUT/" 2>/dev/null; ls -la "$OUT" ;;
  vllm-pair)
    $V timeout 560 python3 gpu/load_suite.py pair --engine vllm --out /tmp/out_vp --root /tmp/root_vp --memory 0.06 \
      2>&1 | tail -20
    cp /tmp/out_vp/*.json /tmp/out_vp/*.tar.gz "$OUT/" 2>/dev/null
    (cd /tmp/out_vp && tar czf "$OUT/recorded_vllm.tar.gz" recorded vbs 2>/dev/null); ls -la "$OUT" ;;
  vllm-sweep)
    $V timeout 560 python3 gpu/load_suite.py sweep --engine vllm --ks ${2:-1,2,4,6} --out /tmp/out_vs \
      --root /tmp/root_vs --memory 0.06 2>&1 | tail -20
    cp /tmp/out_vs/*.json /tmp/out_vs/*.tar.gz "$OUT/" 2>/dev/null; ls -la "$OUT" ;;
  synthetic)
    $V timeout 570 python3 gpu/load_suite.py synthetic --out /tmp/out_syn --root /tmp/root_syn --memory 0.15 \
      --taus ${2:-1,2,3,4} 2>&1 | tail -20
    cp /tmp/out_syn/*.json /tmp/out_syn/*.tar.gz "$OUT/" 2>/dev/null; ls -la "$OUT" ;;
  prove-start)
    mkdir -p /tmp/out_prove
    setsid nohup $V bash gpu/prove_vllm.sh /tmp/out_prove > /tmp/out_prove/prove.log 2>&1 < /dev/null &
    sleep 5; tail -3 /tmp/out_prove/prove.log ;;
  prove-collect)
    tail -30 /tmp/out_prove/prove.log; cp /tmp/out_prove/* "$OUT/" 2>/dev/null; ls -la "$OUT" ;;
  bg-sglang)
    mkdir -p /tmp/out_sgl; setsid nohup $S python3 gpu/load_suite.py sweep --engine sglang --ks ${2:-1,2,4} \
      --out /tmp/out_sgl --root /tmp/root_sgl --memory ${3:-0.12} --opt attention-backend=triton \
      > /tmp/out_sgl/suite.log 2>&1 < /dev/null & echo $! > /tmp/out_sgl/pid; sleep 15; tail -5 /tmp/out_sgl/suite.log ;;
  bg-synthetic)
    mkdir -p /tmp/out_syn; setsid nohup $V python3 gpu/load_suite.py synthetic --out /tmp/out_syn --root /tmp/root_syn \
      --memory 0.15 --taus ${2:-1,2,3,4} > /tmp/out_syn/suite.log 2>&1 < /dev/null & echo $! > /tmp/out_syn/pid
    sleep 15; tail -5 /tmp/out_syn/suite.log ;;
  bg-vsweep)
    mkdir -p /tmp/out_vs; setsid nohup $V python3 gpu/load_suite.py sweep --engine vllm --ks ${2:-1,2,4,6} \
      --out /tmp/out_vs --root /tmp/root_vs --memory 0.06 > /tmp/out_vs/suite.log 2>&1 < /dev/null &
    echo $! > /tmp/out_vs/pid; sleep 15; tail -5 /tmp/out_vs/suite.log ;;
  bg-kinds)  # issue 23: gpu/kinds_h200.sh in the background
    mkdir -p /tmp/out_kinds; setsid nohup bash gpu/kinds_h200.sh /tmp/out_kinds > /tmp/out_kinds/suite.log 2>&1 \
      < /dev/null & echo $! > /tmp/out_kinds/pid; sleep 10; tail -5 /tmp/out_kinds/suite.log ;;
  bg-fault)  # issue 24 item 5: gpu/fault_suite.py for both engines, each engine's commands on its own site dir
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_duck /tmp/whl/*.whl 2>&1 | tail -2
    mkdir -p /tmp/out_fault; setsid nohup env PYTHONPATH=/tmp/site_duck python3 gpu/fault_suite.py --out /tmp/out_fault \
      --engines ${3:-vllm,sglang} --engine-path vllm=/tmp/site_vllm --engine-path sglang=/tmp/site_sgl \
      --budget-s ${2:-900} ${4:+--steps $4} > /tmp/out_fault/suite.log 2>&1 < /dev/null & echo $! > /tmp/out_fault/pid
    sleep 10; tail -5 /tmp/out_fault/suite.log ;;
  poll)
    d=$2; end=$(( $(date +%s) + ${3:-500} ))
    while kill -0 "$(cat "$d/pid")" 2>/dev/null && [ "$(date +%s)" -lt $end ]; do sleep 5; done
    tail -25 "$d/suite.log"; kill -0 "$(cat "$d/pid")" 2>/dev/null && echo "STILL RUNNING" || echo "FINISHED"
    cp "$d"/*.json "$d"/*.tar.gz "$d"/*.log "$d"/*.md "$OUT/" 2>/dev/null; nvidia-smi --query-gpu=memory.used --format=csv,noheader; ls "$OUT" ;;
  collect)
    tail -20 /tmp/out_watch/suite.log
    (cd /tmp/out_watch && tar czf "$OUT/watch_raw.tar.gz" watch_raw) ; cp /tmp/out_watch/*.json /tmp/out_watch/*.tar.gz \
      /tmp/out_watch/suite.log "$OUT/" 2>/dev/null; ls -la "$OUT" ;;
esac
