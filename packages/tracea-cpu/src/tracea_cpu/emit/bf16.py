"""bf16 GEMM on AVX512_BF16: ``vdpbf16ps`` micro-kernel, k-pair-interleaved packers and two drivers
(the blocked one; one for few rows against transposed weights), emitted as one C library (``tb_gemm``).

``vdpbf16ps`` adds two bf16 products per fp32 lane: lane j of ``acc += dot(a, b)`` gets
``a[2j] * b[2j] + a[2j+1] * b[2j+1]``. Packed operands therefore hold *k pairs* as 32-bit words:
the B micro-panel is ``b[t*NR + j] = (B(2t, j), B(2t+1, j))`` (one zmm = 16 columns of one k pair),
the A micro-panel is ``a[t*MR + i] = (A(i, 2t), A(i, 2t+1))`` (broadcast as one 32-bit word). An odd
K is padded with a zero bf16 in the last pair, and the pair count with zero pairs to a multiple of
the unroll KU. Accumulation is fp32; C is fp32, or bf16 rounded to nearest even (``vcvtneps2bf16``)
on the last K block, after the fp32 epilogue. With a bf16 output and more than one K block the
partial sums go through an fp32 workspace.
"""

from __future__ import annotations

from tracea.ir.epilogue import Epilogue

from ..isa import Isa
from .common import epilogue_c, prologue

BF16_LAYER = r"""
typedef uint16_t bf16;
#define BDOT(acc, b, a) _mm512_dpbf16_ps((acc), (__m512bh)(b), (__m512bh)(a))
/* 16 fp32 lanes -> 16 bf16, round to nearest even (NaN stays NaN). */
#define BSTORE(p, v) _mm256_storeu_si256((__m256i *)(p), (__m256i)_mm512_cvtneps_pbh(v))
static inline uint32_t tb_pair(bf16 lo, bf16 hi) { return (uint32_t)lo | (uint32_t)hi << 16; }
"""


def microkernel_c(mr: int, nr: int, ku: int) -> str:
    """``tb_ukernel``: kp k pairs of packed A x packed B -> an mr x nr tile of fp32 C (partial sums)
    and, on the last K block with ``o`` set, of the bf16 output."""
    nv = nr // 16
    acc = [[f"c{i}_{v}" for v in range(nv)] for i in range(mr)]
    lines = [f"#define MR {mr}", f"#define NR {nr}", f"#define KU {ku}", f"#define NV {nv}",
             "static void tb_ukernel(long kp, const uint32_t *restrict a, const uint32_t *restrict b,\n"
             "                       float *restrict c, long ldc, bf16 *restrict o, long ldo, int mr, int nr,\n"
             "                       int first, int last, const float *bias) {"]
    for i in range(mr):
        lines.append("    __m512 " + ", ".join(f"{n} = _mm512_setzero_ps()" for n in acc[i]) + ";")
    lines.append("    for (long t = 0; t < kp; t += KU) {")
    for u in range(ku):
        lines.append("        {")
        for v in range(nv):
            lines.append(f"        __m512i b{v} = _mm512_loadu_si512(b + {u * nr + v * 16});")
        for i in range(mr):
            lines.append(f"        {{ __m512i ai = _mm512_set1_epi32((int)a[{u * mr + i}]);")
            for v in range(nv):
                lines.append(f"          {acc[i][v]} = BDOT({acc[i][v]}, b{v}, ai);")
            lines.append("        }")
        lines.append("        }")
    lines.append(f"        a += {ku * mr}; b += {ku * nr};")
    lines.append("    }")
    lines += _store(mr, nr, acc)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _store(mr: int, nr: int, acc: list[list[str]]) -> list[str]:
    nv = nr // 16
    out = ["    int fin = last && o;",
           "    if (mr == MR && nr == NR) {",
           "        __m512 bv[NV];",
           "        for (int v = 0; v < NV; v++) bv[v] = TR_HAS_BIAS && last ? _mm512_loadu_ps(bias + v * 16) : VZERO();"]
    for i in range(mr):
        for v in range(nv):
            off = f"{i}*ldc + {v * 16}"
            out.append(f"        {{ V x = {acc[i][v]}; if (!first) x = VADD(x, VLOAD(c + {off}));")
            out.append(f"          if (last && TR_HAS_EPI) x = tr_epi(x, bv[{v}]);")
            out.append(f"          if (fin) BSTORE(o + {i}*ldo + {v * 16}, x); else VSTORE(c + {off}, x); }}")
    out.append("        return;")
    out.append("    }")
    out.append("    float tile[MR * NR] __attribute__((aligned(64)));")
    for i in range(mr):
        for v in range(nv):
            out.append(f"    VSTORE(tile + {i * nr + v * 16}, {acc[i][v]});")
    out.append(BIAS_TILE + EDGE_STORE)
    return out


