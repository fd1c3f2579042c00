"""tracea-torch: Tracea kernels for PyTorch models.

* :func:`patch_conv2d` / :func:`patch_linear` (+ ``unpatch_*``, :func:`patched`): run existing models'
  ``nn.Conv2d`` / ``nn.Linear`` layers on Tracea, globally or per model, reversibly.
* :func:`patch_attention` (+ ``unpatch_attention``): run ``F.scaled_dot_product_attention`` (so the
  attention layers that call it) on Tracea, globally or per model, reversibly.
* :class:`TraceaConv2d` / :class:`TraceaLinear`: drop-in module subclasses.
* :mod:`tracea_torch.ops`: ``conv2d`` / ``linear`` as ``torch.library`` custom ops (autograd,
  ``torch.compile(fullgraph=True)``).
* :func:`tune`: tune every conv/linear shape of a model as one graph and report per-layer speedups.
* :mod:`tracea_torch.fallbacks`: which calls PyTorch computed instead, and why;
  :mod:`tracea_torch.policy`: whether the reference oracle may serve torch calls.

Importing ``tracea_torch`` imports torch only when torch is already imported; otherwise the names above
load (and import torch) on first use. Tracea's plugin loader imports this package for
``tracea_torch.plugin``, so a NumPy program calling ``tracea.ops`` with tracea-torch installed does not
pay for importing torch (1-2 s and a few hundred MB) nor load its OpenMP runtime. ``import tracea_torch.ops``
registers the ``torch.library`` custom ops explicitly.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from . import fallbacks, ops, policy, tuning
    from .compat import TORCH_MIN, TORCH_TESTED_MAX, check_torch_version
    from .modules import TraceaConv2d, TraceaLinear
    from .patching import (FusedActivation, is_patched, patch_attention, patch_conv2d, patch_linear, patched,
                           unpatch_attention, unpatch_conv2d, unpatch_linear)
    from .policy import allow_reference
    from .tuning import TuneReport, tune

#: public name -> (submodule, attribute; None: the submodule itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    **{m: (m, None) for m in ("fallbacks", "ops", "policy", "tuning")},
    **{n: ("compat", n) for n in ("TORCH_MIN", "TORCH_TESTED_MAX", "check_torch_version")},
    **{n: ("modules", n) for n in ("TraceaConv2d", "TraceaLinear")},
    **{n: ("patching", n) for n in ("FusedActivation", "is_patched", "patch_attention", "patch_conv2d",
                                    "patch_linear", "patched", "unpatch_attention", "unpatch_conv2d",
                                    "unpatch_linear")},
    "allow_reference": ("policy", "allow_reference"),
    **{n: ("tuning", n) for n in ("TuneReport", "tune")},
}


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'tracea_torch' has no attribute {name!r}") from None
    mod = importlib.import_module(f".{module}", __name__)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if "torch" in sys.modules:  # torch is here anyway: load everything now (and register the custom ops)
    for _name in _LAZY:
        __getattr__(_name)

__all__ = ["__version__", "TORCH_MIN", "TORCH_TESTED_MAX", "FusedActivation", "TraceaConv2d", "TraceaLinear",
           "TuneReport", "allow_reference", "check_torch_version", "fallbacks", "is_patched", "ops", "patch_attention",
           "patch_conv2d", "patch_linear", "patched", "policy", "tune", "tuning", "unpatch_attention", "unpatch_conv2d",
           "unpatch_linear"]
