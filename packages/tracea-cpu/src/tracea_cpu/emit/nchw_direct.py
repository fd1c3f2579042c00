"""Direct NCHW conv2d with output pixels in the vector lanes (AVX-512 and AVX2): ``tr_conv_nd``.

For a stride-1 NCHW conv whose output rows are as wide as the input rows (``Q == W``, e.g. a 3x3
"same" conv), the flattened output pixels p = h*W + w of one image and the input pixels a tap reads,
p + (r*dh - ph)*W + (s*dw - pw), are both contiguous runs of one input channel plane. So a tile of
``ND_PV`` x VW consecutive output pixels x ``ND_KB`` output channels (VW = 16 lanes on AVX-512, 8 on
AVX2) is a sum over (tap, input channel) of one masked vector load per VW pixels (zero where the tap
falls in the padding or past the plane) times one broadcast weight per output channel: the input is
read in place from NCHW and the tile is stored straight into the NCHW output, with no NHWC copy of the
input, no transposed store and no im2col. The weights are packed once per call, ``ND_KB`` output
channels at a time in (tap, c, j) order, so each broadcast reads the next float. Padding taps are
multiplied like any other (a zero times the weight), so a NaN / Inf weight gives PyTorch's NaN at the
border outputs without a second run, and nothing is skipped.

Work items are chunks of tiles over all images (dynamic schedule); per tile every output-channel
block runs against the same input lines (kept in L1 / L2 across the blocks).

The two ISAs share the driver and differ in the mask representation: AVX-512 ``__mmask16`` registers
(``_mm512_maskz_loadu_ps``), AVX2 integer vectors with all-ones lanes (``_mm256_maskload_ps``, which
does not fault on masked-off lanes that fall outside the buffer, like the AVX-512 masked load). On AVX2
(2 x 8 pixels x 6 channels per tile) the reduction of a tile runs in parts -- one tap row x at most
``TR_ND_CB`` input channels -- over a group of output-channel blocks whose accumulators wait in memory
between the parts, so every block of the group reads the part's input lines from L1; the AVX-512 text
is the one measured on Sapphire Rapids, unchanged (one pass over all taps and channels per block).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from ..isa import Isa

#: AVX-512 tile: vectors of 16 pixels per tile and output channels per tile (``ND_PV * ND_KB``
#: accumulators of 32 zmm registers; 4 x 6 and 2 x 12 ran 299 / 300 against 322 GFLOP/s, see
#: docs/backends/cpu.md "Measured: direct NCHW conv").
ND_PV = 3
ND_KB = 8
#: AVX2 tile: 2 vectors of 8 pixels x 6 output channels (12 accumulators, 2 input vectors and one
#: broadcast weight: 15 of the 16 ymm registers). 2-core AMD EPYC Zen 3 VM (AVX2), two threads, against
#: F.conv2d interleaved (probes/nchw_direct_tiles.py, 20:38 UTC): 2 x 6 ran 0.92x / 0.98x / 1.13x / 1.17x
#: at 64@56^2 b8 / 128@28^2 b8 / 64@56^2 b1 / 128@28^2 b1 where 3 x 4 (3 loads and 4 broadcasts per 12
#: FMAs) ran 0.88x / 0.95x / 1.10x / 1.08x; 2 x 6 also ahead on one thread (0.89-0.96x vs 0.86-0.95x).
ND_PV_AVX2 = 2
ND_KB_AVX2 = 6


@dataclass(frozen=True)
class _Spelling:
    """The ISA-specific C spellings of the direct conv: vector width, mask type, how a mask is tested
    for all lanes set, a masked (zeroing) load, the mask builder and the masked tile store."""

    guard: str
    vw: int
    mask_t: str
    partial: str  # format with v: whether mask m{v} leaves some lane off
    mload: str  # format with v, off: zero-masked load of xc + off under m{v}
    masks: str
    store: str
    split: bool  # the reduction in parts (tap row x channel chunk) with a group of blocks' accumulators in memory


_MASKS_512 = r"""/* Masks of the tile of pv vectors at pixel p0 of a P x W output plane: tmask[t*ND_PV + v] has lane l set
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
"""

_MASKS_256 = r"""/* Masks of the tile of pv vectors at pixel p0 of a P x W output plane: tmask[t*ND_PV + v] has lane l all
   ones when pixel p0 + 8v + l is in the plane and tap t = r*S + s reads the image there (not the padding). */
