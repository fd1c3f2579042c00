"""Emitter for the split-KV decode attention forward (flash-decoding style, ``mma.sync`` m16n8k16, sm_80+).

Built for few query rows over a long KV cache (one-token decode, speculative decoding, short KV-cache
prefill chunks), where the kernel is bound by reading K and V once from memory:

* the ``G = heads / kv_heads`` query heads of one kv head (times ``seq_q``) are packed as the 16 rows of
  one ``m16`` tile (rows past ``G * seq_q`` are zero), so every K / V element is read once for the whole
  group; more than 16 rows take several CTAs along grid x (they re-read K / V, mostly from L2);
* grid z cuts the keys into ``SPLITS`` chunks (whole ``BN``-key tiles) so the grid fills every SM;
* inside a CTA each of the ``WARPS`` warps takes every ``WARPS``-th tile of the chunk through its own
  ``STAGES``-deep ``cp.async`` ring in shared memory (warp-private: the loop has no CTA barrier, only
  ``__syncwarp``), so many tiles are in flight per SM;
* per tile the warp runs S = Q K^T (Q fragments kept in registers), the online softmax in base-2 units
  and O += P V with P taken from the S accumulators, like ``flash_attn.py`` (same XOR-swizzled layout,
  ``ldmatrix`` / ``ldmatrix.trans``);
* at the end the warps merge their (max, sum, O) rows through shared memory; with one split the CTA
  writes the output, otherwise the normalised fp32 partial and its base-2 log-sum-exp go to scratch and
  the last CTA of the row block to finish (an arrival count per row block, in a buffer that every
  launch leaves at zero) merges the splits with weights ``exp2(lse_s - max lse)``: no second kernel.

Masks (bool / additive), causal (top-left), ``scale`` and the NaN / Inf behaviour are those of
``flash_attn.py``: keys past ``seq_kv`` are zero-filled and masked; a NaN or +Inf logit makes its row NaN;
a row whose keys are all masked gives 0. The mask values of a tile travel with its K and V: each warp's
ring has a 16-row x ``BN``-key mask slot per stage, filled by ``cp.async`` in the tile's group (one row
when every row of the block reads the same mask row: ``mask_heads`` 1 and ``seq_q`` 1, the padding
mask of decode), so the softmax reads shared memory instead of waiting on a global load per key. A mask
whose rows are not 16-byte aligned (``seq_kv`` not a multiple of 8, or an offset base) is copied into the
slot by plain loads instead (correct, slower).

Optional log-sum-exp output (``lse`` not null): float32 per query row, natural log, from the merged
(max, sum) of the warps or of the splits.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracea.dtypes import DType
from tracea.errors import UnsupportedConfigError

from .common import PRELUDE
from .flash_attn import key_range

KERNEL_NAME = "tracea_flash_decode"
ROWS = 16  # query rows per CTA (one m16 tile shared by every warp)
_MACROS = ("D", "BN", "WARPS", "STAGES", "CAUSAL", "MASK", "SPLITS", "MMA_KIND", "TO16", "TO32", "NT", "CHUNKS",
           "RSTRIDE", "KERNEL", "MAXREG", "LN2F", "MCH", "MPL", "LSE")


@dataclass(frozen=True)
class DecodeSpec:
    """What one compiled decode kernel is fixed to."""

    dtype: DType  # F16 or BF16
    head_dim: int  # 64 or 128
    bn: int  # keys per warp tile (16 or 32)
    warps: int  # warps per CTA, each with its own ring
    stages: int  # ring depth per warp
    causal: bool
    mask: int = 0  # 0 none, 1 bool, 2 additive
    splits: int = 1
    lse: bool = False  # also write each row's log-sum-exp (natural log, float32) to the ``lse`` argument

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def smem_bytes(self) -> int:
        """Q tile, then per warp ``stages`` K and V tiles, then the per-warp row max / sum (fp32), then
        (with a mask) per warp ``stages`` 16-row mask tiles; the rings are reused for the per-warp fp32 O
        rows of the final merge."""
        ring = self.warps * self.stages * 2 * self.bn * self.head_dim * 2
        merge = self.warps * ROWS * (self.head_dim + 8) * 4
        masks = self.warps * self.stages * ROWS * self.bn * 2 if self.mask else 0
        return 2 * ROWS * self.head_dim + max(ring, merge) + self.warps * ROWS * 2 * 4 + masks

    @property
    def max_registers(self) -> int:
        """Per-thread register cap given to ptxas (``__maxnreg__``): without one it aims at lower counts
        and spills a few bytes; the cap also bounds the blocks per SM the split count assumes."""
        if self.head_dim <= 64:
            return 168 if self.warps <= 4 else 128
        return 255 if self.warps <= 4 else 224

    def check(self) -> None:
        if self.dtype not in (DType.F16, DType.BF16):
            raise UnsupportedConfigError(f"decode attention runs float16 / bfloat16, not {self.dtype.value}")
        if self.head_dim not in (64, 128):
            raise UnsupportedConfigError(f"head_dim={self.head_dim}: the decode kernel is built for 64 and 128")
        if self.bn not in (16, 32):
            raise UnsupportedConfigError(f"bn={self.bn} must be 16 or 32")
        if self.warps not in (1, 2, 4, 8):
            raise UnsupportedConfigError(f"warps={self.warps} must be 1, 2, 4 or 8")
        if not 2 <= self.stages <= 8:
            raise UnsupportedConfigError(f"stages={self.stages} must be 2..8")
        if self.mask not in (0, 1, 2) or self.splits < 1:
            raise UnsupportedConfigError(f"mask={self.mask} / splits={self.splits} out of range")
        if self.mask and self.bn == 32 and self.head_dim == 128:
            raise UnsupportedConfigError("bn=32 with head_dim=128 and a mask needs more than 255 registers (spills)")


BODY = r"""
#define NT (WARPS * 32)
#define CHUNKS (D / 8)
#define LN2F 0.6931471805599453f
#define RSTRIDE (D + 8)

