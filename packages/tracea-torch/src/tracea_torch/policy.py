"""When tracea-torch hands a call to Tracea and when it lets PyTorch compute it.

The reference backend (NumPy, float64) accepts every host op but is a correctness oracle, orders of
magnitude slower than PyTorch's own CPU kernels. So by default, a torch call that only the reference
backend would serve is computed by PyTorch instead (recorded as a fallback with the reasons the real
variants gave). ``TRACEA_TORCH_REFERENCE=1`` or :func:`allow_reference` lets the reference run such
calls (tests use it to exercise dispatch end to end without a compiled CPU backend).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

ENV_REFERENCE = "TRACEA_TORCH_REFERENCE"
_lock = threading.Lock()
_override: list[bool] = []


def reference_allowed() -> bool:
    """Whether calls only the reference backend serves run there (else PyTorch computes them)."""
    with _lock:
        if _override:
            return _override[-1]
    return os.environ.get(ENV_REFERENCE, "").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def allow_reference(enabled: bool = True) -> Iterator[None]:
    """Within the block, let (or with False, forbid) the reference backend serve torch calls."""
    from tracea.runtime import plans

    with _lock:
        _override.append(bool(enabled))
    plans.invalidate("tracea_torch.policy.allow_reference")  # plans were built under the other policy
    try:
        yield
    finally:
        with _lock:
            _override.pop()
        plans.invalidate("tracea_torch.policy.allow_reference")
