"""Emitter for the flash-attention forward (FlashAttention-2 style, ``mma.sync`` m16n8k16, sm_80+).

One CTA computes ``BM`` query rows of one (batch, kv head) against every visible key, ``BN`` keys at a
time: K and V tiles stream through shared memory with ``cp.async`` into two buffers (the next tile loads
while the current one is computed), fragments come from ``ldmatrix`` (V transposed by ``ldmatrix.trans``)
on an XOR-swizzled layout (16-byte chunk ``c`` of row ``r`` stored at chunk ``c ^ (r & 7)``: conflict-free
for ``ldmatrix`` and for the 16-byte ``cp.async`` stores; head dim 32, four chunks a row, two rows a
128-byte line: chunk ``c ^ ((r >> 1) & 3)``, so the 8 rows one ``ldmatrix`` reads still fall on 8
distinct 16-byte bank groups). Each warp owns 16 query rows: S = Q K^T
accumulates in registers, the online softmax (running max ``m`` and sum ``l`` per row, in base-2 units
with the scale folded into one multiply) rescales the output accumulator, and P goes from the S
accumulators straight into the A fragments of P V (the m16n8 accumulator layout of two adjacent key
tiles is the m16n8k16 A layout), without shared memory.

Grouped-query attention packs the ``G = heads / kv_heads`` query heads of one kv head as ``G * seq_q``
rows (they are adjacent in a packed (B, H, Sq, D) array), so one-token decode still fills rows. Row
``r`` of a kv head is query ``r % seq_q`` of head ``kvh * G + r / seq_q``.

Causal masking is top-left aligned (key j is visible to query i when j <= i); tiles wholly after a
block's last visible key are never loaded, tiles wholly before its first row's diagonal skip the mask
code, and causal blocks are scheduled longest first. Keys past ``seq_kv`` are zero-filled (``cp.async``
with a zero source size) and masked, so no garbage (possibly NaN) reaches the sums.

Optional mask (``MASK`` 1: boolean, a key takes part where the mask is non-zero, else its logit is
replaced by -inf; 2: additive, added to the scaled logits): read from a packed (MB, MH, Sq, Skv) array
of the input dtype, MB / MH 1 (broadcast) or B / H. With ``MASK_RING`` a tile's mask values travel with
its K and V: a (BM, BN) mask tile per buffer, filled by ``cp.async`` in the tile's group from each row's
mask row (offsets computed once per block into shared memory; plain loads into the tile when the mask's
base is not 16-byte aligned), rows padded by 16 bytes so the softmax's reads (a quad's 4-byte pairs over
8 rows) hit distinct banks. Without it (the variant turns it off unless ``seq_kv`` is a multiple of 8)
every thread loads its keys' mask values from global memory after the score MMAs.

Split-KV (``SPLITS`` > 1, decode): the keys are cut into ``SPLITS`` chunks along grid z; each CTA writes
its rows' normalised partial output (fp32) and base-2 log-sum-exp to scratch, and a second kernel
(:func:`render_combine`) merges them weighted by ``exp2(lse_s - max lse)``.

NaN / Inf follow ``softmax(masked_fill(scale q k^T, mask, -inf)) @ v`` in IEEE arithmetic, like the
float64 reference, for every key the kernel reads: a NaN or +Inf logit makes its row NaN, an all -inf
row gets weights 0 (output 0), a masked key's weight 0 still multiplies its v. Keys of causal tiles
that are never loaded (wholly after the diagonal) are not multiplied at all: a NaN / Inf in their v does
not reach the output, as in PyTorch's CUDA flash and cuDNN SDPA backends (its math backend and the
reference do propagate it).
"""

from __future__ import annotations

from dataclasses import dataclass

from tracea.dtypes import DType
from tracea.errors import UnsupportedConfigError

from .common import PRELUDE

KERNEL_NAME = "tracea_flash_fwd"
COMBINE_NAME = "tracea_flash_combine"
LOG2E = 1.4426950408889634
MASK_PAD = 8  # u16 elements after each mask tile row: 16 bytes keep cp.async aligned and the quads' reads conflict-free
#: head dims the kernel is built for (32: four 16-byte chunks a row, see the swizzle above)
HEAD_DIMS = (32, 64, 128)