namespace {
__device__ __forceinline__ u32 dswz(int r, int c) {  // element offset of (row r, column c), XOR-swizzled
    return (u32)(r * D + ((((c >> 3) ^ (r & 7))) << 3) + (c & 7));
}
__device__ __forceinline__ void dmma(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_KIND "." MMA_KIND ".f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ int dlane() {  // opaque lane index: keeps unrolled fragment addresses un-hoisted
    int l; asm volatile("mov.u32 %0, %%laneid;" : "=r"(l)); return l;
}
__device__ __forceinline__ u32 dpack2(float lo, float hi) {
    return (u32)TO16(lo) | ((u32)TO16(hi) << 16);
}
// BN rows from row r0 of a (rows_total, D) matrix into swizzled smem by the 32 lanes of one warp
__device__ __forceinline__ void warp_tile(u16* s, const u16* g, int r0, int rows_total) {
    const int lane = dlane();  // read here: addresses formed at each call, not held across the loop
    #pragma unroll
    for (int i = lane; i < BN * CHUNKS; i += 32) {
        const int r = i / CHUNKS, c = (i % CHUNKS) * 8;
        const bool ok = r0 + r < rows_total;
        cp_async16(smem_u32(s + dswz(r, c)), g + (size_t)(ok ? r0 + r : 0) * D + c, ok);
    }
}
#if MASK
#define MCH (BN / 8)        // 8-key (16-byte) chunks of a mask tile row
#define MPL (16 * MCH / 32) // chunks per lane of a 16-row mask tile (1 or 2): rows lane / MCH (+ 32 / MCH)
// the mask values of the BN keys from n0 into a (16, BN) slot: lane chunk u covers row lane / MCH + u * 32 /
// MCH, keys (lane % MCH) * 8 .. + 8, read from mask + mo[u]; only the first `rows` rows (1 when every row
// reads the same mask row); zero past Skv (those keys are masked anyway). vec: rows 16-byte aligned, by
// cp.async in the caller's group; else plain 2-byte loads.
__device__ __forceinline__ void warp_mask(u16* s, const u16* mask, const size_t* mo, int n0, int Skv, int rows,
                                          bool vec) {
    const int lane = dlane(), c = (lane % MCH) * 8;
    #pragma unroll
    for (int u = 0; u < MPL; ++u) {
        const int r = lane / MCH + u * (32 / MCH);
        if (r >= rows) continue;
        const bool ok = n0 + c < Skv;
        if (vec) {
            cp_async16(smem_u32(s + r * BN + c), mask + mo[u] + (ok ? n0 + c : 0), ok);
        } else {
            #pragma unroll
            for (int e = 0; e < 8; ++e) s[r * BN + c + e] = n0 + c + e < Skv ? mask[mo[u] + n0 + c + e] : (u16)0;
        }
    }
}
#endif
}  // namespace

