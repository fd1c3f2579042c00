"""GPU tests of cuda.gemm.rows_kn (few rows against a B stored (K, N) row-major) against a float64 reference: odd
M / N / K, one and several K slices, every epilogue, output casts, unaligned views (element loads), NaN / Inf, and
the declines (no GPU)."""

from __future__ import annotations

import pytest

from tracea.dtypes import DType
from tracea.ir.ops import GemmOp

from tracea_cuda import testing as T
from tracea_cuda.variants.rows_kn import RowsKnGemm, slices

V = RowsKnGemm()
needs_gpu = pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")


def test_rows_kn_declines_and_slices():
    h100 = T.fake_profile("H100")
    reasons = lambda op: V.requirements.check(op, h100) + V.extra_checks(op, h100)  # noqa: E731
    assert not reasons(GemmOp(8, 4096, 4096))
    assert any("nn.Linear" in r for r in reasons(GemmOp(8, 4096, 4096, trans_b=True)))
    assert any("transposed" in r for r in reasons(GemmOp(8, 4096, 4096, trans_a=True)))
    assert reasons(GemmOp(17, 4096, 4096)) and reasons(GemmOp(8, 64, 64, batch=2))
    from tracea_cuda.variants import all_variants

    by_name = {v.name: v for v in all_variants()}
    for name in ("cuda.gemm.mma_3xtf32", "cuda.gemm.wgmma_3xtf32"):  # fp32-exact few rows: rows_kn serves them
        v = by_name[name]
        assert any("rows_kn serves" in r for r in v.extra_checks(GemmOp(8, 4096, 4096), h100)), name
        assert not any("rows_kn" in r for r in v.extra_checks(GemmOp(8, 4096, 4096, trans_b=True), h100)), name
        assert not any("rows_kn" in r for r in v.extra_checks(GemmOp(17, 4096, 4096), h100)), name
        assert not any("rows_kn" in r for r in v.extra_checks(GemmOp(7, 13, 5), h100)), name  # B too small
    for n, k in ((4096, 4096), (7, 5), (100000, 300), (1000, 100000), (768, 768), (1024, 8192)):
        count, length = slices(GemmOp(4, n, k), 132)
        assert length <= 512 and count * length >= k > (count - 1) * length, (n, k, count, length)
        assert count <= max(256, -(-k // 512)), (n, k, count)
    # one wave of resident blocks over the 128-column blocks, at least eight rows of B a warp, partials under half of
    # B's bytes, at most 32 by default; the config param overrides the rule
    assert slices(GemmOp(1, 768, 768), 132)[0] == 12 and slices(GemmOp(1, 1024, 8192), 132)[0] == 32
    assert slices(GemmOp(16, 4096, 4096), 132)[0] == 8 and slices(GemmOp(1, 100000, 300), 132)[0] == 1
    assert slices(GemmOp(1, 768, 768), 132, 48)[0] == 48 and slices(GemmOp(1, 8192, 8192), 132, 1)[0] == 16


def _tol(dt: str, out: str) -> float:
    return T.tolerance("3xtf32" if dt == "float32" else "f16" if dt == "float16" else "bf16", DType.parse(out))


@needs_gpu
@pytest.mark.cuda
@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (5, 333, 520), (16, 1000, 8192), (3, 7, 5), (8, 2052, 3),
                                   (12, 11008, 700), (2, 64, 100000)])
@pytest.mark.parametrize("epi", ["none", "bias+relu", "bias+gelu", "silu"])
def test_rows_kn_matches_reference(dt, m, n, k, epi):
    op = GemmOp(m, n, k, dtype_a=dt, dtype_b=dt, epilogue=epi)
    T.check_gemm_configs(V, op, V.hero_configs(op, T.gpu_profile()), _tol(dt, dt), seed=m + n)


@needs_gpu
@pytest.mark.cuda
@pytest.mark.parametrize("out", ["float32", "bfloat16"])
def test_rows_kn_output_cast(out):
    op = GemmOp(6, 777, 640, dtype_a="float16", dtype_b="float16", dtype_out=out, epilogue="bias+gelu")
    T.check_gemm_configs(V, op, V.hero_configs(op, T.gpu_profile()), _tol("float16", out), seed=3)


@needs_gpu
@pytest.mark.cuda
def test_rows_kn_user_path_unaligned_and_nan_inf():
    import torch

    import tracea

    torch.backends.cuda.matmul.allow_tf32 = False
    b = torch.randn(4096 * 3001 + 1, device="cuda")[1:].view(4096, 3001)  # N odd, base unaligned: element loads
    x = torch.randn(7, 4096, device="cuda")
    ref = x.double() @ b.double()
    out = tracea.ops.matmul(x, b, variant="cuda.gemm.rows_kn")
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-6  # exact fp32 FMAs
    x, b = torch.randn(9, 512, device="cuda"), torch.randn(512, 300, device="cuda")
    x[2, 5], b[100, 7], x[4, 9] = float("nan"), float("inf"), float("-inf")
    out = tracea.ops.matmul(x, b, variant="cuda.gemm.rows_kn")
    ref = x.double() @ b.double()
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf())
    x = torch.randn(8, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    y = tracea.ops.matmul(x, b)  # the default decision, eager and captured in a CUDA graph
    static = torch.empty_like(y)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static.copy_(tracea.ops.matmul(x, b))
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    ref = x.double() @ b.double()
    assert float((static.double() - ref).norm() / ref.norm()) < 1e-5


@needs_gpu
@pytest.mark.cuda
@pytest.mark.parametrize("m,n,k", [(1, 768, 768), (16, 768, 768), (1, 1024, 8192), (3, 130, 4099)])
def test_rows_kn_split_scratch_repeated_calls_streams_and_graphs(m, n, k):
    """One launch a call: the partial tiles and counters in the stream's split scratch, reused call after call (the
    kernel re-zeroes its counters), on two streams, interleaved with other shapes, and replayed from a CUDA graph
    (a zeroed buffer of the capture's own)."""
    import torch

    import tracea

    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n)
    b = torch.randn(k, n, device="cuda", generator=gen)
    other_b = torch.randn(k, n + 4, device="cuda", generator=gen)
    for rep in range(3):
        x = torch.randn(m, k, device="cuda", generator=gen)
        out = tracea.ops.matmul(x, b, variant="cuda.gemm.rows_kn")
        other = tracea.ops.matmul(x, other_b, variant="cuda.gemm.rows_kn")  # same scratch, other tiles
        ref = x.double() @ b.double()
        assert float((out.double() - ref).norm() / ref.norm()) < 1e-6, rep
        assert float((other.double() - x.double() @ other_b.double()).norm()) / float(ref.norm()) < 1e-5
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        y = tracea.ops.matmul(x, b, variant="cuda.gemm.rows_kn")
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(y, tracea.ops.matmul(x, b, variant="cuda.gemm.rows_kn"))  # bitwise: a fixed summation order
    static_x = x.clone()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = tracea.ops.matmul(static_x, b, variant="cuda.gemm.rows_kn")
    for _ in range(2):
        static_x.copy_(torch.randn(m, k, device="cuda", generator=gen))
        g.replay()
        torch.cuda.synchronize()
        ref = static_x.double() @ b.double()
        assert float((static_y.double() - ref).norm() / ref.norm()) < 1e-6
