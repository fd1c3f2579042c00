"""From torch tensors to Tracea and back: the body of the ``tracea::conv2d`` and ``tracea::linear``
custom ops and of patched layers.

A call computes its signature (the tensors' shapes, strides, dtypes and devices, the arguments, torch's
float32 math mode) and runs the plan stored for it in :mod:`tracea.runtime.plans`; the first call of a
signature builds that plan (:mod:`tracea_torch.bridge_plans`): the Doctor's decision bound to a launcher
working on the tensors' memory, or a PyTorch computation when Tracea should not run the call. PyTorch
computes it (and the reason is counted in :mod:`tracea_torch.fallbacks`) when:

* no variant accepts the op (groups, dilation, dtype, device ... per the Doctor's rejection reasons);
* only the reference oracle accepts it (see :mod:`tracea_torch.policy`);
* the chosen kernel fails to compile or launch (a backend bug: also warned about, once per message;
  the signature then stays on PyTorch);
* the activation is neither NCHW-contiguous nor ``channels_last`` (kernels read packed layouts and
  copying would cost a full extra pass), or the operands mix dtypes/devices, are empty, or are of a
  dtype Tracea does not know (PyTorch then gives its own result or error, as unpatched).

An NCHW tensor in ``torch.channels_last`` memory runs the NHWC kernels on zero-copy views.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from tracea.doctor.decision import Decision
from tracea.doctor.doctor import get_doctor
from tracea.dtypes import DType, Fp32Precision
from tracea.errors import NoVariantError, UnsupportedDeviceError
from tracea.ir.epilogue import Epilogue
from tracea.ir.ops import Op
from tracea.runtime.dispatch import fallback_reason
from tracea.runtime.plans import _SIGS, Uncacheable, lookup, signature

from .adapter import device_of
from .policy import reference_allowed

ACTIVATION_NAMES = {"none": None, "relu": "relu", "gelu": "gelu_erf", "gelu_erf": "gelu_erf",
                    "gelu_tanh": "gelu_tanh", "silu": "silu", "swish": "silu"}
SERVED_DTYPES = (DType.F64, DType.F32, DType.F16, DType.BF16)


class Fallback(Exception):
    """Internal: PyTorch must compute this call signature; ``args[0]`` is the reason."""


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


def choose(op: Op, device: torch.device) -> Decision:
    """The Doctor's decision for ``op`` here; raise :class:`Fallback` unless a variant tracea-torch may
    use serves it (the reference oracle only where the policy allows)."""
    if device.type not in ("cpu", "cuda"):
        raise Fallback(f"device {device.type} not served by Tracea")
    try:
        decision = get_doctor().decide(op, device_of(device))
    except (NoVariantError, UnsupportedDeviceError) as exc:
        raise Fallback(fallback_reason(exc)) from None
    if decision.chosen.variant.backend != "reference":
        return decision
    if not reference_allowed():
        rejected = {r.variant: r.reasons for r in decision.rejected if r.backend != "reference"}
        if not rejected:
            raise Fallback(f"no {op.kind.value} kernel for {device.type} installed (only the reference oracle)")
        raise Fallback(fallback_reason(NoVariantError("", rejected)))
    if any(dt.numpy is None for dt in op.dtypes):
        raise Fallback(f"reference backend cannot view {op.dtypes[0].value} host tensors (needs ml_dtypes)")
    return decision


def serving_variant(op: Op, device: torch.device) -> tuple[str, str] | None:
    """``(variant name, config source)`` that runs ``op`` for tracea-torch, or None when PyTorch would."""
    try:
        chosen = choose(op, device).chosen
    except Fallback:
        return None
    return chosen.variant.name, chosen.source


_F32 = torch.float32
_cudnn = torch.backends.cudnn
_matmul_precision = torch.get_float32_matmul_precision


def conv2d(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: Sequence[int],
           padding: Sequence[int], dilation: Sequence[int], groups: int, activation: str | None) -> torch.Tensor:
    """4-D NCHW ``x`` (any memory format) conv ``w`` (+ bias, + activation): a fresh output tensor in
    :func:`output_memory_format` of ``x``."""
    if type(stride) is not tuple:
        stride, padding, dilation = tuple(stride), tuple(padding), tuple(dilation)
    elif type(padding) is not tuple or type(dilation) is not tuple:
        padding, dilation = tuple(padding), tuple(dilation)
    prec = (_cudnn.allow_tf32 if x.is_cuda else _matmul_precision()) if x.dtype is _F32 else None
    try:
        try:  # the signatures, without the frames of plans.signature in the common case
            sx, sw, sb = _SIGS[type(x)](x), _SIGS[type(w)](w), _SIGS[type(bias)](bias)
        except KeyError:
            sx, sw, sb = signature(x), signature(w), signature(bias)
        key: Any = ("torch.conv2d", sx, sw, sb, stride, padding, dilation, groups, activation, prec)
        plan = lookup(key)
    except (Uncacheable, TypeError):
        key = plan = None
    if plan is None:
        from .bridge_plans import conv2d_plan

        plan = conv2d_plan(key, x, w, bias, stride, padding, dilation, groups, activation)
    return plan(x, w, bias)


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, activation: str | None) -> torch.Tensor:
    """``act(x @ w.T + bias)`` for ``x`` of shape (..., in_features): a fresh contiguous output."""
    try:
        try:  # the signatures, without the frames of plans.signature in the common case
            sx, sw, sb = _SIGS[type(x)](x), _SIGS[type(w)](w), _SIGS[type(bias)](bias)
        except KeyError:
            sx, sw, sb = signature(x), signature(w), signature(bias)
        key: Any = ("torch.linear", sx, sw, sb, activation, _matmul_precision() if x.dtype is _F32 else None)
        plan = lookup(key)
    except (Uncacheable, TypeError):
        key = plan = None
    if plan is None:
        from .bridge_plans import linear_plan

        plan = linear_plan(key, x, w, bias, activation)
    return plan(x, w, bias)
