"""``tracea.ops.conv2d``'s lean plan: with a pointer-only launcher, torch channels_last x and w reach the
launcher as they are (no views) and the output is allocated channels_last; anything else (a weight in
NCHW memory, ``out=``, a bias to convert, a launcher that reads more than pointers) keeps the full plan.
The launcher here is a stand-in (CPU): it checks what it is given and computes the conv with PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tracea
from tracea.runtime import dispatch, plans

pytestmark = pytest.mark.torch


class _Launch:
    """A pointer-only launcher recording its arrays; writes F.conv2d's result into ``out``."""

    def __init__(self, pointer_only: bool, stride: int, padding: int) -> None:
        self.pointer_only, self.stride, self.padding, self.calls = pointer_only, stride, padding, []

    def __call__(self, x, w, bias, out) -> None:
        self.calls.append((x, w, bias, out))
        if x.dim() == 4 and x.shape[1] == w.shape[1]:  # logical NCHW tensors (lean path or NCHW)
            xl, wl = x, w
            target = out if out.shape[1] == w.shape[0] else out.permute(0, 3, 1, 2)
        else:  # the full path's NHWC views
            xl, wl, target = x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2), out.permute(0, 3, 1, 2)
        target.copy_(F.conv2d(xl, wl, bias, stride=self.stride, padding=self.padding))


@pytest.fixture
def fake_runner(monkeypatch):
    made = []

    def runner(op, device, adapter, user_arrays, out, **kw):
        launch = _Launch(made[0] if made else True, op.stride[0], op.padding[0])
        made.append(launch)
        return dispatch.Runner(op, None, launch, None), None

    monkeypatch.setattr(dispatch, "runner", runner)
    plans.invalidate("test")
    yield made
    plans.invalidate("test")


def _inputs(cl_x: bool, cl_w: bool, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 8, 9, 7, generator=g, dtype=dtype)
    w = torch.randn(5, 8, 3, 3, generator=g, dtype=dtype) / 8
    b = torch.randn(5, generator=g, dtype=dtype)
    if cl_x:
        x = x.contiguous(memory_format=torch.channels_last)
    if cl_w:
        w = w.contiguous(memory_format=torch.channels_last)
    return x, w, b


@pytest.mark.parametrize("stride,padding", [(1, 1), (2, 0)])
def test_channels_last_operands_reach_a_pointer_only_launcher_as_they_are(fake_runner, stride, padding):
    x, w, b = _inputs(True, True)
    ref = F.conv2d(x.double(), w.double(), b.double(), stride=stride, padding=padding)
    for seed in range(3):  # first call, then the stored plan on fresh arrays of the same signature
        if seed:
            x, w, b = _inputs(True, True, seed=seed)
            ref = F.conv2d(x.double(), w.double(), b.double(), stride=stride, padding=padding)
        out = tracea.ops.conv2d(x, w, b, stride=stride, padding=padding)
        assert out.shape == ref.shape and out.is_contiguous(memory_format=torch.channels_last)
        assert float((out.double() - ref).abs().max()) < 1e-4
    launch = fake_runner[0]
    for xx, ww, _bb, oo in launch.calls[1:]:  # the plan's calls: the caller's tensors themselves
        assert xx.shape[1] == 8 and ww.shape[1] == 8 and oo.shape == ref.shape


@pytest.mark.parametrize("case", ["nchw_weight", "out", "bias_dtype", "not_pointer_only"])
def test_other_calls_keep_the_full_plan(fake_runner, case):
    x, w, b = _inputs(True, case != "nchw_weight")
    kw = {}
    if case == "not_pointer_only":
        fake_runner.append(False)  # the first launcher made reads more than pointers
    if case == "bias_dtype":
        b = b.double()
    if case == "out":
        kw["out"] = torch.empty(2, 5, 9, 7).contiguous(memory_format=torch.channels_last)
    ref = F.conv2d(x.double(), w.double(), b.double(), padding=1)
    for _ in range(2):
        out = tracea.ops.conv2d(x, w, b, padding=1, **kw)
        assert out.shape == ref.shape
        assert float((out.double() - ref).abs().max()) < 1e-4
    launch = fake_runner[-1]
    for xx, ww, _bb, oo in launch.calls:  # NHWC views of x and w, an NHWC output
        assert xx.shape == (2, 9, 7, 8) and ww.shape == (5, 3, 3, 8) and oo.shape == (2, 9, 7, 5)


def test_nchw_packed_operands_take_the_lean_plan(fake_runner):
    x, w, b = _inputs(False, False)
    ref = F.conv2d(x.double(), w.double(), b.double(), padding=1)
    for _ in range(2):
        out = tracea.ops.conv2d(x, w, b, padding=1)
        assert out.is_contiguous() and float((out.double() - ref).abs().max()) < 1e-4
    assert all(c[0] is x and c[1] is w for c in fake_runner[0].calls)
