"""The AMX bf16 GEMM's driver for many rows (``tb_drive_amx``): B packed once per call for the whole K,
A packed once per M block for the whole K, partial sums kept in a per-thread fp32 C block.

Why (measured on the 2-core Intel Xeon with AMX, 2048^3, one thread): the shared blocked driver of
:mod:`.bf16` reached 0.80 TFLOP/s although its micro-kernel loop alone ran 1.5-1.7 TFLOP/s. It lost
~30% to packing (A packed again for every NC block; row-major B packed panel by panel, K rows a whole
row of B apart: 3.5-6 GB/s) and ~25% to the C updates (every K block's partial sums went through a
scratch tile, AVX-512 and the full C matrix, which is far larger than L2). Here:

* **B** is packed into VNNI panels for the whole K once per call (all threads, groups of panels, 32 rows
  of B at a time across the group, so each row segment read is contiguous): ``bp + p*NR*KP`` is panel p.
* **Work items** are M blocks of ``mc`` rows (split over N panel ranges only when there are fewer than
  two per thread). An item packs its A rows for the whole K once (tile after tile, the layout of
  ``tb_pack_a``), then walks its N range in blocks of ``nc`` columns; per block it runs the K blocks of
  ``kc`` (bf16) elements, and per K block every NR panel (its ``kc x NR`` slice stays in L1) against every
  MR tile row (A slices from L2).
* **Partial sums** stay in an ``mc x nc`` fp32 block per thread (L2): a tile block is loaded into the
  accumulator tiles (``tileloadd``) or zeroed on the first K block, and stored back after each. After the
  last K block the tile block is finished from there (bias, activation, fp32 or bf16 output, edges
  masked): the output is written once.

Every M block streams the packed B once from beyond the L2 (on the 2-core Xeon VM that is ~13 GB/s,
against ~70 GB/s from L2), so ``mc`` is large (256) and only lowered for a deep K (the variant keeps
``mc x K`` bf16 within twice the L2, ``CpuGemmAmxVariant.block_rows``).
"""

from __future__ import annotations

from .amx import k_loop, tile_plan


def block_kernel_c(mr: int, nr: int) -> str:
    """``tb_amx_tile``: ``kp`` pairs (a multiple of 16) of packed A x packed B added to the MR x NR fp32
    block at ``cb`` (row stride ``ldcb`` floats; zero instead of its content when ``first``)."""
    ctile, atile, btile = tile_plan(mr, nr)
    mt, nt = len(atile), len(btile)
    lines = ["static inline void tb_amx_tile(long kp, const uint32_t *restrict a, const uint32_t *restrict b,",
             "                               float *cb, long ldcb, int first) {",
             "    if (first) {"]
    lines += [f"        _tile_zero({ctile[i][j]});" for i in range(mt) for j in range(nt)]
    lines.append("    } else {")
    lines += [f"        _tile_loadd({ctile[i][j]}, cb + {i * 16} * ldcb + {j * 16}, ldcb * 4);"
              for i in range(mt) for j in range(nt)]
    lines.append("    }")
    lines += k_loop(ctile, atile, btile)
    lines += [f"    _tile_stored({ctile[i][j]}, cb + {i * 16} * ldcb + {j * 16}, ldcb * 4);"
              for i in range(mt) for j in range(nt)]
    lines.append("}")
    return "\n".join(lines) + "\n"


