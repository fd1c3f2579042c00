"""Tracea plugin entry point for tracea-torch (entry-point group ``tracea``, name ``torch``).

Brings the torch array adapter (so ``tracea.ops`` accepts ``torch.Tensor``) and computes an op with
PyTorch when dispatch finds no Tracea variant for torch tensors. Importing this module never imports
torch; a missing torch makes the integration unavailable with the reason, never an import error.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from tracea.plugins import BackendInfo, hookimpl
from tracea.runtime.arrays import imported

from ._version import __version__


def _torch_version() -> str | None:
    torch = imported("torch")
    if torch is not None:
        return str(torch.__version__)
    if importlib.util.find_spec("torch") is None:
        return None
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # noqa: BLE001 - metadata missing for a source build of torch
        return "unknown"


@hookimpl
def tracea_backend_info() -> BackendInfo:
    torch_version = _torch_version()
    if torch_version is None:
        return BackendInfo(name="torch", version=__version__, package="tracea-torch", available=False,
                           reason="torch is not installed: pip install torch")
    from .compat import TORCH_MIN, parse_version

    if torch_version != "unknown" and parse_version(torch_version) < TORCH_MIN:
        return BackendInfo(name="torch", version=__version__, package="tracea-torch", available=False,
                           reason=f"torch {torch_version} is older than {TORCH_MIN[0]}.{TORCH_MIN[1]}")
    return BackendInfo(name="torch", version=__version__, package="tracea-torch", available=True,
                       details={"torch": torch_version,
                                "role": "accepts torch tensors; PyTorch computes calls no variant serves"})


@hookimpl
def tracea_array_adapters() -> list:
    from .adapter import TorchAdapter

    return [TorchAdapter()]


@hookimpl
def tracea_register_variants() -> list:
    return []


@hookimpl
def tracea_fallback_run(op: Any, arrays: dict, out: Any, reason: str) -> Any:
    """Compute ``op`` with PyTorch when every arrays is a torch tensor. ``arrays`` are the tensors as
    the user passed them (logically NCHW, untransposed); the result is a fresh tensor that dispatch
    returns or copies into the user's ``out`` (``out`` here may be a physical-layout kernel buffer,
    so it is not written)."""
    torch = imported("torch")
    if torch is None:
        return None
    tensors = [a for a in arrays.values() if a is not None]
    if not tensors or not all(isinstance(a, torch.Tensor) for a in tensors):
        return None
    from . import eager

    with torch.no_grad():
        return eager.run_logical(op, arrays)
