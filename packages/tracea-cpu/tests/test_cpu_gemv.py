"""The packing-free drivers of the fp32 GEMM for a few rows: GEMV (B columns contiguous along k:
nn.Linear weights stored N x K) and axpy (B stored K x N). float64 reference, NaN-poisoned outputs,
odd K and N, every epilogue, batch, both B layouts, every ISA this machine runs, and the routing that
decides when each driver runs."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.ir.ops import GemmOp
from tracea_cpu import kernels
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.spaces import GEMM_HEROES
from tracea_cpu.testing import BEST, HAVE_CC, ISAS, config, epilogue_ref, gemm_error, rand, rel_err
from tracea_cpu.variants import CpuGemmVariant

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")

ODD = [1, 7, 33, 129, 1000]
EPILOGUES = ["bias", "relu", "bias+gelu_tanh", "gelu_erf", "bias+silu", "bias+relu+gelu_erf"]


def _hero(isa: str, threads: int = 2):
    return config(**GEMM_HEROES[isa][0], threads=threads)


def route(isa: str, m: int, n: int, k: int, *, tb: bool = True, threads: int = 2) -> str:
    """The driver tr_gemm takes for this shape (as the variant calls it: rsb = 1 when B is N x K)."""
    hero = GEMM_HEROES[isa][0]
    lib = kernels.blocked_library(isa, hero["mr"], hero["nr"], "none")
    rsb, csb = (1, k) if tb else (n, 1)
    return kernels.GEMM_ROUTES[lib.tr_gemm_route(m, n, k, rsb, csb, threads)]


def gemv_case(isa: str, m: int, n: int, k: int, *, batch=1, ta=False, tb=True, epi="none", threads=2, seed=0):
    op = GemmOp(m, n, k, batch=batch, trans_a=ta, trans_b=tb, epilogue=epi)
    return gemm_error(CpuGemmVariant(ISA_BY_NAME[isa]), op, _hero(isa, threads), seed)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_gemv_odd_shapes_every_isa(isa, m):
    for n in ODD:
        for k in ODD:
            if isa == "scalar" and n * k > 200_000:
                continue
            assert route(isa, m, n, k) == "gemv"
            assert gemv_case(isa, m, n, k, seed=n + k) < 1e-5, (m, n, k)


@pytest.mark.parametrize("epi", EPILOGUES)
def test_gemv_every_epilogue(epi):
    for m, n, k in [(1, 1000, 129), (3, 33, 1000), (4, 7, 7), (2, 129, 33)]:
        assert gemv_case(BEST, m, n, k, epi=epi, seed=m * n) < 1e-5, (epi, m, n, k)


@pytest.mark.parametrize("isa", [i for i in ISAS if i != BEST])
def test_gemv_epilogue_other_isas(isa):
    for m, n, k in [(1, 129, 1000), (3, 33, 7)]:
        assert gemv_case(isa, m, n, k, epi="bias+gelu_erf") < 1e-5, (m, n, k)


@pytest.mark.parametrize("isa", ISAS)
def test_gemv_batched_transposed_a_one_and_two_threads(isa):
    for threads in (1, 2):
        assert gemv_case(isa, 3, 129, 33, batch=3, ta=True, epi="bias", threads=threads) < 1e-5
        assert gemv_case(isa, 1, 1000, 129, batch=2, threads=threads) < 1e-5


def test_gemv_wide_rows_with_deep_k():
    # 5..64 rows take the GEMV driver only when K is deep enough (groups of four rows reuse the weights):
    # up to 16 rows from K = 256, up to 64 from K = 1024.
    for m, k in [(5, 257), (16, 300), (17, 1024), (64, 1031)]:
        assert route(BEST, m, 1000, k) == "gemv"
        assert gemv_case(BEST, m, 1000, k, epi="bias+silu", seed=m) < 1e-5, m
    for m, k in [(65, 4096), (17, 1023), (8, 64)]:
        assert route(BEST, m, 1000, k) != "gemv"


def test_gemv_b_not_transposed_single_column():
    # B stored K x N with one column: that column is contiguous along k (GEMV).
    assert route(BEST, 3, 1, 1000, tb=False) == "gemv"
    assert gemv_case(BEST, 3, 1, 1000, tb=False, epi="bias+relu") < 1e-5


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_axpy_b_not_transposed_odd_shapes_every_isa(isa, m):
    # B stored K x N (A @ W): up to four rows take the axpy driver; odd N exercises the column tails.
    for n in [7, 33, 129, 1000, 2100]:
        for k in [1, 3, 7, 33, 1000]:
            if isa == "scalar" and n * k > 200_000:
                continue
            assert route(isa, m, n, k, tb=False) == "axpy"
            assert gemv_case(isa, m, n, k, tb=False, seed=n * k) < 1e-5, (m, n, k)


@pytest.mark.parametrize("epi", EPILOGUES)
def test_axpy_every_epilogue_batched_transposed_a(epi):
    for m, n, k, ta in [(1, 1000, 129, False), (4, 33, 1000, True), (3, 2100, 7, True)]:
        assert gemv_case(BEST, m, n, k, tb=False, ta=ta, batch=2, epi=epi, seed=m * n) < 1e-5, (epi, m, n, k)
    for isa in ISAS:
        assert gemv_case(isa, 2, 129, 1000, tb=False, epi="bias+gelu_erf") < 1e-5
    assert route(BEST, 5, 129, 1000, tb=False) != "axpy"


def test_gemv_concurrent_calls_with_transposed_a():
    # trans_a copies A into the shared workspace: concurrent callers must not share it.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=4) as pool:
        errors = list(pool.map(lambda s: gemv_case(BEST, 4, 257, 300 + s, ta=True, seed=s), range(8)))
    assert max(errors) < 1e-5, errors


def test_gemv_python_rule_matches_compiled_route():
    # The variant trims its heroes and search space by unpacked_driver: it must agree with tr_gemm.
    from tracea_cpu.emit.gemv import unpacked_driver

    for m in (1, 3, 4, 5, 16, 17, 64, 65, 200):
        for n in (1, 7, 1000):
            for k in (1, 64, 255, 256, 1023, 1024, 4096):
                for tb in (False, True):
                    want = unpacked_driver(m, n, k, tb)
                    got = route(BEST, m, n, k, tb=tb)
                    assert got == want or (want is None and got in ("packed", "rows", "cols")), (m, n, k, tb, got)


def test_gemv_ops_get_one_hero_and_a_threads_only_space():
    from tracea_cpu.testing import PROFILE

    v = CpuGemmVariant(ISA_BY_NAME[BEST])
    linear = GemmOp(1, 4096, 4096, trans_b=True)
    assert len(v.hero_configs(linear, PROFILE)) == 1
    space = list(v.search_space(linear, PROFILE))
    assert 1 <= len(space) <= 2 and len({(c.get("mr"), c.get("nr")) for c in space}) == 1
    square = GemmOp(64, 64, 64)
    from tracea_cpu.spaces import gemm_hero_table

    assert len(v.hero_configs(square, PROFILE)) == len(gemm_hero_table(ISA_BY_NAME[BEST], PROFILE))
    assert len(list(v.search_space(square, PROFILE))) > 2


def test_gemv_threads_follow_weight_bytes(monkeypatch):
    from tracea_cpu.testing import PROFILE
    from tracea_cpu.variants import GEMV_THREADS_BYTES

    monkeypatch.delenv("TRACEA_NUM_THREADS", raising=False)
    v = CpuGemmVariant(ISA_BY_NAME[BEST])
    cfg = _hero(BEST, threads=0)
    big = GemmOp(1, 1024, 1024, trans_b=True)  # 4 MiB of weights, 2 MFLOP: memory-bound
    assert 4 * 1024 * 1024 >= GEMV_THREADS_BYTES > 4 * 512 * 512
    assert v.threads(GemmOp(1, 512, 512, trans_b=True), cfg, PROFILE) == 1  # 1 MiB: not worth a wake-up
    assert v.threads(big, cfg, PROFILE) == max(1, PROFILE.compute_units)
    assert v.threads(GemmOp(1, 64, 64, trans_b=True), cfg, PROFILE) == 1
    assert v.threads(big, _hero(BEST, threads=1), PROFILE) == 1


def test_gemv_through_dispatch_with_transposed_weights_view(tmp_path, monkeypatch):
    # tracea.ops.matmul(x, W.T): the transposed view reaches the kernel as trans_b (no copy) and runs
    # the GEMV driver with the fused epilogue.
    from tracea import ops

    monkeypatch.setenv("TRACEA_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(7)
    x, w, bias = rand(rng, 3, 1000), rand(rng, 129, 1000), rand(rng, 129)
    out = ops.matmul(x, w.T, bias=bias, activation="silu", variant=f"cpu.gemm.{BEST}", config=_hero(BEST, 0))
    ref = epilogue_ref(x.astype(np.float64) @ w.astype(np.float64).T, ["bias", "silu"], bias, axis=1)
    assert rel_err(out, ref) < 1e-5
