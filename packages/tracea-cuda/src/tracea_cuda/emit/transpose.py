"""A batched 2-D transpose kernel (32x32 shared-memory tiles, padded against bank conflicts), used to
bring NCHW activations and KCRS weights into the channels-last order the fast conv path reads."""

from __future__ import annotations

from tracea.dtypes import DType

from .common import ctype

KERNEL_NAME = "tracea_transpose"


PAIR_NAME = "tracea_transpose_pair"


def render(dtype: DType) -> str:
    """The single transpose (``KERNEL_NAME``: grid (C/32, R/32, batch)) and the pair (``PAIR_NAME``: two
    transposes in one launch -- an NCHW activation and its KCRS weight -- over a 1-D grid of both jobs'
    tiles, so a call pays one launch instead of two)."""
    t = ctype(dtype)
    return f"""
static __device__ __forceinline__ void tracea_transpose_tile(const {t}* __restrict__ in, {t}* __restrict__ out,
                                                             int R, int C, int bx, int by, int bz) {{
    // in: [batch][R][C] -> out: [batch][C][R]
    __shared__ {t} tile[32][33];
    const long long off = (long long)bz * R * C;
    in += off; out += off;
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const int c0 = bx * 32, r0 = by * 32;
    #pragma unroll
    for (int i = ty; i < 32; i += 8) {{
        const int r = r0 + i, c = c0 + tx;
        if (r < R && c < C) tile[i][tx] = in[(long long)r * C + c];
    }}
    __syncthreads();
    #pragma unroll
    for (int i = ty; i < 32; i += 8) {{
        const int c = c0 + i, r = r0 + tx;
        if (r < R && c < C) out[(long long)c * R + r] = tile[tx][i];
    }}
}}
extern "C" __global__ void __launch_bounds__(256) {KERNEL_NAME}(const {t}* __restrict__ in, {t}* __restrict__ out,
                                                             int R, int C) {{
    tracea_transpose_tile(in, out, R, C, blockIdx.x, blockIdx.y, blockIdx.z);
}}
extern "C" __global__ void __launch_bounds__(256) {PAIR_NAME}(
        const {t}* __restrict__ in0, {t}* __restrict__ out0, int R0, int C0, int gx0, int gy0,
        const {t}* __restrict__ in1, {t}* __restrict__ out1, int R1, int C1, int gx1, int gy1, int blocks0) {{
    int id = blockIdx.x;
    if (id < blocks0) {{
        tracea_transpose_tile(in0, out0, R0, C0, id % gx0, (id / gx0) % gy0, id / (gx0 * gy0));
    }} else {{
        id -= blocks0;
        tracea_transpose_tile(in1, out1, R1, C1, id % gx1, (id / gx1) % gy1, id / (gx1 * gy1));
    }}
}}
"""
