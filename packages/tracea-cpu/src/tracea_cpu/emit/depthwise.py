"""C source of the direct depthwise conv2d (``cpu.conv2d.depthwise.<isa>``): NCHW float32 or bfloat16, one input
channel per group and one output channel per input channel (MobileNet / EfficientNet / ConvNeXt layers).

Per (image, channel) plane, in one thread: the plane is copied once, zero-padded, into ``SH x SW`` phase
planes (phase ``(fr, fc)`` holds the padded rows ``i * SH + fr`` and columns ``j * SW + fc``), each ``Wq``
columns wide, ``Wq = Q + ((S - 1) * DW) / SW``. Output ``(p, q)`` then reads tap ``(r, s)`` at
``(p + r * DH / SH) * Wq + q + s * DW / SW`` of one phase plane: a fixed offset per tap for every output, so
the output plane is computed as one flat run of ``P * Wq`` values, ``VB`` vectors at a time, each tap a
broadcast weight times an unaligned load (the ``Wq - Q`` columns past each row's end are computed and
dropped). Strided convolutions read unit-stride too (the phases split the stride out), and small planes
(7 x 7, 14 x 14) keep every lane busy, which blocks along one output row would not. The epilogue (bias,
activation) is applied to the accumulators before the rows are written out.
"""

from __future__ import annotations

from tracea.ir.epilogue import Epilogue

from ..isa import Isa
from .common import epilogue_c, prologue

#: order of the ``long`` parameters of ``td_depthwise_call``
DEPTHWISE_PARAMS = ("n", "C", "H", "W", "P", "Q", "ph", "pw", "nth")

