"""Tile widths of the Hopper GEMM beyond 64 / 128 / 256 (any multiple of 16 with a K-major B, 192 with an
MN-major one) and the rule that picks them (``variants/hopper_tiles.py``): the rule on the CPU, then GPU runs
against a float64 reference over odd shapes, dtypes, transposes, epilogues, output dtypes, the deferred
epilogue, split-K, TF32 and the bound (plan cache) path."""

from __future__ import annotations

import pytest

from tracea.doctor.profile import DeviceProfile
from tracea.ir.device import Device
from tracea.ir.ops import GemmOp

from tracea_cuda import testing as T
from tracea_cuda.device import isa_flags
from tracea_cuda.variants import all_variants, hopper_tiles
from tracea_cuda.variants.hopper import _hero

VARIANTS = {v.name: v for v in all_variants()}
H200 = DeviceProfile(Device("cuda", 0), "H200 (fake)", backend="cuda", arch="sm_90a", compute_units=132,
                     compute_capability=(9, 0), warp_size=32, max_threads_per_block=1024,
                     shared_mem_per_block=232448, registers_per_block=65536, isa=isa_flags((9, 0)),
                     bandwidth_gbs=4800.0)


def _bf16(m, n, k, trans_b=True, batch=1):
    return GemmOp(m, n, k, batch=batch, trans_b=trans_b, dtype_a="bfloat16", dtype_b="bfloat16")


def test_fill_rule_picks_the_width_that_fills_the_waves():
    v = VARIANTS["cuda.gemm.wgmma"]
    first = lambda op: v.hero_configs(op, H200)[0]  # noqa: E731
    # 512 x 5120: 80 tiles of 128 x 256 on 132 SMs; 128 x 160 makes 128 tiles (one wave)
    c = first(_bf16(512, 5120, 5120))
    assert (c.tile_m, c.tile_n) == (128, 160) and v.validate_config(_bf16(512, 5120, 5120), c, H200)
    assert hopper_tiles.tiles(_bf16(512, 5120, 5120), 128, 160) <= 132
    # 216 tiles of 128 x 256 fill 82% of two waves: the deep-ring narrow width (128 x 144, 5 stages, 384
    # tiles in three waves) replaces it (hopper_tiles.narrow_fill); the model's 128 x 224 is the runner-up
    assert [c.tile_n for c in v.hero_configs(_bf16(512, 13824, 5120), H200)[:2]] == [144, 224]
    # an MN-major B (a @ b, b stored (K, N)) is loaded in 64-column boxes; fill widths from 80 (from 128 there):
    # 1000^3 keeps its 128 x 128 tiles, M512 N6144 takes 128 x 192
    op = GemmOp(1000, 1000, 1000, dtype_a="float16", dtype_b="float16")
    assert first(op).tile_n == 128 and all(c.tile_n % 64 == 0 for c in v.hero_configs(op, H200))
    assert first(_bf16(512, 6144, 4096, trans_b=False)).tile_n == 192
    # shapes whose waves the rule's tiles fill already keep them
    for op in (_bf16(4096, 4096, 4096), _bf16(2048, 4096, 4096), _bf16(512, 4096, 4096), _bf16(512, 8192, 8192)):
        assert first(op).tile_n in (128, 256), op
    # split-K heroes are untouched
    assert first(_bf16(512, 1024, 8192)).get("split_k") == 4
    assert first(_bf16(128, 1024, 8192)).get("split_k") == 8 and first(_bf16(128, 1024, 8192)).tile_n == 64
    # one 128-row tile over a long K: narrower tiles put more SMs on the weight (128x48: 107 tiles, not 80)
    c = first(_bf16(128, 5120, 5120))
    assert (c.tile_n, c.get("split_k") or 1) == (48, 1)
    assert first(_bf16(128, 4096, 4096)).tile_n == 32 and first(_bf16(128, 13824, 5120)).tile_n == 112
    # partial row tiles and short K keep the rule's tiles
    assert first(_bf16(192, 4096, 4096)).tile_n in (64, 128, 256)
    assert first(_bf16(128, 3072, 768)).tile_n in (64, 128, 256)


