"""OpenCL implicit-GEMM conv2d against a float64 direct convolution: both layouts, stride, padding,
dilation, groups, every epilogue, fp16."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.doctor.variant import OpArgs
from tracea.dtypes import DType
from tracea.ir.ops import Conv2dOp
from tracea.semantic.config import PipelineConfig

pytestmark = pytest.mark.opencl

DIRECT = PipelineConfig(tile_m=8, tile_n=16, tile_k=8, stages=1, warps=1,
                        params={"wg_m": 1, "wg_n": 16, "vw": 1, "local": 0, "raster": 4096, "pack": 1})
UNPACKED = PipelineConfig(tile_m=8, tile_n=16, tile_k=8, stages=1, warps=1,
                          params={"wg_m": 2, "wg_n": 8, "vw": 1, "local": 0, "raster": 0, "pack": 0})
LOCAL = PipelineConfig(tile_m=32, tile_n=16, tile_k=8, stages=1, warps=1,
                       params={"wg_m": 8, "wg_n": 4, "vw": 2, "local": 1, "raster": 0})
VECTOR = PipelineConfig(tile_m=4, tile_n=16, tile_k=4, stages=1, warps=1,
                        params={"wg_m": 2, "wg_n": 2, "vw": 4, "local": 0, "raster": 0, "pack": 1})

# (n, c, h, w, k, r, s, stride, padding, dilation, groups)
CASES = [
    (1, 3, 9, 11, 5, 3, 3, 1, 1, 1, 1),
    (2, 8, 12, 10, 16, 3, 3, 2, 1, 1, 1),
    (2, 6, 7, 9, 4, 1, 1, 1, 0, 1, 1),
    (1, 5, 13, 13, 7, 5, 3, (2, 1), (2, 0), 1, 1),
    (1, 4, 11, 12, 6, 3, 3, 1, 2, 2, 1),
    (2, 8, 8, 8, 12, 3, 3, 1, 1, 1, 4),
]


def run_conv(op: Conv2dOp, config: PipelineConfig, profile, oracle, seed: int = 0) -> float:
    from tracea_opencl import to_device
    from tracea_opencl.arrays import PyOpenCLAdapter
    from tracea_opencl.conv2d import OpenCLConv2d

    rng = np.random.default_rng(seed)
    np_in = op.dtype.numpy
    x = rng.standard_normal(op.x_shape).astype(np_in)
    w = rng.standard_normal(op.w_shape).astype(np_in)
    bias = rng.standard_normal(op.k).astype(op.out_dtype.numpy) if op.epilogue.has_bias else None
    dev = profile.device
    out = oracle.poisoned(op.out_shape, op.out_dtype.numpy, dev)
    args = OpArgs({"x": to_device(x, dev), "w": to_device(w, dev),
                   "bias": None if bias is None else to_device(bias, dev)}, out, PyOpenCLAdapter())
    variant = OpenCLConv2d()
    assert variant.check(op, profile) == []
    variant.run(op, config, args, profile)
    return oracle.rel_error(out.get(), oracle.conv(op, x, w, bias))


@pytest.mark.parametrize("config", [DIRECT, UNPACKED, LOCAL, VECTOR], ids=["packed", "direct", "local", "vector"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_conv_geometries(cl_profile, oracle, case, layout, config):
    n, c, h, w, k, r, s, stride, padding, dilation, groups = case
    op = Conv2dOp(n, c, h, w, k, r, s, stride=stride, padding=padding, dilation=dilation, groups=groups,
                  layout=layout, epilogue="bias")
    assert run_conv(op, config, cl_profile, oracle) < 1e-5


@pytest.mark.parametrize("epilogue", ["none", "relu", "bias+gelu_tanh", "bias+gelu_erf", "bias+silu"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv_epilogues(cl_profile, oracle, epilogue, layout):
    op = Conv2dOp(2, 6, 10, 9, 10, 3, 3, padding=1, layout=layout, epilogue=epilogue)
    assert run_conv(op, DIRECT, cl_profile, oracle, seed=2) < 1e-5


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv_fp16(cl_profile, oracle, layout):
    op = Conv2dOp(1, 8, 9, 9, 16, 3, 3, padding=1, layout=layout, dtype=DType.F16, epilogue="bias+relu")
    assert run_conv(op, LOCAL, cl_profile, oracle, seed=4) < 2e-3


def test_conv_heroes_are_valid(cl_profile, oracle):
    from tracea_opencl.conv2d import OpenCLConv2d

    op = Conv2dOp(1, 16, 14, 14, 32, 3, 3, padding=1, layout="NHWC", epilogue="bias+relu")
    variant = OpenCLConv2d()
    heroes = variant.hero_configs(op, cl_profile)
    assert heroes
    assert run_conv(op, heroes[0], cl_profile, oracle, seed=6) < 1e-5
