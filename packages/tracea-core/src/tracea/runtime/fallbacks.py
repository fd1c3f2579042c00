"""Counters of calls that Tracea did not run itself (computed by a framework integration, e.g. PyTorch),
by op kind and reason. ``tracea doctor`` shows them; ``TRACEA_WARN_FALLBACK=1`` warns once per reason."""

from __future__ import annotations

import os
import threading
import warnings
from collections import Counter

from ..errors import FallbackWarning

_lock = threading.Lock()
_counts: Counter[tuple[str, str]] = Counter()
_warned: set[tuple[str, str]] = set()


def record(kind: str, reason: str) -> None:
    """Count one fallback of an op of ``kind`` (``"conv2d"``) for ``reason``."""
    key = (kind, reason)
    with _lock:
        _counts[key] += 1
        first = key not in _warned
        _warned.add(key)
    if first and os.environ.get("TRACEA_WARN_FALLBACK", "").lower() in ("1", "true", "yes", "on"):
        warnings.warn(f"tracea: {kind} fell back to the framework: {reason}", FallbackWarning, stacklevel=3)


def counts() -> dict[tuple[str, str], int]:
    """A snapshot of the counters."""
    with _lock:
        return dict(_counts)


def reset() -> None:
    """Clear the counters (and the warn-once memory)."""
    with _lock:
        _counts.clear()
        _warned.clear()
