"""A patched layer's memo of its last call's plan (``tracea_torch.layer_path``): used only while the call
signature, the layer's hyper-parameters, torch's float32 mode and the plan cache's generation are those
the plan was chosen for; never across gradients, invalidations or copies."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tracea_torch
from tracea.runtime import plans
from tracea_torch.layer_path import CallMemo

pytestmark = [pytest.mark.torch]


def _conv() -> nn.Conv2d:
    conv = nn.Conv2d(4, 6, 3, padding=1)
    tracea_torch.patch_conv2d(conv)
    return conv


def _warm(layer: nn.Module, x: torch.Tensor) -> CallMemo:
    with torch.no_grad():
        for _ in range(3):  # plans built, array kinds learned, memo stored
            layer(x)
    memo = layer.__dict__.get("_tracea_memo")
    assert isinstance(memo, CallMemo) and memo.plan is not None
    return memo


def _poison(memo: CallMemo) -> None:
    def boom(*args):  # noqa: ANN002
        raise AssertionError("the memo's plan was used")
    memo.plan = boom


def test_memo_serves_repeated_calls(restricted_backend):
    conv, x = _conv(), torch.randn(2, 4, 9, 9)
    _poison(_warm(conv, x))
    with torch.no_grad(), pytest.raises(AssertionError, match="memo's plan"):
        conv(x)


@pytest.mark.parametrize("kind", ["conv", "linear"])
def test_first_call_stores_a_memo_before_array_kinds_are_learned(restricted_backend, kind):
    """The first call of a process (torch tensors not yet known to the plan cache) builds its memo: it
    used to take the general path until the array kind was learned, so a layer called twice had none."""
    layer, x = (_conv(), torch.randn(2, 4, 9, 9)) if kind == "conv" else (nn.Linear(8, 5), torch.randn(3, 8))
    if kind == "linear":
        tracea_torch.patch_linear(layer)
    plans._forget_kinds()
    with torch.no_grad():
        layer(x)
    assert isinstance(layer.__dict__.get("_tracea_memo"), CallMemo)


@pytest.mark.parametrize("change", ["shape", "layout", "stride_attr", "padding_attr", "weight_shape",
                                    "invalidate", "grad", "precision"])
def test_memo_is_bypassed_when_anything_it_was_chosen_for_changes(restricted_backend, rel_err, change):
    conv, x = _conv(), torch.randn(2, 4, 9, 9)
    _poison(_warm(conv, x))
    if change == "shape":
        x = torch.randn(3, 4, 7, 11)
    elif change == "layout":
        x = x.contiguous(memory_format=torch.channels_last)
    elif change == "stride_attr":
        conv.stride = (2, 2)
    elif change == "padding_attr":
        conv.padding = (0, 1)
    elif change == "weight_shape":
        conv.weight = nn.Parameter(torch.randn(5, 4, 3, 3))
        conv.bias = nn.Parameter(torch.randn(5))
    elif change == "invalidate":
        plans.invalidate("test")
    previous = torch.get_float32_matmul_precision()
    try:
        if change == "precision":
            torch.set_float32_matmul_precision("high" if previous == "highest" else "highest")
        if change == "grad":
            x.requires_grad_(True)
            out = conv(x)
            out.sum().backward()
            assert x.grad is not None
        else:
            with torch.no_grad():
                out = conv(x)
    finally:
        torch.set_float32_matmul_precision(previous)
    ref = F.conv2d(x.detach(), conv.weight.detach(), conv.bias.detach(), conv.stride, conv.padding)
    assert rel_err(out.detach(), ref) < 1e-5


def test_linear_memo_and_its_bypass(restricted_backend, rel_err):
    lin = nn.Linear(8, 5)
    tracea_torch.patch_linear(lin)
    x = torch.randn(3, 8)
    memo = _warm(lin, x)
    with torch.no_grad():
        assert rel_err(lin(x), F.linear(x, lin.weight, lin.bias)) < 1e-5
    _poison(memo)
    with torch.no_grad():
        x2 = torch.randn(4, 2, 8)  # another shape: not the (poisoned) memo, and it becomes the memo
        assert rel_err(lin(x2), F.linear(x2, lin.weight, lin.bias)) < 1e-5
    fresh = lin.__dict__["_tracea_memo"]
    assert fresh is not memo and fresh.check(x2, lin.weight, lin.bias) and not fresh.check(x, lin.weight, lin.bias)
    _poison(fresh)
    with torch.no_grad(), pytest.raises(AssertionError, match="memo's plan"):
        lin(x2)


def test_global_patch_uses_the_memo_too(restricted_backend, rel_err):
    conv = nn.Conv2d(4, 6, 3, padding=1)
    x = torch.randn(2, 4, 9, 9)
    tracea_torch.patch_conv2d()
    try:
        _poison(_warm(conv, x))
        with torch.no_grad(), pytest.raises(AssertionError, match="memo's plan"):
            conv(x)
    finally:
        tracea_torch.unpatch_conv2d()
    with torch.no_grad():  # unpatched: PyTorch, the memo is not consulted
        assert rel_err(conv(x), F.conv2d(x, conv.weight, conv.bias, 1, 1)) < 1e-6


def test_copies_and_pickles_start_empty(restricted_backend, rel_err):
    conv, x = _conv(), torch.randn(2, 4, 9, 9)
    _warm(conv, x)
    for clone in (copy.deepcopy(conv), pickle.loads(pickle.dumps(conv))):
        assert clone.__dict__["_tracea_memo"].plan is None
        with torch.no_grad():
            assert rel_err(clone(x), F.conv2d(x, conv.weight, conv.bias, 1, 1)) < 1e-5
    buf = io.BytesIO()
    torch.save(conv, buf)  # a whole patched module saves (plans are closures, which do not pickle)
    assert buf.tell() > 0


@pytest.mark.parametrize("guard", ["torch", "python"])
def test_memo_guards_compare_every_part_of_the_signature(guard):
    """Both tensor comparisons a memo may use (dynamo's TensorGuards where it behaves as needed, the
    Python stand-in otherwise) tell apart exactly the same things."""
    from tracea_torch import guards

    build = guards.PyGuard if guard == "python" else guards.torch_guard()
    if build is None:
        pytest.skip("this torch has no usable TensorGuards (the Python comparison serves)")
    x, w, b = torch.randn(2, 4, 5, 5), nn.Parameter(torch.randn(6, 4, 3, 3)), nn.Parameter(torch.randn(6))
    check = build(x, w, b).check
    assert check(x, w, b) and check(torch.randn(2, 4, 5, 5), w, b)  # same signature, other data
    assert not check(torch.randn(2, 4, 5, 6), w, b)  # shape
    assert not check(x.contiguous(memory_format=torch.channels_last), w, b)  # strides
    assert not check(x.double(), w, b)  # dtype
    assert not check(x.clone().requires_grad_(), w, b)  # requires_grad
    assert not check(x, w.detach(), b)  # Python type (Parameter vs Tensor)
    assert not check(x, w, guards.NO_TENSOR)  # a missing bias never matches a bias
    assert not check(None, w, b)
    no_bias = build(x, w, guards.NO_TENSOR).check
    assert no_bias(x, w, guards.NO_TENSOR) and not no_bias(x, w, b)


def test_guard_of_a_tensor_passed_twice_matches_the_same_call():
    """``sdpa(x, x, x)`` passes one tensor three times: TensorGuards never matches such a call, so
    guard_of builds the Python comparison for it (a memo that never matched would cost a lookup per call)."""
    from tracea_torch import guards

    x, y = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8)
    check = guards.guard_of(x, x, x, guards.NO_TENSOR).check
    assert check(x, x, x, guards.NO_TENSOR) and check(y, y, y, guards.NO_TENSOR)
    assert not check(x, x, x.double(), guards.NO_TENSOR) and not check(x, x, x, x)


@pytest.mark.parametrize("bias", [True, False])
def test_memo_serves_layers_with_and_without_bias_inside_a_model(restricted_backend, bias):
    """Every patched layer of a model reuses its memo from the second forward on (a guard that never
    matched would pass every test above and still cost a full lookup per call)."""
    from tracea_torch import layer_path

    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=bias), nn.ReLU(), nn.Conv2d(8, 8, 3, bias=bias),
                          nn.Flatten(), nn.Linear(8 * 6 * 6, 5, bias=bias)).eval()
    tracea_torch.patch_conv2d(model)
    tracea_torch.patch_linear(model)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        for _ in range(3):
            model(x)
        for layer in (model[0], model[2], model[4]):
            _poison(layer.__dict__[layer_path._KEY])
        with pytest.raises(AssertionError, match="memo's plan"):
            model(x)


@pytest.mark.arbiter
@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_a_signature_pytorch_serves_calls_pytorch_straight_from_the_layer(restricted_backend, monkeypatch, kind):
    """The arbiter gave the signature to PyTorch: the layer calls F.linear / F.conv2d itself (the plan is
    not called), with gradients too, and a new shape is judged again."""
    from tracea_torch import arbiter

    monkeypatch.setattr(arbiter, "_cpu_alternating", lambda fa, fb: (2.0e-3, 1.0e-3))  # PyTorch faster
    if kind == "linear":
        layer, x = nn.Linear(8, 5), torch.randn(3, 8)
        tracea_torch.patch_linear(layer)
        ref = lambda t: F.linear(t, layer.weight, layer.bias)  # noqa: E731
    else:
        layer, x = _conv(), torch.randn(2, 4, 9, 9)
        ref = lambda t: F.conv2d(t, layer.weight, layer.bias, 1, 1)  # noqa: E731
    memo = _warm(layer, x)
    assert memo.lean
    _poison(memo)
    calls = (restricted_backend.gemm if kind == "linear" else restricted_backend.conv).calls
    with torch.no_grad():
        assert torch.equal(layer(x), ref(x))
    xg = x.clone().requires_grad_(True)
    layer(xg).sum().backward()  # autograd through F.* (another signature: requires_grad differs)
    assert xg.grad is not None
    assert (restricted_backend.gemm if kind == "linear" else restricted_backend.conv).calls == calls


@pytest.mark.arbiter
@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_a_lean_memo_is_matched_without_the_tensor_guard_and_refreshed_on_any_change(restricted_backend,
                                                                                     monkeypatch, kind):
    """A signature PyTorch serves is matched on x's shape / dtype / device and the weight object and dtype
    (the tensor guard is not called: it cost ~1.5 us a layer inside a model); a new shape, a weight converted
    in place or replaced takes the general path again (a new memo), and every result equals the functional call."""
    from tracea_torch import arbiter

    monkeypatch.setattr(arbiter, "_cpu_alternating", lambda fa, fb: (2.0e-3, 1.0e-3))  # PyTorch faster
    if kind == "linear":
        layer, x, x2 = nn.Linear(8, 5), torch.randn(3, 8), torch.randn(4, 8)
        tracea_torch.patch_linear(layer)
        ref = lambda t: F.linear(t, layer.weight, layer.bias)  # noqa: E731
    else:
        layer, x, x2 = _conv(), torch.randn(2, 4, 9, 9), torch.randn(2, 4, 7, 9)
        ref = lambda t: F.conv2d(t, layer.weight, layer.bias, 1, 1)  # noqa: E731
    memo = _warm(layer, x)
    assert memo.lean == 1 and memo.w is layer.weight

    def no_guard(*tensors):  # noqa: ANN002, ANN202
        raise AssertionError("a lean memo called the tensor guard")

    memo.check = no_guard
    with torch.no_grad():
        assert torch.equal(layer(x), ref(x))
        assert layer.__dict__["_tracea_memo"] is memo
        # it reads the plan generation and the environment write count in place: an invalidation or any
        # write through os.environ (a steering variable may have changed) takes the general path again
        plans.invalidate("test")
        layer(x)
        assert layer.__dict__["_tracea_memo"] is not memo
        memo = layer.__dict__["_tracea_memo"]
        assert memo.lean == 1
        layer(x)
        assert layer.__dict__["_tracea_memo"] is memo
        monkeypatch.setenv("TRACEA_TEST_LEAN_WRITE", "1")
        assert torch.equal(layer(x), ref(x))
        assert layer.__dict__["_tracea_memo"] is not memo
        memo = layer.__dict__["_tracea_memo"]
        memo.check = no_guard
        for change in ("replaced", "shape", "dtype"):  # (each from a lean memo)
            if change == "replaced":
                layer.weight = nn.Parameter(layer.weight.detach().clone())
                xx = x
            elif change == "shape":
                xx = x2
            else:
                layer.double()  # converts the parameters in place (the same objects)
                xx = x2.double()
            assert layer.__dict__["_tracea_memo"].lean == 1
            before = layer.__dict__["_tracea_memo"]
            torch.testing.assert_close(layer(xx), ref(xx))
            new = layer.__dict__["_tracea_memo"]
            assert new is not before and new.w in (None, layer.weight), change  # (float64: a plain fallback)


def test_compile_after_eager_calls_left_a_memo(restricted_backend):
    """dynamo traces a patched model whose layers already hold memos (the C++ tensor comparison is not
    traced: compiling takes the custom-op path)."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 5 * 5, 6)).eval()
    tracea_torch.patch_conv2d(model)
    tracea_torch.patch_linear(model)
    x = torch.randn(2, 3, 5, 5)
    with torch.no_grad():
        for _ in range(3):
            ref = model(x)
        assert model[0].__dict__["_tracea_memo"].plan is not None
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(compiled(x), ref, rtol=1e-5, atol=1e-5)


