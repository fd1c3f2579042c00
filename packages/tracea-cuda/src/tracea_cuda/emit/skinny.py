"""A skinny-GEMM kernel on Tensor Cores for few-row products against an (N, K) weight: ``C = epi(A @ B^T)``
with A (M, K), M <= 64, B stored (N, K) row-major -- ``x @ W.T`` of an ``nn.Linear`` at decode time with
a few to a few dozen tokens, where the CUDA-core GEMV runs out of FMA throughput and a tiled GEMM has too
few output tiles to keep the memory system busy.

The weight is streamed once, straight from global memory into registers (no shared-memory staging):
each warp owns ``NB`` blocks of 8 weight rows and a slice of K; per chunk of ``32 * UNROLL`` k a lane loads
``UNROLL`` adjacent 16-byte vectors (8 consecutive k each) of one weight row -- the four lanes of a quad
read whole cache lines -- and the same k of the matching A rows. ``mma.sync.m16n8k16`` then
runs on those registers as they are: the reduction order over k is free, so the k slots of the A and B
fragments are assigned to match what each lane loaded (each 16-byte vector of lane t of a quad feeds
slots 2t, 2t+1, 2t+8, 2t+9 of two mmas: its first four k one, its last four the next). ``KW`` warps of a block split K and reduce their partial tiles through shared memory, then apply
the fused epilogue. Rows of A past M and k past K are zero-filled. 16-bit inputs, fp32 accumulation.

float32 inputs (``math`` ``tf32`` or ``3xtf32``) run the same loop on ``mma.sync.m16n8k8`` TF32: a 16-byte
vector holds 4 consecutive k, which feed slots t and t+4 of two mmas (first pair one, last pair the next:
the register pattern of the 16-bit kernel); ``3xtf32`` splits each operand in registers into a TF32 big part
and the TF32 rounding of its remainder and accumulates small x big + big x small + big x big (fp32-level
accuracy, ``fp32_precision="highest"``; each chunk into a fresh partial tile added with FADD, since Tensor
Core accumulation truncates), with the non-finite handling of :mod:`tracea_cuda.emit.mma`. The
weight is still read once: no split pass through memory, which is what made the tiled 3xTF32 GEMMs
0.17-0.65x cuBLAS on 8-32-row products.

Options: ``coalesced`` assigns k so that a quad reads 64 contiguous bytes per instruction instead;
``prefetch`` issues the next chunk's loads before this chunk's mma (two register buffers: each warp keeps
a chunk in flight while it computes); ``half`` (M <= 8) compiles out rows 8-15 of the A fragment;
``wide_regs`` adds a minimum of one block per SM to the launch bounds (registers for the prefetching
16-warp blocks, which spill when ptxas plans for two); ``wn`` > 1 puts ``WN`` groups of ``KW`` warps in a
block, each group on its own ``8 * NB`` weight rows over the same K slices, so the ``WN`` warps that share a
K slice read the same A vectors (the later reads hit L1: A's traffic from L2 per weight byte drops by
``WN``, which counts at M = 9-16 where A is as many bytes per block as the weight at ``NB`` = 2).
"""

from __future__ import annotations

from dataclasses import dataclass

from tracea.dtypes import DType
from tracea.errors import UnsupportedConfigError
from tracea.ir.epilogue import Epilogue

from .common import PRELUDE, ctype, epilogue_function, store_expr
from .mma import TF32_CORE, TF32_REST

KERNEL_NAME = "tracea_skinny_mma"
MAX_ROWS = 64


