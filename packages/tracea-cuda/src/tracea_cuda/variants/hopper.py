"""Hopper GEMM variant: TMA + wgmma, warp-specialised, persistent (sm_90a)."""

from __future__ import annotations

import ctypes
import threading
from dataclasses import replace
from typing import Any

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType, Fp32Precision
from tracea.ir.ops import GemmOp, LayerType
from tracea.semantic.config import BarrierMode, PipelineConfig, SwizzleMode, Validity
from tracea.semantic.search_space import SearchSpace
from tracea.errors import LaunchError, UnsupportedConfigError

from .. import compiler, helpers_kernels, launcher, stream_k, tma, toolkit
from ..arrays import data_ptr, device_index, launch_stream
from ..device import resident_sms
from ..emit.wgmma import KERNEL_NAME, WgmmaSpec, render
from . import hopper_tiles
from .base import FLOAT_IO, CudaVariant, scratch_buffer, served_by
from .gemm import MmaGemm16


def _hero(bn: int, stages: int, group_m: int = 8, schedule: str = "coop", bm: int = 128,
          smem_epilogue: bool = True, cluster: int | None = None, stream_k: bool | None = None,
          defer: bool = False, split_k: int = 1) -> PipelineConfig:
    params = (("group_m", group_m), ("schedule", schedule), ("smem_epilogue", smem_epilogue))
    if defer:
        params += (("defer", True),)  # type: ignore[assignment]
    if split_k > 1:
        params += (("split_k", split_k),)  # type: ignore[assignment]
    if cluster is not None:  # GEMM configs say it; the conv variant has no cluster dimension
        params += (("cluster", cluster),)  # type: ignore[assignment]
    if stream_k is not None:  # likewise
        params += (("stream_k", stream_k),)  # type: ignore[assignment]
    return PipelineConfig(bm, bn, 64, stages, 12, SwizzleMode.XOR8, BarrierMode.PRODUCER_CONSUMER, params)


