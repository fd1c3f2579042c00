"""GPU tests of the Hopper NCHW 1x1 conv as a batched GEMM with a shared weight (``cuda.conv2d.wgmma_nchw1x1``)
against a float64 reference: planes read in place and through the padded-pitch copy, row bias and every
epilogue, split-K, misaligned operands, the user path and CUDA graphs."""

from __future__ import annotations

import pytest

from tracea.dtypes import DType
from tracea.ir.ops import Conv2dOp

from tracea_cuda import testing as T
from tracea_cuda.variants import all_variants
from tracea_cuda.variants.base import math_mode
from tracea_cuda.variants.hopper import _hero
from tracea_cuda.variants.hopper_nchw1x1 import pitch_of

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")]

NAME = "cuda.conv2d.wgmma_nchw1x1"
VARIANT = {v.name: v for v in all_variants()}[NAME]


def _hopper():
    profile = T.gpu_profile()
    if (profile.compute_capability or (0, 0)) < (9, 0):
        pytest.skip("needs an sm_90 GPU (wgmma)")
    return profile


# (n, c, h, w, k): planes of 8k pixels (read in place) and others (7x7, 14x14, 11x13, 5x3: the pitched copy),
# output channels off the 128-row tile, C of one 16-byte run, a long reduction over few tiles (split-K)
GEOMS = [(2, 64, 8, 8, 72), (3, 128, 7, 7, 40), (1, 64, 14, 14, 200), (5, 96, 11, 13, 24), (4, 256, 28, 28, 64),
         (1, 960, 7, 7, 160), (33, 32, 5, 3, 16), (2, 8, 16, 16, 520), (2, 24, 56, 56, 144), (2, 64, 10, 7, 48)]
MODES = [("float16", "bias+relu", None), ("bfloat16", "bias+gelu", None), ("float16", "bias+gelu", None),
         ("bfloat16", "silu", "float32"), ("float16", "bias", "bfloat16"), ("bfloat16", None, None),
         ("float32", "bias+relu", None), ("float32", "bias+silu", "bfloat16"), ("float32", None, None)]


def _check(op: Conv2dOp, configs) -> None:
    _hopper()
    T.check_conv_configs(VARIANT, op, configs, T.tolerance(math_mode(op.dtype, op.fp32_precision), op.out_dtype))


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(x for x in m if x))
@pytest.mark.parametrize("geom", GEOMS, ids=lambda g: "g" + "_".join(map(str, g)))
def test_nchw1x1_geometries(mode, geom):
    dt, epi, out = mode
    n, c, h, w, k = geom
    op = Conv2dOp(n, c, h, w, k, 1, 1, layout="nchw", dtype=dt, dtype_out=out, epilogue=epi, fp32_precision="high")
    heroes = VARIANT.hero_configs(op, _hopper())
    i = (GEOMS.index(geom) + MODES.index(mode)) % len(heroes)
    _check(op, [heroes[0]] + ([heroes[i]] if i else []))  # the default, and every hero over the grid


@pytest.mark.parametrize("params", [dict(tile_n=64, schedule="pingpong", tile_m=64, stages=6),
                                    dict(tile_n=192, schedule="coop", smem_epilogue=False, stages=4),
                                    dict(tile_n=128, schedule="coop", split_k=4, stages=5),
                                    dict(tile_n=128, schedule="coop", tile_m=256, stages=3, smem_epilogue=False)])
def test_nchw1x1_search_space_corners(params):
    p = dict(params)
    config = _hero(p.pop("tile_n"), p.pop("stages"), bm=p.pop("tile_m", 128), schedule=p.pop("schedule"),
                   smem_epilogue=p.pop("smem_epilogue", True), split_k=p.pop("split_k", 1))
    for geom in ((3, 64, 9, 9, 136), (2, 128, 16, 16, 72)):
        _check(Conv2dOp(*geom, 1, 1, layout="nchw", dtype="float16", epilogue="bias+relu"), [config])


def test_nchw1x1_declines_with_reasons():
    profile = _hopper()
    for op, words in ((Conv2dOp(2, 20, 8, 8, 64, 1, 1, layout="nchw", dtype="float16"), "multiple of 8"),
                      (Conv2dOp(2, 18, 8, 8, 64, 1, 1, layout="nchw", dtype="float32", fp32_precision="high"),
                       "multiple of 4"),
                      (Conv2dOp(2, 64, 8, 8, 64, 3, 3, padding=1, layout="nchw", dtype="float16"), "1x1"),
                      (Conv2dOp(2, 64, 8, 8, 64, 1, 1, stride=2, layout="nchw", dtype="float16"), "1x1"),
                      (Conv2dOp(2, 64, 8, 8, 64, 1, 1, layout="nhwc", dtype="float16"), "1x1")):
        assert any(words in r for r in VARIANT.check(op, profile)), VARIANT.check(op, profile)
    assert VARIANT.check(Conv2dOp(2, 64, 8, 8, 64, 1, 1, layout="nchw", dtype="float32"), profile)  # fp32-exact


