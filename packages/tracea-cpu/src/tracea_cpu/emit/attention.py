"""Flash-style attention forward on the CPU: per group of query rows, stream blocks of ``KB`` keys with an
online softmax (running row max ``m`` and row sum ``l``); no seq_q x seq_kv buffer exists.

q, k, v and the output are read and written in place through (batch, head, seq) element strides (head_dim
unit-stride), so the (batch, seq, heads, dim) views Hugging Face and timm models hand to SDPA need no
copies. Two drivers share the softmax and the P V product:

* **tile** (many query rows per kv head: prefill, ViT, Swin windows): a ``BQ``-row query block, its
  scaled Q^T packed d-major (``BQ x D`` floats); S = Q K^T by a ``BQ x BK`` register tile that broadcasts
  Q^T against ``BK``-wide K^T panels, packed once per call and (batch, kv head) and shared by the query
  heads of a GQA group.
* **rows** (a few query rows per kv head: LLM decode, class-token attention, GQA groups of one position):
  the rows of one kv head's query heads together, up to ``RM`` at a time (scaled, packed), against the
  keys read in place: ``RM x 4`` dot products over head_dim at a time, reduced across lanes. Nothing
  is packed per key, so a decode step reads K and V once.

P V: ``O[rows, d-chunk] = alpha * O + P V`` by register tiles of up to ``RG`` rows x ``u`` vectors
(u = 4, 2, 1, and a masked partial vector for a head_dim that is not a multiple of the vector width),
V rows read in place.

Causal masking is top-left aligned (key j visible to query i when j <= i, also when seq_q != seq_kv). An
optional mask (``mkind`` 1: boolean, a key takes part where the mask is non-zero, else its logit is
replaced by -inf; 2: additive, added to the scaled logits) is read from a packed (MB, MH, Sq, Skv) array
whose batch / head extents MB / MH are 1 (broadcast) or B / H. An optional ``lse`` (B, H, Sq) float32
receives each row's log-sum-exp ``m + log(l)`` of the scaled, masked logits (-inf for a row whose logits
are all -inf).

NaN and Inf follow ``softmax(masked_fill(scale Q K^T, mask, -inf)) @ V`` in IEEE arithmetic, as the
float64 reference and PyTorch do: a NaN or +inf logit makes its row NaN (``exp(NaN)`` and
``exp(inf - inf)`` are NaN: ``tr_vexp`` propagates NaN and gives exactly 0 at -inf and +inf at +inf); a
row whose logits are all -inf gets weights 0 (PyTorch's convention, not 0/0); a masked key's logit is
replaced, so its k never matters, but its weight 0 still multiplies its v (0 x NaN and 0 x Inf are NaN).
The kernel never reads the keys after a causal row group's last visible one, so a non-finite v there is
found by a scan of V (causal calls only: the last such key per kv head) and written into the rows that
would have multiplied it.

Element types (``elem``): float32, and bf16 / fp16 where :data:`ELEMENTS` lists them. A 16-bit q, k, v and mask
are widened to float32 as they are loaded or packed, the arithmetic is the float32 kernel's, and the output is
rounded once to nearest even (NaN kept NaN); the log-sum-exp stays float32.

Threads: one call runs without an OpenMP region when it is given one thread; otherwise the K^T packing
(and the causal V scan) are shared first, then the row groups, handed out dynamically.
"""

from __future__ import annotations

from ..isa import Isa
from .calls import ATTENTION_CALL
from .common import prologue

#: dot products of the rows driver computed together: keys per step
_KEYS = 4

# Partial vectors (head_dim not a multiple of the vector width) and 4-way lane reductions, per ISA.
_EXTRA = {
    "avx512": r"""
#define VLOADN(p, n) _mm512_maskz_loadu_ps((__mmask16)((1u << (n)) - 1u), (p))
#define VSTOREN(p, v, n) _mm512_mask_storeu_ps((p), (__mmask16)((1u << (n)) - 1u), (v))
#define VKEEPN(x, n) _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), (__mmask16)((1u << (n)) - 1u), (x))
#define VKEEPNZ(x, mk) _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), _mm512_cmp_ps_mask((mk), _mm512_setzero_ps(), _CMP_NEQ_UQ), (x))
#define TR_TRANSPOSE 1
/* r[0..15] = the 16 x 16 block's rows -> its columns */
static inline void tr_transpose(V *r) {
    V t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
        r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xDD);
    }
}
static inline void tr_hsum4(V a, V b, V c, V d, float *dst) {
    __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    __m256 x = _mm256_hadd_ps(_mm256_hadd_ps(a8, b8), _mm256_hadd_ps(c8, d8));
    _mm_storeu_ps(dst, _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1)));
}
""",
    "avx2": r"""
static inline __m256i tr_lanes(long n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#define VLOADN(p, n) _mm256_maskload_ps((p), tr_lanes(n))
#define VSTOREN(p, v, n) _mm256_maskstore_ps((p), tr_lanes(n), (v))
#define VKEEPN(x, n) _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), (x), _mm256_castsi256_ps(tr_lanes(n)))
#define VKEEPNZ(x, mk) _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), (x), _mm256_cmp_ps((mk), _mm256_setzero_ps(), _CMP_NEQ_UQ))
#define TR_TRANSPOSE 1
static inline void tr_transpose(V *r) {
    V t[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
        t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
    }
    for (int i = 0; i < 8; i++) r[i] = t[i];
}
static inline void tr_hsum4(V a, V b, V c, V d, float *dst) {
    __m256 x = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    _mm_storeu_ps(dst, _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1)));
}
""",
    "neon": r"""
static inline V tr_loadn(const float *p, long n) { float t[4] = {0, 0, 0, 0}; memcpy(t, p, n * 4); return vld1q_f32(t); }
static inline void tr_storen(float *p, V v, long n) { float t[4]; vst1q_f32(t, v); memcpy(p, t, n * 4); }
#define VLOADN(p, n) tr_loadn((p), (n))
#define VSTOREN(p, v, n) tr_storen((p), (v), (n))
static inline V tr_keepn(V x, long n) {
    uint32_t l[4] = {0, 1, 2, 3};
    return vbslq_f32(vcltq_u32(vld1q_u32(l), vdupq_n_u32((uint32_t)n)), x, vdupq_n_f32(-INFINITY));
}
#define VKEEPN(x, n) tr_keepn((x), (n))
#define VKEEPNZ(x, mk) vbslq_f32(vmvnq_u32(vceqq_f32((mk), vdupq_n_f32(0.0f))), (x), vdupq_n_f32(-INFINITY))
static inline void tr_hsum4(V a, V b, V c, V d, float *dst) {
    vst1q_f32(dst, vpaddq_f32(vpaddq_f32(a, b), vpaddq_f32(c, d)));
}
""",
    "scalar": r"""
#define VLOADN(p, n) ((n) > 0 ? *(p) : 0.0f)
#define VSTOREN(p, v, n) do { if ((n) > 0) *(p) = (v); } while (0)
#define VKEEPN(x, n) ((n) > 0 ? (x) : -INFINITY)
#define VKEEPNZ(x, mk) ((mk) != 0.0f ? (x) : -INFINITY)
static inline void tr_hsum4(V a, V b, V c, V d, float *dst) { dst[0] = a; dst[1] = b; dst[2] = c; dst[3] = d; }
""",
}


