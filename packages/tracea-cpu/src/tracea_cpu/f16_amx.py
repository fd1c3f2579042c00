"""fp16 GEMM on AMX-BF16 tiles with fp32 accuracy (``cpu.gemm.f16amx``): every fp16 value split exactly
into two bf16 values, four bf16 products per fp16 product, fp32 accumulation (:mod:`.emit.f16_split`
explains the arithmetic). Picked over the converting fp32-FMA kernels (:mod:`.f16`) where the CPU has
AMX-BF16 and F16C and the OS grants tile data; declines with the reason elsewhere.
"""

from __future__ import annotations

import functools
from typing import Any

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType
from tracea.ir.ops import GemmOp, LayerType, Op
from tracea.semantic import PipelineConfig

from . import kernels
from .amx import AMX_EFFICIENCY, CpuGemmAmxVariant, amx_peak_gflops
from .f16 import _bias32, host_operands
from .isa import AMX_BF16
from .host_load import thread_picker
from .variant_base import _check_rc, _require, _requested_threads

#: extra work of the split: four bf16 products per fp16 product
SPLIT_FACTOR = 4


class CpuGemmF16AmxVariant(CpuGemmAmxVariant):
    """fp16 GEMM as an exact bf16 split on the AMX bf16 GEMM (K four times as deep), fp32 or fp16 output."""

    def __init__(self) -> None:
        super().__init__()
        self.priority = 46
        self.name = "cpu.gemm.f16amx"
        self.description = "fp16 GEMM on AMX-BF16 tiles (exact hi/lo bf16 split, fp32 accumulate), fused epilogue"
        self.requirements = Requirements(device_kind="cpu", op_kind=LayerType.GEMM, dtypes=frozenset({DType.F16}),
                                         out_dtypes=frozenset({DType.F16, DType.F32}),
                                         isa=tuple(AMX_BF16.requires) + ("f16c",))

    def estimate_seconds(self, op: Op, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        assert isinstance(op, GemmOp)
        m_pad = -(-op.m // 16) * 16
        flops = 2.0 * op.batch * m_pad * op.n * op.k * SPLIT_FACTOR
        split_bytes = op.batch * (op.m + op.n) * op.k * 2 * (1 + 2 * SPLIT_FACTOR)
        bw = (profile.bandwidth_gbs or 20.0) * 1e9
        return flops / (amx_peak_gflops(profile) * 1e9 * AMX_EFFICIENCY) + split_bytes / bw + 20e-6

    def prepare(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Any:
        return _split_plan(self, op, config)

    def bind(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        assert isinstance(op, GemmOp)
        fn, params = self.prepare(op, config, profile)
        ptr, has_bias = adapter.data_ptr, op.epilogue.has_bias
        pick = thread_picker(self.threads(op, config, profile), _requested_threads(config))

        def launch(a: Any, b: Any, bias: Any, out: Any) -> None:
            b32 = _bias32(adapter, bias) if has_bias else None
            rc = fn(params, ptr(a), ptr(b), ptr(out), None if b32 is None else b32.ctypes.data, pick())
            del b32  # alive until the kernel returned
            if rc:
                _check_rc(rc, "fp16 AMX gemm")

        launch.pointer_only = True  # type: ignore[attr-defined]
        return launch

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, GemmOp)
        fn, params = self.prepare(op, config, profile)
        a, b, out, b32 = host_operands(op, args)
        rc = fn(params, a.ctypes.data, b.ctypes.data, out.ctypes.data,  # type: ignore[union-attr]
                None if b32 is None else b32.ctypes.data, self.threads(op, config, profile))
        _check_rc(rc, "fp16 AMX gemm")


@functools.lru_cache(maxsize=256)
def _split_plan(variant: CpuGemmF16AmxVariant, op: Op, config: PipelineConfig) -> tuple[Any, Any]:
    """Validated config -> (``tf_gemm_split``, its parameter block), memoised."""
    _require(variant.validate_config(op, config, None), variant.name, config)  # type: ignore[arg-type]
    assert isinstance(op, GemmOp)
    lib = variant.library(int(config.get("mr")), int(config.get("nr")), op.epilogue.key)
    rsa, csa = (1, op.m) if op.trans_a else (op.k, 1)
    rsb, csb = (1, op.k) if op.trans_b else (op.n, 1)
    # mc as the many-rows driver wants it for the K it sees (four times the op's)
    split_op = GemmOp(op.m, op.n, SPLIT_FACTOR * op.k, dtype_a=DType.BF16, dtype_b=DType.BF16)
    from tracea.doctor.host_plugin import host_profile

    mc = variant.block_rows(split_op, config, host_profile())
    params = kernels.call_params(("batch", "M", "N", "K", "rsa", "csa", "rsb", "csb", "out_f16", "mc", "nc", "kc"), dict(
        batch=op.batch, M=op.m, N=op.n, K=op.k, rsa=rsa, csa=csa, rsb=rsb, csb=csb,
        out_f16=int(op.out_dtype is DType.F16), mc=mc, nc=int(config.get("nc")), kc=int(config.get("kc"))))
    return lib.tf_gemm_split, params
