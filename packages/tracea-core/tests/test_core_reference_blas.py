"""The core's NumPy-BLAS GEMM (``reference.gemm_blas``): the default of a core-only install. Checked
against the float64 oracle on fresh random inputs over odd shapes, every dtype, transposes, batches and
epilogues; NaN/Inf propagate as in the oracle; the one-time warning and the Doctor's recommendations."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tracea import GemmOp, ops
from tracea.doctor import recommend
from tracea.doctor.doctor import Doctor
from tracea.errors import ReferenceBackendWarning, TraceaWarning
from tracea.plugins import create_plugin_manager
from tracea.reference import blas, reference
from tracea.testing import output_error

pytestmark = pytest.mark.usefixtures("no_env_plugin_list")

SHAPES = [(1, 1, 1), (7, 13, 5), (33, 17, 65), (64, 48, 31), (129, 3, 257)]


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("trans", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("epi", ["", "bias", "bias+gelu", "relu", "silu"])
def test_blas_gemm_matches_the_float64_oracle(rng, m, n, k, trans, batch, epi):
    op = GemmOp(m, n, k, batch=batch, trans_a=trans[0], trans_b=trans[1], epilogue=epi or None)
    a = rng.standard_normal((batch, *((k, m) if trans[0] else (m, k))), dtype=np.float32)
    b = rng.standard_normal((batch, *((n, k) if trans[1] else (k, n))), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32) if "bias" in epi else None
    got = blas.gemm(op, a, b, bias)
    assert got.shape == (batch, m, n)
    ref = reference(op, a=a, b=b, bias=bias).reshape(got.shape)
    # float32 accumulation: |error| <= (k + 2) eps32 (|a| @ |b| + |bias|) before the activation, whose
    # slope is at most ~1.13 (GELU); an elementwise bound, so cancellation in a*b + bias cannot flake it
    scale = reference(GemmOp(m, n, k, batch=batch, trans_a=trans[0], trans_b=trans[1]),
                      a=np.abs(a), b=np.abs(b)).reshape(got.shape) + (0 if bias is None else np.abs(bias))
    bound = 1.2 * (k + 2) * np.finfo(np.float32).eps * scale + 1e-30
    assert np.all(np.abs(got - ref) <= bound), float(np.max(np.abs(got - ref) / bound))
    assert output_error(op, got, dict(a=a, b=b, bias=bias)) < 1e-4  # and close as a whole


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-13), (np.float32, 3e-6), (np.float16, 3e-6)])
def test_blas_gemm_dtype_semantics(rng, dtype, tol):
    """float64 accumulates in float64; float32 and float16 inputs in float32 (float16 is exact in it)."""
    op = GemmOp(70, 45, 300, epilogue="bias+relu")
    a = rng.standard_normal((70, 300)).astype(dtype)
    b = rng.standard_normal((300, 45)).astype(dtype)
    bias = rng.standard_normal(45).astype(dtype)
    got = blas.gemm(op, a, b, bias)
    assert got.dtype == np.float64  # epilogue ran on the accumulator in float64
    ref = reference(op, a=a, b=b, bias=bias).reshape(got.shape)
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel < tol, rel
    plain = blas.gemm(GemmOp(70, 45, 300), a, b)
    assert plain.dtype == (np.float64 if dtype == np.float64 else np.float32)


def test_blas_gemm_writes_out_in_place_and_keeps_inputs(rng):
    a = rng.standard_normal((2, 31, 17), dtype=np.float32)
    b = rng.standard_normal((2, 17, 9), dtype=np.float32)
    a0, b0 = a.copy(), b.copy()
    out = np.full((2, 31, 9), np.nan, np.float32)
    op = GemmOp(31, 9, 17, batch=2)
    assert blas.gemm(op, a, b, out=out) is out
    assert output_error(op, out, dict(a=a, b=b)) < 3e-6
    assert np.array_equal(a, a0) and np.array_equal(b, b0)


def test_blas_gemm_propagates_nan_and_inf_like_the_oracle(rng):
    op = GemmOp(6, 5, 4, epilogue="relu")
    a = rng.standard_normal((6, 4))
    b = rng.standard_normal((4, 5))
    a[1, 2], a[3, 0], b[0, 4] = np.nan, np.inf, -np.inf
    got = blas.gemm(op, a, b).reshape(6, 5)
    ref = reference(op, a=a, b=b).reshape(6, 5)
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    assert np.array_equal(got[np.isinf(ref)], ref[np.isinf(ref)])


def _core_doctor() -> Doctor:
    return Doctor(create_plugin_manager(autoload=False, blocked=[]))


def test_core_only_ranks_blas_before_the_oracle_and_after_real_backends():
    d = _core_doctor().decide(GemmOp(256, 256, 256), "cpu")
    names = [c.variant.name for c in d.candidates]
    assert names == ["reference.gemm_blas", "reference.gemm"]
    assert not d.chosen.variant.oracle and d.candidates[-1].variant.oracle


def test_matmul_through_the_public_api_uses_blas_and_can_force_the_oracle(rng, monkeypatch):
    a = rng.standard_normal((40, 24), dtype=np.float32)
    b = rng.standard_normal((24, 33), dtype=np.float32)
    out = ops.matmul(a, b, variant="reference.gemm_blas")
    assert out.dtype == np.float32 and output_error(GemmOp(40, 33, 24), out, dict(a=a, b=b)) < 3e-6
    assert np.allclose(ops.matmul(a, b, variant="reference.gemm"), out, rtol=1e-5, atol=1e-5)


def test_reference_only_warning_names_the_package_once(monkeypatch):
    monkeypatch.setattr(recommend, "_warned", set())
    doctor = _core_doctor()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recommend.warn_reference_only(doctor, "gemm", "cpu", "reference.gemm_blas")
        recommend.warn_reference_only(doctor, "conv2d", "cpu", "reference.conv2d")
    assert len(caught) == 1
    w = caught[0]
    assert issubclass(w.category, ReferenceBackendWarning) and issubclass(w.category, TraceaWarning)
    assert "pip install tracea-cpu" in str(w.message) and "tracea doctor" in str(w.message)
    assert w.filename == __file__  # points at the caller, not into tracea


def test_no_warning_when_a_backend_serves_the_device(monkeypatch):
    monkeypatch.setattr(recommend, "_warned", set())
    monkeypatch.setattr(recommend, "served_kinds", lambda doctor: {"cpu"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recommend.warn_reference_only(_core_doctor(), "gemm", "cpu", "reference.gemm_blas")


def test_doctor_recommends_backends_for_the_machine(monkeypatch):
    monkeypatch.setattr(recommend, "nvidia_driver_present", lambda: True)
    monkeypatch.setattr(recommend, "c_compiler", lambda: None)
    recs = {r.package: r for r in recommend.recommendations(_core_doctor())}
    assert "tracea-cuda" in recs and "cuda13" in recs["tracea-cuda"].install
    assert "tracea-cpu" in recs and "no C compiler" not in recs["tracea-cpu"].why
    assert "needs a C compiler" in recs["tracea-cpu"].why
    assert "tracea-opencl" not in recs  # a CUDA GPU is there: OpenCL is not the one to add
    monkeypatch.setattr(recommend, "nvidia_driver_present", lambda: False)
    monkeypatch.setattr(recommend, "opencl_icds", lambda: ["/etc/OpenCL/vendors/x.icd"])
    monkeypatch.setattr(recommend, "served_kinds", lambda doctor: {"cpu"})
    recs = {r.package for r in recommend.recommendations(_core_doctor())}
    assert recs >= {"tracea-opencl"} and "tracea-cpu" not in recs and "tracea-cuda" not in recs


def test_doctor_report_carries_the_recommendations(monkeypatch):
    from tracea.cli.doctor_cmd import render_text
    from tracea.doctor.report import build_report

    monkeypatch.setattr(recommend, "nvidia_driver_present", lambda: False)
    report = build_report(_core_doctor())
    assert any(r["package"] == "tracea-cpu" for r in report["recommendations"])
    assert "Recommended backends for this machine" in render_text(report)
