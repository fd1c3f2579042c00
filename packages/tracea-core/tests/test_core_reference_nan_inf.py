"""The float64 reference is the NaN / Inf oracle of every backend's tests (docs/architecture.md,
"Numerics"); here it is checked against PyTorch in float64 on the same inputs: every epilogue step on
special values, GEMM and conv2d with NaN / +-Inf at random positions (zero padding included: 0 * Inf
is NaN), attention under PyTorch's SDPA. Also that ``nonfinite_mismatch`` catches every kind of
difference."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.ir.epilogue import Epilogue
from tracea.ir.ops import AttentionOp, Conv2dOp, GemmOp
from tracea.reference import apply_epilogue, attention, conv2d, gemm
from tracea.testing import inject_nonfinite, nonfinite_mismatch

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 3.0, -3.0, 20.0, -20.0, 88.5, -88.5, 100.0,
                    -100.0, 1e30, -1e30, 1e300, -1e300])
EPILOGUES = ["relu", "gelu_tanh", "gelu_erf", "silu", "bias+relu", "bias+silu"]


def test_nonfinite_mismatch_reports_each_kind_of_difference():
    ref = np.array([np.nan, np.inf, -np.inf, 1.0, 2.0])
    assert nonfinite_mismatch(ref.copy(), ref) is None
    assert "NaN" in nonfinite_mismatch(np.array([0.0, np.inf, -np.inf, 1.0, 2.0]), ref)
    assert "+Inf" in nonfinite_mismatch(np.array([np.nan, 5.0, -np.inf, 1.0, 2.0]), ref)
    assert "-Inf" in nonfinite_mismatch(np.array([np.nan, np.inf, 7.0, 1.0, 2.0]), ref)
    assert "finite" in nonfinite_mismatch(np.array([np.nan, np.inf, -np.inf, 1.0, 2.1]), ref)
    assert nonfinite_mismatch(np.array([np.nan, np.inf, -np.inf, 1.0, 2.00001]), ref) is None


def test_inject_nonfinite_writes_where_it_says():
    rng = np.random.default_rng(0)
    a = np.zeros((3, 4))
    done = inject_nonfinite(rng, a, 5)
    for idx, val in done[-1:]:
        assert np.array_equal(a[idx], val, equal_nan=True)
    assert (~np.isfinite(a)).sum() >= 1 and np.isfinite(a).sum() >= 12 - 5


torch = pytest.importorskip("torch")
F = torch.nn.functional
ACT = {"relu": F.relu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "gelu_erf": F.gelu, "silu": F.silu}
pytestmark = pytest.mark.torch


def _torch_epilogue(t, epi: str, bias, dim: int):
    for step in epi.split("+"):
        if step == "bias":
            shape = [1] * t.dim()
            shape[dim] = -1
            t = t + torch.from_numpy(bias).reshape(shape)
        else:
            t = ACT[step](t)
    return t


@pytest.mark.parametrize("epi", ["relu", "gelu_tanh", "gelu_erf", "silu"])
def test_epilogue_steps_on_special_values_match_torch(epi):
    got = apply_epilogue(SPECIAL, Epilogue.parse(epi), None)
    assert nonfinite_mismatch(got, ACT[epi](torch.from_numpy(SPECIAL)).numpy(), atol=1e-12) is None


@pytest.mark.parametrize("epi", EPILOGUES)
def test_gemm_with_nonfinite_inputs_matches_torch(epi):
    rng = np.random.default_rng(len(epi))
    for trial in range(6):
        op = GemmOp(7, 9, 5, trans_b=bool(trial % 2), epilogue=epi)
        a = rng.standard_normal((7, 5))
        b = rng.standard_normal((9, 5) if op.trans_b else (5, 9))
        bias = rng.standard_normal(9)
        inject_nonfinite(rng, (a, b)[trial % 2], 1 + trial % 3)
        got = gemm(op, a, b, bias if op.epilogue.has_bias else None)[0]
        tb = torch.from_numpy(b.T if op.trans_b else b)
        want = _torch_epilogue(torch.from_numpy(a) @ tb, epi, bias, 1).numpy()
        assert nonfinite_mismatch(got, want, atol=1e-12) is None, (epi, trial)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("epi", EPILOGUES)
def test_conv2d_with_nonfinite_inputs_matches_torch(layout, epi):
    rng = np.random.default_rng([len(epi), len(layout)])
    for trial in range(6):
        op = Conv2dOp(2, 4, 6, 7, 6, 3, 3, stride=1 + trial % 2, padding=1, dilation=1 + trial // 4,
                      groups=2 if trial % 3 == 0 else 1, layout=layout, epilogue=epi)
        x, w, bias = rng.standard_normal(op.x_shape), rng.standard_normal(op.w_shape), rng.standard_normal(op.k)
        inject_nonfinite(rng, (x, w)[trial % 2], 1 + trial % 2)
        got = conv2d(op, x, w, bias if op.epilogue.has_bias else None)
        tx, tw = torch.from_numpy(x), torch.from_numpy(w)
        if layout == "nhwc":
            tx, tw = tx.permute(0, 3, 1, 2), tw.permute(0, 3, 1, 2)
        want = F.conv2d(tx, tw, None, op.stride, op.padding, op.dilation, op.groups)
        want = _torch_epilogue(want, epi, bias, 1)
        if layout == "nhwc":
            want = want.permute(0, 2, 3, 1)
        assert nonfinite_mismatch(got, want.numpy(), atol=1e-12) is None, (epi, trial)


# (batch, heads, kv_heads, seq_q, seq_kv, head_dim)
ATTN = [(1, 4, 2, 9, 13, 8), (2, 2, 2, 30, 30, 16), (1, 4, 1, 5, 40, 4)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name,value", [("k", np.nan), ("k", np.inf), ("k", -np.inf), ("q", np.inf), ("q", -np.inf),
                                        ("v", np.nan), ("v", np.inf), ("v", -np.inf)])
def test_attention_with_nonfinite_inputs_matches_torch_sdpa(causal, name, value):
    rng = np.random.default_rng([int(causal), len(name), int(np.isnan(value))])
    for b, h, kvh, sq, skv, d in ATTN:
        for _ in range(4):
            op = AttentionOp(b, h, sq, skv, d, causal=causal, kv_heads=kvh)
            q, k, v = (rng.standard_normal(s) for s in ((b, h, sq, d), (b, kvh, skv, d), (b, kvh, skv, d)))
            arr = {"q": q, "k": k, "v": v}[name]
            idx = tuple(int(rng.integers(0, n)) for n in arr.shape)
            if name == "k":  # not key 0: a causal row 0 would see NaN logits only (see the next test)
                idx = idx[:2] + (max(1, idx[2]),) + idx[3:]
            arr[idx] = value
            want = F.scaled_dot_product_attention(*(torch.from_numpy(t) for t in (q, k, v)), is_causal=causal,
                                                  enable_gqa=kvh != h).numpy()
            assert nonfinite_mismatch(attention(op, q, k, v), want, atol=1e-12) is None, (name, idx, value)


def test_attention_row_of_nan_logits_is_nan_as_in_torch_math_backend():
    """A NaN in q makes every logit of its row NaN: the row is NaN (PyTorch's math backend; its CPU
    flash kernel can return 0 there, depending on where the row falls in its vector loop)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((1, 2, 6, 8)), rng.standard_normal((1, 2, 20, 8)), rng.standard_normal((1, 2, 20, 8))
    q[0, 1, 2, 5] = np.nan
    got = attention(AttentionOp(1, 2, 6, 20, 8), q, k, v)
    with sdpa_kernel(SDPBackend.MATH):
        want = F.scaled_dot_product_attention(*(torch.from_numpy(t) for t in (q, k, v))).numpy()
    assert nonfinite_mismatch(got, want, atol=1e-12) is None
    assert np.isnan(got[0, 1, 2]).all() and np.isfinite(np.delete(got[0, 1], 2, axis=0)).all()
