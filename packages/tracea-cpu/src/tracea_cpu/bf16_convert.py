"""bf16 GEMM on x86 CPUs without AVX512_BF16 or AMX (``cpu.gemm.bf16cvt.<isa>``, AVX2 and AVX-512 builds):
bf16 A and B widened to fp32 while they are packed (exact: a bf16 is the top half of an fp32), the ISA's
fp32 blocked driver and micro-kernel, the fp32 epilogue, and an fp32 or bf16 (round to nearest even, NaN
kept) output. Kernel: :data:`.emit.f16.BF16C`, the bf16 flavour of the fp16 library.

Why: PyTorch's CPU bf16 matmul has no fast path there. 2-core AMD Zen 3 VM (AVX2), torch 2.13, ``F.linear``
bf16 512^3 / 1024^3 / 2048^3 / 512x4096x4096: 15 / 18 / 20 / 16 GFLOP/s against 106-115 in fp32.
Where AVX512_BF16 (``cpu.gemm.avx512bf16``, twice the fp32 FMA rate) or AMX exists, those rank first.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType
from tracea.ir.ops import GemmOp, LayerType, Op
from tracea.semantic import PipelineConfig, SearchSpace
from tracea.semantic.config import Validity

from . import kernels, spaces
from .bf16 import bf16_operand, bias_f32, f32_operand
from .host_load import thread_picker
from .isa import AVX2, AVX512, Isa
from .variant_base import CpuVariant, _check_rc, _ptr, _require, _requested_threads, _validate_blocked

#: Share of the fp32 blocked GEMM's speed the widening packers leave (they convert every element of A and
#: B once per pass; measured on the Zen 3 VM: 0.85-0.95 of the fp32 kernel on 512-2048 squares).
CONVERT_SHARE = 0.85
#: Fewer rows of A than this are declined: widening and packing the whole weight then costs more than the
#: GEMM (Zen 3 VM, `F.linear` bf16 x 4096^2: 1 / 4 tokens 0.43 / 0.84x torch, 8 tokens 1.97x, 16 2.27x); the
#: skinny (decode) kernels or PyTorch serve them.
MIN_ROWS = 8


class CpuGemmBf16ConvertVariant(CpuVariant):
    """Blocked bf16 GEMM for CPUs without a bf16 dot product: widening packers, fp32 micro-kernel."""

    def __init__(self, isa: Isa) -> None:
        super().__init__(isa)
        self.name = f"cpu.gemm.bf16cvt.{isa.name}"
        self.description = (f"blocked bf16 GEMM (bf16 -> fp32 on packing, {isa.name} fp32 micro-kernel), "
                            "fused epilogue, bf16 or fp32 output")
        self.requirements = Requirements(device_kind="cpu", op_kind=LayerType.GEMM, dtypes=frozenset({DType.BF16}),
                                         out_dtypes=frozenset({DType.BF16, DType.F32}), isa=isa.requires)

    def check(self, op: Op, profile: DeviceProfile) -> list[str]:
        reasons = [f"needs {self.isa.name}: {r}" if r.startswith("device lacks") else r
                   for r in super().check(op, profile)]
        if isinstance(op, GemmOp) and op.m < MIN_ROWS:
            reasons.append(f"m={op.m} rows: below {MIN_ROWS} widening the whole weight costs more than the GEMM "
                           "(decode shapes: the skinny kernels or PyTorch serve them)")
        return reasons

    def estimate_seconds(self, op: Op, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        # fp32 FMAs (the profile's bf16 peak would be a bf16 dot product's, which this kernel does not use)
        eff = self.efficiency_on(profile) * CONVERT_SHARE
        flop_time = op.flops / (profile.peak("float32") * 1e9 * eff)
        return max(flop_time, op.min_bytes / ((profile.bandwidth_gbs or 20.0) * 1e9)) + 15e-6

    def search_space(self, op: Op, profile: DeviceProfile) -> SearchSpace:
        return spaces.blocked_space(self.isa, profile)

    def hero_configs(self, op: Op, profile: DeviceProfile) -> list[PipelineConfig]:
        return spaces.blocked_heroes(self.isa, op, profile=profile)

    def validate_config(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        return _validate_blocked(self.isa, config)

    def prepare(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Any:
        return _plan(self, op, config)

    def bind(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        assert isinstance(op, GemmOp)
        fn, geo = self.prepare(op, config, profile)
        ptr = adapter.data_ptr
        pick = thread_picker(self.threads(op, config, profile), _requested_threads(config))
        head, mid, tail = geo[:4], geo[4:6], geo[6:8]
        out_b16, blocks = geo[8], geo[9:]
        if not op.epilogue.has_bias:
            def launch(a: Any, b: Any, bias: Any, out: Any) -> None:
                rc = fn(*head, ptr(a), *mid, ptr(b), *tail, ptr(out), out_b16, None, *blocks, pick())
                if rc:
                    _check_rc(rc, "bf16 gemm")

            launch.pointer_only = True  # type: ignore[attr-defined]
            return launch
        widen = op.out_dtype is DType.BF16  # the bias arrives in the output dtype; the epilogue runs in fp32

        def launch_bias(a: Any, b: Any, bias: Any, out: Any) -> None:
            # the fp32 bias must outlive the kernel call: held in a local until the call returns
            b32 = (adapter.host_bits(bias).astype(np.uint32) << 16).view(np.float32) if widen else bias
            rc = fn(*head, ptr(a), *mid, ptr(b), *tail, ptr(out), out_b16,
                    b32.ctypes.data if widen else ptr(b32), *blocks, pick())
            if rc:
                _check_rc(rc, "bf16 gemm")

        launch_bias.pointer_only = True  # type: ignore[attr-defined]
        return launch_bias

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, GemmOp)
        fn, geo = self.prepare(op, config, profile)
        bt, m, n, k = op.batch, op.m, op.n, op.k
        # every (address, owner) pair keeps its owner referenced until the kernel has returned
        a, a_owner = bf16_operand(args, "a", (bt, m, k))
        b, b_owner = bf16_operand(args, "b", (bt, k, n))
        out, out_owner = (bf16_operand if geo[8] else f32_operand)(args, "out", (bt, m, n))
        bias_arr = bias_f32(args, n) if op.epilogue.has_bias else None
        rc = fn(*geo[:4], a, *geo[4:6], b, *geo[6:8], out, geo[8], _ptr(bias_arr), *geo[9:],
                self.threads(op, config, profile))
        del a_owner, b_owner, out_owner, bias_arr
        _check_rc(rc, "bf16 gemm")


@functools.lru_cache(maxsize=256)
def _plan(variant: CpuGemmBf16ConvertVariant, op: Op, config: PipelineConfig) -> tuple[Any, tuple]:
    """Validated config -> (``tr_gemm_bf16c``, its shape, stride, output and block arguments), memoised."""
    _require(variant.validate_config(op, config, None), variant.name, config)  # type: ignore[arg-type]
    assert isinstance(op, GemmOp)
    lib = kernels.bf16c_gemm_library(variant.isa.name, int(config.get("mr")), int(config.get("nr")),
                                     op.epilogue.key)
    rsa, csa = (1, op.m) if op.trans_a else (op.k, 1)
    rsb, csb = (1, op.k) if op.trans_b else (op.n, 1)
    geo = (op.batch, op.m, op.n, op.k, rsa, csa, rsb, csb, int(op.out_dtype is DType.BF16),
           int(config.get("mc")), int(config.get("nc")), int(config.get("kc")))
    return lib.tr_gemm_bf16c, geo


def bf16_convert_variants() -> list[CpuGemmBf16ConvertVariant]:
    """The converting bf16 GEMM variants (AVX-512 and AVX2 builds)."""
    return [CpuGemmBf16ConvertVariant(AVX512), CpuGemmBf16ConvertVariant(AVX2)]
