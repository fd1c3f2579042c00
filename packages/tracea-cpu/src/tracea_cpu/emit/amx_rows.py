"""AMX driver for few rows against transposed weights (``nn.Linear``: X (M x K) @ W^T, W stored N x K),
M <= 128: computes C^T = W X^T so that the *weights* are the tile A operand, loaded straight from
their row-major storage (16 rows of W, 64 bytes of K each, ``K * 2`` bytes apart) with no packing,
and only the activations are packed (into the pair-interleaved B layout, 16 tokens per tile).

A W block of ``16 * RA`` rows (RA = 2: 32 outputs) stays in the tile registers' accumulators for the
whole K (C tiles: RA x TB, TB = token tiles of 16; RA * TB + 1 + TB <= 8), so each weight byte is read
from memory once per 16 * TB tokens; a thread streams the block's 32 weight rows at once (64-row blocks,
64 page-strided streams per thread, ran 20-25% slower on a Sapphire Rapids VM, warm and cold); the result tile (rows: outputs n, columns: tokens m) is transposed 16 x 16 in
registers on the way out, where the fp32 epilogue (bias per output n) and the bf16 / fp32 store run.
Edges: a K tail (K % 32) and a last W block past N are copied into zero-padded scratch tiles, so no
load reads past the operands (garbage times a zero pad could be NaN).

More than 32 tokens (``TB_WA_CHUNK_MINM``; whole 32-row blocks, K a multiple of 32): a block's 32-token
slices each ran the whole K, so the block's weight rows (32 x K bf16: 256 KB at K = 4096) came back from
L2 once per slice and every step loaded 4 KB from L2 for 4 tile products, the L2's bandwidth.
``tb_wa_chunked`` runs K in chunks of ``TB_WA_KCH`` = 4 steps (128 k: 8 KB of weight rows) and
passes every token slice over a chunk before the next, keeping the slices' accumulator tiles in a
per-thread buffer between chunks (one tile load and store per tile and chunk). The weight rows are 8 KiB
apart and share L1 sets, so in place they would not stay in L1: the first slice stores each weight tile it
loads into a contiguous per-thread buffer (``wc``), which the later slices load from (a separate
copy loop before the slices ran 15% slower; the tile stores cost little: 2-8% faster than reading in
place, two threads, 64-128 tokens). The activations of these calls are packed slice by slice
(``tb_wa_pack_xs``: a slice's two B tiles of a step are 2 KiB in one run, not 16 rows ``MP * 4`` bytes
apart): 128 tokens 2.55-2.58 -> 2.39-2.41 ms, 64-96 tokens 1-3%, two threads. Measured on the 2-core
Sapphire Rapids VM, 4096 x 4096 with bias, one thread, kernel alone: 48 / 64 / 96 / 128 tokens
2395 / 2889 / 3971 / 5493-5858 us before, 2071 / 2518 / 3573 / 4808-5205 us after (8 steps a chunk);
two threads, with the transposing packer below, 4 steps a chunk and the weight rows prefetched 4 steps
ahead ran 1220 / 1425 / 1888 / 2464 us against 8 steps' 1320 / 1522 / 2019 / 2560 (2 steps: slower).
"""

from __future__ import annotations

