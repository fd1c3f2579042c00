"""int8 linear layer on AMX (``tdpbssd``): y = dequant(quant(X) @ Wq^T) + bias, emitted as one C library
(``ti_linear``).

* Activations X (M x K, fp32) are quantized per row, symmetric: ``sx[m] = max|X[m, :]| / 127``,
  ``xq = round_half_even(X / sx)`` in [-127, 127] (a row with NaN or Inf gets ``sx = NaN``, so its
  output row is NaN; an all-zero row gets ``sx = 0`` and outputs the bias).
* Weights Wq (N x K, int8, row-major, quantized once by the caller with per-output-channel scales
  ``sw[n]``) are the tile A operand, loaded in place: 16 rows of 64 int8 of K, ``K`` bytes apart.
* ``tdpbssd`` adds 4 signed int8 products per int32 lane: the B operand holds X^T as *k quads*,
  ``xp[s*16*MP + u*MP + m]`` = ``xq[m, 64s+4u .. 64s+4u+3]`` (one 32-bit word), 16 tokens per tile.
* int32 accumulation over the whole K in the tiles (exact: |sum| <= K * 127^2 < 2^31 for K < 133000),
  then per 16 x 16 tile: convert to fp32, transpose in registers, ``y = acc * sw[n] * sx[m] + bias[n]``,
  fp32 out. Token chunks of 256 rows bound the packed activations (L2) for large M.
"""

from __future__ import annotations

from .amx_rows import few_rows_block_c
from .int8_vnni import QUANT, vnni_source

INT8_LAYER = r"""
#ifndef TR_WPF
#define TR_WPF 2
#endif
/* Quantize rows [0, M) of x (fp32, row stride ldx) into quads for tile B: xp as above (zero padded to
   MP tokens); sx per row. Per 16 tokens and k step, their 16 rows of 16 quads are quantized into
   registers, transposed and stored as 16 whole 64-byte rows (no scatter: see tb_wa_pack_x). */
static void ti_pack_x(const float *x, long M, long MP, long K, long ldx, uint32_t *xp, float *sx) {
    long steps = (K + 63) / 64;
    for (long m0 = 0; m0 < MP; m0 += 16) {
        __m512 inv[16];
        int live[16];
        for (int i = 0; i < 16; i++) {
            long m = m0 + i;
            live[i] = 0;
            inv[i] = _mm512_setzero_ps();
            if (m >= M) continue;
            int bad;
            float amax = ti_row_amax(x + m * ldx, K, &bad);
            sx[m] = bad ? NAN : amax / 127.0f;
            live[i] = !bad && amax != 0.0f;  /* NaN / Inf rows and zero rows: all-zero quads */
            if (live[i]) inv[i] = _mm512_set1_ps(127.0f / amax);
        }
        for (long s = 0; s < steps; s++) {
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                if (!live[i]) { r[i] = _mm512_setzero_si512(); continue; }
                const float *row = x + (m0 + i) * ldx;
                __m128i q[4];
                for (int h = 0; h < 4; h++) {
                    long k = 64 * s + 16 * h;
                    q[h] = ti_quant16(row + k, (__mmask16)(k >= K ? 0 : K - k >= 16 ? 0xffff : (1u << (K - k)) - 1), inv[i]);
                }
                __m512i w = _mm512_inserti32x4(_mm512_castsi128_si512(q[0]), q[1], 1);
                w = _mm512_inserti32x4(w, q[2], 2);
                r[i] = _mm512_inserti32x4(w, q[3], 3);
            }
            tb_t16(r);
            for (int u = 0; u < 16; u++) _mm512_storeu_si512(xp + s * 16 * MP + u * MP + m0, r[u]);
        }
    }
}

/* Copy rows [n0, n0+rows) x k in [k0, k0+kn) of W (int8, row stride ldw) into a zero-padded 16 x 64 tile. */
static inline void ti_copy_tile(const int8_t *w, long ldw, long n0, long rows, long k0, long kn, int8_t *dst) {
    __mmask64 km = kn >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << kn) - 1);
    for (long r = 0; r < 16; r++)
        _mm512_storeu_si512(dst + r * 64, r < rows ? _mm512_maskz_loadu_epi8(km, w + (n0 + r) * ldw + k0)
                                                   : _mm512_setzero_si512());
}

/* The int32 C^T tile (16 outputs n0.. x 16 tokens m0..) -> y rows m0.., columns n0.., dequantized. */
static inline void ti_store(const int32_t *t, long m0, long mn, long n0, long nn, const float *sw, const float *sx,
                            const float *bias, float *y, long ldy) {
    __m512i r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_load_si512((const __m512i *)(t + 16 * i));
    tb_t16(r);
    __mmask16 m = (__mmask16)(nn >= 16 ? 0xffff : (1u << nn) - 1);
    __m512 swv = _mm512_maskz_loadu_ps(m, sw + n0);
    __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias + n0) : _mm512_setzero_ps();
    for (long i = 0; i < mn; i++) {
        __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(r[i]), _mm512_mul_ps(swv, _mm512_set1_ps(sx[m0 + i])));
        _mm512_mask_storeu_ps(y + (m0 + i) * ldy + n0, m, _mm512_add_ps(v, bv));
    }
}
"""


