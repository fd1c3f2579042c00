"""The plan cache: the one hot path from a call to a kernel launch.

The first call with a given *signature* (op kind, every array's shape, strides, dtype and device, the
keyword arguments, the framework's float32 math mode) validates its arguments, asks the Doctor, compiles
and binds a launcher: together, a :class:`Plan`. Later calls with the same signature compute the
signature (a few attribute reads per array) and call the plan with the new arrays; nothing that depends
only on the signature is done twice. ``tracea.ops`` and ``tracea_torch`` both go through this cache.

Plans are dropped (:func:`invalidate`) when what they were decided from changes:

* the tuning cache (an entry written here, or another process's write seen through the file);
* the plugin set (:func:`tracea.plugins.manager.set_plugin_manager`), :meth:`Doctor.invalidate`,
  :func:`~tracea.doctor.doctor.reset_doctor`;
* an environment variable that steers choices (:data:`STEERING_ENV`), checked on every lookup;
* framework state that changes the op (torch's TF32 flags) is part of the signature itself.

Signatures come from :meth:`ArrayAdapter.signature`; an array kind without one is never cached (every
call takes the full path). Thread-safe: plans are immutable once stored and building one twice in a
race is harmless.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

from . import env_watch

#: Environment variables whose value changes what a call runs: any change drops every plan.
STEERING_ENV = ("TRACEA_VARIANT", "TRACEA_EXCLUDE_VARIANTS", "TRACEA_NUM_THREADS", "TRACEA_TORCH_REFERENCE",
                "TRACEA_CACHE_PATH", "TRACEA_CACHE_DIR", "TRACEA_TUNING", "TRACEA_ARBITER", "TRACEA_PERF_MODEL",
                "TRACEA_PERF_DATA")
#: Seconds between checks of the tuning-cache file (other processes' writes) and the working directory.
RECHECK_S = 0.5
MAX_PLANS = 8192

Plan = Callable[..., Any]

_plans: dict[Any, Plan] = {}
_lock = threading.Lock()
_stats = {"builds": 0, "invalidations": 0}
_generation = [0]  # bumped by every invalidation: a memo of a plan is valid while this is unchanged
_listeners: list[Callable[[], None]] = []

# Writes through os.environ are counted (env_watch): the steering variables are re-read only after one.
_WATCHED = env_watch.install()
_WRITES = env_watch.WRITES
# os.environ keeps its data in a bytes-keyed dict on POSIX; reading it directly costs ~20 ns a key
# instead of ~0.5 us through the Mapping interface (the interface is the fallback elsewhere).
_env_data = getattr(os.environ, "_data", None)
if _env_data is not None and os.name == "posix":
    _K0, _K1, _K2, _K3, _K4, _K5, _K6, _K7, _K8, _K9 = (k.encode() for k in STEERING_ENV)
    _g = _env_data.get
else:  # pragma: no cover - Windows
    _K0, _K1, _K2, _K3, _K4, _K5, _K6, _K7, _K8, _K9 = STEERING_ENV  # type: ignore[assignment]
    _g = os.environ.get


def _env_token() -> tuple[Any, ...]:
    # unrolled (a generator over the keys costs twice as much)
    return _g(_K0), _g(_K1), _g(_K2), _g(_K3), _g(_K4), _g(_K5), _g(_K6), _g(_K7), _g(_K8), _g(_K9)


_env_seen = _env_token()
_writes_seen = _WRITES[0]
_next_check = 0.0
_watch: tuple[Any, int] | None = None  # (tuning cache object, its generation) the plans were built under
_get = _plans.get
_monotonic = time.monotonic


def lookup(key: Any) -> Plan | None:
    """The plan stored for ``key``, or None. Checks the steering environment on every call and the
    tuning-cache file every :data:`RECHECK_S` seconds; either changing drops every plan first."""
    generation()  # the checks
    return _get(key)


def generation() -> int:
    """A number that changes whenever plans are dropped or replaced, after the checks :func:`lookup` relies
    on (the steering environment on every call -- re-read only after a write through ``os.environ``, see
    :mod:`tracea.runtime.env_watch` --, the tuning-cache file every :data:`RECHECK_S` seconds). A
    caller that memoises a plan outside this cache (a patched layer remembering its last call's plan)
    reuses it only while this number is unchanged."""
    global _next_check, _writes_seen
    if _WRITES[0] != _writes_seen or not _WATCHED:  # (an environment write since the last look)
        _writes_seen = _WRITES[0]
        if _env_token() != _env_seen:
            _env_changed()
    now = _monotonic()
    if now >= _next_check:
        _next_check = now + RECHECK_S
        _recheck()
    return _generation[0]


def latest() -> Plan | None:
    """The plan stored last, or None (for tools: a plan built by ``tracea.ops`` carries ``runner``, whose
    ``decision`` names the variant and config it runs, or whose ``reason`` says why the framework does)."""
    with _lock:
        return next(reversed(_plans.values()), None)


def store(key: Any, plan: Plan) -> Plan:
    """Remember ``plan`` for ``key`` (the cache is bounded: it is emptied when full); returns ``plan``."""
    with _lock:
        if len(_plans) >= MAX_PLANS:
            _plans.clear()
        elif key in _plans:  # a plan replaced (a kernel that failed gives way to PyTorch): memos of it go
            _generation[0] += 1
        _plans[key] = plan
        _stats["builds"] += 1
    return plan


def invalidate(reason: str = "") -> None:
    """Drop every plan (and tell the listeners, e.g. backends' launcher memos). Cheap; safe anytime."""
    with _lock:
        _plans.clear()
        _generation[0] += 1
        _forget_kinds()
        _stats["invalidations"] += 1
        _stats["last_reason"] = reason  # type: ignore[assignment]
    for fn in list(_listeners):
        fn()


def on_invalidate(fn: Callable[[], None]) -> None:
    """Call ``fn()`` whenever plans are invalidated (for state derived from decisions elsewhere)."""
    _listeners.append(fn)


def stats() -> dict[str, Any]:
    """Plans built, invalidations (and the last reason) and the number of stored plans."""
    return {**_stats, "plans": len(_plans)}


def _env_changed() -> None:
    global _env_seen
    _env_seen = _env_token()
    invalidate("environment changed")


# Who to ask (registered by the modules that own them, so this module imports none of them):
_cache_source: Callable[[], Any] | None = None  # the process tuning cache (tracea.tuning.cache)
_adapter_source: Callable[[], Any] | None = None  # the array adapters (the Doctor)


def watch_cache(source: Callable[[], Any]) -> None:
    """Register the function returning the process tuning cache, whose changes drop plans."""
    global _cache_source
    _cache_source = source


def adapters_from(source: Callable[[], Any]) -> None:
    """Register the function returning the array adapters, in descending priority."""
    global _adapter_source
    _adapter_source = source


def _recheck() -> None:
    """Notice a tuning cache that changed under us (another process's write, a new working directory
    or cache location): the Doctor's decisions and every plan depend on it."""
    global _watch
    if _cache_source is None:
        return
    try:
        cache = _cache_source()
        generation = cache.generation  # re-reads the file when its stat changed
    except Exception:  # noqa: BLE001 - an unreadable cache: nothing to watch
        return
    if _watch is None or _watch[0] is not cache:
        changed = _watch is not None
    else:
        changed = _watch[1] != generation
    _watch = (cache, generation)
    if changed:
        invalidate("tuning cache changed")


def cache_changed(cache: Any, decisive: bool = True) -> None:
    """Called by the tuning cache when its entries change in this process: drop plans at once, unless
    the change decides nothing (``decisive=False``); the new generation is noted either way."""
    global _watch
    if (_watch is not None and _watch[0] is cache) or decisive:
        # decisive: every plan is dropped now, so the plans built next are built under this cache; watching
        # it avoids dropping them once more when the periodic recheck first sees it (a plan built right
        # after a put could vanish on the next lookup)
        _watch = (cache, getattr(cache, "_generation", 0))
    if decisive:
        invalidate("tuning cache changed")


# ------------------------------------------------------------------------------------------------
# Signatures
# ------------------------------------------------------------------------------------------------

class Uncacheable(Exception):
    """Internal: an argument has no cheap signature; the call takes the full path."""


_SIGS: dict[type, Callable[[Any], Any]] = {type(None): lambda x: None}
_STATES: dict[type, Callable[[], Any]] = {}


def signature(obj: Any) -> Any:
    """The hashable signature of one argument (an array through its adapter's
    :meth:`~tracea.runtime.arrays.ArrayAdapter.signature`, or None). Raises :class:`Uncacheable` for
    objects with no cheap signature."""
    fn = _SIGS.get(type(obj))
    if fn is not None:
        return fn(obj)
    return _learn(obj)[0]


def state(obj: Any) -> Any:
    """The framework state that changes how arrays of ``obj``'s kind are computed (torch's float32
    matmul precision and cuDNN's TF32 flag), part of every key; call after :func:`signature` of the same object."""
    fn = _STATES.get(type(obj))
    return None if fn is None else fn()


def _learn(obj: Any) -> tuple[Any, Any]:
    for adapter in (_adapter_source() if _adapter_source is not None else ()):
        if adapter.owns(obj):
            probe = adapter.signature(obj)
            if probe is None:
                break
            _SIGS[type(obj)] = adapter.signature
            _STATES[type(obj)] = adapter.framework_state
            return probe, adapter
    raise Uncacheable(type(obj).__name__)


def _forget_kinds() -> None:
    """Adapters may have changed (plugins): learn array kinds again."""
    for kind in [k for k in _SIGS if k is not type(None)]:
        del _SIGS[kind]
    _STATES.clear()


__all__ = ["Plan", "STEERING_ENV", "Uncacheable", "generation", "invalidate", "latest", "lookup", "on_invalidate",
           "signature", "state", "stats", "store"]
