"""Tracea plugin entry point for the OpenCL backend (entry-point group ``tracea``, name ``opencl``).

Importing this module never imports pyopencl; every hook degrades to "unavailable, with a reason"
when pyopencl or an OpenCL platform is missing.
"""

from __future__ import annotations

from typing import Any

from tracea.plugins import BackendInfo, hookimpl

from . import runtime
from ._version import __version__


@hookimpl
def tracea_backend_info() -> BackendInfo:
    st = runtime.status()
    if not st.available:
        return BackendInfo(name="opencl", version=__version__, package="tracea-opencl", available=False,
                           reason=st.reason, details={"pyopencl": st.pyopencl_version or "not installed"})
    details = {"pyopencl": st.pyopencl_version}
    for i, (plat, dev) in enumerate(runtime.devices()):
        details[f"opencl:{i}"] = f"{dev.name.strip()} ({plat.name.strip()}, driver {dev.driver_version.strip()})"
    return BackendInfo(name="opencl", version=__version__, package="tracea-opencl", available=True,
                       details=details)


@hookimpl
def tracea_register_variants() -> list:
    from .conv2d import OpenCLConv2d
    from .gemm import OpenCLGemm

    return [OpenCLGemm(), OpenCLConv2d()]


@hookimpl
def tracea_device_profiles() -> list:
    from .devices import profiles

    return profiles()


@hookimpl
def tracea_array_adapters() -> list:
    from .arrays import PyOpenCLAdapter

    return [PyOpenCLAdapter()]


@hookimpl
def tracea_environment(profile: Any) -> dict[str, str] | None:
    if profile.device.kind != "opencl" or not runtime.status().available:
        return None
    try:
        plat = runtime.platform_of(profile.device)
        dev = runtime.cl_device(profile.device)
    except Exception:  # the profile came from another process/machine: nothing to add
        return None
    return {"opencl_platform": f"{plat.name.strip()} {plat.version.strip()}",
            "opencl_driver": dev.driver_version.strip(), "opencl_device_version": dev.version.strip(),
            "pyopencl": runtime.status().pyopencl_version, "tracea_opencl": __version__}


@hookimpl
def tracea_synchronize(device: Any) -> None:
    if device.kind == "opencl" and runtime.status().available:
        runtime.finish(device)


@hookimpl
def tracea_measure(variant: Any, op: Any, config: Any, args: Any, profile: Any, warmup: int,
                   repeats: int) -> list[float] | None:
    """Times OpenCL variants with profiling events when the output's queue has profiling enabled."""
    if getattr(variant, "backend", None) != "opencl" or not hasattr(variant, "launch"):
        return None
    from .timing import measure_events

    return measure_events(variant, op, config, args, profile, warmup, repeats)


@hookimpl
def tracea_kernel_runner(lang: str, device: Any, options: dict) -> Any:
    """User OpenCL kernels for ``tracea.tune_kernel(lang="OpenCL")`` (pyopencl)."""
    if lang != "OPENCL":
        return None
    from .user_kernels import runner

    return runner(lang, device, options)
