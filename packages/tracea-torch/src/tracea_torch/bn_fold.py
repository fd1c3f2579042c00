"""Folding an inference-mode ``nn.BatchNorm2d`` into the patched convolution that feeds it.

A convolution whose output goes only to a ``BatchNorm2d`` computes, in eval mode, ``conv(x, w') + b'``
with ``w' = w * s`` and ``b' = (b - mean) * s + beta`` per output channel (``s = gamma / sqrt(var + eps)``):
one kernel instead of the conv's and the normalization's, and in a forward whose host is the bottleneck
one launch less per pair. :func:`attach` finds the pairs when a model is patched, from a ``torch.fx``
trace of the model (or, where the whole model does not trace, of its largest submodules that do): a conv
node whose only user is a plain ``BatchNorm2d`` node taking it as its input, both modules registered and
called once (a timm ``BatchNormAct2d`` counts as a BatchNorm: its activation is then fused into the
conv as well where the kernels have it). A trace only succeeds where the forward's dataflow does not depend on tensor values, so the
path traced is the path a forward takes (in eval mode: the trace runs with every module in eval mode).

At run time the conv folds only while folding is exactly equivalent: the BatchNorm in eval mode with its
running statistics, no gradient needed (grad mode off, or nothing requiring grad), no forward hooks on
either module (nor global ones, which would see the folded output), not inside a Dynamo trace, no autocast
(which runs the batch norm in float32). The folded
weight and bias are computed once in float64 (rounded to the weight's dtype) and again whenever a
parameter or running statistic changes (version counters and addresses are compared each call), in place
where the layout allows, except during CUDA graph capture, where an unfolded call is captured instead. A
CUDA graph captured with folded weights reads the buffers they were folded into: those stay alive as long
as the conv does (after unpatching too), and a refold (the next call outside the graph after a parameter
or statistic changed) writes into them, so a replay after that reads the new values; replays before it
read the weights folded before (unlike the unfolded modules, whose parameters a graph reads directly). The conv hands its output to its
BatchNorm (:class:`FoldedBatchNorm2d`; per thread, :func:`pending`), which passes exactly that tensor
through; anything else it
computes as a BatchNorm2d does. An activation module that alone takes a plain BatchNorm's output (timm's
ResNets: ``act1(bn1(conv1(x)))``) is fused into the conv too when the kernels have it (ReLU, SiLU, GELU),
passing the conv's output through the same way. A BatchNorm (or activation) that receives another tensor while its conv's folded output
is pending means the forward left the traced path: it raises :class:`~tracea.errors.VerificationError`
and folding stays off for that pair.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
from torch import Tensor, nn
from torch.nn.modules import module as _module_globals

from .adapter import stream_capturing
from .layer_path import _any_autocast, _is_dynamo_compiling

_BN = "_tracea_bn"  # conv.__dict__: the BatchNorm2d its output feeds
_FOLD = "_tracea_fold"  # conv.__dict__: (key, (weight, bias), the tensors folded) of the last fold
_ACT = "_tracea_bn_act"  # producer.__dict__: the activation it applies (a BatchNormAct's or the next module's)
_NEXT = "_tracea_bn_next"  # producer.__dict__: the activation module fused after it, or None
_CONV = "_tracea_bn_conv"  # consumer.__dict__ (the BatchNorm, the fused activation module): its producer
_FUSED = "_tracea_act_fused"  # bn.__dict__: True when the conv applies the activation
#: conv -> folded buffers a CUDA graph captured (kept while the conv lives, after unpatching too)
_CAPTURED: "weakref.WeakKeyDictionary[nn.Module, list[Tensor]]" = weakref.WeakKeyDictionary()
_capturing = stream_capturing()
#: each thread's hand-overs: id(module) -> the output its producer (a folding conv, a fusing linear) handed
#: it, until the module takes it (per thread: one model may run forwards in several threads at once)
_tls = threading.local()


def pending() -> dict[int, Tensor]:
    """This thread's hand-overs (see ``_tls``)."""
    try:
        return _tls.pending  # type: ignore[no-any-return]
    except AttributeError:
        out: dict[int, Tensor] = {}
        _tls.pending = out
        return out