ROWS_DRIVER = r"""
#ifndef TR_WPF
#define TR_WPF 2
#endif
#define TB_WA_MAXM 128
#ifndef TB_WA_KCH
#define TB_WA_KCH 4
#endif
#ifndef TB_WA_CPF
#define TB_WA_CPF 4  /* steps the first slice prefetches the weight rows ahead (TR_WPF 2 ran 3-6% slower) */
#endif
#ifndef TB_WA_CHUNK_MINM
#define TB_WA_CHUNK_MINM 32
#endif
/* X^T as tile B operands: xp[(s*MP + m)*16 + u]... stored per k step s (16 pairs) and token m:
   xp[s*16*MP + u*MP + m] = (X(m, 32s + 2u), X(m, 32s + 2u + 1)), zero padded to MP tokens and whole steps.
   16 tokens x one step at a time: their 16 rows of 16 pairs loaded, transposed in registers, stored as
   16 whole 64-byte rows. (It scattered each token's step before, serially ahead of the parallel region:
   a 128-token x K = 4096 call against 32 weight rows took 529 us with the scatters, 97 us now.) */
/* Tokens m0 .. m0 + 15 of X at k step s (zero past M tokens and past K), transposed: r[u] = pair u of the
   16 tokens. */
static inline __attribute__((always_inline)) void tb_wa_load_t(const bf16 *x, long M, long K, long ldx, long m0,
                                                              long s, __m512i r[16]) {
    long k0 = 32 * s, n = TR_MIN(32, K - k0);
    __mmask32 km = (__mmask32)(n == 32 ? 0xffffffffu : (1u << n) - 1);
    for (int i = 0; i < 16; i++)
        r[i] = m0 + i < M ? _mm512_maskz_loadu_epi16(km, x + (m0 + i) * ldx + k0) : _mm512_setzero_si512();
    tb_t16(r);
}

static void tb_wa_pack_x(const bf16 *x, long M, long MP, long K, long ldx, uint32_t *xp) {
    long steps = (K + 31) / 32;
    for (long m0 = 0; m0 < MP; m0 += 16)
        for (long s = 0; s < steps; s++) {
            __m512i r[16];
            tb_wa_load_t(x, M, K, ldx, m0, s, r);
            for (int u = 0; u < 16; u++) _mm512_storeu_si512(xp + s * 16 * MP + u * MP + m0, r[u]);
        }
}

/* The same pairs for the K-chunked blocks, 32-token slice by slice: xs[(m / 32) * steps * 512 + s * 512 +
   u * 32 + m % 32] (zero padded to MP32 = a multiple of 32 tokens): a slice's two B tiles of a step are
   2 KiB in one run instead of 16 rows MP * 4 bytes apart. */
static void tb_wa_pack_xs(const bf16 *x, long M, long MP32, long K, long ldx, uint32_t *xs) {
    long steps = (K + 31) / 32;
    for (long m0 = 0; m0 < MP32; m0 += 16)
        for (long s = 0; s < steps; s++) {
            __m512i r[16];
            tb_wa_load_t(x, M, K, ldx, m0, s, r);
            uint32_t *d = xs + (m0 / 32) * steps * 512 + s * 512 + m0 % 32;
            for (int u = 0; u < 16; u++) _mm512_storeu_si512(d + u * 32, r[u]);
        }
}

/* Copy rows [n0, n0+rows) x k in [k0, k0+kn) of W (row stride ldw) into a zero-padded 16-row x 32
   bf16 tile (64-byte rows). */
static inline void tb_wa_copy_tile(const bf16 *w, long ldw, long n0, long rows, long k0, long kn, bf16 *dst) {
    __mmask32 km = (__mmask32)(kn >= 32 ? 0xffffffffu : (1u << kn) - 1);
    for (long r = 0; r < 16; r++)
        _mm512_storeu_si512(dst + r * 32, r < rows ? _mm512_maskz_loadu_epi16(km, w + (n0 + r) * ldw + k0)
                                                   : _mm512_setzero_si512());
}

/* The C^T tile (16 outputs n0.. x 16 tokens m0..) in t[16][16] -> out rows m0.. columns n0.., after the
   epilogue (bias per n). */
static inline void tb_wa_store(float *t, long m0, long mn, long n0, long nn, float *c, long ldc, bf16 *o, long ldo,
                               const float *bias) {
    __m512i r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_load_si512((const __m512i *)(t + 16 * i));
    tb_t16(r);
    __mmask16 m = (__mmask16)(nn >= 16 ? 0xffff : (1u << nn) - 1);
    V bv = TR_HAS_BIAS ? _mm512_maskz_loadu_ps(m, bias + n0) : VZERO();
    for (long i = 0; i < mn; i++) {
        V x = _mm512_castsi512_ps(r[i]);
        if (TR_HAS_EPI) x = tr_epi(x, bv);
        if (o) _mm256_mask_storeu_epi16(o + (m0 + i) * ldo + n0, m, (__m256i)_mm512_cvtneps_pbh(x));
        else _mm512_mask_storeu_ps(c + (m0 + i) * ldc + n0, m, x);
    }
}
"""


