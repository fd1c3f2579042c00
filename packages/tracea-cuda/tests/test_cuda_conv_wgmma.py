"""GPU tests of the Hopper implicit-GEMM conv2d (wgmma, cp.async gather) against a float64 reference."""

from __future__ import annotations

from dataclasses import replace

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
# strides, asymmetric padding, dilation, non-square kernels, 1x1 (NCHW 16-bit: cuda.conv2d.wgmma_nchw1x1's, declined).
GEOMS = [(2, 64, 9, 9, 72, 3, 3, 1, 1, 1), (3, 128, 7, 7, 40, 3, 3, 1, 1, 1), (1, 64, 17, 15, 128, 5, 3, 2, (2, 1), 1),
         (12, 64, 11, 13, 200, 1, 1, 1, 0, 1), (1, 192, 10, 13, 96, 3, 3, 1, 2, 2), (5, 64, 6, 6, 24, 2, 2, 2, 0, 1),
         (1, 256, 14, 14, 264, 3, 3, 2, 1, 1)]
MODES = [("nhwc", "float16", "bias+relu", None), ("nhwc", "bfloat16", "bias+gelu", None),
         ("nhwc", "bfloat16", "silu", "float32"), ("nhwc", "float32", "bias+relu", None),
         ("nchw", "float32", "bias+silu", None), ("nchw", "float16", "bias+relu", None),
         ("nchw", "bfloat16", "gelu", "float32")]


