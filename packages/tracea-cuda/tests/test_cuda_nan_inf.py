"""GPU tests: NaN and Inf through the CUDA GEMM and conv2d kernels (docs/architecture.md, "Numerics";
skipped without a GPU). NaN, +Inf and -Inf must land where the float64 reference (torch, same inputs)
puts them, every activation, every GEMM / conv variant: ReLU was ``fmaxf(v, 0)``, which drops NaN.

The 3xTF32 paths (the mma.sync split in registers and the Hopper split pass) get NaN and +-Inf like the
others. Documented exception (docs/backends/cuda.md): the deferred epilogue of a float16 output gives -0 for GELU / SiLU of an accumulator
that is -Inf itself (PyTorch: NaN)."""

from __future__ import annotations

import numpy as np
import pytest

from tracea.ir.ops import Conv2dOp, GemmOp
from tracea.testing import NONFINITE, inject_nonfinite, nonfinite_mismatch

from tracea_cuda import testing as T
from tracea_cuda.variants import all_variants
from tracea_cuda.variants.base import math_mode

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not T.gpu_available(), reason="needs a CUDA GPU, CuPy and torch")]

VARIANTS = {v.name: v for v in all_variants()}
EPILOGUES = ["bias+relu", "relu", "gelu", "bias+gelu_erf", "silu", "bias+silu"]
NAN_ONLY = (float("nan"),)
# Accepted |out - ref| / max(1, |ref|) per finite element, by math.
ATOL = {"f16": 1e-2, "bf16": 3e-2, "tf32": 3e-2, "3xtf32": 1e-4}
# (variant, input dtype, fp32 precision, needs wgmma, values injected)
GEMMS = [("cuda.gemm.mma_f16", "float16", "highest", False, NONFINITE),
         ("cuda.gemm.mma_f16", "bfloat16", "highest", False, NONFINITE),
         ("cuda.gemm.mma_tf32", "float32", "high", False, NONFINITE),
         ("cuda.gemm.mma_3xtf32", "float32", "highest", False, NONFINITE),
         ("cuda.gemm.gemv", "float16", "highest", False, NONFINITE),
         ("cuda.gemm.gemv", "float32", "highest", False, NONFINITE),
         ("cuda.gemm.skinny_mma", "bfloat16", "highest", False, NONFINITE),
         ("cuda.gemm.skinny_mma", "float16", "highest", False, NONFINITE),
         ("cuda.gemm.wgmma", "float16", "highest", True, NONFINITE),
         ("cuda.gemm.wgmma", "bfloat16", "highest", True, NONFINITE),
         ("cuda.gemm.wgmma_tf32", "float32", "high", True, NONFINITE),
         ("cuda.gemm.wgmma_3xtf32", "float32", "highest", True, NONFINITE)]


def _profile(needs_wgmma: bool):
    profile = T.gpu_profile()
    if needs_wgmma and not profile.has("wgmma"):
        pytest.skip("needs a Hopper GPU (wgmma)")
    return profile


def _configs(variant, op, profile) -> list:
    """The first hero configs, plus the deferred epilogue for a 16-bit wgmma output (heroes offer it for
    big GEMMs only)."""
    configs = variant.hero_configs(op, profile)[:3]
    if variant.name == "cuda.gemm.wgmma":
        from tracea_cuda.variants.hopper import _hero

        defer = _hero(256, 3, 16, cluster=1, defer=True)
        if variant.validate_config(op, defer, profile):
            configs.append(defer)
    return configs


def _deferred_f16(op, config) -> bool:
    """float16 output with a deferred trailing GELU / SiLU: -Inf accumulators give -0 (documented)."""
    last = op.epilogue.steps[-1].value if op.epilogue.steps else ""
    return bool(config.get("defer")) and op.out_dtype.value == "float16" and last in ("gelu_tanh", "gelu_erf", "silu")


