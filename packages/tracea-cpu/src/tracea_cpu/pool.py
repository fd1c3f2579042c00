"""Tracea's CPU worker pool: one per process, shared by every blocked library (see :mod:`.emit.pool` for
why an OpenMP region's closing barrier was the wrong end for a counter-driven driver).

The pool is a small shared library built once (disk-cached like the kernels); each blocked library is
told its entry point (``tr_set_pool``) when it loads, and told again (or told to drop it) when
``TRACEA_CPU_POOL`` changes (:func:`sync`, run whenever a new CPU GEMM plan or library is made).

When: only with ``TRACEA_CPU_POOL=1`` (on / yes / true); off by default, because it measured no
consistent win in a process that also runs OpenMP regions. 16-core Xeon (the GPU machine's host), fp32
1024^3, 16 threads, ``benchmarks/cpu/probes/region_start.py``, median ms over 12 calls, three rounds, pool
against the OpenMP region it replaces:

* libgomp's default spin (torch installed: Tracea leaves the runtime alone, see ``omp_env``): a torch
  512^2 matmul before each call 4.6-7.6 against 2.0-2.2 (torch's workers spin on every core; the OpenMP
  region reuses them, the pool's threads compete with them); one of Tracea's own OpenMP regions before
  each call 6.4-8.0 against 2.1; right after a NumPy matmul (OpenBLAS's workers spin ~0.1 s) 3.2-6.9
  against 5.7-11.9; quiet 2.0-2.3 both.
* ``GOMP_SPINCOUNT=1000`` (Tracea's default when torch is not installed): torch / Tracea-OpenMP before
  each call 1.9-2.3 both; after NumPy 5.2-7.2 against 5.8-7.9; NumPy and torch before each call 7.3-8.4
  against 3.3-6.7.

So the late-worker wait it removes is real, but a second set of threads costs as much whenever another
runtime's workers spin; the next step is every Tracea driver on one runtime (docs/backends/cpu.md,
"Thread pools").
``TRACEA_CPU_POOL_SPIN_US`` sets how long idle workers spin after the latest job before sleeping
(default 100).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Any

from .emit.pool import POOL_SOURCE
from .toolchain import build

_lock = threading.Lock()
_state: dict[str, Any] = {}  # "lib" once built, "reason" once it cannot be (platform, build failure)
_clients: list[ctypes.CDLL] = []  # blocked libraries told about the pool (they live as long as the process)
_applied: list[int | None] = []  # the address last given to them (empty: none given yet)
#: why this platform has no pool (None: Linux)
_PLATFORM = None if sys.platform.startswith("linux") else f"not on {sys.platform} (the pool sleeps on a Linux futex)"


def mode() -> str:
    """``TRACEA_CPU_POOL`` read now: "on" (1 / on / yes / true) or "off" (anything else; the default)."""
    return "on" if os.environ.get("TRACEA_CPU_POOL", "").strip().lower() in ("1", "on", "yes", "true") else "off"


def _why_not() -> str | None:
    """Why the pool is not to be used now (None: it is)."""
    return "off (TRACEA_CPU_POOL=1 turns it on)" if mode() == "off" else _PLATFORM


def _spin_ns() -> int:
    """``TRACEA_CPU_POOL_SPIN_US`` in nanoseconds (default 100 us; bad values keep the default)."""
    raw = os.environ.get("TRACEA_CPU_POOL_SPIN_US", "").strip()
    try:
        us = float(raw) if raw else 100.0
    except ValueError:
        us = 100.0
    return int(max(0.0, min(us, 1e6)) * 1000) if us == us else 100_000


def library() -> ctypes.CDLL | None:
    """The pool library (built on first use), or None when this platform has none or it failed to build.
    (Whether the drivers use it is :func:`sync`'s business.)"""
    with _lock:
        if "lib" in _state or "reason" in _state:
            return _state.get("lib")
        if _PLATFORM is not None:
            _state["reason"] = _PLATFORM
            return None
        try:
            lib = build(POOL_SOURCE, ("-pthread",), "pool")
        except Exception as exc:  # noqa: BLE001 - a missing pool is a documented fallback, not an error
            _state["reason"] = f"not built: {exc}"
            return None
        lib.tr_pool_set_spin.argtypes = [ctypes.c_long]
        lib.tr_pool_set_spin.restype = None
        lib.tr_pool_workers.restype = ctypes.c_int
        lib.tr_pool_set_spin(_spin_ns())
        _state["lib"] = lib
        return lib


def entry_point() -> int | None:
    """Address of ``tr_pool_run`` (what ``tr_set_pool`` takes) when the pool is to be used now, else None."""
    if _why_not() is not None:
        return None
    lib = library()
    return None if lib is None else ctypes.cast(lib.tr_pool_run, ctypes.c_void_p).value


def attach(lib: ctypes.CDLL) -> None:
    """Register a blocked library and point its counter-driven drivers at the pool, or at nothing (their
    OpenMP regions) when it is not to be used now."""
    lib.tr_set_pool.argtypes = [ctypes.c_void_p]
    lib.tr_set_pool.restype = None
    with _lock:
        if all(c is not lib for c in _clients):
            _clients.append(lib)
    sync()  # (the others too, if the answer changed since they were told)
    lib.tr_set_pool(_applied[0])


def sync() -> None:
    """Tell every registered library again when ``TRACEA_CPU_POOL`` changed; cheap when it did not."""
    address = entry_point()
    if _applied and _applied[0] == address:
        return
    with _lock:
        clients = list(_clients)
        _applied[:] = [address]
    for lib in clients:
        lib.tr_set_pool(address)


def status() -> str:
    """One line for ``tracea doctor``: whether the drivers use the pool, and why not."""
    reason = _why_not() or _state.get("reason")
    if reason is not None:
        return str(reason)
    lib = _state.get("lib")
    started = f"{lib.tr_pool_workers()} workers started" if lib is not None else "not built yet"
    return f"on ({started}, spin {_spin_ns() // 1000} us)"
