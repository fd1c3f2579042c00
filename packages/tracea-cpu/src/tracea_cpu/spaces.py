"""Per-ISA search spaces and hero configs of the CPU kernels.

Blocked GEMM / conv2d params: ``mr`` x ``nr`` register tile (accumulators: mr * nr / width vector
registers), ``kc`` (K block: an mr x kc A micro-panel and a kc x nr B micro-panel stay in L1/L2),
``mc`` (M block: the packed mc x kc A block stays in L2), ``nc`` (N block: the packed kc x nc B block
stays in L3), ``threads`` (0 = ``$TRACEA_NUM_THREADS`` or every core).
Attention params: ``bq`` query rows per block, ``bk`` keys per block, ``threads``.
"""

from __future__ import annotations

import math

from tracea.doctor.profile import DeviceProfile
from tracea.ir.ops import AttentionOp, Conv2dOp, Layout, Op
from tracea.semantic import PipelineConfig, SearchSpace

from .isa import Isa

# Measured on the development machine (2-core AMD EPYC, AVX-512); the first entry is the default.
GEMM_HEROES: dict[str, list[dict[str, int]]] = {
    "avx512": [dict(mr=6, nr=64, mc=48, nc=4096, kc=1024), dict(mr=14, nr=32, mc=28, nc=4096, kc=1024),
               dict(mr=8, nr=48, mc=32, nc=4080, kc=1024), dict(mr=12, nr=32, mc=24, nc=4096, kc=1024),
               dict(mr=4, nr=64, mc=72, nc=2048, kc=384)],
    "avx2": [dict(mr=6, nr=16, mc=48, nc=4096, kc=512), dict(mr=4, nr=24, mc=48, nc=4080, kc=512)],
    "neon": [dict(mr=8, nr=12, mc=64, nc=4092, kc=512), dict(mr=6, nr=16, mc=48, nc=4096, kc=512)],
    "scalar": [dict(mr=4, nr=4, mc=64, nc=2048, kc=256)],
}
# GEMM hero orders for CPU families (``profile.extras["microarch"]``, see
# tracea.doctor.cpu_probe.CpuInfo.microarch) measured on that family; a family without an entry uses its
# ISA's table above (measured on AMD Zen 4 / Zen 5). Intel AVX-512 (Sapphire Rapids class, 2 cores, 2 MB
# L2 per core), benchmarks/cpu/probes/hero_study.py (every config and NumPy interleaved, medians), quiet
# machine: 14x32 mc112 kc512 2.12x / 1.03x / 0.88x NumPy at 512 / 1024 / 2048, where the ISA default
# (6x64 mc48 kc1024) ran 2.14x / 0.87x / 0.87x; it was also among the fastest under heavy load (load
# average 10-11). 6x64 tiles are left out: the least-waste order would put them first on multiples of 6 /
# 1024 (6x64 mc96 kc512: 0.91x at 1024), and 4x64 mc72 kc384 (first on multiples of 4) ran 0.81x at 2048.
# kc 768 (the K block is at most that deep, cut into equal blocks by tr_drive_cols; a 14 x 768 A
# micro-panel is 42 KiB, within the 48 KiB L1d): 768^3 in one K block 2745 us against 2848 for two of
# 384 (and 2915 for 512 + 256 before the equal cut), 1024-2048 as fast as kc 512 (probes/gemm_phases.py).
# The table's kc is capped per host so the A micro-panel fits 7/8 of its L1d (:func:`gemm_hero_table`).
# AMD Zen 3 (AVX2 only, 2-core EPYC VM, 512 KiB L2 / 32 KiB L1d per core), probes/hero_study.py interleaved
# with NumPy (OpenBLAS), 2026-11-26, noisy (another job on the VM): 4x24 tiles (4 broadcasts + 3 loads per
# 12 FMAs, against 6 + 2 for 6x16) mc48 kc512 geomean 1.01x NumPy over 512^3, 1024^3, 2048^3, 512x4096x4096
# and 2048x1024x4096 (0.90-1.24x), where the ISA default 6x16 mc48 kc512 ran 0.85x (0.78-0.93x); one thread
# 1.09x / 0.79x at 1024^3 / 512x4096x4096 against 0.97x / 0.73x; 4x24 mc96 kc256 1.01x, mc192 0.96x.
MICROARCH_GEMM_HEROES: dict[str, list[dict[str, int]]] = {
    "intel-avx512": [dict(mr=14, nr=32, mc=112, nc=4096, kc=768), dict(mr=14, nr=32, mc=56, nc=4096, kc=1024),
                     dict(mr=12, nr=32, mc=96, nc=4096, kc=512), dict(mr=8, nr=48, mc=96, nc=4080, kc=512)],
    "amd-avx2": [dict(mr=4, nr=24, mc=48, nc=4080, kc=512), dict(mr=4, nr=24, mc=96, nc=4080, kc=256),
                 dict(mr=6, nr=16, mc=48, nc=4096, kc=512)],
}
# Indirect conv heroes (``indirect=1``: pixel rows read in place, weights packed) of ISAs measured apart
# from their GEMM table; others use the GEMM heroes. AVX2: deep K blocks (2304 = 256 channels x 9 taps: one
# block for ResNet's 3x3 layers up to 256 channels, two equal ones at 512; the packed kc x 16 weight panel
# is 144 KiB, within L2) mean one pass over each output tile instead of two to nine. Zen 3 2-core VM, NCHW
# ResNet 3x3 layers, interleaved with torch 2.13 CPU: batch 8 64@56 / 128@28 / 256@14 / 512@7 0.83 / 1.00 /
# 1.10 / 1.17x torch with 6x16 kc2304 against 0.47 / 0.78 / 0.89 / 1.04x with the GEMM default (6x16
# kc512); batch 1 1.02 / 1.29 / 1.16 / 1.11x against 0.78 / 1.02 / 1.02 / 1.00x. 6x16 ran ahead of 4x24
# (same kc) on 7 of the 8.
INDIRECT_HEROES: dict[str, list[dict[str, int]]] = {
    "avx2": [dict(mr=6, nr=16, mc=48, nc=4096, kc=2304), dict(mr=4, nr=24, mc=48, nc=4080, kc=2304)],
}
# Indirect conv heroes whose tile is an equal part of one output row (Q % mr == 0): tiles in the top
# or bottom output row skip the taps that read only padding (~10% of a 3x3 conv on 7^2 images).
# Measured on ResNet-50 512@7^2 NCHW, batch 8: 7x32 230 GFLOP/s, 7x48 210 (11 panels of 48 for 512
# channels: uneven over 2 threads), 6x64 216; kc = 2304 (NCHW: 256 channels x 9 taps per K block, one
# block for 256 channels) +3-5% over 1024 on 256@14^2 and 512@7^2.
ROW_HEROES: dict[str, list[dict[str, int]]] = {
    "avx512": [dict(mr=7, nr=32, mc=28, nc=4096, kc=2304), dict(mr=14, nr=32, mc=28, nc=4096, kc=2304)],
    "avx2": [], "neon": [], "scalar": [],
}
# Output widths up to which the row-aligned indirect conv heroes go first, per CPU family (default 14,
# measured on AMD). Intel AVX-512: 7x32 rows first at 28^2 as well -- ResNet 128@28^2 NCHW at batch 1 / 8
# 2.86x / 0.99x torch against 1.68x / 0.96x for the 6x64 default, interleaved, under load 11-13 (noisy).
# AMD Zen 4 (2-core EPYC VM, 2026-11-27, quiet; both configs forced through tracea.ops.conv2d's config=,
# interleaved with torch 2.13 CPU in one process, 15 rounds, three runs): 128@28^2 NCHW 7x32 kc2304 at batch 1 / 8 1.01-1.07x / 1.18-1.36x torch against 0.91-0.93x /
# 1.07-1.22x for the 6x64 kc1024 default.
ROW_FIRST_MAX_Q: dict[str, int] = {"intel-avx512": 28, "amd-zen4-avx512": 28}
# K block of the weights-stationary conv heroes (the whole K of ResNet-50's 512-channel 3x3 layers).
STATIONARY_KC = 4608
ATTN_HEROES: dict[str, list[dict[str, int]]] = {
    "avx512": [dict(bq=12, bk=32), dict(bq=8, bk=48), dict(bq=6, bk=64), dict(bq=10, bk=32), dict(bq=14, bk=32)],
    "avx2": [dict(bq=6, bk=16), dict(bq=4, bk=24)],
    "neon": [dict(bq=8, bk=12), dict(bq=6, bk=16)],
    "scalar": [dict(bq=4, bk=4)],
}
#: attention: keys per online-softmax block (``kb``, a multiple of ``bk``; 512 ran 1-3% faster than 256 on
#: BERT 512, ViT 577 and causal 2048 prefill, one block of scores staying in L1), and the most query rows per kv
#: head (GQA group heads x seq_q) the rows driver serves (``rows``; more run the tile driver), when a config
#: does not say. 16: the rows driver beat the tile driver at 8-16 rows (one thread, 2-core VM: 1 x 32/8
#: heads x 4 new tokens x 1024 keys d128 1.0 vs 1.6 ms, 8 heads x 16 x 1024 d128 1.1 vs 1.4 ms, 12 heads x
#: 16 x 64 d64 0.51 vs 0.58 ms); at 32 rows it won with long key sequences and lost with short ones.
ATTN_KB = 512
ATTN_KB_MAX = 4096
ATTN_ROWS = 16


