"""Emitter for pointwise (1x1, stride 1, no padding) convolutions on the CUDA cores: a streaming kernel for
layers with few channels (MobileNet / EfficientNet projections), where the layer moves far more bytes than
it computes and Tensor Core tiles would be mostly empty (16 or 24 output channels).

Both layouts share one weight matrix W (K, C) (KCRS and KRSC are the same thing at R = S = 1).

- NCHW: per image, Y[K, HW] = W @ X[C, HW]. Each thread owns ``vp`` consecutive pixels of one image and
  ``kb`` output channels; per input channel it loads its ``vp`` pixels as one vector (coalesced over the
  warp: consecutive threads, consecutive pixels) and does ``kb x vp`` FMAs with weights read from shared
  memory (every lane reads the same address: a broadcast). The output planes are written the same way. No
  transpose, no scratch.
- NHWC: Y[M, K] = X[M, C] @ W^T with M = N*H*W rows. Each thread owns one row (pixel) and ``kb`` output
  channels, reads its row's channels as 16-byte vectors and stores its ``kb`` outputs.

Grid: one block of 128 threads per (channel group, pixel chunk), the channel group varying fastest so the
blocks that read the same pixels run together (the second read comes from L2). Accumulation in fp32 with
``fmaf`` (the result is fp32-accurate whatever ``fp32_precision`` allows), then the fused epilogue.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracea.dtypes import DType
from tracea.errors import UnsupportedConfigError
from tracea.ir.epilogue import Epilogue

from .common import PRELUDE, ctype, epilogue_function, load_expr, store_expr

KERNEL_NAME = "tracea_pointwise_conv"
THREADS = 128
#: static shared memory the weight slice may take (fp32 values, ``c * kb``)
SMEM_LIMIT = 48 * 1024


@dataclass(frozen=True)
class PointwiseSpec:
    """What the kernel source depends on.

    :param nchw: layout of x and the output (else NHWC).
    :param c: input channels; ``k`` output channels; ``kb`` output channels per block.
    :param vp: NCHW: consecutive pixels per thread, loaded as one vector (1, 2 or 4; the pixel count of an
        image is a multiple of it and x is aligned to it); NHWC: 1.
    :param vec_in: NHWC: each row's channels are read as 16-byte vectors (C a multiple of 16 bytes, x
        aligned).
    :param vec_out: the ``vp`` (NCHW) / ``kb`` (NHWC) outputs of a thread go out as vector stores.
    """

    dtype_in: DType
    dtype_out: DType
    bias_dtype: DType
    epilogue: Epilogue
    nchw: bool
    c: int
    k: int
    kb: int
    vp: int = 1
    vec_in: bool = False
    vec_out: bool = False

    threads = THREADS
    smem_bytes = 0  # the weight slice is static shared memory

    @property
    def groups(self) -> int:
        """Output-channel groups (blocks per pixel chunk)."""
        return -(-self.k // self.kb)

    def check(self) -> None:
        problems = []
        if self.kb < 1 or self.kb > 64:
            problems.append(f"kb={self.kb} not in 1..64")
        if self.c * self.kb * 4 > SMEM_LIMIT:
            problems.append(f"a weight slice of {self.c} x {self.kb} fp32 values exceeds {SMEM_LIMIT} B of shared memory")
        if self.vp not in (1, 2, 4) or (self.vp > 1 and not self.nchw):
            problems.append(f"vp={self.vp}: 1, 2 or 4 pixels per thread (NCHW), 1 (NHWC)")
        if self.nchw and self.vp > 1 and self.dtype_in.storage is not DType.F32:
            problems.append("vector pixel loads are emitted for float32 NCHW inputs")
        if self.kb * self.vp > 64:
            problems.append(f"kb x vp = {self.kb * self.vp} accumulators per thread (at most 64)")
        if problems:
            raise UnsupportedConfigError("; ".join(problems))


def _nchw_body(spec: PointwiseSpec) -> str:
    vp, kb = spec.vp, spec.kb
    if vp == 1:
        load = f"xv[0] = {load_expr(spec.dtype_in, 'xp[(long long)c * P]')};"
    else:
        vt = {2: "float2", 4: "float4"}[vp]
        comps = "xyzw"[:vp]
        load = (f"const {vt} t = __ldg(reinterpret_cast<const {vt}*>(xp + (long long)c * P)); "
                + " ".join(f"xv[{i}] = t.{comps[i]};" for i in range(vp)))
    out_f32 = spec.dtype_out.storage is DType.F32
    if spec.vec_out and vp > 1 and out_f32:
        vt = {2: "float2", 4: "float4"}[vp]
        vals = ", ".join(f"apply_epilogue_b(acc[kk][{i}], b)" for i in range(vp))
        store = f"*reinterpret_cast<{vt}*>(yp) = make_{vt}({vals});"
    else:
        store = (f"#pragma unroll\n                for (int v = 0; v < {vp}; ++v) "
                 f"yp[v] = {store_expr(spec.dtype_out, 'apply_epilogue_b(acc[kk][v], b)')};")
    return f"""
    const int pch = (P + {vp * THREADS - 1}) / {vp * THREADS};
    const int img = rest / pch, pc = rest - img * pch;
    const int p = (pc * {THREADS} + (int)threadIdx.x) * {vp};
    if (p >= P) return;
    const {ctype(spec.dtype_in)}* xp = X + (long long)img * {spec.c} * P + p;
    float acc[{kb}][{vp}];
    #pragma unroll
    for (int kk = 0; kk < {kb}; ++kk)
        #pragma unroll
        for (int v = 0; v < {vp}; ++v) acc[kk][v] = 0.0f;
    #pragma unroll 8
    for (int c = 0; c < {spec.c}; ++c) {{
        float xv[{vp}];
        {load}
        const float* wr = ws + c * {kb};
        #pragma unroll
        for (int kk = 0; kk < {kb}; ++kk) {{
            const float wv = wr[kk];
            #pragma unroll
            for (int v = 0; v < {vp}; ++v) acc[kk][v] = fmaf(wv, xv[v], acc[kk][v]);
        }}
    }}
    #pragma unroll
    for (int kk = 0; kk < {kb}; ++kk) {{
        const int k = k0 + kk;
        if (k < {spec.k}) {{
            const float b = bias_at(bias, k);
            {ctype(spec.dtype_out)}* yp = Y + ((long long)img * {spec.k} + k) * P + p;
            {store}
        }}
    }}"""


def _nhwc_body(spec: PointwiseSpec) -> str:
    kb = spec.kb
    tin = ctype(spec.dtype_in)
    if spec.vec_in:
        epv = 16 // spec.dtype_in.storage.itemsize
        if spec.dtype_in.storage is DType.F32:
            unpack = "xv[0] = __uint_as_float(q.x); xv[1] = __uint_as_float(q.y); xv[2] = __uint_as_float(q.z); xv[3] = __uint_as_float(q.w);"
        else:
            conv = "f16_to_f32" if spec.dtype_in.storage is DType.F16 else "bf16_to_f32"
            unpack = " ".join(f"xv[{2 * i}] = {conv}((u16)(q.{f} & 0xffffu)); xv[{2 * i + 1}] = {conv}((u16)(q.{f} >> 16));"
                              for i, f in enumerate("xyzw"))
        loop = f"""
    #pragma unroll 4
    for (int c0 = 0; c0 < {spec.c}; c0 += {epv}) {{
        const uint4 q = __ldg(reinterpret_cast<const uint4*>(xr + c0));
        float xv[{epv}];
        {unpack}
        #pragma unroll
        for (int e = 0; e < {epv}; ++e) {{
            const float* wr = ws + (c0 + e) * {kb};
            #pragma unroll
            for (int kk = 0; kk < {kb}; ++kk) acc[kk] = fmaf(wr[kk], xv[e], acc[kk]);
        }}
    }}"""
    else:
        loop = f"""
    #pragma unroll 4
    for (int c = 0; c < {spec.c}; ++c) {{
        const float xv = {load_expr(spec.dtype_in, 'xr[c]')};
        const float* wr = ws + c * {kb};
        #pragma unroll
        for (int kk = 0; kk < {kb}; ++kk) acc[kk] = fmaf(wr[kk], xv, acc[kk]);
    }}"""
    osz = spec.dtype_out.storage.itemsize
    epv_out = 16 // osz
    if spec.vec_out:
        # kb and K are multiples of the vector, so a group is either whole or past K
        if osz == 4:
            pack = "make_uint4(__float_as_uint(o[0]), __float_as_uint(o[1]), __float_as_uint(o[2]), __float_as_uint(o[3]))"
        else:
            words = ", ".join(f"(u32){store_expr(spec.dtype_out, f'o[{2 * i}]')} | ((u32){store_expr(spec.dtype_out, f'o[{2 * i + 1}]')} << 16)"
                              for i in range(4))
            pack = f"make_uint4({words})"
        store = f"""
    #pragma unroll
    for (int g = 0; g < {kb}; g += {epv_out}) {{
        if (k0 + g >= {spec.k}) break;
        float o[{epv_out}];
        #pragma unroll
        for (int e = 0; e < {epv_out}; ++e) o[e] = apply_epilogue_b(acc[g + e], bias_at(bias, k0 + g + e));
        *reinterpret_cast<uint4*>(yr + g) = {pack};
    }}"""
    else:
        store = f"""
    #pragma unroll
    for (int kk = 0; kk < {kb}; ++kk)
        if (k0 + kk < {spec.k}) yr[kk] = {store_expr(spec.dtype_out, 'apply_epilogue_b(acc[kk], bias_at(bias, k0 + kk))')};"""
    return f"""
    const long long m = (long long)rest * {THREADS} + threadIdx.x;
    if (m >= P) return;
    const {tin}* xr = X + m * {spec.c};
    {ctype(spec.dtype_out)}* yr = Y + m * {spec.k} + k0;
    float acc[{kb}];
    #pragma unroll
    for (int kk = 0; kk < {kb}; ++kk) acc[kk] = 0.0f;{loop}{store}"""


def render(spec: PointwiseSpec, name: str = KERNEL_NAME) -> str:
    """CUDA C++ of the pointwise conv kernel ``name(X, W, Y, bias, P)``: grid ``groups x chunks`` blocks
    of 128 threads, where P is the pixels of one image (NCHW; the grid's chunks cover every image) or the
    rows N*H*W (NHWC)."""
    spec.check()
    tin, tout, tb = ctype(spec.dtype_in), ctype(spec.dtype_out), ctype(spec.bias_dtype)
    kb, c = spec.kb, spec.c
    body = _nchw_body(spec) if spec.nchw else _nhwc_body(spec)
    return f"""// Tracea pointwise conv: {'NCHW' if spec.nchw else 'NHWC'} {spec.dtype_in.value} C={c} K={spec.k} kb={kb} vp={spec.vp}
{PRELUDE}
{epilogue_function(spec.epilogue, spec.bias_dtype, spec.dtype_out)}

extern "C" __global__ void __launch_bounds__({THREADS}) {name}(
        const {tin}* __restrict__ X, const {tin}* __restrict__ W, {tout}* __restrict__ Y,
        const {tb}* __restrict__ bias, int P) {{
    __shared__ __align__(16) float ws[{c * kb}];  // ws[c][kk] = W[k0 + kk][c] (0 past K)
    const int kg = (int)(blockIdx.x % {spec.groups}), rest = (int)(blockIdx.x / {spec.groups});
    const int k0 = kg * {kb};
    for (int i = threadIdx.x; i < {c * kb}; i += {THREADS}) {{  // coalesced over W's rows
        const int kk = i / {c}, cc = i - kk * {c};
        ws[cc * {kb} + kk] = k0 + kk < {spec.k} ? {load_expr(spec.dtype_in, f'W[(long long)(k0 + kk) * {c} + cc]')} : 0.0f;
    }}
    __syncthreads();{body}
}}
"""
