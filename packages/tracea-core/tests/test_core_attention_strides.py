"""Strided attention operands (``AttentionOp.strides``): which operands ``tracea.ops.attention`` packs, with
fake CPU variants that do and do not take strided operands, the output's storage order, and the helpers of
:mod:`tracea.runtime.attention_strides`."""

from __future__ import annotations

import numpy as np
import pytest

from tracea import ops
from tracea.doctor.variant import KernelVariant, Requirements
from tracea.dtypes import DType
from tracea.errors import InvalidArgumentError
from tracea.ir.ops import AttentionOp, LayerType, op_from_dict
from tracea.plugins import create_plugin_manager, hookimpl, set_plugin_manager
from tracea.runtime import attention_strides as strided, plans
from tracea.semantic.config import PipelineConfig
from tracea.tuning.cache import TuningCache, set_cache


def _ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False) -> np.ndarray:
    q64, k64, v64 = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    rep = q.shape[-3] // k.shape[-3]
    k64, v64 = np.repeat(k64, rep, axis=-3), np.repeat(v64, rep, axis=-3)
    s = q64 @ np.swapaxes(k64, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v64


class _Fake(KernelVariant):
    backend = "fakeattn"
    description = "numpy attention that records what it was given"
    priority = 10_000
    efficiency = 1e6
    requirements = Requirements("cpu", LayerType.ATTENTION, dtypes=frozenset({DType.F32}), causal=True)
    takes = False
    seen: list = []

    def hero_configs(self, op, profile):  # noqa: ANN001
        return [PipelineConfig(warps=1)]

    def takes_strides(self, op):  # noqa: ANN001
        return self.takes and op.strides is not None

    def bind(self, op, config, profile, adapter):  # noqa: ANN001
        def launch(q, k, v, mask, out):  # noqa: ANN001
            type(self).seen.append((op, q, k, v, out))
            out[...] = _ref(q, k, v, op.causal).reshape(out.shape)

        return launch


class _Strided(_Fake):
    name = "fakeattn.strided"
    takes = True


class _Packed(_Fake):
    name = "fakeattn.packed"


class _Plugin:
    @hookimpl
    def tracea_register_variants(self):  # noqa: ANN201
        return [_Strided(), _Packed()]


@pytest.fixture
def fakes(tmp_path):
    set_cache(TuningCache(tmp_path / "cache.json"))
    pm = create_plugin_manager()
    pm.register_plugin(_Plugin(), "fakeattn", "test")
    set_plugin_manager(pm)
    plans.invalidate("test")
    _Fake.seen = []
    yield _Fake.seen
    set_plugin_manager(None)
    set_cache(None)
    plans.invalidate("test")


def _bshd(rng, b, s, h, d):  # noqa: ANN001
    return rng.standard_normal((b, s, h, d), dtype=np.float32).transpose(0, 2, 1, 3)


def test_fold_and_packed_strides():
    assert strided.fold((2, 3, 5, 8), (120, 40, 8, 1)) == (120, 40, 8)
    assert strided.fold((2, 3, 5, 8), (120, 8, 24, 1)) == (120, 8, 24)  # BSHD
    assert strided.fold((1, 1, 5, 8), (99, 77, 8, 1)) == (0, 0, 8)  # size-1 dims: 0
    assert strided.fold((2, 4, 3, 5, 8), (480, 120, 40, 8, 1)) == (120, 40, 8)  # nested lead dims fold
    assert strided.fold((2, 4, 3, 5, 8), (999, 120, 40, 8, 1)) is None  # lead dims that do not nest
    assert strided.fold((2, 3, 5, 8), (120, 40, 8, 2)) is None  # strided head_dim
    assert strided.fold((2, 3, 5, 8), None) is None
    assert strided.packed(3, 5, 8) == (120, 40, 8) and strided.packed(3, 1, 8, batch=1) == (0, 8, 0)
    assert strided.bshd_like((120, 8, 24)) and not strided.bshd_like((120, 40, 8))


def test_op_strides_field_is_validated_keyed_and_round_trips():
    st = (120, 8, 24) * 4
    op = AttentionOp(2, 3, 5, 5, 8, strides=st)
    assert op.strides == st and "strides=" in op.key
    assert "strides" not in AttentionOp(2, 3, 5, 5, 8).key  # packed ops keep their keys (tuning cache)
    assert op_from_dict(op.to_dict()) == op
    for bad in ((1, 2, 3), (-1,) * 12, (1.5,) * 12):
        with pytest.raises(InvalidArgumentError):
            AttentionOp(2, 3, 5, 5, 8, strides=bad)


@pytest.mark.parametrize("causal", [False, True])
def test_a_variant_that_takes_strides_gets_the_arrays_as_they_are(fakes, rng, causal):
    q, k, v = (_bshd(rng, 2, 7, 3, 8) for _ in range(3))
    for _ in range(2):  # the first call (building the plan) and a planned one
        out = ops.attention(q, k, v, is_causal=causal, variant="fakeattn.strided")
        np.testing.assert_allclose(out, _ref(q, k, v, causal), rtol=1e-5, atol=1e-6)
        op, qq, kk, vv, kout = fakes[-1]
        assert qq is q and kk is k and vv is v  # not packed
        assert op.strides == (168, 8, 24) * 3 + (168, 8, 24)  # the output in q's storage order
        assert out.transpose(0, 2, 1, 3).flags.c_contiguous  # (B, S, H, D) memory, like PyTorch's SDPA


def test_a_variant_that_does_not_take_strides_gets_packed_arrays(fakes, rng):
    q, k, v = (_bshd(rng, 2, 7, 3, 8) for _ in range(3))
    outs = [ops.attention(q, k, v, variant="fakeattn.packed") for _ in range(2)]
    for out in outs:
        np.testing.assert_allclose(out, _ref(q, k, v), rtol=1e-5, atol=1e-6)
    for op, qq, kk, vv, kout in fakes:
        assert op.strides is not None  # the op describes the user's layout ...
        assert all(t.flags.c_contiguous for t in (qq, kk, vv, kout))  # ... the variant sees packed arrays
        assert qq.shape == (2, 3, 7, 8) and kout.shape == (2, 3, 7, 8)
    assert outs[1].flags.c_contiguous  # after the first call: a packed output, no copy through a temporary


def test_vit_qkv_gqa_and_mixed_layouts(fakes, rng):
    """timm's packed qkv (three views of one buffer), and q strided with packed GQA k / v."""
    b, s, h, d = 2, 9, 4, 8
    qkv = rng.standard_normal((b, s, 3, h, d), dtype=np.float32)
    q, k, v = qkv.transpose(2, 0, 3, 1, 4)
    out = ops.attention(q, k, v, variant="fakeattn.strided")
    np.testing.assert_allclose(out, _ref(q, k, v), rtol=1e-5, atol=1e-6)
    op = fakes[-1][0]
    assert op.strides[:9] == (s * 3 * h * d, d, 3 * h * d) * 3
    q2 = _bshd(rng, 2, 5, 4, 8)
    k2 = rng.standard_normal((2, 2, 6, 8), dtype=np.float32)
    v2 = rng.standard_normal((2, 2, 6, 8), dtype=np.float32)
    out = ops.attention(q2, k2, v2, enable_gqa=True, variant="fakeattn.strided")
    np.testing.assert_allclose(out, _ref(q2, k2, v2), rtol=1e-5, atol=1e-6)
    op = fakes[-1][0]
    assert op.strides[3:9] == (96, 48, 8) * 2 and fakes[-1][2] is k2


def test_operands_that_do_not_fold_or_broadcast_are_packed(fakes, rng):
    q = rng.standard_normal((2, 3, 5, 16), dtype=np.float32)[..., ::2]  # strided head_dim
    k = rng.standard_normal((1, 3, 5, 8), dtype=np.float32)  # broadcast over the batch
    v = rng.standard_normal((2, 3, 5, 8), dtype=np.float32)
    out = ops.attention(q, k, v, variant="fakeattn.strided")
    np.testing.assert_allclose(out, _ref(q, np.broadcast_to(k, v.shape), v), rtol=1e-5, atol=1e-6)
    op, qq, kk, vv, _ = fakes[-1]
    assert op.strides is None and qq.flags.c_contiguous and kk.shape == (2, 3, 5, 8)


def test_out_argument_with_strided_inputs(fakes, rng):
    q, k, v = (_bshd(rng, 2, 7, 3, 8) for _ in range(3))
    out = np.empty((2, 3, 7, 8), dtype=np.float32)
    got = ops.attention(q, k, v, out=out, variant="fakeattn.strided")
    assert got is out
    np.testing.assert_allclose(out, _ref(q, k, v), rtol=1e-5, atol=1e-6)
    assert fakes[-1][0].strides[9:] == strided.packed(3, 7, 8)  # the user's packed out is written directly


def test_numpy_reference_path_on_strided_views(rng):
    """Without fakes: the default CPU path (variants that read packed arrays) on BSHD views."""
    plans.invalidate("test")
    q, k, v = (_bshd(rng, 2, 11, 3, 16) for _ in range(3))
    for _ in range(2):
        np.testing.assert_allclose(ops.attention(q, k, v, is_causal=True), _ref(q, k, v, True), rtol=1e-4, atol=1e-5)