def test_a_plan_for_one_call_only_is_not_remembered(restricted_backend, monkeypatch, rel_err):
    """A first call inside CUDA graph capture gets a plan for that call only (PyTorch computes it): the
    layer keeps no memo of it, so the next call builds the kernel's plan."""
    from tracea_torch import bridge_plans

    real, refused = bridge_plans._launcher, []

    def once(decision):  # noqa: ANN001, ANN202
        if not refused:
            refused.append(1)
            raise bridge_plans._NotNow("first call inside CUDA graph capture (test)")
        return real(decision)

    monkeypatch.setattr(bridge_plans, "_launcher", once)
    conv, x = _conv(), torch.randn(2, 4, 9, 9)
    with torch.no_grad():
        out = conv(x)
        assert "_tracea_memo" not in conv.__dict__ and refused
        assert rel_err(out, F.conv2d(x, conv.weight, conv.bias, padding=1)) < 1e-5
        conv(x)
    memo = conv.__dict__.get("_tracea_memo")
    assert isinstance(memo, CallMemo) and not getattr(memo.plan, "fallback", None)


@pytest.mark.parametrize("kind", ["conv", "linear"])
def test_lean_fallback_memo_calls_torch_and_counts_each_call(kind, monkeypatch):
    """A fallback plan marked lean (CUDA signatures no kernel serves) is short-cut by the layer: F.* is
    called directly (the plan is not) and every call is still counted under the plan's reason."""
    from tracea_torch import bridge_plans, fallbacks, layer_path

    if kind == "conv":
        layer, x = nn.Conv2d(4, 6, 3, padding=1, groups=2), torch.randn(2, 4, 9, 9)
        tracea_torch.patch_conv2d(layer)
        ref = F.conv2d(x, layer.weight, layer.bias, padding=1, groups=2)
        plan = bridge_plans._conv_eager(None, None, ((1, 1), (1, 1), (1, 1), 2, None), "test reason", lean=True)
        hyper = dict(stride=layer.stride, padding=layer.padding, dilation=layer.dilation, groups=layer.groups)
    else:
        layer, x = nn.Linear(8, 5), torch.randn(3, 8)
        tracea_torch.patch_linear(layer)
        ref = F.linear(x, layer.weight, layer.bias)
        plan = bridge_plans._linear_eager(None, None, None, "test reason", lean=True)
        hyper = {}
    assert plan.lean and plan.count[1] == "test reason"

    def boom(*args):  # noqa: ANN002, ANN202
        raise AssertionError("the plan was called")

    boom.lean, boom.count = True, plan.count
    layer.__dict__["_tracea_memo"] = layer_path._memo(plans.generation(), x, layer.weight, layer.bias, None, boom,
                                                      act=None, **hyper)
    fallbacks.reset()
    with torch.no_grad():
        outs = [layer(x) for _ in range(3)]
    assert all(torch.equal(o, ref) for o in outs)
    assert fallbacks.total(contains="test reason") == 3


