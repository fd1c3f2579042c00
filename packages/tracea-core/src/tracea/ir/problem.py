"""The seed's ``ProblemDescriptor``: an op plus the device it should run on, as the tuner consumes it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..dtypes import DType
from ..errors import InvalidArgumentError
from .device import Device
from .epilogue import Epilogue
from .ops import AttentionOp, Conv2dOp, GemmOp, LayerType, Op
from .shape import Shape


@dataclass(frozen=True)
class ProblemDescriptor:
    """A problem to tune or run: ``device``, ``layer_type`` and either a GEMM ``shape`` or a full ``op``.

    Seed form: ``ProblemDescriptor(device=Device.cuda(0), layer_type=LayerType.Gemm,
    shape=Shape(m=2048, n=2048, k=2048))``. Conv2d and attention problems pass ``op=`` explicitly
    (their dimensions do not fit a GEMM shape).
    """

    device: Device = field(default_factory=Device.cpu)
    layer_type: LayerType = LayerType.GEMM
    shape: Shape | None = None
    dtype: DType = DType.F32
    epilogue: Epilogue = field(default_factory=Epilogue.empty)
    op: Op | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", Device.parse(self.device))
        object.__setattr__(self, "dtype", DType.parse(self.dtype))
        object.__setattr__(self, "epilogue", Epilogue.parse(self.epilogue))
        if self.op is None:
            if self.layer_type is not LayerType.GEMM:
                raise InvalidArgumentError("op", None, f"an explicit op for a {self.layer_type.value} problem")
            if self.shape is None:
                raise InvalidArgumentError("shape", None, "a Shape(m, n, k, batch) for a GEMM problem")
            s = self.shape
            object.__setattr__(self, "op", GemmOp(s.m, s.n, s.k, s.batch, dtype_a=self.dtype,
                                                  dtype_b=self.dtype, epilogue=self.epilogue))
        elif self.op.kind is not self.layer_type:
            object.__setattr__(self, "layer_type", self.op.kind)

    @classmethod
    def for_op(cls, op: Op, device: Device | str = "cpu") -> "ProblemDescriptor":
        """Wrap an existing op."""
        return cls(device=Device.parse(device), layer_type=op.kind, op=op)

    def to_dict(self) -> dict[str, Any]:
        assert self.op is not None
        return {"device": str(self.device), "op": self.op.to_dict()}


__all__ = ["AttentionOp", "Conv2dOp", "GemmOp", "ProblemDescriptor"]
