"""The direct NCHW conv2d (``indirect=3``: output pixels in the vector lanes, input read in place, tiles
stored straight into the NCHW output) against float64: odd image sizes, channel counts that are not
multiples of 16 and output-channel counts that are not multiples of the 8-channel block, every padding
with output rows as wide as the input's (1x1 / 3x3 / 5x5, dilation, P != H), images smaller than one
16-pixel vector, the evened-out last tiles, outputs 4-60 bytes past a 64-byte boundary, one to three
threads, epilogues, NaN / Inf (nothing is skipped over padding: 0 x Inf = NaN as in PyTorch), the
fallback to the indirect algorithm where the direct one does not apply, and the hero choice."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tracea.ir.ops import Conv2dOp
from tracea.testing import inject_nonfinite, nonfinite_mismatch
from tracea_cpu import spaces
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.testing import BEST, HAVE_CC, PROFILE, config, conv2d_ref, epilogue_ref, rand, rel_err, run_variant
from tracea_cpu.variants import CpuConv2dVariant

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")

# (n, c, h, w, k, (r, s), padding, dilation, threads)
CASES = [(2, 20, 33, 29, 40, (3, 3), (1, 1), 1, 2),     # odd sizes, 20 channels, 40 = 5 blocks of 8
         (3, 13, 17, 23, 11, (3, 3), (1, 1), 1, 3),     # 11 outputs: a partial 8-channel block
         (1, 64, 56, 56, 64, (3, 3), (1, 1), 1, 2),     # the ResNet layer (3 + 1 vectors -> 2 + 2)
         (2, 24, 14, 14, 32, (3, 3), (1, 1), 1, 1),     # 196 pixels: 13 vectors, one thread
         (2, 9, 19, 21, 16, (5, 5), (2, 2), 1, 2),      # 5x5, padding 2
         (2, 16, 15, 13, 24, (1, 1), (0, 0), 1, 2),     # 1x1, padding 0
         (1, 12, 20, 18, 8, (3, 3), (2, 2), 2, 2),      # dilation 2, padding 2
         (2, 8, 12, 11, 16, (3, 3), (0, 1), 1, 2),      # P = H - 2 (no row padding)
         (2, 8, 9, 10, 16, (3, 3), (2, 1), 1, 2),       # P = H + 2 (output rows of padding only)
         (2, 17, 1, 1, 9, (3, 3), (1, 1), 1, 2),        # one pixel: every tap but the centre is padding
         (3, 10, 3, 5, 12, (3, 3), (1, 1), 1, 2),       # 15 pixels: less than one vector
         (1, 32, 7, 7, 64, (3, 3), (1, 1), 1, 2)]       # 49 pixels: 4 vectors as 2 + 2


def _out_at(shape: tuple[int, ...], offset: int) -> np.ndarray:
    """A NaN-filled float32 array of ``shape`` starting ``offset`` floats past a 64-byte boundary."""
    size = int(np.prod(shape))
    buf = np.full(size + 32, np.nan, dtype=np.float32)
    start = (-(buf.ctypes.data // 4)) % 16 + offset
    return buf[start:start + size].reshape(shape)


def _run(op: Conv2dOp, seed: int, offset: int = 0, threads: int = 2, nonfinite: bool = False,
         algo: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x, wt = rand(rng, *op.x_shape), rand(rng, *op.w_shape)
    bias = rand(rng, op.k) if op.epilogue.has_bias else None
    if nonfinite:
        inject_nonfinite(rng, x, 4)
        inject_nonfinite(rng, wt, 2)
    x_in, w_in = x.copy(), wt.copy()
    out = _out_at(op.out_shape, offset)
    cfg = config(mr=6, nr=64, mc=48, nc=4096, kc=1024, indirect=algo, threads=threads)
    run_variant(CpuConv2dVariant(ISA_BY_NAME[BEST]), op, cfg, {"x": x, "w": wt, "bias": bias}, out)
    assert np.array_equal(x, x_in, equal_nan=True) and np.array_equal(wt, w_in, equal_nan=True)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = epilogue_ref(conv2d_ref(x, wt, op), op.epilogue.steps, bias, axis=1)
    return out, ref


@pytest.mark.parametrize("offset", [0, 1, 15])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}@{c[2]}x{c[3]}-k{c[4]}-{c[5][0]}x{c[5][1]}"
                                                       f"-p{c[6][0]}{c[6][1]}-d{c[7]}")
def test_nchw_direct_matches_float64(case, offset):
    n, c, h, w, k, (r, s), pad, dil, threads = case
    epi = "bias+relu" if offset == 1 else ("bias" if offset == 15 else "none")
    op = Conv2dOp(n, c, h, w, k, r, s, padding=pad, dilation=dil, layout="nchw", epilogue=epi)
    assert op.q == op.w
    out, ref = _run(op, n * c + k + offset, offset, threads)
    assert rel_err(out, ref) < 1e-5


def test_nchw_direct_nonfinite():
    op = Conv2dOp(3, 24, 31, 27, 20, 3, 3, padding=1, layout="nchw", epilogue="bias+silu")
    out, ref = _run(op, 11, offset=2, nonfinite=True)
    assert nonfinite_mismatch(out, ref) is None


def test_nchw_direct_inf_weight_over_padding_gives_nan():
    """An Inf weight at a corner tap: the border outputs multiply it by the zero padding (NaN)."""
    op = Conv2dOp(1, 8, 9, 11, 8, 3, 3, padding=1, layout="nchw")
    rng = np.random.default_rng(5)
    x, wt = rand(rng, *op.x_shape), rand(rng, *op.w_shape)
    wt[3, 2, 0, 0] = np.inf
    out = _out_at(op.out_shape, 0)
    run_variant(CpuConv2dVariant(ISA_BY_NAME[BEST]), op, config(mr=6, nr=64, mc=48, nc=4096, kc=1024, indirect=3,
                                                                 threads=2), {"x": x, "w": wt, "bias": None}, out)
    with np.errstate(invalid="ignore"):
        ref = conv2d_ref(x, wt, op)
    assert np.isnan(ref[0, 3, 0, :]).all()
    assert nonfinite_mismatch(out, ref) is None


@pytest.mark.parametrize("op", [Conv2dOp(2, 16, 15, 15, 24, 3, 3, stride=2, padding=1, layout="nchw"),
                                Conv2dOp(2, 16, 12, 12, 32, 3, 3, padding=1, groups=2, layout="nchw"),
                                Conv2dOp(2, 16, 12, 13, 24, 3, 3, padding=0, layout="nchw"),
                                Conv2dOp(2, 16, 12, 13, 24, 3, 3, padding=1, layout="nhwc")],
                         ids=["stride2", "groups2", "narrower-output", "nhwc"])
def test_direct_falls_back_where_it_does_not_apply(op):
    assert not spaces.direct_nchw_ok(ISA_BY_NAME[BEST], op)
    out, ref = _run(op, 3)
    assert rel_err(out, ref) < 1e-5


def test_direct_hero_choice():
    variant = CpuConv2dVariant(ISA_BY_NAME[BEST])
    small_c = Conv2dOp(8, 64, 56, 56, 64, 3, 3, padding=1)
    many_c = Conv2dOp(8, 128, 28, 28, 128, 3, 3, padding=1)
    nhwc = dataclasses.replace(small_c, layout="nhwc")
    assert all(h.get("indirect") != 3 for h in variant.hero_configs(nhwc, PROFILE))
    assert 3 not in {c.get("indirect") for c in variant.search_space(nhwc, PROFILE)}
    assert variant.validate_config(small_c, config(mr=6, nr=64, mc=48, nc=4096, kc=1024, indirect=3), PROFILE)
    if BEST != "avx512":  # no direct kernel: never offered
        assert all(h.get("indirect") != 3 for h in variant.hero_configs(small_c, PROFILE))
        return
    pointwise = Conv2dOp(8, 512, 28, 28, 128, 1, 1)
    small_image = Conv2dOp(1, 64, 14, 14, 64, 3, 3, padding=1)
    for op, first in ((small_c, 3), (many_c, 1), (pointwise, 3), (small_image, 1),
                      (dataclasses.replace(pointwise, n=1, h=7, w=7), 1)):
        heroes = variant.hero_configs(op, PROFILE)
        assert heroes[0].get("indirect") == first, op
        assert any(h.get("indirect") == 3 for h in heroes) and any(h.get("indirect") == 1 for h in heroes)
    assert 3 in {c.get("indirect") for c in variant.search_space(small_c, PROFILE)}
