"""The hero order of the Hopper conv (``cuda.conv2d.wgmma``) on convs whose 128x128 grid is under two waves
(``variants/hopper_conv.py``: :func:`few_wave_cost`), checked on the CPU against the tiles measured fastest on an
H100 (``benchmarks/cuda/probe_conv_tiles.py``)."""

from __future__ import annotations

import pytest

from tracea.doctor.profile import DeviceProfile
from tracea.ir.device import Device
from tracea.ir.ops import Conv2dOp

from tracea_cuda.device import isa_flags
from tracea_cuda.variants import all_variants
from tracea_cuda.variants.hopper_conv import FEW_WAVE_SHARE, few_wave_cost

VARIANT = {v.name: v for v in all_variants()}["cuda.conv2d.wgmma"]
H100 = DeviceProfile(Device("cuda", 0), "H100 (fake)", backend="cuda", arch="sm_90a", compute_units=132,
                     compute_capability=(9, 0), warp_size=32, max_threads_per_block=1024,
                     shared_mem_per_block=232448, registers_per_block=65536, isa=isa_flags((9, 0)),
                     bandwidth_gbs=3350.0)


def _first(batch, c, k, h, r, layout="nhwc", dtype="float16"):
    op = Conv2dOp(batch, c, h, h, k, r, r, padding=r // 2, layout=layout, dtype=dtype, fp32_precision="high")
    heroes = VARIANT.hero_configs(op, H100)
    assert all(VARIANT.validate_config(op, cfg, H100) for cfg in heroes)
    first = heroes[0]
    return first.tile_m, first.tile_n, first.get("schedule")


# (batch, C, K, H, R) -> the tile measured fastest on an H100 (CUDA graphs, fp16 channels_last; stop 42)
MEASURED = [((32, 160, 160, 14, 3), (128, 128, "coop")),  # 98 tiles: one wave; 64x128 made two (26.2 vs 15.6 us)
            ((32, 192, 192, 14, 3), (128, 128, "coop")),
            ((32, 256, 256, 14, 3), (128, 128, "coop")),
            ((32, 96, 96, 28, 3), (128, 128, "coop")),
            ((32, 512, 512, 7, 3), (64, 128, "pingpong")),  # 52 tiles of 128x128: 104 of 64x128 use twice the SMs
            ((32, 2048, 512, 7, 1), (64, 128, "pingpong")),
            ((8, 128, 128, 28, 3), (64, 128, "pingpong")),
            ((8, 160, 160, 14, 3), (64, 64, "pingpong")),
            ((1, 512, 512, 7, 3), (64, 64, "pingpong")),
            ((1, 256, 256, 14, 3), (64, 64, "pingpong")),
            ((8, 144, 144, 28, 3), (128, 128, "coop"))]


@pytest.mark.parametrize("shape,tile", MEASURED, ids=lambda v: "x".join(map(str, v)) if isinstance(v[0], int) else None)
def test_few_wave_rule_picks_the_measured_tile(shape, tile):
    assert _first(*shape) == tile


def test_few_wave_rule_applies_to_nchw_and_fp32_and_keeps_split_and_wide_rules():
    # the NCHW (transposed) path and TF32 order the tiles the same way
    assert _first(32, 160, 160, 14, 3, layout="nchw", dtype="float32") == (128, 128, "coop")
    # a long reduction over few tiles keeps its split-K hero first
    op = Conv2dOp(1, 1024, 7, 7, 1024, 3, 3, padding=1, layout="nhwc", dtype="float16")
    assert (VARIANT.hero_configs(op, H100)[0].get("split_k") or 1) > 1
    # grids of two waves and more keep the wide-tile order, narrow outputs the 64-wide heroes
    assert _first(32, 64, 256, 56, 1)[:2] in ((128, 256), (128, 128))
    assert _first(32, 64, 64, 56, 3)[1] == 64


def test_few_wave_cost_counts_the_busiest_cta():
    cfg = VARIANT.hero_configs(Conv2dOp(32, 160, 14, 14, 160, 3, 3, padding=1, layout="nhwc", dtype="float16"), H100)
    by_tile = {(c.tile_m, c.tile_n, c.get("schedule")): c for c in cfg}
    big, pp = by_tile[(128, 128, "coop")], by_tile[(64, 128, "pingpong")]
    # 6272 x 160: 98 tiles of 128x128 (one round), 196 of 64x128 (two rounds on 132 CTAs)
    assert few_wave_cost(6272, 160, big, 132) == 128 * 128 / FEW_WAVE_SHARE[(128, 128, "coop")]
    assert few_wave_cost(6272, 160, pp, 132) == 2 * 64 * 128 / FEW_WAVE_SHARE[(64, 128, "pingpong")]
    # more CTAs: one round each, the narrower tile wins
    assert few_wave_cost(6272, 160, pp, 264) < few_wave_cost(6272, 160, big, 264)
