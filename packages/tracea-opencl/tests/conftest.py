"""Fixtures of the OpenCL backend tests: the OpenCL profile (skipping without a platform) and a float64
NumPy reference for GEMM and conv2d with epilogues."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tracea.ir.epilogue import Epilogue, EpilogueKind
from tracea.ir.ops import Conv2dOp, GemmOp, Layout

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


def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf  # noqa: PLC0415

        return erf(x)
    except ImportError:  # pragma: no cover
        return np.vectorize(math.erf)(x)


def apply_epilogue(acc: np.ndarray, epilogue: Epilogue, bias: np.ndarray | None, axis: int) -> np.ndarray:
    """float64 epilogue; the bias broadcasts along ``axis`` of ``acc``."""
    out = acc.astype(np.float64)
    for step in epilogue.steps:
        if step is EpilogueKind.BIAS:
            shape = [1] * out.ndim
            shape[axis] = -1
            out = out + bias.astype(np.float64).reshape(shape)
        elif step is EpilogueKind.RELU:
            out = np.maximum(out, 0.0)
        elif step is EpilogueKind.GELU_TANH:
            out = 0.5 * out * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (out + 0.044715 * out**3)))
        elif step is EpilogueKind.GELU_ERF:
            out = 0.5 * out * (1.0 + _erf(out / math.sqrt(2.0)))
        elif step is EpilogueKind.SILU:
            out = out / (1.0 + np.exp(-out))
    return out


def gemm_reference(op: GemmOp, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    a64 = a.astype(np.float64).reshape(op.batch, *((op.k, op.m) if op.trans_a else (op.m, op.k)))
    b64 = b.astype(np.float64).reshape(op.batch, *((op.n, op.k) if op.trans_b else (op.k, op.n)))
    if op.trans_a:
        a64 = a64.transpose(0, 2, 1)
    if op.trans_b:
        b64 = b64.transpose(0, 2, 1)
    return apply_epilogue(a64 @ b64, op.epilogue, bias, axis=2)


def conv_reference(op: Conv2dOp, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """Direct float64 convolution returning the op's physical output layout."""
    x64 = x.astype(np.float64)
    w64 = w.astype(np.float64)
    if op.layout is Layout.NHWC:
        x64 = x64.transpose(0, 3, 1, 2)
        w64 = w64.transpose(0, 3, 1, 2)
    ph, pw = op.padding
    sh, sw = op.stride
    dh, dw = op.dilation
    xp = np.pad(x64, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    cg, kg = op.c // op.groups, op.k // op.groups
    out = np.zeros((op.n, op.k, op.p, op.q))
    for g in range(op.groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        ws = w64[g * kg:(g + 1) * kg]
        for r in range(op.r):
            for s in range(op.s):
                rows = slice(r * dh, r * dh + sh * (op.p - 1) + 1, sh)
                cols = slice(s * dw, s * dw + sw * (op.q - 1) + 1, sw)
                patch = xs[:, :, rows, cols]
                out[:, g * kg:(g + 1) * kg] += np.einsum("nchw,kc->nkhw", patch, ws[:, :, r, s])
    out = apply_epilogue(out, op.epilogue, bias, axis=1)
    return out.transpose(0, 2, 3, 1) if op.layout is Layout.NHWC else out


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
