"""tracea_torch.ops.conv2d / linear: results, every fallback reason, opcheck, gradcheck, autograd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tracea
import tracea_torch
from tracea_torch import fallbacks

pytestmark = pytest.mark.torch

ACTS = {None: lambda t: t, "relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
        "silu": F.silu}

CONV_CASES = [
    # (n, c, h, w, k, r, s, stride, padding, dilation, groups)
    (2, 3, 9, 7, 5, 3, 3, 1, 1, 1, 1),
    (1, 4, 8, 8, 6, 1, 1, 1, 0, 1, 1),
    (2, 4, 11, 10, 8, 3, 3, 2, 1, 1, 1),
    (1, 3, 7, 9, 4, 5, 3, (2, 1), (2, 0), 1, 1),
    (1, 6, 9, 9, 6, 3, 3, 1, 2, 2, 1),
    (2, 6, 8, 8, 4, 3, 3, 1, 1, 1, 2),
]


def _conv_inputs(case, dtype=torch.float32, bias=True):
    n, c, h, w, k, r, s, stride, padding, dilation, groups = case
    x = torch.randn(n, c, h, w, dtype=dtype)
    wt = torch.randn(k, c // groups, r, s, dtype=dtype) / (c * r * s) ** 0.5
    b = torch.randn(k, dtype=dtype) if bias else None
    return x, wt, b, dict(stride=stride, padding=padding, dilation=dilation, groups=groups)


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("act", [None, "relu", "gelu"])
def test_conv2d_matches_torch_through_reference(reference_backend, rel_err, case, act):
    x, w, b, kw = _conv_inputs(case)
    out = tracea_torch.ops.conv2d(x, w, b, activation=act, **kw)
    ref = ACTS[act](F.conv2d(x, w, b, **kw))
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert rel_err(out, ref) < 1e-5
    assert fallbacks.total() == 0


def test_conv2d_runs_a_tracea_variant_zero_copy(restricted_backend, rel_err):
    x, w, b, kw = _conv_inputs(CONV_CASES[2])
    out = tracea_torch.ops.conv2d(x, w, b, activation="silu", **kw)
    assert restricted_backend.conv.calls == 1
    assert fallbacks.total() == 0
    assert rel_err(out, F.silu(F.conv2d(x, w, b, **kw))) < 1e-5


@pytest.mark.parametrize("act", ["relu", "gelu_tanh", "silu", None])
def test_linear_runs_a_tracea_gemm_with_fused_epilogue(restricted_backend, rel_err, act):
    x = torch.randn(3, 5, 24)
    w = torch.randn(17, 24) / 24 ** 0.5
    b = torch.randn(17)
    out = tracea_torch.ops.linear(x, w, b, activation=act)
    assert restricted_backend.gemm.calls == 1 and fallbacks.total() == 0
    assert out.shape == (3, 5, 17)
    assert rel_err(out, ACTS[act](F.linear(x, w, b))) < 1e-5
    out_nb = tracea_torch.ops.linear(x[0], w)
    assert rel_err(out_nb, F.linear(x[0], w)) < 1e-5


def test_channels_last_runs_nhwc_or_falls_back_with_layout_reason(restricted_backend, rel_err):
    x, w, b, kw = _conv_inputs(CONV_CASES[0])
    xc = x.to(memory_format=torch.channels_last)
    out = tracea_torch.ops.conv2d(xc, w, b, **kw)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert rel_err(out, F.conv2d(x, w, b, **kw)) < 1e-5
    # the testkit serves NCHW only: the Doctor's reason names the layout
    assert fallbacks.total("conv2d", "layout NHWC not supported") == 1


def test_channels_last_through_reference(reference_backend, rel_err):
    x, w, b, kw = _conv_inputs(CONV_CASES[2])
    out = tracea_torch.ops.conv2d(x.to(memory_format=torch.channels_last), w, b, activation="relu", **kw)
    assert out.is_contiguous(memory_format=torch.channels_last) and fallbacks.total() == 0
    assert rel_err(out, torch.relu(F.conv2d(x, w, b, **kw))) < 1e-5


@pytest.mark.parametrize("name, make, reason", [
    ("groups", lambda: _conv_inputs(CONV_CASES[5]), "groups=2 not supported"),
    ("dilation", lambda: _conv_inputs(CONV_CASES[4]), "dilation=(2, 2) not supported"),
    ("dtype", lambda: _conv_inputs(CONV_CASES[0], dtype=torch.float64), "input dtype float64 not in"),
])
def test_conv2d_doctor_rejections_fall_back_with_reason(restricted_backend, rel_err, name, make, reason):
    x, w, b, kw = make()
    out = tracea_torch.ops.conv2d(x, w, b, **kw)
    assert rel_err(out, F.conv2d(x, w, b, **kw)) < 1e-6
    assert restricted_backend.conv.calls == 0
    assert fallbacks.total("conv2d", reason) == 1, fallbacks.counts()


def test_conv2d_non_contiguous_input_is_served_on_a_packed_copy(restricted_backend, rel_err):
    x, w, b, kw = _conv_inputs(CONV_CASES[0])
    xs = torch.randn(2, 3, 9, 14)[..., ::2]  # strided view
    keep = xs.clone()
    out = tracea_torch.ops.conv2d(xs, w, b, **kw)
    assert rel_err(out, F.conv2d(xs, w, b, **kw)) < 1e-6 and out.is_contiguous()
    assert fallbacks.total("conv2d", "non-contiguous") == 0, fallbacks.counts()
    assert restricted_backend.conv.calls == 1 and torch.equal(xs, keep)


def test_bfloat16_falls_back_and_matches_torch(restricted_backend):
    x, w, b, kw = _conv_inputs(CONV_CASES[0], dtype=torch.bfloat16)
    out = tracea_torch.ops.conv2d(x, w, b, **kw)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, F.conv2d(x, w, b, **kw))
    assert fallbacks.total("conv2d", "bfloat16") == 1


def test_only_reference_serves_means_pytorch_computes(monkeypatch, rel_err):
    from tracea_torch import policy

    monkeypatch.delenv(policy.ENV_REFERENCE, raising=False)
    # no compiled backend at all: only the reference oracle accepts the op
    tracea.plugins.set_plugin_manager(tracea.plugins.create_plugin_manager(blocked=["cpu", "cuda", "opencl"]))
    try:
        x, w, b, kw = _conv_inputs(CONV_CASES[0])
        with policy.allow_reference(False):
            out = tracea_torch.ops.conv2d(x, w, b, **kw)
        assert rel_err(out, F.conv2d(x, w, b, **kw)) < 1e-6
        assert fallbacks.counts() == {("conv2d", "no conv2d kernel for cpu installed (only the reference oracle)"): 1}
        with policy.allow_reference(True):  # opted in: the reference runs it, no fallback
            out = tracea_torch.ops.conv2d(x, w, b, **kw)
        assert rel_err(out, F.conv2d(x, w, b, **kw)) < 1e-5 and fallbacks.total() == 1
    finally:
        tracea.plugins.set_plugin_manager(None)


def test_mixed_dtypes_and_empty_and_integer_inputs_behave_like_torch(restricted_backend):
    x, w, b, kw = _conv_inputs(CONV_CASES[0])
    with pytest.raises(RuntimeError):
        F.conv2d(x, w.double(), b, **kw)
    with pytest.raises(RuntimeError):
        tracea_torch.ops.conv2d(x, w.double(), b, **kw)
    assert fallbacks.total("conv2d", "different dtypes") == 1
    empty = tracea_torch.ops.conv2d(x[:0], w, b, **kw)
    assert empty.shape == F.conv2d(x[:0], w, b, **kw).shape
    assert fallbacks.total("conv2d", "empty tensor") == 1
    lin = tracea_torch.ops.linear(torch.randn(4, 6).double(), torch.randn(3, 6).double())
    assert lin.dtype == torch.float64 and fallbacks.total("gemm", "input dtype float64") == 1


def test_fallback_warns_once_per_reason(restricted_backend, monkeypatch):
    monkeypatch.setenv(fallbacks.ENV_WARN, "1")
    x, w, b, kw = _conv_inputs(CONV_CASES[5])
    with pytest.warns(fallbacks.FallbackWarning, match="groups=2"):
        tracea_torch.ops.conv2d(x, w, b, **kw)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tracea_torch.ops.conv2d(x, w, b, **kw)  # same reason: no second warning
    assert fallbacks.total("conv2d", "groups=2") == 2


def test_fallbacks_show_in_doctor_report(restricted_backend):
    from tracea.doctor.report import build_report

    x, w, b, kw = _conv_inputs(CONV_CASES[5])
    tracea_torch.ops.conv2d(x, w, b, **kw)
    report = build_report(tracea.get_doctor())
    assert any(f["op"] == "conv2d" and "groups=2" in f["reason"] for f in report["fallbacks"])


def test_padding_same_valid_and_unbatched(reference_backend, rel_err):
    x = torch.randn(3, 8, 9)
    w = torch.randn(4, 3, 4, 2)
    for pad in ("same", "valid"):
        out = tracea_torch.ops.conv2d(x, w, None, padding=pad, dilation=(1, 2))
        assert rel_err(out, F.conv2d(x, w, None, padding=pad, dilation=(1, 2))) < 1e-5
    with pytest.raises(tracea.InvalidArgumentError):
        tracea_torch.ops.conv2d(x, w, None, padding="same", stride=2)
    # nn.Conv2d holds stride as a tuple: (1, 1) with "same" is valid (it used to be compared with a list)
    out = tracea_torch.ops.conv2d(x, w, None, stride=(1, 1), padding="same")
    assert rel_err(out, F.conv2d(x, w, None, padding="same")) < 1e-5
    layer = torch.nn.Conv2d(3, 4, (4, 2), padding="same", bias=True)
    x4 = torch.randn(2, 3, 9, 9)
    with torch.no_grad():
        want = layer(x4)
        patched = tracea_torch.patch_conv2d(layer)
        assert rel_err(patched(x4), want) < 1e-5


def test_bad_activation_is_a_clear_error():
    with pytest.raises(tracea.InvalidArgumentError, match="activation"):
        tracea_torch.ops.linear(torch.randn(2, 3), torch.randn(4, 3), activation="tanhh")


# ------------------------------------------------------------------------------------------------
# autograd, opcheck, gradcheck
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_conv2d_gradients_match_torch(reference_backend, act):
    x, w, b, kw = _conv_inputs(CONV_CASES[2])
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    ref_leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    g = torch.randn(2, 8, 6, 5)
    tracea_torch.ops.conv2d(*leaves, activation=act, **kw).backward(g)
    ACTS[act](F.conv2d(*ref_leaves, **kw)).backward(g)
    for got, want in zip(leaves, ref_leaves):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("act", [None, "relu", "gelu", "silu"])
def test_linear_gradients_match_torch(restricted_backend, act):
    x, w, b = torch.randn(2, 3, 8), torch.randn(5, 8), torch.randn(5)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    ref_leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    g = torch.randn(2, 3, 5)
    tracea_torch.ops.linear(*leaves, activation=act).backward(g)
    ACTS[act](F.linear(*ref_leaves)).backward(g)
    for got, want in zip(leaves, ref_leaves):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5)


def test_opcheck_conv2d(reference_backend):
    x, w, b, _ = _conv_inputs(CONV_CASES[2])
    samples = [
        (x, w, b, [2, 2], [1, 1], [1, 1], 1, "relu"),
        (x.requires_grad_(), w.requires_grad_(), None, [1, 1], [0, 0], [1, 1], 1, "none"),
        (x.detach().to(memory_format=torch.channels_last), w.detach(), b, [1, 1], [1, 1], [1, 1], 1, "silu"),
    ]
    for args in samples:
        torch.library.opcheck(torch.ops.tracea.conv2d.default, args)


def test_opcheck_linear(reference_backend):
    x, w, b = torch.randn(2, 3, 8), torch.randn(5, 8), torch.randn(5)
    for args in [(x, w, b, "gelu"), (x.requires_grad_(), w.requires_grad_(), None, "none")]:
        torch.library.opcheck(torch.ops.tracea.linear.default, args)


def test_gradcheck_double(reference_backend):
    x = torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: tracea_torch.ops.conv2d(*t, stride=1, padding=1, activation="silu"),
                                    (x, w, b))
    xl = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    wl = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    bl = torch.randn(2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: tracea_torch.ops.linear(*t, activation="gelu"), (xl, wl, bl))
    assert torch.autograd.gradgradcheck(lambda *t: tracea_torch.ops.linear(*t, activation="relu"), (xl, wl, bl))


def test_a_failing_kernel_warns_and_pytorch_computes(restricted_backend, monkeypatch, rel_err):
    def broken(self, op, config, args, profile):
        raise RuntimeError("simulated launch failure")

    monkeypatch.setattr(type(restricted_backend.gemm), "run", broken)
    x, w = torch.randn(4, 6), torch.randn(3, 6)
    with pytest.warns(RuntimeWarning, match="simulated launch failure"):
        out = tracea_torch.ops.linear(x, w, None, activation="relu")
    assert rel_err(out, torch.relu(F.linear(x, w))) < 1e-6
    assert fallbacks.total("gemm", "backend error") == 1


def test_linear_edge_shapes_and_inference_mode(restricted_backend, rel_err):
    w = torch.randn(3, 6)
    x1 = torch.randn(6)
    out = tracea_torch.ops.linear(x1, w, activation="silu")  # 1-D input
    assert out.shape == (3,) and rel_err(out, F.silu(F.linear(x1, w))) < 1e-5
    wt = torch.randn(6, 3).t()  # weight stored transposed: read as a plain (k, n) operand, no copy
    x = torch.randn(2, 6)
    assert rel_err(tracea_torch.ops.linear(x, wt), F.linear(x, wt)) < 1e-5
    with torch.inference_mode():
        y = tracea_torch.ops.linear(x, w, torch.randn(3))
    assert y.is_inference() and restricted_backend.gemm.calls == 3 and fallbacks.total() == 0


def test_direct_call_only_in_plain_eager_inference(restricted_backend, rel_err):
    from torch.utils._python_dispatch import TorchDispatchMode

    from tracea_torch.ops import _direct

    x, w = torch.randn(1, 2, 5, 5), torch.nn.Parameter(torch.randn(3, 2, 3, 3))
    assert not _direct(x, w, None)  # the weight requires grad: autograd must record
    with torch.no_grad():
        assert _direct(x, w, None)
        out = tracea_torch.ops.conv2d(x, w, None, padding=1)
    assert rel_err(out, F.conv2d(x, w.detach(), padding=1)) < 1e-5 and restricted_backend.conv.calls == 1

    class Spy(TorchDispatchMode):
        seen: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Spy():
        assert not _direct(x, w, None)
        tracea_torch.ops.conv2d(x, w, None, padding=1)
    assert "tracea.conv2d.default" in Spy.seen  # modes see the op as one node


def test_reference_ranked_first_still_runs_the_real_kernel(restricted_backend, monkeypatch, rel_err):
    # Even when the reference's estimate beats a real kernel's, the Doctor ranks the oracle last.
    monkeypatch.setattr(type(restricted_backend.gemm), "estimate_seconds", lambda self, op, profile, config=None: 1.0)
    tracea.get_doctor().invalidate()
    op = tracea.GemmOp(4, 3, 6, trans_b=True)
    decision = tracea.get_doctor().decide(op, "cpu")
    assert decision.chosen.variant.backend != "reference" and decision.candidates[-1].variant.backend == "reference"
    x, w = torch.randn(4, 6), torch.randn(3, 6)
    out = tracea_torch.ops.linear(x, w)
    assert restricted_backend.gemm.calls == 1 and fallbacks.total() == 0
    assert rel_err(out, F.linear(x, w)) < 1e-5


# --- bad out= / out_dtype / bias dtype through tracea.ops on torch tensors (fuzz findings, issue 13) ---

def test_tracea_ops_torch_expanded_out_is_refused():
    from tracea import ops
    from tracea.errors import InvalidArgumentError

    a, b = torch.randn(8, 8), torch.randn(8, 8)
    out = torch.zeros(8).expand(8, 8)
    with pytest.raises(InvalidArgumentError, match="'out'"):
        ops.matmul(a, b, out=out)


def test_tracea_ops_torch_out_requiring_grad_is_refused():
    from tracea import ops
    from tracea.errors import InvalidArgumentError

    a, b = torch.randn(8, 8), torch.randn(8, 8)
    out = torch.zeros(8, 8, requires_grad=True)
    with pytest.raises(InvalidArgumentError, match="'out'.*grad"):
        ops.matmul(a, b, out=out)


def test_tracea_ops_torch_int_out_dtype_like_numpy():
    from tracea import ops
    from tracea.errors import DTypeError

    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with pytest.raises(DTypeError, match="out_dtype"):
        ops.matmul(a, b, out_dtype="int32")


def test_tracea_ops_torch_fp16_conv_with_float64_bias():
    """The bias is converted to the output dtype before anything (kernel or PyTorch fallback) sees it."""
    from tracea import ops

    x = torch.randn(1, 3, 8, 8, dtype=torch.float16)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float16)
    b = torch.randn(4, dtype=torch.float64)
    out = ops.conv2d(x, w, b, padding=1)
    ref = F.conv2d(x.double(), w.double(), b, padding=1)
    assert out.dtype == torch.float16
    assert float((out.double() - ref).norm() / ref.norm()) < 5e-3


def test_core_ops_fallback_calls_the_framework_directly(restricted_backend, monkeypatch, rel_err):
    """``tracea.ops.conv2d`` on torch tensors no kernel serves: after the first call (through the
    ``tracea_fallback_run`` hook) the plan calls the adapter's direct fallback (``F.conv2d`` on CUDA tensors;
    stood in here for CPU ones), each call counted with the reason; an ``out=`` keeps the hook path."""
    from tracea_torch import eager
    from tracea_torch.adapter import TorchAdapter

    built, hooked = [], []

    def direct(self, op, like):  # noqa: ANN001 - the CUDA rule without the device check
        built.append(op)
        return lambda x, w, bias: torch.relu(F.conv2d(x, w, bias, op.stride, op.padding, op.dilation, op.groups))

    run_logical = eager.run_logical
    monkeypatch.setattr(TorchAdapter, "direct_fallback", direct)
    monkeypatch.setattr(eager, "run_logical", lambda op, arrays: hooked.append(op) or run_logical(op, arrays))
    x, w, b, kw = _conv_inputs(CONV_CASES[5])  # groups=2: the testkit declines it
    ref = torch.relu(F.conv2d(x, w, b, **kw))
    outs = [tracea.ops.conv2d(x, w, b, activation="relu", **kw) for _ in range(3)]
    assert len(built) == 1 and len(hooked) == 1  # the first call through the hook, then direct
    assert all(rel_err(out, ref) < 1e-6 for out in outs)
    assert fallbacks.total("conv2d", "groups=2") == 3
    out = torch.empty_like(ref)
    tracea.ops.conv2d(x, w, b, activation="relu", out=out, **kw)
    tracea.ops.conv2d(x, w, b, activation="relu", out=out, **kw)
    assert len(built) == 1 and len(hooked) == 3 and rel_err(out, ref) < 1e-6


def test_torch_adapter_direct_fallback_rules():
    """CUDA conv2d with at most a bias and one activation, at PyTorch's own float32 precision: F.conv2d
    (+ the activation); CPU tensors only float32 NCHW with row-major strides (oneDNN needs the hook's workarounds
    for the others), a weight in another memory format through the hook; CUDA fp32 ``highest``: None."""
    import types

    from tracea.ir.ops import Conv2dOp
    from tracea_torch.adapter import TorchAdapter

    ad = TorchAdapter()
    op = Conv2dOp(2, 6, 8, 8, 4, 3, 3, stride=1, padding=1, groups=2, dtype="float32", epilogue="bias+silu",
                  fp32_precision="high")
    cuda_like = types.SimpleNamespace(is_cuda=True, dtype=torch.float32)
    fn = ad.direct_fallback(op, cuda_like)
    x, w, b = torch.randn(2, 6, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    torch.testing.assert_close(fn(x, w, b), F.silu(F.conv2d(x, w, b, 1, 1, 1, 2)))
    plain = ad.direct_fallback(Conv2dOp(2, 6, 8, 8, 4, 3, 3, padding=1, groups=2, dtype="float16"),
                               types.SimpleNamespace(is_cuda=True, dtype=torch.float16))
    torch.testing.assert_close(plain(x, w, None), F.conv2d(x, w, None, 1, 1, 1, 2))
    cpu = ad.direct_fallback(op, x)  # float32 NCHW on the CPU: F.conv2d itself
    torch.testing.assert_close(cpu(x, w, b), F.silu(F.conv2d(x, w, b, 1, 1, 1, 2)))
    w_cl = w.contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(cpu(x, w_cl, b), F.silu(F.conv2d(x, w, b, 1, 1, 1, 2)))
    assert ad.direct_fallback(op, x.contiguous(memory_format=torch.channels_last)) is None
    assert ad.direct_fallback(op, x[:, :, :, :].transpose(2, 3)) is None
    bf16 = Conv2dOp(2, 6, 8, 8, 4, 3, 3, padding=1, groups=2, dtype="bfloat16")
    assert ad.direct_fallback(bf16, x.bfloat16()) is None
    exact = Conv2dOp(2, 6, 8, 8, 4, 3, 3, padding=1, groups=2, dtype="float32", fp32_precision="highest")
    assert ad.direct_fallback(exact, cuda_like) is None
