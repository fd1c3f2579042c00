"""conv2d variants against a float64 reference: both layouts, stride, padding, dilation, groups,
fused bias + activation, every ISA this machine runs, small blocks to take every packing path."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tracea.ir.ops import Conv2dOp
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu import spaces
from tracea_cpu.spaces import GEMM_HEROES
from tracea_cpu.testing import (BEST, HAVE_CC, ISAS, config, conv2d_ref, epilogue_ref, poisoned, rand, rel_err,
                                run_variant)
from tracea_cpu.variants import CpuConv2dVariant

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")

# (n, c, h, w, k, r, s, stride, padding, dilation, groups)
CASES = [
    (1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1),
    (2, 3, 9, 11, 5, 3, 3, 1, 1, 1, 1),
    (1, 8, 13, 10, 17, 3, 3, 2, 1, 1, 1),
    (2, 6, 12, 12, 9, 3, 2, (2, 1), (0, 2), (2, 1), 3),
    (1, 16, 7, 7, 32, 1, 1, 1, 0, 1, 1),
    (1, 4, 15, 15, 4, 5, 5, 3, 2, 2, 4),
    (3, 5, 6, 40, 7, 3, 3, 1, 1, 1, 1),
]


def conv_case(isa, case, layout, epi="none", cfg=None, seed=0):
    n, c, h, w, k, r, s, st, pad, dil, g = case
    op = Conv2dOp(n, c, h, w, k, r, s, stride=st, padding=pad, dilation=dil, groups=g, layout=layout, epilogue=epi)
    rng = np.random.default_rng(seed)
    x, wt = rand(rng, *op.x_shape), rand(rng, *op.w_shape)
    bias = rand(rng, op.k) if op.epilogue.has_bias else None
    out = poisoned(op.out_shape)
    cfg = cfg or config(**GEMM_HEROES[isa][0], threads=0)
    run_variant(CpuConv2dVariant(ISA_BY_NAME[isa]), op, cfg, {"x": x, "w": wt, "bias": bias}, out)
    ref = epilogue_ref(conv2d_ref(x, wt, op), op.epilogue.steps, bias, axis=1 if layout == "nchw" else 3)
    return rel_err(out, ref)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("case", CASES)
def test_conv2d_shapes(case, layout):
    assert conv_case(BEST, case, layout) < 1e-5


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("epi", ["bias+relu", "bias+gelu_erf", "silu"])
def test_conv2d_epilogues(layout, epi):
    assert conv_case(BEST, CASES[3], layout, epi=epi, seed=1) < 1e-5
    assert conv_case(BEST, CASES[2], layout, epi=epi, seed=2) < 1e-5


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_conv2d_small_blocks(layout):
    h = GEMM_HEROES[BEST][0]
    cfg = config(mr=h["mr"], nr=h["nr"], mc=h["mr"], nc=h["nr"], kc=8, threads=2)
    for case in (CASES[1], CASES[3], (2, 24, 10, 10, 40, 3, 3, 1, 1, 1, 1)):
        assert conv_case(BEST, case, layout, epi="bias+relu", cfg=cfg) < 1e-5, case


@pytest.mark.parametrize("isa", [i for i in ISAS if i != BEST])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_conv2d_other_isas(isa, layout):
    assert conv_case(isa, CASES[3], layout, epi="bias+relu") < 1e-5
    assert conv_case(isa, CASES[1], layout, epi="bias+relu") < 1e-5
    # every algorithm, with the scalar fallbacks of the AVX-512-only transposes (NCHW channel blocks,
    # transposed tile stores) and the padding-tap skips
    h = GEMM_HEROES[isa][0]
    for indirect in (0, 1, 2):
        for kc in (7, 1024):
            cfg = config(**dict(h, kc=kc), threads=2, indirect=indirect)
            for case in [(2, 24, 7, 7, 20, 3, 3, 1, 1, 1, 1), (1, 16, 9, 8, 12, 3, 3, 2, 2, 2, 2)]:
                assert conv_case(isa, case, layout, epi="bias+silu", cfg=cfg) < 1e-5, (indirect, kc, case)


def test_conv2d_resnet_layer_shape():
    assert conv_case(BEST, (1, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1), "nchw", epi="bias+relu") < 1e-5
    assert conv_case(BEST, (1, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1), "nhwc", epi="bias+relu") < 1e-5


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("indirect", [0, 1, 2])
def test_conv2d_indirect_and_packed_paths(indirect, layout):
    h = GEMM_HEROES[BEST][0]
    small = config(mr=h["mr"], nr=h["nr"], mc=2 * h["mr"], nc=h["nr"], kc=24, threads=2, indirect=indirect)
    for case in [(2, 16, 9, 11, 40, 3, 3, 1, 1, 1, 1), (1, 24, 12, 12, 18, 3, 2, (2, 1), (0, 2), (2, 1), 3),
                 (2, 8, 7, 7, 33, 1, 1, 1, 0, 1, 1),
                 # many channels per group, not a multiple of the vector width
                 (1, 72, 6, 5, 20, 3, 3, 1, 1, 1, 1), (2, 80, 5, 6, 18, 3, 3, 2, 1, 2, 2),
                 # channel runs shorter than a vector (any algorithm must accept any config)
                 (2, 6, 8, 9, 10, 3, 3, 1, 1, 1, 2)]:
        assert conv_case(BEST, case, layout, epi="bias+silu", cfg=small) < 1e-5, case
        cfg = config(**h, threads=0, indirect=indirect)
        assert conv_case(BEST, case, layout, epi="bias+relu", cfg=cfg) < 1e-5, case


@pytest.mark.parametrize("isa", [i for i in ("avx512", "avx2") if i in ISAS])
def test_conv2d_packed_nchw_stride_two_rows(isa):
    """NCHW packed im2col (indirect=0) at stride 2: the even-column gather (16 at a time from two vectors on
    AVX-512) on rows wide enough for it, odd and even widths, padding 0-3 (spans clipped at both ends), stems."""
    h = GEMM_HEROES[isa][0]
    cfg = config(**h, threads=0, indirect=0)
    for case in [(1, 3, 40, 112, 16, 7, 7, 2, 3, 1, 1), (2, 3, 9, 67, 8, 7, 7, 2, 3, 1, 1),
                 (1, 5, 6, 130, 9, 3, 3, 2, 0, 1, 1), (1, 4, 5, 97, 6, 3, 3, 2, 1, 1, 1),
                 (1, 2, 4, 65, 3, 5, 5, (1, 2), (2, 2), 1, 1), (1, 3, 8, 33, 4, 3, 3, 2, 2, 2, 1)]:
        assert conv_case(isa, case, "nchw", epi="bias+relu", cfg=cfg) < 1e-5, case


def test_packed_stem_hero_takes_one_m_block_and_matches_reference():
    """The packed NCHW hero of a conv with few output channels against many pixels (stems) covers all of M with one
    M block (``spaces.whole_m_block``: the threads split B's panels), and computes the reference at stride 1 / 2,
    with M not a multiple of the tile (20, 64 -> mc 24 / 66 with 6-row tiles), on 1 and 2 threads; convs with many
    output channels or few pixels keep the table's mc."""
    from tracea_cpu.testing import PROFILE
    variant = CpuConv2dVariant(ISA_BY_NAME[BEST])
    stem = Conv2dOp(1, 3, 112, 112, 64, 7, 7, stride=2, padding=3)
    packed = next(h for h in variant.hero_configs(stem, PROFILE) if h.get("indirect") == 0)
    assert packed.get("mc") >= 64 and packed.get("mc") % packed.get("mr") == 0
    table_mc = GEMM_HEROES[BEST][0]["mc"]
    for op in (Conv2dOp(1, 3, 8, 8, 64, 3, 3, padding=1), Conv2dOp(1, 3, 112, 112, 512, 7, 7, stride=2, padding=3)):
        h = next(h for h in variant.hero_configs(op, PROFILE) if h.get("indirect") == 0)
        assert h.get("mc") == table_mc, op.describe()
    for case in [(1, 3, 41, 37, 64, 7, 7, 2, 3, 1, 1), (2, 3, 30, 30, 20, 3, 3, 1, 1, 1, 1), (1, 4, 33, 35, 64, 3, 3, 1, 1, 1, 1)]:
        n, c, h, w, k, r, s, st, pad, dil, g = case
        op = Conv2dOp(n, c, h, w, k, r, s, stride=st, padding=pad)
        hero = next(x for x in variant.hero_configs(op, PROFILE) if x.get("indirect") == 0)
        assert hero.get("mc") >= k, (case, hero.key)
        for threads in (1, 2):
            cfg = hero.with_params(threads=threads)
            assert conv_case(BEST, case, "nchw", epi="bias+relu", cfg=cfg) < 1e-5, (case, threads)


def test_conv2d_algorithm_choice_and_validation():
    from tracea_cpu.testing import PROFILE
    variant = CpuConv2dVariant(ISA_BY_NAME[BEST])
    few = Conv2dOp(1, 512, 7, 7, 512, 3, 3, padding=1)
    many = Conv2dOp(8, 64, 56, 56, 64, 3, 3, padding=1, layout="nhwc")
    for layout in ("nchw", "nhwc"):
        heroes = variant.hero_configs(dataclasses.replace(few, layout=layout), PROFILE)
        assert heroes[0].get("indirect") == 1
        assert any(h.get("indirect") == 2 for h in heroes)
        if BEST == "avx512":  # small images: a tile that is one output row first (skips padding taps)
            assert 7 % heroes[0].get("mr") == 0
    assert variant.hero_configs(many, PROFILE)[0].get("indirect") == 1
    assert any(h.get("indirect") == 2 for h in variant.hero_configs(many, PROFILE))
    # 3: the direct NCHW algorithm, offered where it applies (AVX-512 / AVX2, stride 1, q == w)
    direct = {3} if BEST in spaces.DIRECT_NCHW_ISAS else set()
    assert {c.get("indirect") for c in variant.search_space(few, PROFILE)} == {0, 1, 2} | direct
    assert {c.get("indirect") for c in variant.search_space(many, PROFILE)} == {0, 1, 2}
    bad = config(**GEMM_HEROES[BEST][0], threads=0, indirect=4)
    assert not variant.validate_config(few, bad, PROFILE)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_conv2d_weights_stationary_resnet_tail(layout):
    """The 512@7^2-like shape the weights-stationary path is chosen for, with every epilogue step on."""
    h = GEMM_HEROES[BEST][0]
    cfg = config(**h, threads=0, indirect=2)
    assert conv_case(BEST, (1, 96, 7, 7, 130, 3, 3, 1, 1, 1, 1), layout, epi="bias+gelu_tanh", cfg=cfg) < 1e-5
    assert conv_case(BEST, (2, 64, 5, 5, 72, 3, 3, 1, 1, 1, 2), layout, epi="bias+relu", cfg=cfg, seed=3) < 1e-5


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("tile", [(7, 48), (7, 32), (14, 32)])
def test_conv2d_row_tiles_skip_padding_taps(tile, layout):
    """Tiles that are whole output rows skip the taps reading only padding; tiles straddling rows or
    images, taps where every pixel reads padding (1x1 kernel, padding 1: border outputs are bias only),
    and the NCHW channel blocks (one block, several, an uneven last one) must all stay exact."""
    if ISA_BY_NAME[BEST].width != 16:
        pytest.skip("AVX-512 tiles")
    mr, nr = tile
    for kc in (4608, 9 * 5, 7):
        cfg = config(mr=mr, nr=nr, mc=2 * mr, nc=4 * nr, kc=kc, threads=2, indirect=1)
        for case in [(2, 24, 7, 7, 50, 3, 3, 1, 1, 1, 1), (1, 16, 14, 14, 40, 3, 3, 1, 1, 1, 1),
                     (3, 16, 5, 5, 20, 1, 1, 1, 1, 1, 1), (2, 32, 9, 9, 48, 3, 3, 1, 2, 2, 2),
                     (1, 40, 15, 13, 17, 3, 3, 2, 1, 1, 1)]:
            assert conv_case(BEST, case, layout, epi="bias+gelu_tanh", cfg=cfg) < 1e-5, (case, kc)
