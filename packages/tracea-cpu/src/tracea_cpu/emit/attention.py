"""Flash-style attention forward: per (batch, head, BQ-row query block), stream BK-key blocks of K and V
with an online softmax (running row max ``m`` and row sum ``l``); no seq_q x seq_kv buffer exists.

Both products are register-tiled micro-kernels: S = Q K^T broadcasts Q^T (packed d-major, scale folded
in) against BK-wide K^T panels; O += P V broadcasts P against rows of V padded to a multiple of the
vector width. K^T panels and padded V are packed once per (batch, kv head) and shared by the query
heads of a GQA group. Causal masking is top-left aligned (key j visible to query i when j <= i).
An optional mask (``mkind`` 1: boolean, a key takes part where the mask is non-zero, else its logit is
replaced by -inf; 2: additive, added to the scaled logits) is read from a packed (MB, MH, Sq, Skv) array
whose batch / head extents MB / MH are 1 (broadcast) or B / H. An optional ``lse`` (B, H, Sq) float32
receives each row's log-sum-exp ``m + log(l)`` of the scaled, masked logits (-inf for a row whose logits
are all -inf).

NaN and Inf follow ``softmax(masked_fill(scale Q K^T, mask, -inf)) @ V`` in IEEE arithmetic, as the
float64 reference and PyTorch do: a NaN or +inf logit makes its row NaN (``exp(NaN)`` and
``exp(inf - inf)`` are NaN: ``tr_vexp`` propagates NaN and gives exactly 0 at -inf and +inf at +inf); a
row whose logits are all -inf gets weights 0 (PyTorch's convention, not 0/0); a masked key's logit is
replaced, so its k never matters, but its weight 0 still multiplies its v (0 x NaN and 0 x Inf are
NaN). The kernel never reads the keys after a causal row block's last visible one, so a non-finite v
there is found when V is packed (the last such key per kv head) and written into the rows that would
have multiplied it.
"""

from __future__ import annotations

from ..isa import Isa
from .calls import ATTENTION_CALL
from .common import prologue


def _s_tile(isa: Isa, bq: int, bk: int) -> str:
    nv = bk // isa.width
    acc = [[f"s{i}_{v}" for v in range(nv)] for i in range(bq)]
    out = ["static __attribute__((noinline)) void tr_s_tile(long D, const float *restrict qt, const float *restrict kt, float *restrict s) {"]
    for i in range(bq):
        out.append("    V " + ", ".join(f"{n} = VZERO()" for n in acc[i]) + ";")
    out.append("    for (long d = 0; d < D; d++) {")
    for v in range(nv):
        out.append(f"        V k{v} = VLOAD(kt + d * BK + {v * isa.width});")
    for i in range(bq):
        out.append(f"        {{ V q = VSET1(qt[d * BQ + {i}]);")
        for v in range(nv):
            out.append(f"          {acc[i][v]} = VFMA(q, k{v}, {acc[i][v]});")
        out.append("        }")
    out.append("    }")
    for i in range(bq):
        for v in range(nv):
            out.append(f"    VSTORE(s + {i * bk + v * isa.width}, {acc[i][v]});")
    out.append("}")
    return "\n".join(out)


def _pv(isa: Isa, bq: int, rg: int, dv: int, name: str) -> str:
    """O[rows, d0:d0+dv*VW] = alpha * O + P[rows, :BK] @ V[:BK, d0:...] for rg rows at a time."""
    out = [f"static __attribute__((noinline)) void {name}(long d0, long Dp, const float *restrict p, const float *restrict v,",
           "                   float *restrict o, const float *restrict alpha, long i0) {"]
    for g in range(rg):
        out.append(f"    V al{g} = VSET1(alpha[i0 + {g}]);")
        for u in range(dv):
            out.append(f"    V o{g}_{u} = VMUL(al{g}, VLOAD(o + (i0 + {g}) * Dp + d0 + {u * isa.width}));")
    out.append("    for (long j = 0; j < BK; j++) {")
    for u in range(dv):
        out.append(f"        V v{u} = VLOAD(v + j * Dp + d0 + {u * isa.width});")
    for g in range(rg):
        out.append(f"        {{ V pg = VSET1(p[(i0 + {g}) * BK + j]);")
        for u in range(dv):
            out.append(f"          o{g}_{u} = VFMA(pg, v{u}, o{g}_{u});")
        out.append("        }")
    out.append("    }")
    for g in range(rg):
        for u in range(dv):
            out.append(f"    VSTORE(o + (i0 + {g}) * Dp + d0 + {u * isa.width}, o{g}_{u});")
    out.append("}")
    return "\n".join(out)