def test_fill_widths_cost_and_stages():
    assert hopper_tiles.widths(False) == (64, 128, 192, 256) and hopper_tiles.widths(False, 80) == (128, 192, 256)
    assert hopper_tiles.widths(True, 32)[:2] == (32, 48)
    assert all(bn % 16 == 0 for bn in hopper_tiles.widths(True))
    for bn in hopper_tiles.widths(True):
        st = hopper_tiles.fill_stages(bn)
        assert 2 <= st <= 8 and st * (128 + bn) * 128 <= hopper_tiles.RING_BYTES
    assert [hopper_tiles.fill_stages(bn) for bn in (256, 128, 64)] == [4, 6, 8]  # the existing heroes' rings
    op = _bf16(512, 5120, 5120)
    assert hopper_tiles.grid_cost(op, 256, 128, 132) == hopper_tiles.grid_cost(op, 128, 256, 132)


def first_tiles(v, op):
    c = v.hero_configs(op, H200)[0]
    return c.tile_m, c.tile_n


def test_first_use_candidates_hold_other_tile_widths():
    """The first three heroes (what first-use tuning times) of a prefill GEMM hold the runners-up of the fill
    model next to the default, not near-copies of it; the default itself is the rule's."""
    v = VARIANTS["cuda.gemm.wgmma"]
    tiles = lambda op: [(c.tile_m, c.tile_n) for c in v.hero_configs(op, H200)[:3]]  # noqa: E731
    assert tiles(_bf16(1024, 14336, 4096)) == [(128, 224), (128, 176), (128, 128)]
    assert tiles(_bf16(512, 5120, 5120))[:2] == [(128, 160), (128, 176)]
    assert tiles(_bf16(2048, 5632, 2048)) == [(128, 176), (128, 240), (128, 256)]  # narrow_fill, runner-up, rule
    assert v.hero_configs(_bf16(2048, 5632, 2048), H200)[2].get("defer")  # the rule's deferred 128x256
    assert tiles(_bf16(2048, 2048, 2048))[:2] == [(256, 128), (128, 256)]
    heroes = v.hero_configs(_bf16(512, 4096, 4096), H200)
    assert [(c.tile_n, c.get("schedule")) for c in heroes[:2]] == [(128, "coop"), (128, "pingpong")]
    for op in (_bf16(2048, 11008, 4096), _bf16(1024, 5120, 5120), _bf16(4096, 1536, 8960)):
        heroes = v.hero_configs(op, H200)
        assert len({(c.tile_m, c.tile_n) for c in heroes[:3]}) == 3, op
        assert len(set(heroes)) == len(heroes) and all(v.validate_config(op, c, H200) for c in heroes)
    # decode and few-row GEMMs keep their lists (no alternatives below FILL_MIN_ROWS rows)
    assert hopper_tiles.fill_alternatives(_bf16(128, 5120, 5120), 132, True, (128, 64)) == []
    # the narrow fill: 128x256 grids with a poor last wave only, deep rings, K-major B, >= 256 rows
    assert hopper_tiles.narrow_fill(_bf16(2048, 11008, 4096), 132, True) == 176  # 688 tiles: 87% of 6 waves
    assert hopper_tiles.fill_stages(176) >= hopper_tiles.NARROW_FILL_STAGES > hopper_tiles.fill_stages(192)
    for op in (_bf16(2048, 4096, 11008), _bf16(4096, 14336, 4096), _bf16(3000, 4096, 4096), _bf16(128, 5632, 2048)):
        assert hopper_tiles.narrow_fill(op, 132, True) is None, op  # filled >= 97%, or too few rows
    assert hopper_tiles.narrow_fill(_bf16(2048, 11008, 4096, trans_b=False), 132, False) is None
    assert first_tiles(v, _bf16(2048, 13824, 5120)) == (128, 256)  # 93% of 7 waves: the rule's tile
    # alternatives never cost more than the rule's tile and never repeat it
    op = _bf16(2048, 11008, 4096)
    alts = hopper_tiles.fill_alternatives(op, 132, True, (128, 256))
    assert alts and 256 not in alts and len(alts) <= hopper_tiles.ALTERNATIVES
    assert all(hopper_tiles.grid_cost(op, 128, bn, 132) <= hopper_tiles.grid_cost(op, 128, 256, 132) for bn in alts)


@pytest.mark.parametrize("bn", [40, 8, 272, 160])
def test_kernel_declines_widths_it_cannot_serve(bn):
    v = VARIANTS["cuda.gemm.wgmma"]
    kmajor = _bf16(300, 500, 256)
    mn_major = _bf16(300, 500, 256, trans_b=False)
    ok = bn % 16 == 0 and 16 <= bn <= 256
    assert bool(v.validate_config(kmajor, _hero(bn, 4, cluster=1), H200)) == ok
    assert not v.validate_config(mn_major, _hero(bn, 4, cluster=1), H200)  # only 64-column multiples
    assert v.validate_config(mn_major, _hero(192, 4, cluster=1), H200)


