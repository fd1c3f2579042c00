#!/usr/bin/env bash
# Everything the GPU machine checks, in one go: the CUDA and torch GPU tests (CUDA-graph capture of every
# variant path, torch.compile), the user-path benchmarks (patched layers and models vs PyTorch, eager and
# in CUDA graphs; the untuned shapes; a zoo of models no test uses), the isolated-kernel benchmark, and
# the public-ops fuzzer on CUDA tensors.
# Logs and JSON go to $OUT (default /tmp/tracea-gpu).
#   scripts/gpu_run.sh [--quick] [--tests-only|--bench-only|--user-only|--fuzz-only|--host-cpu-only] [--pytest-k EXPR]
#                      [bench args...]
# --host-cpu-only: the CPU backend on the GPU machine's host CPU (a many-core Xeon with AVX-512 and AMX, which
# development machines may lack): the tracea-cpu tests, the AMX targets, fp32 GEMM / conv against NumPy /
# torch, the interference checks (with torch, and a NumPy-only program), the late-worker probe, bf16
# attention, depthwise convs (fp32, bf16), patched linears between torch ops at two torch thread counts and a
# CPU zoo (fp32, bf16; the model check's verdicts under each row). Not part
# of the default run (the host's figures need a quiet host: `uptime` is printed first).
# Carry .whl (`../shared/tools/device-wheels.sh platformdirs`: optuna and its needs for the tuner's tests, and
# platformdirs, a tracea-core dependency the GPU machine lacks).
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
if [ -d .whl ] && ! python3 -c "import optuna" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
source scripts/srcenv.sh
OUT="${OUT:-/tmp/tracea-gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TRACEA_CUDA_CACHE_DIR="${TRACEA_CUDA_CACHE_DIR:-/tmp/tracea-cuda-cache}"
export TRACEA_CACHE_PATH="${TRACEA_CACHE_PATH:-/tmp/tracea-tuning-cache.json}"
mode=all; quick=""; extra=(); kexpr=""; fuzz_cases="${FUZZ_CASES:-10000}"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick="--quick" ;;
    --tests-only) mode=tests ;;
    --bench-only) mode=bench ;;
    --user-only) mode=user ;;
    --fuzz-only) mode=fuzz ;;
    --host-cpu-only) mode=hostcpu ;;
    --pytest-k) shift; kexpr="$1" ;;
    *) extra+=("$1") ;;
  esac
  shift
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  | tee "$OUT/gpu.txt"
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$OUT/gpu.txt"
rc=0
if [ "$mode" = all ] || [ "$mode" = tests ]; then
  xdist=""
  python -c "import xdist" 2>/dev/null && xdist="-n 12"
  # the tests write tuned entries and arbiter verdicts measured while a dozen workers share the GPU:
  # a cache of their own, so the benchmarks below never read verdicts timed under that contention
  TRACEA_CACHE_PATH="${TRACEA_CACHE_PATH%.json}-tests.json" \
  python -m pytest packages/tracea-cuda/tests packages/tracea-torch/tests -m cuda -q -p no:cacheprovider $xdist \
    ${kexpr:+-k "$kexpr"} 2>&1 | tee "$OUT/tests.log" | tail -40
  rc=$?
fi
if [ "$mode" = all ] || [ "$mode" = tests ]; then
  # every hero config of every CUDA variant on small odd shapes under compute-sanitizer memcheck
  compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 30 python scripts/memcheck_heroes.py \
    --json "$OUT/memcheck.json" > "$OUT/memcheck.log" 2>&1
  rc=$(( rc || $? )); grep -v '^ok' "$OUT/memcheck.log" | tail -8
  # shared-memory races in the kernels whose warps meet in shared memory (rows_kn's tree, gemv's K parts)
  compute-sanitizer --tool racecheck --error-exitcode 9 python scripts/memcheck_heroes.py --bound \
    --variant cuda.gemm.rows_kn --variant cuda.gemm.gemv > "$OUT/racecheck.log" 2>&1
  rc=$(( rc || $? )); tail -2 "$OUT/racecheck.log"
