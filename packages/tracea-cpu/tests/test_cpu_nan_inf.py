"""NaN and Inf through the fp32 CPU GEMM and conv2d kernels (docs/architecture.md, "Numerics"): NaN,
+Inf and -Inf must land exactly where the float64 reference puts them (the reference matches PyTorch:
tests/test_core_reference_nan_inf.py), with the finite values unchanged. Every activation, every ISA
this machine runs, every GEMM driver (blocked, few rows against weights, GEMV, axpy) and every conv2d
algorithm in both layouts, on fresh random inputs with NaN / +-Inf written at random positions.

Two defects this guards: ReLU was max(x, 0), which on x86 (maxps returns its second operand when
either is NaN) and in the portable C turned NaN into 0; and the indirect conv skipped the taps over
zero padding, so a NaN / Inf weight did not make the border outputs NaN as 0 * Inf does in PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.ir.ops import Conv2dOp, GemmOp
from tracea.testing import inject_nonfinite, nonfinite_mismatch
from tracea_cpu import kernels
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.spaces import GEMM_HEROES
from tracea_cpu.testing import ISAS, HAVE_CC, config, conv2d_ref, epilogue_ref, poisoned, rand, run_variant
from tracea_cpu.variants import CpuConv2dVariant, CpuGemmVariant

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")

# Every activation alone (a chain like relu+gelu would hide gelu(-inf)), with and without the bias step.
EPILOGUES = ["bias+relu", "gelu_tanh", "bias+gelu_erf", "silu"]
ALL_EPILOGUES = ["none", "bias", "relu", "bias+relu", "gelu_tanh", "bias+gelu_tanh", "gelu_erf", "bias+gelu_erf",
                 "silu", "bias+silu"]
# Accumulator values around every threshold of the activations' code (exp's clamp at -88 / 89, fp32
# overflow of x^3 in GELU(tanh), FLT_MAX) and the non-finite ones.
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 3.0, -3.0, 20.0, -20.0, 44.5, -44.5, 87.7, -87.7,
                    88.0, -88.0, 88.5, -88.5, 89.0, -89.0, 100.0, -100.0, 1e13, -1e13, 1e30, -1e30, 3e38, -3e38],
                   dtype=np.float32)
HERO = {isa: GEMM_HEROES[isa][0] for isa in ISAS}


def _route(isa: str, m: int, n: int, k: int, tb: bool, threads: int) -> str:
    lib = kernels.blocked_library(isa, HERO[isa]["mr"], HERO[isa]["nr"], "none")
    rsb, csb = (1, k) if tb else (n, 1)
    return kernels.GEMM_ROUTES[lib.tr_gemm_route(m, n, k, rsb, csb, threads)]


def _gemm(isa: str, op: GemmOp, a: np.ndarray, b: np.ndarray, bias, threads: int = 2) -> tuple[np.ndarray, np.ndarray]:
    out = poisoned((op.batch, op.m, op.n))
    run_variant(CpuGemmVariant(ISA_BY_NAME[isa]), op, config(**HERO[isa], threads=threads),
                {"a": a, "b": b, "bias": bias}, out)
    a64 = a.astype(np.float64).reshape(op.batch, *((op.k, op.m) if op.trans_a else (op.m, op.k)))
    b64 = b.astype(np.float64).reshape(op.batch, *((op.n, op.k) if op.trans_b else (op.k, op.n)))
    a64 = a64.transpose(0, 2, 1) if op.trans_a else a64
    b64 = b64.transpose(0, 2, 1) if op.trans_b else b64
    with np.errstate(invalid="ignore", over="ignore"):
        ref = epilogue_ref(a64 @ b64, op.epilogue.steps, bias, axis=2)
    return out, ref


# (route, m, n, trans_b): K = 2, the second product 0 * 1, so that each output is exactly one SPECIAL
# value (+ bias). (The rows driver needs B stored N x K with K > 1.)
TABLE_ROUTES = [("packed", len(SPECIAL), 40, False), ("gemv", 3, len(SPECIAL), True),
                ("axpy", 4, len(SPECIAL), False), ("rows", len(SPECIAL), 300, True),
                ("cols", len(SPECIAL), 1200, False)]  # (M x N x K >= 65536: two threads)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("route,m,n,tb", TABLE_ROUTES)
def test_activation_of_special_values_every_driver(isa, route, m, n, tb):
    """Each output is act(v + bias) for v in SPECIAL: the kernels' activations against the reference's
    on NaN, +-Inf and the values around every threshold of their code."""
    assert _route(isa, m, n, 2, tb, 2) == route
    rng = np.random.default_rng(len(route))
    values_down_m = m == len(SPECIAL)  # values along M (A's first column), else along N (B's first row)
    vals = np.stack([SPECIAL, np.zeros_like(SPECIAL)], axis=1)  # (len, 2): v, 0
    ones = np.ones((n if values_down_m else m, 2), np.float32)
    for epi in ALL_EPILOGUES:
        op = GemmOp(m, n, 2, trans_b=tb, epilogue=epi)
        a = vals.copy() if values_down_m else ones
        b = ones if values_down_m else vals.copy()
        b = b if tb else np.ascontiguousarray(b.T)
        bias = rand(rng, n) if op.epilogue.has_bias else None
        out, ref = _gemm(isa, op, a, b, bias)
        msg = nonfinite_mismatch(out, ref, atol=1e-5)
        assert msg is None, f"{isa} {route} {epi}: {msg}"


# (route, m, n, k, trans_a, trans_b, batch)
RANDOM_SHAPES = [("packed", 37, 45, 29, False, False, 1), ("packed", 23, 70, 40, True, False, 2),
                 ("rows", 20, 300, 33, False, True, 1), ("gemv", 1, 77, 50, False, True, 1),
                 ("gemv", 4, 33, 300, True, True, 2), ("gemv", 2, 1, 19, False, False, 1),
                 ("axpy", 1, 100, 21, False, False, 1), ("axpy", 3, 45, 40, True, False, 1),
                 ("cols", 61, 530, 47, False, False, 1), ("cols", 45, 600, 33, True, False, 2),
                 ("cols", 300, 520, 40, False, True, 1)]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("route,m,n,k,ta,tb,batch", RANDOM_SHAPES)
def test_gemm_random_nonfinite_every_driver(isa, route, m, n, k, ta, tb, batch):
    assert _route(isa, m, n, k, tb, 2) == route
    rng = np.random.default_rng([m, n, k])
    for trial, epi in enumerate(EPILOGUES * 2):
        op = GemmOp(m, n, k, batch=batch, trans_a=ta, trans_b=tb, epilogue=epi)
        a = rand(rng, batch, *((k, m) if ta else (m, k)))
        b = rand(rng, batch, *((n, k) if tb else (k, n)))
        bias = rand(rng, n) if op.epilogue.has_bias else None
        targets = [a, b] + ([bias] if bias is not None else [])
        injected = [inject_nonfinite(rng, targets[int(rng.integers(len(targets)))], 1)
                    for _ in range(1 + trial % 3)]
        out, ref = _gemm(isa, op, a, b, bias)
        msg = nonfinite_mismatch(out, ref)
        assert msg is None, f"{isa} {route} {epi} injected {injected}: {msg}"


# (n, c, h, w, k, r, s, stride, padding, dilation, groups)
CONV_CASES = [(2, 16, 7, 9, 20, 3, 3, 1, 1, 1, 1), (1, 8, 10, 6, 33, 3, 3, 2, 1, 1, 1),
              (1, 16, 8, 8, 16, 5, 3, (1, 2), (2, 1), (2, 1), 2), (2, 8, 1, 1, 8, 3, 3, 1, 1, 1, 1)]


def _conv(isa: str, op: Conv2dOp, x, w, bias, algorithm: int) -> tuple[np.ndarray, np.ndarray]:
    out = poisoned(op.out_shape)
    cfg = config(**HERO[isa], threads=2, indirect=algorithm)
    run_variant(CpuConv2dVariant(ISA_BY_NAME[isa]), op, cfg, {"x": x, "w": w, "bias": bias}, out)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = epilogue_ref(conv2d_ref(x, w, op), op.epilogue.steps, bias, axis=1 if op.layout.value == "nchw" else 3)
    return out, ref


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("algorithm", [0, 1, 2], ids=["packed", "indirect", "stationary"])
def test_conv2d_random_nonfinite(isa, layout, algorithm):
    rng = np.random.default_rng([algorithm, len(layout), len(isa)])
    for case in CONV_CASES:
        n, c, h, w, k, r, s, st, pad, dil, g = case
        for trial, epi in enumerate(EPILOGUES):
            op = Conv2dOp(n, c, h, w, k, r, s, stride=st, padding=pad, dilation=dil, groups=g, layout=layout,
                          epilogue=epi)
            x, wt = rand(rng, *op.x_shape), rand(rng, *op.w_shape)
            bias = rand(rng, k) if op.epilogue.has_bias else None
            target = (x, wt, wt if bias is None else bias)[trial % 3]
            injected = inject_nonfinite(rng, target, 1 + trial % 2)
            out, ref = _conv(isa, op, x, wt, bias, algorithm)
            msg = nonfinite_mismatch(out, ref)
            assert msg is None, f"{isa} {layout} algorithm {algorithm} {case} {epi} injected {injected}: {msg}"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_conv2d_nonfinite_weight_reaches_the_padded_border(isa, layout, value):
    """A NaN / Inf weight at a corner tap: PyTorch's zero padding gives 0 * Inf = NaN at the border
    pixels where that tap reads padding, which the indirect algorithm used to skip."""
    rng = np.random.default_rng(3)
    op = Conv2dOp(1, 16, 7, 7, 32, 3, 3, padding=1, layout=layout, epilogue="bias+relu")
    x, wt, bias = rand(rng, *op.x_shape), rand(rng, *op.w_shape), rand(rng, 32)
    wt[5, 0, 0, 0] = value  # KCRS [k, c, r, s] / KRSC [k, r, s, c]: tap (0, 0) either way
    for algorithm in (1, 0, 2):
        out, ref = _conv(isa, op, x, wt, bias, algorithm)
        assert nonfinite_mismatch(out, ref) is None, (algorithm, nonfinite_mismatch(out, ref))
        channel = out[0, 5] if layout == "nchw" else out[0, :, :, 5]
        assert np.isnan(channel[0, :]).all() and np.isnan(channel[:, 0]).all()  # the padded top row / left column
