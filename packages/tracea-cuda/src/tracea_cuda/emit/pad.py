"""Channel padding: rows of C values copied into rows of CP >= C values, zeros after the C-th (bit
patterns: +0.0 in every float format). It brings small-channel NHWC activations and KRSC weights (RGB
stems, C = 3) to the 16-byte channel runs the vectorised conv gathers read; the extra zero channels add
nothing to any product. The same copy with a coalesced layout (:func:`render_pitch`) brings NCHW planes whose
pixel rows are not 16-byte multiples (7x7, 14x14) to the row pitch a TMA map needs (the pointwise conv of
``variants.hopper_nchw1x1``)."""

from __future__ import annotations

from tracea.dtypes import DType

PAIR_NAME = "tracea_pad_channels_pair"


def render(dtype: DType) -> str:
    """``PAIR_NAME``: an activation and a weight padded in one launch, in
    :func:`tracea_cuda.launcher.pair_launch`'s argument layout (1-D grid of 256-thread blocks, one row per
    thread). A padded row of 16 bytes (what the conv paths ask for) is written as one 16-byte vector: the
    earlier one-element-per-thread form (a 64-bit division per element) took 45 us to pad the batch-32 RGB
    stem's 9.6 MB input on an H200, several times its bandwidth time."""
    t = "unsigned int" if dtype.storage.itemsize == 4 else "unsigned short"
    per16 = 16 // dtype.storage.itemsize
    return f"""
static __device__ __forceinline__ void tracea_pad_block({t}* __restrict__ out, const {t}* __restrict__ in,
                                                         long long rows, int C, int CP, long long block) {{
    const long long r = block * 256 + threadIdx.x;
    if (r >= rows) return;
    const {t}* src = in + r * C;
    {t}* dst = out + r * CP;
    if (CP == {per16}) {{  // one 16-byte row: a vector store (the scratch rows are 16-byte aligned)
        union {{ uint4 v; {t} e[{per16}]; }} u;
        #pragma unroll
        for (int c = 0; c < {per16}; ++c) u.e[c] = c < C ? src[c] : ({t})0;
        *reinterpret_cast<uint4*>(dst) = u.v;
    }} else {{
        for (int c = 0; c < CP; ++c) dst[c] = c < C ? src[c] : ({t})0;
    }}
}}
extern "C" __global__ void __launch_bounds__(256) {PAIR_NAME}(
        const {t}* __restrict__ in0, {t}* __restrict__ out0, int rows0, int C0, int CP0, int gx0, int gy0,
        const {t}* __restrict__ in1, {t}* __restrict__ out1, int rows1, int C1, int CP1, int gx1, int gy1,
        int blocks0) {{
    const int id = blockIdx.x;
    if (id < blocks0) tracea_pad_block(out0, in0, rows0, C0, CP0, id);
    else tracea_pad_block(out1, in1, rows1, C1, CP1, id - blocks0);
}}
"""


PITCH_NAME = "tracea_pitch_rows"


def render_pitch(dtype: DType) -> str:
    """``PITCH_NAME(in, out, rows, width, pitch)``: ``rows`` rows of ``width`` values copied into rows of
    ``pitch`` >= ``width`` (zeros after the width), so that a TMA map -- whose row strides must be 16-byte
    multiples -- can read them: NCHW planes of 7x7 or 14x14 pixels for the pointwise conv; ``rows * pitch`` <
    2^31. 16-bit values: one thread per output pair (a 4-byte load and store when ``width`` is even and ``in``
    4-byte aligned, else two 2-byte loads), the grid covering ``rows * pitch / 2`` pairs in 256-thread blocks;
    32-bit values: one thread per output value, the grid covering ``rows * pitch``."""
    if dtype.storage.itemsize == 4:
        return f"""
extern "C" __global__ void __launch_bounds__(256) {PITCH_NAME}(
        const unsigned int* __restrict__ in, unsigned int* __restrict__ out, int rows, int width, int pitch) {{
    const int i = blockIdx.x * 256 + threadIdx.x;
    if (i >= rows * pitch) return;
    const int r = i / pitch, c = i - r * pitch;
    out[i] = c < width ? __ldg(in + (long long)r * width + c) : 0u;
}}
"""
    if dtype.storage.itemsize != 2:
        raise ValueError("the pitch copy serves 16- and 32-bit rows")
    return f"""
extern "C" __global__ void __launch_bounds__(256) {PITCH_NAME}(
        const unsigned short* __restrict__ in, unsigned short* __restrict__ out, int rows, int width, int pitch) {{
    const int pair = blockIdx.x * 256 + threadIdx.x, half = pitch >> 1;
    if (pair >= rows * half) return;
    const int r = pair / half, c = 2 * (pair - r * half);
    const unsigned short* src = in + (long long)r * width + c;
    unsigned int v;
    if ((width & 1) == 0 && (reinterpret_cast<unsigned long long>(in) & 3) == 0) {{
        v = c < width ? __ldg(reinterpret_cast<const unsigned int*>(src)) : 0u;
    }} else {{
        const unsigned int lo = c < width ? __ldg(src) : 0u, hi = c + 1 < width ? __ldg(src + 1) : 0u;
        v = lo | (hi << 16);
    }}
    reinterpret_cast<unsigned int*>(out)[pair] = v;
}}
"""
