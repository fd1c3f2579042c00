"""Emitter (L5) for the portable Tensor Core kernel: ``mma.sync`` fed by a multi-stage ``cp.async``
pipeline through XOR-swizzled shared memory, with predicated edges and a fused epilogue.

One template serves GEMM (any transposes, batched) and implicit-GEMM conv2d: only the operand
*address maps* differ (:mod:`tracea_cuda.emit.operands`). The kernel is specialised at render time
on everything in :class:`MmaSpec`; GEMM sizes stay run-time arguments, conv geometry is baked in.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracea.dtypes import DType
from tracea.errors import UnsupportedConfigError
from tracea.ir.epilogue import Epilogue

from .common import PRELUDE, ctype, epilogue_function, store_expr
from .operands import OperandMap, StoreMap

KERNEL_NAME = "tracea_mma_kernel"


@dataclass(frozen=True)
class MmaSpec:
    """Everything the rendered source depends on.

    :param dtype_in: operand storage dtype (f16, bf16 or f32).
    :param math: ``f16``, ``bf16``, ``tf32`` (one TF32 product) or ``3xtf32`` (fp32-accurate split).
    :param dtype_out: output storage dtype; ``bias_dtype`` the bias vector's.
    :param a, b: operand address maps (layout in shared memory + global address + validity).
    :param store: output address map.
    :param bm, bn, bk, stages, warps_m, warps_n: CTA tile, pipeline depth and warp grid.
    :param swizzle: XOR factor (1, 2, 4, 8) applied to 16-byte chunks of each shared-memory row.
    :param group_m: rows of CTA tiles walked together for L2 reuse.
    """

    dtype_in: DType
    math: str
    dtype_out: DType
    bias_dtype: DType
    epilogue: Epilogue
    a: OperandMap
    b: OperandMap
    store: StoreMap
    bm: int = 128
    bn: int = 128
    bk: int = 32
    stages: int = 4
    warps_m: int = 2
    warps_n: int = 2
    swizzle: int = 8
    group_m: int = 8
    split_k: int = 1  # > 1: blockIdx.z splits K; raw fp32 partials go to a workspace (see splitk.py)

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def esize(self) -> int:
        return self.dtype_in.itemsize

    @property
    def smem_bytes(self) -> int:
        return self.stages * (self.bm + self.bn) * self.bk * self.esize

    def check(self) -> None:
        """Raise :class:`UnsupportedConfigError` when the tiling cannot be rendered."""
        kstep = 16 if self.esize == 2 else 8
        wtm, wtn = self.bm // self.warps_m, self.bn // self.warps_n
        problems = []
        if self.bm % self.warps_m or wtm % 16:
            problems.append(f"tile_m={self.bm} over warp_m={self.warps_m} is not a multiple of 16 per warp")
        if self.bn % self.warps_n or wtn % 16:
            problems.append(f"tile_n={self.bn} over {self.warps_n} warps is not a multiple of 16 per warp")
        if self.bk % kstep or self.bk * self.esize < 32:
            problems.append(f"tile_k={self.bk} must be a multiple of {kstep} and span >= 32 bytes")
        if self.stages < 2:
            problems.append("stages must be >= 2")
        if self.swizzle not in (1, 2, 4, 8):
            problems.append(f"swizzle factor {self.swizzle} not in 1/2/4/8")
        if (wtm // 16) * (wtn // 8) * 4 > 160:
            problems.append(f"warp tile {wtm}x{wtn} needs more than 160 accumulator registers")
        if problems:
            raise UnsupportedConfigError("; ".join(problems))


def _swizzle_consts(row_len: int, esize: int, factor: int) -> tuple[int, int]:
    """(shift, mask) for XOR-swizzling 16-byte chunks of rows of ``row_len`` elements."""
    row_bytes = row_len * esize
    chunks = max(1, row_bytes // 16)
    mask = max(1, min(factor, chunks)) - 1
    shift = 0
    while row_bytes << shift < 128 and (1 << shift) < 8:
        shift += 1
    return shift, mask


def _smem_layout(spec: MmaSpec, op: OperandMap, tile_outer: int) -> tuple[int, int]:
    """(rows, row_len) of one operand's stage tile: k-major rows hold tile_k elements."""
    return (tile_outer, spec.bk) if op.k_major else (spec.bk, tile_outer)


