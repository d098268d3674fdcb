#!/usr/bin/env bash
# Build the wheel bundles the GPU node needs, as this session did on 2026-12-06 (about 5 minutes here), into ignored
# folders of the repo, each split into parts that fit one device call beside the tracked tree (a call carries at
# most 64 MiB in all, the tree included: 41 MiB on 2026-12-06, so 20 MiB parts):
#   .stage   vLLM 0.24.0                                      -> /tmp/stage_v, `bash gpu/load_h200.sh install-vllm SHA`
#   .stage2  SGLang 0.5.15, sgl_kernel without flash_ops (FA3: its servers run --attention-backend triton)
#                                                             -> /tmp/stage_s, `bash gpu/load_h200.sh install-sgl SHA`
#   .stage3  duckdb (.whl) and SGLang's transformers 5.12.1 + tokenizers 0.22.2 (.whl2)
#                                                             -> untar into /tmp, then .whl -> /tmp/whl, .whl2 -> /tmp/whl2
#   bash gpu/bundles.sh [BUNDLE_SH]     (BUNDLE_SH: the device notes' bundle.sh, default ../shared/device/bundle.sh)
# Prints each bundle's SHA256 (also in .stageN/SHA256) and the part size used.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=${1:-../shared/device/bundle.sh}
for d in .stage .stage2 .stage3 .whl .whl2; do
  grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude
done
tree_mib=$(( $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) / 1048576 + 1 ))
part_mib=$(( 62 - tree_mib ))
[ "$part_mib" -ge 4 ] || { echo "the tracked tree ($tree_mib MiB) leaves no room for parts"; exit 1; }
echo "tracked tree $tree_mib MiB: parts of $part_mib MiB"
PART=${part_mib}M "$bundle" 'vllm==0.24.0' .stage &
PART=${part_mib}M "$bundle" 'sglang==0.5.15' .stage2 &
duck=$(.venv/bin/python -c "import duckdb; print(duckdb.__version__)")
mkdir -p .whl .whl2
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "duckdb==$duck"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d .whl2 transformers==5.12.1 tokenizers==0.22.2
wait
# SGLang: drop sgl_kernel's FA3 library (1.7 GB unpacked) and re-split
work=$(mktemp -d)
cat .stage2/part* > "$work/b.tar"
test "$(sha256sum "$work/b.tar" | cut -d' ' -f1)" = "$(cat .stage2/SHA256)"
mkdir "$work/w" && tar xf "$work/b.tar" -C "$work/w" && rm "$work/b.tar"
python3 - "$work"/w/sglang_kernel*.whl <<'PY'
import os, sys, zipfile
f = sys.argv[1]
src, out = zipfile.ZipFile(f), f + ".new"
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as o:
    for i in src.infolist():
        if i.filename.endswith("flash_ops.abi3.so"):
            continue
        data = src.read(i)
        if i.filename.endswith("/RECORD"):
            data = b"\n".join(ln for ln in data.split(b"\n") if b"flash_ops.abi3.so" not in ln)
        o.writestr(i, data, compress_type=i.compress_type)
os.replace(out, f)
PY
(cd "$work/w" && tar cf ../b.tar ./*.whl)
rm -f .stage2/part* && (cd .stage2 && split -b "${part_mib}M" -d "$work/b.tar" part \
  && sha256sum "$work/b.tar" | cut -d' ' -f1 > SHA256)
rm -rf "$work"
mkdir -p .stage3 && rm -f .stage3/part* && tar cf /tmp/speclens-extras.tar .whl .whl2
(cd .stage3 && split -b "${part_mib}M" -d /tmp/speclens-extras.tar part \
  && sha256sum /tmp/speclens-extras.tar | cut -d' ' -f1 > SHA256)
rm -f /tmp/speclens-extras.tar
for d in .stage .stage2 .stage3; do
  echo "$d: $(ls $d/part* | wc -l) parts, sha256 $(cat $d/SHA256)"
done
