"""torch's CausalBias masks (``causal_upper_left`` / ``causal_lower_right``) through ``tracea.ops.attention``
and the patched ``F.scaled_dot_product_attention``: their tensor data are a placeholder, so Tracea must read
what they stand for (a silent wrong result before)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import tracea.ops
import tracea_torch
from tracea.errors import ShapeError

bias = pytest.importorskip("torch.nn.attention.bias")
pytestmark = [pytest.mark.torch]

SDPA = F.scaled_dot_product_attention  # the unpatched function (CausalBias dispatches on it)
SHAPES = [(3, 7), (5, 5), (4, 9), (6, 4), (1, 13)]


def _case(sq: int, sk: int, make):  # noqa: ANN001, ANN202
    q, k, v = torch.randn(2, 4, sq, 8), torch.randn(2, 4, sk, 8), torch.randn(2, 4, sk, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # lower right with sq > sk: torch warns about NaN rows
        m = make(sq, sk)
    return q, k, v, m, SDPA(q, k, v, attn_mask=m)


def _close(out: torch.Tensor, ref: torch.Tensor) -> bool:
    return torch.equal(out.isnan(), ref.isnan()) and bool(torch.allclose(out.nan_to_num(), ref.nan_to_num(), atol=1e-5))


@pytest.mark.parametrize("sq,sk", SHAPES)
def test_ops_attention_reads_what_a_causal_bias_stands_for(sq, sk):
    for make in (bias.causal_upper_left, bias.causal_lower_right, bias.causal_upper_left):
        q, k, v, m, ref = _case(sq, sk, make)
        for _ in range(2):  # the second call must not reuse a plan of the other alignment
            assert _close(tracea.ops.attention(q, k, v, attn_mask=m), ref), make.__name__


@pytest.mark.parametrize("sq,sk", SHAPES)
def test_patched_sdpa_reads_what_a_causal_bias_stands_for(sq, sk):
    # (the references first: CausalBias dispatches only while F.scaled_dot_product_attention is unpatched)
    cases = [_case(sq, sk, make) for make in (bias.causal_lower_right, bias.causal_upper_left, bias.causal_lower_right)]
    tracea_torch.patch_attention()
    try:
        for q, k, v, m, ref in cases:
            for _ in range(2):
                assert _close(F.scaled_dot_product_attention(q, k, v, attn_mask=m), ref), m.variant
    finally:
        tracea_torch.unpatch_attention()


def test_a_causal_bias_of_other_lengths_is_refused():
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    with pytest.raises(ShapeError, match="attn_mask"):
        tracea.ops.attention(q, k, v, attn_mask=bias.causal_upper_left(5, 6))
