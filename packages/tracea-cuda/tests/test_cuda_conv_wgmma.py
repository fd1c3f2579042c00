"""GPU tests of the Hopper implicit-GEMM conv2d (wgmma, cp.async gather) against a float64 reference."""

from __future__ import annotations

import pytest

from tracea.ir.ops import Conv2dOp

from tracea_cuda import testing as T
from tracea_cuda.variants import all_variants
from tracea_cuda.variants.base import math_mode

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")]

VARIANT = {v.name: v for v in all_variants()}["cuda.conv2d.wgmma"]


def _hopper():
    profile = T.gpu_profile()
    if (profile.compute_capability or (0, 0)) < (9, 0):
        pytest.skip("needs an sm_90 GPU (wgmma)")
    return profile


# (n, c, h, w, k, r, s, stride, padding, dilation): odd spatial sizes, M and K_out off the tile grid,
# strides, asymmetric padding, dilation, non-square kernels, 1x1.
GEOMS = [(2, 64, 9, 9, 72, 3, 3, 1, 1, 1), (3, 128, 7, 7, 40, 3, 3, 1, 1, 1), (1, 64, 17, 15, 128, 5, 3, 2, (2, 1), 1),
         (2, 64, 11, 13, 200, 1, 1, 1, 0, 1), (1, 192, 10, 13, 96, 3, 3, 1, 2, 2), (5, 64, 6, 6, 24, 2, 2, 2, 0, 1),
         (1, 256, 14, 14, 264, 3, 3, 2, 1, 1)]
MODES = [("nhwc", "float16", "bias+relu", None), ("nhwc", "bfloat16", "bias+gelu", None),
         ("nhwc", "bfloat16", "silu", "float32"), ("nhwc", "float32", "bias+relu", None),
         ("nchw", "float32", "bias+silu", None)]


def _check(op: Conv2dOp, config=None) -> None:
    profile = _hopper()
    assert not VARIANT.check(op, profile), VARIANT.check(op, profile)
    configs = [config] if config else VARIANT.hero_configs(op, profile)
    t = T.conv_inputs(op)
    ref = T.conv_reference(op, t)
    tol = T.tolerance(math_mode(op.dtype, op.fp32_precision), op.out_dtype)
    for c in configs:
        assert VARIANT.validate_config(op, c, profile), c.key
        t["out"].fill_(float("nan"))
        VARIANT.run(op, c, T.op_args(t), profile)
        err = T.rel_err(t["out"], ref)
        assert err <= tol, f"{op.describe()} {c.key}: rel err {err:.3g} > {tol}"


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(x for x in m if x))
@pytest.mark.parametrize("geom", GEOMS, ids=lambda g: "g" + "_".join(map(str, g[:7])))
def test_wgmma_conv_geometries(mode, geom):
    layout, dt, epi, out = mode
    n, c, h, w, k, r, s, st, pad, dil = geom
    if dt == "float32":
        c = c // 2  # fp32 slices are 32 channels: exercise C = 32 * odd too
    op = Conv2dOp(n, c, h, w, k, r, s, stride=st, padding=pad, dilation=dil, layout=layout, dtype=dt,
                  dtype_out=out, fp32_precision="high", epilogue=epi)
    heroes = VARIANT.hero_configs(op, _hopper())
    _check(op, heroes[(GEOMS.index(geom) + MODES.index(mode)) % len(heroes)])  # every hero over the grid


@pytest.mark.parametrize("config_params", [dict(tile_m=128, tile_n=64, schedule="coop"),
                                           dict(tile_m=64, tile_n=256, schedule="pingpong", stages=4),
                                           dict(tile_m=128, tile_n=256, schedule="coop", smem_epilogue=False, stages=3),
                                           dict(tile_m=128, tile_n=128, schedule="pingpong", stages=3)])
def test_wgmma_conv_search_space_corners(config_params):
    op = Conv2dOp(2, 64, 11, 9, 136, 3, 3, padding=1, layout="nhwc", dtype="float16", epilogue="bias+gelu")
    base = VARIANT.hero_configs(op, _hopper())[0]
    params = dict(config_params)
    config = base.replace(tile_m=params.pop("tile_m"), tile_n=params.pop("tile_n"),
                          stages=params.pop("stages", base.stages)).replace(**params)
    _check(op, config)


def test_wgmma_conv_resnet_layer_every_hero():
    _check(Conv2dOp(4, 128, 28, 28, 128, 3, 3, padding=1, layout="nhwc", dtype="bfloat16", epilogue="bias+relu"))
    _check(Conv2dOp(4, 64, 28, 28, 64, 3, 3, padding=1, layout="nchw", dtype="float32", fp32_precision="high"))


def test_wgmma_conv_misaligned_input_falls_back():
    import torch

    op = Conv2dOp(2, 64, 8, 8, 64, 3, 3, padding=1, layout="nhwc", dtype="float16", epilogue="bias")
    profile = _hopper()
    t = T.conv_inputs(op)
    ref = T.conv_reference(op, t)
    flat = torch.empty(t["x"].numel() + 1, device="cuda", dtype=t["x"].dtype)
    x = flat[1:].view(t["x"].shape)
    x.copy_(t["x"])
    t["x"] = x
    VARIANT.run(op, VARIANT.hero_configs(op, profile)[0], T.op_args(t), profile)
    assert T.rel_err(t["out"], ref) <= 2e-3


def test_wgmma_conv_declines_with_reasons():
    profile = _hopper()
    stem = Conv2dOp(1, 3, 32, 32, 64, 7, 7, stride=2, padding=3, layout="nhwc", dtype="float16")
    assert any("multiple of 64 channels" in r for r in VARIANT.check(stem, profile))
    accurate = Conv2dOp(1, 64, 8, 8, 64, 3, 3, layout="nchw", dtype="float32", fp32_precision="highest")
    assert VARIANT.check(accurate, profile)
    pointwise = Conv2dOp(2, 64, 8, 8, 64, 1, 1, layout="nchw", dtype="float32", fp32_precision="high")
    assert any("implicit_mma" in r for r in VARIANT.check(pointwise, profile))
    grouped = Conv2dOp(1, 128, 8, 8, 128, 3, 3, groups=2, layout="nhwc", dtype="float16")
    assert any("groups" in r for r in VARIANT.check(grouped, profile))
