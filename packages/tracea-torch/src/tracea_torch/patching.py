"""Patch PyTorch so existing models run their convolutions and linear layers on Tracea.

Two scopes, both idempotent and exactly reversible:

* **global** (``patch_conv2d()`` with no model): replaces ``nn.Conv2d._conv_forward`` (which
  ``nn.Conv2d.forward`` and most subclasses call) and ``nn.Linear.forward`` for every instance, existing
  and new. Unpatching puts the original function objects back.
* **one model** (``patch_conv2d(model, filter=...)``): swaps the class of each selected plain
  ``nn.Conv2d`` / ``nn.Linear`` to :class:`TraceaConv2d` / :class:`TraceaLinear` in place. Parameters,
  buffers, hooks and ``state_dict`` keys stay as they are; unpatching restores the original classes.
  Inside a plain ``nn.Sequential``, a layer directly followed by ``nn.ReLU``/``nn.GELU``/``nn.SiLU``
  gets that activation fused into its kernel and the activation module becomes a pass-through
  (``fuse_activations=False`` to keep them separate). Fusion is skipped when either module is used more
  than once in the model. With ``fuse_activations="traced"``, a linear whose output goes only to such an
  activation module anywhere in the forward (found by tracing the model, :mod:`tracea_torch.act_fuse`)
  fuses it too; a conv feeding an eval-mode BatchNorm folds it (:mod:`tracea_torch.bn_fold`).

Attention (``patch_attention``) has no module to swap: layers call ``F.scaled_dot_product_attention``
(Hugging Face's ``sdpa`` attention, ``nn.MultiheadAttention``'s fast path does not). Globally, that
attribute of ``torch.nn.functional`` is replaced by :func:`tracea_torch.ops.scaled_dot_product_attention`
(code that bound the function under another name before patching keeps PyTorch's); for one model, the
model's ``forward`` is wrapped so that the replacement is in place while that forward runs (other
threads calling SDPA meanwhile also get Tracea's: same results). Under ``torch.compile`` only the
global patch applies (Dynamo cannot trace the per-model swap; the global one puts the ``tracea::sdpa``
custom op into the graph). Unpatching restores both.

A model patched at model scope (any kind) also gets its ``forward`` wrapped for the model check
(:mod:`tracea_torch.model_check`): its first calls of each signature are judged against the model
unpatched, and the faster route serves that signature. The wrapper goes when the model's last patch does.

``patched(...)`` is the context-manager form; it undoes only what it did.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Callable, Iterator, Optional

import torch
from torch import Tensor, nn

from . import act_fuse, bn_fold, model_check, ops
from .bridge import parse_activation
from .compat import check_torch_version
from .layer_path import conv2d_layer, linear_layer
from .modules import TraceaConv2d, TraceaLinear

#: ``filter(name, module) -> bool`` picks which layers of a model to patch.
ModuleFilter = Callable[[str, nn.Module], bool]

_lock = threading.RLock()
_ORIGINALS: dict[str, Any] = {}  # "conv2d"/"linear" -> original function while globally patched
# module -> (what, original class, activation it had before) for every in-place class swap.
_SWAPPED: "weakref.WeakKeyDictionary[nn.Module, tuple[str, type, Optional[str]]]" = weakref.WeakKeyDictionary()

_ACTIVATION_MODULES: dict[type, Callable[[nn.Module], Optional[str]]] = {
    nn.ReLU: lambda m: "relu",
    nn.SiLU: lambda m: "silu",
    nn.GELU: lambda m: "gelu_tanh" if getattr(m, "approximate", "none") == "tanh" else "gelu_erf",
}


def _activation_of(m: nn.Module) -> Optional[str]:
    """The epilogue activation an activation module computes, or None when the kernels have none for it."""
    spell = _ACTIVATION_MODULES.get(type(m))
    return parse_activation(spell(m)) if spell is not None else None


_KINDS = {"conv2d": (nn.Conv2d, TraceaConv2d), "linear": (nn.Linear, TraceaLinear)}


class FusedActivation(nn.Module):
    """Pass-through standing in for an activation fused into the preceding layer (its class is
    swapped back on unpatch)."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input

    def extra_repr(self) -> str:
        original = _SWAPPED.get(self)
        return f"{original[1].__name__} fused into the previous layer" if original else ""


