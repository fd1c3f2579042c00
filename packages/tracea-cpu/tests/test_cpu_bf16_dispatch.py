"""How bf16 reaches the CPU backend: the Doctor's verdict (AMX where usable, else AVX512_BF16, "needs
avx512_bf16" where not), ``tracea.ops.matmul`` on torch bf16 tensors end to end, ml_dtypes arrays when
installed, and a DTypeError for arrays the kernel cannot read as bf16."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tracea
from tracea.doctor.variant import OpArgs
from tracea.errors import DTypeError
from tracea.ir.ops import GemmOp
from tracea.runtime.arrays import NumpyAdapter
from tracea_cpu.bf16 import CpuGemmBf16Variant
from tracea_cpu.testing import HAVE_CC, PROFILE, config, rel_err

HAVE_BF16 = PROFILE.has("avx512_bf16")
needs_bf16 = pytest.mark.skipif(not (HAVE_CC and HAVE_BF16), reason="no C compiler or no avx512_bf16 on this CPU")
OP = GemmOp(64, 48, 33, dtype_a="bf16", dtype_b="bf16", dtype_out="bf16")


def test_bf16_variant_rejected_without_avx512_bf16():
    lacking = dataclasses.replace(PROFILE, isa=tuple(f for f in PROFILE.isa if f != "avx512_bf16"))
    reasons = CpuGemmBf16Variant().check(OP, lacking)
    assert any("needs avx512_bf16" in r for r in reasons), reasons


def test_bf16_variant_rejects_fp32_and_f16_outputs_it_cannot_store():
    v = CpuGemmBf16Variant()
    assert any("dtype" in r for r in v.check(GemmOp(8, 8, 8), PROFILE))
    assert any("output dtype" in r for r in v.check(GemmOp(8, 8, 8, dtype_a="bf16", dtype_b="bf16",
                                                           dtype_out="f16"), PROFILE))


@needs_bf16
def test_doctor_chooses_bf16_variant():
    from tracea_cpu.amx import amx_permission

    # AMX (tdpbf16ps) serves bf16 GEMMs where the CPU has it and the OS grants tile data.
    amx = PROFILE.has("amx_tile", "amx_bf16") and amx_permission() is None
    decision = tracea.Doctor().decide(OP, "cpu:0")
    assert decision.variant.name == ("cpu.gemm.amxbf16" if amx else "cpu.gemm.avx512bf16")


@needs_bf16
def test_numpy_float32_arrays_on_a_bf16_op_raise_dtype_error():
    a = np.ones((64, 33), np.float32)
    b = np.ones((33, 48), np.float32)
    out = np.empty((64, 48), np.float32)
    v = CpuGemmBf16Variant()
    with pytest.raises(DTypeError, match="bfloat16"):
        v.run(OP, v.hero_configs(OP, PROFILE)[0], OpArgs({"a": a, "b": b, "bias": None}, out, NumpyAdapter()),
              PROFILE)


@needs_bf16
@pytest.mark.torch
@pytest.mark.parametrize("out_dtype", [None, "float32"])
def test_ops_matmul_torch_bf16_end_to_end(out_dtype):
    torch = pytest.importorskip("torch")
    pytest.importorskip("tracea_torch")
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 45, 67, generator=g).bfloat16()
    b = torch.randn(2, 31, 67, generator=g).bfloat16().transpose(1, 2)  # a transposed view
    bias = torch.randn(31, generator=g).bfloat16()
    c = tracea.ops.matmul(a, b, bias=bias, activation="relu", out_dtype=out_dtype)
    assert c.dtype == (torch.bfloat16 if out_dtype is None else torch.float32)
    ref = torch.relu(a.double() @ b.double() + bias.double())
    assert rel_err(c.double().numpy(), ref.numpy()) < (1e-2 if out_dtype is None else 1e-5)


@needs_bf16
def test_ml_dtypes_bf16_arrays():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((40, 33)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((33, 70)).astype(ml_dtypes.bfloat16)
    out = np.full((40, 70), np.nan, np.float32)
    op = GemmOp(40, 70, 33, dtype_a="bf16", dtype_b="bf16", dtype_out="float32")
    v = CpuGemmBf16Variant()
    v.run(op, config(mr=6, nr=64, mc=48, nc=4096, kc=2048, threads=0),
          OpArgs({"a": a, "b": b, "bias": None}, out, NumpyAdapter()), PROFILE)
    assert rel_err(out, a.astype(np.float64) @ b.astype(np.float64)) < 1e-5


@needs_bf16
@pytest.mark.torch
def test_tuning_bf16_without_ml_dtypes_checks_every_trial():
    # The tuner holds bf16 host inputs as bf16-rounded float32 when NumPy has no bf16; trials are timed
    # on torch bf16 tensors and checked against the float64 reference of the rounded values.
    pytest.importorskip("torch")
    pytest.importorskip("tracea_torch")
    from tracea.tuning.autotuner import AutoTuner
    from tracea.tuning.inputs import InputSets, carried

    op = GemmOp(37, 70, 33, dtype_a="bf16", dtype_b="bf16", dtype_out="bf16", epilogue="bias+relu")
    tuner = AutoTuner(trials=3, cache=False, progress=False, seed=0)
    result = tuner.tune(op, "cpu:0", variant="cpu.gemm.avx512bf16")
    assert result.ok and result.variant == "cpu.gemm.avx512bf16"
    assert all(t.ok for t in result.history if t.status != "invalid"), [t.reason for t in result.history]
    if carried(op.dtypes[0]):
        from tracea_torch.adapter import TorchAdapter

        sets = InputSets(op, tracea.Device.cpu(), TorchAdapter(), count=2)
        a = sets.host[0]["a"]
        assert a.dtype == np.float32 and not (a.view(np.uint32) & 0xFFFF).any()  # bf16-exact values
        assert str(sets.args[0].a.dtype) == "torch.bfloat16"
        sets.poison(0)
        assert np.isnan(sets.output(0)).all() and sets.output(0).dtype == np.float32
