"""How long idle OpenMP workers spin: Tracea's default for the OpenMP runtime when Tracea loads it.

libgomp's workers spin-wait ~300k PAUSE instructions at every barrier and after every parallel region
before sleeping (a PAUSE takes ~140 cycles on Intel server cores since Skylake: ~16 ms). When another
thread or process needs the core, the spinner holds it: a 2-thread call waiting for a descheduled peer
took 20-40 ms instead of 0.3 ms on the 2-core development machine, and NumPy (OpenBLAS) calls
interleaved with Tracea's slowed the same way (docs/backends/cpu.md, "Thread pools").

libgomp reads ``GOMP_SPINCOUNT`` once, when it is loaded, for the whole process. So Tracea sets it
(:data:`SPINCOUNT`) when its CPU plugin loads or before its first kernel, only if no libgomp is loaded
yet, the user set neither ``OMP_WAIT_POLICY`` nor ``GOMP_SPINCOUNT`` (``TRACEA_OMP_SPIN=default`` keeps
libgomp's default; ``TRACEA_OMP_SPIN=short`` asks for Tracea's) and torch is not installed: torch
imported later shares the runtime (its libgomp has the same soname) and so the setting, which helped it on
a busy machine (512^3 bf16 365 -> 720 GFLOP/s at load ~2.5) but slowed it badly on a quiet one (2-core
Sapphire Rapids VM, load 0.4, 2026-11-26: ``F.linear`` 512x512 one token 9.6 -> 91 us, a 64@56 3x3 conv
1.52 -> 1.99 ms; in ``bench_user_cpu.py`` torch's convs ran 4-18% slower after Tracea's GEMMs had loaded
the runtime first). Tracea does not change another library's runtime behind its back.
"""

from __future__ import annotations

import os
import sys

#: spins before an idle worker sleeps (~54 us on a 2.6 GHz Intel server core)
SPINCOUNT = "1000"
_done = False


def _mapped(name: str) -> bool | None:
    """Whether a library whose path contains ``name`` (lower case) is mapped into this process (None: cannot
    tell: no ``/proc/self/maps``)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            return name in f.read().lower()
    except OSError:
        return None


def libgomp_loaded() -> bool | None:
    """Whether an OpenMP runtime (libgomp) is mapped into this process (None: cannot tell)."""
    return _mapped("libgomp")


_openblas_seen = False


def _openblas_loaded() -> bool | None:
    """Whether OpenBLAS is mapped into this process (None: cannot tell). Once seen it stays loaded, so
    later calls (the backend info feeds every tuning fingerprint) skip the ~0.4 ms read of the maps."""
    global _openblas_seen
    if not _openblas_seen:
        seen = _mapped("openblas")
        if seen is None:
            return None
        _openblas_seen = seen
    return _openblas_seen


def blas_pool_advice(maps: str | None = None) -> str:
    """One line for ``tracea doctor``: whether OpenBLAS (NumPy's BLAS) is loaded here and how long its idle
    workers spin. They busy-wait ~0.1 s after every call unless ``OPENBLAS_THREAD_TIMEOUT`` was set before it
    loaded, and a Tracea kernel started in that window shares the cores with them (2x on a 16-core host,
    docs/backends/cpu.md, "Sharing the cores"). Tracea does not change another library's setting itself.
    ``maps``: the text of ``/proc/self/maps`` (read when None)."""
    if maps is None:
        loaded = _openblas_loaded()
        if loaded is None:
            return "unknown (no /proc/self/maps)"
    else:
        loaded = "openblas" in maps.lower()
    if not loaded:
        return "no OpenBLAS loaded"
    timeout = os.environ.get("OPENBLAS_THREAD_TIMEOUT")
    if timeout:
        return f"OpenBLAS loaded, OPENBLAS_THREAD_TIMEOUT={timeout}"
    return ("OpenBLAS loaded, its workers spin ~0.1 s after each call (set OPENBLAS_THREAD_TIMEOUT=4 before "
            "NumPy loads in programs that interleave NumPy BLAS calls with Tracea's)")


def _torch_installed() -> bool:
    """Whether torch is imported or importable in this environment (it would share the runtime)."""
    if "torch" in sys.modules:
        return True
    import importlib.util

    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return True  # cannot tell: leave the runtime alone


def apply_spin_default() -> str | None:
    """Set ``GOMP_SPINCOUNT`` before Tracea's first kernel loads libgomp (see the module doc); returns
    the value set, or None when the user's settings or an already loaded runtime decide. Runs once."""
    global _done
    if _done:
        return None
    _done = True
    if not sys.platform.startswith("linux"):
        return None
    env = os.environ
    asked = env.get("TRACEA_OMP_SPIN", "").lower()
    if asked == "default" or "OMP_WAIT_POLICY" in env or "GOMP_SPINCOUNT" in env:
        return None
    if asked != "short" and _torch_installed():
        return None
    if libgomp_loaded() is not False:
        return None
    env["GOMP_SPINCOUNT"] = SPINCOUNT
    return SPINCOUNT
