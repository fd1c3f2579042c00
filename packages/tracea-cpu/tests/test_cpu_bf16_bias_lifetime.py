"""A bf16 GEMM's bias is widened to a fresh fp32 array for the kernel's epilogue; that array must stay
referenced until the kernel has read it. It used to be created inside the ``_ptr(...)`` call
expression, so it was freed before the C kernel ran and the output was garbage (relative error 1e8 to
1e35, or NaN, varying from run to run)."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

from tracea.doctor.variant import OpArgs
from tracea.ir.ops import GemmOp
from tracea_cpu import bf16 as bf16_mod
from tracea_cpu.testing import HAVE_CC, PROFILE

torch = pytest.importorskip("torch")
TorchAdapter = pytest.importorskip("tracea_torch.adapter", reason="bf16 inputs come as torch tensors").TorchAdapter

pytestmark = [pytest.mark.torch,
              pytest.mark.skipif(not HAVE_CC, reason="no C compiler"),
              pytest.mark.skipif(not PROFILE.has("avx512_bf16"), reason="this CPU lacks avx512_bf16")]


def test_fuzz_report_shape_through_dispatch():
    """The reported case: (17, 2) @ (2, 640) + bias, all bf16, fp32 epilogue on a widened bias."""
    import tracea

    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        a = torch.randn(17, 2, generator=g).bfloat16()
        b = torch.randn(2, 640, generator=g).bfloat16()
        bias = torch.randn(640, generator=g).bfloat16()
        out = tracea.ops.matmul(a, b, bias=bias, variant="cpu.gemm.avx512bf16")
        ref = a.double() @ b.double() + bias.double()
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, err  # bf16 output rounding: ~2e-3


@pytest.mark.parametrize("bias_dtype", ["bfloat16", "float32"])
def test_widened_bias_is_alive_when_the_kernel_runs(monkeypatch, bias_dtype):
    """Deterministic: the bias array the variant builds is tracked with a finalizer, and the kernel
    entry point checks, when it is called, that the finalizer has not run."""
    state = {"freed": False, "alive_at_call": None}
    real_bias, real_plan = bf16_mod.bias_f32, bf16_mod._bf16_plan

    def tracked_bias(args, n):
        arr = np.array(real_bias(args, n), copy=True)  # fresh, referenced only by the variant
        weakref.finalize(arr, state.__setitem__, "freed", True)
        return arr

    def checked_plan(variant, op, config, *rest):
        fn, call, ref = real_plan(variant, op, config, *rest)

        def kernel(*a):
            state["alive_at_call"] = not state["freed"]
            return fn(*a)

        return kernel, call, ref

    monkeypatch.setattr(bf16_mod, "bias_f32", tracked_bias)
    monkeypatch.setattr(bf16_mod, "_bf16_plan", checked_plan)
    variant = bf16_mod.CpuGemmBf16Variant()
    op = GemmOp(17, 640, 2, epilogue="bias", dtype_a="bf16", dtype_b="bf16", dtype_out="bf16")
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(17, 2, generator=g).bfloat16(), torch.randn(2, 640, generator=g).bfloat16()
    bias = torch.randn(640, generator=g).to(getattr(torch, bias_dtype))
    out = torch.full((17, 640), float("nan"), dtype=torch.bfloat16)
    variant.run(op, variant.hero_configs(op, PROFILE)[0], OpArgs({"a": a, "b": b, "bias": bias}, out,
                                                                  TorchAdapter()), PROFILE)
    assert state["alive_at_call"] is True
    ref = a.double() @ b.double() + bias.double()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2
