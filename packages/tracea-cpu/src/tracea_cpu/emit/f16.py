"""fp16 GEMM (``tr_gemm_f16``): fp16 A and B converted to fp32 while they are packed, the fp32 blocked
driver and micro-kernel of :mod:`.blocked` (fp32 products and accumulation: PyTorch's CPU fp16 matmul has
the same accuracy class), the fp32 epilogue, and an fp32 or fp16 (round to nearest even) output.

Why not AVX512_FP16 arithmetic: its FMAs (``vfmadd*ph``) round every product and partial sum to fp16
(11-bit significands), and it has no fp16 x fp16 -> fp32 dot product like AVX512_BF16's ``vdpbf16ps``
(AMX-FP16 has one; this development CPU lacks it). The fp16 -> fp32 conversions are F16C / AVX-512
instructions, so the same library serves every x86 CPU with F16C (AVX2 and AVX-512 builds).
"""

from __future__ import annotations

from tracea.ir.epilogue import Epilogue

from ..isa import Isa
from .bf16_cast import BF16_RNE
from .blocked import blocked_source

F16 = r"""
typedef struct { const uint16_t *p; long rs, cs; } tr_dense16;
static inline float tr_h2f(uint16_t h) { return _cvtsh_ss(h); }

/* tr_pack_a_dense of an fp16 matrix, converting. */
static void tr_pack_a_f16(const void *vctx, long i0, long mr, long p0, long kc, float *dst) {
    const tr_dense16 *x = (const tr_dense16 *)vctx;
    long kcp = TR_ROUNDUP(kc, KU);
    for (long t = 0; t < kcp; t += KU)
        for (int i = 0; i < MR; i++) {
            float *d = dst + t * MR + i * KU;
            for (int u = 0; u < KU; u++) {
                long k = t + u;
                d[u] = (i < mr && k < kc) ? tr_h2f(x->p[(i0 + i) * x->rs + (p0 + k) * x->cs]) : 0.0f;
            }
        }
}

/* tr_pack_b_dense of an fp16 matrix, converting (row-major rows a vector at a time). */
static void tr_pack_b_f16(const void *vctx, long j0, long nr, long p0, long kc, float *dst) {
    const tr_dense16 *x = (const tr_dense16 *)vctx;
    long kcp = TR_ROUNDUP(kc, KU);
    if (nr < NR || kc < kcp) memset(dst, 0, sizeof(float) * kcp * NR);
    if (x->cs == 1) {
        for (long k = 0; k < kc; k++) {
            const uint16_t *s = x->p + (p0 + k) * x->rs + j0;
            float *d = dst + k * NR;
            long j = 0;
#if defined(__AVX512F__)
            for (; j + 16 <= nr; j += 16) _mm512_storeu_ps(d + j, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + j))));
#elif defined(__F16C__)
            for (; j + 8 <= nr; j += 8) _mm256_storeu_ps(d + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + j))));
#endif
            for (; j < nr; j++) d[j] = tr_h2f(s[j]);
        }
    } else {
        for (long j = 0; j < nr; j++) {
            const uint16_t *s = x->p + (j0 + j) * x->cs + p0 * x->rs;
            for (long k = 0; k < kc; k++) dst[k * NR + j] = tr_h2f(s[k * x->rs]);
        }
    }
}

/* n fp32 values -> fp16, round to nearest even (NaN stays NaN, overflow gives Inf). */
static void tr_f2h_run(const float *src, uint16_t *dst, long n) {
    long i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; i++) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* batch x (M x K) @ (K x N): element (i, k) of A at a[q*M*K + i*rsa + k*csa], (k, j) of B at
   b[q*K*N + k*rsb + j*csb]; out row-major, fp32 or (out_f16) fp16; bias fp32 or null. 0, or 1 (allocation). */
int tr_gemm_f16(long batch, long M, long N, long K, const uint16_t *a, long rsa, long csa, const uint16_t *b,
                long rsb, long csb, void *out, int out_f16, const float *bias, long mc, long nc, long kc, int nth) {
    int owned = 0, T = nth > 0 ? nth : tr_threads_available();
    float *c32 = 0;
    if (out_f16) {
        c32 = tr_ws_slot(1, (size_t)M * N, &owned);
        if (!c32) return 1;
    }
    int rc = 0;
    for (long q = 0; q < batch && !rc; q++) {
        tr_dense16 A = {a + q * M * K, rsa, csa}, B = {b + q * K * N, rsb, csb};
        float *c = out_f16 ? c32 : (float *)out + q * M * N;
        rc = tr_drive(M, N, K, tr_pack_a_f16, &A, tr_pack_b_f16, &B, c, N, 0, 0, bias, 0, mc, nc, kc, nth, 0, 0);
        if (!rc && out_f16) {
            uint16_t *o = (uint16_t *)out + q * M * N;
            long chunk = 4096, nchunk = (M * N + chunk - 1) / chunk;
            #pragma omp parallel for schedule(static) num_threads(T) if (T > 1 && M * N >= 65536)
            for (long ci = 0; ci < nchunk; ci++)
                tr_f2h_run(c32 + ci * chunk, o + ci * chunk, TR_MIN(chunk, M * N - ci * chunk));
        }
    }
    if (c32) tr_ws_release(1, c32, owned);
    return rc;
}
"""