def _handed(m: nn.Module, input: Tensor) -> bool:  # noqa: A002
    """Whether ``input`` is what ``m``'s producer handed it (then ``m`` passes it through); another tensor
    while a hand-over is pending raises (:func:`_diverged`); under Dynamo nothing is handed over."""
    if _is_dynamo_compiling():
        return False
    mark = pending().pop(id(m), None)
    if mark is input:
        return True
    if mark is not None:
        _diverged(m)
    return False


class FoldedBatchNorm2d(nn.BatchNorm2d):
    """A ``BatchNorm2d`` folded into the convolution before it: passes the conv's folded output through,
    computes every other input as ``nn.BatchNorm2d`` does (its class is swapped back on unpatch)."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - nn.BatchNorm2d's parameter name
        return input if _handed(self, input) else super().forward(input)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", folded into the preceding conv"


def _tail_forward(self: Any, input: Tensor) -> Tensor:  # noqa: A002
    """forward of a folded BatchNorm-plus-activation module (timm's ``BatchNormAct2d``: batch norm, then
    ``self.drop``, then ``self.act``): the folded output gets the dropout and activation unless the conv
    applied the activation itself."""
    if _handed(self, input):
        return input if self.__dict__.get(_FUSED) else self.act(self.drop(input))
    return super(type(self), self).forward(input)


_TAIL_CLASSES: dict[type, type] = {}


def _passing_forward(self: Any, input: Tensor) -> Tensor:  # noqa: A002
    """forward of an activation module fused into the layer producing its input (a conv before a folded
    BatchNorm, a linear): that layer's output (already activated) passes through; an input while none is
    pending gets the activation (the layer did not fuse it: unfolded, under Dynamo, a direct call)."""
    return input if _handed(self, input) else super(type(self), self).forward(input)


def _passing_repr(self: Any) -> str:
    base = super(type(self), self).extra_repr()
    return (base + ", " if base else "") + "fused into the layer before it"


_PASSING_CLASSES: dict[type, type] = {}


def _passing_class(cls: type) -> type:
    """The stand-in class of an activation module fused after a folded BatchNorm (a subclass of it)."""
    passing = _PASSING_CLASSES.get(cls)
    if passing is None:
        passing = _PASSING_CLASSES[cls] = _derived("Fused", cls, {
            "forward": _passing_forward, "extra_repr": _passing_repr,
            "__doc__": f"A {cls.__name__} fused into the layer before it (tracea_torch.bn_fold)."})
    return passing


#: the module attribute name of a derived class: its kind, then the base's module and qualified name
_SEP, _DOT = "__of__", "__dot__"


def _derived(kind: str, base: type, body: dict[str, Any]) -> type:
    """A subclass of ``base`` defined in this module under a name that says how to rebuild it, so that a
    pickled patched model loads in a process that has not made it yet (see :func:`__getattr__`)."""
    name = f"{kind}{_SEP}{base.__module__.replace('.', _DOT)}{_SEP}{base.__qualname__.replace('.', _DOT)}"
    cls = type(name, (base,), {"__module__": __name__, "__qualname__": name, **body})
    globals()[name] = cls
    return cls


def __getattr__(name: str) -> type:
    """Rebuild a derived class (:func:`_derived`) that a pickle names; other names: AttributeError."""
    parts = name.split(_SEP)
    if len(parts) == 3 and parts[0] in ("Fused", "Folded"):
        import importlib

        base: Any = importlib.import_module(parts[1].replace(_DOT, "."))
        for attr in parts[2].split(_DOT):
            base = getattr(base, attr)
        return _passing_class(base) if parts[0] == "Fused" else _folded_class(base)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_norm_act(bn: nn.Module) -> bool:
    """timm's ``BatchNormAct2d`` (a BatchNorm2d subclass computing batch norm, ``drop``, then ``act``)."""
    return (isinstance(bn, nn.BatchNorm2d) and type(bn).__name__ == "BatchNormAct2d"
            and isinstance(getattr(bn, "drop", None), nn.Module) and isinstance(getattr(bn, "act", None), nn.Module))


def _folded_class(cls: type) -> type:
    """The folded stand-in class for a BatchNorm class (a subclass of it, so ``isinstance`` holds)."""
    if cls is nn.BatchNorm2d:
        return FoldedBatchNorm2d
    folded_cls = _TAIL_CLASSES.get(cls)
    if folded_cls is None:
        folded_cls = _TAIL_CLASSES[cls] = _derived("Folded", cls, {
            "forward": _tail_forward, "extra_repr": FoldedBatchNorm2d.extra_repr,
            "__doc__": f"A {cls.__name__} folded into the convolution before it (see tracea_torch.bn_fold)."})
    return folded_cls


