"""bf16 conv2d on AMX tiles (``tc_conv2d``): implicit GEMM whose A tiles are loaded in place from a
zero-padded NHWC copy of the input rows, so no im2col buffer and no A packing exist.

Layout. Each thread copies the input rows its blocks read into its own image-sized buffer
``xp[Hp][Wp][G][Cgp]`` (bf16), a group of blocks' rows right before the group computes: zero rows for
``ph``, ``pw`` zero pixels before each row (``Wp = W + pw``: the left padding of row h + 1 is the right
padding of row h; 1-wide kernels with padding keep both borders), each group's ``Cg`` channels padded
with zeros to ``Cgp`` (a multiple of 32, one tile row of K), zeroed slack after the last row. NCHW inputs
are transposed on the way (pairs of channel rows widened to 32-bit words, then 16 x 16 word transposes);
NHWC inputs are row copies. GEMM rows are output pixels, columns output channels, K runs over (tap,
channel) -- the tap (r, s) and a 32-channel block select ``tileloadd``'s base address and the 16 rows of
a tile are 16 pixels at a fixed stride:

* **stride 1 ("flat" rows)**: pixel rows are numbered ``f = p * Wp + q`` over the padded width, so pixel
  ``f`` of tap (r, s) is ``xp[f + r*dh*Wp + s*dw]`` -- one stride for a whole tile even across output
  rows. The ``Wp - Q`` columns past each output row are computed and dropped (7x7 images: 56 rows for
  49 pixels; 56x56: 3192 for 3136).
* **other strides**: a tile is up to 16 pixels of one output row, ``sw * Cpix`` apart.

A row of C depends only on its A row, so the dropped rows (which read padding, the next row, rows not
copied yet or the zeroed slack) cannot touch kept ones. Zero padding is multiplied like any other
input, so a NaN / Inf weight gives NaN where the float64 reference (and PyTorch) does.

The weights are packed into VNNI panels ``wp[g][nb][tap][Cgp/2][NR]`` (32-bit words of a channel pair,
the B layout of ``tdpbf16ps``), by :func:`tc_pack_w` (the variant keeps packed weights of an unchanged
torch tensor, see :mod:`tracea_cpu.panel_cache`) or per call into a workspace. A work item is a chunk of
MR-pixel blocks of one image against a run of NR-channel panels (runs sized to ``wblk`` KiB); each MR x
NR block is accumulated over the whole K in tile registers (or over K chunks of ``kst`` KiB with fp32
partial sums, for groups of ``mbg`` blocks), stored to an fp32 scratch block and finished from there
after the next block's tiles are stored (bias, activation, fp32 or bf16 output; NCHW through 16 x 16
transposes and compressing stores that skip the dropped rows).
"""

from __future__ import annotations

from tracea.ir.epilogue import Epilogue

from ..isa import Isa
from .amx import tile_plan
from .bf16 import BF16_LAYER, T16
from .common import epilogue_c, prologue

#: parameter block of ``tc_conv2d`` / ``tc_pack_w`` (one C ``long`` each, in this order)
PARAMS = ("layout", "n", "C", "H", "W", "K", "R", "S", "sh", "sw", "ph", "pw", "dh", "dw", "G", "P", "Q",
          "out_bf16", "nth", "wblk", "kst", "mbg")