fi
if [ "$mode" = all ] || [ "$mode" = user ]; then
  python benchmarks/user_path/bench_user_path.py --device cuda --verdicts --json "$OUT/user_path.json" \
    --timm "${TIMM_MODELS:-resnet50,convnext_tiny}" 2>&1 | tee "$OUT/user_path.log" | tail -60
  rc=$(( rc || $? ))
  # where a batch-1 patched model gains or loses, layer by layer (served by, patched vs eager)
  python benchmarks/user_path/layer_breakdown.py --device cuda --models resnet --only b1 --json "$OUT/layers.json" \
    > "$OUT/layers.log" 2>&1
  rc=$(( rc || $? )); grep -E "ratio|sum of" "$OUT/layers.log"
  python benchmarks/user_path/bench_shapes.py --json "$OUT/shapes.json" 2>&1 | tee "$OUT/shapes.log" | tail -70
  rc=$(( rc || $? ))
  # the same shapes with first-use tuning (tuning, then the framework check against PyTorch's own call; a tuning
  # cache of its own so the default run above is not steered by its entries)
  TRACEA_TUNING=first-use TRACEA_CACHE_PATH="${TRACEA_CACHE_PATH%.json}-first-use.json" \
    python benchmarks/user_path/bench_shapes.py --json "$OUT/shapes_first_use.json" > "$OUT/shapes_first_use.log" 2>&1
  rc=$(( rc || $? )); grep -E "cases: median" "$OUT/shapes_first_use.log"
  # few-row GEMMs (17-127 tokens) with the weights streamed from memory: default and wgmma_fewrows configs
  python benchmarks/cuda/probe_fewrows.py --ms 24,64,96 --shapes 4096x4096,11008x4096,1024x8192 \
    --json "$OUT/fewrows.json" 2>&1 | tee "$OUT/fewrows.log" | cut -c1-160
  rc=$(( rc || $? ))
  # the rules behind the default decisions, against the anchor with the operands streamed from memory: the Hopper
  # conv's tile order under two waves, gemv's K parts and rows_kn's slices, TF32 few-row x @ W.T
  python benchmarks/cuda/probe_conv_tiles.py --batches 8,32 --json "$OUT/conv_tiles.json" 2>&1 \
    | tee "$OUT/conv_tiles.log" | tail -3
  rc=$(( rc || $? ))
  python benchmarks/cuda/probe_streamed_rows.py 2>&1 | tee "$OUT/streamed_rows.log" | cut -c1-160
  rc=$(( rc || $? ))
  python benchmarks/cuda/probe_tf32_rows.py 2>&1 | tee "$OUT/tf32_rows.log" | cut -c1-160
  rc=$(( rc || $? ))
  # models no test uses (timm CNNs/ViTs, HF BERT/Llama; conv, linear and SDPA patched)
  python benchmarks/user_path/bench_zoo.py --device cuda --json "$OUT/zoo.json" 2>&1 | tee "$OUT/zoo.log" | tail -25
  rc=$(( rc || $? ))
  # grouped / depthwise CNNs (the arbiter times cuda.conv2d.depthwise where it declined for cuDNN: FrameworkFaster)
  python benchmarks/user_path/bench_zoo.py --device cuda --timm "${GROUPED_MODELS:-regnety_040,resnext50_32x4d}" \
    --hf "" --json "$OUT/zoo_grouped.json" 2>&1 | tee "$OUT/zoo_grouped.log" | tail -8
  rc=$(( rc || $? ))
  # what BatchNorm folding gives (the same CNNs with the BatchNorms kept apart)
  python benchmarks/user_path/bench_zoo.py --device cuda --timm "${FOLD_MODELS:-resnet50,efficientnet_b0}" --hf "" \
    --no-fold --json "$OUT/zoo_nofold.json" 2>&1 | tee "$OUT/zoo_nofold.log" | tail -8
  rc=$(( rc || $? ))
  # head-dim-32 window attention models (Swin-style windows, PVT's reduced keys, TinyViT's masks)
  python benchmarks/user_path/bench_zoo.py --device cuda --timm "${D32_MODELS:-pvt_v2_b0,tiny_vit_5m_224}" --hf "" \
    --json "$OUT/zoo_d32.json" 2>&1 | tee "$OUT/zoo_d32.log" | tail -10
  rc=$(( rc || $? ))
  # pooled 1x1 heads (VGG's ConvMlp, MobileNetV3 conv_head, SE blocks: cuda.conv2d.pooled_gemm) and fp32 few-row
  # classifier linears (skinny_tf32) at small batches
  python benchmarks/user_path/bench_zoo.py --device cuda --timm "${POOLED_MODELS:-vgg11_bn,mobilenetv3_large_100}" \
    --hf "" --gpu-configs float32-nchw-8,float16-cl-1 --json "$OUT/zoo_pooled.json" 2>&1 | tee "$OUT/zoo_pooled.log" | tail -10
  rc=$(( rc || $? ))
  # fp32 accuracy with TF32 allowed: the network and each patched conv vs float64, beside cuDNN's
  python benchmarks/user_path/tf32_error.py --model "${TF32_MODEL:-inception_v3}" 2>&1 | tee "$OUT/tf32.log" | tail -12
  rc=$(( rc || $? ))
  # 16-bit NCHW convs (a model not converted to channels_last): per layer and patched models
  python benchmarks/user_path/bench_nchw16.py --odd-widths --models "${NCHW16_MODELS:-resnet50}" 2>&1 | tee "$OUT/nchw16.log" | tail -16
  rc=$(( rc || $? ))
  python benchmarks/cuda/bench_attention.py --quick --json "$OUT/attention.json" 2>&1 | tee "$OUT/attention.log" | tail -30
  rc=$(( rc || $? ))
