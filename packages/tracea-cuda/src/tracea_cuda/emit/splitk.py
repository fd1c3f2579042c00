"""Split-K reduction: sums the fp32 partial products of the K splits, applies the epilogue chain and
stores in the op's output layout (row-major (M, N) or NCHW)."""

from __future__ import annotations

from tracea.dtypes import DType
from tracea.ir.epilogue import Epilogue

from .common import PRELUDE, ctype, epilogue_function, store_expr

KERNEL_NAME = "tracea_splitk_reduce"


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
