"""Tests of the pointwise (1x1) conv variant on the CUDA cores: what it declines (no GPU needed), and on a
GPU its outputs against a float64 reference over odd and aligned shapes, both layouts, every dtype,
epilogue and output dtype, misaligned views, the bound launcher and CUDA graph replay."""

from __future__ import annotations

import pytest

from tracea.doctor.profile import DeviceProfile
from tracea.ir.device import Device
from tracea.ir.ops import Conv2dOp

from tracea_cuda import testing as T
from tracea_cuda.device import isa_flags
from tracea_cuda.emit.pointwise import render
from tracea_cuda.variants.pointwise import PointwiseConv

VARIANT = PointwiseConv()
OFFLINE = DeviceProfile(Device("cuda", 0), "H200 (offline)", backend="cuda", arch="sm_90a", compute_units=132,
                        compute_capability=(9, 0), warp_size=32, max_threads_per_block=1024,
                        shared_mem_per_block=232448, registers_per_block=65536, isa=isa_flags((9, 0)),
                        peak_gflops={"float32": 66908.0}, bandwidth_gbs=4800.0)
needs_gpu = pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")


def _reasons(op: Conv2dOp) -> list[str]:
    return VARIANT.requirements.check(op, OFFLINE) + VARIANT.extra_checks(op, OFFLINE)


def test_declines_with_reasons():
    assert any("1x1" in r for r in _reasons(Conv2dOp(1, 32, 8, 8, 16, 3, 3, padding=1)))
    assert any("1x1" in r for r in _reasons(Conv2dOp(1, 32, 8, 8, 16, 1, 1, stride=2)))
    assert any("NHWC" in r for r in _reasons(Conv2dOp(1, 32, 8, 8, 16, 1, 1, layout="nchw", dtype="float16")))
    assert any("FLOP/B" in r for r in _reasons(Conv2dOp(1, 256, 8, 8, 64, 1, 1)))  # Tensor Cores serve it
    assert any("groups" in r for r in _reasons(Conv2dOp(1, 32, 8, 8, 16, 1, 1, groups=2)))
    assert not _reasons(Conv2dOp(32, 32, 112, 112, 16, 1, 1, fp32_precision="high"))
    assert not _reasons(Conv2dOp(32, 96, 56, 56, 24, 1, 1, fp32_precision="highest"))
    assert not _reasons(Conv2dOp(32, 32, 112, 112, 16, 1, 1, layout="nhwc", dtype="float16"))


@pytest.mark.parametrize("op", [Conv2dOp(32, 32, 112, 112, 16, 1, 1), Conv2dOp(1, 32, 112, 112, 16, 1, 1),
                                Conv2dOp(3, 21, 9, 7, 13, 1, 1, dtype_out="float16", epilogue="bias+gelu"),
                                Conv2dOp(32, 32, 112, 112, 16, 1, 1, layout="nhwc", dtype="bfloat16"),
                                Conv2dOp(2, 30, 5, 5, 10, 1, 1, layout="nhwc", dtype="float16", epilogue="silu")],
                         ids=lambda op: op.describe())
def test_heroes_are_valid_and_render(op):
    heroes = VARIANT.hero_configs(op, OFFLINE)
    assert heroes
    for c in heroes:
        assert VARIANT.validate_config(op, c, OFFLINE), c.key
        src = render(VARIANT.spec(op, c, None))
        assert "tracea_pointwise_conv" in src and "fmaf" in src
    # at least two blocks per SM where the pixels allow it (small layers split channels across blocks)
    spec = VARIANT.spec(op, heroes[0], None)
    assert VARIANT.grid(op, spec)[0] >= min(2 * 132, op.n * op.h * op.w // 128)


def test_estimate_is_bandwidth_bound():
    op = Conv2dOp(32, 32, 112, 112, 16, 1, 1)
    est = VARIANT.estimate_seconds(op, OFFLINE)
    assert op.min_bytes / 4.8e12 < est < 3 * op.min_bytes / 4.8e12 + 5e-6


# (n, c, h, w, k): odd planes (no vector loads), planes a multiple of 2 / 4, one output group or several,
# channel counts off every vector width
GEOMS = [(2, 32, 12, 12, 16), (3, 21, 9, 7, 13), (1, 96, 14, 14, 24), (4, 8, 5, 6, 3), (2, 40, 7, 9, 40),
         (1, 16, 33, 31, 8), (5, 64, 3, 3, 20)]
MODES = [("nchw", "float32", None, "bias"), ("nchw", "float32", "float16", "bias+relu"),
         ("nchw", "float32", "bfloat16", "silu"), ("nhwc", "float16", None, "bias+gelu"),
         ("nhwc", "bfloat16", "float32", "bias"), ("nhwc", "float32", None, "bias+silu"),
         ("nhwc", "float16", "float32", "none")]


def _tol(op: Conv2dOp) -> float:
    from tracea.dtypes import DType

    return T.tolerance("3xtf32" if op.dtype.storage is DType.F32 else "f16", op.out_dtype)


def _run_check(op: Conv2dOp, config, t=None) -> None:
    profile = T.gpu_profile()
    t = t or T.conv_inputs(op)
    ref = T.conv_reference(op, t)
    t["out"].fill_(float("nan"))
    VARIANT.run(op, config, T.op_args(t), profile)
    err = T.rel_err(t["out"], ref)
    assert err <= _tol(op), f"{op.describe()} {config.key}: rel err {err:.3g}"


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(x for x in m if x))
@pytest.mark.parametrize("geom", GEOMS, ids=lambda g: "g" + "_".join(map(str, g)))
@pytest.mark.cuda
@needs_gpu
def test_pointwise_against_float64(mode, geom):
    layout, dt, out, epi = mode
    n, c, h, w, k = geom
    op = Conv2dOp(n, c, h, w, k, 1, 1, layout=layout, dtype=dt, dtype_out=out, fp32_precision="high",
                  epilogue=epi)
    profile = T.gpu_profile()
    reasons = VARIANT.check(op, profile)
    if reasons:  # 16-bit 96->24 moves half the bytes per FLOP: Tensor Core variants serve it
        assert op.dtype.storage.itemsize == 2 and all("FLOP/B" in r for r in reasons), reasons
        return
    for config in VARIANT.hero_configs(op, profile):
        _run_check(op, config)


