"""``return_lse`` of ``tracea.ops.attention`` in core: the op field and its requirement (variants without a
log-sum-exp output are declined with a reason), the float64 reference's lse (fully masked rows -inf, NaN
rows NaN), the argument check, and the clear error when only a framework fallback would compute the call."""

from __future__ import annotations

import numpy as np
import pytest

import tracea
from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import Requirements
from tracea.errors import InvalidArgumentError, NoVariantError
from tracea.ir.device import Device
from tracea.ir.ops import AttentionOp, LayerType
from tracea.reference import kernels


def test_op_field_roles_and_requirement() -> None:
    op = AttentionOp(2, 4, 5, 7, 8, lse=True)
    assert op.roles == ("q", "k", "v", "mask", "lse") and AttentionOp(2, 4, 5, 7, 8).roles == ("q", "k", "v", "mask")
    assert op != AttentionOp(2, 4, 5, 7, 8) and "lse" in op.key and "lse" not in AttentionOp(2, 4, 5, 7, 8).key
    cpu = DeviceProfile(Device("cpu", 0), "cpu")
    plain = Requirements("cpu", LayerType.ATTENTION)
    assert any("log-sum-exp" in r for r in plain.check(op, cpu))
    assert Requirements("cpu", LayerType.ATTENTION, lse=True).check(op, cpu) == []


def test_reference_lse() -> None:
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((1, 2, 3, 4)), rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((1, 2, 5, 4))
    mask = np.ones((1, 2, 3, 5))
    mask[0, 1, 2] = 0
    op = AttentionOp(1, 2, 3, 5, 4, mask="bool", mask_shape=(1, 2), scale=0.7)
    out, lse = kernels.attention(op, q, k, v, mask, return_lse=True)
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * 0.7
    want = np.log(np.exp(s).sum(-1))
    want[0, 1, 2] = -np.inf
    np.testing.assert_allclose(lse, want, rtol=1e-12)
    assert np.all(out[0, 1, 2] == 0)
    q[0, 0, 1, 0] = np.nan
    _, lse = kernels.attention(op, q, k, v, mask, return_lse=True)
    assert np.isnan(lse[0, 0, 1]) and np.isfinite(lse[0, 0, 0])


def test_reference_variant_through_ops() -> None:
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 3, 6, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, 3, 9, 8)).astype(np.float32) for _ in range(2))
    out, lse = tracea.ops.attention(q, k, v, is_causal=True, return_lse=True, variant="reference.attention")
    ref_out, ref_lse = kernels.attention(AttentionOp(2, 3, 6, 9, 8, causal=True), q, k, v, return_lse=True)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-6)
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-6)


def test_bad_flag_and_fallback_error() -> None:
    q = np.zeros((1, 2, 3, 4), dtype=np.float32)
    with pytest.raises(InvalidArgumentError):
        tracea.ops.attention(q, q, q, return_lse="yes")
    torch = pytest.importorskip("torch")
    t = torch.zeros(1, 2, 3, 4)
    with pytest.raises(NoVariantError, match="log-sum-exp"):
        tracea.ops.attention(t, t, t, dropout_p=0.5, return_lse=True)
