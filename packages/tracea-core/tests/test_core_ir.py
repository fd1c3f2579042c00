"""Core IR: dtypes, epilogues, ops (validation, FLOPs, bytes, keys), devices, problem descriptors."""

from __future__ import annotations

import numpy as np
import pytest

from tracea import (AttentionOp, Conv2dOp, Device, DType, Epilogue, EpilogueKind, GemmOp, LayerType, Layout,
                    ProblemDescriptor, Shape)
from tracea.dtypes import Fp32Precision
from tracea.errors import DTypeError, InvalidArgumentError, LayoutError, ShapeError
from tracea.ir import op_from_dict


@pytest.mark.parametrize("value,expected", [
    ("float32", DType.F32), ("fp16", DType.F16), ("half", DType.F16), ("bf16", DType.BF16),
    ("torch.bfloat16", DType.BF16), (np.float16, DType.F16), (np.dtype("float64"), DType.F64),
    ("tf32", DType.TF32), ("float8_e4m3fn", DType.FP8_E4M3), ("e5m2", DType.FP8_E5M2), ("int8", DType.INT8),
])
def test_dtype_parse(value, expected):
    assert DType.parse(value) is expected


def test_dtype_properties():
    assert DType.TF32.storage is DType.F32 and DType.TF32.itemsize == 4
    assert DType.FP8_E4M3.bits == 8 and DType.BF16.itemsize == 2
    assert DType.F16.numpy == np.float16
    with pytest.raises(DTypeError, match="argument 'dtype'"):
        DType.parse("float13")


def test_fp32_precision_parse():
    assert Fp32Precision.parse(True) is Fp32Precision.HIGH
    assert Fp32Precision.parse("highest") is Fp32Precision.HIGHEST
    with pytest.raises(InvalidArgumentError):
        Fp32Precision.parse("fastest")


def test_epilogue_chain_and_parse():
    e = Epilogue.empty().bias_add().gelu().silu()
    assert e.steps == (EpilogueKind.BIAS, EpilogueKind.GELU_TANH, EpilogueKind.SILU)
    assert Epilogue.parse("bias+gelu+silu") == e
    assert Epilogue.parse(None).is_empty and Epilogue.empty().key == "none"
    assert Epilogue.empty().gelu(approximate="none").steps == (EpilogueKind.GELU_ERF,)
    assert e.has_bias and e.activations == (EpilogueKind.GELU_TANH, EpilogueKind.SILU)
    with pytest.raises(InvalidArgumentError, match="at most one bias"):
        Epilogue.parse("bias+relu+bias")
    with pytest.raises(InvalidArgumentError, match="epilogue"):
        Epilogue.parse("tanh")


def test_gemm_op_counts_and_key():
    op = GemmOp(128, 64, 32, batch=2, dtype_a="f16", dtype_b="f16", dtype_out="f32", epilogue="bias+relu")
    assert op.flops == 2 * 2 * 128 * 64 * 32
    assert op.min_bytes == 2 * (128 * 32 * 2 + 32 * 64 * 2 + 128 * 64 * 4) + 64 * 4
    assert op.key != GemmOp(128, 64, 32, batch=2, dtype_a="f16", dtype_b="f16").key
    assert op_from_dict(op.to_dict()) == op
    assert hash(op) == hash(GemmOp(128, 64, 32, batch=2, dtype_a="f16", dtype_b="f16", dtype_out="f32",
                                   epilogue="bias+relu"))


@pytest.mark.parametrize("kwargs,arg", [
    (dict(m=0, n=1, k=1), "m"), (dict(m=1, n=-3, k=1), "n"), (dict(m=1, n=1, k=2.5), "k"),
    (dict(m=1, n=1, k=1, batch=0), "batch"), (dict(m=True, n=1, k=1), "m"),
])
def test_gemm_op_rejects_bad_sizes(kwargs, arg):
    with pytest.raises(ShapeError, match=f"argument '{arg}'"):
        GemmOp(**kwargs)


def test_gemm_op_rejects_mixed_dtypes():
    with pytest.raises(InvalidArgumentError, match="b.dtype"):
        GemmOp(4, 4, 4, dtype_a="f16", dtype_b="f32")


def test_conv_op_geometry():
    op = Conv2dOp(2, 8, 17, 13, 6, 3, 5, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2,
                  layout="nhwc")
    assert op.p == (17 + 2 - 2 - 1) // 2 + 1 and op.q == (13 + 4 - 8 - 1) // 1 + 1
    assert op.x_shape == (2, 17, 13, 8) and op.w_shape == (6, 3, 5, 4) and op.out_shape == (2, op.p, op.q, 6)
    m, n, k = op.gemm_mnk
    assert op.flops == 2 * m * n * k * 2 and k == 4 * 15
    assert op_from_dict(op.to_dict()) == op


@pytest.mark.parametrize("kwargs,match", [
    (dict(groups=3), "groups"), (dict(padding=-1), "padding"), (dict(stride=0), "stride"),
    (dict(r=9), "kernel extent"),
])
def test_conv_op_rejects(kwargs, match):
    base = dict(n=1, c=4, h=5, w=5, k=4, r=3, s=3)
    base.update(kwargs)
    with pytest.raises(InvalidArgumentError, match=match):
        Conv2dOp(**base)


def test_conv_layout_parse():
    assert Layout.parse("channels_last") is Layout.NHWC
    with pytest.raises(LayoutError):
        Layout.parse("NCWH")


def test_attention_op():
    op = AttentionOp(2, 8, 5, 7, 16, causal=True, kv_heads=2)
    assert op.scale == pytest.approx(0.25)
    # row i sees keys 0..i: 1+2+3+4+5
    assert op.unmasked_pairs == 15
    assert op.flops == 4 * 2 * 8 * 15 * 16
    longer_q = AttentionOp(1, 1, 6, 3, 4, causal=True)
    assert longer_q.unmasked_pairs == 1 + 2 + 3 + 3 * 3
    with pytest.raises(InvalidArgumentError, match="kv_heads"):
        AttentionOp(1, 8, 4, 4, 16, kv_heads=3)
    with pytest.raises(InvalidArgumentError, match="scale"):
        AttentionOp(1, 1, 4, 4, 16, scale=float("nan"))


def test_device_and_problem_descriptor():
    assert Device.parse("cuda:1") == Device.Cuda(1) and str(Device.cpu()) == "cpu:0"
    with pytest.raises(InvalidArgumentError):
        Device.parse("cuda:x")
    p = ProblemDescriptor(device=Device.Cuda(0), layer_type=LayerType.Gemm, shape=Shape(m=64, n=32, k=16))
    assert isinstance(p.op, GemmOp) and p.op.m == 64
    with pytest.raises(InvalidArgumentError, match="explicit op"):
        ProblemDescriptor(layer_type=LayerType.CONV2D)
    conv = Conv2dOp(1, 3, 8, 8, 4, 3, 3)
    assert ProblemDescriptor.for_op(conv).layer_type is LayerType.CONV2D
    with pytest.raises(ShapeError):
        Shape(0, 1, 1)
