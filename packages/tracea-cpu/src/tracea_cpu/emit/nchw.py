"""C helpers of the NCHW conv through the indirect kernel (``tr_conv2d`` with ``indirect=1``): the
NHWC copy of the input made row by row as work items first need the rows (no separate pass; the
rows are still in cache when the kernel reads them), the KCRS weight panels packed in
channel-blocked K order, and finished output tiles stored transposed straight into the NCHW output.

K order. The indirect kernel walks K as (tap, channel run) segments. For NCHW the K blocks are
channel blocks: block b covers channels [c0, c0 + cn) at every tap, so its weights are one contiguous
run ``w[j*CRS + c0*RS .. (c0+cn)*RS)`` of every KCRS row (read once per call, cache-line by cache-line)
and the panel is that run with its (c, tap) order turned to (tap, c): 16 x 16 register transposes
whose rows are stored to permuted panel rows. (The plain (tap, c) order gathered every weight at a
stride of R*S floats and read each row R*S times.)
"""

from __future__ import annotations

NCHW = r"""
/* NCHW weights (KCRS) as the B operand of the NHWC-ordered GEMM. */
typedef struct { const float *w; long CRS, Cg, RS; } tr_kcrs;

/* B panel of channel block [c0, c0+cn): dst[(tap*cn + cc)*NR + jj] = w[(j0+jj)*CRS + (c0+cc)*RS + tap],
   columns nr..NR-1 zero. */
static void tr_pack_b_kcrs_blk(const tr_kcrs *x, long j0, long nr, long c0, long cn, float *dst) {
    long RS = x->RS, flat = cn * RS, CRS = x->CRS;
    const float *w0 = x->w + j0 * CRS + c0 * RS;
    if (nr < NR) memset(dst, 0, sizeof(float) * flat * NR);
    long jj = 0;
#if TR_HAVE_T16
    for (; jj + 16 <= nr; jj += 16) {
        const float *s = w0 + jj * CRS;
        long f = 0, tap = 0, cc = 0;
        for (; f + 16 <= flat; f += 16) {
            __m512 r[16];
            for (int q = 0; q < 16; q++) r[q] = _mm512_loadu_ps(s + q * CRS + f);
            tr_t16_regs(r);
            for (int q = 0; q < 16; q++) {
                _mm512_storeu_ps(dst + (tap * cn + cc) * NR + jj, r[q]);
                if (++tap == RS) { tap = 0; cc++; }
            }
        }
        for (; f < flat; f++) {
            for (int q = 0; q < 16; q++) dst[(tap * cn + cc) * NR + jj + q] = s[q * CRS + f];
            if (++tap == RS) { tap = 0; cc++; }
        }
    }
#endif
    for (; jj < nr; jj++) {
        const float *s = w0 + jj * CRS;
        for (long cc = 0; cc < cn; cc++)
            for (long t = 0; t < RS; t++) dst[(t * cn + cc) * NR + jj] = s[cc * RS + t];
    }
}

/* The NCHW indirect conv: finished tiles go to out (this group's first channel), image stride
   img_stride, PQ pixels per plane; K walked in channel blocks of cb; the NHWC copy xt of the NCHW
   input xsrc (all channels) is made row by row as work items first need the rows (done[img*H + ih]:
   0 not yet, 1 being copied, 2 ready), so no separate pass and the rows are in cache when read. */
typedef struct {
    const tr_kcrs *w; long cb; float *out; long PQ, img_stride;
    const float *xsrc; float *xt; int *done;
} tr_ind_nchw;

static inline void tr_spin_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* NHWC copy of input rows [r0, r0+nrows) of image img (every channel): 16 x 16 register transposes. */
static void tr_nchw_copy_rows(const tr_ind_nchw *o, const tr_conv *g, long img, long r0, long nrows) {
    long HW = g->H * g->W;
    const float *src = o->xsrc + img * g->C * HW + r0 * g->W;
    float *dst = o->xt + (img * HW + r0 * g->W) * g->C;
    for (long c0 = 0; c0 < g->C; c0 += 16)
        tr_transpose_strip(src + c0 * HW, TR_MIN(16, g->C - c0), nrows * g->W, HW, dst + c0, g->C);
}

/* Make sure the NHWC copy holds every input row that output pixels [m0, m1) read: rows nobody has
   claimed are claimed and copied (consecutive ones in one strip), then rows the other thread is
   copying are waited for (a claimed row is always finished without waiting, so no deadlock). */
static void tr_nchw_rows_ready(const tr_ind_nchw *o, const tr_conv *g, long m0, long m1) {
    long PQ = g->P * g->Q;
    for (int pass = 0; pass < 2; pass++)
        for (long img = m0 / PQ; img <= (m1 - 1) / PQ; img++) {
            long lo = TR_MAX(m0, img * PQ) - img * PQ, hi = TR_MIN(m1, (img + 1) * PQ) - 1 - img * PQ;
            long r0 = TR_MAX(0, (lo / g->Q) * g->sh - g->ph);
            long r1 = TR_MIN(g->H - 1, (hi / g->Q) * g->sh - g->ph + (g->R - 1) * g->dh);
            int *done = o->done + img * g->H;
            long run = -1;
            for (long ih = r0; ih <= r1 + 1; ih++) {
                int mine = 0;
                if (ih <= r1) {
                    if (pass == 0) {
                        int expect = 0;
                        mine = __atomic_compare_exchange_n(done + ih, &expect, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
                    } else {
                        while (__atomic_load_n(done + ih, __ATOMIC_ACQUIRE) != 2) tr_spin_pause();
                    }
                }
                if (mine && run < 0) run = ih;
                if (!mine && run >= 0) {
                    tr_nchw_copy_rows(o, g, img, run, ih - run);
                    for (long r = run; r < ih; r++) __atomic_store_n(done + r, 2, __ATOMIC_RELEASE);
                    run = -1;
                }
            }
        }
}

/* Tile src (mr pixels x nr channels, row stride ld) into the NCHW output: pixel i+ii, channel j+jj goes
   to out[img*img_stride + (j+jj)*PQ + p] (img, p: image and plane offset of pixel i+ii). */
static void tr_store_nchw(const float *src, long ld, const tr_ind_nchw *o, long i, long j, int mr, int nr) {
    long PQ = o->PQ, p = i % PQ;
    if (p + mr <= PQ) {
        float *dst = o->out + (i / PQ) * o->img_stride + j * PQ + p;
        int jj = 0;
#if TR_HAVE_T16
        if (mr <= 16) {
            __mmask16 m = (__mmask16)((1u << mr) - 1);
            for (; jj + 16 <= nr; jj += 16) {
                __m512 r[16];
                for (int ii = 0; ii < 16; ii++) r[ii] = ii < mr ? _mm512_loadu_ps(src + ii * ld + jj) : _mm512_setzero_ps();
                tr_t16_regs(r);
                for (int q = 0; q < 16; q++) {
                    float *d = dst + (jj + q) * PQ;
                    /* masked-off lanes that reach into the next page make the store very slow (an
                       assist on every call on Zen 4): those few rows take the scalar path */
                    if ((((uintptr_t)d & 4095) + 64 <= 4096) || mr == 16) _mm512_mask_storeu_ps(d, m, r[q]);
                    else { float t[16]; _mm512_storeu_ps(t, r[q]); for (int ii = 0; ii < mr; ii++) d[ii] = t[ii]; }
                }
            }
        }
#endif
        for (; jj < nr; jj++)
            for (int ii = 0; ii < mr; ii++) dst[jj * PQ + ii] = src[ii * ld + jj];
        return;
    }
    for (int ii = 0; ii < mr; ii++) {
        long m = i + ii;
        float *dst = o->out + (m / PQ) * o->img_stride + j * PQ + m % PQ;
        for (int jj = 0; jj < nr; jj++) dst[jj * PQ] = src[ii * ld + jj];
    }
}
"""