fi
if [ "$mode" = all ] || [ "$mode" = bench ]; then
  python benchmarks/cuda/bench_cuda.py --json "$OUT/bench.json" $quick "${extra[@]}" 2>&1 | tee "$OUT/bench.log" | tail -60
  rc=$(( rc || $? ))
fi
if [ "$mode" = hostcpu ]; then
  uptime | tee "$OUT/host_cpu.log"
  xdist=""
  python -c "import xdist" 2>/dev/null && xdist="-n $(nproc)"
  python -m pytest packages/tracea-cpu/tests -q -p no:cacheprovider $xdist 2>&1 | tail -5 | tee -a "$OUT/host_cpu.log"
  rc=$(( rc || $? ))
  python benchmarks/cpu/bench_amx.py --only gemm,linear,int8 2>&1 | tee -a "$OUT/host_cpu.log" | tail -25
  python benchmarks/cpu/bench_user_cpu.py --rounds 10 --only gemm,conv 2>&1 | tee -a "$OUT/host_cpu.log" | tail -20
  for others in numpy,torch numpy; do
    python benchmarks/cpu/bench_user_cpu.py --rounds 10 --only interference --interference-others "$others" 2>&1 \
      | tee -a "$OUT/host_cpu.log" | tail -9
  done
  python benchmarks/cpu/probes/region_start.py --n 1024 2>&1 | tee -a "$OUT/host_cpu.log" | tail -15
  # 16-bit attention (the kernel reads bf16 itself) against PyTorch's bf16 SDPA, which may use AMX on this host
  python benchmarks/cpu/bench_attention_cpu.py --dtype bfloat16 --rounds 10 --only vit,swin,bert,decode 2>&1 \
    | tee -a "$OUT/host_cpu.log" | tail -22
  # depthwise convs (cpu.conv2d.depthwise) against F.conv2d, fp32 and bf16, tracea.ops and patched layers
  python benchmarks/cpu/bench_depthwise.py --rounds 5 --batches 1,8 2>&1 | tee -a "$OUT/host_cpu.log" | tail -26
  python benchmarks/cpu/bench_depthwise.py --rounds 5 --batches 1,8 --dtype bfloat16 2>&1 \
    | tee -a "$OUT/host_cpu.log" | tail -1
  # patched linears between torch ops at torch's default and half its threads (one OpenMP team size)
  python benchmarks/cpu/probes/torch_team.py --threads 0,half 2>&1 | tee -a "$OUT/host_cpu.log" | tail -3
  # patched models on the host CPU, fp32 and bf16 (AMX): models no test uses
  python benchmarks/user_path/bench_zoo.py --device cpu --cpu-dtypes float32,bfloat16 --hf "" \
    --timm "${CPU_ZOO_MODELS:-deit_tiny_patch16_224,mobilevit_xxs,cspdarknet53,resnet50,efficientnet_b0}" 2>&1 \
    | tee "$OUT/cpu_zoo.log" | grep -E "timm |cases"
  uptime | tee -a "$OUT/host_cpu.log"
fi
if [ "$mode" = fuzz ] && python -c "import tracea.fuzzing" 2>/dev/null; then
  python -m tracea.fuzzing --device cuda --cases "$fuzz_cases" --jobs 8 --report "$OUT/fuzz.json" \
    --sanitize "${FUZZ_SANITIZE:-50}" 2>&1 | tee "$OUT/fuzz.log" | tail -40
  rc=$(( rc || $? ))
fi
exit $rc
