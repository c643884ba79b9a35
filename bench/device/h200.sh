#!/usr/bin/env bash
# How the lent H200 machines ran `make bench-comm` (device tool; no network there, FlashInfer carried in).
#   bench/device/h200.sh build   JIT-build FlashInfer's trtllm comm, PCIe IPC and norm modules; capture the host
#                                tools' outputs; smoke-test bench-comm without FlashInfer.  -> $OUT/*.tar.gz, smoke
#   bench/device/h200.sh bench   full bench-comm with the modules built by `build` (carried in .device/fi-aot*)
# Needs in .device/ (git-ignored, `carry: [".device"]`): fi.tar.gz (flashinfer/ from flashinfer_python-0.7.2 minus
# cutlass/cccl and unneeded CUDA sources) and the apache_tvm_ffi cp312 wheel; see eagle-fast-verify.md.
set -euo pipefail
stage=${1:?build or bench}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/fi
tar xzf .device/fi.tar.gz -C /tmp/fi
python3 -m pip install -q --no-index --no-deps --target /tmp/fi .device/apache_tvm_ffi-*.whl
export PYTHONPATH=/tmp/fi PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=/tmp/fiws MAX_JOBS=16
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,compute_cap --format=csv | tee "$OUT/gpus.csv"

if [ "$stage" = build ]; then
  t0=$(date +%s)
  python3 -c "from flashinfer.comm.trtllm_ar import get_trtllm_comm_module as f; f()" > "$OUT/jit-trtllm.log" 2>&1 &
  p1=$!
  python3 -c "from flashinfer.comm.pcie_ipc_ar import get_pcie_ipc_comm_module as f; f()" > "$OUT/jit-pcie.log" 2>&1 &
  p2=$!
  python3 -c "from flashinfer.jit.norm import gen_norm_module as g; g().build_and_load()" > "$OUT/jit-norm.log" 2>&1 &
  p3=$!
  mkdir -p /tmp/host
  ( nvidia-smi -q > /tmp/host/nvidia-smi-q.txt; nvidia-smi topo -m > /tmp/host/topo-m.txt
    for m in r w n a p; do echo "== -p2p $m"; nvidia-smi topo -p2p $m; done > /tmp/host/topo-p2p.txt
    nvidia-smi nvlink -s > /tmp/host/nvlink-s.txt 2>&1 || true
    nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total,compute_cap --format=csv > /tmp/host/query-gpu.csv
    (lscpu; numactl -H 2>&1 || true) > /tmp/host/cpu-numa.txt
    cat /sys/module/nvidia_uvm/parameters/uvm_disable_hmm > /tmp/host/uvm_disable_hmm.txt 2>&1 || true
    cat /proc/cmdline > /tmp/host/proc-cmdline.txt; nvcc --version > /tmp/host/nvcc-version.txt 2>&1 || true
    python3 -c "import torch;print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())" > /tmp/host/torch-nccl.txt 2>&1
    tar czf "$OUT/host-tools.tar.gz" -C /tmp host ) || true
  python3 -m scripts.bench.bench_comm --no-flashinfer --variants default --rows 4,8 --prefill-rows 512 --layers 4 \
      --iters 5 --reps 3 --race-rows "" --out "$OUT/smoke.json" > "$OUT/smoke.log" 2>&1 || echo "smoke failed" >> "$OUT/smoke.log"
  wait $p1 $p2 $p3 || true
  echo "jit build wall: $(( $(date +%s) - t0 ))s"
  (cd /tmp/fiws/.cache/flashinfer && find . -name '*.so' | tee /dev/stderr | tar czf "$OUT/fi-aot.tar.gz" -T -)
  ls -la "$OUT"; tail -3 "$OUT"/jit-*.log; tail -30 "$OUT/smoke.log"
else
  # the .so files built by `build`, loaded as FlashInfer AOT modules (flashinfer/data/aot/<name>/<name>.so)
  mkdir -p /tmp/aot && tar xzf .device/fi-aot.tar.gz -C /tmp/aot
  for so in $(find /tmp/aot -name '*.so'); do n=$(basename "$so" .so); mkdir -p "/tmp/fi/flashinfer/data/aot/$n"; cp "$so" "/tmp/fi/flashinfer/data/aot/$n/"; done
  ls /tmp/fi/flashinfer/data/aot
  shift
  # EAGLE_GIT_REV: set it in the device command (`EAGLE_GIT_REV=$(git rev-parse --short HEAD)` here); no .git there
  # the pcie_defaults variant reads the patched launcher's NCCL defaults from a patched SGLang: carry build/sglang
  # (make apply) and pass --sglang build/sglang/python, or drop pcie_defaults from --variants
  python3 -m scripts.bench.bench_comm --box H200 --out "$OUT/bench-comm.json" "$@" 2>&1 | tee "$OUT/bench-comm.log"
fi
