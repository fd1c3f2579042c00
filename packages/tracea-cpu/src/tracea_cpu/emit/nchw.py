"""C helpers of the NCHW conv through the indirect kernel (``tr_conv2d`` with ``indirect=1``): the
KCRS weight panels packed in channel-blocked K order, and finished output tiles stored transposed
straight into the NCHW output.

K order. The indirect kernel walks K as (tap, channel run) segments. For NCHW the K blocks are
channel blocks: block b covers channels [c0, c0 + cn) at every tap, so its weights are one contiguous
run ``w[j*CRS + c0*RS .. (c0+cn)*RS)`` of every KCRS row (read once per call, cache-line by cache-line)
and the panel is that run with its (c, tap) order turned to (tap, c): 16 x 16 register transposes
whose rows are stored to permuted panel rows. (The plain (tap, c) order gathered every weight at a
stride of R*S floats and read each row R*S times.)
"""

from __future__ import annotations

NCHW = r"""
#ifndef TR_SEG_PAD
#define TR_SEG_PAD 16
#endif
#ifndef TR_KCRS_STAGE
#define TR_KCRS_STAGE 1
#endif
/* NCHW weights (KCRS) as the B operand of the NHWC-ordered GEMM. */
typedef struct { const float *w; long CRS, Cg, RS; } tr_kcrs;

/* Channels [cc0, cn) of a KCRS panel straight into dst (16 x 16 register transposes along the flat
   (c, tap) run, each transposed row stored to its (tap, c) panel row). */
static void tr_kcrs_direct(const float *w0, long CRS, long RS, long TS, long nr, long cc0, long cn, float *dst) {
    long flat = cn * RS, jj = 0;
#if TR_HAVE_T16
    for (; jj + 16 <= nr; jj += 16) {
        const float *s = w0 + jj * CRS;
        long f = cc0 * RS, tap = 0, cc = cc0;
        for (; f + 16 <= flat; f += 16) {
            __m512 r[16];
            for (int q = 0; q < 16; q++) r[q] = _mm512_loadu_ps(s + q * CRS + f);
            tr_t16_regs(r);
            for (int q = 0; q < 16; q++) {
                _mm512_storeu_ps(dst + tap * TS + cc * NR + jj, r[q]);
                if (++tap == RS) { tap = 0; cc++; }
            }
        }
        for (; f < flat; f++) {
            for (int q = 0; q < 16; q++) dst[tap * TS + cc * NR + jj + q] = s[q * CRS + f];
            if (++tap == RS) { tap = 0; cc++; }
        }
    }
#endif
    for (; jj < nr; jj++) {
        const float *s = w0 + jj * CRS;
        for (long cc = cc0; cc < cn; cc++)
            for (long t = 0; t < RS; t++) dst[t * TS + cc * NR + jj] = s[cc * RS + t];
    }
}

/* B panel of channel block [c0, c0+cn): dst[tap*TS + cc*NR + jj] = w[(j0+jj)*CRS + (c0+cc)*RS + tap],
   columns nr..NR-1 zero; one tap's rows are TS = cn*NR + TR_SEG_PAD floats after the previous tap's
   (the pad keeps the taps' rows out of one L1 set). Full panels go 16 channels at a time through an
   L1 stage, so the panel is written tap by tap in 16-row bursts instead of R*S interleaved streams.
   Not inlined: the stage (a variable-length array) would cost the caller's micro-kernel a register. */
__attribute__((noinline)) static void tr_pack_b_kcrs_blk(const tr_kcrs *x, long j0, long nr, long c0, long cn, float *dst) {
    long RS = x->RS, CRS = x->CRS, TS = cn * NR + TR_SEG_PAD, cc0 = 0;
    const float *w0 = x->w + j0 * CRS + c0 * RS;
    if (nr < NR) memset(dst, 0, sizeof(float) * RS * TS);
#if TR_HAVE_T16 && TR_KCRS_STAGE
    if (nr == NR && NR % 16 == 0 && RS <= 16) {
        float stage[16 * RS * NR] __attribute__((aligned(64)));
        for (; cc0 + 16 <= cn; cc0 += 16) {
            for (long jj = 0; jj < NR; jj += 16) {
                const float *s = w0 + jj * CRS + cc0 * RS;
                long tap = 0, cc = 0;
                for (long f = 0; f < 16 * RS; f += 16) {
                    __m512 r[16];
                    for (int q = 0; q < 16; q++) r[q] = _mm512_loadu_ps(s + q * CRS + f);
                    tr_t16_regs(r);
                    for (int q = 0; q < 16; q++) {
                        _mm512_store_ps(stage + (tap * 16 + cc) * NR + jj, r[q]);
                        if (++tap == RS) { tap = 0; cc++; }
                    }
                }
            }
            for (long tap = 0; tap < RS; tap++) {
                float *d = dst + tap * TS + cc0 * NR;
                const float *st = stage + tap * 16 * NR;
                for (long e = 0; e < 16 * NR; e += 16) _mm512_storeu_ps(d + e, _mm512_load_ps(st + e));
            }
        }
    }
#endif
    if (cc0 < cn) tr_kcrs_direct(w0, CRS, RS, TS, nr, cc0, cn, dst);
}

/* Where the NCHW indirect conv's finished tiles go: out (this group's first channel), image stride
   img_stride, PQ pixels per plane; K walked in channel blocks of cb. */
typedef struct { const tr_kcrs *w; long cb; float *out; long PQ, img_stride; } tr_ind_nchw;

/* The NHWC copy of an NCHW conv's input, made inside the conv's parallel region image by image as the
   work items first need them (tr_xcopy_need) instead of in a parallel region of its own before it (one
   fork and one join less per call, and an image is copied right before its pixels are computed, while
   it is in that core's L2). An image's copy is cut into nsub sub-tasks handed out from the image's
   counter, so the threads that need an image at the same time copy it together. pix: 16 pixels x every
   channel at a time (the copy written as one stream); else 16 channels x every pixel. */
typedef struct {
    const float *x; float *xt; long C, HW, nsub; int pix;
    long *next, *done;  /* per image: next sub-task to hand out, sub-tasks finished */
} tr_xcopy;

static void tr_xcopy_sub(const tr_xcopy *xc, long img, long q) {
    long C = xc->C, HW = xc->HW;
    if (xc->pix) {
        long npb = (HW + 15) / 16, b0 = q * npb / xc->nsub, b1 = (q + 1) * npb / xc->nsub;
        for (long pb = b0; pb < b1; pb++) {
            long p0 = pb * 16, pn = TR_MIN(16, HW - p0);
            for (long c0 = 0; c0 < C; c0 += 16)
                tr_transpose_strip(xc->x + (img * C + c0) * HW + p0, TR_MIN(16, C - c0), pn, HW,
                                   xc->xt + (img * HW + p0) * C + c0, C);
        }
    } else {
        long c0 = q * 16;
        tr_transpose_strip(xc->x + (img * C + c0) * HW, TR_MIN(16, C - c0), HW, HW, xc->xt + img * HW * C + c0, C);
    }
}

/* Returns once image img is copied; helps copy it while sub-tasks are left. */
static void tr_xcopy_need(tr_xcopy *xc, long img) {
    for (int spin = 0; __atomic_load_n(&xc->done[img], __ATOMIC_ACQUIRE) < xc->nsub; spin++) {
        long q = __atomic_fetch_add(&xc->next[img], 1, __ATOMIC_RELAXED);
        if (q < xc->nsub) {
            tr_xcopy_sub(xc, img, q);
            __atomic_add_fetch(&xc->done[img], 1, __ATOMIC_RELEASE);
        } else {
            tr_cpu_relax();
            if (spin > 4096) sched_yield();
        }
    }
}

/* Up to 16 pixels of a tile (tr_store_nchw). */
static void tr_store_nchw16(const float *src, long ld, const tr_ind_nchw *o, long i, long j, int mr, int nr) {
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

/* Tile src (mr pixels x nr channels, row stride ld) into the NCHW output: pixel i+ii, channel j+jj goes
   to out[img*img_stride + (j+jj)*PQ + p] (img, p: image and plane offset of pixel i+ii). 16 pixels at
   a time: a 16 x 16 register transpose, then one store of 16 pixels per channel. */
static void tr_store_nchw(const float *src, long ld, const tr_ind_nchw *o, long i, long j, int mr, int nr) {
    for (int g = 0; g < mr; g += 16) tr_store_nchw16(src + g * ld, ld, o, i + g, j, TR_MIN(16, mr - g), nr);
}
"""
