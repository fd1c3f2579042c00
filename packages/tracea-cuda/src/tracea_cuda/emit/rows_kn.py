"""A few-row GEMM against a B stored (K, N) row-major: ``C = epi(A @ B)`` with A (M, K), M <= 16 -- ``a @ b`` of
two plain matrices where ``a`` has a few rows (``tracea.ops.matmul(x, w)`` with ``w`` not an ``nn.Linear``
weight). The product is bound by reading B once.

Each thread owns ``VEC`` adjacent columns (one 16-byte vector of float32, 8 bytes of 16-bit values) and walks a
slice of K: a warp reads whole rows of B (coalesced), and the block's slice of A, converted to float32, sits in
shared memory where every thread reads the same element (a broadcast). Accumulation is exact fp32 FMA (the
product is memory-bound; every fp32 precision mode is served at full accuracy). Grid (column blocks, K slices):
with one slice the epilogue is applied and C written; with several each slice writes its fp32 partial tile to a
workspace ``W[slice][M][N]`` and :mod:`tracea_cuda.emit.splitk`'s reduction sums them in slice order (so results
do not depend on timing) and applies the epilogue.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracea.dtypes import DType
from tracea.errors import UnsupportedConfigError
from tracea.ir.epilogue import Epilogue

from .common import PRELUDE, ctype, epilogue_function, load_expr, store_expr
from .gemv import vec_load as gemv_vec_load

KERNEL_NAME = "tracea_rows_kn"
MAX_ROWS = 16
THREADS = 128
#: longest K slice of one block (its slice of A in shared memory: MAX_ROWS x 512 floats = 32 KB)
MAX_SLICE = 512


@dataclass(frozen=True)
class RowsKnSpec:
    """What one compiled kernel bakes in."""

    dtype_in: DType
    dtype_out: DType
    bias_dtype: DType
    epilogue: Epilogue
    mr: int  # compile-time row bound (M <= mr)
    vec: int  # columns per thread: 4 (vector loads) or 1
    partial: bool  # write fp32 partials to the workspace (several K slices) instead of C

    @property
    def threads(self) -> int:
        return THREADS

    @property
    def smem_bytes(self) -> int:
        return 4 * self.mr * MAX_SLICE

    def check(self) -> None:
        if self.dtype_in not in (DType.F32, DType.F16, DType.BF16):
            raise UnsupportedConfigError(f"rows_kn reads float32 / float16 / bfloat16, not {self.dtype_in.value}")
        if self.mr not in (1, 2, 4, 8, 16):
            raise UnsupportedConfigError(f"row bound mr={self.mr} not in 1, 2, 4, 8, 16")
        if self.vec not in (1, 4):
            raise UnsupportedConfigError(f"columns per thread vec={self.vec} not 1 or 4")


def _load_b(spec: RowsKnSpec) -> str:
    """``load_b(p, out)``: ``VEC`` consecutive values of a row of B as floats (non-allocating: read once) -- the
    GEMV kernel's loads for float32 and single elements, 8 bytes (4 values) for 16-bit vectors."""
    if spec.vec == 1 or spec.dtype_in is DType.F32:
        return gemv_vec_load(spec.dtype_in, spec.vec) + "#define load_b load_vec\n"
    cvt = "bf16_to_f32" if spec.dtype_in is DType.BF16 else "f16_to_f32"
    return ("static __device__ __forceinline__ void load_b(const u16* p, float* out) {\n"
            "    u32 r0, r1; asm volatile(\"ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];\"\n"
            "        : \"=r\"(r0), \"=r\"(r1) : \"l\"(p));\n"
            f"    out[0] = {cvt}((u16)(r0 & 0xffffu)); out[1] = {cvt}((u16)(r0 >> 16));\n"
            f"    out[2] = {cvt}((u16)(r1 & 0xffffu)); out[3] = {cvt}((u16)(r1 >> 16));\n}}\n")


def render(spec: RowsKnSpec, name: str = KERNEL_NAME) -> str:
    """Complete CUDA source of the kernel for ``spec``."""
    spec.check()
    tin, tout, tb = ctype(spec.dtype_in), ctype(spec.dtype_out), ctype(spec.bias_dtype)
    a_load = load_expr(spec.dtype_in, "A[(long long)m * K + k]")
    store = ("W[((long long)blockIdx.y * M + m) * N + col] = acc[m][v];" if spec.partial else
             f"C[(long long)m * N + col] = {store_expr(spec.dtype_out, 'apply_epilogue(acc[m][v], bias, (int)col)')};")
    return f"""{PRELUDE}
#define MR {spec.mr}
#define VEC {spec.vec}
#define MAX_SLICE {MAX_SLICE}
{epilogue_function(spec.epilogue, spec.bias_dtype, spec.dtype_out)}
{_load_b(spec)}
extern "C" __global__ void __launch_bounds__({THREADS}) {name}(
        const {tin}* __restrict__ A, const {tin}* __restrict__ B, {tout}* __restrict__ C,
        const {tb}* __restrict__ bias, float* __restrict__ W, int M, int N, int K, int slice) {{
    __shared__ float As[MR][MAX_SLICE];
    const int k0 = blockIdx.y * slice, k1 = min(K, k0 + slice);
    for (int e = threadIdx.x; e < MR * slice; e += {THREADS}) {{  // the block's slice of A, as float
        const int m = e / slice, k = k0 + e % slice;
        As[m][e % slice] = (m < M && k < k1) ? {a_load} : 0.0f;
    }}
    __syncthreads();
    const long long col0 = ((long long)blockIdx.x * {THREADS} + threadIdx.x) * VEC;
    if (col0 >= N) return;
    float acc[MR][VEC];
    #pragma unroll
    for (int m = 0; m < MR; ++m)
        #pragma unroll
        for (int v = 0; v < VEC; ++v) acc[m][v] = 0.0f;
    const {tin}* bp = B + (long long)k0 * N + col0;
    #pragma unroll 4
    for (int k = k0; k < k1; ++k, bp += N) {{
        float b[VEC];
        load_b(bp, b);
        const int kk = k - k0;
        #pragma unroll
        for (int m = 0; m < MR; ++m)
            #pragma unroll
            for (int v = 0; v < VEC; ++v) acc[m][v] = fmaf(As[m][kk], b[v], acc[m][v]);
    }}
    #pragma unroll
    for (int m = 0; m < MR; ++m)
        #pragma unroll
        for (int v = 0; v < VEC; ++v) {{
            const long long col = col0 + v;
            if (m < M && col < N) {{ {store} }}
        }}
}}
"""
