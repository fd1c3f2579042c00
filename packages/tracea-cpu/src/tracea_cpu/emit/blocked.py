"""The BLIS-style blocked drivers (NC / KC / MC loops around the micro-kernel) and ``tr_gemm``; the
whole GEMM + conv2d library source is assembled here (packers in :mod:`.packers`, ``tr_conv2d`` in
:mod:`.conv`).

Threading (OpenMP). ``tr_drive`` (GEMM, packed and weights-stationary conv): the B block (KC x NC) is
packed cooperatively (split along k when panels are few), then the MC blocks, split further over NR
panels when there are too few of them to keep every thread busy, are shared out; each thread packs its
own A block. ``tr_drive_ind`` (indirect conv): no shared block and no barrier, each thread packs the B
panels it uses. No im2col buffer is ever built: conv tiles are gathered while packing.
"""

from __future__ import annotations

from tracea.ir.epilogue import Epilogue

from ..isa import Isa
from .calls import GEMM_CONV_CALLS
from .common import epilogue_c, prologue
from .conv import CONV
from .gemv import gemv_source
from .microkernel import microkernel_c
from .nchw import NCHW
from .nchw_direct import nchw_direct_source
from .packers import PACKERS
from .pool import POOL_CLIENT

DRIVER = r"""
#ifndef TR_SBUF
#define TR_SBUF 48
#endif
#ifndef TR_NCHW_ALIGN
#define TR_NCHW_ALIGN 1
#endif
#ifndef TR_ROWS_DRIVER
#define TR_ROWS_DRIVER 1
#endif
#ifndef TR_GEMV_DRIVER
#define TR_GEMV_DRIVER 1
#endif
#ifndef TR_AXPY_DRIVER
#define TR_AXPY_DRIVER 1
#endif
#ifndef TR_ROWS_MAXM
#define TR_ROWS_MAXM 256
#endif
/* C(i, j) = c[i*ldc + j], or with img_cols > 0: c[(j / img_cols)*img_stride + i*ldc + j % img_cols]
   (NCHW conv over all images at once); a tile that straddles two images runs on a scratch tile. */
static void tr_tile(long kcp, const float *ap, const float *bp, float *c, long ldc, long i, long j, int mr, int nr,
                    int first, int last, const float *bias, int bias_row, long img_cols, long img_stride) {
    if (!img_cols) {
        tr_ukernel(kcp, ap, bp, c + i * ldc + j, ldc, mr, nr, first, last, bias, bias_row);
        return;
    }
    long img = j / img_cols, q0 = j % img_cols;
    if (q0 + nr <= img_cols) {
        tr_ukernel(kcp, ap, bp, c + img * img_stride + i * ldc + q0, ldc, mr, nr, first, last, bias, bias_row);
        return;
    }
    float sc[MR * NR] __attribute__((aligned(64)));
    if (!first)
        for (int ii = 0; ii < mr; ii++)
            for (int jj = 0; jj < nr; jj++) {
                long col = j + jj;
                sc[ii * NR + jj] = c[(col / img_cols) * img_stride + (i + ii) * ldc + col % img_cols];
            }
    tr_ukernel(kcp, ap, bp, sc, NR, mr, nr, first, last, bias, bias_row);
    for (int ii = 0; ii < mr; ii++)
        for (int jj = 0; jj < nr; jj++) {
            long col = j + jj;
            c[(col / img_cols) * img_stride + (i + ii) * ldc + col % img_cols] = sc[ii * NR + jj];
        }
}

/* Where an indirect-kernel tile writes: straight into C, or (a tile straddling two images of an NCHW
   output) into sc, preloaded when accumulating; tr_tile_end copies sc back. */
static float *tr_tile_begin(float *c, long ldc, long i, long j, int mr, int nr, int first, long img_cols,
                            long img_stride, float *sc, long *ld) {
    *ld = ldc;
    if (!img_cols) return c + i * ldc + j;
    long img = j / img_cols, q0 = j % img_cols;
    if (q0 + nr <= img_cols) return c + img * img_stride + i * ldc + q0;
    *ld = NR;
    if (!first)
        for (int ii = 0; ii < mr; ii++)
            for (int jj = 0; jj < nr; jj++) {
                long col = j + jj;
                sc[ii * NR + jj] = c[(col / img_cols) * img_stride + (i + ii) * ldc + col % img_cols];
            }
    return sc;
}

static void tr_tile_end(float *c, long ldc, long i, long j, int mr, int nr, long img_cols, long img_stride,
                        const float *sc) {
    for (int ii = 0; ii < mr; ii++)
        for (int jj = 0; jj < nr; jj++) {
            long col = j + jj;
            c[(col / img_cols) * img_stride + (i + ii) * ldc + col % img_cols] = sc[ii * NR + jj];
        }
}

/* A is packed by pa, or read in place as dense unit-stride rows (arows: the weights of a
   weights-stationary conv). ctrans (arows only): tiles are stored transposed,
   C(i, j) = c[(i / img_cols)*img_stride + i % img_cols + j*ldc]. */
static int tr_drive(long M, long N, long K, tr_pack_fn pa, const void *ca, tr_pack_fn pb, const void *cb,
                    float *c, long ldc, long img_cols, long img_stride, const float *bias, int bias_row,
                    long mc, long nc, long kc, int nth, const tr_dense *arows, int ctrans) {
    mc = TR_MIN(TR_ROUNDUP(TR_MAX(mc, MR), MR), TR_ROUNDUP(M, MR));
    nc = TR_MIN(TR_ROUNDUP(TR_MAX(nc, NR), NR), TR_ROUNDUP(N, NR));
    kc = TR_MIN(TR_ROUNDUP(TR_MAX(kc, KU), KU), TR_ROUNDUP(K, KU));
    if (nth <= 0) nth = tr_threads_available();
    if ((double)M * N * K < 65536.0) nth = 1;
    if (ctrans && !arows) return 2;
    int owned;
    float *ws = tr_ws_get((size_t)nc * kc + (size_t)nth * mc * kc + kc + 32, &owned);
    if (!ws) return 1;
    float *bbuf = ws, *zeros = ws + TR_ROUNDUP((size_t)nc * kc, 16);
    float *abase = zeros + TR_ROUNDUP(kc, 16);
    if (arows) memset(zeros, 0, sizeof(float) * kc);
    #pragma omp parallel num_threads(nth) if (nth > 1)
    {
        int tid = TR_TID(), T = TR_NT();
        float *abuf = abase + (size_t)tid * mc * kc;
        for (long jc = 0; jc < N; jc += nc) {
            long ncur = TR_MIN(nc, N - jc), npan = (ncur + NR - 1) / NR;
            for (long pc = 0; pc < K; pc += kc) {
                long kcur = TR_MIN(kc, K - pc), kcp = TR_ROUNDUP(kcur, KU);
                int first = pc == 0, last = pc + kcur >= K;
                /* Few panels: split each one along k too, so every thread packs. */
                long ksl = npan >= 2 * T ? 1 : TR_MIN((2 * T + npan - 1) / npan, kcp / (4 * KU));
                if (ksl < 1) ksl = 1;
                long kstep = TR_ROUNDUP((kcur + ksl - 1) / ksl, KU);
                #pragma omp for schedule(dynamic, 1)
                for (long it = 0; it < npan * ksl; it++) {
                    long p = it / ksl, k0 = (it % ksl) * kstep;
                    if (k0 < kcur)
                        pb(cb, jc + p * NR, TR_MIN(NR, ncur - p * NR), pc + k0, TR_MIN(kstep, kcur - k0),
                           bbuf + p * NR * kcp + k0 * NR);
                }
                long nic = (M + mc - 1) / mc, ntile = (M + MR - 1) / MR;
                long nsplit = (nic % T == 0 || nic >= 4 * T) ? 1 : TR_MIN((long)T, npan);
                /* Blocks of (almost) equal tile counts, a multiple of the thread count when not split
                   over panels, so no thread idles at the barrier with a short last block. */
                long nblk = nsplit > 1 ? nic : TR_ROUNDUP(nic, T);
                /* dynamic: on a shared machine a descheduled thread must not hold the others back */
                #pragma omp for schedule(dynamic, 1)
                for (long it = 0; it < nblk * nsplit; it++) {
                    long q = it / nsplit, sp = it % nsplit, t0 = q * ntile / nblk, t1 = (q + 1) * ntile / nblk;
                    if (t1 == t0) continue;
                    long ic = t0 * MR, mcur = TR_MIN(M, t1 * MR) - ic, nmp = t1 - t0;
                    long jlo = npan * sp / nsplit, jhi = npan * (sp + 1) / nsplit;
                    if (arows) {
                        /* A read in place: one unit-stride run per tile row (no packing). */
                        long lens[1] = {kcur}, offs[1] = {0};
                        int skip[1] = {0};
                        const float **rows = (const float **)abuf;
                        for (long r = 0; r < nmp; r++)
                            tr_rows_dense(arows, ic + r * MR, TR_MIN(MR, mcur - r * MR), pc, zeros, rows + r * MR);
                        for (long jr = jlo; jr < jhi; jr++) {
                            long j = jc + jr * NR;
                            int nr = (int)TR_MIN(NR, N - j);
                            for (long r = 0; r < nmp; r++) {
                                long i = ic + r * MR, ld;
                                int mr = (int)TR_MIN(MR, M - i);
                                const float *bb = !bias ? 0 : (bias_row ? bias + i : bias + j);
                                float sc[MR * NR] __attribute__((aligned(64)));
                                float *dst = sc;
                                if (ctrans) {
                                    ld = NR;
                                    if (!first) tr_tile_io_t(c, ldc, img_cols, img_stride, i, j, mr, nr, sc, 1);
                                } else {
                                    dst = tr_tile_begin(c, ldc, i, j, mr, nr, first, img_cols, img_stride, sc, &ld);
                                }
                                tr_ukernel_ind(1, lens, offs, skip, rows + r * MR, bbuf + jr * NR * kcp, dst, ld,
                                               mr, nr, first, last, bb, bias_row, 0);
                                if (ctrans) tr_tile_io_t(c, ldc, img_cols, img_stride, i, j, mr, nr, sc, 0);
                                else if (dst == sc) tr_tile_end(c, ldc, i, j, mr, nr, img_cols, img_stride, sc);
                            }
                        }
                        continue;
                    }
                    for (long r = 0; r < nmp; r++)
                        pa(ca, ic + r * MR, TR_MIN(MR, mcur - r * MR), pc, kcur, abuf + r * MR * kcp);
                    for (long jr = jlo; jr < jhi; jr++) {
                        long j = jc + jr * NR;
                        int nr = (int)TR_MIN(NR, N - j);
                        for (long r = 0; r < nmp; r++) {
                            long i = ic + r * MR;
                            const float *bp = !bias ? 0 : (bias_row ? bias + i : bias + j);
                            tr_tile(kcp, abuf + r * MR * kcp, bbuf + jr * NR * kcp, c, ldc, i, j,
                                    (int)TR_MIN(MR, M - i), nr, first, last, bp, bias_row, img_cols, img_stride);
                        }
                    }
                }
            }
        }
    }
    tr_ws_put(ws, owned);
    return 0;
}

/* Conv with A read in place through pixel rows (ind) and B packed panel by panel by the thread that uses
   it: work items are (NR panel, M chunk); per K block an item packs its kc x NR panel into a private
   buffer and runs every tile of its chunk against it. One thread's packing (a memory stream) overlaps
   the other's arithmetic, and packed panels stay in that core's L2.
   nchw (NCHW weights and output): K blocks are channel blocks of KCRS weights (pb unused) and the last
   K block stores its tiles transposed into nchw->out; c (NHWC) holds partial sums between K blocks and
   may be null when K is one block. keep_all: no tap over padding is skipped (see tr_rows_nhwc); nf
   (unless null) is set to 1 when some tile's accumulators held a NaN or Inf. xc (NCHW only, may be
   null): the input's NHWC copy, made here as items first need its images (see tr_xcopy). */
static int tr_drive_ind(long M, long N, long K, tr_pack_fn pb, const void *cb, float *c, long ldc,
                        const float *bias, long mc, long kc, int nth, const tr_conv *ind,
                        const tr_ind_nchw *nchw, int keep_all, int *nf, tr_xcopy *xc) {
    long RS = ind->R * ind->S, nkb, nsmax;
    if (nchw) {
        kc = nchw->cb * RS;
        nkb = (ind->Cg + nchw->cb - 1) / nchw->cb;
        nsmax = RS;
        if (nkb > 1 && !c) return 2;
    } else {
        kc = TR_MIN(TR_ROUNDUP(TR_MAX(kc, KU), KU), TR_ROUNDUP(K, KU));
        nkb = (K + kc - 1) / kc;
        nsmax = tr_max_segs(ind->Cg, kc);
    }
    if (nth <= 0) nth = tr_threads_available();
    if ((double)M * N * K < 65536.0) nth = 1;
    long npan = (N + NR - 1) / NR, ntile = (M + MR - 1) / MR;
    /* Enough items for a dynamic schedule (>= 4 per thread), in chunks of at least mc rows. */
    long want = (4 * nth + npan - 1) / npan;
    long chunk = TR_MAX((ntile + want - 1) / want, TR_MAX(1, mc / MR));
    long nchunk = (ntile + chunk - 1) / chunk;
    size_t per = TR_ROUNDUP((size_t)kc * NR + (nchw ? RS * TR_SEG_PAD : 0), 16) + TR_ROUNDUP((size_t)nsmax * MR * 2, 16);
    int owned;
    float *ws = tr_ws_get(per * nth + TR_ROUNDUP(kc, 16) + 32, &owned);
    if (!ws) return 1;
    float *zeros = ws;
    memset(zeros, 0, sizeof(float) * kc);
    long t_call = tr_now_ns();
    int done = 0;
    TR_PROBE_FROM(t_call);
    #pragma omp parallel num_threads(nth) if (nth > 1)
    {
        int tid = TR_TID(), T = TR_NT();
        {
            TR_PROBE_FROM(t_call);
            TR_PROBE_LAP(5, tid);
        }
        float *bp = ws + TR_ROUNDUP(kc, 16) + (size_t)tid * per;
        const float **rows = (const float **)(bp + TR_ROUNDUP((size_t)kc * NR + (nchw ? RS * TR_SEG_PAD : 0), 16));
        tr_seg segs[nsmax];
        long lens[nsmax], klen[nsmax], koff[nsmax];
        int kskip[nsmax], tnf = 0;
        /* NCHW output, one K block: finished tiles of consecutive pixels collect here (up to TR_SBUF
           pixels) and go to the output 16 pixels per channel at a time, not MR (masked) at a time. */
        float sc[(TR_SBUF + MR) * NR] __attribute__((aligned(64)));
        #pragma omp for schedule(dynamic, 1) nowait
        for (long it = 0; it < npan * nchunk; it++) {
            long j = (it / nchunk) * NR, t0 = (it % nchunk) * chunk, t1 = TR_MIN(ntile, t0 + chunk);
            int nr = (int)TR_MIN(NR, N - j);
            TR_PROBE_BEGIN;
            if (xc)  /* the images of this item's pixels copied to NHWC */
                for (long img = t0 * MR / nchw->PQ; img <= (TR_MIN(M, t1 * MR) - 1) / nchw->PQ; img++)
                    tr_xcopy_need(xc, img);
            TR_PROBE_LAP(0, tid);
            for (long kb = 0; kb < nkb; kb++) {
                int first = kb == 0, last = kb == nkb - 1, nseg;
                if (nchw) {
                    long c0 = kb * nchw->cb, cn = TR_MIN(nchw->cb, ind->Cg - c0);
                    tr_pack_b_kcrs_blk(nchw->w, j, nr, c0, cn, bp);
                    for (long t = 0; t < RS; t++) { segs[t].tap = t; segs[t].c0 = c0; lens[t] = cn; }
                    nseg = (int)RS;
                } else {
                    long pc = kb * kc, kcur = TR_MIN(kc, K - pc);
                    pb(cb, j, nr, pc, kcur, bp);
                    nseg = tr_conv_segments(ind, pc, kcur, segs, lens);
                }
                TR_PROBE_LAP(1, tid);
                long sb_i = 0;
                int sb_n = 0;  /* pixels pending in sc, from pixel sb_i */
                for (long t = t0; t < t1; t++) {
                    long i = t * MR;
                    int mr = (int)TR_MIN(MR, M - i);
                    int kseg = tr_rows_nhwc(ind, i, mr, segs, lens, nseg, zeros, rows, klen, koff, kskip,
                                            nchw ? TR_SEG_PAD : 0, keep_all);
                    int direct = !nchw || !last, staged = !direct && first;
                    float *dst = staged ? sc + sb_n * NR : c + i * ldc + j;
                    long ld = staged ? NR : ldc;
                    tr_ukernel_ind(kseg, klen, koff, kskip, rows, bp, dst, ld, mr, nr, first, last, bias ? bias + j : 0, 0,
                                   nf ? &tnf : 0);
                    TR_PROBE_LAP(2, tid);
                    if (direct) continue;
                    if (!staged) { tr_store_nchw(dst, ld, nchw, i, j, mr, nr); TR_PROBE_LAP(3, tid); continue; }
                    if (!sb_n) sb_i = i;
                    sb_n += mr;
                    /* flush when full, at the chunk's end, or where the next tile starts another image */
                    long pq = nchw->PQ;
                    if (sb_n >= TR_SBUF || t + 1 == t1 || (sb_i % pq) + sb_n + MR > pq) {
                        int flush = sb_n;
                        if (TR_NCHW_ALIGN && sb_n >= TR_SBUF && t + 1 < t1 && (sb_i % pq) + sb_n + MR <= pq) {
                            /* a full buffer mid-chunk: store up to the last pixel where the output rows reach
                               a 64-byte boundary and keep the rest, so the next stores begin there */
                            long p0 = sb_i % pq, mis = (long)(((uintptr_t)(nchw->out + (sb_i / pq) * nchw->img_stride
                                                                           + j * pq + p0) & 63) / sizeof(float));
                            int keep = (int)((mis + sb_n) & 15);
                            if (keep < sb_n) flush = sb_n - keep;
                        }
                        tr_store_nchw(sc, NR, nchw, sb_i, j, flush, nr);
                        if (flush < sb_n) memmove(sc, sc + (size_t)flush * NR, sizeof(float) * (size_t)(sb_n - flush) * NR);
                        sb_i += flush;
                        sb_n -= flush;
                        TR_PROBE_LAP(3, tid);
                    }
                }
            }
        }
        if (tnf) __atomic_store_n(nf, 1, __ATOMIC_RELAXED);
        tr_join(&done, T, tid, t_call);
    }
    TR_PROBE_LAP(4, 0);
    tr_ws_put(ws, owned);
    return 0;
}

/* GEMM of up to TR_ROWS_MAXM rows against a transposed B (nn.Linear weights, N x K): A packed once per
   K block and shared; each thread packs the B panels it runs into a private (L2-resident) buffer and
   uses them at once, so B is read from memory once and no KC x NC block is written and read back. */
__attribute__((noinline)) static int tr_drive_rows(long M, long N, long K, const tr_dense *A, const tr_dense *B,
                                                   float *c, long ldc, const float *bias, long kc, int nth) {
    long ntile = (M + MR - 1) / MR, npan = (N + NR - 1) / NR;
    int owned;
    float *ws = tr_ws_get((size_t)ntile * MR * kc + (size_t)nth * NR * kc + 32, &owned);
    if (!ws) return 1;
    float *abuf = ws, *bbase = ws + TR_ROUNDUP((size_t)ntile * MR * kc, 16);
    #pragma omp parallel num_threads(nth) if (nth > 1)
    {
        int tid = TR_TID();
        float *bp = bbase + (size_t)tid * NR * kc;
        for (long pc = 0; pc < K; pc += kc) {
            long kcur = TR_MIN(kc, K - pc), kcp = TR_ROUNDUP(kcur, KU);
            int first = pc == 0, last = pc + kcur >= K;
            #pragma omp for schedule(static)
            for (long r = 0; r < ntile; r++)
                tr_pack_a_dense(A, r * MR, TR_MIN(MR, M - r * MR), pc, kcur, abuf + r * MR * kcp);
            #pragma omp for schedule(dynamic, 1)
            for (long p = 0; p < npan; p++) {
                long j = p * NR;
                int nr = (int)TR_MIN(NR, N - j);
                tr_pack_b_dense(B, j, nr, pc, kcur, bp);
                for (long r = 0; r < ntile; r++) {
                    long i = r * MR;
                    tr_ukernel(kcp, abuf + r * MR * kcp, bp, c + i * ldc + j, ldc, (int)TR_MIN(MR, M - i), nr,
                               first, last, bias ? bias + j : 0, 0);
                }
            }
        }
    }
    tr_ws_put(ws, owned);
    return 0;
}

#ifndef TR_COLS_DRIVER
#define TR_COLS_DRIVER 1
#endif
#ifndef TR_COLS_MIN_PANELS
#define TR_COLS_MIN_PANELS 4
#endif
/* Per-core L2 bytes of the host, set once by the loader (tr_set_caches) from the host profile. */
static long tr_l2_bytes = 1L << 20;
void tr_set_caches(long l1d, long l2) {
    (void)l1d;
    if (l2 > 0) tr_l2_bytes = l2;
}
#ifndef TR_COLS_SHARE_A
#define TR_COLS_SHARE_A 12  /* eighths of the L2 */
#endif
#ifndef TR_COLS_STEAL
#define TR_COLS_STEAL 1
#endif
#ifndef TR_COLS_FEW_A
#define TR_COLS_FEW_A 8  /* the column driver below TR_COLS_MIN_PANELS panels a thread: A within this many L2s */
#endif
#ifndef TR_COLS_FEW_T
#define TR_COLS_FEW_T 8  /* ... and from this many threads (measured at 16: faster; at 2: even) */
#endif
#ifndef TR_COLS_UNITS
#define TR_COLS_UNITS 4  /* pieces per thread's range when TR_COLS_STEAL */
#endif
/* One call of the column driver, shared by its participants (tr_cols_part). */
typedef struct {
    long M, N, K;
    const tr_dense *A, *B;
    float *c;
    long ldc;
    const float *bias;
    long mc, nc, kc, npan, ntile, nkb;
    size_t each;
    int steal, share;
    float *ws, *abig;
    int *ready;    /* tile rows of the shared A packed */
    long *claimed; /* pieces claimed per range */
    long next;     /* next tile row of the shared A to pack */
    long t_call;
    int done;      /* participants done (tr_join) */
} tr_cols_job;

/* Participant `tid` of `T`: its own column range's pieces, then (stealing) the pieces left in the others'.
   Returns only when no piece is left unclaimed, so the pool's caller may close the job on return. */
static void tr_cols_part(void *arg, int tid, int T) {
    tr_cols_job *jb = (tr_cols_job *)arg;
    long M = jb->M, N = jb->N, K = jb->K, mc = jb->mc, nc = jb->nc, kc = jb->kc, npan = jb->npan, ntile = jb->ntile,
         nkb = jb->nkb, ldc = jb->ldc;
    const tr_dense *A = jb->A, *B = jb->B;
    float *c = jb->c, *abig = jb->abig;
    const float *bias = jb->bias;
    int steal = jb->steal, share = jb->share, *ready = jb->ready;
    long *claimed = jb->claimed;
    TR_PROBE_FROM(jb->t_call);
    TR_PROBE_LAP(0, tid);
    float *bbuf = jb->ws + (size_t)tid * jb->each, *abuf = bbuf + TR_ROUNDUP((size_t)nc * kc, 16);
    long units = steal ? TR_COLS_UNITS : 1;
    for (int o = 0; o < (steal ? T : 1); o++) {
      int owner = (tid + o) % T;
      long p0 = npan * owner / T, p1 = npan * (owner + 1) / T;
      for (long u; (u = __atomic_fetch_add(&claimed[owner], 1, __ATOMIC_RELAXED)) < units;) {
      long j0 = TR_MIN(N, (p0 + (p1 - p0) * u / units) * NR), j1 = TR_MIN(N, (p0 + (p1 - p0) * (u + 1) / units) * NR);
      for (long jc = j0; jc < j1; jc += nc) {
        long ncur = TR_MIN(nc, j1 - jc), np = (ncur + NR - 1) / NR;
        for (long pc = 0; pc < K; pc += kc) {
            long kcur = TR_MIN(kc, K - pc), kcp = TR_ROUNDUP(kcur, KU), kb = pc / kc;
            int first = pc == 0, last = pc + kcur >= K;
            for (long p = 0; p < np; p++)
                tr_pack_b_dense(B, jc + p * NR, TR_MIN(NR, ncur - p * NR), pc, kcur, bbuf + p * NR * kcp);
            TR_PROBE_LAP(1, tid);
            for (long ic = 0; ic < M; ic += mc) {
                long mcur = TR_MIN(mc, M - ic), nmp = (mcur + MR - 1) / MR;
                const float *ablk = abuf;
                long astep = MR * kcp;
                if (share) {
                    ablk = abig + ((size_t)kb * ntile + ic / MR) * MR * kc;
                    astep = MR * kc;
                    for (long r = ic / MR; r < ic / MR + nmp; r++)
                        for (int spin = 0; !__atomic_load_n(&ready[r], __ATOMIC_ACQUIRE); spin++) {
                            long q = __atomic_fetch_add(&jb->next, 1, __ATOMIC_RELAXED);
                            if (q < ntile) {
                                TR_PROBE_LAP(3, tid);
                                for (long b = 0; b < nkb; b++)
                                    tr_pack_a_dense(A, q * MR, TR_MIN(MR, M - q * MR), b * kc, TR_MIN(kc, K - b * kc),
                                                    abig + ((size_t)b * ntile + q) * MR * kc);
                                __atomic_store_n(&ready[q], 1, __ATOMIC_RELEASE);
                                TR_PROBE_LAP(6, tid);
                            } else {
                                tr_cpu_relax();
                                if (spin > 4096) sched_yield();
                            }
                        }
                } else {
                    for (long r = 0; r < nmp; r++)
                        tr_pack_a_dense(A, ic + r * MR, TR_MIN(MR, mcur - r * MR), pc, kcur, abuf + r * MR * kcp);
                }
                TR_PROBE_LAP(3, tid);
                for (long jr = 0; jr < np; jr++) {
                    long j = jc + jr * NR;
                    int nr = (int)TR_MIN(NR, N - j);
                    for (long r = 0; r < nmp; r++) {
                        long i = ic + r * MR;
                        tr_ukernel(kcp, ablk + r * astep, bbuf + jr * NR * kcp, c + i * ldc + j, ldc,
                                   (int)TR_MIN(MR, M - i), nr, first, last, bias ? bias + j : 0, 0);
                    }
                }
                TR_PROBE_LAP(2, tid);
            }
        }
      }
      }
    }
}

/* The blocked GEMM with the columns shared out instead of the row blocks: each thread owns a contiguous
   range of NR panels and runs the NC / KC / MC loops over it with its own B block and A block, so no
   block is shared and no thread waits for another until the end. Taken when every thread gets at least
   TR_COLS_MIN_PANELS panels (each thread packs all of A: M x K per call, small next to the M x N x K
   work); 2-core Sapphire Rapids VM, fp32 1024^3 / 2048^3: see docs/backends/cpu.md. */
__attribute__((noinline)) static int tr_drive_cols(long M, long N, long K, const tr_dense *A, const tr_dense *B,
                                                   float *c, long ldc, const float *bias, long mc, long nc, long kc,
                                                   int nth) {
    long npan = (N + NR - 1) / NR, per = (npan + nth - 1) / nth;
    mc = TR_MIN(TR_ROUNDUP(TR_MAX(mc, MR), MR), TR_ROUNDUP(M, MR));
    nc = TR_MIN(TR_ROUNDUP(TR_MAX(nc, NR), NR), per * NR);
    kc = TR_MIN(TR_ROUNDUP(TR_MAX(kc, KU), KU), TR_ROUNDUP(K, KU));
#ifndef TR_COLS_EVEN_K
#define TR_COLS_EVEN_K 1
#endif
    if (TR_COLS_EVEN_K) {  /* K blocks of (almost) equal depth: 768 = 384 + 384, not 512 + 256 */
        long nkb = (K + kc - 1) / kc;
        kc = TR_ROUNDUP((K + nkb - 1) / nkb, KU);
    }
    /* Shared A, when the packed A of the whole call is at most TR_COLS_SHARE_A / 8 of one core's L2:
       A is packed once, a tile row (MR rows x all of K) at a time, by whichever thread first needs a
       tile row not packed yet (tasks handed out in order from a counter, ready flags tell the others),
       instead of by every thread. Otherwise each thread packs all of A into its own mc x kc blocks right
       before using them. 2-core Sapphire Rapids VM (2 MiB L2), same process: 512^3 (1 MiB packed A)
       -3 to -5% time, 768^3 (2.3 MiB) -1 to -3%, 1024^3 (4.2 MiB) +2% (the kernels then read A tiles
       packed long before, from L3, instead of right after packing them). */
    long ntile = (M + MR - 1) / MR, nkb = (K + kc - 1) / kc;
    size_t ashared = (size_t)ntile * MR * kc * nkb;
    /* Units (TR_COLS_STEAL): each thread's range is cut into TR_COLS_UNITS pieces, claimed from a counter
       per range; a thread done with its own range takes the pieces left in the others'. A thread sharing
       its core (another library's spinning pool: OpenBLAS's workers busy-wait ~0.1 s after each NumPy
       call) then no longer holds the call back: 1024^3 on the 2-core Zen 3 VM right after a NumPy 512^2
       matmul took 2.3x its time alone with fixed ranges. Pieces of one range reuse no A block, so A is
       then always shared (packed once). */
    int steal = TR_COLS_STEAL && nth > 1;
    int share = nth > 1 && (steal || (double)ashared * sizeof(float) <= (double)tr_l2_bytes * TR_COLS_SHARE_A / 8);
    size_t each = TR_ROUNDUP((size_t)nc * kc, 16) + (share ? 0 : TR_ROUNDUP((size_t)mc * kc, 16));
    size_t extra = (share ? TR_ROUNDUP(ashared, 16) + TR_ROUNDUP((size_t)ntile, 16) : 0) + TR_ROUNDUP((size_t)nth * 2, 16);
    int owned;
    float *ws = tr_ws_get((size_t)nth * each + extra + 32, &owned);
    if (!ws) return 1;
    float *abig = ws + (size_t)nth * each;
    tr_cols_job job = {M, N, K, A, B, c, ldc, bias, mc, nc, kc, npan, ntile, nkb, each, steal, share, ws, abig,
                       (int *)(abig + TR_ROUNDUP(ashared, 16)),
                       (long *)(abig + (share ? TR_ROUNDUP(ashared, 16) + TR_ROUNDUP((size_t)ntile, 16) : 0)),
                       0, tr_now_ns(), 0};
    if (share) memset(job.ready, 0, sizeof(int) * (size_t)ntile);
    memset(job.claimed, 0, sizeof(long) * (size_t)nth);
    TR_PROBE_FROM(job.t_call);
    /* Tracea's pool when it is set and free (the call returns once every piece is done, not once every
       worker has arrived: tracea_cpu/emit/pool.py; with stealing, a participant returns only when no
       piece is left unclaimed); else an OpenMP region. */
    if (!steal || tr_pool_try(tr_cols_part, &job, nth)) {  /* (fixed ranges: every thread must run its own) */
        #pragma omp parallel num_threads(nth) if (nth > 1)
        {
            int tid = TR_TID(), T = TR_NT();
            tr_cols_part(&job, tid, T);
            tr_join(&job.done, T, tid, job.t_call);
        }
    }
    TR_PROBE_LAP(4, 0);
    tr_ws_put(ws, owned);
    return 0;
}

/* Which driver tr_gemm runs: 0 the packed blocked driver, 1 tr_drive_rows, 2 tr_drive_gemv,
   3 tr_drive_axpy, 4 tr_drive_cols. */
int tr_gemm_route(long M, long N, long K, long rsb, long csb, int nth) {
    int T = nth > 0 ? nth : tr_threads_available();
    if ((double)M * N * K < 65536.0) T = 1;
    /* B columns contiguous along k (nn.Linear weights) and few rows: dot products, nothing packed
       (thresholds and measurements: emit/gemv.py; Python mirrors this rule in unpacked_driver). */
    if (TR_GEMV_DRIVER && rsb == 1 && TR_GEMV_ROWS_OK(M, K)) return 2;
    if (TR_AXPY_DRIVER && csb == 1 && M <= TR_AXPY_MAXM) return 3;
    /* Few rows against transposed weights (measured at M x 4096 x 4096, 6x64 tile: M = 1 / 8 / 32:
       9.0 / 9.5 / 12.8 ms -> see docs/backends/cpu.md) take the per-thread-panel driver. */
    if (TR_ROWS_DRIVER && M <= TR_ROWS_MAXM && csb != 1 && (N + NR - 1) / NR >= 2 * T) return 1;
    if (TR_COLS_DRIVER && T > 1 && M >= 2 * MR) {
        long npan = (N + NR - 1) / NR;
        if (npan >= (long)TR_COLS_MIN_PANELS * T) return 4;
        /* Many threads (TR_COLS_FEW_T), fewer panels, but one a thread and a small A (every thread reads
           all of the shared packed A): the column driver still beats the packed one, whose row blocks
           then split over up to T panel ranges (each piece packing its A block again) with a barrier
           per K block. 16-core Xeon (AVX-512, 2 MiB L2), 16 threads, 512^3 / 768^3 / 1024^3 / 1536^3
           vs NumPy: 0.98 / 0.95 / 1.35 / 0.95x against 0.76 / 0.83 / 1.19 / 0.83x on one machine,
           1.01-1.04 / 0.93-1.00 / 1.05 / 1.01-1.03x against 0.95 / 1.00 / 1.02 / 1.00x on another. On
           two threads (Zen 3, 3-4 panels each) the two measured within noise, and the packed driver's
           pieces pack each A block at most twice there (docs/backends/cpu.md). */
        if (T >= TR_COLS_FEW_T && npan >= T && (double)M * K * sizeof(float) <= (double)tr_l2_bytes * TR_COLS_FEW_A)
            return 4;
    }
    return 0;
}

int tr_gemm(long batch, long M, long N, long K,
            const float *a, long rsa, long csa, long sa, const float *b, long rsb, long csb, long sb,
            float *c, long ldc, long sc, const float *bias, long mc, long nc, long kc, int nth) {
    int T = nth > 0 ? nth : tr_threads_available();
    if ((double)M * N * K < 65536.0) T = 1;
    int route = tr_gemm_route(M, N, K, rsb, csb, nth), rows = route == 1, gemv = route == 2, axpy = route == 3,
        cols = route == 4;
    long kcr = TR_MIN(TR_ROUNDUP(TR_MAX(kc, KU), KU), TR_ROUNDUP(K, KU));
    for (long q = 0; q < batch; q++) {
        tr_dense A = {a + q * sa, rsa, csa}, B = {b + q * sb, rsb, csb};
        int rc = gemv ? tr_drive_gemv(M, N, K, a + q * sa, rsa, csa, b + q * sb, csb, c + q * sc, ldc, bias, T)
               : axpy ? tr_drive_axpy(M, N, K, a + q * sa, rsa, csa, b + q * sb, rsb, c + q * sc, ldc, bias, T)
               : rows ? tr_drive_rows(M, N, K, &A, &B, c + q * sc, ldc, bias, kcr, T)
               : cols ? tr_drive_cols(M, N, K, &A, &B, c + q * sc, ldc, bias, mc, nc, kc, T)
                      : tr_drive(M, N, K, tr_pack_a_dense, &A, tr_pack_b_dense, &B, c + q * sc, ldc, 0, 0, bias, 0,
                                 mc, nc, kc, nth, 0, 0);
        if (rc) return rc;
    }
    return 0;
}
"""


def blocked_source(isa: Isa, mr: int, nr: int, epilogue: Epilogue, ku: int = 8) -> str:
    """Complete C source of the GEMM + conv2d library for one ISA, register tile and epilogue."""
    if not isa.fits(mr, nr):
        raise ValueError(f"tile {mr}x{nr} does not fit {isa.name}'s registers")
    return "\n".join([prologue(isa), epilogue_c(epilogue), microkernel_c(isa, mr, nr, ku), PACKERS, POOL_CLIENT, NCHW,
                      gemv_source(isa), DRIVER, nchw_direct_source(isa), CONV, GEMM_CONV_CALLS])
