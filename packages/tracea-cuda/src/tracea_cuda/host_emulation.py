"""Run emitted CUDA kernels on the host, for tests on machines without a GPU.

A rendered kernel's source is compiled as C++ by the host compiler (``g++``) with the CUDA prelude
(:data:`tracea_cuda.emit.common.PRELUDE`, PTX conversions) swapped for plain C++ equivalents and the CUDA
keywords defined away; a driver walks the grid block by block and thread by thread. Kernels that stage data
in shared memory behind one ``__syncthreads()`` are run with ``passes=2``: the first pass over a block's
threads fills the (static) shared array, the second recomputes every output with it complete (the kernels
only store their outputs, so the second pass overwrites the first's).

This checks what the host can check (index arithmetic, vector loads / stores and their packing, grouping,
padding, epilogues, NaN / Inf handling, fp16 / bf16 rounding); it says nothing about warp behaviour, timing
or register use (the offline ``nvcc`` compile reports those). Only kernels of pointer arguments
``(X, W, Y, bias)`` are driven here.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tracea.dtypes import DType

from .emit.common import PRELUDE

#: C++ stand-ins for the CUDA prelude and keywords (see the module docstring)
HOST_PRELUDE = r"""
#include <cmath>
#include <cstring>
#include <cstdint>
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
static inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
struct host_dim3 { unsigned x, y, z; };
static host_dim3 threadIdx, blockIdx;
template <class T> static inline T __ldg(const T* p) { return *p; }
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
#define __expf(x) expf(x)
static inline void __syncthreads() {}
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;
static inline float f16_to_f32(u16 x) { _Float16 h; std::memcpy(&h, &x, 2); return (float)h; }
static inline u16 f32_to_f16(float f) { _Float16 h = (_Float16)f; u16 x; std::memcpy(&x, &h, 2); return x; }
static inline float bf16_to_f32(u16 x) { return __uint_as_float(((u32)x) << 16); }
static inline u16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return (u16)(u >> 16);
}
static inline float max_nan_f(float a, float b) { return (a != a || a > b) ? a : b; }
static inline float relu_f(float x) { return max_nan_f(x, 0.0f); }
static inline float gelu_tanh_f(float x) {
    float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + std::tanh(u));
}
static inline float tanh_fast(float x) { return std::tanh(x); }
static inline float gelu_tanh_fast(float x) {
    const float hx = 0.5f * x;
    const float u = x * fmaf(0.035677408136300125f, x * x, 0.7978845608028654f);
    return fmaf(hx, tanh_fast(u), hx);
}
static inline float gelu_tanh_half(float h) {
    return fmaf(h, tanh_fast(h * fmaf(0.285419265090401f, h * h, 1.5957691216057308f)), h);
}
static inline float gelu_erf_f(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f)); }
static inline float silu_f(float x) { return x / (1.0f + __expf(-x)); }
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
"""

_CTYPE = {DType.F32: "float", DType.F16: "unsigned short", DType.BF16: "unsigned short"}


def compiler_path() -> str | None:
    """The host C++ compiler (``$CXX`` or ``g++``), or None."""
    return os.environ.get("CXX") or shutil.which("g++")


def host_source(source: str, name: str, dtype_in: DType, dtype_out: DType, bias_dtype: DType) -> str:
    """``source`` (a rendered kernel ``name(X, W, Y, bias)``) as host C++ with a driver
    ``run_grid(gx, gy, threads, passes, X, W, Y, bias)``."""
    if PRELUDE not in source:
        raise ValueError("the source does not carry the CUDA prelude this emulation replaces")
    tin, tout, tb = _CTYPE[dtype_in.storage], _CTYPE[dtype_out.storage], _CTYPE[bias_dtype.storage]
    driver = f"""
extern "C" void run_grid(unsigned gx, unsigned gy, unsigned threads, int passes, const void* X, const void* W,
                         void* Y, const void* B) {{
    for (unsigned by = 0; by < gy; ++by)
        for (unsigned bx = 0; bx < gx; ++bx)
            for (int pass = 0; pass < passes; ++pass)
                for (unsigned t = 0; t < threads; ++t) {{
                    blockIdx = {{bx, by, 0}};
                    threadIdx = {{t, 0, 0}};
                    {name}((const {tin}*)X, (const {tin}*)W, ({tout}*)Y, (const {tb}*)B);
                }}
}}
"""
    return source.replace(PRELUDE, HOST_PRELUDE) + driver


class HostKernel:
    """A host-compiled kernel: ``kernel(grid, threads, passes, x, w, out, bias)`` on NumPy arrays (C
    contiguous; ``bias`` None passes ``out``, as the launchers do)."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self._fn = lib.run_grid
        self._fn.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_int] + [ctypes.c_void_p] * 4
        self._fn.restype = None

    def __call__(self, grid: tuple[int, int, int], threads: int, passes: int, x: Any, w: Any, out: Any,
                 bias: Any = None) -> None:
        assert grid[2] == 1
        ptr = lambda a: a.ctypes.data  # noqa: E731
        self._fn(grid[0], grid[1], threads, passes, ptr(x), ptr(w), ptr(out), ptr(out if bias is None else bias))


def build(source: str, name: str, dtype_in: DType, dtype_out: DType, bias_dtype: DType,
          workdir: str | Path | None = None) -> HostKernel:
    """Compile ``source`` for the host (see :func:`host_source`) and load it."""
    cxx = compiler_path()
    if cxx is None:
        raise RuntimeError("no host C++ compiler (g++)")
    text = host_source(source, name, dtype_in, dtype_out, bias_dtype)
    tag = hashlib.sha256(text.encode()).hexdigest()[:16]
    folder = Path(workdir or tempfile.mkdtemp(prefix="tracea-host-"))
    src, lib = folder / f"k{tag}.cpp", folder / f"k{tag}.so"
    if not lib.exists():
        src.write_text(text)
        proc = subprocess.run([cxx, "-O1", "-std=c++17", "-shared", "-fPIC", "-Wno-unknown-pragmas", "-o", str(lib),
                               str(src)], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"host compile of {name} failed:\n{proc.stderr[-4000:]}")
    return HostKernel(ctypes.CDLL(str(lib)))
