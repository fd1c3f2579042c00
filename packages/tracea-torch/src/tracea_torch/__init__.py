"""tracea-torch: Tracea kernels for PyTorch models.

* :func:`patch_conv2d` / :func:`patch_linear` (+ ``unpatch_*``, :func:`patched`): run existing models'
  ``nn.Conv2d`` / ``nn.Linear`` layers on Tracea, globally or per model, reversibly.
* :class:`TraceaConv2d` / :class:`TraceaLinear`: drop-in module subclasses.
* :mod:`tracea_torch.ops`: ``conv2d`` / ``linear`` as ``torch.library`` custom ops (autograd,
  ``torch.compile(fullgraph=True)``).
* :func:`tune`: tune every conv/linear shape of a model as one graph and report per-layer speedups.
* :mod:`tracea_torch.fallbacks`: which calls PyTorch computed instead, and why.

Importing ``tracea_torch`` imports torch (a dependency of this package); ``tracea_torch.plugin`` does not.
"""

from ._version import __version__
from . import fallbacks, ops
from .compat import TORCH_MIN, TORCH_TESTED_MAX, check_torch_version
from .modules import TraceaConv2d, TraceaLinear
from .patching import (FusedActivation, is_patched, patch_conv2d, patch_linear, patched, unpatch_conv2d,
                       unpatch_linear)

__all__ = ["__version__", "TORCH_MIN", "TORCH_TESTED_MAX", "FusedActivation", "TraceaConv2d", "TraceaLinear",
           "check_torch_version", "fallbacks", "is_patched", "ops", "patch_conv2d", "patch_linear", "patched",
           "tune", "unpatch_conv2d", "unpatch_linear"]


def __getattr__(name: str):  # tune pulls in the tuner; load it on first use
    if name == "tune":
        from .tuning import tune

        return tune
    if name == "TuneReport":
        from .tuning import TuneReport

        return TuneReport
    raise AttributeError(f"module 'tracea_torch' has no attribute {name!r}")