BLOCK_DRIVER = r"""
/* A finished fp32 block (mr x nr valid of cb, row stride ldcb) -> the output, row after row (each
   output row segment written in one run; the next row's segment prefetched): epilogue (bias per column),
   then fp32 c or, when o is set, bf16 o (round to nearest even); the right edge masked. */
static void tb_amx_out(const float *cb, long ldcb, float *c, long ldc, bf16 *o, long ldo, long mr, long nr,
                       const float *bias, int nt) {
    long nv = (nr + 15) / 16, esz = o ? 2 : 4;
    char *base = o ? (char *)o : (char *)c;
    long ld = (o ? ldo : ldc) * esz;
    __mmask16 tail = (__mmask16)(nr % 16 ? (1u << (nr % 16)) - 1 : 0xffff);
    /* Streaming stores (no read for ownership: the output is written once and larger than the caches)
       when every row segment is whole aligned cache lines. */
    if (nt && nr % 32 == 0 && ((uintptr_t)base | (uintptr_t)ld) % 64 == 0) {
        for (long i = 0; i < mr; i++)
            for (long v = 0; v < nv; v += 2) {
                V x0 = VLOAD(cb + i * ldcb + v * 16), x1 = VLOAD(cb + i * ldcb + v * 16 + 16);
                if (TR_HAS_EPI) {
                    x0 = tr_epi(x0, TR_HAS_BIAS ? VLOAD(bias + v * 16) : VZERO());
                    x1 = tr_epi(x1, TR_HAS_BIAS ? VLOAD(bias + v * 16 + 16) : VZERO());
                }
                if (o) {
                    __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(x0)),
                                                   (__m256i)_mm512_cvtneps_pbh(x1), 1);
                    _mm512_stream_si512((__m512i *)(o + i * ldo + v * 16), w);
                } else {
                    _mm512_stream_ps(c + i * ldc + v * 16, x0);
                    _mm512_stream_ps(c + i * ldc + v * 16 + 16, x1);
                }
            }
        return;
    }
    for (long i = 0; i < mr; i++) {
        if (i + 1 < mr)
            for (long l = 0; l < nr * esz; l += 64) _mm_prefetch(base + (i + 1) * ld + l, _MM_HINT_T0);
        for (long v = 0; v < nv; v++) {
            __mmask16 m = v + 1 == nv ? tail : (__mmask16)0xffff;
            V x = VLOAD(cb + i * ldcb + v * 16);
            if (TR_HAS_EPI) x = tr_epi(x, TR_HAS_BIAS ? _mm512_maskz_loadu_ps(m, bias + v * 16) : VZERO());
            if (o) _mm256_mask_storeu_epi16(o + i * ldo + v * 16, m, (__m256i)_mm512_cvtneps_pbh(x));
            else _mm512_mask_storeu_ps(c + i * ldc + v * 16, m, x);
        }
    }
}

/* Largest B (bytes) packed whole by tb_drive_amx; tb_route sends larger ones to the blocked driver. */
#ifndef TB_AMX_MAX_B_BYTES
#define TB_AMX_MAX_B_BYTES (256.0 * (1 << 20))
#endif
#ifndef TB_NT_BYTES
#define TB_NT_BYTES (4L << 20)
#endif
/* NR panels per B packing item: each row segment read is TB_PACK_GROUP * NR bf16 long. */
#ifndef TB_PACK_GROUP
#define TB_PACK_GROUP 8
#endif

/* B already packed by tb_amx_pack_b (whole K, every panel) for the next tb_drive_amx on this thread,
   or null (set and cleared by tb_gemm_call_pk). */
static __thread const uint32_t *tb_amx_bpk = 0;

/* See the module docstring of emit/amx_blocks.py. c: fp32 output (unless o); o: bf16 output or null. */
static int tb_drive_amx(long M, long N, long K, const tb_dense *A, const tb_dense *B, float *c, long ldc,
                        bf16 *o, long ldo, const float *bias, long mc, long nc, long kc, int nth) {
    long KP = tb_pairs(K), kpb = TR_MAX(16, TR_ROUNDUP(kc / 2, 16));
    mc = TR_MIN(TR_ROUNDUP(TR_MAX(mc, MR), MR), TR_ROUNDUP(M, MR));
    nc = TR_MIN(TR_ROUNDUP(TR_MAX(nc, NR), NR), TR_ROUNDUP(N, NR));
    /* At least max(4, 2 nth) M blocks while blocks keep 4 tile rows: a few rows more per block do not
       pay for items that idle a thread or split N (512^3: mc 128 against 256, +12% on one thread, +26% on
       two; 1024^3 keeps 256) */
    long want = TR_MAX(4, 2 * (long)nth), mfit = TR_ROUNDUP((M + want - 1) / want, MR);
    if (mfit < mc) mc = TR_MAX(mfit, TR_MIN(mc, 4 * MR));
    long npan = (N + NR - 1) / NR, nic = (M + mc - 1) / mc, pnc = nc / NR;
    long nsplit = nic >= 2 * nth ? 1 : TR_MIN(npan, (2 * nth + nic - 1) / nic);
    long ngrp = (npan + TB_PACK_GROUP - 1) / TB_PACK_GROUP;
    /* Fewer panel groups than 2 per thread: each group's K split into runs (whole 16-pair steps) too, so
       every thread packs (512^2 B, 64-wide panels: one group, which one thread packed alone while the
       others waited at the barrier) */
    long nks = ngrp >= 2 * nth ? 1 : TR_MIN((2 * nth + ngrp - 1) / ngrp, KP / 16);
    if (nks < 1) nks = 1;
    size_t bwords = TR_ROUNDUP((size_t)npan * NR * KP, 16), per = TR_ROUNDUP((size_t)mc * KP, 16) + (size_t)mc * nc;
    /* streaming output stores from TB_NT_BYTES of output on */
    int nt = (double)M * N * (o ? 2 : 4) >= TB_NT_BYTES;
    int owned;
    uint32_t *ws = (uint32_t *)tr_ws_get(bwords + (size_t)nth * per + 32, &owned);
    if (!ws) return 1;
    const uint32_t *bpk = tb_amx_bpk;
    uint32_t *bbuf = ws;
    if (bpk) ngrp = 0;  /* B comes packed */
    #pragma omp parallel num_threads(nth) if (nth > 1)
    {
        int tid = TR_TID();
        uint32_t *abuf = ws + bwords + (size_t)tid * per;
        float *cb = (float *)(abuf + TR_ROUNDUP((size_t)mc * KP, 16));
        /* B packed here (the barrier after it lets no thread compute before every panel is written) or
           given packed: then no barrier at all, and none after the items either (the region's end is
           one); a thread the scheduler wakes late finds the items taken instead of holding the others */
        if (ngrp) {
            #pragma omp for schedule(dynamic, 1)
            for (long gi = 0; gi < ngrp * nks; gi++) {
                long g = gi / nks, ks = gi % nks, p1 = TR_MIN(npan, (g + 1) * TB_PACK_GROUP);
                long steps = KP / 16, ta = steps * ks / nks * 16, tb = steps * (ks + 1) / nks * 16;
                for (long t0 = ta; t0 < tb; t0 += 16)
                    for (long p = g * TB_PACK_GROUP; p < p1; p++)
                        tb_pack_b(B, p * NR, TR_MIN(NR, N - p * NR), 2 * t0, TR_MIN(32, K - 2 * t0), bbuf + p * NR * KP + t0 * NR);
            }
        }
        TB_THREAD_BEGIN();
        #pragma omp for schedule(dynamic, 1) nowait
        for (long it = 0; it < nic * nsplit; it++) {
            long ic = (it / nsplit) * mc, sp = it % nsplit, mcur = TR_MIN(mc, M - ic), nmp = (mcur + MR - 1) / MR;
            long plo = npan * sp / nsplit, phi = npan * (sp + 1) / nsplit;
            if (plo == phi) continue;
            for (long r = 0; r < nmp; r++)
                tb_pack_a(A, ic + r * MR, TR_MIN(MR, mcur - r * MR), 0, K, abuf + r * MR * KP);
            for (long p0 = plo; p0 < phi; p0 += pnc) {
                long p1 = TR_MIN(phi, p0 + pnc);
                for (long t0 = 0; t0 < KP; t0 += kpb) {
                    long kp = TR_MIN(kpb, KP - t0);
                    int first = t0 == 0;
                    for (long p = p0; p < p1; p++) {
                        const uint32_t *bp = (bpk ? bpk : bbuf) + p * NR * KP + t0 * NR;
                        /* the next B slice, prefetched into L2 a share per tile: beyond L2 the slices
                           stream at a fraction of its bandwidth, which the tile loads do not hide */
                        const char *nb = (const char *)(p + 1 < p1 ? bp + NR * KP
                                                        : (bpk ? bpk : bbuf) + p0 * NR * KP + (t0 + kp) * NR);
                        long nbytes = t0 + kp < KP || p + 1 < p1 ? TR_MIN(kpb, KP - (p + 1 < p1 ? t0 : t0 + kp)) * NR * 4 : 0;
                        long share = (nbytes / 64 + nmp - 1) / nmp;
                        for (long r = 0; r < nmp; r++) {
                            for (long l = r * share; l < TR_MIN((r + 1) * share, nbytes / 64); l++)
                                _mm_prefetch(nb + l * 64, _MM_HINT_T1);
                            tb_amx_tile(kp, abuf + r * MR * KP + t0 * MR, bp, cb + r * MR * nc + (p - p0) * NR, nc, first);
                        }
                    }
                }
                /* Finish the block once every tile is stored (a vector load right after a tile store of the
                   same lines waits for it: finishing tile by tile cost ~25%). */
                long j = p0 * NR;
                tb_amx_out(cb, nc, o ? 0 : c + ic * ldc + j, ldc, o ? o + ic * ldo + j : 0, ldo, mcur,
                           TR_MIN(p1 * NR, N) - j, bias ? bias + j : 0, nt);
            }
        }
        /* every thread: its streaming stores globally visible before the region's closing barrier */
        if (nt) _mm_sfence();
        TB_THREAD_DONE();
    }
    tr_ws_put((float *)ws, owned);
    return 0;
}
#define TB_AMX_DRIVER 1
"""

