"""A few-row GEMM against a B stored (K, N) row-major: ``C = epi(A @ B)`` with A (M, K), M <= 16 -- ``a @ b`` of
two plain matrices where ``a`` has a few rows (``tracea.ops.matmul(x, w)`` with ``w`` not an ``nn.Linear``
weight). The product is bound by reading B once.

A block of ``WARPS`` warps owns ``COLS = 32 * VEC`` columns of C (``VEC`` adjacent columns a lane: one 16-byte
vector of float32, 8 bytes of 16-bit values) over a slice of K: the block's slice of A, converted to float32,
sits in shared memory (every lane reads the same element: a broadcast), and the warps take the slice's rows of B
in turn (warp ``w`` rows ``w, w + WARPS, ...``: each warp reads whole row runs, coalesced). Accumulation is exact
fp32 FMA (the product is memory-bound; every fp32 precision mode is served at full accuracy). The warps' sums
meet in a fixed tree through shared memory (the A slice's room), so results do not depend on timing.

Grid (column blocks, K slices), one launch: with one slice warp 0 applies the epilogue and stores C; with several,
each slice writes its fp32 partial tile (``MR x COLS``) to a workspace, bumps its column block's arrival counter,
and the last slice to arrive sums the partial tiles -- the block's warps each over a run of slices in slice
order, then the same tree --, applies the epilogue, stores C and re-zeroes the counter (the buffers can be shared
by every launch on a stream: see :func:`tracea_cuda.launcher.split_scratch`).
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
WARPS = 8
THREADS = 32 * WARPS
#: longest K slice of one block (its slice of A in shared memory: MAX_ROWS x 512 floats = 32 KB; the warps'
#: tree takes the same room afterwards: WARPS / 2 x MR x COLS floats)
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
    split: bool  # K split across gridDim.y slices, the last slice of a column block reducing (workspace + counters)

    @property
    def threads(self) -> int:
        return THREADS

    @property
    def cols(self) -> int:
        """Columns of C per block."""
        return 32 * self.vec

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
    store = store_expr(spec.dtype_out, "apply_epilogue(acc[m][v], bias, (int)col)")
    return f"""{PRELUDE}
#define MR {spec.mr}
#define VEC {spec.vec}
#define WARPS {WARPS}
#define COLS (32 * VEC)
#define MAX_SLICE {MAX_SLICE}
#define SPLIT {int(spec.split)}
{epilogue_function(spec.epilogue, spec.bias_dtype, spec.dtype_out)}
{_load_b(spec)}
// a lane's VEC values of a partial tile (16-byte aligned when VEC = 4), through L2 only
static __device__ __forceinline__ void st_part(float* p, const float (&x)[VEC]) {{
#if VEC == 4
    __stcg(reinterpret_cast<float4*>(p), make_float4(x[0], x[1], x[2], x[3]));
#else
    __stcg(p, x[0]);
#endif
}}
static __device__ __forceinline__ void add_part(const float* p, float (&x)[VEC]) {{
#if VEC == 4
    const float4 t = __ldcg(reinterpret_cast<const float4*>(p));
    x[0] += t.x; x[1] += t.y; x[2] += t.z; x[3] += t.w;
#else
    x[0] += __ldcg(p);
#endif
}}
// acc of every warp summed into warp 0's in a fixed tree (w += w + h for h = WARPS/2, ..., 1) through red
// (WARPS / 2 x MR x COLS floats); every thread of the block calls it
static __device__ __forceinline__ void tree_sum(float (&acc)[MR][VEC], float* red, int warp, int lane) {{
    #pragma unroll
    for (int h = WARPS / 2; h > 0; h >>= 1) {{
        __syncthreads();
        if (warp >= h && warp < 2 * h)
            #pragma unroll
            for (int m = 0; m < MR; ++m)
                #pragma unroll
                for (int v = 0; v < VEC; ++v) red[((warp - h) * MR + m) * COLS + lane * VEC + v] = acc[m][v];
        __syncthreads();
        if (warp < h)
            #pragma unroll
            for (int m = 0; m < MR; ++m)
                #pragma unroll
                for (int v = 0; v < VEC; ++v) acc[m][v] += red[(warp * MR + m) * COLS + lane * VEC + v];
    }}
}}

