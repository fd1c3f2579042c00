"""Where an operation runs: a device kind plus an index (``cpu:0``, ``cuda:1``, ``opencl:2``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgumentError

KNOWN_KINDS = ("cpu", "cuda", "opencl")


@dataclass(frozen=True, order=True)
class Device:
    """A device kind and index. Seed spelling: ``Device.Cuda(0)``, ``Device.Cpu()``.

    Kinds are free-form lower-case names so a third-party backend may add its own (``"metal"``);
    ``cpu``, ``cuda`` and ``opencl`` are the ones Tracea's own backends serve.
    """

    kind: str
    index: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind or not self.kind.replace("_", "").isalnum():
            raise InvalidArgumentError("device", self.kind, "a device kind such as 'cpu', 'cuda', 'opencl'")
        object.__setattr__(self, "kind", self.kind.lower())
        if isinstance(self.index, bool) or not isinstance(self.index, int) or self.index < 0:
            raise InvalidArgumentError("device index", self.index, "a non-negative integer")

    @classmethod
    def parse(cls, value: "Device | str") -> "Device":
        """Parse ``"cuda"``, ``"cuda:1"``, ``"cpu"`` or return a Device unchanged."""
        if isinstance(value, Device):
            return value
        if not isinstance(value, str):
            raise InvalidArgumentError("device", value, "a Device or a string like 'cuda:0'")
        kind, _, idx = value.strip().partition(":")
        if idx and not idx.isdigit():
            raise InvalidArgumentError("device", value, "'kind' or 'kind:index' with a numeric index")
        return cls(kind, int(idx) if idx else 0)

    @classmethod
    def cpu(cls) -> "Device":
        return cls("cpu", 0)

    @classmethod
    def cuda(cls, index: int = 0) -> "Device":
        return cls("cuda", index)

    @classmethod
    def opencl(cls, index: int = 0) -> "Device":
        return cls("opencl", index)

    # Seed (Rust enum) spellings.
    Cpu = cpu
    Cuda = cuda
    OpenCL = opencl

    def __str__(self) -> str:
        return f"{self.kind}:{self.index}"
