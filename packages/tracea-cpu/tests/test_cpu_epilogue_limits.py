"""Fused activations at the ends of the float range, on every ISA this machine runs (found by the ops
fuzzer: SiLU(-inf) was -inf because the vectorised exp clamped its argument and never overflowed)."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.ir.ops import GemmOp
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.spaces import GEMM_HEROES
from tracea_cpu.testing import HAVE_CC, ISAS, config, poisoned, run_variant
from tracea_cpu.variants import CpuGemmVariant

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")

X = np.array([-np.inf, -1e30, -100.0, -88.5, -87.0, -20.0, -1.0, 0.0, 0.5, 20.0, 44.3, 88.5, 1e30, np.inf],
             np.float32)


def _run(isa: str, act: str) -> np.ndarray:
    """``act(x * 1)``: an (n x 1) @ (1 x 16) GEMM puts each value of X through the fused epilogue."""
    a = X.reshape(-1, 1).copy()
    b = np.ones((1, 16), np.float32)
    op = GemmOp(a.shape[0], 16, 1, epilogue=act)
    cfg = config(**GEMM_HEROES[isa][0], threads=1)
    return run_variant(CpuGemmVariant(ISA_BY_NAME[isa]), op, cfg, {"a": a, "b": b}, poisoned((a.shape[0], 16)))[:, 0]


def _expected(act: str) -> np.ndarray:
    import math

    x = X.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if act == "silu":
            y = x / (1.0 + np.exp(-x))
        elif act == "gelu_erf":
            y = 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
        else:
            y = 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return y


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_erf"])
def test_activation_limits(isa, act):
    got = _run(isa, act).astype(np.float64)
    want = _expected(act)
    for x, g, w in zip(X, got, want):
        if np.isnan(w):  # -inf * 0 in the formula (PyTorch gives NaN too): NaN or the limit 0
            assert np.isnan(g) or g == 0.0, (act, x, g)
        elif np.isinf(w):
            assert g == w, (act, x, g)
        else:
            assert np.isfinite(g) and abs(g - w) <= 1e-6 * (1 + abs(w)), (act, x, g, w)
