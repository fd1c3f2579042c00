"""NaN and Inf through the OpenCL GEMM and conv2d kernels (docs/architecture.md, "Numerics"): NaN, +Inf
and -Inf must land where the float64 reference puts them, every activation, both kernel designs
(direct with packed or in-place B, local memory), conv zero padding included (0 * Inf = NaN). ReLU
was ``fmax(x, 0)``, which returns 0 for NaN."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.doctor.variant import OpArgs
from tracea.ir.ops import Conv2dOp, GemmOp
from tracea.semantic.config import PipelineConfig
from tracea.testing import inject_nonfinite, nonfinite_mismatch

pytestmark = pytest.mark.opencl

EPILOGUES = ["bias+relu", "relu", "gelu_tanh", "bias+gelu_erf", "silu"]
# (tile_m, tile_n, tile_k, wg_m, wg_n, vw, local, raster, pack)
CONFIGS = [(8, 32, 8, 1, 16, 1, 0, 4096, 1), (4, 16, 4, 1, 4, 4, 0, 0, 0), (16, 16, 8, 4, 4, 1, 1, 0, 0)]
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, 1.0, -1.0, 3.0, -3.0, 20.0, -20.0, 88.5, -88.5, 100.0, -100.0,
                    1e30, -1e30, 3e38, -3e38], dtype=np.float32)


def _config(c) -> PipelineConfig:
    tm, tn, tk, wm, wn, vw, local, raster, pack = c
    return PipelineConfig(tile_m=tm, tile_n=tn, tile_k=tk, stages=1, warps=1,
                          params={"wg_m": wm, "wg_n": wn, "vw": vw, "local": local, "raster": raster, "pack": pack})


def _gemm(op, config, profile, a, b, bias) -> np.ndarray:
    from tracea_opencl import to_device
    from tracea_opencl.arrays import PyOpenCLAdapter
    from tracea_opencl.gemm import OpenCLGemm

    dev = profile.device
    out = to_device(np.full((op.batch, op.m, op.n), np.nan, np.float32), dev)
    args = OpArgs({"a": to_device(a, dev), "b": to_device(b, dev),
                   "bias": None if bias is None else to_device(bias, dev)}, out, PyOpenCLAdapter())
    OpenCLGemm().run(op, config, args, profile)
    return out.get()


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "x".join(map(str, c)))
def test_gemm_random_nonfinite(cfg, cl_profile, oracle):
    rng = np.random.default_rng(sum(cfg))
    for trial, epi in enumerate(EPILOGUES * 2):
        op = GemmOp(33, 65, 17, trans_b=bool(trial % 2), epilogue=epi)
        a = rng.standard_normal((1, 33, 17)).astype(np.float32)
        b = rng.standard_normal((1, 65, 17) if op.trans_b else (1, 17, 65)).astype(np.float32)
        bias = rng.standard_normal(65).astype(np.float32) if op.epilogue.has_bias else None
        targets = [a, b] + ([bias] if bias is not None else [])
        injected = [inject_nonfinite(rng, targets[int(rng.integers(len(targets)))], 1) for _ in range(1 + trial % 2)]
        out = _gemm(op, _config(cfg), cl_profile, a, b, bias)
        msg = nonfinite_mismatch(out, oracle.gemm(op, a, b, bias))
        assert msg is None, f"{cfg} {epi} injected {injected}: {msg}"


@pytest.mark.parametrize("epi", ["none", "relu", "gelu_tanh", "gelu_erf", "silu", "bias+relu"])
def test_activation_of_special_values(epi, cl_profile, oracle):
    """K = 2, A = [v, 0], B = ones: each output row is act(v (+ bias))."""
    rng = np.random.default_rng(1)
    m = len(SPECIAL)
    a = np.stack([SPECIAL, np.zeros_like(SPECIAL)], axis=1)[None]
    b = np.ones((1, 2, 40), np.float32)
    op = GemmOp(m, 40, 2, epilogue=epi)
    bias = rng.standard_normal(40).astype(np.float32) if op.epilogue.has_bias else None
    for cfg in CONFIGS:
        out = _gemm(op, _config(cfg), cl_profile, a, b, bias)
        msg = nonfinite_mismatch(out, oracle.gemm(op, a, b, bias), atol=1e-5)
        assert msg is None, f"{cfg} {epi}: {msg}"


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_conv2d_random_nonfinite(layout, cl_profile, oracle):
    from tracea_opencl import to_device
    from tracea_opencl.arrays import PyOpenCLAdapter
    from tracea_opencl.conv2d import OpenCLConv2d

    rng = np.random.default_rng(len(layout))
    dev = cl_profile.device
    for trial, epi in enumerate(EPILOGUES * 2):
        op = Conv2dOp(2, 8, 9, 11, 12, 3, 3, stride=1 + trial % 2, padding=1, groups=1 + 3 * (trial % 3 == 2),
                      layout=layout, epilogue=epi)
        x = rng.standard_normal(op.x_shape).astype(np.float32)
        w = rng.standard_normal(op.w_shape).astype(np.float32)
        bias = rng.standard_normal(op.k).astype(np.float32) if op.epilogue.has_bias else None
        injected = inject_nonfinite(rng, (x, w)[trial % 2], 1)
        if trial % 2:
            w[3, 0, 0, 0] = np.inf  # tap (0, 0) of output channel 3: the padded border gives 0 * Inf = NaN
        for cfg in CONFIGS:
            out = to_device(np.full(op.out_shape, np.nan, np.float32), dev)
            args = OpArgs({"x": to_device(x, dev), "w": to_device(w, dev),
                           "bias": None if bias is None else to_device(bias, dev)}, out, PyOpenCLAdapter())
            OpenCLConv2d().run(op, _config(cfg), args, cl_profile)
            msg = nonfinite_mismatch(out.get(), oracle.conv(op, x, w, bias))
            assert msg is None, f"{layout} {cfg} {epi} injected {injected}: {msg}"
