"""Core IR (L2): dtypes, shapes, epilogues, operator descriptions and problem descriptors."""

from .device import Device
from .epilogue import Epilogue, EpilogueKind
from .ops import AttentionOp, Conv2dOp, GemmOp, LayerType, Layout, Op, op_from_dict
from .problem import ProblemDescriptor
from .shape import Shape

__all__ = ["AttentionOp", "Conv2dOp", "Device", "Epilogue", "EpilogueKind", "GemmOp", "LayerType", "Layout",
           "Op", "ProblemDescriptor", "Shape", "op_from_dict"]
