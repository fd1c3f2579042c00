"""Host views for dtypes NumPy lacks: ``ArrayAdapter.host_bits`` and the tuner's bf16 carriers (bf16
inputs held as bf16-rounded float32 when ml_dtypes is absent)."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.dtypes import DType
from tracea.errors import DTypeError
from tracea.ir.device import Device
from tracea.ir.ops import GemmOp
from tracea.runtime.arrays import NumpyAdapter
from tracea.tuning import inputs


def test_numpy_host_bits_is_a_zero_copy_unsigned_view():
    ad = NumpyAdapter()
    a = np.array([1.0, -2.0], np.float16)
    bits = ad.host_bits(a)
    assert bits.dtype == np.uint16 and np.shares_memory(bits, a)
    assert bits[0] == 0x3C00
    assert ad.host_bits(np.zeros(3, np.float32)).dtype == np.uint32


def test_round_bf16_is_round_to_nearest_even():
    # 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even one (1.0);
    # 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -3.0], np.float32)
    np.testing.assert_array_equal(inputs._round_bf16(x), [1.0, 1 + 2 ** -6, 1 + 2 ** -7, -3.0])


@pytest.mark.skipif(DType.BF16.numpy is not None, reason="ml_dtypes installed: NumPy stores bf16 itself")
def test_bf16_tuning_inputs_without_ml_dtypes():
    op = GemmOp(5, 6, 7, dtype_a="bf16", dtype_b="bf16", dtype_out="bf16", epilogue="bias")
    host = inputs.random_host_inputs(op, np.random.default_rng(0))
    for role in ("a", "b", "bias"):
        assert host[role].dtype == np.float32 and not (host[role].view(np.uint32) & 0xFFFF).any(), role
    # NumPy arrays cannot hold bf16 without ml_dtypes: a clear error, not float64 in disguise
    with pytest.raises(DTypeError, match="bfloat16"):
        inputs.InputSets(op, Device.cpu(), NumpyAdapter(), count=2)
