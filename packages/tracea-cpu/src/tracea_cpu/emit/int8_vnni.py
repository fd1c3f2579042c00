"""int8 linear layer for a few tokens on AVX512-VNNI (``vpdpbusd``): a GEMV-style kernel that reads the
row-major int8 weights once, in place, with every 64-byte weight load feeding all the tokens of a pass
(``ti_linear_vnni``). The AMX kernel (:mod:`.amx_int8`) computes 16 tokens per tile whatever the count:
at one token 15/16 of its tile work and its packed-activation traffic are padding. Measured on the 2-core
Sapphire Rapids VM (4096 x 4096, warm, two threads, kernels alone): 1-4 tokens 400-430 us here (~40 GB/s
of weights; a plain two-thread read of the 16 MB reached 40-50 GB/s) against AMX's 450-520 us; from 5
tokens AMX leads (5: 0.87x, 8: 0.81x, 16: 0.57x AMX's time).

Math, exactly the AMX kernel's: per-row symmetric activations ``xq`` in [-127, 127] with the same
quantizer, int32 sums, ``y = sum * sw[n] * sx[m] + bias[n]``. ``vpdpbusd`` multiplies *unsigned* bytes by
signed bytes, so the activations are stored biased, ``xu = xq + 128`` in [1, 255], and the weights' row
sums (``rs[n] = sum_k wq[n, k]``, computed once with the weights) take the bias back out:
``sum_k xq * wq = sum_k xu * wq - 128 * rs[n]``. The int32 lanes wrap (``vpdpbusd`` does not saturate);
both the biased sum and ``128 * rs`` are taken modulo 2^32, so the difference is exact whenever the true
sum fits in int32 (K <= 131072, as the AMX kernel requires).

Layout: a pass computes ``R`` weight rows x ``T`` tokens with ``R * T`` int32 accumulators, 16 lanes each,
over the whole K (64 bytes of K per step; the K tail is a masked load of the weights, zero beyond K,
so the activations' padding never counts). At the end the R accumulators of a token are reduced
across lanes by a shuffle tree into one vector whose lane r holds row r's sum, then dequantized and
stored with one masked store. A thread takes blocks of 16 weight rows (16 page-strided streams; 32-row
blocks and software prefetch 256-1024 bytes ahead measured alike); for more than 4 tokens a block's rows
are read again from L1/L2 for each further pass of up to 4 tokens.
"""

from __future__ import annotations

#: (R rows, T tokens) of the full-block passes: R * T accumulators + T activation vectors + 1 weight
#: vector stay within the 32 zmm registers.
PASSES = {1: 16, 2: 8, 3: 8, 4: 4}
#: weight rows of a block (a thread's unit of work): the rows it streams at once for one token
ROWS = 16
#: software prefetch distance in bytes along each weight row (0: none)
PREFETCH = 0
#: tokens of one pass at most
MAX_T = 4

QUANT = r"""
#define TI_MAXK 131072
/* max|x| over one row of K floats; *bad set when the row holds NaN or Inf. */
static inline float ti_row_amax(const float *r, long K, int *bad) {
    __m512 mx = _mm512_setzero_ps();
    __mmask16 b = 0;
    for (long k = 0; k < K; k += 16) {
        __mmask16 km = (__mmask16)(K - k >= 16 ? 0xffff : (1u << (K - k)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(km, r + k);
        b |= _mm512_mask_cmp_ps_mask(km, v, v, _CMP_UNORD_Q) |
             _mm512_mask_cmp_ps_mask(km, _mm512_abs_ps(v), _mm512_set1_ps(INFINITY), _CMP_EQ_OQ);
        mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
    }
    *bad = b != 0;
    return _mm512_reduce_max_ps(mx);
}

/* 16 floats (lanes outside km read as 0) times inv, rounded half to even, clamped to [-127, 127]. */
static inline __m128i ti_quant16(const float *p, __mmask16 km, __m512 inv) {
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(km, p), inv);
    __m512i iv = _mm512_cvtps_epi32(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    return _mm512_cvtsepi32_epi8(_mm512_max_epi32(iv, _mm512_set1_epi32(-127)));
}
"""

