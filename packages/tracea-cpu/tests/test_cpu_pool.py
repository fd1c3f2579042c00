"""Tracea's CPU worker pool (``tracea_cpu.pool``, C in ``emit/pool.py``) under the column driver: results
equal float64 with the pool and with the OpenMP region it replaces, on more threads than cores, from
several Python threads at once (one call holds the pool, the others run OpenMP regions), over many quick
calls in a row (workers waking for a finished job must not touch the next one), in a forked child (no
workers there until it asks), with ``TRACEA_CPU_POOL=0``, and with a spin of zero (every job wakes sleeping
workers)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from tracea_cpu import kernels, pool
from tracea_cpu.testing import HAVE_CC, ISAS, rand

pytestmark = [pytest.mark.skipif(not HAVE_CC, reason="no C compiler"),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the pool is Linux-only")]


@pytest.fixture(autouse=True)
def pool_on(monkeypatch):
    """``TRACEA_CPU_POOL=1`` for these tests (the pool is off by default); the libraries are told again
    afterwards."""
    monkeypatch.setenv("TRACEA_CPU_POOL", "1")
    pool.sync()
    yield
    monkeypatch.undo()
    pool.sync()


#: the register tile of the libraries these tests load (the ISA's default family tile)
TILE = {"avx512": (14, 32), "avx2": (6, 16), "neon": (8, 12)}.get(ISAS[0], (4, 4))


def _lib() -> ctypes.CDLL:
    return kernels.blocked_library(ISAS[0], *TILE, "bias")


def _gemm(lib, a, b, bias, threads, out=None):
    m, k = a.shape
    n = b.shape[1]
    out = np.full((m, n), np.nan, np.float32) if out is None else out
    route = kernels.GEMM_ROUTES[lib.tr_gemm_route(m, n, k, n, 1, threads)]
    assert route == "cols", (m, n, k, threads, route)
    rc = lib.tr_gemm(1, m, n, k, a.ctypes.data, k, 1, 0, b.ctypes.data, n, 1, 0, out.ctypes.data, n, 0,
                     bias.ctypes.data, 112, 4096, 256, threads)
    assert rc == 0
    return out


def _check(out, a, b, bias):
    ref = a.astype(np.float64) @ b.astype(np.float64) + bias
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-6


@pytest.fixture
def operands():
    rng = np.random.default_rng(11)
    return rand(rng, 1, 97, 301)[0], rand(rng, 1, 301, 1100)[0], rand(rng, 1100)


@pytest.mark.parametrize("threads", [2, 3, 5])
@pytest.mark.parametrize("use_pool", [True, False], ids=["pool", "openmp"])
def test_pool_and_openmp_match_float64(operands, threads, use_pool):
    lib = _lib()
    assert pool.library() is not None, pool.status()
    try:
        if not use_pool:
            lib.tr_set_pool(None)
        for _ in range(5):
            _check(_gemm(lib, *operands, threads), *operands)
    finally:
        pool.attach(lib)
    if use_pool:
        assert 1 <= pool.library().tr_pool_workers() <= 1023


def test_many_quick_calls(operands):
    """Back-to-back calls: a worker waking late for job g must not join job g + 1 with g's slot."""
    lib = _lib()
    a, b, bias = operands
    a, b = np.ascontiguousarray(a[:40]), np.ascontiguousarray(b[:, :600])  # (M >= 2 x 14 rows, 4 panels a thread)
    out = np.empty((40, 600), np.float32)
    for i in range(300):
        _gemm(lib, a, b, bias[:600], 2 + i % 3, out)
        if i % 50 == 0:
            _check(out, a, b, bias[:600])
    _check(out, a, b, bias[:600])


