"""Fixtures of the OpenCL backend tests: the OpenCL profile (skipping without a platform) and a float64
NumPy reference for GEMM and conv2d with epilogues."""

from __future__ import annotations

import numpy as np
import pytest

from tracea import reference
from tracea.ir.ops import Conv2dOp, GemmOp

NO_RUNTIME_HINT = ("no OpenCL platform: run packages/tracea-opencl/ci/setup_opencl_runtime.sh and export "
                   "the lines it prints")


@pytest.fixture(scope="session")
def cl_profile():
    """The profile of the default OpenCL device; skips the test when OpenCL is unusable."""
    from tracea_opencl import runtime
    from tracea_opencl.devices import profile_of

    st = runtime.status()
    if not st.available:
        pytest.skip(st.reason if "setup_opencl_runtime.sh" in st.reason else f"{st.reason}; {NO_RUNTIME_HINT}")
    return profile_of(None)


# The oracle is the core's reference backend (float64), as for every backend.
apply_epilogue = reference.apply_epilogue


def gemm_reference(op: GemmOp, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """float64 (batch, m, n) result of ``op``."""
    return reference.gemm(op, a, b, bias)


def conv_reference(op: Conv2dOp, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """float64 convolution in the op's physical output layout."""
    return reference.conv2d(op, x, w, bias)


def rel_error(out: np.ndarray, ref: np.ndarray) -> float:
    out = out.astype(np.float64)
    assert np.all(np.isfinite(out)), "output holds NaN/inf (unwritten or poisoned elements)"
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-300))


def poisoned(shape, dtype, device):
    """A device array filled with NaN, so unwritten outputs fail the comparison."""
    from tracea_opencl import to_device

    return to_device(np.full(shape, np.nan, dtype=dtype), device)


@pytest.fixture(scope="session")
def oracle():
    """The reference helpers, as a fixture (test modules cannot import conftest under importlib mode)."""
    from types import SimpleNamespace

    return SimpleNamespace(gemm=gemm_reference, conv=conv_reference, rel_error=rel_error, poisoned=poisoned,
                           apply_epilogue=apply_epilogue)
