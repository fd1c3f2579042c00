"""The skinny GEMM library: ``C = epilogue(A @ W.T)`` for a few rows of A (``M <= 16``) against weights
stored N x K (``nn.Linear`` at decode time), fp32 (any ISA's ``V*`` layer), bf16 (AVX512_BF16) and bf16
widened to fp32 in registers (AVX2, AVX-512 without AVX512_BF16).

These calls are memory-bound: every weight is read once per call and nothing else is large. So nothing is
packed; each output C(i, j) is the dot product of row i of A (small, L1/L2-resident) with weight row j.

* **Split.** The N weight rows are cut into ``T`` contiguous ranges, one per thread, each a multiple of
  ``TS_R`` rows (a static split: each thread's hardware prefetchers see long forward streams, and no
  work-sharing counter is touched). The caller chooses ``T`` (see :mod:`tracea_cpu.skinny`); with
  ``T = 1`` no parallel region is entered at all.
* **Block.** A thread walks its range ``TS_R`` (8) weight rows at a time along k with ``TS_R x mg``
  vector accumulators (``mg <= TS_MG`` rows of A; more rows of A are taken in groups against the same
  weight rows, which are in L1/L2 by then), reduces each accumulator horizontally and adds the k tail
  (fp32: scalar; bf16: masked loads, so any K). Eight side-by-side weight streams keep enough loads in
  flight to reach the memory bandwidth from one core.
* **bf16.** ``vdpbf16ps`` multiplies 32 bf16 pairs of A and W per instruction into 16 fp32 lanes (products
  of two bf16 are exact in fp32); accumulation and the epilogue are fp32; a bf16 output is rounded to
  nearest even (``vcvtneps2bf16``, torch's rounding).
* **Widened bf16** (:data:`WIDEN`, ``ts_bw_*``). A load of 2 x VW bf16 values becomes two fp32 vectors: the
  even-indexed values by a 16-bit left shift of each 32-bit lane, the odd-indexed ones by clearing its low
  16 bits; A and W widened alike pair up, fp32 FMAs accumulate. 8 accumulators on AVX2 (16 registers),
  16 on AVX-512; a zero-padded (AVX2) or masked (AVX-512) tail; bf16 output rounded to nearest even in
  integer ops, NaN kept NaN.
* **Epilogue.** ``tr_epi`` (bias, activations) runs vectorised over each finished chunk of
  ``TS_CH`` outputs of a row while it is in L1.
* **End of the region.** The calling thread spins for the workers (``tr_join``, bounded) instead of
  sleeping in the region's closing barrier: a sleeping master is woken tens of microseconds late on a
  KVM guest (docs/backends/cpu.md, "Threads").

Entry points: ``ts_f32_call(p, a, w, c, bias)``, ``ts_bf16_call`` and ``ts_bw_call`` (same arguments) with
``p = {batch, M, N, K, rsa, sa, ldw, sw, ldc, sc, nth, out_bf16}`` (longs; :data:`SKINNY_PARAMS`).
"""

from __future__ import annotations

from tracea.ir.epilogue import Epilogue

from ..isa import Isa
from .common import epilogue_c, prologue
from .gemv import ROW_EPILOGUE

#: Order of the ``long`` parameters of ``ts_f32_call`` / ``ts_bf16_call``.
SKINNY_PARAMS = ("batch", "M", "N", "K", "rsa", "sa", "ldw", "sw", "ldc", "sc", "nth", "out_bf16")
#: Most rows of A the skinny library serves (the variants decline more).
MAX_M = 16