def test_concurrent_callers(operands):
    """Python threads calling at once (ctypes drops the GIL): one holds the pool, the rest run OpenMP."""
    lib = _lib()
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            a, b, bias = rand(rng, 1, 61, 203)[0], rand(rng, 1, 203, 700)[0], rand(rng, 700)
            for _ in range(20):
                _check(_gemm(lib, a, b, bias, 3), a, b, bias)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_spin_zero_wakes_sleepers(operands):
    """Spin 0: every worker sleeps on the futex right after each job; the next job must wake them."""
    lib = _lib()
    plib = pool.library()
    assert plib is not None
    try:
        plib.tr_pool_set_spin(0)
        for _ in range(40):
            _check(_gemm(lib, *operands, 3), *operands)
    finally:
        plib.tr_pool_set_spin(pool._spin_ns())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_forked_child_runs(operands):
    lib = _lib()
    _gemm(lib, *operands, 3)  # workers started in the parent
    pid = os.fork()
    if pid == 0:  # child: no workers; the pool starts its own
        try:
            out = _gemm(lib, *operands, 3)
            ref = operands[0].astype(np.float64) @ operands[1].astype(np.float64) + operands[2]
            ok = np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-6 and pool.library().tr_pool_workers() >= 1
            os._exit(0 if ok else 1)
        except BaseException:  # noqa: BLE001 - the child reports through its exit code
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


@pytest.mark.parametrize("value, torch_first, expect", [("0", False, "off"), ("1", False, "on"), ("", False, "off"),
                                                        ("1", True, "on")])
def test_switch(value, torch_first, expect):
    """``TRACEA_CPU_POOL``: unset or 0 keeps the OpenMP regions, 1 uses the pool (status says which);
    results are the same either way."""
    if torch_first:
        pytest.importorskip("torch")
    code = (("import torch; " if torch_first else "")
            + "import numpy as np; from tracea_cpu import pool, kernels; from tracea_cpu.testing import ISAS;"
            f"lib = kernels.blocked_library(ISAS[0], *{TILE}, 'none');"
            " a = np.ones((40, 64), np.float32); b = np.ones((64, 900), np.float32);"
            "c = np.zeros((40, 900), np.float32);"
            "rc = lib.tr_gemm(1, 40, 900, 64, a.ctypes.data, 64, 1, 0, b.ctypes.data, 900, 1, 0, c.ctypes.data,"
            " 900, 0, None, 112, 4096, 256, 3); assert rc == 0 and (c == 64).all(); print(pool.status())")
    env = dict(os.environ, TRACEA_CPU_POOL=value)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(expect), out.stdout


@pytest.mark.parametrize("m, n, k, ta, tb, batch, threads", [(61, 530, 47, False, False, 1, 2),
                                                            (333, 777, 1537, True, False, 2, 2),
                                                            (45, 900, 3, False, False, 1, 3),
                                                            (300, 2051, 65, True, True, 1, 4)])
def test_pool_transposed_batched(m, n, k, ta, tb, batch, threads):
    """Transposed operands, batches (one pool job per batch entry), K < 8 and more threads than cores."""
    lib = _lib()
    rng = np.random.default_rng(m + n + k)
    a = rand(rng, batch, *((k, m) if ta else (m, k)))
    b = rand(rng, batch, *((n, k) if tb else (k, n)))
    bias = rand(rng, n)
    out = np.full((batch, m, n), np.nan, np.float32)
    rsa, csa = (1, m) if ta else (k, 1)
    rsb, csb = (1, k) if tb else (n, 1)
    assert kernels.GEMM_ROUTES[lib.tr_gemm_route(m, n, k, rsb, csb, threads)] == "cols"
    rc = lib.tr_gemm(batch, m, n, k, a.ctypes.data, rsa, csa, m * k, b.ctypes.data, rsb, csb, k * n, out.ctypes.data,
                     n, m * n, bias.ctypes.data, 112, 4096, 256, threads)
    assert rc == 0
    a64 = a.astype(np.float64).transpose(0, 2, 1) if ta else a.astype(np.float64)
    b64 = b.astype(np.float64).transpose(0, 2, 1) if tb else b.astype(np.float64)
    ref = a64 @ b64 + bias
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-6
