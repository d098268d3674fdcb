#!/usr/bin/env bash
# Issue 13 item 2 on the lent H200 (2026-12-01): SGLang 0.5.17 (toy drafters + real-config cases) and vLLM 0.25.1
# (toy drafters: what the running engine fed them), the three suites side by side on the one GPU.
#   usage, on the device, once the wheel-bundle parts lie in /tmp/stage_s (SGLang) and /tmp/stage_v (vLLM):
#     bash gpu/h200_releases.sh SGLANG_BUNDLE_SHA256 VLLM_BUNDLE_SHA256 [SECONDS]
# Each engine gets its own --target site folder (SGLang 0.5.17 needs transformers 5.12.1 over the image's 5.17;
# vLLM 0.25.1 runs on the image's). The SGLang bundle leaves out sgl_kernel's FA3 library (flash_ops, 1.1 GB), so
# every SGLang server gets --attention-backend triton. Results are copied flat into $OUT (at most 8 files).
set -u
sgl_sha=$1 vllm_sha=$2 secs=${3:-500}
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
install() {  # stage-dir sha256 target
  [ -f "$3/.done" ] && return 0
  (cd "$1" && cat part* > b.tar && test "$(sha256sum b.tar | cut -d' ' -f1)" = "$2" && mkdir -p w && tar xf b.tar -C w \
    && rm b.tar && python3 -m pip install -q --no-index --no-deps --no-compile --target "$3" w/*.whl) \
    && touch "$3/.done" && echo "installed $1 into $3" || echo "INSTALL FAILED: $1"
}
t0=$(date +%s)
install /tmp/stage_s "$sgl_sha" /tmp/site_sgl &
install /tmp/stage_v "$vllm_sha" /tmp/site_vllm &
wait
for site in /tmp/site_sgl /tmp/site_vllm; do   # the project's own needs that the image lacks (.whl: duckdb)
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $site .whl/*.whl
done
echo "install: $(( $(date +%s) - t0 )) s"
R=/tmp/res && mkdir -p $R
PYTHONPATH=/tmp/site_sgl python3 -c "import sglang, sgl_kernel, transformers, torch; print('sglang', sglang.__version__,
  'transformers', transformers.__version__, 'torch', torch.__version__)" 2>&1 | tail -3
PYTHONPATH=/tmp/site_vllm python3 -c "import vllm; print('vllm', vllm.__version__)" 2>&1 | tail -3
budget=$(( secs - 150 ))
PYTHONPATH=/tmp/site_sgl timeout $secs python3 gpu/sglang_suite.py --skip-capture --out $R/sgl --root /tmp/data-sgl \
  --budget-s $budget --engine-option attention-backend=triton > $R/sgl.log 2>&1 &
sleep 20
PYTHONPATH=/tmp/site_sgl timeout $secs python3 gpu/sglang_suite.py --real-only --out $R/sglreal --root /tmp/data-sglr \
  --budget-s $budget --engine-option attention-backend=triton --engine-option max-total-tokens=8192 \
  > $R/sglreal.log 2>&1 &
sleep 20
PYTHONPATH=/tmp/site_vllm timeout $secs python3 gpu/vllm_suite.py toy --out $R/vllm --root /tmp/data-vllm \
  --only bench_vllm_matched,bench_vllm_after_layer,nested_v2,nested_v1,recorded --budget-s $budget > $R/vllm.log 2>&1 &
wait
echo "suites: $(( $(date +%s) - t0 )) s"
cp $R/sgl/sglang_results.json "$OUT/sglang_toy_results.json" 2>/dev/null
cp $R/sgl/recorded/sglang_engine_info.json "$OUT/sglang_engine_info.json" 2>/dev/null
cp $R/sglreal/sglang_results.json "$OUT/sglang_real_results.json" 2>/dev/null
cp $R/vllm/vllm_toy.json "$OUT/vllm_toy.json" 2>/dev/null
cp $R/vllm/recorded/vllm_engine_info.json "$OUT/vllm_engine_info.json" 2>/dev/null
for f in sgl sglreal vllm; do echo "=== $f.log"; tail -c 20000 $R/$f.log; done > "$OUT/logs.txt"
for f in sgl sglreal vllm; do echo "=== $f.log"; grep -E "^\[|tau|agree|ERROR|Error|engine " $R/$f.log | tail -25; done
