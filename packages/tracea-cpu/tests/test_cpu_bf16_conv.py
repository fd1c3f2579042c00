"""AVX512_BF16 implicit-GEMM conv2d (``cpu.conv2d.avx512bf16``) against a float64 reference of the bf16 inputs:
odd shapes (images narrower than a register tile, channels not multiples of 16, 1x1 / 2x2 / 5x5 kernels), stride,
padding, dilation, NCHW and NHWC, both output dtypes, every hero tile and a K split over several blocks (fp32
partial sums under a bf16 output), the epilogues, NaN / Inf placement, the kept KRSC weights (in-place updates are
seen), the declines (groups, odd C) and the user path ``tracea.ops.conv2d`` (the Doctor's pick, inputs untouched).
Skipped, with the reason, where the CPU lacks AVX512_BF16."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.ir.ops import Conv2dOp
from tracea.testing import nonfinite_mismatch
from tracea_cpu.bf16_conv import HEROES, CpuConv2dBf16Variant
from tracea_cpu.panel_cache import PANELS
from tracea_cpu.testing import HAVE_CC, PROFILE, bf16_tol, config, max_rel, run_bf16_conv

torch = pytest.importorskip("torch")
F = torch.nn.functional
TorchAdapter = pytest.importorskip("tracea_torch.adapter", reason="bf16 inputs come as torch tensors").TorchAdapter

VARIANT = CpuConv2dBf16Variant()
pytestmark = [pytest.mark.skipif(not HAVE_CC, reason="no C compiler"),
              pytest.mark.skipif(not PROFILE.has("avx512_bf16"), reason="this CPU lacks AVX512_BF16 (vdpbf16ps)")]

# (n, C, H, W, K, R, S, stride, padding, dilation)
SHAPES = [(1, 64, 14, 14, 64, 3, 3, 1, 1, 1), (2, 4, 9, 11, 5, 3, 3, 1, 1, 1), (1, 34, 7, 7, 17, 3, 3, 2, 1, 1),
          (1, 40, 6, 5, 70, 1, 1, 1, 0, 1), (2, 8, 13, 10, 12, 3, 3, 2, 2, 2), (3, 40, 5, 6, 70, 2, 2, 1, 0, 1),
          (1, 32, 12, 12, 48, 5, 5, 3, 2, 1), (1, 2, 1, 1, 1, 1, 1, 1, 0, 1), (2, 96, 17, 3, 31, 3, 1, (2, 1), (1, 0), (1, 2)),
          (1, 50, 33, 2, 33, 1, 2, 1, (0, 1), 1), (1, 600, 4, 4, 20, 3, 3, 1, 1, 1),
          (1, 4, 12, 12, 8, 9, 9, 1, 4, 1)]  # 81 taps: the direct kernel's run pointers on the heap


def conv_case(shape, **kw):
    """(output, float64 reference) of the variant on ``shape`` (see :func:`tracea_cpu.testing.run_bf16_conv`)."""
    return run_bf16_conv(VARIANT, shape, **kw)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("out", ["float32", "bf16"])
def test_shapes_against_float64(shape, layout, out):
    got, ref = conv_case(shape, layout=layout, out=out, seed=hash((shape, layout, out)) % 1000)
    assert max_rel(got, ref) < bf16_tol(out), (shape, layout, out, max_rel(got, ref))


@pytest.mark.parametrize("epi", ["bias", "relu", "bias+relu", "bias+gelu", "silu", "bias+silu"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_epilogues(epi, layout):
    for shape in (SHAPES[1], SHAPES[4]):
        for out in ("float32", "bf16"):
            got, ref = conv_case(shape, layout=layout, out=out, epi=epi, seed=7)
            assert max_rel(got, ref) < bf16_tol(out) * 2, (epi, shape, out)


@pytest.mark.parametrize("hero", range(len(HEROES)))
@pytest.mark.parametrize("kc", [2048, 64])
def test_heroes_and_k_blocks(hero, kc):
    """Every hero tile; kc = 64 splits K (= R*S*C) over several blocks (a bf16 output sums them in fp32)."""
    cfg = config(**dict(HEROES[hero], kc=kc, threads=0))
    for shape in (SHAPES[0], SHAPES[2], SHAPES[10]):
        for layout, out in (("NCHW", "bf16"), ("NHWC", "float32")):
            got, ref = conv_case(shape, layout=layout, out=out, cfg=cfg, seed=3)
            assert max_rel(got, ref) < bf16_tol(out), (hero, kc, shape, layout)


def test_one_thread_and_two_threads_agree():
    a, _ = conv_case(SHAPES[0], cfg=config(**dict(HEROES[0], threads=1)), seed=5)
    b, _ = conv_case(SHAPES[0], cfg=config(**dict(HEROES[0], threads=2)), seed=5)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("seed", range(3))
def test_nan_inf_propagate_as_the_reference(layout, seed):
    shape = [SHAPES[1], SHAPES[2], SHAPES[0]][seed]
    got, ref = conv_case(shape, layout=layout, seed=seed, nonfinite=2)
    why = nonfinite_mismatch(got, ref, atol=1e-3)
    assert why is None, why


def test_declines_groups_and_odd_channels():
    grouped = Conv2dOp(1, 8, 6, 6, 8, 3, 3, padding=(1, 1), groups=2, dtype="bf16")
    odd = Conv2dOp(1, 3, 6, 6, 8, 3, 3, padding=(1, 1), dtype="bf16")
    assert any("groups" in r for r in VARIANT.check(grouped, PROFILE))
    assert any("odd" in r for r in VARIANT.check(odd, PROFILE))
    assert not VARIANT.check(Conv2dOp(1, 8, 6, 6, 8, 3, 3, padding=(1, 1), dtype="bf16"), PROFILE)


def _amx() -> bool:
    from tracea_cpu.amx import amx_permission

    return PROFILE.has("amx_tile", "amx_bf16") and amx_permission() is None


def test_user_path_picks_it_and_sees_weight_updates():
    import tracea

    PANELS.clear()
    x = torch.randn(2, 32, 10, 10).bfloat16()
    w = (torch.randn(24, 32, 3, 3) / 17).bfloat16()
    b = torch.randn(24).bfloat16()
    op = Conv2dOp(2, 32, 10, 10, 24, 3, 3, padding=(1, 1), dtype="bf16", epilogue="bias")
    # a CPU with usable AMX tiles gets the AMX conv (which keeps its weight panels in the same cache)
    assert tracea.get_doctor().decide(op, "cpu").variant.name == ("cpu.conv2d.amxbf16" if _amx() else VARIANT.name)
    for step in range(4):  # the KRSC weights are kept from the second sighting; an in-place update is seen
        if step == 2:
            w.mul_(-1)
        y = tracea.ops.conv2d(x, w, b, padding=1)
        ref = F.conv2d(x.double(), w.double(), b.double(), padding=1)
        assert float((y.double() - ref).norm() / ref.norm()) < 8e-3, step
    xl = x.contiguous(memory_format=torch.channels_last)
    y = tracea.ops.conv2d(xl, w.contiguous(memory_format=torch.channels_last), b, padding=1)
    assert float((y.double() - ref).norm() / ref.norm()) < 8e-3
