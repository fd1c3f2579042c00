"""Device profiles: what a device can do, as plain data.

Backends contribute :class:`DeviceProfile` objects through the ``tracea_device_profiles`` hook; the
core contributes the host CPU's. Capabilities are data (ISA flags, shared memory, registers), never
``if backend == ...`` branches in shared code.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from ..ir.device import Device


@dataclass(frozen=True, eq=True)
class DeviceProfile:
    """Capabilities and identity of one device.

    :param device: the device this describes (``cpu:0``, ``cuda:0``, ``opencl:1``).
    :param name: marketing/model name (``"NVIDIA H200"``, ``"AMD EPYC 9B45"``).
    :param backend: the plugin that contributed this profile (``"core"`` for the host CPU).
    :param vendor: vendor name.
    :param arch: architecture (``"x86_64"``, ``"aarch64"``, ``"sm_90a"``, OpenCL device type).
    :param compute_units: CPU cores usable by this process, CUDA SMs, or OpenCL compute units.
    :param isa: capability flags (``"avx512f"``, ``"fma"``, ``"neon"``; ``"wgmma"``, ``"tma"``; OpenCL extensions).
    :param compute_capability: CUDA (major, minor), else None.
    :param warp_size: threads per warp/wavefront/SIMD group (1 on CPUs).
    :param max_threads_per_block: threads per block / work-group limit.
    :param shared_mem_per_block: bytes of shared/local memory one block may use (opt-in maximum).
    :param shared_mem_per_sm: bytes of shared memory per SM.
    :param registers_per_block: 32-bit registers one block may use.
    :param registers_per_sm: 32-bit registers per SM.
    :param caches: cache sizes in bytes by level name (``{"L1d": 49152, "L2": 1048576, "L3": ...}``).
    :param memory_bytes: device (or host) memory size.
    :param peak_gflops: estimated peak GFLOP/s by dtype name (``{"float32": 530.0}``), for estimates.
    :param bandwidth_gbs: estimated memory bandwidth in GB/s.
    :param driver_version: driver version string (GPU) or empty.
    :param runtime_version: toolkit/runtime version (CUDA, NVRTC, OpenCL platform) or empty.
    :param extras: any further facts a backend wants shown or fingerprinted (strings).
    """

    device: Device
    name: str
    backend: str = "core"
    vendor: str = ""
    arch: str = ""
    compute_units: int = 1
    isa: tuple[str, ...] = ()
    compute_capability: tuple[int, int] | None = None
    warp_size: int = 1
    max_threads_per_block: int = 1
    shared_mem_per_block: int = 0
    shared_mem_per_sm: int = 0
    registers_per_block: int = 0
    registers_per_sm: int = 0
    caches: Mapping[str, int] = field(default_factory=dict)
    memory_bytes: int = 0
    peak_gflops: Mapping[str, float] = field(default_factory=dict)
    bandwidth_gbs: float = 0.0
    driver_version: str = ""
    runtime_version: str = ""
    extras: Mapping[str, str] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash((self.device, self.name, self.backend))

    def has(self, *flags: str) -> bool:
        """True when every flag is in :attr:`isa` (case-insensitive)."""
        have = {f.lower() for f in self.isa}
        return all(f.lower() in have for f in flags)

    def peak(self, dtype: str = "float32") -> float:
        """Peak GFLOP/s for ``dtype`` (falls back to float32's, then 1.0)."""
        return float(self.peak_gflops.get(dtype) or self.peak_gflops.get("float32") or 1.0)

    def fingerprint_fields(self) -> dict[str, Any]:
        """The facts that make a tuning result valid: identity, architecture, ISA, driver and runtime."""
        return {"name": self.name, "backend": self.backend, "arch": self.arch,
                "compute_capability": list(self.compute_capability) if self.compute_capability else None,
                "isa": sorted(self.isa), "compute_units": self.compute_units,
                "driver": self.driver_version, "runtime": self.runtime_version}

    def fingerprint(self) -> str:
        """A short stable hash of :meth:`fingerprint_fields`."""
        text = json.dumps(self.fingerprint_fields(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Device):
                v = str(v)
            elif isinstance(v, tuple):
                v = list(v)
            elif isinstance(v, Mapping):
                v = dict(v)
            out[f.name] = v
        return out

    def with_(self, **changes: Any) -> "DeviceProfile":
        """A copy with some fields changed."""
        return replace(self, **changes)
