"""From torch tensors to Tracea dispatch and back: the body of the ``tracea::conv2d`` and
``tracea::linear`` custom ops.

A call runs the kernel the Doctor picks for it on the tensors' memory (packed here, as ``tracea.ops``
would; the reference oracle and unusual biases go through ``tracea.ops`` itself). PyTorch computes
it instead (and the reason is counted in :mod:`tracea_torch.fallbacks`) when:

* no variant accepts the op (groups, dilation, dtype, device ... per the Doctor's rejection reasons);
* only the reference oracle accepts it (see :mod:`tracea_torch.policy`);
* the chosen kernel fails to compile or launch (a backend bug: also warned about, once per message);
* the activation is neither NCHW-contiguous nor ``channels_last`` (kernels read packed layouts and
  copying would cost a full extra pass), or the operands mix dtypes/devices, are empty, or are of a
  dtype Tracea does not know (PyTorch then gives its own result or error, as unpatched).

An NCHW tensor in ``torch.channels_last`` memory runs the NHWC kernels on zero-copy views.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import replace
from typing import Any, Iterator, Sequence

import torch

from tracea.doctor.doctor import get_doctor
from tracea.dtypes import DType, Fp32Precision
from tracea.errors import BackendError, DTypeError, NoVariantError, UnsupportedDeviceError
from tracea.ir.epilogue import Epilogue
from tracea.ir.ops import Conv2dOp, GemmOp, Layout, Op
from tracea.doctor.decision import Decision
from tracea.doctor.variant import OpArgs
from tracea.runtime.dispatch import fallback_reason, prepare_and_run

from . import eager, fallbacks
from .recording import note
from .adapter import device_of, tracea_dtype
from .policy import reference_allowed

ACTIVATION_NAMES = {"none": None, "relu": "relu", "gelu": "gelu_erf", "gelu_erf": "gelu_erf",
                    "gelu_tanh": "gelu_tanh", "silu": "silu", "swish": "silu"}
SERVED_DTYPES = (DType.F64, DType.F32, DType.F16, DType.BF16)


class _Fallback(Exception):
    """Internal: PyTorch must compute this call; ``args[0]`` is the reason."""


def parse_activation(activation: str | None) -> str | None:
    """Normalise an activation name: None/'none', 'relu', 'gelu' (erf, PyTorch's default), 'gelu_tanh',
    'silu'."""
    key = "none" if activation is None else str(activation).strip().lower()
    if key not in ACTIVATION_NAMES:
        from tracea.errors import InvalidArgumentError

        raise InvalidArgumentError("activation", activation, "one of " + ", ".join(sorted(ACTIVATION_NAMES)))
    return ACTIVATION_NAMES[key]


def epilogue_for(has_bias: bool, activation: str | None) -> Epilogue:
    steps = (["bias"] if has_bias else []) + ([activation] if activation else [])
    return Epilogue.of(*steps)


def fp32_precision(device_type: str, conv: bool) -> Fp32Precision:
    """torch's float32 math mode for this call: cuDNN's ``allow_tf32`` for CUDA convolutions (on by
    default), ``torch.get_float32_matmul_precision()`` otherwise."""
    if conv and device_type == "cuda":
        return Fp32Precision.HIGH if torch.backends.cudnn.allow_tf32 else Fp32Precision.HIGHEST
    return Fp32Precision.parse(torch.get_float32_matmul_precision())


def output_memory_format(x: torch.Tensor) -> torch.memory_format:
    """Memory format of a conv output: channels_last exactly when the input is channels_last and not
    also plainly contiguous (the fake kernel uses the same rule)."""
    if not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def _common_checks(tensors: Sequence[torch.Tensor | None]) -> DType:
    present = [t for t in tensors if t is not None]
    dev = present[0].device
    if any(t.device != dev for t in present):
        raise _Fallback("operands on different devices")
    if any(t.dtype != present[0].dtype for t in present):
        raise _Fallback("operands of different dtypes")
    if any(t.numel() == 0 for t in present):
        raise _Fallback("empty tensor")
    try:
        dtype = tracea_dtype(present[0].dtype)
    except DTypeError:
        raise _Fallback(f"dtype {present[0].dtype} not supported by Tracea") from None
    if dtype not in SERVED_DTYPES:
        raise _Fallback(f"dtype {present[0].dtype} not supported by Tracea")
    return dtype


def _choose(op: Op, device: torch.device) -> Decision:
    """The Doctor's decision for ``op`` here (memoised by the Doctor); raise :class:`_Fallback` unless a
    variant tracea-torch may use serves it (the reference oracle only where the policy allows)."""
    if device.type not in ("cpu", "cuda"):
        raise _Fallback(f"device {device.type} not served by Tracea")
    try:
        decision = get_doctor().decide(op, _device(device))
    except (NoVariantError, UnsupportedDeviceError) as exc:
        raise _Fallback(fallback_reason(exc)) from None
    if decision.chosen.variant.backend != "reference":
        return decision
    if not reference_allowed():
        rejected = {r.variant: r.reasons for r in decision.rejected if r.backend != "reference"}
        if not rejected:
            raise _Fallback(f"no {op.kind.value} kernel for {device.type} installed (only the reference oracle)")
        raise _Fallback(fallback_reason(NoVariantError("", rejected)))
    if any(dt.numpy is None for dt in op.dtypes):
        raise _Fallback(f"reference backend cannot view {op.dtypes[0].value} host tensors (needs ml_dtypes)")
    return decision


def _run_direct(decision: Decision, arrays: dict[str, Any], out: torch.Tensor) -> None:
    """Run the decided kernel on packed tensors by role, writing ``out`` (the fast path: the bridge has
    already validated and packed what :mod:`tracea.ops` would, so it skips that second pass and the
    second decision, about half the host time of a small layer)."""
    global _adapter
    if _adapter is None:
        _adapter = next(a for a in get_doctor().adapters() if a.name == "torch")
    c = decision.chosen
    prepare_and_run(c.variant, decision.op, c.config, OpArgs(arrays, out, _adapter), decision.profile)


_adapter: Any = None


def _plain_bias(bias: torch.Tensor | None, length: int) -> bool:
    return bias is None or (bias.dim() == 1 and bias.shape[0] == length and bias.is_contiguous())


@contextlib.contextmanager
def _backend_failures_fall_back() -> Iterator[None]:
    """Dispatch errors become fallbacks. A variant that fails to compile or launch is a backend bug: say so loudly (once per message),
    count it, and let PyTorch compute the call so the model keeps running."""
    try:
        yield
    except (NoVariantError, UnsupportedDeviceError) as exc:  # dispatch disagreed with _choose's answer
        raise _Fallback(fallback_reason(exc)) from exc
    except BackendError as exc:
        first = str(exc).splitlines()[0]
        if first not in _warned_failures:
            _warned_failures.add(first)
            warnings.warn(f"tracea: a kernel failed, PyTorch computes this call instead: {first}", RuntimeWarning,
                          stacklevel=4)
        raise _Fallback(f"backend error: {first[:200]}") from exc


_warned_failures: set[str] = set()


def _device(device: torch.device) -> Any:
    return device_of(device)


def serving_variant(op: Op, device: torch.device) -> tuple[str, str] | None:
    """``(variant name, config source)`` that runs ``op`` for tracea-torch, or None when PyTorch would."""
    try:
        chosen = _choose(op, device).chosen
    except _Fallback:
        return None
    return chosen.variant.name, chosen.source


# ------------------------------------------------------------------------------------------------
# conv2d
# ------------------------------------------------------------------------------------------------

def conv2d(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: Sequence[int],
           padding: Sequence[int], dilation: Sequence[int], groups: int, activation: str | None) -> torch.Tensor:
    """4-D NCHW ``x`` (any memory format) conv ``w`` (+ bias, + activation): a fresh output tensor in
    :func:`output_memory_format` of ``x``."""
    act = parse_activation(activation)
    stride, padding, dilation = tuple(stride), tuple(padding), tuple(dilation)
    fmt = output_memory_format(x)
    op = None
    try:
        dtype = _common_checks((x, w, bias))
        op = _conv_op(x, w, bias, stride, padding, dilation, groups, act, dtype)
        decision = _choose(op, x.device)
        with _backend_failures_fall_back():
            if decision.variant.fallback_only or not _plain_bias(bias, op.k):
                from tracea import ops

                out = ops.conv2d(x, w, bias, stride, padding, dilation, groups,
                                 activation=act, fp32_precision=op.fp32_precision)
            else:
                out = _conv_direct(decision, op, x, w, bias)
        note("conv2d", op, None, (x, w, bias, stride, padding, dilation, groups, activation))
    except _Fallback as fb:
        fallbacks.record("conv2d", str(fb))
        note("conv2d", op, str(fb), (x, w, bias, stride, padding, dilation, groups, activation))
        if op is not None:
            nchw = op if op.layout is Layout.NCHW else replace(op, layout=Layout.NCHW)
            out = eager.conv2d(nchw, x, w, bias)
        else:
            out = torch.nn.functional.conv2d(x, w, bias, stride, padding, dilation, groups)
            if act:
                out = eager.apply_epilogue(out, Epilogue.of(act), None, 1)
    return out.contiguous(memory_format=fmt)


def _conv_direct(decision: Decision, op: Conv2dOp, x: torch.Tensor, w: torch.Tensor,
                 bias: torch.Tensor | None) -> torch.Tensor:
    """What ``tracea.ops.conv2d`` runs for torch tensors: NHWC kernels on the channels_last memory of x (a
    zero-copy view) and of w (a copy unless w is channels_last too), NCHW kernels on packed tensors."""
    if op.layout is Layout.NHWC:
        xa, wa = x.permute(0, 2, 3, 1), w.permute(0, 2, 3, 1)
        phys = torch.empty((op.n, op.p, op.q, op.k), dtype=x.dtype, device=x.device)
        out = phys.permute(0, 3, 1, 2)
    else:
        xa, wa = x, w
        phys = out = torch.empty((op.n, op.k, op.p, op.q), dtype=x.dtype, device=x.device)
    if not xa.is_contiguous():
        xa = xa.contiguous()
    if not wa.is_contiguous():
        wa = wa.contiguous()
    _run_direct(decision, {"x": xa, "w": wa, "bias": bias}, phys)
    return out


def _conv_op(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: tuple, padding: tuple,
             dilation: tuple, groups: int, act: str | None, dtype: DType) -> Conv2dOp:
    if x.is_contiguous():
        layout = Layout.NCHW
    elif x.is_contiguous(memory_format=torch.channels_last):
        layout = Layout.NHWC
    else:
        raise _Fallback("non-contiguous input (neither NCHW-contiguous nor channels_last)")
    key = (tuple(x.shape), tuple(w.shape), bias is not None, stride, padding, dilation, groups, act, dtype, layout,
           fp32_precision(x.device.type, conv=True))
    op = _OPS.get(key)
    if op is None:
        op = _OPS[key] = _new_conv_op(key)
        if len(_OPS) > 4096:
            _OPS.clear()
    return op


_OPS: dict[tuple, Op] = {}  # op descriptions by call signature (building one validates every field)


def _new_conv_op(key: tuple) -> Conv2dOp:
    (n, c, h, wd), (k, cg, r, s), has_bias, stride, padding, dilation, groups, act, dtype, layout, prec = key
    if cg * groups != c:
        raise _Fallback("weight shape does not match input channels / groups")
    try:
        return Conv2dOp(n, c, h, wd, k, r, s, stride=stride, padding=padding, dilation=dilation, groups=groups,
                        layout=layout, dtype=dtype, dtype_out=dtype, epilogue=epilogue_for(has_bias, act),
                        fp32_precision=prec)
    except Exception as exc:  # noqa: BLE001 - PyTorch gives its own error for impossible shapes
        raise _Fallback(f"invalid conv2d arguments ({exc})") from None


# ------------------------------------------------------------------------------------------------
# linear
# ------------------------------------------------------------------------------------------------

def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, activation: str | None) -> torch.Tensor:
    """``act(x @ w.T + bias)`` for ``x`` of shape (..., in_features): a fresh contiguous output."""
    act = parse_activation(activation)
    op = None
    try:
        dtype = _common_checks((x, w, bias))
        op = _linear_op(x, w, bias, act, dtype)
        decision = _choose(op, x.device)
        a = x.reshape(op.m, op.k)
        with _backend_failures_fall_back():
            if decision.variant.fallback_only or not _plain_bias(bias, op.n):
                from tracea import ops

                out = ops.matmul(a, w.t(), bias=bias, activation=act, fp32_precision=op.fp32_precision)
            else:  # B = w (n, k) read transposed when packed, else w.t() is the packed (k, n) operand
                out = torch.empty((op.m, op.n), dtype=x.dtype, device=x.device)
                _run_direct(decision, {"a": a, "b": w if op.trans_b else w.t(), "bias": bias}, out)
        out = out.reshape(*x.shape[:-1], op.n)
        note("linear", op, None, (x, w, bias, activation))
    except _Fallback as fb:
        fallbacks.record("gemm", str(fb))
        note("linear", op, str(fb), (x, w, bias, activation))
        out = torch.nn.functional.linear(x, w, bias)
        if act:
            out = eager.apply_epilogue(out, Epilogue.of(act), None, -1)
    return out.contiguous()


def _linear_op(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, act: str | None, dtype: DType) -> GemmOp:
    if x.dim() < 1 or w.dim() != 2 or x.shape[-1] != w.shape[1]:
        raise _Fallback("shapes do not match x @ w.T")
    if not x.is_contiguous():
        raise _Fallback("non-contiguous input")
    m = x.numel() // x.shape[-1]
    # w (n, k) is used transposed without a copy: the GEMM reads B stored n x k.
    trans_b = w.is_contiguous()
    if not trans_b and not w.t().is_contiguous():
        raise _Fallback("non-contiguous weight")
    key = ("gemm", m, w.shape[0], w.shape[1], trans_b, dtype, bias is not None, act,
           fp32_precision(x.device.type, False))
    op = _OPS.get(key)
    if op is None:
        op = _OPS[key] = GemmOp(m, w.shape[0], w.shape[1], trans_b=trans_b, dtype_a=dtype, dtype_b=dtype,
                                dtype_out=dtype, epilogue=epilogue_for(bias is not None, act), fp32_precision=key[-1])
    return op