def split_slices(op: GemmOp, ctas: int, bn: int = 128) -> int:
    """K slices for the split-K hero on a GEMM with few 128 x ``bn`` tiles (1: do not split), from the H100
    probe (``benchmarks/cuda/probe_split_k.py``, kernel time vs slices): about 3/4 of a wave of pieces up
    to 256 rows (weight-bound) and a whole wave above, at most 8 slices and at least 8 k-tiles of 64 per
    slice; grids of half a wave or more are split in two only for K >= 12288 (M256 N4096 K14336: 0.76x ->
    1.00x cuBLAS; M128 N8192 K8192 ran 7% slower split). Fewer than 64 rows are left to the few-row
    variants."""
    tiles = -(-op.m // 128) * -(-op.n // bn) * op.batch
    if op.m < 64 or not ctas or 2 * tiles > ctas and op.k < 12288:
        return 1
    target = ctas if op.m > 256 else 3 * ctas // 4
    s = min(8, target // tiles, ctas // tiles, op.k // 512)
    if s < 2 and 2 * tiles <= ctas and op.k >= 12288:
        s = 2
    return max(1, s)


def narrow_tiles(op: GemmOp, profile: DeviceProfile) -> bool:
    """Whether ``op`` takes the 128x64-tile hero: 128 or 256 rows (whole 128-row tiles), at most one 128x64
    tile per SM (see :meth:`WgmmaGemm.hero_configs`; measured on an H200 and an H100)."""
    tiles = -(-op.m // 128) * -(-op.n // 64) * op.batch
    return op.m in (128, 256) and tiles <= profile.compute_units


def narrow_split_slices(op: GemmOp, ctas: int) -> int:
    """K slices for the 128x64-tile hero, from the H200 probe (kernel time vs cuBLAS): a whole wave of
    pieces where the tiles fill at most a quarter of the SMs (M128 N2048 K8192, 32 tiles: 4 slices 0.97x,
    3 0.90x), at most 8 slices of at least 8 k-tiles of 64 each; else as many as fit the SMs while every
    slice keeps at least 64 k-tiles (M128 N4096, 64 tiles: K4096 unsplit 0.87x, 2 slices 0.84x; K11008
    unsplit 0.81x, 2 slices 0.94x)."""
    tiles = -(-op.m // 128) * -(-op.n // 64) * op.batch
    if 4 * tiles <= ctas:
        return max(1, min(8, ctas // tiles, op.k // 512))
    return max(1, min(ctas // tiles, op.k // 4096))


def narrow_store(row_bytes: int, ptrs: dict | None) -> int:
    """``WgmmaSpec.narrow_store`` for output rows of ``row_bytes``: 8 or 4 where every row and the output
    base are aligned to it (the staged epilogue then stores 16-byte runs in such pieces), else 0."""
    return next((b for b in (8, 4) if row_bytes % b == 0 and (ptrs is None or ptrs.get("out", 0) % b == 0)), 0)


def wave_efficiency(tiles: int, ctas: int) -> float:
    """Share of the SM-slots of a grid's waves that ``tiles`` fill (1.0: whole waves)."""
    return tiles / (-(-tiles // ctas) * ctas) if tiles and ctas else 1.0


class WgmmaGemm(CudaVariant):
    name = "cuda.gemm.wgmma"
    description = ("fp16/bf16 GEMM for Hopper: TMA (128B swizzle) + mbarrier pipeline + wgmma, producer/2 consumer "
                   "warpgroups with setmaxnreg, persistent grouped grid, fused epilogue (sm_90a)")
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.GEMM, dtypes=frozenset({DType.F16, DType.BF16}),
                                out_dtypes=FLOAT_IO, isa=("wgmma", "tma"), min_compute_capability=(9, 0))
    efficiency = 0.8
    priority = 20
    #: whether operands whose rows TMA cannot address (a row not a multiple of 16 bytes, e.g. K = 1023)
    #: are first copied into scratch with 16-byte row pitches (one ``cudaMemcpy2DAsync`` each); the
    #: output takes the kernel's scalar stores then. fp32 variants require aligned rows instead.
    pads_rows = True

    #: the array roles of the two operands, in kernel order (A then B)
    roles = ("a", "b")

    def __init__(self) -> None:
        self._fallback = MmaGemm16()
        # memos of run() (the tuner's path): compiled spec per (op, config, device, bias dtype, out
        # alignment), packed TMA launch per pointers
        self._plans: dict = {}
        self._launches: dict = {}

    def extra_checks(self, op: GemmOp, profile: DeviceProfile) -> list[str]:
        return [f"{n}={getattr(op, n)} exceeds the TMA coordinate range" for n in ("m", "n", "k")
                if getattr(op, n) >= 2**31 - 256]

    def spec(self, op: GemmOp, config: PipelineConfig, ptrs: dict | None) -> WgmmaSpec:
        bias_dtype = DType.parse(ptrs["bias_dtype"]) if ptrs and "bias_dtype" in ptrs else op.out_dtype
        if config.tile_k != 64 or config.warps != 12:
            raise UnsupportedConfigError("the wgmma kernel needs tile_k=64 and warps=12 (3 warpgroups)")
        pairs = op.n % 2 == 0 and (ptrs is None or ptrs.get("out", 0) % (2 * op.out_dtype.itemsize) == 0)
        vec_store = op.n % (16 // op.out_dtype.itemsize) == 0 and (ptrs is None or ptrs.get("out", 0) % 16 == 0)
        narrow = narrow_store(op.n * op.out_dtype.itemsize, ptrs)
        a_km, b_km = self.kmajor(op)
        return WgmmaSpec(op.dtype_a.storage, op.out_dtype, bias_dtype, op.epilogue, a_km, b_km,
                         pairs, vec_store, narrow_store=narrow, bn=config.tile_n, stages=config.stages, group_m=int(config.get("group_m") or 8),
                         bm=config.tile_m, schedule=str(config.get("schedule") or "coop"),
                         smem_epilogue=bool(config.get("smem_epilogue", True)), cluster=int(config.get("cluster") or 1),
                         stream_k=bool(config.get("stream_k", False)), defer=bool(config.get("defer", False)),
                         split_k=int(config.get("split_k") or 1) > 1)

    def _build_launch(self, op: GemmOp, spec: WgmmaSpec, pa: int, pb: int, ptrs: dict, profile: DeviceProfile,
                      kernel: Any = None):
        op = self.kernel_op(op)
        b = op.batch
        row = 128 // spec.dtype_in.itemsize  # elements per 128-byte swizzle row (of k, or of m/n when MN-major)
        pa_pitch, pb_pitch = self.pitches(op)
        ab = 1 if spec.a_bcast else b  # one A shared by every batch entry: its loads read entry 0
        a_map = (tma.tiled_map(pa, spec.dtype_in, (op.k, op.m, ab), (row, spec.bm, 1), pa_pitch) if spec.a_kmajor else
                 tma.tiled_map(pa, spec.dtype_in, (op.m, op.k, ab), (row, row, 1), pa_pitch))
        # In a 2-CTA cluster each CTA loads half of the B tile (multicast to both): K-major boxes are halved.
        bb = 1 if spec.b_bcast else b
        b_map = (tma.tiled_map(pb, spec.dtype_in, (op.k, op.n, bb), (row, spec.bn // spec.cluster, 1), pb_pitch)
                 if spec.b_kmajor else tma.tiled_map(pb, spec.dtype_in, (op.n, op.k, bb), (row, row, 1), pb_pitch))
        cm = spec.cluster
        tiles = self._tiles(op, spec)  # clusters' tiles
        resident = resident_sms(profile) if cm == 1 else tma.max_active_clusters(
            kernel.function, cm, spec.threads, spec.smem_bytes, resident_sms(profile) // cm)
        grid = (min(tiles, resident) * cm, 1, 1)
        sk = []
        if spec.split_k:  # one unit per (tile, K slice); slices given here (the compiled kernel serves any)
            splits = ptrs["splits"]
            grid = (min(tiles * splits, resident), 1, 1)
            sk = [ctypes.c_uint64(ptrs.get("sk_ws", 0)), ctypes.c_uint64(ptrs.get("sk_flags", 0)),
                  ctypes.c_int32(tiles), ctypes.c_int32(splits - 1)]
        elif spec.stream_k:  # workspace and counters come from run() (per stream), the split from the grid
            p = ptrs["sk_plan"]
            sk = [ctypes.c_uint64(ptrs.get("sk_ws", 0)), ctypes.c_uint64(ptrs.get("sk_flags", 0)),
                  ctypes.c_int32(p.sk_tiles), ctypes.c_int32(p.max_contributors)]
        cargs = tma.pack([a_map, b_map, *sk, ctypes.c_uint64(ptrs["out"]),
                          ctypes.c_uint64(ptrs.get("bias") or ptrs["out"]),
                          ctypes.c_int32(op.m), ctypes.c_int32(op.n), ctypes.c_int32(op.k), ctypes.c_int32(b)])
        return grid, cargs

    def stream_k_plan(self, op: GemmOp, config: PipelineConfig,
                      profile: DeviceProfile) -> tuple[stream_k.StreamKPlan, int, int]:
        """Stream-K split of ``config`` on ``op``: (plan, 32-bit tile counters, float32 partial-sum slots'
        size). Stream-K runs without clusters: the grid is min(tiles, SMs)."""
        kop = self.kernel_op(op)
        spec = self.spec(op, config, None)
        tiles = self._tiles(kop, spec)
        p = stream_k.plan(tiles, min(tiles, resident_sms(profile)), -(-kop.k // (128 // spec.dtype_in.itemsize)))
        per_slot = 2 * 128 * spec.subs * spec.bn // 2  # two consumer warpgroups x their accumulators
        return p, 2 * p.sk_tiles, p.sk_tiles * p.max_contributors * per_slot

    def _stream_k_buffers(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile, args: OpArgs,
                          ptrs: dict) -> None:
        """Stream-K split for this launch plus its fp32 partial-sum workspace and zeroed tile counters, for
        this call only (kept alive in ``ptrs["_keep"]`` until the kernel is enqueued)."""
        p, flag_words, ws_size = self.stream_k_plan(op, config, profile)
        ws = scratch_buffer(args, ws_size)
        flags = scratch_buffer(args, flag_words, zeroed=True)
        ptrs.setdefault("_keep", []).extend((ws, flags))
        ptrs["sk_plan"] = p
        ptrs["sk_ws"] = data_ptr(ws, "sk_ws")
        ptrs["sk_flags"] = data_ptr(flags, "sk_flags")

    def split_plan(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile) -> tuple[int, int, int]:
        """Split-K of ``config`` on ``op``: (slices S, tiles, float32 scratch elements). S is the config's
        ``split_k``, capped so that no slice is empty (S <= K tiles) and every piece of every tile is
        resident at once (tiles x S <= SMs: the pieces of a tile wait for each other); S = 1 runs the
        tiles whole. The scratch holds the per-tile counters (arrivals and departures for each of the two
        consumer warpgroups, left at zero by every launch, padded to 256 bytes), then S fp32 partial tiles per
        tile."""
        kop = self.kernel_op(op)
        spec = self.spec(op, config, None)
        tiles = self._tiles(kop, spec)
        k_tiles = -(-kop.k // (128 // spec.dtype_in.itemsize))
        splits = max(1, min(int(config.get("split_k") or 1), k_tiles, resident_sms(profile) // tiles))
        return splits, tiles, (self._flag_floats(tiles) + tiles * splits * spec.bm * spec.bn if splits > 1 else 0)

    @staticmethod
    def _flag_floats(tiles: int) -> int:
        return -(-4 * tiles // 64) * 64

    def _split_k_buffers(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile, args: OpArgs, ptrs: dict,
                         stream: Any) -> None:
        """Split-K scratch for this call (caller's allocator, alive in ``ptrs["_keep"]`` until the kernel is
        enqueued), its counters zeroed on ``stream``."""
        splits, tiles, size = self.split_plan(op, config, profile)
        if not size:  # one slice: the kernel runs the tiles whole and touches no scratch
            ptrs.update(splits=1, sk_flags=0, sk_ws=0)
            return
        buf = scratch_buffer(args, size)
        ptrs.setdefault("_keep", []).append(buf)
        base = data_ptr(buf, "sk_flags")
        toolkit.cupy().cuda.runtime.memsetAsync(base, 0, 16 * tiles, stream.ptr)
        ptrs.update(splits=splits, sk_flags=base, sk_ws=base + 4 * self._flag_floats(tiles))

    def kernel_op(self, op: GemmOp) -> GemmOp:
        """The GEMM as the kernel sees it (M and N exchanged when the operands are swapped)."""
        return op

    @staticmethod
    def _tiles(kop: GemmOp, spec: WgmmaSpec) -> int:
        """Tiles the persistent grid walks (a 2-CTA cluster's pair counts once)."""
        return -(-kop.m // (spec.cluster * spec.bm)) * -(-kop.n // spec.bn) * kop.batch

    def kmajor(self, op: GemmOp) -> tuple[bool, bool]:
        """Whether A and B reach the kernel K-major (16-bit: as stored; wgmma transposes the others)."""
        return not op.trans_a, op.trans_b

    def pitches(self, op: Any) -> tuple[int | None, int | None]:
        """Row pitches (elements) of the scratch copies A and B are read from, None where the operand's
        own rows are 16-byte multiples and it is read in place."""
        if not self.pads_rows or not isinstance(op, GemmOp):
            return None, None
        vec = 16 // op.dtype_a.storage.itemsize
        rows = (op.m if op.trans_a else op.k, op.k if op.trans_b else op.n)
        return tuple(None if r % vec == 0 else -(-r // vec) * vec for r in rows)  # type: ignore[return-value]

    def operands(self, op: GemmOp, args: OpArgs, ptrs: dict, stream: Any) -> tuple[int, int]:
        """Device pointers of A and B as the kernel reads them: the caller's arrays, or (rows TMA cannot
        address) pitched scratch copies made on ``stream`` (so ordered before the GEMM)."""
        out = [ptrs["a"], ptrs["b"]]
        item = op.dtype_a.storage.itemsize
        for i, pitch in enumerate(self.pitches(op)):
            if pitch is None:
                continue
            width = (op.m if op.trans_a else op.k) if i == 0 else (op.k if op.trans_b else op.n)
            height = op.batch * ((op.k if op.trans_a else op.m) if i == 0 else (op.n if op.trans_b else op.k))
            buf = scratch_buffer(args, -(-height * pitch * item // 4))
            ptrs.setdefault("_keep", []).append(buf)  # alive until the GEMM reading it is enqueued
            dst = data_ptr(buf, "scratch")
            toolkit.cupy().cuda.runtime.memcpy2DAsync(dst, pitch * item, out[i], width * item, width * item, height,
                                                      3, stream.ptr)  # 3: device to device
            out[i] = dst
        return out[0], out[1]

    def validate_config(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        try:
            spec = self.spec(op, config, None)
            spec.check()
        except UnsupportedConfigError as exc:
            return Validity(False, exc.reason)
        if profile.shared_mem_per_block and spec.smem_bytes > profile.shared_mem_per_block:
            return Validity(False, f"needs {spec.smem_bytes} B of shared memory, device allows "
                                   f"{profile.shared_mem_per_block} B per block")
        return Validity(True)

    def search_space(self, op: GemmOp, profile: DeviceProfile) -> SearchSpace:
        return (SearchSpace().tile_m([64, 128, 256]).tile_n([64, 128, 256]).tile_k([64]).stages([3, 4, 5, 6, 7])
                .warps([12]).swizzles([SwizzleMode.XOR8]).barrier_modes([BarrierMode.PRODUCER_CONSUMER])
                .param("group_m", [4, 8, 16]).param("schedule", ["coop", "pingpong"])
                .param("smem_epilogue", [True, False]).param("cluster", [1, 2]).param("stream_k", [False, True])
                .param("split_k", [1, 2, 3, 4, 6, 8])
                .param("defer", [False, True])
                .param("partial_stages", [1, 2, 4, 8] if self.name.endswith("3xtf32") else [1])
                .where(lambda c: bool(self.validate_config(op, c, profile)) or "invalid"))

    def hero_configs(self, op: GemmOp, profile: DeviceProfile) -> list[PipelineConfig]:
        # 2-CTA clusters (B multicast) measured on par with single CTAs on an H200 (764 vs 772 TF/s at
        # 4096^3, 675 vs 678 at 8192^3): one cluster hero, the tuner explores the rest.
        big = [_hero(256, 4, cluster=1), _hero(256, 3, 16, cluster=1), _hero(128, 4, bm=256, cluster=1),
               _hero(256, 4, cluster=2), _hero(128, 6, schedule="pingpong", cluster=1),
               _hero(256, 4, smem_epilogue=False, cluster=1), _hero(128, 6, schedule="pingpong", smem_epilogue=False,
                                                                     cluster=1)]
        tiles = -(-op.m // 128) * -(-op.n // 256) * op.batch
        # Stream-K (the partial last wave split along K) measured +1.9% at 8192^3 bf16 (15.5 waves) but
        # -5% at 4096^3 (3.9 waves) and -1% at M8192 N4096 K4096 (7.8 waves) on an H200, where the
        # partial-sum exchange costs more than the idle SMs of the last wave: first hero from 12 waves.
        sk = [_hero(256, 4, cluster=1, stream_k=True)]
        # A 16-bit output can defer the activation and the stores of a tile into the next tile's mainloop
        # (3 stages leave room for the stash): bf16 bias+GELU 1.00-1.02x cuBLASLt's fused kernel at
        # 4096^3-8192^3 (0.98-0.99x without), plain GEMMs +0.5-1%, paired on an H200.
        # (Not where C's rows take scalar stores, N % 8 != 0: the stash then spills on sm_90a.)
        if op.out_dtype.storage in (DType.BF16, DType.F16) and op.n % 8 == 0:
            big = [_hero(256, 3, 16, cluster=1, defer=True)] + big
            sk = [_hero(256, 3, 16, cluster=1, stream_k=True, defer=True)] + sk
        ctas = profile.compute_units
        if tiles >= 12 * ctas and tiles % ctas:  # a partial last wave
            return sk + big
        t128 = -(-op.m // 128) * -(-op.n // 128) * op.batch
        b_kmajor = self.kmajor(op)[1]
        if tiles >= ctas:
            # 128x128 tiles where they fill the waves much better (the 128x256 tile runs ~10% faster per
            # tile): H100, M512 N11008 K4096 0.72x -> 0.90x cuBLAS, M2048 N5120 K5120 0.89x -> 1.14x,
            # M512 N28672 K8192 0.83x -> 0.95x; 4096^3 and 8192^3 keep 128x256 (both fill 97%).
            if wave_efficiency(t128, ctas) > wave_efficiency(tiles, ctas) + 0.1:
                return self._with_fills(op, ctas, b_kmajor, (128, 128), [_hero(128, 6, cluster=1)] + big + sk)
            return self._with_fills(op, ctas, b_kmajor, (128, 256), big + sk, narrow=True)
        few = [_hero(128, 6, cluster=1), _hero(64, 8, cluster=1), _hero(256, 4, cluster=1)]
        if narrow_tiles(op, profile):
            # Whole 128-row tiles over a weight of <= SMs x 64 columns: 128x64 tiles put twice the CTAs on
            # the weight stream. H200, kernel time vs cuBLAS (benchmarks/cuda/probe_split_k.py), best
            # 128x128 split (1-8 slices) -> this hero: M128 N4096 K4096 0.82x -> 0.87x, N5120 K5120 0.73x
            # -> 0.85x, N8192 K8192 0.85x -> 0.94x, N2048 K8192 0.89x -> 0.97x, N1024 K8192 0.56x -> 0.68x,
            # N4096 K11008 0.89x -> 0.94x; M256 N4096 K4096 0.71x -> 0.89x, N1024 K8192 0.77x -> 0.82x. Not
            # on partial row tiles (M64 N4096 K4096 0.43x -> 0.37x, M96 N4096 K14336 0.90x -> 0.81x, M192
            # N4096 K4096 0.82x -> 0.66x) or M512 (N1024 K8192 0.82x -> 0.78x). H100, the former H100
            # default (128x128, split_slices) -> this rule's first hero, kernel time vs cuBLAS: M128 N4096
            # K4096 0.75x -> 1.00x (128x32), N5120 K5120 0.76x -> 0.94x, N8192 K8192 0.93x -> 0.99x, N4096
            # K11008 0.94x -> 0.99x, N2048 K8192 0.78x (4 slices; 6 not timed) -> 0.94x, N1024 K8192 0.59x ->
            # 0.67x; M256 N4096 K4096 0.70x -> 0.99x.
            slices = narrow_split_slices(op, ctas)
            head = self._fill(op, ctas, b_kmajor, (128, 64)) if slices == 1 else []  # M128 N5120: 128x48
            return head + [_hero(64, 8, cluster=1, split_k=slices)] + few
        splits = split_slices(op, ctas)
        if splits > 1:  # few 128x128 tiles: K split so that the pieces fill the SMs
            return [_hero(128, 6, cluster=1, split_k=splits)] + few
        if t128 > ctas and op.m >= 256:  # 256x128 tiles fill the wave (M512 N5120 K5120 0.70x -> 0.74x)
            return self._with_fills(op, ctas, b_kmajor, (256, 128), [_hero(128, 4, bm=256, cluster=1)] + few)
        if op.m >= hopper_tiles.FILL_MIN_ROWS:
            # the 128x128 ping-pong tile next: on an H100 within 2% of the coop one at M512 N4096 K4096 /
            # K11008 and M2048 N1024 K8192, where the 128x64 / 128x256 heroes ran 0.55-0.80x cuBLAS
            # (benchmarks/cuda/probe_prefill.py); first-use tuning times both
            few = few[:1] + [_hero(128, 6, schedule="pingpong", cluster=1)] + few[1:]
        return self._with_fills(op, ctas, b_kmajor, (128, 128), few)

    @staticmethod
    def _fill(op: GemmOp, ctas: int, b_kmajor: bool, current: tuple[int, int]) -> list[PipelineConfig]:
        """The 128-row tile whose width fills the waves (``hopper_tiles.fill_tile``) ahead of the rule's
        ``current`` (tile_m, tile_n) tile, or nothing."""
        bn = hopper_tiles.fill_tile(op, ctas, b_kmajor, current)
        return [] if bn is None else [_hero(bn, hopper_tiles.fill_stages(bn), cluster=1)]

    @classmethod
    def _with_fills(cls, op: GemmOp, ctas: int, b_kmajor: bool, current: tuple[int, int],
                    rule: list[PipelineConfig], narrow: bool = False) -> list[PipelineConfig]:
        """The heroes of a rule whose tile is ``current`` (``rule[0]`` its first hero): the wave-filling width
        first where it replaces that tile (with ``narrow``, a 128x256 rule tile, the deep-ring width of
        ``hopper_tiles.narrow_fill`` first where that applies, else :meth:`_fill`'s), then the runners-up
        the model costs no more than the rule's tile (``hopper_tiles.fill_alternatives``) within the first
        three heroes (what first-use tuning times), then the rule's heroes. Tuning gets other tile widths
        to time instead of near-copies of the default."""
        bn = hopper_tiles.narrow_fill(op, ctas, b_kmajor) if narrow else None
        lead = ([_hero(bn, hopper_tiles.fill_stages(bn), cluster=1)] if bn is not None
                else cls._fill(op, ctas, b_kmajor, current))
        alts = [_hero(bn, hopper_tiles.fill_stages(bn), cluster=1) for bn in
                hopper_tiles.fill_alternatives(op, ctas, b_kmajor, current, tuple(c.tile_n for c in lead))]
        out = lead + alts[:1] + rule if lead else rule[:1] + alts + rule[1:]
        return [c for i, c in enumerate(out) if c not in out[:i]]

    def _kernel(self, spec: WgmmaSpec, profile: DeviceProfile) -> compiler.Kernel:
        return compiler.load(render(spec), KERNEL_NAME, "sm_90a", smem=spec.smem_bytes, threads=spec.threads)

    def prepare(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile) -> Any:
        with toolkit.cupy().cuda.Device(profile.device.index):
            return self._kernel(self.spec(op, config, None), profile)

    #: roles whose pointers live inside TMA tensor maps (the others are plain kernel parameters)
    mapped_roles: tuple[str, ...] = ("a", "b")

    def fast_launch_ok(self, op: GemmOp, config: PipelineConfig) -> bool:
        return self.pitches(op) == (None, None)

    def bind(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        """Tensor maps are built per distinct pointer of the mapped operands (weights: once; torch's caching
        allocator mostly hands activations the same blocks each step) and memoised; every other pointer
        is written into the parameter block per call. Misaligned operands take :meth:`run` (the mma
        fallback)."""
        dev = profile.device.index
        stream = launcher.stream_getter(adapter, dev)
        launcher.refuse_if_capturing(stream(), self.name)
        if not self.fast_launch_ok(op, config):
            return self._bind_run(op, config, profile, adapter)
        ptr, device, name = launcher.pointer_getter(adapter), launcher.on_device(dev), self.name
        r0, r1 = self.roles
        mapped = [i for i, r in enumerate((r0, r1)) if r in self.mapped_roles]
        m0, m1 = 0 in mapped, 1 in mapped
        plain_roles = [r for r in (r0, r1) if r not in self.mapped_roles] + ["out", "bias"]
        # Split-K: counters and partial sums in the stream's split scratch (launcher.split_scratch: kept
        # across calls, the kernel leaves its counters at zero); inside CUDA graph capture one buffer per
        # call from the caller's allocator instead, its counters zeroed by a memset captured with the kernel.
        # Stream-K likewise: its owners re-zero their tiles' counters once every contributor has arrived.
        spec0 = self.spec(op, config, None)
        splits, sk_plan, flag_words, scratch_size = 1, None, 0, 0
        if spec0.split_k:
            splits, tiles, scratch_size = self.split_plan(op, config, profile)
            flag_words = 4 * tiles
        elif spec0.stream_k:
            sk_plan, flag_words, ws_size = self.stream_k_plan(op, config, profile)
            scratch_size = self._flag_floats(-(-flag_words // 4)) + ws_size if ws_size else 0
        if scratch_size:
            plain_roles += ["sk_ws", "sk_flags"]
            factory: list[Any] = []  # bound on the first call (the factory needs an array of the call)
            memset, flag_floats = toolkit.cupy().cuda.runtime.memsetAsync, self._flag_floats(-(-flag_words // 4))
            ws_off, flag_bytes, ws_floats = 4 * flag_floats, 4 * flag_words, scratch_size - flag_floats
            capturing, split_scratch = launcher.is_capturing, launcher.split_scratch
        specs: dict[int, tuple[Any, WgmmaSpec]] = {}

        def kernel_for(out_mod: int) -> tuple[Any, WgmmaSpec]:
            spec = self.spec(op, config, {"out": out_mod})
            with device():
                return self._kernel(spec, profile), spec

        specs[0] = kernel_for(0)
        memo: dict[tuple[int, ...], tuple] = {}
        drv_launch = toolkit.cupy().cuda.driver.launchKernel
        current, single = toolkit.cupy().cuda.runtime.getDevice, launcher.single_device()
        lock = threading.Lock()

        def build(p: tuple[int, ...], out_mod: int) -> tuple:
            ks = specs.get(out_mod)
            if ks is None:
                launcher.refuse_if_capturing(stream(), name)
                ks = specs[out_mod] = kernel_for(out_mod)
            kernel, spec = ks
            sentinels = {r: 0x7E57_0000_0000 + (i + 1) * 0x1000_0000 for i, r in enumerate(plain_roles)}
            ptrs = {**sentinels, r0: p[0] if 0 in mapped else sentinels.get(r0), r1: p[1] if 1 in mapped else
                    sentinels.get(r1), "splits": splits, "sk_plan": sk_plan}
            pa, pb = self.operands(op, None, ptrs, None)  # type: ignore[arg-type]
            grid, cargs = self._build_launch(op, spec, pa, pb, ptrs, profile, kernel)
            back = {v: i for i, v in enumerate(sentinels.values())}
            slots = [(h, back[h.value]) for h in cargs.holders
                     if isinstance(h, ctypes.c_uint64) and h.value in back]
            return int(kernel.function.ptr), grid, spec.threads, spec.smem_bytes, cargs, slots

        def launch(x0: Any, x1: Any, bias: Any, out: Any) -> None:
            p0, p1 = ptr(x0), ptr(x1)
            if (p0 | p1) & 15:  # TMA needs 16-byte aligned bases: the documented mma fallback
                self.run(op, config, OpArgs({r0: x0, r1: x1, "bias": bias}, out, adapter), profile)
                return
            by_pointer(p0, p1, bias, out)

        def by_pointer(p0: int, p1: int, bias: Any, out: Any) -> None:
            """The launch on operands given as 16-byte aligned device addresses (scratch regions)."""
            po = ptr(out)
            key = (p0 if m0 else 0, p1 if m1 else 0, po & 15)
            hit = memo.get(key)
            if hit is None:
                if len(memo) >= 64:
                    memo.clear()
                hit = memo[key] = build((p0, p1), po & 15)
            fptr, (gx, gy, gz), threads, smem, cargs, slots = hit
            pb = po if bias is None else ptr(bias)
            # the per-call pointers in role order: the unmapped operands, out, bias
            values: tuple[int, ...] = ((po, pb) if m0 and m1 else (p1, po, pb) if m0 else (p0, po, pb) if m1
                                       else (p0, p1, po, pb))
            s = stream()
            zero = False
            if scratch_size:
                if capturing(s):
                    if not factory:
                        factory.append(adapter.empty_factory((scratch_size,), DType.F32, out))
                    buf = factory[0](out)  # released after the launch: stream order keeps it for the kernel
                    pbuf, zero = ptr(buf), True
                    values += (pbuf + ws_off, pbuf)
                else:
                    pflags, pws = split_scratch(adapter, out, dev, s, flag_floats, ws_floats)
                    values += (pws, pflags)
            with lock:
                for holder, role in slots:
                    holder.value = values[role]
                try:
                    if single or current() == dev:
                        if zero:
                            memset(pbuf, 0, flag_bytes, s)
                        drv_launch(fptr, gx, gy, gz, threads, 1, 1, smem, s, cargs.address, 0)
                    else:
                        with device():
                            if zero:
                                memset(pbuf, 0, flag_bytes, s)
                            drv_launch(fptr, gx, gy, gz, threads, 1, 1, smem, s, cargs.address, 0)
                except Exception as exc:  # noqa: BLE001
                    raise LaunchError(f"cuLaunchKernel failed: {type(exc).__name__}: {exc}", backend="cuda") from None

        launch.pointer_only = True  # type: ignore[attr-defined]
        launch.by_pointer = by_pointer  # type: ignore[attr-defined]
        return launch

    def run(self, op: GemmOp, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        ra, rb = self.roles
        ptrs: dict[str, Any] = {r: data_ptr(args.arrays[r], r) for r in self.roles}
        ptrs["out"] = data_ptr(args.out, "out")
        bias = args.arrays.get("bias")
        if bias is not None:
            ptrs["bias"] = data_ptr(bias, "bias")
            ptrs["bias_dtype"] = DType.parse(bias.dtype, arg="bias").value
        copied = self.pitches(op)  # operands read from pitched copies may start anywhere
        if any(ptrs[r] % 16 and p is None for r, p in zip(self.roles, copied)):
            # TMA (and 16-byte gathers) need aligned bases: documented fallback
            self._fallback.run(op, self._fallback.hero_configs(op, profile)[0], args, profile)
            return
        cp = toolkit.cupy()
        dev = device_index(args.out)
        key = (op, config, dev, ptrs.get("bias_dtype"), ptrs["out"] % 16)
        with cp.cuda.Device(dev):
            plan = self._plans.get(key)
            if plan is None:
                spec = self.spec(op, config, ptrs)
                plan = (self._kernel(spec, profile), spec)
                self._plans[key] = plan
            kernel, spec = plan
            stream = launch_stream(args)
            pa, pb = self.operands(op, args, ptrs, stream)
            if spec.stream_k:
                self._stream_k_buffers(op, config, profile, args, ptrs)
            if spec.split_k:
                self._split_k_buffers(op, config, profile, args, ptrs, stream)
            # Tensor maps and the packed parameter block depend only on the pointers: cache them so a
            # repeated call costs one dict lookup and one cuLaunchKernel.
            lkey = (key, pa, pb, ptrs["out"], ptrs.get("bias"), ptrs.get("sk_ws"), ptrs.get("sk_flags"),
                    ptrs.get("splits"))
            launch = self._launches.get(lkey)
            if launch is None:
                launch = self._build_launch(op, spec, pa, pb, ptrs, profile, kernel)
                if len(self._launches) > 256:
                    self._launches.clear()
                self._launches[lkey] = launch
            grid, cargs = launch
            tma.launch(kernel.function, grid, spec.threads, spec.smem_bytes, stream, cargs)


class WgmmaGemmTf32(WgmmaGemm):
    """fp32 GEMM on TF32 wgmma (TF32 allowed). TF32 wgmma reads shared-memory operands K-major only:

    - A (M, K) and B stored (N, K): both K-major, as for 16-bit inputs.
    - A (M, K) and B stored (K, N) (``a @ b`` of two row-major matrices): the kernel computes
      C^T = B^T A^T -- B becomes the kernel's MN-major A, read into registers, A its K-major B -- and
      stores C^T column-major, i.e. C row-major. No transpose pass.
    - A stored (K, M) and B (N, K): A is the kernel's register-fed MN-major A.
    - A stored (K, M) and B (K, N): B is first transposed into a cached scratch buffer.
    """

    name = "cuda.gemm.wgmma_tf32"
    description = ("fp32 GEMM on TF32 Tensor Cores for Hopper (fp32_precision high/medium): TMA + wgmma "
                   "m64nNk8, warp-specialised persistent kernel; an MN-major operand is fed to wgmma from "
                   "registers (operands swapped for B stored (K, N))")
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.GEMM, dtypes=frozenset({DType.F32}),
                                out_dtypes=FLOAT_IO, isa=("wgmma", "tma"), min_compute_capability=(9, 0),
                                fp32_precisions=frozenset({Fp32Precision.HIGH, Fp32Precision.MEDIUM}),
                                alignment=4)
    efficiency = 0.7
    pads_rows = False

    def __init__(self) -> None:
        super().__init__()
        from .gemm import MmaGemmTf32  # noqa: PLC0415

        self._fallback = MmaGemmTf32()  # type: ignore[assignment]

    def swapped(self, op: GemmOp) -> bool:
        """Whether the kernel computes C^T = B^T A^T (A (M, K) and B (K, N) both row-major)."""
        return not op.trans_a and not op.trans_b

    def kernel_op(self, op: GemmOp) -> GemmOp:
        """The GEMM as the kernel sees it (M and N exchanged when the operands are swapped)."""
        if self.swapped(op):
            return replace(op, m=op.n, n=op.m, trans_a=True, trans_b=True)
        return op

    def kmajor(self, op: GemmOp) -> tuple[bool, bool]:
        return not op.trans_a, True

    def spec(self, op: GemmOp, config: PipelineConfig, ptrs: dict | None) -> WgmmaSpec:
        if not self.swapped(op):
            return super().spec(op, config, ptrs)
        kop = self.kernel_op(op)
        sp = super().spec(kop, config, ptrs)
        out_align = ptrs is None or ptrs.get("out", 0) % (2 * op.out_dtype.itemsize) == 0
        return replace(sp, out_cm=True, pairs=kop.m % 2 == 0 and out_align, vec_store=False)

    def hero_configs(self, op: GemmOp, profile: DeviceProfile) -> list[PipelineConfig]:
        kop = self.kernel_op(op)
        tiles = -(-kop.m // 128) * -(-kop.n // 256) * kop.batch
        splits = split_slices(kop, profile.compute_units) if tiles < profile.compute_units else 1
        direct = not self.kmajor(kop)[0]  # register-fed A: direct epilogue
        # few tiles: K split (H100, x @ W.T fp32 with TF32: M512 N1024 K8192 0.46x -> 1.24x cuBLAS,
        # M192 N2048 K4096 0.58x -> 1.12x, M256 N4096 K14336 0.49x -> 1.25x)
        first = [_hero(128, 6, cluster=1, split_k=splits, smem_epilogue=not direct)] if splits > 1 else []
        if direct:
            return first + [_hero(256, 4, 16, smem_epilogue=False, cluster=1),
                            _hero(256, 4, smem_epilogue=False, cluster=1),
                            _hero(128, 4, 16, bm=256, smem_epilogue=False, cluster=1),
                            _hero(128, 6, smem_epilogue=False, cluster=1),
                            _hero(256, 4, 16, smem_epilogue=False, cluster=2)]
        return first + [_hero(256, 4, 16, cluster=1), _hero(256, 4, cluster=1), _hero(128, 4, 16, bm=256, cluster=1),
                        _hero(256, 4, 16, cluster=2), _hero(128, 6, cluster=1),
                        _hero(256, 4, 16, cluster=1, stream_k=True)]

    def extra_checks(self, op: GemmOp, profile: DeviceProfile) -> list[str]:
        from .skinny import skinny_tf32_serves  # noqa: PLC0415

        from .hopper_fewrows import fewrows_tf32_serves  # noqa: PLC0415

        reasons = super().extra_checks(op, profile) + served_by(
            skinny_tf32_serves(op, profile), f"M={op.m} rows against an (N, K) weight: cuda.gemm.skinny_tf32 serves "
            "it (H100, x8 @ W.T: this kernel 0.13-0.36x cuBLAS TF32, the skinny one 0.99-1.18x)") + served_by(
            fewrows_tf32_serves(op, profile), f"M={op.m} rows against an (N, K) "
            "weight: cuda.gemm.wgmma_fewrows_tf32 serves it (H200, 17-64 rows: this kernel 0.10-0.94x cuBLAS TF32, "
            "that one 0.78-1.36x)")
        if self.transposes_b(op) and op.k % 4:
            reasons.append(f"K={op.k} is not a multiple of 4: the (N, K) copy of B would have rows TMA cannot "
                           "address (16-byte strides)")
        return reasons

    def transposes_b(self, op: GemmOp) -> bool:
        """A stored (K, M) and B (K, N): B is transposed to (N, K) in scratch first."""
        return not self.swapped(op) and not op.trans_b

    def operands(self, op: GemmOp, args: OpArgs, ptrs: dict, stream: Any) -> tuple[int, int]:
        import numpy as np  # noqa: PLC0415

        if self.swapped(op):
            return ptrs["b"], ptrs["a"]
        pa, pb = ptrs["a"], ptrs["b"]
        if self.transposes_b(op):
            tk = helpers_kernels.transposer(DType.F32, "sm_90a")
            buf = scratch_buffer(args, op.batch * op.n * op.k)
            ptrs.setdefault("_keep", []).append(buf)  # alive until the GEMM reading it is enqueued
            tk.launch((-(-op.n // 32), -(-op.k // 32), op.batch),
                      (np.uint64(pb), np.uint64(data_ptr(buf, "b")), np.int32(op.k), np.int32(op.n)), stream)
            pb = data_ptr(buf, "b")
        return pa, pb

    def fast_launch_ok(self, op: GemmOp, config: PipelineConfig) -> bool:
        return super().fast_launch_ok(op, config) and not self.transposes_b(op)

    def preload(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile) -> None:
        super().preload(op, config, profile)
        if self.transposes_b(op):
            helpers_kernels.transposer(DType.F32, "sm_90a")


class WgmmaGemm3xTf32(WgmmaGemmTf32):
    """fp32-accurate GEMM (``fp32_precision="highest"``) on TF32 wgmma: one pass splits A and B into
    K-major (small, big, big) / (big, small, big) TF32 parts three times as wide along K, then the TF32
    kernel runs K' = 3K with each stage accumulated into a fresh partial sum added with FADD (Tensor
    Core accumulation truncates; this keeps long-K error at fp32 level)."""

    name = "cuda.gemm.wgmma_3xtf32"
    description = ("fp32-accurate GEMM for Hopper: 3xTF32 split written K-major in one pass, TF32 wgmma over "
                   "3K with per-stage partial sums (rel. error ~1e-6)")
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.GEMM, dtypes=frozenset({DType.F32}),
                                out_dtypes=FLOAT_IO, isa=("wgmma", "tma"), min_compute_capability=(9, 0),
                                fp32_precisions=frozenset({Fp32Precision.HIGHEST}), alignment=4)
    efficiency = 0.6  # of the TF32 peak over 3x the FLOPs (measured 2.1-2.3x cuBLAS SGEMM on an H200)

    def __init__(self) -> None:
        super().__init__()
        from .gemm import MmaGemm3xTf32  # noqa: PLC0415

        self._fallback = MmaGemm3xTf32()  # type: ignore[assignment]

    def swapped(self, op: GemmOp) -> bool:
        return False  # the split pass writes both operands K-major

    def kmajor(self, op: GemmOp) -> tuple[bool, bool]:
        return True, True

    def spec(self, op: GemmOp, config: PipelineConfig, ptrs: dict | None) -> WgmmaSpec:
        return replace(super().spec(op, config, ptrs), split_acc=True,
                       partial_stages=int(config.get("partial_stages") or 1))

    def hero_configs(self, op: GemmOp, profile: DeviceProfile) -> list[PipelineConfig]:
        return [_hero(128, 4, cluster=c).replace(partial_stages=8) for c in (1, 2)] + [
            _hero(128, 5, cluster=1).replace(partial_stages=4), _hero(128, 4, cluster=1).replace(partial_stages=4),
            _hero(128, 4, 16, cluster=1).replace(partial_stages=8)]

    def extra_checks(self, op: GemmOp, profile: DeviceProfile) -> list[str]:
        from .rows_fma import rows_fma_serves  # noqa: PLC0415
        from .rows_kn import rows_kn_serves  # noqa: PLC0415

        reasons = WgmmaGemm.extra_checks(self, op, profile) + served_by(
            rows_kn_serves(op, profile), f"M={op.m} rows against a (K, N) row-major B: cuda.gemm.rows_kn serves it "
            "(H100, x @ B(8192x1024) fp32: this kernel 0.05-0.10x cuBLAS SGEMM, rows_kn 0.66-1.21x)") + served_by(
            rows_fma_serves(op, profile), f"M={op.m} rows against an (N, K) weight: cuda.gemm.rows_fma serves it")
        if op.k % 4:
            reasons.append(f"K={op.k} is not a multiple of 4: the split operands' rows (3K floats) would not be "
                           "16-byte aligned for TMA")
        return reasons

    def estimate_seconds(self, op: GemmOp, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        """The roofline plus the split pass's traffic: A and B are read, written three times as wide and read
        again by the GEMM (7x their bytes), which dominates few-row products against a weight (H100,
        fp32-exact x8 @ W4096x4096.T: 0.19x cuBLAS where the plain roofline had ranked it first)."""
        split = 6 * (op.m + op.n) * op.k * op.batch * 4 / (max(profile.bandwidth_gbs, 1.0) * 1e9)
        return super().estimate_seconds(op, profile, config) + split

    def split_op(self, op: GemmOp) -> GemmOp:
        """The TF32 GEMM the split operands feed: K' = 3K, both operands K-major."""
        return replace(op, k=3 * op.k, trans_a=False, trans_b=True)

    def fast_launch_ok(self, op: GemmOp, config: PipelineConfig) -> bool:
        return False  # two split passes into scratch, then the GEMM

    def preload(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile) -> None:
        self.prepare(self.split_op(op), config, profile)
        helpers_kernels.splitter("sm_90a")

    def _split_args(self, op: GemmOp) -> list[tuple[str, int, int, int, int, int]]:
        """Per operand: (role, scratch floats, rows r and columns c of what the splitter reads, its
        transposed flag, its part order) -- one splitter launch each."""
        out = []
        for role, rows, trans, order in (("a", op.m, op.trans_a, 0), ("b", op.n, not op.trans_b, 1)):
            r, c = (op.k, rows) if trans else (rows, op.k)
            out.append((role, op.batch * rows * 3 * op.k, r, c, 0 if trans else 1, order))
        return out

    def bind(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        """Two pointer-only launches per call (A and B split into TF32 parts in one scratch buffer from the
        caller's allocator, then the TF32 kernel over 3K) instead of the multi-launch :meth:`run` path and its
        per-call Python; stream-K configs keep :meth:`run`."""
        if bool(config.get("stream_k", False)):
            return self._bind_run(op, config, profile, adapter)

        dev = profile.device.index
        stream = launcher.stream_getter(adapter, dev)
        launcher.refuse_if_capturing(stream(), self.name)
        inner = _PreSplit().bind(self.split_op(op), config, profile, adapter)
        with toolkit.cupy().cuda.Device(dev):
            sk = helpers_kernels.splitter("sm_90a", pair=True)
        (_, size0, *ints0), (_, size1, *ints1) = self._split_args(op)
        jobs = [((-(-c // 32), -(-r // 32), op.batch), (r, c, flag, order)) for r, c, flag, order in (ints0, ints1)]
        return launcher.with_prepasses(adapter, dev, stream, (size0, size1), DType.F32,
                                       launcher.pair_launch(sk.function, *jobs), inner)

    def run(self, op: GemmOp, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        import numpy as np  # noqa: PLC0415

        cp = toolkit.cupy()
        dev = device_index(args.out)
        with cp.cuda.Device(dev):
            stream = launch_stream(args)
            sk = helpers_kernels.splitter("sm_90a")
            bufs = {}
            for role, size, r, c, flag, order in self._split_args(op):
                buf = scratch_buffer(args, size)
                sk.launch((-(-c // 32), -(-r // 32), op.batch),
                          (np.uint64(data_ptr(args.arrays[role], role)), np.uint64(data_ptr(buf, role)), np.int32(r),
                           np.int32(c), np.int32(flag), np.int32(order)), stream)
                bufs[role] = buf
            op3 = self.split_op(op)
            inner = OpArgs({**args.arrays, "a": bufs["a"], "b": bufs["b"]}, args.out, args.adapter)
            WgmmaGemm.run(self, op3, config, inner, profile)


class _PreSplit(WgmmaGemm3xTf32):
    """The 3xTF32 GEMM's kernel over operands already split (the inner launch of
    :meth:`WgmmaGemm3xTf32.bind`, given the split op); not registered as a variant."""

    def fast_launch_ok(self, op: GemmOp, config: PipelineConfig) -> bool:
        return not bool(config.get("stream_k", False))

    bind = WgmmaGemm.bind
    run = WgmmaGemm.run  # type: ignore[assignment]


HOPPER_VARIANTS = [WgmmaGemm, WgmmaGemmTf32, WgmmaGemm3xTf32]