HEAD = r"""
typedef struct { long layout, n, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, G, P, Q, out_bf16, nth, wblk, kst, mbg; } tc_prm;
typedef struct __attribute__((packed)) { uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16]; uint8_t rows[16]; } tc_tilecfg;
static void tc_tiles_on(void) {
    tc_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    _tile_loadconfig(&cfg);
}
/* Derived sizes of one call. */
typedef struct { long Cg, Kg, Cgp, Cpix, Hp, Wp, RS, flat, QT, U, MB, NB, panel, slack; } tc_geo;
static void tc_geometry(const tc_prm *p, tc_geo *g) {
    g->Cg = p->C / p->G; g->Kg = p->K / p->G; g->Cgp = TR_ROUNDUP(g->Cg, 32); g->Cpix = p->G * g->Cgp;
    g->flat = p->sh == 1 && p->sw == 1;
    /* Rows of W + pw pixels: the left padding of row h + 1 is the right padding of row h (a read past the
       right edge lands in it; past the last row, in the zeroed slack). Flat rows need a padded row at least
       as wide as the output row (not so for 1-wide kernels with padding): those keep both borders. */
    g->Hp = p->H + 2 * p->ph; g->Wp = p->W + p->pw; g->RS = p->R * p->S;
    if (g->flat && p->Q > g->Wp) g->Wp = p->W + 2 * p->pw;
    g->QT = (p->Q + 15) / 16;
    g->U = g->flat ? (p->P * g->Wp + 15) / 16 : p->P * g->QT;
    g->MB = (g->U + MR / 16 - 1) / (MR / 16);
    g->NB = (g->Kg + NR - 1) / NR;
    g->panel = g->RS * (g->Cgp / 2) * NR;
    /* pixels read past the last image by dropped rows: a block of MR rows, the widest tap and a row */
    g->slack = MR * p->sw + p->S * p->dw + g->Wp + 16;
}
"""

PACK_W = r"""
/* Packed weight words for one call's shape. */
long tc_wpack_words(const tc_prm *p) {
    tc_geo g; tc_geometry(p, &g);
    return p->G * g.NB * g.panel;
}

/* Weights -> VNNI panels: dst[((gi*NB + nb)*RS + tap)*(Cgp/2)*NR + t*NR + j] = (w(k, 2t, tap), w(k, 2t+1, tap))
   for output channel k = gi*Kg + nb*NR + j; zero past Kg and Cg. layout 1: KRSC (16 x 16 word transposes
   of the channel runs); layout 0: KCRS (channel pairs RS apart, gathered, then the same transposes). */
int tc_pack_w(const tc_prm *p, const bf16 *w, uint32_t *dst) {
    tc_geo g; tc_geometry(p, &g);
    long Cg = g.Cg, Kg = g.Kg, RS = g.RS, CP = g.Cgp / 2, nth = p->nth > 0 ? p->nth : 1;
    #pragma omp parallel for collapse(2) schedule(static) num_threads(nth) if (nth > 1)
    for (long gi = 0; gi < p->G; gi++)
        for (long nb = 0; nb < g.NB; nb++) {
            uint32_t *d = dst + (gi * g.NB + nb) * g.panel;
            long k0 = gi * Kg + nb * NR, kn = TR_MIN(NR, Kg - nb * NR);
            if (p->layout == 1) {
                for (long tap = 0; tap < RS; tap++)
                    for (long j0 = 0; j0 < NR; j0 += 16)
                        for (long t0 = 0; t0 < CP; t0 += 16) {
                            __m512i r[16];
                            long c0 = 2 * t0, cn = TR_MAX(0, TR_MIN(32, Cg - c0));
                            __mmask32 m = (__mmask32)(cn >= 32 ? 0xffffffffu : (1u << cn) - 1);
                            for (int q = 0; q < 16; q++)
                                r[q] = j0 + q < kn ? _mm512_maskz_loadu_epi16(m, w + ((k0 + j0 + q) * RS + tap) * Cg + c0)
                                                   : _mm512_setzero_si512();
                            tb_t16(r);
                            for (int q = 0; q < 16; q++)
                                _mm512_storeu_si512(d + (tap * CP + t0 + q) * NR + j0, r[q]);
                        }
            } else {
                /* KCRS: the 16 channel pairs of one tap are gathered (32-bit gathers RS elements apart,
                   the low half kept; the next row's first element is read past a row's end, so the
                   tensor's last row is copied by scalars), then transposed like the KRSC runs */
                const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
                for (long tap = 0; tap < RS; tap++)
                    for (long j0 = 0; j0 < NR; j0 += 16)
                        for (long t0 = 0; t0 < CP; t0 += 16) {
                            __m512i r[16];
                            long c0 = 2 * t0;
                            __m512i cl = _mm512_add_epi32(_mm512_set1_epi32((int)c0), _mm512_slli_epi32(lane, 1));
                            __mmask16 mlo = _mm512_cmplt_epi32_mask(cl, _mm512_set1_epi32((int)Cg));
                            __mmask16 mhi = _mm512_cmplt_epi32_mask(_mm512_add_epi32(cl, _mm512_set1_epi32(1)),
                                                                    _mm512_set1_epi32((int)Cg));
                            __m512i off = _mm512_add_epi32(_mm512_mullo_epi32(cl, _mm512_set1_epi32((int)RS)),
                                                           _mm512_set1_epi32((int)tap));
                            for (int q = 0; q < 16; q++) {
                                long k = k0 + j0 + q;
                                const bf16 *s = w + k * Cg * RS;
                                if (j0 + q >= kn) {
                                    r[q] = _mm512_setzero_si512();
                                } else if (k == p->K - 1) {
                                    uint32_t t[16];
                                    for (int i = 0; i < 16; i++) {
                                        long c = c0 + 2 * i;
                                        t[i] = (c < Cg ? s[c * RS + tap] : 0) | (uint32_t)(c + 1 < Cg ? s[(c + 1) * RS + tap] : 0) << 16;
                                    }
                                    r[q] = _mm512_loadu_si512(t);
                                } else {
                                    __m512i lo = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mlo, off, s, 2);
                                    __m512i hi = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mhi,
                                                                             _mm512_add_epi32(off, _mm512_set1_epi32((int)RS)), s, 2);
                                    r[q] = _mm512_or_si512(_mm512_and_si512(lo, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(hi, 16));
                                }
                            }
                            tb_t16(r);
                            for (int q = 0; q < 16; q++)
                                _mm512_storeu_si512(d + (tap * CP + t0 + q) * NR + j0, r[q]);
                        }
            }
        }
    return 0;
}
"""