def _loader(spec: MmaSpec, name: str, op: OperandMap, tile_outer: int) -> str:
    rows, row_len = _smem_layout(spec, op, tile_outer)
    es = spec.esize
    epc = 16 // es
    vec = epc if op.vectorized else 1
    units = rows * row_len // vec
    iters = -(-units // spec.threads)
    shift, mask = _swizzle_consts(row_len, es, spec.swizzle)
    t = ctype(spec.dtype_in)
    outer = "m" if name == "a" else "n"
    if op.k_major:
        coords = f"const int {outer}i = {outer}0 + row; const int ki = k0 + col;"
    else:
        coords = f"const int ki = k0 + row; const int {outer}i = {outer}0 + col;"
    if op.vectorized:
        copy = "cp_async16(dst, src, valid);"
    elif es == 4:
        copy = "cp_async4(dst, src, valid);"
    else:
        copy = "{ u16 v = valid ? *src : (u16)0; asm volatile(\"st.shared.u16 [%0], %1;\" :: \"r\"(dst), \"h\"(v)); }"
    unroll = "#pragma unroll" if op.vectorized else "#pragma unroll 2"
    return f"""
static __device__ __forceinline__ void load_{name}(u32 s_base, const {t}* __restrict__ g, int {outer}0, int k0,
                                                 int M, int N, int K) {{
    {unroll}
    for (int it = 0; it < {iters}; ++it) {{
        const int u = threadIdx.x + it * {spec.threads};
        if ({iters * spec.threads} > {units} && u >= {units}) break;
        const int row = u / {row_len // vec};
        const int col = (u % {row_len // vec}) * {vec};
        {coords}
        bool valid;
        const {t}* src = g;
        {{ {op.address} }}
        if (!valid) src = g;
        const int chunk = col / {epc};
        const u32 dst = s_base + (u32)((row * {row_len} + ((chunk ^ ((row >> {shift}) & {mask})) * {epc}) + col % {epc}) * {es});
        {copy}
    }}
}}
"""


def _frag_addr(row_len: int, es: int, factor: int) -> tuple[str, int, int]:
    shift, mask = _swizzle_consts(row_len, es, factor)
    epc = 16 // es
    return (f"((r) * {row_len} + ((((c) / {epc}) ^ (((r) >> {shift}) & {mask})) * {epc}) + (c) % {epc})", shift, mask)


def render(spec: MmaSpec, name: str = KERNEL_NAME) -> str:
    """CUDA C++ source of the kernel ``name`` (default ``tracea_mma_kernel``) for ``spec``."""
    spec.check()
    es = spec.esize
    tin, tout, tb = ctype(spec.dtype_in), ctype(spec.dtype_out), ctype(spec.bias_dtype)
    a_rows, a_len = _smem_layout(spec, spec.a, spec.bm)
    b_rows, b_len = _smem_layout(spec, spec.b, spec.bn)
    a_off, _, _ = _frag_addr(a_len, es, spec.swizzle)
    b_off, _, _ = _frag_addr(b_len, es, spec.swizzle)
    wtm, wtn = spec.bm // spec.warps_m, spec.bn // spec.warps_n
    mi, ni = wtm // 16, wtn // 8
    kstep = 16 if es == 2 else 8
    a_stage, b_stage = spec.bm * spec.bk, spec.bn * spec.bk
    frag = _fragments_16(spec, mi, ni) if es == 2 else _fragments_32(spec, mi, ni)
    epilogue = epilogue_function(spec.epilogue, spec.bias_dtype, spec.dtype_out)
    part_init = part_flush = ""
    if spec.split_k > 1:
        kt_setup = (f"    const int KT_all = (K + {spec.bk - 1}) / {spec.bk}, per = (KT_all + {spec.split_k - 1}) / {spec.split_k};\n"
                    f"    const int kt0 = blockIdx.z * per, KT = max(0, min(KT_all, kt0 + per) - kt0);")
    else:
        kt_setup = f"    const int kt0 = 0, KT = (K + {spec.bk - 1}) / {spec.bk};"
    if spec.math == "3xtf32":
        # Tensor Cores accumulate with truncation; a per-k-tile partial sum added with FADD keeps the
        # long-K error at fp32 level (rel. err ~1e-6 instead of ~3e-5 at K=4096).
        loops = f"for (int i = 0; i < {mi}; ++i) for (int j = 0; j < {ni}; ++j) for (int e = 0; e < 4; ++e)"
        part_init = f"        float part[{mi}][{ni}][4];\n        #pragma unroll\n        {loops} part[i][j][e] = 0.0f;"
        part_flush = f"        #pragma unroll\n        {loops} acc[i][j][e] += part[i][j][e];"
        frag = frag.replace("mma_step(acc[i][j]", "mma_step(part[i][j]")
    store = spec.store.render(tout, store_expr(spec.dtype_out, "{v}"))
    return f"""// Tracea mma.sync kernel: {spec.math} {spec.bm}x{spec.bn}x{spec.bk} stages={spec.stages} warps={spec.warps_m}x{spec.warps_n} swizzle=xor{spec.swizzle}
{PRELUDE}
#define A_OFF(r, c) {a_off}
#define B_OFF(r, c) {b_off}
{epilogue}
{spec.store.helpers}
{_loader(spec, "a", spec.a, spec.bm)}
{_loader(spec, "b", spec.b, spec.bn)}
{_MMA[spec.math]}

extern "C" __global__ void __launch_bounds__({spec.threads}) {name}(
        const {tin}* __restrict__ A, const {tin}* __restrict__ B, {tout}* __restrict__ C,
        const {tb}* __restrict__ bias, int M, int N, int K) {{
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const u32 sA = smem_u32(smem_raw);
    const u32 sB = sA + {spec.stages * a_stage * es};
    const {tin}* sAp = reinterpret_cast<const {tin}*>(smem_raw);
    const {tin}* sBp = sAp + {spec.stages * a_stage};
    const int tiles_m = (M + {spec.bm - 1}) / {spec.bm}, tiles_n = (N + {spec.bn - 1}) / {spec.bn};
    const int pid = blockIdx.x;
    const int group = {spec.group_m} * tiles_n;
    const int first_m = (pid / group) * {spec.group_m};
    const int gsz = min(tiles_m - first_m, {spec.group_m});
    const int m0 = (first_m + (pid % group) % gsz) * {spec.bm};
    const int n0 = ((pid % group) / gsz) * {spec.bn};
    const long long bz = {"0" if spec.split_k > 1 else "blockIdx.z"};
    A += bz * {spec.a.batch_stride};
    B += bz * {spec.b.batch_stride};
    C += {"(long long)blockIdx.z * M * N" if spec.split_k > 1 else f"bz * {spec.store.batch_stride}"};
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = (warp % {spec.warps_m}) * {wtm}, wn = (warp / {spec.warps_m}) * {wtn};
    float acc[{mi}][{ni}][4];
    #pragma unroll
    for (int i = 0; i < {mi}; ++i)
        #pragma unroll
        for (int j = 0; j < {ni}; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
{kt_setup}
    #pragma unroll
    for (int s = 0; s < {spec.stages - 1}; ++s) {{
        if (s < KT) {{
            load_a(sA + s * {a_stage * es}, A, m0, (kt0 + s) * {spec.bk}, M, N, K);
            load_b(sB + s * {b_stage * es}, B, n0, (kt0 + s) * {spec.bk}, M, N, K);
        }}
        cp_async_commit();
    }}
    for (int kt = 0; kt < KT; ++kt) {{
        cp_async_wait<{spec.stages - 2}>();
        __syncthreads();
        const int nk = kt + {spec.stages - 1};
        if (nk < KT) {{
            const int slot = nk % {spec.stages};
            load_a(sA + slot * {a_stage * es}, A, m0, (kt0 + nk) * {spec.bk}, M, N, K);
            load_b(sB + slot * {b_stage * es}, B, n0, (kt0 + nk) * {spec.bk}, M, N, K);
        }}
        cp_async_commit();
        const int cur = kt % {spec.stages};
        const u32 a_s = sA + cur * {a_stage * es};
        const u32 b_s = sB + cur * {b_stage * es};
        const {tin}* a_p = sAp + cur * {a_stage};
        const {tin}* b_p = sBp + cur * {b_stage};
{part_init}
        #pragma unroll
        for (int kk = 0; kk < {spec.bk}; kk += {kstep}) {{
{frag}
        }}
{part_flush}
    }}
    cp_async_wait<0>();
    const int g = lane >> 2, t = lane & 3;
    #pragma unroll
    for (int i = 0; i < {mi}; ++i) {{
        #pragma unroll
        for (int h = 0; h < 2; ++h) {{
            const int row = m0 + wm + i * 16 + g + h * 8;
            if (row >= M) continue;
            #pragma unroll
            for (int j = 0; j < {ni}; ++j) {{
                const int col = n0 + wn + j * 8 + 2 * t;
                const float v0 = apply_epilogue(acc[i][j][2 * h], bias, col < N ? col : 0);
                const float v1 = apply_epilogue(acc[i][j][2 * h + 1], bias, col + 1 < N ? col + 1 : 0);
                {store}
            }}
        }}
    }}
}}
#undef A_OFF
#undef B_OFF
"""


def _fragments_16(spec: MmaSpec, mi: int, ni: int) -> str:
    if spec.a.k_major:
        a_load = ("const int r = wm + i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8; const int c = kk + (lane >> 4) * 8;"
                  " ldsm_x4(af[i], a_s + (u32)(A_OFF(r, c) * 2));")
    else:
        a_load = ("const int r = kk + (lane & 7) + (lane >> 4) * 8; const int c = wm + i * 16 + ((lane >> 3) & 1) * 8;"
                  " ldsm_x4_t(af[i], a_s + (u32)(A_OFF(r, c) * 2));")
    if spec.b.k_major:
        b_load = ("const int r = wn + j * 8 + (lane >> 4) * 8 + (lane & 7); const int c = kk + ((lane >> 3) & 1) * 8;"
                  " ldsm_x4(&bf[j][0], b_s + (u32)(B_OFF(r, c) * 2));")
    else:
        b_load = ("const int r = kk + ((lane >> 3) & 1) * 8 + (lane & 7); const int c = wn + j * 8 + (lane >> 4) * 8;"
                  " ldsm_x4_t(&bf[j][0], b_s + (u32)(B_OFF(r, c) * 2));")
    return f"""            u32 af[{mi}][4]; u32 bf[{ni}][2];
            #pragma unroll
            for (int i = 0; i < {mi}; ++i) {{ {a_load} }}
            #pragma unroll
            for (int j = 0; j < {ni}; j += 2) {{ {b_load} }}
            #pragma unroll
            for (int i = 0; i < {mi}; ++i)
                #pragma unroll
                for (int j = 0; j < {ni}; ++j) mma_step(acc[i][j], af[i], bf[j]);"""


def _fragments_32(spec: MmaSpec, mi: int, ni: int) -> str:
    a_ld = b_ld = None
    if spec.a.k_major:
        a_ld = ("const int r = wm + i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8; const int c = kk + (lane >> 4) * 4;"
                " u32 q[4]; ldsm_x4(q, a_s + (u32)(A_OFF(r, c) * 4));"
                " af[i][0] = __uint_as_float(q[0]); af[i][1] = __uint_as_float(q[1]);"
                " af[i][2] = __uint_as_float(q[2]); af[i][3] = __uint_as_float(q[3]);")
    if spec.b.k_major:
        b_ld = ("const int r = wn + j * 8 + (lane >> 4) * 8 + (lane & 7); const int c = kk + ((lane >> 3) & 1) * 4;"
                " u32 q[4]; ldsm_x4(q, b_s + (u32)(B_OFF(r, c) * 4));"
                " bf[j][0] = __uint_as_float(q[0]); bf[j][1] = __uint_as_float(q[1]);"
                " bf[j + 1][0] = __uint_as_float(q[2]); bf[j + 1][1] = __uint_as_float(q[3]);")

    def a_at(dr: str, dc: str) -> str:
        if spec.a.k_major:
            return f"a_p[A_OFF(wm + i * 16 + g + {dr}, kk + t + {dc})]"
        return f"a_p[A_OFF(kk + t + {dc}, wm + i * 16 + g + {dr})]"

    def b_at(dk: str) -> str:
        if spec.b.k_major:
            return f"b_p[B_OFF(wn + j * 8 + g, kk + t + {dk})]"
        return f"b_p[B_OFF(kk + t + {dk}, wn + j * 8 + g)]"

    return f"""            const int g = lane >> 2, t = lane & 3;
            float af[{mi}][4]; float bf[{ni}][2];
            #pragma unroll
            for (int i = 0; i < {mi}; ++i) {{
                {a_ld or f"af[i][0] = {a_at('0', '0')}; af[i][1] = {a_at('8', '0')}; af[i][2] = {a_at('0', '4')}; af[i][3] = {a_at('8', '4')};"}
            }}
            #pragma unroll
            for (int j = 0; j < {ni}; j += {2 if b_ld else 1}) {{ {b_ld or f"bf[j][0] = {b_at('0')}; bf[j][1] = {b_at('4')};"} }}
            #pragma unroll
            for (int i = 0; i < {mi}; ++i)
                #pragma unroll
                for (int j = 0; j < {ni}; ++j) mma_step(acc[i][j], af[i], bf[j]);"""




def _mma16(kind: str) -> str:
    return f"""
static __device__ __forceinline__ void mma_step(float* d, const u32* a, const u32* b) {{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 "
                 "{{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}}
"""


TF32_CORE = r"""
static __device__ __forceinline__ void mma_tf32(float* d, const u32* a, const u32* b) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
"""

# 3xTF32 keeps IEEE non-finite results: a*b ~ as*bb + ab*bs + ab*bb, where x - big is NaN for x = +-Inf and
# a zero small part times an Inf big part is NaN. So the small parts of non-finite values are 0, and the
# two correction products only see finite operands (a non-finite big part is 0 there): a NaN or +-Inf
# reaches the sum through ab*bb alone, which gives the IEEE product.
TF32_REST = r"""
static __device__ __forceinline__ u32 tf32_rest(float x, u32 big) {
    const float r = x - __uint_as_float(big);
    return f32_to_tf32(r == r ? r : 0.0f);
}
static __device__ __forceinline__ u32 tf32_finite(u32 big) {
    return (big & 0x7f800000u) == 0x7f800000u ? 0u : big;
}
"""

_MMA = {
    "f16": _mma16("f16"),
    "bf16": _mma16("bf16"),
    "tf32": TF32_CORE + r"""
static __device__ __forceinline__ void mma_step(float* d, const float* a, const float* b) {
    u32 ar[4], br[2];
    #pragma unroll
    for (int e = 0; e < 4; ++e) ar[e] = f32_to_tf32(a[e]);
    br[0] = f32_to_tf32(b[0]); br[1] = f32_to_tf32(b[1]);
    mma_tf32(d, ar, br);
}
""",
    "3xtf32": TF32_CORE + TF32_REST + r"""
static __device__ __forceinline__ void mma_step(float* d, const float* a, const float* b) {
    u32 ab[4], as[4], bb[2], bs[2];
    #pragma unroll
    for (int e = 0; e < 4; ++e) { ab[e] = f32_to_tf32(a[e]); as[e] = tf32_rest(a[e], ab[e]); }
    #pragma unroll
    for (int e = 0; e < 2; ++e) { bb[e] = f32_to_tf32(b[e]); bs[e] = tf32_rest(b[e], bb[e]); }
    u32 af[4] = {tf32_finite(ab[0]), tf32_finite(ab[1]), tf32_finite(ab[2]), tf32_finite(ab[3])};
    u32 bf[2] = {tf32_finite(bb[0]), tf32_finite(bb[1])};
    mma_tf32(d, as, bf);
    mma_tf32(d, af, bs);
    mma_tf32(d, ab, bb);
}
""",
}
