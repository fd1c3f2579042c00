"""int8 linear layers (``tracea_cpu.int8``): the AMX ``tdpbssd`` kernel and the AVX512-VNNI ``vpdpbusd``
kernel (1-4 tokens next to AMX, every token count in its own library on CPUs without AMX) against the
documented math in float64 (same quantized integers, exact products) over odd shapes (M = 1, 2, 3, 7,
17; M, N, K not multiples of 16 / 64; M above the 256-row chunk), with and without bias, saturated values
over the longest K, NumPy and torch inputs, NaN / Inf / zero rows, the NumPy fallback, bad arguments.
Kernel tests skip, with the reason, where AMX-INT8 (or, for the VNNI-only library, AVX512-VNNI) cannot
run."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.errors import DTypeError, InvalidArgumentError, LayoutError, ShapeError
from tracea_cpu import int8 as int8_mod
from tracea_cpu.int8 import Int8Weight, linear_int8, quantize_weight, reference

WHY = int8_mod._amx_ready()  # (fallback_reason() is None on AVX512-VNNI CPUs without AMX too)
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


def _force_numpy(monkeypatch):
    monkeypatch.setattr(int8_mod, "_amx_ready", lambda: "forced fallback (test)")
    monkeypatch.setattr(int8_mod, "_vnni_ready", lambda: "forced fallback (test)")


def test_int8_fallback_computes_the_same_math(monkeypatch):
    """Without AMX and AVX512-VNNI the documented NumPy fallback runs the same integers."""
    _force_numpy(monkeypatch)
    assert int8_mod.kernel_in_use() == "numpy" and "forced fallback" in int8_mod.fallback_reason()
    for shape in [(1, 33, 129), (17, 100, 200)]:
        x, qw, b, _ = _case(*shape)
        got = linear_int8(x, qw, b)
        assert np.abs(got - reference(x, qw, b)).max() <= 1e-5 * np.abs(got).max()
    torch = pytest.importorskip("torch")
    got_t = linear_int8(torch.from_numpy(x), qw, torch.from_numpy(b))  # torch in, torch out, same math
    assert isinstance(got_t, torch.Tensor) and np.abs(got_t.numpy() - reference(x, qw, b)).max() <= 1e-5 * np.abs(got).max()


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


# --- the AVX512-VNNI few-tokens kernel (``ti_linear_vnni``) and the route between the two kernels ---

VNNI_SHAPES = [(1, 1, 1), (2, 3, 5), (3, 17, 64), (4, 16, 65), (5, 31, 127), (6, 33, 128), (7, 70, 129),
               (8, 15, 300), (9, 48, 1000), (17, 100, 200), (1, 257, 4097), (2, 19, 63)]


@needs_amx
@pytest.mark.parametrize("shape", VNNI_SHAPES)
@pytest.mark.parametrize("route", ["vnni", "amx"])
def test_int8_both_kernels_match_the_documented_math(monkeypatch, shape, route):
    """Every token count and odd N / K through each kernel (the route forced), fresh random data with
    per-row activation scales spanning two decades and per-channel weight scales."""
    monkeypatch.setattr(int8_mod, "VNNI_MAX_TOKENS", 1 << 30 if route == "vnni" else 0)
    for seed in (1, 2):
        x, qw, b, _ = _case(*shape, seed=seed, bias=seed == 1)
        got = linear_int8(x, qw, b)
        ref = reference(x, qw, b)
        assert np.abs(got - ref).max() <= 1e-6 * max(1.0, np.abs(ref).max()), (shape, route, seed)


@needs_amx
@pytest.mark.parametrize("route", ["vnni", "amx"])
def test_int8_saturated_values_and_long_k(monkeypatch, route):
    """Saturation edges: activations and weights at +-127 after quantization over K = 131072 (the
    largest K), where the true sums reach ~2.1e9 (just inside int32) and the VNNI kernel's biased sums
    (x + 128) overflow int32 and must wrap back exactly."""
    monkeypatch.setattr(int8_mod, "VNNI_MAX_TOKENS", 1 << 30 if route == "vnni" else 0)
    k, n = 131072, 5
    w = np.ones((n, k), np.float32)
    w[1] *= -1.0
    w[2, ::2] = -1.0
    w[3, :] = np.where(np.arange(k) % 3 == 0, 1.0, -1.0)
    w[4, 7] = 0.5  # one value off the grid: rounds half to even
    x = np.ones((3, k), np.float32)
    x[1] *= -2.5
    x[2, 1::2] = -1.0
    qw = quantize_weight(w)
    assert qw.q.max() == 127 and qw.q.min() == -127
    got = linear_int8(x, qw)
    ref = reference(x, qw, None)
    assert int(qw.q[0].astype(np.int64).sum()) * 127 > 2.0e9  # x[0] quantizes to 127s: int32 really exercised
    assert np.abs(got - ref).max() <= 1e-6 * np.abs(ref).max(), route


@needs_amx
def test_int8_vnni_nan_inf_and_zero_rows():
    x, qw, b, _ = _case(4, 40, 70)
    x[1, 3] = np.nan
    x[2] = 0.0
    x[3, 69] = np.inf
    got = linear_int8(x, qw, b)  # 4 tokens: the VNNI kernel
    assert np.isnan(got[[1, 3]]).all()
    assert np.array_equal(got[2], b)
    assert np.abs(got[0] - reference(x, qw, b)[0]).max() <= 1e-6 * np.abs(got[0]).max()


def test_int8_weight_row_sums():
    qw = quantize_weight(np.array([[1.0, -1.0, 0.5], [2.0, 2.0, 2.0]], np.float32))
    assert qw.q.tolist() == [[127, -127, 64], [127, 127, 127]]
    assert qw.row_sums.dtype == np.int32 and qw.row_sums.tolist() == [64, 381]
    assert qw.row_sums is qw.row_sums  # computed once


@pytest.mark.parametrize("forced_fallback", [False, True])
def test_int8_torch_fast_and_checked_paths_agree(monkeypatch, forced_fallback):
    """Contiguous torch tensors take the address-only path; a transposed x, a NumPy bias next to a torch
    x and a grad-requiring x take the checked one: same numbers, x never mutated."""
    torch = pytest.importorskip("torch")
    if forced_fallback:
        _force_numpy(monkeypatch)
    elif WHY is not None:
        pytest.skip(f"AMX-INT8 kernel unavailable: {WHY}")
    x, qw, b, _ = _case(6, 40, 72)
    ref = reference(x, qw, b)
    xt, bt = torch.from_numpy(x.copy()), torch.from_numpy(b)
    calls = {"fast": linear_int8(xt, qw, bt), "fast-2tokens": linear_int8(xt[:2], qw, bt),
             "transposed": linear_int8(torch.from_numpy(x.T.copy()).T, qw, bt),
             "numpy bias": linear_int8(xt, qw, b), "grad": linear_int8(xt.clone().requires_grad_(), qw, bt)}
    for name, got in calls.items():
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float32, name
        rows = got.shape[0]
        assert np.abs(got.numpy() - ref[:rows]).max() <= 1e-5 * np.abs(ref).max(), name
    assert np.array_equal(xt.numpy(), x)
    assert linear_int8(torch.zeros(0, 72), qw, bt).shape == (0, 40)
    with pytest.raises(ShapeError):
        linear_int8(torch.zeros(2, 71), qw, bt)
    with pytest.raises(ShapeError):
        linear_int8(xt, qw, bt[:39])
    with pytest.raises(DTypeError):
        linear_int8(xt.double(), qw, bt)


def test_int8_weight_is_checked_when_built():
    q = np.zeros((4, 8), np.int8)
    s = np.ones(4, np.float32)
    assert Int8Weight(q, s).shape == (4, 8)
    with pytest.raises(DTypeError):
        Int8Weight(q.astype(np.int16), s)
    with pytest.raises(DTypeError):
        Int8Weight(q, s.astype(np.float64))
    with pytest.raises(ShapeError):
        Int8Weight(q, s[:3])
    with pytest.raises(ShapeError):
        Int8Weight(q[0], s)
    with pytest.raises(LayoutError):
        Int8Weight(np.zeros((8, 4), np.int8).T, s)
    with pytest.raises(InvalidArgumentError):
        Int8Weight([[1, 2]], s)  # type: ignore[arg-type]


@needs_amx
@pytest.mark.parametrize("m", [1, 9])
def test_int8_k_beyond_exact_int32_sums_is_refused(m):
    """K > 131072 could overflow the int32 sums: both kernels refuse with LaunchError, no output."""
    from tracea.errors import LaunchError

    k = 131073
    qw = Int8Weight(np.ones((2, k), np.int8), np.ones(2, np.float32))
    with pytest.raises(LaunchError, match="K too large"):
        linear_int8(np.ones((m, k), np.float32), qw)


@pytest.mark.skipif(int8_mod._vnni_ready() is not None, reason=f"AVX512-VNNI kernel unavailable: {int8_mod._vnni_ready()}")
def test_int8_vnni_only_library_without_amx(monkeypatch):
    """A CPU with AVX512-VNNI but no usable AMX (forced here) runs the VNNI-only library for every token
    count (1-300 rows, odd N / K, NaN and zero rows): same integers as the documented math."""
    monkeypatch.setattr(int8_mod, "_amx_ready", lambda: "no AMX (test)")
    assert int8_mod.kernel_in_use() == "vnni" and int8_mod.fallback_reason() is None
    for shape in [(1, 1, 1), (3, 17, 65), (5, 33, 128), (9, 70, 129), (17, 100, 200), (130, 97, 300), (300, 50, 77)]:
        x, qw, b, _ = _case(*shape)
        if shape[0] >= 9:
            x[2] = 0.0
            x[5, 1] = np.nan
        got = linear_int8(x, qw, b)
        ref = reference(x, qw, b)
        ok = np.isfinite(ref).all(axis=1)
        assert np.isnan(got[~ok]).all(), shape
        assert np.abs(got[ok] - ref[ok]).max() <= 1e-6 * max(1.0, np.abs(ref[ok]).max()), shape