@dataclass(frozen=True)
class SkinnySpec:
    """What one compiled skinny-GEMM kernel bakes in."""

    dtype_in: DType
    dtype_out: DType
    bias_dtype: DType
    epilogue: Epilogue
    mf: int  # 16-row fragments of A (M <= 16 * mf)
    nb: int  # 8-row blocks of the weight per warp
    kw: int  # warps per block, splitting K
    unroll: int  # 32-wide k chunks loaded ahead per lane
    vec: bool  # 16-byte loads (K % 8 == 0, 16-byte aligned A and B); else element loads
    coalesced: bool = False  # each load instruction reads 64 contiguous bytes of a row (else 16 of every 32)
    prefetch: bool = False  # the next chunk's loads are issued before this chunk's mma (registers x2)
    half: bool = False  # M <= 8: rows 8-15 of the one A fragment are absent (zero registers, no loads)
    wide_regs: bool = False  # __launch_bounds__(threads, 1): registers for one block per SM (no spills at kw=16)
    wn: int = 1  # groups of KW warps per block, each on its own 8 * NB rows, sharing A's K slices through L1
    math: str = ""  # float32 inputs: "tf32" (one TF32 product) or "3xtf32" (split, fp32-level accuracy)

    @property
    def epv(self) -> int:
        """Elements per 16-byte vector (8 16-bit values, 4 floats)."""
        return 16 // self.dtype_in.itemsize

    @property
    def rows(self) -> int:
        """Weight rows per block."""
        return 8 * self.nb * self.wn

    @property
    def threads(self) -> int:
        return 32 * self.kw * self.wn

    @property
    def smem_bytes(self) -> int:
        return 4 * self.kw * self.wn * self.mf * self.nb * 128  # every warp's partial tile, fp32

    def check(self) -> None:
        if self.dtype_in not in (DType.F16, DType.BF16, DType.F32):
            raise UnsupportedConfigError(f"the skinny mma kernel reads 16-bit or float32 inputs, not {self.dtype_in.value}")
        if (self.dtype_in is DType.F32) != (self.math in ("tf32", "3xtf32")):
            raise UnsupportedConfigError(f"math={self.math!r} for {self.dtype_in.value} inputs (float32 takes tf32 or "
                                         "3xtf32, 16-bit inputs none)")
        if not 1 <= self.mf <= MAX_ROWS // 16:
            raise UnsupportedConfigError(f"A fragments mf={self.mf} outside 1..{MAX_ROWS // 16}")
        if self.nb not in (1, 2, 4):
            raise UnsupportedConfigError(f"weight blocks per warp nb={self.nb} not in 1, 2, 4")
        if self.kw not in (2, 4, 8, 16):
            raise UnsupportedConfigError(f"warps per block kw={self.kw} not in 2, 4, 8, 16")
        if self.wn not in (1, 2, 4, 8) or self.kw * self.wn > 16:
            raise UnsupportedConfigError(f"row groups wn={self.wn} not in 1, 2, 4, 8 or kw x wn = {self.kw * self.wn} "
                                         "warps over 16")
        if self.unroll not in (1, 2, 4):
            raise UnsupportedConfigError(f"unroll={self.unroll} not in 1, 2, 4")
        if self.mf * self.nb * self.unroll > 16 or self.mf * self.nb > 8:
            raise UnsupportedConfigError(f"mf={self.mf} x nb={self.nb} x unroll={self.unroll}: too many registers "
                                         "per lane (spills)")
        if self.prefetch and self.mf * self.nb * self.unroll > 8:
            raise UnsupportedConfigError(f"prefetch with mf={self.mf} x nb={self.nb} x unroll={self.unroll}: two "
                                         "chunks of loads take too many registers per lane (spills)")
        if self.half and self.mf != 1:
            raise UnsupportedConfigError("half fragments (M <= 8) need mf=1")


def _loader(spec: SkinnySpec) -> str:
    """``load8_b / load8_a(row, k, K, ok)``: one 16-byte vector of a row (8 16-bit values or 4 floats) as a uint4,
    zero where ``!ok`` or past K; ``nc`` loads of the weight bypass L1 (read once), A loads are cached (every
    warp reads A). Without 16-byte alignment (``vec`` off) element loads packed the same way."""
    tin = ctype(spec.dtype_in)
    if spec.vec:
        return f"""
static __device__ __forceinline__ uint4 load8_b(const {tin}* row, int k, int K, bool ok) {{
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (ok && k < K)
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {{%0,%1,%2,%3}}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(row + k));
    return v;
}}
static __device__ __forceinline__ uint4 load8_a(const {tin}* row, int k, int K, bool ok) {{
    return (ok && k < K) ? __ldg(reinterpret_cast<const uint4*>(row + k)) : make_uint4(0u, 0u, 0u, 0u);
}}
"""
    pack = ("w[i] = __float_as_uint(__ldg(row + k + i))" if spec.dtype_in is DType.F32
            else "w[i >> 1] |= (u32)__ldg(row + k + i) << (16 * (i & 1))")
    return f"""
static __device__ __forceinline__ uint4 load8_any(const {tin}* row, int k, int K, bool ok) {{
    u32 w[4] = {{0u, 0u, 0u, 0u}};
    if (ok) {{
        #pragma unroll
        for (int i = 0; i < {spec.epv}; ++i)
            if (k + i < K) {pack};
    }}
    return make_uint4(w[0], w[1], w[2], w[3]);
}}
#define load8_b load8_any
#define load8_a load8_any
"""


