"""bf16 conv2d on CPUs with AVX512_BF16 (``cpu.conv2d.avx512bf16``): an implicit GEMM through the bf16 GEMM's
``vdpbf16ps`` micro-kernel and drivers, the A panels gathered from the NHWC input (kernel:
:mod:`.emit.bf16_conv`). NCHW and NHWC, stride, padding, dilation, the fused epilogues, fp32 accumulation, bf16
or fp32 output; one group and an even channel count (other convs keep ``cpu.conv2d.bf16cvt.<isa>``).

Why: without it a bf16 conv on such a CPU (AMD Zen 4 / Zen 5, Intel Cooper Lake; AMX CPUs have
``cpu.conv2d.amxbf16``) ran through the fp32 conv on widened copies, at the fp32 rate: 2-core Zen 4 VM, ResNet 3x3
layers at batch 1, 156-223 GFLOP/s, 0.48-0.68x torch's oneDNN bf16 conv.

An NCHW input is transposed to NHWC first and the NHWC result back (the GEMM's C is pixels x channels); KCRS
weights are laid out KRSC, once per unchanged torch weight (:mod:`.panel_cache`; NumPy weights on every call).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType
from tracea.errors import LayoutError
from tracea.ir.ops import Conv2dOp, Layout, LayerType, Op
from tracea.semantic import PipelineConfig, SearchSpace
from tracea.semantic.config import Validity

from . import kernels, spaces
from .bf16 import BF16_EFFICIENCY, bias_f32, host_bf16
from .bf16_direct import Runner, kept_panels, pointer_launcher
from .host_load import thread_picker
from .isa import AVX512_BF16
from .variant_base import CpuVariant, _check_rc, _host, _ptr, _requested_threads, _validate_blocked

#: share of the bf16 GEMM's speed the conv keeps (2-core Zen 4 VM, 3x3 ResNet layers: the direct kernel 408-451
#: GFLOP/s against the GEMM's 420-440; the NCHW transposes are estimated apart)
CONV_SHARE = 0.95
#: register tiles and blocks tried first. ``direct=1``: the direct kernel (A read in place, all of K per tile,
#: weights as cached VNNI panels); ``direct=0``: the implicit GEMM through the bf16 GEMM's drivers (A panels
#: packed). 2-core Zen 4 VM, 3x3 ResNet layers NHWC, raw kernel: direct 4x64 416-451 GFLOP/s (6x64 within 1-5%,
#: 14x32 3-9% behind), the packed GEMM path 306-424.
HEROES = (dict(mr=4, nr=64, mc=48, nc=4096, kc=2048, direct=1), dict(mr=6, nr=64, mc=48, nc=4096, kc=2048, direct=1),
          dict(mr=6, nr=64, mc=48, nc=4096, kc=2048, direct=0), dict(mr=14, nr=32, mc=28, nc=4096, kc=2048, direct=1))


class CpuConv2dBf16Variant(CpuVariant):
    """Implicit-GEMM bf16 conv2d on AVX512_BF16: ``vdpbf16ps`` register tiles over k pairs of (tap, channel),
    A panels packed from the NHWC input, KRSC weights, fp32 epilogue, bf16 or fp32 output."""

    def __init__(self) -> None:
        super().__init__(AVX512_BF16)
        self.name = "cpu.conv2d.avx512bf16"
        self.description = "implicit-GEMM bf16 conv2d, vdpbf16ps micro-kernel (fp32 accumulate), NCHW/NHWC, fused epilogue"
        self.requirements = Requirements(device_kind="cpu", op_kind=LayerType.CONV2D, dtypes=frozenset({DType.BF16}),
                                         out_dtypes=frozenset({DType.BF16, DType.F32}), isa=AVX512_BF16.requires)

    def check(self, op: Op, profile: DeviceProfile) -> list[str]:
        reasons = [f"needs avx512_bf16 (vdpbf16ps): {r}" if r.startswith("device lacks") else r
                   for r in super().check(op, profile)]
        if isinstance(op, Conv2dOp):
            if op.groups != 1:
                reasons.append(f"groups={op.groups}: the implicit GEMM runs one group (bf16cvt serves grouped convs)")
            elif op.c % 2:
                reasons.append(f"C={op.c} is odd: a k pair would straddle two taps (bf16cvt serves it)")
        return reasons

    def efficiency_on(self, profile: DeviceProfile) -> float:
        return BF16_EFFICIENCY * CONV_SHARE

    def estimate_seconds(self, op: Op, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        # vdpbf16ps: twice the fp32 FMA rate; plus the NCHW transposes (in, out) through memory
        flop_time = op.flops / (2 * profile.peak("float32") * 1e9 * BF16_EFFICIENCY * CONV_SHARE)
        moved = 0.0
        if isinstance(op, Conv2dOp) and op.layout is Layout.NCHW:
            moved = 2.0 * (op.n * op.c * op.h * op.w * 2 + op.n * op.k * op.p * op.q * op.out_dtype.itemsize)
        bw = (profile.bandwidth_gbs or 20.0) * 1e9
        return max(flop_time, op.min_bytes / bw) + moved / bw + 20e-6

    def search_space(self, op: Op, profile: DeviceProfile) -> SearchSpace:
        return spaces.bf16_space(self.isa, profile).param("direct", [1, 0])

    def hero_configs(self, op: Op, profile: DeviceProfile) -> list[PipelineConfig]:
        return [PipelineConfig(params=tuple(dict(h, threads=0).items())) for h in HEROES]

    def validate_config(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        if config.get("direct", 0) not in (0, 1):
            return Validity(False, f"param direct={config.get('direct')!r} must be 0 or 1")
        return _validate_blocked(self.isa, config)

    def prepare(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Any:
        assert isinstance(op, Conv2dOp)
        return kernels.bf16_conv_library(int(config.get("mr")), int(config.get("nr")), op.epilogue.key)

    def _computer(self, op: Conv2dOp, config: PipelineConfig) -> Runner:
        """``compute(x, w_obj, w, bias32, out, nth)`` on data addresses in the op's memory order (``w_obj``: the
        weight object, for the layout cache; ``bias32``: an fp32 bias address or 0)."""
        lib = self.prepare(op, config, None)  # type: ignore[arg-type]
        return _compute(lib, op, int(config.get("mc")), int(config.get("nc")), int(config.get("kc")),
                        bool(config.get("direct", 0)), int(config.get("nr")))

    def bind(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        assert isinstance(op, Conv2dOp)
        pick = thread_picker(self.threads(op, config, profile), _requested_threads(config))
        return pointer_launcher(self._computer(op, config), adapter, op.epilogue.has_bias,
                                op.out_dtype is DType.BF16, pick)

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, Conv2dOp)
        xb, wb = host_bf16(args, "x", op.x_shape), host_bf16(args, "w", op.w_shape)
        out = host_bf16(args, "out", op.out_shape) if op.out_dtype is DType.BF16 else _host(args, "out", op.out_shape)
        if out is None or not out.flags.writeable:
            raise LayoutError("out", out, "a writable array")
        b32 = bias_f32(args, op.k) if op.epilogue.has_bias else None
        px, pw, po = _ptr(xb), _ptr(wb), _ptr(out)
        assert px is not None and pw is not None and po is not None
        self._computer(op, config)(px, None, pw, 0 if b32 is None else int(b32.ctypes.data), po,
                                   self.threads(op, config, profile))


_TLS = threading.local()


def _scratch(slot: int, n: int, dtype: Any) -> np.ndarray:
    """``n`` elements of ``dtype`` from this thread's scratch buffer ``slot`` (grown, never shrunk; valid until the
    thread's next call asking for that slot). A fresh multi-MB ``np.empty`` per call costs page faults on every
    touch: 2-core Zen 4 VM, NCHW 64@56^2 bf16 batch 1, 0.59 ms of kernels took 0.79 ms with per-call buffers."""
    bufs = getattr(_TLS, "bufs", None)
    if bufs is None:
        bufs = _TLS.bufs = {}
    nbytes = n * np.dtype(dtype).itemsize
    buf = bufs.get(slot)
    if buf is None or buf.nbytes < nbytes:
        buf = bufs[slot] = np.empty(max(nbytes, 64) + 64, np.uint8)
    skip = -buf.ctypes.data % 64
    return buf[skip:skip + nbytes].view(dtype)


def _compute(lib: Any, op: Conv2dOp, mc: int, nc: int, kc: int, direct: bool, nr: int) -> Runner:
    geo = (ctypes.c_long * 15)(op.n, op.h, op.w, op.c, op.k, op.p, op.q, op.r, op.s, *op.stride, *op.padding,
                               *op.dilation)
    nchw, rs = op.layout is Layout.NCHW, op.r * op.s
    out_b16 = op.out_dtype is DType.BF16
    nx, nw, no, kk = op.n * op.c * op.h * op.w, op.k * op.c * rs, op.n * op.k * op.p * op.q, op.c * rs
    conv, tr16, tr_out = lib.tb_conv, lib.tb_tr16, (lib.tb_tr16 if out_b16 else lib.tb_tr32)
    out_np = np.uint16 if out_b16 else np.float32
    if direct:  # the weights as VNNI panels of the register tile's width
        geometry: tuple = ("bf16conv-vnni", nr, op.k, op.c, op.r, op.s, op.layout.value)
        words = int(lib.tb_conv_bwords(op.k, kk))
    else:  # the weights laid out KRSC (the GEMM's B, n-major)
        geometry, words = ("bf16conv-krsc", op.k, op.c, op.r, op.s), nw // 2
    relayout = nchw and rs > 1  # KCRS -> KRSC first

    def pack_weights(w: int, addr: int, nth: int) -> None:
        if not direct:  # KCRS -> KRSC straight into the kept buffer
            tr16(w, addr, op.k, op.c, rs, nth)
            return
        tmp = None
        if relayout:
            tmp = np.empty(nw, np.uint16)
            tr16(w, tmp.ctypes.data, op.k, op.c, rs, nth)
            w = tmp.ctypes.data
        lib.tb_conv_pack_w(w, op.k, kk, addr, nth)
        del tmp  # alive until the packer has returned

    def compute(x: int, w_obj: Any, w: int, bias32: int, out: int, nth: int) -> None:
        held: list[Any] = []  # scratch arrays: alive until the kernels have returned
        if nchw:
            xs = _scratch(0, nx, np.uint16)
            tr16(x, xs.ctypes.data, op.n, op.c, op.h * op.w, nth)
            held.append(xs)
            x = xs.ctypes.data
        if direct or relayout:  # packed / relaid-out weights, kept per unchanged torch weight
            src = w
            holder, w = kept_panels(geometry, w_obj, src, words, lambda addr: pack_weights(src, addr, nth))
            held.append(holder)
        target = out
        if nchw:
            os_ = _scratch(1, no, out_np)
            held.append(os_)
            target = os_.ctypes.data
        if direct:
            rc = lib.tb_conv_ind(geo, x, w, target, int(out_b16), bias32 or None, mc, nth)
        else:
            rc = conv(geo, x, w, target, int(out_b16), bias32 or None, mc, nc, kc, nth)
        _check_rc(rc, "bf16 conv2d")
        if nchw:
            tr_out(target, out, op.n, op.p * op.q, op.k, nth)
        del held

    return compute


def bf16_conv_variants() -> list[CpuVariant]:
    """The AVX512_BF16 conv variant."""
    return [CpuConv2dBf16Variant()]
