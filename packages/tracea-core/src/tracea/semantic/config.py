"""Semantic IR (L4): how a kernel is organised, independent of which backend renders it.

A :class:`PipelineConfig` holds the tiling (``tile_m x tile_n x tile_k``), the software-pipeline depth
(``stages``), the parallel width (``warps``: warps on GPUs, threads on CPUs), the shared-memory
:class:`SwizzleMode` and the :class:`BarrierMode`, plus backend-specific ``params`` (for example the
CPU micro-kernel's ``mr``/``nr`` or a CUDA kernel's ``cluster``). Configs are validated against a
:class:`~tracea.doctor.profile.DeviceProfile` with a reason when invalid.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Mapping

from ..doctor.profile import DeviceProfile
from ..errors import InvalidArgumentError, UnsupportedConfigError
from ..ir.hashing import memo_hash


class SwizzleMode(enum.Enum):
    """Shared-memory address swizzle that removes bank conflicts.

    ``XOR2``/``XOR4``/``XOR8`` XOR the 16-byte chunk index within a row with the row index modulo 2/4/8
    (the 32/64/128-byte swizzles of Hopper's TMA are XOR2/XOR4/XOR8 on 16-byte chunks).
    """

    NONE = "none"
    XOR2 = "xor2"
    XOR4 = "xor4"
    XOR8 = "xor8"

    # Seed spellings (SwizzleMode::Xor4 ...); `None` is a Python keyword, so only NONE exists for it.
    Xor2 = "xor2"
    Xor4 = "xor4"
    Xor8 = "xor8"

    @property
    def factor(self) -> int:
        """Rows in one swizzle period (1 for NONE)."""
        return {"none": 1, "xor2": 2, "xor4": 4, "xor8": 8}[self.value]


class BarrierMode(enum.Enum):
    """How pipeline stages synchronise.

    ``NONE``: no inter-stage barrier (single stage, or backends without shared memory).
    ``SYNC``: a block-wide barrier between load and compute (``__syncthreads``/``barrier(CLK_LOCAL_MEM_FENCE)``).
    ``PRODUCER_CONSUMER``: producer warps fill stages and signal full/empty barriers (``mbarrier`` on
    Hopper) so loads and math of different stages overlap.
    """

    NONE = "none"
    SYNC = "sync"
    PRODUCER_CONSUMER = "producer_consumer"

    ProducerConsumer = "producer_consumer"


ParamValue = Any


@dataclass(frozen=True)
class Validity:
    """Result of validating a config: truthy when valid, else ``reason`` says why."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


VALID = Validity(True)


@memo_hash
@dataclass(frozen=True)
class PipelineConfig:
    """One point of a variant's search space. Immutable and hashable; ``key`` is its stable text form."""

    tile_m: int = 64
    tile_n: int = 64
    tile_k: int = 32
    stages: int = 2
    warps: int = 4
    swizzle: SwizzleMode = SwizzleMode.NONE
    barrier: BarrierMode = BarrierMode.NONE
    params: tuple[tuple[str, ParamValue], ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("tile_m", "tile_n", "tile_k", "stages", "warps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise InvalidArgumentError(name, v, "a positive integer")
        object.__setattr__(self, "swizzle", _enum(SwizzleMode, self.swizzle, "swizzle"))
        object.__setattr__(self, "barrier", _enum(BarrierMode, self.barrier, "barrier"))
        params = self.params.items() if isinstance(self.params, Mapping) else self.params
        items = []
        for k, v in params:
            if not isinstance(k, str) or not k.isidentifier():
                raise InvalidArgumentError("params", k, "identifier-like parameter names")
            if not isinstance(v, (int, float, str, bool)):
                raise InvalidArgumentError(f"params.{k}", v, "an int, float, str or bool")
            items.append((k, v))
        object.__setattr__(self, "params", tuple(sorted(items)))

    def get(self, name: str, default: ParamValue = None) -> ParamValue:
        """A backend-specific parameter, or a core field by name, or ``default``."""
        for k, v in self.params:
            if k == name:
                return v
        if name in _CORE_FIELDS:
            return getattr(self, name)
        return default

    def with_params(self, **params: ParamValue) -> "PipelineConfig":
        """A copy with backend-specific parameters set or replaced."""
        merged = dict(self.params)
        merged.update(params)
        return replace(self, params=tuple(merged.items()))

    def replace(self, **changes: Any) -> "PipelineConfig":
        """A copy with core fields and/or params changed (unknown names become params)."""
        core = {k: v for k, v in changes.items() if k in _CORE_FIELDS or k == "params"}
        extra = {k: v for k, v in changes.items() if k not in core}
        out = replace(self, **core)
        return out.with_params(**extra) if extra else out

    @property
    def key(self) -> str:
        """Stable text form used in caches and tables."""
        base = (f"tm{self.tile_m}.tn{self.tile_n}.tk{self.tile_k}.st{self.stages}.w{self.warps}"
                f".sw{self.swizzle.value}.b{self.barrier.value}")
        return base + "".join(f".{k}={v}" for k, v in self.params)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in _CORE_FIELDS}
        out["swizzle"] = self.swizzle.value
        out["barrier"] = self.barrier.value
        out["params"] = dict(self.params)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PipelineConfig":
        """Inverse of :meth:`to_dict`; unknown top-level keys become params."""
        data = dict(data)
        params = dict(data.pop("params", {}) or {})
        core = {k: data.pop(k) for k in list(data) if k in _CORE_FIELDS}
        params.update(data)
        return cls(**core, params=tuple(params.items()))

    def threads(self, profile: DeviceProfile) -> int:
        """Threads per block: ``warps * warp_size`` (on CPUs, where warp_size is 1, the thread count)."""
        return self.warps * max(1, profile.warp_size)

    def validate(self, profile: DeviceProfile, *, smem_bytes: int | None = None,
                 regs_per_thread: int | None = None) -> Validity:
        """Check this config against a device's limits.

        :param profile: the device's profile.
        :param smem_bytes: shared/local memory the variant needs for this config (the variant computes it,
            since it depends on dtypes and padding); skipped when None.
        :param regs_per_thread: the variant's register estimate; skipped when None.
        :returns: a truthy :class:`Validity`, or a falsy one whose ``reason`` names the exceeded limit.
        """
        threads = self.threads(profile)
        if profile.max_threads_per_block > 1 and threads > profile.max_threads_per_block:
            return Validity(False, f"{threads} threads per block exceed the device limit "
                                   f"{profile.max_threads_per_block}")
        if smem_bytes is not None and profile.shared_mem_per_block and smem_bytes > profile.shared_mem_per_block:
            return Validity(False, f"needs {smem_bytes} B of shared memory, device allows "
                                   f"{profile.shared_mem_per_block} B per block")
        if regs_per_thread is not None and profile.registers_per_block:
            if regs_per_thread * threads > profile.registers_per_block:
                return Validity(False, f"needs {regs_per_thread * threads} registers per block "
                                       f"({regs_per_thread}/thread), device has {profile.registers_per_block}")
        return VALID

    def require_valid(self, profile: DeviceProfile, **kw: Any) -> None:
        """Raise :class:`UnsupportedConfigError` when :meth:`validate` fails."""
        v = self.validate(profile, **kw)
        if not v:
            raise UnsupportedConfigError(f"config {self.key} is invalid on {profile.name}: {v.reason}",
                                         reason=v.reason)

    def __str__(self) -> str:
        return self.key


_CORE_FIELDS = tuple(f.name for f in fields(PipelineConfig) if f.name != "params")


def _enum(cls: type[enum.Enum], value: Any, arg: str) -> Any:
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        for m in cls:
            if value.lower() in (m.value, m.name.lower()):
                return m
    raise InvalidArgumentError(arg, value, "one of " + ", ".join(m.value for m in cls))


def configs_from(items: Iterable[PipelineConfig | Mapping[str, Any]]) -> list[PipelineConfig]:
    """Normalise a list of configs or config dicts."""
    return [c if isinstance(c, PipelineConfig) else PipelineConfig.from_dict(c) for c in items]