extern "C" __global__ void __maxnreg__(MAXREG) KERNEL(
        const u16* __restrict__ q, const u16* __restrict__ k, const u16* __restrict__ v, u16* __restrict__ out,
        const u16* __restrict__ mask, float* __restrict__ part, float* __restrict__ part_lse,
        int* __restrict__ arrivals, float* __restrict__ lse, int B, int H, int KVH, int Sq, int Skv, float scale_log2,
        int MB, int MH) {
    extern __shared__ __align__(128) u16 smem[];
    __shared__ int is_last;
    u16* sQ = smem;
    u16* ring = sQ + 16 * D;
    const int ring_elems = WARPS * STAGES * 2 * BN * D;
    const int merge_elems = WARPS * 16 * RSTRIDE * 2;  // fp32 as u16 pairs
    float* red = reinterpret_cast<float*>(ring + (ring_elems > merge_elems ? ring_elems : merge_elems));

    const int G = H / KVH, M = G * Sq;
    const int m0 = (int)blockIdx.x * 16;
    const int kvh = blockIdx.y;
    const int b = (int)blockIdx.z / SPLITS, split = (int)blockIdx.z % SPLITS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int gq = lane >> 2, tq = lane & 3;
#if MASK
    u16* mring = reinterpret_cast<u16*>(red + WARPS * 16 * 2) + warp * STAGES * 16 * BN;
    // mask row offsets of this lane's tile rows (rows past M read row M - 1's); one row when all share it
    const int mrows = (MH == 1 && Sq == 1) ? 1 : 16;
    const bool mvec = (Skv & 7) == 0 && (reinterpret_cast<size_t>(mask) & 15) == 0;  // 16-byte aligned rows
    size_t mo[MPL];
    #pragma unroll
    for (int u = 0; u < MPL; ++u) {
        const int rr = min(m0 + lane / MCH + u * (32 / MCH), M - 1);
        mo[u] = (((size_t)(MB > 1 ? b : 0) * MH + (MH > 1 ? kvh * G + rr / Sq : 0)) * Sq + rr % Sq) * Skv;
    }
#endif

    const size_t head0 = (size_t)b * H + (size_t)kvh * G;
    const u16* qb = q + head0 * Sq * D;
    const u16* kb = k + ((size_t)b * KVH + kvh) * Skv * D;
    const u16* vb = v + ((size_t)b * KVH + kvh) * Skv * D;

@KEY_RANGE@    const int mine = warp < ntiles ? (ntiles - warp + WARPS - 1) / WARPS : 0;  // tiles warp, warp + WARPS, ...

    // Q (16 rows, zero past M) by the whole CTA, then each warp's first STAGES - 1 tiles
    for (int i = threadIdx.x; i < 16 * CHUNKS; i += NT) {
        const int r = i / CHUNKS, c = (i % CHUNKS) * 8;
        const bool ok = m0 + r < M;
        cp_async16(smem_u32(sQ + dswz(r, c)), qb + (size_t)(ok ? m0 + r : 0) * D + c, ok);
    }
    cp_async_commit();
    u16* wring = ring + warp * STAGES * 2 * BN * D;
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < mine) {
            const int n0 = kbeg + (warp + s * WARPS) * BN;
            warp_tile(wring + (2 * s) * BN * D, kb, n0, Skv);
            warp_tile(wring + (2 * s + 1) * BN * D, vb, n0, Skv);
#if MASK
            warp_mask(mring + s * 16 * BN, mask, mo, n0, Skv, mrows, mvec);
#endif
        }
        cp_async_commit();
    }

    int row[2], qi[2], klim[2];
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        row[h] = m0 + gq + h * 8;
        const int rr = min(row[h], M - 1);
        qi[h] = rr % Sq;
        klim[h] = CAUSAL ? min(Skv, qi[h] + 1) : Skv;
    }

    float o[D / 8][4];
    #pragma unroll
    for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float mrun[2] = {-INFINITY, -INFINITY}, lrun[2] = {0.0f, 0.0f};
    u32 qf[D / 16][4];

    cp_async_wait<STAGES - 1>();  // the Q group
    __syncthreads();
    #pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const int mi = lane >> 3;
        ldsm_x4(qf[kk], smem_u32(sQ + dswz((mi & 1) * 8 + (lane & 7), kk * 16 + (mi >> 1) * 8)));
    }

    for (int i = 0; i < mine; ++i) {
        cp_async_wait<STAGES - 2>();
        __syncwarp();
        {  // refill the slot consumed in the previous iteration
            const int j = i + STAGES - 1;
            if (j < mine) {
                const int n1 = kbeg + (warp + j * WARPS) * BN, slot = j % STAGES;
                warp_tile(wring + (2 * slot) * BN * D, kb, n1, Skv);
                warp_tile(wring + (2 * slot + 1) * BN * D, vb, n1, Skv);
#if MASK
                warp_mask(mring + slot * 16 * BN, mask, mo, n1, Skv, mrows, mvec);
#endif
            }
            cp_async_commit();
        }
        const int n0 = kbeg + (warp + i * WARPS) * BN, slot = i % STAGES;
        const u16* cK = wring + (2 * slot) * BN * D;
        const u16* cV = cK + BN * D;

        float s[BN / 8][4];
        #pragma unroll
        for (int j = 0; j < BN / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        #pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            #pragma unroll
            for (int nn = 0; nn < BN / 16; ++nn) {
                u32 bf[4];
                const int ln = lane, mi = ln >> 3;
                ldsm_x4(bf, smem_u32(cK + dswz(nn * 16 + (mi >> 1) * 8 + (ln & 7), kk * 16 + (mi & 1) * 8)));
                dmma(s[2 * nn], qf[kk], bf[0], bf[1]);
                dmma(s[2 * nn + 1], qf[kk], bf[2], bf[3]);
            }
        }
        const bool edge = n0 + BN > Skv || (CAUSAL && n0 + BN - 1 > i_min);
#if MASK
        const u16* cM = mring + slot * 16 * BN;  // this tile's mask values (row 0 only when all rows share it)
#endif
        #pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int h = e >> 1, key = n0 + j * 8 + 2 * tq + (e & 1);
                float x = s[j][e] * scale_log2;
                if (edge && key >= klim[h]) x = -INFINITY;
#if MASK
                // keys past Skv read 0 here; they are -inf already (edge), and -inf + 0 stays -inf
                const float mv = TO32(cM[(mrows == 1 ? 0 : gq + 8 * h) * BN + j * 8 + 2 * tq + (e & 1)]);
                if (MASK == 1) {
                    if (mv == 0.0f) x = -INFINITY;
                } else {
                    x += mv * 1.4426950408889634f;
                }
#endif
                s[j][e] = x;
            }
        }
        float alpha[2];
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = -INFINITY;
            #pragma unroll
            for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * h], s[j][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mnew = fmaxf(mrun[h], mx);
            const float msafe = mnew == -INFINITY ? 0.0f : mnew;
            alpha[h] = exp2f(mrun[h] - msafe);
            mrun[h] = mnew;
            float sum = 0.0f;
            #pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
                s[j][2 * h] = exp2f(s[j][2 * h] - msafe);
                s[j][2 * h + 1] = exp2f(s[j][2 * h + 1] - msafe);
                sum += s[j][2 * h] + s[j][2 * h + 1];
            }
            lrun[h] = lrun[h] * alpha[h] + sum;
        }
        #pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            o[j][0] *= alpha[0]; o[j][1] *= alpha[0];
            o[j][2] *= alpha[1]; o[j][3] *= alpha[1];
        }
        #pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            u32 pa[4];
            pa[0] = dpack2(s[2 * kk][0], s[2 * kk][1]);
            pa[1] = dpack2(s[2 * kk][2], s[2 * kk][3]);
            pa[2] = dpack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[3] = dpack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            #pragma unroll
            for (int dd = 0; dd < D / 16; ++dd) {
                u32 bf[4];
                const int ln = lane, mi = ln >> 3;
                ldsm_x4_t(bf, smem_u32(cV + dswz(kk * 16 + (mi & 1) * 8 + (ln & 7), dd * 16 + (mi >> 1) * 8)));
                dmma(o[2 * dd], pa, bf[0], bf[1]);
                dmma(o[2 * dd + 1], pa, bf[2], bf[3]);
            }
        }
    }

    // merge the warps: each writes its unnormalised O rows, row max and row sum; then the CTA combines
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with its ring (reused for the O rows)
    float* ro = reinterpret_cast<float*>(ring) + warp * 16 * RSTRIDE;
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = lrun[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int r = gq + h * 8;
        #pragma unroll
        for (int j = 0; j < D / 8; ++j)
            *reinterpret_cast<float2*>(ro + r * RSTRIDE + j * 8 + 2 * tq) = make_float2(o[j][2 * h], o[j][2 * h + 1]);
        if (tq == 0) {
            red[warp * 16 + r] = mrun[h];
            red[WARPS * 16 + warp * 16 + r] = l;
        }
    }
    __syncthreads();
    const float* all = reinterpret_cast<const float*>(ring);
    for (int idx = threadIdx.x; idx < 16 * D; idx += NT) {
        const int r = idx / D, d = idx % D;
        if (m0 + r >= M) break;  // rows are in order: the rest are past M too
        float mx = -INFINITY;
        #pragma unroll
        for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, red[w * 16 + r]);
        const float msafe = mx == -INFINITY ? 0.0f : mx;
        float acc = 0.0f, l = 0.0f;
        #pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const float e = exp2f(red[w * 16 + r] - msafe);
            l += red[WARPS * 16 + w * 16 + r] * e;
            acc += all[(w * 16 + r) * RSTRIDE + d] * e;
        }
        const float inv = l == 0.0f ? 1.0f : 1.0f / l;  // l = 0: every key masked, weights 0
        const size_t orow = head0 * Sq + m0 + r;
        if (SPLITS > 1) {
            const size_t prow = (size_t)split * B * H * Sq + orow;
            part[prow * D + d] = acc * inv;
            if (d == 0) part_lse[prow] = l == 0.0f ? -INFINITY : msafe + log2f(l);
        } else {
            out[orow * D + d] = TO16(acc * inv);
            if (LSE && d == 0) lse[orow] = l == 0.0f ? -INFINITY : (msafe + log2f(l)) * LN2F;
        }
    }