#: the element type of q, k, v, the mask and the output (``TIN``): loads widen it to float32 vectors
#: (``LDI`` / ``LDIN``: whole / ``n`` lanes), stores round float32 to it (``STO`` / ``STON``, round to
#: nearest even, NaN kept NaN); ``TIN_FINITE`` tests one element, ``TIN_NAN`` is its NaN. The kernel
#: computes in float32 whatever the element type.
_ELEM_F32 = r"""
typedef float TIN;
#define LDI(p) VLOAD(p)
#define LDIN(p, n) VLOADN((p), (n))
#define STO(p, v) VSTORE((p), (v))
#define STON(p, v, n) VSTOREN((p), (v), (n))
#define TOF(x) (x)
#define TIN_FINITE(x) ((x) - (x) == 0.0f)
#define TIN_NAN NAN
"""

_ELEM_16 = r"""
typedef uint16_t TIN;
static inline float TOF(uint16_t x) { return tr_widen1(x); }
static inline V tr_ldin(const uint16_t *p, long n) { uint16_t t[VW] = {0}; memcpy(t, p, (size_t)n * 2); return LDI(t); }
static inline void tr_ston(uint16_t *p, V x, long n) { uint16_t t[VW]; STO(t, x); memcpy(p, t, (size_t)n * 2); }
#define LDIN(p, n) tr_ldin((p), (n))
#define STON(p, v, n) tr_ston((p), (v), (n))
"""

#: per (element type, ISA): whole-vector loads and stores (fp16 only on AVX-512, whose ``vcvtph2ps`` also
#: widens the odd scalar, :data:`_WIDEN1`)
_ELEM: dict[tuple[str, str], str] = {
    ("bf16", "avx512"): r"""
#define LDI(p) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
static inline __m256i tr_narrow(__m512 x) {
    __m512i i = _mm512_castps_si512(x), one = _mm512_set1_epi32(1);
    __m512i r = _mm512_add_epi32(i, _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(i, 16), one), _mm512_set1_epi32(0x7FFF)));
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_or_si512(i, _mm512_set1_epi32(0x400000)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}
#define STO(p, v) _mm256_storeu_si256((__m256i *)(p), tr_narrow(v))
""",
    ("bf16", "avx2"): r"""
#define LDI(p) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
static inline __m128i tr_narrow(__m256 x) {
    __m256i i = _mm256_castps_si256(x), one = _mm256_set1_epi32(1);
    __m256i r = _mm256_add_epi32(i, _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(i, 16), one), _mm256_set1_epi32(0x7FFF)));
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    r = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(_mm256_or_si256(i, _mm256_set1_epi32(0x400000))), nan));
    r = _mm256_srli_epi32(r, 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}
#define STO(p, v) _mm_storeu_si128((__m128i *)(p), tr_narrow(v))
""",
    ("f16", "avx512"): r"""
#define LDI(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define STO(p, v) _mm256_storeu_si256((__m256i *)(p), _mm512_cvtps_ph((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
""",
}

_WIDEN1 = {"bf16": r"""
static inline float tr_widen1(uint16_t x) { uint32_t u = (uint32_t)x << 16; float f; memcpy(&f, &u, 4); return f; }
#define TIN_FINITE(x) (((x) & 0x7F80) != 0x7F80)
#define TIN_NAN ((uint16_t)0x7FC0)
""", "f16": r"""
static inline float tr_widen1(uint16_t x) { return _mm512_cvtss_f32(_mm512_cvtph_ps(_mm256_set1_epi16((short)x))); }
#define TIN_FINITE(x) (((x) & 0x7C00) != 0x7C00)
#define TIN_NAN ((uint16_t)0x7E00)
"""}

#: element types the kernel is emitted for, by ISA
ELEMENTS = {"avx512": ("f32", "bf16", "f16"), "avx2": ("f32", "bf16"), "neon": ("f32",), "scalar": ("f32",)}


