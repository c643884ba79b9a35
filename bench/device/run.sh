#!/usr/bin/env bash
# On a lent GPU machine (device tool), from the repository root, with .device/ carried (bench/device/prepare.sh):
#   bench/device/run.sh test-gpu            make test-gpu's pytest run -> $OUT/test-gpu.xml (+ .log)
#   bench/device/run.sh bench-comm [ARGS]   bench-comm -> $OUT/bench-comm.json (+ .log)
#   bench/device/run.sh both [ARGS]         both, test-gpu first
#   bench/device/run.sh pytest [ARGS]       pytest tests/gpu ARGS directly (a subset, e.g. -k faults)
#   bench/device/run.sh test-serve [ARGS]   make test-serve on its lent-GPU route: pytest tests/gpu/serve --standins
#                                           ARGS -> $OUT/test-serve.xml (+ .log: the servers' logs, paths masked),
#                                           interrupted after SERVE_BUDGET seconds (default 480)
#   bench/device/run.sh bench-tiny [ARGS]   the real make bench once, against the tiny pair served as test-serve
#                                           serves it (bench/device/lent.py: --server-url, tiny-scenarios.toml)
#                                           -> $OUT/bench-tiny.tgz (results, report, logs)
#   bench/device/run.sh sweep-tiny [ARGS]   the DFlash arm (bench/sweep-dflash.toml) on the tiny models: no speculation,
#                                           EAGLE-3 and DFlash served at once, benched at C1 on the chat and code
#                                           prompt sets through lent.py -> $OUT/sweep-tiny.tgz, within BENCH_BUDGET
#                                           seconds (default 3600; 300 fits a 6-minute call)
#   bench/device/run.sh profile [ARGS]      make report's profile part against the tiny pair (lent.py, TP1), then
#                                           the doctor's GPU probes at TP1 -> $OUT/profile.json (+ traces, logs),
#                                           $OUT/doctor-tp1.json, $OUT/probes-tp1.log
#   bench/device/run.sh serve-all [ARGS]    test-serve (ARGS go to it) and bench-tiny (WITH=sweep-tiny: the sweep's
#                                           DFlash arm) at the same time, the bench within DEADLINE seconds of the
#                                           start (default 360)
#   bench/device/run.sh kernels [ARGS]      the kernels of a Kimi-K2.5 layer and the forward at real dimensions, on
#                                           the lent route (bench/device/kernels.py ARGS) within KERNELS_BUDGET
#                                           seconds (default 420) -> $OUT/kernels.{json,md,run.log},
#                                           $OUT/kernels-traces.tgz
# The machine has python3 with CUDA torch 2.11 and no network: the patched SGLang, FlashInfer (with its modules
# compiled ahead by prepare.sh; test-serve's sampled verify needs its sampling module) and the missing wheels come
# from .device/;
# sgl-kernel is not carried (built for another torch): tests/gpu/standin stands in for its imports. NVLink multicast
# stays off (the machines' rule: NCCL_NVLS_ENABLE=0 and friends are kept as the machine sets them). SGLang's JIT and
# Triton caches come from .device/{jit,triton}-cache.tgz when present and go back as $OUT/{jit,triton}-cache.tgz.
set -euo pipefail
what=${1:?test-gpu, bench-comm, both, pytest, test-serve, bench-tiny, sweep-tiny, serve-all, profile or kernels}
shift || true
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/site /tmp/sgl-tree/python
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/whl/*.whl
[ -f .device/flashinfer.tgz ] && tar xzf .device/flashinfer.tgz -C /tmp/site
tar xzf .device/sglang.tgz -C /tmp/sgl-tree/python
# tests/gpu/standin: the import-only sgl_kernel stand-in (the GPU tier adds it itself; bench-comm's SGLang rows need
# it too, since argument resolution imports quantization modules that import sgl_kernel)
export PYTHONPATH=/tmp/sgl-tree/python:/tmp/site:$PWD/tests/gpu/standin PYTHONUNBUFFERED=1 SGLANG_TREE=/tmp/sgl-tree
export FLASHINFER_WORKSPACE_BASE=/tmp/fiws SGLANG_JIT_CACHE_DIR=/tmp/sgljit TRITON_CACHE_DIR=/tmp/triton-cache
export EAGLE_GIT_REV=${EAGLE_GIT_REV:-unknown}
# the patched SGLang is a tree on PYTHONPATH here, without its console script (sglang.cli.main:main), which
# test-serve's servers start by (SGLang's popen_launch_server runs `sglang serve`)
mkdir -p /tmp/bin && export PATH=/tmp/bin:$PATH
printf '#!/bin/sh\nexec python3 -c "import sys; from sglang.cli.main import main; sys.argv[0] = \x27sglang\x27; main()" "$@"\n' \
  > /tmp/bin/sglang && chmod +x /tmp/bin/sglang
[ -f .device/jit-cache.tgz ] && tar xzf .device/jit-cache.tgz -C /tmp
[ -f .device/triton-cache.tgz ] && tar xzf .device/triton-cache.tgz -C /tmp
echo "[device] unpacked in $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,compute_cap --format=csv | tee "$OUT/gpus.csv"
case $what in test-gpu|both|bench-comm|pytest)
  nvidia-smi -q -x > "$OUT/nvidia-smi-q.xml" 2>/dev/null || true
  nvidia-smi topo -m > "$OUT/topo-m.txt" 2>&1 || true;; esac
python3 -c "import torch, sglang; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), 'gpus',
  torch.cuda.device_count(), 'sglang', sglang.__file__)"

test_serve() {  # interrupted after SERVE_BUDGET seconds (default 480): it still stops its servers and writes
  local rc=0
  timeout --signal=INT --kill-after=60 "${SERVE_BUDGET:-480}" python3 -m pytest -v -p no:cacheprovider tests/gpu/serve \
    --standins --serve-out "$OUT/test-serve.xml" "$@" 2>&1 | tee "$OUT/test-serve.run.log" || rc=$?
  return $rc
}
bench_tiny() {  # $1: bench-tiny or sweep-tiny, the tiny servers all up at once (bench/device/lent.py SERVERS)
  local verb=$1; shift
  [ "${BENCH_BUDGET:-3600}" -gt 60 ] || { echo "[device] $verb: no time left (${BENCH_BUDGET} s)"; return 1; }
  rm -rf "/tmp/$verb" && mkdir -p "/tmp/$verb"
  timeout --signal=INT --kill-after=20 "${BENCH_BUDGET:-3600}" python3 bench/device/lent.py "$verb" /tmp "$@" \
    2>&1 | tee "/tmp/$verb/bench.run.log"
  local rc=${PIPESTATUS[0]}
  # the files are committed: machine paths masked
  local prefix
  prefix=$(python3 -c 'import sys; print(sys.prefix)')
  find "/tmp/$verb" -type f \( -name '*.jsonl' -o -name '*.md' -o -name '*.log' \) -exec sed -i -e "s#$PWD#<repo>#g" \
    -e "s#/tmp/lent-[^/]*/models#<models>#g" -e "s#/tmp/sgl-tree#<sgl-tree>#g" -e "s#/tmp/site#<site>#g" \
    -e "s#$prefix#<python>#g" {} +
  tar czf "$OUT/$verb.tgz" -C /tmp "$verb"
  return $rc
}
profile() {
  local rc=0
  timeout --signal=INT --kill-after=30 "${PROFILE_BUDGET:-300}" python3 bench/device/lent.py profile "$OUT" "$@" \
    2>&1 | tee "$OUT/profile.run.log" || rc=$?
  # the doctor at TP1 (no GPU pair: its probes say why), its smoke's bring-up and watchdog on a real GPU
  python3 -m scripts.host.doctor --tp 1 --json > "$OUT/doctor-tp1.json" 2> "$OUT/probes-tp1.log" || true
  python3 -c 'from scripts.host.nccl import run; run("pcie-ipc-smoke", 1); run("pcie-ipc-smoke", 1, 3)
run("nccl-transport", 1); run("peer-bandwidth", 1)' >> "$OUT/probes-tp1.log" 2>&1 || true
  return $rc
}
kernels() {  # issue 39: the lent route's environment (route_env), then the driver, which stops its servers itself
  local budget=${KERNELS_BUDGET:-420}
  route_env /tmp/tiny-models
  timeout --signal=INT --kill-after=30 "$budget" python3 bench/device/kernels.py --out "$OUT" \
    --budget $(( budget - 15 )) "$@" 2>&1 | tee "$OUT/kernels.run.log"
  return "${PIPESTATUS[0]}"
}
rc=0
[ "$what" = profile ] && { profile "$@" || rc=$?; }
[ "$what" = kernels ] && { kernels "$@" || rc=$?; }
if [ "$what" = test-gpu ] || [ "$what" = both ]; then
  python3 -m scripts.host.gpu_tier --out "$OUT/test-gpu.xml" 2>&1 | tee "$OUT/test-gpu.log" || rc=$?