def _cache(profile: DeviceProfile, name: str, default: int) -> int:
    return int(profile.caches.get(name) or default)


def _blocking_space(isa: Isa, profile: DeviceProfile, elem: int, kcs: list[int], mcs: list[int],
                    ncs: list[int]) -> SearchSpace:
    """Register tiles that fit the ISA, cache blocks of ``elem``-byte elements that fit the profile's
    L2 (the A block) and L3 (the B block), and threads."""
    l2 = _cache(profile, "L2", 1 << 20)
    l3 = _cache(profile, "L3", 8 << 20)
    tiles = [t for t in isa.tiles if isa.fits(*t)]

    def fits_caches(c: PipelineConfig) -> bool | str:
        mr, nr, mc, nc, kc = (c.get(x) for x in ("mr", "nr", "mc", "nc", "kc"))
        if (mr, nr) not in tiles:
            return f"tile {mr}x{nr} not offered for {isa.name}"
        if mc % mr or nc % nr:
            return "mc must be a multiple of mr and nc of nr"
        if elem * mc * kc > l2:
            return f"A block {mc}x{kc} exceeds L2 ({l2} B)"
        if elem * nc * kc > l3:
            return f"B block {kc}x{nc} exceeds L3 ({l3} B)"
        return True

    threads = [0, 1] if profile.compute_units > 1 else [1]
    return (SearchSpace()
            .param("mr", sorted({t[0] for t in tiles})).param("nr", sorted({t[1] for t in tiles}))
            .param("kc", kcs).param("mc", mcs).param("nc", ncs).param("threads", threads)
            .where(fits_caches))


