"""A skinny-GEMM ("GEMV") kernel for few-row products against an (N, K) weight: ``C = epi(A @ B^T)`` with A
(M, K), M <= 16, and B stored (N, K) row-major -- ``x @ W.T`` of an ``nn.Linear`` at decode time.

Such a product is bound by reading B once (N*K elements). Each warp owns ``NPW`` rows of B and streams
them with 16-byte vector loads (``ld.global.nc.L1::no_allocate``: B is read once, A stays in L1/L2 for
every warp), accumulating all M rows of A against them in fp32 registers; the partial sums are reduced
across the warp with shuffles and lanes write the outputs with the fused epilogue. Float32 inputs use
exact fp32 FMAs (the product is memory-bound: Tensor Cores would not be faster), so every fp32
precision mode is served at full fp32 accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracea.dtypes import DType
from tracea.errors import UnsupportedConfigError
from tracea.ir.epilogue import Epilogue

from .common import PRELUDE, ctype, epilogue_function, load_expr, store_expr

KERNEL_NAME = "tracea_gemv"
MAX_ROWS = 16
WARPS = 8


@dataclass(frozen=True)
class GemvSpec:
    """What one compiled GEMV kernel bakes in."""

    dtype_in: DType
    dtype_out: DType
    bias_dtype: DType
    epilogue: Epilogue
    mr: int  # A rows (compile-time bound; M <= mr)
    npw: int  # B rows per warp
    vec: int  # elements per load (16 bytes), or 1 for unaligned operands
    ks: int = 1  # warps of a block per row group, each on an interleaved share of K (summed in shared memory)

    @property
    def threads(self) -> int:
        return 32 * WARPS

    @property
    def smem_bytes(self) -> int:
        return 0

    def check(self) -> None:
        if not 1 <= self.mr <= MAX_ROWS:
            raise UnsupportedConfigError(f"GEMV rows mr={self.mr} outside 1..{MAX_ROWS}")
        if self.npw not in (1, 2, 4):
            raise UnsupportedConfigError(f"GEMV rows per warp npw={self.npw} not in 1, 2, 4")
        if self.mr * self.npw > 32 or (self.npw == 4 and self.mr > 2):
            raise UnsupportedConfigError(f"mr={self.mr} x npw={self.npw}: too many accumulators per lane (spills)")
        if self.vec not in (1, 16 // self.dtype_in.storage.itemsize):
            raise UnsupportedConfigError(f"vector width {self.vec} is not 1 or 16 bytes")
        if self.ks not in (1, 2, 4, 8):
            raise UnsupportedConfigError(f"GEMV K parts ks={self.ks} not in 1, 2, 4, 8")
        if self.ks > 1 and self.mr * self.npw > 4:
            raise UnsupportedConfigError(f"K parts with mr={self.mr} x npw={self.npw}: more than 4 accumulators a lane "
                                         "(ptxas spills the part sums)")


def vec_load(dtype: DType, vec: int) -> str:
    """``load_vec(p, out)``: ``vec`` consecutive values at ``p`` as floats (16-byte non-allocating load)."""
    if vec == 1:
        return (f"static __device__ __forceinline__ void load_vec(const {ctype(dtype)}* p, float* out) "
                f"{{ out[0] = {load_expr(dtype, '__ldg(p)')}; }}\n")
    if dtype.storage is DType.F32:
        return ("static __device__ __forceinline__ void load_vec(const float* p, float* out) {\n"
                "    float4 v; asm(\"ld.global.nc.L1::no_allocate.v4.f32 {%0,%1,%2,%3}, [%4];\"\n"
                "        : \"=f\"(v.x), \"=f\"(v.y), \"=f\"(v.z), \"=f\"(v.w) : \"l\"(p));\n"
                "    out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;\n}\n")
    cvt = "bf16_to_f32" if dtype.storage is DType.BF16 else "f16_to_f32"
    return ("static __device__ __forceinline__ void load_vec(const u16* p, float* out) {\n"
            "    u32 r[4]; asm(\"ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\"\n"
            "        : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"l\"(p));\n"
            "    #pragma unroll\n"
            "    for (int i = 0; i < 4; ++i) {\n"
            f"        out[2 * i] = {cvt}((u16)(r[i] & 0xffffu)); out[2 * i + 1] = {cvt}((u16)(r[i] >> 16));\n"
            "    }\n}\n")


def _a_load(dtype: DType, vec: int) -> str:
    """``load_a(p, out)``: ``vec`` values of A (cached: every warp reads the same A)."""
    if vec == 1:
        return (f"static __device__ __forceinline__ void load_a(const {ctype(dtype)}* p, float* out) "
                f"{{ out[0] = {load_expr(dtype, '__ldg(p)')}; }}\n")
    if dtype.storage is DType.F32:
        return ("static __device__ __forceinline__ void load_a(const float* p, float* out) {\n"
                "    const float4 v = __ldg(reinterpret_cast<const float4*>(p));\n"
                "    out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;\n}\n")
    cvt = "bf16_to_f32" if dtype.storage is DType.BF16 else "f16_to_f32"
    return ("static __device__ __forceinline__ void load_a(const u16* p, float* out) {\n"
            "    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));\n"
            "    const u32 r[4] = {v.x, v.y, v.z, v.w};\n"
            "    #pragma unroll\n"
            "    for (int i = 0; i < 4; ++i) {\n"
            f"        out[2 * i] = {cvt}((u16)(r[i] & 0xffffu)); out[2 * i + 1] = {cvt}((u16)(r[i] >> 16));\n"
            "    }\n}\n")


def render(spec: GemvSpec) -> str:
    """Complete CUDA source of the GEMV kernel for ``spec``."""
    spec.check()
    tin, tout, tb = ctype(spec.dtype_in), ctype(spec.dtype_out), ctype(spec.bias_dtype)
    return f"""{PRELUDE}
