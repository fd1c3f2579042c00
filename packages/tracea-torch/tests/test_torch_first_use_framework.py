"""First-use tuning's framework check for ``tracea.ops`` on torch tensors: with ``tracea.set_tuning("first-use")``
the first call of a signature Tracea serves is timed against PyTorch's own call (the arbiter, verdict
persisted), and the faster serves the signature; off by default, never with a forced variant or ``out=``.

The framework's direct call exists for CUDA tensors; these CPU tests hand the adapter the same call for CPU
tensors (``_direct_matmul``) so the wiring runs without a GPU."""

from __future__ import annotations

import pytest
import torch

import tracea
from tracea import ops
from tracea.runtime import fallbacks as core_fallbacks
from tracea.runtime import plans
from tracea.tuning.cache import TuningCache, get_cache, set_cache
from tracea_torch import adapter as torch_adapter
from tracea_torch import arbiter

pytestmark = [pytest.mark.torch, pytest.mark.arbiter]


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    set_cache(TuningCache(tmp_path / "cache.json"))
    arbiter.reset()
    plans.invalidate("test")
    monkeypatch.setattr(torch_adapter.TorchAdapter, "direct_fallback",
                        lambda self, op, like: torch_adapter._direct_matmul(op, like)
                        if type(op).__name__ == "GemmOp" else None)
    yield
    tracea.set_tuning(None)
    arbiter.reset()
    set_cache(None)
    plans.invalidate("test")


def _inputs(n: int = 24):
    g = torch.Generator().manual_seed(n)
    return torch.randn(5, n, generator=g), torch.randn(n, n, generator=g), torch.randn(n, generator=g)


def test_first_use_serves_the_faster_framework_call(restricted_backend, rel_err):
    # one torch thread: the testkit kernel's NumPy call leaves OpenBLAS workers spinning, which slowed a
    # two-thread torch.addmm on a 2-core VM to ~8 ms (the interference of issue 17), and Tracea won
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _serves_the_framework(restricted_backend, rel_err)
    finally:
        torch.set_num_threads(threads)


def _serves_the_framework(restricted_backend, rel_err):
    x, w, b = _inputs()
    ref = torch.relu(torch.addmm(b, x, w))
    tracea.set_tuning("first-use")
    out = ops.matmul(x, w, bias=b, activation="relu")
    assert rel_err(out, ref) < 1e-5
    run = plans.latest().runner
    # the testkit kernel (NumPy on views) against torch.addmm: PyTorch is faster and serves the signature
    assert run.launch is None and run.reason.startswith("arbiter:"), (run.reason, arbiter.verdicts())
    (v,) = arbiter.verdicts()
    assert v.winner == "torch" and v.variant == "testkit.gemm"
    assert any(e.variant == arbiter.NAME for e in get_cache().entries())  # persisted like a layer's verdict
    calls = restricted_backend.gemm.calls
    x2 = torch.randn(5, 24)
    assert rel_err(ops.matmul(x2, w, bias=b, activation="relu"), torch.relu(torch.addmm(b, x2, w))) < 1e-5
    assert restricted_backend.gemm.calls == calls  # later calls: PyTorch's own, not the kernel
    assert core_fallbacks.counts().get(("gemm", run.reason), 0) >= 2


def test_framework_check_is_off_by_default_and_for_forced_choices(restricted_backend, rel_err):
    x, w, b = _inputs(16)
    out = ops.matmul(x, w, bias=b)  # default policy: off
    assert rel_err(out, torch.addmm(b, x, w)) < 1e-5
    assert plans.latest().runner.variant == "testkit.gemm" and not arbiter.verdicts()
    tracea.set_tuning("first-use")
    ops.matmul(x, w, bias=b, variant="testkit.gemm")  # forced: Tracea's choice stands
    assert plans.latest().runner.variant == "testkit.gemm" and not arbiter.verdicts()
    out = torch.empty(5, 16)
    ops.matmul(x, w, bias=b, out=out)  # out=: no framework side
    assert plans.latest().runner.variant == "testkit.gemm" and not arbiter.verdicts()
    assert rel_err(out, torch.addmm(b, x, w)) < 1e-5


def test_arbiter_off_leaves_tracea_serving(restricted_backend, monkeypatch):
    monkeypatch.setenv(arbiter.ENV, "0")
    x, w, b = _inputs(8)
    tracea.set_tuning("first-use")
    ops.matmul(x, w, bias=b)
    assert plans.latest().runner.variant == "testkit.gemm" and not arbiter.verdicts()


def test_direct_matmul_computes_what_ops_matmul_promises():
    from tracea.ir.epilogue import Epilogue
    from tracea.ir.ops import GemmOp

    g = torch.Generator().manual_seed(3)
    a, b, bias = torch.randn(6, 10, generator=g), torch.randn(10, 7, generator=g), torch.randn(7, generator=g)
    a3, b3 = torch.randn(2, 6, 10, generator=g), torch.randn(2, 10, 7, generator=g)
    prec = torch.get_float32_matmul_precision()
    op = GemmOp(6, 7, 10, epilogue=Epilogue.of("bias", "silu"), fp32_precision=prec)
    torch.testing.assert_close(torch_adapter._direct_matmul(op, a)(a, b, bias), torch.nn.functional.silu(a @ b + bias))
    op3 = GemmOp(12, 7, 10, epilogue=Epilogue.of("bias"), fp32_precision=prec)  # (2, 6, 10) @ (10, 7)
    torch.testing.assert_close(torch_adapter._direct_matmul(op3, a3)(a3, b, bias), a3 @ b + bias)
    bmm = GemmOp(6, 7, 10, batch=2, fp32_precision=prec)
    torch.testing.assert_close(torch_adapter._direct_matmul(bmm, a3)(a3, b3, None), a3 @ b3)
    other = "highest" if prec != "highest" else "high"
    assert torch_adapter._direct_matmul(GemmOp(6, 7, 10, fp32_precision=other), a) is None  # not torch's math
    assert torch_adapter._direct_matmul(GemmOp(6, 7, 10, epilogue=Epilogue.of("bias", "relu", "gelu"),
                                               fp32_precision=prec), a) is None


