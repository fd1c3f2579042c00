"""A batched 2-D transpose kernel (32x32 shared-memory tiles, padded against bank conflicts), used to
bring NCHW activations and KCRS weights into the channels-last order the fast conv path reads."""

from __future__ import annotations

from tracea.dtypes import DType

from .common import ctype

KERNEL_NAME = "tracea_transpose"


def render(dtype: DType) -> str:
    t = ctype(dtype)
    return f"""
extern "C" __global__ void __launch_bounds__(256) {KERNEL_NAME}(const {t}* __restrict__ in, {t}* __restrict__ out,
                                                             int R, int C) {{
    // in: [batch][R][C] -> out: [batch][C][R]
    __shared__ {t} tile[32][33];
    const long long off = (long long)blockIdx.z * R * C;
    in += off; out += off;
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
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
"""
