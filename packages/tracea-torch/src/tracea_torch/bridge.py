"""From torch tensors to Tracea dispatch and back: the body of the ``tracea::conv2d`` and
``tracea::linear`` custom ops.

Each call either runs through ``tracea.ops`` (Doctor -> variant, or core's PyTorch fallback through the
``tracea_fallback_run`` hook when no variant serves the op) or, for cases tracea-torch itself knows
no variant can read, goes straight to PyTorch, recording the reason in :mod:`tracea_torch.fallbacks`.

Layouts: an NCHW tensor in ``torch.channels_last`` memory format runs as an NHWC op on zero-copy
permuted views; other non-contiguous activations fall back (copying them would cost a full pass).
Weights and biases are small and are made contiguous.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from tracea.dtypes import Fp32Precision
from tracea.errors import NoVariantError, UnsupportedDeviceError
from tracea.ir.epilogue import Epilogue
from tracea.ir.ops import Conv2dOp, GemmOp, Layout

from . import eager, fallbacks

SERVED_DEVICES = ("cpu", "cuda")
ACTIVATION_NAMES = {"none": None, "relu": "relu", "gelu": "gelu_erf", "gelu_erf": "gelu_erf",
                    "gelu_tanh": "gelu_tanh", "silu": "silu", "swish": "silu"}


class _Fallback(Exception):
    """Internal: PyTorch must compute this call; ``args[0]`` is the reason."""


def parse_activation(activation: str | None) -> str | None:
    """Normalise an activation name: None/'none', 'relu', 'gelu' (erf), 'gelu_tanh', 'silu'."""
    key = "none" if activation is None else str(activation).strip().lower()
    if key not in ACTIVATION_NAMES:
        from tracea.errors import InvalidArgumentError

        raise InvalidArgumentError("activation", activation, "one of " + ", ".join(sorted(ACTIVATION_NAMES)))
    return ACTIVATION_NAMES[key]


def epilogue_for(has_bias: bool, activation: str | None) -> Epilogue:
    steps = (["bias"] if has_bias else []) + ([activation] if activation else [])
    return Epilogue.of(*steps)


def fp32_precision(device_type: str, conv: bool) -> Fp32Precision:
    """torch's float32 math mode for this call: cuDNN's ``allow_tf32`` for CUDA convolutions,
    ``torch.get_float32_matmul_precision()`` otherwise."""
    if conv and device_type == "cuda":
        return Fp32Precision.HIGH if torch.backends.cudnn.allow_tf32 else Fp32Precision.HIGHEST
    return Fp32Precision.parse(torch.get_float32_matmul_precision())


def output_memory_format(x: torch.Tensor) -> torch.memory_format:
    """The memory format a conv output takes: channels_last exactly when the input is channels_last
    and not also plainly contiguous (the same rule the fake kernel uses)."""
    if not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def _common_checks(kind: str, tensors: Sequence[torch.Tensor | None]) -> None:
    present = [t for t in tensors if t is not None]
    dev = present[0].device
    if dev.type not in SERVED_DEVICES:
        raise _Fallback(f"device {dev.type} not served by Tracea")
    if any(t.device != dev for t in present):
        raise _Fallback("operands on different devices")
    dtype = present[0].dtype
    if any(t.dtype != dtype for t in present):
        raise _Fallback("operands of different dtypes")
    if any(t.numel() == 0 for t in present):
        raise _Fallback("empty tensor")


def _ops() -> Any:
    try:
        from tracea import ops
    except ImportError as exc:
        raise _Fallback(f"tracea.ops unavailable ({exc})") from None
    return ops


def _dispatch(kind: str, call: Any) -> torch.Tensor:
    """Run ``call`` (a tracea.ops call); dispatch errors meaning "nothing here can run it" fall back."""
    try:
        return call()
    except (NoVariantError, UnsupportedDeviceError) as exc:
        raise _Fallback(str(exc).splitlines()[0]) from None


def conv2d(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: Sequence[int],
           padding: Sequence[int], dilation: Sequence[int], groups: int, activation: str | None) -> torch.Tensor:
    """4-D NCHW ``x`` (any memory format) conv ``w`` (+ bias, + activation); a fresh output tensor in
    :func:`output_memory_format` of ``x``."""
    act = parse_activation(activation)
    fmt = output_memory_format(x)
    try:
        _common_checks("conv2d", (x, w, bias))
        out = _conv2d_tracea(x, w, bias, tuple(stride), tuple(padding), tuple(dilation), groups, act)
    except _Fallback as fb:
        fallbacks.record("conv2d", str(fb))
        op = Conv2dOp(*x.shape, w.shape[0], w.shape[2], w.shape[3], stride=tuple(stride), padding=tuple(padding),
                      dilation=tuple(dilation), groups=groups, dtype=_dtype_or_f32(x),
                      epilogue=epilogue_for(bias is not None, act)) if x.numel() else None
        out = (eager.conv2d(op, x, w, bias) if op is not None else
               torch.nn.functional.conv2d(x, w, bias, stride, padding, dilation, groups))
    return out.contiguous(memory_format=fmt)


def _dtype_or_f32(t: torch.Tensor) -> Any:
    from tracea.dtypes import DType

    try:
        return DType.parse(t.dtype)
    except Exception:  # noqa: BLE001 - integer/complex tensors: torch itself will reject or handle them
        return DType.F32


def _conv2d_tracea(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: tuple, padding: tuple,
                   dilation: tuple, groups: int, act: str | None) -> torch.Tensor:
    if x.is_contiguous():
        layout = Layout.NCHW
        xs, ws = x, w.contiguous()
    elif x.is_contiguous(memory_format=torch.channels_last):
        layout = Layout.NHWC
        xs, ws = x.permute(0, 2, 3, 1), w.permute(0, 2, 3, 1).contiguous()
    else:
        raise _Fallback("non-contiguous input (neither NCHW-contiguous nor channels_last)")
    ops = _ops()
    b = bias.contiguous() if bias is not None else None
    epi = epilogue_for(False, act)  # the bias is passed as an argument and fused by dispatch
    prec = fp32_precision(x.device.type, conv=True)
    out = _dispatch("conv2d", lambda: ops.conv2d(xs, ws, b, stride=stride, padding=padding, dilation=dilation,
                                                 groups=groups, layout=layout.value, epilogue=epi,
                                                 fp32_precision=prec))
    return out.permute(0, 3, 1, 2) if layout is Layout.NHWC else out


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, activation: str | None) -> torch.Tensor:
    """``act(x @ w.T + bias)`` for ``x`` of shape (..., in_features); a fresh contiguous output."""
    act = parse_activation(activation)
    try:
        _common_checks("gemm", (x, w, bias))
        if x.dim() == 0:
            raise _Fallback("scalar input")
        out = _linear_tracea(x, w, bias, act)
    except _Fallback as fb:
        fallbacks.record("gemm", str(fb))
        x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
        if x2.shape[0] and x.shape[-1] and w.shape[0]:
            op = GemmOp(x2.shape[0], w.shape[0], x.shape[-1], trans_b=True, dtype_a=_dtype_or_f32(x),
                        dtype_b=_dtype_or_f32(x), epilogue=epilogue_for(bias is not None, act))
            out = eager.gemm(op, x2, w, bias).reshape(*x.shape[:-1], w.shape[0])
        else:
            out = torch.nn.functional.linear(x, w, bias)
            if act:
                out = eager.apply_epilogue(out, Epilogue.of(act), None, -1)
    return out.contiguous()


def _linear_tracea(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, act: str | None) -> torch.Tensor:
    lead = x.shape[:-1]
    if not x.is_contiguous():
        raise _Fallback("non-contiguous input")
    a = x.reshape(-1, x.shape[-1])
    ops = _ops()
    wc = w.contiguous()
    b = bias.contiguous() if bias is not None else None
    epi = epilogue_for(False, act)
    prec = fp32_precision(x.device.type, conv=False)
    out = _dispatch("gemm", lambda: ops.gemm(a, wc, b, trans_b=True, epilogue=epi, fp32_precision=prec))
    return out.reshape(*lead, w.shape[0])
