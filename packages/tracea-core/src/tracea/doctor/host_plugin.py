"""Built-in plugin: the host CPU's device profile (``cpu:0``), from :mod:`tracea.doctor.cpu_probe`."""

from __future__ import annotations

from .._version import __version__
from ..ir.device import Device
from ..plugins.backend_info import BackendInfo
from ..plugins.manager import hookimpl
from .cpu_probe import probe_cpu
from .profile import DeviceProfile


def host_profile() -> DeviceProfile:
    """The host CPU as a :class:`DeviceProfile`; ``isa`` holds its SIMD flags plus ``best_isa``."""
    cpu = probe_cpu()
    peak = cpu.peak_gflops_f32()
    return DeviceProfile(
        device=Device.cpu(), name=cpu.model, backend="host", vendor=cpu.vendor, arch=cpu.arch,
        compute_units=cpu.cores, isa=cpu.simd + (f"isa:{cpu.best_isa}",), warp_size=1,
        max_threads_per_block=cpu.cores, caches=dict(cpu.caches),
        # bf16: AVX512_BF16's vdpbf16ps does two products per fp32 lane (measured 2x the FMA rate on Zen 4).
        peak_gflops={"float32": peak, "float64": peak / 2, "float16": peak / 4,
                     "bfloat16": _bf16_peak(cpu, peak)},
        bandwidth_gbs=20.0 * max(1, min(cpu.cores, 8)),
        extras={"logical_cpus": str(cpu.logical_cpus), "best_isa": cpu.best_isa, "microarch": cpu.microarch,
                "isa_summary": cpu.isa_summary, "matrix_isa": cpu.matrix_isa,
                "mhz": f"{cpu.mhz:.0f}" if cpu.mhz else "unknown"})


def _bf16_peak(cpu, peak: float) -> float:
    """bf16 GFLOP/s: AMX 1024 flops per cycle and core; AVX512_BF16 twice the fp32 FMA rate."""
    if cpu.matrix_isa == "amx":
        return cpu.cores * 1024 * (cpu.mhz or 2000.0) / 1000.0
    return peak * 2 if "avx512_bf16" in cpu.simd else peak / 4


@hookimpl
def tracea_device_profiles() -> list[DeviceProfile]:
    return [host_profile()]


@hookimpl
def tracea_backend_info() -> BackendInfo:
    return BackendInfo(name="host", version=__version__, package="tracea-core",
                       details={"role": "host CPU profiler"})
