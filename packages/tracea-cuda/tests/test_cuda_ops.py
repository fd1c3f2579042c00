"""GPU end-to-end: tracea.ops on CuPy arrays picks a CUDA variant through the Doctor and matches the
float64 reference (skipped without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from tracea_cuda import testing as T

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")]


def _rel(got, ref) -> float:
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("dt,prec,tol", [("float16", None, 2e-3), ("float32", "high", 5e-3),
                                         ("float32", "highest", 1e-5)])
def test_matmul_on_cupy_arrays(dt, prec, tol):
    import cupy as cp

    import tracea

    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 200)).astype(dt)
    b = rng.standard_normal((200, 136)).astype(dt)
    bias = rng.standard_normal(136).astype(dt)
    out = tracea.ops.matmul(cp.asarray(a), cp.asarray(b), bias=cp.asarray(bias), activation="relu",
                            fp32_precision=prec)
    assert isinstance(out, cp.ndarray) and out.shape == (300, 136)
    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64), 0)
    assert _rel(cp.asnumpy(out).astype(np.float64), ref) <= tol


def test_doctor_picks_a_cuda_variant():
    from tracea.doctor.doctor import get_doctor
    from tracea.ir.device import Device
    from tracea.ir.ops import GemmOp

    decision = get_doctor().decide(GemmOp(4096, 4096, 4096, dtype_a="bfloat16", dtype_b="bfloat16"), Device("cuda", 0))
    assert decision.chosen.variant.backend == "cuda"


def test_conv2d_nhwc_on_cupy_arrays():
    import cupy as cp
    import torch
    import torch.nn.functional as F

    import tracea

    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 10, 10, 16)).astype(np.float16)
    w = (rng.standard_normal((24, 3, 3, 16)) / 12).astype(np.float16)
    y = tracea.ops.conv2d(cp.asarray(x), cp.asarray(w), None, stride=1, padding=1, layout="NHWC", activation="relu")
    ref = F.relu(F.conv2d(torch.from_numpy(x).double().permute(0, 3, 1, 2), torch.from_numpy(w).double().permute(0, 3, 1, 2),
                          padding=1)).permute(0, 2, 3, 1).numpy()
    assert _rel(cp.asnumpy(y).astype(np.float64), ref) <= 2e-3
