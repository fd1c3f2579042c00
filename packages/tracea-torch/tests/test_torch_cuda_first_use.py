"""First-use tuning's framework check on CUDA tensors (``tracea.set_tuning("first-use")``): the chosen kernel is
timed against PyTorch's own call; whichever serves, results are right and the plan says who runs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tracea  # noqa: E402
from tracea import ops  # noqa: E402
from tracea.runtime import plans  # noqa: E402
from tracea.tuning.cache import TuningCache, set_cache  # noqa: E402
from tracea_torch import arbiter  # noqa: E402

pytestmark = [pytest.mark.cuda, pytest.mark.torch, pytest.mark.arbiter,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


@pytest.fixture(autouse=True)
def _first_use(tmp_path):
    set_cache(TuningCache(tmp_path / "cache.json"))
    arbiter.reset()
    tracea.set_tuning("first-use")
    yield
    tracea.set_tuning(None)
    arbiter.reset()
    set_cache(None)


def _check(out, ref, runner, tol):
    err = float((out.double() - ref.double()).norm() / ref.double().norm())
    assert err < tol, err
    (v,) = [v for v in arbiter.verdicts() if v.variant == (runner.decision.chosen.variant.name)]
    assert (runner.launch is None) == (v.winner == "torch"), (v, runner.reason)


@pytest.mark.parametrize("m,act", [(1, None), (64, "gelu"), (512, "relu")])
def test_matmul_checked_against_torch(m, act):
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, 1024, device="cuda", generator=g).half()
    w = (torch.randn(1024, 768, device="cuda", generator=g) / 32).half()
    b = torch.randn(768, device="cuda", generator=g).half()
    out = ops.matmul(x, w, bias=b, activation=act)
    ref = torch.addmm(b.float(), x.float(), w.float())
    ref = {None: ref, "gelu": torch.nn.functional.gelu(ref), "relu": torch.relu(ref)}[act]
    _check(out, ref, plans.latest().runner, 1e-2)
    again = ops.matmul(x, w, bias=b, activation=act)  # the plan that won serves the next call
    assert torch.equal(again, out) or float((again - out).abs().max()) < 1e-2


def test_conv2d_checked_against_cudnn():
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(2, 64, 28, 28, device="cuda", generator=g).half().to(memory_format=torch.channels_last)
    w = (torch.randn(64, 64, 3, 3, device="cuda", generator=g) / 24).half().to(memory_format=torch.channels_last)
    b = torch.randn(64, device="cuda", generator=g).half()
    out = ops.conv2d(x, w, b, padding=1)
    ref = torch.nn.functional.conv2d(x.float(), w.float(), b.float(), padding=1)
    _check(out, ref, plans.latest().runner, 1e-2)


@pytest.mark.parametrize("batch,dtype", [(2, torch.float16), (1, torch.float32)])
def test_a_grouped_conv_cudnn_was_measured_faster_on_is_checked_not_declined(batch, dtype):
    """ResNeXt's 16 channels per group over 4M multiply-adds: ``cuda.conv2d.depthwise`` declines it with a
    FrameworkFaster reason (cuDNN measured faster), so by default PyTorch serves; with first-use tuning the
    variant is kept and timed against cuDNN on the call, and the verdict decides."""
    from tracea.doctor import FrameworkFaster

    cl = dtype == torch.float16
    fmt = torch.channels_last if cl else torch.contiguous_format
    g = torch.Generator(device="cuda").manual_seed(batch)
    x = torch.randn(batch * 16, 512, 14, 14, device="cuda", generator=g).to(dtype).contiguous(memory_format=fmt)
    w = (torch.randn(512, 16, 3, 3, device="cuda", generator=g) / 12).to(dtype).contiguous(memory_format=fmt)
    b = torch.randn(512, device="cuda", generator=g).to(dtype)
    out = ops.conv2d(x, w, b, padding=1, groups=32)
    ref = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), padding=1, groups=32)
    runner = plans.latest().runner
    assert runner.decision is not None and runner.decision.variant.name == "cuda.conv2d.depthwise", runner.reason
    assert runner.decision.chosen.framework_faster  # kept for the check
    rejected = dict((r.variant, r.reasons) for r in runner.decision.rejected)
    assert not any(isinstance(r, FrameworkFaster) for r in rejected.get("cuda.conv2d.depthwise", []))
    _check(out, ref, runner, 1e-2 if cl else 5e-3)
    tracea.set_tuning(None)
    plans.invalidate("test")
    ops.conv2d(x, w, b, padding=1, groups=32)  # default policy: the decline stands
    assert plans.latest().runner.launch is None and "measured faster" in plans.latest().runner.reason
