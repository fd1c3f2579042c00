"""Recording the conv2d/linear calls a model makes (what :func:`tracea_torch.tune` collects).

While :func:`recording` is active, every call through :mod:`tracea_torch.bridge` appends a :class:`Call`
with its op description, whether it fell back (and why), its arguments and the layer it came from
(``layers`` is a stack the caller's module hooks push names on).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator


@dataclass
class Call:
    """One recorded call."""

    kind: str  # "conv2d" or "linear"
    op: Any  # the Tracea op, or None when the arguments could not even be described
    fallback: str | None  # the reason PyTorch computed it, or None when a Tracea variant ran
    args: tuple  # the positional arguments of bridge.conv2d / bridge.linear
    layer: str | None = None


_recorder: list[Call] | None = None
#: names of the layers being run, innermost last (pushed by the collector's forward hooks).
layers: list[str] = []


@contextlib.contextmanager
def recording() -> Iterator[list[Call]]:
    """Collect every conv2d/linear call made in the block (one recorder at a time, not thread-safe)."""
    global _recorder
    previous, _recorder = _recorder, []
    try:
        yield _recorder
    finally:
        _recorder = previous


def note(kind: str, op: Any, reason: str | None, args: tuple) -> None:
    """Record a call if a recorder is active (cheap no-op otherwise)."""
    if _recorder is not None:
        _recorder.append(Call(kind, op, reason, args, layers[-1] if layers else None))
