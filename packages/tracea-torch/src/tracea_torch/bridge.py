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

from typing import Any, Callable, Sequence

import torch

from tracea.runtime.plans import _SIGS, Uncacheable, lookup, signature

from .bridge_plans import conv2d_plan, linear_plan
from .torch_flags import cudnn_allow_tf32 as _cudnn_tf32
from .torch_flags import matmul_precision as _matmul_precision
from .choice import (ACTIVATION_NAMES, SERVED_DTYPES, Fallback, choose, epilogue_for, fp32_precision,  # noqa: F401
                     output_memory_format, parse_activation, serving_variant)

_F32 = torch.float32


def conv2d(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: Sequence[int],
           padding: Sequence[int], dilation: Sequence[int], groups: int, activation: str | None) -> torch.Tensor:
    """4-D NCHW ``x`` (any memory format) conv ``w`` (+ bias, + activation): a fresh output tensor in
    :func:`output_memory_format` of ``x``."""
    return conv2d_plan_for(x, w, bias, stride, padding, dilation, groups, activation)(x, w, bias)


def conv2d_plan_for(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: Sequence[int],
                    padding: Sequence[int], dilation: Sequence[int], groups: int,
                    activation: str | None) -> Callable[..., torch.Tensor]:
    """The plan :func:`conv2d` runs for this call's signature (built and stored on its first call)."""
    if type(stride) is not tuple:
        stride, padding, dilation = tuple(stride), tuple(padding), tuple(dilation)
    elif type(padding) is not tuple or type(dilation) is not tuple:
        padding, dilation = tuple(padding), tuple(dilation)
    prec = (_cudnn_tf32() if x.is_cuda else _matmul_precision()) if x.dtype is _F32 else None
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
        plan = conv2d_plan(key, x, w, bias, stride, padding, dilation, groups, activation)
    return plan


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, activation: str | None) -> torch.Tensor:
    """``act(x @ w.T + bias)`` for ``x`` of shape (..., in_features): a fresh contiguous output."""
    return linear_plan_for(x, w, bias, activation)(x, w, bias)


def linear_plan_for(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                    activation: str | None) -> Callable[..., torch.Tensor]:
    """The plan :func:`linear` runs for this call's signature (built and stored on its first call)."""
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
        plan = linear_plan(key, x, w, bias, activation)
    return plan
