"""Emitter for the Hopper flash-attention forward (FlashAttention-3 style, ``wgmma`` + TMA, sm_90a).

Block = one producer warpgroup and ``CW`` (1, 2 or 3) consumer warpgroups; ``BM = 64 * CW`` query rows of one
(batch, kv head) against every visible key, ``BN`` keys per tile. ``CTAS`` blocks are meant to be resident per
SM (``__launch_bounds__(NT, CTAS)``: ptxas gives each thread the cap, 65536 / (NT * CTAS) rounded down to 8,
and ``setmaxnreg`` moves the producer's share to the consumers within the CTA's pool): one consumer warpgroup
with two or three blocks per SM serves short sequences, where a block's prologue, first loads and epilogue
are a large part of its time and the other blocks' GEMMs cover them. Thread 0 prefetches the three tensor
maps (``prefetch.tensormap``) before it sets up the barriers.

* The producer's thread 0 loads the Q tile once and then streams K and V tiles (``cp.async.bulk.tensor``
  with 128-byte swizzle, 64-column boxes) into ``ST``-deep rings, K and V on separate ``full`` / ``empty``
  mbarriers so the score GEMM of a tile can start before its V arrived. TMA zero-fills rows past
  ``seq_kv`` (and query rows past the group), so no garbage reaches the sums. It drops to 24 (or 32)
  registers with ``setmaxnreg``; the consumers take the rest.
* Each consumer warpgroup owns 64 query rows. ``S = Q K^T`` is ``D / 16`` ``wgmma.m64n{BN}k16`` with both
  operands in shared memory (K-major); ``O += P V`` is ``BN / 16`` ``wgmma.m64n{D}k16`` with P in registers
  -- the fp32 S accumulator fragment converted in place to 16-bit pairs (the m64nNk16 register-A layout
  of a k16 step is the accumulator layout of two adjacent 8-column blocks) -- and V read MN-major from
  shared memory (the descriptor's transpose bit).
* Intra-warpgroup overlap: tile ``t``'s score GEMM and tile ``t-1``'s ``P V`` are in flight together; the
  softmax of tile ``t`` runs while ``P V`` still computes (``wgmma.wait_group 1``), then ``O`` is rescaled.
  ``OVERLAP`` (two consumer warpgroups by default) ends the softmax's basic block before the
  ``wgmma.wait_group 0`` (see ``softmax_fence``): without it ptxas hoists that wait above the softmax.
* Ping-pong: the consumer warpgroups take turns issuing their GEMMs (named barriers), so one warpgroup's
  softmax overlaps the others' tensor-core work (two or more consumer warpgroups).
* Online softmax in base-2 units (``ex2.approx``; the row max is taken on the raw scores and the positive
  ``scale * log2(e)`` folded into the exponent's FFMA), row max and row sum over the quad of lanes that
  share a row (two ``shfl.xor``).

GQA packing, causal alignment, tile skipping and NaN / Inf behaviour are those of ``flash_attn`` (the
``mma.sync`` kernel): rows ``r`` of a kv head are query ``r % Sq`` of head ``kvh * G + r / Sq``; causal is
top-left aligned, tiles past a block's last visible key are never loaded, only tiles that reach past the
block's first row's diagonal (or past ``seq_kv``) run the mask code. Work items (query blocks x (batch, kv
head) pairs) are numbered on a 1-D grid: causal ones longest first within groups of 8 heads, so the last
items to start are short ones (``LPT``: longest first over all heads; a persistent grid deals pairs of
blocks of one kv head whose lengths sum to about the same, in snake order, see ``Walk``); others
block-fastest. A grid of fewer CTAs than items is persistent: CTA
``b`` runs items ``b, b + grid, ...``, the K / V rings run on across items and the producer loads the next
item's Q (once every consumer's last score GEMM is done: an ``empty Q`` mbarrier) and K / V while the
consumers finish and store the current one. A NaN or +Inf logit makes its row NaN, an all -inf row gives 0.
With ``lse`` not null the epilogue also writes each row's log-sum-exp (natural log, float32): the running
max (base-2 units) plus log2 of the row sum, times ln 2.

``TAIL`` (persistent, non-causal): the whole-item loop stops at ``full`` (a multiple of the grid) and the
items past it -- fewer than a wave, which would leave the other SMs idle -- are cut along the keys: their key
tiles, numbered item by item, in runs of ``trun`` tiles, one per CTA (a run meets at most two items). A
piece runs the same item code over its tiles (the whole-item loop's text is unchanged: the tail is a second
copy of it after the loop, so ptxas schedules the main loop as without the option), then publishes its
normalised O rows and base-2 log-sum-exp as fp32 (``part``, ``part_lse``: two slots per CTA); the last
piece of an item to arrive (an int32 count per tail item, ``arrivals``, which it leaves at zero) reads every
piece back in piece order -- its own too, so the result does not depend on the arrival order -- merges
them with weights ``exp2(lse_p - max)`` and stores. ``EDGE_PV``: an item's last P V runs only the k steps
that hold keys below seq_kv (the rest have P = 0 and V = 0); the choice is a chain of branches over whole
fence..commit groups, since a branch around single wgmma instructions makes ptxas serialise every wgmma of
the kernel (advisory C7519).

``MASK`` (1 boolean: a key takes part where its bit is set; 2 additive: the value is added to the scaled
logit), MB / MH 1 where the mask broadcasts over batch / heads. ``runtime/plan_attention.py`` converts the
user's mask to a packed (MB, MH, seq_q, seq_kv) array of the input dtype; an additive one is read as that,
a boolean one as bits: ``render_mask_bits`` packs it into rows of ``mwords`` 32-bit words (a multiple of 4,
zero past seq_kv) before the main kernel, since at 2 bytes a key the mask's reads from L2 matched K's and
V's and the kernel ran at half its unmasked speed (H100, 4x32/8x2048 D128: 917 vs 524 us). Each consumer
thread reads the mask of its own S fragment -- two rows, per tile ``BN / 32`` words (bits) or ``BN / 4``
pairs of adjacent keys (additive: ``mask_pair``, one 32-bit load per pair where seq_kv is even and the
mask 4-byte aligned, else two 16-bit loads; nothing past seq_kv) -- straight from global memory into
registers, issued for the first tile after its score GEMM and for each next tile as soon as the softmax has
applied the current one's, so they travel for a whole tile; the softmax applies them. Additive values are
divided by ``scale`` and added to the raw score (the row max is taken on raw scores and scaled once). The mask rows of a block's query
heads (GQA packing) come from ``row / Sq`` and ``row % Sq`` like the rows themselves.

``strided`` (``AttentionOp.strides``): q, k and v through 4-D tensor maps (d, seq, head, batch) with the
caller's strides (16-byte multiples), a work item is a query block of one query head (its kv head is
``head / G``; TMA zero-fills rows past ``seq_q``, so a tile never mixes heads) and the epilogue stores
through the output's (batch, head, seq) strides (``LOAD_Q`` / ``LOAD_KV`` / ``OUT_ROW`` in the source).
"""

