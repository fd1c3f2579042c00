"""Emitter for depthwise and grouped conv2d with few channels per group (``groups > 1``, C/groups and
K/groups at most 64: MobileNet / EfficientNet / ConvNeXt depthwise layers, ResNeXt / RegNet grouped 3x3s) as
a direct kernel on the CUDA cores. Such layers move far more bytes than they compute (a 3x3 depthwise conv
does 18 FLOPs per output element), so the kernel is built to stream x and the output once and keep the
re-reads of neighbouring taps in L1 / L2.

Notation: group g holds input channels ``[g*cg, (g+1)*cg)`` and output channels ``[g*kg, (g+1)*kg)``; output
channel k reads input channels ``(k // kg) * cg + ci``, ``ci < cg``. Depthwise is ``cg == 1`` (``kg`` is the
channel multiplier). Every shape parameter (sizes, stride, padding, dilation, cg, kg) is a compile-time
constant of the rendered source; the tap loops over S (and, NCHW, over the rows a thread needs) are unrolled.

**NHWC** (16-bit and float32). One thread owns ``vec`` consecutive output channels ``k0 .. k0+vec-1`` of
``ppt`` consecutive output pixels along Q (one output row p of one image). ``vec`` is a power of two
dividing K such that the thread's channels lie in one group (``kg % vec == 0``) or cover whole groups
(``vec % kg == 0``); then the input channels it reads are one contiguous window of ``nw`` channels
(``cg``, or ``vec / kg * cg``) starting at ``(k0 // kg) * cg``, loaded per input pixel as vectors of ``vin``
elements (16-byte ``uint4`` loads for 16-bit depthwise: 8 channels; ``float4`` for float32) when C, the
window and the pointer allow, else narrower or scalar loads (odd C: a scalar path, ``vec = 1``).
A block is ``tc`` channel vectors x ``tp`` pixel units (channel index fastest, so a warp reads whole 128-byte
runs of one pixel's channels); the grid is (pixel tiles, channel tiles) with the pixel tiles varying fastest,
so blocks resident together share input rows in L1 / L2. The block's weights ``w[k][r][s][ci]`` are staged
once in static shared memory as float32 ``ws[(r*S + s)*cg + ci][k - k_block]`` (a thread reads its ``vec``
weights of one tap as ``float4``; threads of the same channels read the same words: broadcasts).
Per row r (a rolled loop), the input columns the thread's ``ppt`` outputs need (the distinct
``i*stride + s*dilation``) are loaded once into registers when they fit (``ROW_CACHE_FLOATS``), so stride-1
neighbours share loads; otherwise each tap loads its column (L1 hits). Rows outside the image are skipped and
columns outside it read as zeros (zero padding). Past the register budget, the taps of a row are a rolled loop
instead (one column live at a time: unrolled, ptxas hoisted every load of the row and spilled).

**NCHW** (any dtype; float32 is what PyTorch models use). One thread owns one output column q, ``rows``
consecutive output rows and ``kpt`` consecutive output channels of one group (``kg % kpt == 0``) of one
image; consecutive threads take consecutive q, so a warp's loads are coalesced along W. For each of its cg
input planes it walks the distinct input rows its outputs need (shared between vertically neighbouring
outputs at stride 1) and the S taps of each, each input value loaded once for its ``kpt`` channels (wide
groups: the ``kg`` output channels of a group read the same cg planes, so ``kpt > 1`` divides those loads),
reading the weights ``w[k][ci][r][s]`` through the read-only cache (one address per plane: broadcasts).

Both accumulate in float32 with ``fmaf`` (fp32-accurate whatever ``fp32_precision`` allows), then apply the
fused epilogue (:func:`~tracea_cuda.emit.common.epilogue_function`: bias, ReLU / GELU / SiLU, NaN kept) and
store in the output dtype (NHWC: vector stores of the thread's channels where aligned). No scratch memory,
one launch, pointer-only arguments ``(X, W, Y, bias)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracea.dtypes import DType
from tracea.errors import UnsupportedConfigError
from tracea.ir.epilogue import Epilogue

from .common import PRELUDE, ctype, epilogue_function, load_expr, store_expr

KERNEL_NAME = "tracea_depthwise_conv"
#: static shared memory the NHWC weight slice may take (float32 values)
SMEM_LIMIT = 48 * 1024
#: input values (per row) a thread may keep in registers to share columns between its outputs
ROW_CACHE_FLOATS = 64
#: accumulators per thread (NHWC: ppt x vec; NCHW: rows)
MAX_ACC = 32
#: largest kernel extent (R or S) served: the tap loops are unrolled
MAX_KERNEL = 7
#: NHWC: widest input window read with scalar loads at the usual register budget (see ``_nhwc_kernel``)
MAX_WINDOW_SCALAR = 16
#: most input / output channels per group served (NHWC: the block's weight slice, in shared memory, bounds it
#: further for large kernels; NCHW: the planes are a rolled loop, a thread's ``kpt`` channels read each input
#: value once)
MAX_PER_GROUP = 64

def _min_blocks(threads: int, resident: int = 512) -> int:
    """``__launch_bounds__``' blocks per SM: ``resident`` threads (512: ptxas may use up to 128 registers; left
    to itself it capped 256-thread blocks at 64 and spilled)."""
    return max(1, resident // threads)


def _index_type(spec: "DepthwiseSpec") -> str:
    """C type of the thread / pixel-unit index: 32-bit where the grid's indices fit (cheaper divisions by the
    sizes), else 64-bit. Memory offsets are 64-bit either way."""
    gx, _, _ = spec.grid()
    return "int" if gx * spec.threads < 2**31 - 1 else "long long"


_VEC_TYPE = {1: "unsigned int", 2: "uint2", 4: "uint4"}  # by 32-bit words


@dataclass(frozen=True)
class DepthwiseSpec:
    """What the kernel source depends on (see the module docstring).

    :param nchw: layout of x and the output (else NHWC; w is KCRS / KRSC accordingly).
    :param geom: ``(n, c, h, w, k, r, s, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w)``.
    :param cg: input channels per group; ``kg`` output channels per group.
    :param vec: NHWC output channels per thread; ``vin`` input channels per load (``vin * itemsize`` bytes);
        ``vec_out``: the thread's channels are stored as 16-byte (or narrower) vectors; ``ppt`` output pixels
        per thread along Q; ``tc`` channel vectors x ``tp`` pixel units per block.
    :param rows: NCHW output rows per thread; ``kpt`` NCHW output channels per thread (within one group);
        ``nchw_threads`` threads per block.
    """

    dtype_in: DType
    dtype_out: DType
    bias_dtype: DType
    epilogue: Epilogue
    nchw: bool
    geom: tuple[int, ...]
    cg: int
    kg: int
    vec: int = 1
    vin: int = 1
    vec_out: bool = False
    ppt: int = 1
    tc: int = 1
    tp: int = 128
    rows: int = 1
    kpt: int = 1
    nchw_threads: int = 128

    smem_bytes = 0  # the weight slice is static shared memory

    # -- derived sizes -----------------------------------------------------------------------------
    @property
    def p(self) -> int:
        n, c, h, w, k, r, s, sh, sw, ph, pw, dh, dw = self.geom
        return (h + 2 * ph - dh * (r - 1) - 1) // sh + 1

    @property
    def q(self) -> int:
        n, c, h, w, k, r, s, sh, sw, ph, pw, dh, dw = self.geom
        return (w + 2 * pw - dw * (s - 1) - 1) // sw + 1

    @property
    def threads(self) -> int:
        return self.nchw_threads if self.nchw else self.tc * self.tp

    @property
    def nw(self) -> int:
        """NHWC: input channels one thread reads per pixel (its window)."""
        return self.cg if self.kg % self.vec == 0 else self.vec // self.kg * self.cg

    @property
    def units(self) -> int:
        """NHWC: pixel units (``ppt`` outputs along Q) over the batch; NCHW: threads over the output."""
        n, k = self.geom[0], self.geom[4]
        if self.nchw:
            return n * (k // self.kpt) * -(-self.p // self.rows) * self.q
        return n * self.p * -(-self.q // self.ppt)

    @property
    def smem_floats(self) -> int:
        r, s = self.geom[5], self.geom[6]
        return 0 if self.nchw else self.tc * self.vec * r * s * self.cg

    def grid(self) -> tuple[int, int, int]:
        if self.nchw:
            return (-(-self.units // self.nchw_threads), 1, 1)
        kv = self.geom[4] // self.vec
        return (-(-self.units // self.tp), -(-kv // self.tc), 1)

    def columns(self) -> list[int]:
        """NHWC: the distinct input column offsets (from ``q0 * stride - pad``) of one row."""
        sw, dw, s = self.geom[8], self.geom[12], self.geom[6]
        return sorted({i * sw + t * dw for i in range(self.ppt) for t in range(s)})

    def row_cached(self) -> bool:
        return len(self.columns()) * self.nw <= ROW_CACHE_FLOATS

    def check(self) -> None:
        problems = []
        n, c, h, w, k, r, s = self.geom[:7]
        if self.cg * (c // self.cg) != c or k % self.kg or c // self.cg != k // self.kg:
            problems.append(f"cg={self.cg}, kg={self.kg} do not split C={c}, K={k} into the same groups")
        if max(r, s) > MAX_KERNEL:
            problems.append(f"kernel {r}x{s}: at most {MAX_KERNEL} taps per axis (the tap loops are unrolled)")
        if self.cg > MAX_PER_GROUP or self.kg > MAX_PER_GROUP:
            problems.append(f"{self.cg} input / {self.kg} output channels per group: at most {MAX_PER_GROUP}")
        if self.nchw:
            if self.rows not in (1, 2, 4, 8):
                problems.append(f"rows={self.rows}: 1, 2, 4 or 8 output rows per thread")
            if self.kpt < 1 or self.kg % self.kpt:
                problems.append(f"kpt={self.kpt}: output channels per thread must divide the {self.kg} of a group")
            elif self.kpt * self.rows > MAX_ACC:
                problems.append(f"kpt x rows = {self.kpt * self.rows} accumulators per thread (at most {MAX_ACC})")
            if self.nchw_threads not in (32, 64, 128, 256, 512):
                problems.append(f"threads={self.nchw_threads}: 32 .. 512, a power of two")
            if self.grid()[0] >= 2**31:
                problems.append("output larger than the grid range")
        else:
            isz = self.dtype_in.storage.itemsize
            if self.vec not in (1, 2, 4, 8) or k % self.vec or (self.vec % self.kg and self.kg % self.vec):
                problems.append(f"vec={self.vec}: a power of two <= 8 dividing K={k}, within one group or "
                                f"covering whole groups of {self.kg}")
            elif self.vin < 1 or self.nw % self.vin or self.vin * isz > 16 or self.vin & (self.vin - 1):
                problems.append(f"vin={self.vin} does not split the {self.nw}-channel window into <= 16-byte loads")
            if self.ppt not in (1, 2, 4, 8):
                problems.append(f"ppt={self.ppt}: 1, 2, 4 or 8 pixels per thread")
            if self.ppt * self.vec > MAX_ACC:
                problems.append(f"ppt x vec = {self.ppt * self.vec} accumulators per thread (at most {MAX_ACC})")
            if self.tc < 1 or self.tp < 1 or self.threads > 1024:
                problems.append(f"block of {self.tc} x {self.tp} threads: at most 1024")
            if self.smem_floats * 4 > SMEM_LIMIT:
                problems.append(f"a weight slice of {self.smem_floats} fp32 values exceeds {SMEM_LIMIT} B of "
                                "shared memory")
            gx, gy, _ = self.grid()
            if gx >= 2**31 or gy > 65535:
                problems.append("output larger than the grid range")
        if problems:
            raise UnsupportedConfigError("; ".join(problems))


# ------------------------------------------------------------------------------------------------
# vector loads and stores
# ------------------------------------------------------------------------------------------------

def _unpack_words(dtype: DType, words: list[str]) -> list[str]:
    """Float expressions of the elements packed in 32-bit ``words`` (in memory order)."""
    if dtype.storage is DType.F32:
        return [f"__uint_as_float({wd})" for wd in words]
    conv = "f16_to_f32" if dtype.storage is DType.F16 else "bf16_to_f32"
    out = []
    for wd in words:
        out += [f"{conv}((u16)({wd} & 0xffffu))", f"{conv}((u16)({wd} >> 16))"]
    return out


def _load_run(dtype: DType, ptr: str, count: int, ok: str, dest: str, first: int) -> str:
    """C statements loading ``count`` consecutive elements at ``ptr`` (aligned to their size) into
    ``dest[first ..]`` as floats, zeros unless ``ok``."""
    nbytes = count * dtype.storage.itemsize
    if nbytes < 4:  # one 16-bit element, or a scalar
        return f"{dest}[{first}] = {ok} ? {load_expr(dtype, f'__ldg({ptr})')} : 0.0f;"
    nwords = nbytes // 4
    vt = _VEC_TYPE[nwords]
    zero = {1: "0u", 2: "make_uint2(0u, 0u)", 4: "make_uint4(0u, 0u, 0u, 0u)"}[nwords]
    words = ["v"] if nwords == 1 else [f"v.{f}" for f in "xyzw"[:nwords]]
    vals = _unpack_words(dtype, words)
    body = " ".join(f"{dest}[{first + i}] = {v};" for i, v in enumerate(vals))
    return (f"{{ const {vt} v = {ok} ? __ldg(reinterpret_cast<const {vt}*>({ptr})) : {zero}; {body} }}")


def _store_run(dtype: DType, ptr: str, vals: list[str]) -> str:
    """C statements storing float expressions ``vals`` to consecutive elements at ``ptr`` (aligned to the
    run's size, 4 to 16 bytes) as one vector store."""
    if dtype.storage is DType.F32:
        words = [f"__float_as_uint({v})" for v in vals]
    else:
        words = [f"((u32){store_expr(dtype, vals[2 * i])} | ((u32){store_expr(dtype, vals[2 * i + 1])} << 16))"
                 for i in range(len(vals) // 2)]
    n = len(words)
    vt = _VEC_TYPE[n]
    value = words[0] if n == 1 else f"make_{vt}({', '.join(words)})"
    return f"*reinterpret_cast<{vt}*>({ptr}) = {value};"


# ------------------------------------------------------------------------------------------------
# NHWC
# ------------------------------------------------------------------------------------------------

def _nhwc_kernel(spec: DepthwiseSpec, name: str) -> str:
    n, c, h, w, k, r, s, sh, sw, ph, pw, dh, dw = spec.geom
    p, q = spec.p, spec.q
    cg, kg, vec, vin, ppt, nw = spec.cg, spec.kg, spec.vec, spec.vin, spec.ppt, spec.nw
    tc, tp, tcv = spec.tc, spec.tp, spec.tc * spec.vec
    rs = r * s
    qt = -(-q // ppt)
    tin, tout, tb = ctype(spec.dtype_in), ctype(spec.dtype_out), ctype(spec.bias_dtype)
    cols = spec.columns()
    cached = spec.row_cached()
    it = _index_type(spec)

    def gl(j: int) -> int:  # the thread-local group of output j (its window offset is gl * cg)
        return j // kg if vec % kg == 0 else 0

    def load_col(off: str, dest: str) -> str:
        lines = [f"{{ const int col = w0 + {off}; const bool ok = (unsigned)col < {w}u;",
                 f"  const {tin}* src = xr + (long long)col * {c};"]
        for t in range(nw // vin):
            lines.append("  " + _load_run(spec.dtype_in, f"src + {t * vin}", vin, "ok", dest, t * vin))
        lines.append("}")
        return "\n            ".join(lines)

    def weights(tap: str, ci: int) -> tuple[list[str], list[str]]:
        """Statements reading the thread's ``vec`` weights of one tap and input channel from shared
        memory, and the expressions naming them."""
        base = f"wsk + ({tap} * {cg} + {ci}) * {tcv}"
        if vec >= 4:
            reads = [f"const float4 w{ci}_{g} = *reinterpret_cast<const float4*>({base} + {4 * g});"
                     for g in range(vec // 4)]
            return reads, [f"w{ci}_{j // 4}.{'xyzw'[j % 4]}" for j in range(vec)]
        if vec == 2:
            return [f"const float2 w{ci}_0 = *reinterpret_cast<const float2*>({base});"], [f"w{ci}_0.x", f"w{ci}_0.y"]
        return [f"const float w{ci}_0 = ({base})[0];"], [f"w{ci}_0"]

    def fmas(tap: str, outs: list[tuple[int, str]]) -> list[str]:
        """For each ci: read the tap's weights, then FMA into the outputs ``(i, x array)``."""
        body: list[str] = []
        for ci in range(cg):
            reads, names = weights(tap, ci)
            body += ["{"] + reads
            for i, xa in outs:
                body += [f"acc[{i}][{j}] = fmaf({xa}[{gl(j) * cg + ci}], {names[j]}, acc[{i}][{j}]);"
                         for j in range(vec)]
            body.append("}")
        return body

    lines: list[str] = []
    if cached:
        for u in cols:
            lines.append(f"float xc{u}[{nw}];")
            lines.append(load_col(str(u), f"xc{u}"))
        for t in range(s):
            outs = [(i, f"xc{i * sw + t * dw}") for i in range(ppt)]
            lines += fmas(f"(r * {s} + {t})", outs)
    else:  # a rolled loop over the taps: one column in registers at a time (wide windows, long rows)
        lines.append("#pragma unroll 1")
        lines.append(f"for (int s = 0; s < {s}; ++s) {{")
        for i in range(ppt):
            lines.append(f"{{ float xt[{nw}];")
            lines.append(load_col(f"{i * sw} + s * {dw}", "xt"))
            lines += fmas(f"(r * {s} + s)", [(i, "xt")])
            lines.append("}")
        lines.append("}")
    row_body = "\n            ".join(lines)
    # a window wider than 16 channels read one element at a time (a misaligned view): 256 resident threads, so
    # ptxas may keep its loads in registers (at 128 registers a 24-channel window spilled ~100 bytes)
    resident = 256 if nw > MAX_WINDOW_SCALAR and vin == 1 else 512

    osz = spec.dtype_out.storage.itemsize
    if spec.vec_out and vec * osz >= 4:
        run = min(vec, 16 // osz)
        st = [_store_run(spec.dtype_out, f"yp + {g}", [f"o[{g + e}]" for e in range(run)]) for g in range(0, vec, run)]
    else:
        st = [f"yp[{j}] = {store_expr(spec.dtype_out, f'o[{j}]')};" for j in range(vec)]
    stores = " ".join(st)

    return f"""
extern "C" __global__ void __launch_bounds__({spec.threads}, {_min_blocks(spec.threads, resident)}) {name}(
        const {tin}* __restrict__ X, const {tin}* __restrict__ Wt, {tout}* __restrict__ Y,
        const {tb}* __restrict__ bias) {{
    __shared__ __align__(16) float ws[{spec.smem_floats}];  // ws[(r*S + s)*cg + ci][k - kb0]
    const int cvl = (int)(threadIdx.x % {tc}), pl = (int)(threadIdx.x / {tc});
    const int kb0 = (int)blockIdx.y * {tcv};
    for (int i = threadIdx.x; i < {spec.smem_floats}; i += {spec.threads}) {{  // coalesced over w's rows
        const int kl = i / {rs * cg}, rem = i - kl * {rs * cg};
        ws[rem * {tcv} + kl] = kb0 + kl < {k} ? {load_expr(spec.dtype_in, f'Wt[(long long)(kb0 + kl) * {rs * cg} + rem]')} : 0.0f;
    }}
    __syncthreads();
    const int k0 = kb0 + cvl * {vec};
    const {it} u = ({it})blockIdx.x * {tp} + pl;
    if (k0 >= {k} || u >= ({it}){spec.units}LL) return;
    const int qt = (int)(u % {qt});
    const {it} rest = u / {qt};
    const int p = (int)(rest % {p});
    const long long img = (long long)(rest / {p});
    const int q0 = qt * {ppt};
    const int h0 = p * {sh} - {ph}, w0 = q0 * {sw} - {pw};
    const {tin}* xn = X + img * {h * w * c}LL + (k0 / {kg}) * {cg};
    const float* wsk = ws + cvl * {vec};
    float acc[{ppt}][{vec}];
    #pragma unroll
    for (int i = 0; i < {ppt}; ++i)
        #pragma unroll
        for (int j = 0; j < {vec}; ++j) acc[i][j] = 0.0f;
    #pragma unroll 1
    for (int r = 0; r < {r}; ++r) {{
        const int hh = h0 + r * {dh};
        if ((unsigned)hh >= {h}u) continue;  // a padding row: zeros
        const {tin}* xr = xn + (long long)hh * {w * c};
        {{
            {row_body}
        }}
    }}
    float b[{vec}];
    #pragma unroll
    for (int j = 0; j < {vec}; ++j) b[j] = bias_at(bias, k0 + j);
    #pragma unroll
    for (int i = 0; i < {ppt}; ++i) {{
        if (q0 + i >= {q}) break;
        {tout}* yp = Y + ((img * {p} + p) * {q} + q0 + i) * {k}LL + k0;
        float o[{vec}];
        #pragma unroll
        for (int j = 0; j < {vec}; ++j) o[j] = apply_epilogue_b(acc[i][j], b[j]);
        {stores}
    }}
}}
"""


# ------------------------------------------------------------------------------------------------
# NCHW
# ------------------------------------------------------------------------------------------------

def _nchw_kernel(spec: DepthwiseSpec, name: str) -> str:
    n, c, h, w, k, r, s, sh, sw, ph, pw, dh, dw = spec.geom
    p, q = spec.p, spec.q
    cg, kg, rows, kpt = spec.cg, spec.kg, spec.rows, spec.kpt
    pb, kb = -(-p // rows), k // kpt
    it = _index_type(spec)
    tin, tout, tb = ctype(spec.dtype_in), ctype(spec.dtype_out), ctype(spec.bias_dtype)
    wload = (lambda e: load_expr(spec.dtype_in, f"__ldg({e})"))
    body: list[str] = []
    for u in sorted({i * sh + t * dh for i in range(rows) for t in range(r)}):
        pairs = [(i, t) for i in range(rows) for t in range(r) if i * sh + t * dh == u]
        body.append(f"if ((unsigned)(h0 + {u}) < {h}u) {{")
        body.append(f"    const {tin}* xr = xc + (h0 + {u}) * {w};")
        for t_s in range(s):
            body.append(f"    {{ const int col = w0 + {t_s * dw};")
            body.append(f"      const float xv = (unsigned)col < {w}u ? {load_expr(spec.dtype_in, '__ldg(xr + col)')} : 0.0f;")
            for j in range(kpt):
                for i, t_r in pairs:
                    body.append(f"      acc[{j * rows + i}] = fmaf(xv, {wload(f'wc + {j * cg * r * s + t_r * s + t_s}')}, "
                                f"acc[{j * rows + i}]);")
            body.append("    }")
        body.append("}")
    inner = "\n        ".join(body)
    unroll = "#pragma unroll 1" if cg * kpt > 4 else "#pragma unroll"
    store = store_expr(spec.dtype_out, f"apply_epilogue_b(acc[j * {rows} + i], b)")
    return f"""
extern "C" __global__ void __launch_bounds__({spec.nchw_threads}, {_min_blocks(spec.nchw_threads)}) {name}(
        const {tin}* __restrict__ X, const {tin}* __restrict__ Wt, {tout}* __restrict__ Y,
        const {tb}* __restrict__ bias) {{
    const {it} idx = ({it})blockIdx.x * {spec.nchw_threads} + threadIdx.x;
    if (idx >= ({it}){spec.units}LL) return;
    const int q = (int)(idx % {q});
    {it} t = idx / {q};
    const int p0 = (int)(t % {pb}) * {rows};
    t /= {pb};
    const int k = (int)(t % {kb}) * {kpt};
    const long long img = (long long)(t / {kb});
    const int h0 = p0 * {sh} - {ph}, w0 = q * {sw} - {pw};
    const {tin}* xn = X + (img * {c} + (k / {kg}) * {cg}) * {h * w}LL;
    const {tin}* wk = Wt + (long long)k * {cg * r * s};
    float acc[{kpt * rows}];
    #pragma unroll
    for (int i = 0; i < {kpt * rows}; ++i) acc[i] = 0.0f;
    {unroll}
    for (int ci = 0; ci < {cg}; ++ci) {{
        const {tin}* xc = xn + (long long)ci * {h * w};
        const {tin}* wc = wk + ci * {r * s};
        {inner}
    }}
    #pragma unroll
    for (int j = 0; j < {kpt}; ++j) {{
        const float b = bias_at(bias, k + j);
        {tout}* yp = Y + ((img * {k} + k + j) * {p} + p0) * {q}LL + q;
        #pragma unroll
        for (int i = 0; i < {rows}; ++i)
            if (p0 + i < {p}) yp[(long long)i * {q}] = {store};
    }}
}}
"""


def render(spec: DepthwiseSpec, name: str = KERNEL_NAME) -> str:
    """CUDA C++ of the depthwise / grouped conv kernel ``name(X, W, Y, bias)`` for ``spec`` (grid
    :meth:`DepthwiseSpec.grid`, :attr:`DepthwiseSpec.threads` threads per block, no dynamic shared memory)."""
    spec.check()
    n, c, h, w, k, r, s = spec.geom[:7]
    head = (f"// Tracea depthwise/grouped conv: {'NCHW' if spec.nchw else 'NHWC'} {spec.dtype_in.value}->"
            f"{spec.dtype_out.value} n{n} {c}->{k} {h}x{w} k{r}x{s} cg={spec.cg} kg={spec.kg} "
            + (f"rows={spec.rows} kpt={spec.kpt}" if spec.nchw else
               f"vec={spec.vec} vin={spec.vin} ppt={spec.ppt} block={spec.tc}x{spec.tp}"
               f"{' row-cached' if spec.row_cached() else ''}"))
    kernel = _nchw_kernel(spec, name) if spec.nchw else _nhwc_kernel(spec, name)
    return f"""{head}
{PRELUDE}
{epilogue_function(spec.epilogue, spec.bias_dtype, spec.dtype_out)}
{kernel}"""
