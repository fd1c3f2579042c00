"""Optimizer (L6): goals, the AutoTuner, the persistent tuning cache and graph tuning."""

from .goals import OptimizationGoal

__all__ = ["OptimizationGoal"]