def _check(op: Conv2dOp, config=None) -> None:
    profile = _hopper()
    configs = [config] if config else VARIANT.hero_configs(op, profile)
    T.check_conv_configs(VARIANT, op, configs, T.tolerance(math_mode(op.dtype, op.fp32_precision), op.out_dtype))


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(x for x in m if x))
@pytest.mark.parametrize("geom", GEOMS, ids=lambda g: "g" + "_".join(map(str, g[:7])))
def test_wgmma_conv_geometries(mode, geom):
    layout, dt, epi, out = mode
    n, c, h, w, k, r, s, st, pad, dil = geom
    if dt == "float32":
        c = c // 2  # fp32 slices are 32 channels: exercise C = 32 * odd too
    op = Conv2dOp(n, c, h, w, k, r, s, stride=st, padding=pad, dilation=dil, layout=layout, dtype=dt,
                  dtype_out=out, fp32_precision="high", epilogue=epi)
    if layout == "nchw" and dt != "float32" and (r, s, st, pad) == (1, 1, 1, 0):
        assert any("wgmma_nchw1x1" in why for why in VARIANT.check(op, _hopper()))
        return
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
    _check(Conv2dOp(4, 64, 28, 28, 64, 3, 3, padding=1, layout="nchw", dtype="float16", epilogue="bias"))


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_wgmma_conv_nchw_16bit_user_path_and_graph(dt):
    """A 16-bit NCHW conv (what a model not converted to channels_last runs) through ``tracea.ops.conv2d`` with
    the default decision: served by a Tracea kernel (not counted as a fallback), equal to float64 within the
    dtype's tolerance, repeated and replayed from a CUDA graph; 3x3, strided and 1x1 layers, odd planes."""
    import torch
    import torch.nn.functional as F

    import tracea
    from tracea.runtime import fallbacks

    _hopper()
    tdt = getattr(torch, dt)
    # (the last two: 1x1 stride-1, served by cuda.conv2d.wgmma_nchw1x1: a 14^2 and a 7^2 plane -- no 16-byte
    # pixel runs)
    for n, c, hw, k, r, st in ((2, 64, 15, 72, 3, 1), (1, 128, 28, 256, 3, 2), (3, 256, 14, 64, 1, 2),
                               (8, 64, 14, 136, 1, 1), (33, 128, 7, 256, 1, 1)):
        g = torch.Generator(device="cuda").manual_seed(n * c + k)
        x = torch.randn(n, c, hw, hw, device="cuda", dtype=tdt, generator=g)
        w = (torch.randn(k, c, r, r, device="cuda", dtype=tdt, generator=g) / (c * r * r) ** 0.5).to(tdt)
        b = torch.randn(k, device="cuda", dtype=tdt, generator=g)
        pad = r // 2
        ref = F.relu(F.conv2d(x.double(), w.double(), b.double(), stride=st, padding=pad))
        before = sum(fallbacks.counts().values())
        outs = [tracea.ops.conv2d(x, w, b, stride=st, padding=pad, activation="relu") for _ in range(2)]
        assert sum(fallbacks.counts().values()) == before, fallbacks.counts()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = tracea.ops.conv2d(x, w, b, stride=st, padding=pad, activation="relu")
        graph.replay()
        torch.cuda.synchronize()
        op = Conv2dOp(n, c, hw, hw, k, r, r, stride=st, padding=pad, layout="nchw", dtype=dt)
        tol = T.tolerance(math_mode(op.dtype, op.fp32_precision), op.out_dtype)
        for out in outs + [captured]:
            assert out.is_contiguous() and T.rel_err(out, ref) <= tol, T.rel_err(out, ref)
        assert torch.equal(captured, outs[-1])


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
    assert any("pre-pass" in r for r in VARIANT.check(stem, profile))  # padded only from PAD_ROWS (65536) rows
    assert not VARIANT.check(Conv2dOp(32, 3, 224, 224, 64, 7, 7, stride=2, padding=3, layout="nhwc",
                                      dtype="float16"), profile)
    odd = Conv2dOp(1, 20, 32, 32, 64, 3, 3, padding=1, layout="nhwc", dtype="float16")
    assert any("16-byte" in r for r in VARIANT.check(odd, profile))
    assert not VARIANT.check(replace(odd, c=24), profile)  # whole 16-byte runs: gathered chunk by chunk
    nchw_stem = Conv2dOp(32, 3, 224, 224, 64, 7, 7, stride=2, padding=3, layout="nchw", dtype="float32",
                         fp32_precision="high")
    assert VARIANT.check(nchw_stem, profile)
    accurate = Conv2dOp(1, 64, 8, 8, 64, 3, 3, layout="nchw", dtype="float32", fp32_precision="highest")
    assert VARIANT.check(accurate, profile)
    pointwise = Conv2dOp(2, 64, 8, 8, 64, 1, 1, layout="nchw", dtype="float32", fp32_precision="high")
    assert any("implicit_mma" in r for r in VARIANT.check(pointwise, profile))
    # 16-bit NCHW: served through the channels-last transpose, but for 1x1 stride-1 convs (any batch, plane or
    # width: cuda.conv2d.wgmma_nchw1x1 reads x in place)
    for dt in ("float16", "bfloat16"):
        for n, c, hw, k in ((2, 64, 8, 64), (1, 2048, 7, 512), (32, 2048, 7, 512), (32, 1024, 14, 256),
                            (1, 256, 14, 1024), (32, 128, 28, 512), (8, 256, 14, 1024), (32, 512, 7, 2048)):
            assert any("wgmma_nchw1x1" in r for r in VARIANT.check(
                Conv2dOp(n, c, hw, hw, k, 1, 1, layout="nchw", dtype=dt), profile)), (n, c, hw, k)
        assert not VARIANT.check(Conv2dOp(2, 64, 8, 8, 64, 1, 1, stride=2, layout="nchw", dtype=dt), profile)
        assert not VARIANT.check(Conv2dOp(2, 64, 8, 8, 64, 3, 3, padding=1, layout="nchw", dtype=dt), profile)
    grouped = Conv2dOp(1, 128, 8, 8, 128, 3, 3, groups=2, layout="nhwc", dtype="float16")
    assert any("groups" in r for r in VARIANT.check(grouped, profile))


