"""The converting bf16 GEMM (``cpu.gemm.bf16cvt.avx2`` / ``cpu.gemm.bf16cvt.avx512``: bf16 widened to fp32
while packed, fp32 micro-kernel) against a float64 reference of the bf16 inputs: odd and tiny shapes, B
stored N x K on and off the 8 x 8 register-transpose path (odd N and K), transposes, batches, epilogues, both
output dtypes with bf16's round-to-nearest-even and NaN, several K blocks and threads, NaN / Inf
propagation, the Doctor's ranking against the bf16 dot-product / AMX variants, and the user path. Inputs are
torch CPU bf16 tensors; each ISA's tests skip with the reason where the CPU lacks it."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.doctor.variant import OpArgs
from tracea.ir.ops import GemmOp
from tracea.testing import nonfinite_mismatch
from tracea_cpu.bf16_convert import CpuGemmBf16ConvertVariant
from tracea_cpu.isa import AVX2, AVX512
from tracea_cpu.testing import HAVE_CC, PROFILE, config, epilogue_ref, rel_err, run_bf16_gemm

torch = pytest.importorskip("torch")
TorchAdapter = pytest.importorskip("tracea_torch.adapter", reason="bf16 inputs come as torch tensors").TorchAdapter

pytestmark = pytest.mark.torch

# (the kernel runs any shape when called directly; the Doctor declines fewer than MIN_ROWS rows)
SHAPES = [(1, 1, 1), (7, 7, 7), (1, 33, 129), (33, 1, 7), (17, 33, 65), (97, 131, 257), (2, 97, 3), (64, 64, 64),
          (31, 47, 95), (130, 17, 300), (9, 40, 16)]


def _variants() -> list:
    out = []
    for isa in (AVX512, AVX2):
        ok = HAVE_CC and isa.runs_here() and PROFILE.has(*isa.requires)
        out.append(pytest.param(CpuGemmBf16ConvertVariant(isa), id=isa.name,
                                marks=pytest.mark.skipif(not ok, reason=f"needs a C compiler and {isa.name}")))
    return out


VARIANTS = _variants()


def case(v, m, n, k, *, tb=True, cfg=None, **kw):
    """(output as float64, float64 reference) of a bf16 GEMM through ``v`` (the 64^3 op's first hero by default)."""
    cfg = cfg or v.hero_configs(GemmOp(64, 64, 64, dtype_a="bf16", dtype_b="bf16"), PROFILE)[0]
    res, ref = run_bf16_gemm(v, m, n, k, tb=tb, cfg=cfg, **kw)
    return res.double().numpy(), ref


@pytest.mark.parametrize("v", VARIANTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out", ["float32", "bf16"])
def test_shapes(v, shape, out):
    got, ref = case(v, *shape, out=out, seed=sum(shape))
    # exact bf16 products accumulated in fp32; a bf16 output adds one rounding (2^-8)
    assert rel_err(got, ref) < (3e-6 if out == "float32" else 5e-3)


@pytest.mark.parametrize("v", VARIANTS)
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (True, True)])
def test_transposes_and_batches(v, ta, tb):
    got, ref = case(v, 37, 29, 71, batch=3, ta=ta, tb=tb, seed=4)
    assert rel_err(got, ref) < 3e-6


@pytest.mark.parametrize("v", VARIANTS)
@pytest.mark.parametrize("epi", ["bias", "bias+relu", "bias+gelu", "silu", "bias+gelu_tanh"])
def test_epilogues(v, epi):
    for out, bias_dtype in (("float32", "float32"), ("bf16", "bfloat16")):
        got, ref = case(v, 45, 70, 33, epi=epi, out=out, bias_dtype=bias_dtype, seed=6)
        assert rel_err(got, ref) < (1e-5 if out == "float32" else 5e-3), (epi, out)


@pytest.mark.parametrize("v", VARIANTS)
def test_several_k_blocks_and_threads(v):
    for threads in (1, 2):
        mr, nr = v.isa.tiles[0]
        cfg = config(mr=mr, nr=nr, kc=64, mc=2 * mr, nc=2 * nr, threads=threads)
        got, ref = case(v, 150, 133, 1000, cfg=cfg, seed=8)  # K blocks of 64 plus a tail of 40
        assert rel_err(got, ref) < 3e-6


