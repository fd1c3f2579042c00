#!/usr/bin/env bash
# On the GPU machine: Kernel Tuner's own CUDA example scripts, run through Tracea with only their import
# changed (examples/kernel_tuner/run_kt_script.py). KT_EXAMPLES is a folder holding the scripts and their
# .cu files from Kernel Tuner's repository (examples/cuda/); nothing of them is kept in this repository.
# Summaries (JSON) and logs go to $OUT.
set -u
OUT=${OUT:-/tmp/kt_out}
KT_EXAMPLES=${KT_EXAMPLES:?set KT_EXAMPLES to Kernel Tuner\'s examples/cuda folder}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
source scripts/srcenv.sh
export TRACEA_CACHE_PATH=/tmp/kt_scripts_cache.json
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
run() {  # run SCRIPT TAG SECONDS [runner options]
    local name=$1 tag=$2 secs=$3; shift 3
    timeout "$secs" python examples/kernel_tuner/run_kt_script.py "$KT_EXAMPLES/$name.py" --json "$OUT/$tag.json" "$@" \
        > "$OUT/$tag.log" 2>&1
    echo "$tag rc=$?" >> "$OUT/summary.txt"
}
run vector_add_cupy vector_add_cupy "${KT_S1:-20}"
run stencil stencil "${KT_S2:-25}"
run matmul matmul "${KT_S3:-60}"