#if SPLITS > 1
    // the last CTA of this (batch, kv head, row block) to finish merges the splits: partials published
    // by a fence before the arrival count; the count returns to 0 for the next launch on this stream
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const int slot = ((int)b * KVH + kvh) * (int)gridDim.x + (int)blockIdx.x;
        const int prev = atomicAdd(arrivals + slot, 1);
        is_last = prev == SPLITS - 1;
        if (is_last) arrivals[slot] = 0;
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    float* wts = reinterpret_cast<float*>(ring);  // [16][SPLITS] weights, then [16] sums
    const size_t rows_all = (size_t)B * H * Sq;
    if (threadIdx.x < 16 && m0 + (int)threadIdx.x < M) {
        const int r = threadIdx.x;
        const size_t orow = head0 * Sq + m0 + r;
        float mx = -INFINITY;
        #pragma unroll
        for (int sp = 0; sp < SPLITS; ++sp) mx = fmaxf(mx, __ldcg(part_lse + sp * rows_all + orow));
        const float msafe = mx == -INFINITY ? 0.0f : mx;
        float tot = 0.0f;
        #pragma unroll
        for (int sp = 0; sp < SPLITS; ++sp) {
            const float w = exp2f(__ldcg(part_lse + sp * rows_all + orow) - msafe);
            wts[r * SPLITS + sp] = w;
            tot += w;
        }
        wts[16 * SPLITS + r] = tot == 0.0f ? 1.0f : 1.0f / tot;
        if (LSE) lse[orow] = tot == 0.0f ? -INFINITY : (msafe + log2f(tot)) * LN2F;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < 16 * D; idx += NT) {
        const int r = idx / D, d = idx % D;
        if (m0 + r >= M) break;
        const size_t orow = head0 * Sq + m0 + r;
        float acc = 0.0f;
        #pragma unroll 8
        for (int sp = 0; sp < SPLITS; ++sp) acc += wts[r * SPLITS + sp] * __ldcg(part + (sp * rows_all + orow) * D + d);
        out[orow * D + d] = TO16(acc * wts[16 * SPLITS + r]);
    }
