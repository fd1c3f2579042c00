"""OpenCL devices as Doctor :class:`DeviceProfile` objects (device kind ``opencl``, index = position in
the global enumeration over every platform)."""

from __future__ import annotations

from typing import Any

from tracea.doctor.profile import DeviceProfile
from tracea.ir.device import Device

from . import runtime

# Vendor-specific device queries (cl_nv_device_attribute_query, cl_amd_device_attribute_query).
_CL_DEVICE_WARP_SIZE_NV = 0x4003
_CL_DEVICE_WAVEFRONT_WIDTH_AMD = 0x4043
_CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV = 0x4000
_CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV = 0x4001


#: Extension name fragments worth showing as capability flags (the full list is in ``extras``).
_FLAG_HINTS = ("_fp16", "_fp64", "dot_product", "bfloat16", "_nv_", "_amd_", "matrix", "_mma")
_FLAG_NAMES = {"cl_khr_subgroups", "cl_intel_subgroups"}


def capability_flags(extensions: set[str], kind: str) -> tuple[str, ...]:
    """The extensions kernels may care about, plus an ``opencl:<type>`` tag."""
    keep = {e for e in extensions if e in _FLAG_NAMES or any(h in e for h in _FLAG_HINTS)}
    return tuple(sorted(keep | {f"opencl:{kind}"}))


def device_type(dev: Any) -> str:
    """``"gpu"``, ``"cpu"``, ``"accelerator"`` or ``"other"``."""
    t = runtime.cl().device_type
    if dev.type & t.GPU:
        return "gpu"
    if dev.type & t.CPU:
        return "cpu"
    if dev.type & t.ACCELERATOR:
        return "accelerator"
    return "other"


def _query(dev: Any, param: int) -> int | None:
    try:
        return int(dev.get_info(param))
    except Exception:  # the extension query is not supported by this driver
        return None


def _warp_size(dev: Any, kind: str, extensions: set[str]) -> int:
    if "cl_nv_device_attribute_query" in extensions:
        return _query(dev, _CL_DEVICE_WARP_SIZE_NV) or 32
    if "cl_amd_device_attribute_query" in extensions:
        return _query(dev, _CL_DEVICE_WAVEFRONT_WIDTH_AMD) or 64
    return 1 if kind == "cpu" else 32


def _peak_gflops(dev: Any, kind: str) -> float:
    """A rough fp32 FMA peak for estimates: lanes per compute unit x 2 flops x clock."""
    clock_ghz = (dev.max_clock_frequency or 0) / 1000.0 or 2.5
    if kind == "cpu":
        lanes = max(4, int(dev.native_vector_width_float or 4)) * 2  # two FMA pipes per core
    elif "nvidia" in dev.vendor.lower():
        lanes = 128
    else:
        lanes = 64
    return dev.max_compute_units * lanes * 2 * clock_ghz


def profile(index: int, platform: Any, dev: Any) -> DeviceProfile:
    """The profile of OpenCL device ``index`` (``dev`` on ``platform``)."""
    pcl = runtime.cl()
    kind = device_type(dev)
    extensions = set(dev.extensions.split())
    cc = None
    if "cl_nv_device_attribute_query" in extensions:
        major = _query(dev, _CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV)
        minor = _query(dev, _CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV)
        if major is not None and minor is not None:
            cc = (major, minor)
    local_is_dedicated = dev.local_mem_type == pcl.device_local_mem_type.LOCAL
    peak = _peak_gflops(dev, kind)
    has_fp16 = "cl_khr_fp16" in extensions
    caches = {}
    if dev.global_mem_cache_size:
        caches["global_cache"] = int(dev.global_mem_cache_size)
    return DeviceProfile(
        device=Device.opencl(index), name=dev.name.strip(), backend="opencl", vendor=dev.vendor.strip(),
        arch=f"opencl-{kind}", compute_units=int(dev.max_compute_units),
        isa=capability_flags(extensions, kind), compute_capability=None,
        warp_size=_warp_size(dev, kind, extensions), max_threads_per_block=int(dev.max_work_group_size),
        shared_mem_per_block=int(dev.local_mem_size), caches=caches, memory_bytes=int(dev.global_mem_size),
        peak_gflops={"float32": peak, "float16": peak * (2.0 if has_fp16 and kind == "gpu" else 1.0)},
        bandwidth_gbs=50.0 if kind == "cpu" else 500.0,
        driver_version=dev.driver_version.strip(), runtime_version=platform.version.strip(),
        extras={"platform": platform.name.strip(), "device_type": kind, "device_version": dev.version.strip(),
                "opencl_c_version": getattr(dev, "opencl_c_version", "").strip(),
                "local_memory": "dedicated" if local_is_dedicated else "global",
                "max_clock_mhz": str(dev.max_clock_frequency),
                "native_vector_width_float": str(dev.native_vector_width_float),
                "compute_capability": ".".join(map(str, cc)) if cc else "",
                "extensions": " ".join(sorted(extensions))})


def profiles() -> list[DeviceProfile]:
    """Profiles of every OpenCL device (empty when OpenCL is unusable); never raises."""
    out = []
    for i, (plat, dev) in enumerate(runtime.devices()):
        try:
            out.append(profile(i, plat, dev))
        except Exception:  # a driver that fails a query must not hide the other devices
            continue
    return out


def profile_of(device: Device | int | str | None = None) -> DeviceProfile:
    """The profile of one device (see :func:`runtime.resolve` for the accepted specs)."""
    dev = runtime.resolve(device)
    plat, cl_dev = runtime.devices()[dev.index]
    return profile(dev.index, plat, cl_dev)
