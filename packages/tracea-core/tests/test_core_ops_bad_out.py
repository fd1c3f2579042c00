"""Regression tests for bad ``out=`` / ``out_dtype`` / epilogue arguments found by fuzzing (issue 13):
each gets a specific TraceaError naming the argument, and no array is written."""

from __future__ import annotations

import numpy as np
import pytest

from tracea import ops
from tracea.errors import DTypeError, InvalidArgumentError


@pytest.fixture
def ab(rng):
    return rng.standard_normal((8, 6), dtype=np.float32), rng.standard_normal((6, 5), dtype=np.float32)


def test_read_only_out_is_refused_and_untouched(ab):
    a, b = ab
    out = np.zeros((8, 5), np.float32)
    out.flags.writeable = False
    with pytest.raises(InvalidArgumentError, match="'out'.*read-only"):
        ops.matmul(a, b, out=out)
    assert not out.any()


def test_read_only_non_contiguous_out(ab):
    a, b = ab
    out = np.zeros((8, 10), np.float32)[:, ::2]
    out.flags.writeable = False
    with pytest.raises(InvalidArgumentError, match="'out'"):
        ops.matmul(a, b, out=out)


@pytest.mark.parametrize("kind", ["matmul", "attention"])
def test_read_only_memmap_out(tmp_path, rng, kind):
    path = tmp_path / "out.bin"
    if kind == "matmul":
        a, b = rng.standard_normal((8, 6), dtype=np.float32), rng.standard_normal((6, 5), dtype=np.float32)
        np.zeros((8, 5), np.float32).tofile(path)
        out = np.memmap(path, dtype=np.float32, mode="r", shape=(8, 5))
        call = lambda: ops.matmul(a, b, out=out)  # noqa: E731
    else:
        q = rng.standard_normal((1, 2, 4, 8), dtype=np.float32)
        np.zeros(q.shape, np.float32).tofile(path)
        out = np.memmap(path, dtype=np.float32, mode="r", shape=q.shape)
        call = lambda: ops.attention(q, q, q, out=out)  # noqa: E731
    with pytest.raises(InvalidArgumentError, match="'out'"):
        call()
    assert not np.fromfile(path, np.float32).any()


def test_self_overlapping_out(ab):
    a, b = ab
    base = np.zeros(5, np.float32)
    out = np.lib.stride_tricks.as_strided(base, shape=(8, 5), strides=(0, 4), writeable=True)
    with pytest.raises(InvalidArgumentError, match="'out'"):
        ops.matmul(a, b, out=out)


@pytest.mark.parametrize("bad", ["int32", "int8", "bool"])
def test_non_float_out_dtype(ab, bad):
    a, b = ab
    with pytest.raises((DTypeError, InvalidArgumentError), match="out_dtype|dtype"):
        ops.matmul(a, b, out_dtype=bad)


@pytest.mark.parametrize("kw", [dict(epilogue=5), dict(activation=5), dict(activation=3.5), dict(epilogue=b"relu"),
                                dict(activation="nope"), dict(epilogue=[1])])
def test_bad_epilogue_and_activation(ab, kw):
    a, b = ab
    arg = next(iter(kw))
    with pytest.raises(InvalidArgumentError, match=f"'{arg}'"):
        ops.matmul(a, b, **kw)


def test_conv_bad_activation(rng):
    x = rng.standard_normal((1, 3, 6, 6), dtype=np.float32)
    w = rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    with pytest.raises(InvalidArgumentError, match="'activation'"):
        ops.conv2d(x, w, activation=7)


# ---- found by the ops fuzzer (tracea.fuzzing) -----------------------------------------------------

@pytest.mark.parametrize("arg,value", [("stride", (1.5, 1)), ("padding", (1, 0.5)), ("dilation", [2.0, 1]),
                                       ("stride", "1"), ("padding", (True, 0)), ("dilation", (1, "2"))])
def test_conv2d_refuses_non_integer_pairs(rng, arg, value):
    # (1.5, 1) used to run as stride (1, 1): int() truncated every element of a pair.
    x, w = rng.standard_normal((1, 2, 6, 6)), rng.standard_normal((3, 2, 3, 3))
    with pytest.raises(InvalidArgumentError, match=f"'{arg}'.*an int or a pair of ints"):
        ops.conv2d(x, w, **{arg: value})


def test_conv2d_accepts_numpy_integer_pairs(rng):
    x, w = rng.standard_normal((1, 2, 6, 6)), rng.standard_normal((3, 2, 3, 3))
    out = ops.conv2d(x, w, stride=(np.int64(2), np.int32(1)), padding=np.int64(1))
    assert out.shape == (1, 3, 3, 6)


@pytest.mark.parametrize("dtype", [np.int32, np.bool_])
def test_non_float_out_is_refused(ab, dtype):
    # An int32 out without out_dtype used to set the output dtype to int32 (silently truncated results).
    a, b = ab
    out = np.zeros((8, 5), dtype)
    with pytest.raises(DTypeError, match="'out.dtype'"):
        ops.matmul(a, b, out=out)
    assert not out.any()
    with pytest.raises(DTypeError, match="'out.dtype'"):
        ops.conv2d(np.ones((1, 2, 4, 4), np.float32), np.ones((3, 2, 1, 1), np.float32),
                   out=np.zeros((1, 3, 4, 4), dtype))


def test_conv2d_accepts_numpy_integer_groups(rng):
    # groups=np.int64(2) was "expected a positive integer"
    x, w = rng.standard_normal((1, 4, 5, 5)), rng.standard_normal((6, 2, 3, 3))
    got = ops.conv2d(x, w, groups=np.int64(2))
    np.testing.assert_allclose(got, ops.conv2d(x, w, groups=2))


def test_numpy_bf16_out_dtype_error_names_out_dtype(ab):
    from tracea.dtypes import DType

    if DType.BF16.numpy is not None:
        pytest.skip("ml_dtypes is installed: NumPy stores bfloat16")
    with pytest.raises(DTypeError, match="argument 'out_dtype'"):
        ops.matmul(*ab, out_dtype="bfloat16")
