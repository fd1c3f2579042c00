"""``tracea.ops`` with pyopencl arrays: the Doctor picks the OpenCL variants from the arrays' device."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.opencl


def test_matmul_through_dispatch(cl_profile, oracle):
    import tracea
    from tracea.ir.epilogue import Epilogue
    from tracea_opencl import to_device

    rng = np.random.default_rng(21)
    a = rng.standard_normal((3, 19, 27)).astype(np.float32)
    b = rng.standard_normal((3, 27, 30)).astype(np.float32)
    bias = rng.standard_normal(30).astype(np.float32)
    dev = cl_profile.device
    out = tracea.ops.matmul(to_device(a, dev), to_device(b, dev), bias=to_device(bias, dev), activation="gelu")
    assert type(out).__module__ == "pyopencl.array"
    ref = oracle.apply_epilogue(a.astype(np.float64) @ b, Epilogue.parse("bias+gelu_tanh"), bias, axis=2)
    assert oracle.rel_error(out.get(), ref) < 1e-5


def test_transposed_view_runs_without_copy(cl_profile, oracle):
    import tracea
    from tracea_opencl import to_device

    rng = np.random.default_rng(22)
    at = rng.standard_normal((40, 25)).astype(np.float32)  # stored (k, m)
    b = rng.standard_normal((40, 33)).astype(np.float32)
    a_view = to_device(at, cl_profile.device).transpose()
    out = tracea.ops.matmul(a_view, to_device(b, cl_profile.device))
    assert oracle.rel_error(out.get(), at.T.astype(np.float64) @ b) < 1e-5


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv2d_through_dispatch(cl_profile, oracle, layout):
    import tracea
    from tracea.ir.ops import Conv2dOp
    from tracea_opencl import to_device

    op = Conv2dOp(2, 6, 11, 10, 8, 3, 3, stride=2, padding=1, layout=layout, epilogue="bias+relu")
    rng = np.random.default_rng(23)
    x = rng.standard_normal(op.x_shape).astype(np.float32)
    w = rng.standard_normal(op.w_shape).astype(np.float32)
    bias = rng.standard_normal(op.k).astype(np.float32)
    dev = cl_profile.device
    y = tracea.ops.conv2d(to_device(x, dev), to_device(w, dev), to_device(bias, dev), stride=2, padding=1,
                          layout=layout, activation="relu")
    assert oracle.rel_error(y.get(), oracle.conv(op, x, w, bias)) < 1e-5


def test_doctor_lists_opencl_device_and_chooses_the_variant(cl_profile):
    from tracea.doctor.doctor import get_doctor
    from tracea.ir.ops import GemmOp

    doctor = get_doctor()
    assert cl_profile.device in [p.device for p in doctor.profiles()]
    decision = doctor.decide(GemmOp(64, 64, 64, epilogue="relu"), cl_profile.device)
    assert decision.chosen.variant.name == "opencl.gemm.tiled"
    assert doctor.environment(cl_profile)["opencl_driver"] == cl_profile.driver_version
