"""GEMM variants against a float64 NumPy reference: odd shapes, transposes, batch, every epilogue,
every ISA this machine runs, and small cache blocks so every blocking loop and edge path is taken."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.ir.ops import GemmOp
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.spaces import GEMM_HEROES
from tracea_cpu.testing import (BEST, HAVE_CC, ISAS, PROFILE, config, poisoned, rel_err, run_gemm,
                                run_variant)
from tracea_cpu.variants import CpuGemmVariant

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")

SHAPES = [(1, 1, 1), (17, 33, 65), (31, 7, 13), (64, 64, 64), (97, 131, 257), (2, 97, 3), (13, 61, 1)]


def gemm_case(isa: str, m: int, n: int, k: int, *, batch=1, ta=False, tb=False, epi="none", cfg=None, seed=0):
    op = GemmOp(m, n, k, batch=batch, trans_a=ta, trans_b=tb, epilogue=epi)
    cfg = cfg or config(**GEMM_HEROES[isa][0], threads=0)
    out, ref, _, _ = run_gemm(CpuGemmVariant(ISA_BY_NAME[isa]), op, cfg, seed)
    return rel_err(out, ref)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape", SHAPES)
def test_gemm_shapes_every_isa(isa, shape):
    assert gemm_case(isa, *shape) < 1e-5


@pytest.mark.parametrize("isa", ISAS)
def test_gemm_small_blocks_exercise_every_loop(isa):
    mr, nr = GEMM_HEROES[isa][0]["mr"], GEMM_HEROES[isa][0]["nr"]
    cfg = config(mr=mr, nr=nr, mc=2 * mr, nc=2 * nr, kc=16, threads=2)
    for shape in [(5 * mr + 3, 3 * nr + 5, 61), (2 * mr, 2 * nr, 32), (mr - 1, nr + 1, 17)]:
        assert gemm_case(isa, *shape, cfg=cfg, epi="bias+relu") < 1e-5, shape


@pytest.mark.parametrize("ta,tb", [(True, False), (False, True), (True, True)])
def test_gemm_transposes(ta, tb):
    for shape in [(17, 33, 65), (64, 48, 40)]:
        assert gemm_case(BEST, *shape, ta=ta, tb=tb) < 1e-5


def test_gemm_batched_transposed_with_bias():
    assert gemm_case(BEST, 23, 45, 37, batch=3, ta=True, epi="bias") < 1e-5


@pytest.mark.parametrize("epi", ["bias", "relu", "bias+gelu_tanh", "gelu_erf", "bias+silu", "bias+relu+gelu_erf"])
def test_gemm_epilogues(epi):
    for shape in [(17, 33, 65), (40, 64, 32)]:
        assert gemm_case(BEST, *shape, epi=epi, seed=3) < 1e-5, (epi, shape)


@pytest.mark.parametrize("isa", [i for i in ISAS if i != BEST])
def test_gemm_epilogue_other_isas(isa):
    assert gemm_case(isa, 29, 37, 41, epi="bias+gelu_erf") < 1e-5


@pytest.mark.parametrize("hero", range(len(GEMM_HEROES[BEST])))
def test_gemm_every_hero_tile(hero):
    cfg = config(**GEMM_HEROES[BEST][hero], threads=0)
    assert gemm_case(BEST, 53, 101, 77, cfg=cfg, epi="silu") < 1e-5


def test_gemm_large_multi_threaded():
    assert gemm_case(BEST, 300, 257, 600, epi="bias") < 1e-5


def test_gemm_rejects_bad_config():
    v = CpuGemmVariant(ISA_BY_NAME[BEST])
    bad = config(mr=64, nr=64, mc=128, nc=128, kc=64)
    assert not v.validate_config(GemmOp(8, 8, 8), bad, PROFILE)
    assert "registers" in v.validate_config(GemmOp(8, 8, 8), bad, PROFILE).reason


def test_gemm_run_with_invalid_config_raises_tracea_error():
    from tracea.errors import UnsupportedConfigError

    v = CpuGemmVariant(ISA_BY_NAME[BEST])
    op = GemmOp(8, 8, 8)
    a = np.ones((8, 8), np.float32)
    with pytest.raises(UnsupportedConfigError, match="registers"):
        run_variant(v, op, config(mr=64, nr=64, mc=128, nc=128, kc=64), {"a": a, "b": a, "bias": None},
                    poisoned((8, 8)))


def test_gemm_concurrent_calls_from_python_threads():
    # ctypes releases the GIL; concurrent calls must not share the packing workspace.
    from concurrent.futures import ThreadPoolExecutor

    def one(seed):
        return gemm_case(BEST, 61 + seed, 70, 90 + seed, epi="bias+relu", seed=seed)

    with ThreadPoolExecutor(max_workers=4) as pool:
        errors = list(pool.map(one, range(8)))
    assert max(errors) < 1e-5, errors


@pytest.mark.parametrize("isa", ISAS)
def test_gemm_few_rows_against_transposed_weights(isa):
    # M <= 256 with a transposed B (nn.Linear weights) and enough panels takes the per-thread-panel
    # driver: one K block and several, edges in M, N and K, batch, bias.
    mr, nr = GEMM_HEROES[isa][0]["mr"], GEMM_HEROES[isa][0]["nr"]
    for kc in (1024, 16):
        cfg = config(mr=mr, nr=nr, mc=2 * mr, nc=4 * nr, kc=kc, threads=2)
        for shape in [(1, 4 * nr + 3, 129), (7, 5 * nr, 64), (100, 4 * nr + 1, 77), (256, 4 * nr, 33)]:
            err = gemm_case(isa, *shape, tb=True, cfg=cfg, epi="bias+relu", batch=2)
            assert err < 1e-5, (shape, kc)