@pytest.mark.parametrize("v", VARIANTS)
def test_bf16_output_rounds_to_nearest_even_like_torch(v):
    """The bf16 output is the fp32 result rounded to nearest even: equal to torch's own rounding of the
    fp32 output of the same kernel (ties included: K = 1 products of two bf16 hit them)."""
    for m, n, k in ((33, 70, 1), (40, 64, 129)):
        g = torch.Generator().manual_seed(m + k)
        a = torch.randn(1, m, k, generator=g).bfloat16()
        b = torch.randn(1, n, k, generator=g).bfloat16()
        outs = {}
        for dt in ("float32", "bf16"):
            op = GemmOp(m, n, k, trans_b=True, dtype_a="bf16", dtype_b="bf16", dtype_out=dt)
            res = torch.empty(1, m, n, dtype=torch.bfloat16 if dt == "bf16" else torch.float32)
            v.run(op, v.hero_configs(op, PROFILE)[0], OpArgs({"a": a, "b": b, "bias": None}, res, TorchAdapter()),
                  PROFILE)
            outs[dt] = res
        assert torch.equal(outs["bf16"], outs["float32"].bfloat16())


@pytest.mark.parametrize("v", VARIANTS)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("out", ["float32", "bf16"])
def test_nan_inf_propagate(v, seed, out):
    got, ref = case(v, 19, 23, 37, seed=seed, nonfinite=2, out=out)
    if out == "bf16":  # compare where the reference is finite within bf16's precision; non-finite placement exactly
        assert np.array_equal(np.isnan(got), np.isnan(ref)), seed
        fin = np.isfinite(ref)
        assert np.array_equal(np.isinf(got) & ~np.isnan(ref), np.isinf(ref)), seed
        assert rel_err(got[fin], ref[fin]) < 5e-3
    else:
        why = nonfinite_mismatch(got, ref, atol=1e-5)
        assert why is None, why


def test_declines_decode_rows():
    from tracea_cpu.f16 import MIN_ROWS  # (shared with the fp16 GEMM)

    v = CpuGemmBf16ConvertVariant(AVX2)
    few = GemmOp(MIN_ROWS - 1, 4096, 4096, trans_b=True, dtype_a="bf16", dtype_b="bf16")
    assert any("rows" in r for r in v.check(few, PROFILE))
    enough = GemmOp(MIN_ROWS, 4096, 4096, trans_b=True, dtype_a="bf16", dtype_b="bf16")
    assert not any("rows" in r for r in v.check(enough, PROFILE))


@pytest.mark.skipif(not (HAVE_CC and AVX2.runs_here() and PROFILE.has(*AVX2.requires)),
                    reason="needs a C compiler and AVX2")
@pytest.mark.skipif(PROFILE.has("avx512_bf16"), reason="this CPU has a bf16 dot product")
def test_few_rows_go_to_the_skinny_kernel_more_to_this_one():
    """8-16 rows against a large weight: the skinny kernel (weight read once, in place) ranks first; from
    32 rows this GEMM serves (the skinny kernels take at most 16)."""
    from tracea.doctor.doctor import get_doctor

    for m, prefix in ((8, "cpu.gemv.bf16cvt."), (16, "cpu.gemv.bf16cvt."), (32, "cpu.gemm.bf16cvt."),
                      (512, "cpu.gemm.bf16cvt.")):
        op = GemmOp(m, 4096, 4096, trans_b=True, dtype_a="bf16", dtype_b="bf16", epilogue="bias")
        assert get_doctor().decide(op, "cpu").variant.name.startswith(prefix), m


def test_ranks_below_bf16_dot_product_and_amx():
    """Where AVX512_BF16 or AMX exists, their variants stay first: the converting kernel's estimate is
    the fp32 FMA rate's, theirs twice that or more."""
    from tracea_cpu.amx import CpuGemmAmxVariant
    from tracea_cpu.bf16 import CpuGemmBf16Variant
    from tracea_cpu.testing import AMX_PROFILE

    op = GemmOp(1024, 1024, 1024, trans_b=True, dtype_a="bf16", dtype_b="bf16", dtype_out="bf16")
    ours = CpuGemmBf16ConvertVariant(AVX512).estimate_seconds(op, AMX_PROFILE)
    assert CpuGemmBf16Variant().estimate_seconds(op, AMX_PROFILE) < ours
    assert CpuGemmAmxVariant().estimate_seconds(op, AMX_PROFILE) < ours


