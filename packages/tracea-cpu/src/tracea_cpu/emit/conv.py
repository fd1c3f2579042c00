"""``tr_conv2d``: conv2d entry point over the blocked drivers, one of four algorithms per call
(``indirect`` param): 0 packed implicit GEMM, 1 indirect (pixel rows read in place; NCHW goes through
NHWC copies of input and output), 2 weights-stationary (weights read in place, im2col panels of the
output pixels packed), 3 direct NCHW with output pixels in the vector lanes (stride-1 NCHW convs whose
output rows are as wide as the input's, AVX-512; elsewhere 3 runs as 1)."""

from __future__ import annotations

CONV = r"""
#ifndef TR_XCOPY_PIX_MAXC
#define TR_XCOPY_PIX_MAXC 64
#endif
#ifndef TR_XCOPY_PIX_MAXF
#define TR_XCOPY_PIX_MAXF (1L << 18)
#endif

/* Whether every kernel tap reads the image (not only padding) for some output pixel. */
static int tr_taps_all_hit(const tr_conv *g) {
    for (long r = 0; r < g->R; r++) {
        long lo = g->ph - r * g->dh, p = lo <= 0 ? 0 : (lo + g->sh - 1) / g->sh;  /* first p reading row >= 0 */
        if (p >= g->P || p * g->sh - g->ph + r * g->dh >= g->H) return 0;
    }
    for (long s = 0; s < g->S; s++) {
        long lo = g->pw - s * g->dw, q = lo <= 0 ? 0 : (lo + g->sw - 1) / g->sw;
        if (q >= g->Q || q * g->sw - g->pw + s * g->dw >= g->W) return 0;
    }
    return 1;
}

/* tr_drive_ind with PyTorch's NaN / Inf result. The indirect algorithm skips the products of taps that
   fall in the zero padding; they are 0 unless a weight is Inf or NaN, where PyTorch (and the float64
   reference) get 0 * Inf = NaN. When every tap reads the image for some output pixel, a NaN or Inf
   weight makes some accumulator NaN or Inf, which the micro-kernel reports (one FMA per accumulator
   per tile): only then does the conv run again without skipping. When some tap never reads the image
   (tiny images), nothing is skipped at all. */
static int tr_drive_ind_exact(long M, long N, long K, tr_pack_fn pb, const void *cb, float *c, long ldc,
                              const float *bias, long mc, long kc, int nth, const tr_conv *ind,
                              const tr_ind_nchw *nchw, tr_xcopy *xc) {
    int keep = !tr_taps_all_hit(ind), nf = 0;
    int rc = tr_drive_ind(M, N, K, pb, cb, c, ldc, bias, mc, kc, nth, ind, nchw, keep, keep ? 0 : &nf, xc);
    if (!rc && nf) rc = tr_drive_ind(M, N, K, pb, cb, c, ldc, bias, mc, kc, nth, ind, nchw, 1, 0, 0);
    return rc;
}

/* layout 0: NCHW x, KCRS w, NCHW out (out = W x im2col per group; columns are the pixels of all images, bias per row).
   layout 1: NHWC x, KRSC w, NHWC out (out = im2col x W^T per group over all images, bias per column). */
int tr_conv2d(int layout, long n, long C, long H, long W, long K, long R, long S, long sh, long sw,
              long ph, long pw, long dh, long dw, long groups, long P, long Q,
              const float *x, const float *w, const float *bias, float *out,
              long mc, long nc, long kc, int nth, int indirect) {
    long Cg = C / groups, Kg = K / groups, CRS = Cg * R * S;
    if (indirect == 3) {
        /* Direct NCHW, output pixels in the vector lanes (emit/nchw_direct.py); where it does not apply
           (NHWC, stride > 1, groups, output rows narrower than the input's, no AVX-512) the indirect
           algorithm runs instead. */
#if TR_HAVE_ND
        if (layout == 0 && tr_nd_fits(C, W, R, S, sh, sw, pw, dw, groups, Q))
            return tr_conv_nd(n, C, H, W, K, R, S, ph, pw, dh, dw, P, x, w, bias, out, nth);
#endif
        indirect = 1;
    }
    if (layout == 0 && indirect == 1) {
        /* NCHW through the NHWC indirect kernel: x transposed to NHWC; K walked in channel blocks of the
           KCRS weights; tiles stored transposed into out (an NHWC scratch holds partial sums only when
           K takes several blocks). */
        long HW = H * W, PQ = P * Q, RS = R * S;
        /* channel blocks of (almost) equal size, at most kc / RS channels each */
        long cbmax = TR_MAX(1, kc / RS), cb = (Cg + (Cg + cbmax - 1) / cbmax - 1) / ((Cg + cbmax - 1) / cbmax);
        int multi = Cg > cb;
        int xt_owned, ot_owned = 0;
        float *xt = tr_ws_slot(1, (size_t)n * HW * C, &xt_owned), *ot = 0;
        if (xt && multi) ot = tr_ws_slot(2, (size_t)n * PQ * K, &ot_owned);
        if (!xt || (multi && !ot)) { if (xt) tr_ws_release(1, xt, xt_owned); return 1; }
        /* The NHWC copy of x is made inside the first group's tr_drive_ind (tr_xcopy). With C <= 64 and at
           most 1 MiB of input, 16 pixels x all channels at a time so the copy is written as one
           sequential stream (64@56^2 batch 1: 45-57 -> 24-29 us); otherwise 16 channels x all pixels
           (batch 8 of 64@56^2, past L2, ran 188-211 us that way against 312-397 by pixels). */
        int pix = C <= TR_XCOPY_PIX_MAXC && C * HW <= TR_XCOPY_PIX_MAXF;
        long *cnt = (long *)calloc((size_t)(2 * n + 2), sizeof(long));
        if (!cnt) {
            if (ot) tr_ws_release(2, ot, ot_owned);
            tr_ws_release(1, xt, xt_owned);
            return 1;
        }
        tr_xcopy xc = {x, xt, C, HW, pix ? TR_MIN(8, (HW + 15) / 16) : (C + 15) / 16, pix, cnt, cnt + n};
        int rc = 0;
        for (long gi = 0; gi < groups && !rc; gi++) {
            tr_conv A = {xt + gi * Cg, C, H, W, Cg, R, S, sh, sw, ph, pw, dh, dw, P, Q};
            tr_kcrs B = {w + gi * Kg * CRS, CRS, Cg, RS};
            tr_ind_nchw o = {&B, cb, out + gi * Kg * PQ, PQ, K * PQ};
            rc = tr_drive_ind_exact(n * PQ, Kg, CRS, 0, 0, ot ? ot + gi * Kg : 0, K, bias ? bias + gi * Kg : 0,
                                    mc, kc, nth, &A, &o, gi == 0 ? &xc : 0);
        }
        free(cnt);
        if (ot) tr_ws_release(2, ot, ot_owned);
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
                              P * Q, P * Q, K * P * Q, bg, 1, mc, nc, kc, nth, &A, 0);
            } else {
                tr_conv B = {x + gi * Cg, C, H, W, Cg, R, S, sh, sw, ph, pw, dh, dw, P, Q};
                rc = tr_drive(Kg, n * P * Q, CRS, tr_pack_a_dense, &A, tr_pack_b_nhwc, &B, out + gi * Kg,
                              K, Kg, 0, bg, 1, mc, nc, kc, nth, &A, 1);
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
                              out + gi * Kg * P * Q, P * Q, P * Q, K * P * Q, bg, 1, mc, nc, kc, nth, 0, 0);
            if (rc) return rc;
        } else {
            tr_conv A = {x + gi * Cg, C, H, W, Cg, R, S, sh, sw, ph, pw, dh, dw, P, Q};
            tr_dense B = {w + gi * Kg * CRS, 1, CRS};
            if (indirect == 1) {
                int rc = tr_drive_ind_exact(n * P * Q, Kg, CRS, tr_pack_b_dense, &B, out + gi * Kg, K, bg, mc, kc,
                                            nth, &A, 0, 0);
                if (rc) return rc;
                continue;
            }
            int rc = tr_drive(n * P * Q, Kg, CRS, tr_pack_a_nhwc, &A, tr_pack_b_dense, &B,
                              out + gi * Kg, K, 0, 0, bg, 0, mc, nc, kc, nth, 0, 0);
            if (rc) return rc;
        }
    }
    return 0;
}
"""