static void tr_nd_masks(long p0, int pv, long PQ, long H, long W, long R, long S, long ph, long pw, long dh,
                        long dw, __m256i *tmask) {
    int hs[8 * ND_PV], ws[8 * ND_PV];
    for (long l = 0, h = p0 / W, w = p0 % W; l < 8 * pv; l++) {
        hs[l] = (int)h; ws[l] = (int)w;
        if (++w == W) { w = 0; h++; }
    }
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), none = _mm256_set1_epi32(-1);
    for (int v = 0; v < pv; v++) {
        __m256i p = _mm256_add_epi32(_mm256_set1_epi32((int)(p0 + 8 * v)), lane);
        __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)PQ), p);
        __m256i h = _mm256_loadu_si256((const __m256i *)(hs + 8 * v));
        __m256i w = _mm256_loadu_si256((const __m256i *)(ws + 8 * v));
        for (long r = 0; r < R; r++) {
            __m256i hr = _mm256_add_epi32(h, _mm256_set1_epi32((int)(r * dh - ph)));
            __m256i mr = _mm256_and_si256(in, _mm256_and_si256(_mm256_cmpgt_epi32(hr, none),
                                                               _mm256_cmpgt_epi32(_mm256_set1_epi32((int)H), hr)));
            for (long s = 0; s < S; s++) {
                __m256i wsv = _mm256_add_epi32(w, _mm256_set1_epi32((int)(s * dw - pw)));
                tmask[(r * S + s) * ND_PV + v] = _mm256_and_si256(mr, _mm256_and_si256(
                    _mm256_cmpgt_epi32(wsv, none), _mm256_cmpgt_epi32(_mm256_set1_epi32((int)W), wsv)));
            }
        }
    }
}
"""

_STORE_512 = r"""            long left = PQ - p0 - 16 * v;
            if (left >= 16) _mm512_storeu_ps(o + 16 * v, x);
            else _mm512_mask_storeu_ps(o + 16 * v, (__mmask16)((1u << left) - 1), x);
"""

_STORE_256 = r"""            long left = PQ - p0 - 8 * v;
            if (left >= 8) _mm256_storeu_ps(o + 8 * v, x);
            else _mm256_maskstore_ps(o + 8 * v, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)left),
                                                                   _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), x);
"""

#: Weight block b before its first use: packed by whichever thread first claims a block not packed yet
#: (claims handed out in order from a counter), ready flags tell the others (see tr_conv_nd)
_CLAIM = r"""for (int spin = 0; !__atomic_load_n(&ready[b], __ATOMIC_ACQUIRE); spin++) {
    long q = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
    if (q < nkb) {
        tr_nd_pack(w, K, C, RS, q, wp);
        __atomic_store_n(&ready[q], 1, __ATOMIC_RELEASE);
    } else {
        tr_cpu_relax();
        if (spin > 4096) sched_yield();
    }
}
"""


def _claim(indent: int) -> str:
    """:data:`_CLAIM` indented by ``indent`` spaces."""
    return textwrap.indent(_CLAIM, " " * indent)


_BLOCKS_WHOLE = r"""                for (long b = 0; b < nkb; b++) {
@CLAIM20@
                    if (TR_ND_PFW && tn >= 0) tr_nd_prefetch_out(out + (tn / tpi) * K * PQ, K, PQ, pn0, pvn, b, nkb);
                    TR_ND_TILE(pv, xi, HW, C, RS, toff, tmask, wp + b * RS * C * ND_KB, accs);
                    tr_nd_store(accs, oi, PQ, p0, (int)TR_MIN(ND_KB, K - b * ND_KB), pv, bias, b * ND_KB);
                }
"""
_ACCS_WHOLE = "        V accs[ND_PV * ND_KB];\n"

_BLOCKS_SPLIT = r"""                /* Output-channel blocks in groups whose accumulators stay in accs while the reduction runs in
                   parts of one tap row x at most TR_ND_CB input channels: every block of the group reads the
                   part's input lines from L1 (one pass over all taps and channels per block read them from L2) */
                for (long g0 = 0; g0 < nkb; g0 += gsz) {
                    long g1 = TR_MIN(nkb, g0 + gsz);
                    for (long r = 0; r < R; r++)
                        for (long c0 = 0; c0 < C; c0 += cbs)
                            for (long b = g0; b < g1; b++) {
                                if (r == 0 && c0 == 0) {
@CLAIM36@
                                    if (TR_ND_PFW && tn >= 0)
                                        tr_nd_prefetch_out(out + (tn / tpi) * K * PQ, K, PQ, pn0, pvn, b, nkb);
                                }
                                TR_ND_TILE(pv, xi, HW, C, r * S, (r + 1) * S, c0, TR_MIN(C, c0 + cbs), toff, tmask,
                                           wp + b * RS * C * ND_KB, accs + (b - g0) * ND_PV * ND_KB, r == 0 && c0 == 0);
                            }
                    for (long b = g0; b < g1; b++)
                        tr_nd_store(accs + (b - g0) * ND_PV * ND_KB, oi, PQ, p0, (int)TR_MIN(ND_KB, K - b * ND_KB), pv,
                                    bias, b * ND_KB);
                }