def _compare(out, ref, op, math: str) -> str | None:
    ref = ref.reshape(out.shape).to(out.dtype)  # the reference rounded (and overflowed) like the output
    return nonfinite_mismatch(out.double().cpu().numpy(), ref.double().cpu().numpy(), atol=ATOL[math])


@pytest.mark.parametrize("name,dt,prec,hopper,values", GEMMS, ids=lambda x: str(x) if isinstance(x, str) else None)
def test_gemm_random_nonfinite(name, dt, prec, hopper, values):
    profile = _profile(hopper)
    variant = VARIANTS[name]
    rng = np.random.default_rng(len(name) + len(dt))
    for trial, epi in enumerate(EPILOGUES):
        # GEMV: <= 4 rows (16-bit: 1 row, skinny_mma takes more); skinny_mma: <= 16 rows; both B stored (N, K)
        if name.endswith("gemv"):
            m, tb = (1 + trial % 4 if dt == "float32" else 1), True
        elif name.endswith("skinny_mma"):
            m, tb = 1 + 5 * trial % 16, True
        else:
            m, tb = 136, bool(trial % 2)
        op = GemmOp(m, 264, 72, trans_b=tb, dtype_a=dt, dtype_b=dt, fp32_precision=prec, epilogue=epi)
        assert not variant.check(op, profile), variant.check(op, profile)
        for config in _configs(variant, op, profile):
            t = T.gemm_inputs(op, seed=trial)
            vals = NAN_ONLY if _deferred_f16(op, config) else values
            targets = [t["a"], t["b"]] + ([t["bias"]] if t["bias"] is not None else [])
            injected = [inject_nonfinite(rng, targets[int(rng.integers(len(targets)))], 1, vals) for _ in range(2)]
            variant.run(op, config, T.op_args(t), profile)
            msg = _compare(t["out"], T.gemm_reference(op, t), op, math_mode(op.dtype_a, op.fp32_precision))
            assert msg is None, f"{name} {dt} {epi} {config.key} injected {injected}: {msg}"


SPECIAL = [float("nan"), float("inf"), float("-inf"), 0.0, 1.0, -1.0, 3.0, -3.0, 20.0, -20.0, 88.5, -88.5, 100.0,
           -100.0, 1e4, -1e4, 6e4, -6e4, 1e30, -1e30, 3e38, -3e38, 0.5, -0.5]


@pytest.mark.parametrize("name,dt,prec,hopper,values", GEMMS, ids=lambda x: str(x) if isinstance(x, str) else None)
@pytest.mark.parametrize("out", [None, "float32"])
def test_activation_of_special_values(name, dt, prec, hopper, values, out):
    """K = 8, A = [v, 0, ..., 0], B = ones: each output row is act(v (+ bias)) for one special value."""
    import torch

    profile = _profile(hopper)
    variant = VARIANTS[name]
    vals = torch.tensor(SPECIAL, device="cuda")
    gemv = name.endswith(("gemv", "skinny_mma"))  # few rows: the special values go along N (B stored (N, K))
    for epi in ["relu", "bias+relu", "gelu", "gelu_erf", "bias+silu"]:
        m, n = (4, len(SPECIAL)) if gemv else (len(SPECIAL), 64)
        op = GemmOp(m, n, 8, trans_b=gemv, dtype_a=dt, dtype_b=dt, dtype_out=out, fp32_precision=prec, epilogue=epi)
        if variant.check(op, profile):
            continue
        for config in _configs(variant, op, profile):
            t = T.gemm_inputs(op)
            values, ones = (t["b"], t["a"]) if gemv else (t["a"], t["b"])
            values.zero_()
            values[0, :, 0] = vals.to(values.dtype)
            ones.fill_(1.0)
            variant.run(op, config, T.op_args(t), profile)
            ref = T.gemm_reference(op, t)
            got = t["out"]
            if _deferred_f16(op, config):  # rows whose accumulator is -Inf: -0 here (documented)
                acc = values[0, :, 0].double()
                assert (got[0, acc == -float("inf")] == 0).all()
                keep = acc != -float("inf")
                got, ref = got[:, keep], ref[:, keep]
            msg = _compare(got, ref, op, math_mode(op.dtype_a, op.fp32_precision))
            assert msg is None, f"{name} {dt} -> {op.out_dtype.value} {epi} {config.key}: {msg}"