# Shared with the AMX kernel (emit/amx.py): the bias of the block's columns (masked at the right edge)
# and the masked store of an edge block from ``tile`` (fp32 partial sums or, when ``fin``, bf16 out).
BIAS_TILE = r"""    __m512 bt[NV];
    for (int v = 0; v < NV; v++) {
        __mmask16 m = (__mmask16)(nr - v * 16 >= 16 ? 0xffff : nr <= v * 16 ? 0 : (1u << (nr - v * 16)) - 1);
        bt[v] = TR_HAS_BIAS && last ? _mm512_maskz_loadu_ps(m, bias + v * 16) : VZERO();
    }"""

EDGE_STORE = r"""
    for (int i = 0; i < mr; i++) {
        for (int v = 0; v < NV && v * 16 < nr; v++) {
            int n = nr - v * 16 < 16 ? nr - v * 16 : 16;
            __mmask16 m = (__mmask16)((1u << n) - 1);
            V x = VLOAD(tile + i * NR + v * 16);
            if (!first) x = VADD(x, _mm512_maskz_loadu_ps(m, c + i * ldc + v * 16));
            if (last && TR_HAS_EPI) x = tr_epi(x, bt[v]);
            if (fin) _mm256_mask_storeu_epi16(o + i * ldo + v * 16, m, (__m256i)_mm512_cvtneps_pbh(x));
            else _mm512_mask_storeu_ps(c + i * ldc + v * 16, m, x);
        }
    }"""

DENSE = r"""
/* Implicit-GEMM geometry of a conv's A (emit/bf16_conv.py): A(i, k) with i = (n, p, q) and k = (r, s, c) read
   from an NHWC input. */
typedef struct tb_geom { long H, W, C, P, Q, R, S, sh, sw, ph, pw, dh, dw; } tb_geom;
/* Dense bf16 operand X(i, k) = p[i*rs + k*cs] (A) or X(k, j) = p[k*rs + j*cs] (B); with g set, a conv's A
   (p: the NHWC input). */
typedef struct { const bf16 *p; long rs, cs; const tb_geom *g; } tb_dense;

static inline long tb_pairs(long kc) { return TR_ROUNDUP((kc + 1) / 2, KU); }
"""

PACK_A = r"""
/* A micro-panel: rows [i0, i0+mr), k in [p0, p0+kc) -> dst[t*MR + i] = (A(i, 2t), A(i, 2t+1)),
   zero padded to MR rows and tb_pairs(kc) pairs. */
#ifdef TB_CONV
static void tb_pack_a_conv(const tb_dense *x, long i0, long mr, long p0, long kc, uint32_t *dst);
#endif
static void tb_pack_a(const tb_dense *x, long i0, long mr, long p0, long kc, uint32_t *dst) {
#ifdef TB_CONV
    if (x->g) { tb_pack_a_conv(x, i0, mr, p0, kc, dst); return; }
#endif
    long kp = tb_pairs(kc), full = kc / 2;
    if (mr < MR || full < kp) memset(dst, 0, sizeof(uint32_t) * kp * MR);
    if (x->cs == 1) {
        for (long i = 0; i < mr; i++) {
            const bf16 *s = x->p + (i0 + i) * x->rs + p0;
            uint32_t *d = dst + i;
            for (long t = 0; t < full; t++) { uint32_t w; memcpy(&w, s + 2 * t, 4); d[t * MR] = w; }
            if (kc & 1) d[full * MR] = s[kc - 1];
        }
    } else {
        /* Transposed A (stored k-major): rows 2t and 2t+1 of the source interleave. */
        for (long t = 0; t < full; t++) {
            const bf16 *r0 = x->p + (p0 + 2 * t) * x->cs + i0 * x->rs, *r1 = r0 + x->cs;
            for (long i = 0; i < mr; i++) dst[t * MR + i] = tb_pair(r0[i * x->rs], r1[i * x->rs]);
        }
        if (kc & 1) {
            const bf16 *r0 = x->p + (p0 + kc - 1) * x->cs + i0 * x->rs;
            for (long i = 0; i < mr; i++) dst[full * MR + i] = r0[i * x->rs];
        }
    }
}

"""