@pytest.mark.parametrize("layout,dt", [("nchw", "float32"), ("nhwc", "float16"), ("nhwc", "bfloat16"),
                                       ("nhwc", "float32")])
@pytest.mark.parametrize("splits,bn", [(2, 128), (5, 64), (16, 128), (16, 64)])
def test_wgmma_conv_split_k(layout, dt, splits, bn):
    """K split over CTAs (fp32 partial sums exchanged in-kernel): odd M (63 rows in a 128-row tile), N off
    the tile grid, slices of 1-14 K-tiles; every split piece's output checked against float64."""
    from tracea_cuda.variants.hopper import _hero

    c = 96 if dt == "float32" else 192  # 27 K-tiles of one (r, s) and 32 / 64 channels
    config = _hero(bn, 4, smem_epilogue=layout == "nhwc", split_k=splits)
    # a 9x7 and a 5x5 plane (the NCHW transpose of x takes its narrow-row path below 32 pixels)
    for h, w in ((9, 7), (5, 5)):
        op = Conv2dOp(1, c, h, w, 136, 3, 3, padding=1, layout=layout, dtype=dt, fp32_precision="high",
                      epilogue="bias+relu")
        assert VARIANT.split_plan(op, config, _hopper())[0] == splits
        _check(op, config)


def test_wgmma_conv_split_k_default_user_path_and_graph():
    """The batch-1 512->512 3x3 layer at 7^2 (4 output tiles over 144 fp32 K-tiles): the default config is the
    split-K hero; through ``tracea.ops.conv2d`` (bound launcher: transpose pre-pass, counters' memset, conv),
    repeated and replayed from a CUDA graph, against float64; NHWC float16 (72 K-tiles: not split by default)
    with the split hero forced likewise."""
    import torch
    import torch.nn.functional as F

    import tracea
    from tracea_cuda.variants.hopper import _hero

    profile = _hopper()
    for dt, fmt in ((torch.float32, torch.contiguous_format), (torch.float16, torch.channels_last)):
        layout = "nchw" if dt is torch.float32 else "nhwc"
        op = Conv2dOp(1, 512, 7, 7, 512, 3, 3, padding=1, layout=layout, dtype=str(dt)[6:], fp32_precision="high",
                      epilogue="bias+relu")
        first = VARIANT.hero_configs(op, profile)[0]
        assert (int(first.get("split_k") or 1) > 1) == (dt is torch.float32), first.key
        config = first if dt is torch.float32 else _hero(64, 4, split_k=16)
        g = torch.Generator(device="cuda").manual_seed(5)
        x = torch.randn(1, 512, 7, 7, device="cuda", dtype=dt, generator=g).contiguous(memory_format=fmt)
        w = (torch.randn(512, 512, 3, 3, device="cuda", dtype=dt, generator=g) / 48).contiguous(memory_format=fmt)
        b = torch.randn(512, device="cuda", dtype=dt, generator=g)
        ref = F.relu(F.conv2d(x.double(), w.double(), b.double(), padding=1))
        with torch.backends.cudnn.flags(allow_tf32=True):
            outs = [tracea.ops.conv2d(x, w, b, padding=1, activation="relu", variant=VARIANT.name, config=config)
                    for _ in range(3)]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = tracea.ops.conv2d(x, w, b, padding=1, activation="relu", variant=VARIANT.name,
                                             config=config)
            graph.replay()
        torch.cuda.synchronize()
        tol = T.tolerance(math_mode(op.dtype, op.fp32_precision), op.out_dtype)
        for out in outs + [captured]:
            assert T.rel_err(out, ref) <= tol, T.rel_err(out, ref)
        assert torch.equal(captured, outs[-1])


@pytest.mark.parametrize("layout,dt,c", [("nhwc", "float16", 8), ("nhwc", "bfloat16", 16), ("nhwc", "float16", 32),
                                         ("nhwc", "float32", 4), ("nhwc", "float32", 16), ("nchw", "float32", 8)])