def _soften(variant, monkeypatch) -> str:
    """Make ``variant`` decline every op with a FrameworkFaster reason only (a speed judgement)."""
    from tracea.doctor import FrameworkFaster

    reason = FrameworkFaster("test: PyTorch's kernel measured faster on such shapes")
    original = variant.check
    monkeypatch.setattr(variant, "check", lambda op, profile: list(original(op, profile)) + [reason])
    return str(reason)


def _arbitrate(monkeypatch, verdict):
    asked = []

    def arbitrate(self, decision, ours, theirs, args):
        asked.append(decision)
        return verdict

    monkeypatch.setattr(torch_adapter.TorchAdapter, "arbitrate", arbitrate)
    return asked


def test_a_framework_faster_decline_falls_back_without_the_check(restricted_backend, rel_err, monkeypatch):
    reason = _soften(restricted_backend.gemm, monkeypatch)
    x, w, b = _inputs(12)
    out = ops.matmul(x, w, bias=b)  # default policy: the judgement stands, PyTorch serves
    assert rel_err(out, torch.addmm(b, x, w)) < 1e-5
    run = plans.latest().runner
    assert run.launch is None and reason in run.reason and restricted_backend.gemm.calls == 0


def test_first_use_times_a_variant_kept_for_the_framework_check(restricted_backend, rel_err, monkeypatch):
    reason = _soften(restricted_backend.gemm, monkeypatch)
    asked = _arbitrate(monkeypatch, ("tracea", "", "tracea"))
    tracea.set_tuning("first-use")
    x, w, b = _inputs(14)
    assert rel_err(ops.matmul(x, w, bias=b), torch.addmm(b, x, w)) < 1e-5
    run = plans.latest().runner
    assert run.variant == "testkit.gemm" and run.decision.chosen.framework_faster == reason
    assert len(asked) == 1 and asked[0].chosen.framework_faster == reason
    calls = restricted_backend.gemm.calls
    ops.matmul(torch.randn(5, 14), w, bias=b)
    assert restricted_backend.gemm.calls == calls + 1  # the check said Tracea: its kernel serves


def test_a_kept_variant_without_a_verdict_gives_way_to_the_framework(restricted_backend, rel_err, monkeypatch):
    reason = _soften(restricted_backend.gemm, monkeypatch)
    _arbitrate(monkeypatch, None)  # the adapter has no opinion (TRACEA_ARBITER=0, say)
    tracea.set_tuning("first-use")
    x, w, b = _inputs(10)
    assert rel_err(ops.matmul(x, w, bias=b), torch.addmm(b, x, w)) < 1e-5
    run = plans.latest().runner
    assert run.launch is None and reason in run.reason
    calls = restricted_backend.gemm.calls
    x2 = torch.randn(5, 10)
    assert rel_err(ops.matmul(x2, w, bias=b), torch.addmm(b, x2, w)) < 1e-5
    assert restricted_backend.gemm.calls == calls


@pytest.mark.parametrize("eager", ["tracea", "framework"])
def test_captured_calls_follow_the_graph_winner(restricted_backend, rel_err, monkeypatch, eager):
    """A verdict whose winner in CUDA graphs differs from the eager one: the plan asks on each call whether
    the stream is capturing (faked here on the CPU) and routes the call to that side's winner."""
    graph = "framework" if eager == "tracea" else "tracea"
    _arbitrate(monkeypatch, (eager, "arbiter: test verdict", graph))
    capturing = [False]
    monkeypatch.setattr(torch_adapter.TorchAdapter, "capturing", lambda self, obj: capturing[0])
    tracea.set_tuning("first-use")
    x, w, b = _inputs(18)
    assert rel_err(ops.matmul(x, w, bias=b), torch.addmm(b, x, w)) < 1e-5
    kernel = restricted_backend.gemm
    for captured in (False, True, False):
        capturing[0] = captured
        calls = kernel.calls
        x2 = torch.randn(5, 18)
        assert rel_err(ops.matmul(x2, w, bias=b), torch.addmm(b, x2, w)) < 1e-5
        winner = graph if captured else eager
        assert kernel.calls == calls + (winner == "tracea"), (captured, winner)


def test_no_framework_check_and_no_kept_variant_for_a_first_call_inside_capture(restricted_backend, rel_err,
                                                                                 monkeypatch):
    """A first call made while the stream captures a CUDA graph cannot be timed: no framework check, so the
    Doctor keeps no FrameworkFaster variant for it either (the decline stands: PyTorch serves)."""
    reason = _soften(restricted_backend.gemm, monkeypatch)
    asked = _arbitrate(monkeypatch, ("tracea", "", "tracea"))
    monkeypatch.setattr(torch_adapter.TorchAdapter, "capturing", lambda self, obj: True)
    tracea.set_tuning("first-use")
    x, w, b = _inputs(22)
    assert rel_err(ops.matmul(x, w, bias=b), torch.addmm(b, x, w)) < 1e-5
    run = plans.latest().runner
    assert not asked and run.launch is None and reason in run.reason
