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

The tensors are compared by one C++ call (:func:`tracea_torch.guards.guard_of`), except for a memo of a
signature PyTorch serves (see :class:`CallMemo`'s ``lean``), matched on fewer, cheaper reads.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from tracea.runtime import env_watch, plans
from tracea.runtime.fallbacks import counter as _counter
from tracea.runtime.plans import generation

from . import bridge, ops, recording
from .adapter import stream_capturing
from .bridge_plans import _ACT_FNS
from .guards import NO_TENSOR as _NO_BIAS
from .guards import guard_of as _guard_of
from .torch_flags import cudnn_allow_tf32 as _cudnn_tf32
from .torch_flags import matmul_precision as _matmul_precision
from .ops import (_any_autocast, _dispatch_modes, _function_modes, _grad_enabled, _is_dynamo_compiling, _pair,
                  _tracing_state, _transforms_active)

_F32 = torch.float32
_conv2d, _linear = torch.nn.functional.conv2d, torch.nn.functional.linear
_capturing = stream_capturing()
_KEY = "_tracea_memo"
#: the plan cache's generation and the environment write count, read in place by a lean memo's check
#: (no call: it skips :func:`generation`'s tuning-cache file recheck, which a signature PyTorch serves
#: can wait for -- an in-process cache change or a steering variable written through ``os.environ``
#: is seen at once)
_GEN, _WRITES = plans._generation, env_watch.WRITES


class CallMemo:
    """One layer's last call signature and the plan that serves it. ``check(x, w, b or _NO_BIAS)``
    compares the tensors;
    ``rg``: some tensor requires grad (then the plan serves only while grad mode is off); ``prec``: the
    float32 mode the plan was chosen under, read by ``prec_of`` (None when the call is not float32);
    ``lean``: 1 when PyTorch serves the signature (the arbiter's verdict, or a CUDA call no kernel serves),
    2 when it serves the signature's eager calls and Tracea only calls captured in CUDA graphs, 0 otherwise;
    also for a layer that fuses an activation PyTorch has as a function (``actfn``: relu, GELU, SiLU). A
    lean call (for 2: one whose stream is not capturing) calls ``F.conv2d`` / ``F.linear`` (and ``actfn``)
    itself, as the unpatched layer does (they handle grad, autocast, tracing and precision themselves:
    only the signature and the plan generation are checked); ``count``: the counting cell
    (``tracea.runtime.fallbacks.counter``) of the ``(kind, reason)`` a lean call counts in
    :mod:`tracea_torch.fallbacks` (None for a verdict, which is counted once). A lean memo is matched by a
    cheaper check than ``check`` (``x``'s shape, dtype and device,
    the weight object and its dtype: ``lean_sig``; ``x`` a plain tensor, not a subclass such as the fake
    tensors of ``torch.export``), since what it runs, the functional call itself, is right for any tensors:
    a looser match can only cost speed, never a result."""

    __slots__ = ("gen", "check", "rg", "prec_of", "prec", "stride", "padding", "dilation", "groups", "act",
                 "actfn", "plan", "lean", "count", "xshape", "xdtype", "xcuda", "w", "wdtype", "writes")

    def __init__(self, gen: int = -1, check: Optional[Callable[..., bool]] = None, rg: bool = False,
                 prec_of: Optional[Callable[[], Any]] = None, prec: Any = None, stride: Any = None,
                 padding: Any = None, dilation: Any = None, groups: Any = None, act: Optional[str] = None,
                 plan: Optional[Callable[..., Tensor]] = None) -> None:
        self.gen, self.check, self.rg, self.prec_of, self.prec = gen, check or _never, rg, prec_of, prec
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.act, self.plan = act, plan
        self.actfn = _ACT_FNS.get(act) if act is not None else None
        self.lean = 0 if act is not None and self.actfn is None else 1 if getattr(plan, "lean", False) else 2 if getattr(
            plan, "lean_eager", False) else 0
        count = getattr(plan, "count", None)
        self.count = None if count is None else _counter(*count)
        self.xshape: Any = None
        self.xdtype: Any = None
        self.xcuda: Any = None
        self.writes: Any = None
        self.w: Any = None
        self.wdtype: Any = None

    def lean_sig(self, x: Tensor, w: Tensor, writes: int) -> "CallMemo":
        """Remember what a lean memo is matched on (``x``'s shape, dtype and whether it is on CUDA, the
        weight; ``writes``: the environment write count when the plan generation was read)."""
        self.xshape, self.xdtype, self.xcuda, self.w, self.wdtype = x.shape, x.dtype, x.is_cuda, w, w.dtype
        self.writes = writes
        return self

    def __reduce__(self) -> tuple:
        return (CallMemo, ())  # plans do not travel: a copy or an unpickled model starts empty


def _never(*tensors: Any) -> bool:
    return False


def _memo(gen: int, x: Tensor, w: Tensor, b: Optional[Tensor], prec_of: Optional[Callable[[], Any]],
          plan: Callable[..., Tensor], writes: Optional[int] = None, **hyper: Any) -> CallMemo:
    bb = _NO_BIAS if b is None else b
    memo = CallMemo(gen, _guard_of(x, w, bb).check, bool(x.requires_grad or w.requires_grad or bb.requires_grad),
                    prec_of, None if prec_of is None else prec_of(), plan=plan, **hyper)
    return memo.lean_sig(x, w, _WRITES[0] if writes is None else writes) if memo.lean else memo


def conv2d_layer(m: nn.Conv2d, x: Tensor, w: Tensor, b: Optional[Tensor], act: Optional[str]) -> Tensor:
    """What the patched conv layer ``m`` (``padding_mode="zeros"``) computes on ``x`` with weight ``w``
    and bias ``b``, plus the fused activation ``act``."""
    d = m.__dict__
    memo = d.get(_KEY)
    # (dynamo does not trace the C++ tensor comparison: compiling takes the refresh path's custom op)
    if memo is not None and not _is_dynamo_compiling():
        lean = memo.lean
        if lean and (lean == 1 or not _capturing()):  # (F.conv2d reads the hyper-parameters itself)
            if (type(x) is Tensor and x.shape == memo.xshape and x.dtype is memo.xdtype and w is memo.w and w.dtype is memo.wdtype
                    and x.is_cuda is memo.xcuda and act == memo.act and memo.gen == _GEN[0] and memo.writes == _WRITES[0]
                    and recording._recorder is None):
                if memo.count is not None:
                    memo.count[0] += 1
                out = _conv2d(x, w, b, m.stride, m.padding, m.dilation, m.groups)
                return out if act is None else memo.actfn(out)
        # (the hyper-parameters read from the instance dict: ~4x cheaper than attribute reads through
        # nn.Module's class hierarchy; a class that computes them as properties never matches, safely)
        elif (memo.check(x, w, _NO_BIAS if b is None else b) and memo.stride is d.get("stride")
                and memo.padding is d.get("padding") and memo.dilation is d.get("dilation")
                and memo.groups == d.get("groups") and memo.act == act and memo.gen == generation()
                and not _any_autocast()
                and not (_tracing_state() is not None or _dispatch_modes() or _function_modes()
                         or _transforms_active() or (memo.rg and _grad_enabled()))
                and (memo.prec_of is None or memo.prec_of() == memo.prec)):
            return memo.plan(x, w, b)
    return _conv2d_refresh(m, x, w, b, act)


def _conv2d_refresh(m: nn.Conv2d, x: Tensor, w: Tensor, b: Optional[Tensor], act: Optional[str]) -> Tensor:
    padding = m.padding
    if isinstance(padding, str) or x.dim() != 4 or _any_autocast() or not ops._direct(x, w, b):  # the general path
        return ops.conv2d(x, w, b, m.stride, padding, m.dilation, m.groups, activation=act)
    writes = _WRITES[0]  # (read first: a write between the two makes the lean memo refresh once more)
    gen = generation()  # before building: a plan built across an invalidation is looked up again
    plan = bridge.conv2d_plan_for(x, w, b, _pair(m.stride, "stride"), _pair(padding, "padding"),
                                  _pair(m.dilation, "dilation"), int(m.groups), act or "none")
    if not getattr(plan, "transient", False):  # (a plan for this call only is not remembered)
        prec_of = (_cudnn_tf32 if x.is_cuda else _matmul_precision) if x.dtype is _F32 else None
        m.__dict__[_KEY] = _memo(gen, x, w, b, prec_of, plan, writes, stride=m.stride, padding=padding,
                                 dilation=m.dilation, groups=m.groups, act=act)
    return plan(x, w, b)


def layer_params(m: nn.Module) -> tuple[Tensor, Optional[Tensor]]:
    """``(m.weight, m.bias)`` read from the module's parameter dict: ``m.weight`` goes through
    ``nn.Module.__getattr__`` (~0.5 us a read on a fast host, more than the rest of a memo hit's checks).
    A weight that is not a registered parameter (a hook computes it, as ``weight_norm`` does) is read as
    an attribute."""
    ps: Any = m._parameters
    try:
        return ps["weight"], ps["bias"]
    except KeyError:
        return m.weight, m.bias  # type: ignore[return-value]


def linear_layer(m: nn.Linear, x: Tensor, act: Optional[str]) -> Tensor:
    """What the patched linear layer ``m`` computes on ``x``, plus the fused activation ``act``."""
    ps: Any = m._parameters
    w: Any
    b: Any
    try:
        w, b = ps["weight"], ps["bias"]
    except KeyError:  # (as in layer_params, inlined: a call frame costs ~0.1 us here)
        w, b = m.weight, m.bias
    memo = m.__dict__.get(_KEY)
    if memo is not None and not _is_dynamo_compiling():  # (compiling: as in conv2d_layer)
        lean = memo.lean
        if lean and (lean == 1 or not _capturing()):
            if (type(x) is Tensor and x.shape == memo.xshape and x.dtype is memo.xdtype and w is memo.w and w.dtype is memo.wdtype
                    and x.is_cuda is memo.xcuda and act == memo.act and memo.gen == _GEN[0] and memo.writes == _WRITES[0]
                    and recording._recorder is None):
                if memo.count is not None:
                    memo.count[0] += 1
                return _linear(x, w, b) if act is None else memo.actfn(_linear(x, w, b))
        elif (memo.check(x, w, _NO_BIAS if b is None else b) and memo.act == act and memo.gen == generation()
                and not _any_autocast()
                and not (_tracing_state() is not None or _dispatch_modes() or _function_modes()
                         or _transforms_active() or (memo.rg and _grad_enabled()))
                and (memo.prec_of is None or memo.prec_of() == memo.prec)):
            return memo.plan(x, w, b)
    if _any_autocast() or not ops._direct(x, w, b):
        return ops.linear(x, w, b, act)
    writes = _WRITES[0]
    gen = generation()
    plan = bridge.linear_plan_for(x, w, b, act or "none")
    if not getattr(plan, "transient", False):
        m.__dict__[_KEY] = _memo(gen, x, w, b, _matmul_precision if x.dtype is _F32 else None, plan, writes, act=act)
    return plan(x, w, b)


__all__ = ["CallMemo", "conv2d_layer", "layer_params", "linear_layer"]
