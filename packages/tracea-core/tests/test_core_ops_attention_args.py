"""``tracea.ops.attention`` with the arguments of ``torch.nn.functional.scaled_dot_product_attention`` on
NumPy arrays (the CPU kernel or the reference), against an independent float64 NumPy formula:
boolean / additive masks broadcast from any rank, leading batch dimensions broadcast between q and
k / v, 3-D and 5-D inputs, GQA, is_causal with seq_q != seq_kv (top-left), scale, a value head dim
unlike q's; and the errors and the plan-cache behaviour of the new arguments."""

from __future__ import annotations

import numpy as np
import pytest

from tracea import ops
from tracea.errors import DTypeError, InvalidArgumentError, NoVariantError, ShapeError
from tracea.runtime import plans


def sdpa64(q, k, v, mask=None, causal=False, scale=None):  # noqa: ANN001, ANN201
    """float64 softmax(q k^T * scale + mask) v with NumPy broadcasting, GQA by repeating kv heads."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    if k.shape[-3] != q.shape[-3] and q.shape[-3] % k.shape[-3] == 0:
        rep = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - np.where(m == -np.inf, 0.0, m))
    total = p.sum(axis=-1, keepdims=True)
    return np.matmul(p / np.where(total == 0, 1.0, total), v)


def _r(rng, *shape):  # noqa: ANN001, ANN202
    return rng.standard_normal(shape, dtype=np.float32)


# (q shape, k shape, v shape, mask shape or None)
SHAPES = [
    ((2, 4, 9, 16), (2, 4, 13, 16), (2, 4, 13, 16), (9, 13)),
    ((2, 4, 9, 16), (2, 2, 13, 16), (2, 2, 13, 16), (2, 1, 9, 13)),  # GQA, mask broadcast over heads
    ((4, 3, 8), (4, 4, 6, 8), (4, 4, 6, 8), (4, 1, 3, 6)),  # 3-D q against 4-D k / v, batch-dependent mask
    ((3, 5, 8), (3, 7, 8), (3, 7, 8), (1, 7)),  # 3-D, mask broadcast over queries
    ((2, 1, 2, 5, 8), (1, 3, 2, 6, 8), (1, 3, 2, 6, 8), (3, 1, 5, 6)),  # 5-D, batch dims broadcast both ways
    ((1, 2, 33, 64), (1, 2, 70, 64), (1, 2, 70, 64), None),
]


@pytest.mark.parametrize("kind", [None, "bool", "additive"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shapes", SHAPES, ids=[str(s[0]) for s in SHAPES])
@pytest.mark.parametrize("variant", [None, "reference.attention"])
def test_sdpa_arguments_match_float64(rng, shapes, kind, causal, variant):
    qs, ks, vs, ms = shapes
    q, k, v = _r(rng, *qs), _r(rng, *ks), _r(rng, *vs)
    mask = None
    if kind is not None:
        ms = ms or (qs[-2], ks[-2])
        mask = rng.uniform(size=ms) < 0.75 if kind == "bool" else rng.uniform(-2, 1, size=ms).astype(np.float32)
    scale = 0.3 if kind == "additive" else None
    out = ops.attention(q, k, v, mask, 0.0, causal, scale, variant=variant)
    ref = sdpa64(q, k, v, mask, causal, scale)
    assert out.shape == ref.shape and out.dtype == np.float32
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-4)


def test_value_head_dim_unlike_q_is_served_by_the_reference(rng):
    q, k, v = _r(rng, 2, 3, 5, 8), _r(rng, 2, 3, 7, 8), _r(rng, 2, 3, 7, 12)
    out = ops.attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(out, sdpa64(q, k, v, causal=True), atol=2e-5, rtol=1e-4)


def test_plain_call_keeps_one_plan_and_the_alias(rng):
    q, k, v = _r(rng, 1, 2, 9, 16), _r(rng, 1, 2, 9, 16), _r(rng, 1, 2, 9, 16)
    a = ops.attention(q, k, v, causal=True)
    before = plans.stats()["builds"]
    b = ops.attention(q, k, v, is_causal=True)
    c = ops.attention(q, k, v, None, 0.0, True)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    assert plans.stats()["builds"] - before <= 1  # causal= and is_causal= are two keys at most, then cached
    m = np.ones((9, 9), bool)
    ops.attention(q, k, v, m)
    after_mask = plans.stats()["builds"]
    ops.attention(q, k, v, ~m)  # same signature, new mask values: the plan reads the mask each call
    assert plans.stats()["builds"] == after_mask
    np.testing.assert_array_equal(ops.attention(q, k, v, ~m), np.zeros_like(q))  # every key masked: 0


def test_mask_values_are_read_on_every_call(rng):
    q, k, v = _r(rng, 1, 1, 4, 8), _r(rng, 1, 1, 6, 8), _r(rng, 1, 1, 6, 8)
    m = rng.uniform(-1, 1, size=(4, 6)).astype(np.float32)
    first = ops.attention(q, k, v, m)
    m2 = m.copy()
    m2[:, 0] = -np.inf
    second = ops.attention(q, k, v, m2)
    np.testing.assert_allclose(second, sdpa64(q, k, v, m2), atol=2e-5, rtol=1e-4)
    assert not np.allclose(first, second)


def test_bad_sdpa_arguments_raise_specific_errors(rng):
    q = _r(rng, 2, 4, 5, 8)
    with pytest.raises(NoVariantError, match="dropout"):
        ops.attention(q, q, q, dropout_p=0.1)
    with pytest.raises(InvalidArgumentError, match="dropout_p"):
        ops.attention(q, q, q, dropout_p=1.5)
    with pytest.raises(ShapeError, match="attn_mask"):
        ops.attention(q, q, q, np.zeros((3, 5), np.float32))
    with pytest.raises(DTypeError, match="attn_mask"):
        ops.attention(q, q, q, np.zeros((5, 5), np.int8))
    with pytest.raises(ShapeError, match="argument 'k'"):
        ops.attention(q, _r(rng, 3, 4, 5, 8), _r(rng, 3, 4, 5, 8))  # batch 2 vs 3 does not broadcast
    with pytest.raises(ShapeError, match="argument 'k'"):
        ops.attention(q, _r(rng, 2, 3, 5, 8), _r(rng, 2, 3, 5, 8))  # 3 kv heads do not divide 4
    with pytest.raises(InvalidArgumentError, match="is_causal"):
        ops.attention(q, q, q, is_causal="yes")
    with pytest.raises(InvalidArgumentError, match="scale"):
        ops.attention(q, q, q, scale=float("nan"))


@pytest.mark.parametrize("scale", [-1.0, 0.0, -0.25])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_takes_any_finite_scale(rng, scale, causal):
    """PyTorch accepts any float scale: zero and negative ones are computed by the documented formula
    (scale the logits, then mask), by whatever variant accepts them (kernels assuming a positive scale
    decline with a reason)."""
    q, k, v = _r(rng, 2, 3, 5, 8), _r(rng, 2, 3, 7, 8), _r(rng, 2, 3, 7, 6)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64)) * scale
    if causal:
        s = np.where(np.tril(np.ones((5, 7), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v.astype(np.float64))
    got = ops.attention(q, k, v, is_causal=causal, scale=scale)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5)


def test_conv2d_unbatched_and_string_padding(rng):
    from tracea.reference import reference
    from tracea import Conv2dOp

    x, w, b = _r(rng, 4, 9, 8), _r(rng, 6, 4, 2, 3), _r(rng, 6)
    for dil in (1, 2, 3):
        out = ops.conv2d(x, w, b, padding="same", dilation=dil)
        assert out.shape == (6, 9, 8)
        # PyTorch's 'same': total dil*(k-1) per dim, the odd one at the end (bottom / right)
        th, tw = dil * 1, dil * 2
        xp = np.zeros((1, 4, 9 + th, 8 + tw), np.float32)
        xp[0, :, th // 2:th // 2 + 9, tw // 2:tw // 2 + 8] = x
        op = Conv2dOp(1, 4, 9 + th, 8 + tw, 6, 2, 3, dilation=dil, epilogue="bias")
        np.testing.assert_allclose(out, reference(op, x=xp, w=w, bias=b)[0], atol=2e-5, rtol=1e-4)
    valid = ops.conv2d(x, w, padding="valid", stride=2)
    np.testing.assert_allclose(valid, ops.conv2d(x[None], w, stride=2)[0], atol=1e-6)
    out = np.full((6, 4, 3), np.nan, np.float32)
    assert ops.conv2d(x, w, padding="valid", stride=2, out=out) is out
    np.testing.assert_array_equal(out, valid)
    with pytest.raises(InvalidArgumentError, match="padding"):
        ops.conv2d(x, w, padding="same", stride=2)
    with pytest.raises(InvalidArgumentError, match="padding"):
        ops.conv2d(x, w, padding="full")


def test_conv2d_unbatched_out_must_be_an_array():
    """Fuzz case 6164:2155: a Python list as out= of an unbatched conv raised a bare TypeError."""
    x = np.ones((1, 3, 7), np.float32)
    w = np.ones((4, 1, 3, 3), np.float32)
    with pytest.raises(InvalidArgumentError, match="'out'"):
        ops.conv2d(x, w, padding=1, out=[[0.0] * 7] * 3)
