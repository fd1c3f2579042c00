"""The packing-free drivers of the fp32 GEMM for a few rows of A (``nn.Linear`` decode shapes).

GEMV (columns of B contiguous along k: weights stored N x K, ``trans_b=True``, or a single column):
every output C(i, j) is the dot product of row i of A with column j of B. Each thread takes chunks of
B columns (weight rows), walks ``TR_GV_R`` (8) of them at a time along k with ``TR_GV_R x mg`` vector
accumulators (``mg <= 4`` rows of A, which stay in L1), reduces each accumulator horizontally at the
end and adds the scalar k tail. With more than four rows the same ``TR_GV_R`` weight rows (a few tens
of KiB, L2-resident) are reused for each group of four, so the weights stream from memory once.

axpy (B stored K x N, ``trans_b=False``, M <= 4): each thread takes a chunk of up to ``TR_AX_CW``
columns, keeps those C rows in L1 and adds ``TR_AX_KG`` (8) rows of B at a time (side-by-side streams).

Both read B exactly once and write nothing but C; the epilogue runs vectorised over each finished
chunk of C.
"""

from __future__ import annotations

from ..isa import Isa

# tr_gemm takes the GEMV driver for M <= rows when K >= k, for any (rows, k) here. Measured against the
# blocked drivers (N = 4096, ms, GEMV vs blocked): K = 4096: M = 48 / 64 8.8 / 11.1 vs 12.8 / 15.6;
# K = 1024: M = 64 3.21 vs 3.47; K = 512: M = 32 0.79 vs 0.95, M = 64 1.59 vs 1.51; K = 256: M = 8
# 0.12 vs 0.19, M = 16 0.26 vs 0.27, M = 32 0.46 vs 0.41; K = 64: slower from M = 8 on.
GEMV_TIERS = ((4, 1), (16, 256), (64, 1024))
# B stored K x N: the axpy driver for M <= AXPY_MAXM, columns in chunks of at most AXPY_CW, AXPY_KG rows
# of B at a time (4096 x 4096, M = 1 / 4, ms: KG = 2 2.60 / 3.27, 4 2.13 / 2.46, 8 1.86 / 2.00, 16 2.16 / 2.36).
AXPY_MAXM = 4
AXPY_CW = 2048
AXPY_KG = 8

#: ``tr_gv_epi``: the epilogue chain over one output row segment (the GEMV and the skinny library share it)
ROW_EPILOGUE = r"""
/* The epilogue chain over c[0:n] (bias: the matching n bias values or null). */
static void tr_gv_epi(float *c, long n, const float *bias) {
#if TR_HAS_EPI
    long j = 0;
    for (; j + VW <= n; j += VW) VSTORE(c + j, tr_epi(VLOAD(c + j), bias ? VLOAD(bias + j) : VZERO()));
    if (j < n) {
        float t[VW], tb[VW];
        for (int q = 0; q < VW; q++) { t[q] = j + q < n ? c[j + q] : 0.0f; tb[q] = bias && j + q < n ? bias[j + q] : 0.0f; }
        V x = tr_epi(VLOAD(t), VLOAD(tb));
        VSTORE(t, x);
        for (long q = 0; j + q < n; q++) c[j + q] = t[q];
    }
#else
    (void)c; (void)n; (void)bias;
#endif
}
"""

