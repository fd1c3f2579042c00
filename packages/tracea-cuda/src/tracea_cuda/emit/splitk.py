"""Split-K reduction: sums the fp32 partial products of the K splits, applies the epilogue chain and
stores in the op's output layout (row-major (M, N) or NCHW)."""

from __future__ import annotations

from tracea.dtypes import DType
from tracea.ir.epilogue import Epilogue

from .common import PRELUDE, ctype, epilogue_function, store_expr

KERNEL_NAME = "tracea_splitk_reduce"
WIDE_NAME = "tracea_splitk_reduce_wide"
#: slice groups of the wide reduction (a block: 32 outputs x WIDE_GROUPS threads)
WIDE_GROUPS = 8


def render(dtype_out: DType, bias_dtype: DType, epilogue: Epilogue, splits: int, nchw_pq: int = 0) -> str:
    tout, tb = ctype(dtype_out), ctype(bias_dtype)
    if nchw_pq:
        dst = f"C[((long long)(row / {nchw_pq}) * N + col) * {nchw_pq} + row % {nchw_pq}]"
    else:
        dst = "C[(long long)row * N + col]"
    return f"""{PRELUDE}
{epilogue_function(epilogue, bias_dtype, dtype_out)}
extern "C" __global__ void __launch_bounds__(256) {KERNEL_NAME}(const float* __restrict__ W, {tout}* __restrict__ C,
                                                              const {tb}* __restrict__ bias, int M, int N) {{
    const long long total = (long long)M * N;
    const long long idx = (long long)blockIdx.x * 256 + threadIdx.x;
    if (idx >= total) return;
    float v = 0.0f;
    #pragma unroll
    for (int s = 0; s < {splits}; ++s) v += W[s * total + idx];
    const int row = (int)(idx / N), col = (int)(idx % N);
    {dst} = {store_expr(dtype_out, "apply_epilogue(v, bias, col)")};
}}
"""


def render_wide(dtype_out: DType, bias_dtype: DType, epilogue: Epilogue, splits: int) -> str:
    """The reduction for many slices (tens to hundreds) over few outputs: a block of 32 outputs x
    :data:`WIDE_GROUPS` threads, thread group g summing slices g, g + 8, ... and the groups' sums added in group
    order in shared memory (a fixed order: results do not depend on timing), then the epilogue; row-major C."""
    tout, tb = ctype(dtype_out), ctype(bias_dtype)
    return f"""{PRELUDE}
{epilogue_function(epilogue, bias_dtype, dtype_out)}
extern "C" __global__ void __launch_bounds__({32 * WIDE_GROUPS}) {WIDE_NAME}(const float* __restrict__ W,
        {tout}* __restrict__ C, const {tb}* __restrict__ bias, int M, int N) {{
    __shared__ float part[{WIDE_GROUPS}][32];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;  // output, slice group
    const long long total = (long long)M * N;
    const long long idx = (long long)blockIdx.x * 32 + tx;
    float v = 0.0f;
    if (idx < total) {{
        #pragma unroll 8
        for (int s = ty; s < {splits}; s += {WIDE_GROUPS}) v += W[s * total + idx];
    }}
    part[ty][tx] = v;
    __syncthreads();
    if (ty != 0 || idx >= total) return;
    float sum = 0.0f;
    #pragma unroll
    for (int g = 0; g < {WIDE_GROUPS}; ++g) sum += part[g][tx];
    const int row = (int)(idx / N), col = (int)(idx % N);
    C[(long long)row * N + col] = {store_expr(dtype_out, "apply_epilogue(sum, bias, col)")};
}}
"""