COMMON = r"""
#ifndef TS_CH
#define TS_CH 256
#endif
#ifndef TS_PF
#define TS_PF 0
#endif
/* Rows of A per tile: 4 (16 / 4 = 4 weight rows per tile) or 2 (8 weight rows, a group of 4 rows runs as
   two tiles over the same, L1-resident, weight rows). */
#ifndef TS_MG
#define TS_MG 4
#endif
/* Weight rows per block: every block keeps 16 vector accumulators (mg rows of A x 16 / mg weight rows). */
#define TS_R 16
/* Row range [*lo, *hi) of thread tid of T over N rows: contiguous, multiples of TS_R but the last. */
static inline void ts_range(long N, int T, int tid, long *lo, long *hi) {
    long blocks = (N + TS_R - 1) / TS_R;
    *lo = TR_MIN(N, blocks * tid / T * TS_R);
    *hi = TR_MIN(N, blocks * (tid + 1) / T * TS_R);
}
""" + ROW_EPILOGUE + r"""#ifdef __AVX512F__
/* s[q] = the sum of the 16 lanes of v[q], q < 16: a shuffle-and-add tree (45 instructions instead of 16
   separate horizontal sums). */
static inline __attribute__((always_inline)) void ts_hsum16(const __m512 *v, float *s) {
    __m512 x[8], t[4];
    for (int i = 0; i < 8; i++)  /* 128-bit lanes: [a0+a2, a1+a3, b0+b2, b1+b3] */
        x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)  /* lanes: [a, b, c, d], four partials each */
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0x88), _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0xDD));
    __m512 u0 = _mm512_add_ps(_mm512_unpacklo_ps(t[0], t[1]), _mm512_unpackhi_ps(t[0], t[1]));
    __m512 u1 = _mm512_add_ps(_mm512_unpacklo_ps(t[2], t[3]), _mm512_unpackhi_ps(t[2], t[3]));
    __m512 w = _mm512_add_ps(_mm512_shuffle_ps(u0, u1, 0x44), _mm512_shuffle_ps(u0, u1, 0xEE));
    /* w[4L + q] is the sum of v[4q + L] */
    const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(s, _mm512_permutexvar_ps(perm, w));
}
#endif
"""

def _rows(name: str, ctype: str, acc: str = "16") -> str:
    """The row-block driver ``ts_<name>_rows`` over the tile kernel ``ts_<name>_tile`` (fp32, bf16 and
    widened bf16 share it: the element type and the tile's accumulator count ``acc``, a C constant,
    differ): C rows i0 .. i0+mg (mg <= 4) at columns j .. j+nr (nr <= 16) of weight rows w + j*ldw, in
    blocks of acc / MG rows; edge rows and a padded A group (mg = 3 runs as 4) repeat the last valid
    pointer and their results are dropped."""
    return f"""static void ts_{name}_rows(long K, const {ctype} *const *ar, int mg, const {ctype} *w, long ldw, float *c,
                            long ldc, long nr) {{
    int MG = mg == 1 ? 1 : mg == 2 ? 2 : 4, R = {acc} / MG;
    const {ctype} *ap[4];
    for (int i = 0; i < MG; i++) ap[i] = ar[TR_MIN(i, mg - 1)];
    float s[{acc}];
    for (long r0 = 0; r0 < nr; r0 += R) {{
        const {ctype} *wr[16];
        for (int r = 0; r < R; r++) wr[r] = w + TR_MIN(r0 + r, nr - 1) * ldw;
        if (MG == 1) ts_{name}_tile(K, ap, wr, s, 1);
        else if (MG == 2) ts_{name}_tile(K, ap, wr, s, 2);
        else ts_{name}_tile(K, ap, wr, s, 4);
        for (int i = 0; i < mg; i++)
            for (int r = 0; r < R && r0 + r < nr; r++) c[i * ldc + r0 + r] = s[i * R + r];
    }}
}}
"""