PAD_X = r"""
/* Padded rows [h0, h1) of image n -> xp (one image, see the module doc): borders and channel padding zero. */
static void tc_pad_rows(const tc_prm *p, const tc_geo *g, const bf16 *x, long n, long h0, long h1, bf16 *xp) {
    long Wp = g->Wp, Cpix = g->Cpix, Cg = g->Cg, Cgp = g->Cgp, W = p->W, H = p->H;
    for (long hp = h0; hp < h1; hp++) {
        bf16 *row = xp + hp * Wp * Cpix;
        long h = hp - p->ph;
        if (h < 0 || h >= H) { memset(row, 0, sizeof(bf16) * Wp * Cpix); continue; }
        memset(row, 0, sizeof(bf16) * p->pw * Cpix);
        memset(row + (p->pw + W) * Cpix, 0, sizeof(bf16) * (Wp - p->pw - W) * Cpix);
        bf16 *dst = row + p->pw * Cpix;
        if (p->layout == 1) {
            const bf16 *src = x + (n * H + h) * W * p->C;
            if (Cg == Cgp) { memcpy(dst, src, sizeof(bf16) * W * p->C); continue; }
            for (long w = 0; w < W; w++)
                for (long gi = 0; gi < p->G; gi++)
                    for (long c0 = 0; c0 < Cgp; c0 += 32) {
                        long cn = TR_MAX(0, TR_MIN(32, Cg - c0));
                        __mmask32 m = (__mmask32)(cn >= 32 ? 0xffffffffu : (1u << cn) - 1);
                        _mm512_storeu_si512(dst + w * Cpix + gi * Cgp + c0,
                                            _mm512_maskz_loadu_epi16(m, src + w * p->C + gi * Cg + c0));
                    }
        } else {
            /* NCHW: rows of channels c, c+1 widened into 32-bit pairs for 16 pixels, 16 pairs
               transposed so that each pixel's 32 channels are one 64-byte store */
            long HW = H * W;
            const bf16 *src = x + n * p->C * HW + h * W;
            for (long w0 = 0; w0 < W; w0 += 16) {
                long wn = TR_MIN(16, W - w0);
                __mmask16 mw = (__mmask16)(wn == 16 ? 0xffff : (1u << wn) - 1);
                for (long gi = 0; gi < p->G; gi++)
                    for (long c0 = 0; c0 < Cgp; c0 += 32) {
                        __m512i r[16];
                        for (int t = 0; t < 16; t++) {
                            long c = c0 + 2 * t;
                            const bf16 *s0 = src + (gi * Cg + c) * HW + w0;
                            __m512i lo = c < Cg ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mw, s0))
                                                : _mm512_setzero_si512();
                            __m512i hi = c + 1 < Cg ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mw, s0 + HW))
                                                    : _mm512_setzero_si512();
                            r[t] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
                        }
                        tb_t16(r);
                        for (int q = 0; q < wn; q++)
                            _mm512_storeu_si512(dst + (w0 + q) * Cpix + gi * Cgp + c0, r[q]);
                    }
            }
        }
    }
}
"""