from __future__ import annotations

from dataclasses import dataclass

from tracea.dtypes import DType
from tracea.errors import UnsupportedConfigError

from .common import PRELUDE
from .wgmma import HOPPER_PTX, wgmma_function

KERNEL_NAME = "tracea_flash_wgmma_fwd"
LOG2E = 1.4426950408889634
MAX_SMEM = 227 * 1024
SM_SMEM = 228 * 1024  # one SM's shared memory, shared by its resident CTAs (each also reserves 1 KB)


@dataclass(frozen=True)
class FlashWgmmaSpec:
    """What one compiled Hopper flash-attention kernel is fixed to."""

    dtype: DType  # F16 or BF16
    head_dim: int  # 64 or 128
    bn: int  # keys per tile (multiple of 16, 64..256)
    cw: int  # consumer warpgroups (64 query rows each): 1, 2 or 3
    stages: int  # depth of the K and V rings (1..4; one: a tile's loads wait for the previous tile's GEMMs)
    causal: bool
    pingpong: bool = True  # consumer warpgroups take turns issuing their GEMMs (named barriers)
    lse: bool = False  # also write each row's log-sum-exp (natural log, float32) to the ``lse`` argument
    overlap: bool = True  # tile t's softmax inside tile t-1's P V (ptxas kept from hoisting the wait above it)
    tail: bool = False  # persistent, not causal: the items past the last whole wave cut along the keys
    edge_pv: bool = False  # not causal: an item's last P V skips the 16-key groups past seq_kv
    strided: bool = False  # q, k, v through 4-D maps (d, seq, head, batch), out through (batch, head, seq) strides
    ctas: int = 1  # CTAs resident per SM (``__launch_bounds__`` minimum blocks; registers and shared memory split)
    ostage: bool = False  # the epilogue stages O in shared memory and stores whole rows (16-byte stores)
    lpt: bool = False  # causal: longest first over all heads; persistent: balanced pairs of blocks, snake-dealt
    mask: int = 0  # 0 none, 1 boolean (packed bits, render_mask_bits), 2 additive (packed, the input dtype)

    @property
    def bm(self) -> int:
        return 64 * self.cw

    @property
    def threads(self) -> int:
        return 128 * (self.cw + 1)

    @property
    def smem_bytes(self) -> int:
        """Q tile, ``stages`` K and V tiles (16-bit), (ostage) the O tile, mbarriers, (tail) a flag word,
        plus 1 KB to align the base to 1024."""
        o_tile = self.bm if self.ostage else 0
        return (2 * self.head_dim * (self.bm + o_tile + 2 * self.stages * self.bn) + 8 * (2 + 4 * self.stages)
                + (16 if self.tail else 0) + 1024)

    @property
    def regs(self) -> tuple[int, int]:
        """``setmaxnreg`` counts (producer, consumers): the CTA's share of the 64K register file (ptxas gives
        each thread the ``__launch_bounds__`` cap, 8-register granules) split over the warpgroups."""
        # the producer keeps 32 with three consumer warpgroups and for the causal longest-first walk (``LPT``:
        # at 24 its item arithmetic spilled)
        prod = 32 if self.cw == 3 or (self.lpt and self.causal) else 24
        cap = min(255, 65536 // (self.threads * self.ctas)) // 8 * 8
        return prod, min(240, (cap * (self.cw + 1) - prod) // self.cw // 8 * 8)

    def check(self) -> None:
        problems = []
        if self.dtype not in (DType.F16, DType.BF16):
            problems.append(f"the wgmma flash kernel runs float16 / bfloat16, not {self.dtype.value}")
        if self.head_dim not in (64, 128):
            problems.append(f"head_dim={self.head_dim}: the wgmma flash kernel is built for 64 and 128")
        if self.bn % 16 or not 64 <= self.bn <= 256:
            problems.append(f"tile_n={self.bn} must be a multiple of 16 in 64..256")
        if self.mask not in (0, 1, 2):
            problems.append(f"mask={self.mask} not in 0..2 (none, boolean, additive)")
        if self.mask == 1 and self.bn % 32:
            problems.append(f"tile_n={self.bn}: a boolean mask's tiles are whole 32-bit words (a multiple of 32)")
        if self.cw not in (1, 2, 3):
            problems.append(f"consumer warpgroups={self.cw} not in 1..3 (tile_m 64 / 128 / 192)")
        if not 1 <= self.stages <= 4:
            problems.append(f"stages={self.stages} not in 1..4")
        if self.pingpong and self.cw < 2:
            problems.append("ping-pong takes turns between two or more consumer warpgroups (tile_m >= 128)")
        if self.ctas not in (1, 2, 3):
            problems.append(f"ctas={self.ctas} CTAs per SM not in 1..3")
        if self.lpt and not self.causal:
            problems.append("lpt orders causal items by length (non-causal items are all alike)")
        if self.tail and self.causal:
            problems.append("the tail split serves non-causal attention (causal items differ in length)")
        # registers per consumer thread: O (D/2) + S (BN/2) + P (BN/4) + ~32 for addresses and row state
        budget = self.regs[1] - 32
        if self.head_dim // 2 + self.bn // 2 + self.bn // 4 > budget:
            problems.append(f"O, S and P need {self.head_dim // 2 + 3 * self.bn // 4} registers per thread, over "
                            f"the {budget} a consumer has with {self.cw} consumer warpgroups")
        if self.smem_bytes > MAX_SMEM:
            problems.append(f"needs {self.smem_bytes} B of shared memory (at most {MAX_SMEM})")
        elif self.ctas * (self.smem_bytes + 1024) > SM_SMEM:
            problems.append(f"{self.ctas} CTAs of {self.smem_bytes} B (+1 KB each reserved) exceed the SM's "
                            f"{SM_SMEM} B of shared memory")
        if problems:
            raise UnsupportedConfigError("; ".join(problems))


BODY = r"""
#define NT (128 * (CW + 1))
#define HEAD_GROUP 8                 // causal schedule: heads whose blocks are ordered together
#define BM (64 * CW)
#define DCH (D / 64)                 // 64-column (128-byte) chunks of a row
#define Q_BYTES (BM * D * 2)
#define KV_BYTES (BN * D * 2)        // one K or V tile
#define CHUNK_Q (BM * 128)           // one 64-column chunk of the Q tile
#define CHUNK_KV (BN * 128)          // one 64-column chunk of a K / V tile

static __device__ __forceinline__ float ex2(float x) {
    float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y;
}
// MASK: the mask values of keys c and c + 1 of mask row r (low, high half); 0 past n (those keys are hidden
// by the seq_kv bound anyway). vec: one 32-bit load (seq_kv even, the mask 4-byte aligned: c is even)
static __device__ __forceinline__ u32 mask_pair(const u16* r, int c, int n, bool vec) {
    if (vec) {
        u32 pair = 0;
        if (c < n) asm volatile("ld.global.nc.b32 %0, [%1];" : "=r"(pair) : "l"(r + c));
        return pair;
    }
    unsigned short a = 0, b = 0;
    if (c < n) asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(a) : "l"(r + c));
    if (c + 1 < n) asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(b) : "l"(r + c + 1));
    return (u32)a | ((u32)b << 16);
}
static __device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r; asm("cvt.rn." CVT_KIND "x2.f32 %0, %2, %1;" : "=r"(r) : "f"(lo), "f"(hi)); return r;
}
// S = Q K^T over the head dim: Q rows of this warpgroup (qa), K tile (ka), both K-major 128B-swizzled
static __device__ __forceinline__ void issue_qk(float* s, u32 qa, u32 ka) {
    wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        wg_qk(s, smem_desc(qa + (kk / 4) * CHUNK_Q + (kk % 4) * 32, 16, 1024),
              smem_desc(ka + (kk / 4) * CHUNK_KV + (kk % 4) * 32, 16, 1024), kk > 0);
    wgmma_commit();
}
// O += P V: P from registers, V tile (va) MN-major: 16 keys = 16 rows of 128 B per k step,
// 64-column chunks CHUNK_KV apart
static __device__ __forceinline__ void issue_pv(float* o, u32 (*p)[4], u32 va) {
    wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) wg_pv(o, p[kk], smem_desc(va + kk * 2048, CHUNK_KV, 1024), 1);
    wgmma_commit();
}

// the last tile's O += P V over its first nk k steps only (EDGE_PV, not causal: the 16-key groups past
// seq_kv hold P = 0 and V = 0, TMA's fill). Each branch is a whole fence..commit group of a fixed length
// (a wgmma under a branch of its own makes ptxas serialise every wgmma of the kernel, advisory C7519).
template <int K> static __device__ __forceinline__ void issue_pv_k(float* o, u32 (*p)[4], u32 va) {
    wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < K; ++kk) wg_pv(o, p[kk], smem_desc(va + kk * 2048, CHUNK_KV, 1024), 1);
    wgmma_commit();
}
// the K-step group for nk (1 <= nk <= BN / 16): K = BN / 16, then down one step per branch
template <int K> static __device__ __forceinline__ void issue_pv_n(float* o, u32 (*p)[4], u32 va, int nk) {
    if constexpr (K > 1) {
        if (nk < K) {
            issue_pv_n<K - 1>(o, p, va, nk);
            return;
        }
    }
    issue_pv_k<K>(o, p, va);
}

// Keeping the softmax of tile t inside tile t-1's P V (the wait for P V after it): ptxas schedules a basic
// block freely and, left alone, hoists the ``wgmma.wait_group 0`` that retires P V above the softmax (the
// arithmetic has no dependence on it), so the softmax never overlapped this warpgroup's own P V. A loop
// that never runs (``n`` is never negative: it is seq_kv) ends the softmax's basic block; its body reads P,
// so P's registers also stay live (not reused as softmax temporaries while P V still reads them). A loop,
// unlike an ``if``, cannot be turned into predicated instructions, which would merge the blocks again.
static __device__ __forceinline__ void softmax_fence(u32 (*p)[4], int n, u32 dst) {
    for (int i = n; i < 0; ++i) {
        #pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" :: "r"(dst + 16 * kk), "r"(p[kk][0]),
                         "r"(p[kk][1]), "r"(p[kk][2]), "r"(p[kk][3]) : "memory");
    }
}

// Ping-pong (PINGPONG): consumer warpgroup w issues its GEMMs only in its turn (named barrier 1 + w: its
// 128 threads sync, the previous warpgroup's 128 arrive), then passes the turn on, so one warpgroup's
// softmax runs while the others' GEMMs occupy the tensor cores.
static __device__ __forceinline__ void turn_wait(int w) {
    if (PINGPONG) asm volatile("bar.sync %0, 256;" :: "r"(1 + w) : "memory");
}
static __device__ __forceinline__ void turn_pass(int w) {
    if (PINGPONG) asm volatile("bar.arrive %0, 256;" :: "r"(1 + w) : "memory");
}

// STRIDED: q, k and v through 4-D tensor maps (d, seq, head, batch) of any (16-byte multiple) strides, the
// output through its (batch, head, seq) element strides; a work item is a query block of one query head
// (tiles never straddle heads: TMA zero-fills rows past seq_q), "bz" then numbers (batch, query head) pairs.
// Otherwise q is packed (batch x kv heads, G x seq_q, d): a block holds rows of the G heads of a kv head.
static __device__ __forceinline__ void tma_load_4d(u32 dst, const TmaDesc* map, u32 bar, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];"
                 :: "r"(dst), "l"(reinterpret_cast<u64>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
// LOAD_Q: 64-column chunk c of the Q tile of rows m0.. of bz; LOAD_KV: chunk c of key tile t of bz's K or
// V; OUT_ROW: the element offset of output row r of bz.
#if STRIDED
#define LOAD_Q(dst, c, m0, bz) tma_load_4d(dst, &tmQ, full_q, (c) * 64, (m0), (bz) % H, (bz) / H)
#define LOAD_KV(dst, map, bar, c, t, bz) tma_load_4d(dst, map, bar, (c) * 64, (t) * BN, ((bz) % H) / G, (bz) / H)
#define OUT_ROW(bz, r) ((size_t)((bz) / H) * osb + (size_t)((bz) % H) * osh + (size_t)(r) * oss)
#else
#define LOAD_Q(dst, c, m0, bz) tma_load_3d(dst, &tmQ, full_q, (c) * 64, (m0), (bz))
#define LOAD_KV(dst, map, bar, c, t, bz) tma_load_3d(dst, map, bar, (c) * 64, (t) * BN, (bz))
#define OUT_ROW(bz, r) (((size_t)(bz) * M + (r)) * D)
#endif

// Work item w = one query block of one (batch, kv head): its first row, head, key tiles, causal bound.
struct Item { int m0, bz, ntiles, i_min; };
static __device__ __forceinline__ Item item_of(int w, int nmb, int nb, int M, int Sq, int Skv) {
    Item it;
    int mb;
    if (CAUSAL && LPT) {
        // longest blocks first over every (batch, kv head): all last row blocks, then the ones before them ...
        mb = nmb - 1 - w / nb;
        it.bz = w % nb;
    } else if (CAUSAL) {
        // longest blocks first within groups of HEAD_GROUP heads (whose K / V stay in L2): the items that
        // start last are short, so no long block runs alone at the end
        const int group = w / (HEAD_GROUP * nmb), within = w % (HEAD_GROUP * nmb);
        const int hg = min(HEAD_GROUP, nb - group * HEAD_GROUP);
        mb = nmb - 1 - within / hg;
        it.bz = group * HEAD_GROUP + within % hg;
    } else {
        mb = w % nmb;
        it.bz = w / nmb;
    }
    it.m0 = mb * BM;
    // visible keys: [0, kend); causal masking needed from key i_min + 1 on
    int kend = Skv;
    it.i_min = 0;
    if (CAUSAL) {
        const int r_first = it.m0, r_last = min(it.m0 + BM, M) - 1;
        const bool one_head = (r_first / Sq) == (r_last / Sq);
        const int i_max = one_head ? r_last % Sq : Sq - 1;
        it.i_min = one_head ? r_first % Sq : 0;
        kend = min(Skv, i_max + 1);
    }
    it.ntiles = kend > 0 ? (kend + BN - 1) / BN : 0;
    return it;
}

// A CTA's walk over its work items (item_of's numbering), in order. Plain: items blockIdx.x, blockIdx.x +
// gridDim.x, ... below ``full``. CAUSAL && LPT on a persistent grid (fewer CTAs than items): the work is dealt
// in units of two blocks of one (batch, kv head) whose causal lengths sum to about the same -- the last block
// and the first, the second last and the second, ... -- numbered pair by pair within a (batch, kv head) and
// (batch, kv head) after (batch, kv head), then (an odd block count) the middle blocks alone; dealt in snake
// order: wave k holds units [k grid, (k + 1) grid), forwards over the CTAs in even waves and backwards in odd
// ones (a partial last wave reversed within itself). A CTA runs a unit's two blocks back to back (the second
// re-reads K / V the first just pulled into L2), neighbouring CTAs run the same kv heads' units together, and
// the CTAs' sums of key tiles even out: the plain deal of the 8-head groups left some CTAs 40% over the
// average on short causal prefills (H100, 128x128: 4x32x512 0.82 -> 0.90x SDPA, 2x32/8x1024 0.87 -> 1.20x).
#if CAUSAL && LPT
struct Walk {
    int k = 0, e = 0;  // wave, element of the current pair
    __device__ __forceinline__ int next(int items, int nmb, int nb) {
        const int grid = gridDim.x, b = blockIdx.x;
        if (grid >= items) return k++ == 0 && b < items ? b : -1;  // one item per CTA
        const int npp = nmb / 2, nfull = npp * nb, units = nfull + (nmb & 1) * nb;
        if (k * grid >= units) return -1;
        const int rem = min(grid, units - k * grid);
        if (b >= rem) return -1;
        const int u = k * grid + ((k & 1) ? rem - 1 - b : b);
        int mb, bz;
        if (u < nfull) {
            bz = u / npp;
            const int j = u - bz * npp;
            mb = e == 0 ? nmb - 1 - j : j;
            k += e;
            e ^= 1;
        } else {
            bz = u - nfull;
            mb = npp;
            ++k;
        }
        return (nmb - 1 - mb) * nb + bz;  // LPT numbering (see item_of)
    }
};
// the loop over a CTA's items (w: item_of's numbering; n counts them)
#define FOR_EACH_ITEM Walk walk; for (int w; (w = walk.next(items, nmb, heads_kv)) >= 0; ++n)
#else
#define FOR_EACH_ITEM for (int w = blockIdx.x; w < full; w += gridDim.x, ++n)
#endif

// TAIL (persistent, non-causal): items [full, items) -- fewer than a wave -- are cut along the keys. Their
// key tiles, numbered item by item (u = j * nt + t for tail item j), are cut into runs of ``trun`` tiles,
// run b = [b trun, (b + 1) trun) for CTA b; a run meets at most two items (trun <= nt), so CTA b's tail
// segment si is item u0 / nt + si's tiles [tb, te) within it, and its partial results go to slot 2 b + si.
struct Seg { int w, tb, te; };
static __device__ __forceinline__ bool seg_of(int si, int full, int items, int nt, int trun, Seg& g) {
    const int T = (items - full) * nt, u0 = blockIdx.x * trun, u1 = min(T, u0 + trun);
    const int j = u0 / nt + si;
    if (u0 >= u1 || j * nt >= u1) return false;
    g.w = full + j;
    g.tb = max(u0 - j * nt, 0);
    g.te = min(u1 - j * nt, nt);
    return true;
}
// the consumer warpgroups only (named barrier CW + 1; 1..CW are the ping-pong turns)
static __device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync %0, %1;" :: "r"(CW + 1), "r"(128 * CW) : "memory");
}
// the 128 threads of consumer warpgroup w (OSTAGE's staged O tile): named barrier CW + 2 + w, or 1 (a
// compile-time id: ptxas reserves all 16 for a run-time one) with one consumer warpgroup and no ping-pong
static __device__ __forceinline__ void wg_sync(int w) {
    if (CW == 1) asm volatile("bar.sync 1, 128;" ::: "memory");
    else asm volatile("bar.sync %0, 128;" :: "r"(CW + 2 + w) : "memory");
}

// 1-D grid; CTA b runs items b, b + gridDim.x, ... below ``full`` (gridDim.x = items: one each; fewer:
// persistent, the producer loads the next item's Q and K / V while the consumers finish and store the
// current one), then (TAIL) its run of the tail's key tiles.
extern "C" __global__ void __launch_bounds__(NT, CTAS) KERNEL(
        const __grid_constant__ TmaDesc tmQ, const __grid_constant__ TmaDesc tmK, const __grid_constant__ TmaDesc tmV,
        u16* __restrict__ out, float* __restrict__ lse, float* __restrict__ part, float* __restrict__ part_lse,
        int* __restrict__ arrivals, const void* __restrict__ mask_in, int full, int trun, int H, int KVH, int Sq, int Skv,
        int heads_kv, float scale_log2, long long osb, long long osh, long long oss, int MB, int MH, int mwords) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const u32 sq = base, sk = sq + Q_BYTES, sv = sk + ST * KV_BYTES;
    const u32 so = sv + ST * KV_BYTES;  // OSTAGE: the O tile (64 rows per consumer warpgroup)
    const u32 bars = so + (OSTAGE ? Q_BYTES : 0);  // full Q, empty Q, full K[ST], full V[ST], empty K[ST], empty V[ST]
    const u32 full_q = bars, empty_q = bars + 8, kvb = bars + 16;
    const int G = H / KVH, M = STRIDED ? Sq : G * Sq;
    const int nmb = (M + BM - 1) / BM, items = nmb * heads_kv;  // heads_kv: batch x kv heads (STRIDED: x heads)
    const int nt = (Skv + BN - 1) / BN;  // key tiles of a non-causal item

    if (threadIdx.x == 0) {
        // fetch the tensor maps while the barriers are set up (a short item's first loads wait on them)
        asm volatile("prefetch.tensormap [%0];" :: "l"(reinterpret_cast<u64>(&tmQ)) : "memory");
        asm volatile("prefetch.tensormap [%0];" :: "l"(reinterpret_cast<u64>(&tmK)) : "memory");
        asm volatile("prefetch.tensormap [%0];" :: "l"(reinterpret_cast<u64>(&tmV)) : "memory");
        mbar_init(full_q, 1);
        mbar_init(empty_q, 4 * CW);
        for (int s = 0; s < ST; ++s) {
            mbar_init(kvb + 8 * s, 1);
            mbar_init(kvb + 8 * (ST + s), 1);
            mbar_init(kvb + 8 * (2 * ST + s), 4 * CW);
            mbar_init(kvb + 8 * (3 * ST + s), 4 * CW);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(PRODUCER_REGS));
        if (threadIdx.x == 0) {
            int kt = 0, n = 0;  // K / V tiles loaded so far (ring position), items so far (Q phase)
            // the Q tile of item w (the n-th of this CTA), once the consumers' last S GEMM of the previous one is done
            auto load_q = [&](int wq, int nq) {
                const Item iq = item_of(wq, nmb, heads_kv, M, Sq, Skv);
                mbar_wait(empty_q, (nq & 1) ^ 1);
                mbar_expect_tx(full_q, Q_BYTES);
                #pragma unroll
                for (int c = 0; c < DCH; ++c) LOAD_Q(sq + c * CHUNK_Q, c, iq.m0, iq.bz);
            };
            // key tile t of (batch, kv head) bz into ring slot kt % ST, K and V each once its slot is free
            auto load_kv = [&](int t, int kt, int bz) {
                const int s = kt % ST;
                const u32 ph = (kt / ST) & 1;
                const u32 fk = kvb + 8 * s, fv = kvb + 8 * (ST + s);
                mbar_wait(kvb + 8 * (2 * ST + s), ph ^ 1);
                mbar_expect_tx(fk, KV_BYTES);
                #pragma unroll
                for (int c = 0; c < DCH; ++c) LOAD_KV(sk + s * KV_BYTES + c * CHUNK_KV, &tmK, fk, c, t, bz);
                mbar_wait(kvb + 8 * (3 * ST + s), ph ^ 1);
                mbar_expect_tx(fv, KV_BYTES);
                #pragma unroll
                for (int c = 0; c < DCH; ++c) LOAD_KV(sv + s * KV_BYTES + c * CHUNK_KV, &tmV, fv, c, t, bz);
            };
            FOR_EACH_ITEM {
                const Item it = item_of(w, nmb, heads_kv, M, Sq, Skv);
                load_q(w, n);
                for (int t = 0; t < it.ntiles; ++t, ++kt) load_kv(t, kt, it.bz);
            }
#if TAIL
            Seg sg;  // then this CTA's run of the tail's key tiles, one segment per item it meets
            for (int si = 0; seg_of(si, full, items, nt, trun, sg); ++si, ++n) {
                load_q(sg.w, n);
                const int bz = item_of(sg.w, nmb, heads_kv, M, Sq, Skv).bz;
                for (int t = sg.tb; t < sg.te; ++t, ++kt) load_kv(t, kt, bz);
            }
#endif
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(CONSUMER_REGS));
        const int cw = wg - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
        const int g = lane >> 2, t4 = lane & 3;
        const u32 qa = sq + cw * 64 * 128;
        const float c = scale_log2;  // scale * log2(e), applied in the exponent
        // MASK: additive values join the raw scores divided by scale; 32-bit pair loads where they are aligned
        const float minv = 1.4426950408889634f / c;
        const u16* mask = static_cast<const u16*>(mask_in);  // MASK 2
        const u32* mbits = static_cast<const u32*>(mask_in);  // MASK 1: rows of mwords words
        const bool mvec = (Skv & 1) == 0 && (reinterpret_cast<u64>(mask) & 3) == 0;
        // OSTAGE: 16-byte stores need a 16-byte aligned output and rows 8 elements apart
        const bool ovec = OSTAGE && (reinterpret_cast<u64>(out) & 15) == 0
                          && (!STRIDED || ((osb | osh | oss) & 7) == 0);
        int kt = 0, n = 0;  // K / V tiles consumed so far (ring position), items so far (Q phase)
// mask (tiles at seq_kv's end or the diagonal), online softmax of tile T in base-2 units: s becomes the
// unnormalised probabilities, alpha the rescale of the rows' earlier sums. The scale is positive (the op
// checks it), so the row max is taken on the raw scores and scaled once; exp2(s * c - m) is one FFMA.
#if MASK
// this tile's mask values (loaded by MASK_LOAD into mk) applied to the raw scores: a boolean 0 hides the key,
// an additive value joins as value / scale
#define MASK_APPLY()                                                                                 \
            _Pragma("unroll")                                                                        \
            for (int i = 0; i < BN / 2; ++i) {                                                       \
                if (MASK == 1) { /* key 8 j + 2 t4 + (i & 1) of the tile, j = i / 4: mk is pre-shifted by 2 t4 */ \
                    const int j = i >> 2;                                                            \
                    if (!((mk[(i >> 1) & 1][j >> 2] >> (8 * (j & 3) + (i & 1))) & 1u)) s[i] = -INFINITY; \
                } else {                                                                             \
                    const float mv = TO32((u16)(mk[(i >> 1) & 1][i >> 2] >> (16 * (i & 1))));       \
                    s[i] = fmaf(mv, minv, s[i]);                                                     \
                }                                                                                    \
            }
// the mask values of key tile T for this thread's two rows (the first tile's issued while its score GEMM
// runs, each next one a tile ahead by MASK_NEXT)
#define MASK_LOAD(T)                                                                                 \
        {                                                                                            \
            const int c0 = (T) * BN + 2 * t4;                                                        \
            _Pragma("unroll")                                                                        \
            for (int h = 0; h < 2; ++h) {                                                            \
                if (MASK == 1) { /* the tile's words, shifted to this thread's first key */         \
                    _Pragma("unroll")                                                                \
                    for (int j = 0; j < BN / 32; ++j)                                                \
                        mk[h][j] = __ldg(brow[h] + (T) * (BN / 32) + j) >> (2 * t4);                 \
                } else {                                                                             \
                    _Pragma("unroll")                                                                \
                    for (int j = 0; j < BN / 8; ++j) mk[h][j] = mask_pair(mrow[h], c0 + 8 * j, Skv, mvec); \
                }                                                                                    \
            }                                                                                        \
        }
// the next tile's values, into the registers just read: they travel for a whole tile
#define MASK_NEXT(T)                                                                                 \
            if ((T) + 1 < mend) MASK_LOAD((T) + 1)
#else
#define MASK_APPLY()
#define MASK_LOAD(T)
#define MASK_NEXT(T)
#endif
#define SOFTMAX(T)                                                                                   \
        {                                                                                            \
            const int n0 = (T) * BN;                                                                 \
            const bool edge = n0 + BN > Skv || (CAUSAL && n0 + BN - 1 > i_min);                      \
            _Pragma("unroll")                                                                        \
            for (int i = 0; i < BN / 2; ++i) {                                                       \
                if (edge && n0 + (i >> 2) * 8 + 2 * t4 + (i & 1) >= klim[(i >> 1) & 1]) s[i] = -INFINITY; \
            }                                                                                        \
            MASK_APPLY()                                                                             \
            MASK_NEXT(T)                                                                             \
            _Pragma("unroll")                                                                        \
            for (int h = 0; h < 2; ++h) {                                                            \
                float mx = -INFINITY;                                                                \
                _Pragma("unroll")                                                                    \
                for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1])); \
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));                                 \
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));                                 \
                const float mnew = fmaxf(mrun[h], mx * c);                                           \
                const float msafe = mnew == -INFINITY ? 0.0f : mnew;                                 \
                alpha[h] = ex2(mrun[h] - msafe);                                                     \
                mrun[h] = mnew;                                                                      \
                float sum = 0.0f;                                                                    \
                _Pragma("unroll")                                                                    \
                for (int j = 0; j < BN / 8; ++j) {                                                   \
                    s[4 * j + 2 * h] = ex2(fmaf(s[4 * j + 2 * h], c, -msafe));                       \
                    s[4 * j + 2 * h + 1] = ex2(fmaf(s[4 * j + 2 * h + 1], c, -msafe));               \
                    sum += s[4 * j + 2 * h] + s[4 * j + 2 * h + 1];                                  \
                }                                                                                    \
                lrun[h] = lrun[h] * alpha[h] + sum;                                                  \
            }                                                                                        \
        }
#define PACK_P()                                                                                     \
        _Pragma("unroll")                                                                            \
        for (int kk = 0; kk < BN / 16; ++kk) {                                                       \
            p[kk][0] = pack2(s[8 * kk], s[8 * kk + 1]);                                              \
            p[kk][1] = pack2(s[8 * kk + 2], s[8 * kk + 3]);                                          \
            p[kk][2] = pack2(s[8 * kk + 4], s[8 * kk + 5]);                                          \
            p[kk][3] = pack2(s[8 * kk + 6], s[8 * kk + 7]);                                          \
        }


        FOR_EACH_ITEM {
        const Item it = item_of(w, nmb, heads_kv, M, Sq, Skv);
        const int t0 = 0, ntiles = it.ntiles, i_min = it.i_min, bz = it.bz;
@ITEM@        // finish: row sums over the quad, normalise, store
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = lrun[h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const float inv = l == 0.0f ? 1.0f : 1.0f / l;  // l = 0: every logit -inf, weights 0 (PyTorch)
            if (row[h] < M) {
                if (LSE && t4 == 0) {
                    const float msafe = mrun[h] == -INFINITY ? 0.0f : mrun[h];
                    lse[(size_t)bz * M + row[h]] = l == 0.0f ? -INFINITY : (msafe + log2f(l)) * 0.6931471805599453f;
                }
                if (OSTAGE && ovec) {
                    // row r of this warpgroup's O tile, 16-byte chunk j at chunk j ^ (r % 8): the 8 rows of a
                    // store instruction land in 8 different bank groups
                    const int r = warp * 16 + g + 8 * h;
                    const u32 dst = so + cw * 64 * D * 2 + r * D * 2 + 4 * t4;
                    #pragma unroll
                    for (int j = 0; j < D / 8; ++j)
                        asm volatile("st.shared.b32 [%0], %1;" :: "r"(dst + 16 * (j ^ (r & 7))),
                                     "r"(pack2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv)) : "memory");
                } else {
                    u16* dst = out + OUT_ROW(bz, row[h]) + 2 * t4;
                    #pragma unroll
                    for (int j = 0; j < D / 8; ++j)
                        asm volatile("st.global.b32 [%0], %1;" :: "l"(dst + 8 * j),
                                     "r"(pack2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv)) : "memory");
                }
            }
        }
        if (OSTAGE && ovec) {
            // whole rows from the staged tile: 16 bytes a thread, a warp's store covers 2 (D128) or 4 rows
            wg_sync(cw);
            const int m_base = it.m0 + cw * 64;
            #pragma unroll
            for (int i = tid; i < 64 * (D / 8); i += 128) {
                const int r = i / (D / 8), j = i % (D / 8);
                if (m_base + r < M) {
                    u32 a, b2, c2, d2;
                    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(b2), "=r"(c2), "=r"(d2)
                                 : "r"(so + cw * 64 * D * 2 + r * D * 2 + 16 * (j ^ (r & 7))) : "memory");
                    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" :: "l"(out + OUT_ROW(bz, m_base + r) + 8 * j),
                                 "r"(a), "r"(b2), "r"(c2), "r"(d2) : "memory");
                }
            }
            wg_sync(cw);  // the tile is read before the next item stages into it
        }
        }
@TAIL@    }
}
"""


# one work item of a consumer warpgroup (the whole-item loop and, with TAIL, the tail pieces run it): the
# S / P V pipeline over the item's key tiles, leaving o, mrun and lrun for the epilogue
ITEM = r"""        int row[2], klim[2];
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            row[h] = it.m0 + cw * 64 + warp * 16 + g + 8 * h;
            const int qi = min(row[h], M - 1) % Sq;
            klim[h] = CAUSAL ? min(Skv, qi + 1) : Skv;  // keys visible to the row: [0, klim)
        }
#if MASK
        // the mask row of each of this thread's rows: (batch, query head, query) of the row
        const u16* mrow[2];
        const u32* brow[2];
        u32 mk[2][MASK == 1 ? BN / 32 : BN / 8];
        const int mend = t0 + ntiles;  // key tiles of this item (or tail piece): [t0, mend)
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int rr = min(row[h], M - 1);
            const int mbat = STRIDED ? bz / H : bz / KVH, mhead = STRIDED ? bz % H : (bz % KVH) * G + rr / Sq;
            const size_t mr = ((size_t)(MB > 1 ? mbat : 0) * MH + (MH > 1 ? mhead : 0)) * Sq + rr % Sq;
            mrow[h] = mask + mr * Skv;
            brow[h] = mbits + mr * mwords;
        }
#endif
        float o[D / 2], s[BN / 2];
        u32 p[BN / 16][4];
        #pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
        float mrun[2] = {-INFINITY, -INFINITY}, lrun[2] = {0.0f, 0.0f};
        mbar_wait(full_q, n & 1);

        if (ntiles > 0) {
            float alpha[2];
            if (PINGPONG && cw == CW - 1) turn_pass(0);  // warpgroup 0 issues first
            mbar_wait(kvb + 8 * (kt % ST), (kt / ST) & 1);
            turn_wait(cw);
            issue_qk(s, qa, sk + (kt % ST) * KV_BYTES);
            turn_pass((cw + 1) % CW);
            MASK_LOAD(t0)
            wgmma_wait<0>();
            #pragma unroll
            for (int i = 0; i < BN / 2; ++i) fence_acc(s[i]);
            if (lane == 0) mbar_arrive(kvb + 8 * (2 * ST + kt % ST));
            SOFTMAX(0)
            PACK_P()
            for (int t = 1; t < ntiles; ++t) {
                const int kc = kt + t, st = kc % ST, sp = (kc - 1) % ST;
                mbar_wait(kvb + 8 * st, (kc / ST) & 1);
                turn_wait(cw);
                issue_qk(s, qa, sk + st * KV_BYTES);                  // S of tile t ...
                mbar_wait(kvb + 8 * (ST + sp), ((kc - 1) / ST) & 1);
                issue_pv(o, p, sv + sp * KV_BYTES);                   // ... while P V of tile t-1 runs
                turn_pass((cw + 1) % CW);
                wgmma_wait<1>();
                #pragma unroll
                for (int i = 0; i < BN / 2; ++i) fence_acc(s[i]);
                if (lane == 0) mbar_arrive(kvb + 8 * (2 * ST + st));
                SOFTMAX(t)
                if (OVERLAP) softmax_fence(p, Skv, sq);
                wgmma_wait<0>();
                #pragma unroll
                for (int i = 0; i < D / 2; ++i) fence_acc(o[i]);
                if (lane == 0) mbar_arrive(kvb + 8 * (3 * ST + sp));
                #pragma unroll
                for (int i = 0; i < D / 2; ++i) o[i] *= alpha[(i >> 1) & 1];
                PACK_P()
            }
            if (lane == 0) mbar_arrive(empty_q);  // every S GEMM of this item is done: Q may be reloaded
            const int kl = kt + ntiles - 1, sl = kl % ST;
            mbar_wait(kvb + 8 * (ST + sl), (kl / ST) & 1);
            turn_wait(cw);
            if (EDGE_PV && !CAUSAL) issue_pv_n<BN / 16>(o, p, sv + sl * KV_BYTES, (Skv - (t0 + ntiles - 1) * BN + 15) / 16);
            else issue_pv(o, p, sv + sl * KV_BYTES);
            if (cw != CW - 1) turn_pass(cw + 1);  // the last warpgroup's last turn is passed to nobody
            wgmma_wait<0>();
            #pragma unroll
            for (int i = 0; i < D / 2; ++i) fence_acc(o[i]);
            if (lane == 0) mbar_arrive(kvb + 8 * (3 * ST + sl));  // the ring goes on into the next item
        } else if (lane == 0) {
            mbar_arrive(empty_q);
        }
        kt += ntiles;
"""

TAIL_ITEMS = r"""#if TAIL
        // the tail: this CTA's run of key tiles, one piece per item it meets
        const u32 flag_at = bars + 8 * (2 + 4 * ST);  // is this piece the item's last (one int)
        volatile int* last_flag = reinterpret_cast<volatile int*>(smem_raw + (flag_at - smem_u32(smem_raw)));
        Seg sg;
        for (int si = 0; seg_of(si, full, items, nt, trun, sg); ++si, ++n) {
        const Item it = item_of(sg.w, nmb, heads_kv, M, Sq, Skv);
        const int t0 = sg.tb, ntiles = sg.te - sg.tb, i_min = it.i_min, bz = it.bz;
@ITEM_TAIL@        // row sums over the quad; inv2 = 1 / sum, l2 = the row's base-2 log-sum-exp over this piece's keys
        float inv2[2], l2[2];
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = lrun[h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            inv2[h] = l == 0.0f ? 1.0f : 1.0f / l;
            l2[h] = l == 0.0f ? -INFINITY : (mrun[h] == -INFINITY ? 0.0f : mrun[h]) + log2f(l);
        }
        // tail item j's pieces: the runs of CTAs first..last (one CTA: its run holds the whole item)
        const int j = sg.w - full, first = j * nt / trun, last = ((j + 1) * nt - 1) / trun, slot = 2 * blockIdx.x + si;
        if (first != last) {
            // publish the normalised O rows and base-2 log-sum-exps; the last piece to arrive merges every
            // piece (weights exp2(lse_p - max)), stores, and leaves the item's arrival count at 0
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = cw * 64 + warp * 16 + g + 8 * h;  // the row within the block
                float* dst = part + ((size_t)slot * BM + r) * D + 2 * t4;
                #pragma unroll
                for (int jj = 0; jj < D / 8; ++jj)
                    __stcg(reinterpret_cast<float2*>(dst + 8 * jj),
                           make_float2(o[4 * jj + 2 * h] * inv2[h], o[4 * jj + 2 * h + 1] * inv2[h]));
                if (t4 == 0) __stcg(part_lse + (size_t)slot * BM + r, l2[h]);
            }
            __threadfence();
            consumers_sync();
            if (threadIdx.x == 128) {
                const int is_last = atomicAdd(arrivals + j, 1) == last - first;
                if (is_last) arrivals[j] = 0;
                *last_flag = is_last;
            }
            consumers_sync();
            if (!*last_flag) continue;
            __threadfence();
            // every piece read back in piece order (this one's too), so the sums do not depend on which
            // piece arrived last: repeated launches give the same bits
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = cw * 64 + warp * 16 + g + 8 * h;
                float mx = -INFINITY;
                for (int bb = first; bb <= last; ++bb) {
                    const int sb = 2 * bb + j - bb * trun / nt;  // CTA bb's slot for item j
                    mx = fmaxf(mx, __ldcg(part_lse + (size_t)sb * BM + r));
                }
                const float msafe = mx == -INFINITY ? 0.0f : mx;
                float wsum = 0.0f;
                #pragma unroll
                for (int jj = 0; jj < D / 8; ++jj) {
                    o[4 * jj + 2 * h] = 0.0f;
                    o[4 * jj + 2 * h + 1] = 0.0f;
                }
                for (int bb = first; bb <= last; ++bb) {
                    const int sb = 2 * bb + j - bb * trun / nt;
                    const float wb = exp2f(__ldcg(part_lse + (size_t)sb * BM + r) - msafe);
                    wsum += wb;
                    const float* src = part + ((size_t)sb * BM + r) * D + 2 * t4;
                    #pragma unroll
                    for (int jj = 0; jj < D / 8; ++jj) {
                        const float2 x = __ldcg(reinterpret_cast<const float2*>(src + 8 * jj));
                        o[4 * jj + 2 * h] += wb * x.x;
                        o[4 * jj + 2 * h + 1] += wb * x.y;
                    }
                }
                inv2[h] = wsum == 0.0f ? 1.0f : 1.0f / wsum;
                l2[h] = wsum == 0.0f ? -INFINITY : msafe + log2f(wsum);
            }
        }
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            if (row[h] < M) {
                if (LSE && t4 == 0) lse[(size_t)bz * M + row[h]] = l2[h] * 0.6931471805599453f;
                u16* dst = out + OUT_ROW(bz, row[h]) + 2 * t4;
                #pragma unroll
                for (int jj = 0; jj < D / 8; ++jj)
                    asm volatile("st.global.b32 [%0], %1;" :: "l"(dst + 8 * jj),
                                 "r"(pack2(o[4 * jj + 2 * h] * inv2[h], o[4 * jj + 2 * h + 1] * inv2[h])) : "memory");
            }
        }
        }
#endif
"""

MASK_BITS_NAME = "tracea_mask_bits"
MASK_BITS_THREADS = 256

MASK_BITS = r"""
// A boolean mask, converted to 16-bit values (rows of n, non-zero = keep), as bits: word w of a row holds keys
// 32 w .. 32 w + 31 (bit i = key 32 w + i), rows of ``words`` words, zero past n. One warp per 32 words of one
// row: lane l reads key 32 s + l of word s for s = 0..31 (64 contiguous bytes a load), a ballot gathers word s
// and lane s stores it.
extern "C" __global__ void __launch_bounds__(256) tracea_mask_bits(const u16* __restrict__ m, u32* __restrict__ bits,
                                                                  int rows, int n, int words) {
    const int lane = threadIdx.x & 31;
    const long long gw = (long long)blockIdx.x * 8 + threadIdx.x / 32;
    const int chunks = (words + 31) / 32;
    if (gw >= (long long)rows * chunks) return;
    const int r = (int)(gw / chunks), w0 = (int)(gw % chunks) * 32;
    const u16* row = m + (size_t)r * n;
    u32 mine = 0;
    #pragma unroll 4
    for (int s = 0; s < 32; ++s) {
        const int key = (w0 + s) * 32 + lane;
        const bool keep = key < n && (row[key] & 0x7fffu) != 0;  // +-0 hides the key
        const u32 b = __ballot_sync(0xffffffffu, keep);
        if (lane == s) mine = b;
    }
    if (w0 + lane < words) bits[(size_t)r * words + w0 + lane] = mine;
}
"""


def mask_words(seq_kv: int) -> int:
    """32-bit words per row of a boolean mask's bits (``render_mask_bits``): the keys' words, rounded up
    to a multiple of 4 (16-byte rows)."""
    return -(-seq_kv // 128) * 4


def render_mask_bits() -> str:
    """CUDA source of ``tracea_mask_bits``: one warp per 32 words of a row, 8 warps a block."""
    return PRELUDE + MASK_BITS


def _defines(spec: FlashWgmmaSpec) -> str:
    bf = spec.dtype is DType.BF16
    prod, cons = spec.regs
    return "\n".join([
        f"#define D {spec.head_dim}", f"#define BN {spec.bn}", f"#define CW {spec.cw}", f"#define ST {spec.stages}",
        f"#define CAUSAL {int(spec.causal)}", f"#define PINGPONG {int(spec.pingpong)}", f"#define LSE {int(spec.lse)}",
        f"#define OVERLAP {int(spec.overlap)}", f"#define TAIL {int(spec.tail)}", f"#define EDGE_PV {int(spec.edge_pv)}",
        f"#define STRIDED {int(spec.strided)}", f"#define CTAS {spec.ctas}",         f"#define OSTAGE {int(spec.ostage)}", f"#define LPT {int(spec.lpt)}",
        f"#define MASK {spec.mask}", f"#define TO32(x) {'bf16_to_f32' if bf else 'f16_to_f32'}(x)",
        f"#define PRODUCER_REGS {prod}", f"#define CONSUMER_REGS {cons}",
        f'#define CVT_KIND "{"bf16" if bf else "f16"}"',
        "#ifndef INFINITY\n#define INFINITY __int_as_float(0x7f800000)\n#endif",
    ])


def render(spec: FlashWgmmaSpec, name: str = KERNEL_NAME) -> str:
    """Complete CUDA source (sm_90a) of the Hopper flash-attention forward kernel ``name`` for ``spec``."""
    spec.check()
    kind = "bf16" if spec.dtype is DType.BF16 else "f16"
    head = (f"// Tracea flash attention forward (wgmma): {spec.dtype.value} d{spec.head_dim} {spec.bm}x{spec.bn} "
            f"stages={spec.stages} causal={int(spec.causal)} pingpong={int(spec.pingpong)} lse={int(spec.lse)} "
            f"overlap={int(spec.overlap)} tail={int(spec.tail)} edge_pv={int(spec.edge_pv)} strided={int(spec.strided)} "
            f"ctas={spec.ctas} ostage={int(spec.ostage)} lpt={int(spec.lpt)} mask={spec.mask}\n")
    mmas = (wgmma_function("wg_qk", spec.bn, kind) + wgmma_function("wg_pv", spec.head_dim, kind, a_regs=True,
                                                                      trans_b=1))
    tail = "" if not spec.tail else TAIL_ITEMS.replace(
        "@ITEM_TAIL@", ITEM.replace("SOFTMAX(0)", "SOFTMAX(t0)").replace("SOFTMAX(t)", "SOFTMAX(t0 + t)"))
    body = BODY.replace("@ITEM@", ITEM).replace("@TAIL@", tail)
    return head + PRELUDE + HOPPER_PTX + _defines(spec) + f"\n#define KERNEL {name}\n" + mmas + body
