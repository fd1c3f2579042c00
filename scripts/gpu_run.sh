#!/usr/bin/env bash
# Run the CUDA backend's GPU tests and GPU benchmarks in one go (on the H200), print a table of
# ratios vs cuBLAS / cuBLASLt / cuDNN. Logs and JSON go to $OUT (default /tmp/tracea-gpu).
#   scripts/gpu_run.sh [--quick] [--tests-only|--bench-only] [extra bench args...]
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
source scripts/srcenv.sh
OUT="${OUT:-/tmp/tracea-gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TRACEA_CUDA_CACHE_DIR="${TRACEA_CUDA_CACHE_DIR:-/tmp/tracea-cuda-cache}"
mode=all; quick=""; extra=()
for arg in "$@"; do
  case "$arg" in
    --quick) quick="--quick" ;;
    --tests-only) mode=tests ;;
    --bench-only) mode=bench ;;
    *) extra+=("$arg") ;;
  esac
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  | tee "$OUT/gpu.txt"
rc=0
if [ "$mode" != bench ]; then
  xdist=""
  python -c "import xdist" 2>/dev/null && xdist="-n 8"
  python -m pytest packages/tracea-cuda/tests -m cuda -q -p no:cacheprovider $xdist 2>&1 | tee "$OUT/tests.log" | tail -40
  rc=$?
fi
if [ "$mode" != tests ]; then
  python benchmarks/cuda/bench_cuda.py --json "$OUT/bench.json" $quick "${extra[@]}" 2>&1 | tee "$OUT/bench.log" | tail -60
  rc=$(( rc || $? ))
fi
exit $rc
