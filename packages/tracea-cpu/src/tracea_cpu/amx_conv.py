"""bf16 conv2d on AMX tiles (``cpu.conv2d.amxbf16``): NCHW and NHWC, groups, stride, padding, dilation,
the fused epilogues, fp32 accumulation, bf16 or fp32 output (kernel: :mod:`.emit.amx_conv`).

Weight panels. The kernel reads the weights as VNNI panels. Packing them costs as much as the whole
convolution of a deep layer at batch 1 (512@7^2: ~0.4 ms against ~0.3 ms), so the panels of an unchanged
**torch** weight are kept between calls (:mod:`.panel_cache`: what it sees and what it cannot;
``TRACEA_CPU_WEIGHT_CACHE=0`` packs on every call, as NumPy weights always are).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType
from tracea.errors import BackendError, DTypeError
from tracea.ir.ops import Conv2dOp, Layout, LayerType, Op
from tracea.semantic import PipelineConfig, SearchSpace
from tracea.semantic.config import VALID, Validity

from . import kernels
from .amx import AMX_EFFICIENCY, amx_bf16_reasons, amx_peak_gflops, amx_permission
from .bf16 import bf16_operand, f32_operand, widened_bias
from .emit.amx_conv import PARAMS, check_conv_tile
from .isa import AMX_BF16
from .host_load import thread_picker
from .panel_cache import PANELS
from .variant_base import CpuVariant, _check_rc, _require, _requested_threads, _threads_problem

#: tile blocks offered (MR pixels x NR output channels); the heroes order them per op (hero_configs)
CONV_TILES = ((32, 32), (32, 16), (64, 16), (48, 16), (16, 64), (16, 32))
#: weight-panel run sizes (KiB) a work item walks while its pixels stay put
WBLK = (512, 256, 1024)
#: K chunk budgets (KiB of a panel; whole taps, whole kernel rows when they fit) walked by a group of
#: ``mbg`` pixel blocks with their partial sums in an fp32 scratch. The default (a budget larger than any
#: panel) is one chunk: chunking did not measure faster on the ResNet layers (2-core Xeon, load 4-6).
KST = (4096, 24, 48)
#: fewest input and output channels per group the variant takes (see ``check``)
MIN_GROUP_CHANNELS = 4
MBG = (1, 8, 16)




class CpuConv2dAmxVariant(CpuVariant):
    """Implicit-GEMM bf16 conv2d on AMX tiles: A tiles loaded in place from a zero-padded NHWC copy of the
    input, VNNI weight panels, MR x NR tile blocks accumulated over the whole K, fused fp32 epilogue."""

    def __init__(self) -> None:
        self.isa = AMX_BF16
        self.priority = 45
        self.name = "cpu.conv2d.amxbf16"
        self.description = "implicit-GEMM bf16 conv2d on AMX tiles (NCHW/NHWC, fp32 accumulate), fused epilogue"
        self.requirements = Requirements(device_kind="cpu", op_kind=LayerType.CONV2D, dtypes=frozenset({DType.BF16}),
                                         out_dtypes=frozenset({DType.BF16, DType.F32}), isa=AMX_BF16.requires)

    def check(self, op: Op, profile: DeviceProfile) -> list[str]:
        reasons = super().check(op, profile)
        if isinstance(op, Conv2dOp) and min(op.c // op.groups, op.k // op.groups) < MIN_GROUP_CHANNELS:
            # a group's channels fill tile rows of 32 and tile columns of 16: depthwise-like groups
            # would compute 16-512x the products
            reasons.append(f"groups of {op.c // op.groups} input / {op.k // op.groups} output channels: AMX "
                           f"tiles need at least {MIN_GROUP_CHANNELS} of each per group")
        return amx_bf16_reasons(reasons)

    def efficiency_on(self, profile: DeviceProfile) -> float:
        return AMX_EFFICIENCY

    def estimate_seconds(self, op: Op, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        assert isinstance(op, Conv2dOp)
        cg = op.c // op.groups
        # channels padded to whole tile rows of K (32), pixels and output channels to whole tiles
        waste = (-(-cg // 32) * 32 / cg) * (-(-op.q // 16) * 16 / op.q) * (-(-(op.k // op.groups) // 16) * 16 / (op.k // op.groups))
        flop_time = op.flops * waste / (amx_peak_gflops(profile) * 1e9 * AMX_EFFICIENCY)
        memory = op.min_bytes / ((profile.bandwidth_gbs or 20.0) * 1e9)
        return max(flop_time, memory) + 15e-6

    def search_space(self, op: Op, profile: DeviceProfile) -> SearchSpace:
        threads = [0, 1] if profile.compute_units > 1 else [1]
        return (SearchSpace().param("mr", [16, 32, 48, 64]).param("nr", [16, 32, 64]).param("wblk", list(WBLK))
                .param("kst", list(KST)).param("mbg", list(MBG)).param("threads", threads)
                .where(lambda c: (c.get("mr"), c.get("nr")) in CONV_TILES
                       or f"AMX conv block {c.get('mr')}x{c.get('nr')} not offered"))

    def hero_configs(self, op: Op, profile: DeviceProfile) -> list[PipelineConfig]:
        tiles = list(CONV_TILES)
        if isinstance(op, Conv2dOp) and 32 < op.c // op.groups <= 128:
            # measured (one thread, NHWC 128@28^2): 32 x 16 1.86-1.88 TFLOP/s, 32 x 32 1.54-1.58, 64 x 16
            # 1.48-1.66; with 256 channels 32 x 32 led (1.76-1.83 against 1.51-1.54). 64 channels (NHWC
            # 64@56^2 batch 8, thread CPU time, medians of 15, 2026-11-26): 32 x 16 1.26x F.conv2d, 32 x 32
            # 1.12x, 48 x 16 / 64 x 16 1.19-1.20x; 32 channels: 32 x 32 and 32 x 16 alike (1.08-1.10x)
            tiles.remove((32, 16))
            tiles.insert(0, (32, 16))
        return [PipelineConfig(params=(("mr", mr), ("nr", nr), ("wblk", WBLK[0]), ("kst", KST[0]), ("mbg", MBG[0]),
                                       ("threads", 0))) for mr, nr in tiles]

    def validate_config(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        mr, nr = config.get("mr"), config.get("nr")
        values = dict(mr=mr, nr=nr, wblk=config.get("wblk", WBLK[0]), kst=config.get("kst", KST[0]),
                      mbg=config.get("mbg", MBG[0]))
        for name, v in values.items():
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                return Validity(False, f"param {name}={v!r} must be a positive integer")
            if name in ("wblk", "kst", "mbg") and v > kernels.MAX_BLOCK:
                return Validity(False, f"param {name}={v} exceeds {kernels.MAX_BLOCK}")
        why = check_conv_tile(mr, nr) or _threads_problem(config)
        return Validity(False, why) if why else VALID

    def library(self, mr: int, nr: int, epilogue_key: str) -> Any:
        """The compiled ``tc_conv2d`` library for one tile block and epilogue chain."""
        why = amx_permission()
        if why:
            raise BackendError(why, backend="cpu")
        return kernels.amx_conv_library(mr, nr, epilogue_key)

    def prepare(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Any:
        return _conv_plan(self, op, config, self.threads(op, config, profile))

    def bind(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        assert isinstance(op, Conv2dOp)
        lib, shared, geometry = self.prepare(op, config, profile)
        prm = (ctypes.c_long * len(shared))(*shared)  # this launcher's own block: it sets the thread count
        slot = PARAMS.index("nth")
        pick = thread_picker(prm[slot], _requested_threads(config))
        fn, ptr, has_bias = lib.tc_conv2d, adapter.data_ptr, op.epilogue.has_bias
        panels_of = PANELS.panels
        words, pack = lib.tc_wpack_words(prm), lib.tc_pack_w

        def launch(x: Any, w: Any, bias: Any, out: Any) -> None:
            wp = ptr(w)
            prm[slot] = pick()
            panels = panels_of(geometry, w, wp, words, lambda dst: pack(prm, wp, dst))
            b32 = _bias_f32(adapter, bias) if has_bias else None
            rc = fn(prm, ptr(x), wp, None if panels is None else panels[1], None if b32 is None else b32.ctypes.data,
                    ptr(out))
            del b32, panels  # alive until the kernel returned
            if rc:
                _check_rc(rc, "AMX conv2d")

        launch.pointer_only = True  # type: ignore[attr-defined]
        return launch

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, Conv2dOp)
        lib, prm, geometry = self.prepare(op, config, profile)
        x, x_owner = bf16_operand(args, "x", op.x_shape)
        w, w_owner = bf16_operand(args, "w", op.w_shape)
        out, out_owner = (bf16_operand if op.dtype_out is DType.BF16 else f32_operand)(args, "out", op.out_shape)
        b32 = None
        if op.epilogue.has_bias:
            b32 = _bias_f32(args.adapter, args.arrays.get("bias"))
            if b32.size != op.k:
                raise DTypeError("bias", f"{b32.size} values", f"{op.k} (one per output channel)")
        panels = PANELS.panels(geometry, args.arrays.get("w"), w, lib.tc_wpack_words(prm),
                               lambda dst: lib.tc_pack_w(prm, w, dst))
        rc = lib.tc_conv2d(prm, x, w, None if panels is None else panels[1], None if b32 is None else b32.ctypes.data,
                           out)
        del x_owner, w_owner, out_owner, b32, panels  # alive until here, after the kernel returned
        _check_rc(rc, "AMX conv2d")


def _bias_f32(adapter: Any, bias: Any) -> np.ndarray:
    """The bias as a C-contiguous float32 NumPy array (bf16 widened; a new array the caller must hold
    until the kernel has returned)."""
    dtype = adapter.info(bias).dtype
    if dtype is DType.BF16:
        return widened_bias(adapter, bias).reshape(-1)
    if dtype is DType.F32:
        return np.ascontiguousarray(adapter.to_numpy(bias), dtype=np.float32).reshape(-1)
    raise DTypeError("bias", dtype.value, "float32 or bfloat16")


@functools.lru_cache(maxsize=256)
def _conv_plan(variant: CpuConv2dAmxVariant, op: Op, config: PipelineConfig, nth: int) -> tuple[Any, Any, tuple]:
    """Validated config -> (library, ``tc_prm`` parameter block, weight geometry key), memoised."""
    _require(variant.validate_config(op, config, None), variant.name, config)  # type: ignore[arg-type]
    assert isinstance(op, Conv2dOp)
    mr, nr = int(config.get("mr")), int(config.get("nr"))
    lib = variant.library(mr, nr, op.epilogue.key)
    values = dict(layout=0 if op.layout is Layout.NCHW else 1, n=op.n, C=op.c, H=op.h, W=op.w, K=op.k, R=op.r,
                  S=op.s, sh=op.stride[0], sw=op.stride[1], ph=op.padding[0], pw=op.padding[1], dh=op.dilation[0],
                  dw=op.dilation[1], G=op.groups, P=op.p, Q=op.q, out_bf16=int(op.dtype_out is DType.BF16),
                  nth=nth, wblk=int(config.get("wblk", WBLK[0])), kst=int(config.get("kst", KST[0])),
                  mbg=int(config.get("mbg", MBG[0])))
    prm = kernels.call_params(PARAMS, values)
    geometry = (id(lib), "conv", values["layout"], op.c, op.k, op.r, op.s, op.groups, nr)
    return lib, prm, geometry