def test_cpu_linear_on_a_strided_input_is_served_after_a_packing_copy(monkeypatch):
    """A CPU linear on a strided view (ViT's class token, BERT's pooler input) is served by a Tracea kernel
    on a packed copy of x (not a "non-contiguous input" fallback), in fp32 and bf16, x untouched; with
    the arbiter on, the verdict decides between that and F.linear."""
    from tracea_torch import fallbacks

    monkeypatch.setenv("TRACEA_ARBITER", "0")
    for dt, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        layer = nn.Linear(16, 5).to(dt)
        tracea_torch.patch_linear(layer)
        h = torch.randn(3, 7, 16).to(dt)
        x = h[:, 0]  # (3, 16), row stride 7 * 16
        keep = h.clone()
        fallbacks.reset()
        with torch.no_grad():
            outs = [layer(x) for _ in range(3)]
            want = F.linear(x.double(), layer.weight.double(), layer.bias.double())
        assert all(o.dtype == dt and ((o.double() - want).norm() / want.norm()) < tol for o in outs)
        assert fallbacks.total(contains="non-contiguous") == 0, fallbacks.counts()
        assert torch.equal(h, keep)


@pytest.mark.parametrize("dt,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_cpu_conv_on_a_channel_slice_is_served_after_a_packing_copy(dt, tol, memory_format):
    """A CPU conv whose input is a channel slice (CSPNet's and GhostNet's split halves: neither NCHW-contiguous
    nor channels_last) runs a Tracea kernel on a packed NCHW copy, not a "non-contiguous input" fallback; the
    output is NCHW-contiguous (the memory-format rule of every conv plan) and x is untouched."""
    from tracea_torch import fallbacks

    torch.manual_seed(3)
    layer = nn.Conv2d(12, 10, 3, padding=1).to(dt)
    tracea_torch.patch_conv2d(layer)
    h = torch.randn(2, 29, 9, 11).to(dt).contiguous(memory_format=memory_format)
    x = h[:, 5:17]
    assert not x.is_contiguous() and not x.is_contiguous(memory_format=torch.channels_last)
    keep = h.clone()
    fallbacks.reset()
    with torch.no_grad():
        outs = [layer(x) for _ in range(3)]
        want = F.conv2d(x.double(), layer.weight.double(), layer.bias.double(), padding=1)
    assert all(o.dtype == dt and o.is_contiguous() and ((o.double() - want).norm() / want.norm()) < tol for o in outs)
    assert fallbacks.total(contains="non-contiguous") == 0, fallbacks.counts()
    assert torch.equal(h, keep)


@pytest.mark.parametrize("dtype,layout", [(torch.float16, "NHWC"), (torch.bfloat16, "NHWC"),
                                          (torch.float32, "NCHW")])
def test_conv_input_contiguous_both_ways_takes_the_layout_kernels_serve(dtype, layout):
    """A squeeze-excite conv's input (N, C, 1, 1) is NCHW- and channels_last-contiguous at once (the
    same memory): 16-bit calls take NHWC (the 16-bit kernels' layout), fp32 NCHW."""
    from tracea.dtypes import DType
    from tracea_torch import bridge_plans

    x = torch.randn(4, 16, 1, 1, dtype=dtype).contiguous(memory_format=torch.channels_last)
    w = torch.randn(8, 16, 1, 1, dtype=dtype)
    dt = {torch.float16: DType.F16, torch.bfloat16: DType.BF16, torch.float32: DType.F32}[dtype]
    op = bridge_plans._conv_op(x, w, None, (1, 1), (0, 0), (1, 1), 1, None, dt)
    assert op.layout.name == layout


def test_memo_of_a_routed_plan_calls_torch_unless_capturing(monkeypatch):
    """The arbiter gave eager calls to PyTorch and captured ones to Tracea (``lean_eager``): the layer calls
    ``F.linear`` itself while its stream is not capturing, and runs the routed plan while it is."""
    from tracea_torch import layer_path

    layer, x = nn.Linear(8, 5), torch.randn(3, 8)
    tracea_torch.patch_linear(layer)
    ran = []

    def routed(xx, w, b):  # noqa: ANN001, ANN202
        ran.append(1)
        return F.linear(xx, w, b) + 1

    routed.lean_eager = True
    memo = layer_path._memo(plans.generation(), x, layer.weight, layer.bias, None, routed, act=None)
    assert memo.lean == 2
    layer.__dict__["_tracea_memo"] = memo
    capturing = [False]
    monkeypatch.setattr(layer_path, "_capturing", lambda: capturing[0])
    with torch.no_grad():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias)) and not ran
        capturing[0] = True
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias) + 1) and ran
    # a fused activation PyTorch has as a function: the lean call applies it after F.linear
    relu_memo = layer_path._memo(plans.generation(), x, layer.weight, layer.bias, None, routed, act="relu")
    assert relu_memo.lean == 2 and relu_memo.actfn is F.relu
    layer.__dict__["_tracea_memo"] = relu_memo
    layer.activation = "relu"
    capturing[0] = False
    with torch.no_grad():
        assert torch.equal(layer(x), F.relu(F.linear(x, layer.weight, layer.bias)))