def _chunk_loader(spec: SkinnySpec) -> str:
    """``load_chunk(...)``: the weight and A vectors of chunk ``c`` (zeros where ``!live``). Coalesced: lane
    t's vector u starts at k = CHUNK * c + 4E * u + E * t (E elements per 16-byte vector, CHUNK = 4E * UNROLL),
    so the four lanes of a quad read 64 contiguous bytes of a row per instruction (whole 32-byte sectors, each
    requested once); else at ``E * (UNROLL * t + u)`` (a lane's vectors adjacent, each instruction reading
    half of four sectors)."""
    e = spec.epv
    koff = f"{4 * e} * u + {e} * t" if spec.coalesced else f"{e} * (UNROLL * t + u)"
    tin = ctype(spec.dtype_in)
    return f"""
static __device__ __forceinline__ void load_chunk(uint4 (&bv)[UNROLL][NB], uint4 (&av)[UNROLL][MF][2],
        const {tin}* const (&brow)[NB], const bool (&bok)[NB], const {tin}* const (&arow)[MF][2],
        const bool (&aok)[MF][2], int c, bool live, int K, int t) {{
    #pragma unroll
    for (int u = 0; u < UNROLL; ++u) {{
        const int k = CHUNK * c + {koff};
        #pragma unroll
        for (int j = 0; j < NB; ++j) bv[u][j] = load8_b(brow[j], k, K, live && bok[j]);
        #pragma unroll
        for (int i = 0; i < MF; ++i)
            #pragma unroll
            for (int h = 0; h < 2; ++h) av[u][i][h] = load8_a(arow[i][h], k, K, live && aok[i][h]);
    }}
}}
"""


def _block_head(spec: SkinnySpec) -> str:
    """The block's warp / row coordinates. With one row group (``wn`` = 1) the code of the kernels before
    row groups existed: the general form's index arithmetic cost an H200 8-23% at M = 16 on 8192x8192 and
    13824x5120 weights (x16 @ W8192²: 35.1 -> 43.7 us) with the same config."""
    if spec.wn == 1:
        return ("    extern __shared__ float red[];  // [KW][MF][NB][32 lanes][4]\n"
                "    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
                "    const long long n0 = (long long)blockIdx.x * (8 * NB);")
    return ("    extern __shared__ float red[];  // [WN][KW][MF][NB][32 lanes][4]\n"
            "    // warp (row group ng, K slice warp); the WN warps of one K slice read the same A vectors\n"
            "    const int ng = (threadIdx.x >> 5) / KW, warp = (threadIdx.x >> 5) % KW, lane = threadIdx.x & 31;\n"
            "    const int g = lane >> 2, t = lane & 3;\n"
            "    const long long nblk = (long long)blockIdx.x * (8 * NB * WN), n0 = nblk + 8 * NB * ng;")


def _block_reduce(spec: SkinnySpec) -> str:
    """The partial tiles' store to shared memory and the cross-warp sum up to each output's coordinates
    (``m``, ``n``, the sum ``v``); one row group keeps the pre-row-group code (see :func:`_block_head`)."""
    if spec.wn == 1:
        return ("                red[(((warp * MF + i) * NB + j) * 32 + lane) * 4 + r] = acc[i][j][r];\n"
                "    __syncthreads();\n"
                "    const int tile = MF * NB * 128;\n"
                "    for (int e = threadIdx.x; e < tile; e += 32 * KW) {\n"
                "        float v = 0.0f;\n"
                "        #pragma unroll\n"
                "        for (int w = 0; w < KW; ++w) v += red[w * tile + e];\n"
                "        const int r = e & 3, ln = (e >> 2) & 31, j = (e >> 7) % NB, i = (e >> 7) / NB;\n"
                "        const int m = 16 * i + (ln >> 2) + 8 * (r >> 1);\n"
                "        const long long n = n0 + 8 * j + 2 * (ln & 3) + (r & 1);")
    return ("                red[((((ng * KW + warp) * MF + i) * NB + j) * 32 + lane) * 4 + r] = acc[i][j][r];\n"
            "    __syncthreads();\n"
            "    const int tile = MF * NB * 128;\n"
            "    for (int f = threadIdx.x; f < WN * tile; f += 32 * KW * WN) {\n"
            "        const int gr = f / tile, e = f - gr * tile;\n"
            "        float v = 0.0f;\n"
            "        #pragma unroll\n"
            "        for (int w = 0; w < KW; ++w) v += red[(gr * KW + w) * tile + e];\n"
            "        const int r = e & 3, ln = (e >> 2) & 31, j = (e >> 7) % NB, i = (e >> 7) / NB;\n"
            "        const int m = 16 * i + (ln >> 2) + 8 * (r >> 1);\n"
            "        const long long n = nblk + 8 * NB * gr + 8 * j + 2 * (ln & 3) + (r & 1);")