@pytest.mark.skipif(not (HAVE_CC and AVX2.runs_here() and PROFILE.has(*AVX2.requires)),
                    reason="needs a C compiler and AVX2")
@pytest.mark.skipif(PROFILE.has("avx512_bf16"), reason="this CPU has a bf16 dot product: cpu.gemm.avx512bf16 serves")
def test_user_path_chooses_it_and_matches_torch():
    import tracea
    from tracea.doctor.doctor import get_doctor
    from tracea.runtime import fallbacks

    op = GemmOp(96, 80, 70, trans_b=True, dtype_a="bf16", dtype_b="bf16", dtype_out="bf16", epilogue="bias")
    assert get_doctor().decide(op, "cpu").variant.name.startswith("cpu.gemm.bf16cvt.")
    g = torch.Generator().manual_seed(11)
    x = torch.randn(96, 70, generator=g).bfloat16()
    w = torch.randn(80, 70, generator=g).bfloat16()
    b = torch.randn(80, generator=g).bfloat16()
    fallbacks.reset()
    y = tracea.ops.matmul(x, w.t(), bias=b)
    assert not fallbacks.counts(), fallbacks.counts()
    ref = x.double() @ w.double().t() + b.double()
    assert y.dtype == torch.bfloat16 and rel_err(y.double().numpy(), ref.numpy()) < 5e-3
    x_before = x.clone()
    tracea.ops.matmul(x, w.t(), bias=b)
    assert torch.equal(x, x_before)  # inputs untouched


# -- conv2d ---------------------------------------------------------------------------------------------

def _conv_variants() -> list:
    from tracea.dtypes import DType
    from tracea_cpu.bf16_convert import CpuConv2dBf16ConvertVariant

    out = []
    for isa in (AVX512, AVX2):
        for dt in (DType.BF16, DType.F16):
            ok = HAVE_CC and isa.runs_here() and PROFILE.has(*isa.requires, "f16c")
            out.append(pytest.param(CpuConv2dBf16ConvertVariant(isa, dt), id=f"{isa.name}-{dt.value}",
                                    marks=pytest.mark.skipif(not ok, reason=f"needs a C compiler, {isa.name} and F16C")))
    return out


CONV_VARIANTS = _conv_variants()
# (n, c, hw, k, r, stride, padding, groups): 3x3, strided, 1x1, an RGB stem, odd sizes, grouped
CONV_GEOMS = [(1, 16, 9, 24, 3, 1, 1, 1), (2, 33, 11, 7, 3, 2, 1, 1), (3, 16, 8, 40, 1, 1, 0, 1),
              (1, 3, 23, 8, 7, 2, 3, 1), (2, 8, 6, 8, 3, 1, 1, 2)]