@pytest.mark.parametrize("params", [dict(kb=4, vp=4), dict(kb=24, vp=2), dict(kb=12, vp=1), dict(kb=32, vp=1)],
                         ids=lambda p: f"kb{p['kb']}-vp{p['vp']}")
@pytest.mark.cuda
@needs_gpu
def test_pointwise_search_space_corners(params):
    from tracea.semantic.config import PipelineConfig

    for layout, dt in (("nchw", "float32"), ("nhwc", "bfloat16")):
        if layout == "nhwc" and params["vp"] > 1:
            continue
        op = Conv2dOp(3, 24, 10, 12, 37, 1, 1, layout=layout, dtype=dt, epilogue="bias+relu")
        _run_check(op, PipelineConfig(params=tuple(params.items())))


@pytest.mark.cuda
@needs_gpu
def test_pointwise_misaligned_views():
    """x / out views one element off 16 bytes take the scalar loads / stores (another compiled kernel)."""

    for layout, dt in (("nchw", "float32"), ("nhwc", "float16")):
        op = Conv2dOp(2, 32, 8, 8, 16, 1, 1, layout=layout, dtype=dt, epilogue="bias")
        t = T.misalign(T.conv_inputs(op))
        _run_check(op, VARIANT.hero_configs(op, T.gpu_profile())[0], t)


@pytest.mark.cuda
@needs_gpu
def test_pointwise_user_path_bound_and_graph():
    """``tracea.ops.conv2d`` on torch tensors picks the variant for a MobileNet projection (NCHW float32 and
    channels_last float16), repeats through the plan cache and replays from a CUDA graph, against float64."""
    import torch
    import torch.nn.functional as F

    import tracea
    from tracea.doctor.doctor import get_doctor

    for dt, fmt in ((torch.float32, torch.contiguous_format), (torch.float16, torch.channels_last)):
        g = torch.Generator(device="cuda").manual_seed(3)
        x = torch.randn(8, 32, 56, 56, device="cuda", dtype=dt, generator=g).contiguous(memory_format=fmt)
        w = (torch.randn(16, 32, 1, 1, device="cuda", dtype=dt, generator=g) / 6).contiguous(memory_format=fmt)
        b = torch.randn(16, device="cuda", dtype=dt, generator=g)
        ref = F.relu(F.conv2d(x.double(), w.double(), b.double()))
        layout = "nchw" if fmt is torch.contiguous_format else "nhwc"
        op = Conv2dOp(8, 32, 56, 56, 16, 1, 1, layout=layout, dtype=str(dt)[6:], fp32_precision="high",
                      epilogue="bias+relu")
        decision = get_doctor().decide(op, "cuda:0")
        outs = [tracea.ops.conv2d(x, w, b, activation="relu", variant=VARIANT.name) for _ in range(2)]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = tracea.ops.conv2d(x, w, b, activation="relu", variant=VARIANT.name)
        graph.replay()
        torch.cuda.synchronize()
        tol = 2e-3 if dt is torch.float16 else 1e-5
        for out in outs + [captured]:
            assert T.rel_err(out, ref) <= tol, (decision.chosen.variant.name, T.rel_err(out, ref))
        assert torch.equal(captured, outs[-1])
        print(op.describe(), "default:", decision.chosen.variant.name)
