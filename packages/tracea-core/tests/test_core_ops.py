"""tracea.ops on NumPy arrays: results against the float64 reference, and every bad input's error."""

from __future__ import annotations

import numpy as np
import pytest

import tracea
from tracea import AttentionOp, Conv2dOp, GemmOp, ops
from tracea.errors import DTypeError, InvalidArgumentError, NoVariantError, ShapeError, UnsupportedDeviceError
from tracea.reference import reference
from tracea.testing import output_error, rel_err

VARIANTS = [None, "reference"]  # whatever the Doctor picks, and the oracle itself


def _v(kind: str, which: str | None) -> str | None:
    return None if which is None else f"reference.{kind}"


@pytest.mark.parametrize("which", VARIANTS)
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 13, 5), (33, 17, 65), (64, 48, 31)])
@pytest.mark.parametrize("epi", [None, "relu", "gelu", "gelu_erf", "silu"])
def test_matmul_matches_reference(rng, m, n, k, epi, which):
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    out = ops.matmul(a, b, bias=bias, activation=epi, variant=_v("gemm", which))
    op = GemmOp(m, n, k, epilogue="bias" + (f"+{epi}" if epi else ""))
    assert out.shape == (m, n) and out.dtype == np.float32
    err = output_error(op, out, dict(a=a, b=b, bias=bias))  # a 1x1 GELU output must not flake
    assert np.isfinite(out).all() and err < 1e-5, err


def test_matmul_transposed_batched_and_out(rng):
    a = rng.standard_normal((3, 9, 5), dtype=np.float32)
    b = rng.standard_normal((3, 5, 7), dtype=np.float32)
    at = np.swapaxes(a.copy(order="C").swapaxes(1, 2).copy(), 1, 2)  # column-major view, same values
    assert not at.flags.c_contiguous
    out = np.full((3, 9, 7), np.nan, np.float32)
    res = ops.matmul(at, b, out=out)
    assert res is out
    assert rel_err(out, np.matmul(a.astype(np.float64), b)) < 1e-5
    shared_b = b[0]
    res = ops.matmul(a, shared_b)  # 3-D @ 2-D: one GEMM with M = batch*m
    assert res.shape == (3, 9, 7) and rel_err(res, a.astype(np.float64) @ shared_b) < 1e-5
    f64 = ops.matmul(a[0].astype(np.float64), b[0].astype(np.float64))
    assert f64.dtype == np.float64
    f16out = ops.matmul(a[0], b[0], out_dtype="float16")
    assert f16out.dtype == np.float16
    strided = a[0][::2]  # non-contiguous rows: copied once
    assert rel_err(ops.matmul(strided, b[0]), strided.astype(np.float64) @ b[0]) < 1e-5


