"""int8 linear layers (``tracea_cpu.int8``): the AMX ``tdpbssd`` kernel against the documented math in
float64 (same quantized integers, exact products) over odd shapes (M = 1; M, N, K not multiples of
16 / 64; M above the 256-row chunk), with and without bias, NumPy and torch inputs, NaN / Inf rows, the
NumPy fallback, bad arguments. Kernel tests skip, with the reason, where AMX-INT8 cannot run."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.errors import DTypeError, InvalidArgumentError, ShapeError
from tracea_cpu import int8 as int8_mod
from tracea_cpu.int8 import Int8Weight, fallback_reason, linear_int8, quantize_weight, reference

WHY = fallback_reason()
needs_amx = pytest.mark.skipif(WHY is not None, reason=f"AMX-INT8 kernel unavailable: {WHY}")
SHAPES = [(1, 1, 1), (1, 33, 129), (7, 70, 65), (17, 100, 200), (16, 64, 64), (40, 64, 63), (130, 97, 300),
          (300, 50, 77), (3, 257, 1000), (33, 31, 130)]


def _case(m, n, k, seed=0, bias=True):
    rng = np.random.default_rng([m, n, k, seed])
    w = rng.standard_normal((n, k), dtype=np.float32)
    x = (rng.standard_normal((m, k), dtype=np.float32) * rng.uniform(0.1, 10, (m, 1))).astype(np.float32)
    b = rng.standard_normal(n, dtype=np.float32) if bias else None
    return x, quantize_weight(w), b, w


@needs_amx
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_int8_kernel_matches_the_documented_math(shape, bias):
    x, qw, b, w = _case(*shape, bias=bias)
    got = linear_int8(x, qw, b)
    ref = reference(x, qw, b)
    # the kernel converts the int32 sum to fp32 (exact below 2^24) and scales in fp32
    assert np.abs(got - ref).max() <= 1e-6 * max(1.0, np.abs(ref).max()), shape
    # and the quantized layer stays close to the fp32 one (quantization error ~1%)
    full = x.astype(np.float64) @ w.T.astype(np.float64) + (0 if b is None else b)
    assert np.abs(got - full).max() <= 0.05 * np.abs(full).max() + 1e-6, shape


@needs_amx
def test_int8_nan_inf_rows_and_zero_rows():
    x, qw, b, _ = _case(9, 40, 70)
    x[2, 5] = np.nan
    x[4, 0] = np.inf
    x[6, 69] = -np.inf
    x[7] = 0.0
    got = linear_int8(x, qw, b)
    assert np.isnan(got[[2, 4, 6]]).all()
    assert np.array_equal(got[7], b)  # a zero row gives the bias exactly
    ok = [0, 1, 3, 5, 8]
    assert np.isfinite(got[ok]).all()
    assert np.abs(got[ok] - reference(x, qw, b)[ok]).max() <= 1e-6 * np.abs(got[ok]).max()


@needs_amx
def test_int8_torch_in_torch_out_with_leading_dims():
    torch = pytest.importorskip("torch")
    x, qw, b, _ = _case(12, 48, 80)
    xt = torch.from_numpy(x).reshape(3, 4, 80)
    got = linear_int8(xt, qw, torch.from_numpy(b))
    assert isinstance(got, torch.Tensor) and got.shape == (3, 4, 48) and got.dtype == torch.float32
    ref = reference(x, qw, b)
    assert np.abs(got.reshape(12, 48).numpy() - ref).max() <= 1e-6 * np.abs(ref).max()


def test_int8_fallback_computes_the_same_math(monkeypatch):
    """Without AMX the documented NumPy fallback runs the same integers."""
    monkeypatch.setattr(int8_mod, "_amx_ready", lambda: "forced fallback (test)")
    for shape in [(1, 33, 129), (17, 100, 200)]:
        x, qw, b, _ = _case(*shape)
        got = linear_int8(x, qw, b)
        assert np.abs(got - reference(x, qw, b)).max() <= 1e-5 * np.abs(got).max()


def test_int8_quantize_weight_per_channel():
    w = np.array([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [127.0, 63.5, -127.0]], np.float32)
    qw = quantize_weight(w)
    assert qw.q.dtype == np.int8 and qw.q.flags.c_contiguous and qw.scale.dtype == np.float32
    assert qw.q[0].tolist() == [64, -127, 32] and qw.q[1].tolist() == [0, 0, 0]
    assert qw.q[2].tolist() == [127, 64, -127]  # 63.5 rounds half to even
    assert np.allclose(qw.scale, [2 / 127, 0, 1])


def test_int8_bad_arguments():
    x, qw, b, _ = _case(3, 8, 16)
    with pytest.raises(ShapeError):
        linear_int8(x[:, :15], qw, b)
    with pytest.raises(ShapeError):
        linear_int8(x, qw, b[:7])
    with pytest.raises(DTypeError):
        linear_int8(x.astype(np.float64), qw, b)
    with pytest.raises(InvalidArgumentError):
        linear_int8(x, "not a weight", b)
    with pytest.raises(InvalidArgumentError):
        quantize_weight(np.array([[np.nan, 1.0]], np.float32))
    with pytest.raises(ShapeError):
        quantize_weight(np.ones(4, np.float32))
    assert linear_int8(np.zeros((0, 16), np.float32), qw).shape == (0, 8)
    assert isinstance(qw, Int8Weight) and qw.shape == (8, 16)
    before = x.copy()
    linear_int8(x, qw, b)
    assert np.array_equal(x, before)  # inputs are never mutated
