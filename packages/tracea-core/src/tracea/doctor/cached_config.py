"""Which tuning-cache entries may run: the rule every consumer of cached configs applies.

A cache file is data from outside the process (another Tracea version, another user, a damaged or
hand-edited file), and a config reaches compiled kernels as loop bounds, thread counts and buffer
sizes. So a cached config is used only when

1. it is one of the variant's hero configs for the op and profile, or a point of the variant's
   search space (:meth:`SearchSpace.contains`: every value one of the candidates, of the same type,
   no extra parameters, the constraints hold) -- exactly what the tuner could have produced;
2. ``variant.validate_config(op, config, profile)`` accepts it;
3. its measured ``median_s`` is a finite, non-negative number.

Otherwise the entry is ignored (never run), :func:`warn_ignored` says so once per entry and process
(:class:`~tracea.tuning.cache_file.TuningCacheWarning`), and ``tracea cache ls`` shows it as
``invalid``. The rule is backend-independent; backends still validate what they run.
"""

from __future__ import annotations

import math
import threading
import warnings
from typing import Any, Callable, Iterable

from ..ir.ops import Op
from ..semantic.config import PipelineConfig
from ..semantic.search_space import SearchSpace
from .profile import DeviceProfile

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def config_problem(variant: Any, op: Op, profile: DeviceProfile, config: Any, *,
                   space: SearchSpace | Callable[[], SearchSpace],
                   heroes: Iterable[PipelineConfig] | Callable[[], Iterable[PipelineConfig]]) -> str | None:
    """Why ``config`` (from a cache entry) must not run ``op`` with ``variant``, or None when it may.

    ``space`` and ``heroes`` are the variant's search space and hero configs for ``op`` and
    ``profile`` (or callables producing them, called only when needed). Never raises: a failing
    hook or ``validate_config`` is a reason."""
    if not isinstance(config, PipelineConfig):
        return f"config {config!r} is not a PipelineConfig"
    try:
        hero_list = list(heroes() if callable(heroes) else heroes)
        if not any(h == config and h.key == config.key for h in hero_list if isinstance(h, PipelineConfig)):
            the_space = space() if callable(space) else space
            if not the_space.contains(config):
                return (f"config {config.key} is neither a hero config nor a point of "
                        f"{getattr(variant, 'name', variant)}'s search space for this op")
        valid = variant.validate_config(op, config, profile)
    except Exception as exc:  # noqa: BLE001 - a broken hook or validator rejects, never crashes
        return f"checking config {config.key} raised {type(exc).__name__}: {exc}"
    if not valid:
        return f"config {config.key} is invalid: {getattr(valid, 'reason', '') or 'rejected by validate_config'}"
    return None


def entry_problem(entry: Any, variant: Any, op: Op, profile: DeviceProfile, *,
                  space: SearchSpace | Callable[[], SearchSpace],
                  heroes: Iterable[PipelineConfig] | Callable[[], Iterable[PipelineConfig]]) -> str | None:
    """:func:`config_problem` of the entry's config, plus its measured time (finite, non-negative)."""
    median = getattr(entry, "median_s", None)
    if isinstance(median, bool) or not isinstance(median, (int, float)) or not math.isfinite(median) or median < 0:
        return f"median_s={median!r} is not a finite non-negative time"
    return config_problem(variant, op, profile, getattr(entry, "config", None), space=space, heroes=heroes)


def doctor_entry_problem(doctor: Any, entry: Any, variant: Any, op: Op, profile: DeviceProfile) -> str | None:
    """:func:`entry_problem` with the space and heroes from ``doctor``'s plugin hooks."""
    return entry_problem(entry, variant, op, profile,
                         space=lambda: doctor.search_space(variant, op, profile),
                         heroes=lambda: doctor.hero_configs(variant, op, profile))


def warn_ignored(entry: Any, why: str) -> None:
    """Warn, once per (entry, reason) and process, that a cache entry is ignored and why."""
    key = (str(getattr(entry, "key", entry)), why)
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    from ..tuning.cache_file import TuningCacheWarning

    warnings.warn(f"ignoring tuning-cache entry {key[0][:160]}: {why}", TuningCacheWarning, stacklevel=3)