def gemv_space(isa: Isa, profile: DeviceProfile) -> SearchSpace:
    """GEMMs that run through the GEMV driver: the tile and cache blocks are unused there, so only the
    default hero's values (one compiled library) and the thread count are offered."""
    hero = GEMM_HEROES[isa.name][0]
    space = SearchSpace()
    for name in ("mr", "nr", "kc", "mc", "nc"):
        space = space.param(name, [hero[name]])
    return space.param("threads", [0, 1] if profile.compute_units > 1 else [1])


def blocked_space(isa: Isa, profile: DeviceProfile) -> SearchSpace:
    """The fp32 GEMM's register tiles, cache blocks and threads."""
    return _blocking_space(isa, profile, 4, [128, 256, 384, 512, 768, 1024, 1152, 2304, STATIONARY_KC],
                           [24, 28, 32, 42, 48, 56, 64, 72, 96, 112, 120, 144, 168, 192, 240, 288, 336, 384, 480],
                           [1024, 2016, 2048, 4032, 4080, 4092, 4096, 8192])


# bf16 GEMM (AVX512_BF16): kc counts bf16 elements (two per k pair). Measured on the development
# machine (2-core AMD EPYC Zen 4), raw kernel: 6x64 443 GFLOP/s at 1024 (94% of the vdpbf16ps peak);
# 4x64 (no M edge on multiples of 4) 378 / 431 GFLOP/s at 256 / 512, where 6x64 gets 371 / 418.
BF16_HEROES: list[dict[str, int]] = [
    dict(mr=6, nr=64, mc=48, nc=4096, kc=2048), dict(mr=14, nr=32, mc=28, nc=4096, kc=2048),
    dict(mr=4, nr=64, mc=72, nc=4096, kc=2048), dict(mr=8, nr=48, mc=32, nc=4080, kc=2048),
    dict(mr=6, nr=64, mc=96, nc=4096, kc=1024)]


