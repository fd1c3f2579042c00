#!/usr/bin/env bash
# On the GPU machine: the CUDA / Triton tests of tracea.tune_kernel and @tracea.kernel, then the exhaustive
# tables (every config timed once) of the CUDA GEMM and convolution for kt_sample_efficiency.py replay.
# Writes into $OUT (tables are Kernel Tuner cache files, written as configs finish, so a timeout keeps
# what was measured).
set -u
OUT=${OUT:-/tmp/kt_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
source scripts/srcenv.sh
export TRACEA_CACHE_PATH=/tmp/kt_tuning_cache.json CUPY_CACHE_DIR=/tmp/kt_cupy_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
timeout "${KT_TEST_S:-60}" python -m pytest -q -p no:cacheprovider tests/test_kernel_tuner_examples.py -k "cuda or triton" \
    > "$OUT/tests.txt" 2>&1; echo "pytest rc=$?" >> "$OUT/tests.txt"
for k in matmul_cuda convolution_cuda; do
    timeout "${KT_MEASURE_S:-60}" python benchmarks/tuner/kt_sample_efficiency.py measure --kernel $k \
        --table "$OUT/$k.json" --precompile --jobs 14 >> "$OUT/measure.txt" 2>&1; echo "$k rc=$?" >> "$OUT/measure.txt"
done