"""
_ACCS_SPLIT = r"""        V accs[TR_ND_GROUP * ND_PV * ND_KB];
        long ngr = (nkb + TR_ND_GROUP - 1) / TR_ND_GROUP, gsz = (nkb + ngr - 1) / ngr;
        long ncb = (C + TR_ND_CB - 1) / TR_ND_CB, cbs = (C + ncb - 1) / ncb;
"""
_SPLIT_KNOBS = r"""#ifndef TR_ND_WANT
#define TR_ND_WANT 8  /* work items per thread (Zen 3 VM, 2 x 6 tiles: 8 ran 0.92x / 1.07x / 1.12x / 1.21x F.conv2d at 64@56^2 b8 / 128@28^2 b8 / 64@56^2 b1 / 128@28^2 b1 against 0.92x / 1.01x / 1.06x / 1.18x for 2) */
#endif
#ifndef TR_ND_GROUP
#define TR_ND_GROUP 16  /* output-channel blocks whose accumulators wait in memory across the reduction's parts (Zen 3
                           VM, 2 x 6 tiles, F.conv2d ratios 64@56^2 / 128@28^2 b8 and b1: 0.92 / 0.98 / 1.13 / 1.17x
                           against 0.91 / 0.97 / 1.10 / 1.11x for 1, the whole reduction per block) */
#endif
#ifndef TR_ND_CB
#define TR_ND_CB 64  /* most input channels per part of the reduction (with one tap row; 32 ran alike at 64@56^2 b8) */
#endif
"""

_AVX512 = _Spelling("#if defined(__AVX512F__) && TR_HAVE_T16", 16, "__mmask16", "(m{v} != 0xFFFF)",
                    "_mm512_maskz_loadu_ps(m{v}, xc + {off})", _MASKS_512, _STORE_512, False)
_AVX2 = _Spelling("#if defined(__AVX2__) && defined(__FMA__)", 8, "__m256i",
                  "(_mm256_movemask_ps(_mm256_castsi256_ps(m{v})) != 0xFF)", "_mm256_maskload_ps(xc + {off}, m{v})",
                  _MASKS_256, _STORE_256, True)


def _tile_kernel(sp: _Spelling, pv: int, kb: int, npv: int) -> str:
    """``tr_nd_tile<pv>``: one tile's accumulators over every tap and input channel. Per tap, the
    channel loop is specialised by which of the pv vectors need a masked load (a masked load costs a
    vector-ALU slot next to the FMAs: plain loads where the whole vector reads the image)."""
    acc = [[f"a{v}_{j}" for j in range(kb)] for v in range(pv)]
    if sp.split:
        lines = [f"static void tr_nd_tile{pv}(const float *restrict xp, long HW, long C, long t0, long t1, long c0, long c1,",
                 f"                          const long *restrict toff, const {sp.mask_t} *restrict tmask,",
                 "                          const float *restrict wp, V *restrict accs, int init) {"]
        for v in range(pv):
            lines.append("    V " + ", ".join(f"{a} = init ? VZERO() : accs[{j * npv + v}]" for j, a in enumerate(acc[v]))
                         + ";")
        lines.append("    for (long t = t0; t < t1; t++) {")
        lines.append("        const float *restrict xc = xp + toff[t] + c0 * HW;")
        lines.append("        const float *restrict wc = wp + (t * C + c0) * ND_KB;")
    else:
        lines = [f"static void tr_nd_tile{pv}(const float *restrict xp, long HW, long C, long RS, const long *restrict toff,",
                 f"                          const {sp.mask_t} *restrict tmask, const float *restrict wp, V *restrict accs) {{"]
        for v in range(pv):
            lines.append("    V " + ", ".join(f"{a} = VZERO()" for a in acc[v]) + ";")
        lines.append("    for (long t = 0; t < RS; t++) {")
        lines.append("        const float *restrict xc = xp + toff[t];")
        lines.append("        const float *restrict wc = wp + t * C * ND_KB;")
    for v in range(pv):
        lines.append(f"        {sp.mask_t} m{v} = tmask[t * ND_PV + {v}];")
    pat = " | ".join(f"({sp.partial.format(v=v)} << {v})" for v in range(pv))
    lines.append(f"        switch ({pat}) {{")
    for p in range(1 << pv):
        lines.append(f"        case {p}:")
        lines.append("        for (long c = c0; c < c1; c++) {" if sp.split else "        for (long c = 0; c < C; c++) {")
        for v in range(pv):
            load = sp.mload.format(v=v, off=sp.vw * v) if p >> v & 1 else f"VLOAD(xc + {sp.vw * v})"
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


def nchw_direct_tile(isa: Isa) -> tuple[int, int]:
    """(vectors, output channels) of the direct conv's tile on ``isa`` (AVX2: its own; else AVX-512's)."""
    return (ND_PV_AVX2, ND_KB_AVX2) if isa.name == "avx2" else (ND_PV, ND_KB)


def nchw_direct_source(isa: Isa | None = None, npv: int | None = None, nkb: int | None = None) -> str:
    """C text of ``tr_conv_nd`` for ``isa``: the AVX2 kernel for ``avx2``, else the AVX-512 one (guarded
    by ``__AVX512F__``: ISAs without AVX-512 get ``TR_HAVE_ND`` 0). ``npv`` / ``nkb``: the tile, by
    default :func:`nchw_direct_tile` (other tiles are for measuring)."""
    avx2 = isa is not None and isa.name == "avx2"
    sp = _AVX2 if avx2 else _AVX512
    dpv, dkb = nchw_direct_tile(isa) if isa is not None else (ND_PV, ND_KB)
    npv, nkb = npv or dpv, nkb or dkb
    vw = sp.vw
    kernels = "".join(_tile_kernel(sp, pv, nkb, npv) for pv in range(1, npv + 1))
    dispatch = " else ".join(f"if ((pv) == {pv}) tr_nd_tile{pv}(__VA_ARGS__);" for pv in range(npv, 0, -1))
    kernels += f"#define TR_ND_TILE(pv, ...) do {{ {dispatch} }} while (0)\n"
    body = (_BODY.replace("@MASKS@", sp.masks).replace("@STORE@", sp.store).replace("@MT@", sp.mask_t)
            .replace("@VW1@", str(vw - 1)).replace("@VW@", str(vw))
            .replace("@ACCS@", _ACCS_SPLIT if sp.split else _ACCS_WHOLE)
            .replace("@BLOCKS@", _BLOCKS_SPLIT if sp.split else _BLOCKS_WHOLE)
            .replace("@CLAIM20@\n", _claim(20)).replace("@CLAIM36@\n", _claim(36)))
    knobs = _SPLIT_KNOBS if sp.split else ""
    return f"\n{sp.guard}\n#define TR_HAVE_ND 1\n#define ND_PV {npv}\n#define ND_KB {nkb}\n" + knobs + kernels + body


_BODY = r"""
/* Whether tr_conv_nd runs this conv: NCHW, stride 1, one group, output rows as wide as the input's. */
static int tr_nd_fits(long C, long W, long R, long S, long sh, long sw, long pw, long dw, long groups, long Q) {
    (void)C; (void)R;
    return sh == 1 && sw == 1 && groups == 1 && Q == W && 2 * pw == dw * (S - 1);
}

