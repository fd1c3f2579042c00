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
#: per-reason counting cells (:func:`counter`), added into :func:`counts`
_cells: dict[tuple[str, str], list[int]] = {}


def record(kind: str, reason: str) -> None:
    """Count one fallback of an op of ``kind`` (``"conv2d"``) for ``reason``."""
    key = (kind, reason)
    with _lock:
        _counts[key] += 1
        first = key not in _warned
        _warned.add(key)
    if first and os.environ.get("TRACEA_WARN_FALLBACK", "").lower() in ("1", "true", "yes", "on"):
        warnings.warn(f"tracea: {kind} fell back to the framework: {reason}", FallbackWarning, stacklevel=3)


def counter(kind: str, reason: str) -> list[int]:
    """A one-element list counting further fallbacks of (``kind``, ``reason``): a caller on a hot path
    increments ``cell[0]`` itself instead of calling :func:`record` (no call, no lock: an increment racing
    another thread's may be lost, which only a diagnostic counter can afford). :func:`counts` adds the
    cells in; the warn-once is :func:`record`'s, so count a reason's first call there."""
    key = (kind, reason)
    with _lock:
        cell = _cells.get(key)
        if cell is None:
            cell = _cells[key] = [0]
        return cell


def counts() -> dict[tuple[str, str], int]:
    """A snapshot of the counters."""
    with _lock:
        out = Counter(_counts)
        for key, cell in _cells.items():
            if cell[0]:
                out[key] += cell[0]
        return dict(out)


def reset() -> None:
    """Clear the counters (and the warn-once memory)."""
    with _lock:
        _counts.clear()
        _warned.clear()
        for cell in _cells.values():  # (held by callers: zeroed in place)
            cell[0] = 0
