"""Plans for tracea-torch calls: what one call signature of :func:`bridge.conv2d` / :func:`bridge.linear`
runs from its second call on (see :mod:`tracea.runtime.plans`).

A kernel plan holds the bound launcher and does per call only what the tensors' memory needs: views,
the output allocation (torch's allocator, on the caller's stream), the launch. A fallback plan computes
the call with PyTorch and counts it. A kernel that fails replaces its plan by a fallback plan, so a
broken variant costs one warning, not one exception per call.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import replace
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from tracea.doctor.decision import Decision
from tracea.dtypes import DType
from tracea.errors import (BackendError, CaptureError, DTypeError, KernelFailureWarning, NoVariantError, TraceaError,
                           UnsupportedDeviceError)
from tracea.ir.epilogue import Epilogue
from tracea.ir.ops import Conv2dOp, GemmOp, Layout
from tracea.runtime import plans
from tracea.runtime.dispatch import bind, fallback_reason

from . import arbiter, cpu16, eager, fallbacks, recording, second_chance
from .adapter import stream_capturing, tracea_dtype
from .choice import SERVED_DTYPES, Fallback, choose, epilogue_for, fp32_precision, output_memory_format, \
    parse_activation

_warned_failures: set[str] = set()
_adapter: Any = None


def _torch_adapter() -> Any:
    global _adapter
    if _adapter is None:
        from tracea.doctor.doctor import get_doctor

        _adapter = next(a for a in get_doctor().adapters() if a.name == "torch")
    return _adapter


def _common_checks(tensors: tuple[torch.Tensor | None, ...]) -> DType:
    present = [t for t in tensors if t is not None]
    dev = present[0].device
    if any(t.device != dev for t in present):
        raise Fallback("operands on different devices")
    if any(t.dtype != present[0].dtype for t in present):
        raise Fallback("operands of different dtypes")
    if any(t.numel() == 0 for t in present):
        raise Fallback("empty tensor")
    try:
        dtype = tracea_dtype(present[0].dtype)
    except DTypeError:
        raise Fallback(f"dtype {present[0].dtype} not supported by Tracea") from None
    if dtype not in SERVED_DTYPES:
        raise Fallback(f"dtype {present[0].dtype} not supported by Tracea")
    return dtype


def _plain_bias(bias: torch.Tensor | None, length: int) -> bool:
    return bias is None or (bias.dim() == 1 and bias.shape[0] == length and bias.is_contiguous())


class _NotNow(Exception):
    """Internal: Tracea cannot start this signature *now* (its first call is inside a CUDA graph
    capture): PyTorch computes this call, and nothing is remembered, so a later call binds the kernel."""


def _launcher(decision: Decision) -> Callable[..., None]:
    c = decision.chosen
    try:
        return bind(c.variant, decision.op, c.config, decision.profile, _torch_adapter())
    except CaptureError as exc:
        raise _NotNow(f"first call inside CUDA graph capture ({str(exc).splitlines()[0][:160]})") from exc
    except (NoVariantError, UnsupportedDeviceError) as exc:
        raise Fallback(fallback_reason(exc)) from exc
    except BackendError as exc:
        raise Fallback(_backend_failure(exc)) from exc


def _backend_failure(exc: BackendError) -> str:
    """A variant that fails to compile or launch is a backend bug: say so loudly (once per message)."""
    first = str(exc).splitlines()[0]
    if first not in _warned_failures:
        _warned_failures.add(first)
        warnings.warn(f"tracea: a kernel failed, PyTorch computes this call instead: {first}", KernelFailureWarning,
                      stacklevel=5)
    return f"backend error: {first[:200]}"


def _kernel_plan(key: Any, kind: str, op: Any, extra: tuple, run: Callable[..., torch.Tensor],
                 eager_plan: Callable[[str], Callable[..., torch.Tensor]]) -> Callable[..., torch.Tensor]:
    """Wrap ``run(x, w, bias)``: record the call when a recorder listens (``extra``: the call's other
    arguments); when Tracea cannot run it after all (a backend failure, dispatch refusing it), warn,
    store ``eager_plan(reason)`` for the key and compute this call with it."""
    def plan(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        try:
            out = run(x, w, bias)
        except CaptureError as exc:  # a step that cannot happen inside a capture: PyTorch, this call only
            return eager_plan(f"inside CUDA graph capture ({str(exc).splitlines()[0][:160]})")(x, w, bias)
        except (BackendError, NoVariantError, UnsupportedDeviceError) as exc:
            reason = _backend_failure(exc) if isinstance(exc, BackendError) else fallback_reason(exc)
            fb = eager_plan(reason)
            if key is not None:
                plans.store(key, fb)
            return fb(x, w, bias)
        if recording._recorder is not None:
            recording.note(kind, op, None, (x, w, bias) + extra)
        return out

    plan.op = op  # type: ignore[attr-defined]
    return plan


def _store(key: Any, plan: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    return plans.store(key, plan) if key is not None else plan


# ------------------------------------------------------------------------------------------------
# conv2d
# ------------------------------------------------------------------------------------------------

#: the arbiter's standing verdict on depthwise convs on the CPU (one input channel per group), given
#: without compiling or timing: every one measured lost, 4-73x (2-core Sapphire Rapids VM, batch 2:
#: EfficientNet-B0 541 vs 4188 us and 1127 vs 5748 us, MobileNetV3 323 vs 2230 us, ConvNeXt-T 7x7 0.8 vs
#: 59 ms), while each cost its first call a compilation, the timing and a second chance's compilations
CPU_DEPTHWISE = "arbiter: depthwise conv on the CPU: PyTorch's kernel (Tracea's implicit GEMM measured 4-73x slower)"


def conv2d_plan(key: Any, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: tuple,
                padding: tuple, dilation: tuple, groups: int, activation: str | None) -> Callable[..., torch.Tensor]:
    """Build (and store under ``key``) the plan of one conv2d call signature."""
    act = parse_activation(activation)
    conf = (stride, padding, dilation, groups, activation)
    op = None
    try:
        dtype = _common_checks((x, w, bias))
        op = _conv_op(x, w, bias, stride, padding, dilation, groups, act, dtype)
        cpu_depthwise = x.device.type == "cpu" and op.groups > 1 and op.groups == op.c and arbiter.enabled()
        # (the direct depthwise kernel is judged as any other)
        decision = _depthwise_kernel(op, x.device) if cpu_depthwise else None
        if cpu_depthwise and decision is None:
            fallbacks.record("conv2d", CPU_DEPTHWISE)  # (once per signature, as a verdict)
            # 16-bit: PyTorch's bf16 / fp16 CPU depthwise kernels ran 10-45x slower than its fp32 one (2-core
            # Zen 3 VM, bf16 dw384@14^2 7x7 b2 24.7 vs 0.55 ms), so the plan computes in fp32 (eager.conv2d,
            # as every CPU conv fallback does) unless PyTorch's 16-bit call measures right and faster here
            # (tracea_torch.cpu16); a patched layer must not call F.conv2d itself
            return _store(key, _lean(_conv_torch_side(op, act, conf, (x, w, bias), x.device), "conv2d", op, conf,
                                     CPU_DEPTHWISE, direct_ok=not _cpu_16bit_conv("conv2d", op, x.device)))
        decision = decision or choose(op, x.device)
        via_ops = decision.variant.fallback_only or not _plain_bias(bias, op.k)
        view = not (x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last))
        build_run = None if via_ops else _builder(_packed_input(_conv_run) if view else _conv_run, op, decision, w)
        with _ahead(decision, build_run, x.device) as ahead:  # (alternatives compiled meanwhile)
            run = _conv_via_ops(op, act) if via_ops else _conv_run(op, _launcher(decision), w)
        if view:
            run = _packed_x(run)
        # (PyTorch's side is timed only where the arbiter will judge: not for a fallback-only oracle)
        torch_side = (_conv_torch(op, act, conf) if decision.variant.fallback_only
                      else _conv_torch_side(op, act, conf, (x, w, bias), x.device))
        plan = _arbitrated(key, "conv2d", op, conf, decision, x.device, run, torch_side,
                           lambda reason: _conv_eager(op, act, conf, reason), (x, w, bias), build_run, ahead)
    except _NotNow as why:
        return _transient(_conv_eager(op, act, conf, str(why)))
    except Fallback as fb:
        plan = _conv_eager(op, act, conf, str(fb), lean=x.is_cuda,
                           compute=_conv_torch_side(op, act, conf, (x, w, bias), x.device))
    return _store(key, plan)


def _depthwise_kernel(op: Conv2dOp, device: torch.device) -> Any:
    """The Doctor's decision for a CPU depthwise conv when a direct depthwise kernel serves it
    (``cpu.conv2d.depthwise.*``: NCHW float32 / bfloat16), else None: the standing verdict :data:`CPU_DEPTHWISE`
    stands."""
    if op.layout is not Layout.NCHW or op.dtype.storage not in (DType.F32, DType.BF16):
        return None
    try:
        decision = choose(op, device)
    except Fallback:
        return None
    return decision if ".depthwise." in decision.variant.name else None


def _conv_op(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: tuple, padding: tuple,
             dilation: tuple, groups: int, act: str | None, dtype: DType) -> Conv2dOp:
    if x.dim() != 4 or w.dim() != 4:
        raise Fallback("conv2d needs a 4-D input and weight")
    nchw, nhwc = x.is_contiguous(), x.is_contiguous(memory_format=torch.channels_last)
    if nchw and nhwc:  # 1x1 spatial (squeeze-excite) or one channel: the same memory either way; 16-bit
        layout = Layout.NHWC if dtype in (DType.F16, DType.BF16) else Layout.NCHW  # kernels are NHWC
    elif nchw:
        layout = Layout.NCHW
    elif nhwc:
        layout = Layout.NHWC
    else:  # a view (a channel slice: CSPNet's and GhostNet's split halves): packed per call, _packed_input
        layout = Layout.NCHW
    (n, c, h, wd), (k, cg, r, s) = x.shape, w.shape
    if cg * groups != c:
        raise Fallback("weight shape does not match input channels / groups")
    try:
        return Conv2dOp(n, c, h, wd, k, r, s, stride=stride, padding=padding, dilation=dilation, groups=groups,
                        layout=layout, dtype=dtype, dtype_out=dtype, epilogue=epilogue_for(bias is not None, act),
                        fp32_precision=fp32_precision(x.device.type, conv=True))
    except Exception as exc:  # noqa: BLE001 - PyTorch gives its own error for impossible shapes
        raise Fallback(f"invalid conv2d arguments ({exc})") from None


def _conv_run(op: Conv2dOp, launch: Callable[..., None], w_sample: torch.Tensor) -> Callable[..., torch.Tensor]:
    """NHWC kernels on the channels_last memory of x (a zero-copy view) and of w (a copy unless w is
    channels_last too); NCHW kernels on the packed tensors. A pointer-only launcher gets the tensors
    themselves (same memory, no views) and writes a channels_last output directly."""
    empty, dt, dev = torch.empty, w_sample.dtype, w_sample.device  # fixed by the signature
    if op.layout is Layout.NHWC:
        shape, cl = (op.n, op.k, op.p, op.q), torch.channels_last
        if getattr(launch, "pointer_only", False) and w_sample.permute(0, 2, 3, 1).is_contiguous():
            def run(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
                out = empty(shape, dtype=dt, device=dev, memory_format=cl)
                launch(x, w, bias, out)
                return out
            return run

        def run(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            phys = empty((op.n, op.p, op.q, op.k), dtype=dt, device=dev)
            launch(x.permute(0, 2, 3, 1), w.permute(0, 2, 3, 1).contiguous(), bias, phys)
            return phys.permute(0, 3, 1, 2)
        return run
    shape = op.out_shape
    if getattr(launch, "pointer_only", False) and w_sample.is_contiguous():
        # w's strides are part of the signature: a packed w stays packed, no per-call check
        def run(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:  # type: ignore[no-redef]
            out = empty(shape, dtype=dt, device=dev)
            launch(x, w, bias, out)
            return out
        return run

    def run(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:  # type: ignore[no-redef]
        out = empty(shape, dtype=dt, device=dev)
        launch(x, w if w.is_contiguous() else w.contiguous(), bias, out)
        return out
    return run


def _packed_x(run: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``run`` given a packed copy of ``x`` (for a conv, NCHW): for a signature whose input is a view (a
    conv's neither NCHW-contiguous nor channels_last; the key holds the strides, so every call of it is
    such a view). The copy is part of what the arbiter times against PyTorch's call on the view itself."""
    def packed(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return run(x.contiguous(), w, bias)

    return packed


def _packed_input(make_run: Callable[..., Callable[..., torch.Tensor]]) -> Callable[..., Callable[..., torch.Tensor]]:
    """``make_run`` (:func:`_conv_run`) whose runs pack ``x`` first (:func:`_packed_x`)."""
    return lambda *args: _packed_x(make_run(*args))


def _conv_via_ops(op: Conv2dOp, act: str | None) -> Callable[..., torch.Tensor]:
    """Calls Tracea serves only through ``tracea.ops`` (the reference oracle, an unusual bias)."""
    from tracea import ops

    def run(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = ops.conv2d(x, w, bias, op.stride, op.padding, op.dilation, op.groups, activation=act,
                         fp32_precision=op.fp32_precision)
        return out.contiguous(memory_format=output_memory_format(x))

    return run


def _conv_torch(op: Conv2dOp | None, act: str | None, conf: tuple) -> Callable[..., torch.Tensor]:
    """PyTorch computing the call (what a fallback runs and what the arbiter times)."""
    stride, padding, dilation, groups, _ = conf
    nchw = None if op is None else (op if op.layout is Layout.NCHW else replace(op, layout=Layout.NCHW))
    epi = Epilogue.of(act) if act else None

    def run(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if nchw is not None:
            out = eager.conv2d(nchw, x, w, bias)
        else:
            out = F.conv2d(x, w, bias, stride, padding, dilation, groups)
            if epi is not None:
                out = eager.apply_epilogue(out, epi, None, 1)
        return out.contiguous(memory_format=output_memory_format(x))

    return run


def _transient(plan: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Mark a plan that serves this call only (a first call inside CUDA graph capture): not stored, and a
    patched layer does not remember it either, so the next call builds the real plan."""
    plan.transient = True  # type: ignore[attr-defined]
    return plan


def _leaned(plan: Callable[..., torch.Tensor], kind: str, reason: str, direct: bool) -> Callable[..., torch.Tensor]:
    """A fallback plan a patched layer may short-cut (``lean``): the layer calls ``F.conv2d`` /
    ``F.linear`` itself and counts the fallback (``count``), skipping the plan's frames. Only where the
    plan computes exactly that call (``direct``: no fused activation, a CUDA tensor)."""
    if direct:
        plan.lean = True  # type: ignore[attr-defined]
        plan.count = (kind, reason)  # type: ignore[attr-defined]
    return plan


def _conv_eager(op: Conv2dOp | None, act: str | None, conf: tuple, reason: str,
                lean: bool = False, compute: Callable[..., torch.Tensor] | None = None) -> Callable[..., torch.Tensor]:
    """PyTorch computing a signature no kernel serves (``reason``), each call counted; ``lean``: the
    signature's tensors are on CUDA, so a patched layer may call ``F.conv2d`` itself (see :func:`_leaned`).
    ``compute``: the CPU computation (default :func:`_conv_torch`; see :func:`_conv_torch_side`)."""
    stride, padding, dilation, groups, activation = conf
    compute = compute or _conv_torch(op, act, conf)
    # CUDA tensors: what the unpatched layer runs (F.conv2d and the activation), ~10-20 us less host time
    # than the reference path per call (H200 host, ConvNeXt's depthwise convs, which no kernel serves:
    # 49 vs 28 us); the CPU keeps eager.conv2d (it steps around a oneDNN error, see there)
    direct = _torch_direct("conv2d", op, conf) or compute

    def plan(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        fallbacks.record("conv2d", reason)
        if recording._recorder is not None:
            recording.note("conv2d", op, reason, (x, w, bias, stride, padding, dilation, groups, activation))
        return direct(x, w, bias) if x.is_cuda else compute(x, w, bias)

    plan.op = op  # type: ignore[attr-defined]
    plan.fallback = reason  # type: ignore[attr-defined]
    return _leaned(plan, "conv2d", reason, lean and (act is None or act in _ACT_FNS))


# ------------------------------------------------------------------------------------------------
# linear
# ------------------------------------------------------------------------------------------------

def linear_plan(key: Any, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                activation: str | None) -> Callable[..., torch.Tensor]:
    """Build (and store under ``key``) the plan of one linear call signature."""
    act = parse_activation(activation)
    op = None
    try:
        dtype = _common_checks((x, w, bias))
        op = _linear_op(x, w, bias, act, dtype)
        decision = choose(op, x.device)
        via_ops = decision.variant.fallback_only or not _plain_bias(bias, op.n)
        build_run = None if via_ops else _builder(_linear_run_packed, op, decision, x)
        with _ahead(decision, build_run, x.device) as ahead:
            run = _linear_via_ops(op, act) if via_ops else _linear_run_packed(op, _launcher(decision), x)
        plan = _arbitrated(key, "linear", op, (activation,), decision, x.device, run, _linear_torch(act),
                           lambda reason: _linear_eager(op, act, activation, reason), (x, w, bias), build_run, ahead)
    except _NotNow as why:
        return _transient(_linear_eager(op, act, activation, str(why)))
    except Fallback as fb:
        # lean on the CPU too (unlike conv2d, whose CPU fallback steps around a oneDNN error): F.linear is
        # what the unpatched layer runs (2-core Sapphire Rapids VM, XCiT-nano b2, whose linears mostly see
        # non-contiguous inputs: 0.94x eager with the full memo check per call)
        plan = _linear_eager(op, act, activation, str(fb), lean=True)
    return _store(key, plan)


def _linear_op(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, act: str | None, dtype: DType) -> GemmOp:
    if x.dim() < 1 or w.dim() != 2 or x.shape[-1] != w.shape[1]:
        raise Fallback("shapes do not match x @ w.T")
    # (a non-contiguous x is copied to packed memory per call: _linear_run_packed)
    # w (n, k) is used transposed without a copy: the GEMM reads B stored n x k.
    trans_b = w.is_contiguous()
    if not trans_b and not w.t().is_contiguous():
        raise Fallback("non-contiguous weight")
    return GemmOp(x.numel() // x.shape[-1], w.shape[0], w.shape[1], trans_b=trans_b, dtype_a=dtype, dtype_b=dtype,
                  dtype_out=dtype, epilogue=epilogue_for(bias is not None, act),
                  fp32_precision=fp32_precision(x.device.type, False))


def _linear_run(op: GemmOp, launch: Callable[..., None], x_sample: torch.Tensor) -> Callable[..., torch.Tensor]:
    """B = w (n, k) read transposed when packed, else w.t() is the packed (k, n) operand. A pointer-only
    launcher gets x (..., k) and an (..., n) output as they are (same memory as the (m, k) / (m, n)
    operands): no views."""
    m, n, k, trans_b, empty = op.m, op.n, op.k, op.trans_b, torch.empty
    out_shape = (*x_sample.shape[:-1], n)
    dt, dev = x_sample.dtype, x_sample.device  # fixed by the signature
    if getattr(launch, "pointer_only", False) and trans_b:
        if x_sample.is_cuda:
            def run(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
                out = empty(out_shape, dtype=dt, device=dev)
                launch(x, w, bias, out)
                return out
        else:
            def run(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
                out = empty(out_shape, dtype=dt)
                launch(x, w, bias, out)
                return out
        return run

    def run(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:  # type: ignore[no-redef]
        out = empty((m, n), dtype=dt, device=dev)
        launch(x.view(m, k), w if trans_b else w.t(), bias, out)
        return out.view(out_shape)

    return run


def _linear_run_packed(op: GemmOp, launch: Callable[..., None], x_sample: torch.Tensor) -> Callable[..., torch.Tensor]:
    """:func:`_linear_run`, with a non-contiguous ``x`` (a row slice such as BERT's pooler input
    ``hidden[:, 0]``, a transposed view such as MLP-Mixer's token MLP input or LeViT's flattened feature
    map) copied to packed memory first: one pass over x, which the arbiter's timing includes. ``F.linear``
    copies such an x too (its ``reshape`` to 2-D), except a 2-D transposed one, which cuBLAS reads as it
    is: there the arbiter's verdict goes to PyTorch when the copy costs more than Tracea's kernel gains.
    (Before, such calls always went to PyTorch: on the CPU, whose bf16 linears run 15-20 GFLOP/s without
    AVX512_BF16; on CUDA, as a "non-contiguous input" fallback.)"""
    if x_sample.is_contiguous():
        return _linear_run(op, launch, x_sample)
    return _packed_x(_linear_run(op, launch, x_sample.contiguous()))


def _linear_via_ops(op: GemmOp, act: str | None) -> Callable[..., torch.Tensor]:
    from tracea import ops

    def run(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = ops.matmul(x.reshape(op.m, op.k), w.t(), bias=bias, activation=act, fp32_precision=op.fp32_precision)
        return out.reshape(*x.shape[:-1], op.n).contiguous()

    return run


def _linear_torch(act: str | None) -> Callable[..., torch.Tensor]:
    """PyTorch computing the call (what a fallback runs and what the arbiter times)."""
    epi = Epilogue.of(act) if act else None

    def run(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = F.linear(x, w, bias)
        if epi is not None:
            out = eager.apply_epilogue(out, epi, None, -1)
        return out.contiguous()

    return run


def _linear_eager(op: GemmOp | None, act: str | None, activation: str | None, reason: str,
                  lean: bool = False) -> Callable[..., torch.Tensor]:
    """PyTorch computing a signature no kernel serves (``reason``), each call counted; ``lean``: as in
    :func:`_conv_eager`."""
    compute = _linear_torch(act)

    def plan(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        fallbacks.record("gemm", reason)
        if recording._recorder is not None:
            recording.note("linear", op, reason, (x, w, bias, activation))
        return compute(x, w, bias)

    plan.op = op  # type: ignore[attr-defined]
    plan.fallback = reason  # type: ignore[attr-defined]
    return _leaned(plan, "gemm", reason, lean and (act is None or act in _ACT_FNS))


# ------------------------------------------------------------------------------------------------
# the arbiter
# ------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _ahead(decision: Decision, build_run: Callable[[Any, Any], Callable[..., torch.Tensor]] | None,
           device: torch.device) -> Iterator[second_chance.Prefetch | None]:
    """Inside: the second chance's alternatives compile in worker threads while the caller builds the
    first choice (:func:`tracea_torch.second_chance.prefetch`); on leaving, every build is done."""
    ahead = None if build_run is None else second_chance.prefetch(decision, build_run, device)
    try:
        yield ahead
    finally:
        if ahead is not None:
            ahead.wait()


def _arbitrated(key: Any, kind: str, op: Any, extra: tuple, decision: Decision, device: torch.device,
                run: Callable[..., torch.Tensor], torch_run: Callable[..., torch.Tensor],
                eager_plan: Callable[[str], Callable[..., torch.Tensor]], args: tuple,
                build_run: Callable[[Any, Any], Callable[..., torch.Tensor]] | None = None,
                ahead: second_chance.Prefetch | None = None) -> Callable[..., torch.Tensor]:
    """The kernel plan, unless the arbiter (see :mod:`tracea_torch.arbiter`) finds PyTorch faster for
    this signature or Tracea's result wrong: then the eager plan, with the verdict as its reason.
    ``build_run(variant, config)``: a run like ``run`` for another choice, for the arbiter's second chance
    (:mod:`tracea_torch.second_chance`) when PyTorch's kernel won; ``ahead``: those already built."""
    kernel_plan = _kernel_plan(key, kind, op, extra, run, eager_plan)
    if not arbiter.enabled() or decision.variant.fallback_only:
        kept = decision.chosen.framework_faster  # kept only for a verdict that will not come
        return eager_plan(f"{decision.variant.name}: {kept}") if kept else kernel_plan
    # PyTorch timed as the unpatched layer runs the call; a 16-bit conv on the CPU as PyTorch's side computes it
    # in every plan (eager.conv2d: fp32, which PyTorch runs 10-45x faster there and without oneDNN's bf16 errors)
    wide_cpu = _cpu_16bit_conv(kind, op, device)  # (torch_run: already tracea_torch.cpu16's choice, if any)
    direct = (None if wide_cpu else _torch_direct(kind, op, extra)) or torch_run
    try:
        verdict = arbiter.judge(decision, device, run, direct, args, cold_weights=True)
    except CaptureError as exc:
        raise _NotNow(f"first call inside CUDA graph capture ({str(exc).splitlines()[0][:160]})") from exc
    except BackendError as exc:
        return eager_plan(_backend_failure(exc))
    except (NoVariantError, UnsupportedDeviceError) as exc:
        return eager_plan(fallback_reason(exc))
    if verdict.winner == "tracea" and verdict.captured_winner == "tracea":
        return kernel_plan
    if build_run is not None and second_chance.worth_retrying(verdict):
        again = _second_chance(decision, device, verdict, build_run, direct, args, ahead)
        if again is not None:
            return _arbitrated(key, kind, op, extra, again[0], device, again[1], torch_run, eager_plan, args)
    fallbacks.record(kind if kind == "conv2d" else "gemm", verdict.reason)  # once per signature, not per call
    torch_plan = _lean(torch_run, kind, op, extra, verdict.reason, direct_ok=not wide_cpu)
    if verdict.winner == verdict.captured_winner:
        return torch_plan
    routed = routed_plan(verdict, kernel_plan, torch_plan)
    routed.op = op  # type: ignore[attr-defined]
    return routed


def _second_chance(decision: Decision, device: torch.device, verdict: arbiter.Verdict,
                   build_run: Callable[[Any, Any], Callable[..., torch.Tensor]], direct: Callable[..., torch.Tensor],
                   args: tuple, ahead: second_chance.Prefetch | None = None
                   ) -> tuple[Decision, Callable[..., torch.Tensor]] | None:
    """The new decision and its run when the second chance found (and persisted) a better choice."""
    try:
        if not second_chance.retry(decision, device, verdict, build_run, direct, args, ahead):
            return None
        again = choose(decision.op, device)
        c = again.chosen
        if c.variant is decision.chosen.variant and c.config == decision.chosen.config:
            return None
        return again, build_run(c.variant, c.config)
    except (TraceaError, Fallback):  # nothing better can run here: the first verdict stands
        return None


def _builder(make_run: Callable[[Any, Callable[..., None], torch.Tensor], Callable[..., torch.Tensor]], op: Any,
             decision: Decision, sample: torch.Tensor) -> Callable[[Any, Any], Callable[..., torch.Tensor]]:
    """``build_run(variant, config)`` for the second chance: ``make_run`` (:func:`_linear_run` /
    :func:`_conv_run`) over a launcher of that choice (errors: :class:`TraceaError`)."""
    def build(variant: Any, config: Any) -> Callable[..., torch.Tensor]:
        return make_run(op, bind(variant, decision.op, config, decision.profile, _torch_adapter()), sample)

    return build


def routed_plan(verdict: arbiter.Verdict, tracea_plan: Callable[..., torch.Tensor],
                torch_plan: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A plan for a verdict whose eager and captured winners differ: each call runs the side that won
    its situation, by whether its stream is capturing a CUDA graph. ``lean_eager`` marks PyTorch serving
    the eager calls: a patched layer may then call F.* itself while its stream is not capturing (the
    host-bound case, where the plan's frames would cost most)."""
    eager_side, graph_side = (tracea_plan, torch_plan) if verdict.winner == "tracea" else (torch_plan, tracea_plan)
    capturing = stream_capturing()

    def routed(*args: Any) -> torch.Tensor:
        return (graph_side if capturing() else eager_side)(*args)

    routed.lean_eager = verdict.winner == "torch"  # type: ignore[attr-defined]
    return routed


_ACT_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu, "gelu_erf": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}


def _cpu_16bit_conv(kind: str, op: Any, device: torch.device) -> bool:
    """A float16 / bfloat16 conv on the CPU: PyTorch's side of it (the fallback, what the arbiter times, a
    verdict's plan) is ``eager.conv2d`` in fp32 rounded once, never ``F.conv2d`` in 16 bits (its CPU
    kernels run 10-45x slower than fp32 on CPUs without AMX and return wrong values for some shapes)."""
    return kind == "conv2d" and device.type == "cpu" and op is not None and op.dtype in (DType.F16, DType.BF16)


def _conv_torch_side(op: Conv2dOp | None, act: str | None, conf: tuple, args: tuple,
                     device: torch.device) -> Callable[..., torch.Tensor]:
    """PyTorch computing a conv signature (what a fallback runs and what the arbiter times): :func:`_conv_torch`,
    or for a 16-bit CPU conv (:func:`_cpu_16bit_conv`) with the arbiter on, PyTorch's own 16-bit call
    (:func:`_torch_direct`) where that measures right and faster on the first call's ``args``
    (:mod:`tracea_torch.cpu16`)."""
    fp32 = _conv_torch(op, act, conf)
    if not (_cpu_16bit_conv("conv2d", op, device) and arbiter.enabled()):
        return fp32
    return cpu16.torch_side(_torch_direct("conv2d", op, conf), fp32, args)[0]


def _torch_direct(kind: str, op: Any, extra: tuple) -> Callable[..., torch.Tensor] | None:
    """What the unpatched layer runs for this call -- ``F.linear`` / ``F.conv2d`` and the activation module's
    function -- with no other Python (None where a call needs :func:`_conv_torch` / :func:`_linear_torch`)."""
    act = parse_activation(extra[-1]) if extra else None
    fn = _ACT_FNS.get(act) if act is not None else None
    if act is not None and fn is None:
        return None
    if kind == "linear":
        lin = F.linear
        if fn is None:
            return lin
        return lambda x, w, bias: fn(lin(x, w, bias))
    if kind == "conv2d" and op is not None:
        conv, (stride, padding, dilation, groups) = F.conv2d, extra[:4]
        fmt = torch.channels_last if op.layout is Layout.NHWC else torch.contiguous_format
        if fn is None:
            return lambda x, w, bias: conv(x, w, bias, stride, padding, dilation, groups).contiguous(memory_format=fmt)
        return lambda x, w, bias: fn(conv(x, w, bias, stride, padding, dilation, groups)).contiguous(memory_format=fmt)
    return None


def _lean(compute: Callable[..., torch.Tensor], kind: str, op: Any, extra: tuple,
          reason: str, direct_ok: bool = True) -> Callable[..., torch.Tensor]:
    """PyTorch serving a signature the arbiter gave it: no per-call counting (the verdict is counted once
    and listed by :func:`tracea_torch.fallbacks.report`), only the recorder hook; a plain linear or conv
    (and its activation) calls ``F.linear`` / ``F.conv2d`` itself (frames less on a path that competes
    with PyTorch's own) unless ``direct_ok`` is False (then ``compute`` always runs)."""
    direct = (_torch_direct(kind, op, extra) if direct_ok else None) or compute

    def plan(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if recording._recorder is not None:
            recording.note(kind, op, reason, (x, w, bias) + extra)
        return direct(x, w, bias)

    plan.op = op  # type: ignore[attr-defined]
    plan.fallback = reason  # type: ignore[attr-defined]
    plan.lean = direct_ok  # type: ignore[attr-defined]  # PyTorch by verdict: a layer may call F.* itself
    return plan
