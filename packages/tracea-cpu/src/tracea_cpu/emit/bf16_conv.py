"""bf16 conv2d on AVX512_BF16 as an implicit GEMM through the bf16 GEMM library (:mod:`.bf16`): ``tb_conv``.

C(i, j) = sum_k A(i, k) B(k, j) with i = (n, p, q) the output pixels, j the output channels and k = (r, s, c) the
taps, channel fastest. A is never materialised: the blocked and rows drivers of the GEMM pack their A
micro-panels through :c:func:`tb_pack_a`, which for an operand with a geometry (``tb_dense.g``) gathers the
pixels' channel runs, tap by tap, from the NHWC input (``tb_pack_a_conv``: the MR rows of a k pair side by side,
so the panel is written contiguously -- 2-core Zen 4 VM, 64@56^2 b1: 306 -> 362 GFLOP/s against row by row;
taps outside the image and rows past M are zeros). With C even a k pair never straddles two taps, so a pair is one 32-bit word of the input. B is
the weight stored (K, R, S, C) -- n-major with k contiguous, which the GEMM's packer transposes 16 x 16 words at a
time. The output is C row-major: NHWC. ``tb_tr16`` / ``tb_tr32`` transpose (batch, rows, cols) blocks of 16- and
32-bit elements (NCHW input -> NHWC, KCRS weights -> KRSC, NHWC output -> NCHW).
"""

from __future__ import annotations

from tracea.ir.epilogue import Epilogue

from ..isa import Isa
from .bf16 import BF16_LAYER, DRIVER, PACKERS, _store, microkernel_c
from .common import epilogue_c, prologue

