"""Semantic IR (L4): pipeline configs, swizzle/barrier modes and search spaces."""

from .config import BarrierMode, PipelineConfig, SwizzleMode, Validity
from .search_space import SearchSpace

__all__ = ["BarrierMode", "PipelineConfig", "SearchSpace", "SwizzleMode", "Validity"]
