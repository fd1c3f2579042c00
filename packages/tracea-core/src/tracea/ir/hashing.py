"""Remembered hashes for frozen dataclasses that key dispatch-time dictionaries.

Ops and configs are hashed on every call (the Doctor's decision memo, the prepared-kernel set); the
generated dataclass hash walks every field, enums included, which costs microseconds per call on the
host path of small layers. :func:`memo_hash` keeps each instance's hash after the first use; the memo
never travels through pickle or copy (string hashes differ between processes).
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")
_SLOT = "_memo_hash"


def memo_hash(cls: type[T]) -> type[T]:
    """Class decorator, applied after ``@dataclass(frozen=True)``: the same hash, computed once."""
    field_hash = cls.__hash__

    def __hash__(self: Any) -> int:
        h = self.__dict__.get(_SLOT)
        if h is None:
            h = field_hash(self)
            object.__setattr__(self, _SLOT, h)
        return h

    def __getstate__(self: Any) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop(_SLOT, None)
        return state

    cls.__hash__ = __hash__  # type: ignore[method-assign]
    cls.__getstate__ = __getstate__  # type: ignore[attr-defined]
    return cls
