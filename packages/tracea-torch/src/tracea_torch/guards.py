"""Signature checks for the memos of the hot paths (a patched layer's last call, the patched SDPA's).

A memo remembers the tensors a plan was chosen for and compares each new call's tensors with them. The
comparison is one C++ call when this torch has dynamo's ``TensorGuards`` (what ``torch.compile`` checks
its graphs' inputs with: Python type, dispatch keys, dtype, device, ``requires_grad``, sizes and
strides): ~0.35 us for three tensors instead of ~2 us of attribute reads and tuple compares on a
Sapphire Rapids core. The class is private to torch, so it is self-tested at import and the Python
comparison (:class:`PyGuard`) takes over when it is missing or behaves differently. ``TensorGuards``
never matches a call that passes one tensor twice (``sdpa(x, x, x)``): :func:`guard_of` builds a
:class:`PyGuard` for such calls.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn


class PyGuard:
    """The tensors' signatures (Python type, shape, strides, dtype, device, ``requires_grad``) compared
    in Python: the stand-in for ``TensorGuards``."""

    __slots__ = ("sigs",)

    def __init__(self, *tensors: Tensor) -> None:
        self.sigs = tuple(_meta(t) for t in tensors)

    def check(self, *tensors: Tensor) -> bool:
        """Whether ``tensors`` have the signatures this guard was built on."""
        return len(tensors) == len(self.sigs) and all(_meta(t) == s for t, s in zip(tensors, self.sigs))


def _meta(t: Any) -> Any:
    if not isinstance(t, Tensor):
        return None, type(t)
    return type(t), t.shape, t.stride(), t.dtype, t.get_device(), t.requires_grad


def torch_guard() -> Optional[Callable[..., Any]]:
    """dynamo's ``TensorGuards`` when it exists and compares what a memo needs (checked on samples)."""
    try:
        from torch._C._dynamo.guards import TensorGuards
    except Exception:  # noqa: BLE001 - a private class: any failure means "not usable"
        return None

    def build(*tensors: Tensor) -> Any:
        return TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)

    try:
        a, b = torch.zeros(2, 3), torch.zeros(3)
        g = build(a, b)
        ok = (g.check(a, b) and g.check(torch.ones(2, 3), torch.ones(3))
              and not g.check(torch.zeros(3, 3), b) and not g.check(a.t().contiguous().t(), b)
              and not g.check(a.double(), b) and not g.check(a.requires_grad_(True), b)
              and not g.check(nn.Parameter(torch.zeros(2, 3)), b) and not g.check(None, b))
        a.requires_grad_(False)
    except Exception:  # noqa: BLE001
        return None
    return build if ok else None


_torch_build = torch_guard()


def guard_of(*tensors: Tensor) -> Any:
    """A guard (``.check(*tensors) -> bool``) of these tensors' signatures: ``TensorGuards`` when this
    torch has a usable one and no tensor is passed twice, else a :class:`PyGuard`."""
    if _torch_build is None or len({id(t) for t in tensors}) < len(tensors):
        return PyGuard(*tensors)
    return _torch_build(*tensors)


#: what a memo's tensor comparison sees for a missing optional tensor (a bias, a mask): an empty float32
#: vector, which no tensor a kernel could serve matches (not another argument again: ``TensorGuards``
#: rejects a tensor passed twice).
NO_TENSOR = torch.empty(0)

__all__ = ["NO_TENSOR", "PyGuard", "guard_of", "torch_guard"]
