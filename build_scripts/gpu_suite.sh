#!/usr/bin/env bash
# The whole GPU suite and benchmarks, in one call on the device machine.
#
# Expects, in the repository root: a built cache in $CACHE (default
# .devcache, built here with `cutlass-aot build --cache-dir .devcache`) and
# the wheels the device image lacks in .whl/ (apache-tvm-ffi, platformdirs).
# Writes logs and result tables to $OUT (default ./gpu-out).
#   usage: build_scripts/gpu_suite.sh [tests|bench|all]
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
CACHE=${CACHE:-.devcache}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD:$PWD/benchmarks"
export CUTLASS_AOT_CACHE_DIR="$PWD/$CACHE"
export CUTLASS_AOT_COMMIT=${CUTLASS_AOT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv | tee "$OUT/gpu.txt"
rc=0
if [[ $what == tests || $what == all ]]; then
  python3 -m pytest --noconftest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/gpu_tests.log"
  rc=${PIPESTATUS[0]}
fi
if [[ $what == bench || $what == all ]]; then
  python3 benchmarks/bench_host.py --out "$OUT/host_overhead.md" 2>&1 | tail -30
  python3 benchmarks/bench_gemm.py --out "$OUT/gemm_vs_cublas.md" 2>&1 | tail -60
fi
exit $rc
