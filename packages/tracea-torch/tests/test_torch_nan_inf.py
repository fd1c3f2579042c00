"""NaN and Inf through tracea_torch's linear / conv2d on the CPU kernels, against PyTorch's own F.linear /
F.conv2d + activation in float64 on the same tensors (docs/architecture.md, "Numerics"): decode-time
linear (the GEMV route), batched linear, NCHW and channels_last conv, every activation; and the bf16
linear with a bias whose widened fp32 copy used to be freed before the kernel read it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tracea_torch
from tracea.testing import inject_nonfinite, nonfinite_mismatch
from tracea_torch import fallbacks

pytestmark = pytest.mark.torch

ACTS = {None: lambda t: t, "relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
        "silu": F.silu}


def _cpu_backend():
    from tracea_cpu.testing import HAVE_CC

    if not HAVE_CC:
        pytest.skip("no C compiler for the CPU backend")


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_linear_nonfinite_matches_torch(act, rows):
    _cpu_backend()
    rng = np.random.default_rng(rows + len(str(act)))
    for trial in range(4):
        x, w, b = torch.randn(rows, 96), torch.randn(130, 96) / 10, torch.randn(130)
        inject_nonfinite(rng, (x, w, b)[trial % 3], 1 + trial % 2)
        out = tracea_torch.ops.linear(x, w, b, activation=act)
        want = ACTS[act](F.linear(x.double(), w.double(), b.double()))
        assert nonfinite_mismatch(out.numpy(), want.numpy()) is None, (act, rows, trial)
    assert fallbacks.total() == 0, fallbacks.report()


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("channels_last", [False, True])
def test_conv2d_nonfinite_matches_torch(act, channels_last):
    _cpu_backend()
    rng = np.random.default_rng(len(str(act)) + channels_last)
    for trial in range(4):
        x, w, b = torch.randn(2, 16, 9, 9), torch.randn(24, 16, 3, 3) / 12, torch.randn(24)
        inject_nonfinite(rng, (x, w, b)[trial % 3], 1)
        if channels_last:
            x, w = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
        out = tracea_torch.ops.conv2d(x, w, b, padding=1, activation=act)
        want = ACTS[act](F.conv2d(x.double(), w.double(), b.double(), padding=1))
        assert nonfinite_mismatch(out.numpy(), want.numpy()) is None, (act, channels_last, trial)
    assert fallbacks.total() == 0, fallbacks.report()


def test_bf16_linear_with_bias_fuzz_report_shape():
    """(17, 2) @ (2, 640) + bias in bf16 returned garbage (rel. error 1e8-1e35 or NaN) on CPUs with
    AVX512_BF16: the kernel read a freed fp32 copy of the bias. The converting bf16 kernels of AVX2 /
    AVX-512 CPUs widen the bias the same way."""
    _cpu_backend()
    from tracea_cpu.isa import AVX2
    from tracea_cpu.testing import PROFILE

    if not (PROFILE.has("avx512_bf16") or (AVX2.runs_here() and PROFILE.has(*AVX2.requires))):
        pytest.skip("this CPU has no bf16 kernel (neither avx512_bf16 nor AVX2: bf16 runs through PyTorch)")
    for _ in range(10):
        x, w, b = torch.randn(17, 2).bfloat16(), torch.randn(640, 2).bfloat16(), torch.randn(640).bfloat16()
        out = tracea_torch.ops.linear(x, w, b)
        want = F.linear(x.double(), w.double(), b.double())
        assert ((out.double() - want).norm() / want.norm()).item() < 1e-2
    assert fallbacks.total() == 0, fallbacks.report()
