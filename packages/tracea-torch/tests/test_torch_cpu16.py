"""PyTorch's side of a 16-bit CPU conv (``tracea_torch.cpu16``): its own 16-bit call where that agrees with the
float32 path and is faster on the first call's arrays, else float32; patched 16-bit depthwise convs (PyTorch's
by the arbiter's standing verdict) get that choice."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tracea_torch
from tracea_torch import bridge_plans, cpu16

pytestmark = pytest.mark.torch


def _args(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 4, 10, 10, generator=g).to(dtype)
    w = (torch.randn(6, 4, 3, 3, generator=g) / 6).to(dtype)
    return x, w, torch.randn(6, generator=g).to(dtype)


def _fp32(x, w, b):
    return F.conv2d(x.float(), w.float(), b.float(), 1, 1).to(x.dtype)


def _native(x, w, b):
    return F.conv2d(x, w, b, 1, 1)


def _slowed(fn, seconds):
    def run(*a):
        time.sleep(seconds)
        return fn(*a)
    return run


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_faster_side_serves_when_both_agree(dtype):
    args = _args(dtype)
    fn, why = cpu16.torch_side(_native, _slowed(_fp32, 2e-3), args)
    assert fn is _native and why.startswith("PyTorch's 16-bit call")
    slow_native = _slowed(_native, 2e-3)
    fn, why = cpu16.torch_side(slow_native, _fp32, args)
    assert fn is _fp32 and why.startswith("float32")


def test_float32_serves_when_the_16_bit_call_is_wrong_raises_or_is_missing():
    args = _args()
    wrong = lambda x, w, b: _native(x, w, b) * 1.5  # noqa: E731
    slow_fp32 = _slowed(_fp32, 2e-3)  # (would lose on time: the check of the values decides first)
    fn, why = cpu16.torch_side(wrong, slow_fp32, args)
    assert fn is slow_fp32 and "differs" in why
    nan = lambda x, w, b: torch.full_like(_native(x, w, b), float("nan"))  # noqa: E731
    assert cpu16.torch_side(nan, _fp32, args)[0] is _fp32

    def raising(x, w, b):
        raise RuntimeError("could not create a primitive")

    fn, why = cpu16.torch_side(raising, _fp32, args)
    assert fn is _fp32 and "raised RuntimeError" in why
    assert cpu16.torch_side(None, _fp32, args) == (_fp32, "float32 (no direct 16-bit call for this epilogue)")


@pytest.mark.arbiter
def test_a_patched_16_bit_cpu_depthwise_conv_gets_the_measured_side(monkeypatch):
    """The CPU depthwise verdict (PyTorch's kernel) in bfloat16: the plan computes with what
    ``cpu16.torch_side`` chose on the first call (its float32 path or PyTorch's own 16-bit call), and the
    result matches PyTorch's within bfloat16 rounding."""
    asked = []
    real = cpu16.torch_side

    def spy(native, fp32, args):
        fn, why = real(native, fp32, args)
        asked.append((native is not None, why))
        return fn, why

    monkeypatch.setattr(cpu16, "torch_side", spy)
    layer = nn.Conv2d(8, 8, 3, padding=1, groups=8).to(torch.bfloat16)
    tracea_torch.patch_conv2d(layer)
    x = torch.randn(2, 8, 12, 12).to(torch.bfloat16)
    with torch.no_grad():
        outs = [layer(x) for _ in range(3)]
    assert len(asked) == 1 and asked[0][0], asked  # once per signature, with PyTorch's direct call offered
    with torch.no_grad():
        ref = F.conv2d(x.float(), layer.weight.float(), layer.bias.float(), padding=1, groups=8)
    for o in outs:
        assert o.dtype == torch.bfloat16 and float((o.float() - ref).abs().max()) < 0.05
    assert bridge_plans._cpu_16bit_conv("conv2d", layer.__dict__["_tracea_memo"].plan.op, x.device)
