"""Direct NCHW conv2d with output pixels in the vector lanes (AVX-512 only): ``tr_conv_nd``.

For a stride-1 NCHW conv whose output rows are as wide as the input rows (``Q == W``, e.g. a 3x3
"same" conv), the flattened output pixels p = h*W + w of one image and the input pixels a tap reads,
p + (r*dh - ph)*W + (s*dw - pw), are both contiguous runs of one input channel plane. So a tile of
``ND_PV`` x 16 consecutive output pixels x ``ND_KB`` output channels is a sum over (tap, input channel)
of one masked vector load per 16 pixels (zero where the tap falls in the padding or past the plane)
times one broadcast weight per output channel: the input is read in place from NCHW and the tile is
stored straight into the NCHW output, with no NHWC copy of the input, no transposed store and no
im2col. The weights are packed once per call, ``ND_KB`` output channels at a time in (tap, c, j)
order, so each broadcast reads the next float. Padding taps are multiplied like any other (a zero
times the weight), so a NaN / Inf weight gives PyTorch's NaN at the border outputs without a second
run, and nothing is skipped.

Work items are chunks of tiles over all images (dynamic schedule); per tile every output-channel
block runs against the same input lines (kept in L1 / L2 across the blocks).
"""

from __future__ import annotations

#: Vectors of 16 pixels per tile and output channels per tile (``ND_PV * ND_KB`` accumulators).
ND_PV = 3
ND_KB = 8