T16 = r"""
/* 16 x 16 transpose of 32-bit words held in r[0..15]. */
static inline void tb_t16(__m512i *r) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    }
}

"""

PACK_B = T16 + r"""
/* B micro-panel: k in [p0, p0+kc), columns [j0, j0+nr) -> dst[t*NR + j] = (B(2t, j), B(2t+1, j)). */
static void tb_pack_b(const tb_dense *x, long j0, long nr, long p0, long kc, uint32_t *dst) {
    long kp = tb_pairs(kc), full = kc / 2;
    if (nr < NR || full < kp) memset(dst, 0, sizeof(uint32_t) * kp * NR);
    if (x->cs == 1 && nr == NR) {
        /* Row-major B, full panel: widen 16 columns of row 2t to the low halves, of row 2t+1 to the
           high halves (a fixed count per row, fully unrolled). */
        for (long t = 0; t < full; t++) {
            const bf16 *r0 = x->p + (p0 + 2 * t) * x->rs + j0, *r1 = r0 + x->rs;
            for (int v = 0; v < NR / 16; v++) {
                __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r0 + v * 16)));
                __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r1 + v * 16)));
                _mm512_storeu_si512(dst + t * NR + v * 16, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
            }
        }
        if (kc & 1) {
            const bf16 *r0 = x->p + (p0 + kc - 1) * x->rs + j0;
            for (int v = 0; v < NR / 16; v++)
                _mm512_storeu_si512(dst + full * NR + v * 16,
                                    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r0 + v * 16))));
        }
    } else if (x->cs == 1) {
        /* Row-major B, edge panel: the same with masked loads and stores. */
        for (long t = 0; t < (kc + 1) / 2; t++) {
            const bf16 *r0 = x->p + (p0 + 2 * t) * x->rs + j0, *r1 = r0 + x->rs;
            int odd = 2 * t + 1 == kc;
            for (long j = 0; j < nr; j += 16) {
                long n = TR_MIN(16, nr - j);
                __mmask16 m = (__mmask16)(n == 16 ? 0xffff : (1u << n) - 1);
                __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r0 + j));
                __m512i hi = odd ? _mm512_setzero_si512()
                                 : _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r1 + j)), 16);
                _mm512_mask_storeu_epi32(dst + t * NR + j, m, _mm512_or_si512(lo, hi));
            }
        }
    } else {
        /* Transposed B (stored n-major): the pair (2t, 2t+1) of column j is one 32-bit word of the
           source row, so the panel is a transpose of 32-bit words, 16 x 16 at a time in registers. */
        long j = 0;
        for (; j + 16 <= nr && x->rs == 1; j += 16) {
            long t = 0;
            for (; t + 16 <= full; t += 16) {
                __m512i r[16];
                for (int q = 0; q < 16; q++) r[q] = _mm512_loadu_si512(x->p + (j0 + j + q) * x->cs + p0 + 2 * t);
                tb_t16(r);
                for (int q = 0; q < 16; q++) _mm512_storeu_si512(dst + (t + q) * NR + j, r[q]);
            }
            for (long jj = j; jj < j + 16; jj++) {
                const bf16 *s = x->p + (j0 + jj) * x->cs + p0;
                for (long u = t; u < full; u++) { uint32_t w; memcpy(&w, s + 2 * u, 4); dst[u * NR + jj] = w; }
                if (kc & 1) dst[full * NR + jj] = s[kc - 1];
            }
        }
        for (; j < nr; j++) {
            const bf16 *s = x->p + (j0 + j) * x->cs + p0 * x->rs;
            for (long u = 0; u < full; u++) dst[u * NR + j] = tb_pair(s[2 * u * x->rs], s[(2 * u + 1) * x->rs]);
            if (kc & 1) dst[full * NR + j] = s[(kc - 1) * x->rs];
        }
    }
}
"""

PACKERS = DENSE + PACK_A + PACK_B

