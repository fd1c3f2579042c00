"""Timing with CUDA events on the launch stream (no host clock, no per-run synchronization)."""

from __future__ import annotations

from typing import Any

from . import toolkit
from .arrays import device_index, launch_stream


def measure(variant: Any, op: Any, config: Any, args: Any, profile: Any, warmup: int, repeats: int) -> list[float]:
    """Per-run seconds of ``repeats`` runs after ``warmup`` runs, each bracketed by CUDA events."""
    cp = toolkit.cupy()
    with cp.cuda.Device(device_index(args.out)):
        stream = launch_stream(args)
        variant.prepare(op, config, profile)
        for _ in range(max(warmup, 0)):
            variant.run(op, config, args, profile)
        events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(repeats)]
        for start, end in events:
            start.record(stream)
            variant.run(op, config, args, profile)
            end.record(stream)
        events[-1][1].synchronize()
        return [cp.cuda.get_elapsed_time(s, e) / 1e3 for s, e in events]
