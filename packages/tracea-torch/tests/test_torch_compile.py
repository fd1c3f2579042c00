"""torch.compile(fullgraph=True) over the tracea custom ops and a patched model (kept small: compiling
is slow on a 2-core machine)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tracea_torch

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    tracea_torch.unpatch_conv2d()
    tracea_torch.unpatch_linear()


def test_compile_fullgraph_forward_and_backward(restricted_backend):
    def fn(x, w, b, lw, lb):
        y = tracea_torch.ops.conv2d(x, w, b, stride=1, padding=1, activation="relu")
        return tracea_torch.ops.linear(y.mean((2, 3)), lw, lb, activation="gelu")

    args = [torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3), torch.randn(4), torch.randn(5, 4), torch.randn(5)]
    leaves = [a.clone().requires_grad_() for a in args]
    ref_leaves = [a.clone().requires_grad_() for a in args]
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    out = compiled(*leaves)
    ref = F.gelu(F.linear(torch.relu(F.conv2d(*ref_leaves[:3], padding=1)).mean((2, 3)), *ref_leaves[3:]))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert restricted_backend.conv.calls >= 1 and restricted_backend.gemm.calls >= 1
    out.sum().backward()
    ref.sum().backward()
    for a, b in zip(leaves, ref_leaves):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # inductor codegen: ~2 s warm, longer on a cold compile cache
def test_compile_patched_model_inductor(restricted_backend):
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 5 * 5, 6),
                          nn.SiLU()).eval()
    x = torch.randn(2, 3, 5, 5)
    ref = model(x)
    tracea_torch.patch_conv2d(model)
    tracea_torch.patch_linear(model)
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x), ref, rtol=1e-5, atol=1e-5)
    assert restricted_backend.conv.calls >= 1 and restricted_backend.gemm.calls >= 1


def test_meta_tensors_and_export(restricted_backend):
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10)).eval()
    tracea_torch.patch_conv2d(model)
    tracea_torch.patch_linear(model)
    x = torch.randn(2, 3, 6, 6)
    ep = torch.export.export(model, (x,))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert "tracea.conv2d.default" in targets and "tracea.linear.default" in targets
    torch.testing.assert_close(ep.module()(x), model(x))
    meta_out = model.to("meta")(x.to("meta"))  # shapes only, through the fake kernels
    assert meta_out.shape == (2, 10) and meta_out.device.type == "meta"


@pytest.mark.arbiter
@pytest.mark.parametrize("lean", [False, True], ids=["tracea-memos", "pytorch-memos"])
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non-strict"])
def test_export_after_eager_calls_left_memos(restricted_backend, monkeypatch, strict, lean):
    """Eager calls leave each patched layer a memo, of a Tracea plan or (the arbiter found PyTorch faster)
    a lean one (the memo hit paths ask only whether dynamo traces); ``torch.export`` afterwards, strict
    (dynamo) or non-strict (fake tensors through the eager code), still records the Tracea custom ops with
    a dynamic batch and gives the eager result."""
    from tracea_torch import arbiter

    if lean:
        monkeypatch.setattr(arbiter, "_cpu_alternating", lambda fa, fb: (2.0e-3, 1.0e-3))  # PyTorch faster
    else:
        monkeypatch.setenv("TRACEA_ARBITER", "0")
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10)).eval()
    tracea_torch.patch_conv2d(model)
    tracea_torch.patch_linear(model)
    x = torch.randn(3, 3, 6, 6)
    with torch.no_grad():
        for _ in range(3):  # plans built, array kinds learned, memos stored
            ref = model(x)
    assert "_tracea_memo" in model[0].__dict__ and bool(model[3].__dict__["_tracea_memo"].lean) == lean
    batch = torch.export.Dim("batch", min=2, max=64)
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: batch},), strict=strict)
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert "tracea.conv2d.default" in targets and "tracea.linear.default" in targets
    torch.testing.assert_close(ep.module()(x), ref)
    x5 = torch.randn(5, 3, 6, 6)
    torch.testing.assert_close(ep.module()(x5), model(x5))


def test_compile_with_global_patch(restricted_backend):
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 5 * 5, 6)).eval()
    x = torch.randn(2, 3, 5, 5)
    ref = model(x)
    with tracea_torch.patched():
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), ref, rtol=1e-5, atol=1e-5)
    assert restricted_backend.conv.calls == 1 and restricted_backend.gemm.calls == 1
