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

**One team size** (:func:`team`): libgomp ends the surplus threads of its pool whenever a parallel region
asks for fewer threads than the previous one, and starts new ones for the next larger region. torch
shares that runtime (same soname), so a Tracea kernel whose automatic count differs from torch's
(``torch.set_num_threads`` / ``OMP_NUM_THREADS`` below the core count, or a smaller count picked for a
small problem) made every switch between a torch op and a Tracea op end and start threads (measured on
a 16-core Xeon, 12 bf16 MLP blocks patched with ``torch.set_num_threads(8)``: 0.34x eager, thread
creation per call). Automatic multi-threaded calls therefore run with torch's thread count when torch is
loaded, and otherwise with the largest automatic count this process has used, so Tracea's own kernels
keep one team too; a kernel with less work than threads leaves the surplus threads idle. Serial calls
(one thread) never touch the pool and stay serial.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

from tracea.runtime.arrays import imported

from .kernels import max_threads

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
        """``nth`` capped at the free cores (rounded), at least 1; not capped while the other processes
        leave every core free (a team larger than the host, asked for through torch's thread count, stays
        as asked: a smaller one would end and start threads at every switch, see :func:`team`)."""
        others = self.others()
        if others is None or nth <= 1:
            return nth
        cpus = self._cpus or nth
        free = int(cpus - others + 0.5)
        return nth if free >= cpus else max(1, min(nth, free))


_FREE = FreeCores()
_LIMIT = max_threads()


def adaptive(requested: int) -> bool:
    """Whether a call whose config asked for ``requested`` threads (0: automatic) may be capped."""
    env = os.environ
    return requested == 0 and not env.get("TRACEA_NUM_THREADS") and env.get("TRACEA_CPU_ADAPT_THREADS") != "0"


def threads_now(nth: int) -> int:
    """The threads this call should use: ``nth`` capped at the cores other processes leave free."""
    return _FREE.cap(nth)


#: the largest automatic thread count used so far in this process (the team when torch is not loaded)
_widest = 1


def team(nth: int) -> int:
    """The team for an automatic multi-threaded call that would use ``nth`` threads: torch's thread count
    when torch is loaded (it shares the OpenMP runtime), else the largest automatic count used so far
    (see the module docstring); at least 1, at most :func:`~tracea_cpu.kernels.max_threads`."""
    global _widest
    torch = imported("torch")
    if torch is not None:
        try:
            want = int(torch.get_num_threads())
        except (AttributeError, RuntimeError, TypeError, ValueError):
            want = nth
    else:
        if nth > _widest:
            _widest = nth
        want = _widest
    return max(1, min(want, _LIMIT))


def thread_picker(nth: int, requested: int) -> Callable[[], int]:
    """What a launcher calls before each kernel call for its thread count. A config's own count
    (``requested`` > 0), ``TRACEA_NUM_THREADS`` and serial calls (``nth`` <= 1) always get ``nth`` (that
    picker's ``fixed`` attribute holds it). Other calls get the process's :func:`team` at each call,
    capped at the cores other processes leave free (:func:`threads_now`) unless
    ``TRACEA_CPU_ADAPT_THREADS=0``."""
    env = os.environ
    if nth > 1 and requested == 0 and not env.get("TRACEA_NUM_THREADS"):
        if adaptive(requested):
            cap = _FREE.cap
            return lambda: cap(team(nth))
        return lambda: team(nth)

    def fixed() -> int:
        return nth

    fixed.fixed = nth  # type: ignore[attr-defined]  # launchers may write it once instead of per call
    return fixed
