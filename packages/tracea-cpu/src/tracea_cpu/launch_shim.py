"""The compiled launch shim: calls a kernel entry point on the arrays' data pointers in one C call.

A plan's CPU launch was a ctypes call (converting five arguments, ~2.5 us on a 2-core Zen 3 VM) after
reading each NumPy array's address from Python (~0.5-0.8 us each). The shim (:mod:`.emit.launch_shim`, a
small CPython extension built with the backend's C compiler and Python's own headers, cached on disk like
the kernels) reads NumPy data pointers itself and calls the entry point directly: ``tracea.ops.matmul``
on 16x16 arrays went from ~7.0 to ~4.6 us there (``benchmarks/user_path/bench_user_path.py --sections host``).

It is optional: without Python's headers (``Python.h``; e.g. a system Python without its ``-dev``
package), with no compiler, or with ``TRACEA_CPU_SHIM=0``, launchers call the entry points through
ctypes as before. :func:`status` says which (``tracea doctor`` shows it).
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Any, Callable

from tracea.errors import TraceaError

from .emit.launch_shim import MODULE, SOURCE
from .toolchain import build_with

_lock = threading.Lock()
_state: dict[str, Any] = {}  # "module" once built, "reason" once it failed or is off


def _switched_off() -> bool:
    """``TRACEA_CPU_SHIM`` set to 0 / off / no / false."""
    return os.environ.get("TRACEA_CPU_SHIM", "1").strip().lower() in ("0", "off", "no", "false")


def _includes() -> tuple[str, ...]:
    """``-I`` flags for Python's headers, or raise OSError naming what is missing."""
    paths = sysconfig.get_paths()
    dirs = [d for d in dict.fromkeys((paths.get("include"), paths.get("platinclude"))) if d]
    if not any(Path(d, "Python.h").is_file() for d in dirs):
        raise OSError(f"Python's headers are not installed (no Python.h in {', '.join(dirs) or 'any include dir'})")
    return tuple(f"-I{d}" for d in dirs)


def _abi_tag() -> str:
    """What the compiled module is bound to: the interpreter's ABI (part of the cache key)."""
    return f"{sys.implementation.cache_tag}{sysconfig.get_config_var('EXT_SUFFIX') or ''}"


def _load(path: Path) -> Any:
    loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
    spec = importlib.util.spec_from_file_location(MODULE, str(path), loader=loader)
    if spec is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    import numpy as np

    module.set_array_type(np.ndarray)
    return module


def module() -> Any | None:
    """The shim module (built on first use), or None when it is off or cannot be built (see :func:`status`)."""
    mod = _state.get("module")
    if mod is not None or "reason" in _state:
        return mod
    with _lock:
        if "module" in _state or "reason" in _state:
            return _state.get("module")
        if _switched_off():
            _state["reason"] = "off (TRACEA_CPU_SHIM=0)"
            return None
        if sys.implementation.name != "cpython":
            _state["reason"] = f"not available on {sys.implementation.name} (CPython only)"
            return None
        try:
            flags = _includes() + (f'-DTRACEA_ABI="{_abi_tag()}"',)
            _state["module"] = build_with(SOURCE, flags, "launch-shim", _load, openmp=False)
        except (TraceaError, OSError, ImportError) as exc:
            _state["reason"] = f"not built ({str(exc).splitlines()[0][:200]}); launches go through ctypes"
            return None
        return _state["module"]


def status() -> str:
    """``"in use"``, ``"built on first launch"`` or why launches go through ctypes; never compiles."""
    if "module" in _state:
        return "in use"
    if "reason" in _state:
        return str(_state["reason"])
    if _switched_off():
        return "off (TRACEA_CPU_SHIM=0)"
    try:
        _includes()
    except OSError as exc:
        return f"unavailable ({exc}); launches go through ctypes"
    return "built on first launch"


def entry_point(fn: Any) -> tuple[Callable[..., int], int] | None:
    """``(call5, entry)`` for the ctypes function ``fn`` (five pointer arguments, an int result):
    ``call5(entry, a0, ..., a4)`` runs it on NumPy arrays, addresses or None (a ``TypeError`` for other
    objects). None when the shim is unavailable or ``fn`` has another signature (call ``fn`` itself)."""
    args, res = getattr(fn, "argtypes", None), getattr(fn, "restype", None)
    if args is None or len(args) != 5 or any(a is not ctypes.c_void_p for a in args) or res is not ctypes.c_int:
        return None
    mod = module()
    if mod is None:
        return None
    entry = ctypes.cast(fn, ctypes.c_void_p).value
    return (mod.call5, entry) if entry else None


__all__ = ["entry_point", "module", "status"]