CONV = r"""
/* geo (N, H, W, C, K, P, Q, R, S, stride h / w, padding h / w, dilation h / w) -> the input's geometry. */
static tb_geom tb_geom_of(const long *geo) {
    tb_geom g = {geo[1], geo[2], geo[3], geo[5], geo[6], geo[7], geo[8], geo[9], geo[10], geo[11], geo[12],
                 geo[13], geo[14]};
    return g;
}

/* Output pixel pix (over all images): the input position of its tap (0, 0) (may lie in the padding) and the
   base of its image in the NHWC input x. */
static inline const bf16 *tb_origin(const tb_geom *g, const bf16 *x, long pix, long *h0, long *w0) {
    long pq = g->P * g->Q, n = pix / pq, rem = pix - n * pq, p = rem / g->Q, q = rem - p * g->Q;
    *h0 = p * g->sh - g->ph;
    *w0 = q * g->sw - g->pw;
    return x + n * g->H * g->W * g->C;
}

static inline int tb_inside(const tb_geom *g, long hh, long ww) { return hh >= 0 && hh < g->H && ww >= 0 && ww < g->W; }

/* A micro-panel of an implicit-GEMM conv: pixels [i0, i0+mr), k in [p0, p0+kc) with k = (r*S + s)*C + c. p0 is
   even and C is even, so each k pair is one 32-bit word of one pixel's channel run. */
static void tb_pack_a_conv(const tb_dense *x, long i0, long mr, long p0, long kc, uint32_t *dst) {
    const tb_geom *g = x->g;
    long kp = tb_pairs(kc), kend = p0 + kc;
    long h0[MR], w0[MR];
    const bf16 *img[MR];
    for (int i = 0; i < MR; i++) {
        img[i] = tb_origin(g, x->p, i0 + (i < mr ? i : 0), &h0[i], &w0[i]);
        if (i >= mr) h0[i] = -(1L << 40);  /* rows past mr: never inside the image */
    }
    /* run by run (one tap's channels), all MR rows per k pair: the panel is written contiguously */
    for (long k = p0; k < kend;) {
        long tap = k / g->C, c = k - tap * g->C, r = tap / g->S, s = tap - r * g->S;
        long run = TR_MIN(g->C - c, kend - k), pairs = run >> 1;
        const bf16 *src[MR];
        for (int i = 0; i < MR; i++) {
            long hh = h0[i] + r * g->dh, ww = w0[i] + s * g->dw;
            src[i] = tb_inside(g, hh, ww) ? img[i] + (hh * g->W + ww) * g->C + c : 0;
        }
        uint32_t *dd = dst + ((k - p0) >> 1) * MR;
        for (long u = 0; u < pairs; u++, dd += MR)
            for (int i = 0; i < MR; i++) {
                uint32_t v = 0;
                if (src[i]) memcpy(&v, src[i] + 2 * u, 4);
                dd[i] = v;
            }
        if (run & 1)  /* the last k of an odd block: its pair's high half stays zero */
            for (int i = 0; i < MR; i++) dd[i] = src[i] ? src[i][run - 1] : 0;
        k += run;
    }
    if ((kc + 1) / 2 < kp) memset(dst + (kc + 1) / 2 * MR, 0, sizeof(uint32_t) * (kp - (kc + 1) / 2) * MR);
}

/* 8 x 8 16-bit and 4 x 4 32-bit transposes in SSE registers: s rows at stride ss, d rows at stride ds. */
static inline void tb_t8x8_16(const uint16_t *s, long ss, uint16_t *d, long ds) {
    __m128i r[8], a[8], b[8];
    for (int i = 0; i < 8; i++) r[i] = _mm_loadu_si128((const __m128i *)(s + i * ss));
    for (int i = 0; i < 4; i++) {
        a[2 * i] = _mm_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        b[4 * i] = _mm_unpacklo_epi32(a[4 * i], a[4 * i + 2]);
        b[4 * i + 1] = _mm_unpackhi_epi32(a[4 * i], a[4 * i + 2]);
        b[4 * i + 2] = _mm_unpacklo_epi32(a[4 * i + 1], a[4 * i + 3]);
        b[4 * i + 3] = _mm_unpackhi_epi32(a[4 * i + 1], a[4 * i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        _mm_storeu_si128((__m128i *)(d + (2 * i) * ds), _mm_unpacklo_epi64(b[i], b[4 + i]));
        _mm_storeu_si128((__m128i *)(d + (2 * i + 1) * ds), _mm_unpackhi_epi64(b[i], b[4 + i]));
    }
}
static inline void tb_t4x4_32(const uint32_t *s, long ss, uint32_t *d, long ds) {
    __m128 r0 = _mm_loadu_ps((const float *)s), r1 = _mm_loadu_ps((const float *)(s + ss));
    __m128 r2 = _mm_loadu_ps((const float *)(s + 2 * ss)), r3 = _mm_loadu_ps((const float *)(s + 3 * ss));
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    _mm_storeu_ps((float *)d, r0); _mm_storeu_ps((float *)(d + ds), r1);
    _mm_storeu_ps((float *)(d + 2 * ds), r2); _mm_storeu_ps((float *)(d + 3 * ds), r3);
}

/* (batch, rows, cols) -> (batch, cols, rows): 32 x 32 blocks over the threads, each by register tiles of V x V
   (SSE) and element by element at the edges. */
#define TB_TRANSPOSE(NAME, T, V, TILE)                                                                 \
int NAME(const T *src, T *dst, long batch, long rows, long cols, int nth) {                          \
    long rb = (rows + 31) / 32, cb = (cols + 31) / 32, nb = batch * rb * cb;                            \
    if (nth <= 0) nth = tr_threads_available();                                                         \
    if ((double)batch * rows * cols < 65536.0) nth = 1;                                                 \
    _Pragma("omp parallel for schedule(static) num_threads(nth) if (nth > 1)")                         \
    for (long t = 0; t < nb; t++) {                                                                     \
        long b = t / (rb * cb), u = t - b * rb * cb, r0 = (u / cb) * 32, c0 = (u % cb) * 32;            \
        long r1 = TR_MIN(rows, r0 + 32), c1 = TR_MIN(cols, c0 + 32);                                     \
        const T *s = src + b * rows * cols;                                                             \
        T *d = dst + b * rows * cols;                                                                   \
        long rv = r0 + (r1 - r0) / V * V, cv = c0 + (c1 - c0) / V * V;                                  \
        for (long r = r0; r < rv; r += V)                                                               \
            for (long c = c0; c < cv; c += V) TILE(s + r * cols + c, cols, d + c * rows + r, rows);     \
        for (long c = c0; c < c1; c++)                                                                  \
            for (long r = (c < cv ? rv : r0); r < r1; r++) d[c * rows + r] = s[r * cols + c];           \
    }                                                                                                   \
    return 0;                                                                                           \
}
TB_TRANSPOSE(tb_tr16, uint16_t, 8, tb_t8x8_16)
TB_TRANSPOSE(tb_tr32, uint32_t, 4, tb_t4x4_32)

/* The conv: x NHWC bf16, w (K, R, S, C) bf16, out NHWC ((N*P*Q) x K row-major), fp32 or bf16 (out_bf16).
   geo: N, H, W, C, K, P, Q, R, S, stride h / w, padding h / w, dilation h / w. bias: fp32 per output
   channel or null. Returns 0, 1 (workspace allocation failed) or 2 (bad call). */
/* Words of the VNNI weight panels of the direct conv: ceil(K_out / NR) panels of R*S*C/2 pairs x NR. */
long tb_conv_bwords(long kout, long k) { return (kout + NR - 1) / NR * (k / 2) * NR; }

/* Pack KRSC bf16 weights (kout x k, k = R*S*C, C even) into those panels. */
int tb_conv_pack_w(const bf16 *w, long kout, long k, uint32_t *dst, int nth) {
    long npan = (kout + NR - 1) / NR, words = (k / 2) * NR;
    tb_dense B = {w, 1, k, 0};
    if (nth <= 0) nth = tr_threads_available();
    #pragma omp parallel for schedule(dynamic, 1) num_threads(nth) if (nth > 1 && npan > 1)
    for (long p = 0; p < npan; p++) {
        /* tb_pack_b pads the pair count to a multiple of KU: pack into a scratch panel, keep k / 2 pairs */
        long kp = tb_pairs(k);
        uint32_t *tmp = (uint32_t *)malloc(sizeof(uint32_t) * kp * NR);
        if (tmp) {
            tb_pack_b(&B, p * NR, TR_MIN(NR, kout - p * NR), 0, k, tmp);
            memcpy(dst + p * words, tmp, sizeof(uint32_t) * words);
            free(tmp);
        }
    }
    return 0;
}

/* The direct conv: x NHWC bf16 (C even), wp the packed panels (tb_conv_pack_w), out NHWC fp32 or bf16, bias fp32
   per output channel or null; geo as tb_conv's. Tiles of MR pixels x NR channels, each over all of K (no
   partial sums), panel by panel so a panel stays in cache while the pixel tiles stream past it. */
int tb_conv_ind(const long *geo, const bf16 *x, const uint32_t *wp, void *out, int out_bf16, const float *bias,
                long mb, int nth) {
    tb_geom g = tb_geom_of(geo);
    long W = g.W, C = g.C, KO = geo[4], R = g.R, S = g.S;
    if (C & 1) return 2;
    long M = geo[0] * g.P * g.Q, taps = R * S, cp = C / 2, npan = (KO + NR - 1) / NR, words = taps * cp * NR;
    long ntile = (M + MR - 1) / MR, mbt = TR_MAX(1, mb / MR), nmb = (ntile + mbt - 1) / mbt;
    uint32_t *zero = (uint32_t *)calloc((size_t)cp + 16, sizeof(uint32_t));
    if (!zero) return 1;
    if (nth <= 0) nth = tr_threads_available();
    if ((double)M * KO * C * taps < 65536.0) nth = 1;
    #pragma omp parallel num_threads(nth) if (nth > 1)
    {
        const uint32_t *rows[64 * MR];  /* taps x MR run pointers of one tile (taps <= 64 here) */
        const uint32_t **rp = taps <= 64 ? rows : (const uint32_t **)malloc(sizeof(void *) * taps * MR);
        #pragma omp for schedule(dynamic, 1)
        for (long it = 0; it < npan * nmb; it++) {
            long pan = it / nmb, blk = it % nmb, j = pan * NR;
            int nr = (int)TR_MIN(NR, KO - j);
            for (long tile = blk * mbt; tile < TR_MIN(ntile, (blk + 1) * mbt); tile++) {
                long i0 = tile * MR;
                int mr = (int)TR_MIN(MR, M - i0);
                for (int i = 0; i < MR; i++) {
                    long h0, w0;
                    const bf16 *img = tb_origin(&g, x, i0 + (i < mr ? i : 0), &h0, &w0);
                    for (long r = 0; r < R; r++)
                        for (long s = 0; s < S; s++) {
                            long hh = h0 + r * g.dh, ww = w0 + s * g.dw;
                            int ok = i < mr && tb_inside(&g, hh, ww);
                            rp[(r * S + s) * MR + i] = ok ? (const uint32_t *)(img + (hh * W + ww) * C) : zero;
                        }
                }
                if (out_bf16)
                    tb_ukernel_conv(taps, cp, rp, wp + pan * words, 0, 0, (bf16 *)out + i0 * KO + j, KO, mr, nr,
                                    bias ? bias + j : 0);
                else
                    tb_ukernel_conv(taps, cp, rp, wp + pan * words, (float *)out + i0 * KO + j, KO, 0, 0, mr, nr,
                                    bias ? bias + j : 0);
            }
        }
        if (rp != rows) free((void *)rp);
    }
    free(zero);
    return 0;
}

int tb_conv(const long *geo, const bf16 *x, const bf16 *w, void *out, int out_bf16, const float *bias,
            long mc, long nc, long kc, int nth) {
    if (geo[3] & 1) return 2;
    tb_geom g = tb_geom_of(geo);
    long M = geo[0] * geo[5] * geo[6], N = geo[4], K = geo[7] * geo[8] * geo[3];
    tb_dense A = {x, 0, 0, &g}, B = {w, 1, K, 0};
    long kcb = TR_MIN(TR_ROUNDUP(TR_MAX(kc, 2 * KU), 2 * KU), TR_ROUNDUP(K, 2 * KU));
    int owned = 0;
    float *part = 0;
    if (out_bf16 && K > kcb) {
        part = tr_ws_slot(1, (size_t)M * N, &owned);
        if (!part) return 1;
    }
    int rc = out_bf16 ? tb_drive(M, N, K, &A, &B, part, N, (bf16 *)out, N, bias, mc, nc, kc, nth)
                      : tb_drive(M, N, K, &A, &B, (float *)out, N, 0, 0, bias, mc, nc, kc, nth);
    if (part) tr_ws_release(1, part, owned);
    return rc;
}
"""