F32 = r"""
/* s[i*R + r] = dot(ar[i][0:K], wr[r][0:K]) for i < MG, r < R = 16 / MG (compile-time constants). */
static inline __attribute__((always_inline)) void ts_f32_tile(long K, const float *const *ar, const float *const *wr,
                                                             float *s, const int MG) {
    const int R = 16 / MG;
    V acc[16];
    for (int q = 0; q < 16; q++) acc[q] = VZERO();
    long kv = K / VW * VW, k = 0;
    for (; k < kv; k += VW) {
        V av[4];
        for (int i = 0; i < MG; i++) av[i] = VLOAD(ar[i] + k);
        for (int r = 0; r < R; r++) {
            V wv = VLOAD(wr[r] + k);
#if TS_PF
            VPREFETCH(wr[r] + k + TS_PF);
#endif
            for (int i = 0; i < MG; i++) acc[i * R + r] = VFMA(av[i], wv, acc[i * R + r]);
        }
    }
#ifdef __AVX512F__
    if (k < K) {
        __mmask16 mk = (__mmask16)((1u << (K - k)) - 1);
        V av[4];
        for (int i = 0; i < MG; i++) av[i] = _mm512_maskz_loadu_ps(mk, ar[i] + k);
        for (int r = 0; r < R; r++) {
            V wv = _mm512_maskz_loadu_ps(mk, wr[r] + k);
            for (int i = 0; i < MG; i++) acc[i * R + r] = VFMA(av[i], wv, acc[i * R + r]);
        }
    }
    ts_hsum16(acc, s);
#else
    for (int i = 0; i < MG; i++)
        for (int r = 0; r < R; r++) {
            float x = VHSUM(acc[i * R + r]);
            for (long t = kv; t < K; t++) x += ar[i][t] * wr[r][t];
            s[i * R + r] = x;
        }
#endif
}

""" + _rows("f32", "float") + r"""
/* One thread's rows [lo, hi) of one batch entry. */
static void ts_f32_part(long M, long K, const float *const *ar, const float *w, long ldw, float *c, long ldc,
                        const float *bias, long lo, long hi) {
    for (long j0 = lo; j0 < hi; j0 += TS_CH) {
        long j1 = TR_MIN(hi, j0 + TS_CH);
        for (long j = j0; j < j1; j += TS_R)
            for (long i = 0; i < M; i += TS_MG)
                ts_f32_rows(K, ar + i, (int)TR_MIN(TS_MG, M - i), w + j * ldw, ldw, c + i * ldc + j, ldc,
                            TR_MIN(TS_R, j1 - j));
        for (long i = 0; i < M; i++) tr_gv_epi(c + i * ldc + j0, j1 - j0, bias ? bias + j0 : 0);
    }
}

int ts_f32(long batch, long M, long N, long K, const float *a, long rsa, long sa, const float *w, long ldw,
           long sw, float *c, long ldc, long sc, const float *bias, int nth) {
    if (M > 64 || M < 1) return 2;
    long t_call = tr_now_ns();
    int T = nth > 1 && N >= 2 * TS_R ? nth : 1;
    for (long q = 0; q < batch; q++) {
        const float *ar[64];
        for (long i = 0; i < M; i++) ar[i] = a + q * sa + i * rsa;
        const float *wq = w + q * sw;
        float *cq = c + q * sc;
        if (T == 1) { ts_f32_part(M, K, ar, wq, ldw, cq, ldc, bias, 0, N); continue; }
        int done = 0;
        #pragma omp parallel num_threads(T)
        {
            int tid = TR_TID(), nt = TR_NT();
            long lo, hi;
            ts_range(N, nt, tid, &lo, &hi);
            ts_f32_part(M, K, ar, wq, ldw, cq, ldc, bias, lo, hi);
            tr_join(&done, nt, tid, t_call);
        }
    }
    return 0;
}

int ts_f32_call(const long *p, const float *a, const float *w, float *c, const float *bias) {
    return ts_f32(p[0], p[1], p[2], p[3], a, p[4], p[5], w, p[6], p[7], c, p[8], p[9], bias, (int)p[10]);
}
"""

