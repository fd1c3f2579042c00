"""Hopper conv2d variant: implicit GEMM on the warp-specialised wgmma kernel (sm_90a).

The producer warpgroup gathers the activation tile with ``cp.async`` (see :mod:`..emit.im2col`) and
loads the weight tile with TMA; two consumer warpgroups run ``wgmma``. NHWC f16/bf16 directly;
fp32 as TF32 (TF32 allowed); NCHW (every dtype: a 16-bit model not converted to channels_last is NCHW)
through one transpose of x and w to channels-last scratch buffers (the output is stored NCHW by the
kernel) -- but not 16-bit NCHW 1x1 stride-1 convs, which ``cuda.conv2d.wgmma_nchw1x1`` reads in place. Any channel count in whole 16-byte runs (8 16-bit / 4 fp32 channels: MobileNet / EfficientNet /
DenseNet widths such as 24, 40, 80, 96, 112, 160 as well as multiples of 64); fp32-accurate (``highest``)
convs, other channel counts (an RGB stem below 65,536 output rows), grouped convs and misaligned pointers
are served by ``cuda.conv2d.implicit_mma``.
"""

from __future__ import annotations

import ctypes
from dataclasses import replace
from typing import Any

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType, Fp32Precision
from tracea.errors import UnsupportedConfigError
from tracea.ir.ops import Conv2dOp, LayerType, Layout
from tracea.semantic.config import BarrierMode, PipelineConfig, SwizzleMode
from tracea.semantic.search_space import SearchSpace

from .. import helpers_kernels, launcher, tma, toolkit
from ..arrays import data_ptr
from ..device import resident_sms
from ..emit import im2col, operands
from ..emit.wgmma import WgmmaSpec
from .base import FLOAT_IO, aligned
from .conv import (PAD_FIRST_ROWS, ImplicitGemmConv, can_pad, channel_pad_prepass, channels_last_prepass,
                   pad_channels, to_channels_last)
from .hopper import WgmmaGemm, _hero, narrow_store
from .pooled import pooled_reasons


#: output rows from which an NHWC conv with fewer channels than one 16-byte run (RGB stems) is served, its x
#: and w padded by a pre-pass. H200, user path: the batch-32 fp16 stem 0.84x -> 0.99x cuDNN (device 187 ->
#: 163 us); at batch 1 (12544 rows) device 25.8 -> 10.0 us, but the pre-pass launch and its scratch made the
#: host-bound call slower (39.1 -> 45.3 us, torch 41.1), so implicit_mma's scalar gathers keep it
PAD_ROWS = PAD_FIRST_ROWS
#: K-tiles (128-byte channel slices of one (r, s)) a tile must have before its K is split. The split launch
#: costs host time (its scratch allocation and the counters' memset): on an H200, batch 1, user path, the
#: split hero took fp32 NCHW 512->512 3x3 at 7^2 (144 K-tiles) from 60.5 to 46.8 us and 512->256 at 32^2
#: from 52.6 to 34.8 us, but at 72 K-tiles (fp32 256->256 at 14^2, fp16 512->512 at 7^2) the device time
#: it saved (26.6 -> 20.0, 19.6 -> 14.0 us) went to the host: 47.8 -> 56.2, 49.9 -> 60.4 us. Measured with a
#: per-call scratch and memset; since then the counters and partial sums live in the stream's split scratch
#: (launcher.split_scratch), so the cut may now sit lower (not re-measured)
SPLIT_MIN_K_TILES = 96
#: K-tiles each slice keeps at least (the stage ring's fill latency is paid once per slice)
SPLIT_SLICE_K_TILES = 4
#: most slices (an owning warp adds S - 1 partial row blocks)
SPLIT_MAX = 16


#: what the Hopper conv variants take: f16 / bf16, fp32 as TF32 (``high`` / ``medium``), no groups, sm_90a
HOPPER_CONV_REQUIREMENTS = Requirements(device_kind="cuda", op_kind=LayerType.CONV2D,
                                        dtypes=frozenset({DType.F16, DType.BF16, DType.F32}), out_dtypes=FLOAT_IO,
                                        isa=("wgmma", "tma"), min_compute_capability=(9, 0), groups=False,
                                        fp32_precisions=frozenset({Fp32Precision.HIGH, Fp32Precision.MEDIUM}))


