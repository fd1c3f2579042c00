"""Threads for one call on a host that other processes keep busy.

A kernel's OpenMP threads wait for each other at barriers, and the region's end waits for the slowest.
When another process holds a core, one of our threads shares a core with it (or with our own master:
the scheduler wakes the worker on the busy master's core and preempts it), so a two-thread call runs
serially plus the waiting (measured on the 2-core Intel Xeon VM: a 512^3 bf16 AMX GEMM whose master ran
none of the four work items in every call of a run, the worker all of them).

:func:`threads_now` caps a call's automatic thread count at the cores the *other* processes left free
over the last ~0.1 s: the host's busy time (``/proc/stat``, all CPUs) minus this process's own CPU time
(``time.process_time``: every thread of the process, so torch's and OpenBLAS's pools in the same process
do not count as others). One ``pread`` of ``/proc/stat`` per window; between windows a call costs a clock
read. Only calls whose thread count is automatic are capped (config ``threads=0`` and no
``TRACEA_NUM_THREADS``); ``TRACEA_CPU_ADAPT_THREADS=0`` turns it off. Where ``/proc/stat`` cannot be
read (not Linux) nothing is capped.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

#: shortest window between two ``/proc/stat`` samples, seconds (the kernel counts CPU time in ticks of
#: 1-10 ms per CPU: shorter windows are too coarse)
WINDOW_S = 0.1
#: weight of the newest window in the running estimate of the other processes' busy cores
NEW_WEIGHT = 0.5


class FreeCores:
    """Running estimate of the cores other processes leave free (see the module docstring)."""

    def __init__(self, path: str = "/proc/stat") -> None:
        self._path = path
        self._fd: int | None = None
        self._tick = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
        self._last: tuple[float, float, float] | None = None  # (wall, busy CPU-s of the host, our CPU-s)
        self._others = 0.0
        self._measured = False
        self._cpus = 0
        self._dead = False
        self._lock = threading.Lock()

    def _sample(self) -> tuple[float, int]:
        """(busy CPU-seconds of the whole host since boot, CPUs of the host); raises OSError / ValueError
        when unreadable. Only the aggregate first line is read (the per-CPU lines of a large host run
        past any small read)."""
        if self._fd is None:
            self._fd = os.open(self._path, os.O_RDONLY)
        fields = os.pread(self._fd, 512, 0).split(b"\n", 1)[0].split()
        if not fields or fields[0] != b"cpu":
            raise ValueError("no aggregate cpu line")
        ticks = [int(x) for x in fields[1:]]
        # user nice system idle iowait irq softirq steal [guest guest_nice]; guest time is in user already
        busy = sum(ticks[:8]) - ticks[3] - ticks[4]
        return busy / self._tick, os.cpu_count() or 1

    def others(self) -> float | None:
        """Cores the other processes kept busy (running estimate), None where it cannot be measured."""
        if self._dead:
            return None
        now = time.monotonic()
        last = self._last
        if last is not None and now - last[0] < WINDOW_S:
            return self._others
        with self._lock:
            last = self._last
            if last is not None and now - last[0] < WINDOW_S:
                return self._others
            try:
                busy, cpus = self._sample()
            except (OSError, ValueError, IndexError):
                self._dead = True
                return None
            ours = time.process_time()
            if last is not None:
                window = now - last[0]
                other = min(max(0.0, (busy - last[1]) - (ours - last[2])) / window, float(cpus or 1))
                # the first window is the estimate; later ones are averaged into it
                self._others = other if not self._measured else (1 - NEW_WEIGHT) * self._others + NEW_WEIGHT * other
                self._measured = True
            self._cpus = cpus
            self._last = (now, busy, ours)
            return self._others

    def cap(self, nth: int) -> int:
        """``nth`` capped at the free cores (rounded), at least 1."""
        others = self.others()
        if others is None or nth <= 1:
            return nth
        cpus = self._cpus or nth
        return max(1, min(nth, int(cpus - others + 0.5)))


_FREE = FreeCores()


def adaptive(requested: int) -> bool:
    """Whether a call whose config asked for ``requested`` threads (0: automatic) may be capped."""
    env = os.environ
    return requested == 0 and not env.get("TRACEA_NUM_THREADS") and env.get("TRACEA_CPU_ADAPT_THREADS") != "0"


def threads_now(nth: int) -> int:
    """The threads this call should use: ``nth`` capped at the cores other processes leave free."""
    return _FREE.cap(nth)


def thread_picker(nth: int, requested: int) -> Callable[[], int]:
    """What a launcher calls before each kernel call for its thread count: :func:`threads_now` of
    ``nth`` when the config's ``requested`` count (0: automatic) allows capping (:func:`adaptive`, read
    once here), else always ``nth`` (that picker's ``fixed`` attribute holds it)."""
    if nth > 1 and adaptive(requested):
        cap = _FREE.cap
        return lambda: cap(nth)

    def fixed() -> int:
        return nth

    fixed.fixed = nth  # type: ignore[attr-defined]  # launchers may write it once instead of per call
    return fixed
