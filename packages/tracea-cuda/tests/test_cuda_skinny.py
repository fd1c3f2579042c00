"""GPU tests of cuda.gemm.skinny_mma (few rows against an (N, K) weight on mma.sync) against a float64
reference: every hero config and the search space's corners, odd M / N / K, every epilogue, output casts,
NaN / Inf propagation, unaligned views (element loads), and the Doctor's pick for decode shapes."""

from __future__ import annotations

import pytest

from tracea.dtypes import DType
from tracea.ir.ops import GemmOp
from tracea.semantic.config import PipelineConfig

from tracea_cuda import testing as T
from tracea_cuda.variants.skinny import SkinnyMmaGemm

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")]

V = SkinnyMmaGemm()


def _tol(dtype: str, out: str) -> float:
    return T.tolerance("f16" if dtype == "float16" else "bf16", DType.parse(out))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m,n,k", [(1, 8, 8), (5, 333, 520), (16, 4096, 4096), (17, 1000, 264), (33, 2049, 1000),
                                   (64, 1024, 8192), (40, 37, 8), (9, 11008, 4096), (1, 5120, 5120), (8, 1001, 2056),
                                   (2, 13, 24)])
@pytest.mark.parametrize("epi", ["none", "bias+relu", "bias+gelu", "silu"])
def test_skinny_matches_reference(dtype, m, n, k, epi):
    op = GemmOp(m, n, k, trans_b=True, dtype_a=dtype, dtype_b=dtype, dtype_out=dtype, epilogue=epi)
    profile = T.gpu_profile()
    assert not V.check(op, profile) or m > 16, V.check(op, profile)  # the kernel takes up to 64 rows
    T.check_gemm_configs(V, op, V.hero_configs(op, profile), _tol(dtype, dtype), seed=m * 31 + n)


@pytest.mark.parametrize("m", [13, 8, 1])  # whole and half (M <= 8) A fragments
@pytest.mark.parametrize("nb,kw,unroll,coalesced,prefetch,wide", [
    (1, 2, 1, True, False, False), (4, 16, 4, True, False, False), (2, 8, 4, False, False, True),
    (1, 16, 1, False, True, False), (2, 8, 2, True, True, False), (4, 4, 2, True, True, False),
    (1, 8, 4, False, True, False), (1, 16, 4, True, True, True)])
def test_skinny_search_space_corners(m, nb, kw, unroll, coalesced, prefetch, wide):
    """Both k orders of the loads and the prefetching loop, on K not a multiple of a chunk and warps left
    without chunks (K = 1032: 17 chunks of 64 over 16 warps)."""
    op = GemmOp(m, 517, 1032, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16", epilogue="bias")
    cfg = PipelineConfig(warps=kw, params=(("nb", nb), ("kw", kw), ("unroll", unroll), ("coalesced", coalesced),
                                           ("prefetch", prefetch), ("wide_regs", wide)))
    T.check_gemm_configs(V, op, [cfg], _tol("bfloat16", "bfloat16"), seed=nb + kw + m)


@pytest.mark.parametrize("m", [16, 11, 4, 1])
@pytest.mark.parametrize("nb,kw,unroll,wn,prefetch,coalesced", [
    (2, 8, 2, 2, True, False), (2, 4, 2, 4, True, False), (1, 2, 4, 8, True, True), (4, 4, 2, 2, True, False),
    (2, 2, 1, 2, False, True)])
@pytest.mark.parametrize("n,k", [(517, 1032), (1000, 264), (37, 4104)])
def test_skinny_row_groups(m, nb, kw, unroll, wn, prefetch, coalesced, n, k):
    """Several row groups per block (wn): partial last blocks (N = 517 / 1000 / 37 against 16-256-row blocks),
    K not a multiple of a chunk, warps without chunks (K = 264 over 8 K slices)."""
    op = GemmOp(m, n, k, trans_b=True, dtype_a="float16", dtype_b="float16", epilogue="bias+gelu")
    cfg = PipelineConfig(warps=kw * wn, params=(("nb", nb), ("kw", kw), ("unroll", unroll), ("coalesced", coalesced),
                                                ("prefetch", prefetch), ("wide_regs", kw * wn == 16), ("wn", wn)))
    T.check_gemm_configs(V, op, [cfg], _tol("float16", "float16"), seed=nb + kw + wn + m + n)


@pytest.mark.parametrize("out", ["float32", "float16"])
def test_skinny_output_cast(out):
    op = GemmOp(24, 777, 640, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16", dtype_out=out, epilogue="bias+gelu")
    T.check_gemm_configs(V, op, V.hero_configs(op, T.gpu_profile())[:1], _tol("bfloat16", out), seed=3)


def test_skinny_nan_inf_propagate_and_unaligned_views():
    import torch

    import tracea

    w = torch.randn(3000 * 4096 + 1, device="cuda", dtype=torch.bfloat16)[1:].view(3000, 4096)
    x = torch.randn(12 * 4096 + 1, device="cuda", dtype=torch.bfloat16)[1:].view(12, 4096)
    assert w.data_ptr() % 16 and x.data_ptr() % 16  # element loads
    out = tracea.ops.matmul(x, w.t(), variant="cuda.gemm.skinny_mma")
    ref = x.double() @ w.double().t()
    assert float((out.double() - ref).norm() / ref.norm()) < 1.6e-2
    x, w = torch.randn(7, 512, device="cuda", dtype=torch.float16), torch.randn(300, 512, device="cuda",
                                                                               dtype=torch.float16)
    x[2, 5], w[7, 100], x[4, 9] = float("nan"), float("inf"), float("-inf")
    out = tracea.ops.matmul(x, w.t(), variant="cuda.gemm.skinny_mma")
    ref = x.float() @ w.float().t()
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf())


def test_doctor_picks_skinny_for_few_token_decode():
    from tracea.doctor.doctor import get_doctor

    for m in (2, 4, 16):
        op = GemmOp(m, 11008, 4096, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16")
        assert get_doctor().decide(op, "cuda:0").chosen.variant.name == "cuda.gemm.skinny_mma", op.describe()
    op = GemmOp(64, 11008, 4096, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16")
    rejected = {r.variant: " ".join(r.reasons) for r in get_doctor().decide(op, "cuda:0").rejected}
    assert "exceeds 16" in rejected["cuda.gemm.skinny_mma"]