DRIVE = r"""
/* Rows of unit u (16 GEMM rows of one image): first pixel in xp (pixels), kept-row mask, plane index of
   the first kept row (kept rows are consecutive in the output plane). */
static void tc_units(const tc_prm *p, const tc_geo *g, long *base, uint32_t *mask, long *plane) {
    for (long u = 0; u < g->U; u++) {
        uint32_t m = 0;
        long first = -1;
        if (g->flat) {
            base[u] = 16 * u;
            for (int i = 0; i < 16; i++) {
                long f = 16 * u + i, pp = f / g->Wp, q = f % g->Wp;
                if (pp < p->P && q < p->Q) { m |= 1u << i; if (first < 0) first = pp * p->Q + q; }
            }
        } else {
            long pp = u / g->QT, q0 = (u % g->QT) * 16, qn = TR_MIN(16, p->Q - q0);
            base[u] = pp * p->sh * g->Wp + q0 * p->sw;
            m = qn == 16 ? 0xffffu : (1u << qn) - 1;
            first = pp * p->Q + q0;
        }
        mask[u] = m;
        plane[u] = first < 0 ? 0 : first;
    }
}

/* A finished MR x NR fp32 block (cb, row stride NR) of image n, units u0.., channels k0.. (kn valid)
   -> the output: epilogue, then fp32 or bf16, NHWC rows or NCHW planes. */
static void tc_store(const tc_prm *p, const tc_geo *g, const float *cb, long n, long u0, long k0, long kn,
                     const uint32_t *mask, const long *plane, const float *bias, void *out) {
    long K = p->K, PQ = p->P * p->Q;
    int bf = (int)p->out_bf16;
    for (int ut = 0; ut < MR / 16; ut++) {
        long u = u0 + ut;
        if (u >= g->U) break;
        uint32_t m = mask[u];
        if (!m) continue;
        const float *blk = cb + ut * 16 * NR;
        if (p->layout == 1) {
            long pl = plane[u];
            for (int i = 0; i < 16; i++) {
                if (!(m >> i & 1)) continue;
                long o = (n * PQ + pl++) * K + k0;
                for (int v = 0; v < NR; v += 16) {
                    long c = TR_MIN(16, kn - v);
                    if (c <= 0) break;
                    __mmask16 cm = (__mmask16)(c == 16 ? 0xffff : (1u << c) - 1);
                    V x = VLOAD(blk + i * NR + v);
                    if (TR_HAS_EPI) x = tr_epi(x, TR_HAS_BIAS ? _mm512_maskz_loadu_ps(cm, bias + k0 + v) : VZERO());
                    if (bf) _mm256_mask_storeu_epi16((bf16 *)out + o + v, cm, (__m256i)_mm512_cvtneps_pbh(x));
                    else _mm512_mask_storeu_ps((float *)out + o + v, cm, x);
                }
            }
        } else {
            int cnt = __builtin_popcount(m);
            __mmask16 sm = (__mmask16)(cnt == 16 ? 0xffff : (1u << cnt) - 1);
            for (int v = 0; v < NR && v < kn; v += 16) {
                __m512i r[16];
                for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(blk + i * NR + v);
                tb_t16(r);
                for (int j = 0; j < 16 && v + j < kn; j++) {
                    V x = _mm512_castsi512_ps(r[j]);
                    if (TR_HAS_EPI) x = tr_epi(x, TR_HAS_BIAS ? VSET1(bias[k0 + v + j]) : VZERO());
                    x = _mm512_maskz_compress_ps((__mmask16)m, x);
                    long o = (n * K + k0 + v + j) * PQ + plane[u];
                    if (bf) _mm256_mask_storeu_epi16((bf16 *)out + o, sm, (__m256i)_mm512_cvtneps_pbh(x));
                    else _mm512_mask_storeu_ps((float *)out + o, sm, x);
                }
            }
        }
    }
}

/* x: NCHW or NHWC bf16; w: raw weights (packed here into a workspace) unless wpk is given (tc_pack_w's
   panels); bias: fp32 (K) or null; out: fp32 or bf16 (out_bf16), NCHW or NHWC. 0, or 1 (allocation).

   Work items: (image, chunk of its pixel blocks, run of panels), runs innermost. Each thread pads the rows
   of the image its blocks read into its own image-sized buffer, a group of blocks' rows right before the
   group computes (so they are in L1 / L2 when the tiles load them; a separate padding pass over the whole
   batch wrote and re-read it through memory: 30% of the time of 64@56^2 at batch 8); the next item of
   the same image and chunk (another run of panels) finds them padded. */
int tc_conv2d(const tc_prm *p, const bf16 *x, const bf16 *w, const uint32_t *wpk, const float *bias, void *out) {
    tc_geo g; tc_geometry(p, &g);
    int nth = p->nth > 0 ? (int)p->nth : 1;
    long Cpix = g.Cpix, Wp = g.Wp, RS = g.RS, CB = g.Cgp / 32;
    size_t img = (size_t)g.Hp * Wp * Cpix, xsz = TR_ROUNDUP(img + (size_t)g.slack * Cpix, 32);  /* bf16 */
    int xo, wo = 0;
    bf16 *xbuf = (bf16 *)tr_ws_slot(1, xsz / 2 * nth, &xo);
    if (!xbuf) return 1;
    uint32_t *wsp = 0;
    if (!wpk) {
        wsp = (uint32_t *)tr_ws_slot(2, (size_t)p->G * g.NB * g.panel, &wo);
        if (!wsp) { tr_ws_release(1, (float *)xbuf, xo); return 1; }
        tc_pack_w(p, w, wsp);
        wpk = wsp;
    }
    long *ubase = (long *)malloc(sizeof(long) * (2 * g.U + RS + RS * CB + 16) + sizeof(uint32_t) * g.U);
    if (!ubase) {
        tr_ws_release(1, (float *)xbuf, xo);
        if (wsp) tr_ws_release(2, (float *)wsp, wo);
        return 1;
    }
    long *uplane = ubase + g.U, *toff = uplane + g.U, *soff = toff + RS;
    uint32_t *umask = (uint32_t *)(soff + RS * CB + 16);
    tc_units(p, &g, ubase, umask, uplane);
    for (long r = 0; r < p->R; r++)
        for (long s = 0; s < p->S; s++) toff[r * p->S + s] = (r * p->dh * Wp + s * p->dw) * Cpix;
    /* runs of panels that fit wblk KiB (at least one); chunks of pixel blocks so that there are at
       least two items per thread */
    long nbs = TR_MAX(1, TR_MIN(g.NB, p->wblk * 1024 / (g.panel * 4)));
    long nruns = (g.NB + nbs - 1) / nbs, per_img = p->G * nruns;
    long nch = TR_MIN(g.MB, TR_MAX(1, (2 * nth + p->n * per_img - 1) / (p->n * per_img)));
    long items = p->n * nch * per_img, rsb = p->sw * Cpix * 2;
    long reach = (p->R - 1) * p->dh * Wp + (p->S - 1) * p->dw;  /* pixels from a row's base to its last tap */
    /* K chunks of about kst steps (tap, 32 channels) of a panel, each walked by a group of mbg pixel
       blocks (their partial sums in cbuf) while it stays in L1 */
    long steps = RS * CB, tapb = CB * 16 * NR * 4, rowb = p->S * tapb, kb = TR_MAX(1, p->kst) * 1024;
    long tpc = rowb <= kb ? p->S * (kb / rowb) : TR_MAX(1, kb / tapb), kst = tpc * CB;
    long mbg = TR_MAX(1, p->mbg);
    for (long k = 0; k < steps; k++) soff[k] = toff[k / CB] + (k % CB) * 32;
    float *cbuf = (float *)aligned_alloc(64, sizeof(float) * MR * NR * 2 * mbg * nth);
    if (!cbuf) {
        free(ubase);
        tr_ws_release(1, (float *)xbuf, xo);
        if (wsp) tr_ws_release(2, (float *)wsp, wo);
        return 1;
    }
    #pragma omp parallel num_threads(nth) if (nth > 1)
    {
        int tid = TR_TID();
        bf16 *xp = xbuf + (size_t)tid * xsz;
        float *cbg = cbuf + (size_t)tid * MR * NR * 2 * mbg;
        int half = 0;  /* which half of cbg the blocks of the current (group, panel) use */
        /* a finished block waits until the next block's tiles are stored: a vector load right after a
           tile store of the same lines waits for the store */
        long pend_n = -1, pend_u0 = 0, pend_k0 = 0, pend_kn = 0;
        const float *pend_cb = 0;
        long pad_sub = -1, pad_next = 0, pad_end = 0;  /* rows [pad_next, pad_end) of item group pad_sub to pad */
        memset(xp + img, 0, sizeof(bf16) * g.slack * Cpix);
        tc_tiles_on();
        #pragma omp for schedule(static)
        for (long it = 0; it < items; it++) {
            long sub = it / per_img, n = sub / nch, ch = sub % nch;
            long gi = it % per_img / nruns, run = it % nruns;
            long mb0 = g.MB * ch / nch, mb1 = g.MB * (ch + 1) / nch;
            if (pad_sub != sub) {
                long ulo = mb0 * (MR / 16), uhi = TR_MIN(g.U, mb1 * (MR / 16)) - 1;
                pad_sub = sub;
                pad_next = ubase[ulo] / Wp;
                pad_end = TR_MIN(g.Hp, (ubase[uhi] + 15 * p->sw + reach) / Wp + 1);
            }
            for (long mg = mb0; mg < mb1; mg += mbg) {
                long mge = TR_MIN(mb1, mg + mbg);
                /* the rows this group of blocks reads, padded just before (they stay in L1 / L2) */
                long need = TR_MIN(pad_end, (ubase[TR_MIN(g.U, mge * (MR / 16)) - 1] + 15 * p->sw + reach) / Wp + 1);
                if (need > pad_next) {
                    tc_pad_rows(p, &g, x, n, pad_next, need, xp);
                    pad_next = need;
                }
                for (long nb = run * nbs; nb < TR_MIN(g.NB, (run + 1) * nbs); nb++) {
                    const uint32_t *bp = wpk + (gi * g.NB + nb) * g.panel;
                    half ^= 1;
                    long k0c = gi * g.Kg + nb * NR;
                    for (long k0 = 0; k0 < steps; k0 += kst) {
                        long k1 = TR_MIN(steps, k0 + kst);
                        for (long mb = mg; mb < mge; mb++) {
                            long u0 = mb * (MR / 16);
                            float *cb = cbg + ((mb - mg) + mbg * half) * MR * NR;
                            const bf16 *xa[MR / 16];
                            for (int ut = 0; ut < MR / 16; ut++)
                                xa[ut] = xp + ubase[TR_MIN(u0 + ut, g.U - 1)] * Cpix + gi * g.Cgp;
TC_BLOCK
                            if (pend_n >= 0) {
                                tc_store(p, &g, pend_cb, pend_n, pend_u0, pend_k0, pend_kn, umask, uplane, bias, out);
                                pend_n = -1;
                            }
                            if (k1 == steps) {
                                pend_n = n; pend_u0 = u0; pend_k0 = k0c; pend_kn = TR_MIN(NR, g.Kg - nb * NR);
                                pend_cb = cb;
                            }
                        }
                    }
                }
            }
        }
        if (pend_n >= 0) tc_store(p, &g, pend_cb, pend_n, pend_u0, pend_k0, pend_kn, umask, uplane, bias, out);
        _tile_release();
    }
    free(cbuf);
    free(ubase);
    tr_ws_release(1, (float *)xbuf, xo);
    if (wsp) tr_ws_release(2, (float *)wsp, wo);
    return 0;
}
"""