BF16 = r"""
#define TS_BLOADN(p, n) _mm512_maskz_loadu_epi16((__mmask32)(0xffffffffu >> (32 - (n))), (const void *)(p))

/* As ts_f32_tile, bf16 operands: 32 k values per vdpbf16ps, a masked tail (any K). */
static inline __attribute__((always_inline)) void ts_bf16_tile(long K, const bf16 *const *ar, const bf16 *const *wr,
                                                              float *s, const int MG) {
    const int R = 16 / MG;
    __m512 acc[16];
    for (int q = 0; q < 16; q++) acc[q] = _mm512_setzero_ps();
    long kv = K / 32 * 32, k = 0;
    for (; k < kv; k += 32) {
        __m512i av[4];
        for (int i = 0; i < MG; i++) av[i] = _mm512_loadu_si512((const void *)(ar[i] + k));
        for (int r = 0; r < R; r++) {
            __m512i wv = _mm512_loadu_si512((const void *)(wr[r] + k));
            for (int i = 0; i < MG; i++) acc[i * R + r] = _mm512_dpbf16_ps(acc[i * R + r], (__m512bh)wv, (__m512bh)av[i]);
        }
    }
    if (k < K) {
        int n = (int)(K - k);
        __m512i av[4];
        for (int i = 0; i < MG; i++) av[i] = TS_BLOADN(ar[i] + k, n);
        for (int r = 0; r < R; r++) {
            __m512i wv = TS_BLOADN(wr[r] + k, n);
            for (int i = 0; i < MG; i++) acc[i * R + r] = _mm512_dpbf16_ps(acc[i * R + r], (__m512bh)wv, (__m512bh)av[i]);
        }
    }
    ts_hsum16(acc, s);
}

/* o[0:n] = row[0:n] rounded to bf16, nearest even (vcvtneps2bf16). */
static inline void ts_bf16_store(const float *row, bf16 *o, long n) {
    long j = 0;
    for (; j + 16 <= n; j += 16)
        _mm256_storeu_si256((__m256i *)(o + j), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(row + j)));
    if (j < n) {
        __mmask16 mk = (__mmask16)((1u << (n - j)) - 1);
        _mm256_mask_storeu_epi16(o + j, mk, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, row + j)));
    }
}

""" + _rows("bf16", "bf16")