def conv_case(v, geom, layout, out, epi, seed=0, nonfinite=False):
    """``out``: "half" (the variant's 16-bit dtype) or "float32"."""
    from tracea.ir.ops import Conv2dOp

    n, c, hw, k, r, st, pad, groups = geom
    g = torch.Generator().manual_seed(seed)
    half = torch.bfloat16 if v.half.value == "bfloat16" else torch.float16
    op = Conv2dOp(n, c, hw, hw, k, r, r, stride=st, padding=pad, groups=groups, layout=layout, dtype=v.half,
                  dtype_out=v.half if out == "half" else out, epilogue=epi)
    x = torch.randn(n, c, hw, hw, generator=g).to(half)
    w = (torch.randn(k, c // groups, r, r, generator=g) / (c * r * r / groups) ** 0.5).to(half)
    if nonfinite:
        x.view(-1)[5] = float("nan")
        x.view(-1)[-3] = float("inf")
    b = torch.randn(k, generator=g).to(half if out == "half" else torch.float32) if op.epilogue.has_bias else None
    nhwc = layout == "nhwc"
    xs, ws = (x.permute(0, 2, 3, 1).contiguous(), w.permute(0, 2, 3, 1).contiguous()) if nhwc else (x, w)
    res = torch.full(op.out_shape, float("nan"), dtype=half if out == "half" else torch.float32)
    v.run(op, v.hero_configs(op, PROFILE)[0], OpArgs({"x": xs, "w": ws, "bias": b}, res, TorchAdapter()), PROFILE)
    got = res.permute(0, 3, 1, 2) if nhwc else res
    ref = torch.nn.functional.conv2d(x.double(), w.double(), None, st, pad, 1, groups).numpy()
    ref = epilogue_ref(ref, op.epilogue.steps, None if b is None else b.double().numpy(), axis=1)
    return got.double().numpy(), ref


@pytest.mark.parametrize("v", CONV_VARIANTS)
@pytest.mark.parametrize("geom", CONV_GEOMS, ids=lambda g: "x".join(map(str, g)))
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("out", ["float32", "half"])
def test_conv_geometries(v, geom, layout, out):
    got, ref = conv_case(v, geom, layout, out, "bias+relu", seed=sum(geom))
    assert rel_err(got, ref) < (1e-5 if out == "float32" else 5e-3 if v.half.value == "bfloat16" else 1e-3)


@pytest.mark.parametrize("v", CONV_VARIANTS)
def test_conv_nan_inf_propagate(v):
    for out in ("float32", "half"):
        got, ref = conv_case(v, CONV_GEOMS[0], "nchw", out, "bias", seed=2, nonfinite=True)
        assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(np.isinf(got), np.isinf(ref)), out
        fin = np.isfinite(ref)
        assert rel_err(got[fin], ref[fin]) < (1e-5 if out == "float32" else 5e-3)


def test_conv_ranks_below_amx():
    from tracea.ir.ops import Conv2dOp
    from tracea_cpu.amx_conv import CpuConv2dAmxVariant
    from tracea_cpu.bf16_convert import CpuConv2dBf16ConvertVariant
    from tracea_cpu.testing import AMX_PROFILE

    op = Conv2dOp(8, 128, 28, 28, 128, 3, 3, padding=1, layout="nhwc", dtype="bf16", dtype_out="bf16")
    ours = CpuConv2dBf16ConvertVariant(AVX512).estimate_seconds(op, AMX_PROFILE)
    assert CpuConv2dAmxVariant().estimate_seconds(op, AMX_PROFILE) < ours


@pytest.mark.skipif(not (HAVE_CC and AVX2.runs_here() and PROFILE.has(*AVX2.requires)),
                    reason="needs a C compiler and AVX2")
@pytest.mark.skipif(PROFILE.has("amx_bf16"), reason="this CPU has AMX: cpu.conv2d.amxbf16 serves")
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_conv_user_path_torch_layouts_and_patched_module(dt):
    """``tracea.ops.conv2d`` on bf16 / fp16 torch tensors (NCHW and channels_last, out= as well) and a patched
    16-bit ``nn.Conv2d``: served by a Tracea kernel (no fallback counted), torch's result within bf16's
    rounding, inputs untouched."""
    import tracea
    import tracea_torch
    from tracea.runtime import fallbacks

    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 32, 12, 12, generator=g).to(dt)
    w = (torch.randn(48, 32, 3, 3, generator=g) / 17).to(dt)
    b = torch.randn(48, generator=g).to(dt)
    ref = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), padding=1)
    fallbacks.reset()
    for fmt in (torch.contiguous_format, torch.channels_last):
        xf, wf = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
        keep = xf.clone()
        y = tracea.ops.conv2d(xf, wf, b, padding=1)
        assert y.dtype == dt and y.is_contiguous(memory_format=fmt)
        assert rel_err(y.double().numpy(), ref.numpy()) < 5e-3 and torch.equal(xf, keep)
        out = torch.empty_like(y)
        assert tracea.ops.conv2d(xf, wf, b, padding=1, out=out) is out and torch.equal(out, y)
    assert not fallbacks.counts(), fallbacks.counts()
    conv = torch.nn.Conv2d(32, 48, 3, padding=1).to(dt).eval()
    model = tracea_torch.patch_conv2d(torch.nn.Sequential(conv))
    with torch.no_grad():
        want = torch.nn.functional.conv2d(x.double(), conv.weight.double(), conv.bias.double(), padding=1)
        assert rel_err(model(x).double().numpy(), want.numpy()) < 5e-3