def test_wgmma_conv_channels_below_one_slice(layout, dt, c):
    """C a divisor of the 128-byte slice: each 16-byte chunk of a gathered row has its own (r, s), chunks past
    the last (r, s) are zeros; odd planes, strides, dilation, 3x3 / 5x5 / 7x7 kernels; every hero. Reductions
    shorter than two K-tiles are declined (mostly zeros)."""
    slice_c = 128 // (4 if dt == "float32" else 2)
    for geom in ((2, 9, 11, 40, 5, 5, 1, 2, 1), (1, 17, 15, 72, 7, 7, 2, 3, 1), (3, 10, 13, 24, 3, 3, 1, 1, 1),
                 (1, 12, 12, 136, 3, 3, 1, 2, 2)):
        n, h, w, k, r, s_, st, pad, dil = geom
        op = Conv2dOp(n, c, h, w, k, r, s_, stride=st, padding=pad, dilation=dil, layout=layout, dtype=dt,
                      fp32_precision="high", epilogue="bias+relu")
        if c * r * s_ < 2 * slice_c:
            assert any("two" in reason for reason in VARIANT.check(op, _hopper()))
            continue
        _check(op)


#: channel counts in whole 16-byte runs that are neither multiples nor divisors of the 128-byte slice
ODD_CHANNELS = [("nhwc", "float16", 24), ("nhwc", "float16", 40), ("nhwc", "float16", 112), ("nhwc", "float16", 200),
                ("nhwc", "bfloat16", 72), ("nhwc", "bfloat16", 160), ("nhwc", "float32", 12), ("nhwc", "float32", 36),
                ("nchw", "float16", 80), ("nchw", "bfloat16", 96), ("nchw", "float32", 20)]


@pytest.mark.parametrize("layout,dt,c", ODD_CHANNELS, ids=lambda v: str(v))
def test_wgmma_conv_odd_channel_counts(layout, dt, c):
    """C a multiple of the 16-byte chunk only (MobileNet / EfficientNet / DenseNet widths): K-tiles straddle
    (r, s) boundaries, each chunk gathered from its own (r, s), the last K-tile past R*S*C zero on both
    sides; 3x3 / 5x5 strided / dilated / 1x1 kernels, odd planes, K_out off the tile grid, every hero."""
    for geom in ((2, 13, 11, 72, 3, 3, 1, 1, 1), (1, 17, 15, 40, 5, 5, 2, 2, 1), (3, 10, 9, 136, 3, 3, 1, 2, 2),
                 (16, 7, 7, 200, 1, 1, 1, 0, 1)):
        n, h, w, k, r, s_, st, pad, dil = geom
        if layout == "nchw" and r == 1:
            continue  # (16-bit NCHW 1x1: cuda.conv2d.wgmma_nchw1x1; fp32: implicit_mma)
        op = Conv2dOp(n, c, h, w, k, r, s_, stride=st, padding=pad, dilation=dil, layout=layout, dtype=dt,
                      fp32_precision="high", epilogue="bias+relu")
        if c * r * s_ < 2 * VARIANT.slice_channels(op):
            assert any("two" in reason for reason in VARIANT.check(op, _hopper()))  # (mostly zeros: declined)
            continue
        _check(op)


def test_wgmma_conv_odd_channels_split_k():
    """A long reduction over few tiles (batch 1, 7x7 plane, C = 1000): the split-K hero on the chunk-by-chunk
    gather (K slices cut where K-tiles straddle (r, s))."""
    op = Conv2dOp(1, 1000, 7, 7, 128, 3, 3, padding=1, layout="nhwc", dtype="float16", epilogue="bias")
    heroes = VARIANT.hero_configs(op, _hopper())
    assert int(heroes[0].get("split_k") or 1) > 1, heroes[0].key
    _check(op)


