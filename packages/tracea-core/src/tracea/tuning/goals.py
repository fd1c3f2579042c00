"""What tuning optimises for (seed: ``tracea.OptimizationGoal``)."""

from __future__ import annotations

import enum


class OptimizationGoal(enum.Enum):
    """``MaximizeTFLOPS``: highest median throughput. ``MinimizeLatency``: lowest tail (p90) latency.
    ``Balanced``: a utility of throughput and run-to-run variance (see docs/tuning.md)."""

    MaximizeTFLOPS = "max_tflops"
    MinimizeLatency = "min_latency"
    Balanced = "balanced"

    MAXIMIZE_TFLOPS = "max_tflops"
    MINIMIZE_LATENCY = "min_latency"
    BALANCED = "balanced"
