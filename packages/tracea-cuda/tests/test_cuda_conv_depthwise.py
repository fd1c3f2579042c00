"""Tests of ``cuda.conv2d.depthwise`` (depthwise / grouped conv2d with <= 16 channels per group, 64 in NCHW).

Without a GPU: what it accepts and declines (with reasons) and that the dense conv variants still decline
``groups > 1``; the Doctor's choice on a fake H100 / A100; config validation, heroes and the search space;
the kernels compiled with NVRTC (when CuPy's NVRTC loads) and with nvcc for sm_80 / sm_90a (no spills);
and the emitted kernels run on the host (:mod:`tracea_cuda.host_emulation`, g++) against a float64 PyTorch
reference over odd shapes, every layout / dtype / epilogue, misaligned pointers and NaN / Inf.

On a GPU (marked ``cuda``): the same against float64 on fresh random inputs over many shapes, search-space
corners, misaligned views, NaN / Inf, the user path through ``tracea.ops.conv2d`` (default choice, plan
cache, CUDA graph capture and replay), and patched timm-style depthwise / grouped blocks through tracea_torch
against eager."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

from tracea.doctor.profile import DeviceProfile
from tracea.dtypes import DType
from tracea.errors import NoVariantError
from tracea.ir.ops import Conv2dOp, Layout
from tracea.semantic.config import PipelineConfig

from tracea_cuda import host_emulation
from tracea_cuda import testing as T
from tracea_cuda.emit.depthwise import render
from tracea_cuda.offline import bundle, compile_report, nvcc_path
from tracea_cuda.variants import all_variants
from tracea_cuda.variants.depthwise import DepthwiseConv

VARIANT = DepthwiseConv()
NAME = VARIANT.name
H100, A100 = T.fake_profile("H100"), T.fake_profile("A100")
needs_gpu = pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")


def dw(n, c, h, w, r, stride=1, padding=None, mult=1, layout="nhwc", dtype="float16", **kw) -> Conv2dOp:
    """A depthwise conv (groups = C, K = mult * C)."""
    pad = r // 2 if padding is None else padding
    return Conv2dOp(n, c, h, w, mult * c, r, r, stride=stride, padding=pad, groups=c, layout=layout, dtype=dtype, **kw)


def grouped(n, c, h, w, groups, k=None, r=3, stride=1, layout="nhwc", dtype="float16", **kw) -> Conv2dOp:
    return Conv2dOp(n, c, h, w, k or c, r, r, stride=stride, padding=r // 2, groups=groups, layout=layout,
                    dtype=dtype, **kw)


#: real layers: EfficientNet-B0 / MobileNetV2-V3 depthwise, ConvNeXt 7x7, ResNeXt-50 32x4d, RegNetX group 8/16
MODEL_OPS = [dw(32, 96, 112, 112, 3, stride=2, epilogue="bias+silu"), dw(1, 1152, 7, 7, 5, epilogue="bias+silu"),
             dw(32, 480, 14, 14, 5, dtype="bfloat16", epilogue="bias+silu"), dw(1, 384, 14, 14, 7, epilogue="bias"),
             dw(32, 96, 56, 56, 7, epilogue="bias"), grouped(32, 128, 56, 56, 32, epilogue="bias+relu"),
             grouped(1, 256, 28, 28, 32, stride=2, epilogue="bias+relu"), grouped(32, 64, 56, 56, 8, epilogue="bias+relu"),
             grouped(1, 224, 28, 28, 14, dtype="bfloat16", epilogue="bias+relu"),
             dw(32, 96, 56, 56, 3, layout="nchw", dtype="float32", fp32_precision="high", epilogue="bias+relu"),
             grouped(8, 128, 28, 28, 32, layout="nchw", dtype="float32", epilogue="bias"),
             dw(4, 144, 28, 28, 3, dtype="float32", epilogue="bias+gelu")]


def _reasons(op: Conv2dOp, profile: DeviceProfile = H100) -> list[str]:
    return VARIANT.requirements.check(op, profile) + VARIANT.extra_checks(op, profile)


# ------------------------------------------------------------------------------------------------
# CPU: acceptance, the Doctor, configs
# ------------------------------------------------------------------------------------------------

def test_accepts_depthwise_and_grouped_and_declines_with_reasons():
    for op in MODEL_OPS:
        assert not _reasons(op), (op.describe(), _reasons(op))
    assert not _reasons(dw(3, 17, 15, 15, 3, mult=2, layout="nchw", dtype="float16"))  # 16-bit NCHW too
    assert any("groups=1" in r for r in _reasons(Conv2dOp(1, 32, 8, 8, 32, 3, 3, padding=1, layout="nhwc",
                                                         dtype="float16")))
    assert any("65 input / 65 output channels per group" in r for r in _reasons(grouped(1, 1040, 7, 7, 16)))
    assert any("channels per group" in r for r in _reasons(grouped(1, 16, 7, 7, 16, k=1280)))  # kg = 80
    # up to 64 channels per group (RegNetX-1.6GF's 24, at any batch); 80 is declined
    nchw = dict(layout="nchw", dtype="float32")
    assert not _reasons(grouped(1, 168, 28, 28, 7, **nchw)) and not _reasons(grouped(1, 912, 7, 7, 38, **nchw))
    assert not _reasons(grouped(8, 168, 28, 28, 7, **nchw)) and not _reasons(grouped(32, 408, 14, 14, 17))
    # ... but NCHW past 32M multiply-adds goes to cuDNN (b32: 0.62-0.77x device time)
    assert "cuDNN" in " ".join(_reasons(grouped(32, 168, 28, 28, 7, **nchw)))
    assert not _reasons(grouped(1, 256, 7, 7, 4, **nchw))  # 64 per group, 0.8M multiply-adds
    assert any("80 input / 80 output channels per group" in r for r in _reasons(grouped(1, 160, 7, 7, 2, **nchw)))
    assert any("at most 7x7" in r for r in _reasons(dw(1, 64, 32, 32, 9)))
    assert any("compute capability" in r for r in _reasons(dw(1, 64, 32, 32, 3),
                                                           dataclass_replace(A100, compute_capability=(6, 1))))
    bf16_old = dataclass_replace(A100, compute_capability=(7, 5))
    assert any("bfloat16" in r for r in _reasons(dw(1, 64, 8, 8, 3, dtype="bfloat16"), bf16_old))
    assert not _reasons(dw(1, 64, 8, 8, 3, dtype="float16"), bf16_old)


def dataclass_replace(profile: DeviceProfile, **changes) -> DeviceProfile:
    from dataclasses import replace

    return replace(profile, **changes)


def test_dense_conv_variants_still_decline_groups():
    op = grouped(2, 64, 14, 14, 8)
    for v in all_variants():
        if v.op_kind is not op.kind or v.name == NAME:
            continue
        reasons = v.requirements.check(op, H100)
        assert any("groups=8 not supported" in r for r in reasons), (v.name, reasons)


@pytest.mark.parametrize("profile", [H100, A100], ids=["h100", "a100"])
def test_doctor_picks_depthwise_for_grouped_ops_untuned(monkeypatch, profile):
    doc = T.doctor_on(monkeypatch, profile)
    for op in MODEL_OPS:
        d = doc.decide(op, "cuda:0", use_cache=False)
        assert d.variant.name == NAME, (op.describe(), d.explain())
        assert d.chosen.source == "hero" and VARIANT.validate_config(op, d.chosen.config, profile)
        others = {r.variant: r.reasons for r in d.rejected if r.variant.startswith("cuda.conv2d.")}
        assert others and all(any("groups=" in x for x in rs) for rs in others.values()), others
    dense = Conv2dOp(32, 64, 56, 56, 64, 3, 3, padding=1, layout="nhwc", dtype="float16")
    d = doc.decide(dense, "cuda:0", use_cache=False)
    assert d.variant.name != NAME
    assert any(r.variant == NAME and any("groups=1" in x for x in r.reasons) for r in d.rejected)
    wide = grouped(1, 1040, 7, 7, 16)  # 65 channels per group: no CUDA variant (the reference oracle at most)
    try:
        d = doc.decide(wide, "cuda:0", use_cache=False)
    except NoVariantError as exc:
        assert "channels per group" in " ".join(exc.rejections[NAME])
    else:
        assert not d.variant.name.startswith("cuda.")
        assert "channels per group" in " ".join(next(r.reasons for r in d.rejected if r.variant == NAME))


def test_estimate_is_a_memory_roofline():
    op = MODEL_OPS[0]  # 3x3 stride-2 depthwise: bytes dominate
    est = VARIANT.estimate_seconds(op, H100)
    assert op.min_bytes / 3.35e12 < est < 2 * op.min_bytes / 3.35e12 + 5e-6
    heavy = grouped(32, 256, 28, 28, 16)  # 16 channels per group: FLOPs dominate on the CUDA cores
    assert VARIANT.estimate_seconds(heavy, H100) >= heavy.flops / 67e12


@pytest.mark.parametrize("op", MODEL_OPS, ids=lambda op: op.describe())
def test_heroes_valid_and_fill_the_gpu(op):
    heroes = VARIANT.hero_configs(op, H100)
    assert heroes
    for c in heroes:
        assert VARIANT.validate_config(op, c, H100), c.key
        spec = VARIANT.spec(op, c, None)
        src = render(spec)
        assert "tracea_depthwise_conv" in src and "fmaf" in src
    spec = VARIANT.spec(op, heroes[0], None)
    gx, gy, gz = spec.grid()
    assert gx * gy * gz >= min(2 * 132, spec.units // 64)
    if op.layout is Layout.NHWC and op.dtype.storage is not DType.F32 and op.c % 8 == 0 and op.groups == op.c:
        assert spec.vec == 4 and spec.vin == 4 and spec.vec_out  # 8-byte loads and stores (the H100 probe's best)
    if op.layout is Layout.NHWC:
        assert spec.row_cached()  # the heroes' outputs share the row's columns in registers


def test_heroes_follow_the_h100_probe():
    """b32 layers: NHWC 8 vectors of 4 channels x 256 threads, 4 outputs per thread (2 where 4 outputs'
    columns would not stay in registers: 16 channels per group); NCHW 128 threads x 4 rows at stride 1, 2 at
    stride 2. Batch-1 late layers shrink blocks, then outputs / rows per thread, to fill the GPU."""
    def first(op):
        return dict(VARIANT.hero_configs(op, H100)[0].params)

    assert first(dw(32, 144, 56, 56, 3)) == {"threads": 256, "cv": 8, "ppt": 4, "vec": 4}
    assert first(dw(32, 96, 112, 112, 3, stride=2)) == {"threads": 256, "cv": 8, "ppt": 4, "vec": 4}
    assert first(dw(32, 384, 14, 14, 7, dtype="bfloat16")) == {"threads": 256, "cv": 8, "ppt": 4, "vec": 4}
    assert first(grouped(32, 128, 56, 56, 32)) == {"threads": 256, "cv": 8, "ppt": 4, "vec": 4}
    # wide groups (8+ channels per group): 4 channel vectors per block (smaller weight slices)
    assert first(grouped(32, 256, 28, 28, 32)) == {"threads": 256, "cv": 4, "ppt": 4, "vec": 4}
    assert first(grouped(1, 256, 28, 28, 32)) == {"threads": 128, "cv": 4, "ppt": 2, "vec": 4}
    assert first(dw(32, 144, 56, 56, 3, layout="nchw", dtype="float32")) == {"threads": 128, "rows": 4}
    assert first(dw(32, 96, 112, 112, 3, stride=2, layout="nchw", dtype="float32")) == {"threads": 128, "rows": 2}
    small = first(dw(1, 768, 7, 7, 7))
    assert small["threads"] == 64 and small["ppt"] == 1 and small["cv"] < 8
    # NCHW small grids: fewer rows first (b1 probe)
    assert first(dw(1, 768, 7, 7, 7, layout="nchw", dtype="float32")) == {"threads": 128, "rows": 1}
    assert first(dw(1, 480, 14, 14, 3, layout="nchw", dtype="float32")) == {"threads": 128, "rows": 2}
    # NCHW groups of 4+ input channels: one row, 64-thread blocks, as many of the group's output channels per
    # thread as leave 256 threads per SM (132 SMs), up to 16
    nchw = dict(layout="nchw", dtype="float32")
    assert first(grouped(1, 256, 28, 28, 32, **nchw)) == {"threads": 64, "rows": 1, "kpt": 4}  # 200k outputs
    assert first(grouped(8, 256, 28, 28, 32, **nchw)) == {"threads": 64, "rows": 1, "kpt": 8}  # capped by K/g
    assert first(grouped(32, 512, 14, 14, 32, **nchw)) == {"threads": 64, "rows": 1, "kpt": 16}
    assert first(grouped(1, 512, 14, 14, 32, **nchw)) == {"threads": 64, "rows": 1, "kpt": 2}
    assert first(grouped(1, 152, 14, 14, 19, **nchw)) == {"threads": 64, "rows": 1}  # 30k outputs: one each
    assert first(grouped(32, 32, 56, 56, 16, **nchw)) == {"threads": 128, "rows": 4}  # 2 per group: as depthwise
    assert [dict(c.params) for c in VARIANT.hero_configs(grouped(8, 56, 28, 28, 7, **nchw), H100)] == [
        {"threads": 64, "rows": 1, "kpt": 8}, {"threads": 64, "rows": 1, "kpt": 4}]


def test_declines_wide_groups_where_cudnn_measured_faster(monkeypatch):
    """8+ input channels per group in fp32 NHWC, cuDNN's widths (16, 32) and wider groups by their tier are
    left to PyTorch from a number of multiply-adds, with a reason; 8 per group in NCHW and 16-bit NHWC, fewer
    channels and small layers stay; the switch turns the decline off."""
    from tracea_cuda.variants import depthwise as dwmod

    def why(op) -> str:
        return " ".join(_reasons(op))

    big8_f32 = grouped(32, 256, 28, 28, 32, layout="nhwc", dtype="float32")  # ResNeXt stage 2, 51M MACs
    assert "cuDNN" in why(big8_f32) and "8 input channels per group" in why(big8_f32)
    assert not why(grouped(32, 256, 28, 28, 32, layout="nchw", dtype="float32"))  # NCHW kpt: 1.24x cuDNN
    big16_nchw = grouped(8, 512, 14, 14, 32, layout="nchw", dtype="float32")  # 12.8M MACs: 0.89x
    assert "16 input channels per group" in why(big16_nchw)
    assert "16 input channels per group" in why(grouped(32, 512, 14, 14, 32))  # fp16 NHWC, 16 per group
    assert "cuDNN" in why(grouped(8, 224, 28, 28, 14, dtype="bfloat16"))
    assert not why(grouped(32, 256, 28, 28, 32))  # fp16 NHWC, 8 per group: 1.25x cuDNN at b32
    assert not why(grouped(32, 128, 56, 56, 32, layout="nchw", dtype="float32"))  # 4 per group
    assert not why(grouped(1, 512, 14, 14, 32, layout="nchw", dtype="float32"))  # 1.6M MACs (b1)
    assert not why(grouped(8, 56, 28, 28, 7, layout="nchw", dtype="float32"))  # RegNet b8: 2.8M
    assert not why(dw(32, 96, 56, 56, 7, layout="nchw", dtype="float32"))  # depthwise: any size
    # wider groups (RegNetX-3.2GF / 4.0GF 48 / 40, RegNetY-8.0GF / 4.0GF 56 / 64 per group)
    nchw = dict(layout="nchw", dtype="float32")
    assert not why(grouped(32, 240, 28, 28, 6)) and not why(grouped(32, 432, 14, 14, 9))  # 16-bit 40 / 48: served
    assert not why(grouped(1, 448, 28, 28, 8)) and not why(grouped(1, 512, 14, 14, 8))  # 56 / 64 at b1: served
    assert "56 input channels per group" in why(grouped(32, 896, 14, 14, 16))  # 315M, 0.48x in graphs
    assert "64 input channels per group" in why(grouped(32, 1088, 7, 7, 17, dtype="bfloat16"))
    assert not why(grouped(1, 240, 28, 28, 6, **nchw)) and not why(grouped(1, 896, 14, 14, 16, **nchw))
    assert "cuDNN" in why(grouped(1, 448, 28, 28, 8, **nchw))  # 19.7M: from 16M
    assert "cuDNN" in why(grouped(1, 512, 14, 14, 8, **nchw))  # 64 per group NCHW: from 4M
    assert dwmod.DepthwiseConv.decline_macs(grouped(1, 96, 7, 7, 24), 24) is None  # 16-bit NHWC 24: never
    # a speed judgement, not a limit: first-use tuning's framework check may time the variant anyway
    from tracea.doctor import FrameworkFaster

    assert all(isinstance(r, FrameworkFaster) for r in _reasons(big8_f32))
    assert not any(isinstance(r, FrameworkFaster) for r in _reasons(grouped(1, 96, 7, 7, 1, layout="nchw")))
    monkeypatch.setattr(dwmod, "DECLINE_WIDE_GROUPS", False)
    assert not why(big8_f32)


def test_search_space_points_are_valid_and_cover_the_knobs():
    for op in (MODEL_OPS[1], MODEL_OPS[5], MODEL_OPS[9]):
        points = list(VARIANT.search_space(op, H100))
        assert len(points) >= 3
        assert all(VARIANT.validate_config(op, c, H100) for c in points)
    nhwc = {tuple(sorted(c.params)) for c in VARIANT.search_space(MODEL_OPS[5], H100)}
    assert any(dict(p).get("ppt") == 4 for p in nhwc) and any(dict(p).get("vec") == 1 for p in nhwc)


def test_config_validation_reasons():
    nhwc, nchw = MODEL_OPS[1], MODEL_OPS[9]

    def why(op, **params) -> str:
        v = VARIANT.validate_config(op, PipelineConfig(params=tuple(params.items())), H100)
        assert not v, params
        return v.reason

    assert "NCHW" in why(nhwc, rows=2)
    assert "NHWC" in why(nchw, ppt=2)
    assert "ppt=3" in why(nhwc, ppt=3)
    assert "rows=3" in why(nchw, rows=3)
    assert "NCHW" in why(nhwc, kpt=2)
    wide = grouped(1, 64, 14, 14, 8, layout="nchw", dtype="float32")  # 8 output channels per group
    assert "kpt=3" in why(wide, kpt=3) and "kpt=16" in why(wide, kpt=16)
    assert "accumulators" in why(wide, kpt=8, rows=8)
    assert VARIANT.validate_config(wide, PipelineConfig(params=(("kpt", 8), ("rows", 4))), H100)
    assert "threads=1000" in why(nchw, threads=1000)
    assert "at most 1024" in why(nhwc, threads=2048, cv=1)
    assert "accumulators" in why(nhwc, ppt=8)  # 8 x 8 channels
    assert "integer" in why(nhwc, cv="8")
    assert "shared memory" in why(grouped(1, 256, 14, 14, 16, r=5), cv=32)  # 256 ch x 25 taps x 16
    assert VARIANT.validate_config(nhwc, PipelineConfig(params=(("vec", 2), ("cv", 32), ("ppt", 4))), H100)


def test_vector_widths_follow_groups_alignment_and_pointers():
    spec = VARIANT.spec
    cfg = PipelineConfig()
    s = spec(grouped(2, 128, 8, 8, 32), cfg, None)  # 4 + 4 per group: 8 outputs cover two whole groups
    assert (s.vec, s.nw, s.vin) == (8, 8, 8)
    s = spec(grouped(2, 64, 8, 8, 16, k=128), cfg, None)  # 4 in, 8 out per group: one group per thread
    assert (s.vec, s.nw, s.vin) == (8, 4, 4)
    s = spec(dw(2, 17, 8, 8, 3), cfg, None)  # odd C: the scalar path
    assert (s.vec, s.vin, s.vec_out) == (1, 1, False)
    s = spec(dw(2, 48, 8, 8, 3, mult=3), cfg, None)  # multiplier 3: K = 144, one output group of 3 per thread
    assert s.kg == 3 and s.vec == 1
    s = spec(dw(2, 64, 8, 8, 3), cfg, {"x": 2, "w": 0, "out": 4, "bias": 0})  # misaligned views
    assert s.vin == 1 and s.vec_out is False
    s = spec(dw(2, 64, 8, 8, 3), cfg, {"x": 8, "w": 0, "out": 8, "bias": 0})
    assert s.vin == 4 and s.vec_out is False  # 8-byte runs in; 16-byte stores need 16-byte alignment


# ------------------------------------------------------------------------------------------------
# CPU: the torch bridge's routing of grouped convs (no GPU: the pieces it is built from)
# ------------------------------------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_torch_bridge_routes_grouped_convs_to_the_variant(monkeypatch):
    """tracea_torch describes depthwise / grouped calls with their groups and layout (channels_last 16-bit ->
    NHWC, fp32 NCHW), chooses this variant on a CUDA device (the fake H100's Doctor), and hands a pointer-only
    launcher the tensors themselves (depthwise weights (K, 1, R, S) read as KRSC without a copy), writing a
    channels_last output; wide groups fall back with the Doctor's reason."""
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415

    from tracea_torch import bridge_plans, choice  # noqa: PLC0415

    doc = T.doctor_on(monkeypatch, H100)
    monkeypatch.setattr(choice, "get_doctor", lambda: doc)
    cuda = torch.device("cuda", 0)
    cases = [(torch.float16, torch.channels_last, 96, 96, 3, 1), (torch.bfloat16, torch.channels_last, 128, 32, 3, 2),
             (torch.float32, torch.contiguous_format, 144, 144, 5, 1), (torch.float32, torch.channels_last, 64, 8, 3, 1)]
    for dt, fmt, c, groups, r, stride in cases:
        x = torch.randn(2, c, 12, 12, dtype=dt).contiguous(memory_format=fmt)
        w = torch.randn(c, c // groups, r, r, dtype=dt).contiguous(memory_format=fmt)
        b = torch.randn(c, dtype=dt)
        act = choice.parse_activation("silu")
        op = bridge_plans._conv_op(x, w, b, (stride, stride), (r // 2, r // 2), (1, 1), groups, act,
                                   DType.parse(str(dt)[6:]))
        assert op.groups == groups and op.layout is (Layout.NHWC if fmt is torch.channels_last else Layout.NCHW)
        assert op.epilogue.key == "bias+silu"
        decision = choice.choose(op, cuda)
        assert decision.variant.name == NAME, decision.explain()
        assert choice.serving_variant(op, cuda) == (NAME, "hero")
        seen = {}

        def launch(xx, ww, bb, out, op=op, x=x, w=w, seen=seen):  # stands in for the bound kernel (no epilogue)
            seen.update(x=xx.data_ptr() == x.data_ptr(), w=ww.data_ptr() == w.data_ptr())
            out.copy_(F.conv2d(xx, ww, bb, op.stride, op.padding, op.dilation, op.groups))

        launch.pointer_only = True  # type: ignore[attr-defined]
        out = bridge_plans._conv_run(op, launch, w)(x, w, b)
        assert seen == {"x": True, "w": True}, (dt, fmt, groups, seen)  # zero-copy: no views, no weight copy
        assert out.is_contiguous(memory_format=fmt) and tuple(out.shape) == (2, c, op.p, op.q)
        torch.testing.assert_close(out, F.conv2d(x, w, b, stride, r // 2, 1, groups))
    wide = bridge_plans._conv_op(torch.randn(1, 160, 8, 8), torch.randn(160, 80, 3, 3), None, (1, 1), (1, 1), (1, 1),
                                 2, None, DType.F32)
    with pytest.raises(choice.Fallback, match="channels per group"):
        choice.choose(wide, cuda)
    # a wide-group layer cuDNN measured faster on: with the arbiter on (the default) the variant stays a
    # candidate for the arbiter's timing; with it off PyTorch serves it, counted with the variant's reason
    big = bridge_plans._conv_op(torch.randn(32, 512, 14, 14), torch.randn(512, 16, 3, 3), None, (1, 1), (1, 1),
                                (1, 1), 32, None, DType.F32)
    monkeypatch.delenv("TRACEA_ARBITER", raising=False)
    kept = choice.choose(big, cuda)
    assert kept.variant.name == NAME and "cuDNN's grouped kernels measured faster" in kept.chosen.framework_faster
    monkeypatch.setenv("TRACEA_ARBITER", "0")
    with pytest.raises(choice.Fallback, match="cuDNN's grouped kernels measured faster"):
        choice.choose(big, cuda)


# ------------------------------------------------------------------------------------------------
# CPU: compilation (NVRTC when it loads, nvcc for the resource report)
# ------------------------------------------------------------------------------------------------

def _compile_specs():
    """(name, spec) for the heroes of MODEL_OPS, misaligned variants and search-space corners."""
    out = []
    for op in MODEL_OPS + [dw(3, 17, 15, 15, 3, mult=2, layout="nchw", dtype="float16", dtype_out="float32"),
                           dw(1, 32, 15, 15, 3, padding=2, dilation=2, dtype="float32"),
                           grouped(2, 48, 14, 14, 3, r=5, dtype="bfloat16", epilogue="gelu_erf"),
                           grouped(1, 168, 28, 28, 7, layout="nchw", dtype="float32", epilogue="bias+relu"),
                           grouped(8, 256, 7, 7, 4, layout="nchw", dtype="float32"),  # 24 / 64 per group
                           grouped(1, 168, 28, 28, 7, epilogue="bias+relu"), grouped(2, 1024, 7, 7, 32)]:
        for c in VARIANT.hero_configs(op, H100):
            out.append(VARIANT.spec(op, c, None))
        if op.layout is Layout.NHWC:
            out.append(VARIANT.spec(op, VARIANT.hero_configs(op, H100)[0], {"x": 2, "w": 0, "out": 2, "bias": 0}))
            for params in ((("ppt", 4), ("cv", 4), ("threads", 256)), (("ppt", 1), ("cv", 32), ("vec", 2))):
                cfg = PipelineConfig(params=params)
                if VARIANT.validate_config(op, cfg, H100):
                    out.append(VARIANT.spec(op, cfg, None))
        else:
            out.append(VARIANT.spec(op, PipelineConfig(params=(("rows", 4), ("threads", 64))), None))
    return [(f"d{i}", s) for i, s in enumerate(out)]


def _nvrtc():
    try:
        from cupy.cuda import nvrtc  # noqa: PLC0415

        nvrtc.getVersion()
        return nvrtc
    except Exception:  # noqa: BLE001 - no CuPy or no NVRTC library here
        return None


@pytest.mark.skipif(_nvrtc() is None, reason="CuPy's NVRTC is not loadable here")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_kernels_compile_with_nvrtc(arch):
    """What the GPU path runs: ``compiler._nvrtc_cubin`` with the backend's options, for every spec."""
    from tracea_cuda import compiler

    for name, spec in _compile_specs():
        cubin = compiler._nvrtc_cubin(render(spec, name=name), compiler.options_for(arch), name)
        assert len(cubin) > 1000, name


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_kernels_compile_without_spills(arch):
    specs = dict(_compile_specs())
    report = compile_report(bundle({name: render(spec, name=name) for name, spec in specs.items()}), arch)
    assert set(report) == set(specs)
    bad = {name: r for name, r in report.items() if r.spill_stores or r.spill_loads or r.static_smem > 48 * 1024}
    assert not bad, bad


# ------------------------------------------------------------------------------------------------
# CPU: the emitted kernels run on the host against float64
# ------------------------------------------------------------------------------------------------

needs_cxx = pytest.mark.skipif(host_emulation.compiler_path() is None or importlib.util.find_spec("torch") is None,
                               reason="no host C++ compiler or no torch (the reference)")


def _host_inputs(op: Conv2dOp, seed: int = 0):
    import torch  # noqa: PLC0415

    td = {DType.F32: torch.float32, DType.F16: torch.float16, DType.BF16: torch.bfloat16}
    g = torch.Generator().manual_seed(seed)
    cg = op.c // op.groups
    x = torch.randn(op.n, op.c, op.h, op.w, generator=g).to(td[op.dtype.storage])
    w = (torch.randn(op.k, cg, op.r, op.s, generator=g) / math.sqrt(cg * op.r * op.s)).to(td[op.dtype.storage])
    b = torch.randn(op.k, generator=g).to(td[op.out_dtype.storage]) if op.epilogue.has_bias else None
    return x, w, b, td


def _bits(t) -> np.ndarray:
    import torch  # noqa: PLC0415

    t = t.contiguous()
    return t.numpy() if t.dtype == torch.float32 else t.view(torch.int16).numpy()


def _host_run(op: Conv2dOp, config: PipelineConfig, tmp_path, x, w, b, offsets=(0, 0)):
    """Run the rendered kernel on the host on NCHW-logical tensors (laid out as ``op.layout``), with x and
    the output ``offsets`` elements past an aligned start; returns the output as NCHW-logical float64."""
    import torch  # noqa: PLC0415

    nhwc = op.layout is Layout.NHWC
    xs, ws_ = (x.permute(0, 2, 3, 1), w.permute(0, 2, 3, 1)) if nhwc else (x, w)
    xa, wa = _bits(xs), _bits(ws_)
    ptrs = {"x": offsets[0] * xa.itemsize, "w": 0, "out": offsets[1] * (4 if op.out_dtype is DType.F32 else 2),
            "bias": 0}
    spec = VARIANT.spec(op, config, ptrs)
    kernel = host_emulation.build(render(spec, name="dwk"), "dwk", op.dtype.storage, op.out_dtype, op.out_dtype,
                                  tmp_path)
    xbuf = np.zeros(xa.size + 16, dtype=xa.dtype)
    base = (-xbuf.ctypes.data % 16) // xa.itemsize
    xview = xbuf[base + offsets[0]: base + offsets[0] + xa.size]
    xview[:] = xa.reshape(-1)
    out_np = np.float32 if op.out_dtype is DType.F32 else np.int16
    size = int(np.prod(op.out_shape))
    obuf = np.full(size + 16, -1, dtype=out_np)  # (-1 bits: NaN in 16-bit, a sentinel in fp32)
    obase = (-obuf.ctypes.data % 16) // obuf.itemsize
    oview = obuf[obase + offsets[1]: obase + offsets[1] + size]
    kernel(spec.grid(), spec.threads, 1 if spec.nchw else 2, xview, np.ascontiguousarray(wa), oview,
           None if b is None else _bits(b))
    res = torch.from_numpy(oview.copy()).reshape(op.out_shape)
    if op.out_dtype is not DType.F32:
        res = res.view({DType.F16: torch.float16, DType.BF16: torch.bfloat16}[op.out_dtype.storage])
    res = res.double()
    return res.permute(0, 3, 1, 2) if nhwc else res


def _reference(op: Conv2dOp, x, w, b):
    import torch.nn.functional as F  # noqa: PLC0415

    y = F.conv2d(x.double(), w.double(), None, op.stride, op.padding, op.dilation, op.groups)
    return T.apply_epilogue_ref(y.permute(0, 2, 3, 1), op.epilogue, b).permute(0, 3, 1, 2)


def _tol(op: Conv2dOp) -> float:
    return {DType.F32: 1e-5, DType.F16: 2e-3, DType.BF16: 1e-2}[op.out_dtype.storage]


def _rel(out, ref) -> float:
    return float((out - ref).norm() / max(float(ref.norm()), 1e-300))


# (n, c, k, h, w, r, s, stride, padding, dilation, groups): odd C, multipliers, H = W = 1, rectangular kernels,
# padding 0 / 1 / 3, stride 2, dilation 2, groups of 4 / 8 / 16 channels, 1x1, multipliers 2 / 3, and a
# grouped conv with fewer outputs than inputs per group (4 -> 2: a thread's 8 outputs span 4 groups)
HOST_GEOMS = [(1, 3, 3, 7, 7, 3, 3, 1, 1, 1, 3), (3, 17, 17, 15, 14, 3, 3, 1, 1, 1, 17),
              (2, 17, 34, 15, 15, 5, 5, 2, 2, 1, 17), (1, 32, 32, 1, 1, 3, 3, 1, 1, 1, 32),
              (2, 32, 32, 15, 15, 3, 3, 1, 2, 2, 32), (1, 96, 96, 14, 14, 7, 7, 1, 3, 1, 96),
              (1, 96, 96, 14, 14, 1, 1, 1, 0, 1, 96), (2, 40, 40, 9, 8, 3, 3, 2, 0, 1, 40),
              (3, 128, 128, 7, 7, 3, 3, 1, 1, 1, 32), (1, 256, 256, 7, 9, 3, 3, 2, 1, 1, 32),
              (2, 64, 128, 7, 9, 3, 3, 1, 0, 1, 8), (1, 48, 48, 6, 7, 3, 5, 1, (1, 2), 1, 3),
              (1, 48, 144, 5, 5, 3, 3, 1, 1, 1, 48), (1, 32, 64, 9, 9, 3, 3, 1, 1, 1, 32),
              (2, 64, 32, 7, 7, 3, 3, 1, 1, 1, 16)]
# 17-64 channels per group (RegNetX-style 24, 48; 64)
WIDE_GEOMS = [(1, 72, 72, 9, 9, 3, 3, 1, 1, 1, 3), (2, 96, 96, 7, 6, 3, 3, 2, 1, 1, 2),
                   (1, 128, 128, 5, 5, 3, 3, 1, 1, 1, 2), (1, 48, 96, 6, 6, 5, 5, 1, 2, 1, 2)]
HOST_MODES = [("nhwc", "float16", None, "bias+silu"), ("nhwc", "bfloat16", None, "bias+relu"),
              ("nhwc", "float32", None, "bias"), ("nchw", "float32", None, "bias+gelu"),
              ("nchw", "bfloat16", "float32", "none"), ("nhwc", "float16", "float32", "gelu_erf")]


def _geom_op(geom, mode) -> Conv2dOp:
    n, c, k, h, w, r, s, st, pad, dil, g = geom
    layout, dt, out, epi = mode
    return Conv2dOp(n, c, h, w, k, r, s, stride=st, padding=pad, dilation=dil, groups=g, layout=layout, dtype=dt,
                    dtype_out=out, epilogue=epi)


@needs_cxx
@pytest.mark.parametrize("geom", HOST_GEOMS + WIDE_GEOMS, ids=lambda g: "g" + "_".join(map(str, g)))
def test_host_emulated_kernels_against_float64(geom, tmp_path):
    """Every geometry in two modes (cycling through HOST_MODES), each hero: the rendered CUDA run on the host.
    Groups of 24-64 channels in NCHW also run a spread of kpt / rows."""
    geoms = HOST_GEOMS + WIDE_GEOMS
    i = geoms.index(geom)
    for mode in (HOST_MODES[i % len(HOST_MODES)], HOST_MODES[(i + 3) % len(HOST_MODES)]):
        op = _geom_op(geom, mode)
        assert not _reasons(op), _reasons(op)
        x, w, b, _ = _host_inputs(op, seed=i)
        ref = _reference(op, x, w, b)
        configs = VARIANT.hero_configs(op, H100)
        assert configs, op.describe()
        if geom in WIDE_GEOMS and op.layout is Layout.NCHW:
            configs += [PipelineConfig(params=(("rows", 2), ("kpt", 8), ("threads", 64))),
                        PipelineConfig(params=(("rows", 1), ("threads", 32)))]
        for config in configs:
            assert VARIANT.validate_config(op, config, H100), config
            err = _rel(_host_run(op, config, tmp_path, x, w, b), ref)
            assert err <= _tol(op), (op.describe(), config.key, err)


@needs_cxx
def test_host_emulated_search_corners_and_misaligned_views(tmp_path):
    cases = [(_geom_op(HOST_GEOMS[5], HOST_MODES[0]), (("ppt", 4), ("cv", 4), ("threads", 64))),
             (_geom_op(HOST_GEOMS[8], HOST_MODES[1]), (("ppt", 1), ("cv", 32), ("vec", 2))),
             (_geom_op(HOST_GEOMS[10], HOST_MODES[2]), (("ppt", 8), ("cv", 1), ("vec", 4), ("threads", 32))),
             (_geom_op(HOST_GEOMS[4], HOST_MODES[3]), (("rows", 8), ("threads", 32))),
             (_geom_op(HOST_GEOMS[2], HOST_MODES[4]), (("rows", 4), ("threads", 64))),
             # NCHW wide groups, several output channels per thread: a whole 16-channel group, a 2-channel one
             (_geom_op(HOST_GEOMS[10], HOST_MODES[3]), (("rows", 2), ("kpt", 16), ("threads", 32))),
             (_geom_op(HOST_GEOMS[14], HOST_MODES[4]), (("rows", 8), ("kpt", 2), ("threads", 64))),
             (_geom_op(HOST_GEOMS[9], HOST_MODES[3]), (("rows", 1), ("kpt", 4), ("threads", 128)))]
    for op, params in cases:
        config = PipelineConfig(params=params)
        assert VARIANT.validate_config(op, config, H100), params
        x, w, b, _ = _host_inputs(op)
        ref = _reference(op, x, w, b)
        assert _rel(_host_run(op, config, tmp_path, x, w, b), ref) <= _tol(op), (op.describe(), params)
    for mode in (HOST_MODES[0], HOST_MODES[2]):  # x one element off 16 bytes, out one / two elements off
        op = _geom_op(HOST_GEOMS[8], mode)
        x, w, b, _ = _host_inputs(op)
        for offsets in ((1, 1), (2, 2), (4, 0)):
            out = _host_run(op, VARIANT.hero_configs(op, H100)[0], tmp_path, x, w, b, offsets)
            assert _rel(out, _reference(op, x, w, b)) <= _tol(op), (mode, offsets)


@needs_cxx
@pytest.mark.parametrize("mode", [HOST_MODES[0], HOST_MODES[3]], ids=["nhwc-f16", "nchw-f32"])
def test_host_emulated_nan_inf_propagate(mode, tmp_path):
    import torch  # noqa: PLC0415

    op = _geom_op((2, 32, 32, 9, 9, 3, 3, 1, 1, 1, 32), (mode[0], mode[1], None, "bias+relu"))
    x, w, b, _ = _host_inputs(op)
    x[0, 3, 4, 4] = float("nan")
    x[1, 5, 0, 0] = float("inf")
    x[1, 6, 2, 2], x[1, 6, 2, 3] = float("inf"), float("-inf")
    out, ref = _host_run(op, VARIANT.hero_configs(op, H100)[0], tmp_path, x, w, b), _reference(op, x, w, b)
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and int(torch.isnan(ref).sum()) >= 9
    assert torch.equal(torch.isinf(out), torch.isinf(ref))
    fin = torch.isfinite(ref)
    assert _rel(out[fin], ref[fin]) <= _tol(op)


# ------------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------------

# (n, c, k, h, w, r, s, stride, padding, dilation, groups)
GPU_GEOMS = HOST_GEOMS + [(1, 32, 32, 112, 112, 3, 3, 1, 1, 1, 32), (3, 96, 96, 56, 56, 3, 3, 2, 1, 1, 96),
                          (1, 1152, 1152, 7, 7, 5, 5, 1, 2, 1, 1152), (3, 96, 96, 14, 14, 7, 7, 1, 3, 1, 96),
                          (3, 128, 128, 56, 56, 3, 3, 1, 1, 1, 32), (1, 256, 256, 15, 15, 3, 3, 2, 1, 1, 32),
                          (3, 1152, 1152, 15, 14, 3, 3, 2, 1, 1, 1152)]
GPU_MODES = HOST_MODES + [("nchw", "float32", None, "bias+silu"), ("nhwc", "bfloat16", "float16", "bias+gelu")]


def _gpu_check(op: Conv2dOp, config: PipelineConfig, t=None, seed: int = 0) -> None:
    profile = T.gpu_profile()
    t = t or T.conv_inputs(op, seed=seed)
    ref = T.conv_reference(op, t)
    t["out"].fill_(float("nan"))
    VARIANT.run(op, config, T.op_args(t), profile)
    err = T.rel_err(t["out"], ref)
    assert err <= _tol(op), f"{op.describe()} {config.key}: rel err {err:.3g}"


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("mode", GPU_MODES, ids=lambda m: "-".join(x for x in m if x))
@pytest.mark.parametrize("geom", GPU_GEOMS, ids=lambda g: "g" + "_".join(map(str, g)))
def test_depthwise_against_float64(geom, mode):
    op = _geom_op(geom, mode)
    profile = T.gpu_profile()
    assert not VARIANT.check(op, profile), VARIANT.check(op, profile)
    for i, config in enumerate(VARIANT.hero_configs(op, profile)):
        _gpu_check(op, config, seed=i)


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("geom", WIDE_GEOMS + [(2, 168, 168, 28, 28, 3, 3, 1, 1, 1, 7),
                                               (1, 912, 912, 7, 7, 3, 3, 1, 1, 1, 38),
                                               (2, 1024, 1024, 7, 7, 3, 3, 1, 1, 1, 32)],
                         ids=lambda g: "g" + "_".join(map(str, g)))
def test_depthwise_wide_groups_on_gpu(geom):
    for mode in (HOST_MODES[0], HOST_MODES[3], GPU_MODES[6], GPU_MODES[7]):
        op = _geom_op(geom, mode)
        profile = T.gpu_profile()
        for i, config in enumerate(VARIANT.hero_configs(op, profile)):
            _gpu_check(op, config, seed=i)


@pytest.mark.cuda
@needs_gpu
def test_depthwise_search_corners_on_gpu():
    profile = T.gpu_profile()
    for op in (MODEL_OPS[1], MODEL_OPS[3], grouped(3, 128, 14, 14, 32, epilogue="bias+relu"), MODEL_OPS[9]):
        small = Conv2dOp(min(op.n, 2), op.c, min(op.h, 28), min(op.w, 28), op.k, op.r, op.s, stride=op.stride,
                         padding=op.padding, groups=op.groups, layout=op.layout, dtype=op.dtype, epilogue=op.epilogue)
        points = [c for c in VARIANT.search_space(small, profile)]
        for config in points[:: max(1, len(points) // 12)]:  # a spread of the space
            _gpu_check(small, config)


@pytest.mark.cuda
@needs_gpu
def test_depthwise_misaligned_views():
    """x / out views one element off 16 bytes take the narrow loads / scalar stores (another compiled kernel)."""

    for layout, dt in (("nhwc", "float16"), ("nhwc", "float32"), ("nchw", "float32")):
        op = dw(2, 64, 14, 14, 3, layout=layout, dtype=dt, epilogue="bias")
        t = T.misalign(T.conv_inputs(op))
        _gpu_check(op, VARIANT.hero_configs(op, T.gpu_profile())[0], t)


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("layout,dt", [("nhwc", "float16"), ("nhwc", "bfloat16"), ("nchw", "float32")])
def test_depthwise_nan_inf_on_gpu(layout, dt):
    import torch  # noqa: PLC0415

    op = dw(2, 32, 9, 9, 3, layout=layout, dtype=dt, epilogue="bias+relu")
    t = T.conv_inputs(op)
    x = t["x"] if layout == "nchw" else t["x"].permute(0, 3, 1, 2)  # an NCHW-logical view of the same memory
    x[0, 3, 4, 4] = float("nan")
    x[1, 5, 0, 0] = float("inf")
    x[1, 6, 2, 2], x[1, 6, 2, 3] = float("inf"), float("-inf")
    ref = T.conv_reference(op, t)
    VARIANT.run(op, VARIANT.hero_configs(op, T.gpu_profile())[0], T.op_args(t), T.gpu_profile())
    out = t["out"].double()
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and int(torch.isnan(ref).sum()) >= 9
    assert torch.equal(torch.isinf(out), torch.isinf(ref))
    fin = torch.isfinite(ref)
    assert T.rel_err(out[fin], ref[fin]) <= _tol(op)


@pytest.mark.cuda
@needs_gpu
def test_depthwise_user_path_default_choice_and_graph():
    """``tracea.ops.conv2d`` on torch tensors: the Doctor's default for depthwise / grouped ops is this variant;
    repeated calls (plan cache, pointer-only launcher) and a CUDA graph replay equal eager, against float64."""
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415

    import tracea  # noqa: PLC0415
    from tracea.doctor.doctor import get_doctor  # noqa: PLC0415

    cases = [(torch.float16, torch.channels_last, 96, 96, 3, 2), (torch.bfloat16, torch.channels_last, 128, 32, 3, 1),
             (torch.float32, torch.contiguous_format, 144, 144, 5, 1),
             (torch.float16, torch.channels_last, 384, 384, 7, 1)]
    for dt, fmt, c, groups, r, stride in cases:
        g = torch.Generator(device="cuda").manual_seed(5)
        x = torch.randn(8, c, 28, 28, device="cuda", dtype=dt, generator=g).contiguous(memory_format=fmt)
        w = (torch.randn(c, c // groups, r, r, device="cuda", dtype=dt, generator=g) / r).contiguous(memory_format=fmt)
        b = torch.randn(c, device="cuda", dtype=dt, generator=g)
        ref = F.silu(F.conv2d(x.double(), w.double(), b.double(), stride, r // 2, 1, groups))
        op = Conv2dOp(8, c, 28, 28, c, r, r, stride=stride, padding=r // 2, groups=groups,
                      layout="nchw" if fmt is torch.contiguous_format else "nhwc", dtype=str(dt)[6:],
                      fp32_precision="high", epilogue="bias+silu")
        assert get_doctor().decide(op, "cuda:0").variant.name == NAME

        def call(x=x, w=w, b=b, stride=stride, pad=r // 2, groups=groups):
            return tracea.ops.conv2d(x, w, b, stride=stride, padding=pad, groups=groups, activation="silu")

        outs = [call() for _ in range(3)]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = call()
        captured.zero_()
        graph.replay()
        torch.cuda.synchronize()
        tol = 1e-5 if dt is torch.float32 else 2e-3 if dt is torch.float16 else 1e-2
        for out in outs + [captured]:
            assert T.rel_err(out, ref) <= tol, (op.describe(), T.rel_err(out, ref))
        assert torch.equal(captured, outs[-1]) and torch.equal(outs[0], outs[-1])
        assert outs[0].is_contiguous(memory_format=fmt)


def _timm_like_block(c: int, groups: int, r: int, stride: int, padding) -> "object":
    """Conv (depthwise or grouped, bias from a folded BatchNorm) + SiLU, then a 1x1 conv + ReLU."""
    from torch import nn  # noqa: PLC0415

    return nn.Sequential(nn.Conv2d(c, c, r, stride=stride, padding=padding, groups=groups, bias=True), nn.SiLU(),
                         nn.Conv2d(c, 2 * c, 1), nn.ReLU())


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("arbiter", ["0", "1"], ids=["arbiter-off", "arbiter-on"])
def test_patched_depthwise_blocks_match_eager(monkeypatch, arbiter):
    """Patched timm-style blocks (depthwise 3x3 / 5x5 stride 2 / 7x7 ``padding="same"`` and a ResNeXt
    grouped 3x3) in channels_last fp16 / bf16 and NCHW fp32 equal eager; with the arbiter off no grouped conv
    falls back (Tracea serves each), with it on whichever side it picks still equals eager."""
    import copy  # noqa: PLC0415

    import torch  # noqa: PLC0415

    import tracea_torch  # noqa: PLC0415
    from tracea_torch import fallbacks  # noqa: PLC0415

    monkeypatch.setenv("TRACEA_ARBITER", arbiter)
    blocks = [(96, 96, 3, 1, 1), (144, 144, 5, 2, 2), (192, 192, 7, 1, "same"), (128, 32, 3, 1, 1)]
    for dt, fmt in ((torch.float16, torch.channels_last), (torch.bfloat16, torch.channels_last),
                    (torch.float32, torch.contiguous_format)):
        for c, groups, r, stride, padding in blocks:
            torch.manual_seed(0)
            model = _timm_like_block(c, groups, r, stride, padding).to("cuda", dt).to(memory_format=fmt).eval()
            patched = tracea_torch.patch_conv2d(copy.deepcopy(model))
            x = torch.randn(4, c, 30, 30, device="cuda", dtype=dt).contiguous(memory_format=fmt)
            fallbacks.reset()
            with torch.no_grad():
                torch.backends.cudnn.allow_tf32 = False
                try:
                    outs = [patched(x) for _ in range(2)]
                    want = model(x)
                finally:
                    torch.backends.cudnn.allow_tf32 = True
            tol = {torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5}[dt]
            for out in outs:
                assert T.rel_err(out, want.double()) <= tol, (dt, c, groups, r, T.rel_err(out, want.double()))
            if arbiter == "0":
                assert fallbacks.total("conv2d") == 0, fallbacks.counts()


@pytest.mark.cuda
@needs_gpu
def test_patched_timm_efficientnet_has_no_grouped_fallbacks(monkeypatch):
    """A real timm EfficientNet-B0 (when timm is installed), channels_last fp16, patched: no conv falls back
    for ``groups`` (before this variant: ~1270 per run) and the output matches eager."""
    import copy  # noqa: PLC0415

    timm = pytest.importorskip("timm")
    import torch  # noqa: PLC0415

    import tracea_torch  # noqa: PLC0415
    from tracea_torch import fallbacks  # noqa: PLC0415

    monkeypatch.setenv("TRACEA_ARBITER", "0")
    model = timm.create_model("efficientnet_b0", pretrained=False).to("cuda", torch.float16)
    model = model.to(memory_format=torch.channels_last).eval()
    patched = tracea_torch.patch_conv2d(copy.deepcopy(model))
    x = torch.randn(4, 3, 224, 224, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    fallbacks.reset()
    with torch.no_grad():
        out, want = patched(x), model(x)
    print("efficientnet_b0 patched fallbacks:", fallbacks.counts())
    assert fallbacks.total("conv2d", "groups") == 0, fallbacks.counts()
    assert torch.isfinite(out).all() and T.rel_err(out.float(), want.double()) <= 5e-2  # 16 fp16 blocks deep