#: bf16 on the plain ISA layers (AVX2, AVX-512 without AVX512_BF16): operands widened to fp32 in registers.
WIDEN = r"""
/* A vector load of 2*VW bf16 values widens into two fp32 vectors without a shuffle: shifting each 32-bit
   lane left by 16 gives the even-indexed values, clearing its low 16 bits the odd-indexed ones. A dot
   product does not care in which order its terms are summed, so A and W widened alike pair up. */
#ifdef __AVX512F__
typedef __m512i TW;
#define TW_LOAD(p) _mm512_loadu_si512((const void *)(p))
#define TW_LOADN(p, n) _mm512_maskz_loadu_epi16((__mmask32)(0xffffffffu >> (32 - (n))), (const void *)(p))
#define TW_EVEN(x) _mm512_castsi512_ps(_mm512_slli_epi32((x), 16))
#define TW_ODD(x, hi) _mm512_castsi512_ps(_mm512_and_si512((x), (hi)))
#define TW_HI() _mm512_set1_epi32((int)0xffff0000u)
/* 16 accumulators (ts_hsum16); 16 + the widened vectors of one operand + 3 fit the 32 registers */
#define TS_BW_ACC 16
#else
typedef __m256i TW;
#define TW_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
/* the last n < 16 values of a row through a zero-padded copy (AVX2 has no 16-bit masked load) */
static inline TW tw_loadn(const bf16 *p, int n) {
    bf16 t[16] = {0};
    memcpy(t, p, sizeof(bf16) * (size_t)n);
    return TW_LOAD(t);
}
#define TW_LOADN(p, n) tw_loadn((p), (n))
#define TW_EVEN(x) _mm256_castsi256_ps(_mm256_slli_epi32((x), 16))
#define TW_ODD(x, hi) _mm256_castsi256_ps(_mm256_and_si256((x), (hi)))
#define TW_HI() _mm256_set1_epi32((int)0xffff0000u)
/* 8 accumulators: with the widened vectors of one operand (2 per row), one more pair and the mask they
   fill the 16 registers (16 accumulators, as fp32 uses, spilled) */
#define TS_BW_ACC 8
#endif

/* acc[i*R + r] += A row i . W row r over k .. k + 2*VW (n == 0) or the first n of them (a tail); MG, R
   compile-time constants. The operand with fewer rows is widened first and kept in registers, the other
   is widened one row at a time. */
static inline __attribute__((always_inline)) void ts_bw_step(const bf16 *const *ar, const bf16 *const *wr, long k,
                                                            int n, V *acc, const int MG, const int R) {
    const TW hi = TW_HI();
    if (MG <= R) {
        V ae[4], ao[4];
        for (int i = 0; i < MG; i++) {
            TW x = n ? TW_LOADN(ar[i] + k, n) : TW_LOAD(ar[i] + k);
            ae[i] = TW_EVEN(x);
            ao[i] = TW_ODD(x, hi);
        }
        for (int r = 0; r < R; r++) {
            TW x = n ? TW_LOADN(wr[r] + k, n) : TW_LOAD(wr[r] + k);
            V we = TW_EVEN(x), wo = TW_ODD(x, hi);
            for (int i = 0; i < MG; i++) {
                acc[i * R + r] = VFMA(ae[i], we, acc[i * R + r]);
                acc[i * R + r] = VFMA(ao[i], wo, acc[i * R + r]);
            }
        }
    } else {
        V we[16], wo[16];
        for (int r = 0; r < R; r++) {
            TW x = n ? TW_LOADN(wr[r] + k, n) : TW_LOAD(wr[r] + k);
            we[r] = TW_EVEN(x);
            wo[r] = TW_ODD(x, hi);
        }
        for (int i = 0; i < MG; i++) {
            TW x = n ? TW_LOADN(ar[i] + k, n) : TW_LOAD(ar[i] + k);
            V ae = TW_EVEN(x), ao = TW_ODD(x, hi);
            for (int r = 0; r < R; r++) {
                acc[i * R + r] = VFMA(ae, we[r], acc[i * R + r]);
                acc[i * R + r] = VFMA(ao, wo[r], acc[i * R + r]);
            }
        }
    }
}

/* s[i*R + r] = dot(ar[i][0:K], wr[r][0:K]) for i < MG, r < R = TS_BW_ACC / MG: 2*VW k values per step, a
   zero-padded tail (any K). */
static inline __attribute__((always_inline)) void ts_bw_tile(long K, const bf16 *const *ar, const bf16 *const *wr,
                                                            float *s, const int MG) {
    const int R = TS_BW_ACC / MG;
    V acc[TS_BW_ACC];
    for (int q = 0; q < TS_BW_ACC; q++) acc[q] = VZERO();
    long kv = K / (2 * VW) * (2 * VW), k = 0;
    for (; k < kv; k += 2 * VW) ts_bw_step(ar, wr, k, 0, acc, MG, R);
    if (k < K) ts_bw_step(ar, wr, k, (int)(K - k), acc, MG, R);
#if TS_BW_ACC == 16
    ts_hsum16(acc, s);
#else
    for (int q = 0; q < TS_BW_ACC; q++) s[q] = VHSUM(acc[q]);
#endif
}

/* fp32 -> bf16, round to nearest even; NaN -> 0x7FC0 (as torch's c10::BFloat16 rounds). */
static inline uint16_t ts_bf16_rne(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if (x != x) return 0x7FC0;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* o[0:n] = row[0:n] rounded to bf16 as ts_bf16_rne, a vector at a time. */
static inline void ts_bw_store(const float *row, bf16 *o, long n) {
    long j = 0;
#ifdef __AVX512F__
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7FFF), qnan = _mm512_set1_epi32(0x7FC00000);
    for (; j + 16 <= n; j += 16) {
        __m512 x = _mm512_loadu_ps(row + j);
        __m512i u = _mm512_castps_si512(x);
        __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
        r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, qnan);
        _mm256_storeu_si256((__m256i *)(o + j), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
#else
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7FFF), qnan = _mm256_set1_epi32(0x7FC00000);
    for (; j + 8 <= n; j += 8) {
        __m256 x = _mm256_loadu_ps(row + j);
        __m256i u = _mm256_castps_si256(x);
        __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(half, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
        r = _mm256_blendv_epi8(r, qnan, _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
        r = _mm256_srli_epi32(r, 16);  /* <= 0xFFFF: packus keeps every value */
        _mm_storeu_si128((__m128i *)(o + j), _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
    }
#endif
    for (; j < n; j++) o[j] = ts_bf16_rne(row[j]);
}

""" + _rows("bw", "bf16", "TS_BW_ACC")