@dataclass(frozen=True)
class FlashSpec:
    """What one compiled flash-attention kernel is fixed to."""

    dtype: DType  # F16 or BF16 (q, k, v, out, mask)
    head_dim: int  # 32, 64 or 128
    bm: int  # query rows per CTA (16 per warp)
    bn: int  # keys per tile
    causal: bool
    mask: int = 0  # 0 none, 1 bool, 2 additive
    splits: int = 1  # > 1: split-KV partials (fp32) for the combine kernel
    mt: int = 1  # 16-row m-tiles per warp (2: each K / V fragment feeds two MMAs; Q read from smem)
    lse: bool = False  # also write each row's log-sum-exp (natural log, float32) to the ``lse`` argument
    mask_ring: bool = True  # with a mask: its tiles travel with K / V through cp.async (else a global load per key)
    strided: bool = False  # q, k, v and out through their (batch, head, seq) element strides (kernel arguments)

    @property
    def ring(self) -> bool:
        """Whether the mask's tiles go through shared memory (a mask, and ``mask_ring``)."""
        return bool(self.mask) and self.mask_ring

    @property
    def warps(self) -> int:
        return self.bm // (16 * self.mt)

    @property
    def threads(self) -> int:
        return self.warps * 32

    @property
    def smem_bytes(self) -> int:
        """Q tile plus two K and two V tiles, 16-bit elements; with the mask ring two (BM, BN + 8) mask
        tiles and BM 8-byte mask row offsets."""
        ring = 2 * self.bm * (self.bn + MASK_PAD) * 2 + 8 * self.bm if self.ring else 0
        return 2 * self.head_dim * (self.bm + 4 * self.bn) + ring

    def check(self) -> None:
        if self.dtype not in (DType.F16, DType.BF16):
            raise UnsupportedConfigError(f"flash attention runs float16 / bfloat16, not {self.dtype.value}")
        if self.head_dim not in HEAD_DIMS:
            raise UnsupportedConfigError(f"head_dim={self.head_dim}: the flash kernel is built for 32, 64 and 128")
        if self.mt not in (1, 2) or self.bm % (16 * self.mt) or not 1 <= self.warps <= 8:
            raise UnsupportedConfigError(f"bm={self.bm} must be 16 x mt={self.mt} x (1..8 warps)")
        if self.bn not in (32, 64, 128):
            raise UnsupportedConfigError(f"bn={self.bn} must be 32, 64 or 128")
        # accumulators per thread: O (head_dim / 2) + S (bn / 2) per m-tile + Q fragments (head_dim / 4, mt 1)
        if self.mt * (self.head_dim // 2 + self.bn // 2) + (self.head_dim // 4 if self.mt == 1 else 8) > 176:
            raise UnsupportedConfigError(f"bn={self.bn} with head_dim={self.head_dim} needs more than 255 registers")
        if self.mask and self.mt == 2 and self.head_dim == 128:
            raise UnsupportedConfigError("mt=2 with head_dim=128 and a mask needs more than 255 registers (spills)")
        if self.mask not in (0, 1, 2) or self.splits < 1:
            raise UnsupportedConfigError(f"mask={self.mask} / splits={self.splits} out of range")


def key_range(rows: str) -> str:
    """C statements of a kernel body: the visible keys ``[kbeg, kend)`` of the query rows ``m0 ..
    m0 + rows - 1`` of one kv head (row r is query r % Sq of the group's head r / Sq; top-left causal),
    cut to key chunk ``split`` of ``SPLITS``, ``i_min`` (causal masking needed for keys past it) and
    ``ntiles`` (``BN``-key tiles). Shared by this kernel and ``flash_decode``."""
    return KEY_RANGE.replace("@ROWS@", rows)


KEY_RANGE = r"""    // visible keys of this block: [kbeg, kend)
    const int r_first = m0, r_last = min(m0 + @ROWS@, M) - 1;
    const bool one_head = (r_first / Sq) == (r_last / Sq);
    int kend = Skv;
    int i_min = 0;  // smallest query index in the block (causal masking needed past it)
    if (CAUSAL) {
        const int i_max = one_head ? r_last % Sq : Sq - 1;
        i_min = one_head ? r_first % Sq : 0;
        kend = min(Skv, i_max + 1);
    }
    int kbeg = 0;
    if (SPLITS > 1) {
        const int per = ((Skv + SPLITS - 1) / SPLITS + BN - 1) / BN * BN;
        kbeg = split * per;
        kend = min(kend, kbeg + per);
    }
    const int ntiles = kend > kbeg ? (kend - kbeg + BN - 1) / BN : 0;
"""

BODY = r"""
#define NT (WARPS * 32)
#define CHUNKS (D / 8)

static __device__ __forceinline__ u32 swz(int r, int c) {  // element offset of (row r, column c)
#if CHUNKS >= 8
    return (u32)(r * D + ((((c >> 3) ^ (r & 7))) << 3) + (c & 7));
#else  // D 32: rows r and r + 1 share a 128-byte line (bank groups 4 (r & 1) + chunk)
    return (u32)(r * D + ((((c >> 3) ^ ((r >> 1) & 3))) << 3) + (c & 7));
#endif
}
static __device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_KIND "." MMA_KIND ".f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// the lane index read anew where fragment addresses are formed: an opaque value keeps the compiler
// from hoisting every (k-step, tile) address of the unrolled loops into registers (it spilled)
static __device__ __forceinline__ int lane_now() {
    int l; asm volatile("mov.u32 %0, %%laneid;" : "=r"(l)); return l;
}
static __device__ __forceinline__ u32 pack2(float lo, float hi) {
    return (u32)TO16(lo) | ((u32)TO16(hi) << 16);
}
// rows [r0, r0 + ROWS) of a (rows_total, D) matrix at g, rows rs elements apart, into swizzled shared
// memory; rows past the end zeroed
template <int ROWS>
static __device__ __forceinline__ void load_tile(u16* s, const u16* g, int r0, int rows_total, size_t rs) {
    const int tid = threadIdx.x;
    #pragma unroll
    for (int i = tid; i < ROWS * CHUNKS; i += NT) {
        const int r = i / CHUNKS, c = (i % CHUNKS) * 8;
        const bool ok = r0 + r < rows_total;
        const u16* src = g + (size_t)(ok ? r0 + r : 0) * rs + c;
        cp_async16(smem_u32(s + swz(r, c)), src, ok);
    }
}
#if STRIDED
// the Q tile of a group's rows [r0, r0 + ROWS): row r is query r % per of head r / per, at
// g + (r / per) * hs + (r % per) * rs; rows past the end zeroed
template <int ROWS>
static __device__ __forceinline__ void load_q_strided(u16* s, const u16* g, int r0, int rows_total, int per,
                                                      long long hs, long long rs) {
    #pragma unroll
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += NT) {
        const int r = i / CHUNKS, c = (i % CHUNKS) * 8;
        const bool ok = r0 + r < rows_total;
        const int rr = ok ? r0 + r : 0;
        cp_async16(smem_u32(s + swz(r, c)), g + (size_t)(rr / per) * hs + (size_t)(rr % per) * rs + c, ok);
    }
}
#endif

#if MASK_RING
#define MROW (BN + MASK_PAD)  // u16 elements per mask tile row
// the mask values of keys [n0, n0 + BN) of the block's BM rows into a (BM, MROW) tile: row r from
// mask + moff[r]; zero past Skv (those keys are masked anyway). vec: rows 16-byte aligned (cp.async),
// else plain loads.
static __device__ __forceinline__ void load_mask(u16* s, const u16* mask, const size_t* moff, int n0, int Skv,
                                                 bool vec) {
    #pragma unroll
    for (int i = threadIdx.x; i < BM * (BN / 8); i += NT) {
        const int r = i / (BN / 8), c = (i % (BN / 8)) * 8;
        if (vec) {
            const bool ok = n0 + c < Skv;
            cp_async16(smem_u32(s + r * MROW + c), mask + (ok ? moff[r] + n0 + c : 0), ok);
        } else {
            #pragma unroll
            for (int e = 0; e < 8; ++e) s[r * MROW + c + e] = n0 + c + e < Skv ? mask[moff[r] + n0 + c + e] : (u16)0;
        }
    }
}
#endif

extern "C" __global__ void __launch_bounds__(NT, 1) KERNEL(
        const u16* __restrict__ q, const u16* __restrict__ k, const u16* __restrict__ v, u16* __restrict__ out,
        const u16* __restrict__ mask, float* __restrict__ part, float* __restrict__ part_lse, float* __restrict__ lse,
        int B, int H, int KVH, int Sq, int Skv, float scale_log2, int MB, int MH
#if STRIDED
        , long long qsb, long long qsh, long long qss, long long ksb, long long ksh, long long kss,
        long long vsb, long long vsh, long long vss, long long osb, long long osh, long long oss
#endif
        ) {
    extern __shared__ __align__(128) u16 smem[];
    u16* sQ = smem;
    u16* sK = sQ + BM * D;           // two buffers
    u16* sV = sK + 2 * BN * D;       // two buffers
#if MASK_RING
    u16* sM = sV + 2 * BN * D;       // two (BM, MROW) mask tiles
    size_t* sMoff = reinterpret_cast<size_t*>(sM + 2 * BM * MROW);  // mask row offset of each block row
#endif
    const int G = H / KVH, M = G * Sq;
    const int nmb = (M + BM - 1) / BM;
    const int mb = CAUSAL ? nmb - 1 - (int)blockIdx.x : (int)blockIdx.x;  // causal: longest blocks first
    const int kvh = blockIdx.y;
    const int b = (int)blockIdx.z / SPLITS, split = (int)blockIdx.z % SPLITS;
    const int m0 = mb * BM;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int gq = lane >> 2, tq = lane & 3;

    const size_t head0 = (size_t)b * H + (size_t)kvh * G;            // first q head of this kv head
#if STRIDED
    const u16* qb = q + (size_t)b * qsb + (size_t)kvh * G * qsh;       // row r: head r / Sq, query r % Sq
    const u16* kb = k + (size_t)b * ksb + (size_t)kvh * ksh;
    const u16* vb = v + (size_t)b * vsb + (size_t)kvh * vsh;
    const size_t krs = kss, vrs = vss;
#else
    const u16* qb = q + head0 * Sq * D;                                // rows r of the group: qb + r * D
    const u16* kb = k + ((size_t)b * KVH + kvh) * Skv * D;
    const u16* vb = v + ((size_t)b * KVH + kvh) * Skv * D;
    const size_t krs = D, vrs = D;
#endif

@KEY_RANGE@
#if MASK_RING
    // mask row offsets of the block's rows (rows past M read row M - 1's)
    for (int r = threadIdx.x; r < BM; r += NT) {
        const int rr = min(m0 + r, M - 1);
        sMoff[r] = (((size_t)(MB > 1 ? b : 0) * MH + (MH > 1 ? kvh * G + rr / Sq : 0)) * Sq + rr % Sq) * Skv;
    }
    const bool mvec = (Skv & 7) == 0 && (reinterpret_cast<size_t>(mask) & 15) == 0;  // 16-byte aligned rows
    __syncthreads();
#endif
#if STRIDED
    load_q_strided<BM>(sQ, qb, m0, M, Sq, qsh, qss);
#else
    load_tile<BM>(sQ, qb, m0, M, D);
#endif
    cp_async_commit();
    if (ntiles > 0) {
        load_tile<BN>(sK, kb, kbeg, Skv, krs);
        load_tile<BN>(sV, vb, kbeg, Skv, vrs);
#if MASK_RING
        load_mask(sM, mask, sMoff, kbeg, Skv, mvec);
#endif
    }
    cp_async_commit();

    // this thread's rows: m-tile mt, rows gq and gq + 8 of it; their query / head indices
    int row[MT][2], qi[MT][2], qh[MT][2];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            row[mt][h] = m0 + (warp * MT + mt) * 16 + gq + h * 8;
            const int rr = min(row[mt][h], M - 1);
            qi[mt][h] = rr % Sq;
            qh[mt][h] = kvh * G + rr / Sq;
        }
    }
    int klim[MT][2];  // keys visible to each row: [0, klim)
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
        #pragma unroll
        for (int h = 0; h < 2; ++h) klim[mt][h] = CAUSAL ? min(Skv, qi[mt][h] + 1) : Skv;
#if !MASK_RING
    const u16* mrow[MT][2];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        #pragma unroll
        for (int h = 0; h < 2; ++h)
            mrow[mt][h] = MASK ? mask + (((size_t)(MB > 1 ? b : 0) * MH + (MH > 1 ? qh[mt][h] : 0)) * Sq + qi[mt][h]) * Skv
                               : mask;
    }
#endif

    float o[MT][D / 8][4];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
        #pragma unroll
        for (int j = 0; j < D / 8; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.0f;
    float mrun[MT][2], lrun[MT][2];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt) mrun[mt][0] = mrun[mt][1] = -INFINITY, lrun[mt][0] = lrun[mt][1] = 0.0f;
#if MT == 1
    u32 qf[D / 16][4];  // one m-tile: Q fragments stay in registers
#endif

    cp_async_wait<1>();
    __syncthreads();
#if MT == 1
    #pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const int mi = lane >> 3;
        const int r = warp * 16 + (mi & 1) * 8 + (lane & 7), c = kk * 16 + (mi >> 1) * 8;
        ldsm_x4(qf[kk], smem_u32(sQ + swz(r, c)));
    }
#endif

    for (int t = 0; t < ntiles; ++t) {
        const int n0 = kbeg + t * BN;
        const int buf = t & 1;
        cp_async_wait<0>();
        __syncthreads();
        if (t + 1 < ntiles) {  // the next tile loads while this one is computed
            load_tile<BN>(sK + (buf ^ 1) * BN * D, kb, n0 + BN, Skv, krs);
            load_tile<BN>(sV + (buf ^ 1) * BN * D, vb, n0 + BN, Skv, vrs);
#if MASK_RING
            load_mask(sM + (buf ^ 1) * BM * MROW, mask, sMoff, n0 + BN, Skv, mvec);
#endif
        }
        cp_async_commit();
        const u16* cK = sK + buf * BN * D;
        const u16* cV = sV + buf * BN * D;

        float s[MT][BN / 8][4];
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            #pragma unroll
            for (int j = 0; j < BN / 8; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
        #pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#if MT == 1
            const u32* af0 = qf[kk];
#else
            u32 af[MT][4];  // several m-tiles: Q fragments from shared memory, each K fragment feeds MT
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const int ln = lane_now(), mi = ln >> 3;
                const int r = (warp * MT + mt) * 16 + (mi & 1) * 8 + (ln & 7), c = kk * 16 + (mi >> 1) * 8;
                ldsm_x4(af[mt], smem_u32(sQ + swz(r, c)));
            }
#endif
            #pragma unroll
            for (int nn = 0; nn < BN / 16; ++nn) {
                u32 bf[4];
                const int ln = lane_now(), mi = ln >> 3;
                const int r = nn * 16 + (mi >> 1) * 8 + (ln & 7), c = kk * 16 + (mi & 1) * 8;
                ldsm_x4(bf, smem_u32(cK + swz(r, c)));
                #pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
#if MT == 1
                    const u32* a = af0;
#else
                    const u32* a = af[mt];
#endif
                    mma16816(s[mt][2 * nn], a, bf[0], bf[1]);
                    mma16816(s[mt][2 * nn + 1], a, bf[2], bf[3]);
                }
            }
        }
        // scale (base-2 units), masks
        const bool edge = n0 + BN > Skv || (CAUSAL && n0 + BN - 1 > i_min);
#if MASK_RING
        const u16* cM = sM + buf * BM * MROW;  // this tile's mask values, row r at cM + r * MROW
#endif
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            #pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
#if MASK_RING
                u32 mpair[2];  // the mask values of this thread's two keys in rows gq and gq + 8
                #pragma unroll
                for (int h = 0; h < 2; ++h)
                    mpair[h] = *reinterpret_cast<const u32*>(cM + ((warp * MT + mt) * 16 + gq + 8 * h) * MROW + j * 8 + 2 * tq);
#endif
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int h = e >> 1, key = n0 + j * 8 + 2 * tq + (e & 1);
                    float x = s[mt][j][e] * scale_log2;
                    if (edge && key >= klim[mt][h]) x = -INFINITY;  // past seq_kv, or causally hidden
#if MASK_RING
                    const float mv = TO32((u16)(mpair[h] >> (16 * (e & 1))));  // 0 past Skv: masked anyway
                    if (MASK == 1) {
                        if (mv == 0.0f) x = -INFINITY;
                    } else if (MASK == 2) {
                        x += mv * 1.4426950408889634f;
                    }
#else
                    if (MASK == 1) {
                        if (key < Skv && TO32(mrow[mt][h][key]) == 0.0f) x = -INFINITY;
                    } else if (MASK == 2) {
                        if (key < Skv) x += TO32(mrow[mt][h][key]) * 1.4426950408889634f;
                    }
#endif
                    s[mt][j][e] = x;
                }
            }
        }
        // online softmax: row max over the quad, rescale, exponentials, partial row sums
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            float alpha[2];
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = -INFINITY;
                #pragma unroll
                for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[mt][j][2 * h], s[mt][j][2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mnew = fmaxf(mrun[mt][h], mx);
                const float msafe = mnew == -INFINITY ? 0.0f : mnew;
                alpha[h] = exp2f(mrun[mt][h] - msafe);
                mrun[mt][h] = mnew;
                float sum = 0.0f;
                #pragma unroll
                for (int j = 0; j < BN / 8; ++j) {
                    s[mt][j][2 * h] = exp2f(s[mt][j][2 * h] - msafe);
                    s[mt][j][2 * h + 1] = exp2f(s[mt][j][2 * h + 1] - msafe);
                    sum += s[mt][j][2 * h] + s[mt][j][2 * h + 1];
                }
                lrun[mt][h] = lrun[mt][h] * alpha[h] + sum;
            }
            #pragma unroll
            for (int j = 0; j < D / 8; ++j) {
                o[mt][j][0] *= alpha[0]; o[mt][j][1] *= alpha[0];
                o[mt][j][2] *= alpha[1]; o[mt][j][3] *= alpha[1];
            }
        }
        // O += P V: P from the S accumulators (two key tiles = one k16 A fragment), V by ldmatrix.trans
        #pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            u32 pa[MT][4];
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                pa[mt][0] = pack2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                pa[mt][1] = pack2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                pa[mt][2] = pack2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                pa[mt][3] = pack2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
            #pragma unroll
            for (int dd = 0; dd < D / 16; ++dd) {
                u32 bf[4];
                const int ln = lane_now(), mi = ln >> 3;
                const int r = kk * 16 + (mi & 1) * 8 + (ln & 7), c = dd * 16 + (mi >> 1) * 8;
                ldsm_x4_t(bf, smem_u32(cV + swz(r, c)));
                #pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16816(o[mt][2 * dd], pa[mt], bf[0], bf[1]);
                    mma16816(o[mt][2 * dd + 1], pa[mt], bf[2], bf[3]);
                }
            }
        }
    }

    // finish: row sums over the quad, normalise, store
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = lrun[mt][h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const float inv = l == 0.0f ? 1.0f : 1.0f / l;  // l = 0: every logit -inf, weights 0 (PyTorch)
            if (row[mt][h] >= M) continue;
            if (SPLITS > 1) {
                const size_t prow = ((size_t)split * B * H * Sq) + (head0 * Sq + row[mt][h]);
                float* dst = part + prow * D;
                #pragma unroll
                for (int j = 0; j < D / 8; ++j) {
                    dst[j * 8 + 2 * tq] = o[mt][j][2 * h] * inv;
                    dst[j * 8 + 2 * tq + 1] = o[mt][j][2 * h + 1] * inv;
                }
                if (tq == 0) {
                    const float msafe = mrun[mt][h] == -INFINITY ? 0.0f : mrun[mt][h];
                    part_lse[prow] = l == 0.0f ? -INFINITY : msafe + log2f(l);
                }
            } else {
#if STRIDED
                // head and query index recomputed here: kept live through the key loop they cost spills
                const int rq = row[mt][h];
                u16* dst = out + (size_t)b * osb + (size_t)(kvh * G + rq / Sq) * osh + (size_t)(rq % Sq) * oss;
#else
                u16* dst = out + (head0 * Sq + row[mt][h]) * D;
#endif
                #pragma unroll
                for (int j = 0; j < D / 8; ++j)
                    *reinterpret_cast<u32*>(dst + j * 8 + 2 * tq) =
                        pack2(o[mt][j][2 * h] * inv, o[mt][j][2 * h + 1] * inv);
                if (LSE && tq == 0) {  // natural-log log-sum-exp of the row (-inf: all masked)
                    const float msafe = mrun[mt][h] == -INFINITY ? 0.0f : mrun[mt][h];
                    lse[head0 * Sq + row[mt][h]] = l == 0.0f ? -INFINITY : (msafe + log2f(l)) * 0.6931471805599453f;
                }
            }
        }
    }
}
"""

COMBINE = r"""
// one warp per output row: out = sum_s w_s part_s with w_s = exp2(lse_s - max lse) / sum
extern "C" __global__ void __launch_bounds__(256) COMBINE_KERNEL(
        const float* __restrict__ part, const float* __restrict__ part_lse, u16* __restrict__ out,
        float* __restrict__ lse, int rows
#if STRIDED
        , int H, int Sq, long long osb, long long osh, long long oss
#endif
        ) {
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    float mx = -INFINITY;
    for (int s = 0; s < SPLITS; ++s) mx = fmaxf(mx, part_lse[(size_t)s * rows + row]);
    const float msafe = mx == -INFINITY ? 0.0f : mx;
    float acc[D / 32], wsum = 0.0f;
    #pragma unroll
    for (int j = 0; j < D / 32; ++j) acc[j] = 0.0f;
    for (int s = 0; s < SPLITS; ++s) {
        const float w = exp2f(part_lse[(size_t)s * rows + row] - msafe);
        wsum += w;
        const float* p = part + ((size_t)s * rows + row) * D;
        #pragma unroll
        for (int j = 0; j < D / 32; ++j) acc[j] += w * p[j * 32 + lane];
    }
    const float inv = wsum == 0.0f ? 1.0f : 1.0f / wsum;
    if (LSE && lane == 0) lse[row] = wsum == 0.0f ? -INFINITY : (msafe + log2f(wsum)) * 0.6931471805599453f;
#if STRIDED
    u16* dst = out + (size_t)(row / Sq / H) * osb + (size_t)(row / Sq % H) * osh + (size_t)(row % Sq) * oss;
#else
    u16* dst = out + (size_t)row * D;
#endif
    #pragma unroll
    for (int j = 0; j < D / 32; ++j) dst[j * 32 + lane] = TO16(acc[j] * inv);
}
"""


def _defines(spec: FlashSpec) -> str:
    bf = spec.dtype is DType.BF16
    return "\n".join([
        f"#define D {spec.head_dim}", f"#define BM {spec.bm}", f"#define BN {spec.bn}", f"#define WARPS {spec.warps}",
        f"#define CAUSAL {int(spec.causal)}", f"#define MT {spec.mt}", f"#define MASK {spec.mask}", f"#define SPLITS {spec.splits}",
        f"#define LSE {int(spec.lse)}", f"#define MASK_RING {int(spec.ring)}", f"#define MASK_PAD {MASK_PAD}",
        f"#define STRIDED {int(spec.strided)}",
        f'#define MMA_KIND "{"bf16" if bf else "f16"}"',
        f"#define TO16(x) {'f32_to_bf16' if bf else 'f32_to_f16'}(x)",
        f"#define TO32(x) {'bf16_to_f32' if bf else 'f16_to_f32'}(x)",
        "#ifndef INFINITY\n#define INFINITY __int_as_float(0x7f800000)\n#endif",
    ])


def render(spec: FlashSpec, name: str = KERNEL_NAME) -> str:
    """Complete CUDA source of the flash-attention forward kernel ``name`` for ``spec``."""
    spec.check()
    head = (f"// Tracea flash attention forward: {spec.dtype.value} d{spec.head_dim} {spec.bm}x{spec.bn} "
            f"causal={int(spec.causal)} mask={spec.mask} splits={spec.splits} mt={spec.mt} lse={int(spec.lse)} "
            f"mask_ring={int(spec.ring)} strided={int(spec.strided)}\n")
    return head + PRELUDE + _defines(spec) + f"\n#define KERNEL {name}\n" + BODY.replace("@KEY_RANGE@", key_range("BM"))


def render_combine(spec: FlashSpec, name: str = COMBINE_NAME) -> str:
    """CUDA source of the split-KV combine kernel ``name`` (``spec.splits`` partials of ``spec.head_dim``)."""
    return (f"// Tracea flash attention split-KV combine: {spec.dtype.value} d{spec.head_dim} splits={spec.splits} "
            f"strided={int(spec.strided)}\n"
            + PRELUDE + _defines(spec) + f"\n#define COMBINE_KERNEL {name}\n" + COMBINE)
