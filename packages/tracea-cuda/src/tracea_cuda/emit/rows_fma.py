"""An exact-fp32 GEMM for a few dozen rows against an (N, K) weight: ``C = epi(A @ B^T)`` with A (M, K),
17 <= M <= 64 where it is chosen, B stored (N, K) row-major -- ``x @ W.T`` of a float32 ``nn.Linear`` at a small batch,
with PyTorch's default precision (no TF32).

There the skinny Tensor Core kernel (:mod:`tracea_cuda.emit.skinny`) runs out of issue slots (every A fragment is
split into three TF32 parts in registers, per weight block) and the tiled 3xTF32 GEMMs compute 128-row tiles or
split both operands through memory. Plain FFMA is enough: at M = 64 the product is ~16 us of the H100's fp32
peak per GFLOP-pair against ~21 us of weight stream for a 4096 x 4096 weight.

A block computes a ``BM`` x 64 tile of C (``gridDim.z`` row tiles, ``gridDim.x`` column tiles) over a slice of K: 128 threads, each ``BM / 8`` rows x 4 columns (the
columns 16 apart, so the eight threads of a quarter warp read eight different 16-byte banks of the weight
tile). Tiles of A (``BM`` x 32) and of the weight (64 x 32) go to shared memory by ``cp.async``, two stages,
row-major with a 4-float pad; each thread then reads 4 k of a row at once (one 16-byte load per row) and runs
``4 * BM / 8 * 4`` FFMA. Accumulation is in k order, one fused multiply-add at a time (fp32 exact, as
cuBLAS SGEMM). Rows past M, weight rows past N and k past the slice are zero-filled by the copies.

K is split across ``gridDim.y`` slices when the N tiles alone leave SMs idle. Each slice writes its partial tile
to a workspace, bumps the tile's arrival counter, and the last slice to arrive sums the partial tiles in slice
order (results do not depend on timing), applies the epilogue and stores C, then re-zeroes the counter (the
buffers can be shared by every launch on a stream: see :func:`tracea_cuda.launcher.split_scratch`).

``vec`` copies 16-byte vectors (K a multiple of 4, 16-byte aligned A and B); without it each float is copied
alone (any K, any 4-byte alignment).
"""

from __future__ import annotations

from dataclasses import dataclass

from tracea.dtypes import DType
from tracea.errors import UnsupportedConfigError
from tracea.ir.epilogue import Epilogue

from .common import PRELUDE, ctype, epilogue_function, store_expr

KERNEL_NAME = "tracea_rows_fma"
THREADS = 128
BN = 64  # columns of C per block
BK = 32  # k per stage
PAD = 4  # floats of padding per shared-memory row (keeps rows 16-byte aligned)
MAX_ROWS = 64


@dataclass(frozen=True)
class RowsFmaSpec:
    """What one compiled kernel bakes in."""

    dtype_out: DType
    bias_dtype: DType
    epilogue: Epilogue
    bm: int  # rows of C per block (M <= bm): 16, 32 or 64
    vec: bool  # 16-byte copies (K % 4 == 0, aligned operands); else one float per copy
    split: bool  # K split across gridDim.y slices, the last slice of a tile reducing (workspace + counters)

    @property
    def threads(self) -> int:
        return THREADS

    @property
    def tm(self) -> int:
        """Rows per thread."""
        return self.bm // 8

    @property
    def smem_bytes(self) -> int:
        return 2 * (self.bm + BN) * (BK + PAD) * 4

    def check(self) -> None:
        if self.bm not in (16, 32, 64):
            raise UnsupportedConfigError(f"rows per block bm={self.bm} not in 16, 32, 64")


def _copy(spec: RowsFmaSpec) -> str:
    """``copy_row4(dst, src, n_ok)``: 4 floats of a row into shared memory, ``n_ok`` (0-4) of them from global
    memory and the rest zero (cp.async's src-size zero-fill)."""
    if spec.vec:
        return r"""
static __device__ __forceinline__ void copy_row4(float* dst, const float* src, int n_ok) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(d), "l"(src), "r"(n_ok > 0 ? 16 : 0));
}
"""
    return r"""
static __device__ __forceinline__ void copy_row4(float* dst, const float* src, int n_ok) {
    #pragma unroll
    for (int q = 0; q < 4; ++q) {
        const unsigned d = (unsigned)__cvta_generic_to_shared(dst + q);
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                     :: "r"(d), "l"(n_ok > q ? src + q : src), "r"(n_ok > q ? 4 : 0));
    }
}
"""