def _unlink(producer: Optional[nn.Module]) -> None:
    """``producer`` (a folding conv, a fusing linear) stops folding and fusing; none of its hand-overs
    stays pending in this thread."""
    if producer is None:
        return
    d = producer.__dict__
    hand = pending()
    for consumer in (d.get(_BN), d.get(_NEXT)):
        if consumer is not None:
            hand.pop(id(consumer), None)
    for key in (_BN, _FOLD, _NEXT, _ACT):
        d.pop(key, None)


def _diverged(m: nn.Module) -> None:
    _unlink(m.__dict__.get(_CONV))
    from tracea.errors import VerificationError

    raise VerificationError(
        f"tracea: a {type(m).__name__} folded or fused into the layer before it received another tensor than "
        "that layer's output: this forward did not follow the path traced when the model was patched, and a "
        "result computed on the folded output cannot be trusted. Folding is now off for this pair; run the "
        "forward again, or patch with fold_batchnorm=False")


def folded(conv: nn.Conv2d, bn: nn.BatchNorm2d, x: Tensor) -> Optional[tuple[Tensor, Optional[Tensor]]]:
    """The folded ``(weight, bias)`` for this call of ``conv`` on ``x``, or None when folding is not exactly
    equivalent now (see the module docstring)."""
    if (bn.training or conv._forward_hooks or bn._forward_pre_hooks or bn._forward_hooks
            or _module_globals._global_forward_hooks or _module_globals._global_forward_pre_hooks
            or _is_dynamo_compiling() or _any_autocast()):  # (autocast runs batch_norm in float32)
        return None
    ps, bps, bbs = conv._parameters, bn._parameters, bn._buffers
    w, b = ps["weight"], ps.get("bias")
    g, beta = bps.get("weight"), bps.get("bias")
    mean, var = bbs.get("running_mean"), bbs.get("running_var")
    if mean is None or var is None or w is None:
        return None
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)
                                    or (g is not None and g.requires_grad)
                                    or (beta is not None and beta.requires_grad)):
        return None
    # each tensor's version and address (in-place changes, `.data` replaced, `.to()`), the objects themselves
    # (a buffer or parameter replaced by another, maybe at a freed one's address: held in the cache, so
    # compared by identity), eps and the dtype
    refs = (w, b, g, beta, mean, var)
    try:
        key = (w._version, w.data_ptr(), mean._version, mean.data_ptr(), var._version, var.data_ptr(),
               -1 if b is None else b._version, 0 if b is None else b.data_ptr(),
               -1 if g is None else g._version, 0 if g is None else g.data_ptr(),
               -1 if beta is None else beta._version, 0 if beta is None else beta.data_ptr(), bn.eps, w.dtype)
    except RuntimeError:  # inference tensors (a model built under torch.inference_mode) keep no versions:
        return None  # their in-place changes could not be seen, so such a pair is not folded
    cache = conv.__dict__.get(_FOLD)
    capturing = w.is_cuda and _capturing()
    if cache is not None and cache[0] == key:
        r = cache[2]
        if r[0] is w and r[1] is b and r[2] is g and r[3] is beta and r[4] is mean and r[5] is var:
            if capturing:  # a graph now holds these buffers' addresses: they outlive the cache and the patch
                kept = _CAPTURED.setdefault(conv, [])
                if not any(t is cache[1][0] for t in kept):
                    kept.extend(cache[1])
            return cache[1]
    if capturing:
        return None  # (no new tensors inside a capture: this call is captured unfolded)
    wb = _fold(w, b, g, beta, mean, var, bn.eps)
    if cache is not None and _same_layout(cache[1], wb):
        with torch.inference_mode(False), torch.no_grad():  # refolded in place: a graph captured before reads it
            cache[1][0].copy_(wb[0])
            cache[1][1].copy_(wb[1])
        wb = cache[1]
    conv.__dict__[_FOLD] = (key, wb, refs)
    return wb


