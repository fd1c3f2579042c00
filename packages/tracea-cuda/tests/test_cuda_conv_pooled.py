"""``cuda.conv2d.pooled_gemm`` (1x1 convs over a 1x1 plane run as x @ W.T on the GEMM variants): declines and the
conv variants' matching declines (no GPU), then on a GPU every delegate's heroes against a float64 reference over
dtypes, layouts, batches and epilogues, and the user path (``tracea.ops.conv2d`` on torch tensors, NCHW and
channels_last, eager and in a CUDA graph)."""

from __future__ import annotations

import pytest

from tracea.ir.ops import Conv2dOp

from tracea_cuda import testing as T
from tracea_cuda.variants import all_variants
from tracea_cuda.variants.base import math_mode
from tracea_cuda.variants.pooled import gemm_op, pooled_shape

VARIANTS = {v.name: v for v in all_variants()}
POOLED = VARIANTS["cuda.conv2d.pooled_gemm"]
needs_gpu = pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")


def _reasons(variant, op, profile) -> list[str]:
    return variant.requirements.check(op, profile) + variant.extra_checks(op, profile)


def test_pooled_shapes_and_declines(monkeypatch):
    monkeypatch.setattr(T.toolkit, "status", lambda: (True, ""))
    h100 = T.fake_profile("H100")
    head = Conv2dOp(8, 4096, 1, 1, 4096, 1, 1, layout="nchw", dtype="float32", epilogue="bias", fp32_precision="high")
    assert pooled_shape(head) and not _reasons(POOLED, head, h100)
    g = gemm_op(head)
    assert (g.m, g.n, g.k, g.trans_b, g.fp32_precision) == (8, 4096, 4096, True, head.fp32_precision)
    for name in ("cuda.conv2d.wgmma", "cuda.conv2d.implicit_mma", "cuda.conv2d.pointwise", "cuda.conv2d.wgmma_nchw1x1"):
        assert any("pooled_gemm" in r for r in _reasons(VARIANTS[name], head, h100)), name
    for op in (Conv2dOp(8, 64, 2, 2, 64, 1, 1), Conv2dOp(8, 64, 1, 1, 64, 3, 3, padding=1),
               Conv2dOp(8, 64, 1, 1, 64, 1, 1, groups=2), Conv2dOp(8, 64, 1, 1, 64, 1, 1, padding=1)):
        assert not pooled_shape(op) and _reasons(POOLED, op, h100)
        assert not any("pooled_gemm" in r for r in _reasons(VARIANTS["cuda.conv2d.implicit_mma"], op, h100))
    # the configs name their GEMM variant; one naming none is refused
    cfg = POOLED.hero_configs(head, h100)[0]
    assert cfg.get("gemm") == "cuda.gemm.skinny_tf32" and POOLED.validate_config(head, cfg, h100)
    assert not POOLED.validate_config(head, cfg.replace(gemm="cuda.gemm.nope"), h100)


CASES = [(8, 4096, 4096, "nchw", "float32", "bias", "high"), (1, 4096, 1000, "nchw", "float32", "bias+relu", "high"),
         (24, 512, 768, "nchw", "float32", None, "highest"), (32, 960, 1280, "nhwc", "float16", "bias+relu", "high"),
         (1, 960, 1280, "nhwc", "bfloat16", "bias", "high"), (32, 96, 24, "nhwc", "float16", "bias+silu", "high"),
         (5, 336, 40, "nchw", "float32", "bias+gelu", "high"), (256, 512, 2048, "nhwc", "bfloat16", "bias", "high"),
         (3, 72, 18, "nchw", "float32", "silu", "highest")]


@needs_gpu
@pytest.mark.cuda
@pytest.mark.parametrize("case", CASES, ids=lambda c: "_".join(str(v) for v in c))
def test_pooled_heroes_match_reference(case):
    n, c, k, lay, dt, epi, prec = case
    op = Conv2dOp(n, c, 1, 1, k, 1, 1, layout=lay, dtype=dt, epilogue=epi, fp32_precision=prec)
    profile = T.gpu_profile()
    heroes = POOLED.hero_configs(op, profile)
    assert heroes, POOLED.check(op, profile)
    T.check_conv_configs(POOLED, op, heroes, T.tolerance(math_mode(op.dtype, op.fp32_precision), op.out_dtype))


@needs_gpu
@pytest.mark.cuda
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_pooled_user_path_and_graphs(channels_last, dt):
    import torch
    import torch.nn.functional as F

    import tracea
    from tracea.doctor.doctor import get_doctor

    dtype = getattr(torch, dt)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(8, 2048, 1, 1, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    w = (torch.randn(1024, 2048, 1, 1, device="cuda", dtype=dtype) / 45).contiguous(memory_format=fmt)
    b = torch.randn(1024, device="cuda", dtype=dtype)
    op = Conv2dOp(8, 2048, 1, 1, 1024, 1, 1, layout="nhwc" if channels_last else "nchw", dtype=dt, epilogue="bias",
                  fp32_precision="high" if torch.backends.cudnn.allow_tf32 else "highest")
    if not channels_last or dt != "float32":
        assert get_doctor().decide(op, "cuda:0").variant.name == "cuda.conv2d.pooled_gemm"
    ref = F.conv2d(x.double(), w.double(), b.double())
    out = tracea.ops.conv2d(x, w, b)
    assert out.shape == ref.shape
    tol = 5e-3 if dt == "float32" else 2e-3
    assert float((out.double() - ref).norm() / ref.norm()) < tol
    static = torch.empty_like(out)
    tracea.ops.conv2d(x, w, b)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static.copy_(tracea.ops.conv2d(x, w, b))
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    ref = F.conv2d(x.double(), w.double(), b.double())
    assert float((static.double() - ref).norm() / ref.norm()) < tol