BODY = r"""
static void tr_pv_all(long Dp, const float *p, const float *v, float *o, const float *alpha) {
    for (long i0 = 0; i0 < BQ; i0 += RG) {
        long d0 = 0;
        for (; d0 + DV * VW <= Dp; d0 += DV * VW) tr_pv_wide(d0, Dp, p, v, o, alpha, i0);
        for (; d0 < Dp; d0 += VW) tr_pv_narrow(d0, Dp, p, v, o, alpha, i0);
    }
}

/* q: (B, H, Sq, D), k/v: (B, KVH, Skv, D), out: (B, H, Sq, D), all packed row-major; lse (B, H, Sq) or 0. */
int tr_attention(long B, long H, long KVH, long Sq, long Skv, long D, float scale, int causal,
                 const float *q, const float *k, const float *v, float *out, int nth,
                 const float *mask, int mkind, long MB, long MH, float *lse) {
    long Dp = TR_ROUNDUP(D, VW), Skp = TR_ROUNDUP(Skv, BK), nkb = Skp / BK, nqb = (Sq + BQ - 1) / BQ;
    long per_head = Skp * D + Skp * Dp, per_thread = TR_ROUNDUP(D * BQ + BQ * BK + BQ * Dp + 4 * BQP + BQ * VW, 16);
    if (nth <= 0) nth = tr_threads_available();
    if ((double)Sq * Skv * D * H * B < 65536.0) nth = 1;
    int owned;
    float *ws = tr_ws_get((size_t)B * KVH * per_head + (size_t)nth * per_thread + 16 + B * KVH, &owned);
    if (!ws) return 1;
    float *tws = ws + (size_t)B * KVH * per_head;
    /* per (batch, kv head): the last key whose v has a NaN or Inf, -1 if none (as floats: keys < 2^24) */
    float *vbad = tws + (size_t)nth * per_thread + 16;
    #pragma omp parallel num_threads(nth) if (nth > 1)
    {
        int tid = TR_TID();
        #pragma omp for schedule(static)
        for (long bh = 0; bh < B * KVH; bh++) {
            const float *ks = k + bh * Skv * D, *vs = v + bh * Skv * D;
            float *kt = ws + bh * per_head, *vp = kt + Skp * D;
            for (long jb = 0; jb < nkb; jb++)
                for (long d = 0; d < D; d++)
                    for (long j = 0; j < BK; j++) {
                        long jj = jb * BK + j;
                        kt[(jb * D + d) * BK + j] = jj < Skv ? ks[jj * D + d] : 0.0f;
                    }
            for (long j = 0; j < Skp; j++)
                for (long d = 0; d < Dp; d++) vp[j * Dp + d] = (j < Skv && d < D) ? vs[j * D + d] : 0.0f;
            long bad = Skv - 1;  /* causal only: the last key whose v row has a NaN or Inf */
            for (; causal && bad >= 0; bad--) {
                V t = VZERO();
                for (long d = 0; d < Dp; d += VW) t = VFMA(VLOAD(vp + bad * Dp + d), VZERO(), t);
                if (VANYNAN(t)) break;
            }
            vbad[bh] = causal ? (float)bad : -1.0f;
        }
        float *qt = tws + (size_t)tid * per_thread, *s = qt + D * BQ, *o = s + BQ * BK;
        float *m = o + BQ * Dp, *mnew = m + BQP, *mref = mnew + BQP, *alpha = mref + BQP, *lv = alpha + BQP;
        #pragma omp for schedule(dynamic, 1)
        for (long item = 0; item < B * H * nqb; item++) {
            long bh = item / nqb, q0 = (item % nqb) * BQ, b = bh / H, h = bh % H;
            long kvh = b * KVH + h / (H / KVH);
            const float *qs = q + (bh * Sq + q0) * D;
            const float *kt = ws + kvh * per_head, *vp = kt + Skp * D;
            long rows = TR_MIN(BQ, Sq - q0);
            for (long d = 0; d < D; d++)
                for (long i = 0; i < BQ; i++) qt[d * BQ + i] = i < rows ? qs[i * D + d] * scale : 0.0f;
            for (long i = 0; i < BQP; i++) { m[i] = -INFINITY; mnew[i] = -INFINITY; mref[i] = 0.0f; }
            memset(lv, 0, sizeof(float) * BQ * VW);
            memset(o, 0, sizeof(float) * BQ * Dp);
            long kend = causal ? TR_MIN(Skv, q0 + BQ) : Skv;
            const float *mrow = mkind ? mask + (((MB > 1 ? b : 0) * MH + (MH > 1 ? h : 0)) * Sq + q0) * Skv : 0;
            for (long j0 = 0; j0 < kend; j0 += BK) {
                tr_s_tile(D, qt, kt + (j0 / BK) * D * BK, s);
                if (mkind) {
                    long jn = TR_MIN(BK, Skv - j0);
                    for (long i = 0; i < rows; i++) {
                        const float *mr = mrow + i * Skv + j0;
                        float *row = s + i * BK;
                        if (mkind == 1) {
                            for (long j = 0; j < jn; j++) if (mr[j] == 0.0f) row[j] = -INFINITY;
                        } else {
                            for (long j = 0; j < jn; j++) row[j] += mr[j];
                        }
                    }
                }
                int mask = j0 + BK > Skv || (causal && j0 + BK - 1 > q0);
                for (long i = 0; i < BQ; i++) {
                    float *row = s + i * BK;
                    if (mask) {
                        long lim = Skv - j0;
                        if (causal) lim = TR_MIN(lim, q0 + i + 1 - j0);
                        for (long j = TR_MAX(lim, 0); j < BK; j++) row[j] = -INFINITY;
                    }
                    V mx = VLOAD(row);
                    for (int u = 1; u < BK / VW; u++) mx = VMAX(mx, VLOAD(row + u * VW));
                    mnew[i] = TR_MAX(m[i], VHMAX(mx));
                }
                /* Rescale factors of all rows at once; a row that has seen only masked keys keeps 0. */
                for (long i = 0; i < BQ; i += VW) {
                    for (long t = 0; t < VW; t++) {
                        float mn = mnew[i + t];
                        mref[i + t] = mn == -INFINITY ? 0.0f : mn;
                    }
                    VSTORE(alpha + i, tr_vexp(VSUB(VLOAD(m + i), VLOAD(mref + i))));
                }
                for (long i = 0; i < BQ; i++) {
                    float *row = s + i * BK;
                    V mv = VSET1(mref[i]), al = VSET1(alpha[i]), sum = VZERO();
                    for (int u = 0; u < BK / VW; u++) {
                        V e = tr_vexp(VSUB(VLOAD(row + u * VW), mv));
                        VSTORE(row + u * VW, e);
                        sum = VADD(sum, e);
                    }
                    if (mask) {
                        long lim = Skv - j0;
                        if (causal) lim = TR_MIN(lim, q0 + i + 1 - j0);
                        for (long j = TR_MAX(lim, 0); j < BK; j++) row[j] = 0.0f;
                        sum = VZERO();
                        for (int u = 0; u < BK / VW; u++) sum = VADD(sum, VLOAD(row + u * VW));
                    }
                    VSTORE(lv + i * VW, VFMA(VLOAD(lv + i * VW), al, sum));
                    m[i] = mnew[i];
                }
                tr_pv_all(Dp, s, vp + j0 * Dp, o, alpha);
            }
            float *os = out + (bh * Sq + q0) * D;
            for (long i = 0; i < rows; i++) {
                /* l = 0: every logit of the row was -inf (weights 0, PyTorch's convention) */
                float l = VHSUM(VLOAD(lv + i * VW)), inv = l == 0.0f ? 1.0f : 1.0f / l;
                for (long d = 0; d < D; d++) os[i * D + d] = o[i * Dp + d] * inv;
                /* m is the running max of the scaled logits (-inf: none seen; NaN rows stay NaN) */
                if (lse) lse[bh * Sq + q0 + i] = l == 0.0f ? -INFINITY : (m[i] == -INFINITY ? 0.0f : m[i]) + logf(l);
            }
            /* Causal: keys from jvis on were never read; weight 0 times a NaN / Inf v there is NaN. */
            long jvis = TR_ROUNDUP(kend, BK);
            if (causal && (long)vbad[kvh] >= jvis) {
                const float *vv = v + kvh * Skv * D;
                for (long d = 0; d < D; d++) {
                    int hit = 0;
                    for (long j = jvis; j < Skv && !hit; j++) hit = !(vv[j * D + d] - vv[j * D + d] == 0.0f);
                    if (hit)
                        for (long i = 0; i < rows; i++) os[i * D + d] = NAN;
                }
            }
        }
    }
    tr_ws_put(ws, owned);
    return 0;
}
"""


def attention_source(isa: Isa, bq: int, bk: int, dv: int = 4) -> str:
    """Complete C source of the attention kernel for one ISA and query/key block sizes."""
    if bk % isa.width or not isa.fits(bq, bk):
        raise ValueError(f"block {bq}x{bk} does not fit {isa.name}'s registers")
    rg = max(g for g in range(1, bq + 1) if bq % g == 0 and g * (dv + 1) + dv <= isa.registers - 2)
    parts = [prologue(isa), f"#define BQ {bq}\n#define BK {bk}\n#define RG {rg}\n#define DV {dv}\n"
             "#define BQP TR_ROUNDUP(BQ, VW)\n",
             _s_tile(isa, bq, bk), _pv(isa, bq, rg, dv, "tr_pv_wide"),
             _pv(isa, bq, rg, 1, "tr_pv_narrow"), BODY, ATTENTION_CALL]
    return "\n".join(parts)
