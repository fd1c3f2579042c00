"""The seed's ``Shape``: GEMM-style problem dimensions shared by every problem descriptor."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ShapeError


@dataclass(frozen=True)
class Shape:
    """Problem dimensions ``m x n x k`` with a ``batch`` count (all positive integers)."""

    m: int
    n: int
    k: int
    batch: int = 1

    def __post_init__(self) -> None:
        for name in ("m", "n", "k", "batch"):
            check_positive(name, getattr(self, name))


def check_positive(arg: str, value: object) -> int:
    """Return ``value`` when it is a positive int (bools excluded), else raise :class:`ShapeError`."""
    if isinstance(value, bool) or not isinstance(value, int) and not _is_int_like(value):
        raise ShapeError(arg, value, "a positive integer")
    if int(value) <= 0:  # type: ignore[call-overload]
        raise ShapeError(arg, value, "a positive integer")
    return int(value)  # type: ignore[call-overload]


def check_non_negative(arg: str, value: object) -> int:
    """Return ``value`` when it is an int >= 0, else raise :class:`ShapeError`."""
    if isinstance(value, bool) or not isinstance(value, int) and not _is_int_like(value):
        raise ShapeError(arg, value, "a non-negative integer")
    if int(value) < 0:  # type: ignore[call-overload]
        raise ShapeError(arg, value, "a non-negative integer")
    return int(value)  # type: ignore[call-overload]


def _is_int_like(value: object) -> bool:
    try:
        import numpy as np

        return isinstance(value, np.integer)
    except ImportError:  # pragma: no cover
        return False
