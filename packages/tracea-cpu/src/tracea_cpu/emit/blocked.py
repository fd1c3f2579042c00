"""The BLIS-style blocked driver (NC / KC / MC loops around the micro-kernel), the operand packers
(dense strided matrices, and implicit-im2col tiles for conv2d) and the exported entry points
``tr_gemm`` and ``tr_conv2d``.

Threading (OpenMP): the B block (KC x NC) is packed cooperatively, then the MC blocks, split further
over NR panels when there are too few of them to keep every thread busy, are shared out; each thread
packs its own A block. No im2col buffer is ever built: conv tiles are gathered while packing.
"""

from __future__ import annotations

from tracea.ir.epilogue import Epilogue

from ..isa import Isa
from .common import epilogue_c, prologue
from .microkernel import microkernel_c

PACKERS = r"""
typedef void (*tr_pack_fn)(const void *ctx, long start, long len, long p0, long kc, float *dst);

/* Dense operand X(i, k) = p[i*rs + k*cs]. */
typedef struct { const float *p; long rs, cs; } tr_dense;

/* A micro-panel: rows [i0, i0+mr), k in [p0, p0+kc), stored k-blocked dst[t*MR + i*KU + u], zero padded. */
static void tr_pack_a_dense(const void *vctx, long i0, long mr, long p0, long kc, float *dst) {
    const tr_dense *x = (const tr_dense *)vctx;
    long kcp = TR_ROUNDUP(kc, KU);
    if (x->cs == 1) {
        for (long t = 0; t < kcp; t += KU) {
            long ku = TR_MIN(KU, kc - t);
            for (int i = 0; i < MR; i++) {
                float *d = dst + t * MR + i * KU;
                long u = 0;
                if (i < mr) {
                    const float *s = x->p + (i0 + i) * x->rs + p0 + t;
                    for (; u < ku; u++) d[u] = s[u];
                }
                for (; u < KU; u++) d[u] = 0.0f;
            }
        }
    } else {
        for (long t = 0; t < kcp; t += KU)
            for (int u = 0; u < KU; u++) {
                long k = t + u;
                const float *s = x->p + (p0 + k) * x->cs + i0 * x->rs;
                for (int i = 0; i < MR; i++)
                    dst[t * MR + i * KU + u] = (k < kc && i < mr) ? s[i * x->rs] : 0.0f;
            }
    }
}

#if defined(__AVX512F__)
/* dst[k*ld_d + j] = src[j*ld_s + k] for a 16 x 16 block: three shuffle stages in registers. */
#define TR_HAVE_T16 1
static inline void tr_transpose16(const float *src, long ld_s, float *dst, long ld_d) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * ld_s);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * ld_d, r[i]);
}
#else
#define TR_HAVE_T16 0
#endif

/* B micro-panel: k in [p0, p0+kc), columns [j0, j0+nr) of X(k, j) = p[k*rs + j*cs], dst[k*NR + j]. */
static void tr_pack_b_dense(const void *vctx, long j0, long nr, long p0, long kc, float *dst) {
    const tr_dense *x = (const tr_dense *)vctx;
    long kcp = TR_ROUNDUP(kc, KU);
    if (nr < NR || kc < kcp) memset(dst, 0, sizeof(float) * kcp * NR);
    if (x->cs == 1) {
        for (long k = 0; k < kc; k++) {
            const float *s = x->p + (p0 + k) * x->rs + j0;
            float *d = dst + k * NR;
            if (nr == NR) { for (int j = 0; j < NR; j++) d[j] = s[j]; }
            else { for (long j = 0; j < nr; j++) d[j] = s[j]; }
        }
    } else {
        /* Transposed source, in 16-deep k slabs: one cache line read per column, a 16 x NR block
           (L1-resident) written; whole 16 x 16 blocks are transposed in registers where the ISA can. */
        for (long k0 = 0; k0 < kc; k0 += 16) {
            long kn = TR_MIN(16, kc - k0), j = 0;
#if TR_HAVE_T16
            if (kn == 16 && x->rs == 1)
                for (; j + 16 <= nr; j += 16)
                    tr_transpose16(x->p + (j0 + j) * x->cs + p0 + k0, x->cs, dst + k0 * NR + j, NR);
#endif
            for (; j < nr; j++) {
                const float *s = x->p + (j0 + j) * x->cs + (p0 + k0) * x->rs;
                float *d = dst + k0 * NR + j;
                for (long k = 0; k < kn; k++) d[k * NR] = s[k * x->rs];
            }
        }
    }
}

/* conv2d geometry; x points at the group's first channel (of image 0 for NHWC, of this image for NCHW). */
typedef struct {
    const float *x;
    long C, H, W, Cg, R, S, sh, sw, ph, pw, dh, dw, P, Q;
    long CB;  /* indirect K order: blocks of CB channels x all taps (0 = Cg: k = tap*Cg + c) */
} tr_conv;  /* NCHW: pixel index j spans all images (image = j / (P*Q)), x image stride C*H*W. */

/* k -> (tap, channel) in the channel-blocked order k = cb*CB*RS + tap*cbn + cc (c = cb*CB + cc, cbn the
   block's channel count); returns how many k from here stay in the same channel run. */
static inline long tr_k_split(long k, long Cg, long CB, long RS, long *tap, long *c) {
    long blk = CB * RS, cb = k / blk, rem = k - cb * blk, cbn = TR_MIN(CB, Cg - cb * CB), cc = rem % cbn;
    *tap = rem / cbn; *c = cb * CB + cc;
    return cbn - cc;
}

/* Upper bound on the channel runs (segments) in kc consecutive k. */
static inline long tr_max_segs(long Cg, long CB, long kc) {
    long shortest = Cg % CB ? TR_MIN(CB, Cg % CB) : CB;
    return kc / shortest + 2;
}

/* NHWC implicit GEMM, A = output pixels x (r, s, c): each (pixel, r, s) is a contiguous run of c. */
static void tr_pack_a_nhwc(const void *vctx, long i0, long mr, long p0, long kc, float *dst) {
    const tr_conv *g = (const tr_conv *)vctx;
    long kcp = TR_ROUNDUP(kc, KU), end = p0 + kc;
    for (int i = 0; i < MR; i++) {
        if (i >= mr) {
            for (long t = 0; t < kcp; t += KU) memset(dst + t * MR + i * KU, 0, sizeof(float) * KU);
            continue;
        }
        long m = i0 + i, img = m / (g->P * g->Q), rem = m % (g->P * g->Q);
        long ih0 = (rem / g->Q) * g->sh - g->ph, iw0 = (rem % g->Q) * g->sw - g->pw;
        const float *base = g->x + img * g->H * g->W * g->C;
        long k = p0, rs = k / g->Cg, c = k % g->Cg, r = rs / g->S, s = rs % g->S;
        while (k < end) {
            long ih = ih0 + r * g->dh, iw = iw0 + s * g->dw;
            long run = TR_MIN(g->Cg - c, end - k);
            int valid = ih >= 0 && ih < g->H && iw >= 0 && iw < g->W;
            const float *src = base + (ih * g->W + iw) * g->C + c;
            for (long e = 0; e < run;) {
                long kk = k - p0 + e, u = kk % KU, piece = TR_MIN(KU - u, run - e);
                float *d = dst + (kk - u) * MR + i * KU + u;
                if (piece == KU) {
                    if (valid) memcpy(d, src + e, sizeof(float) * KU);
                    else memset(d, 0, sizeof(float) * KU);
                } else if (valid) for (long q = 0; q < piece; q++) d[q] = src[e + q];
                else for (long q = 0; q < piece; q++) d[q] = 0.0f;
                e += piece;
            }
            k += run; c = 0;
            if (++s == g->S) { s = 0; r++; }
        }
        for (long kk = kc; kk < kcp; kk++) dst[(kk - kk % KU) * MR + i * KU + kk % KU] = 0.0f;
    }
}

/* NCHW implicit GEMM, B = (c, r, s) x output pixels of one image: runs of pixels along an output row
   read consecutive input columns (a copy when stride is 1). */
static void tr_pack_b_nchw(const void *vctx, long j0, long nr, long p0, long kc, float *dst) {
    const tr_conv *g = (const tr_conv *)vctx;
    long kcp = TR_ROUNDUP(kc, KU);
    long seg_p[NR + 1], seg_q[NR + 1], seg_len[NR + 1], seg_j[NR + 1], seg_img[NR + 1];
    long PQ = g->P * g->Q, CHW = g->C * g->H * g->W;
    int nseg = 0;
    for (long j = 0; j < nr;) {
        long pix = j0 + j, rem = pix % PQ, q = rem % g->Q, len = TR_MIN(g->Q - q, nr - j);
        seg_img[nseg] = pix / PQ; seg_p[nseg] = rem / g->Q; seg_q[nseg] = q; seg_len[nseg] = len;
        seg_j[nseg] = j; nseg++;
        j += len;
    }
    long c = p0 / (g->R * g->S), r = (p0 / g->S) % g->R, s = p0 % g->S;
    for (long k = 0; k < kcp; k++) {
        float *d = dst + k * NR;
        if (k >= kc) { memset(d, 0, sizeof(float) * NR); continue; }
        const float *plane0 = g->x + c * g->H * g->W;
        for (int sg = 0; sg < nseg; sg++) {
            float *ds = d + seg_j[sg];
            const float *plane = plane0 + seg_img[sg] * CHW;
            long len = seg_len[sg], ih = seg_p[sg] * g->sh - g->ph + r * g->dh;
            if (ih < 0 || ih >= g->H) { memset(ds, 0, sizeof(float) * len); continue; }
            const float *row = plane + ih * g->W;
            long iw = seg_q[sg] * g->sw - g->pw + s * g->dw;
            if (g->sw == 1) {
                long lo = TR_MIN(len, TR_MAX(0, -iw)), hi = TR_MAX(lo, TR_MIN(len, g->W - iw));
                long e = 0;
                for (; e < lo; e++) ds[e] = 0.0f;
                for (; e < hi; e++) ds[e] = row[iw + e];
                for (; e < len; e++) ds[e] = 0.0f;
            } else {
                for (long e = 0; e < len; e++) {
                    long w = iw + e * g->sw;
                    ds[e] = (w >= 0 && w < g->W) ? row[w] : 0.0f;
                }
            }
        }
        for (long j = nr; j < NR; j++) d[j] = 0.0f;
        if (++s == g->S) { s = 0; if (++r == g->R) { r = 0; c++; } }
    }
}

/* Indirect NHWC conv: K range [p0, p0+kc) as (tap, channel run) segments; per output pixel and
   segment, a pointer to the input channels it reads (or to a zero row outside the image). */
typedef struct { long tap, c0; } tr_seg;

static int tr_conv_segments(const tr_conv *g, long p0, long kc, tr_seg *segs, long *lens) {
    int n = 0;
    long CB = g->CB ? g->CB : g->Cg;
    for (long k = p0, end = p0 + kc; k < end;) {
        long tap, c, len = TR_MIN(tr_k_split(k, g->Cg, CB, g->R * g->S, &tap, &c), end - k);
        segs[n].tap = tap; segs[n].c0 = c; lens[n] = len; n++;
        k += len;
    }
    return n;
}

/* NCHW weights (KCRS) as the B operand of the NHWC-ordered GEMM in the channel-blocked K order
   (tr_k_split): B(k, j) = w[j*CRS + c*RS + tap]. Blocks of CB channels keep each K block's reads within
   a few cache lines per output channel. */
typedef struct { const float *w; long CRS, Cg, RS, CB; } tr_kcrs;

static void tr_pack_b_kcrs(const void *vctx, long j0, long nr, long p0, long kc, float *dst) {
    const tr_kcrs *x = (const tr_kcrs *)vctx;
    long kcp = TR_ROUNDUP(kc, KU);
    if (nr < NR || kc < kcp) memset(dst, 0, sizeof(float) * kcp * NR);
    for (long k0 = 0; k0 < kc; k0 += 16) {
        long kn = TR_MIN(16, kc - k0), off[16];
        for (long k = 0; k < kn; k++) {
            long tap, c;
            tr_k_split(p0 + k0 + k, x->Cg, x->CB, x->RS, &tap, &c);
            off[k] = c * x->RS + tap;
        }
        for (long j = 0; j < nr; j++) {
            const float *s = x->w + (j0 + j) * x->CRS;
            float *d = dst + k0 * NR + j;
            for (long k = 0; k < kn; k++) d[k * NR] = s[off[k]];
        }
    }
}

/* Channel-major (NCHW) output of the pixel-row GEMM: C(i, j) = c[(i / rows)*img_stride + i % rows + j*ldc]. */
static void tr_tile_io_t(float *c, long ldc, long rows, long img_stride, long i, long j, int mr, int nr,
                         float *sc, int load) {
    float *base[MR];
    for (int ii = 0; ii < mr; ii++) {
        long row = i + ii;
        base[ii] = c + (row / rows) * img_stride + row % rows + j * ldc;
    }
    /* Channel by channel: the tile's pixels are (mostly) consecutive floats of one output plane. */
    for (int jj = 0; jj < nr; jj++)
        for (int ii = 0; ii < mr; ii++) {
            if (load) sc[ii * NR + jj] = base[ii][jj * ldc];
            else base[ii][jj * ldc] = sc[ii * NR + jj];
        }
}

static void tr_rows_nhwc(const tr_conv *g, long i0, long mr, const tr_seg *segs, int nseg,
                         const float *zeros, const float **rows) {
    long PQ = g->P * g->Q;
    for (int i = 0; i < MR; i++) {
        if (i >= mr) { for (int sg = 0; sg < nseg; sg++) rows[sg * MR + i] = zeros; continue; }
        long m = i0 + i, img = m / PQ, rem = m % PQ;
        long ih0 = (rem / g->Q) * g->sh - g->ph, iw0 = (rem % g->Q) * g->sw - g->pw;
        const float *base = g->x + img * g->H * g->W * g->C;
        for (int sg = 0; sg < nseg; sg++) {
            long ih = ih0 + (segs[sg].tap / g->S) * g->dh, iw = iw0 + (segs[sg].tap % g->S) * g->dw;
            int valid = ih >= 0 && ih < g->H && iw >= 0 && iw < g->W;
            rows[sg * MR + i] = valid ? base + (ih * g->W + iw) * g->C + segs[sg].c0 : zeros;
        }
    }
}

/* NHWC im2col panel with output pixels as columns (weights-stationary conv): B(k = tap*Cg + c, j) is
   input channel c of the pixel that output pixel j0+j reads at tap k / Cg; dst[k*NR + j], zero padded. */
static void tr_pack_b_nhwc(const void *vctx, long j0, long nr, long p0, long kc, float *dst) {
    const tr_conv *g = (const tr_conv *)vctx;
    long kcp = TR_ROUNDUP(kc, KU), PQ = g->P * g->Q, end = p0 + kc;
    if (nr < NR || kc < kcp) memset(dst, 0, sizeof(float) * kcp * NR);
    for (long jj = 0; jj < nr; jj++) {
        long m = j0 + jj, img = m / PQ, rem = m % PQ;
        long ih0 = (rem / g->Q) * g->sh - g->ph, iw0 = (rem % g->Q) * g->sw - g->pw;
        const float *base = g->x + img * g->H * g->W * g->C;
        long tap = p0 / g->Cg, c = p0 % g->Cg;
        for (long k = p0; k < end; tap++) {
            long ih = ih0 + (tap / g->S) * g->dh, iw = iw0 + (tap % g->S) * g->dw;
            long run = TR_MIN(g->Cg - c, end - k);
            float *d = dst + (k - p0) * NR + jj;
            if (ih >= 0 && ih < g->H && iw >= 0 && iw < g->W) {
                const float *src = base + (ih * g->W + iw) * g->C + c;
                for (long e = 0; e < run; e++) d[e * NR] = src[e];
            } else {
                for (long e = 0; e < run; e++) d[e * NR] = 0.0f;
            }
            k += run; c = 0;
        }
    }
}

/* A read in place (no packing): tile row i is the unit-stride run p[(i0 + i)*rs + p0 ...], or zeros. */
static void tr_rows_dense(const tr_dense *a, long i0, long mr, long p0, const float *zeros, const float **rows) {
    for (int i = 0; i < MR; i++) rows[i] = i < mr ? a->p + (i0 + i) * a->rs + p0 : zeros;
}
"""

