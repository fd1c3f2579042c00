"""GPU tests of cuda.gemm.skinny_tf32 (the skinny kernel on float32: 3xTF32 split in registers, or one TF32
product where TF32 is allowed) against a float64 reference: every hero config over odd M / N / K, both
precisions, every epilogue, output casts, the search space's corners, NaN / Inf propagation, unaligned views
(element loads), and the Doctor's pick for fp32 few-row products."""

from __future__ import annotations

import pytest

from tracea.dtypes import DType
from tracea.ir.ops import GemmOp
from tracea.semantic.config import PipelineConfig

from tracea_cuda import testing as T
from tracea_cuda.variants.rows_fma import rows_fma_serves
from tracea_cuda.variants.skinny import TF32_SERVED_ROWS, SkinnyTf32Gemm

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")]

V = SkinnyTf32Gemm()


def _tol(precision: str, out: str = "float32") -> float:
    return T.tolerance("3xtf32" if precision == "highest" else "tf32", DType.parse(out))


@pytest.mark.parametrize("precision", ["highest", "high"])
@pytest.mark.parametrize("m,n,k", [(1, 8, 4), (5, 333, 520), (16, 4096, 4096), (17, 1000, 264), (33, 2049, 1000),
                                   (64, 1024, 8192), (40, 37, 4), (9, 3001, 4096), (8, 1001, 2056), (2, 13, 24),
                                   (24, 4096, 25088), (48, 768, 768)])
@pytest.mark.parametrize("epi", ["none", "bias+relu", "bias+gelu", "silu"])
def test_skinny_tf32_matches_reference(precision, m, n, k, epi):
    op = GemmOp(m, n, k, trans_b=True, epilogue=epi, fp32_precision=precision)
    profile = T.gpu_profile()
    if precision == "high" and m > TF32_SERVED_ROWS:  # declined (the tiled TF32 GEMMs serve it); the kernel runs it
        assert any("tiled TF32" in r for r in V.check(op, profile)), V.check(op, profile)
    elif rows_fma_serves(op, profile):  # declined (rows_fma serves 17-64 fp32-exact rows); the kernel runs it
        assert any("rows_fma serves" in r for r in V.check(op, profile)), V.check(op, profile)
    else:
        assert not V.check(op, profile), V.check(op, profile)
    T.check_gemm_configs(V, op, V.hero_configs(op, profile), _tol(precision), seed=m * 31 + n)


@pytest.mark.parametrize("m", [13, 8, 1, 37, 64])  # whole and half (M <= 8) A fragments, 1-4 fragments
@pytest.mark.parametrize("nb,kw,unroll,coalesced,prefetch,wide", [
    (1, 2, 1, True, False, False), (2, 8, 4, False, False, True), (1, 16, 1, False, True, False),
    (2, 8, 2, True, True, False), (1, 8, 4, False, True, False), (1, 4, 2, True, True, False)])
def test_skinny_tf32_search_space_corners(m, nb, kw, unroll, coalesced, prefetch, wide):
    """Both k orders of the loads and the prefetching loop, on K not a multiple of a chunk and warps left
    without chunks (K = 1028: 65 chunks of 16 (unroll 4: 17 of 64) over up to 16 warps)."""
    op = GemmOp(m, 517, 1028, trans_b=True, epilogue="bias", fp32_precision="highest")
    cfg = PipelineConfig(warps=kw, params=(("nb", nb), ("kw", kw), ("unroll", unroll), ("coalesced", coalesced),
                                           ("prefetch", prefetch), ("wide_regs", wide)))
    if not V.validate_config(op, cfg, T.gpu_profile()):
        pytest.skip("outside the kernel's register bounds for this M")
    T.check_gemm_configs(V, op, [cfg], _tol("highest"), seed=nb + kw + m)


@pytest.mark.parametrize("out", ["float16", "bfloat16"])
def test_skinny_tf32_output_cast(out):
    op = GemmOp(24, 777, 640, trans_b=True, dtype_out=out, epilogue="bias+gelu", fp32_precision="highest")
    T.check_gemm_configs(V, op, V.hero_configs(op, T.gpu_profile())[:1], _tol("highest", out), seed=3)