@pytest.mark.parametrize("which", VARIANTS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("geom", [
    dict(n=1, c=3, h=8, w=8, k=4, r=3, stride=1, padding=1),
    dict(n=2, c=4, h=9, w=7, k=6, r=3, stride=2, padding=0, dilation=2),
    dict(n=1, c=6, h=5, w=5, k=4, r=1, stride=1, padding=0, groups=2),
    dict(n=1, c=2, h=11, w=6, k=3, r=5, stride=(2, 1), padding=(2, 1)),
])
def test_conv2d_matches_reference(rng, layout, geom, which):
    g = dict(stride=1, padding=0, dilation=1, groups=1)
    g.update(geom)
    n, c, h, w, k, r = (g[x] for x in "nchwkr")
    cg = c // g["groups"]
    x = rng.standard_normal((n, c, h, w) if layout == "NCHW" else (n, h, w, c), dtype=np.float32)
    wt = rng.standard_normal((k, cg, r, r) if layout == "NCHW" else (k, r, r, cg), dtype=np.float32)
    b = rng.standard_normal(k, dtype=np.float32)
    out = ops.conv2d(x, wt, b, stride=g["stride"], padding=g["padding"], dilation=g["dilation"], groups=g["groups"],
                     layout=layout, activation="relu", variant=_v("conv2d", which))
    op = Conv2dOp(n, c, h, w, k, r, r, stride=g["stride"], padding=g["padding"], dilation=g["dilation"],
                  groups=g["groups"], layout=layout, epilogue="bias+relu")
    assert out.shape == op.out_shape
    assert rel_err(out, reference(op, x=x, w=wt, bias=b)) < 1e-5


@pytest.mark.parametrize("which", VARIANTS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,h,kvh,sq,skv,d", [(1, 1, 1, 1, 1, 8), (2, 4, 2, 17, 9, 16), (1, 2, 2, 5, 33, 64)])
def test_attention_matches_reference(rng, b, h, kvh, sq, skv, d, causal, which):
    q = rng.standard_normal((b, h, sq, d), dtype=np.float32)
    k = rng.standard_normal((b, kvh, skv, d), dtype=np.float32)
    v = rng.standard_normal((b, kvh, skv, d), dtype=np.float32)
    out = ops.attention(q, k, v, causal=causal, variant=_v("attention", which))
    op = AttentionOp(b, h, sq, skv, d, causal=causal, kv_heads=kvh)
    assert out.shape == q.shape
    assert rel_err(out, reference(op, q=q, k=k, v=v)) < 1e-5
    three_d = ops.attention(q[0], k[0], v[0], causal=causal)
    assert three_d.shape == q[0].shape


class _FakeCudaArray:
    """A DLPack-speaking array on a CUDA device, with no backend for it."""

    shape = (4, 4)
    dtype = "float32"

    def __dlpack__(self, stream=None):  # pragma: no cover - never consumed
        raise AssertionError

    def __dlpack_device__(self):
        return (2, 0)


def test_errors_are_specific(rng):
    a = rng.standard_normal((4, 5), dtype=np.float32)
    with pytest.raises(ShapeError, match="argument 'b'.*k=5"):
        ops.matmul(a, rng.standard_normal((4, 3), dtype=np.float32))
    with pytest.raises(ShapeError, match="argument 'a'.*2-D or 3-D"):
        ops.matmul(a.ravel(), a.T)
    with pytest.raises(DTypeError, match="b.dtype"):
        ops.matmul(a, a.T.astype(np.float64))
    with pytest.raises(DTypeError, match="a.dtype"):
        ops.matmul(a.astype(np.int32), a.T.astype(np.int32))
    with pytest.raises(ShapeError, match="positive size"):
        ops.matmul(np.zeros((0, 5), np.float32), a.T)
    with pytest.raises(ShapeError, match="argument 'bias'"):
        ops.matmul(a, a.T, bias=np.ones(3, np.float32))
    with pytest.raises(ShapeError, match="argument 'out'"):
        ops.matmul(a, a.T, out=np.empty((4, 5), np.float32))
    with pytest.raises(DTypeError, match="out.dtype"):
        ops.matmul(a, a.T, out=np.empty((4, 4), np.float64), out_dtype="float16")
    with pytest.raises(InvalidArgumentError, match="does not overlap"):
        sq = np.ones((4, 4), np.float32)
        ops.matmul(sq, sq, out=sq)
    with pytest.raises(InvalidArgumentError, match="bias array"):
        ops.matmul(a, a.T, epilogue="bias+relu")
    with pytest.raises(InvalidArgumentError, match="argument 'a'"):
        ops.matmul([[1.0]], [[1.0]])
    with pytest.raises(UnsupportedDeviceError, match="cuda:0"):
        ops.matmul(_FakeCudaArray(), _FakeCudaArray())
    x = rng.standard_normal((1, 4, 6, 6), dtype=np.float32)
    with pytest.raises(ShapeError, match="argument 'w'"):
        ops.conv2d(x, rng.standard_normal((2, 3, 3, 3), dtype=np.float32))
    with pytest.raises(InvalidArgumentError, match="argument 'groups'"):
        ops.conv2d(x, rng.standard_normal((3, 4, 3, 3), dtype=np.float32), groups=0)
    with pytest.raises(InvalidArgumentError, match="kernel extent"):
        ops.conv2d(x, rng.standard_normal((2, 4, 9, 9), dtype=np.float32))
    with pytest.raises(InvalidArgumentError, match="stride"):
        ops.conv2d(x, rng.standard_normal((2, 4, 3, 3), dtype=np.float32), stride=(1, 2, 3))
    q = rng.standard_normal((1, 2, 4, 8), dtype=np.float32)
    with pytest.raises(ShapeError, match="argument 'k'"):
        ops.attention(q, q[:, :, :, :4], q)
    with pytest.raises(ShapeError, match="argument 'v'"):
        ops.attention(q, q, q[:, :, :3])
    with pytest.raises(NoVariantError, match="not registered"):
        ops.matmul(a, a.T, variant="nonexistent.gemm")


def test_no_variant_error_lists_reasons(rng):
    a = rng.standard_normal((4, 4)).astype(np.int8)
    from tracea.doctor import get_doctor

    with pytest.raises(NoVariantError) as info:
        get_doctor().decide(GemmOp(4, 4, 4, dtype_a="int8", dtype_b="int8"), "cpu")
    assert "reference.gemm" in info.value.rejections
    assert any("int8" in r for r in info.value.rejections["reference.gemm"])
    assert a.dtype == np.int8


def test_tracea_version_and_ops_module():
    assert tracea.__version__ == "0.1.0"
    assert tracea.ops.__name__ == "tracea.ops"
