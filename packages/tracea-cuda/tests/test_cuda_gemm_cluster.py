"""GPU tests of the 2-CTA cluster (TMA multicast of B) configs of the Hopper GEMMs: odd tile counts
(a CTA whose A tile lies wholly past M), batches, every transpose, both schedules, TF32 and 3xTF32."""

from __future__ import annotations

import pytest

from tracea.ir.ops import GemmOp

from tracea_cuda import testing as T
from tracea_cuda.variants import all_variants
from tracea_cuda.variants.hopper import _hero

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")]

VARIANTS = {v.name: v for v in all_variants()}
CONFIGS = [_hero(256, 4, cluster=2), _hero(128, 6, cluster=2), _hero(128, 4, bm=256, cluster=2),
           _hero(128, 6, schedule="pingpong", cluster=2), _hero(256, 4, smem_epilogue=False, cluster=2)]
SHAPES = [(8, 8, 8, 1), (136, 264, 72, 1), (392, 136, 2000, 1), (1000, 1016, 520, 2), (2304, 1280, 512, 1)]


_hopper = T.require_hopper


def _run(variant_name, op, configs, tol):
    _hopper()
    T.check_gemm_configs(VARIANTS[variant_name], op, configs, tol, seed=op.m + op.k)


@pytest.mark.parametrize("trans", [(False, False), (True, False), (False, True), (True, True)], ids=["NN", "TN", "NT", "TT"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_cluster_bf16(trans, shape):
    m, n, k, batch = shape
    op = GemmOp(m, n, k, batch=batch, trans_a=trans[0], trans_b=trans[1], dtype_a="bfloat16", dtype_b="bfloat16",
                epilogue="bias+gelu")
    _run("cuda.gemm.wgmma", op, CONFIGS, T.tolerance("bf16", op.out_dtype))


@pytest.mark.parametrize("shape", SHAPES[1:4], ids=lambda s: "x".join(map(str, s)))
def test_cluster_tf32_and_3xtf32(shape):
    m, n, k, batch = shape
    op = GemmOp(m, n, k, batch=batch, trans_b=True, fp32_precision="high", epilogue="bias+relu")
    _run("cuda.gemm.wgmma_tf32", op, CONFIGS[:3], T.tolerance("tf32", op.out_dtype))
    # A (M, K) @ B (K, N): the swapped kernel (B^T fed from registers, C^T stored column-major)
    op = GemmOp(m, n, k, batch=batch, fp32_precision="high", epilogue="bias+relu")
    _run("cuda.gemm.wgmma_tf32", op, [c.replace(smem_epilogue=False) for c in CONFIGS[:3]],
         T.tolerance("tf32", op.out_dtype))
    op = GemmOp(m, n, k, batch=batch, trans_a=True, fp32_precision="highest", epilogue="bias")
    _run("cuda.gemm.wgmma_3xtf32", op, [c.replace(partial_stages=4) for c in CONFIGS[1:2]], 1e-5)


def test_cluster_declined_for_narrow_tiles():
    profile = _hopper()
    op = GemmOp(512, 512, 512, dtype_a="float16", dtype_b="float16")
    assert not VARIANTS["cuda.gemm.wgmma"].validate_config(op, _hero(64, 6, cluster=2), profile)
