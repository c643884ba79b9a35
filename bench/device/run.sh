#!/usr/bin/env bash
# On a lent GPU machine (device tool), from the repository root, with .device/ carried (bench/device/prepare.sh):
#   bench/device/run.sh test-gpu            make test-gpu's pytest run -> $OUT/test-gpu.json (+ .log)
#   bench/device/run.sh bench-comm [ARGS]   bench-comm -> $OUT/bench-comm.json (+ .log)
#   bench/device/run.sh both [ARGS]         both, test-gpu first
#   bench/device/run.sh pytest [ARGS]       pytest tests/gpu ARGS directly (a subset, e.g. -k faults)
# The machine has python3 with CUDA torch 2.11 and no network: the patched SGLang, FlashInfer (with its modules
# compiled ahead by prepare.sh) and the missing wheels come from .device/; sgl-kernel is not carried (built for
# another torch): tests/gpu/standin stands in for its imports only. NVLink multicast stays off (the machines'
# rule: NCCL_NVLS_ENABLE=0 and friends are kept as the machine sets them).
set -euo pipefail
what=${1:?test-gpu, bench-comm, both or pytest}
shift || true
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/site /tmp/sgl-tree/python
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/whl/*.whl
tar xzf .device/flashinfer.tgz -C /tmp/site
tar xzf .device/sglang.tgz -C /tmp/sgl-tree/python
# tests/gpu/standin: the import-only sgl_kernel stand-in (the GPU tier adds it itself; bench-comm's SGLang rows need
# it too, since argument resolution imports quantization modules that import sgl_kernel)
export PYTHONPATH=/tmp/sgl-tree/python:/tmp/site:$PWD/tests/gpu/standin PYTHONUNBUFFERED=1 SGLANG_TREE=/tmp/sgl-tree
export FLASHINFER_WORKSPACE_BASE=/tmp/fiws
export EAGLE_GIT_REV=${EAGLE_GIT_REV:-unknown}
echo "[device] unpacked in $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,compute_cap --format=csv | tee "$OUT/gpus.csv"
nvidia-smi -q -x > "$OUT/nvidia-smi-q.xml" 2>/dev/null || true
nvidia-smi topo -m > "$OUT/topo-m.txt" 2>&1 || true
python3 -c "import torch, flashinfer, sglang; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count(), 'flashinfer', flashinfer.__version__, 'sglang', sglang.__file__)"
rc=0
if [ "$what" = test-gpu ] || [ "$what" = both ]; then
  python3 -m scripts.host.gpu_tier --python python3 --out "$OUT/test-gpu.json" 2>&1 | tee "$OUT/test-gpu.log" || rc=$?
fi
if [ "$what" = pytest ]; then
  EAGLE_GPU_RESULTS="$OUT/test-gpu.json" python3 -m pytest -v -p no:cacheprovider tests/gpu "$@" 2>&1 \
    | tee "$OUT/test-gpu.log" || rc=$?
fi
if [ "$what" = bench-comm ] || [ "$what" = both ]; then
  python3 -m scripts.bench.bench_comm --box H200 --out "$OUT/bench-comm.json" "$@" 2>&1 | tee "$OUT/bench-comm.log" || rc=$?
fi
echo "[device] done in $(( $(date +%s) - t0 )) s, rc=$rc"
exit $rc
