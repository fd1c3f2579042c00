"""GPU tests of the implicit-GEMM conv2d variant against a float64 reference (skipped without a GPU)."""

from __future__ import annotations

import pytest

from tracea.ir.ops import Conv2dOp

from tracea_cuda import testing as T
from tracea_cuda.variants import all_variants
from tracea_cuda.variants.base import math_mode

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")]

VARIANT = {v.name: v for v in all_variants()}["cuda.conv2d.implicit_mma"]

# (n, c, h, w, k, r, s, stride, padding, dilation)
GEOMS = [(2, 16, 9, 9, 24, 3, 3, 1, 1, 1), (1, 3, 17, 15, 8, 7, 7, 2, 3, 1), (3, 32, 14, 14, 64, 1, 1, 1, 0, 1),
         (2, 8, 12, 12, 16, 3, 3, 2, 0, 1), (1, 24, 10, 11, 40, 3, 3, 1, 2, 2), (2, 64, 7, 7, 72, 3, 5, 1, (1, 2), 1),
         (1, 5, 6, 6, 3, 2, 2, 1, 0, 1)]
MODES = [("nhwc", "float16", "highest"), ("nhwc", "bfloat16", "highest"), ("nhwc", "float32", "high"),
         ("nchw", "float32", "high"), ("nchw", "float32", "highest")]


def _check(op: Conv2dOp, config=None) -> float:
    profile = T.gpu_profile()
    assert not VARIANT.check(op, profile), VARIANT.check(op, profile)
    config = config or VARIANT.hero_configs(op, profile)[0]
    t = T.conv_inputs(op)
    VARIANT.run(op, config, T.op_args(t), profile)
    err = T.rel_err(t["out"], T.conv_reference(op, t))
    tol = T.tolerance(math_mode(op.dtype, op.fp32_precision), op.out_dtype)
    assert err <= tol, f"{op.describe()} {config.key}: rel err {err:.3g} > {tol}"
    return err


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(m))
@pytest.mark.parametrize("geom", GEOMS, ids=lambda g: "g" + "_".join(map(str, g[:7])))
def test_conv_geometries(mode, geom):
    layout, dt, prec = mode
    n, c, h, w, k, r, s, st, pad, dil = geom
    op = Conv2dOp(n, c, h, w, k, r, s, stride=st, padding=pad, dilation=dil, layout=layout, dtype=dt,
                  fp32_precision=prec, epilogue="bias+relu")
    _check(op)


@pytest.mark.parametrize("epilogue", ["none", "bias", "bias+gelu", "bias+gelu_erf", "silu"])
def test_conv_epilogues(epilogue):
    op = Conv2dOp(2, 32, 10, 10, 48, 3, 3, padding=1, layout="nhwc", dtype="float16", epilogue=epilogue)
    _check(op)


def test_conv_hero_configs_resnet_like():
    op = Conv2dOp(2, 64, 14, 14, 64, 3, 3, padding=1, layout="nhwc", dtype="bfloat16", epilogue="bias+relu")
    for config in VARIANT.hero_configs(op, T.gpu_profile()):
        _check(op, config)


def test_groups_declined_with_reason():
    op = Conv2dOp(1, 8, 8, 8, 8, 3, 3, groups=2, layout="nhwc", dtype="float16")
    reasons = VARIANT.check(op, T.gpu_profile())
    assert any("groups" in r for r in reasons)


def test_nchw_half_declined_with_reason():
    op = Conv2dOp(1, 8, 8, 8, 8, 3, 3, layout="nchw", dtype="float16")
    assert any("NHWC" in r for r in VARIANT.check(op, T.gpu_profile()))


@pytest.mark.parametrize("mode", ["transform", "direct"])
@pytest.mark.parametrize("prec", ["high", "highest"])
def test_nchw_f32_both_input_paths(mode, prec):
    op = Conv2dOp(3, 20, 13, 11, 36, 3, 3, stride=(1, 2), padding=1, layout="nchw", dtype="float32",
                  fp32_precision=prec, epilogue="bias+silu")
    config = VARIANT.hero_configs(op, T.gpu_profile())[0].replace(nchw_mode=mode)
    _check(op, config)


@pytest.mark.parametrize("layout,dt,prec", [("nhwc", "bfloat16", "highest"), ("nchw", "float32", "high"),
                                            ("nhwc", "float16", "highest")])
@pytest.mark.parametrize("splits", [2, 3, 8])
def test_split_k(layout, dt, prec, splits):
    op = Conv2dOp(2, 64, 7, 7, 72, 3, 3, padding=1, layout=layout, dtype=dt, fp32_precision=prec,
                  epilogue="bias+gelu")
    config = VARIANT.hero_configs(op, T.gpu_profile())[0].replace(split_k=splits)
    _check(op, config)


def test_small_layers_offer_split_k():
    op = Conv2dOp(32, 512, 7, 7, 512, 3, 3, padding=1, layout="nhwc", dtype="float16")
    assert any(c.get("split_k", 1) > 1 for c in VARIANT.hero_configs(op, T.gpu_profile()))


@pytest.mark.parametrize("dt", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("c", [3, 1, 5])
def test_small_channel_nhwc_padded_bound_path_and_graph(dt, c):
    """NHWC convs with fewer channels than one 16-byte run (RGB stems) run on x and w padded with zero
    channels: through ``tracea.ops.conv2d`` (the bound launcher: pad pre-pass + conv), repeated (plan
    cache) and replayed from a CUDA graph, against float64."""
    import torch
    import torch.nn.functional as F

    import tracea
    from tracea.doctor.doctor import get_doctor
    from tracea_cuda.variants.conv import padded_op

    tdt = getattr(torch, dt)
    g = torch.Generator(device="cuda").manual_seed(c)
    x = torch.randn(2, c, 33, 31, device="cuda", dtype=tdt, generator=g).contiguous(memory_format=torch.channels_last)
    w = torch.randn(16, c, 7, 7, device="cuda", dtype=tdt, generator=g).contiguous(memory_format=torch.channels_last)
    b = torch.randn(16, device="cuda", dtype=tdt, generator=g)
    if c == 1 and not x.is_contiguous(memory_format=torch.channels_last):
        pytest.skip("a 1-channel tensor is NCHW-contiguous too")
    op = Conv2dOp(2, c, 33, 31, 16, 7, 7, stride=2, padding=3, layout="nhwc", dtype=dt, fp32_precision="high",
                  epilogue="bias+relu")
    padded = [cfg for cfg in VARIANT.hero_configs(op, T.gpu_profile()) if padded_op(op, cfg) is not None]
    assert bool(padded) == (c < 16 // tdt.itemsize)
    decision = get_doctor().decide(op, "cuda:0")
    ref = F.relu(F.conv2d(x.double(), w.double(), b.double(), 2, 3))
    tol = T.tolerance(math_mode(op.dtype, op.fp32_precision), op.out_dtype)
    forced = dict(variant=VARIANT.name, config=padded[0]) if padded else {}
    with torch.backends.cudnn.flags(allow_tf32=True):
        outs = [tracea.ops.conv2d(x, w, b, stride=2, padding=3, activation="relu") for _ in range(2)]
        outs += [tracea.ops.conv2d(x, w, b, stride=2, padding=3, activation="relu", **forced) for _ in range(2)]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = tracea.ops.conv2d(x, w, b, stride=2, padding=3, activation="relu", **forced)
        graph.replay()
    torch.cuda.synchronize()
    for out in outs + [captured]:
        assert T.rel_err(out, ref) <= tol, (decision.chosen.variant.name, T.rel_err(out, ref))
    assert torch.equal(captured, outs[-1])
