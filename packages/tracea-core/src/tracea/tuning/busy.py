"""Is something else keeping the CPU busy while we tune on it?

A CPU kernel timed while other processes hold the cores is slower, and a multi-threaded one more so than
a single-threaded one: a tuner can then keep a config that loses on the quiet machine, and the tuning
cache keeps it. :func:`warn_if_busy` samples ``/proc/stat`` for a moment before CPU tuning and warns (once
per process) when other processes used more than half a core. Linux only; elsewhere it says nothing.
"""

from __future__ import annotations

import os
import time
import warnings

from ..errors import BusyMachineWarning

_warned = False


def _busy_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies over all CPUs from ``/proc/stat``, or None where there is none."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(x) for x in fields[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


def other_cpu_load(window_s: float = 0.1) -> float | None:
    """Cores kept busy by other processes over ``window_s`` (this process's own CPU time excluded),
    or None when it cannot be measured."""
    first = _busy_jiffies()
    if first is None:
        return None
    own0, t0 = time.process_time(), time.monotonic()
    time.sleep(window_s)
    second = _busy_jiffies()
    own1, t1 = time.process_time(), time.monotonic()
    if second is None or second[1] <= first[1]:
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy_cores = (second[0] - first[0]) / hz / max(t1 - t0, 1e-6)
    return max(0.0, busy_cores - (own1 - own0) / max(t1 - t0, 1e-6))


def warn_if_busy(threshold_cores: float = 0.5, sample=other_cpu_load) -> float | None:
    """Warn once per process when other processes keep more than ``threshold_cores`` cores busy;
    returns the measured load (None when unmeasurable)."""
    global _warned
    load = sample()
    if load is not None and load > threshold_cores and not _warned:
        _warned = True
        warnings.warn(f"tuning on a busy CPU: other processes keep {load:.1f} cores busy, so timings may "
                      "favour configs that lose on a quiet machine (fewer threads, for one); the tuning "
                      "cache keeps what is chosen. Re-tune with force=True (CLI: --force) when it is quiet.",
                      BusyMachineWarning, stacklevel=3)
    return load