def few_rows_block_c(ra: int, tb: int, head: list[str], k_step: int, ldw_scale: str, copy_fn: str, tile_op: str,
                     acc: str, store: str, store_args: str) -> str:
    """One few-rows block function: 16*ra outputs (weight rows, read straight from W) x 16*tb tokens (the
    packed X, ``xp``) over the whole K, C tiles ra x tb and one A tile reused per output group. The bf16
    and int8 kernels differ only in what is passed here: ``head`` (signature and the ``full`` / ``steps``
    line), ``k_step`` (K per tile step), ``ldw_scale`` (`` * 2`` for a bf16 row stride in bytes),
    ``copy_fn`` (the edge-tile copy), ``tile_op`` (the tile product), ``acc`` (the accumulator C type), ``store`` (the store function) and
    ``store_args`` (its arguments after the tile and the four position ones)."""
    assert ra * tb + 1 + tb <= 8
    c = [[i * tb + j for j in range(tb)] for i in range(ra)]
    at, bt0 = ra * tb, ra * tb + 1
    lines = head + [f"    int edge = n0 + {16 * ra} > N;"]
    lines += [f"    _tile_zero({c[i][j]});" for i in range(ra) for j in range(tb)]
    lines.append("    for (long s = 0; s < steps; s++) {")
    # Software prefetch of the weight rows PF steps ahead: each row is its own page-strided stream (too
    # many for the hardware streamer).
    lines.append(f"        if (s + TR_WPF < full) for (int r = 0; r < {16 * ra}; r++) "
                 f"_mm_prefetch((const char *)(w + (n0 + r) * ldw + {k_step} * (s + TR_WPF)), _MM_HINT_T0);")
    for j in range(tb):
        lines.append(f"        _tile_loadd({bt0 + j}, xp + s * 16 * MP + m0 + {16 * j}, MP * 4);")
    for i in range(ra):
        lines.append(f"        if (s < full && !edge) _tile_loadd({at}, w + (n0 + {16 * i}) * ldw + {k_step} * s, "
                     f"ldw{ldw_scale});")
        lines.append(f"        else {{ {copy_fn}(w, ldw, n0 + {16 * i}, TR_MAX(0, TR_MIN(16, N - n0 - {16 * i})), "
                     f"{k_step} * s, K - {k_step} * s, scratch); _tile_loadd({at}, scratch, 64); }}")
        for j in range(tb):
            lines.append(f"        {tile_op}({c[i][j]}, {at}, {bt0 + j});")
    lines.append("    }")
    lines.append(f"    {acc} t[256] __attribute__((aligned(64)));")
    for i in range(ra):
        for j in range(tb):
            lines.append(f"    if (n0 + {16 * i} < N && m0 + {16 * j} < M) {{ _tile_stored({c[i][j]}, t, 64);")
            lines.append(f"        {store}(t, m0 + {16 * j}, TR_MIN(16, M - m0 - {16 * j}), n0 + {16 * i}, "
                         f"N - n0 - {16 * i}, {store_args}); }}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def chunk_kernel_c(tb: int) -> str:
    """``tb_wa_chunk_2_TB``: a whole block of 32 weight rows x 16*tb tokens over K steps [s0, s1) only,
    the accumulators loaded from (or, when ``first``, zeroed instead) and stored back to ``cs`` (tiles
    of 16 x 16 fp32, 1 KB apart): no edges (the caller sends blocks inside N and K % 32 == 0 only)."""
    ra = 2
    c = [[i * tb + j for j in range(tb)] for i in range(ra)]
    at, bt0 = ra * tb, ra * tb + 1
    lines = [f"static void tb_wa_chunk_2_{tb}(const bf16 *w, long ldw, long n0, long m0, long s0, long s1, float *cs,",
             "        int first, int pf, bf16 *wc, int save, const uint32_t *xs, long steps) {",
             "    const uint32_t *xsl = xs + (m0 / 32) * steps * 512;",
             "    if (first) {"]
    lines += [f"        _tile_zero({c[i][j]});" for i in range(ra) for j in range(tb)]
    lines.append("    } else {")
    lines += [f"        _tile_loadd({c[i][j]}, cs + {256 * (i * tb + j)}, 64);" for i in range(ra) for j in range(tb)]
    lines.append("    }")
    lines.append("    for (long s = s0; s < s1; s++) {")
    lines.append("        if (pf) for (int r = 0; r < 32; r++) "
                 "_mm_prefetch((const char *)(w + (n0 + r) * ldw + 32 * (s + TB_WA_CPF)), _MM_HINT_T0);")
    for j in range(tb):
        lines.append(f"        _tile_loadd({bt0 + j}, xsl + s * 512 + {16 * j}, 128);")
    for i in range(ra):
        lines.append(f"        if (wc && !save) _tile_loadd({at}, wc + ((s - s0) * 2 + {i}) * 512, 64);")
        lines.append(f"        else {{ _tile_loadd({at}, w + (n0 + {16 * i}) * ldw + 32 * s, ldw * 2);")
        lines.append(f"               if (wc && save) _tile_stored({at}, wc + ((s - s0) * 2 + {i}) * 512, 64); }}")
        for j in range(tb):
            lines.append(f"        _tile_dpbf16ps({c[i][j]}, {at}, {bt0 + j});")
    lines.append("    }")
    lines += [f"    _tile_stored({c[i][j]}, cs + {256 * (i * tb + j)}, 64);" for i in range(ra) for j in range(tb)]
    lines.append("}")
    return "\n".join(lines) + "\n"


def rows_kernel_c(ra: int, tb: int) -> str:
    """``tb_wa_block_RA_TB``: one block of 16*ra outputs x 16*tb tokens over the whole K."""
    head = [f"static void tb_wa_block_{ra}_{tb}(const bf16 *w, long ldw, long N, long K, long n0, const uint32_t *xp, "
            "long MP,",
            "        long m0, long M, float *c, long ldc, bf16 *o, long ldo, const float *bias, bf16 *scratch) {",
            "    long full = K / 32, steps = (K + 31) / 32;"]
    return few_rows_block_c(ra, tb, head, 32, " * 2", "tb_wa_copy_tile", "_tile_dpbf16ps", "float", "tb_wa_store",
                            "c, ldc, o, ldo, bias")


ROWS_DRIVE = r"""
/* A whole block of 32 weight rows x all M tokens (M > 32), K in chunks of TB_WA_KCH steps (32 k each):
   the chunk of the weight rows (32 x 32 TB_WA_KCH bf16) stays in L1 while every 32-token slice passes
   over it, the slices' accumulators kept in cs (M / 32 x 4 tiles) between chunks; then the stores. */
static void tb_wa_chunked(const bf16 *w, long ldw, long N, long K, long n0, long M, float *c, long ldc, bf16 *o,
                          long ldo, const float *bias, float *cs, bf16 *wc, const uint32_t *xs) {
    long steps = K / 32;
    for (long s0 = 0; s0 < steps; s0 += TB_WA_KCH) {
        long s1 = TR_MIN(steps, s0 + TB_WA_KCH);
        for (long m0 = 0; m0 < M; m0 += 32) {
            float *cm = cs + (m0 / 32) * 4 * 256;
            int pf = m0 == 0 && s1 + TB_WA_CPF <= steps;
            bf16 *wcc = M > 32 + 16 ? wc : 0;  /* a second 32-token slice reads the saved tiles */
            if (M - m0 > 16) tb_wa_chunk_2_2(w, ldw, n0, m0, s0, s1, cm, s0 == 0, pf, wcc, m0 == 0, xs, steps);
            else tb_wa_chunk_2_1(w, ldw, n0, m0, s0, s1, cm, s0 == 0, pf, wcc, m0 == 0, xs, steps);
        }
    }
    for (long m0 = 0; m0 < M; m0 += 32) {
        float *cm = cs + (m0 / 32) * 4 * 256;
        long tb = M - m0 > 16 ? 2 : 1;
        for (long i = 0; i < 2; i++)
            for (long j = 0; j < tb; j++)
                tb_wa_store(cm + 256 * (i * tb + j), m0 + 16 * j, TR_MIN(16, M - m0 - 16 * j), n0 + 16 * i, N - n0 - 16 * i,
                            c, ldc, o, ldo, bias);
    }
}

/* C (M x N) = X (M x K, row-major) @ W^T (W: N x K, row-major), M <= TB_WA_MAXM, the whole K at once. */
static int tb_drive_wa(long M, long N, long K, const bf16 *x, long ldx, const bf16 *w, long ldw, float *c, long ldc,
                       bf16 *o, long ldo, const float *bias, int nth) {
    long MP = TR_ROUNDUP(M, 16), MP32 = TR_ROUNDUP(M, 32), steps = (K + 31) / 32;
    int chunked = M > TB_WA_CHUNK_MINM && K % 32 == 0;
    int owned;
    size_t xwords = (size_t)steps * 16 * MP, swords = chunked ? (size_t)steps * 16 * MP32 : 0;
    uint32_t *xp = (uint32_t *)tr_ws_get(xwords + swords + 32, &owned);
    if (!xp) return 1;
    uint32_t *xs = chunked ? xp + TR_ROUNDUP(xwords, 16) : 0;
    if (!chunked || N % 32) tb_wa_pack_x(x, M, MP, K, ldx, xp);  /* the whole-K blocks' layout */
    if (chunked) tb_wa_pack_xs(x, M, MP32, K, ldx, xs);
    /* 32-output blocks (2 A tiles: 32 weight rows streamed at once per thread; 64-row blocks kept 64
       page-strided streams in flight and ran 20-25% slower, warm and cold), 16 or 32 tokens a step. */
    long rows = 32, nblk = (N + rows - 1) / rows;
    if (nblk < 2 * nth) nth = 1;
    #pragma omp parallel num_threads(nth) if (nth > 1)
    {
        bf16 scratch[16 * 32] __attribute__((aligned(64)));
        float cs[TB_WA_MAXM / 32 * 4 * 256] __attribute__((aligned(64)));
        bf16 wc[TB_WA_KCH * 2 * 512] __attribute__((aligned(64)));
        TB_THREAD_BEGIN();
        #pragma omp for schedule(dynamic, 1)  /* a descheduled peer leaves its blocks to the others */
        for (long b = 0; b < nblk; b++) {
            long n0 = b * rows;
            if (MP <= 16)
                tb_wa_block_2_1(w, ldw, N, K, n0, xp, MP, 0, M, c, ldc, o, ldo, bias, scratch);
            else if (chunked && n0 + 32 <= N)
                tb_wa_chunked(w, ldw, N, K, n0, M, c, ldc, o, ldo, bias, cs, wc, xs);
            else
                for (long m0 = 0; m0 < M; m0 += 32) {
                    if (M - m0 > 16)
                        tb_wa_block_2_2(w, ldw, N, K, n0, xp, MP, m0, M, c, ldc, o, ldo, bias, scratch);
                    else
                        tb_wa_block_2_1(w, ldw, N, K, n0, xp, MP, m0, M, c, ldc, o, ldo, bias, scratch);
                }
        }
        TB_THREAD_DONE();
    }
    tr_ws_put((float *)xp, owned);
    return 0;
}
#define TB_WA_DRIVER 1
"""


def rows_source() -> str:
    """The C text of the few-rows AMX driver (after the packers: it uses ``tb_t16``)."""
    return ROWS_DRIVER + rows_kernel_c(2, 2) + rows_kernel_c(2, 1) + chunk_kernel_c(2) + chunk_kernel_c(1) + ROWS_DRIVE