def _elem(isa: Isa, elem: str) -> str:
    if elem == "f32":
        return _ELEM_F32
    if elem not in ELEMENTS.get(isa.name, ()):
        raise ValueError(f"no {elem} attention kernel for {isa.name}")
    return _WIDEN1[elem] + _ELEM[(elem, isa.name)] + _ELEM_16


def _s_tile(isa: Isa, bq: int, bk: int, name: str, dot: bool = False) -> str:
    """S[0:BQ, 0:bk] (row stride KB) = Q^T' K^T over D: Q^T packed d-major (BQ per d), K^T panels of BK
    keys per d (``bk`` = BK, or one vector for a block's last partial panel); Q is packed scaled.

    ``dot``: the bf16 tile on ``vdpbf16ps`` (AVX512_BF16), S = scale * Q K^T with Q^T and K^T packed as bf16
    pairs along d (the loop runs over ``ceil(D / 2)`` 32-bit words, unscaled), two products per lane and
    instruction; products of bf16 values are exact, sums in fp32."""
    nv = bk // isa.width
    acc = [[f"s{i}_{v}" for v in range(nv)] for i in range(bq)]
    ptr = "const float *restrict"
    out = [f"static __attribute__((noinline)) void {name}(long D, {ptr} qt{'_' * dot}, {ptr} kt{'_' * dot}, "
           "float *restrict s, float sc) {",
           "    const uint32_t *qt = (const uint32_t *)qt_, *kt = (const uint32_t *)kt_;" if dot else "    (void)sc;"]
    for i in range(bq):
        out.append("    V " + ", ".join(f"{n} = VZERO()" for n in acc[i]) + ";")
    out.append("    for (long d = 0; d < D; d++) {")
    for v in range(nv):
        out.append(f"        __m512bh k{v} = (__m512bh)_mm512_loadu_si512(kt + d * BK + {v * isa.width});" if dot
                   else f"        V k{v} = VLOAD(kt + d * BK + {v * isa.width});")
    for i in range(bq):
        out.append(f"        {{ __m512bh q = (__m512bh)_mm512_set1_epi32((int)qt[d * BQ + {i}]);" if dot
                   else f"        {{ V q = VSET1(qt[d * BQ + {i}]);")
        for v in range(nv):
            out.append(f"          {acc[i][v]} = _mm512_dpbf16_ps({acc[i][v]}, q, k{v});" if dot
                       else f"          {acc[i][v]} = VFMA(q, k{v}, {acc[i][v]});")
        out.append("        }")
    out.append("    }")
    if dot:
        out.append("    V scv = VSET1(sc);")
    for i in range(bq):
        for v in range(nv):
            val = f"VMUL({acc[i][v]}, scv)" if dot else acc[i][v]
            out.append(f"    VSTORE(s + {i} * KB + {v * isa.width}, {val});")
    out.append("}")
    return "\n".join(out)


def _s_dot(rows: int) -> str:
    """S[r, j:j+4] (row stride KB) for ``rows`` packed query rows (row stride Dp, zero-padded to a whole
    vector) against keys k0..k3 read in place: dot products over D, reduced across lanes."""
    acc = [[f"a{r}_{c}" for c in range(_KEYS)] for r in range(rows)]
    out = [f"static __attribute__((noinline)) void tr_s_dot{rows}(long D, long Dp, const float *restrict qp, "
           "const TIN *const *kr, float *restrict s) {",
           "    const TIN *k0 = kr[0], *k1 = kr[1], *k2 = kr[2], *k3 = kr[3];"]
    for r in range(rows):
        out.append("    V " + ", ".join(f"{n} = VZERO()" for n in acc[r]) + ";")
    body = []
    for r in range(rows):
        body.append(f"        {{ V q = VLOAD(qp + {r} * Dp + d);")
        for c in range(_KEYS):
            body.append(f"          {acc[r][c]} = VFMA(q, x{c}, {acc[r][c]});")
        body.append("        }")
    out.append("    long d = 0;")
    out.append("    for (; d + VW <= D; d += VW) {")
    out.append("        " + " ".join(f"V x{c} = LDI(k{c} + d);" for c in range(_KEYS)))
    out += body
    out.append("    }")
    out.append("    if (d < D) {")
    out.append("        " + " ".join(f"V x{c} = LDIN(k{c} + d, D - d);" for c in range(_KEYS)))
    out += body
    out.append("    }")
    for r in range(rows):
        out.append(f"    tr_hsum4({', '.join(acc[r])}, s + {r} * KB);")
    out.append("}")
    return "\n".join(out)


def _pv(g: int, u: int, partial: bool) -> str:
    """O[i0:i0+g, d0:d0+u*VW] = alpha * O + P[i0:i0+g, :nk] V[:nk, d0:...]; P row stride KB, V row stride
    vs (read in place), O row stride Dvp. ``partial``: one vector of ``n`` lanes (masked loads)."""
    name = f"tr_pv{'p' if partial else u}_{g}"
    out = [f"static __attribute__((noinline)) void {name}(long nk, long d0, long n, long vs, const float *restrict p, "
           "const TIN *restrict v, float *restrict o, long Dvp, const float *restrict alpha) {",
           "    (void)n;"]
    for r in range(g):
        out.append(f"    V al{r} = VSET1(alpha[{r}]);")
        for c in range(u):
            out.append(f"    V o{r}_{c} = VMUL(al{r}, VLOAD(o + {r} * Dvp + d0 + {c} * VW));")
    out.append("    for (long j = 0; j < nk; j++) {")
    for c in range(u):
        load = "LDIN(v + j * vs + d0, n)" if partial else f"LDI(v + j * vs + d0 + {c} * VW)"
        out.append(f"        V v{c} = {load};")
    for r in range(g):
        out.append(f"        {{ V pr = VSET1(p[{r} * KB + j]);")
        for c in range(u):
            out.append(f"          o{r}_{c} = VFMA(pr, v{c}, o{r}_{c});")
        out.append("        }")
    out.append("    }")
    for r in range(g):
        for c in range(u):
            out.append(f"    VSTORE(o + {r} * Dvp + d0 + {c} * VW, o{r}_{c});")
    out.append("}")
    return "\n".join(out)


