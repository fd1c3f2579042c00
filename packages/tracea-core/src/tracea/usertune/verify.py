"""Checking a user kernel's output against ``answer`` (Kernel Tuner's default check) or ``verify``.

``answer`` is a list as long as ``arguments``; ``None`` entries are not checked. Each other entry must
be an array of the argument's size and a dtype the argument casts to (or a NumPy scalar of its dtype),
checked with ``allclose(expected, result, atol=atol)`` (rtol 1e-5, NumPy's default), NaNs in the
answer matching NaNs in the output. ``verify(answer, result_host, atol=atol)`` replaces the check.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..errors import DTypeError, InvalidArgumentError, ShapeError, VerificationError


def _host(a: Any) -> Any:
    if a is None or isinstance(a, (np.ndarray, np.generic)):
        return a
    if hasattr(a, "get") and hasattr(a, "dtype"):  # CuPy
        return a.get()
    if hasattr(a, "detach") and hasattr(a, "cpu"):  # torch
        return a.detach().cpu().numpy()
    return a


def check_answer(answer: Any, arguments: Sequence[Any]) -> list[Any] | None:
    """Validate ``answer`` against the arguments once, before anything runs; host copies."""
    if answer is None:
        return None
    if not isinstance(answer, (list, tuple)):
        raise InvalidArgumentError("answer", answer, "a list with one entry (or None) per kernel argument")
    if len(answer) != len(arguments):
        raise InvalidArgumentError("answer", f"{len(answer)} entries", f"{len(arguments)} entries, one per argument")
    out: list[Any] = []
    for i, (exp, arg) in enumerate(zip(answer, arguments)):
        exp, arg = _host(exp), _host(arg)
        if exp is None:
            out.append(None)
            continue
        if isinstance(exp, np.ndarray) and isinstance(arg, np.ndarray):
            if not np.can_cast(arg.dtype, exp.dtype):
                raise DTypeError(f"answer[{i}]", exp, f"a dtype argument {i} ({arg.dtype}) casts to")
            if exp.size != arg.size:
                raise ShapeError(f"answer[{i}]", exp, f"{arg.size} elements like argument {i}")
        elif isinstance(exp, np.generic) and isinstance(arg, np.generic):
            if exp.dtype != arg.dtype:
                raise DTypeError(f"answer[{i}]", exp, f"a {arg.dtype} scalar like argument {i}")
        else:
            raise InvalidArgumentError(f"answer[{i}]", exp, f"None or the same kind of value as argument {i} "
                                                           f"({type(arg).__name__})")
        out.append(exp)
    return out


def compare(answer: list[Any] | None, results: list[Any], atol: float, verify: Callable[..., Any] | None,
            instance: str) -> None:
    """Raise :class:`VerificationError` when the output fails the check."""
    if verify is not None:
        try:
            ok = verify(answer, results, atol=atol)
        except TypeError:
            ok = verify(answer, results)
        if not ok:
            raise VerificationError(f"kernel output failed the verify function for {instance}")
        return
    if answer is None:
        return
    for i, exp in enumerate(answer):
        if exp is None:
            continue
        got = np.asarray(results[i]).ravel()
        want = np.asarray(exp).ravel()
        nan = bool(np.isnan(want).any()) if want.dtype.kind in "fc" else False
        if not np.allclose(want, got, atol=atol, equal_nan=nan):
            with np.errstate(invalid="ignore"):
                diff = np.abs(want.astype(np.float64) - got.astype(np.float64))
            bad = int((~np.isclose(want, got, atol=atol, equal_nan=nan)).sum())
            worst = float(np.nanmax(diff)) if diff.size and not np.isnan(diff).all() else float("nan")
            raise VerificationError(f"kernel result verification failed for {instance}: argument {i} has {bad} of "
                                    f"{want.size} elements outside atol={atol:g} (largest difference {worst:.3g})")