@MASKS@
/* Tile ti of an image of nvec @VW@-pixel vectors: its first pixel and vector count. Tiles hold ND_PV vectors;
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
    return v0 * @VW@;
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

/* One tile's accumulators (accs[j*ND_PV + v]: channel j, pixels @VW@v..) through the epilogue into the
   NCHW output plane of channel k0 + j, lanes past the plane's end left alone. */
static void tr_nd_store(const V *accs, float *out, long PQ, long p0, int kn, int pv, const float *bias, long k0) {
    for (int j = 0; j < kn; j++) {
        float *o = out + (k0 + j) * PQ + p0;
        V bv = TR_HAS_BIAS && bias ? VSET1(bias[k0 + j]) : VZERO();
        for (int v = 0; v < pv; v++) {
            V x = accs[j * ND_PV + v];
            if (TR_HAS_EPI) x = tr_epi(x, bv);
@STORE@        }
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
    long k0 = K * q / nq, k1 = K * (q + 1) / nq, pn = TR_MIN(@VW@L * pv, PQ - p0);
    for (long k = k0; k < k1; k++)
        for (long e = 0; e < pn; e += 16) _mm_prefetch((const char *)(oi + k * PQ + p0 + e), _MM_HINT_T1);
}

/* The conv (see the module text); returns 1 when the workspace cannot be had. */
static int tr_conv_nd(long n, long C, long H, long W, long K, long R, long S, long ph, long pw, long dh, long dw,
                      long P, const float *x, const float *w, const float *bias, float *out, int nth) {
    long RS = R * S, HW = H * W, PQ = P * W, nkb = (K + ND_KB - 1) / ND_KB;
    long nvec = (PQ + @VW1@) / @VW@, tpi = (nvec + ND_PV - 1) / ND_PV, ntile = n * tpi;
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
        @MT@ tmask[RS * ND_PV];
@ACCS@        #pragma omp for schedule(dynamic, 1) nowait
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
@BLOCKS@            }
        }
        tr_join(&done, T, tid, t_call);
    }
    tr_ws_release(1, wp, owned);
    return 0;
}
#else
#define TR_HAVE_ND 0
#endif
"""
