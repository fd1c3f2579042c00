"""Timing with CUDA events on the launch stream (no host clock, no per-run synchronization).

Before the timed runs a one-thread spin kernel keeps the stream busy for a little longer than Python
needs to enqueue them, so each start event is reached by a GPU that already has the timed launch
queued behind it. Otherwise the GPU drains the queue while the host issues the next launch (~15 µs
of Python per run), and short kernels would be timed with that host latency inside their window.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import compiler, toolkit
from .arrays import device_index, launch_stream

_SPIN = r"""
extern "C" __global__ void tracea_spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
"""
#: GPU cycles of spin per timed run queued behind it (~30 µs at 2 GHz: more than one run's host time).
SPIN_CYCLES_PER_RUN = 60_000
SPIN_CYCLES_MIN = 200_000


def queue_ahead(stream: Any, runs: int, arch: str) -> None:
    """Keep ``stream`` busy while the host enqueues ``runs`` timed launches."""
    kernel = compiler.load(_SPIN, "tracea_spin", arch, smem=0, threads=1)
    cycles = max(SPIN_CYCLES_MIN, SPIN_CYCLES_PER_RUN * runs)
    kernel.launch((1, 1, 1), (np.int64(cycles),), stream)


def measure(variant: Any, op: Any, config: Any, args: Any, profile: Any, warmup: int, repeats: int) -> list[float]:
    """Per-run seconds of ``repeats`` runs after ``warmup`` runs, each bracketed by CUDA events."""
    cp = toolkit.cupy()
    dev = device_index(args.out)
    with cp.cuda.Device(dev):
        stream = launch_stream(args)
        variant.prepare(op, config, profile)
        for _ in range(max(warmup, 0)):
            variant.run(op, config, args, profile)
        events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(repeats)]
        queue_ahead(stream, repeats, toolkit.arch_name(profile.compute_capability or toolkit.compute_capability(dev)))
        for start, end in events:
            start.record(stream)
            variant.run(op, config, args, profile)
            end.record(stream)
        events[-1][1].synchronize()
        return [cp.cuda.get_elapsed_time(s, e) / 1e3 for s, e in events]
