"""Kernel variants of the CPU backend: ``cpu.<op>.<isa>`` for GEMM, conv2d and attention, one per
instruction set (AVX-512, AVX2+FMA, NEON, portable scalar)."""

from __future__ import annotations

import functools
from typing import Any

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType
from tracea.ir.ops import Conv2dOp, GemmOp, LayerType, Layout, Op
from tracea.semantic import PipelineConfig, SearchSpace
from tracea.semantic.config import Validity

from . import depthwise, kernels, pool, spaces
from .amx import CpuGemmAmxVariant
from .amx_conv import CpuConv2dAmxVariant
from .f16 import f16_variants
from .f16_amx import CpuGemmF16AmxVariant
from .bf16 import CpuGemmBf16Variant
from .attention import CpuAttentionVariant
from .emit.calls import CONV_PARAMS, GEMM_PARAMS
from .emit.gemv import unpacked_driver
from .skinny import skinny_variants
from .isa import ALL_ISAS, Isa
from .variant_base import (GEMV_THREADS_BYTES, CpuVariant, _check_rc, _host, _ptr, _require,  # noqa: F401
                           _requested_threads, _threads_problem, _validate_blocked, pointer_launcher)

def _gemv(op: Op) -> bool:
    """Whether ``tr_gemm`` runs this GEMM through a packing-free driver (GEMV or axpy, see
    :mod:`.emit.gemv`), where the tile and cache blocks of the config are unused."""
    return isinstance(op, GemmOp) and unpacked_driver(op.m, op.n, op.k, op.trans_b) is not None