def bf16_space(isa: Isa, profile: DeviceProfile) -> SearchSpace:
    """The bf16 GEMM's register tiles, cache blocks (2-byte elements) and threads."""
    return _blocking_space(isa, profile, 2, [256, 512, 768, 1024, 1536, 2048, 3072, 4096],
                           [24, 28, 32, 42, 48, 64, 72, 96, 120, 144, 168, 192, 240, 288],
                           [1024, 2016, 2048, 4032, 4080, 4096, 8192])


def bf16_heroes(op: Op) -> list[PipelineConfig]:
    """The bf16 GEMM heroes, those whose register tile wastes least on this op's M x N edges first."""
    return _least_waste_first([PipelineConfig(params=tuple(dict(h, threads=0).items())) for h in BF16_HEROES],
                              *gemm_view(op))


def attention_space(isa: Isa, profile: DeviceProfile, op: Op) -> SearchSpace:
    """Query/key register blocks whose S tile fits the registers, softmax key blocks, the rows driver's
    reach and threads."""
    pairs = [(bq, bk) for bq in (4, 6, 8, 10, 12, 14, 16) for bk in (isa.width * m for m in (1, 2, 3, 4))
             if isa.fits(bq, bk)]

    def fits(c: PipelineConfig) -> bool | str:
        if (c.get("bq"), c.get("bk")) not in pairs:
            return "S tile does not fit the registers"
        return c.get("kb") % c.get("bk") == 0 or "kb must be a multiple of bk"

    threads = [0, 1] if profile.compute_units > 1 else [1]
    kbs = sorted({bk * m for _, bk in pairs for m in (2, 4, 8) if bk * m % 4 == 0 and bk * m <= 512})
    return (SearchSpace().param("bq", sorted({p[0] for p in pairs})).param("bk", sorted({p[1] for p in pairs}))
            .param("kb", kbs).param("rows", [0, 4, 8, 16]).param("threads", threads).where(fits))