_BODY = r"""
/* zeroed floats after the phase planes: the last blocks read up to a block and the widest tap offset past them */
#define TD_TAIL (DVB * VW + DS * DDW + 16)
/* scratch floats for one plane: the phase planes, then the flat output (both with a block of tail room) */
static long td_scratch(long H, long W, long P, long Q, long *Hq, long *Wq) {
    *Wq = Q + ((DS - 1) * DDW) / DSW;
    *Hq = P + ((DR - 1) * DDH) / DSH;
    /* bf16: the plane widened (H * W floats) and the rounded output (P * Wq halves) */
    return DSH * DSW * (*Hq * *Wq) + TD_TAIL + P * *Wq + DVB * VW + (TD_BF16 ? H * W + P * *Wq / 2 + 64 : 0);
}

static void td_plane(const TIN *xp, const TIN *wp, float bias, TIN *op, float *buf, long H, long W,
                     long P, long Q, long ph, long pw, long Hq, long Wq) {
    const long plane = Hq * Wq;
    float wf[DR * DS];  /* the plane's weights as float32, read as broadcasts from here */
    for (int t = 0; t < DR * DS; ++t) wf[t] = TD_IN(wp[t]);
#if TD_BF16
    /* narrow planes are widened in one flat pass, then copied as float32 (rows of 7-28 values vectorise badly one
       by one: 480@14^2 3x3 ran 175 -> 107 us a call on one Zen 4 core); wide rows are widened as they are copied */
    float *xw = buf + DSH * DSW * plane + TD_TAIL + P * Wq + DVB * VW;
    const int flat_in = W < 32, flat_out = Q < 32;
    if (flat_in)
        for (long i = 0; i < H * W; ++i) xw[i] = TD_IN(xp[i]);
    const float *xs = xw;
#else
    const int flat_in = 1;
    const float *xs = xp;
#endif
    /* the zero-padded phase planes */
    for (int fr = 0; fr < DSH; ++fr) {
        for (int fc = 0; fc < DSW; ++fc) {
            float *dst = buf + (fr * DSW + fc) * plane;
            for (long i = 0; i < Hq; ++i, dst += Wq) {
                const long ih = i * DSH + fr - ph;
                if (ih < 0 || ih >= H) { memset(dst, 0, Wq * sizeof(float)); continue; }
                const float *src = xs + ih * W;
                /* columns j with 0 <= j * SW + fc - pw < W */
                long j0 = pw - fc > 0 ? (pw - fc + DSW - 1) / DSW : 0;
                long j1 = (W - 1 + pw - fc) >= 0 ? (W - 1 + pw - fc) / DSW + 1 : 0;
                if (j0 > Wq) j0 = Wq;
                if (j1 > Wq) j1 = Wq;
                if (j1 < j0) j1 = j0;
                for (long j = 0; j < j0; ++j) dst[j] = 0.0f;
                if (!flat_in) {  /* (bf16 rows of 32 and more: widened here) */
                    const TIN *raw = xp + ih * W;
                    for (long j = j0; j < j1; ++j) dst[j] = TD_IN(raw[j * DSW + fc - pw]);
                } else if (DSW == 1) {
                    memcpy(dst + j0, src + (j0 + fc - pw), (j1 - j0) * sizeof(float));
                } else {
                    for (long j = j0; j < j1; ++j) dst[j] = src[j * DSW + fc - pw];
                }
                for (long j = j1; j < Wq; ++j) dst[j] = 0.0f;
            }
        }
    }
    float *tail = buf + DSH * DSW * plane;
    memset(tail, 0, TD_TAIL * sizeof(float));  /* read past the last row: dropped lanes */
    float *flat = tail + TD_TAIL;
    const long total = P * Wq;
    const V vb = VSET1(bias);
    (void)vb;
    for (long i0 = 0; i0 < total; i0 += DVB * VW) {
        V acc[DVB];
        for (int u = 0; u < DVB; ++u) acc[u] = VZERO();
#pragma GCC unroll 64
        for (int r = 0; r < DR; ++r) {
#pragma GCC unroll 64
            for (int s = 0; s < DS; ++s) {
                const int fr = (r * DDH) % DSH, fc = (s * DDW) % DSW;
                const float *src = buf + (fr * DSW + fc) * plane + ((r * DDH) / DSH) * Wq + (s * DDW) / DSW + i0;
                const V wv = VSET1(wf[r * DS + s]);
                for (int u = 0; u < DVB; ++u) acc[u] = VFMA(wv, VLOAD(src + u * VW), acc[u]);
            }
        }
        for (int u = 0; u < DVB; ++u) {
#if TR_HAS_EPI
            acc[u] = tr_epi(acc[u], vb);
#endif
            VSTORE(flat + i0 + u * VW, acc[u]);
        }
    }
#if TD_BF16
    /* rounded in one flat pass (tr_f2bf with both sides computed: a select the compiler vectorises), then rows */
    uint16_t *half = (uint16_t *)(xw + H * W);
    const long rows = flat_out ? 1 : P, run = flat_out ? total : Q;
    for (long p = 0; p < rows; ++p) {
        const float *from = flat + p * Wq;
        uint16_t *to = flat_out ? half : op + p * Q;
        for (long i = 0; i < run; ++i) {
            uint32_t u;
            memcpy(&u, from + i, 4);
            const uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, nan = (u >> 16) | 0x40u;
            to[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rne);
        }
    }
    if (flat_out)
        for (long p = 0; p < P; ++p) memcpy(op + p * Q, half + p * Wq, Q * sizeof(uint16_t));
#else
    for (long p = 0; p < P; ++p) memcpy(op + p * Q, flat + p * Wq, Q * sizeof(float));
#endif
}

/* Each thread's scratch, kept between calls and grown as needed: a buffer allocated per call past glibc's mmap
   threshold (128 KiB) is page-faulted in afresh every call (a 224 x 224 plane's phases are 200 KiB). */
static __thread float *td_buf = 0;
static __thread long td_cap = 0;
static float *td_buffer(long floats) {
    if (td_cap < floats) {
        free(td_buf);
        td_buf = (float *)aligned_alloc(TR_ALIGN, TR_ROUNDUP(floats * sizeof(float), TR_ALIGN));
        td_cap = td_buf ? floats : 0;
    }
    return td_buf;
}

/* x (n, C, H, W), w (C, 1, R, S), bias (C) or NULL, out (n, C, P, Q); returns 0, or 1 when scratch could not
   be allocated */
int td_depthwise(long n, long C, long H, long W, long P, long Q, long ph, long pw, const TIN *x,
                 const TIN *w, const TIN *bias, TIN *out, int nth) {
    long Hq, Wq;
    const long floats = td_scratch(H, W, P, Q, &Hq, &Wq);
    const long planes = n * C;
    if (nth < 1) nth = 1;
    if (nth > planes) nth = (int)(planes > 0 ? planes : 1);
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(nth) if (nth > 1)
#endif
    {
        float *buf = td_buffer(floats);
        if (!buf) {
            __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
        }
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (long pl = 0; pl < planes; ++pl) {
            if (!buf) continue;
            const long c = pl % C;
            td_plane(x + pl * H * W, w + c * DR * DS, bias ? TD_IN(bias[c]) : 0.0f, out + pl * P * Q, buf, H, W, P, Q,
                     ph, pw, Hq, Wq);
        }
    }
    return failed;
}

int td_depthwise_call(const long *p, const TIN *x, const TIN *w, const TIN *bias, TIN *out) {
    return td_depthwise(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], x, w, bias, out, (int)p[8]);
}

"""


_BF16 = r"""
#define TD_BF16 1
typedef uint16_t TIN;
static inline float TD_IN(uint16_t b) { union { uint32_t u; float f; } v; v.u = (uint32_t)b << 16; return v.f; }
"""

_F32 = r"""
#define TD_BF16 0
typedef float TIN;
#define TD_IN(x) (x)
"""


def depthwise_source(isa: Isa, r: int, s: int, stride: tuple[int, int], dilation: tuple[int, int],
                     epilogue: Epilogue, vb: int, bf16: bool = False) -> str:
    """The depthwise library for one ISA, kernel size, stride, dilation, epilogue chain and block of ``vb``
    accumulator vectors (exports ``td_depthwise`` and ``td_depthwise_call``); with ``bf16`` its arrays are
    bfloat16 (widened exactly as the planes are copied, float32 arithmetic, the output rounded once to nearest
    even, NaN kept)."""
    consts = (f"#define DR {int(r)}\n#define DS {int(s)}\n#define DSH {int(stride[0])}\n#define DSW {int(stride[1])}\n"
              f"#define DDH {int(dilation[0])}\n#define DDW {int(dilation[1])}\n#define DVB {int(vb)}\n")
    return prologue(isa) + epilogue_c(epilogue) + consts + (_BF16 if bf16 else _F32) + _BODY
