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

Importing ``tracea_torch`` imports torch (a dependency of this package); ``tracea_torch.plugin`` does not.
"""

from . import fallbacks, ops, policy, tuning
from ._version import __version__
from .compat import TORCH_MIN, TORCH_TESTED_MAX, check_torch_version
from .modules import TraceaConv2d, TraceaLinear
from .patching import (FusedActivation, is_patched, patch_attention, patch_conv2d, patch_linear, patched,
                       unpatch_attention, unpatch_conv2d, unpatch_linear)
from .policy import allow_reference
from .tuning import TuneReport, tune

__all__ = ["__version__", "TORCH_MIN", "TORCH_TESTED_MAX", "FusedActivation", "TraceaConv2d", "TraceaLinear",
           "TuneReport", "allow_reference", "check_torch_version", "fallbacks", "is_patched", "ops", "patch_attention",
           "patch_conv2d", "patch_linear", "patched", "policy", "tune", "tuning", "unpatch_attention", "unpatch_conv2d",
           "unpatch_linear"]