def _tracea_conv_forward(self: nn.Conv2d, input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:  # noqa: A002
    if self.padding_mode != "zeros":
        padded = nn.functional.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
        return ops.conv2d(padded, weight, bias, self.stride, 0, self.dilation, self.groups)
    return conv2d_layer(self, input, weight, bias, None)


def _tracea_linear_forward(self: nn.Linear, input: Tensor) -> Tensor:  # noqa: A002
    return linear_layer(self, input, None)


_GLOBAL_TARGETS = {"conv2d": (nn.Conv2d, "_conv_forward", _tracea_conv_forward),
                   "linear": (nn.Linear, "forward", _tracea_linear_forward),
                   "attention": (nn.functional, "scaled_dot_product_attention", ops.scaled_dot_product_attention)}


# ------------------------------------------------------------------------------------------------
# Global patching
# ------------------------------------------------------------------------------------------------

def _patch_global(kind: str) -> bool:
    cls, attr, replacement = _GLOBAL_TARGETS[kind]
    with _lock:
        if kind in _ORIGINALS:
            return False
        _ORIGINALS[kind] = cls.__dict__[attr]
        if kind == "attention" and _SDPA_DEPTH[0]:  # a patched model's forward is running: it restores this
            _ORIGINALS[kind] = _SDPA_SAVED[0]
        setattr(cls, attr, replacement)
        return True


def _unpatch_global(kind: str) -> bool:
    cls, attr, _ = _GLOBAL_TARGETS[kind]
    with _lock:
        if kind not in _ORIGINALS:
            return False
        setattr(cls, attr, _ORIGINALS.pop(kind))
        return True


def is_patched(kind: str = "conv2d", model: Optional[nn.Module] = None) -> bool:
    """Whether ``kind`` (``"conv2d"``, ``"linear"`` or ``"attention"``) is patched globally, or (with ``model``) whether
    any of the model's layers of that kind was swapped."""
    if model is None:
        return kind in _ORIGINALS
    if kind == "attention":
        wrapper = model.__dict__.get("forward")
        return model in _FORWARDS and isinstance(wrapper, _ModelForward) and wrapper.sdpa
    return any(_SWAPPED.get(m, ("",))[0] == kind for m in model.modules())


# ------------------------------------------------------------------------------------------------
# Per-model patching
# ------------------------------------------------------------------------------------------------

def _use_counts(model: nn.Module) -> dict[int, int]:
    counts: dict[int, int] = {}
    for _, m in model.named_modules(remove_duplicate=False):
        counts[id(m)] = counts.get(id(m), 0) + 1
    return counts


def _fusable_pairs(model: nn.Module, base: type) -> dict[int, nn.Module]:
    """id(layer) -> the activation module that directly follows it inside a plain nn.Sequential."""
    uses = _use_counts(model)
    pairs: dict[int, nn.Module] = {}
    for seq in model.modules():
        if not isinstance(seq, nn.Sequential) or type(seq).forward is not nn.Sequential.forward:
            continue
        children = list(seq.children())
        for layer, nxt in zip(children, children[1:]):
            if (type(layer) is base and type(nxt) in _ACTIVATION_MODULES and not nxt._forward_hooks
                    and not nxt._forward_pre_hooks and uses[id(layer)] == 1 and uses[id(nxt)] == 1):
                pairs[id(layer)] = nxt
    return pairs


def _patch_model(model: nn.Module, kind: str, filter: Optional[ModuleFilter], fuse: "bool | str",
                 fold: bool = False) -> list[nn.Module]:
    if not isinstance(model, nn.Module):
        from tracea.errors import InvalidArgumentError

        raise InvalidArgumentError("model", type(model).__name__, "a torch.nn.Module")
    if fuse not in (True, False, "traced"):
        from tracea.errors import InvalidArgumentError

        raise InvalidArgumentError("fuse_activations", fuse, 'True, False or "traced"')
    base, target = _KINDS[kind]
    pairs = _fusable_pairs(model, base) if fuse else {}
    changed: list[nn.Module] = []
    with _lock:
        for name, m in model.named_modules():
            if type(m) is not base or m in _SWAPPED or (filter is not None and not filter(name, m)):  # type: ignore[arg-type]
                continue
            act_module = pairs.get(id(m))
            _SWAPPED[m] = (kind, type(m), m.__dict__.get("activation"))  # type: ignore[index]
            m.__class__ = target
            m.activation = None  # type: ignore[attr-defined]
            changed.append(m)  # type: ignore[arg-type]
            if act_module is not None and act_module not in _SWAPPED:
                m.activation = _activation_of(act_module)  # type: ignore[attr-defined]
                _SWAPPED[act_module] = ("activation:" + kind, type(act_module), None)
                act_module.__class__ = FusedActivation
                changed.append(act_module)
        if fuse == "traced" and kind == "linear":  # an activation module taking a linear's output alone
            linears = [m for m in model.modules() if type(m) is TraceaLinear and m.activation is None  # type: ignore[attr-defined]
                       and "_tracea_bn_next" not in m.__dict__]
            for linear, act_module, act in act_fuse.find(model, linears, _use_counts(model), _activation_of):
                if act_module in _SWAPPED:
                    continue
                act_class = type(act_module)
                act_fuse.attach(linear, act_module, act)
                _SWAPPED[act_module] = ("activation:" + kind, act_class, None)  # type: ignore[index]
                changed.append(act_module)
        if fold and kind == "conv2d":
            convs = [m for m in model.modules() if type(m) is TraceaConv2d and "_tracea_bn" not in m.__dict__]
            for conv, bn, nxt in bn_fold.find_pairs(model, convs, _use_counts(model)):
                if bn in _SWAPPED:
                    continue
                bn_class, nxt_class = type(bn), type(nxt)
                fuse_nxt = nxt if fuse and nxt is not None and nxt not in _SWAPPED else None
                passed = bn_fold.attach(conv, bn, _activation_of, fuse_nxt)
                _SWAPPED[bn] = ("batchnorm:" + kind, bn_class, None)  # type: ignore[index]
                changed.append(bn)
                if passed is not None:
                    _SWAPPED[passed] = ("batchnorm:" + kind, nxt_class, None)  # type: ignore[index]
                    changed.append(passed)
        if changed and not isinstance(model, (TraceaConv2d, TraceaLinear)):  # (a lone layer: the arbiter's)
            _forward_of(model).layers = True
    return changed


def _restore(modules: list[nn.Module]) -> int:
    restored = 0
    with _lock:
        for m in modules:
            entry = _SWAPPED.pop(m, None)
            if entry is None:
                continue
            _, cls, activation = entry
            m.__class__ = cls
            bn_fold.detach(m)  # (a restored BatchNorm's conv, if still patched, stops folding)
            if "activation" in m.__dict__:
                del m.__dict__["activation"]
            if activation is not None:
                m.__dict__["activation"] = activation
            restored += 1
    return restored


def _release_all(model: Optional[nn.Module]) -> None:
    for m in [model] if model is not None else list(_FORWARDS.keys()):
        _release(m)


def _swapped_in(model: Optional[nn.Module], kind: str) -> list[nn.Module]:
    pool = list(model.modules()) if model is not None else list(_SWAPPED.keys())
    return [m for m in pool if _SWAPPED.get(m, ("",))[0] in (kind, "activation:" + kind, "batchnorm:" + kind)]


# ------------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------------

def patch_conv2d(model: Optional[nn.Module] = None, *, filter: Optional[ModuleFilter] = None,
                 fuse_activations: "bool | str" = True, fold_batchnorm: bool = True) -> Optional[nn.Module]:
    """Run ``nn.Conv2d`` layers on Tracea.

    :param model: patch this model's plain ``nn.Conv2d`` layers in place (returned for chaining);
        None patches ``nn.Conv2d`` globally (every instance, existing and future, and subclasses that
        call ``_conv_forward``).
    :param filter: with ``model``, ``filter(qualified_name, module)`` chooses the layers.
    :param fuse_activations: with ``model``, fuse a directly following ReLU/GELU/SiLU in an nn.Sequential;
        ``"traced"`` also fuses, into a linear, an activation module taking its output alone anywhere in the
        forward (:mod:`tracea_torch.act_fuse`; opt-in: not measured faster).
    :param fold_batchnorm: with ``model``, fold each ``nn.BatchNorm2d`` that takes a patched conv's output
        (its only use, found by tracing the model) into that conv while the BatchNorm is in eval mode and no
        gradient is needed (:mod:`tracea_torch.bn_fold`).
    :raises UnsupportedConfigError: torch older than tracea-torch supports.
    """
    check_torch_version()
    if model is None:
        if filter is not None:
            from tracea.errors import InvalidArgumentError

            raise InvalidArgumentError("filter", filter, "no filter for a global patch (pass a model)")
        _patch_global("conv2d")
        return None
    _patch_model(model, "conv2d", filter, fuse_activations, fold_batchnorm)
    return model


def unpatch_conv2d(model: Optional[nn.Module] = None) -> None:
    """Undo :func:`patch_conv2d`: for ``model`` only its swapped layers; with no model, the global
    patch and every model patch still alive. Calling it when nothing is patched does nothing."""
    if model is None:
        _unpatch_global("conv2d")
    _restore(_swapped_in(model, "conv2d"))
    _release_all(model)


def patch_linear(model: Optional[nn.Module] = None, *, filter: Optional[ModuleFilter] = None,
                 fuse_activations: "bool | str" = True) -> Optional[nn.Module]:
    """Run ``nn.Linear`` layers on Tracea GEMMs with the bias (and a following activation) fused.
    Same arguments and scopes as :func:`patch_conv2d`."""
    check_torch_version()
    if model is None:
        if filter is not None:
            from tracea.errors import InvalidArgumentError

            raise InvalidArgumentError("filter", filter, "no filter for a global patch (pass a model)")
        _patch_global("linear")
        return None
    _patch_model(model, "linear", filter, fuse_activations)
    return model


def unpatch_linear(model: Optional[nn.Module] = None) -> None:
    """Undo :func:`patch_linear` (same scopes as :func:`unpatch_conv2d`)."""
    if model is None:
        _unpatch_global("linear")
    _restore(_swapped_in(model, "linear"))
    _release_all(model)


# ------------------------------------------------------------------------------------------------
# Attention
# ------------------------------------------------------------------------------------------------

# model -> the instance ``forward`` it had before the patch (None: the class's)
_FORWARDS: "weakref.WeakKeyDictionary[nn.Module, Any]" = weakref.WeakKeyDictionary()
_is_compiling = torch.compiler.is_compiling
_SDPA_DEPTH = [0]  # patched-model forwards running (all threads): the function is swapped while > 0
_SDPA_SAVED: list[Any] = [None]


def _sdpa_enter() -> None:
    with _lock:
        if _SDPA_DEPTH[0] == 0:
            _SDPA_SAVED[0] = nn.functional.__dict__["scaled_dot_product_attention"]
            nn.functional.scaled_dot_product_attention = ops.scaled_dot_product_attention
        _SDPA_DEPTH[0] += 1


def _sdpa_exit() -> None:
    with _lock:
        _SDPA_DEPTH[0] -= 1
        if _SDPA_DEPTH[0] == 0:
            if "attention" not in _ORIGINALS:  # not patched globally meanwhile
                nn.functional.scaled_dot_product_attention = _SDPA_SAVED[0]
            _SDPA_SAVED[0] = None


class _ModelForward:
    """A model-scope patched model's ``forward``: the original, judged per call signature against the
    model unpatched (:mod:`tracea_torch.model_check`), with Tracea's SDPA in place while a patched call runs
    when attention is patched (``sdpa``); ``layers``: the model has swapped layers."""

    def __init__(self, original: Callable[..., Any], name: str) -> None:
        self.original = original
        self.__wrapped__ = original  # (inspect.signature and torch.export read the model's own forward)
        self.sdpa = self.layers = False
        self.check = model_check.ModelCheck(name)

    @property
    def __code__(self) -> Any:
        return self.original.__code__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _is_compiling():  # Dynamo traces no locks: a compiled model sees the global patch only
            return self.original(*args, **kwargs)
        return self.check(self._patched, args, kwargs)

    def _patched(self, *args: Any, **kwargs: Any) -> Any:
        if not self.sdpa or model_check.eager_route():
            return self.original(*args, **kwargs)
        _sdpa_enter()
        try:
            return self.original(*args, **kwargs)
        finally:
            _sdpa_exit()


def _forward_of(model: nn.Module) -> _ModelForward:
    """``model``'s :class:`_ModelForward`, installed on first use, or again around a ``forward`` someone
    assigned over it since (call under ``_lock``)."""
    wrapper = model.__dict__.get("forward")
    if isinstance(wrapper, _ModelForward):
        return wrapper
    _FORWARDS[model] = wrapper  # (None: the class's)
    wrapper = _ModelForward(model.forward, type(model).__name__)
    model.forward = wrapper  # type: ignore[method-assign]
    return wrapper


def _release(model: nn.Module) -> None:
    """Drop ``model``'s :class:`_ModelForward` once neither attention nor any of its layers is patched."""
    with _lock:
        wrapper = model.__dict__.get("forward")
        if model not in _FORWARDS or not isinstance(wrapper, _ModelForward):
            return
        if wrapper.layers and not any(_SWAPPED.get(m, ("",))[0] in _KINDS for m in model.modules()):
            wrapper.layers = False
        if wrapper.layers or wrapper.sdpa:
            return
        before = _FORWARDS.pop(model, None)
        if before is None:
            del model.__dict__["forward"]
        else:
            model.__dict__["forward"] = before


def patch_attention(model: Optional[nn.Module] = None) -> Optional[nn.Module]:
    """Run ``F.scaled_dot_product_attention`` (and so the attention layers that call it, e.g. Hugging
    Face models with ``attn_implementation="sdpa"``) on Tracea: the plan cache, the arbiter (Tracea vs
    PyTorch's SDPA, timed on each signature's first call), PyTorch's backward for autograd,
    ``torch.compile`` through the ``tracea::sdpa`` custom op; what no Tracea kernel serves (dropout, a
    dtype, a mask kind) PyTorch computes, counted in :mod:`tracea_torch.fallbacks`.

    :param model: wrap this model's ``forward`` so SDPA runs on Tracea while it runs (returned for
        chaining); None replaces ``torch.nn.functional.scaled_dot_product_attention`` globally.
    """
    check_torch_version()
    if model is None:
        _patch_global("attention")
        return None
    if not isinstance(model, nn.Module):
        from tracea.errors import InvalidArgumentError

        raise InvalidArgumentError("model", type(model).__name__, "a torch.nn.Module")
    with _lock:
        _forward_of(model).sdpa = True
    return model


def unpatch_attention(model: Optional[nn.Module] = None) -> None:
    """Undo :func:`patch_attention`: for ``model`` only its wrapper; with no model, the global patch and
    every model patch still alive. Calling it when nothing is patched does nothing."""
    with _lock:
        if model is None:
            if "attention" in _ORIGINALS:
                original = _ORIGINALS.pop("attention")
                if _SDPA_DEPTH[0]:
                    _SDPA_SAVED[0] = original  # a patched model's forward is running: it restores this
                else:
                    nn.functional.scaled_dot_product_attention = original
            models = list(_FORWARDS.keys())
        else:
            models = [model] if model in _FORWARDS else []
        for m in models:
            wrapper = m.__dict__.get("forward")
            if isinstance(wrapper, _ModelForward):
                wrapper.sdpa = False
            _release(m)


@contextlib.contextmanager
def patched(model: Optional[nn.Module] = None, *, conv2d: bool = True, linear: bool = True,
            filter: Optional[ModuleFilter] = None, fuse_activations: "bool | str" = True,
            attention: bool = False, fold_batchnorm: bool = True) -> Iterator[Optional[nn.Module]]:
    """Context manager: patch on entry, undo on exit exactly what this block patched (patches made
    before it stay). ``attention=True`` also patches SDPA (see :func:`patch_attention`);
    ``fold_batchnorm``: as in :func:`patch_conv2d`."""
    check_torch_version()
    sdpa_done = False
    if attention:
        if model is None:
            sdpa_done = _patch_global("attention")
        elif not is_patched("attention", model):
            patch_attention(model)
            sdpa_done = True
    kinds = [k for k, on in (("conv2d", conv2d), ("linear", linear)) if on]
    done_global: list[str] = []
    swapped: list[nn.Module] = []
    try:
        for kind in kinds:
            if model is None:
                if _patch_global(kind):
                    done_global.append(kind)
            else:
                swapped += _patch_model(model, kind, filter, fuse_activations, fold_batchnorm)
        yield model
    finally:
        for kind in done_global:
            _unpatch_global(kind)
        _restore(swapped)
        if model is not None:
            _release(model)
        if sdpa_done:
            if model is None:
                with _lock:
                    if "attention" in _ORIGINALS:
                        original = _ORIGINALS.pop("attention")
                        if _SDPA_DEPTH[0]:
                            _SDPA_SAVED[0] = original
                        else:
                            nn.functional.scaled_dot_product_attention = original
            else:
                unpatch_attention(model)


__all__ = ["FusedActivation", "ModuleFilter", "is_patched", "patch_attention", "patch_conv2d", "patch_linear",
           "patched", "unpatch_attention", "unpatch_conv2d", "unpatch_linear"]