def _pv_rows(isa: Isa, u: int) -> int:
    """Rows of a P V register tile of ``u`` vectors: accumulators, the u V vectors and a broadcast fit."""
    return max(1, min(8, (isa.registers - 2 - u) // (u + 1)))


def _pv_all(isa: Isa) -> tuple[str, str]:
    """The P V tiles and ``tr_pv(rows, nk, Dv, ...)``, which covers Dv in chunks of 4, 2 and 1 vectors
    (and a partial one), each in row groups of that chunk's tile height."""
    fns, cases = [], []
    widths = [u for u in (4, 2, 1) if u * isa.width <= 64 or u == 1]
    for u in widths + ["p"]:
        partial = u == "p"
        uu = 1 if partial else int(u)
        rg = _pv_rows(isa, uu)
        for g in range(1, rg + 1):
            fns.append(_pv(g, uu, partial))
        table = ", ".join(f"tr_pv{u}_{g}" for g in range(1, rg + 1))
        cases.append((u, rg, table))
    lines = ["typedef void (*tr_pv_fn)(long, long, long, long, const float *, const TIN *, float *, long, const float *);"]
    for u, rg, table in cases:
        lines.append(f"static const tr_pv_fn tr_pv{u}_tab[{rg}] = {{{table}}};")
    lines.append("static void tr_pv(long rows, long nk, long Dv, long Dvp, const float *p, const TIN *v, long vs, "
                 "float *o, const float *alpha) {")
    lines.append("    long d0 = 0;")
    for u, rg, _ in cases:
        if u == "p":
            lines.append("    if (d0 < Dv) {")
            step = "VW"
        else:
            lines.append(f"    for (; d0 + {u} * VW <= Dv; d0 += {u} * VW) {{")
            step = None
        lines.append(f"        for (long i0 = 0; i0 < rows; i0 += {rg}) {{")
        lines.append(f"            long g = TR_MIN({rg}, rows - i0);")
        lines.append(f"            tr_pv{u}_tab[g - 1](nk, d0, Dv - d0, vs, p + i0 * KB, v, o + i0 * Dvp, Dvp, alpha + i0);")
        lines.append("        }")
        if step:
            lines.append(f"        d0 += {step};")
        lines.append("    }")
    lines.append("}")
    return "\n".join(fns), "\n".join(lines)


BODY = r"""
/* dst[d * ld + i] = scale * src[i * ss + d] for rows i < n (n <= VW) and d < D: VW x VW register
   transposes where the ISA has them (rows past n read as 0; only n lanes are stored), else scalar. */
static void tr_tpack(const TIN *src, long ss, long n, long D, float *dst, long ld, float scale) {
#ifdef TR_TRANSPOSE
    V sc = VSET1(scale);
    long d0 = 0;
    for (; d0 < D; d0 += VW) {
        long w = TR_MIN(VW, D - d0);
        V r[VW];
        for (long i = 0; i < VW; i++)
            r[i] = i < n ? VMUL(w == VW ? LDI(src + i * ss + d0) : LDIN(src + i * ss + d0, w), sc) : VZERO();
        tr_transpose(r);
        for (long d = 0; d < w; d++) {
            if (n == VW) VSTORE(dst + (d0 + d) * ld, r[d]);
            else VSTOREN(dst + (d0 + d) * ld, r[d], n);
        }
    }
#else
    for (long i = 0; i < n; i++)
        for (long d = 0; d < D; d++) dst[d * ld + i] = TOF(src[i * ss + d]) * scale;
#endif
}

typedef struct {
    long B, H, KVH, Sq, Skv, D, Dv, causal, mkind, MB, MH, rows_max;
    long qb, qh, qs, kb, kh, ks, vb, vh, vs, ob, oh, os;
    float scale;
    const TIN *q, *k, *v, *mask;
    TIN *out;
    float *lse;
    long G, Skp, Dp, Dvp, nqb, nrb, rpi;  /* GQA group, padded keys, padded head dims, query blocks per head,
                                          rows driver: items per kv head and query rows per item */
    float *kt;                       /* K^T panels (tile driver), (B * KVH) x Skp x D */
    long *vbad;                      /* causal: per (batch, kv head), the last key whose v has a NaN / Inf, -1 if none */
} tr_att;

#if TR_DOT
/* K^T panels of key block jb of (batch, kv head) bkv as bf16 pairs along d: kt[(jb * Dh + p) * BK + j] holds
   k[j, 2p] | k[j, 2p + 1] << 16 (0 past D and past Skv), Dh = ceil(D / 2). */
static void tr_pack_kt(const tr_att *a, long bkv, long jb) {
    long b = bkv / a->KVH, h = bkv % a->KVH, D = a->D, Dh = (D + 1) / 2, j0 = jb * BK, n = TR_MIN(BK, a->Skv - j0);
    const TIN *ks = a->k + b * a->kb + h * a->kh + j0 * a->ks;
    uint32_t *kt = (uint32_t *)a->kt + bkv * a->Skp * Dh + j0 * Dh;
    for (long p = 0; p < Dh; p++) {
        uint32_t *row = kt + p * BK;
        long j = 0;
        for (; j < n; j++) {
            const TIN *kr = ks + j * a->ks;
            row[j] = (uint32_t)kr[2 * p] | (2 * p + 1 < D ? (uint32_t)kr[2 * p + 1] << 16 : 0u);
        }
        for (; j < BK; j++) row[j] = 0u;
    }
}
#else
/* K^T panels of key block jb of (batch, kv head) bkv: kt[(jb * D + d) * BK + j], zeros past Skv. */
static void tr_pack_kt(const tr_att *a, long bkv, long jb) {
    long b = bkv / a->KVH, h = bkv % a->KVH, D = a->D, j0 = jb * BK, n = TR_MIN(BK, a->Skv - j0);
    const TIN *ks = a->k + b * a->kb + h * a->kh + j0 * a->ks;
    float *kt = a->kt + bkv * a->Skp * D + j0 * D;
    for (long jv = 0; jv < BK; jv += VW) {
        long nv = TR_MAX(0, TR_MIN(VW, n - jv));
        if (nv < VW)
            for (long d = 0; d < D; d++) memset(kt + d * BK + jv, 0, sizeof(float) * VW);
        if (nv) tr_tpack(ks + jv * a->ks, a->ks, nv, D, kt + jv, BK, 1.0f);
    }
}
#endif

/* causal: the last key of (batch, kv head) bkv whose v row holds a NaN or Inf (-1: none) */
static void tr_scan_v(const tr_att *a, long bkv) {
    long b = bkv / a->KVH, h = bkv % a->KVH, Dv = a->Dv, bad = a->Skv - 1;
    const TIN *vs = a->v + b * a->vb + h * a->vh;
    for (; bad >= 0; bad--) {
        const TIN *vr = vs + bad * a->vs;
        V t = VZERO();
        long d = 0;
        for (; d + VW <= Dv; d += VW) t = VFMA(LDI(vr + d), VZERO(), t);
        if (d < Dv) t = VFMA(LDIN(vr + d, Dv - d), VZERO(), t);
        if (VANYNAN(t)) break;
    }
    a->vbad[bkv] = bad;
}

/* Online softmax over one block of nk keys for `rows` rows: s (row stride KB) holds the scaled logits
   of nk keys (readable up to a whole vector past nk); row r sees its first lim[r] keys (causal) and its
   mask row mrow[r] (at the block's first key). Leaves P in s; updates m, l; alpha: the rescale of O. */
static void tr_softmax(long rows, long nk, float *s, const long *lim, const TIN *const *mrow, int mkind,
                       float *m, float *l, float *alpha) {
    long nkp = TR_ROUNDUP(nk, VW);
    for (long r = 0; r < rows; r++) {
        float *row = s + r * KB;
        long lm = TR_MAX(0, TR_MIN(nk, lim[r])), lv = lm / VW * VW;
        const TIN *mr = mrow[r];
        V mx = VSET1(-INFINITY);
        for (long j = 0; j < lv; j += VW) {
            V x = VLOAD(row + j);
            if (mkind == 1) x = VKEEPNZ(x, LDI(mr + j));
            else if (mkind == 2) x = VADD(x, LDI(mr + j));
            VSTORE(row + j, x);
            mx = VMAX(mx, x);
        }
        if (lv < lm) {
            V x = VKEEPN(VLOAD(row + lv), lm - lv);
            if (mkind == 1) x = VKEEPNZ(x, LDIN(mr + lv, lm - lv));
            else if (mkind == 2) x = VADD(x, LDIN(mr + lv, lm - lv));
            VSTORE(row + lv, x);
            mx = VMAX(mx, x);
        }
        long le = TR_ROUNDUP(lm, VW);  /* past le: weight 0 (masked by causality or past the keys) */
        for (long j = le; j < nkp; j += VW) VSTORE(row + j, VZERO());
        float hm = VHMAX(mx), mo = m[r], mn = mo < hm ? hm : mo;
        float mref = mn == -INFINITY ? 0.0f : mn;  /* a row that has seen only masked keys keeps 0 */
        float al = mo == -INFINITY ? 0.0f : expf(mo - mref);
        V mv = VSET1(mref), sum = VZERO();
        for (long j = 0; j < le; j += VW) {
            V e = tr_vexp(VSUB(VLOAD(row + j), mv));
            VSTORE(row + j, e);
            sum = VADD(sum, e);
        }
        alpha[r] = al;
        l[r] = l[r] * al + VHSUM(sum);
        m[r] = mn;
    }
}

/* Write `rows` output rows (row r at out_r[r]) from O / l, and their log-sum-exp. */
static void tr_finish(long rows, long Dv, long Dvp, const float *o, const float *m, const float *l,
                      TIN *const *out_r, float *const *lse_r) {
    for (long r = 0; r < rows; r++) {
        /* l = 0: every logit of the row was -inf (weights 0, PyTorch's convention) */
        float lr = l[r], inv = lr == 0.0f ? 1.0f : 1.0f / lr;
        V iv = VSET1(inv);
        const float *or_ = o + r * Dvp;
        TIN *dst = out_r[r];
        long d = 0;
        for (; d + VW <= Dv; d += VW) STO(dst + d, VMUL(VLOAD(or_ + d), iv));
        if (d < Dv) STON(dst + d, VMUL(VLOAD(or_ + d), iv), Dv - d);
        if (lse_r) *lse_r[r] = lr == 0.0f ? -INFINITY : (m[r] == -INFINITY ? 0.0f : m[r]) + logf(lr);
    }
}

/* Causal: keys from kend on were never read; weight 0 times a NaN / Inf v there is NaN. */
static void tr_causal_tail(const tr_att *a, long bkv, long kend, long rows, TIN *const *out_r) {
    if (!a->causal || a->vbad[bkv] < kend) return;
    long b = bkv / a->KVH, h = bkv % a->KVH;
    const TIN *vv = a->v + b * a->vb + h * a->vh;
    for (long d = 0; d < a->Dv; d++) {
        int hit = 0;
        for (long j = kend; j < a->Skv && !hit; j++) hit = !TIN_FINITE(vv[j * a->vs + d]);
        if (hit)
            for (long r = 0; r < rows; r++) out_r[r][d] = TIN_NAN;
    }
}

#define TR_WS_THREAD(a) TR_ROUNDUP((a)->D * BQ + BQ * KB + BQ * (a)->Dvp + 4 * BQ + RPI * ((a)->Dp + (a)->Dvp + 4) + RM * KB + 4 * VW, 16)

/* Tile driver: query block qb0 (BQ rows) of (batch, head) bh. */
static void tr_tile_item(const tr_att *a, long item, float *tws) {
    long bh = item / a->nqb, q0 = (item % a->nqb) * BQ, b = bh / a->H, h = bh % a->H;
    long kvh = h / a->G, bkv = b * a->KVH + kvh, D = a->D, Dvp = a->Dvp;
    long rows = TR_MIN(BQ, a->Sq - q0);
    float *qt = tws, *s = qt + D * BQ, *o = s + BQ * KB, *m = o + BQ * Dvp, *l = m + BQ, *alpha = l + BQ;
    const TIN *qs = a->q + b * a->qb + h * a->qh + q0 * a->qs;
#if TR_DOT
    long KD = (D + 1) / 2;  /* Q^T as bf16 pairs along d, unscaled (the S tile scales its fp32 sums) */
    for (long p = 0; p < KD; p++)
        for (long i = 0; i < BQ; i++) {
            uint32_t w = 0u;
            if (i < rows) {
                const TIN *qr = qs + i * a->qs;
                w = (uint32_t)qr[2 * p] | (2 * p + 1 < D ? (uint32_t)qr[2 * p + 1] << 16 : 0u);
            }
            ((uint32_t *)qt)[p * BQ + i] = w;
        }
#else
    long KD = D;
    if (rows < BQ) memset(qt, 0, sizeof(float) * D * BQ);
    for (long i0 = 0; i0 < rows; i0 += VW) tr_tpack(qs + i0 * a->qs, a->qs, TR_MIN(VW, rows - i0), D, qt + i0, BQ, a->scale);
#endif
    for (long i = 0; i < BQ; i++) { m[i] = -INFINITY; l[i] = 0.0f; alpha[i] = 0.0f; }
    memset(o, 0, sizeof(float) * BQ * Dvp);
    long kend = a->causal ? TR_MIN(a->Skv, q0 + rows) : a->Skv;
    const float *kt = a->kt + bkv * a->Skp * KD;
    const TIN *vs = a->v + b * a->vb + kvh * a->vh;
    const TIN *mbase = a->mkind ? a->mask + (((a->MB > 1 ? b : 0) * a->MH + (a->MH > 1 ? h : 0)) * a->Sq + q0) * a->Skv : 0;
    long lim[BQ];
    const TIN *mrow[BQ];
    for (long kb0 = 0; kb0 < kend; kb0 += KB) {
        long nk = TR_MIN(KB, kend - kb0);
        long j0 = 0;
        /* whole panels (the last one too when it lacks less than a vector: panels are zero-padded) */
        for (; j0 < nk && (j0 + BK <= nk || nk - j0 > BK - VW); j0 += BK) tr_s_tile(KD, qt, kt + (kb0 + j0) * KD, s + j0, a->scale);
        /* else the last partial panel a vector at a time */
        for (long jv = 0; j0 + jv < nk; jv += VW) tr_s_tile1(KD, qt, kt + (kb0 + j0) * KD + jv, s + j0 + jv, a->scale);
        for (long i = 0; i < rows; i++) {
            lim[i] = a->causal ? q0 + i + 1 - kb0 : nk;
            mrow[i] = mbase ? mbase + i * a->Skv + kb0 : 0;
        }
        tr_softmax(rows, nk, s, lim, mrow, (int)a->mkind, m, l, alpha);
        tr_pv(rows, nk, a->Dv, Dvp, s, vs + kb0 * a->vs, a->vs, o, alpha);
    }
    TIN *out_r[BQ], *os = a->out + b * a->ob + h * a->oh + q0 * a->os;
    float *lse_r[BQ];
    for (long i = 0; i < rows; i++) {
        out_r[i] = os + i * a->os;
        if (a->lse) lse_r[i] = a->lse + bh * a->Sq + q0 + i;
    }
    tr_finish(rows, a->Dv, Dvp, o, m, l, out_r, a->lse ? lse_r : 0);
    tr_causal_tail(a, bkv, kend, rows, out_r);
}

static void tr_s_dot(long rows, long D, long Dp, const float *qp, const TIN *const *kr, float *s) {
    switch (rows) {
    case 1: tr_s_dot1(D, Dp, qp, kr, s); break;
    case 2: tr_s_dot2(D, Dp, qp, kr, s); break;
#if RM > 2
    case 3: tr_s_dot3(D, Dp, qp, kr, s); break;
    default: tr_s_dot4(D, Dp, qp, kr, s); break;
#else
    default: tr_s_dot2(D, Dp, qp, kr, s); break;
#endif
    }
}

/* Rows driver: rows r0 .. r0 + rpi of the G * Sq query rows that share (batch, kv head) `item / nrb`
   (r0 = (item % nrb) * rpi); row r is query position r % Sq of head kvh * G + r / Sq. Each key block is
   read once for all of them (groups of RM rows in turn), so K and V stream through the cache once. */
static void tr_rows_item(const tr_att *a, long item, float *tws) {
    long bkv = item / a->nrb, r0 = (item % a->nrb) * a->rpi, b = bkv / a->KVH, kvh = bkv % a->KVH;
    long D = a->D, Dp = a->Dp, Dvp = a->Dvp, Sq = a->Sq;
    long nrows = TR_MIN(a->rpi, a->G * Sq - r0);
    float *qp = tws, *s = qp + RPI * Dp, *o = s + RM * KB, *m = o + RPI * Dvp, *l = m + RPI, *alpha = l + RPI;
    long pos[RPI], head[RPI], lim[RM];
    const TIN *mrow0[RPI], *mrow[RM];
    long kend = 0;
    V sc = VSET1(a->scale);
    for (long r = 0; r < nrows; r++) {  /* tr_s_dot reads exactly its rows, zero-padded to Dp */
        float *dst = qp + r * Dp;
        long rr = r0 + r;
        pos[r] = rr % Sq;
        head[r] = kvh * a->G + rr / Sq;
        const TIN *qr = a->q + b * a->qb + head[r] * a->qh + pos[r] * a->qs;
        long d = 0;
        for (; d + VW <= D; d += VW) VSTORE(dst + d, VMUL(LDI(qr + d), sc));
        if (d < D) VSTORE(dst + d, VMUL(LDIN(qr + d, D - d), sc));
        mrow0[r] = a->mkind ? a->mask + (((a->MB > 1 ? b : 0) * a->MH + (a->MH > 1 ? head[r] : 0)) * Sq + pos[r]) * a->Skv : 0;
        kend = TR_MAX(kend, a->causal ? TR_MIN(a->Skv, pos[r] + 1) : a->Skv);
        m[r] = -INFINITY; l[r] = 0.0f; alpha[r] = 0.0f;
    }
    memset(o, 0, sizeof(float) * nrows * Dvp);
    const TIN *ks = a->k + b * a->kb + kvh * a->kh, *vs = a->v + b * a->vb + kvh * a->vh;
    for (long kb0 = 0; kb0 < kend; kb0 += KB) {
        long nk = TR_MIN(KB, kend - kb0);
        for (long g0 = 0; g0 < nrows; g0 += RM) {
            long rows = TR_MIN(RM, nrows - g0);
            for (long j = 0; j < nk; j += 4) {
                const TIN *kr[4];
                for (long c = 0; c < 4; c++) kr[c] = ks + (kb0 + TR_MIN(j + c, nk - 1)) * a->ks;
                tr_s_dot(rows, D, Dp, qp + g0 * Dp, kr, s + j);
            }
            for (long r = 0; r < rows; r++) {
                lim[r] = a->causal ? pos[g0 + r] + 1 - kb0 : nk;
                mrow[r] = mrow0[g0 + r] ? mrow0[g0 + r] + kb0 : 0;
            }
            tr_softmax(rows, nk, s, lim, mrow, (int)a->mkind, m + g0, l + g0, alpha + g0);
            tr_pv(rows, nk, a->Dv, Dvp, s, vs + kb0 * a->vs, a->vs, o + g0 * Dvp, alpha + g0);
        }
    }
    TIN *out_r[RPI];
    float *lse_r[RPI];
    for (long r = 0; r < nrows; r++) {
        out_r[r] = a->out + b * a->ob + head[r] * a->oh + pos[r] * a->os;
        if (a->lse) lse_r[r] = a->lse + (b * a->H + head[r]) * Sq + pos[r];
    }
    tr_finish(nrows, a->Dv, Dvp, o, m, l, out_r, a->lse ? lse_r : 0);
    /* keys before kend were read (weight 0 past a row's own causal end): only keys from kend on remain */
    tr_causal_tail(a, bkv, kend, nrows, out_r);
}

/* Share of the work of thread tid of nt: packing / scanning, then the row groups. */
static void tr_att_run(tr_att *a, float *tws, int tid, int nt, int tile, long items) {
    long prep = a->causal ? a->B * a->KVH : 0, nkb = a->Skp / BK, packs = tile ? a->B * a->KVH * nkb : 0;
    if (nt == 1) {
        for (long i = 0; i < prep; i++) tr_scan_v(a, i);
        for (long i = 0; i < packs; i++) tr_pack_kt(a, i / nkb, i % nkb);
        for (long it = 0; it < items; it++) tile ? tr_tile_item(a, it, tws) : tr_rows_item(a, it, tws);
        return;
    }
#ifdef _OPENMP
    #pragma omp for schedule(static) nowait
    for (long i = 0; i < prep; i++) tr_scan_v(a, i);
    #pragma omp for schedule(static)
    for (long i = 0; i < packs; i++) tr_pack_kt(a, i / nkb, i % nkb);
    /* Uniform items (no causal mask) in one contiguous share per thread; causal items (their cost grows
       with the query position) dealt round-robin. No shared counter: with thousands of small items
       (Swin windows), dynamic hand-out cost more than the work on two cores. */
    if (a->causal) {
        #pragma omp for schedule(static, 1)
        for (long it = 0; it < items; it++) tile ? tr_tile_item(a, it, tws) : tr_rows_item(a, it, tws);
    } else {
        #pragma omp for schedule(static)
        for (long it = 0; it < items; it++) tile ? tr_tile_item(a, it, tws) : tr_rows_item(a, it, tws);
    }
#endif
    (void)tid;
}

/* q: (B, H, Sq, D), k: (B, KVH, Skv, D), v: (B, KVH, Skv, Dv), out: (B, H, Sq, Dv) through st, the
   (batch, head, seq) element strides of q, k, v and out (0: packed); lse (B, H, Sq) packed or 0.
   rows_max: the rows driver serves calls with at most this many query rows per kv head. */
int tr_attention(long B, long H, long KVH, long Sq, long Skv, long D, long Dv, float scale, int causal,
                 const TIN *q, const TIN *k, const TIN *v, TIN *out, int nth,
                 const TIN *mask, int mkind, long MB, long MH, float *lse, const long *st, long rows_max) {
    if (KVH <= 0 || H % KVH || KB % 4) return 3;
    if (B <= 0 || H <= 0 || Sq <= 0) return 0;
    tr_att a;
    a.B = B; a.H = H; a.KVH = KVH; a.Sq = Sq; a.Skv = Skv; a.D = D; a.Dv = Dv; a.causal = causal;
    a.mkind = mkind; a.MB = MB; a.MH = MH; a.scale = scale; a.q = q; a.k = k; a.v = v; a.mask = mask;
    a.out = out; a.lse = lse; a.rows_max = rows_max;
    if (st) {
        a.qb = st[0]; a.qh = st[1]; a.qs = st[2]; a.kb = st[3]; a.kh = st[4]; a.ks = st[5];
        a.vb = st[6]; a.vh = st[7]; a.vs = st[8]; a.ob = st[9]; a.oh = st[10]; a.os = st[11];
    } else {
        a.qb = H * Sq * D; a.qh = Sq * D; a.qs = D; a.kb = KVH * Skv * D; a.kh = Skv * D; a.ks = D;
        a.vb = KVH * Skv * Dv; a.vh = Skv * Dv; a.vs = Dv; a.ob = H * Sq * Dv; a.oh = Sq * Dv; a.os = Dv;
    }
    a.G = H / KVH; a.Skp = TR_ROUNDUP(Skv, BK); a.Dp = TR_ROUNDUP(D, VW); a.Dvp = TR_ROUNDUP(Dv, VW);
    if (nth <= 0) nth = tr_threads_available();
    /* rows driver: all rows of a kv head in one item (K and V read once) when there are enough kv heads
       to share among the threads; else items of RM rows */
    a.rpi = B * KVH >= nth ? TR_MIN(RPI, TR_ROUNDUP(a.G * Sq, RM)) : RM;
    a.nqb = (Sq + BQ - 1) / BQ; a.nrb = (a.G * Sq + a.rpi - 1) / a.rpi;
    int tile = a.G * Sq > rows_max;
    long items = tile ? B * H * a.nqb : B * KVH * a.nrb;
    /* fewer items than threads: the surplus threads idle through the loops (one team size for every call,
       see host_load.py); one item runs serially */
    if (items <= 1) nth = 1;
    size_t ktn = tile ? (size_t)B * KVH * a.Skp * D : 0, per_thread = TR_WS_THREAD(&a);
    int owned;
    float *ws = tr_ws_get(ktn + (size_t)nth * per_thread + (size_t)B * KVH * 2 + 32, &owned);
    if (!ws) return 1;
    a.kt = ws;
    a.vbad = (long *)(ws + TR_ROUNDUP(ktn + (size_t)nth * per_thread + 16, 2));
    if (nth == 1) {
        tr_att_run(&a, ws + ktn, 0, 1, tile, items);
    } else {
        #pragma omp parallel num_threads(nth)
        {
            int tid = TR_TID();
            tr_att_run(&a, ws + ktn + (size_t)tid * per_thread, tid, TR_NT(), tile, items);
        }
    }
    tr_ws_put(ws, owned);
    return 0;
}
"""


def attention_source(isa: Isa, bq: int, bk: int, kb: int | None = None, elem: str = "f32", dot: bool = False) -> str:
    """Complete C source of the attention kernel for one ISA, query/key register block, softmax key
    block ``kb`` (a multiple of ``bk`` and 4; default :func:`tracea_cpu.spaces.attention_kb`) and element
    type of q, k, v, the mask and the output (``"f32"``, or where :data:`ELEMENTS` lists them ``"bf16"`` /
    ``"f16"``: widened on load, rounded once on the final store). ``dot`` (bf16 on AVX-512, built with
    AVX512_BF16): the tile driver's Q K^T on ``vdpbf16ps`` over bf16 pairs instead of widened fp32 FMAs."""
    if dot and (elem != "bf16" or isa.name != "avx512"):
        raise ValueError("the bf16 dot-product S tile needs bf16 operands on avx512")
    if kb is None:
        from ..spaces import attention_kb

        kb = attention_kb(bk)
    if bk % isa.width or not isa.fits(bq, bk):
        raise ValueError(f"block {bq}x{bk} does not fit {isa.name}'s registers")
    if kb % bk or kb % 4 or kb < bk:
        raise ValueError(f"softmax key block {kb} is not a multiple of bk={bk} and 4")
    rm = 4 if isa.registers >= 32 else 2
    pv_fns, pv_driver = _pv_all(isa)

    parts = [prologue(isa), _EXTRA[isa.name], _elem(isa, elem),
             f"#define BQ {bq}\n#define BK {bk}\n#define KB {kb}\n#define RM {rm}\n#define RPI {8 * rm}\n"
             f"#define TR_DOT {int(dot)}\n",
             _s_tile(isa, bq, bk, "tr_s_tile", dot), _s_tile(isa, bq, isa.width, "tr_s_tile1", dot)] + [_s_dot(r) for r in range(1, rm + 1)] + [pv_fns, pv_driver, BODY, ATTENTION_CALL]
    return "\n".join(parts)
