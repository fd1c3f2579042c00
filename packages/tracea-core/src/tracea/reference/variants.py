"""The reference backend's variants: every op and epilogue on host arrays, float64 accumulation.

They always accept host ops (any float dtype NumPy can hold) and carry priority -1000 and a deliberately
slow estimate, so any real backend that serves an op is preferred; they are the last fallback. GEMM also
has :class:`~tracea.reference.blas.ReferenceBlasGemm` (NumPy's BLAS, float32 accumulation), which ranks
before the float64 oracle: a core-only install runs GEMM at BLAS speed.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import DType, Fp32Precision
from ..ir.ops import AttentionOp, Conv2dOp, GemmOp, LayerType, Op
from ..doctor.profile import DeviceProfile
from ..doctor.variant import FLOAT_DTYPES, KernelVariant, OpArgs, Requirements
from ..semantic.config import PipelineConfig
from . import kernels

_REFERENCE_CONFIG = PipelineConfig(tile_m=1, tile_n=1, tile_k=1, stages=1, warps=1)
_OUT = frozenset(FLOAT_DTYPES)


class _ReferenceVariant(KernelVariant):
    backend = "reference"
    priority = -1000
    fallback_only = True
    efficiency = 0.002  # ~1 GFLOP/s on a typical host: always last when a real kernel exists
    #: True for the float64 oracles that tuning results are checked against (not the BLAS GEMM)
    oracle = True

    def hero_configs(self, op: Op, profile: DeviceProfile) -> list[PipelineConfig]:
        return [_REFERENCE_CONFIG]

    def _store(self, args: OpArgs, result: np.ndarray) -> None:
        out = args.host("out")
        out[...] = result.reshape(out.shape).astype(out.dtype, copy=False)


class ReferenceGemm(_ReferenceVariant):
    name = "reference.gemm"
    description = "NumPy float64 GEMM with every epilogue (correctness oracle)"
    requirements = Requirements("cpu", LayerType.GEMM, dtypes=FLOAT_DTYPES, out_dtypes=_OUT,
                                fp32_precisions=frozenset(Fp32Precision))

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, GemmOp)
        self._store(args, kernels.gemm(op, args.host("a"), args.host("b"), args.host("bias")))


class ReferenceConv2d(_ReferenceVariant):
    name = "reference.conv2d"
    description = "NumPy float64 conv2d, both layouts, stride/padding/dilation/groups, every epilogue"
    requirements = Requirements("cpu", LayerType.CONV2D, dtypes=FLOAT_DTYPES, out_dtypes=_OUT,
                                fp32_precisions=frozenset(Fp32Precision))

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, Conv2dOp)
        self._store(args, kernels.conv2d(op, args.host("x"), args.host("w"), args.host("bias")))


class ReferenceAttention(_ReferenceVariant):
    name = "reference.attention"
    description = "NumPy float64 softmax attention, causal, GQA, bool and additive masks"
    requirements = Requirements("cpu", LayerType.ATTENTION, dtypes=FLOAT_DTYPES, out_dtypes=_OUT,
                                masks=frozenset({"bool", "additive"}), value_head_dim=True, lse=True)

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, AttentionOp)
        result = kernels.attention(op, args.host("q"), args.host("k"), args.host("v"), args.host("mask"),
                                   return_lse=op.lse)
        if op.lse:
            result, lse = result
            dst = args.host("lse")
            if dst is not None:  # float32 (batch, heads, seq_q)
                dst[...] = lse.reshape(dst.shape).astype(dst.dtype, copy=False)
        self._store(args, result)


#: the float64 oracles (the plugin also registers :class:`~tracea.reference.blas.ReferenceBlasGemm`)
VARIANTS = (ReferenceGemm(), ReferenceConv2d(), ReferenceAttention())

__all__ = ["DType", "ReferenceAttention", "ReferenceConv2d", "ReferenceGemm", "VARIANTS"]
