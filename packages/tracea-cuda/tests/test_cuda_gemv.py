"""GPU tests of cuda.gemm.gemv (few rows against an (N, K) weight) against a float64 reference, on every
hero config, odd sizes, unaligned views, every epilogue; and that the Doctor picks it for decode shapes."""

from __future__ import annotations

import pytest

from tracea.dtypes import DType
from tracea.ir.ops import GemmOp

from tracea_cuda import testing as T
from tracea_cuda.variants.gemv import GemvGemm

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")]

V = GemvGemm()
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (1, 4096, 4096), (3, 333, 517), (4, 1000, 264), (2, 64, 8),
                                   (4, 2049, 1000), (4, 37, 3)])
@pytest.mark.parametrize("epi", ["none", "bias+relu", "bias+gelu", "silu"])
def test_gemv_matches_reference(dtype, m, n, k, epi):
    op = GemmOp(m, n, k, trans_b=True, dtype_a=dtype, dtype_b=dtype, dtype_out=dtype, epilogue=epi)
    profile = T.gpu_profile()
    # 16-bit rows beyond the first are cuda.gemm.skinny_mma's; the kernel itself still serves them
    assert not V.check(op, profile) or (m > 1 and dtype != "float32"), V.check(op, profile)
    for cfg in V.hero_configs(op, profile):
        t = T.gemm_inputs(op, seed=m * 31 + n)
        V.run(op, cfg, T.op_args(t), profile)
        err = T.rel_err(t["out"], T.gemm_reference(op, t))
        assert err <= TOL[dtype], f"{op.describe()} {cfg.key}: {err:.3g}"


def test_gemv_unaligned_views_and_doctor_choice():
    import torch

    import tracea
    from tracea.doctor.doctor import get_doctor

    # contiguous views whose data starts 2 bytes past a 16-byte boundary: the scalar-load kernel
    w = torch.randn(3000 * 4096 + 1, device="cuda", dtype=torch.bfloat16)[1:].view(3000, 4096)
    x = torch.randn(4096 + 1, device="cuda", dtype=torch.bfloat16)[1:].view(1, 4096)  # 16-bit: M = 1 only
    assert w.data_ptr() % 16 and x.data_ptr() % 16
    out = tracea.ops.matmul(x, w.t(), variant="cuda.gemm.gemv")
    ref = x.double() @ w.double().t()
    assert float((out.double() - ref).norm() / ref.norm()) < 1.6e-2
    op = GemmOp(1, 4096, 4096, trans_b=True, dtype_a=DType.BF16, dtype_b=DType.BF16, dtype_out=DType.BF16)
    # the untuned choice is a weight-streaming kernel (which one is the performance model's call per GPU:
    # gemv on an H100, skinny_mma on an H200 in this session's runs)
    assert get_doctor().decide(op, "cuda:0", use_cache=False).chosen.variant.name in ("cuda.gemm.gemv",
                                                                                       "cuda.gemm.skinny_mma")
