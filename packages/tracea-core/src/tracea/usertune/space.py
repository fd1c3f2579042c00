"""Kernel Tuner's ``tune_params`` and ``restrictions`` as a Tracea :class:`SearchSpace`.

Each tunable parameter becomes a dimension with its values in the user's order. A config travels as
a :class:`~tracea.semantic.config.PipelineConfig` whose params are the tunable parameters (names that
clash with the config's own fields, such as ``warps`` or ``stages``, are stored with a ``kt_`` prefix
and renamed back). Restrictions (strings evaluated with the parameters as names, or callables taking
the parameter dict) and the device's thread-block limit become the space's constraints.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Mapping, Sequence

from ..errors import InvalidArgumentError
from ..semantic.config import _CORE_FIELDS, PipelineConfig
from ..semantic.search_space import SearchSpace

FORBIDDEN = ("grid_size_x", "grid_size_y", "grid_size_z", "time")
PREFIX = "kt_"
DEFAULT_BLOCK_NAMES = ("block_size_x", "block_size_y", "block_size_z")


def _plain(name: str, value: Any) -> Any:
    """A tunable value as a plain Python int/float/str/bool (NumPy scalars converted)."""
    if isinstance(value, (bool, str)):
        return value
    if hasattr(value, "item") and not hasattr(value, "__len__"):
        value = value.item()  # NumPy scalar
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        if not math.isfinite(float(value)):
            raise InvalidArgumentError(f"tune_params[{name!r}]", value, "finite values")
        return float(value)
    if isinstance(value, (bool, str)):
        return value
    raise InvalidArgumentError(f"tune_params[{name!r}]", value, "ints, floats, strings or bools")


def check_tune_params(tune_params: Any) -> dict[str, tuple[Any, ...]]:
    """Validate ``tune_params`` (a dict of name -> non-empty list of values); ordered, plain values."""
    if not isinstance(tune_params, Mapping) or not tune_params:
        raise InvalidArgumentError("tune_params", tune_params, "a non-empty dict of parameter name -> list of values")
    out: dict[str, tuple[Any, ...]] = {}
    for name, values in tune_params.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidArgumentError("tune_params", name, "identifier names (they become C preprocessor macros)")
        if name in FORBIDDEN:
            raise InvalidArgumentError("tune_params", name, f"a name other than {', '.join(FORBIDDEN)} (reserved)")
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise InvalidArgumentError(f"tune_params[{name!r}]", values, "a list of candidate values")
        vals = tuple(_plain(name, v) for v in values)
        if not vals:
            raise InvalidArgumentError(f"tune_params[{name!r}]", list(values), "at least one value")
        if len(set(map(repr, vals))) != len(vals):
            raise InvalidArgumentError(f"tune_params[{name!r}]", list(values), "distinct values")
        out[name] = vals
    return out


def stored_name(name: str) -> str:
    return PREFIX + name if name in _CORE_FIELDS or name.startswith(PREFIX) else name


def to_config(params: Mapping[str, Any]) -> PipelineConfig:
    """The :class:`PipelineConfig` holding one assignment of the tunable parameters."""
    return PipelineConfig(params=tuple((stored_name(k), v) for k, v in params.items()))


def from_config(config: PipelineConfig, names: Sequence[str]) -> dict[str, Any]:
    """The parameter dict (in ``names`` order) a config holds."""
    return {n: config.get(stored_name(n)) for n in names}


def compile_restrictions(restrictions: Any, names: Sequence[str]) -> list[Callable[[dict[str, Any]], bool]]:
    """Kernel Tuner restrictions as predicates over the parameter dict.

    Accepts None, one callable (``f(params) -> bool``), or a list of strings (Python expressions over
    the parameter names, e.g. ``"block_size_x*block_size_y<=1024"``) and callables.
    """
    if restrictions is None:
        return []
    items = [restrictions] if callable(restrictions) or isinstance(restrictions, str) else restrictions
    if not isinstance(items, (list, tuple)):
        raise InvalidArgumentError("restrictions", restrictions,
                                   "a list of strings / callables, or one callable taking the parameter dict")
    preds: list[Callable[[dict[str, Any]], bool]] = []
    for i, r in enumerate(items):
        if callable(r):
            preds.append(_guard_callable(r, i))
        elif isinstance(r, str):
            preds.append(_compile_expression(r, i, names))
        else:
            raise InvalidArgumentError(f"restrictions[{i}]", r,
                                       "a string expression over the tunable parameters or a callable")
    return preds


def _compile_expression(text: str, index: int, names: Sequence[str]) -> Callable[[dict[str, Any]], bool]:
    try:
        code = compile(text.strip(), f"<restriction {index}>", "eval")
    except SyntaxError as exc:
        raise InvalidArgumentError(f"restrictions[{index}]", text, f"a valid Python expression ({exc.msg})") from None
    unknown = [n for n in code.co_names if n not in names and n not in _SAFE_NAMES]
    if unknown:
        raise InvalidArgumentError(f"restrictions[{index}]", text,
                                   f"an expression over the tunable parameters; unknown name(s) {', '.join(unknown)} "
                                   f"(parameters: {', '.join(names)})")

    def pred(params: dict[str, Any]) -> bool:
        try:
            return bool(eval(code, {"__builtins__": _SAFE_BUILTINS}, dict(params)))  # noqa: S307 - user's own expression
        except ZeroDivisionError:
            return False  # as in Kernel Tuner: a restriction dividing by zero rejects the config

    pred.__name__ = f"restriction {text.strip()!r}"
    return pred


def _guard_callable(fn: Callable[..., Any], index: int) -> Callable[[dict[str, Any]], bool]:
    def pred(params: dict[str, Any]) -> bool:
        try:
            return bool(fn(dict(params)))
        except ZeroDivisionError:
            return False
        except Exception as exc:  # noqa: BLE001 - a crashing restriction is the user's bug: say which
            raise InvalidArgumentError(f"restrictions[{index}]", fn,
                                       f"a callable that accepts the parameter dict ({type(exc).__name__}: {exc})") from exc

    pred.__name__ = f"restriction {getattr(fn, '__name__', index)}"
    return pred


_SAFE_BUILTINS = {n: __builtins__[n] if isinstance(__builtins__, dict) else getattr(__builtins__, n)
                  for n in ("abs", "min", "max", "int", "float", "round", "len", "all", "any", "sum", "bool", "pow")}
_SAFE_NAMES = set(_SAFE_BUILTINS) | {"True", "False", "None"}


def block_dims(params: Mapping[str, Any], block_size_names: Sequence[str]) -> tuple[int, int, int]:
    """Thread-block dimensions: the values of ``block_size_names`` (defaults 256, 1, 1 as in Kernel Tuner)."""
    names = list(block_size_names) + list(DEFAULT_BLOCK_NAMES[len(block_size_names):])
    defaults = (256, 1, 1)
    return tuple(int(params.get(names[i], defaults[i])) for i in range(3))  # type: ignore[return-value]


def build_space(params: dict[str, tuple[Any, ...]], preds: Sequence[Callable[[dict[str, Any]], bool]],
                block_size_names: Sequence[str], max_threads: int | None) -> SearchSpace:
    """The search space: one dimension per parameter, restrictions and the thread limit as constraints."""
    names = list(params)
    space = SearchSpace()
    for n in names:
        space = space.with_dim(stored_name(n), params[n])

    def legal(config: PipelineConfig) -> bool | str:
        p = from_config(config, names)
        for pred in preds:
            if not pred(p):
                return f"fails {pred.__name__}"
        if max_threads:
            x, y, z = block_dims(p, block_size_names)
            if x * y * z > max_threads:
                return f"{x * y * z} threads per block exceed the device's {max_threads}"
        return True

    return space.where(legal)