def conv_tile_plan(mr: int, nr: int) -> tuple[list[list[int]], list[int], list[int]]:
    """Tile registers of an mr x nr block: :func:`.amx.tile_plan`, and for one column of C tiles (nr = 16)
    taller blocks whose A tiles take turns in two registers (up to 64 x 16: 4 C + 1 B + 2 A).
    Raises ValueError for a block that does not fit."""
    if nr == 16 and mr % 16 == 0 and 16 <= mr <= 80:
        mt = mr // 16
        if mt + 2 + 1 > 8:
            raise ValueError(f"AMX conv block {mr}x{nr} needs {mt + 3} tile registers (8 exist)")
        if mt + mt + 1 > 8:
            return [[i] for i in range(mt)], [mt + 1 + i % 2 for i in range(mt)], [mt]
    return tile_plan(mr, nr)


def check_conv_tile(mr: int, nr: int) -> str | None:
    """Why an mr x nr AMX conv block cannot be emitted (None when it can)."""
    try:
        conv_tile_plan(mr, nr)
    except ValueError as exc:
        return str(exc)
    return None


def block_c(mr: int, nr: int) -> str:
    """The tile block of one pixel block and K chunk [k0, k1) of a panel: C tiles zeroed (first chunk) or
    loaded from the block's fp32 partial sums ``cb``; per step (tap, 32 channels) the A tiles straight from
    the padded input (``xa[i]`` + ``soff[k]``, stride ``rsb`` bytes), the B tiles from the panel, the
    products; the C tiles stored back to ``cb``."""
    ctile, atile, btile = conv_tile_plan(mr, nr)
    mt, nt = len(atile), len(btile)
    ind = " " * 28
    lines = [f"{ind}if (k0 == 0) {{"]
    lines += [f"{ind}    _tile_zero({ctile[i][j]});" for i in range(mt) for j in range(nt)]
    lines.append(f"{ind}}} else {{")
    lines += [f"{ind}    _tile_loadd({ctile[i][j]}, cb + {i * 16 * nr + j * 16}, NR * 4);"
              for i in range(mt) for j in range(nt)]
    lines += [f"{ind}}}", f"{ind}for (long k = k0; k < k1; k++) {{",
              f"{ind}    const uint32_t *bq = bp + k * 16 * NR;"]
    if len(set(atile)) < mt:  # A tiles take turns: B first, then each A tile right before its product
        lines.append(f"{ind}    _tile_loadd({btile[0]}, bq, NR * 4);")
        for i, a in enumerate(atile):
            lines.append(f"{ind}    _tile_loadd({a}, xa[{i}] + soff[k], rsb);")
            lines.append(f"{ind}    _tile_dpbf16ps({ctile[i][0]}, {a}, {btile[0]});")
    else:
        lines += [f"{ind}    _tile_loadd({a}, xa[{i}] + soff[k], rsb);" for i, a in enumerate(atile)]
        for j, b in enumerate(btile):
            lines.append(f"{ind}    _tile_loadd({b}, bq + {j * 16}, NR * 4);")
            lines += [f"{ind}    _tile_dpbf16ps({ctile[i][j]}, {a}, {b});" for i, a in enumerate(atile)]
    lines.append(f"{ind}}}")
    lines += [f"{ind}_tile_stored({ctile[i][j]}, cb + {i * 16 * nr + j * 16}, NR * 4);"
              for i in range(mt) for j in range(nt)]
    return "\n".join(lines)


def amx_conv_source(isa: Isa, mr: int, nr: int, epilogue: Epilogue) -> str:
    """Complete C source of the AMX bf16 conv2d library for one MR x NR tile block and epilogue chain
    (``isa``: the AVX-512 ISA whose ``V*`` layer the fp32 epilogue is written against)."""
    conv_tile_plan(mr, nr)  # raises ValueError for a block that does not fit the tile registers
    return "\n".join([prologue(isa), BF16_LAYER, epilogue_c(epilogue), T16, f"#define MR {mr}\n#define NR {nr}\n",
                      HEAD, PACK_W, PAD_X, DRIVE.replace("TC_BLOCK", block_c(mr, nr))])