fi
if [ "$what" = pytest ]; then
  python3 -m pytest -v -p no:cacheprovider tests/gpu --ignore tests/gpu/serve --junitxml "$OUT/test-gpu.xml" "$@" \
    2>&1 | tee "$OUT/test-gpu.log" || rc=$?
fi
if [ "$what" = bench-comm ] || [ "$what" = both ]; then
  python3 -m scripts.comm.bench_comm --out "$OUT/bench-comm.json" "$@" 2>&1 | tee "$OUT/bench-comm.log" || rc=$?
fi
[ "$what" = test-serve ] && { test_serve "$@" || rc=$?; }
case $what in bench-tiny|sweep-tiny) bench_tiny "$what" "$@" || rc=$?;; esac
if [ "$what" = serve-all ]; then
  # both at once on the one GPU (one device call): test-serve's servers and the tiny bench's share it, so their
  # timings are each other's load as well (both are proxies; test-serve's verify-graph vs eager rounds alternate,
  # the bench's A/B/A too). The bench gets DEADLINE seconds (default 360) less 30 for the caches, then an interrupt (it
  # stops its server and keeps the runs it finished).
  test_serve "$@" & tier=$!
  BENCH_BUDGET=$(( ${DEADLINE:-360} - ($(date +%s) - t0) - 30 )) bench_tiny "${WITH:-bench-tiny}" || rc=$?
  wait $tier || rc=$?
fi
case $what in test-serve|bench-tiny|sweep-tiny|serve-all|kernels)
  tar czf "$OUT/jit-cache.tgz" -C /tmp sgljit 2>/dev/null || true
  tar czf "$OUT/triton-cache.tgz" -C /tmp triton-cache 2>/dev/null || true;; esac
echo "[device] done in $(( $(date +%s) - t0 )) s, rc=$rc"
exit $rc
