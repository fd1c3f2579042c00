"""``cuda.gemm.gemv``'s K parts (``ks``: warps sharing a weight row, each on an interleaved share of K, summed in
shared memory in part order): the hero rule on the CPU (the kernel compiles there too), then GPU runs of every
``ks`` against a float64 reference on odd sizes, unaligned views, epilogues, NaN / Inf and repeated calls."""

from __future__ import annotations

import math

import pytest

from tracea.dtypes import DType
from tracea.errors import UnsupportedConfigError
from tracea.ir.epilogue import Epilogue
from tracea.ir.ops import GemmOp
from tracea.semantic.config import PipelineConfig

from tracea_cuda import testing as T
from tracea_cuda.emit.gemv import GemvSpec, render
from tracea_cuda.variants.gemv import GemvGemm, k_parts

V = GemvGemm()
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
gpu = pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")


def _op(m, n, k, dtype="float32", epi="none"):
    return GemmOp(m, n, k, trans_b=True, dtype_a=dtype, dtype_b=dtype, dtype_out=dtype, epilogue=epi)


def test_k_parts_rule():
    # narrow weights over a long K: 8 warps a row (fp32: 128 values a warp load, bf16: 256)
    assert k_parts(_op(1, 1024, 8192)) == 8 and k_parts(_op(1, 1024, 8192, "bfloat16")) == 8
    assert k_parts(_op(4, 256, 4096)) == 8
    # a part gets at least one 16-byte load a lane: K = 768 fp32 is 6 loads -> 4 parts, bf16 3 -> 2
    assert k_parts(_op(1, 768, 768)) == 4 and k_parts(_op(1, 768, 768, "bfloat16")) == 2
    # too short to split, and tall weights over a short K keep a warp a row
    assert k_parts(_op(1, 64, 200)) == 1 and k_parts(_op(1, 8192, 1024)) == 1
    # tall weights over a long K split too (the probe: x1 @ W11008x4096.T 1.03x -> 1.13x cuBLAS)
    assert k_parts(_op(1, 11008, 4096)) == 8


def test_heroes_lead_with_k_parts_and_keep_the_warp_per_row_ones():
    profile = T.fake_profile("H100")
    heroes = V.hero_configs(_op(1, 1024, 8192), profile)
    assert heroes[0].get("ks") == 8 and heroes[0].get("npw") == 1
    assert any((c.get("ks") or 1) == 1 for c in heroes[1:])
    assert all((c.get("ks") or 1) == 1 for c in V.hero_configs(_op(1, 8192, 1024), profile))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("ks", [2, 4, 8])
def test_k_parts_kernel_sources_render_and_reject_spilling_shapes(dtype, ks):
    dt = DType.parse(dtype)
    src = render(GemvSpec(dt, dt, dt, Epilogue.parse("bias+gelu"), 1, 1, 16 // dt.itemsize, ks))
    assert f"#define KS {ks}" in src and "parts[WARPS]" in src
    with pytest.raises(UnsupportedConfigError):
        GemvSpec(dt, dt, dt, Epilogue.parse("none"), 4, 2, 16 // dt.itemsize, ks).check()
    with pytest.raises(UnsupportedConfigError):
        GemvSpec(dt, dt, dt, Epilogue.parse("none"), 1, 1, 16 // dt.itemsize, 3).check()


@pytest.mark.cuda
@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("ks", [2, 4, 8])
@pytest.mark.parametrize("m,n,k,epi", [(1, 1, 1, "none"), (1, 7, 3000, "bias+relu"), (3, 333, 517, "bias+gelu"),
                                        (4, 1000, 264, "silu"), (1, 1027, 8200, "bias"), (2, 9, 130, "none"),
                                        (4, 17, 4096, "bias+gelu")])
def test_k_parts_match_reference(dtype, ks, m, n, k, epi):
    op = _op(m, n, k, dtype, epi)
    profile = T.gpu_profile()
    cfg = PipelineConfig(params=(("npw", 1), ("ks", ks)))
    for call in range(2):  # repeated: the part sums are rewritten, never accumulated across calls
        t = T.gemm_inputs(op, seed=m * 31 + n + call)
        V.run(op, cfg, T.op_args(t), profile)
        err = T.rel_err(t["out"], T.gemm_reference(op, t))
        assert err <= TOL[dtype], f"{op.describe()} ks={ks}: {err:.3g}"


@pytest.mark.cuda
@gpu
@pytest.mark.parametrize("ks", [2, 8])
def test_k_parts_unaligned_views_nan_inf_and_user_path(ks):
    import torch

    import tracea

    cfg = PipelineConfig(params=(("npw", 1), ("ks", ks)))
    w = torch.randn(300 * 4096 + 1, device="cuda")[1:].view(300, 4096)  # 4 bytes past 16: scalar loads
    x = torch.randn(3 * 4096 + 1, device="cuda")[1:].view(3, 4096)
    out = tracea.ops.matmul(x, w.t(), variant="cuda.gemm.gemv", config=cfg)
    ref = x.double() @ w.double().t()
    assert float((out.double() - ref).abs().max() / ref.abs().max()) < 1e-5
    # NaN / Inf propagate as in the reference, row by row
    x2 = torch.randn(2, 4096, device="cuda")
    x2[0, 5] = float("nan")
    x2[1, 4000] = float("inf")
    w2 = torch.randn(64, 4096, device="cuda").abs()
    got = tracea.ops.matmul(x2, w2.t(), variant="cuda.gemm.gemv", config=cfg)
    assert torch.isnan(got[0]).all() and torch.isinf(got[1]).all() and (got[1] > 0).all()
    # the default decision on a narrow weight over a long K takes the K parts and matches torch
    x3, w3 = torch.randn(1, 8192, device="cuda"), torch.randn(1024, 8192, device="cuda")
    y = tracea.ops.matmul(x3, w3.t())
    assert math.isclose(float((y.double() - x3.double() @ w3.double().t()).abs().max()), 0.0, abs_tol=2e-3)
