"""NaN and Inf through the bf16 GEMM (``cpu.gemm.avx512bf16``): bf16 inputs with NaN / +-Inf at random
positions, a bf16 or fp32 bias, bf16 or fp32 output, every activation, the blocked and the few-rows
drivers, one and several K blocks (partial sums in the fp32 workspace). NaN, +Inf and -Inf must land
exactly where the float64 reference of the same bf16 values puts them (docs/architecture.md,
"Numerics"): the epilogue's ReLU turned NaN into 0 here too."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.doctor.variant import OpArgs
from tracea.ir.ops import GemmOp
from tracea.testing import inject_nonfinite, nonfinite_mismatch
from tracea_cpu.bf16 import CpuGemmBf16Variant
from tracea_cpu.testing import HAVE_CC, PROFILE, config, epilogue_ref

torch = pytest.importorskip("torch")
TorchAdapter = pytest.importorskip("tracea_torch.adapter", reason="bf16 inputs come as torch tensors").TorchAdapter

pytestmark = [pytest.mark.torch,
              pytest.mark.skipif(not HAVE_CC, reason="no C compiler"),
              pytest.mark.skipif(not PROFILE.has("avx512_bf16"), reason="this CPU lacks avx512_bf16")]

VARIANT = CpuGemmBf16Variant()
EPILOGUES = ["none", "bias+relu", "relu", "gelu_tanh", "bias+gelu_erf", "silu"]
# (m, n, k, trans_b, config): blocked, several K blocks, few rows against transposed weights
SHAPES = [(37, 70, 29, False, None), (23, 45, 61, True, dict(mr=6, nr=64, mc=48, nc=4096, kc=16, threads=2)),
          (5, 300, 40, True, dict(mr=4, nr=64, mc=72, nc=4096, kc=2048, threads=2))]


def _run(op: GemmOp, a, b, bias, cfg) -> np.ndarray:
    out = torch.full((op.m, op.n), float("nan"), dtype=torch.bfloat16 if op.out_dtype.value == "bfloat16" else torch.float32)
    cfg = config(**cfg) if cfg else VARIANT.hero_configs(op, PROFILE)[0]
    VARIANT.run(op, cfg, OpArgs({"a": a, "b": b, "bias": bias}, out, TorchAdapter()), PROFILE)
    return out.float().numpy()


@pytest.mark.parametrize("out_dtype", ["float32", "bf16"])
@pytest.mark.parametrize("m,n,k,tb,cfg", SHAPES)
def test_bf16_gemm_random_nonfinite(out_dtype, m, n, k, tb, cfg):
    rng = np.random.default_rng([m, n, k, len(out_dtype)])
    for trial, epi in enumerate(EPILOGUES * 2):
        op = GemmOp(m, n, k, trans_b=tb, epilogue=epi, dtype_a="bf16", dtype_b="bf16", dtype_out=out_dtype)
        a = torch.from_numpy(rng.standard_normal((m, k), dtype=np.float32)).bfloat16()
        b = torch.from_numpy(rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)).bfloat16()
        bias = None
        if op.epilogue.has_bias:
            bias = torch.from_numpy(rng.standard_normal(n, dtype=np.float32)).to(
                torch.bfloat16 if trial % 2 else torch.float32)
        targets = [a, b] + ([bias] if bias is not None else [])
        injected = [inject_nonfinite(rng, targets[int(rng.integers(len(targets)))], 1) for _ in range(1 + trial % 3)]
        got = _run(op, a, b, bias, cfg)
        a64, b64 = a.double().numpy(), b.double().numpy()
        with np.errstate(invalid="ignore", over="ignore"):
            ref = epilogue_ref(a64 @ (b64.T if tb else b64), op.epilogue.steps,
                               None if bias is None else bias.double().numpy(), axis=1)
        msg = nonfinite_mismatch(got, ref, atol=1e-2 if out_dtype == "bf16" else 1e-5)
        assert msg is None, f"{(m, n, k, tb)} {epi} -> {out_dtype}, injected {injected}: {msg}"


@pytest.mark.parametrize("epi", ["relu", "gelu_tanh", "gelu_erf", "silu"])
def test_bf16_activation_of_special_values(epi):
    """K = 2 with the second product 0 * 1: each output is act(v) for a bf16 special value v."""
    vals = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, 1.0, -1.0, 3.0, -3.0, 88.5, -88.5, 100.0,
                         -100.0, 1e30, -1e30, 3e38, -3e38]).bfloat16()
    m = vals.numel()
    a = torch.stack([vals, torch.zeros_like(vals)], dim=1)
    b = torch.ones((2, 40)).bfloat16()
    for out_dtype in ("float32", "bf16"):
        op = GemmOp(m, 40, 2, epilogue=epi, dtype_a="bf16", dtype_b="bf16", dtype_out=out_dtype)
        got = _run(op, a, b, None, None)
        with np.errstate(invalid="ignore", over="ignore"):
            ref = epilogue_ref(a.double().numpy() @ b.double().numpy(), op.epilogue.steps, None, axis=1)
        assert nonfinite_mismatch(got, ref, atol=1e-2) is None, (epi, out_dtype, nonfinite_mismatch(got, ref, 1e-2))