#endif
}
"""


def _defines(spec: DecodeSpec, name: str) -> str:
    bf = spec.dtype is DType.BF16
    return "\n".join([
        f"#define D {spec.head_dim}", f"#define BN {spec.bn}", f"#define WARPS {spec.warps}",
        f"#define STAGES {spec.stages}", f"#define CAUSAL {int(spec.causal)}", f"#define MASK {spec.mask}",
        f"#define SPLITS {spec.splits}", f"#define LSE {int(spec.lse)}", f'#define MMA_KIND "{"bf16" if bf else "f16"}"',
        f"#define TO16(x) {'f32_to_bf16' if bf else 'f32_to_f16'}(x)",
        f"#define TO32(x) {'bf16_to_f32' if bf else 'f16_to_f32'}(x)",
        "#ifndef INFINITY\n#define INFINITY __int_as_float(0x7f800000)\n#endif",
        f"#define KERNEL {name}",
        f"#define MAXREG {spec.max_registers}",
    ])


def render(spec: DecodeSpec, name: str = KERNEL_NAME) -> str:
    """Complete CUDA source of the decode kernel ``name`` for ``spec`` (its macros undefined at the end,
    so several kernels can share one translation unit)."""
    spec.check()
    head = (f"// Tracea split-KV decode attention: {spec.dtype.value} d{spec.head_dim} bn={spec.bn} "
            f"warps={spec.warps} stages={spec.stages} causal={int(spec.causal)} mask={spec.mask} "
            f"splits={spec.splits} lse={int(spec.lse)}\n")
    tail = "\n" + "\n".join(f"#undef {m}" for m in _MACROS) + "\n"
    return head + PRELUDE + _defines(spec, name) + "\n" + BODY.replace("@KEY_RANGE@", key_range("16")) + tail