class CpuGemmVariant(CpuVariant):
    """BLIS-style GEMM: packed panels, MR x NR register micro-kernel, KC/MC/NC blocks, fused epilogue."""

    def __init__(self, isa: Isa) -> None:
        super().__init__(isa)
        self.name = f"cpu.gemm.{isa.name}"
        self.description = (f"blocked GEMM, {isa.name} micro-kernel, packed panels, fused epilogue; "
                            f"packing-free GEMV / axpy drivers for a few rows (nn.Linear decode)")
        self.requirements = Requirements(device_kind="cpu", op_kind=LayerType.GEMM, dtypes=frozenset({DType.F32}),
                                         isa=isa.requires)

    def search_space(self, op: Op, profile: DeviceProfile) -> SearchSpace:
        if _gemv(op):
            return spaces.gemv_space(self.isa, profile)
        return spaces.blocked_space(self.isa, profile)

    def hero_configs(self, op: Op, profile: DeviceProfile) -> list[PipelineConfig]:
        # The GEMV / axpy drivers use no tile: one hero (one compiled library), not one per tile.
        if _gemv(op):
            return [spaces.heroes(spaces.GEMM_HEROES, self.isa)[0]]
        return spaces.blocked_heroes(self.isa, op, profile=profile)

    def validate_config(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        return _validate_blocked(self.isa, config)

    def threads(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> int:
        # The GEMV / axpy drivers are memory-bound: a second thread pays off from ~256 KiB of B
        # (measured M = 1, weights 256 x 256: 41 -> 49 GB/s, 512 x 512: 57 -> 95 GB/s, from one to two
        # threads), far below the flop-based small-problem cut.
        if _gemv(op) and not _requested_threads(config):
            assert isinstance(op, GemmOp)
            if 4 * op.n * op.k * op.batch < GEMV_THREADS_BYTES:
                return 1
            return kernels.thread_count(0, profile.compute_units)
        return super().threads(op, config, profile)

    def prepare(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Any:
        return _blocked_plan(self, op, config)

    def bind(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        assert isinstance(op, GemmOp)
        lib, mc, nc, kc = self.prepare(op, config, profile)
        m, n, k = op.m, op.n, op.k
        rsa, csa = (1, m) if op.trans_a else (k, 1)
        rsb, csb = (1, k) if op.trans_b else (n, 1)
        params = kernels.call_params(GEMM_PARAMS, dict(
            batch=op.batch, M=m, N=n, K=k, rsa=rsa, csa=csa, sa=m * k, rsb=rsb, csb=csb, sb=k * n, ldc=n, sc=m * n,
            mc=mc, nc=nc, kc=kc, nth=self.threads(op, config, profile)))
        return pointer_launcher(lib.tr_gemm_call, params, GEMM_PARAMS.index("nth"), config, adapter,
                                op.epilogue.has_bias, "gemm")

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, GemmOp)
        lib, mc, nc, kc = self.prepare(op, config, profile)
        m, n, k, bt = op.m, op.n, op.k, op.batch
        a = _host(args, "a", (bt, m, k))
        b = _host(args, "b", (bt, k, n))
        bias = _host(args, "bias", (n,)) if op.epilogue.has_bias else None
        out = _host(args, "out", (bt, m, n))
        rsa, csa = (1, m) if op.trans_a else (k, 1)
        rsb, csb = (1, k) if op.trans_b else (n, 1)
        rc = lib.tr_gemm(bt, m, n, k, _ptr(a), rsa, csa, m * k, _ptr(b), rsb, csb, k * n, _ptr(out), n, m * n,
                         _ptr(bias), mc, nc, kc, self.threads(op, config, profile))
        _check_rc(rc, "gemm")


class CpuConv2dVariant(CpuVariant):
    """Implicit-GEMM conv2d: im2col tiles gathered while packing (no im2col buffer), NCHW and NHWC."""

    def __init__(self, isa: Isa) -> None:
        super().__init__(isa)
        self.name = f"cpu.conv2d.{isa.name}"
        self.description = f"implicit-GEMM conv2d (NCHW/NHWC), {isa.name} micro-kernel, fused epilogue"
        self.requirements = Requirements(device_kind="cpu", op_kind=LayerType.CONV2D,
                                         dtypes=frozenset({DType.F32}), isa=isa.requires)

    def check(self, op: Op, profile: DeviceProfile) -> list[str]:
        reasons = super().check(op, profile)
        if depthwise.serves(op):  # (one output channel per group: a GEMM of one row per tap window)
            reasons.append(f"depthwise: cpu.conv2d.depthwise.{self.isa.name} serves it (this implicit GEMM measured "
                           "4-73x slower than PyTorch's depthwise kernels)")
        return reasons

    def search_space(self, op: Op, profile: DeviceProfile) -> SearchSpace:
        space = spaces.blocked_space(self.isa, profile)
        if isinstance(op, Conv2dOp):
            algos = [1, 0, 2] if spaces.indirect_ok(op) else [0, 2]
            space = space.param("indirect", algos + ([3] if spaces.direct_nchw_ok(self.isa, op) else []))
        return space

    def hero_configs(self, op: Op, profile: DeviceProfile) -> list[PipelineConfig]:
        heroes = spaces.blocked_heroes(self.isa, op)
        if not isinstance(op, Conv2dOp):
            return heroes
        packed = [spaces.whole_m_block(h.with_params(indirect=0), op) for h in heroes[:1]]
        # Weights-stationary: deep K blocks (the weights are read in place; only the KC x NR im2col panels
        # are packed) mean fewer passes over C and fewer barriers (measured +8% on ResNet-50 512@7^2).
        stationary = [h.with_params(indirect=2, kc=max(h.get("kc"), spaces.STATIONARY_KC), nc=min(h.get("nc"), 2048))
                      for h in spaces.blocked_heroes(self.isa, op, indirect=2)]
        stationary = [h for h in stationary if h.get("mr") >= 6] + [h for h in stationary if h.get("mr") < 6]
        indirect: list[PipelineConfig] = []
        if spaces.indirect_ok(op):
            # The indirect kernel keeps one pointer per tile row in a general register: short tiles first.
            ind = spaces.indirect_heroes(self.isa, op)
            short = [h for h in ind if h.get("mr") <= 6] + [h for h in ind if h.get("mr") > 6]
            rows = spaces.row_heroes(self.isa, op)
            # Small images: the padding taps skipped by row tiles are a large share of the work.
            short = rows + short if op.q <= spaces.row_first_max_q(profile) else short + rows
            indirect = [h.with_params(indirect=1) for h in short]
        # (Weights-stationary was first for NCHW 512@7^2 at batch 1 until the NCHW indirect path read the
        # KCRS weights in channel blocks and skipped padding taps: now 176 vs 153 GFLOP/s there.)
        if not spaces.direct_nchw_ok(self.isa, op):
            return indirect + packed + stationary[:2]
        # Direct NCHW (no NHWC copies): its tile is fixed, the config's tile only names the library.
        direct = [(indirect or heroes)[0].with_params(indirect=3)]
        if indirect and spaces.direct_nchw_first(self.isa, op):
            return direct + indirect + packed + stationary[:2]
        return indirect + packed + stationary[:2] + direct

    def validate_config(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        if config.get("indirect", 0) not in (0, 1, 2, 3):
            return Validity(False, f"param indirect={config.get('indirect')!r} must be 0, 1, 2 or 3")
        return _validate_blocked(self.isa, config)

    def prepare(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Any:
        return _blocked_plan(self, op, config)

    def bind(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        assert isinstance(op, Conv2dOp)
        lib, mc, nc, kc = self.prepare(op, config, profile)
        params = kernels.call_params(CONV_PARAMS, dict(
            layout=0 if op.layout is Layout.NCHW else 1, n=op.n, C=op.c, H=op.h, W=op.w, K=op.k, R=op.r, S=op.s,
            sh=op.stride[0], sw=op.stride[1], ph=op.padding[0], pw=op.padding[1], dh=op.dilation[0],
            dw=op.dilation[1], groups=op.groups, P=op.p, Q=op.q, mc=mc, nc=nc, kc=kc,
            nth=self.threads(op, config, profile), indirect=int(config.get("indirect", 0) or 0)))
        return pointer_launcher(lib.tr_conv2d_call, params, CONV_PARAMS.index("nth"), config, adapter,
                                op.epilogue.has_bias, "conv2d", bias_before_out=True)

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, Conv2dOp)
        lib, mc, nc, kc = self.prepare(op, config, profile)
        x = _host(args, "x", op.x_shape)
        w = _host(args, "w", op.w_shape)
        bias = _host(args, "bias", (op.k,)) if op.epilogue.has_bias else None
        out = _host(args, "out", op.out_shape)
        layout = 0 if op.layout is Layout.NCHW else 1
        rc = lib.tr_conv2d(layout, op.n, op.c, op.h, op.w, op.k, op.r, op.s, op.stride[0], op.stride[1],
                           op.padding[0], op.padding[1], op.dilation[0], op.dilation[1], op.groups, op.p, op.q,
                           _ptr(x), _ptr(w), _ptr(bias), _ptr(out), mc, nc, kc, self.threads(op, config, profile),
                           int(config.get("indirect", 0) or 0))
        _check_rc(rc, "conv2d")


@functools.lru_cache(maxsize=512)
def _blocked_plan(variant: "CpuVariant", op: Op, config: PipelineConfig) -> tuple[Any, int, int, int]:
    """Validated config -> (compiled library, mc, nc, kc), memoised so a call costs one dict lookup."""
    _require(variant.validate_config(op, config, None), variant.name, config)  # type: ignore[arg-type]
    lib = kernels.blocked_library(variant.isa.name, int(config.get("mr")), int(config.get("nr")), op.epilogue.key)  # type: ignore[attr-defined]
    pool.sync()  # (TRACEA_CPU_POOL changed since the libraries loaded)
    return lib, int(config.get("mc")), int(config.get("nc")), int(config.get("kc"))


def all_variants() -> list[CpuVariant]:
    """Every CPU variant, for every ISA (the Doctor filters by the host's flags)."""
    from .bf16_conv import bf16_conv_variants  # noqa: PLC0415
    from .bf16_convert import bf16_convert_variants  # (it subclasses CpuConv2dVariant: imported here)

    out: list[CpuVariant] = []
    for isa in ALL_ISAS:
        out += [CpuGemmVariant(isa), CpuConv2dVariant(isa), CpuAttentionVariant(isa)]
    return (out + [CpuGemmBf16Variant(), CpuGemmAmxVariant(), CpuConv2dAmxVariant(), CpuGemmF16AmxVariant()] + f16_variants() + bf16_conv_variants() + bf16_convert_variants() + skinny_variants()
            + depthwise.depthwise_variants())