PACKED_B = r"""
/* uint32 words of B (K x N, strides rsb / csb) packed for tb_drive_amx: every NR panel for the whole K. */
long tb_amx_bwords(long N, long K) {
    return (long)TR_ROUNDUP((size_t)((N + NR - 1) / NR) * NR * tb_pairs(K), 16);
}

/* B -> dst in tb_drive_amx's layout (panel p at dst + p*NR*KP). */
int tb_amx_pack_b(long N, long K, const bf16 *b, long rsb, long csb, uint32_t *dst, int nth) {
    tb_dense B = {b, rsb, csb};
    long KP = tb_pairs(K), npan = (N + NR - 1) / NR;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(nth) if (nth > 1)
    for (long p = 0; p < npan; p++)
        for (long t0 = 0; t0 < KP; t0 += 16)
            tb_pack_b(&B, p * NR, TR_MIN(NR, N - p * NR), 2 * t0, TR_MIN(32, K - 2 * t0), dst + p * NR * KP + t0 * NR);
    return 0;
}

/* Whether tb_gemm_call_pk reads a packed B for this call (one GEMM that tb_drive_amx runs). */
int tb_amx_takes_packed_b(const tb_call *p, int nth) {
    tb_dense A = {0, p->rsa, p->csa}, B = {0, p->rsb, p->csb};
    return p->batch == 1 && tb_route(p->M, p->N, p->K, &A, &B, p->mc, tb_threads(p->M, p->N, p->K, nth)) == 3;
}

/* tb_gemm_call with B already packed (bpk, from tb_amx_pack_b; used when tb_amx_takes_packed_b). */
int tb_gemm_call_pk(const tb_call *p, const bf16 *a, const bf16 *b, const uint32_t *bpk, void *out,
                    const float *bias, int nth) {
    tb_amx_bpk = bpk;
    int rc = tb_gemm_call(p, a, b, out, bias, nth);
    tb_amx_bpk = 0;
    return rc;
}
"""


def block_driver_c() -> str:
    """The C text of ``tb_amx_out`` and ``tb_drive_amx``."""
    return BLOCK_DRIVER