GEMV = r"""
/* Software prefetch distance along k, in floats (0: none). */
#ifndef TR_GV_PF
#define TR_GV_PF 0
#endif

/* c[i*ldc + r] = dot(ar[i][0:K], w[r*ldw + 0:K]) for i < MG, r < R (MG, R compile-time constants). */
static inline __attribute__((always_inline)) void tr_gv_block(long K, const float *const *ar, const float *w,
                                                             long ldw, float *c, long ldc, const int MG,
                                                             const int R) {
    V acc[4][TR_GV_R];
    for (int i = 0; i < MG; i++)
        for (int r = 0; r < R; r++) acc[i][r] = VZERO();
    long kv = K / VW * VW, k = 0;
    for (; k < kv; k += VW) {
        V av[4];
        for (int i = 0; i < MG; i++) av[i] = VLOAD(ar[i] + k);
        for (int r = 0; r < R; r++) {
            V wv = VLOAD(w + r * ldw + k);
#if TR_GV_PF
            VPREFETCH(w + r * ldw + k + TR_GV_PF);
#endif
            for (int i = 0; i < MG; i++) acc[i][r] = VFMA(av[i], wv, acc[i][r]);
        }
    }
    for (int i = 0; i < MG; i++)
        for (int r = 0; r < R; r++) {
            float s = VHSUM(acc[i][r]);
            for (long t = kv; t < K; t++) s += ar[i][t] * w[r * ldw + t];
            c[i * ldc + r] = s;
        }
}

/* Rows i0 .. i0+mg (mg <= 4) of C against R weight rows starting at w. */
static void tr_gv_rows(long K, const float *const *ar, int mg, const float *w, long ldw, float *c, long ldc,
                       int R) {
    if (R == TR_GV_R) {
        switch (mg) {
        case 1: tr_gv_block(K, ar, w, ldw, c, ldc, 1, TR_GV_R); return;
        case 2: tr_gv_block(K, ar, w, ldw, c, ldc, 2, TR_GV_R); return;
        case 3: tr_gv_block(K, ar, w, ldw, c, ldc, 3, TR_GV_R); return;
        default: tr_gv_block(K, ar, w, ldw, c, ldc, 4, TR_GV_R); return;
        }
    }
    for (int r = 0; r < R; r++) {
        switch (mg) {
        case 1: tr_gv_block(K, ar, w + r * ldw, ldw, c + r, ldc, 1, 1); break;
        case 2: tr_gv_block(K, ar, w + r * ldw, ldw, c + r, ldc, 2, 1); break;
        case 3: tr_gv_block(K, ar, w + r * ldw, ldw, c + r, ldc, 3, 1); break;
        default: tr_gv_block(K, ar, w + r * ldw, ldw, c + r, ldc, 4, 1); break;
        }
    }
}

""" + ROW_EPILOGUE + r"""
/* B stored K x N (rows contiguous along n): C[i, j0:j1] += sum over k in [k, k + KG) of A(i, k) B(k, j0:j1)
   for i < MG (MG, KG compile-time constants): KG rows of B stream side by side, the C rows (a few KiB)
   stay in L1. */
static inline __attribute__((always_inline)) void tr_ax_rows(long k, const float *a, long rsa, long csa,
                                                            const float *b, long rsb, float *c, long ldc, long j0,
                                                            long j1, const int MG, const int KG) {
    V av[4][TR_AX_KG];
    for (int i = 0; i < MG; i++)
        for (int g = 0; g < KG; g++) av[i][g] = VSET1(a[i * rsa + (k + g) * csa]);
    const float *bk = b + k * rsb;
    long j = j0;
    for (; j + VW <= j1; j += VW) {
        V bv[TR_AX_KG];
        for (int g = 0; g < KG; g++) bv[g] = VLOAD(bk + g * rsb + j);
        for (int i = 0; i < MG; i++) {
            V x = VLOAD(c + i * ldc + j);
            for (int g = 0; g < KG; g++) x = VFMA(av[i][g], bv[g], x);
            VSTORE(c + i * ldc + j, x);
        }
    }
    for (; j < j1; j++)
        for (int i = 0; i < MG; i++) {
            float x = c[i * ldc + j];
            for (int g = 0; g < KG; g++) x += a[i * rsa + (k + g) * csa] * bk[g * rsb + j];
            c[i * ldc + j] = x;
        }
}

static void tr_ax_step(long k, int kg, const float *a, long rsa, long csa, int mg, const float *b, long rsb,
                       float *c, long ldc, long j0, long j1) {
#define TR_AX_MG(KGX) \
    switch (mg) { \
    case 1: tr_ax_rows(k, a, rsa, csa, b, rsb, c, ldc, j0, j1, 1, KGX); break; \
    case 2: tr_ax_rows(k, a, rsa, csa, b, rsb, c, ldc, j0, j1, 2, KGX); break; \
    case 3: tr_ax_rows(k, a, rsa, csa, b, rsb, c, ldc, j0, j1, 3, KGX); break; \
    default: tr_ax_rows(k, a, rsa, csa, b, rsb, c, ldc, j0, j1, 4, KGX); break; \
    }
    if (kg == TR_AX_KG) TR_AX_MG(TR_AX_KG) else TR_AX_MG(1)
#undef TR_AX_MG
}

/* C (M x N, ldc) = epilogue(A B) for M <= 4 with B stored K x N (B(k, j) = b[k*rsb + j]): each thread
   takes chunks of TR_AX_CW columns and streams the rows of B over them, four at a time. */
static int tr_drive_axpy(long M, long N, long K, const float *a, long rsa, long csa, const float *b, long rsb,
                         float *c, long ldc, const float *bias, int nth) {
    long chunk = TR_MIN((long)TR_AX_CW, TR_ROUNDUP(TR_MAX(1, (N + nth - 1) / nth), VW));
    long nchunk = (N + chunk - 1) / chunk;
    if (nchunk < 2) nth = 1;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(nth) if (nth > 1)
    for (long q = 0; q < nchunk; q++) {
        long j0 = q * chunk, j1 = TR_MIN(N, j0 + chunk);
        for (long i = 0; i < M; i++) memset(c + i * ldc + j0, 0, sizeof(float) * (j1 - j0));
        for (long i = 0; i < M; i += 4) {
            int mg = (int)TR_MIN(4, M - i);
            long k = 0;
            for (; k + TR_AX_KG <= K; k += TR_AX_KG) tr_ax_step(k, TR_AX_KG, a + i * rsa, rsa, csa, mg, b, rsb, c + i * ldc, ldc, j0, j1);
            for (; k < K; k++) tr_ax_step(k, 1, a + i * rsa, rsa, csa, mg, b, rsb, c + i * ldc, ldc, j0, j1);
        }
        for (long i = 0; i < M; i++) tr_gv_epi(c + i * ldc + j0, j1 - j0, bias ? bias + j0 : 0);
    }
    return 0;
}

/* C (M x N, ldc) = epilogue(A B) where column j of B is b + j*csb, contiguous along k. A(i, k) is
   a[i*rsa + k*csa]; rows that are not contiguous along k are copied once. */
static int tr_drive_gemv(long M, long N, long K, const float *a, long rsa, long csa, const float *b, long csb,
                         float *c, long ldc, const float *bias, int nth) {
    int owned = 0;
    float *ws = 0;
    const float *arows[M];
    if (csa != 1 && K > 1) {
        ws = tr_ws_get((size_t)M * K + 16, &owned);
        if (!ws) return 1;
        for (long i = 0; i < M; i++)
            for (long k = 0; k < K; k++) ws[i * K + k] = a[i * rsa + k * csa];
        for (long i = 0; i < M; i++) arows[i] = ws + i * K;
    } else {
        for (long i = 0; i < M; i++) arows[i] = a + i * rsa;
    }
    /* ~8 chunks per thread (dynamic: a descheduled thread does not hold the other back), whole R groups */
    long chunk = TR_ROUNDUP(TR_MAX(1, (N + 8 * nth - 1) / (8 * nth)), TR_GV_R);
    if (chunk < 4 * TR_GV_R) chunk = 4 * TR_GV_R;
    long nchunk = (N + chunk - 1) / chunk;
    if (nchunk < 2) nth = 1;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(nth) if (nth > 1)
    for (long q = 0; q < nchunk; q++) {
        long j0 = q * chunk, j1 = TR_MIN(N, j0 + chunk);
        for (long j = j0; j < j1; j += TR_GV_R) {
            int R = (int)TR_MIN(TR_GV_R, j1 - j);
            for (long i = 0; i < M; i += 4)
                tr_gv_rows(K, arows + i, (int)TR_MIN(4, M - i), b + j * csb, csb, c + i * ldc + j, ldc, R);
        }
        for (long i = 0; i < M; i++) tr_gv_epi(c + i * ldc + j0, j1 - j0, bias ? bias + j0 : 0);
    }
    if (ws) tr_ws_put(ws, owned);
    return 0;
}
"""


