"""fp16 GEMM on AMX-BF16 tiles with fp32 accuracy (``tf_gemm_split``), appended to the AMX bf16 GEMM
library (:mod:`.amx`).

Every fp16 value is the exact sum of two bf16 values: ``hi = bf16(x)`` (round to nearest even) and
``lo = bf16(x - hi)``. x has 11 significant bits, hi 8, so ``x - hi`` (a multiple of x's fp16 ulp, at most
half of hi's bf16 ulp) needs at most 3 and is exact in bf16; fp16's range, subnormals included, lies well
inside bf16's. With ``A' = [Ah Ah Al Al]`` (M x 4K) and ``B' = [Bh; Bl; Bh; Bl]`` (4K x N)::

    A' B' = Ah Bh + Ah Bl + Al Bh + Al Bl = A B

and each ``tdpbf16ps`` product of two bf16 values is exact in fp32, so the only rounding is the fp32
accumulation -- the accuracy class of fp16 GEMMs that convert to fp32 (PyTorch on CPUs), at four times
the AMX work, which AMX has to spare against fp32 FMAs (~2.5 against ~0.16 TFLOP/s per core on the
development Xeon).

NaN and Inf: a non-finite x keeps ``hi = x`` only in the ``Ah Bh`` block and is 0 in its other copies
and its ``lo``: otherwise ``Inf * 0`` against a zero ``lo`` of the other operand would make NaN where the
reference has Inf. ``Ah Bh`` alone then gives what the reference gives (``bf16(b)`` is 0 exactly when b
is, and has b's sign).
"""

from __future__ import annotations

SPLIT = r"""
/* Element (r, c) of an R x C fp16 matrix (src[r*rs + c*cs]) -> hi at dst[r*ld + c + h0], dst[r*ld + c + h1]
   and lo at dst[r*ld + c + l0], dst[r*ld + c + l1] (bf16); a NaN or Inf only at h0 (0 at the others). */
static void tf_split(long R, long C, const uint16_t *src, long rs, long cs, bf16 *dst, long ld,
                     long h0, long h1, long l0, long l1, int nth) {
    #pragma omp parallel for schedule(static) num_threads(nth) if (nth > 1 && R * C >= 65536)
    for (long r = 0; r < R; r++) {
        bf16 *d = dst + r * ld;
        for (long c = 0; c < C; c += 16) {
            long n = TR_MIN(16, C - c);
            __mmask16 m = (__mmask16)(n == 16 ? 0xffff : (1u << n) - 1);
            __m256i raw;
            if (cs == 1) {
                raw = _mm256_maskz_loadu_epi16(m, src + r * rs + c);
            } else {
                uint16_t t[16] = {0};
                for (long u = 0; u < n; u++) t[u] = src[r * rs + (c + u) * cs];
                raw = _mm256_loadu_si256((const __m256i *)t);
            }
            __m512 x = _mm512_cvtph_ps(raw);
            __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
            __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
            __mmask16 fin = _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(INFINITY), _CMP_LT_OQ);
            __m256i l = _mm256_maskz_mov_epi16(fin, (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(x, hf)));
            _mm256_mask_storeu_epi16(d + c + h0, m, h);
            _mm256_mask_storeu_epi16(d + c + h1, m, _mm256_maskz_mov_epi16(fin, h));
            _mm256_mask_storeu_epi16(d + c + l0, m, l);
            _mm256_mask_storeu_epi16(d + c + l1, m, l);
        }
    }
}

/* p: batch, M, N, K, rsa, csa, rsb, csb, out_f16, mc, nc, kc (A element (i, k) at a[q*M*K + i*rsa + k*csa],
   B element (k, j) at b[q*K*N + k*rsb + j*csb]); out row-major fp32 or fp16. 0, or 1 (allocation). */
int tf_gemm_split(const long *p, const uint16_t *a, const uint16_t *b, void *out, const float *bias, int nth) {
    long batch = p[0], M = p[1], N = p[2], K = p[3], K4 = 4 * K;
    int out_f16 = (int)p[8], T = nth > 0 ? nth : tr_threads_available(), owned;
    size_t aw = TR_ROUNDUP((size_t)M * K4, 32), bw = TR_ROUNDUP((size_t)K4 * N, 32);
    size_t cw = out_f16 ? (size_t)M * N * 2 : 0;  /* bf16 units */
    bf16 *ws = (bf16 *)tr_ws_slot(2, (aw + bw + cw + 64) / 2, &owned);
    if (!ws) return 1;
    bf16 *ap = ws, *bp = ws + aw;
    float *c32 = (float *)(ws + aw + bw);
    int rc = 0;
    for (long q = 0; q < batch && !rc; q++) {
        tf_split(M, K, a + q * M * K, p[4], p[5], ap, K4, 0, K, 2 * K, 3 * K, T);
        /* B' rows: [Bh; Bl; Bh; Bl]: row k of B goes to rows k, K + k, 2K + k, 3K + k */
        tf_split(K, N, b + q * K * N, p[6], p[7], bp, N, 0, 2 * K * N, K * N, 3 * K * N, T);
        float *c = out_f16 ? c32 : (float *)out + q * M * N;
        rc = tb_gemm(1, M, N, K4, ap, K4, 1, 0, bp, N, 1, 0, c, N, 0, 0, bias, p[9], p[10], p[11], nth);
        if (!rc && out_f16) {
            uint16_t *o = (uint16_t *)out + q * M * N;
            long total = M * N;
            #pragma omp parallel for schedule(static) num_threads(T) if (T > 1 && total >= 65536)
            for (long i = 0; i < total; i += 16) {
                long n = TR_MIN(16, total - i);
                __mmask16 m = (__mmask16)(n == 16 ? 0xffff : (1u << n) - 1);
                __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, c32 + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                _mm256_mask_storeu_epi16(o + i, m, h);
            }
        }
    }
    tr_ws_release(2, (float *)ws, owned);
    return rc;
}
"""