def test_skinny_tf32_is_fp32_accurate_on_long_k():
    """3xTF32 over K = 25088 (VGG's first classifier layer) stays at fp32-level error; one TF32 product does
    not (the precision modes are different kernels)."""
    import torch

    import tracea

    x, w = torch.randn(8, 25088, device="cuda"), torch.randn(4096, 25088, device="cuda") / 160
    ref = x.double() @ w.double().t()
    out = tracea.ops.matmul(x, w.t(), variant="cuda.gemm.skinny_tf32", fp32_precision="highest")
    assert float((out.double() - ref).norm() / ref.norm()) < 2e-6
    out = tracea.ops.matmul(x, w.t(), variant="cuda.gemm.skinny_tf32", fp32_precision="high")
    assert 1e-5 < float((out.double() - ref).norm() / ref.norm()) < 5e-3


def test_skinny_tf32_nan_inf_propagate_and_unaligned_views():
    import torch

    import tracea

    w = torch.randn(3000 * 4096 + 1, device="cuda")[1:].view(3000, 4096)
    x = torch.randn(12 * 4096 + 1, device="cuda")[1:].view(12, 4096)
    assert w.data_ptr() % 16 and x.data_ptr() % 16  # element loads
    out = tracea.ops.matmul(x, w.t(), variant="cuda.gemm.skinny_tf32", fp32_precision="highest")
    ref = x.double() @ w.double().t()
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-5
    for precision in ("highest", "high"):
        x, w = torch.randn(14, 512, device="cuda"), torch.randn(300, 512, device="cuda")
        x[2, 5], w[7, 100], x[4, 9], x[11, 3] = float("nan"), float("inf"), float("-inf"), float("inf")
        out = tracea.ops.matmul(x, w.t(), variant="cuda.gemm.skinny_tf32", fp32_precision=precision)
        ref = x.double() @ w.double().t()
        assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf()), precision
        fin = ref.isfinite()
        assert torch.equal(out[fin].sign(), ref[fin].float().sign()) or precision == "high"


def test_doctor_picks_skinny_tf32_for_fp32_few_rows():
    from tracea.doctor.doctor import get_doctor

    for m, n, k, precision in ((8, 4096, 4096, "highest"), (16, 4096, 4096, "highest"), (32, 768, 768, "highest"),
                               (48, 3072, 768, "highest"), (5, 4096, 4096, "high"), (16, 4096, 4096, "high")):
        op = GemmOp(m, n, k, trans_b=True, epilogue="bias", fp32_precision=precision)  # highest: nn.Linear's default
        assert get_doctor().decide(op, "cuda:0").chosen.variant.name == "cuda.gemm.skinny_tf32", op.describe()
    for m in (17, 32, 64):  # fp32-exact 17-64 rows against a big weight: rows_fma (skinny_tf32 0.36-0.95x cuBLAS)
        op = GemmOp(m, 4096, 4096, trans_b=True, epilogue="bias")
        assert get_doctor().decide(op, "cuda:0").chosen.variant.name == "cuda.gemm.rows_fma", op.describe()
    for op, words in ((GemmOp(65, 4096, 4096, trans_b=True), "exceeds 64"),
                      (GemmOp(17, 4096, 4096, trans_b=True, fp32_precision="high"), "tiled TF32 variants serve")):
        rejected = {r.variant: " ".join(r.reasons) for r in get_doctor().decide(op, "cuda:0").rejected}
        assert words in rejected["cuda.gemm.skinny_tf32"], op.describe()
    rejected = {r.variant: " ".join(r.reasons) for r in get_doctor().decide(
        GemmOp(8, 4096, 4096, trans_b=True, fp32_precision="high"), "cuda:0").rejected}
    assert "skinny_tf32 serves it" in rejected["cuda.gemm.wgmma_tf32"] + rejected["cuda.gemm.mma_tf32"]
