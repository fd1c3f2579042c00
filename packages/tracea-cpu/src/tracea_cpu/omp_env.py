"""How long idle OpenMP workers spin: Tracea's default for the OpenMP runtime when Tracea loads it.

libgomp's workers spin-wait ~300k PAUSE instructions at every barrier and after every parallel region
before sleeping (a PAUSE takes ~140 cycles on Intel server cores since Skylake: ~16 ms). When another
thread or process needs the core, the spinner holds it: a 2-thread call waiting for a descheduled peer
took 20-40 ms instead of 0.3 ms on the 2-core development machine, and NumPy (OpenBLAS) calls
interleaved with Tracea's slowed the same way (docs/backends/cpu.md, "Thread pools").

libgomp reads ``GOMP_SPINCOUNT`` once, when it is loaded, for the whole process. So Tracea sets it
(:data:`SPINCOUNT`) when its CPU plugin loads (the Doctor loads it before tracea-torch's, which imports
torch) or before its first kernel, only if no libgomp is loaded yet (``import torch`` earlier loads
it) and the user set neither ``OMP_WAIT_POLICY`` nor ``GOMP_SPINCOUNT``; ``TRACEA_OMP_SPIN=default``
keeps libgomp's default. torch loaded afterwards shares that runtime (its libgomp has the same soname)
and so the setting: measured, it sped torch up too on the busy machine (512^3 bf16 365 -> 720 GFLOP/s).
"""

from __future__ import annotations

import os
import sys

#: spins before an idle worker sleeps (~54 us on a 2.6 GHz Intel server core)
SPINCOUNT = "1000"
_done = False


def libgomp_loaded() -> bool | None:
    """Whether an OpenMP runtime (libgomp) is mapped into this process (None: cannot tell)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            return "libgomp" in f.read()
    except OSError:
        return None


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
    if env.get("TRACEA_OMP_SPIN", "").lower() == "default" or "OMP_WAIT_POLICY" in env or "GOMP_SPINCOUNT" in env:
        return None
    if libgomp_loaded() is not False:
        return None
    env["GOMP_SPINCOUNT"] = SPINCOUNT
    return SPINCOUNT