def test_a_weight_that_is_no_registered_parameter_is_read_as_an_attribute(restricted_backend, rel_err):
    """The patched forward reads weight and bias from the parameter dict (the fast way); a layer whose
    weight a hook computes (``torch.nn.utils.weight_norm``: ``weight`` is a plain attribute) and a layer
    whose parameters were replaced after calls give the unpatched layer's result."""
    import warnings

    torch.manual_seed(3)
    base, layer = nn.Linear(8, 5), nn.Linear(8, 5)
    layer.load_state_dict(base.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # weight_norm is deprecated in favour of parametrizations
        base, layer = torch.nn.utils.weight_norm(base), torch.nn.utils.weight_norm(layer)
    assert "weight" not in layer._parameters
    tracea_torch.patch_linear(layer)
    assert type(layer) is not nn.Linear
    x = torch.randn(3, 8)
    with torch.no_grad():
        for _ in range(3):
            assert rel_err(layer(x), base(x)) < 1e-5
        base.weight_g.mul_(2.0)
        layer.weight_g.mul_(2.0)
        assert rel_err(layer(x), base(x)) < 1e-5
        lin = nn.Linear(8, 5)
        tracea_torch.patch_linear(lin)
        for _ in range(3):
            lin(x)
        lin.weight = nn.Parameter(torch.randn(5, 8))
        lin.bias = None
        assert rel_err(lin(x), F.linear(x, lin.weight)) < 1e-5
        conv = _conv()
        y = torch.randn(2, 4, 9, 9)
        for _ in range(3):
            conv(y)
        conv.weight = nn.Parameter(torch.randn(6, 4, 3, 3))
        assert rel_err(conv(y), F.conv2d(y, conv.weight, conv.bias, padding=1)) < 1e-5


@pytest.mark.arbiter
def test_a_lean_conv_memo_follows_hyper_parameter_changes(restricted_backend, monkeypatch):
    """The lean memo is matched in the module's forward: hyper-parameters changed on the module after it
    was built (a padding mode, a stride) still give nn.Conv2d's result."""
    from tracea_torch import arbiter

    monkeypatch.setattr(arbiter, "_cpu_alternating", lambda fa, fb: (2.0e-3, 1.0e-3))  # PyTorch faster
    layer, x = _conv(), torch.randn(2, 4, 9, 9)
    plain = nn.Conv2d(4, 6, 3, padding=1)
    plain.load_state_dict(layer.state_dict())
    assert _warm(layer, x).lean == 1
    with torch.no_grad():
        for change in ("reflect", "stride"):
            if change == "reflect":
                layer.padding_mode = plain.padding_mode = "reflect"
            else:
                layer.padding_mode = plain.padding_mode = "zeros"
                layer.stride = plain.stride = (2, 2)
            torch.testing.assert_close(layer(x), plain(x))
            torch.testing.assert_close(layer(x), plain(x))


@pytest.mark.arbiter
def test_cpu_bf16_depthwise_conv_is_computed_in_fp32():
    """A channels_last bf16 depthwise conv on the CPU (no kernel: the standing verdict) is PyTorch's, but computed
    in fp32 and rounded once (PyTorch's bf16 CPU depthwise kernel runs 10-45x slower than its fp32 one): the layer
    keeps its plan (no lean F.conv2d call in bf16), every call equals the fp32 conv rounded to bf16, counted once.
    An NCHW one is judged against that same fp32 computation (``cpu.conv2d.depthwise.*`` serves bf16)."""
    from tracea_torch import arbiter, fallbacks

    layer = nn.Conv2d(6, 6, 3, padding=1, groups=6).bfloat16()
    tracea_torch.patch_conv2d(layer)
    x = torch.randn(2, 6, 9, 9).bfloat16().contiguous(memory_format=torch.channels_last)
    fallbacks.reset()
    with torch.no_grad():
        outs = [layer(x) for _ in range(3)]
        want = F.conv2d(x.float(), layer.weight.float(), layer.bias.float(), padding=1, groups=6).bfloat16()
    assert all(o.dtype == torch.bfloat16 and torch.equal(o, want) for o in outs)
    assert layer.__dict__["_tracea_memo"].lean == 0
    assert fallbacks.total(contains="depthwise") == 1
    nchw = nn.Conv2d(6, 6, 3, padding=1, groups=6).bfloat16()
    tracea_torch.patch_conv2d(nchw)
    x = x.contiguous()
    arbiter.reset()
    with torch.no_grad():
        outs = [nchw(x) for _ in range(3)]
        want = F.conv2d(x.float(), nchw.weight.float(), nchw.bias.float(), padding=1, groups=6)
    judged = [v for v in arbiter.verdicts() if v.op.startswith("conv2d")]
    assert judged and judged[-1].variant.startswith("cpu.conv2d.depthwise."), judged
    for o in outs:  # one rounding of an fp32 result either way (one bf16 ulp: the two fp32 sums may differ)
        assert o.dtype == torch.bfloat16 and ((o.float() - want).abs() <= want.abs() * 2 ** -7 + 1e-6).all()


@pytest.mark.arbiter
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_16bit_conv_judged_to_pytorch_is_computed_in_fp32(monkeypatch, dtype):
    """A 16-bit conv on the CPU that the arbiter gives to PyTorch runs PyTorch's side as every CPU
    fallback does -- fp32, rounded once -- where PyTorch's own 16-bit call measured slower
    (``tracea_torch.cpu16``: here every first side timed is slower), not ``F.conv2d`` in 16 bits from the
    layer (no lean memo): after the first call (the checks), ``F.conv2d`` never sees a 16-bit input."""
    from tracea_torch import arbiter

    monkeypatch.setattr(arbiter, "_cpu_alternating", lambda fa, fb: (fa(), fb(), 2.0e-3, 1.0e-3)[2:])  # 2nd faster
    seen = []
    real = F.conv2d
    monkeypatch.setattr(F, "conv2d", lambda x, *a, **k: seen.append(x.dtype) or real(x, *a, **k))
    layer = nn.Conv2d(8, 16, 3, padding=1).to(dtype)
    tracea_torch.patch_conv2d(layer)
    x = torch.randn(2, 8, 12, 12).to(dtype)
    with torch.no_grad():
        outs = [layer(x)]
        seen.clear()
        outs += [layer(x) for _ in range(2)]
        want = real(x.float(), layer.weight.float(), layer.bias.float(), padding=1).to(dtype)
    assert all(o.dtype == dtype and torch.equal(o, want) for o in outs)
    assert layer.__dict__["_tracea_memo"].lean == 0
    assert seen and set(seen) == {torch.float32}


@pytest.mark.arbiter
def test_cpu_16bit_conv_judged_to_pytorch_uses_its_16_bit_call_where_faster(monkeypatch):
    """The same with PyTorch's 16-bit call measured faster than its float32 path (first side timed faster):
    later calls run ``F.conv2d`` in bfloat16, the unpatched layer's own call."""
    from tracea_torch import arbiter

    monkeypatch.setattr(arbiter, "_cpu_alternating", lambda fa, fb: (fa(), fb(), 1.0e-3, 2.0e-3)[2:])
    monkeypatch.setattr(arbiter, "CPU_WIN_16BIT", 0.0)  # Tracea's kernel never wins the verdict
    seen = []
    real = F.conv2d
    monkeypatch.setattr(F, "conv2d", lambda x, *a, **k: seen.append(x.dtype) or real(x, *a, **k))
    layer = nn.Conv2d(8, 16, 3, padding=1).to(torch.bfloat16)
    tracea_torch.patch_conv2d(layer)
    x = torch.randn(2, 8, 12, 12).to(torch.bfloat16)
    with torch.no_grad():
        layer(x)
        seen.clear()
        outs = [layer(x) for _ in range(2)]
        want = real(x, layer.weight, layer.bias, padding=1)
    assert all(torch.equal(o, want) for o in outs)
    assert seen and set(seen) == {torch.bfloat16}


@pytest.mark.arbiter
def test_cpu_channels_last_depthwise_conv_goes_to_pytorch_without_compiling(monkeypatch):
    """A channels_last depthwise conv on the CPU (no direct NHWC depthwise kernel: the implicit GEMM measured 4-73x
    slower) is PyTorch's by the arbiter's standing verdict: nothing is compiled or timed, the layer calls
    F.conv2d itself (lean), counted once; with the arbiter off Tracea serves it."""
    from tracea_cpu import toolchain
    from tracea_torch import bridge_plans, fallbacks

    layer = nn.Conv2d(6, 6, 3, padding=1, groups=6)
    tracea_torch.patch_conv2d(layer)
    x = torch.randn(2, 6, 9, 9).contiguous(memory_format=torch.channels_last)
    built = []
    real = toolchain.build
    monkeypatch.setattr(toolchain, "build", lambda *a, **k: built.append(a) or real(*a, **k))
    fallbacks.reset()
    with torch.no_grad():
        outs = [layer(x) for _ in range(3)]
    assert not built
    assert all(torch.equal(o, F.conv2d(x, layer.weight, layer.bias, padding=1, groups=6)) for o in outs)
    assert layer.__dict__["_tracea_memo"].lean == 1
    assert fallbacks.total(contains="depthwise") == 1 and bridge_plans.CPU_DEPTHWISE.startswith("arbiter:")
    monkeypatch.setenv("TRACEA_ARBITER", "0")  # Tracea's choice for every served call, depthwise too
    other = nn.Conv2d(6, 6, 3, padding=1, groups=6)
    tracea_torch.patch_conv2d(other)
    with torch.no_grad():
        out = other(x)
    assert other.__dict__["_tracea_memo"].lean == 0 and fallbacks.total(contains="depthwise") == 1
    assert (out - F.conv2d(x, other.weight, other.bias, padding=1, groups=6)).abs().max() < 1e-4


@pytest.mark.arbiter
def test_cpu_nchw_depthwise_conv_is_judged_against_pytorch():
    """An NCHW float32 depthwise conv on the CPU has a direct kernel (``cpu.conv2d.depthwise.*``): the arbiter
    times it against PyTorch on the layer's first call like any other conv (no standing verdict), and the
    layer's outputs match F.conv2d whichever side serves."""
    from tracea_torch import arbiter, fallbacks

    layer = nn.Sequential(nn.Conv2d(24, 24, 5, stride=2, padding=2, groups=24), nn.ReLU())
    tracea_torch.patch_conv2d(layer)
    x = torch.randn(2, 24, 33, 31)
    arbiter.reset()
    fallbacks.reset()
    with torch.no_grad():
        outs = [layer(x) for _ in range(3)]
    ref = F.relu(F.conv2d(x, layer[0].weight, layer[0].bias, stride=2, padding=2, groups=24))
    assert all((o - ref).abs().max() < 1e-4 * ref.abs().max() for o in outs)
    judged = [v for v in arbiter.verdicts() if v.op.startswith("conv2d")]
    assert judged and judged[-1].variant.startswith("cpu.conv2d.depthwise."), judged
    assert fallbacks.total(contains="standing") == 0 and fallbacks.total(contains="implicit GEMM measured") == 0