@pytest.mark.parametrize("hw", [8, 7, 14])
def test_nchw1x1_misaligned_operands(hw):
    """x and w starting 2 bytes past a 16-byte boundary: copied to aligned scratch by :meth:`run`, and through
    the bound launcher of ``tracea.ops.conv2d`` (forced variant)."""
    import torch
    import torch.nn.functional as F

    import tracea

    profile = _hopper()
    op = Conv2dOp(3, 64, hw, hw, 96, 1, 1, layout="nchw", dtype="float16", epilogue="bias")
    t = T.conv_inputs(op)
    ref = T.conv_reference(op, t)
    for role in ("x", "w"):
        flat = torch.empty(t[role].numel() + 1, device="cuda", dtype=t[role].dtype)
        moved = flat[1:].view(t[role].shape)
        moved.copy_(t[role])
        t[role] = moved
    VARIANT.run(op, VARIANT.hero_configs(op, profile)[0], T.op_args(t), profile)
    assert T.rel_err(t["out"], ref) <= 2e-3
    for _ in range(2):
        out = tracea.ops.conv2d(t["x"], t["w"], t["bias"], variant=NAME)
        assert T.rel_err(out, F.conv2d(t["x"].double(), t["w"].double(), t["bias"].double())) <= 2e-3


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_nchw1x1_default_user_path_and_graph(dt):
    """16-bit NCHW 1x1 convs of CNNs not converted to channels_last (ResNet / MobileNet / EfficientNet widths,
    planes with and without 16-byte pixel runs, batch 1 and 32) through ``tracea.ops.conv2d`` with the default
    decision: served by this variant (no fallback), equal to float64 within the dtype's tolerance, repeated and
    replayed from a CUDA graph."""
    import torch
    import torch.nn.functional as F

    import tracea
    from tracea.doctor.doctor import get_doctor
    from tracea.runtime import fallbacks

    _hopper()
    tdt = getattr(torch, dt)
    for n, c, hw, k in ((1, 256, 56, 64), (32, 960, 7, 160), (1, 1024, 14, 256), (4, 144, 28, 24), (2, 40, 14, 240)):
        op = Conv2dOp(n, c, hw, hw, k, 1, 1, layout="nchw", dtype=dt, epilogue="bias+relu")
        assert get_doctor().decide(op, "cuda:0").variant.name == NAME, get_doctor().decide(op, "cuda:0").explain()
        g = torch.Generator(device="cuda").manual_seed(n * c + k)
        x = torch.randn(n, c, hw, hw, device="cuda", dtype=tdt, generator=g)
        w = (torch.randn(k, c, 1, 1, device="cuda", dtype=tdt, generator=g) / c ** 0.5).to(tdt)
        b = torch.randn(k, device="cuda", dtype=tdt, generator=g)
        x_before = x.clone()
        ref = F.relu(F.conv2d(x.double(), w.double(), b.double()))
        before = sum(fallbacks.counts().values())
        outs = [tracea.ops.conv2d(x, w, b, activation="relu") for _ in range(2)]
        assert sum(fallbacks.counts().values()) == before, fallbacks.counts()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = tracea.ops.conv2d(x, w, b, activation="relu")
        graph.replay()
        torch.cuda.synchronize()
        tol = T.tolerance(math_mode(op.dtype, op.fp32_precision), op.out_dtype)
        for out in outs + [captured]:
            assert out.is_contiguous() and T.rel_err(out, ref) <= tol, (op.describe(), pitch_of(op),
                                                                          T.rel_err(out, ref))
        assert torch.equal(captured, outs[-1])
        assert torch.equal(x, x_before)  # the pitched copy is scratch: x is never written


def test_nchw1x1_float32_tf32_user_path_and_graph():
    """float32 with TF32 allowed (what ``F.conv2d`` does by default on CUDA) through ``tracea.ops.conv2d`` with
    this variant forced (computed transposed: x as the register-fed MN-major A, the column-major output): planes
    read in place and through the pitched copy, repeated and replayed from a CUDA graph, against float64."""
    import torch
    import torch.nn.functional as F

    import tracea

    _hopper()
    for n, c, hw, k in ((1, 1024, 14, 256), (8, 192, 28, 64), (3, 960, 7, 160), (2, 64, 11, 40)):
        g = torch.Generator(device="cuda").manual_seed(n * c + k)
        x = torch.randn(n, c, hw, hw, device="cuda", generator=g)
        w = torch.randn(k, c, 1, 1, device="cuda", generator=g) / c ** 0.5
        b = torch.randn(k, device="cuda", generator=g)
        ref = F.relu(F.conv2d(x.double(), w.double(), b.double()))
        with torch.backends.cudnn.flags(allow_tf32=True):
            outs = [tracea.ops.conv2d(x, w, b, activation="relu", variant=NAME) for _ in range(2)]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = tracea.ops.conv2d(x, w, b, activation="relu", variant=NAME)
            graph.replay()
        torch.cuda.synchronize()
        tol = T.tolerance("tf32", DType.F32)
        for out in outs + [captured]:
            assert T.rel_err(out, ref) <= tol, ((n, c, hw, k), T.rel_err(out, ref))
        assert torch.equal(captured, outs[-1])