@pytest.mark.parametrize("dt", ["float16", "bfloat16", "float32"])
def test_wgmma_conv_padded_stem_bound_path_and_graph(dt):
    """An NHWC RGB stem (C = 3) with >= 65536 output rows: x and w padded to one 16-byte channel run by the
    pre-pass, then the wgmma conv; through ``variant.run``, ``tracea.ops.conv2d`` (the bound launcher:
    pad pre-pass + conv), repeated and replayed from a CUDA graph, against float64."""
    import torch
    import torch.nn.functional as F

    import tracea

    profile = _hopper()
    op = Conv2dOp(2, 3, 363, 361, 24, 7, 7, stride=2, padding=3, layout="nhwc", dtype=dt, fp32_precision="high",
                  epilogue="bias+relu")
    assert not VARIANT.check(op, profile), VARIANT.check(op, profile)
    _check(op)
    t = T.conv_inputs(op)
    x, w, b = (t["x"].permute(0, 3, 1, 2), t["w"].permute(0, 3, 1, 2), t["bias"])  # channels_last views
    ref = F.relu(F.conv2d(x.double(), w.double(), b.double(), stride=2, padding=3))
    tol = T.tolerance(math_mode(op.dtype, op.fp32_precision), op.out_dtype)
    with torch.backends.cudnn.flags(allow_tf32=True):
        outs = [tracea.ops.conv2d(x, w, b, stride=2, padding=3, activation="relu", variant=VARIANT.name)
                for _ in range(2)]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = tracea.ops.conv2d(x, w, b, stride=2, padding=3, activation="relu", variant=VARIANT.name)
        graph.replay()
    torch.cuda.synchronize()
    for out in outs + [captured]:
        assert T.rel_err(out, ref) <= tol, T.rel_err(out, ref)
    assert torch.equal(captured, outs[-1])


def test_wgmma_conv_nchw_fp32_operands_rounded_to_tf32():
    """fp32 NCHW on the Hopper conv (TF32 allowed) reads x and w through the channels-last pre-pass, which
    rounds them to TF32 (the tensor cores would truncate): the output matches float64 on the rounded
    operands to fp32-accumulation level, through the run path and the bound one (``tracea.ops.conv2d``),
    eager and replayed from a CUDA graph; the inputs are not changed."""
    import torch
    import torch.nn.functional as F

    import tracea

    profile = _hopper()
    for n, c, hw, k, r, st in ((4, 64, 28, 64, 3, 1), (2, 96, 13, 40, 5, 2), (3, 32, 9, 72, 1, 1)):
        op = Conv2dOp(n, c, hw, hw, k, r, r, stride=st, padding=r // 2, layout="nchw", dtype="float32",
                      fp32_precision="high")
        t = T.conv_inputs(op, seed=n + c)
        x0, w0 = t["x"].clone(), t["w"].clone()
        exact = F.conv2d(x0.double(), w0.double(), stride=st, padding=r // 2)
        rounded = F.conv2d(T.tf32_rna(x0).double(), T.tf32_rna(w0).double(), stride=st, padding=r // 2)
        VARIANT.run(op, VARIANT.hero_configs(op, profile)[0], T.op_args(t), profile)
        assert T.rel_err(t["out"], rounded) < 2e-5, (op.describe(), T.rel_err(t["out"], rounded))
        assert T.rel_err(t["out"], exact) > T.rel_err(t["out"], rounded)  # (it is the rounded operands' product)
        outs = [tracea.ops.conv2d(t["x"], t["w"], stride=st, padding=r // 2, variant=VARIANT.name) for _ in range(2)]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = tracea.ops.conv2d(t["x"], t["w"], stride=st, padding=r // 2, variant=VARIANT.name)
        graph.replay()
        torch.cuda.synchronize()
        for out in (*outs, captured):
            assert T.rel_err(out, rounded) < 2e-5, op.describe()
        assert torch.equal(t["x"], x0) and torch.equal(t["w"], w0)