def int8_block_c(ra: int, tb: int) -> str:
    """``ti_block_RA_TB``: 16*ra outputs x 16*tb tokens over the whole K (C tiles ra x tb, A one at a time)."""
    head = [f"static void ti_block_{ra}_{tb}(const int8_t *w, long ldw, long N, long K, long n0, const uint32_t *xp,",
            "        long MP, long m0, long M, const float *sw, const float *sx, const float *bias, float *y, long ldy,",
            "        int8_t *scratch) {",
            "    long full = K / 64, steps = (K + 63) / 64;"]
    return few_rows_block_c(ra, tb, head, 64, "", "ti_copy_tile", "_tile_dpbssd", "int32_t", "ti_store",
                            "sw, sx, bias, y, ldy")


DRIVER = r"""
typedef struct __attribute__((packed)) { uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16]; uint8_t rows[16]; } ti_tilecfg;
static void ti_tiles_on(void) {
    ti_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    _tile_loadconfig(&cfg);
}

#define TI_CHUNK 256
/* y (M x N, fp32, row stride ldy) = dequant(quant(x) @ w^T) + bias. x: M x K fp32 (row stride ldx);
   w: N x K int8 (row stride ldw); sw: N per-channel weight scales; bias: N fp32 or null.
   Returns 0, 1 (workspace allocation failed) or 2 (K too large for exact int32 sums). */
int ti_linear(long M, long N, long K, const float *x, long ldx, const int8_t *w, long ldw, const float *sw,
              const float *bias, float *y, long ldy, int nth) {
    if (K > TI_MAXK) return 2;
    if (nth <= 0) nth = tr_threads_available();
    long steps = (K + 63) / 64, chunk = TR_MIN(M, TI_CHUNK), MPmax = TR_ROUNDUP(chunk, 16);
    int owned;
    uint32_t *xp = (uint32_t *)tr_ws_get((size_t)steps * 16 * MPmax + MPmax + 16, &owned);
    if (!xp) return 1;
    float *sx = (float *)(xp + (size_t)steps * 16 * MPmax);
    for (long c0 = 0; c0 < M; c0 += TI_CHUNK) {
        long Mc = TR_MIN(TI_CHUNK, M - c0), MP = TR_ROUNDUP(Mc, 16);
        ti_pack_x(x + c0 * ldx, Mc, MP, K, ldx, xp, sx);
        long rows = 32, nblk = (N + rows - 1) / rows;  /* 32 weight rows per block (as amx_rows) */
        int nt = nblk < 2 * nth ? 1 : nth;
        float *yc = y + c0 * ldy;
        #pragma omp parallel num_threads(nt) if (nt > 1)
        {
            int8_t scratch[16 * 64] __attribute__((aligned(64)));
            ti_tiles_on();
            #pragma omp for schedule(dynamic, 1)  /* a descheduled peer leaves its blocks to the others */
            for (long b = 0; b < nblk; b++) {
                long n0 = b * rows;
                if (MP <= 16)
                    ti_block_2_1(w, ldw, N, K, n0, xp, MP, 0, Mc, sw, sx, bias, yc, ldy, scratch);
                else
                    for (long m0 = 0; m0 < Mc; m0 += 32) {
                        if (Mc - m0 > 16)
                            ti_block_2_2(w, ldw, N, K, n0, xp, MP, m0, Mc, sw, sx, bias, yc, ldy, scratch);
                        else
                            ti_block_2_1(w, ldw, N, K, n0, xp, MP, m0, Mc, sw, sx, bias, yc, ldy, scratch);
                    }
            }
            _tile_release();
        }
    }
    tr_ws_put((float *)xp, owned);
    return 0;
}
"""


def int8_linear_source(prologue_text: str, transpose16: str) -> str:
    """Complete C source of the int8 linear library (``prologue_text``: the AVX-512 prologue;
    ``transpose16``: C text defining ``tb_t16``): the AMX ``ti_linear`` and the AVX512-VNNI few-tokens
    ``ti_linear_vnni`` (:mod:`.int8_vnni`), which share the activation quantizer."""
    return "\n".join([prologue_text, transpose16, QUANT, INT8_LAYER, int8_block_c(2, 2), int8_block_c(2, 1), DRIVER,
                      vnni_source()])
