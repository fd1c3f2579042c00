"""What tuning optimises for (seed: ``tracea.OptimizationGoal``) and how a goal scores a trial.

Every goal turns the per-run times of one config into one *score* in seconds (lower is better), so the
tuner, the cache and the graph optimiser compare configs the same way whatever the goal:

``MaximizeTFLOPS``
    the median run time (throughput: FLOPs / median).
``MinimizeLatency``
    the 90th percentile of the run times (the tail a latency-bound caller waits for).
``Balanced``
    ``median * (1 + BALANCED_K * cv)`` where ``cv`` is the coefficient of variation (standard deviation
    over mean) of the run times: a fast config keeps its rank unless it is erratic. Example: a config
    with median 1.0 ms and cv 0.4 scores 1.2 ms and loses to one with median 1.1 ms and cv 0.05
    (1.13 ms); with cv 0.1 (1.05 ms) it would win. ``BALANCED_K = 0.5``.
"""

from __future__ import annotations

import enum
import math
from typing import Any, Sequence

import numpy as np

from ..errors import InvalidArgumentError

#: weight of the coefficient of variation in the Balanced score.
BALANCED_K = 0.5


class OptimizationGoal(enum.Enum):
    """``MaximizeTFLOPS``: highest median throughput. ``MinimizeLatency``: lowest tail (p90) latency.
    ``Balanced``: a utility of throughput and run-to-run variance (see docs/tuning.md)."""

    MaximizeTFLOPS = "max_tflops"
    MinimizeLatency = "min_latency"
    Balanced = "balanced"

    MAXIMIZE_TFLOPS = "max_tflops"
    MINIMIZE_LATENCY = "min_latency"
    BALANCED = "balanced"

    @classmethod
    def parse(cls, value: Any, arg: str = "goal") -> "OptimizationGoal":
        """Accept a member, its value (``"max_tflops"``) or a name in any spelling (``"MinimizeLatency"``,
        ``"minimize_latency"``, ``"latency"``, ``"tflops"``)."""
        if isinstance(value, OptimizationGoal):
            return value
        if value is None:
            return cls.MaximizeTFLOPS
        if isinstance(value, str):
            key = value.strip().lower().replace("-", "_")
            aliases = {"max_tflops": cls.MaximizeTFLOPS, "maximizetflops": cls.MaximizeTFLOPS,
                       "maximize_tflops": cls.MaximizeTFLOPS, "tflops": cls.MaximizeTFLOPS,
                       "throughput": cls.MaximizeTFLOPS, "min_latency": cls.MinimizeLatency,
                       "minimizelatency": cls.MinimizeLatency, "minimize_latency": cls.MinimizeLatency,
                       "latency": cls.MinimizeLatency, "balanced": cls.Balanced}
            if key in aliases:
                return aliases[key]
        raise InvalidArgumentError(arg, value, "one of max_tflops, min_latency, balanced "
                                               "(or an OptimizationGoal)")

    def score(self, times: Sequence[float]) -> float:
        """This goal's score of the run times ``times`` (seconds, lower is better); inf when empty."""
        stats = time_stats(times)
        if not stats:
            return math.inf
        if self is OptimizationGoal.MinimizeLatency:
            return stats["p90_s"]
        if self is OptimizationGoal.Balanced:
            return stats["median_s"] * (1.0 + BALANCED_K * stats["cv"])
        return stats["median_s"]

    @property
    def label(self) -> str:
        """What the score means, for tables."""
        return {"max_tflops": "median", "min_latency": "p90", "balanced": "median*(1+0.5cv)"}[self.value]


def percentile(sorted_times: Sequence[float], q: float) -> float:
    """Linear-interpolated ``q``-quantile (0..1) of a sequence (``numpy.quantile``, method "linear")."""
    return float(np.quantile(np.asarray(sorted_times, dtype=np.float64), q))


def time_stats(times: Sequence[float]) -> dict[str, float]:
    """``median_s``, ``p90_s``, ``min_s``, ``mean_s``, ``cv`` and ``n`` of run times (empty dict if none)."""
    ts = sorted(float(t) for t in times if t is not None and math.isfinite(t))
    if not ts:
        return {}
    mean = sum(ts) / len(ts)
    var = sum((t - mean) ** 2 for t in ts) / (len(ts) - 1) if len(ts) > 1 else 0.0
    return {"median_s": percentile(ts, 0.5), "p90_s": percentile(ts, 0.9), "min_s": ts[0], "mean_s": mean,
            "cv": (math.sqrt(var) / mean) if mean > 0 else 0.0, "n": float(len(ts))}