DRIVER = r"""
/* C(i, j) = c[i*ldc + j], or with img_cols > 0: c[(j / img_cols)*img_stride + i*ldc + j % img_cols]
   (NCHW conv over all images at once); a tile that straddles two images runs on a scratch tile. */
static void tr_tile(long kcp, const float *ap, const float *bp, float *c, long ldc, long i, long j, int mr, int nr,
                    int first, int last, const float *bias, int bias_row, long img_cols, long img_stride) {
    if (!img_cols) {
        tr_ukernel(kcp, ap, bp, c + i * ldc + j, ldc, mr, nr, first, last, bias, bias_row);
        return;
    }
    long img = j / img_cols, q0 = j % img_cols;
    if (q0 + nr <= img_cols) {
        tr_ukernel(kcp, ap, bp, c + img * img_stride + i * ldc + q0, ldc, mr, nr, first, last, bias, bias_row);
        return;
    }
    float sc[MR * NR] __attribute__((aligned(64)));
    if (!first)
        for (int ii = 0; ii < mr; ii++)
            for (int jj = 0; jj < nr; jj++) {
                long col = j + jj;
                sc[ii * NR + jj] = c[(col / img_cols) * img_stride + (i + ii) * ldc + col % img_cols];
            }
    tr_ukernel(kcp, ap, bp, sc, NR, mr, nr, first, last, bias, bias_row);
    for (int ii = 0; ii < mr; ii++)
        for (int jj = 0; jj < nr; jj++) {
            long col = j + jj;
            c[(col / img_cols) * img_stride + (i + ii) * ldc + col % img_cols] = sc[ii * NR + jj];
        }
}

/* Where an indirect-kernel tile writes: straight into C, or (a tile straddling two images of an NCHW
   output) into sc, preloaded when accumulating; tr_tile_end copies sc back. */
static float *tr_tile_begin(float *c, long ldc, long i, long j, int mr, int nr, int first, long img_cols,
                            long img_stride, float *sc, long *ld) {
    *ld = ldc;
    if (!img_cols) return c + i * ldc + j;
    long img = j / img_cols, q0 = j % img_cols;
    if (q0 + nr <= img_cols) return c + img * img_stride + i * ldc + q0;
    *ld = NR;
    if (!first)
        for (int ii = 0; ii < mr; ii++)
            for (int jj = 0; jj < nr; jj++) {
                long col = j + jj;
                sc[ii * NR + jj] = c[(col / img_cols) * img_stride + (i + ii) * ldc + col % img_cols];
            }
    return sc;
}

static void tr_tile_end(float *c, long ldc, long i, long j, int mr, int nr, long img_cols, long img_stride,
                        const float *sc) {
    for (int ii = 0; ii < mr; ii++)
        for (int jj = 0; jj < nr; jj++) {
            long col = j + jj;
            c[(col / img_cols) * img_stride + (i + ii) * ldc + col % img_cols] = sc[ii * NR + jj];
        }
}

/* A is packed by pa, or read in place: through conv pixel rows (ind, NHWC input) or as dense unit-stride
   rows (arows, the weights of a weights-stationary conv). ctrans: tiles are stored transposed,
   C(i, j) = c[(i / img_cols)*img_stride + i % img_cols + j*ldc]. */
static int tr_drive(long M, long N, long K, tr_pack_fn pa, const void *ca, tr_pack_fn pb, const void *cb,
                    float *c, long ldc, long img_cols, long img_stride, const float *bias, int bias_row,
                    long mc, long nc, long kc, int nth, const tr_conv *ind, const tr_dense *arows, int ctrans) {
    mc = TR_MIN(TR_ROUNDUP(TR_MAX(mc, MR), MR), TR_ROUNDUP(M, MR));
    nc = TR_MIN(TR_ROUNDUP(TR_MAX(nc, NR), NR), TR_ROUNDUP(N, NR));
    kc = TR_MIN(TR_ROUNDUP(TR_MAX(kc, KU), KU), TR_ROUNDUP(K, KU));
    if (nth <= 0) nth = tr_threads_available();
    if ((double)M * N * K < 65536.0) nth = 1;
    /* Indirect A needs mc * (segments) row pointers in the A buffer: fine unless channel runs are tiny. */
    if (ind && 2 * tr_max_segs(ind->Cg, ind->CB ? ind->CB : ind->Cg, kc) > kc) ind = 0;
    if (ctrans && !ind && !arows) return 2;
    int owned;
    float *ws = tr_ws_get((size_t)nc * kc + (size_t)nth * mc * kc + kc + 32, &owned);
    if (!ws) return 1;
    float *bbuf = ws, *zeros = ws + TR_ROUNDUP((size_t)nc * kc, 16);
    float *abase = zeros + TR_ROUNDUP(kc, 16);
    if (ind || arows) memset(zeros, 0, sizeof(float) * kc);
    #pragma omp parallel num_threads(nth) if (nth > 1)
    {
#ifdef _OPENMP
        int tid = omp_get_thread_num(), T = omp_get_num_threads();
#else
        int tid = 0, T = 1;
#endif
        float *abuf = abase + (size_t)tid * mc * kc;
        for (long jc = 0; jc < N; jc += nc) {
            long ncur = TR_MIN(nc, N - jc), npan = (ncur + NR - 1) / NR;
            for (long pc = 0; pc < K; pc += kc) {
                long kcur = TR_MIN(kc, K - pc), kcp = TR_ROUNDUP(kcur, KU);
                int first = pc == 0, last = pc + kcur >= K;
                /* Few panels: split each one along k too, so every thread packs. */
                long ksl = npan >= 2 * T ? 1 : TR_MIN((2 * T + npan - 1) / npan, kcp / (4 * KU));
                if (ksl < 1) ksl = 1;
                long kstep = TR_ROUNDUP((kcur + ksl - 1) / ksl, KU);
                #pragma omp for schedule(dynamic, 1)
                for (long it = 0; it < npan * ksl; it++) {
                    long p = it / ksl, k0 = (it % ksl) * kstep;
                    if (k0 < kcur)
                        pb(cb, jc + p * NR, TR_MIN(NR, ncur - p * NR), pc + k0, TR_MIN(kstep, kcur - k0),
                           bbuf + p * NR * kcp + k0 * NR);
                }
                long nic = (M + mc - 1) / mc;
                long nsplit = (nic % T == 0 || nic >= 4 * T) ? 1 : TR_MIN((long)T, npan);
                /* dynamic: on a shared machine a descheduled thread must not hold the others back */
                #pragma omp for schedule(dynamic, 1)
                for (long it = 0; it < nic * nsplit; it++) {
                    long ic = (it / nsplit) * mc, sp = it % nsplit;
                    long mcur = TR_MIN(mc, M - ic), nmp = (mcur + MR - 1) / MR;
                    long jlo = npan * sp / nsplit, jhi = npan * (sp + 1) / nsplit;
                    if (ind || arows) {
                        long nsmax = ind ? tr_max_segs(ind->Cg, ind->CB ? ind->CB : ind->Cg, kcur) : 1;
                        tr_seg segs[nsmax];
                        long lens[nsmax];
                        int nseg = 1;
                        if (ind) nseg = tr_conv_segments(ind, pc, kcur, segs, lens);
                        else lens[0] = kcur;
                        const float **rows = (const float **)abuf;
                        for (long r = 0; r < nmp; r++) {
                            long mrr = TR_MIN(MR, mcur - r * MR);
                            if (ind) tr_rows_nhwc(ind, ic + r * MR, mrr, segs, nseg, zeros, rows + r * nseg * MR);
                            else tr_rows_dense(arows, ic + r * MR, mrr, pc, zeros, rows + r * MR);
                        }
                        for (long jr = jlo; jr < jhi; jr++) {
                            long j = jc + jr * NR;
                            int nr = (int)TR_MIN(NR, N - j);
                            for (long r = 0; r < nmp; r++) {
                                long i = ic + r * MR, ld;
                                int mr = (int)TR_MIN(MR, M - i);
                                const float *bb = !bias ? 0 : (bias_row ? bias + i : bias + j);
                                float sc[MR * NR] __attribute__((aligned(64)));
                                float *dst = sc;
                                if (ctrans) {
                                    ld = NR;
                                    if (!first) tr_tile_io_t(c, ldc, img_cols, img_stride, i, j, mr, nr, sc, 1);
                                } else {
                                    dst = tr_tile_begin(c, ldc, i, j, mr, nr, first, img_cols, img_stride, sc, &ld);
                                }
                                tr_ukernel_ind(nseg, lens, rows + r * nseg * MR, bbuf + jr * NR * kcp, dst, ld,
                                               mr, nr, first, last, bb, bias_row);
                                if (ctrans) tr_tile_io_t(c, ldc, img_cols, img_stride, i, j, mr, nr, sc, 0);
                                else if (dst == sc) tr_tile_end(c, ldc, i, j, mr, nr, img_cols, img_stride, sc);
                            }
                        }
                        continue;
                    }
                    for (long r = 0; r < nmp; r++)
                        pa(ca, ic + r * MR, TR_MIN(MR, mcur - r * MR), pc, kcur, abuf + r * MR * kcp);
                    for (long jr = jlo; jr < jhi; jr++) {
                        long j = jc + jr * NR;
                        int nr = (int)TR_MIN(NR, N - j);
                        for (long r = 0; r < nmp; r++) {
                            long i = ic + r * MR;
                            const float *bp = !bias ? 0 : (bias_row ? bias + i : bias + j);
                            tr_tile(kcp, abuf + r * MR * kcp, bbuf + jr * NR * kcp, c, ldc, i, j,
                                    (int)TR_MIN(MR, M - i), nr, first, last, bp, bias_row, img_cols, img_stride);
                        }
                    }
                }
            }
        }
    }
    tr_ws_put(ws, owned);
    return 0;
}

int tr_gemm(long batch, long M, long N, long K,
            const float *a, long rsa, long csa, long sa, const float *b, long rsb, long csb, long sb,
            float *c, long ldc, long sc, const float *bias, long mc, long nc, long kc, int nth) {
    for (long q = 0; q < batch; q++) {
        tr_dense A = {a + q * sa, rsa, csa}, B = {b + q * sb, rsb, csb};
        int rc = tr_drive(M, N, K, tr_pack_a_dense, &A, tr_pack_b_dense, &B, c + q * sc, ldc, 0, 0, bias, 0,
                          mc, nc, kc, nth, 0, 0, 0);
        if (rc) return rc;
    }
    return 0;
}

#ifndef TR_NCHW_CB
#define TR_NCHW_CB 32
#endif

/* layout 0: NCHW x, KCRS w, NCHW out (out = W x im2col per group; columns are the pixels of all images, bias per row).
   layout 1: NHWC x, KRSC w, NHWC out (out = im2col x W^T per group over all images, bias per column). */
int tr_conv2d(int layout, long n, long C, long H, long W, long K, long R, long S, long sh, long sw,
              long ph, long pw, long dh, long dw, long groups, long P, long Q,
              const float *x, const float *w, const float *bias, float *out,
              long mc, long nc, long kc, int nth, int indirect) {
    long Cg = C / groups, Kg = K / groups, CRS = Cg * R * S;
    if (layout == 0 && indirect == 1 && Cg >= 8) {
        /* NCHW through the indirect NHWC kernel: transpose x once, read KCRS weights in place while
           packing, store the pixel-row tiles channel-major. */
        long HW = H * W;
        int xt_owned;
        float *xt = tr_ws_slot(1, (size_t)n * HW * C, &xt_owned);
        if (!xt) return 1;
        /* 16 channel planes are read as 16 sequential streams; each pixel's 16 channels are one line. */
        #pragma omp parallel for collapse(2) schedule(static) num_threads(nth > 0 ? nth : tr_threads_available())
        for (long img = 0; img < n; img++)
            for (long c0 = 0; c0 < C; c0 += 16) {
                long cn = TR_MIN(16, C - c0);
                const float *src = x + (img * C + c0) * HW;
                float *dst = xt + img * HW * C + c0;
                if (cn == 16) {
                    for (long hw = 0; hw < HW; hw++)
                        for (long cc = 0; cc < 16; cc++) dst[hw * C + cc] = src[cc * HW + hw];
                } else {
                    for (long hw = 0; hw < HW; hw++)
                        for (long cc = 0; cc < cn; cc++) dst[hw * C + cc] = src[cc * HW + hw];
                }
            }
        int rc = 0;
        for (long gi = 0; gi < groups && !rc; gi++) {
            long CB = TR_MIN(Cg, TR_NCHW_CB);
            tr_conv A = {xt + gi * Cg, C, H, W, Cg, R, S, sh, sw, ph, pw, dh, dw, P, Q, CB};
            tr_kcrs B = {w + gi * Kg * CRS, CRS, Cg, R * S, CB};
            rc = tr_drive(n * P * Q, Kg, CRS, tr_pack_a_nhwc, &A, tr_pack_b_kcrs, &B, out + gi * Kg * P * Q, P * Q,
                          P * Q, K * P * Q, bias ? bias + gi * Kg : 0, 0, mc, nc, kc, nth, &A, 0, 1);
        }
        tr_ws_release(1, xt, xt_owned);
        return rc;
    }
    if (indirect == 2) {
        /* Weights-stationary: M = output channels with the weights read in place as A rows (no weight
           packing), N = output pixels of all images, B = im2col panels packed on the fly. NCHW output
           is C itself; NHWC output is C transposed. */
        for (long gi = 0; gi < groups; gi++) {
            tr_dense A = {w + gi * Kg * CRS, CRS, 1};
            const float *bg = bias ? bias + gi * Kg : 0;
            int rc;
            if (layout == 0) {
                tr_conv B = {x + gi * Cg * H * W, C, H, W, Cg, R, S, sh, sw, ph, pw, dh, dw, P, Q};
                rc = tr_drive(Kg, n * P * Q, CRS, tr_pack_a_dense, &A, tr_pack_b_nchw, &B, out + gi * Kg * P * Q,
                              P * Q, P * Q, K * P * Q, bg, 1, mc, nc, kc, nth, 0, &A, 0);
            } else {
                tr_conv B = {x + gi * Cg, C, H, W, Cg, R, S, sh, sw, ph, pw, dh, dw, P, Q};
                rc = tr_drive(Kg, n * P * Q, CRS, tr_pack_a_dense, &A, tr_pack_b_nhwc, &B, out + gi * Kg,
                              K, Kg, 0, bg, 1, mc, nc, kc, nth, 0, &A, 1);
            }
            if (rc) return rc;
        }
        return 0;
    }
    for (long gi = 0; gi < groups; gi++) {
        const float *bg = bias ? bias + gi * Kg : 0;
        if (layout == 0) {
            tr_dense A = {w + gi * Kg * CRS, CRS, 1};
            tr_conv B = {x + gi * Cg * H * W, C, H, W, Cg, R, S, sh, sw, ph, pw, dh, dw, P, Q};
            int rc = tr_drive(Kg, n * P * Q, CRS, tr_pack_a_dense, &A, tr_pack_b_nchw, &B,
                              out + gi * Kg * P * Q, P * Q, P * Q, K * P * Q, bg, 1, mc, nc, kc, nth, 0, 0, 0);
            if (rc) return rc;
        } else {
            tr_conv A = {x + gi * Cg, C, H, W, Cg, R, S, sh, sw, ph, pw, dh, dw, P, Q};
            tr_dense B = {w + gi * Kg * CRS, 1, CRS};
            int rc = tr_drive(n * P * Q, Kg, CRS, tr_pack_a_nhwc, &A, tr_pack_b_dense, &B,
                              out + gi * Kg, K, 0, 0, bg, 0, mc, nc, kc, nth, indirect == 1 ? &A : 0, 0, 0);
            if (rc) return rc;
        }
    }
    return 0;
}
"""


def blocked_source(isa: Isa, mr: int, nr: int, epilogue: Epilogue, ku: int = 8) -> str:
    """Complete C source of the GEMM + conv2d library for one ISA, register tile and epilogue."""
    if not isa.fits(mr, nr):
        raise ValueError(f"tile {mr}x{nr} does not fit {isa.name}'s registers")
    return "\n".join([prologue(isa), epilogue_c(epilogue), microkernel_c(isa, mr, nr, ku), PACKERS, DRIVER])