DRIVER = r"""
/* TB_THREAD_BEGIN() / TB_THREAD_DONE(): run by every thread when it enters / leaves a parallel region
   (AMX loads its tile configuration / releases its tiles). */
#ifndef TB_THREAD_BEGIN
#define TB_THREAD_BEGIN() do {} while (0)
#endif
#ifndef TB_THREAD_DONE
#define TB_THREAD_DONE() do {} while (0)
#endif
#ifndef TR_ROWS_DRIVER
#define TR_ROWS_DRIVER 1
#endif
#ifndef TR_ROWS_MAXM
#define TR_ROWS_MAXM 256
#endif
/* One M block (a few rows of A against a large B, e.g. activations x weights): A is packed once per
   K block and shared; each thread packs the B panels it runs into a private (L2-resident) buffer and
   uses them at once, so B is read from memory once and no KC x NC block is written and read back. */
__attribute__((noinline)) static int tb_drive_rows(long M, long N, long K, const tb_dense *A, const tb_dense *B, float *c, long ldc,
                         bf16 *o, long ldo, const float *bias, long kc, int nth) {
    long kpmax = tb_pairs(kc), ntile = (M + MR - 1) / MR, npan = (N + NR - 1) / NR;
    int owned;
    uint32_t *ws = (uint32_t *)tr_ws_get((size_t)ntile * MR * kpmax + (size_t)nth * NR * kpmax + 32, &owned);
    if (!ws) return 1;
    uint32_t *abuf = ws, *bbase = ws + TR_ROUNDUP((size_t)ntile * MR * kpmax, 16);
    #pragma omp parallel num_threads(nth) if (nth > 1)
    {
        int tid = TR_TID();
        uint32_t *bp = bbase + (size_t)tid * NR * kpmax;
        TB_THREAD_BEGIN();
        for (long pc = 0; pc < K; pc += kc) {
            long kcur = TR_MIN(kc, K - pc), kp = tb_pairs(kcur);
            int first = pc == 0, last = pc + kcur >= K;
            #pragma omp for schedule(static)
            for (long r = 0; r < ntile; r++)
                tb_pack_a(A, r * MR, TR_MIN(MR, M - r * MR), pc, kcur, abuf + r * MR * kp);
            #pragma omp for schedule(dynamic, 1)
            for (long p = 0; p < npan; p++) {
                long j = p * NR;
                int nr = (int)TR_MIN(NR, N - j);
                tb_pack_b(B, j, nr, pc, kcur, bp);
                for (long r = 0; r < ntile; r++) {
                    long i = r * MR;
                    tb_ukernel(kp, abuf + r * MR * kp, bp, c ? c + i * ldc + j : 0, ldc, o ? o + i * ldo + j : 0,
                               ldo, (int)TR_MIN(MR, M - i), nr, first, last, bias ? bias + j : 0);
                }
            }
        }
        TB_THREAD_DONE();
    }
    tr_ws_put((float *)ws, owned);
    return 0;
}

/* Threads for one call: nth, or every available one when nth <= 0; one for tiny problems. */
static int tb_threads(long M, long N, long K, int nth) {
    if (nth <= 0) nth = tr_threads_available();
    return (double)M * N * K < 65536.0 ? 1 : nth;
}

/* Which driver tb_drive runs (nth: resolved by tb_threads): 0 the blocked driver below, 1 tb_drive_rows,
   2 tb_drive_wa (AMX few rows, emit/amx_rows.py), 3 tb_drive_amx (AMX, emit/amx_blocks.py). Drivers 2
   and 3 keep their partial sums themselves; 0 and 1 need an fp32 C for them with a bf16 output. */
static int tb_route(long M, long N, long K, const tb_dense *A, const tb_dense *B, long mc, int nth) {
    mc = TR_MIN(TR_ROUNDUP(TR_MAX(mc, MR), MR), TR_ROUNDUP(M, MR));
#ifdef TB_WA_DRIVER
    /* AMX: few rows against transposed weights, the weights loaded as tiles in place. */
    if (A->cs == 1 && B->rs == 1 && M <= TB_WA_MAXM) return 2;
#endif
    /* Up to 256 rows against a transposed B (nn.Linear weights, N x K): panels packed and used per
       thread. Measured at M x 4096 x 4096 (4x64 tile): M = 1 / 8 / 64 / 128 / 256: 1.9 / 2.2 / 6.9 /
       15.5 / 26.0 ms -> 1.1 / 1.4 / 5.6 / 11.0 / 21.0 ms; a row-major B gained nothing (each panel reads
       K rows at a page-sized stride either way). */
    if (TR_ROWS_DRIVER && M <= TR_MAX(mc, TR_ROWS_MAXM) && B->cs != 1 && (N + NR - 1) / NR >= 2 * nth) return 1;
#ifdef TB_AMX_DRIVER
    /* it packs all of B at once: a B beyond TB_AMX_MAX_B_BYTES takes the blocked driver (KC x NC at a time) */
    if ((double)K * N * 2 <= TB_AMX_MAX_B_BYTES) return 3;
#endif
    return 0;
}

/* One GEMM (one batch entry). c: fp32 C (the output, or partial sums when the output is bf16, K
   spans several blocks and the route needs them; may be null otherwise); o: bf16 output or null. */
static int tb_drive(long M, long N, long K, const tb_dense *A, const tb_dense *B, float *c, long ldc,
                    bf16 *o, long ldo, const float *bias, long mc, long nc, long kc, int nth) {
    nth = tb_threads(M, N, K, nth);
    int route = tb_route(M, N, K, A, B, mc, nth);
#ifdef TB_WA_DRIVER
    if (route == 2) return tb_drive_wa(M, N, K, A->p, A->rs, B->p, B->cs, c, ldc, o, ldo, bias, nth);
#endif
#ifdef TB_AMX_DRIVER
    if (route == 3) return tb_drive_amx(M, N, K, A, B, c, ldc, o, ldo, bias, mc, nc, kc, nth);
#endif
    mc = TR_MIN(TR_ROUNDUP(TR_MAX(mc, MR), MR), TR_ROUNDUP(M, MR));
    nc = TR_MIN(TR_ROUNDUP(TR_MAX(nc, NR), NR), TR_ROUNDUP(N, NR));
    kc = TR_MIN(TR_ROUNDUP(TR_MAX(kc, 2 * KU), 2 * KU), TR_ROUNDUP(K, 2 * KU));
    long kpmax = tb_pairs(kc);
    if (o && K > kc && !c) return 2;
    if (route == 1) return tb_drive_rows(M, N, K, A, B, c, ldc, o, ldo, bias, kc, nth);
    int owned;
    uint32_t *ws = (uint32_t *)tr_ws_get((size_t)nc * kpmax + (size_t)nth * mc * kpmax + 32, &owned);
    if (!ws) return 1;
    uint32_t *bbuf = ws, *abase = ws + TR_ROUNDUP((size_t)nc * kpmax, 16);
    #pragma omp parallel num_threads(nth) if (nth > 1)
    {
        int T = TR_NT(), tid = TR_TID();
        uint32_t *abuf = abase + (size_t)tid * mc * kpmax;
        TB_THREAD_BEGIN();
        for (long jc = 0; jc < N; jc += nc) {
            long ncur = TR_MIN(nc, N - jc), npan = (ncur + NR - 1) / NR;
            for (long pc = 0; pc < K; pc += kc) {
                long kcur = TR_MIN(kc, K - pc), kp = tb_pairs(kcur);
                int first = pc == 0, last = pc + kcur >= K;
                /* Few panels: split each along k (in whole unroll groups of pairs) so every thread packs. */
                long ksl = npan >= 2 * T ? 1 : TR_MIN((2 * T + npan - 1) / npan, kp / (4 * KU));
                if (ksl < 1) ksl = 1;
                long kstep = TR_ROUNDUP((kcur + ksl - 1) / ksl, 2 * KU);
                #pragma omp for schedule(dynamic, 1)
                for (long it = 0; it < npan * ksl; it++) {
                    long p = it / ksl, k0 = (it % ksl) * kstep;
                    if (k0 < kcur)
                        tb_pack_b(B, jc + p * NR, TR_MIN(NR, ncur - p * NR), pc + k0, TR_MIN(kstep, kcur - k0),
                                  bbuf + p * NR * kp + (k0 / 2) * NR);
                }
                long nic = (M + mc - 1) / mc, ntile = (M + MR - 1) / MR;
                long nsplit = (nic % T == 0 || nic >= 4 * T) ? 1 : TR_MIN((long)T, npan);
                long nblk = nsplit > 1 ? nic : TR_ROUNDUP(nic, T);
                #pragma omp for schedule(dynamic, 1)
                for (long it = 0; it < nblk * nsplit; it++) {
                    long q = it / nsplit, sp = it % nsplit, t0 = q * ntile / nblk, t1 = (q + 1) * ntile / nblk;
                    if (t1 == t0) continue;
                    long ic = t0 * MR, mcur = TR_MIN(M, t1 * MR) - ic, nmp = t1 - t0;
                    long jlo = npan * sp / nsplit, jhi = npan * (sp + 1) / nsplit;
                    for (long r = 0; r < nmp; r++)
                        tb_pack_a(A, ic + r * MR, TR_MIN(MR, mcur - r * MR), pc, kcur, abuf + r * MR * kp);
                    for (long jr = jlo; jr < jhi; jr++) {
                        long j = jc + jr * NR;
                        int nr = (int)TR_MIN(NR, N - j);
                        for (long r = 0; r < nmp; r++) {
                            long i = ic + r * MR;
                            tb_ukernel(kp, abuf + r * MR * kp, bbuf + jr * NR * kp, c ? c + i * ldc + j : 0, ldc,
                                       o ? o + i * ldo + j : 0, ldo, (int)TR_MIN(MR, M - i), nr, first, last,
                                       bias ? bias + j : 0);
                        }
                    }
                }
            }
        }
        TB_THREAD_DONE();
    }
    tr_ws_put((float *)ws, owned);
    return 0;
}

/* Batched bf16 GEMM: A(i, k) = a[q*sa + i*rsa + k*csa], B(k, j) = b[q*sb + k*rsb + j*csb];
   out_bf16: out is bf16 (else fp32), row-major with row stride ldc and batch stride sc.
   bias: fp32 per column or null. Returns 0, 1 (workspace allocation failed) or 2 (bad call). */
int tb_gemm(long batch, long M, long N, long K, const bf16 *a, long rsa, long csa, long sa,
            const bf16 *b, long rsb, long csb, long sb, void *out, long ldc, long sc, int out_bf16,
            const float *bias, long mc, long nc, long kc, int nth) {
    long kcb = TR_MIN(TR_ROUNDUP(TR_MAX(kc, 2 * KU), 2 * KU), TR_ROUNDUP(K, 2 * KU));
    int owned = 0;
    float *part = 0;
    tb_dense A0 = {a, rsa, csa}, B0 = {b, rsb, csb};
    if (out_bf16 && K > kcb && tb_route(M, N, K, &A0, &B0, mc, tb_threads(M, N, K, nth)) < 2) {
        part = tr_ws_slot(1, (size_t)M * N, &owned);
        if (!part) return 1;
    }
    int rc = 0;
    for (long q = 0; q < batch && !rc; q++) {
        tb_dense A = {a + q * sa, rsa, csa}, B = {b + q * sb, rsb, csb};
        if (out_bf16)
            rc = tb_drive(M, N, K, &A, &B, part, N, (bf16 *)out + q * sc, ldc, bias, mc, nc, kc, nth);
        else
            rc = tb_drive(M, N, K, &A, &B, (float *)out + q * sc, ldc, 0, 0, bias, mc, nc, kc, nth);
    }
    if (part) tr_ws_release(1, part, owned);
    return rc;
}

/* tb_gemm with the per-(op, config) constants in a struct built once (ctypes converts every scalar
   argument on every call: microseconds for a small GEMM). */
typedef struct { long batch, M, N, K, rsa, csa, rsb, csb, mc, nc, kc; int out_bf16; } tb_call;
int tb_gemm_call(const tb_call *p, const bf16 *a, const bf16 *b, void *out, const float *bias, int nth) {
    return tb_gemm(p->batch, p->M, p->N, p->K, a, p->rsa, p->csa, p->M * p->K, b, p->rsb, p->csb, p->K * p->N,
                   out, p->N, p->M * p->N, p->out_bf16, bias, p->mc, p->nc, p->kc, nth);
}
"""


def bf16_gemm_source(isa: Isa, mr: int, nr: int, epilogue: Epilogue, ku: int = 4) -> str:
    """Complete C source of the bf16 GEMM library for one register tile and epilogue chain
    (``isa``: the AVX-512 ISA whose ``V*`` layer the fp32 epilogue is written against)."""
    if nr % 16 or mr * (nr // 16) + nr // 16 + 1 > 32:
        raise ValueError(f"tile {mr}x{nr} does not fit the 32 zmm registers")
    return "\n".join([prologue(isa), BF16_LAYER, epilogue_c(epilogue), microkernel_c(mr, nr, ku), PACKERS, DRIVER])