def conv_split_hero(op: Conv2dOp, profile: DeviceProfile, smem_epilogue: bool) -> list[PipelineConfig]:
    """The split-K hero (coop 128 x ``bn``, ``split_k`` slices) for a conv whose output tiles fill less than
    half of the SMs with a long reduction (batch-1 / small-spatial layers: 512->512 3x3 at 7^2, batch 1,
    is 4 tiles of 128x128 over 144 fp32 K-tiles), else none. The tile width is the one giving more pieces."""
    m, n, kdim = op.gemm_mnk
    ctas = resident_sms(profile)
    k_tiles = kdim // WgmmaConv.slice_channels(op)
    best: tuple[int, int, int] | None = None  # (pieces, bn, slices)
    for bn in (128, 64):
        tiles = -(-m // 128) * -(-n // bn)
        if 2 * tiles > ctas or k_tiles < SPLIT_MIN_K_TILES:
            continue
        s = min(SPLIT_MAX, ctas // tiles, k_tiles // SPLIT_SLICE_K_TILES)
        if s >= 2 and (best is None or tiles * s > best[0]):
            best = (tiles * s, bn, s)
    if best is None:
        return []
    return [_hero(best[1], 4, smem_epilogue=smem_epilogue, split_k=best[2])]


#: relative throughput of the hero tiles of :func:`few_wave_cost` ((tile_m, tile_n, schedule) -> share of the
#: 128x128 coop tile's work per unit time), fitted to the device time of the four tiles on 49 fp16 NHWC convs
#: whose 128x128 grid is under two waves (ResNet-50 3x3 / 1x1 layers and DenseNet / MobileNet / EfficientNet
#: widths 48-320, batch 1 / 8 / 32; H100, CUDA graphs, ``benchmarks/cuda/probe_conv_tiles.py``): the rule's choice
#: averaged 1.009x the best tile's time (worst 1.11x), the fixed order it replaced (64x128 ping-pong first)
#: 1.13x (worst 1.74x: 160->160 3x3 at 14^2 batch 32, 26.2 us against 15.6 us for 128x128)
FEW_WAVE_SHARE = {(128, 128, "coop"): 1.0, (64, 128, "pingpong"): 0.55, (128, 64, "coop"): 0.45,
                  (64, 64, "pingpong"): 0.42}


def few_wave_cost(m: int, n: int, config: PipelineConfig, ctas: int) -> float:
    """Modelled time of a hero tile on a conv's implicit GEMM (``m`` x ``n``) of less than two 128x128 waves:
    the busiest CTA's share of the output (its tiles, ``ceil(tiles / ctas)``, times the tile's area) over the
    tile's relative throughput (:data:`FEW_WAVE_SHARE`; the reduction length is the same for every tile). A
    128x128 tile wins when its grid is one wave that narrower tiles would make two (b32 160->160 at 14^2:
    98 tiles); narrower tiles win where they put more SMs to work within the same number of rounds."""
    bm, bn = config.tile_m, config.tile_n
    share = FEW_WAVE_SHARE.get((bm, bn, str(config.get("schedule") or "coop")), 0.4)
    tiles = -(-m // bm) * -(-n // bn)
    return -(-tiles // max(ctas, 1)) * bm * bn / share


class WgmmaConv(WgmmaGemm):
    name = "cuda.conv2d.wgmma"
    description = ("conv2d implicit GEMM for Hopper: cp.async im2col gather + TMA weights into 128B-swizzled "
                   "stages, wgmma consumers, persistent grid, fused epilogue; NHWC f16/bf16, f32 as TF32 (NCHW via "
                   "a channels-last transpose)")
    requirements = HOPPER_CONV_REQUIREMENTS
    efficiency = 0.75
    priority = 20
    roles = ("x", "w")
    mapped_roles = ("w",)

    def __init__(self) -> None:
        super().__init__()
        self._fallback = ImplicitGemmConv()  # type: ignore[assignment]

    @staticmethod
    def slice_channels(op: Conv2dOp) -> int:
        """Channels in one 128-byte reduction slice (one K-tile)."""
        return 128 // op.dtype.storage.itemsize

    @staticmethod
    def kernel_op(op: Conv2dOp) -> Conv2dOp:  # type: ignore[override]
        """The conv the kernel computes: an NHWC conv with fewer channels than one 16-byte run (RGB stems)
        padded with zero channels to one run (x and w padded by a pre-pass); else ``op``."""
        return replace(op, c=16 // op.dtype.storage.itemsize) if can_pad(op) else op

    @classmethod
    def gathers(cls, op: Conv2dOp) -> bool:
        """Whether the producer gathers ``op``'s channels: C in whole 16-byte chunks (a multiple of the
        128-byte slice: one (r, s) per K-tile; any other multiple of the chunk: each chunk its own (r, s))."""
        return op.c % (16 // op.dtype.storage.itemsize) == 0

    def extra_checks(self, op: Conv2dOp, profile: DeviceProfile) -> list[str]:
        reasons = pooled_reasons(op, profile)
        bke, epc = self.slice_channels(op), 16 // op.dtype.storage.itemsize
        m, _, _ = op.gemm_mnk
        if can_pad(op) and m < PAD_ROWS:
            reasons.append(f"C={op.c} with {m} output rows: the channel-pad pre-pass costs more host time than it "
                           f"saves below {PAD_ROWS} rows; cuda.conv2d.implicit_mma's scalar gathers serve it")
        elif not can_pad(op) and not self.gathers(op):
            reasons.append(f"C={op.c} is not a multiple of {epc} channels (whole 16-byte runs, which the producer's "
                           "cp.async copies move); cuda.conv2d.implicit_mma serves it")
        elif op.c % bke and self.kernel_op(op).gemm_mnk[2] < 2 * bke:
            # H200, 32->16 1x1 fp16 NHWC at 112^2 batch 32: 54.6 us here (a half-empty K-tile, 16 of 64
            # columns) against 23.9 us for cuda.conv2d.pointwise and 35 us for implicit_mma
            reasons.append(f"C*R*S={op.c * op.r * op.s} is less than two {bke}-channel K-tiles: most of each "
                           "K-tile would be zeros; cuda.conv2d.pointwise / implicit_mma serve it")
        if operands.pixels_contiguous(op) and op.dtype.storage is DType.F32:
            reasons.append("NCHW 1x1 stride-1 conv: cuda.conv2d.wgmma_nchw1x1 (TF32) and cuda.conv2d.implicit_mma read "
                           "its 16-byte pixel runs directly, without this variant's channels-last transpose (implicit_mma "
                           "measured 2.7x faster on an H200 at 256->64@56)")
        elif operands.pointwise_nchw(op) and op.dtype.storage is not DType.F32:
            # H100, fp16 in CUDA graphs: the transpose path ran 0.40-0.96x cuDNN outside a narrow window (b32
            # 256->64@56^2 113 us against 47 us); cuda.conv2d.wgmma_nchw1x1 1.06-5.0x on ResNet-50 / MobileNetV2
            # layers, and as fast or faster inside that window (b8 128->512@28^2 7.6 us against 15.1 us)
            reasons.append("16-bit NCHW 1x1 stride-1 conv: cuda.conv2d.wgmma_nchw1x1 reads x in place as a batched "
                           "GEMM, without this variant's channels-last transpose of x")
        if max(op.n * max(op.c, epc) * op.h * op.w, m + 256, op.n * op.k * op.p * op.q) >= 2**31 - 2**20:
            reasons.append("tensor larger than the 32-bit index range")
        return reasons

    def spec(self, op: Conv2dOp, config: PipelineConfig, ptrs: dict | None) -> WgmmaSpec:
        op = self.kernel_op(op)
        if config.tile_k != 64 or config.warps != 12:
            raise UnsupportedConfigError("the wgmma kernel needs tile_k=64 and warps=12 (3 warpgroups)")
        bias_dtype = DType.parse(ptrs["bias_dtype"]) if ptrs and "bias_dtype" in ptrs else op.out_dtype
        osize = op.out_dtype.itemsize
        nchw = op.layout is Layout.NCHW
        pairs = op.k % 2 == 0 and aligned(ptrs, "out", 2 * osize)
        vec_store = op.k % (16 // osize) == 0 and aligned(ptrs, "out")
        return WgmmaSpec(op.dtype.storage, op.out_dtype, bias_dtype, op.epilogue, True, True, pairs, vec_store,
                         narrow_store=narrow_store(op.k * osize, ptrs),
                         bn=config.tile_n, stages=config.stages, group_m=int(config.get("group_m") or 8),
                         bm=config.tile_m, schedule=str(config.get("schedule") or "coop"),
                         smem_epilogue=bool(config.get("smem_epilogue", True)) and not nchw,
                         conv=im2col.ConvGather.of(op), store=operands.conv_output(op, pairs) if nchw else None,
                         split_k=int(config.get("split_k") or 1) > 1)

    def split_plan(self, op: Conv2dOp, config: PipelineConfig, profile: DeviceProfile) -> tuple[int, int, int]:
        """Split-K of ``config`` on the conv's implicit GEMM: (slices S, tiles, float32 scratch elements), as
        :meth:`WgmmaGemm.split_plan` (S capped at the K-tiles -- one (r, s) and one 128-byte channel slice
        each -- and at the resident SMs / tiles, so all pieces of a tile run at once)."""
        spec = self.spec(op, config, None)
        m, n, kdim = self.kernel_op(op).gemm_mnk
        tiles = -(-m // spec.bm) * -(-n // spec.bn)
        k_tiles = -(-kdim // self.slice_channels(op))
        splits = max(1, min(int(config.get("split_k") or 1), k_tiles, resident_sms(profile) // tiles))
        return splits, tiles, (self._flag_floats(tiles) + tiles * splits * spec.bm * spec.bn if splits > 1 else 0)

    def search_space(self, op: Conv2dOp, profile: DeviceProfile) -> SearchSpace:
        nchw = op.layout is Layout.NCHW
        return (SearchSpace().tile_m([64, 128]).tile_n([64, 128, 256]).tile_k([64]).stages([3, 4, 5, 6, 7])
                .warps([12]).swizzles([SwizzleMode.XOR8]).barrier_modes([BarrierMode.PRODUCER_CONSUMER])
                .param("group_m", [4, 8, 16]).param("schedule", ["coop", "pingpong"])
                .param("smem_epilogue", [False] if nchw else [True, False]).param("split_k", [1, 2, 4, 8, 16])
                .where(lambda c: bool(self.validate_config(op, c, profile)) or "invalid"))  # type: ignore[arg-type]

    def hero_configs(self, op: Conv2dOp, profile: DeviceProfile) -> list[PipelineConfig]:
        m, n, _ = op.gemm_mnk
        epi = op.layout is not Layout.NCHW
        wide = [_hero(256, 4, smem_epilogue=epi), _hero(128, 6, smem_epilogue=epi),
                _hero(128, 6, schedule="pingpong", smem_epilogue=epi)]
        narrow = [_hero(64, 7, smem_epilogue=epi), _hero(128, 6, bm=64, schedule="pingpong", smem_epilogue=epi),
                  _hero(64, 7, bm=64, schedule="pingpong", smem_epilogue=epi)]
        split = conv_split_hero(op, profile, epi)
        if n <= 64:
            return split + [narrow[0], narrow[2]]
        tiles = -(-m // 128) * -(-n // 128)
        if tiles >= 2 * profile.compute_units:
            # A 256-wide tile over fewer than 256 output channels computes a half-empty tile: fp16 NHWC
            # n32 128->128 3x3 at 112^2 ran 219 TF/s with it first, 570 (coop) / 604 (ping-pong) with
            # 128-wide tiles, paired on an H200.
            return (wide if n >= 256 else [wide[1], wide[2], wide[0]]) + narrow[:1]
        few = [_hero(128, 6, smem_epilogue=epi), narrow[1], narrow[0], narrow[2]]
        return split + sorted(few, key=lambda c: few_wave_cost(m, n, c, resident_sms(profile))) + [wide[0]]

    def operands(self, op: Conv2dOp, args: OpArgs, ptrs: dict, stream: Any) -> tuple[int, int]:
        """Device pointers of x and w as the kernel reads them: NCHW x and KCRS w are transposed to
        NHWC / KRSC scratch buffers first (same stream, so ordered)."""
        if can_pad(op):
            x_p, w_p = pad_channels(op, self.kernel_op(op), ptrs["x"], ptrs["w"], args, stream, "sm_90a")
            ptrs.setdefault("_keep", []).extend((x_p, w_p))
            return data_ptr(x_p, "x"), data_ptr(w_p, "w")
        if op.layout is not Layout.NCHW:
            return ptrs["x"], ptrs["w"]
        x_t, w_t = to_channels_last(op, ptrs["x"], ptrs["w"], args, stream, "sm_90a", rounds_tf32(op))
        ptrs.setdefault("_keep", []).extend((x_t, w_t))  # alive until the conv reading them is enqueued
        return data_ptr(x_t, "x"), data_ptr(w_t, "w")

    def fast_launch_ok(self, op: Conv2dOp, config: PipelineConfig) -> bool:
        return op.layout is Layout.NHWC and not can_pad(op) and not bool(config.get("stream_k", False))

    def bind(self, op: Conv2dOp, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        """NHWC: the one-kernel launcher. NCHW: two pointer-only launches per call -- x and w
        transposed by one launch into one channels-last scratch buffer (from the caller's allocator, on the
        launch stream), then the conv reading them -- with no per-call Python beyond the allocations (the multi-launch
        :meth:`run` path cost ~40 us of host time per call on an H100 host, more than most batch-1
        layers take on the GPU). NHWC with fewer channels than one 16-byte run (RGB stems) likewise, x and w
        padded with zero channels by the first launch."""
        pad = can_pad(op)
        if (op.layout is not Layout.NCHW and not pad) or bool(config.get("stream_k", False)):
            return super().bind(op, config, profile, adapter)  # type: ignore[arg-type]
        dev = profile.device.index
        stream = launcher.stream_getter(adapter, dev)
        launcher.refuse_if_capturing(stream(), self.name)
        kop = self.kernel_op(op)
        inner = _PreparedInputs().bind(kop, config, profile, adapter)  # type: ignore[arg-type]
        with toolkit.cupy().cuda.Device(dev):
            sizes, prepass = (channel_pad_prepass(op, kop, "sm_90a") if pad
                              else channels_last_prepass(op, "sm_90a", rounds_tf32(op)))
        return launcher.with_prepasses(adapter, dev, stream, sizes, op.dtype, prepass, inner)

    def preload(self, op: Conv2dOp, config: PipelineConfig, profile: DeviceProfile) -> None:
        self.prepare(op, config, profile)  # type: ignore[arg-type]
        if op.layout is Layout.NCHW:
            helpers_kernels.transposer(op.dtype, "sm_90a", pair=True, round_tf32=rounds_tf32(op))
        if can_pad(op):
            helpers_kernels.padder(op.dtype, "sm_90a")

    def _build_launch(self, op: Conv2dOp, spec: WgmmaSpec, px: int, pw: int, ptrs: dict, profile: DeviceProfile,
                      kernel: Any = None):
        m, n, k = self.kernel_op(op).gemm_mnk
        w_map = tma.tiled_map(pw, spec.dtype_in, (k, n, 1), (self.slice_channels(op), spec.bn, 1))
        tiles = -(-m // spec.bm) * -(-n // spec.bn)
        grid, sk = (min(tiles, profile.compute_units), 1, 1), []
        if spec.split_k:  # one CTA per (tile, K slice), all resident (split_plan); slices given at launch
            splits = int(ptrs["splits"])
            grid = (min(tiles * splits, resident_sms(profile)), 1, 1)
            sk = [ctypes.c_uint64(ptrs.get("sk_ws", 0)), ctypes.c_uint64(ptrs.get("sk_flags", 0)),
                  ctypes.c_int32(tiles), ctypes.c_int32(splits - 1)]
        return grid, tma.pack([
            w_map, ctypes.c_uint64(px), *sk, ctypes.c_uint64(ptrs["out"]),
            ctypes.c_uint64(ptrs.get("bias") or ptrs["out"]),
            ctypes.c_int32(m), ctypes.c_int32(n), ctypes.c_int32(k), ctypes.c_int32(1)])


def rounds_tf32(op: Conv2dOp) -> bool:
    """Whether the NCHW pre-pass writes x and w rounded to TF32 (float32: this kernel's TF32 tensor cores
    would truncate them; rounded first, the products carry round-to-nearest error, as cuDNN's do)."""
    return op.dtype.storage is DType.F32


class _PreparedInputs(WgmmaConv):
    """The conv kernel reading x and w already rewritten by :meth:`WgmmaConv.bind`'s pre-pass (NCHW float32
    transposed to channels-last, or NHWC padded to one 16-byte channel run; bound on the padded op): the
    inner launch; not registered as a variant."""

    def operands(self, op: Conv2dOp, args: OpArgs, ptrs: dict, stream: Any) -> tuple[int, int]:
        return ptrs["x"], ptrs["w"]

    def fast_launch_ok(self, op: Conv2dOp, config: PipelineConfig) -> bool:
        return not bool(config.get("stream_k", False))

    bind = WgmmaGemm.bind  # type: ignore[assignment]


HOPPER_CONV_VARIANTS = [WgmmaConv]
