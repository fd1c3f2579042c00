"""Optimizer (L6): goals, the AutoTuner, the persistent tuning cache and graph tuning.

Submodules import optuna only when a search actually runs, so ``import tracea`` stays light.
"""

from .goals import OptimizationGoal

__all__ = ["OptimizationGoal", "AutoTuner", "TuneResult", "TuningCache", "CacheEntry", "get_cache",
           "set_cache", "optimize_graph", "GraphTuneReport"]

_LAZY = {"AutoTuner": "autotuner", "TuneResult": "autotuner", "TuningCache": "cache", "CacheEntry": "cache",
         "get_cache": "cache", "set_cache": "cache", "optimize_graph": "graph", "GraphTuneReport": "graph"}


def __getattr__(name: str):  # noqa: ANN202 - PEP 562 lazy attributes
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(name)