#: The bf16 flavour of :data:`F16` (``tr_gemm_bf16c``): bf16 -> fp32 is exact (the 16 bits become the top half
#: of the fp32 word: a zero-extension and a shift, any x86 ISA); fp32 -> bf16 rounds to nearest even with NaN
#: kept quiet (torch's rounding). For CPUs without AVX512_BF16 / AMX, where PyTorch's bf16 matmul is slow
#: (2-core AMD Zen 3 VM, AVX2: 15-20 GFLOP/s against ~110 in fp32).
BF16C = (F16
         .replace("static inline float tr_h2f(uint16_t h) { return _cvtsh_ss(h); }",
                  "static inline float tr_h2f(uint16_t h) { union { uint32_t u; float f; } v; v.u = (uint32_t)h << 16; "
                  "return v.f; }")
         .replace("_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + j)))",
                  "_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256("
                  "(const __m256i *)(s + j))), 16))")
         .replace("#elif defined(__F16C__)\n            for (; j + 8 <= nr; j += 8) _mm256_storeu_ps(d + j, "
                  "_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + j))));",
                  "#elif defined(__AVX2__)\n            for (; j + 8 <= nr; j += 8) _mm256_storeu_ps(d + j, "
                  "_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128("
                  "(const __m128i *)(s + j))), 16)));")
         .replace("tr_pack_a_f16", "tr_pack_a_bf16c").replace("tr_pack_b_f16", "tr_pack_b_bf16c")
         .replace("tr_gemm_f16", "tr_gemm_bf16c").replace("out_f16", "out_b16").replace("an fp16", "a bf16").replace("fp16", "bf16"))
# B stored N x K (``x @ W.T``, every nn.Linear): columns of the packed panel are rows of W. Eight of them at
# a time are widened and transposed in registers (8 x 8 fp32) instead of one scalar per element: 2-core Zen 3
# VM, bf16 32 / 128 x 4096 x 4096 (weight-packing bound) 26.9 / 62.1 -> 55 / 121 GFLOP/s
# (bench_user_cpu.py --only bf16); the fp16 library takes the same path with F16C conversions.
_SCALAR_COLS = """    } else {
        for (long j = 0; j < nr; j++) {
            const uint16_t *s = x->p + (j0 + j) * x->cs + p0 * x->rs;
            for (long k = 0; k < kc; k++) dst[k * NR + j] = tr_h2f(s[k * x->rs]);
        }
    }"""
