"""The NumPy reference backend (float64 accumulation): oracle for tests and last fallback.

:func:`reference` computes any op on host arrays and returns a float64 NumPy array, which is what tests
compare every kernel against.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir.ops import AttentionOp, Conv2dOp, GemmOp, Op
from .kernels import apply_epilogue, attention, conv2d, gemm


def reference(op: Op, **arrays: Any) -> np.ndarray:
    """float64 result of ``op`` on host arrays given by role (``a``/``b``/``bias``, ``x``/``w``/``bias``,
    ``q``/``k``/``v``)."""
    if isinstance(op, GemmOp):
        return gemm(op, arrays["a"], arrays["b"], arrays.get("bias"))
    if isinstance(op, Conv2dOp):
        return conv2d(op, arrays["x"], arrays["w"], arrays.get("bias"))
    if isinstance(op, AttentionOp):
        return attention(op, arrays["q"], arrays["k"], arrays["v"], arrays.get("mask"))
    raise TypeError(f"no reference for {type(op).__name__}")


__all__ = ["apply_epilogue", "attention", "conv2d", "gemm", "reference"]