VNNI_COMMON = r"""
/* Quantize rows [0, M) of x into biased bytes: xu[m * ldu + k] = xq[m, k] + 128 for k < ldu (128 past K,
   ldu a multiple of 64); sx[m] per row (NaN for a row holding NaN or Inf: its output row is NaN). */
static void ti_quant_u8(const float *x, long M, long K, long ldx, uint8_t *xu, long ldu, float *sx) {
    const __m128i flip = _mm_set1_epi8((char)0x80);
    for (long m = 0; m < M; m++) {
        const float *r = x + m * ldx;
        uint8_t *d = xu + m * ldu;
        int bad;
        float amax = ti_row_amax(r, K, &bad);
        sx[m] = bad ? NAN : amax / 127.0f;
        if (bad || amax == 0.0f) { memset(d, 128, (size_t)ldu); continue; }
        __m512 inv = _mm512_set1_ps(127.0f / amax);
        for (long k = 0; k < ldu; k += 16) {
            __mmask16 km = (__mmask16)(k >= K ? 0 : K - k >= 16 ? 0xffff : (1u << (K - k)) - 1);
            _mm_storeu_si128((__m128i *)(d + k), _mm_xor_si128(ti_quant16(r + k, km, inv), flip));
        }
    }
}

/* Lane sums of 16-lane int32 vectors by a shuffle tree: ti_pair(a, b) holds, per 128-bit lane,
   (a0+a2, b0+b2, a1+a3, b1+b3); ti_quad of two pairs the four vectors' sums per 128-bit lane; ti_oct
   folds the 128-bit lanes of two quads: applied twice it leaves vector r's total in lane r. */
static inline __m512i ti_pair(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
static inline __m512i ti_quad(__m512i ab, __m512i cd) {
    return _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
}
static inline __m512i ti_oct(__m512i q0, __m512i q1) {
    return _mm512_add_epi32(_mm512_shuffle_i32x4(q0, q1, 0x88), _mm512_shuffle_i32x4(q0, q1, 0xdd));
}

/* Row sums s (lane r: weight row n0 + r, rows lanes) -> y[m, n0 .. n0 + rows). */
static inline void ti_vnni_store(__m512i s, long rows, long n0, long m, const float *sw, const float *sx,
                                 const int32_t *rs, const float *bias, float *y, long ldy) {
    __mmask16 km = (__mmask16)(rows >= 16 ? 0xffff : (1u << rows) - 1);
    s = _mm512_sub_epi32(s, _mm512_slli_epi32(_mm512_maskz_loadu_epi32(km, rs + n0), 7));
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(_mm512_maskz_loadu_ps(km, sw + n0),
                                                                  _mm512_set1_ps(sx[m])));
    if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(km, bias + n0));
    _mm512_mask_storeu_ps(y + m * ldy + n0, km, v);
}
"""


def _tree(names: list[str]) -> str:
    """C expression: the lane sums of up to 16 vectors (lane r = vector r's total), zeros padding."""
    z = "_mm512_setzero_si512()"
    v = names + [z] * (16 - len(names))
    pairs = [f"ti_pair({v[2 * i]}, {v[2 * i + 1]})" if v[2 * i] != z else z for i in range(8)]
    quads = [f"ti_quad({pairs[2 * i]}, {pairs[2 * i + 1]})" if pairs[2 * i] != z else z for i in range(4)]
    octs = [f"ti_oct({quads[2 * i]}, {quads[2 * i + 1]})" if quads[2 * i] != z else z for i in range(2)]
    return f"ti_oct({octs[0]}, {octs[1]})"


def vnni_pass_c(r: int, t: int) -> str:
    """``ti_vnni_R_T``: weight rows n0 .. n0 + R (all inside N) x tokens m0 .. m0 + T over the whole K."""
    acc = [[f"a{i}_{j}" for j in range(t)] for i in range(r)]
    lines = [f"static void ti_vnni_{r}_{t}(const int8_t *w, long ldw, long K, long n0, const uint8_t *xu, long ldu,",
             "        long m0, const float *sw, const float *sx, const int32_t *rs, const float *bias, float *y, long ldy) {",
             "    const int8_t *w0 = w + n0 * ldw;",
             "    const uint8_t *xb = xu + m0 * ldu;"]
    lines += [f"    __m512i {acc[i][j]} = _mm512_setzero_si512();" for i in range(r) for j in range(t)]

    def step(load: str) -> list[str]:
        out = [f"        __m512i x{j} = _mm512_loadu_si512(xb + {j} * ldu + k);" for j in range(t)]
        for i in range(r):
            if "maskz" not in load and PREFETCH:
                out.append(f"        _mm_prefetch((const char *)(w0 + {i} * ldw + k + {PREFETCH}), _MM_HINT_T0);")
            out.append(f"        {{ __m512i v = {load.format(row=f'w0 + {i} * ldw + k')};")
            out += [f"          {acc[i][j]} = _mm512_dpbusd_epi32({acc[i][j]}, x{j}, v);" for j in range(t)]
            out.append("        }")
        return out

    lines.append("    long k = 0;")
    lines.append("    for (; k + 64 <= K; k += 64) {")
    lines += step("_mm512_loadu_si512({row})")
    lines.append("    }")
    lines.append("    if (k < K) {")
    lines.append("        __mmask64 km = ((__mmask64)1 << (K - k)) - 1;")
    lines += step("_mm512_maskz_loadu_epi8(km, {row})")
    lines.append("    }")
    for j in range(t):
        for g in range(0, r, 16):  # 16 rows per reduction and store
            lines.append(f"    ti_vnni_store({_tree([acc[i][j] for i in range(g, min(r, g + 16))])}, {min(16, r - g)}, "
                         f"n0 + {g}, m0 + {j}, sw, sx, rs, bias, y, ldy);")
    lines.append("}")
    return "\n".join(lines) + "\n"


