"""A batched 2-D transpose kernel (32x32 shared-memory tiles, padded against bank conflicts), used to
bring NCHW activations and KCRS weights into the channels-last order the fast conv path reads."""

from __future__ import annotations

from tracea.dtypes import DType

from .common import ctype

KERNEL_NAME = "tracea_transpose"


PAIR_NAME = "tracea_transpose_pair"
#: in the pair kernel, a job whose rows are shorter than this (a KCRS weight's R*S = 9, a 5x5 plane) is
#: transposed in row blocks instead of 32x32 tiles, which would leave most of their threads idle
NARROW = 32
#: rows per block of a narrow job
NARROW_ROWS = 128


def render(dtype: DType, round_tf32: bool = False) -> str:
    """The single transpose (``KERNEL_NAME``: grid (C/32, R/32, batch)) and the pair (``PAIR_NAME``: two
    transposes in one launch -- an NCHW activation and its KCRS weight -- over a 1-D grid of both jobs'
    tiles, so a call pays one launch instead of two). In the pair, a job with rows shorter than
    ``NARROW`` (C < 32) runs in blocks of ``NARROW_ROWS`` whole rows, grid (R/128, 1, batch): the block
    reads its rows as one contiguous run and writes each of its C output rows as one contiguous run of
    128 (a 3x3 weight's 9-element rows in 32x32 tiles kept 23 of 32 lanes idle, in 8192 tiny blocks at
    512x512 channels).

    ``round_tf32`` (float32 only): the values are written rounded to TF32 (``cvt.rna.tf32.f32``, nearest, ties
    away), for a Hopper TF32 kernel reading them: its tensor cores truncate fp32 operands read from shared
    memory, so a rounding copy halves the per-product error and removes truncation's bias (a model's
    output error grows with that bias layer after layer)."""
    t = ctype(dtype)
    if round_tf32 and dtype is not DType.F32:
        raise ValueError("round_tf32 applies to float32 operands")
    # (a rounded value is a float32 with its low 13 bits zero; NaN and Inf stay NaN and Inf -- test_cuda_nan_inf's
    # NCHW fp32 wgmma conv case -- and a finite value above the largest TF32 one, ~3.401e38, becomes Inf)
    rnd = ("static __device__ __forceinline__ float tr_val(float v) {\n"
           "    unsigned r; asm(\"cvt.rna.tf32.f32 %0, %1;\" : \"=r\"(r) : \"f\"(v)); return __uint_as_float(r);\n}"
           if round_tf32 else f"static __device__ __forceinline__ {t} tr_val({t} v) {{ return v; }}")
    return rnd + f"""
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
        if (r < R && c < C) tile[i][tx] = tr_val(in[(long long)r * C + c]);
    }}
    __syncthreads();
    #pragma unroll
    for (int i = ty; i < 32; i += 8) {{
        const int c = c0 + i, r = r0 + tx;
        if (r < R && c < C) out[(long long)c * R + r] = tile[tx][i];
    }}
}}
static __device__ __forceinline__ void tracea_transpose_rows(const {t}* __restrict__ in, {t}* __restrict__ out,
                                                             int R, int C, int bx, int bz) {{
    // in: [batch][R][C] with C < {NARROW} -> out: [batch][C][R], rows [bx * {NARROW_ROWS}, +{NARROW_ROWS}) of R
    __shared__ {t} rows[{NARROW_ROWS * (NARROW - 1)}];
    const long long off = (long long)bz * R * C;
    in += off; out += off;
    const int r0 = bx * {NARROW_ROWS}, nr = min({NARROW_ROWS}, R - r0), n = nr * C;
    const {t}* src = in + (long long)r0 * C;
    for (int i = threadIdx.x; i < n; i += 256) rows[i] = tr_val(src[i]);
    __syncthreads();
    for (int i = threadIdx.x; i < {NARROW_ROWS} * C; i += 256) {{
        const int c = i / {NARROW_ROWS}, r = i - c * {NARROW_ROWS};
        if (r < nr) out[(long long)c * R + r0 + r] = rows[r * C + c];
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
    if (id >= blocks0) {{ id -= blocks0; in0 = in1; out0 = out1; R0 = R1; C0 = C1; gx0 = gx1; gy0 = gy1; }}
    if (C0 < {NARROW}) tracea_transpose_rows(in0, out0, R0, C0, id % gx0, id / (gx0 * gy0));  // narrow rows
    else tracea_transpose_tile(in0, out0, R0, C0, id % gx0, (id / gx0) % gy0, id / (gx0 * gy0));
}}
"""