def unpacked_driver(m: int, n: int, k: int, trans_b: bool) -> str | None:
    """The packing-free driver ``tr_gemm`` runs an M x N x K GEMM through: ``"gemv"`` (columns of B
    contiguous along k: ``trans_b`` or a single column), ``"axpy"`` (B stored K x N, M <= AXPY_MAXM), or
    None (the blocked drivers). Mirrors ``tr_gemm_route``; a test checks they agree."""
    if (trans_b or n == 1) and any(m <= rows and k >= kmin for rows, kmin in GEMV_TIERS):
        return "gemv"
    if not trans_b and m <= AXPY_MAXM:
        return "axpy"
    return None


def gemv_source(isa: Isa) -> str:
    """The GEMV driver's C text for ``isa`` (needs the prologue and ``tr_epi`` before it)."""
    # Weight rows walked side by side: more concurrent streams beat fitting the accumulators in
    # registers (4096 x 4096, ms, M = 1 / 4 / 8 / 32; AVX-512 R = 4: 1.68 / 2.09 / 2.70 / 6.38, R = 8:
    # 1.44 / 1.79 / 2.28 / 5.96, R = 12-16 slower; AVX2 R = 2 / 4 / 8 at M = 4: 2.64 / 2.02 / 1.70).
    r = 8
    tiers = " || ".join(f"((M) <= {rows} && (K) >= {kmin})" for rows, kmin in GEMV_TIERS)
    defs = {"TR_GV_R": r, "TR_AX_CW": AXPY_CW, "TR_AX_KG": AXPY_KG, "TR_AXPY_MAXM": AXPY_MAXM, "TR_GEMV_ROWS_OK(M, K)": f"({tiers})"}
    return "".join(f"#ifndef {name.partition('(')[0]}\n#define {name} {value}\n#endif\n"
                   for name, value in defs.items()) + GEMV