def _bf16_driver(name: str) -> str:
    """The bf16 part / entry functions ``ts_<name>_part``, ``ts_<name>``, ``ts_<name>_call`` over the row
    driver ``ts_<name>_rows`` and the bf16 row store ``ts_<name>_store`` (vdpbf16ps and widened bf16 share
    them)."""
    return r"""
/* One thread's rows [lo, hi): fp32 sums of a chunk of TS_CH rows into cb (16 x TS_CH, L1), the epilogue,
   then stored as fp32 or rounded to bf16. */
static void ts_NAME_part(long M, long K, const bf16 *const *ar, const bf16 *w, long ldw, void *c, long ldc,
                         int out_bf16, const float *bias, long lo, long hi) {
    float cb[16 * TS_CH] __attribute__((aligned(64)));
    for (long j0 = lo; j0 < hi; j0 += TS_CH) {
        long j1 = TR_MIN(hi, j0 + TS_CH), n = j1 - j0;
        for (long mi = 0; mi < M; mi += 16) {
            long mm = TR_MIN(16, M - mi);
            for (long j = j0; j < j1; j += TS_R)
                for (long i = 0; i < mm; i += TS_MG)
                    ts_NAME_rows(K, ar + mi + i, (int)TR_MIN(TS_MG, mm - i), w + j * ldw, ldw, cb + i * TS_CH + (j - j0),
                                 TS_CH, TR_MIN(TS_R, j1 - j));
            for (long i = 0; i < mm; i++) {
                float *row = cb + i * TS_CH;
                tr_gv_epi(row, n, bias ? bias + j0 : 0);
                if (out_bf16) ts_NAME_store(row, (bf16 *)c + (mi + i) * ldc + j0, n);
                else memcpy((float *)c + (mi + i) * ldc + j0, row, sizeof(float) * n);
            }
        }
    }
}

int ts_NAME(long batch, long M, long N, long K, const bf16 *a, long rsa, long sa, const bf16 *w, long ldw,
            long sw, void *c, long ldc, long sc, const float *bias, int nth, int out_bf16) {
    if (M > 64 || M < 1) return 2;
    long t_call = tr_now_ns();
    int T = nth > 1 && N >= 2 * TS_R ? nth : 1;
    long esz = out_bf16 ? 2 : 4;
    for (long q = 0; q < batch; q++) {
        const bf16 *ar[64];
        for (long i = 0; i < M; i++) ar[i] = a + q * sa + i * rsa;
        const bf16 *wq = w + q * sw;
        void *cq = (char *)c + q * sc * esz;
        if (T == 1) { ts_NAME_part(M, K, ar, wq, ldw, cq, ldc, out_bf16, bias, 0, N); continue; }
        int done = 0;
        #pragma omp parallel num_threads(T)
        {
            int tid = TR_TID(), nt = TR_NT();
            long lo, hi;
            ts_range(N, nt, tid, &lo, &hi);
            ts_NAME_part(M, K, ar, wq, ldw, cq, ldc, out_bf16, bias, lo, hi);
            tr_join(&done, nt, tid, t_call);
        }
    }
    return 0;
}

int ts_NAME_call(const long *p, const bf16 *a, const bf16 *w, void *c, const float *bias) {
    return ts_NAME(p[0], p[1], p[2], p[3], a, p[4], p[5], w, p[6], p[7], c, p[8], p[9], bias, (int)p[10], (int)p[11]);
}
""".replace("NAME", name)


def skinny_source(isa: Isa, epilogue: Epilogue, bf16: bool, widen: bool = False) -> str:
    """C source of the skinny library for ``isa`` and one epilogue chain: fp32 always; the bf16 entry
    points ``ts_bf16_*`` when ``bf16`` (the ISA must then be AVX-512 compiled with AVX512_BF16); the widened
    bf16 entry points ``ts_bw_*`` when ``widen`` (AVX2 or AVX-512)."""
    parts = [prologue(isa), epilogue_c(epilogue), COMMON, F32]
    if bf16 or widen:
        parts.append("typedef uint16_t bf16;\n")
    if bf16:
        parts += [BF16, _bf16_driver("bf16")]
    if widen:
        parts += [WIDEN, _bf16_driver("bw")]
    return "\n".join(parts)