_hopper = T.require_hopper


gpu = T.gpu_test


SHAPES = [(333, 1000, 520, 1, False, True), (129, 200, 72, 1, False, True), (257, 777, 1000, 2, True, True),
          (1000, 1000, 1000, 1, False, False)]
COMBOS = [("bfloat16", "bias+gelu", None), ("float16", "none", None), ("bfloat16", "bias+silu", "float32"),
          ("float16", "bias+relu", "bfloat16"), ("float32", "bias+gelu_erf", None)]


def _configs(direct: bool, defer_ok: bool) -> list:
    """Fill widths, then the other schedules / tile heights / split-K / clusters at widths that are not
    64-column multiples (a test case runs two of them: each config is one more compile)."""
    epi = {"smem_epilogue": not direct}
    out = [_hero(bn, hopper_tiles.fill_stages(bn), cluster=1, **epi) for bn in (32, 48, 80, 160, 176, 192, 224)]
    out += [_hero(96, 6, cluster=1, split_k=3, **epi), _hero(144, 6, bm=64, schedule="pingpong", cluster=1, **epi),
            _hero(112, 4, bm=256, cluster=1, **epi), _hero(160, 4, cluster=2, **epi)]  # 2 CTAs: 80 rows of B each
    if defer_ok:
        out.append(_hero(208, 3, 16, cluster=1, defer=True))
    return out


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "-".join(str(v) for v in c))
@gpu
def test_fill_widths_match_reference(shape, combo):
    profile = _hopper()
    dt, epilogue, out_dtype = combo
    m, n, k, batch, ta, tb = shape
    kw = {"fp32_precision": "high"} if dt == "float32" else {}
    op = GemmOp(m, n, k, batch=batch, trans_a=ta, trans_b=tb, dtype_a=dt, dtype_b=dt, epilogue=epilogue,
                dtype_out=out_dtype or dt, **kw)
    v = VARIANTS["cuda.gemm.wgmma_tf32" if dt == "float32" else "cuda.gemm.wgmma"]
    if v.check(op, profile):
        pytest.skip(f"declined: {v.check(op, profile)}")
    direct = dt == "float32" and not v.kmajor(v.kernel_op(op))[0]  # TF32 register-fed A: direct epilogue
    valid = [c for c in _configs(direct, dt != "float32" and (out_dtype or dt) != "float32" and n % 8 == 0)
             if v.validate_config(op, c, profile)]  # e.g. only 64-column multiples on an MN-major B
    i = SHAPES.index(shape) * len(COMBOS) + COMBOS.index(combo)
    configs = [valid[(2 * i) % len(valid)], valid[(2 * i + 1) % len(valid)]]  # every config over the cases
    tol = T.tolerance({"bfloat16": "bf16", "float16": "f16", "float32": "tf32"}[dt], op.out_dtype)
    T.check_gemm_configs(v, op, configs, tol, seed=m + n + k)


def test_every_test_config_is_valid_somewhere():
    """The rotation above runs each config on some case (none is invalid everywhere)."""
    kmajor = GemmOp(333, 1000, 520, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16")
    v = VARIANTS["cuda.gemm.wgmma"]
    assert all(v.validate_config(kmajor, c, H200) for c in _configs(False, True))


@gpu
def test_fill_hero_on_the_user_path_and_graph_replay():
    """``tracea.ops.matmul`` of a shape whose first hero is a fill width (untuned default), eager and
    replayed from a CUDA graph, against float64."""
    import torch

    import tracea

    profile = _hopper()
    x = torch.randn(512, 520, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(5120, 520, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(5120, device="cuda", dtype=torch.bfloat16)
    op = GemmOp(512, 5120, 520, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16", epilogue="bias+gelu")
    hero = VARIANTS["cuda.gemm.wgmma"].hero_configs(op, profile)[0]
    fill = hopper_tiles.fill_tile(op, profile.compute_units, True, (256, 128))
    if fill is not None:  # 128 x 160 on 132 SMs
        assert hero.tile_n == fill
    ref = torch.nn.functional.gelu(x.double() @ w.double().t() + bias.double(), approximate="tanh")
    out = tracea.ops.matmul(x, w.t(), bias=bias, activation="gelu", variant="cuda.gemm.wgmma", config=hero)
    assert T.rel_err(out, ref) <= 1e-2, hero.key
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o2 = tracea.ops.matmul(x, w.t(), bias=bias, activation="gelu", variant="cuda.gemm.wgmma", config=hero)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(o2, out)