def conv_microkernel_c(mr: int, nr: int, ku: int) -> str:
    """``tb_ukernel_conv``: an mr x nr tile of the conv over every tap, A read in place: per tap, row ``i`` of the
    tile is the channel-pair run ``rows[tap * MR + i]`` (a zero run for taps outside the image and rows past mr),
    B the packed VNNI panel of the whole K (tap-major, ``cp`` pairs per tap). All of K in registers: the epilogue
    and the store follow at once (``_store``'s code with first = last = 1)."""
    nv = nr // 16
    acc = [[f"c{i}_{v}" for v in range(nv)] for i in range(mr)]
    lines = ["static void tb_ukernel_conv(long taps, long cp, const uint32_t *const *rows, const uint32_t *restrict b,\n"
             "                            float *restrict c, long ldc, bf16 *restrict o, long ldo, int mr, int nr,\n"
             "                            const float *bias) {",
             "    const int first = 1, last = 1;"]
    for i in range(mr):
        lines.append("    __m512 " + ", ".join(f"{n} = _mm512_setzero_ps()" for n in acc[i]) + ";")
    lines.append("    for (long tap = 0; tap < taps; tap++, rows += MR) {")
    lines.append("        " + " ".join(f"const uint32_t *a{i} = rows[{i}];" for i in range(mr)))
    lines.append("        long t = 0;")
    lines.append(f"        for (; t + {ku} <= cp; t += {ku}, b += {ku * nr}) {{")
    for u in range(ku):
        lines += ["            {"] + _pair_step(acc, f"{u * nr} + ", f"t + {u}") + ["            }"]
    lines.append("        }")
    lines.append(f"        for (; t < cp; t++, b += {nr}) {{")
    lines += _pair_step(acc, "", "t")
    lines.append("        }")
    lines.append("    }")
    lines += _store(mr, nr, acc)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _pair_step(acc: list[list[str]], b_off: str, t: str) -> list[str]:
    """One k pair of the conv micro-kernel: the B vectors at ``b + b_off``, each row's word ``a<i>[t]`` broadcast."""
    out = [f"            __m512i b{v} = _mm512_loadu_si512(b + {b_off}{v * 16});" for v in range(len(acc[0]))]
    for i, row in enumerate(acc):
        out.append(f"            {{ __m512i ai = _mm512_set1_epi32((int)a{i}[{t}]);")
        out += [f"              {name} = BDOT({name}, b{v}, ai);" for v, name in enumerate(row)]
        out.append("            }")
    return out

def bf16_conv_source(isa: Isa, mr: int, nr: int, epilogue: Epilogue, ku: int = 4) -> str:
    """Complete C source of the bf16 conv library (the GEMM library's kernel, packers and drivers, with
    ``tb_conv``) for one register tile and epilogue chain."""
    if nr % 16 or mr * (nr // 16) + nr // 16 + 1 > 32:
        raise ValueError(f"tile {mr}x{nr} does not fit the 32 zmm registers")
    return "\n".join([prologue(isa), "#define TB_CONV 1", BF16_LAYER, epilogue_c(epilogue), microkernel_c(mr, nr, ku),
                      conv_microkernel_c(mr, nr, ku), PACKERS, DRIVER, CONV])