def _tile_kernel(pv: int, kb: int, npv: int) -> str:
    """``tr_nd_tile<pv>``: one tile's accumulators over every tap and input channel. Per tap, the
    channel loop is specialised by which of the pv vectors need a masked load (a masked load costs a
    vector-ALU slot next to the FMAs: plain loads where the whole vector reads the image)."""
    acc = [[f"a{v}_{j}" for j in range(kb)] for v in range(pv)]
    lines = [f"static void tr_nd_tile{pv}(const float *restrict xp, long HW, long C, long RS, const long *restrict toff,",
             "                          const __mmask16 *restrict tmask, const float *restrict wp, V *restrict accs) {"]
    for v in range(pv):
        lines.append("    V " + ", ".join(f"{a} = VZERO()" for a in acc[v]) + ";")
    lines.append("    for (long t = 0; t < RS; t++) {")
    lines.append("        const float *restrict xc = xp + toff[t];")
    lines.append("        const float *restrict wc = wp + t * C * ND_KB;")
    for v in range(pv):
        lines.append(f"        __mmask16 m{v} = tmask[t * ND_PV + {v}];")
    pat = " | ".join(f"((m{v} != 0xFFFF) << {v})" for v in range(pv))
    lines.append(f"        switch ({pat}) {{")
    for p in range(1 << pv):
        lines.append(f"        case {p}:")
        lines.append("        for (long c = 0; c < C; c++) {")
        for v in range(pv):
            load = f"_mm512_maskz_loadu_ps(m{v}, xc + {16 * v})" if p >> v & 1 else f"VLOAD(xc + {16 * v})"
            lines.append(f"            V x{v} = {load};")
        for j in range(kb):
            lines.append(f"            {{ V b = VSET1(wc[{j}]);")
            for v in range(pv):
                lines.append(f"              TR_ACC_FMA({acc[v][j]}, x{v}, b);")
            lines.append("            }")
        lines.append("            xc += HW; wc += ND_KB;")
        lines.append("        }")
        lines.append("        break;")
    lines.append("        }")
    lines.append("    }")
    for v in range(pv):
        for j in range(kb):
            lines.append(f"    accs[{j * npv + v}] = {acc[v][j]};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def nchw_direct_source(npv: int = ND_PV, nkb: int = ND_KB) -> str:
    """C text of ``tr_conv_nd`` (empty on ISAs without AVX-512: ``TR_HAVE_ND`` is then 0)."""
    kernels = "".join(_tile_kernel(pv, nkb, npv) for pv in range(1, npv + 1))
    dispatch = " else ".join(f"if ((pv) == {pv}) tr_nd_tile{pv}(__VA_ARGS__);" for pv in range(npv, 0, -1))
    kernels += f"#define TR_ND_TILE(pv, ...) do {{ {dispatch} }} while (0)\n"
    return (r"""
#if defined(__AVX512F__) && TR_HAVE_T16
#define TR_HAVE_ND 1
""" + f"#define ND_PV {npv}\n#define ND_KB {nkb}\n" + kernels + r"""
/* Whether tr_conv_nd runs this conv: NCHW, stride 1, one group, output rows as wide as the input's. */
static int tr_nd_fits(long C, long W, long R, long S, long sh, long sw, long pw, long dw, long groups, long Q) {
    (void)C; (void)R;
    return sh == 1 && sw == 1 && groups == 1 && Q == W && 2 * pw == dw * (S - 1);
}

/* Masks of the tile of pv vectors at pixel p0 of a P x W output plane: tmask[t*ND_PV + v] has lane l set
   when pixel p0 + 16v + l is in the plane and tap t = r*S + s reads the image there (not the padding). */
static void tr_nd_masks(long p0, int pv, long PQ, long H, long W, long R, long S, long ph, long pw, long dh,
                        long dw, __mmask16 *tmask) {
    int hs[16 * ND_PV], ws[16 * ND_PV];
    for (long l = 0, h = p0 / W, w = p0 % W; l < 16 * pv; l++) {
        hs[l] = (int)h; ws[l] = (int)w;
        if (++w == W) { w = 0; h++; }
    }
    __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int v = 0; v < pv; v++) {
        __m512i p = _mm512_add_epi32(_mm512_set1_epi32((int)(p0 + 16 * v)), lane);
        __mmask16 in = _mm512_cmplt_epi32_mask(p, _mm512_set1_epi32((int)PQ));
        __m512i h = _mm512_loadu_si512(hs + 16 * v), w = _mm512_loadu_si512(ws + 16 * v);
        for (long r = 0; r < R; r++) {
            __m512i hr = _mm512_add_epi32(h, _mm512_set1_epi32((int)(r * dh - ph)));
            __mmask16 mr = in & _mm512_cmpge_epi32_mask(hr, _mm512_setzero_si512())
                              & _mm512_cmplt_epi32_mask(hr, _mm512_set1_epi32((int)H));
            for (long s = 0; s < S; s++) {
                __m512i wsv = _mm512_add_epi32(w, _mm512_set1_epi32((int)(s * dw - pw)));
                tmask[(r * S + s) * ND_PV + v] = mr & _mm512_cmpge_epi32_mask(wsv, _mm512_setzero_si512())
                                                    & _mm512_cmplt_epi32_mask(wsv, _mm512_set1_epi32((int)W));
            }
        }
    }
}

/* Tile ti of an image of nvec 16-pixel vectors: its first pixel and vector count. Tiles hold ND_PV vectors;
   a short last tile is evened out with the one before (3 + 1 vectors run as 2 + 2: a 1-vector tile does
   one load per ND_KB FMAs). */
static long tr_nd_tile_at(long ti, long nvec, int *pv) {
    long tpi = (nvec + ND_PV - 1) / ND_PV, rem = nvec % ND_PV, v0 = ti * ND_PV;
    *pv = (int)TR_MIN(ND_PV, nvec - v0);
    if (rem && rem < ND_PV - 1 && tpi >= 2 && ti >= tpi - 2) {
        long both = ND_PV + rem, first = (both + 1) / 2;
        v0 = (tpi - 2) * ND_PV + (ti == tpi - 1 ? first : 0);
        *pv = (int)(ti == tpi - 1 ? both - first : first);
    }
    return v0 * 16;
}

/* Packed weights: block b (output channels b*ND_KB ..), wp[b*RS*C*ND_KB + (t*C + c)*ND_KB + j] =
   w[(b*ND_KB + j)*C*RS + c*RS + t], 0 for channels past K. */
static void tr_nd_pack(const float *w, long K, long C, long RS, long b, float *wp) {
    float *d = wp + b * RS * C * ND_KB;
    for (int j = 0; j < ND_KB; j++) {
        long k = b * ND_KB + j;
        if (k >= K) {
            for (long q = 0; q < RS * C; q++) d[q * ND_KB + j] = 0.0f;
            continue;
        }
        const float *s = w + k * C * RS;
        for (long c = 0; c < C; c++)
            for (long t = 0; t < RS; t++) d[(t * C + c) * ND_KB + j] = s[c * RS + t];
    }
}

/* One tile's accumulators (accs[j*ND_PV + v]: channel j, pixels 16v..) through the epilogue into the
   NCHW output plane of channel k0 + j, lanes past the plane's end left alone. */
static void tr_nd_store(const V *accs, float *out, long PQ, long p0, int kn, int pv, const float *bias, long k0) {
    for (int j = 0; j < kn; j++) {
        float *o = out + (k0 + j) * PQ + p0;
        V bv = TR_HAS_BIAS && bias ? VSET1(bias[k0 + j]) : VZERO();
        for (int v = 0; v < pv; v++) {
            V x = accs[j * ND_PV + v];
            if (TR_HAS_EPI) x = tr_epi(x, bv);
            long left = PQ - p0 - 16 * v;
            if (left >= 16) _mm512_storeu_ps(o + 16 * v, x);
            else _mm512_mask_storeu_ps(o + 16 * v, (__mmask16)((1u << left) - 1), x);
        }
    }
}

#ifndef TR_ND_WANT
#define TR_ND_WANT 2  /* work items per thread (chunks of tiles, dynamic schedule; 64@56^2 batch 1: 2 ran 6% faster than 4, batch 8 alike) */
#endif
#ifndef TR_ND_PFW
#define TR_ND_PFW 1  /* tiles ahead whose output lines are prefetched (0: none) */
#endif
/* Part q of nq of the output lines of a later tile (pv vectors at pixel p0 of the image planes at oi),
   fetched into L2 while this tile runs: without it each tile's stores wait for K x pv lines read for
   ownership (64@56^2 batch 8, 2-core Sapphire Rapids VM: 285 -> 318 GFLOP/s; the input lines of the
   next tile fetched the same way made it slower, 301 -> 294). */
static void tr_nd_prefetch_out(float *oi, long K, long PQ, long p0, int pv, long q, long nq) {
    long k0 = K * q / nq, k1 = K * (q + 1) / nq, pn = TR_MIN(16L * pv, PQ - p0);
    for (long k = k0; k < k1; k++)
        for (long e = 0; e < pn; e += 16) _mm_prefetch((const char *)(oi + k * PQ + p0 + e), _MM_HINT_T1);
}

/* The conv (see the module text); returns 1 when the workspace cannot be had. */
static int tr_conv_nd(long n, long C, long H, long W, long K, long R, long S, long ph, long pw, long dh, long dw,
                      long P, const float *x, const float *w, const float *bias, float *out, int nth) {
    long RS = R * S, HW = H * W, PQ = P * W, nkb = (K + ND_KB - 1) / ND_KB;
    long nvec = (PQ + 15) / 16, tpi = (nvec + ND_PV - 1) / ND_PV, ntile = n * tpi;
    if (nth <= 0) nth = tr_threads_available();
    if ((double)n * PQ * K * C * RS < 65536.0) nth = 1;
    int owned;
    size_t wfloats = TR_ROUNDUP((size_t)nkb * ND_KB * C * RS, 16);
    float *wp = tr_ws_slot(1, wfloats + (size_t)nkb, &owned);
    if (!wp) return 1;
    /* Weight blocks are packed by whichever thread first needs one not claimed yet (claims handed out
       in order from a counter, ready flags tell the others): no barrier that a descheduled thread would
       hold up on a busy machine. */
    int *ready = (int *)(wp + wfloats);
    memset(ready, 0, sizeof(int) * (size_t)nkb);
    long next = 0;
    long want = (long)TR_ND_WANT * nth, chunk = TR_MAX(1, (ntile + want - 1) / want), nchunk = (ntile + chunk - 1) / chunk;
    long t_call = tr_now_ns();
    int done = 0;
    #pragma omp parallel num_threads(nth) if (nth > 1)
    {
        int tid = TR_TID(), T = TR_NT();
        long toff[RS];
        __mmask16 tmask[RS * ND_PV];
        V accs[ND_PV * ND_KB];
        #pragma omp for schedule(dynamic, 1) nowait
        for (long it = 0; it < nchunk; it++) {
            for (long t = it * chunk; t < TR_MIN(ntile, (it + 1) * chunk); t++) {
                int pv, pvn = 0;
                long img = t / tpi, p0 = tr_nd_tile_at(t % tpi, nvec, &pv);
                tr_nd_masks(p0, pv, PQ, H, W, R, S, ph, pw, dh, dw, tmask);
                for (long r = 0; r < R; r++)
                    for (long s = 0; s < S; s++) toff[r * S + s] = p0 + (r * dh - ph) * W + (s * dw - pw);
                const float *xi = x + img * C * HW;
                float *oi = out + img * K * PQ;
                /* the tile TR_ND_PFW ahead in this chunk */
                long tn = t + TR_ND_PFW < TR_MIN(ntile, (it + 1) * chunk) ? t + TR_ND_PFW : -1;
                long pn0 = tn < 0 ? 0 : tr_nd_tile_at(tn % tpi, nvec, &pvn);
                for (long b = 0; b < nkb; b++) {
                    for (int spin = 0; !__atomic_load_n(&ready[b], __ATOMIC_ACQUIRE); spin++) {
                        long q = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
                        if (q < nkb) {
                            tr_nd_pack(w, K, C, RS, q, wp);
                            __atomic_store_n(&ready[q], 1, __ATOMIC_RELEASE);
                        } else {
                            tr_cpu_relax();
                            if (spin > 4096) sched_yield();
                        }
                    }
                    if (TR_ND_PFW && tn >= 0) tr_nd_prefetch_out(out + (tn / tpi) * K * PQ, K, PQ, pn0, pvn, b, nkb);
                    TR_ND_TILE(pv, xi, HW, C, RS, toff, tmask, wp + b * RS * C * ND_KB, accs);
                    tr_nd_store(accs, oi, PQ, p0, (int)TR_MIN(ND_KB, K - b * ND_KB), pv, bias, b * ND_KB);
                }
            }
        }
        tr_join(&done, T, tid, t_call);
    }
    tr_ws_release(1, wp, owned);
    return 0;
}
#else
#define TR_HAVE_ND 0
#endif
""")