# (variant, layout, dtype, fp32 precision, needs wgmma, values injected)
CONVS = [("cuda.conv2d.implicit_mma", "nhwc", "float16", "highest", False, NONFINITE),
         ("cuda.conv2d.implicit_mma", "nhwc", "bfloat16", "highest", False, NONFINITE),
         ("cuda.conv2d.implicit_mma", "nchw", "float32", "high", False, NONFINITE),
         ("cuda.conv2d.implicit_mma", "nchw", "float32", "highest", False, NONFINITE),
         ("cuda.conv2d.wgmma", "nhwc", "float16", "high", True, NONFINITE),
         ("cuda.conv2d.wgmma", "nchw", "float32", "high", True, NONFINITE),
         ("cuda.conv2d.pointwise", "nchw", "float32", "high", False, NONFINITE),
         ("cuda.conv2d.pointwise", "nhwc", "float16", "highest", False, NONFINITE),
         ("cuda.conv2d.wgmma_nchw1x1", "nchw", "float16", "highest", True, NONFINITE),
         ("cuda.conv2d.wgmma_nchw1x1", "nchw", "bfloat16", "highest", True, NONFINITE),
         ("cuda.conv2d.wgmma_nchw1x1", "nchw", "float32", "high", True, NONFINITE)]


@pytest.mark.parametrize("name,layout,dt,prec,hopper,values", CONVS, ids=lambda x: str(x) if isinstance(x, str) else None)
def test_conv2d_random_nonfinite(name, layout, dt, prec, hopper, values):
    """Zero padding multiplies the weights too: a NaN / Inf weight makes the border outputs NaN (0 * Inf),
    as in PyTorch; the corner tap of one output channel is poisoned every other trial."""
    profile = _profile(hopper)
    variant = VARIANTS[name]
    rng = np.random.default_rng(len(name) + len(layout) + len(dt))
    # the pointwise variants serve 1x1 convs (cuda.conv2d.pointwise: with few channels; 9x11 planes take
    # wgmma_nchw1x1's pitched copy)
    c, k, r = ((24, 16, 1) if name == "cuda.conv2d.pointwise" else (64, 72, 1) if name.endswith("nchw1x1")
               else (64, 72, 3))
    for trial, epi in enumerate(EPILOGUES):
        op = Conv2dOp(2, c, 9, 11, k, r, r, padding=r // 2, layout=layout, dtype=dt, fp32_precision=prec,
                      epilogue=epi)
        assert not variant.check(op, profile), variant.check(op, profile)
        configs = variant.hero_configs(op, profile)
        if name in ("cuda.conv2d.wgmma", "cuda.conv2d.wgmma_nchw1x1"):  # the split-K exchange (fp32 sums) too
            from tracea_cuda.variants.hopper import _hero

            epi = layout == "nhwc" or (name.endswith("1x1") and dt != "float32")
            configs = configs + [_hero(128, 4, smem_epilogue=epi, split_k=4)]
        for config in configs:
            t = T.conv_inputs(op, seed=trial)
            targets = [t["x"], t["w"]] + ([t["bias"]] if t["bias"] is not None else [])
            injected = [inject_nonfinite(rng, targets[int(rng.integers(len(targets)))], 1, values)]
            if trial % 2:
                t["w"][3, 0, 0, 0] = values[-1]  # KCRS / KRSC: tap (0, 0) of output channel 3
            variant.run(op, config, T.op_args(t), profile)
            msg = _compare(t["out"], T.conv_reference(op, t), op, math_mode(op.dtype, op.fp32_precision))
            assert msg is None, f"{name} {layout} {dt} {epi} {config.key} injected {injected}: {msg}"
