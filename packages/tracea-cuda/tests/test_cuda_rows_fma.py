"""Tests of cuda.gemm.rows_fma (exact-fp32 x @ W.T of a few dozen rows): the declines and slice plans (no GPU), and
on a GPU, against a float64 reference: odd M / N / K, one and several K slices (the in-kernel reduction), every
epilogue, output casts, unaligned views and K not a multiple of 4 (one float per copy), NaN / Inf, repeated calls
on the shared split scratch, and CUDA graph capture."""

from __future__ import annotations

import pytest

from tracea.dtypes import DType
from tracea.ir.ops import GemmOp
from tracea.semantic.config import PipelineConfig

from tracea_cuda import testing as T
from tracea_cuda.emit.rows_fma import BK
from tracea_cuda.variants.rows_fma import RowsFmaGemm, slices

V = RowsFmaGemm()
needs_gpu = pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")
F32 = dict(dtype_a="float32", dtype_b="float32")


def test_rows_fma_declines_and_slices():
    h100 = T.fake_profile("H100")
    reasons = lambda op: V.requirements.check(op, h100) + V.extra_checks(op, h100)  # noqa: E731
    assert not reasons(GemmOp(32, 4096, 4096, trans_b=True, **F32))
    assert any("TF32 allowed" in r for r in reasons(GemmOp(32, 4096, 4096, trans_b=True, fp32_precision="high", **F32)))
    assert any("(K, N)" in r for r in reasons(GemmOp(32, 4096, 4096, **F32)))
    assert any("transposed" in r for r in reasons(GemmOp(32, 4096, 4096, trans_a=True, trans_b=True, **F32)))
    assert any("weight-streaming" in r for r in reasons(GemmOp(16, 4096, 4096, trans_b=True, **F32)))
    assert reasons(GemmOp(65, 4096, 4096, trans_b=True, **F32))  # more rows: the tiled GEMMs
    assert reasons(GemmOp(32, 4096, 4096, trans_b=True, dtype_a="bfloat16", dtype_b="bfloat16"))
    assert reasons(GemmOp(32, 64, 64, batch=2, trans_b=True, **F32))
    for m, n, k in ((64, 4096, 4096), (17, 7, 5), (33, 100000, 300), (64, 1000, 100000), (20, 64, 64)):
        op = GemmOp(m, n, k, trans_b=True, **F32)
        for bm in (16, 32, 64):
            count, length = slices(op, bm, 132)
            assert length % BK == 0 and count * length >= k > (count - 1) * length, (m, n, k, bm, count, length)
            if count > 1:  # the partial tiles' traffic stays under the weight's
                assert count <= k // (2 * bm * -(-m // bm)), (m, n, k, bm, count)
    from tracea_cuda.variants import all_variants

    by_name = {v.name: v for v in all_variants()}
    served = lambda op: sorted(v.name for v in by_name.values()  # noqa: E731
                               if v.requirements.op_kind == op.kind and not v.own_reasons(op, h100))
    for m in (17, 32, 48, 64):  # 17-64 fp32-exact rows against a big weight: rows_fma alone
        assert served(GemmOp(m, 4096, 4096, trans_b=True, **F32)) == [V.name], m
    assert V.name not in served(GemmOp(32, 768, 768, trans_b=True, **F32))  # a small weight: skinny_tf32
    assert "cuda.gemm.skinny_tf32" in served(GemmOp(32, 768, 768, trans_b=True, **F32))
    assert V.name in served(GemmOp(64, 768, 768, trans_b=True, **F32))
    assert V.name not in served(GemmOp(16, 4096, 4096, trans_b=True, **F32))


def _configs(op: GemmOp) -> list[PipelineConfig]:
    return V.hero_configs(op, T.fake_profile("H100"))


def test_rows_fma_heroes_cover_the_rows():
    for m in (9, 16, 17, 32, 33, 64):
        cfgs = _configs(GemmOp(m, 512, 512, trans_b=True, **F32))
        assert cfgs and all(-(-m // dict(c.params)["bm"]) <= 4 for c in cfgs)


@needs_gpu
@pytest.mark.cuda
@pytest.mark.parametrize("m,n,k", [(17, 4096, 4096), (64, 1000, 8192), (33, 333, 520), (1, 7, 5), (48, 2052, 36),
                                   (24, 11008, 700), (64, 64, 100000), (40, 65, 4100)])
@pytest.mark.parametrize("epi", ["none", "bias+relu", "bias+gelu", "silu"])
def test_rows_fma_matches_reference(m, n, k, epi):
    op = GemmOp(m, n, k, trans_b=True, epilogue=epi, **F32)
    T.check_gemm_configs(V, op, _configs(op), T.tolerance("3xtf32", DType.F32), seed=m + n)


@needs_gpu
@pytest.mark.cuda
@pytest.mark.parametrize("out", ["float16", "bfloat16"])
def test_rows_fma_output_cast(out):
    op = GemmOp(30, 777, 640, trans_b=True, dtype_out=out, epilogue="bias+gelu", **F32)
    T.check_gemm_configs(V, op, _configs(op), T.tolerance("3xtf32", DType.parse(out)), seed=3)


@needs_gpu
@pytest.mark.cuda
def test_rows_fma_user_path_unaligned_nan_inf_and_graphs():
    import torch

    import tracea

    torch.backends.cuda.matmul.allow_tf32 = False
    name = "cuda.gemm.rows_fma"
    w = torch.randn(3001 * 4099 + 1, device="cuda")[1:].view(3001, 4099)  # K odd, base unaligned: float copies
    x = torch.randn(40, 4099, device="cuda")
    for _ in range(3):  # repeated calls reuse the split scratch's counters (the kernel re-zeroes them)
        ref = x.double() @ w.double().t()
        out = tracea.ops.matmul(x, w.t(), variant=name)
        assert float((out.double() - ref).norm() / ref.norm()) < 1e-6  # exact fp32 FMAs
        x = torch.randn_like(x)
    x, w = torch.randn(56, 512, device="cuda"), torch.randn(300, 512, device="cuda")
    x[2, 5], w[100, 7], x[4, 9] = float("nan"), float("inf"), float("-inf")
    out = tracea.ops.matmul(x, w.t(), variant=name)
    ref = x.double() @ w.double().t()
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf())
    x = torch.randn(32, 4096, device="cuda")
    w = torch.randn(4096, 4096, device="cuda")
    bias = torch.randn(4096, device="cuda")
    y = tracea.ops.matmul(x, w.t(), bias=bias)  # the default decision, eager and captured in a CUDA graph
    static = torch.empty_like(y)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static.copy_(tracea.ops.matmul(x, w.t(), bias=bias))
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        ref = x.double() @ w.double().t() + bias.double()
        assert float((static.double() - ref).norm() / ref.norm()) < 1e-6
