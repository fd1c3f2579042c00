"""C operand packers of the blocked driver: dense strided matrices (with in-register 16 x 16 transposes
on AVX-512), and for conv2d the implicit-im2col gathers, the per-pixel channel-run pointers of the
indirect kernel and the channel-blocked K order. Nothing of im2col size is ever allocated: every
packer fills one micro-panel (MR or NR wide, kc deep) at a time."""

from __future__ import annotations

PACKERS = r"""
typedef void (*tr_pack_fn)(const void *ctx, long start, long len, long p0, long kc, float *dst);

/* Dense operand X(i, k) = p[i*rs + k*cs]. */
typedef struct { const float *p; long rs, cs; } tr_dense;

/* A micro-panel: rows [i0, i0+mr), k in [p0, p0+kc), stored k-blocked dst[t*MR + i*KU + u], zero padded. */
static void tr_pack_a_dense(const void *vctx, long i0, long mr, long p0, long kc, float *dst) {
    const tr_dense *x = (const tr_dense *)vctx;
    long kcp = TR_ROUNDUP(kc, KU);
    if (x->cs == 1) {
        /* Row by row (each source row read in one sequential run), whole KU runs copied with a constant
           size (one vector move each): 2.5-3x faster than a run-by-run copy with a variable length */
        long full = kc / KU * KU;
        for (int i = 0; i < MR; i++) {
            float *d = dst + i * KU;
            long t = 0;
            if (i < mr) {
                const float *s = x->p + (i0 + i) * x->rs + p0;
                for (; t < full; t += KU) memcpy(d + t * MR, s + t, KU * sizeof(float));
                if (t < kcp) {
                    long u = 0;
                    for (; u < kc - t; u++) d[t * MR + u] = s[t + u];
                    for (; u < KU; u++) d[t * MR + u] = 0.0f;
                    t += KU;
                }
            }
            for (; t < kcp; t += KU) memset(d + t * MR, 0, KU * sizeof(float));
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
#define TR_HAVE_T16 1
/* Transpose 16 x 16 floats held in r[0..15] (row i -> column i): three shuffle stages. */
static inline void tr_t16_regs(__m512 *r) {
    __m512 t[16];
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
}
/* dst[k*ld_d + j] = src[j*ld_s + k] for a 16 x 16 block. */
static inline void tr_transpose16(const float *src, long ld_s, float *dst, long ld_d) {
    __m512 r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * ld_s);
    tr_t16_regs(r);
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * ld_d, r[i]);
}
#else
#define TR_HAVE_T16 0
#endif

/* dst[c*ld_d + r] = src[r*ld_s + c] for rn <= 16 rows and every column (16 x 16 blocks in registers). */
static void tr_transpose_strip(const float *src, long rn, long cols, long ld_s, float *dst, long ld_d) {
    long c0 = 0;
#if TR_HAVE_T16
    if (rn == 16)
        for (; c0 + 16 <= cols; c0 += 16) tr_transpose16(src + c0, ld_s, dst + c0 * ld_d, ld_d);
#endif
    for (; c0 < cols; c0 += 16) {
        long cn = TR_MIN(16, cols - c0);
        for (long c = c0; c < c0 + cn; c++)
            for (long r = 0; r < rn; r++) dst[c * ld_d + r] = src[r * ld_s + c];
    }
}

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
} tr_conv;  /* NCHW: pixel index j spans all images (image = j / (P*Q)), x image stride C*H*W. */

/* Upper bound on the channel runs (segments) in kc consecutive k. */
static inline long tr_max_segs(long Cg, long kc) { return kc / Cg + 2; }

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
            } else if (g->sw == 2) {
                /* stride 2 (stems, downsampling convs): the in-image span's even columns, 16 at a time from two
                   vectors where the ISA has them (2-core Zen 4 VM, ResNet stem 7x7/2 at 112^2: this packer was
                   most of the call, scalar) */
                long lo = TR_MIN(len, TR_MAX(0, (1 - iw) / 2)), hi = TR_MAX(lo, TR_MIN(len, (g->W - iw + 1) / 2));
                long e = 0;
                for (; e < lo; e++) ds[e] = 0.0f;
#ifdef __AVX512F__
                const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
                for (; e + 16 <= hi && iw + 2 * e + 32 <= g->W; e += 16)
                    _mm512_storeu_ps(ds + e, _mm512_permutex2var_ps(_mm512_loadu_ps(row + iw + 2 * e), even,
                                                                    _mm512_loadu_ps(row + iw + 2 * e + 16)));
#endif
                for (; e < hi; e++) ds[e] = row[iw + 2 * e];
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
    for (long k = p0, end = p0 + kc; k < end;) {
        long c = k % g->Cg, len = TR_MIN(g->Cg - c, end - k);
        segs[n].tap = k / g->Cg; segs[n].c0 = c; lens[n] = len; n++;
        k += len;
    }
    return n;
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

/* Pixel-row pointers of tile rows [i0, i0+mr) per segment, rows[s*MR + i] (a zero row where the pixel
   reads padding). A segment whose rows all read padding is dropped (it would only multiply zeros:
   the padded border taps of a tile that is one output row): returns the kept count, with each kept
   segment's length and offset in the B panel (segments are stored back to back, seg_pad floats apart) in klen / koff, and
   in kskip whether tile row 0 (bit 0) / row MR-1 (bit 1) reads only padding there. keep_all: nothing
   is dropped or skipped, padding taps multiply the zero row (0 * Inf = NaN where a weight is Inf or
   NaN, as PyTorch's zero padding gives). */
static int tr_rows_nhwc(const tr_conv *g, long i0, long mr, const tr_seg *segs, const long *lens, int nseg,
                        const float *zeros, const float **rows, long *klen, long *koff, int *kskip, long seg_pad,
                        int keep_all) {
    long PQ = g->P * g->Q, ih0[MR], iw0[MR], off = 0;
    long img = i0 / PQ, p = (i0 % PQ) / g->Q, q = i0 % g->Q;
    const float *base[MR];
    for (int i = 0; i < mr; i++) {
        ih0[i] = p * g->sh - g->ph;
        iw0[i] = q * g->sw - g->pw;
        base[i] = g->x + img * g->H * g->W * g->C;
        if (++q == g->Q) { q = 0; if (++p == g->P) { p = 0; img++; } }
    }
    int kept = 0;
    for (int sg = 0; sg < nseg; sg++) {
        long dr = (segs[sg].tap / g->S) * g->dh, ds = (segs[sg].tap % g->S) * g->dw;
        const float **rw = rows + kept * MR;
        int any = 0;
        for (int i = 0; i < MR; i++) {
            if (i >= mr) { rw[i] = zeros; continue; }
            long ih = ih0[i] + dr, iw = iw0[i] + ds;
            int valid = ih >= 0 && ih < g->H && iw >= 0 && iw < g->W;
            rw[i] = valid ? base[i] + (ih * g->W + iw) * g->C + segs[sg].c0 : zeros;
            any |= valid;
        }
        if (any || keep_all) {
            klen[kept] = lens[sg]; koff[kept] = off;
            kskip[kept] = keep_all ? 0 : (rw[0] == zeros) | (rw[MR - 1] == zeros) << 1;
            kept++;
        }
        off += lens[sg] * NR + seg_pad;
    }
    return kept;
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