def _mma(spec: SkinnySpec) -> str:
    """``mma_pair(d, a0, a1, a2, a3, b0, b1)``: one 16-byte vector's k pair(s) of A rows g / g+8 and weight row g
    into the m16n8 accumulator ``d`` -- an m16n8k16 mma on 16-bit inputs, one TF32 m16n8k8 mma on float32 bit
    patterns; for ``3xtf32`` ``split4`` instead (the chunk loop, :func:`_chunk_math`, issues the three mmas)."""
    if spec.dtype_in is not DType.F32:
        kind = "bf16" if spec.dtype_in is DType.BF16 else "f16"
        return f"""
static __device__ __forceinline__ void mma_pair(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, "
                 "{{%8,%9}}, {{%0,%1,%2,%3}};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}}
"""
    if spec.math == "3xtf32":
        return TF32_CORE + TF32_REST + r"""
// x = big + small in TF32 (big: rna rounding; small: the remainder rounded, 0 for non-finite x), and big
// with non-finite values zeroed for the correction products (see tracea_cuda.emit.mma)
static __device__ __forceinline__ void split4(uint4 v, u32 (&big)[4], u32 (&small)[4], u32 (&fin)[4]) {
    const float x[4] = {__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w)};
    #pragma unroll
    for (int e = 0; e < 4; ++e) {
        big[e] = f32_to_tf32(x[e]); small[e] = tf32_rest(x[e], big[e]); fin[e] = tf32_finite(big[e]);
    }
}
"""
    return TF32_CORE + r"""
static __device__ __forceinline__ void mma_pair(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    const u32 a[4] = {f32_to_tf32(__uint_as_float(a0)), f32_to_tf32(__uint_as_float(a1)),
                      f32_to_tf32(__uint_as_float(a2)), f32_to_tf32(__uint_as_float(a3))};
    const u32 b[2] = {f32_to_tf32(__uint_as_float(b0)), f32_to_tf32(__uint_as_float(b1))};
    mma_tf32(d, a, b);
}
"""


def _chunk_math(spec: SkinnySpec) -> str:
    """The mma of one loaded chunk (``av`` / ``bv``) into ``acc``. 3xTF32 splits each vector once (A per
    fragment row, the weight per block row) and accumulates the chunk in a fresh partial tile added to
    ``acc`` with FADD: Tensor Core accumulation truncates, which over a warp's K slice (hundreds of k)
    left 1e-5-4e-5 relative error on an H100 (K = 4096-25088) instead of fp32's ~1e-6."""
    if spec.math != "3xtf32":
        return """        #pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            #pragma unroll
            for (int i = 0; i < MF; ++i)
                #pragma unroll
                for (int j = 0; j < NB; ++j) {
                    mma_pair(acc[i][j], av[u][i][0].x, av[u][i][1].x, av[u][i][0].y, av[u][i][1].y,
                             bv[u][j].x, bv[u][j].y);
                    mma_pair(acc[i][j], av[u][i][0].z, av[u][i][1].z, av[u][i][0].w, av[u][i][1].w,
                             bv[u][j].z, bv[u][j].w);
                }"""
    return """        float part[MF][NB][4];
        #pragma unroll
        for (int i = 0; i < MF; ++i)
            #pragma unroll
            for (int j = 0; j < NB; ++j)
                #pragma unroll
                for (int r = 0; r < 4; ++r) part[i][j][r] = 0.0f;
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            u32 bb[NB][4], bs[NB][4], bf[NB][4];
            #pragma unroll
            for (int j = 0; j < NB; ++j) split4(bv[u][j], bb[j], bs[j], bf[j]);
            #pragma unroll
            for (int i = 0; i < MF; ++i) {
                u32 ab[2][4], as[2][4], af[2][4];  // rows g and g + 8, k0 .. k0 + 3
                split4(av[u][i][0], ab[0], as[0], af[0]);
                split4(av[u][i][1], ab[1], as[1], af[1]);
                #pragma unroll
                for (int j = 0; j < NB; ++j)
                    #pragma unroll
                    for (int p = 0; p < 4; p += 2) {  // k pair (k0, k0 + 1), then (k0 + 2, k0 + 3)
                        const u32 a_s[4] = {as[0][p], as[1][p], as[0][p + 1], as[1][p + 1]};
                        const u32 a_f[4] = {af[0][p], af[1][p], af[0][p + 1], af[1][p + 1]};
                        const u32 a_b[4] = {ab[0][p], ab[1][p], ab[0][p + 1], ab[1][p + 1]};
                        const u32 b_f[2] = {bf[j][p], bf[j][p + 1]}, b_s[2] = {bs[j][p], bs[j][p + 1]};
                        const u32 b_b[2] = {bb[j][p], bb[j][p + 1]};
                        mma_tf32(part[i][j], a_s, b_f);
                        mma_tf32(part[i][j], a_f, b_s);
                        mma_tf32(part[i][j], a_b, b_b);
                    }
            }
        }
        #pragma unroll
        for (int i = 0; i < MF; ++i)
            #pragma unroll
            for (int j = 0; j < NB; ++j)
                #pragma unroll
                for (int r = 0; r < 4; ++r) acc[i][j][r] += part[i][j][r];"""