def render(spec: RowsFmaSpec, name: str = KERNEL_NAME) -> str:
    """Complete CUDA source of the kernel for ``spec``."""
    spec.check()
    tout, tb = ctype(spec.dtype_out), ctype(spec.bias_dtype)
    store = store_expr(spec.dtype_out, "apply_epilogue(v, bias, col)")
    a_copies, b_copies = spec.bm * (BK // 4) // THREADS, BN * (BK // 4) // THREADS
    split = "1" if spec.split else "0"
    return f"""{PRELUDE}
#define BM {spec.bm}
#define TM {spec.tm}
#define BN {BN}
#define BK {BK}
#define LD {BK + PAD}
#define SPLIT {split}
{epilogue_function(spec.epilogue, spec.bias_dtype, spec.dtype_out)}
{_copy(spec)}
extern "C" __global__ void __launch_bounds__({THREADS}) {name}(
        const float* __restrict__ A, const float* __restrict__ B, {tout}* __restrict__ C,
        const {tb}* __restrict__ bias, float* __restrict__ W, unsigned* __restrict__ flags,
        int M, int N, int K, int slice) {{
    __shared__ __align__(16) float As[2][BM][LD];
    __shared__ __align__(16) float Bs[2][BN][LD];
    const int tid = threadIdx.x, ng = tid & 15, mg = tid >> 4;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.z * BM;
    const int tile_id = blockIdx.z * gridDim.x + blockIdx.x;
    const int k0 = blockIdx.y * slice, k1 = min(K, k0 + slice);
    const int steps = k1 > k0 ? (k1 - k0 + BK - 1) / BK : 0;
    float acc[TM][4];
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    auto stage = [&](int buf, int k) {{
        #pragma unroll
        for (int p = 0; p < {a_copies}; ++p) {{
            const int e = tid + p * {THREADS}, r = e >> 3, c = (e & 7) * 4;
            const int ok = (m0 + r < M) ? max(0, min(4, k1 - (k + c))) : 0;
            copy_row4(&As[buf][r][c], ok ? A + (long long)(m0 + r) * K + k + c : A, ok);
        }}
        #pragma unroll
        for (int p = 0; p < {b_copies}; ++p) {{
            const int e = tid + p * {THREADS}, r = e >> 3, c = (e & 7) * 4;
            const int ok = (n0 + r < N) ? max(0, min(4, k1 - (k + c))) : 0;
            copy_row4(&Bs[buf][r][c], ok ? B + (long long)(n0 + r) * K + k + c : B, ok);
        }}
        asm volatile("cp.async.commit_group;\\n" ::);
    }};

    if (steps > 0) stage(0, k0);
    for (int it = 0; it < steps; ++it) {{
        const int buf = it & 1;
        if (it + 1 < steps) {{
            stage(buf ^ 1, k0 + (it + 1) * BK);
            asm volatile("cp.async.wait_group 1;\\n" ::);
        }} else {{
            asm volatile("cp.async.wait_group 0;\\n" ::);
        }}
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < BK; kk += 4) {{
            float4 a[TM], b[4];
            #pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = *reinterpret_cast<const float4*>(&As[buf][mg * TM + i][kk]);
            #pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = *reinterpret_cast<const float4*>(&Bs[buf][ng + 16 * j][kk]);
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < 4; ++j) {{
                    acc[i][j] = fmaf(a[i].x, b[j].x, acc[i][j]);
                    acc[i][j] = fmaf(a[i].y, b[j].y, acc[i][j]);
                    acc[i][j] = fmaf(a[i].z, b[j].z, acc[i][j]);
                    acc[i][j] = fmaf(a[i].w, b[j].w, acc[i][j]);
                }}
        }}
        __syncthreads();
    }}

#if SPLIT
    // publish this slice's partial tile; the last slice of the tile to arrive sums them in slice order
    const int S = gridDim.y;
    float* mine = W + ((long long)tile_id * S + blockIdx.y) * (BM * BN);
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j) __stcg(mine + (mg * TM + i) * BN + ng + 16 * j, acc[i][j]);
    __threadfence();
    __syncthreads();
    __shared__ int is_last;
    if (tid == 0) {{
        const unsigned prev = atomicAdd(flags + tile_id, 1u);
        is_last = prev == (unsigned)(S - 1);
        if (is_last) flags[tile_id] = 0u;
    }}
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    // slice by slice, every output of the thread at once (independent loads: one L2 latency per slice)
    const float* tile = W + (long long)tile_id * S * (BM * BN) + (mg * TM) * BN + ng;
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (int s = 0; s < S; ++s, tile += BM * BN)
        #pragma unroll
        for (int i = 0; i < TM; ++i)
            #pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] += __ldcg(tile + i * BN + 16 * j);
#endif
    #pragma unroll
    for (int i = 0; i < TM; ++i) {{
        const int row = m0 + mg * TM + i;
        if (row >= M) continue;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {{
            const int col = n0 + ng + 16 * j;
            if (col < N) {{
                const float v = acc[i][j];
                C[(long long)row * N + col] = {store};
            }}
        }}
    }}
}}
"""
