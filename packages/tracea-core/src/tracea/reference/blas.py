"""GEMM through NumPy's BLAS: the fast default of a core-only install.

``np.matmul`` on float32 or float64 operands calls the BLAS NumPy was built with (OpenBLAS, MKL,
Accelerate), roughly 3x the float64 oracle (:mod:`tracea.reference.kernels`) on float32 1024^2 and
within a few percent of ``a @ b`` itself. Its semantics are those of a real kernel, not of the oracle:

- float64 inputs (or any float64 operand): float64 products and accumulation, as the oracle;
- float32 inputs: float32 products, float32 accumulation (SGEMM), so every ``fp32_precision`` is met;
- float16 / bfloat16 inputs: converted to float32 (exact), float32 accumulation, as Tensor Cores do;
- the epilogue (bias, activation) runs on the accumulator in float64, then the result is rounded once
  to the output dtype. NaN and Inf propagate by IEEE arithmetic through BLAS as through the oracle.

Like the oracle it is ``fallback_only`` (every real backend ranks before it), but it ranks before the
oracle, so it is what a core-only install runs for GEMM on host arrays. ``variant="reference.gemm"``
(or ``TRACEA_VARIANT``) still forces the float64 oracle.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import DType, Fp32Precision
from ..ir.ops import GemmOp, LayerType, Op
from ..doctor.profile import DeviceProfile
from ..doctor.variant import FLOAT_DTYPES, OpArgs, Requirements
from ..semantic.config import PipelineConfig
from .kernels import apply_epilogue
from .variants import _OUT, _ReferenceVariant


def _compute_dtype(*arrays: Any) -> type:
    return np.float64 if any(a is not None and a.dtype == np.float64 for a in arrays) else np.float32


def gemm(op: GemmOp, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None,
         out: np.ndarray | None = None) -> np.ndarray:
    """``epilogue(op(a) @ op(b))`` with BLAS: float32 accumulation for float32/16-bit inputs, float64 for
    float64 ones. Shapes as :func:`tracea.reference.kernels.gemm`; returns (batch, m, n) in the compute
    dtype (float64 when there is an epilogue). With ``out`` (C-contiguous, of the compute dtype) and no
    epilogue the product is written straight into it, and ``out`` is returned."""
    ct = _compute_dtype(a, b)
    a2: np.ndarray = np.asarray(a).astype(ct, copy=False).reshape(op.batch, *((op.k, op.m) if op.trans_a else (op.m, op.k)))
    b2: np.ndarray = np.asarray(b).astype(ct, copy=False).reshape(op.batch, *((op.n, op.k) if op.trans_b else (op.k, op.n)))
    if op.trans_a:
        a2 = np.swapaxes(a2, -1, -2)  # a transposed view: BLAS reads it with its trans flag
    if op.trans_b:
        b2 = np.swapaxes(b2, -1, -2)
    direct = (out is not None and not len(op.epilogue) and out.dtype == ct and out.flags.c_contiguous
              and not np.may_share_memory(out, a) and not np.may_share_memory(out, b))
    with np.errstate(invalid="ignore", over="ignore"):  # NaN / Inf operands: IEEE results, no warnings
        if direct:
            assert out is not None
            np.matmul(a2, b2, out=out.reshape(op.batch, op.m, op.n))
            return out
        acc = np.matmul(a2, b2)
    if op.batch == 1:
        acc = acc.reshape(1, op.m, op.n)
    if not len(op.epilogue):
        return acc
    return apply_epilogue(acc.astype(np.float64), op.epilogue, bias, axis=-1)


class ReferenceBlasGemm(_ReferenceVariant):
    """GEMM on host arrays through NumPy's BLAS (see the module docstring for its dtype semantics)."""

    name = "reference.gemm_blas"
    description = "NumPy BLAS GEMM (fp32 accumulation, fp64 for fp64), every epilogue: core-only default"
    requirements = Requirements("cpu", LayerType.GEMM, dtypes=FLOAT_DTYPES, out_dtypes=_OUT,
                                fp32_precisions=frozenset(Fp32Precision))
    priority = -500
    efficiency = 0.2  # ranks before the float64 oracle; still fallback_only, so after every real backend
    oracle = False

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, GemmOp)
        out = args.host("out")
        result = gemm(op, args.host("a"), args.host("b"), args.host("bias"), out=out)
        if result is not out:
            self._store(args, result)


__all__ = ["DType", "ReferenceBlasGemm", "gemm"]