def render(spec: SkinnySpec, name: str = KERNEL_NAME) -> str:
    """Complete CUDA source of the skinny-GEMM kernel for ``spec``, with entry point ``name``."""
    spec.check()
    tin, tout, tb = ctype(spec.dtype_in), ctype(spec.dtype_out), ctype(spec.bias_dtype)
    return f"""{PRELUDE}
#define MF {spec.mf}
#define NB {spec.nb}
#define KW {spec.kw}
#define WN {spec.wn}
#define UNROLL {spec.unroll}
#define PREFETCH {int(spec.prefetch)}
#define HALF {int(spec.half)}
#define CHUNK {4 * spec.epv * spec.unroll}
{epilogue_function(spec.epilogue, spec.bias_dtype, spec.dtype_out)}
{_loader(spec)}
{_mma(spec)}

{_chunk_loader(spec)}
extern "C" __global__ void __launch_bounds__({"32 * KW" if spec.wn == 1 else "32 * KW * WN"}{", 1" if spec.wide_regs else ""}) {name}(
        const {tin}* __restrict__ A, const {tin}* __restrict__ B, {tout}* __restrict__ C,
        const {tb}* __restrict__ bias, int M, int N, int K) {{
{_block_head(spec)}
    // K in chunks of CHUNK (which k each lane loads: load_chunk); a warp takes a contiguous run of chunks
    const int chunks = (K + CHUNK - 1) / CHUNK;
    const int per = (chunks + KW - 1) / KW;
    const int c_begin = warp * per, c_end = min(chunks, c_begin + per);
    float acc[MF][NB][4];
    #pragma unroll
    for (int i = 0; i < MF; ++i)
        #pragma unroll
        for (int j = 0; j < NB; ++j)
            #pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;
    const {tin}* brow[NB];
    bool bok[NB];
    #pragma unroll
    for (int j = 0; j < NB; ++j) {{
        const long long n = n0 + 8 * j + g;
        bok[j] = n < N;
        brow[j] = B + (bok[j] ? n : 0) * (long long)K;
    }}
    const {tin}* arow[MF][2];
    bool aok[MF][2];
    #pragma unroll
    for (int i = 0; i < MF; ++i)
        #pragma unroll
        for (int h = 0; h < 2; ++h) {{
            const int m = 16 * i + 8 * h + g;
            aok[i][h] = !(HALF && h) && m < M;
            arow[i][h] = A + (long long)(aok[i][h] ? m : 0) * K;
        }}
    uint4 bv[UNROLL][NB], av[UNROLL][MF][2];
#if PREFETCH
    load_chunk(bv, av, brow, bok, arow, aok, c_begin, c_begin < c_end, K, t);
#endif
    for (int c = c_begin; c < c_end; ++c) {{
#if PREFETCH
        // the next chunk's loads go out before this chunk's mma (asm volatile keeps that order)
        uint4 bn[UNROLL][NB], an[UNROLL][MF][2];
        load_chunk(bn, an, brow, bok, arow, aok, c + 1, c + 1 < c_end, K, t);
#else
        load_chunk(bv, av, brow, bok, arow, aok, c, true, K, t);
#endif
{_chunk_math(spec)}
#if PREFETCH
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {{
            #pragma unroll
            for (int j = 0; j < NB; ++j) bv[u][j] = bn[u][j];
            #pragma unroll
            for (int i = 0; i < MF; ++i) {{ av[u][i][0] = an[u][i][0]; av[u][i][1] = an[u][i][1]; }}
        }}
#endif
    }}
    #pragma unroll
    for (int i = 0; i < MF; ++i)
        #pragma unroll
        for (int j = 0; j < NB; ++j)
            #pragma unroll
            for (int r = 0; r < 4; ++r)
{_block_reduce(spec)}
        if (m < M && n < N)
            C[(long long)m * N + n] = {store_expr(spec.dtype_out, "apply_epilogue(v, bias, (int)n)")};
    }}
}}
"""