extern "C" __global__ void __launch_bounds__({THREADS}) {name}(
        const {tin}* __restrict__ A, const {tin}* __restrict__ B, {tout}* __restrict__ C,
        const {tb}* __restrict__ bias, float* __restrict__ W, unsigned* __restrict__ flags,
        int M, int N, int K, int slice) {{
    __shared__ float smem[MR * MAX_SLICE];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int k0 = blockIdx.y * slice, k1 = min(K, k0 + slice);
    // the block's slice of A, as float: a column of MR values a thread at a time (independent loads in flight)
    for (int kk = threadIdx.x; kk < slice; kk += {THREADS}) {{
        const int k = k0 + kk;
        float v[MR];
        #pragma unroll
        for (int m = 0; m < MR; ++m) v[m] = (m < M && k < k1) ? {a_load} : 0.0f;
        #pragma unroll
        for (int m = 0; m < MR; ++m) smem[m * slice + kk] = v[m];
    }}
    __syncthreads();
    const long long col0 = (long long)blockIdx.x * COLS + lane * VEC;
    float acc[MR][VEC];
    #pragma unroll
    for (int m = 0; m < MR; ++m)
        #pragma unroll
        for (int v = 0; v < VEC; ++v) acc[m][v] = 0.0f;
    if (col0 < N) {{
        const {tin}* bp = B + (long long)(k0 + warp) * N + col0;
        #pragma unroll 4
        for (int k = k0 + warp; k < k1; k += WARPS, bp += (long long)WARPS * N) {{
            float b[VEC];
            load_b(bp, b);
            const int kk = k - k0;
            #pragma unroll
            for (int m = 0; m < MR; ++m)
                #pragma unroll
                for (int v = 0; v < VEC; ++v) acc[m][v] = fmaf(smem[m * slice + kk], b[v], acc[m][v]);
        }}
    }}
    tree_sum(acc, smem, warp, lane);  // (its first barrier also ends every read of the A slice)
#if SPLIT
    // publish this slice's partial tile; the last slice of the column block to arrive sums them
    const int S = gridDim.y;
    float* tiles = W + (long long)blockIdx.x * S * (MR * COLS);
    if (warp == 0)
        #pragma unroll
        for (int m = 0; m < MR; ++m) st_part(tiles + ((long long)blockIdx.y * MR + m) * COLS + lane * VEC, acc[m]);
    __threadfence();
    __syncthreads();
    __shared__ int is_last;
    if (threadIdx.x == 0) {{
        const unsigned prev = atomicAdd(flags + blockIdx.x, 1u);
        is_last = prev == (unsigned)(S - 1);
        if (is_last) flags[blockIdx.x] = 0u;
    }}
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    // warp w sums slices [w * per, (w + 1) * per) in order (independent loads: one L2 latency per slice), then the tree
    const int per = (S + WARPS - 1) / WARPS, s0 = warp * per, s1 = min(S, s0 + per);
    #pragma unroll
    for (int m = 0; m < MR; ++m)
        #pragma unroll
        for (int v = 0; v < VEC; ++v) acc[m][v] = 0.0f;
    for (int s = s0; s < s1; ++s)
        #pragma unroll
        for (int m = 0; m < MR; ++m) add_part(tiles + ((long long)s * MR + m) * COLS + lane * VEC, acc[m]);
    tree_sum(acc, smem, warp, lane);
#endif
    if (warp != 0) return;
    #pragma unroll
    for (int m = 0; m < MR; ++m)
        #pragma unroll
        for (int v = 0; v < VEC; ++v) {{
            const long long col = col0 + v;
            if (m < M && col < N) C[(long long)m * N + col] = {store};
        }}
}}
"""
