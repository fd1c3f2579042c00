"""The hot path of a patched layer: an ``nn.Conv2d`` / ``nn.Linear`` call straight to its plan.

A patched layer remembers the plan of its last call (a :class:`CallMemo` in the module's ``__dict__``)
with what that plan was chosen for: the signatures of input, weight and bias, torch's float32 mode, the
layer's hyper-parameters and the plan cache's :func:`~tracea.runtime.plans.generation`. A call that
matches all of them runs the plan directly, skipping the functional wrappers, the key building and the
cache lookup. Inside a model that matters more than a single layer's timing shows: on an H100 host a
ResNet-18-style batch-1 forward spent ~10 us per layer in those frames (its layers called their plans
directly ran 1.03-1.08x eager, through the frames 0.88-0.96x). Anything else -- gradients, tracing or
compiling, autocast, a new shape, dropped plans -- takes the general path of :mod:`tracea_torch.ops`,
and the next call refreshes the memo. A memo pickles and deep-copies as empty (plans are process state).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from tracea.runtime.plans import _SIGS, generation

from . import bridge, ops
from .ops import _any_autocast, _direct, _pair

_F32 = torch.float32
_cudnn = torch.backends.cudnn
_matmul_precision = torch.get_float32_matmul_precision
_KEY = "_tracea_memo"


def _meta(t: Optional[Tensor]) -> Any:
    """What a memo compares of a tensor: shape, strides, dtype and device index (the plan cache's
    signature, with ``get_device()`` instead of a device object: cheaper on the hot path)."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.get_device())


class CallMemo:
    """One layer's last call signature and the plan that serves it."""

    __slots__ = ("gen", "sx", "sw", "sb", "prec", "stride", "padding", "dilation", "groups", "act", "plan")

    def __init__(self, gen: int = -1, sx: Any = None, sw: Any = None, sb: Any = None, prec: Any = None,
                 stride: Any = None, padding: Any = None, dilation: Any = None, groups: Any = None,
                 act: Optional[str] = None, plan: Optional[Callable[..., Tensor]] = None) -> None:
        self.gen, self.sx, self.sw, self.sb, self.prec = gen, sx, sw, sb, prec
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.act, self.plan = act, plan

    def __reduce__(self) -> tuple:
        return (CallMemo, ())  # plans do not travel: a copy or an unpickled model starts empty


def conv2d_layer(m: nn.Conv2d, x: Tensor, w: Tensor, b: Optional[Tensor], act: Optional[str]) -> Tensor:
    """What the patched conv layer ``m`` (``padding_mode="zeros"``) computes on ``x`` with weight ``w``
    and bias ``b``, plus the fused activation ``act``."""
    memo = m.__dict__.get(_KEY)
    if (memo is not None and memo.sx == (x.shape, x.stride(), x.dtype, x.get_device())
            and memo.sw == (w.shape, w.stride(), w.dtype, w.get_device())
            and memo.sb == (None if b is None else (b.shape, b.stride(), b.dtype, b.get_device()))
            and memo.stride is m.stride and memo.padding is m.padding and memo.dilation is m.dilation
            and memo.groups == m.groups and memo.act == act and not _any_autocast() and _direct(x, w, b)
            and memo.prec == ((_cudnn.allow_tf32 if x.is_cuda else _matmul_precision()) if x.dtype is _F32 else None)
            and memo.gen == generation()):
        return memo.plan(x, w, b)
    return _conv2d_refresh(m, x, w, b, act)


def _conv2d_refresh(m: nn.Conv2d, x: Tensor, w: Tensor, b: Optional[Tensor], act: Optional[str]) -> Tensor:
    padding, get = m.padding, _SIGS.get
    fx, fw, fb = get(type(x)), get(type(w)), get(type(b))
    if (fx is None or fw is None or fb is None or isinstance(padding, str) or x.dim() != 4 or _any_autocast()
            or not _direct(x, w, b)):  # the general path (it also learns new array kinds)
        return ops.conv2d(x, w, b, m.stride, padding, m.dilation, m.groups, activation=act)
    gen = generation()  # before building: a plan built across an invalidation is looked up again
    plan = bridge.conv2d_plan_for(x, w, b, _pair(m.stride, "stride"), _pair(padding, "padding"),
                                  _pair(m.dilation, "dilation"), int(m.groups), act or "none")
    prec = (_cudnn.allow_tf32 if x.is_cuda else _matmul_precision()) if x.dtype is _F32 else None
    m.__dict__[_KEY] = CallMemo(gen, _meta(x), _meta(w), _meta(b), prec, m.stride, padding, m.dilation, m.groups,
                                act, plan)
    return plan(x, w, b)


def linear_layer(m: nn.Linear, x: Tensor, act: Optional[str]) -> Tensor:
    """What the patched linear layer ``m`` computes on ``x``, plus the fused activation ``act``."""
    w, b = m.weight, m.bias
    memo = m.__dict__.get(_KEY)
    if (memo is not None and memo.sx == (x.shape, x.stride(), x.dtype, x.get_device())
            and memo.sw == (w.shape, w.stride(), w.dtype, w.get_device())
            and memo.sb == (None if b is None else (b.shape, b.stride(), b.dtype, b.get_device()))
            and memo.act == act and not _any_autocast() and _direct(x, w, b)
            and memo.prec == (_matmul_precision() if x.dtype is _F32 else None) and memo.gen == generation()):
        return memo.plan(x, w, b)
    get = _SIGS.get
    fx, fw, fb = get(type(x)), get(type(w)), get(type(b))
    if fx is None or fw is None or fb is None or _any_autocast() or not _direct(x, w, b):
        return ops.linear(x, w, b, act)
    gen = generation()
    plan = bridge.linear_plan_for(x, w, b, act or "none")
    prec = _matmul_precision() if x.dtype is _F32 else None
    m.__dict__[_KEY] = CallMemo(gen, _meta(x), _meta(w), _meta(b), prec, act=act, plan=plan)
    return plan(x, w, b)


__all__ = ["CallMemo", "conv2d_layer", "linear_layer"]
