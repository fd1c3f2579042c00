"""Fallback bookkeeping: which calls PyTorch computed instead of a Tracea variant, and why.

Core's dispatch records the fallbacks it makes in ``tracea.runtime.fallbacks`` (shown by
``tracea doctor``); tracea-torch records the ones it decides itself (for example an input layout no
variant can read) in the same place. When that core module is absent (older core), the counts are
kept here with the same interface, so :func:`counts` always answers.

Set ``TRACEA_WARN_FALLBACK=1`` to get one ``TraceaFallbackWarning`` per distinct (op, reason).
"""

from __future__ import annotations

import os
import threading
import warnings
from collections import Counter
from types import ModuleType

ENV_WARN = "TRACEA_WARN_FALLBACK"


class TraceaFallbackWarning(UserWarning):
    """Emitted once per (op, reason) when ``TRACEA_WARN_FALLBACK=1`` and a call fell back to PyTorch."""


_lock = threading.Lock()
_counts: Counter[tuple[str, str]] = Counter()
_warned: set[tuple[str, str]] = set()


def _core() -> ModuleType | None:
    try:
        from tracea.runtime import fallbacks  # type: ignore[attr-defined]
    except ImportError:
        return None
    return fallbacks


def record(kind: str, reason: str) -> None:
    """Count one fallback of op ``kind`` (``"conv2d"``, ``"gemm"``, ``"attention"``) for ``reason``."""
    core = _core()
    if core is not None:
        core.record(kind, reason)
        return
    key = (kind, reason)
    with _lock:
        _counts[key] += 1
        first = key not in _warned
        _warned.add(key)
    if first and os.environ.get(ENV_WARN, "").strip().lower() in ("1", "true", "yes", "on"):
        warnings.warn(f"tracea: {kind} fell back to PyTorch: {reason}", TraceaFallbackWarning, stacklevel=3)


def counts() -> dict[tuple[str, str], int]:
    """Fallbacks so far, keyed by ``(op kind, reason)``."""
    core = _core()
    if core is not None:
        return dict(core.counts())
    with _lock:
        return dict(_counts)


def reset() -> None:
    """Forget every count (and which reasons already warned)."""
    core = _core()
    if core is not None and hasattr(core, "reset"):
        core.reset()
    with _lock:
        _counts.clear()
        _warned.clear()


def total(kind: str | None = None, contains: str = "") -> int:
    """How many fallbacks of ``kind`` (any when None) whose reason contains ``contains``."""
    return sum(n for (k, r), n in counts().items() if (kind is None or k == kind) and contains in r)