def _same_layout(old: tuple[Tensor, Tensor], new: tuple[Tensor, Tensor]) -> bool:
    return all(a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and a.stride() == b.stride()
               for a, b in zip(old, new))


def _fold(w: Tensor, b: Optional[Tensor], g: Optional[Tensor], beta: Optional[Tensor], mean: Tensor,
          var: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    with torch.inference_mode(False), torch.no_grad():  # (normal tensors: refolded in place later, anywhere)
        scale = torch.rsqrt(var.double() + eps)
        if g is not None:
            scale = scale * g.double()
        shift = -mean.double() * scale if b is None else (b.double() - mean.double()) * scale
        if beta is not None:
            shift = shift + beta.double()
        w_f = torch.empty_like(w)  # (w's strides: a channels-last weight stays channels-last)
        w_f.copy_(w.double() * scale.view(-1, *([1] * (w.dim() - 1))))
        return w_f, shift.to(w.dtype)


# ------------------------------------------------------------------------------------------------
# Finding the pairs
# ------------------------------------------------------------------------------------------------

class _Tracer(torch.fx.Tracer):
    """Convs and BatchNorms are leaves (the nodes looked for), and so is every module holding neither:
    what happens inside it cannot join a pair, and not tracing into it spares its control flow."""

    def __init__(self, leaves: set[int]) -> None:
        super().__init__()
        self.leaves = leaves
        self.proxy_buffer_attributes = True  # (``self.count += 1`` in a forward: symbolic, the buffer untouched)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return id(m) in self.leaves or super().is_leaf_module(m, module_qualified_name)


def _leaves(root: nn.Module, kinds: tuple[type, ...] = (nn.Conv2d, nn.BatchNorm2d)) -> set[int]:
    """ids of the modules traced as leaves: modules of ``kinds`` (convs and BatchNorms) and every module
    containing none."""
    out: set[int] = set()

    def walk(m: nn.Module) -> bool:  # True when m holds a module of kinds
        if isinstance(m, kinds):
            out.add(id(m))
            return True
        holds = False
        for child in m.children():
            holds = walk(child) or holds
        if not holds:
            out.add(id(m))
        return holds

    walk(root)
    return out


Pair = tuple[nn.Module, nn.Module, Optional[nn.Module]]


def call_counts(graph: Any) -> dict[str, int]:
    """How many times a traced graph calls each submodule (by qualified name)."""
    called: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            called[node.target] = called.get(node.target, 0) + 1
    return called


def sole_module_user(node: Any, called: dict[str, int]) -> Any:
    """The node of the module call that alone uses ``node``'s value, as its only argument, and is that
    module's only call in the graph; else None."""
    if len(node.users) != 1:
        return None
    (user,) = node.users
    if user.op != "call_module" or called[user.target] != 1 or user.args != (node,) or user.kwargs:
        return None
    return user


def _pairs_in(graph: Any, root: nn.Module, uses: dict[int, int], convs: set[int]) -> list[Pair]:
    called = call_counts(graph)
    pairs: list[Pair] = []
    for node in graph.nodes:
        if node.op != "call_module" or called[node.target] != 1:
            continue
        conv = root.get_submodule(node.target)
        user = sole_module_user(node, called)
        if id(conv) not in convs or uses.get(id(conv)) != 1 or user is None:
            continue
        bn = root.get_submodule(user.target)
        if ((type(bn) is not nn.BatchNorm2d and not _is_norm_act(bn)) or uses.get(id(bn)) != 1
                or not bn.track_running_stats or bn._forward_hooks or bn._forward_pre_hooks
                or bn.num_features != conv.out_channels or conv.padding_mode != "zeros"):  # type: ignore[attr-defined]
            continue
        after = sole_module_user(user, called)  # the module the BatchNorm's output goes to, alone
        nxt = None if after is None else root.get_submodule(after.target)
        if nxt is not None and (uses.get(id(nxt)) != 1 or nxt._forward_hooks or nxt._forward_pre_hooks):
            nxt = None
        pairs.append((conv, bn, nxt))
    return pairs


_saved = object()  # (a key missing after tracing)


def traced(model: nn.Module, wanted: set[int], kinds: tuple[type, ...]) -> Iterator[tuple[Any, nn.Module]]:
    """(graph, root) for ``model`` traced in eval mode with modules of ``kinds`` as leaves, or, where it does
    not trace, for its children holding a module in ``wanted`` (ids), recursively; modes, attributes and
    buffers restored after (buffers are traced as proxies, so an in-place update in the forward touches none)."""
    modes = [(m, m.training) for m in model.modules()]
    # tracing runs the forward's Python: an attribute it assigns (``self.last = x.shape``) would keep a Proxy
    saved = [(m, dict(m.__dict__), dict(m._parameters), dict(m._buffers), dict(m._modules)) for m, _ in modes]
    try:
        model.eval()
        todo = [model]
        while todo:
            root = todo.pop()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    graph = _Tracer(_leaves(root, kinds) - {id(root)}).trace(root)
            except Exception:  # noqa: BLE001 - not traceable (tensor-dependent control flow, ...): look inside
                todo.extend(c for c in root.children() if any(id(m) in wanted for m in c.modules()))
                continue
            yield graph, root
    finally:
        for m, attrs, params, buffers, children in saved:
            pairs: tuple[tuple[dict[str, Any], dict[str, Any]], ...] = (
                (m.__dict__, attrs), (m._parameters, params), (m._buffers, buffers), (m._modules, children))
            for now, before in pairs:
                if len(now) != len(before) or any(now.get(k, _saved) is not v for k, v in before.items()):
                    now.clear()
                    now.update(before)
        for m, training in modes:
            m.training = training


def find_pairs(model: nn.Module, convs: Iterable[nn.Module], uses: dict[int, int]) -> list[Pair]:
    """(conv, BatchNorm2d, next) triples of ``model`` among ``convs`` (see the module docstring; ``next``:
    the module taking the BatchNorm's output as its only use, or None); ``uses``: how many times each module
    is registered in the model. The model is traced in eval mode, its modes restored."""
    conv_ids = {id(c) for c in convs}
    if not conv_ids or not any(isinstance(m, nn.BatchNorm2d) for m in model.modules()):
        return []
    pairs: list[Pair] = []
    for graph, root in traced(model, conv_ids, (nn.Conv2d, nn.BatchNorm2d)):
        pairs += _pairs_in(graph, root, uses, conv_ids)
    return pairs


def attach(conv: nn.Module, bn: nn.Module, act_of: Callable[[nn.Module], Optional[str]],
           nxt: Optional[nn.Module] = None) -> Optional[nn.Module]:
    """Fold ``bn`` into ``conv`` (a :class:`~tracea_torch.modules.TraceaConv2d`) from the next call on. A
    BatchNormAct's activation is fused into the conv too when ``act_of(bn.act)`` names one the kernels
    apply (and its dropout is the identity); else the BatchNorm module applies its dropout and activation
    to the folded output. A plain BatchNorm's ``nxt`` (the module its output goes to alone) that
    ``act_of`` names is fused the same way: its class becomes a subclass passing the conv's output
    through (returned, to be restored on unpatch)."""
    fused = None
    passed = None
    if _is_norm_act(bn):
        act_module = bn.act  # type: ignore[union-attr]
        if (type(bn.drop) is nn.Identity and not act_module._forward_hooks  # type: ignore[union-attr]
                and not act_module._forward_pre_hooks):  # type: ignore[union-attr]
            fused = act_of(act_module)  # type: ignore[arg-type]
    elif nxt is not None and (fused := act_of(nxt)) is not None:
        nxt.__class__ = _passing_class(type(nxt))
        nxt.__dict__[_CONV] = conv
        passed = nxt
    bn.__class__ = _folded_class(type(bn))
    bn.__dict__[_CONV] = conv
    bn.__dict__[_FUSED] = fused is not None
    conv.__dict__[_BN] = bn
    conv.__dict__[_ACT] = fused
    conv.__dict__[_NEXT] = passed
    return passed


def detach(m: nn.Module) -> None:
    """Forget folding and fusing state on ``m`` (being unpatched): as a producer (a conv, a linear), and as
    a consumer (a BatchNorm, an activation module), whose producer then stops folding or fusing too."""
    pending().pop(id(m), None)
    _unlink(m)
    _unlink(m.__dict__.pop(_CONV, None))
    m.__dict__.pop(_FUSED, None)


__all__ = ["FoldedBatchNorm2d", "attach", "detach", "find_pairs", "folded"]
