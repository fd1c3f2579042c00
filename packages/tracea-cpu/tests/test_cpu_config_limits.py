"""Defence in depth: configs no space offers (a damaged tuning cache, a hand-written config) are
refused by the CPU variants with UnsupportedConfigError before any C code runs; before, threads=10**6
crashed OpenMP (SIGSEGV) and kc=2**63-1 overflowed the C block rounding into an endless loop."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.errors import InvalidArgumentError, UnsupportedConfigError
from tracea.ir.ops import AttentionOp, Conv2dOp, GemmOp
from tracea_cpu import kernels
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.spaces import ATTN_HEROES, GEMM_HEROES
from tracea_cpu.testing import BEST, HAVE_CC, PROFILE, config, poisoned, run_gemm, run_variant
from tracea_cpu.variants import CpuAttentionVariant, CpuConv2dVariant, CpuGemmVariant

pytestmark = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")
HERO = GEMM_HEROES[BEST][0]
BAD = [dict(threads=10**6), dict(threads=-1), dict(threads="x"), dict(threads=True), dict(threads=1.5),
       dict(kc=2**63 - 1), dict(mc=2**40), dict(nc=kernels.MAX_BLOCK + 1), dict(kc=0), dict(mr=10**30)]


@pytest.mark.parametrize("bad", BAD, ids=[f"{k}={v!r}"[:24] for d in BAD for k, v in d.items()])
def test_gemm_and_conv_refuse_absurd_params(bad):
    isa = ISA_BY_NAME[BEST]
    cfg = config(**{**HERO, "threads": 0, **bad})
    gemm = CpuGemmVariant(isa)
    assert not gemm.validate_config(GemmOp(96, 80, 72), cfg, PROFILE)
    assert not CpuConv2dVariant(isa).validate_config(Conv2dOp(1, 8, 10, 10, 16, 3, 3), cfg, PROFILE)
    with pytest.raises(UnsupportedConfigError):
        run_gemm(gemm, GemmOp(96, 80, 72), cfg)


@pytest.mark.parametrize("threads", [10**6, "x", -3])
def test_attention_refuses_absurd_threads(threads):
    variant = CpuAttentionVariant(ISA_BY_NAME[BEST])
    op = AttentionOp(1, 2, 8, 8, 16)
    cfg = config(**ATTN_HEROES[BEST][0], threads=threads)
    assert not variant.validate_config(op, cfg, PROFILE)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 8, 16), dtype=np.float32)
    with pytest.raises(UnsupportedConfigError):
        run_variant(variant, op, cfg, {"q": q, "k": q.copy(), "v": q.copy()}, poisoned(q.shape))


def test_thread_limit_and_environment_cap(monkeypatch):
    limit = kernels.max_threads()
    assert 64 <= limit <= 1024
    assert kernels.thread_count(limit, 2) == limit
    with pytest.raises(UnsupportedConfigError):
        kernels.thread_count(limit + 1, 2)
    monkeypatch.setenv("TRACEA_NUM_THREADS", str(10**9))
    assert kernels.thread_count(0, 2) == limit
    monkeypatch.setenv("TRACEA_NUM_THREADS", "0")
    with pytest.raises(InvalidArgumentError):
        kernels.thread_count(0, 2)


def test_largest_offered_values_still_run():
    cfg = config(**dict(HERO, kc=4608, threads=2))
    out, ref, _, _ = run_gemm(CpuGemmVariant(ISA_BY_NAME[BEST]), GemmOp(33, 40, 70), cfg)
    assert np.linalg.norm(out[0] - ref[0]) / np.linalg.norm(ref[0]) < 1e-5
