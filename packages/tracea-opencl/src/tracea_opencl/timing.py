"""Event-based timing of OpenCL launches (``CL_QUEUE_PROFILING_ENABLE`` queues only)."""

from __future__ import annotations

from typing import Any

from . import runtime
from .arrays import is_cl_array, queue_of


def measure_events(variant: Any, op: Any, config: Any, args: Any, profile: Any, warmup: int,
                   repeats: int) -> list[float] | None:
    """Per-run device times in seconds of ``repeats`` launches after ``warmup``, or None when the output's
    queue cannot time events (the caller then falls back to wall-clock timing)."""
    out = args.out
    if not is_cl_array(out):
        return None
    pcl = runtime.cl()
    queue = queue_of(out)
    if not queue.properties & pcl.command_queue_properties.PROFILING_ENABLE:
        return None
    for _ in range(max(0, warmup)):
        variant.launch(op, config, args, profile)
    events = [variant.launch(op, config, args, profile) for _ in range(max(1, repeats))]
    queue.finish()
    # A launch may be a pack (transpose) then the GEMM kernel: time from the first start to the last end.
    return [(evs[-1].profile.end - evs[0].profile.start) * 1e-9 for evs in events]
