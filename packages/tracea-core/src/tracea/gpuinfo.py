"""``GPUInfo``: a GPU's tuning-relevant facts, detected from the CUDA backend or taken from presets
(seed: ``GPUInfo::rtx3070()``), so configs can be planned for a GPU that is not in this machine."""

from __future__ import annotations

from dataclasses import dataclass

from .doctor.profile import DeviceProfile
from .ir.device import Device

KB = 1024
MB = 1024 * 1024
GB = 1024 ** 3


@dataclass(frozen=True)
class GPUInfo:
    """Facts about one GPU. ``smem_per_block`` is the opt-in maximum per block in bytes; peaks are
    dense TFLOP/s from vendor datasheets (leads for estimates, not measurements)."""

    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    smem_per_block: int
    smem_per_sm: int
    registers_per_sm: int = 65536
    max_threads_per_block: int = 1024
    warp_size: int = 32
    l2_bytes: int = 0
    memory_bytes: int = 0
    bandwidth_gbs: float = 0.0
    peak_tflops_f16: float = 0.0
    peak_tflops_tf32: float = 0.0
    peak_tflops_f32: float = 0.0
    device_index: int = 0

    @property
    def arch(self) -> str:
        major, minor = self.compute_capability
        return f"sm_{major}{minor}{'a' if (major, minor) == (9, 0) else ''}"

    def to_profile(self) -> DeviceProfile:
        """This GPU as a :class:`DeviceProfile` (``backend="preset"`` unless detected)."""
        isa = ["mma.sync"] if self.compute_capability >= (8, 0) else []
        if self.compute_capability >= (9, 0):
            isa += ["wgmma", "tma", "sm_90a"]
        return DeviceProfile(
            device=Device.cuda(self.device_index), name=self.name, backend="preset", vendor="NVIDIA",
            arch=self.arch, compute_units=self.sm_count, isa=tuple(isa),
            compute_capability=self.compute_capability, warp_size=self.warp_size,
            max_threads_per_block=self.max_threads_per_block, shared_mem_per_block=self.smem_per_block,
            shared_mem_per_sm=self.smem_per_sm, registers_per_block=65536,
            registers_per_sm=self.registers_per_sm, caches={"L2": self.l2_bytes}, memory_bytes=self.memory_bytes,
            peak_gflops={"float16": self.peak_tflops_f16 * 1e3, "bfloat16": self.peak_tflops_f16 * 1e3,
                         "tf32": self.peak_tflops_tf32 * 1e3, "float32": self.peak_tflops_f32 * 1e3},
            bandwidth_gbs=self.bandwidth_gbs)

    @classmethod
    def from_profile(cls, p: DeviceProfile) -> "GPUInfo":
        return cls(name=p.name, compute_capability=tuple(p.compute_capability or (0, 0)),  # type: ignore[arg-type]
                   sm_count=p.compute_units, smem_per_block=p.shared_mem_per_block, smem_per_sm=p.shared_mem_per_sm,
                   registers_per_sm=p.registers_per_sm or 65536, max_threads_per_block=p.max_threads_per_block,
                   warp_size=p.warp_size, l2_bytes=int(p.caches.get("L2", 0)), memory_bytes=p.memory_bytes,
                   bandwidth_gbs=p.bandwidth_gbs, peak_tflops_f16=p.peak("float16") / 1e3,
                   peak_tflops_tf32=p.peak("tf32") / 1e3, peak_tflops_f32=p.peak("float32") / 1e3,
                   device_index=p.device.index)

    @classmethod
    def detect(cls, index: int = 0) -> "GPUInfo | None":
        """The CUDA GPU ``index`` as profiled by an installed CUDA backend, or None when there is none."""
        from .doctor.doctor import get_doctor

        for p in get_doctor().profiles():
            if p.device == Device.cuda(index):
                return cls.from_profile(p)
        return None

    # -- presets (datasheet figures) ---------------------------------------------------------------
    @classmethod
    def rtx3070(cls) -> "GPUInfo":
        return cls("GeForce RTX 3070", (8, 6), 46, 99 * KB, 100 * KB, l2_bytes=4 * MB, memory_bytes=8 * GB,
                   bandwidth_gbs=448, peak_tflops_f16=81.3, peak_tflops_tf32=20.3, peak_tflops_f32=20.3,
                   max_threads_per_block=1024)

    @classmethod
    def rtx4090(cls) -> "GPUInfo":
        return cls("GeForce RTX 4090", (8, 9), 128, 99 * KB, 100 * KB, l2_bytes=72 * MB, memory_bytes=24 * GB,
                   bandwidth_gbs=1008, peak_tflops_f16=165.2, peak_tflops_tf32=82.6, peak_tflops_f32=82.6)

    @classmethod
    def l4(cls) -> "GPUInfo":
        return cls("NVIDIA L4", (8, 9), 58, 99 * KB, 100 * KB, l2_bytes=48 * MB, memory_bytes=24 * GB,
                   bandwidth_gbs=300, peak_tflops_f16=121.0, peak_tflops_tf32=60.0, peak_tflops_f32=30.3)

    @classmethod
    def a100(cls) -> "GPUInfo":
        return cls("NVIDIA A100-SXM4-80GB", (8, 0), 108, 163 * KB, 164 * KB, l2_bytes=40 * MB, memory_bytes=80 * GB,
                   bandwidth_gbs=2039, peak_tflops_f16=312.0, peak_tflops_tf32=156.0, peak_tflops_f32=19.5)

    @classmethod
    def h100(cls) -> "GPUInfo":
        return cls("NVIDIA H100 80GB HBM3", (9, 0), 132, 227 * KB, 228 * KB, l2_bytes=50 * MB, memory_bytes=80 * GB,
                   bandwidth_gbs=3350, peak_tflops_f16=989.0, peak_tflops_tf32=495.0, peak_tflops_f32=67.0)

    @classmethod
    def h200(cls) -> "GPUInfo":
        return cls("NVIDIA H200", (9, 0), 132, 227 * KB, 228 * KB, l2_bytes=60 * MB, memory_bytes=141 * GB,
                   bandwidth_gbs=4800, peak_tflops_f16=989.0, peak_tflops_tf32=495.0, peak_tflops_f32=67.0)

    @classmethod
    def presets(cls) -> dict[str, "GPUInfo"]:
        """Every preset by short name."""
        return {name: getattr(cls, name)() for name in ("rtx3070", "rtx4090", "l4", "a100", "h100", "h200")}
