"""The column-split fp32 GEMM driver (``tr_drive_cols``, route ``cols``) against float64 on odd shapes, on
both L2 settings that chose its A path (``tr_set_caches``, restored afterwards): a packed A shared by the
threads (packed once, tile rows handed out from a counter) when it fits the per-core L2 budget, else a
private A block per thread. With the default unit stealing (``TR_COLS_STEAL``: a thread done with its
columns takes pieces of the others') A is always shared, so both settings must give the same results. Shapes cover K cut into
several equal blocks (not multiples of 8), N blocks smaller than a thread's columns (several ``jc`` steps),
M and N edges, transposed operands, batches, the fused epilogue, more threads than cores, and NaN / Inf."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tracea.testing import inject_nonfinite, nonfinite_mismatch
from tracea_cpu import kernels
from tracea_cpu.testing import HAVE_CC, ISAS, epilogue_ref, poisoned, rand

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")

#: register tiles to run: the Intel AVX-512 default and the AMD one (x86 AVX-512 only), else the ISA's
TILES = {"avx512": [(14, 32), (6, 64)], "avx2": [(6, 16)], "neon": [(8, 12)], "scalar": [(4, 4)]}
#: (m, n, k, trans_a, trans_b, batch, mc, nc, kc, threads)
SHAPES = [(61, 530, 47, False, False, 1, 112, 4096, 768, 2),
          (200, 1000, 1201, False, False, 1, 112, 4096, 512, 2),    # 3 K blocks of 401 -> 408
          (333, 777, 1537, True, False, 2, 56, 4096, 768, 2),       # 3 K blocks of 513 -> 520
          (297, 1300, 301, False, True, 1, 28, 96, 128, 2),         # several jc steps per thread
          (45, 900, 3, False, False, 1, 112, 4096, 768, 3),         # 3 threads, K < 8
          (300, 2051, 65, True, True, 1, 112, 200, 64, 4)]          # 4 threads on 2 cores


def _lib(isa: str, tile: tuple[int, int], epi: str) -> ctypes.CDLL:
    return kernels.blocked_library(isa, tile[0], tile[1], epi)


def _run(lib, m, n, k, ta, tb, batch, mc, nc, kc, threads, a, b, bias):
    out = poisoned((batch, m, n))
    rsa, csa = (1, m) if ta else (k, 1)
    rsb, csb = (1, k) if tb else (n, 1)
    ptr = lambda x: None if x is None else x.ctypes.data  # noqa: E731
    rc = lib.tr_gemm(batch, m, n, k, ptr(a), rsa, csa, m * k, ptr(b), rsb, csb, k * n, ptr(out), n, m * n, ptr(bias),
                     mc, nc, kc, threads)
    assert rc == 0
    return out


def _ref(m, n, k, ta, tb, batch, a, b, bias, epi):
    a64 = a.astype(np.float64).reshape(batch, *((k, m) if ta else (m, k)))
    b64 = b.astype(np.float64).reshape(batch, *((n, k) if tb else (k, n)))
    a64 = a64.transpose(0, 2, 1) if ta else a64
    b64 = b64.transpose(0, 2, 1) if tb else b64
    from tracea.ir.epilogue import Epilogue

    with np.errstate(invalid="ignore", over="ignore"):
        return epilogue_ref(a64 @ b64, Epilogue.parse(epi).steps, bias, axis=2)


@pytest.fixture
def l2_bytes():
    """Set the L2 size the loaded libraries read (forces a path of tr_drive_cols); restored afterwards."""
    touched = []

    def set_l2(lib, value: int) -> None:
        touched.append(lib)
        lib.tr_set_caches(0, value)

    yield set_l2
    for lib in touched:
        kernels.set_caches(lib)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shared", [True, False], ids=["shared-A", "private-A"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:3])))
def test_cols_driver_matches_float64(isa, shared, shape, l2_bytes):
    m, n, k, ta, tb, batch, mc, nc, kc, threads = shape
    epi = "bias+relu" if (m + n) % 2 else "none"
    for tile in TILES[isa]:
        lib = _lib(isa, tile, epi)
        assert kernels.GEMM_ROUTES[lib.tr_gemm_route(m, n, k, 1 if tb else n, k if tb else 1, threads)] == "cols"
        l2_bytes(lib, 1 << 40 if shared else 1)
        rng = np.random.default_rng(m * n + k)
        a, b = rand(rng, batch, *((k, m) if ta else (m, k))), rand(rng, batch, *((n, k) if tb else (k, n)))
        bias = rand(rng, n) if "bias" in epi else None
        out = _run(lib, m, n, k, ta, tb, batch, mc, nc, kc, threads, a, b, bias)
        ref = _ref(m, n, k, ta, tb, batch, a, b, bias, epi)
        err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        assert err < 2e-6, (isa, tile, shared, err)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-A", "private-A"])
def test_cols_driver_nonfinite(shared, l2_bytes):
    isa = ISAS[0]
    m, n, k = 77, 900, 530
    lib = _lib(isa, TILES[isa][0], "bias+silu")
    l2_bytes(lib, 1 << 40 if shared else 1)
    rng = np.random.default_rng(7)
    a, b, bias = rand(rng, 1, m, k), rand(rng, 1, k, n), rand(rng, n)
    inject_nonfinite(rng, a, 6)
    inject_nonfinite(rng, b, 6)
    out = _run(lib, m, n, k, False, False, 1, 112, 4096, 512, 2, a, b, bias)
    ref = _ref(m, n, k, False, False, 1, a, b, bias, "bias+silu")
    assert nonfinite_mismatch(out, ref) is None


@pytest.mark.parametrize("flags", [("-DTR_COLS_UNITS=1",), ("-DTR_COLS_UNITS=7",), ("-DTR_COLS_STEAL=0",)],
                         ids=["one-piece", "seven-pieces", "fixed-ranges"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:3])))
def test_cols_driver_variants_match_float64(flags, shape):
    """The column driver compiled with other piece counts (one piece a range: stealing whole ranges only;
    seven: pieces of zero or one panel on the narrow shapes) and with the fixed ranges of ``TR_COLS_STEAL=0``
    (the A/B baseline of the probes)."""
    from tracea.ir.epilogue import Epilogue
    from tracea_cpu.emit.blocked import blocked_source
    from tracea_cpu.isa import ISA_BY_NAME
    from tracea_cpu.toolchain import build

    m, n, k, ta, tb, batch, mc, nc, kc, threads = shape
    isa = ISA_BY_NAME[ISAS[0]]
    tile = TILES[isa.name][0]
    epi = "bias+relu" if (m + n) % 2 else "none"
    lib = build(blocked_source(isa, tile[0], tile[1], Epilogue.parse(epi)), tuple(isa.cflags) + flags,
                f"test-cols-{isa.name}")
    lib.tr_gemm.argtypes = kernels.GEMM_ARGTYPES
    lib.tr_gemm.restype = ctypes.c_int
    lib.tr_gemm_route.argtypes = [ctypes.c_long] * 5 + [ctypes.c_int]
    kernels.set_caches(lib)
    assert kernels.GEMM_ROUTES[lib.tr_gemm_route(m, n, k, 1 if tb else n, k if tb else 1, threads)] == "cols"
    rng = np.random.default_rng(m + n * k)
    a, b = rand(rng, batch, *((k, m) if ta else (m, k))), rand(rng, batch, *((n, k) if tb else (k, n)))
    bias = rand(rng, n) if "bias" in epi else None
    for _ in range(3):  # (which thread takes which piece changes from call to call)
        out = _run(lib, m, n, k, ta, tb, batch, mc, nc, kc, threads, a, b, bias)
        ref = _ref(m, n, k, ta, tb, batch, a, b, bias, epi)
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-6, flags


@pytest.mark.parametrize("isa", ISAS)
def test_cols_route_few_panels_small_a(isa, l2_bytes):
    """Fewer than ``TR_COLS_MIN_PANELS`` panels a thread: the column driver while the packed A fits
    ``TR_COLS_FEW_A`` L2s (every thread reads all of it) on ``TR_COLS_FEW_T`` threads or more, the packed
    driver otherwise; results match float64 either way (on more threads than cores, panels a thread
    between one and two)."""
    tile = TILES[isa][0]
    lib = _lib(isa, tile, "bias+relu")
    threads, nr = 8, tile[1]
    m, n, k = 6 * tile[0] + 5, 9 * nr + 3, 300  # 10 panels for 8 threads
    rng = np.random.default_rng(n + k)
    a, b, bias = rand(rng, 1, m, k), rand(rng, 1, k, n), rand(rng, n)
    ref = _ref(m, n, k, False, False, 1, a, b, bias, "bias+relu")
    for l2, route in ((1 << 40, "cols"), (m * k * 4 // 8 - 1, "packed")):  # (TR_COLS_FEW_A = 8 L2s)
        l2_bytes(lib, l2)
        assert kernels.GEMM_ROUTES[lib.tr_gemm_route(m, n, k, n, 1, threads)] == route
        out = _run(lib, m, n, k, False, False, 1, 112, 4096, 512, threads, a, b, bias)
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-6, route
    l2_bytes(lib, 1 << 40)
    assert kernels.GEMM_ROUTES[lib.tr_gemm_route(m, nr * (threads - 1), k, n, 1, threads)] == "packed"  # < a panel each
    assert kernels.GEMM_ROUTES[lib.tr_gemm_route(m, 3 * nr, k, n, 1, 2)] == "packed"  # 2 threads: 1.5 panels each