DRIVER = r"""
#define TI_VNNI_ROWS %(rows)d
/* One block of 16 weight rows (or the rows left at N's end) x all M tokens, passes of up to 4 tokens. */
static void ti_vnni_block(long M, long N, long K, long n0, const int8_t *w, long ldw, const uint8_t *xu, long ldu,
                          const float *sw, const float *sx, const int32_t *rs, const float *bias, float *y, long ldy) {
    long rows = TR_MIN(TI_VNNI_ROWS, N - n0);
    for (long m0 = 0; m0 < M; ) {
        long left = M - m0, t = left == 5 || left == 6 ? 3 : TR_MIN(left, 4);  /* 5: 3 + 2, 6: 3 + 3, 7: 4 + 3 */
        if (rows == TI_VNNI_ROWS) {
            switch (t) {
%(full)s
            }
        } else {
            for (long n = n0; n < n0 + rows; n++)
                switch (t) {
%(edge)s
                }
        }
        m0 += t;
    }
}

/* y (M x N, fp32, row stride ldy) = dequant(quant(x) @ w^T) + bias on AVX512-VNNI, for a few tokens.
   x: M x K fp32 (row stride ldx); w: N x K int8 (row stride ldw); sw: N weight scales; rs: N weight
   row sums (int32); bias: N fp32 or null. Returns 0, 1 (workspace allocation failed) or 2 (K too
   large for exact int32 sums). */
int ti_linear_vnni(long M, long N, long K, const float *x, long ldx, const int8_t *w, long ldw, const float *sw,
                   const int32_t *rs, const float *bias, float *y, long ldy, int nth) {
    if (K > TI_MAXK) return 2;
    if (M <= 0 || N <= 0) return 0;
    if (nth <= 0) nth = tr_threads_available();
    long ldu = TR_ROUNDUP(K, 64);
    int owned;
    uint8_t *xu = (uint8_t *)tr_ws_get((size_t)(M * ldu / 4) + M + 16, &owned);
    if (!xu) return 1;
    float *sx = (float *)(xu + M * ldu);
    ti_quant_u8(x, M, K, ldx, xu, ldu, sx);
    long nblk = (N + TI_VNNI_ROWS - 1) / TI_VNNI_ROWS;
    /* below ~1 MB of weights the second thread's start and join cost more than it saves */
    int nt = nblk < 2 * nth || N * K < (1L << 20) ? 1 : nth;
    #pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
    for (long b = 0; b < nblk; b++)
        ti_vnni_block(M, N, K, b * TI_VNNI_ROWS, w, ldw, xu, ldu, sw, sx, rs, bias, y, ldy);
    tr_ws_put((float *)xu, owned);
    return 0;
}
"""


def vnni_source() -> str:
    """The C text of the VNNI few-tokens int8 linear kernel (after an AVX-512 prologue and :data:`QUANT`)."""
    full, edge = [], []
    for t, r in PASSES.items():
        calls = "".join(f"ti_vnni_{r}_{t}(w, ldw, K, n0 + {r0}, xu, ldu, m0, sw, sx, rs, bias, y, ldy); "
                        for r0 in range(0, ROWS, r))
        full.append(f"                case {t}: {calls}break;")
        edge.append(f"                    case {t}: ti_vnni_1_{t}(w, ldw, K, n, xu, ldu, m0, sw, sx, rs, bias, y, ldy); "
                    "break;")
    passes = [vnni_pass_c(r, t) for t, r in PASSES.items()] + [vnni_pass_c(1, t) for t in PASSES]
    driver = DRIVER % {"full": "\n".join(full), "edge": "\n".join(edge), "rows": ROWS}
    return "\n".join([VNNI_COMMON] + passes + [driver])