_VECTOR_COLS = """    } else {
        long j = 0;
#if defined(__AVX2__)
        if (x->rs == 1) {
            for (; j + 8 <= nr; j += 8) {
                const uint16_t *s = x->p + (j0 + j) * x->cs + p0;
                long k = 0;
                for (; k + 8 <= kc; k += 8) {
                    __m256 r[8];
                    for (int u = 0; u < 8; u++) r[u] = tr_b8(s + u * x->cs + k);
                    tr_t8x8(r);
                    for (int u = 0; u < 8; u++) _mm256_storeu_ps(dst + (k + u) * NR + j, r[u]);
                }
                for (; k < kc; k++)
                    for (int u = 0; u < 8; u++) dst[k * NR + j + u] = tr_h2f(s[u * x->cs + k]);
            }
        }
#endif
        for (; j < nr; j++) {
            const uint16_t *s = x->p + (j0 + j) * x->cs + p0 * x->rs;
            for (long k = 0; k < kc; k++) dst[k * NR + j] = tr_h2f(s[k * x->rs]);
        }
    }"""
_HELPERS = """#if defined(__AVX2__)
/* 8 bf16 -> 8 fp32 (exact). */
static inline __m256 tr_b8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
/* In-register transpose of 8 rows of 8 fp32. */
static inline void tr_t8x8(__m256 *r) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20); r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20); r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31); r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31); r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}
#endif

"""
assert _SCALAR_COLS in BF16C
BF16C = BF16C.replace(_SCALAR_COLS, _VECTOR_COLS)
_AT = BF16C.index("/* tr_pack_a_dense of a bf16 matrix")
BF16C = BF16C[:_AT] + _HELPERS + BF16C[_AT:]
_HELPERS_F16 = (_HELPERS.replace("#if defined(__AVX2__)", "#if defined(__AVX2__) && defined(__F16C__)")
                .replace("/* 8 bf16 -> 8 fp32 (exact). */", "/* 8 fp16 -> 8 fp32 (exact). */")
                .replace("_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16))",
                         "_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p))"))
assert "cvtph" in _HELPERS_F16
#: :data:`F16` with B stored N x K widened and transposed 8 x 8 in registers (F16C), as the bf16 flavour.
F16V = F16.replace(_SCALAR_COLS, _VECTOR_COLS.replace("#if defined(__AVX2__)", "#if defined(__AVX2__) && defined(__F16C__)"))
_AT16 = F16V.index("/* tr_pack_a_dense of an fp16 matrix")
F16V = F16V[:_AT16] + _HELPERS_F16 + F16V[_AT16:]
_F2H_START = BF16C.index("/* n fp32 values -> bf16")
_F2H_END = BF16C.index("/* batch x (M x K)")
BF16C = BF16C[:_F2H_START] + BF16_RNE + r"""
/* n fp32 values -> bf16 (tr_f2bf: nearest even, NaN kept). */
static void tr_f2h_run(const float *src, uint16_t *dst, long n) {
    for (long i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, src + i, 4);
        dst[i] = tr_f2bf(u);
    }
}

""" + BF16C[_F2H_END:]


def bf16c_gemm_source(isa: Isa, mr: int, nr: int, epilogue: Epilogue) -> str:
    """Complete C source of the converting bf16 GEMM library (``tr_gemm_bf16c``): the blocked fp32 library of
    ``isa`` plus packers that widen bf16 to fp32 and an fp32 -> bf16 (nearest even) output pass."""
    return blocked_source(isa, mr, nr, epilogue) + BF16C


def f16_gemm_source(isa: Isa, mr: int, nr: int, epilogue: Epilogue) -> str:
    """Complete C source of the fp16 GEMM library: the blocked fp32 library of ``isa`` (one register tile,
    one epilogue chain) plus the converting packers and ``tr_gemm_f16``."""
    return blocked_source(isa, mr, nr, epilogue) + F16V