#define MR {spec.mr}
#define NPW {spec.npw}
#define VEC {spec.vec}
#define WARPS {WARPS}
#define KS {spec.ks}
{epilogue_function(spec.epilogue, spec.bias_dtype, spec.dtype_out)}
{vec_load(spec.dtype_in, spec.vec)}
{_a_load(spec.dtype_in, spec.vec)}
extern "C" __global__ void __launch_bounds__(32 * WARPS) {KERNEL_NAME}(
        const {tin}* __restrict__ A, const {tin}* __restrict__ B, {tout}* __restrict__ C,
        const {tb}* __restrict__ bias, int M, int N, int K) {{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % KS;
    // KS warps share NPW rows, each streaming an interleaved share of K (KS = 1: a warp per row group)
    const long long n0 = ((long long)blockIdx.x * (WARPS / KS) + warp / KS) * NPW;
#if KS == 1
    if (n0 >= N) return;
#endif
    float acc[MR][NPW];
    #pragma unroll
    for (int m = 0; m < MR; ++m)
        #pragma unroll
        for (int j = 0; j < NPW; ++j) acc[m][j] = 0.0f;
    const {tin}* brow[NPW];
    #pragma unroll
    for (int j = 0; j < NPW; ++j) brow[j] = B + (n0 + j < N ? n0 + j : n0) * (long long)K;
    // Unrolled so that several 16-byte loads per lane are in flight (non-volatile loads: the compiler
    // hoists them ahead of the FMAs); the stream is latency-bound otherwise.
    #pragma unroll {max(1, 4 // spec.npw)}
    for (int k = (part * 32 + lane) * VEC; k < (n0 < N ? K : 0); k += KS * 32 * VEC) {{
        float b[NPW][VEC];
        #pragma unroll
        for (int j = 0; j < NPW; ++j) load_vec(brow[j] + k, b[j]);
        #pragma unroll
        for (int m = 0; m < MR; ++m) {{
            if (m < M) {{
                float a[VEC];
                load_a(A + (long long)m * K + k, a);
                #pragma unroll
                for (int j = 0; j < NPW; ++j)
                    #pragma unroll
                    for (int v = 0; v < VEC; ++v) acc[m][j] = fmaf(a[v], b[j][v], acc[m][j]);
            }}
        }}
    }}
    #pragma unroll
    for (int m = 0; m < MR; ++m)
        #pragma unroll
        for (int j = 0; j < NPW; ++j)
            #pragma unroll
            for (int s = 16; s > 0; s >>= 1) acc[m][j] += __shfl_xor_sync(0xffffffffu, acc[m][j], s);
#if KS > 1
    // the row group's K parts, summed in part order (the result does not depend on timing)
    __shared__ float parts[WARPS][MR * NPW];
    #pragma unroll
    for (int m = 0; m < MR; ++m)
        #pragma unroll
        for (int j = 0; j < NPW; ++j)
            if (lane == m * NPW + j) parts[warp][m * NPW + j] = acc[m][j];
    __syncthreads();
    if (part != 0 || n0 >= N) return;
    #pragma unroll
    for (int m = 0; m < MR; ++m)
        #pragma unroll
        for (int j = 0; j < NPW; ++j) {{
            float total = parts[warp][m * NPW + j];
            #pragma unroll
            for (int p = 1; p < KS; ++p) total += parts[warp + p][m * NPW + j];
            acc[m][j] = total;
        }}
#endif
    #pragma unroll
    for (int m = 0; m < MR; ++m)
        #pragma unroll
        for (int j = 0; j < NPW; ++j) {{
            const int slot = m * NPW + j;
            if (lane == (slot & 31) && m < M && n0 + j < N) {{
                const int col = (int)(n0 + j);
                C[(long long)m * N + col] = {store_expr(spec.dtype_out, "apply_epilogue(acc[m][j], bias, col)")};
            }}
        }}
}}
"""
