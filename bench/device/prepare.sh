#!/usr/bin/env bash
# Build, on this (CPU) machine, everything a lent GPU machine needs to run `make test-gpu` and `make bench-comm`
# against the patched SGLang, into .device/ (git-ignored; name it in the device call's `carry`):
#   .device/sglang.tgz      the patched tree's python package (build/sglang/python/sglang, no bytecode or .so)
#   .device/flashinfer.tgz  flashinfer/ from the pinned flashinfer-python wheel, Python files and headers (data/include,
#                           spdlog: SGLang's JIT speculative sampling kernel includes them), plus its sampling,
#                           trtllm comm, PCIe-IPC and norm modules compiled here for the target GPU
#                           (data/aot/<name>.so): no FlashInfer JIT on the device (trtllm alone took 270-480 s)
#   .device/whl/*.whl       the pure-Python / cp312 wheels listed in bench/device/wheels.txt
# Needs: make apply (build/sglang), nvcc 13 (this machine has it), .venv (make setup: ninja, cuBLAS headers).
#   bench/device/prepare.sh [ARCH]          ARCH: FlashInfer's arch list entry, default 9.0a (H200); 12.0a for SM120
#   bench/device/prepare.sh --serve [ARCH]  test-serve and the tiny make bench (tests/gpu/serve/_servers.py LENT_*):
#                                           FlashInfer with its sampling module only (the sampled verify's top-k /
#                                           top-p renorm); minutes on 2 cores
# Caches of an earlier run, carried back from its $OUT, go in as .device/jit-cache.tgz (SGLang's JIT kernels) and
# .device/triton-cache.tgz (Triton's); run.sh unpacks them when present.
set -euo pipefail
cd "$(dirname "$0")/../.."
SERVE_ONLY=$([ "${1:-}" = --serve ] && echo 1 || true)
[ -z "$SERVE_ONLY" ] || shift
ARCH=${1:-9.0a}
DEV=.device
FIWS=${FIWS:-$PWD/.device/fiws}  # FlashInfer JIT workspace (build cache); reuse one with FIWS=DIR
FI_VERSION=0.7.2
PY=.venv/bin/python
mkdir -p "$DEV/whl" "$DEV/stage"
[ -d build/sglang/python/sglang ] || { echo "build/sglang is missing: run make apply first" >&2; exit 2; }

echo "[prepare] wheels (cp312, manylinux x86_64) -> $DEV/whl"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_34_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$DEV/whl" -r bench/device/wheels.txt

echo "[prepare] patched SGLang -> $DEV/sglang.tgz"
# The package as the server reads it (sources, data files, the JIT kernels' sources that SGLang compiles on the
# device), without bytecode, compiled extensions (built for another torch; the Rust radix tree has a Python twin),
# the diffusion package and SGLang's test kit below sglang/test/ (its top-level modules stay: test-serve starts its
# servers with sglang.test.test_utils)
tar czf "$DEV/sglang.tgz" -C build/sglang/python --exclude='__pycache__' --exclude='*.pyc' --exclude='*.so' \
  --exclude='sglang/multimodal_gen' --exclude='sglang/test/*/*' sglang

command -v nvcc >/dev/null || { echo "nvcc not found: the modules are compiled here (CUDA 13 toolkit)" >&2; exit 2; }

echo "[prepare] FlashInfer $FI_VERSION modules for $ARCH (compiled here; minutes on 2 cores, cached in $DEV/fiws)"
# The link wants libcuda (driver): a stub with the symbols the modules use, soname libcuda.so.1, so the real
# driver resolves them on the device.
mkdir -p "$DEV/cudastub"
printf 'int cuDeviceGet(void){return 0;}\nint cuDeviceGetAttribute(void){return 0;}\nint cuStreamWriteValue32_v2(void){return 0;}\n' \
  > "$DEV/cudastub/stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$DEV/cudastub/libcuda.so" "$DEV/cudastub/stub.c"
CUBLAS_INC=$($PY -c "import nvidia.cu13, os; print(os.path.join(nvidia.cu13.__path__[0], 'include'))")
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
[ -d "$CUDA_HOME/lib64" ] || CUDA_HOME=/usr/local/cuda
PATH="$(dirname "$PY"):$PATH" CUDA_HOME=$CUDA_HOME CPATH=$CUBLAS_INC LIBRARY_PATH=$PWD/$DEV/cudastub \
FLASHINFER_CUDA_ARCH_LIST=$ARCH FLASHINFER_WORKSPACE_BASE=$FIWS MAX_JOBS=${MAX_JOBS:-$(nproc)} $PY - "$SERVE_ONLY" <<'PYEOF'
import sys, time
from flashinfer.jit.comm import gen_pcie_ipc_comm_module, gen_trtllm_comm_module
from flashinfer.jit.norm import gen_norm_module
from flashinfer.jit.sampling import gen_sampling_module
gens = [gen_sampling_module]
if not sys.argv[1]:  # not --serve
    gens += [gen_pcie_ipc_comm_module, gen_norm_module, gen_trtllm_comm_module]
for gen in gens:
    t = time.time()
    gen().build()
    print(f"[prepare]   {gen.__name__}: {time.time() - t:.0f} s", flush=True)
PYEOF

echo "[prepare] flashinfer/ (Python files + AOT modules) -> $DEV/flashinfer.tgz"
rm -rf "$DEV/stage/fi" && mkdir -p "$DEV/stage/fi"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$DEV/stage" "flashinfer-python==$FI_VERSION"
(cd "$DEV/stage/fi" && unzip -q ../flashinfer_python-$FI_VERSION-*.whl 'flashinfer/*.py' 'flashinfer/*.json' \
   'flashinfer/py.typed' 'flashinfer/data/include/*' 'flashinfer/data/spdlog/include/*' 2>/dev/null || true)
# Not read on the device: MoE kernel-selection tables (~16 MB), the Python and JSON files of the kernel sources
# (data/csrc, data/cutlass, data/cccl: the modules come compiled). SGLang's JIT checks that the header directories
# exist (kernels/jit/utils/deps.py); the sampling kernel includes data/include only.
rm -rf "$DEV/stage/fi/flashinfer/fused_moe/backends/cudnn_frost/artifacts" \
  "$DEV"/stage/fi/flashinfer/data/{csrc,cutlass,cccl}
mkdir -p "$DEV"/stage/fi/flashinfer/data/{csrc,cutlass/include,cutlass/tools/util/include}
for so in $(find "$FIWS" -name '*.so' -path '*cached_ops*'); do
  n=$(basename "$so" .so); mkdir -p "$DEV/stage/fi/flashinfer/data/aot/$n"; cp "$so" "$DEV/stage/fi/flashinfer/data/aot/$n/"
done
tar czf "$DEV/flashinfer.tgz" -C "$DEV/stage/fi" flashinfer
du -sh "$DEV"/*.tgz "$DEV/whl" | sed 's/^/[prepare] /'
carry=$(for f in sglang.tgz flashinfer.tgz whl jit-cache.tgz triton-cache.tgz; do
  [ ! -e "$DEV/$f" ] || printf '"%s/%s", ' "$DEV" "$f"; done)
echo "[prepare] done: carry [${carry%, }] in the device call (not $DEV/stage, $DEV/fiws), run bench/device/run.sh"
