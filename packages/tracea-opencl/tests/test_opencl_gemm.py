"""OpenCL GEMM against a float64 reference: odd shapes, transposes, batch, every epilogue, fp16, and
configs of both kernel designs (direct/cache-blocked and local-memory)."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.doctor.variant import OpArgs
from tracea.dtypes import DType
from tracea.ir.epilogue import Epilogue
from tracea.ir.ops import GemmOp
from tracea.semantic.config import PipelineConfig

pytestmark = pytest.mark.opencl

# (tile_m, tile_n, tile_k, wg_m, wg_n, vw, local, raster, pack): CPU-style direct kernels (B read in
# place or packed into panels) and GPU-style local-memory kernels with vector loads; all must be right
# on every device.
CONFIGS = [
    (8, 32, 8, 1, 16, 1, 0, 4096, 1),
    (4, 16, 4, 1, 4, 4, 0, 0, 0),
    (4, 16, 4, 2, 2, 4, 0, 3, 1),
    (16, 16, 8, 4, 4, 1, 1, 0, 0),
    (32, 32, 8, 8, 4, 4, 1, 2, 0),
]
SHAPES = [(1, 1, 1), (7, 13, 5), (33, 65, 17), (64, 48, 32), (100, 37, 129)]
EPILOGUES = ["none", "bias", "relu", "bias+gelu_tanh", "bias+gelu_erf", "silu", "bias+relu"]


def config_of(c) -> PipelineConfig:
    tm, tn, tk, wm, wn, vw, local, raster, pack = c
    return PipelineConfig(tile_m=tm, tile_n=tn, tile_k=tk, stages=1, warps=1,
                          params={"wg_m": wm, "wg_n": wn, "vw": vw, "local": local, "raster": raster,
                                  "pack": pack})


def run_gemm(op: GemmOp, config: PipelineConfig, profile, oracle, seed: int = 0):
    from tracea_opencl import to_device
    from tracea_opencl.arrays import PyOpenCLAdapter
    from tracea_opencl.gemm import OpenCLGemm

    rng = np.random.default_rng(seed)
    np_in = op.dtype_a.numpy
    a_shape = (op.batch, *((op.k, op.m) if op.trans_a else (op.m, op.k)))
    b_shape = (op.batch, *((op.n, op.k) if op.trans_b else (op.k, op.n)))
    a = rng.standard_normal(a_shape).astype(np_in)
    b = rng.standard_normal(b_shape).astype(np_in)
    bias = rng.standard_normal(op.n).astype(op.out_dtype.numpy) if op.epilogue.has_bias else None
    dev = profile.device
    out = oracle.poisoned((op.batch, op.m, op.n), op.out_dtype.numpy, dev)
    args = OpArgs({"a": to_device(a, dev), "b": to_device(b, dev),
                   "bias": None if bias is None else to_device(bias, dev)}, out, PyOpenCLAdapter())
    variant = OpenCLGemm()
    assert variant.check(op, profile) == []
    variant.run(op, config, args, profile)
    return oracle.rel_error(out.get(), oracle.gemm(op, a, b, bias))


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_shapes(cl_profile, oracle, cfg, shape):
    m, n, k = shape
    assert run_gemm(GemmOp(m, n, k), config_of(cfg), cl_profile, oracle) < 1e-5


@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[1], CONFIGS[4]], ids=["packed", "direct", "local"])
def test_gemm_epilogues(cl_profile, oracle, epilogue, cfg):
    op = GemmOp(45, 70, 33, epilogue=epilogue)
    assert run_gemm(op, config_of(cfg), cl_profile, oracle, seed=3) < 1e-5


@pytest.mark.parametrize("trans_a,trans_b", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "x".join(map(str, c)))
def test_gemm_transposes_and_batch(cl_profile, oracle, trans_a, trans_b, cfg):
    op = GemmOp(29, 41, 23, batch=3, trans_a=trans_a, trans_b=trans_b, epilogue="bias+silu")
    assert run_gemm(op, config_of(cfg), cl_profile, oracle, seed=5) < 1e-5


@pytest.mark.parametrize("out_dtype", [DType.F16, DType.F32])
@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[1], CONFIGS[4]], ids=["packed", "direct", "local"])
def test_gemm_fp16(cl_profile, oracle, out_dtype, cfg):
    op = GemmOp(37, 64, 40, dtype_a=DType.F16, dtype_b=DType.F16, dtype_out=out_dtype,
                epilogue=Epilogue.parse("bias+gelu_tanh"))
    assert run_gemm(op, config_of(cfg), cl_profile, oracle, seed=7) < 2e-3


def test_gemm_search_space_and_heroes(cl_profile, oracle):
    from tracea_opencl.gemm import OpenCLGemm

    op = GemmOp(50, 70, 30, epilogue="bias+relu")
    variant = OpenCLGemm()
    space = variant.search_space(op, cl_profile)
    configs = list(space)
    assert len(configs) >= 8
    for cfg in configs:
        assert variant.validate_config(op, cfg, cl_profile), cfg.key
    heroes = variant.hero_configs(op, cl_profile)
    assert heroes and all(variant.validate_config(op, h, cl_profile) for h in heroes)
    rng = np.random.default_rng(11)
    for cfg in [heroes[0], *(configs[i] for i in rng.choice(len(configs), 3, replace=False))]:
        assert run_gemm(op, cfg, cl_profile, oracle, seed=13) < 1e-5, cfg.key


def test_gemm_invalid_config_is_rejected(cl_profile):
    from tracea.errors import UnsupportedConfigError
    from tracea_opencl.gemm import OpenCLGemm

    op = GemmOp(16, 16, 16)
    bad = config_of((10, 32, 8, 4, 16, 1, 0, 0, 0))  # tile_m not a multiple of wg_m
    validity = OpenCLGemm().validate_config(op, bad, cl_profile)
    assert not validity and "wg_m" in validity.reason
    with pytest.raises(UnsupportedConfigError, match="wg_m"):
        OpenCLGemm().prepare(op, bad, cl_profile)


def test_gpu_hero_configs_are_correct_on_any_device(cl_profile, oracle):
    """The GPU heroes (local-memory staging, 16x16 work-groups, float4) run on CPU runtimes too, so CI
    checks the GPU design's numerics even without a GPU."""
    from tracea_opencl import spaces

    gpu = cl_profile.with_(extras={**cl_profile.extras, "device_type": "gpu"})
    heroes = spaces.hero_configs(gpu, 130, 257)
    assert heroes and all(c.get("local") == 1 for c in heroes)
    for cfg in heroes:
        op = GemmOp(130, 257, 47, trans_b=True, epilogue="bias+gelu_erf")
        assert run_gemm(op, cfg, cl_profile, oracle, seed=17) < 1e-5, cfg.key