def attention_heroes(isa: Isa, op: Op) -> list[PipelineConfig]:
    """The ISA's attention heroes with the default softmax key block and rows-driver reach; for the tile
    driver, those of the first hero's key width whose query block pads seq_q least go first (Swin's 49
    rows: 10-row blocks compute 50 rows, 12-row blocks 60; measured ~5% faster, one thread)."""
    table = ATTN_HEROES[isa.name]
    if isinstance(op, AttentionOp) and op.heads // int(op.kv_heads or op.heads) * op.seq_q > ATTN_ROWS:
        bk0 = table[0]["bk"]
        same = sorted((h for h in table if h["bk"] == bk0), key=lambda h: -(-op.seq_q // h["bq"]) * h["bq"])
        table = same + [h for h in table if h["bk"] != bk0]
    return [PipelineConfig(params=tuple(dict(h, kb=attention_kb(h["bk"]), rows=ATTN_ROWS, threads=0).items()))
            for h in table]


def attention_kb(bk: int) -> int:
    """The default softmax key block for register blocks ``bk`` keys wide: the largest multiple of ``bk``
    and 4 up to :data:`ATTN_KB` (at least one)."""
    step = bk * 4 // math.gcd(bk, 4)
    return max(step, ATTN_KB // step * step)


def heroes(table: dict[str, list[dict[str, int]]], isa: Isa) -> list[PipelineConfig]:
    return [PipelineConfig(params=tuple(dict(h, threads=0).items())) for h in table[isa.name]]


def blocked_heroes(isa: Isa, op: Op, indirect: int = 0, profile: DeviceProfile | None = None) -> list[PipelineConfig]:
    """The ISA's GEMM heroes, those whose register tile wastes least on this op's M x N edges first
    (``indirect``: the conv2d algorithm, see :func:`gemm_view`). With ``profile``, the hero table of its
    CPU family (:data:`MICROARCH_GEMM_HEROES`) when it has one for this ISA."""
    return _least_waste_first(gemm_hero_table(isa, profile), *gemm_view(op, indirect))


def whole_m_block(config: PipelineConfig, op: Op) -> PipelineConfig:
    """``config`` with ``mc`` covering all of the GEMM's M when M is at most two of its M blocks and N at least four
    times M (the packed NCHW conv of a stem: M = 64 output channels against thousands of pixels). One M block makes
    the driver split the threads over B's panels (each packed panel read by one thread, the small A shared) instead
    of over M (every thread streaming all of B). 2-core Zen 4 VM, fp32 stem 7x7/2 3 -> 64 at 112^2 b1: mc = 48 ->
    66, 0.48 -> 0.39 ms (F.conv2d 0.32 ms)."""
    m, n = gemm_view(op, int(config.get("indirect", 0) or 0))
    mr, mc = int(config.get("mr")), int(config.get("mc"))
    if m <= 2 * mc and n >= 4 * m:
        return config.with_params(mc=max(mc, -(-m // mr) * mr))
    return config


def indirect_heroes(isa: Isa, op: Op) -> list[PipelineConfig]:
    """The indirect conv's heroes (``indirect`` not set): the ISA's :data:`INDIRECT_HEROES` when measured,
    else its GEMM heroes, least edge waste first."""
    if isa.name in INDIRECT_HEROES:
        return _least_waste_first(heroes(INDIRECT_HEROES, isa), *gemm_view(op, 1))
    return blocked_heroes(isa, op, indirect=1)


def gemm_hero_table(isa: Isa, profile: DeviceProfile | None = None) -> list[PipelineConfig]:
    """The GEMM heroes of ``isa`` for ``profile``'s CPU family: its own table when measured (and of this
    ISA: an AVX2 variant on an AVX-512 machine keeps the AVX2 table), else the ISA's."""
    micro = str(profile.extras.get("microarch", "")) if profile is not None else ""
    table = MICROARCH_GEMM_HEROES.get(micro)
    if table and micro.endswith("-" + isa.name):
        assert profile is not None
        return [PipelineConfig(params=tuple(dict(h, kc=l1_kc(h["kc"], h["mr"], profile), threads=0).items()))
                for h in table]
    return heroes(GEMM_HEROES, isa)


def l1_kc(kc: int, mr: int, profile: DeviceProfile) -> int:
    """``kc`` capped so that an ``mr`` x kc fp32 A micro-panel takes at most 7/8 of the profile's L1d
    (a multiple of 8, at least 64; unknown L1d: ``kc`` unchanged)."""
    l1 = int(profile.caches.get("L1d") or 0)
    if l1 <= 0:
        return kc
    return max(64, min(kc, l1 * 7 // 8 // (4 * mr) // 8 * 8))


#: Edge waste (padded M x N over M x N) within this much of the least a hero list has counts as the least:
#: the table's measured order decides between them. Zen 3 (2 threads, interleaved with NumPy): 4x24 tiles
#: ran 0.90-0.98x NumPy at 512^3, where they pad 3.1% of the columns, against 0.82x for 6x16 (0.8% of the
#: rows), and 0.99x against 0.90x at 1024^3.
WASTE_TOLERANCE = 0.04


def _least_waste_first(cfgs: list[PipelineConfig], m: int, n: int) -> list[PipelineConfig]:
    """``cfgs`` sorted by the share of their padded M x N edge tiles, those within
    :data:`WASTE_TOLERANCE` of the least in table order."""
    def waste(cfg: PipelineConfig) -> float:
        mr, nr = cfg.get("mr"), cfg.get("nr")
        return -(-m // mr) * mr / m * (-(-n // nr) * nr) / n

    if not cfgs:
        return []
    least = min(waste(c) for c in cfgs) + WASTE_TOLERANCE
    return sorted(cfgs, key=lambda c: max(waste(c), least))


def row_heroes(isa: Isa, op: Conv2dOp) -> list[PipelineConfig]:
    """Indirect conv heroes whose register tile is an equal part of one output row (``Q % mr == 0``),
    so tiles of the top and bottom rows skip their padding taps."""
    return [h for h in heroes(ROW_HEROES, isa) if op.q % h.get("mr") == 0]


def row_first_max_q(profile: DeviceProfile | None) -> int:
    """Output width up to which row-aligned conv heroes go first on ``profile``'s CPU family."""
    micro = str(profile.extras.get("microarch", "")) if profile is not None else ""
    return ROW_FIRST_MAX_Q.get(micro, 14)


def indirect_ok(op: Conv2dOp) -> bool:
    """Whether the conv may read A in place through the indirect NHWC kernel (per-pixel channel runs
    long enough to stream; NCHW input is transposed to NHWC first)."""
    return op.c // op.groups >= 8


#: Where the direct NCHW algorithm (``indirect=3``) is the first hero (see :func:`direct_nchw_first`):
#: 3x3-like kernels with at most this many input channels, or 1x1 kernels, over at least
#: DIRECT_NCHW_MIN_PIXELS output pixels (batch x P x Q). It saves the input's NHWC copy and the
#: transposed output stores, which weigh most next to the arithmetic with few channels per tap; its
#: micro-kernel is no faster than the indirect one's and re-reads a tile's input for every 8 output
#: channels, and small images leave many lanes masked (2-core Sapphire Rapids VM, docs/backends/cpu.md).
#: The same rule fits AVX2 (2-core AMD EPYC Zen 3 VM, two threads, ratio to F.conv2d, direct / indirect
#: mr=6 nr=16 kc=2304, batch 8: 64@56^2 0.94x / 0.87x, 128@28^2 1.09x / 1.07x, 256@14^2 1.03x / 1.27x,
#: 512@7^2 0.86x / 1.56x; 1x1 256 -> 64 56^2 1.26x / 0.70x; docs/backends/cpu.md, "direct NCHW conv on AVX2").
DIRECT_NCHW_MAX_C = 64
DIRECT_NCHW_MIN_PIXELS = 3136
#: ISAs with a direct NCHW kernel (``emit/nchw_direct.py``).
DIRECT_NCHW_ISAS = ("avx512", "avx2")


def direct_nchw_ok(isa: Isa, op: Conv2dOp) -> bool:
    """Whether the direct NCHW conv (``indirect=3``, output pixels in the vector lanes) runs ``op``
    rather than falling back to the indirect one: AVX-512 or AVX2, NCHW, stride 1, one group, and output
    rows as wide as the input's (``q == w``: e.g. a "same" 3x3). Mirrors ``tr_nd_fits`` in the C source."""
    return (isa.name in DIRECT_NCHW_ISAS and op.layout is Layout.NCHW and op.stride == (1, 1) and op.groups == 1
            and op.q == op.w)


def direct_nchw_first(isa: Isa, op: Conv2dOp) -> bool:
    """Whether the direct NCHW algorithm goes before the indirect one in ``op``'s hero list (measured
    per layer against ``F.conv2d``: 64@56^2 3x3, 1x1 layers of 28^2-56^2 images at batch 8)."""
    return (direct_nchw_ok(isa, op) and op.n * op.p * op.q >= DIRECT_NCHW_MIN_PIXELS
            and (op.c <= DIRECT_NCHW_MAX_C or op.r * op.s == 1))


def gemm_view(op: Op, indirect: int = 0) -> tuple[int, int]:
    """(M, N) of the GEMM the blocked driver runs for ``op`` (per batch entry / group). conv2d
    ``indirect``: 0 packed implicit GEMM, 1 pixel rows read in place, 2 weights-stationary."""
    if isinstance(op, Conv2dOp):
        if indirect == 2 or (op.layout is Layout.NCHW and not indirect):
            return op.k // op.groups, op.n * op.p * op.q
        return op.n * op.p * op.q, op.k // op.groups
    return int(getattr(op, "m", 1)), int(getattr(op, "n", 1))


def small_problem(op: Op) -> bool:
    """Problems too small to pay for waking a second thread."""
    if isinstance(op, AttentionOp):
        return op.flops < 2e6
    return op.flops < 4e6


# AMX bf16 GEMM: mr x nr blocks of 16 x 16 accumulator tiles; kc in bf16 elements (a multiple of 32,
# one tile of K). Many rows run the driver of emit/amx_blocks.py: kc = 256 keeps the kc x NR B slice in
# L1 (32 KiB at NR = 64; kc = 512 ran 0.7x of that), nc = 256 an mc x nc fp32 C block in L2, mc = 256
# rows reuse each streamed B slice (lowered per op only for a deep K, CpuGemmAmxVariant.block_rows).
# 16 x 64 blocks (one A tile per k step, streamed from L2, against four B tiles from L1) ran 5-15% faster
# than 32 x 32 (two A tiles per k step) at 512-4096. Measured on the 2-core Intel Xeon with AMX, one
# thread, interleaved with torch.matmul (docs/backends/cpu.md, "AMX").
AMX_HEROES: list[dict[str, int]] = [
    dict(mr=16, nr=64, mc=256, nc=256, kc=256), dict(mr=32, nr=32, mc=256, nc=256, kc=256),
    dict(mr=16, nr=64, mc=256, nc=128, kc=256), dict(mr=32, nr=32, mc=128, nc=512, kc=512)]


def amx_space(profile: DeviceProfile) -> SearchSpace:
    """The AMX bf16 GEMM's tile blocks, cache blocks (2-byte elements) and threads."""
    from .emit.amx import AMX_TILES

    l2 = _cache(profile, "L2", 1 << 20)
    tiles = [t for t in AMX_TILES if t in ((32, 32), (16, 64), (16, 32))]

    def fits(c: PipelineConfig) -> bool | str:
        mr, nr, mc, nc, kc = (c.get(x) for x in ("mr", "nr", "mc", "nc", "kc"))
        if (mr, nr) not in tiles:
            return f"AMX block {mr}x{nr} not offered"
        if mc % mr or nc % nr:
            return "mc must be a multiple of mr and nc of nr"
        if 2 * mc * kc > l2:
            return f"A block {mc}x{kc} exceeds L2 ({l2} B)"
        return True

    threads = [0, 1] if profile.compute_units > 1 else [1]
    return (SearchSpace().param("mr", [16, 32]).param("nr", [32, 64])
            .param("kc", [256, 512, 768, 1024, 1536, 2048, 4096]).param("mc", [32, 64, 128, 192, 256, 384, 512])
            .param("nc", [128, 256, 512, 1024, 2048, 4096]).param("threads", threads).where(fits))


def amx_rows_space(profile: DeviceProfile) -> SearchSpace:
    """GEMMs the AMX few-rows driver runs (the blocks are unused there): the default hero's values and
    the thread count."""
    space = SearchSpace()
    for name in ("mr", "nr", "kc", "mc", "nc"):
        space = space.param(name, [AMX_HEROES[0][name]])
    return space.param("threads", [0, 1] if profile.compute_units > 1 else [1])


def amx_heroes(op: Op) -> list[PipelineConfig]:
    """The AMX heroes, those whose block wastes least on this op's M x N edges first."""
    return _least_waste_first([PipelineConfig(params=tuple(dict(h, threads=0).items())) for h in AMX_HEROES],
                              *gemm_view(op))
