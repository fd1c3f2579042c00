"""Emitter (L5) for the Hopper GEMM: ``wgmma`` (sm_90a) fed by TMA with 128-byte swizzle, an mbarrier
producer/consumer pipeline, warp specialisation (one producer warpgroup, two consumer warpgroups,
``setmaxnreg``) and a persistent grid walking tiles in grouped (L2-friendly) order.

Block = 3 warpgroups (384 threads). The producer's elected thread issues TMA loads of the A tile
(tile_m x 64) and the B tile (64 x tile_n) into stage ``s`` and arms ``full[s]`` with the byte count;
each consumer warpgroup owns 64 rows of the tile, waits ``full[s]``, issues four
``wgmma.m64nNk16`` over the stage, and once they completed releases the stage through ``empty[s]``.
TMA zero-fills out-of-bounds boxes, so any M, N, K works; stores are predicated. The epilogue chain
runs on the fp32 accumulators in registers before the store.

TF32 wgmma reads shared-memory operands K-major only. An MN-major fp32 A tile is therefore read by the
consumers into registers (``ld.shared.v2``, conflict-free on the 128B-swizzled tile) and fed to wgmma's
register-A form; a caller whose B is MN-major swaps the operands and asks for a column-major output
(``out_cm``: the kernel computes C^T = B^T A^T), so neither case needs a transpose pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracea.dtypes import DType
from tracea.errors import UnsupportedConfigError
from tracea.ir.epilogue import Epilogue

from . import im2col
from .common import PRELUDE, ctype, epilogue_function, load_expr, pair_epilogue_function, store_expr
from .operands import StoreMap
from .wgmma_epilogues import DEFER_CHUNK, DIRECT, STAGED, STASH, TRANSPOSED, TRANSPOSED_ROWS, deferred_split
from .wgmma_stream_k import SK_FIXUP, SK_UNIT, SPLIT_FIXUP, SPLIT_UNIT

KERNEL_NAME = "tracea_wgmma_kernel"
BK = 64  # 64 16-bit elements = one 128-byte swizzle row
EPI_ROWS, EPI_BYTES = 16, 2304  # per-warp epilogue staging: 16 rows x (128 B + 16 B pad)
BIAS_BYTES = 256 * 4  # per consumer warpgroup: the tile's bias as fp32 (at most 256 columns)


@dataclass(frozen=True)
class WgmmaSpec:
    """What the Hopper kernel source depends on.

    :param a_kmajor: A stored (M, K) (else (K, M): MN-major, transposed by wgmma).
    :param b_kmajor: B stored (N, K) (else (K, N): MN-major).
    :param bn: tile_n: a multiple of 16 in 16..256 with a K-major B (64 / 128 / 192 / 256 with an MN-major B,
        loaded in 64-column boxes; 64 / 128 / 256 for the conv); tile_m is 128 or 256 (coop) / 64 or 128 (pingpong).
    """

    dtype_in: DType
    dtype_out: DType
    bias_dtype: DType
    epilogue: Epilogue
    a_kmajor: bool
    b_kmajor: bool
    pairs: bool
    vec_store: bool = False
    narrow_store: int = 0  # staged epilogue without vec_store: rows 8- or 4-byte aligned, 16-byte runs stored in pieces
    bn: int = 256
    stages: int = 4
    group_m: int = 8
    bm: int = 128
    schedule: str = "coop"
    smem_epilogue: bool = True
    split_acc: bool = False  # accumulate in fresh partial sums, added with FADD (fp32 accuracy)
    partial_stages: int = 1  # stages per partial sum when split_acc
    conv: im2col.ConvGather | None = None  # implicit-GEMM conv: A gathered from the NHWC input
    store: StoreMap | None = None  # direct-epilogue store map (default row-major); NCHW conv output
    cluster: int = 1  # CTAs per cluster along M sharing the B tile through TMA multicast (1 or 2)
    out_cm: bool = False  # C stored column-major (ldc = M): the caller swapped A and B to get C^T
    stream_k: bool = False  # the last partial wave's tiles split along K over every CTA (fixup in fp32)
    defer: bool = False  # 16-bit output: the activation and the store of tile j run during tile j+1's mainloop
    split_k: bool = False  # every tile's K cut into slices (count given at launch), partial sums added in-kernel
    a_bcast: bool = False  # one A for every batch entry (its TMA loads use batch coordinate 0): W @ X[b]
    row_bias: bool = False  # the bias is a length-M vector added along the rows (bias[row]), not the columns
    b_bcast: bool = False  # one B for every batch entry (its TMA loads use batch coordinate 0): X[b] @ W
    cm_bias_cols: bool = False  # out_cm with a register-fed A: the bias along C's columns (else along its rows)


    threads = 384

    @property
    def subs(self) -> int:
        """64-row wgmma sub-tiles each consumer computes: 1 (coop: the tile is split) or bm/64 (pingpong)."""
        return self.bm // 128 if self.schedule == "coop" else self.bm // 64

    @property
    def a_regs(self) -> bool:
        """A is an MN-major fp32 tile: the consumers load it into registers (wgmma's register-A form)."""
        return self.dtype_in.storage is DType.F32 and not self.a_kmajor

    @property
    def stage_bytes(self) -> int:
        return (self.bm + self.bn) * BK * 2

    @property
    def epi_bytes(self) -> int:
        """Per-warp epilogue buffer: a 16-row staging pass, or with ``defer`` the warp's whole tile slice."""
        return 16 * self.subs * (self.bn * 2 + 16) if self.defer else EPI_BYTES

    @property
    def smem_bytes(self) -> int:
        return self.stages * self.stage_bytes + 1024 + 2 * 8 * self.stages + 16 + 128 + 8 * self.epi_bytes + 2 * BIAS_BYTES

    def check(self) -> None:
        problems = []
        if self.dtype_in.storage not in (DType.F16, DType.BF16, DType.F32):
            problems.append("the wgmma kernel serves float16/bfloat16 (and float32 as TF32) inputs")
        if self.dtype_in.storage is DType.F32 and not self.b_kmajor:
            problems.append("TF32 wgmma reads B K-major only (swap the operands for C^T, or transpose B first)")
        if (self.a_regs or self.out_cm) and (self.smem_epilogue or self.store is not None or self.conv is not None):
            problems.append("a register-fed A and a column-major C use the direct GEMM epilogue (smem_epilogue=False)")
        if self.schedule not in ("coop", "pingpong"):
            problems.append(f"schedule {self.schedule!r} not in coop/pingpong")
        if self.schedule == "coop" and (self.bm not in (128, 256) or self.subs * self.bn // 2 > 128):
            problems.append("coop schedule needs tile_m in 128/256 (split over two consumer warpgroups) and at "
                            "most 128 accumulators per thread")
        if self.schedule == "pingpong" and (self.bm not in (64, 128) or self.bm * self.bn // 128 > 128):
            problems.append("pingpong schedule needs tile_m in 64/128 and at most 128 accumulators per thread")
        if self.split_acc and self.subs * self.bn // 2 > 64:
            problems.append("split accumulation needs at most 64 accumulators per thread (x2 for the partial sum)")
        if self.conv is not None and self.bn not in (64, 128, 256):
            problems.append(f"tile_n={self.bn} not in 64/128/256 (conv)")
        elif not self.b_kmajor and self.bn not in (64, 128, 192, 256):
            problems.append(f"tile_n={self.bn} not in 64/128/192/256 (an MN-major B is loaded in 64-column boxes)")
        elif self.bn % 16 or not 16 <= self.bn <= 256:
            problems.append(f"tile_n={self.bn} is not a multiple of 16 in 16..256")
        if not 2 <= self.stages <= 8:
            problems.append(f"stages={self.stages} not in 2..8")
        if self.conv is not None and (self.bm not in (64, 128) or not (self.a_kmajor and self.b_kmajor)):
            problems.append("the conv gather serves tile_m 64/128 with K-major operands")
        if self.cluster not in (1, 2):
            problems.append(f"cluster={self.cluster} not in 1/2")
        if self.cluster == 2 and (self.conv is not None or self.bn < 128):
            problems.append("2-CTA clusters serve GEMMs with tile_n >= 128 (each CTA multicasts half of B)")
        if self.stream_k and (self.schedule != "coop" or self.cluster != 1 or self.conv is not None
                              or self.split_acc):
            problems.append("stream-K serves the coop schedule without clusters, conv gathers or split accumulation")
        if self.split_k and (self.schedule != "coop" or self.cluster != 1
                             or self.split_acc or self.stream_k or self.defer):
            problems.append("split-K serves the coop schedule without clusters, split accumulation, "
                            "stream-K or the deferred epilogue")
        if self.defer and (self.schedule != "coop" or not self.smem_epilogue or self.split_acc
                           or self.conv is not None or self.out_cm
                           or self.dtype_out.storage not in (DType.BF16, DType.F16)):
            problems.append("a deferred epilogue serves coop GEMMs with a 16-bit (bfloat16/float16) output and the "
                            "staged epilogue, without split accumulation")
        if self.row_bias and (self.out_cm or self.defer or self.a_regs):
            problems.append("a row bias serves the row-major staged and direct epilogues (no out_cm, defer or "
                            "register-fed A)")
        if self.narrow_store not in (0, 4, 8):
            problems.append(f"narrow_store={self.narrow_store} not in 0/4/8 bytes")
        if self.cm_bias_cols and not (self.out_cm and self.a_regs):
            problems.append("cm_bias_cols serves the column-major epilogue of a register-fed A")
        if self.store is not None and self.store.kind != "rowmajor" and self.smem_epilogue:
            problems.append(f"{self.store.kind} output needs the direct epilogue (smem_epilogue=False)")
        if problems:
            raise UnsupportedConfigError("; ".join(problems))


def wgmma_function(name: str, n: int, kind: str, a_regs: bool = False, trans_a: int = 0, trans_b: int = 0) -> str:
    """A ``static __device__`` wrapper ``name(float* d, ..., int scale_d)`` around one
    ``wgmma.mma_async m64n{n}k16`` of 16-bit inputs (``kind`` bf16 / f16) with fp32 accumulators ``d[n/2]``.

    Shared-memory A: ``name(d, u64 desc_a, u64 desc_b, scale_d)``; register A (``a_regs``: the
    four 32-bit A fragment registers of m64nNk16, the accumulator layout of two adjacent 8-column
    blocks): ``name(d, const u32* a, u64 desc_b, scale_d)``. ``trans_a`` / ``trans_b``: 1 reads that
    operand MN-major (16-bit types only; register A has no transpose)."""
    regs = n // 2
    outs = ", ".join(f"%{i}" for i in range(regs))
    cons = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    shape = f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{kind}.{kind}"
    if a_regs:
        return f"""
static __device__ __forceinline__ void {name}(float* d, const u32* a, u64 db, int scale_d) {{
    asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{regs + 5}, 0;\\n"
                 "{shape} {{{outs}}}, {{%{regs}, %{regs + 1}, %{regs + 2}, %{regs + 3}}}, %{regs + 4}, p, 1, 1, {trans_b}; }}"
                 : {cons}
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}}
"""
    return f"""
static __device__ __forceinline__ void {name}(float* d, u64 da, u64 db, int scale_d) {{
    asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{regs + 2}, 0;\\n"
                 "{shape} {{{outs}}}, %{regs}, %{regs + 1}, p, 1, 1, {trans_a}, {trans_b}; }}"
                 : {cons}
                 : "l"(da), "l"(db), "r"(scale_d));
}}
"""


def _wgmma_call(spec: WgmmaSpec) -> str:
    n = spec.bn
    regs = n // 2
    ta, tb = (0 if spec.a_kmajor else 1), (0 if spec.b_kmajor else 1)
    kind = {DType.BF16: "bf16", DType.F16: "f16", DType.F32: "tf32"}[spec.dtype_in.storage]
    kdim, trans = (8, "") if kind == "tf32" else (16, f", {ta}, {tb}")
    outs = ", ".join(f"%{i}" for i in range(regs))
    cons = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    ss = f"""
static __device__ __forceinline__ void wgmma_tile(float* d, u64 da, u64 db, int scale_d) {{
    asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{regs + 2}, 0;\\n"
                 "wgmma.mma_async.sync.aligned.m64n{n}k{kdim}.f32.{kind}.{kind} {{{outs}}}, %{regs}, %{regs + 1}, p, 1, 1{trans}; }}"
                 : {cons}
                 : "l"(da), "l"(db), "r"(scale_d));
}}
"""
    if kind != "tf32":
        return ss
    return ss + f"""// Register-A form (TF32): a[0..3] = A(g, t4), A(g+8, t4), A(g, t4+4), A(g+8, t4+4) of the warp's 16 rows.
static __device__ __forceinline__ void wgmma_tile_rs(float* d, const u32* a, u64 db, int scale_d) {{
    asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{regs + 5}, 0;\\n"
                 "wgmma.mma_async.sync.aligned.m64n{n}k{kdim}.f32.{kind}.{kind} {{{outs}}}, "
                 "{{%{regs}, %{regs + 1}, %{regs + 2}, %{regs + 3}}}, %{regs + 4}, p, 1, 1; }}"
                 : {cons}
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}}
"""


#: PTX helpers every Hopper kernel shares: mbarriers, TMA loads, shared-memory descriptors, wgmma
#: fence / commit / wait, accumulator pins (also used by ``flash_wgmma``).
HOPPER_PTX = r"""
struct __align__(64) TmaDesc { u64 v[16]; };

static __device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count));
}
static __device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
static __device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
// A long wait (a consumer waiting for its ping-pong turn) backs off so its spinning does not steal
// issue slots from the warpgroup that is issuing wgmma on the same SM sub-partitions.
static __device__ __forceinline__ void mbar_wait_sleepy(u32 bar, u32 parity) {
    u32 done;
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    while (!done) {
        __nanosleep(256);
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    }
}
static __device__ __forceinline__ void tma_load_3d(u32 dst, const TmaDesc* map, u32 bar, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];"
                 :: "r"(dst), "l"(reinterpret_cast<u64>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
static __device__ __forceinline__ void tma_load_3d_mc(u32 dst, const TmaDesc* map, u32 bar, int c0, int c1, int c2,
                                                      unsigned short mask) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%3, %4, %5}], [%2], %6;"
                 :: "r"(dst), "l"(reinterpret_cast<u64>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "h"(mask) : "memory");
}
static __device__ __forceinline__ u32 cluster_rank() {
    u32 r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r;
}
static __device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}
// Arrive on the mbarrier at the same shared-memory offset in CTA ``cta`` of the cluster.
static __device__ __forceinline__ void mbar_arrive_remote(u32 bar, u32 cta) {
    asm volatile("{ .reg .b32 ra; mapa.shared::cluster.u32 ra, %0, %1; mbarrier.arrive.shared::cluster.b64 _, [ra]; }"
                 :: "r"(bar), "r"(cta) : "memory");
}
static __device__ __forceinline__ u64 smem_desc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) | (1ull << 62);
}
// Pins an accumulator register in place: keeps the compiler from moving reads of wgmma results across
// wgmma.wait_group (otherwise ptxas serialises every wgmma, warning C7514).
static __device__ __forceinline__ void fence_acc(float& r) { asm volatile("" : "+f"(r) :: "memory"); }
// Barrier `id` over one consumer warpgroup (128 threads); id 0 is __syncthreads.
static __device__ __forceinline__ void named_bar_sync(int id) {
    asm volatile("bar.sync %0, 128;" :: "r"(id) : "memory");
}
static __device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> static __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
"""


def render(spec: WgmmaSpec, name: str = KERNEL_NAME) -> str:
    """CUDA C++ (sm_90a) source of the warp-specialised persistent wgmma GEMM."""
    spec.check()
    tin, tout, tb = ctype(spec.dtype_in), ctype(spec.dtype_out), ctype(spec.bias_dtype)
    bm, bn, st, cm = spec.bm, spec.bn, spec.stages, spec.cluster
    a_bytes, b_bytes = bm * BK * 2, bn * BK * 2
    bk = 128 // spec.dtype_in.itemsize   # K elements per stage: one 128-byte swizzle row
    # A tile in smem: K-major = [bm rows][bk k] (one TMA box); MN-major = boxes of [bk k][mnb m] (128 B rows).
    mnb, box_bytes = bk, 128 * bk  # an MN-major box row is the same 128 bytes: bk elements of m (or n)
    sub_bytes = 64 // mnb * box_bytes  # a 64-row sub-tile of an MN-major tile
    # batch coordinate of each operand's loads: the tile's batch entry, or 0 for an operand shared by all
    a_batch, b_batch = ("0" if spec.a_bcast else "bz"), ("0" if spec.b_bcast else "bz")
    if spec.a_kmajor:
        a_loads = f"tma_load_3d(sa, &tmA, full, kt * BKE, m0, {a_batch});"
        a_desc = "smem_desc(a_s + ROWOFF * 128 + kk * 32, 16, 1024)"
    else:
        a_loads = (f"for (int c = 0; c < {bm // mnb}; ++c) tma_load_3d(sa + c * {box_bytes}, &tmA, full, "
                   f"m0 + c * {mnb}, kt * BKE, {a_batch});")
        a_desc = "smem_desc(a_s + ROWOFF * 128 + kk * 2048, 8192, 1024)"
    if spec.b_kmajor:
        b_loads = f"tma_load_3d(sb, &tmB, full, kt * BKE, n0, {b_batch});"
        b_desc = "smem_desc(b_s + kk * 32, 16, 1024)"
    else:
        b_loads = (f"for (int c = 0; c < {bn // mnb}; ++c) tma_load_3d(sb + c * {box_bytes}, &tmB, full, "
                   f"n0 + c * {mnb}, kt * BKE, {b_batch});")
        b_desc = "smem_desc(b_s + kk * 2048, 8192, 1024)"
    regs = bn // 2
    if spec.cluster == 2 and spec.b_kmajor:  # each CTA multicasts its half of B to both
        b_loads = (f"tma_load_3d_mc(sb + crank * {bn // 2 * 128}, &tmB, full, kt * BKE, n0 + crank * {bn // 2}, {b_batch}, "
                   f"(unsigned short)3);")
    elif spec.cluster == 2:
        b_loads = (f"for (int c = crank; c < {bn // 64}; c += 2) tma_load_3d_mc(sb + c * 8192, &tmB, full, "
                   f"n0 + c * 64, kt * BKE, {b_batch}, (unsigned short)3);")
    a_loads, b_loads = a_loads.replace("BKE", str(bk)), b_loads.replace("BKE", str(bk))
    coop = spec.schedule == "coop"
    subs = spec.subs
    first, step = ("0", "1") if coop else ("wg", "2")
    rowbase = f"(wg * {bm // 2} + sub * 64)" if coop else "(sub * 64)"
    a_desc = a_desc.replace("ROWOFF", rowbase)
    empty_count = 8 if coop else 4
    out_size = spec.dtype_out.itemsize
    cc_cols = 128 // out_size            # columns staged per pass (one 128-byte row segment)
    ld = cc_cols + 16 // out_size        # padded smem row
    vec = 16 // out_size
    c0, c1 = store_expr(spec.dtype_out, "v0"), store_expr(spec.dtype_out, "v1")
    # One asm store per pair: plain C++ stores here let ptxas serialise the wgmma pipeline (C7514).
    # A GELU(tanh) chain with a 16-bit output runs per pair (epi_pair, bias pre-scaled by its bias_scale).
    x0, x1 = (f"{'acc' if spec.split_acc else 'd'}[sub][4 * j2 + 2 * h + {e}]" for e in (0, 1))
    pair_fn = pair_epilogue_function(spec.epilogue, spec.dtype_out) if spec.smem_epilogue and not (spec.out_cm or spec.defer) else None
    pair_src, bias_scale = pair_fn or ("", 1.0)
    values = (f"const float v0 = apply_epilogue_b({x0}, b0), v1 = apply_epilogue_b({x1}, b1);\n"
              f"                        ")
    if pair_fn is not None:
        smem_pair = f'asm volatile("st.shared.u32 [%0], %1;" :: "r"(smem_u32(e)), "r"(epi_pair({x0}, {x1}, b0, b1)));'
    elif out_size == 4:
        smem_pair = values + 'asm volatile("st.shared.v2.f32 [%0], {%1,%2};" :: "r"(smem_u32(e)), "f"(v0), "f"(v1));'
    else:
        smem_pair = values + ('asm volatile("st.shared.u32 [%0], %1;" :: "r"(smem_u32(e)), '
                              f'"r"((u32){c0} | ((u32){c1} << 16)));')
    bn8, n_cc, cc8, vs = bn // 8, -(-bn // cc_cols), cc_cols // 8, int(spec.vec_store)  # the last pass may be partial
    ns = 0 if spec.vec_store else spec.narrow_store
    if spec.split_acc:
        master_decl = f"    float acc[{subs}][{regs}];"
        master_zero = (f"        for (int sub = 0; sub < {subs}; ++sub) for (int i = 0; i < {regs}; ++i) acc[sub][i] = 0.0f;")
        ps = spec.partial_stages
        scale_d = f"(kt % {ps} > 0 || kk > 0) ? 1 : 0"
        wait_and_release = (f"            if (kt % {ps} == {ps - 1} || kt == KT - 1) {{\n"
                            f"                wgmma_wait<0>();\n"
                            f"                for (int sub = 0; sub < {subs}; ++sub) for (int i = 0; i < {regs}; ++i) fence_acc(d[sub][i]);\n"
                            f"                if (lane < {cm}) {{ if (prev >= 0) release_stage(bars + 8 * ({st} + prev));"
                            f" release_stage(bars + 8 * ({st} + s)); }}\n"
                            f"                #pragma unroll\n"
                            f"                for (int sub = 0; sub < {subs}; ++sub)\n"
                            f"                    #pragma unroll\n"
                            f"                    for (int i = 0; i < {regs}; ++i) acc[sub][i] += d[sub][i];\n"
                            f"                prev = -1;\n"
                            f"            }} else {{\n"
                            f"                wgmma_wait<1>();\n"
                            f"                if (prev >= 0 && lane < {cm}) release_stage(bars + 8 * ({st} + prev));\n"
                            f"                prev = s;\n"
                            f"            }}")
        accn = "acc"
    else:
        master_decl = master_zero = ""
        scale_d = "(kt > k_first || kk > 0) ? 1 : 0"
        wait_and_release = (f"            wgmma_wait<1>();\n"
                            f"            if (prev >= 0 && lane < {cm}) release_stage(bars + 8 * ({st} + prev));\n"
                            f"            prev = s;")
        accn = "d"
    # Consumer row r (0..63 of a 64-row sub-tile, r = 16 warp + g + 8 h in the fragment layouts) holds tile
    # row `lrow`: the identity, or, with a register-fed A, a permutation pairing rows g and g + 8 on
    # adjacent m (one 8-byte load per pair; warps cover chunk sets {{0,1,4,5}} / {{2,3,6,7}} of each 128 B
    # swizzle row, which makes the loads conflict-free) -- the epilogue stores through the same map.
    if spec.a_regs:
        lrow = "(sub * 64 + 32 * (warp >> 1) + 8 * (warp & 1) + 16 * (g >> 2) + 2 * (g & 3) + h)"
    else:
        lrow = "(sub * 64 + warp * 16 + g + 8 * h)"
    lrow = lrow.replace("sub * 64", rowbase)
    a_offsets = A_OFFSETS.format(**locals()) if spec.a_regs else ""
    mma_issue = (MMA_RS if spec.a_regs else MMA_SS).format(**locals())
    # The tile's bias (per output column) is staged as fp32 in shared memory by the consumer warpgroup, so
    # the epilogue reads it with one 8-byte ld.shared per column pair instead of two global loads with
    # their address arithmetic (measured 2.7% of a 4096^3 GEMM). Its global loads are issued at the tile's
    # start (asm volatile keeps them ahead of the mainloop) and stored to shared memory after it, so their
    # latency never delays the tile's first wgmma (+0.2-0.4% with bias+GELU at 4096^3).
    col_bias = spec.epilogue.has_bias and not spec.out_cm and not spec.row_bias
    bias_rows = bias_h = ""  # the staged epilogue's row bias (per sub-tile: rows g and g + 8 of each warp)
    if spec.epilogue.has_bias and spec.row_bias:
        bias_fill = bias_ready = ""
        if spec.smem_epilogue:
            bias_pair = ""
            bias_rows = (f"float rb[2];\n"
                         f"            #pragma unroll\n"
                         f"            for (int h = 0; h < 2; ++h) {{ const int r = rbase + g + 8 * h;"
                         f" rb[h] = {bias_scale!r}f * bias_at(bias, r < M ? r : 0); }}")
            bias_h = "const float b0 = rb[h], b1 = rb[h];"
        else:
            bias_pair = "const float b0 = bias_at(bias, row), b1 = b0;"
    elif col_bias:
        nb = -(-bn // 128)  # bias values per consumer thread
        f32_bias = spec.bias_dtype.storage is DType.F32
        rtype, ptx, rc = ("float", "f32", "f") if f32_bias else ("u16", "u16", "h")
        to_f32 = "bpre[q]" if f32_bias else load_expr(spec.bias_dtype, "bpre[q]")
        bias_fill = (f"        {rtype} bpre[{nb}];\n"
                     f"        #pragma unroll\n"
                     f"        for (int q = 0; q < {nb}; ++q) {{\n"
                     f"            const int c = threadIdx.x % 128 + 128 * q, cg = n0 + c < N ? n0 + c : 0;\n"
                     f"            if (c < {bn}) asm volatile(\"ld.global.nc.{ptx} %0, [%1];\" : \"={rc}\"(bpre[q]) : \"l\"(bias + cg));\n"
                     f"        }}\n")
        bias_ready = (f"        named_bar_sync(1 + wg);  // this warpgroup's previous epilogue has read bias_s\n"
                      f"        #pragma unroll\n"
                      f"        for (int q = 0; q < {nb}; ++q)\n"
                      f"            if (threadIdx.x % 128 + 128 * q < {bn}) bias_s[threadIdx.x % 128 + 128 * q] = {bias_scale!r}f * {to_f32};\n"
                      f"        named_bar_sync(1 + wg);  // bias_s is filled\n")
        bias_pair = ("const float2 bp = *reinterpret_cast<const float2*>(bias_s + (col - n0)); "
                     "const float b0 = bp.x, b1 = bp.y;")
    else:
        bias_fill = bias_ready = ""
        bias_pair = "const float b0 = bias_at(bias, col < N ? col : 0), b1 = bias_at(bias, col + 1 < N ? col + 1 : 0);"
    chain = spec.epilogue
    defer_src = defer_decl = defer_step = defer_tail = ""
    if spec.defer:
        chain, act = deferred_split(spec.epilogue)
        # One chunk = one 16-byte vector per lane, so a 128x256 tile's slice takes 16 k-steps. Measured
        # (paired, 4096^3 bias+GELU): 8 chunks of 2 vectors each, run before the wait for the previous
        # wgmma group, 0.988-0.993x cuBLASLt; the same after the stage release 0.994-0.996x; 16 chunks of
        # one vector after the release 1.010-1.013x. A chunk must not delay the stage release (3 stages).
        nchunk, ldb = 2 * subs * bn // 32, bn * 2 + 16
        rowbase0 = f"wg * {bm // 2}"
        f16 = spec.dtype_out.storage is DType.F16
        suffix = "f16x2" if f16 else "bf16x2"
        unpack = ('asm("{ .reg .f16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }" '
                  ': "=f"(v0), "=f"(v1) : "r"(x[q]));' if f16 else
                  "v0 = __uint_as_float(x[q] << 16); v1 = __uint_as_float(x[q] & 0xffff0000u);")
        # A stash value below -65504 became -inf in fp16: GELU/SiLU of it would be NaN, not -0. The
        # clamp must keep NaN (fmaxf turned it into -65504, then -0); an accumulator that was -inf itself
        # is indistinguishable here and also gives -0 (PyTorch: NaN), see docs/backends/cuda.md.
        if f16 and act:
            act = "v0 = max_nan_f(v0, -65504.0f); v1 = max_nan_f(v1, -65504.0f); " + act
        defer_src = DEFER_CHUNK.format(bn8=bn // 8, ldb=ldb, vs=int(spec.vec_store), act=act,
                                       unpack=unpack, suffix=suffix)
        defer_decl = f"    int pend = 0, prow = 0, pn0 = 0;  // chunks of the previous tile still to finish\n    {tout}* pC = C;\n"
        defer_step = (f"            if (pend > 0) {{ defer_chunk(stash, pC, prow, pn0, M, N, {nchunk} - pend, lane); --pend; }}"
                      f"  // under the wgmma group in flight\n")
        defer_tail = f"    while (pend > 0) {{ defer_chunk(stash, pC, prow, pn0, M, N, {nchunk} - pend, lane); --pend; }}\n"
    if spec.out_cm and not spec.a_regs:  # fragment-order rows: one store per value
        epilogue_code = TRANSPOSED_ROWS.format(**locals())
    elif spec.out_cm:
        if out_size == 4:
            pair = 'asm volatile("st.global.v2.f32 [%0], {%1,%2};" :: "l"(p), "f"(v0), "f"(v1) : "memory");'
        else:
            pair = f"*reinterpret_cast<u32*>(p) = (u32){c0} | ((u32){c1} << 16);"
        cm_store = (f"if ({int(spec.pairs)} && row + 1 < M) {{ {pair} }} else {{ p[0] = {c0}; "
                    f"if (row + 1 < M) p[1] = {c1}; }}")
        if spec.cm_bias_cols:
            cm_bias_rows, cm_bias_col = "", "const float b0 = bias_at(bias, col), b1 = b0;"
        else:
            cm_bias_rows = ("const float b0 = bias_at(bias, row < M ? row : 0), "
                            "b1 = bias_at(bias, row + 1 < M ? row + 1 : 0);")
            cm_bias_col = ""
        epilogue_code = TRANSPOSED.format(**locals())
    elif spec.defer:
        epilogue_code = STASH.format(**locals())
    elif spec.smem_epilogue:
        epilogue_code = STAGED.format(**locals())
    else:
        store = (spec.store or StoreMap("rowmajor", spec.pairs)).render(tout, store_expr(spec.dtype_out, "{v}"))
        epilogue_code = DIRECT.format(**locals())
    # Ping-pong: the consumers take strict turns at the mainloop (so one's epilogue overlaps the other's
    # mainloop, and no consumer ever waits on a stage more than one phase ahead of it).
    turn_wait = "" if coop else (f"        if (j > 0) mbar_wait_sleepy(bars + {16 * st} + 8 * wg, ((j - 1) / 2) & 1);")
    turn_signal = "" if coop else (f"        if (lane == 0) mbar_arrive(bars + {16 * st} + 8 * (1 - wg));")
    if cm == 2:
        cluster_attr, empty_total = "__cluster_dims__(2, 1, 1) ", 2 * empty_count
        # lane 0 releases the stage locally, lane 1 in the peer CTA (whose producer multicasts into it)
        release_body = "if (threadIdx.x % 32 == 0) mbar_arrive(bar); else mbar_arrive_remote(bar, cluster_rank() ^ 1u);"
        rank_decl, rank_add = "    const u32 crank = cluster_rank();\n", f" m0 += (int)crank * {bm};"
        start_sync, else_open, end = "cluster_sync();", " else {", "    }\n    cluster_sync();  // no CTA exits while its peer may still signal it\n"
        tile_first, tile_step = "blockIdx.x / 2", "(gridDim.x / 2)"
    else:
        cluster_attr, empty_total, release_body = "", empty_count, "mbar_arrive(bar);"
        rank_decl, rank_add, start_sync, else_open, end = "", "", "__syncthreads();", "", ""
        tile_first, tile_step = "blockIdx.x", "gridDim.x"
    conv = spec.conv
    if conv is None:
        operands = "const __grid_constant__ TmaDesc tmA, const __grid_constant__ TmaDesc tmB"
        if spec.stream_k or spec.split_k:
            operands += ", float* __restrict__ sk_ws, unsigned* __restrict__ sk_flags, int sk_tiles, int sk_maxc"
        full_count, consumer_regs, proxy_fence = 1, 232, ""
        producer = _tma_producer(spec, a_loads, b_loads)
    else:
        operands = f"const __grid_constant__ TmaDesc tmB, const {tin}* __restrict__ X"
        if spec.split_k:
            operands += ", float* __restrict__ sk_ws, unsigned* __restrict__ sk_flags, int sk_tiles, int sk_maxc"
        full_count, consumer_regs = 129, im2col.CONSUMER_REGS
        proxy_fence = '            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // cp.async wrote A\n'
        producer = im2col.producer(conv, bm, bn, st, 16 // spec.dtype_in.itemsize, spec.split_k)
    if spec.stream_k or spec.split_k:
        loop_head = ("    unsigned itc = 0;  // stages consumed so far (units have different k ranges)\n"
                     "    for (int u = 0; ; ++u) {\n"
                     "        SkUnit w;\n"
                     f"        if (!{_unit_call(spec)}) break;\n"
                     "        const int tile = w.tile, k_first = w.kb, k_end = w.ke;")
        nreg = subs * regs  # fp32 partial sums per thread (stored as float4 runs, coalesced over the warpgroup)
        it_expr, sk_fixup = "itc++", (SPLIT_FIXUP if spec.split_k else SK_FIXUP).format(**locals())
        sk_funcs = SPLIT_UNIT if spec.split_k else SK_UNIT
        if spec.split_k:  # only the warps that reduced their rows store them
            epilogue_code = f"        if (sk_mine) {{\n{epilogue_code}        }}\n"
    else:
        loop_head = (f"    for (int j = {first}; ; j += {step}) {{\n"
                     f"        const int tile = {tile_first} + j * {tile_step};\n"
                     f"        if (tile >= tiles) break;\n"
                     f"        const int k_first = 0, k_end = KT;")
        it_expr, sk_fixup, sk_funcs = "(unsigned)j * KT + kt", "", ""
    return f"""// Tracea wgmma kernel: {spec.dtype_in.value} {bm}x{bn}x64 {spec.schedule} stages={st} a_kmajor={int(spec.a_kmajor)} b_kmajor={int(spec.b_kmajor)}
{PRELUDE}
{HOPPER_PTX}
{epilogue_function(chain, spec.bias_dtype, spec.dtype_out)}
{pair_src}{defer_src}{_wgmma_call(spec)}

static __device__ __forceinline__ void release_stage(u32 bar) {{ {release_body} }}
{sk_funcs}
// Grouped (L2-friendly) tile order: tile t of a batch entry -> the origin (m0, n0) of its block of C
// (a cluster's block: {cm} CTA tile(s) along M). Producer and consumers walk the same sequence.
static __device__ __forceinline__ void tile_origin(int t, int tiles_m, int tiles_n, int& m0, int& n0) {{
    const int group = {spec.group_m} * tiles_n, first_m = (t / group) * {spec.group_m};
    const int gsz = min(tiles_m - first_m, {spec.group_m});
    m0 = (first_m + (t % group) % gsz) * {cm * bm};
    n0 = ((t % group) / gsz) * {bn};
}}

extern "C" __global__ void {cluster_attr}__launch_bounds__(384, 1) {name}(
        {operands}, {tout}* __restrict__ C,
        const {tb}* __restrict__ bias, int M, int N, int K, int batch) {{
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const u32 bars = base + {st * (a_bytes + b_bytes)};  // full[s] at bars + 8s, empty[s] at bars + 8(st + s)
    const u32 epi = (bars + {16 * st + 16} + 127u) & ~127u;
{rank_decl}    const int tiles_m = (M + {cm * bm - 1}) / {cm * bm}, tiles_n = (N + {bn - 1}) / {bn};
    const int tiles_mn = tiles_m * tiles_n, tiles = tiles_mn * batch;
    const int KT = (K + {bk - 1}) / {bk};
    if (threadIdx.x == 0) {{
        for (int s = 0; s < {st}; ++s) {{ mbar_init(bars + 8 * s, {full_count}); mbar_init(bars + 8 * ({st} + s), {empty_total}); }}
        mbar_init(bars + {16 * st}, 4); mbar_init(bars + {16 * st + 8}, 4);  // ping-pong turn barriers
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }}
    {start_sync}
    const int wg = threadIdx.x / 128 - 1;  // -1: producer, 0/1: consumers
    if (wg < 0) {{{producer}
    }}{else_open}
    asm volatile("setmaxnreg.inc.sync.aligned.u32 {consumer_regs};");
    const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
    const int g = lane >> 2, t4 = lane & 3;
    float d[{subs}][{regs}];
{master_decl}{a_offsets}
    {tout}* ebuf = reinterpret_cast<{tout}*>(smem_raw + (epi - smem_u32(smem_raw))) + (wg * 4 + warp) * {EPI_BYTES // out_size};
    float* bias_s = reinterpret_cast<float*>(smem_raw + (epi - smem_u32(smem_raw)) + {8 * spec.epi_bytes} + wg * {BIAS_BYTES});
    const u32 stash = epi + (wg * 4 + warp) * {spec.epi_bytes};
{defer_decl}{loop_head}
        const int bz = tile / tiles_mn;
        int m0, n0;
        tile_origin(tile % tiles_mn, tiles_m, tiles_n, m0, n0);{rank_add}
        int prev = -1;
{bias_fill}{master_zero}
{turn_wait}
        for (int kt = k_first; kt < k_end; ++kt) {{
            const unsigned it = {it_expr};
            const int s = it % {st};
            mbar_wait(bars + 8 * s, (it / {st}) & 1);
{proxy_fence}            const u32 a_s = base + s * {a_bytes}, b_s = base + {st * a_bytes} + s * {b_bytes};
{mma_issue}
            wgmma_commit();
{wait_and_release}
{defer_step}        }}
{turn_signal}
        wgmma_wait<0>();
        #pragma unroll
        for (int sub = 0; sub < {subs}; ++sub)
            #pragma unroll
            for (int i = 0; i < {regs}; ++i) fence_acc(d[sub][i]);
        if (prev >= 0 && lane < {cm}) release_stage(bars + 8 * ({st} + prev));
{sk_fixup}        {tout}* Cb = C + (long long)bz * M * N;
{bias_ready}{epilogue_code}
    }}
{defer_tail}{end}}}
"""


def _unit_call(spec: WgmmaSpec) -> str:
    """The call that fills the next work unit ``w`` of a stream-K or split-K kernel (false: no more)."""
    return "split_unit(u, tiles, KT, sk_maxc + 1, w)" if spec.split_k else "sk_unit(u, tiles, KT, sk_tiles, w)"


def _tma_producer(spec: WgmmaSpec, a_loads: str, b_loads: str) -> str:
    """Producer warpgroup of the GEMM: one elected thread issues the TMA loads of both tiles (in a
    2-CTA cluster: its A tile and its half of B, multicast to both CTAs)."""
    bm, bn, st, cm = spec.bm, spec.bn, spec.stages, spec.cluster
    a_bytes, b_bytes = bm * BK * 2, bn * BK * 2
    # In a cluster every thread must reach the final cluster barrier: no early return.
    leave = "if (threadIdx.x != 0) return;" if cm == 1 else "if (threadIdx.x == 0) {"
    close = "return;" if cm == 1 else "}"
    first, step = ("blockIdx.x", "gridDim.x") if cm == 1 else ("blockIdx.x / 2", "gridDim.x / 2")
    rank_add = "" if cm == 1 else f" m0 += (int)crank * {bm};"
    if spec.stream_k or spec.split_k:
        loop = ("        for (int u = 0; ; ++u) {\n            SkUnit w;\n"
                f"            if (!{_unit_call(spec)}) break;\n"
                "            const int tile = w.tile, k_first = w.kb, k_end = w.ke;")
    else:
        loop = (f"        for (int tile = {first}; tile < tiles; tile += {step}) {{\n"
                f"            const int k_first = 0, k_end = KT;")
    return f"""
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        {leave}
        int s = 0; u32 phase = 0;
{loop}
            const int bz = tile / tiles_mn;
            int m0, n0;
            tile_origin(tile % tiles_mn, tiles_m, tiles_n, m0, n0);{rank_add}
            for (int kt = k_first; kt < k_end; ++kt) {{
                mbar_wait(bars + 8 * ({st} + s), phase ^ 1);
                const u32 full = bars + 8 * s;
                mbar_expect_tx(full, {a_bytes + b_bytes});
                const u32 sa = base + s * {a_bytes}, sb = base + {st * a_bytes} + s * {b_bytes};
                {a_loads}
                {b_loads}
                if (++s == {st}) {{ s = 0; phase ^= 1; }}
            }}
        }}
        {close}"""

MMA_SS = """            wgmma_fence();
            #pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                #pragma unroll
                for (int sub = 0; sub < {subs}; ++sub)
                    wgmma_tile(d[sub], {a_desc}, {b_desc}, {scale_d});"""

# Register-fed A: each thread's 8-byte pair (rows g, g + 8 = adjacent m) at k = t4 and t4 + 4 of each k8 step.
A_OFFSETS = """
    u32 a_off[2];  // byte offsets of this thread's A pairs (k = t4, t4 + 4) in sub-tile 0 of a stage
    #pragma unroll
    for (int q = 0; q < 2; ++q) {{
        const int sub = 0, h = 0, lr = {lrow}, mm = lr & 31, kr = t4 + 4 * q;
        a_off[q] = (lr >> 5) * {box_bytes} + kr * 128 + (((mm >> 2) ^ kr) << 4) + (mm & 3) * 4;
    }}
"""

MMA_RS = """            #pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                #pragma unroll
                for (int sub = 0; sub < {subs}; ++sub) {{
                    u32 af[4];
                    #pragma unroll
                    for (int q = 0; q < 2; ++q)
                        asm volatile("ld.shared.v2.b32 {{%0, %1}}, [%2];" : "=r"(af[2 * q]), "=r"(af[2 * q + 1])
                                     : "r"(a_s + a_off[q] + sub * {sub_bytes} + kk * 1024));
                    wgmma_fence();
                    wgmma_tile_rs(d[sub], af, {b_desc}, {scale_d});
                }}"""
