"""Tracea OpenCL backend: GEMM and implicit-GEMM conv2d kernels rendered per config and run through
pyopencl on any OpenCL device (GPUs without CUDA, CPU runtimes). See README.md.

Public helpers (none imports pyopencl before it is needed)::

    tracea_opencl.status()            # is OpenCL usable here, and if not why
    tracea_opencl.device_profiles()   # every device as a Doctor DeviceProfile (opencl:0, opencl:1 ...)
    tracea_opencl.select_device(spec) # Device for an index / "opencl:N" / name substring / None (default)
    tracea_opencl.to_device(ndarray, device=None)   # a pyopencl array on that device
"""

from ._version import __version__
from .arrays import PyOpenCLAdapter, to_device
from .runtime import DEVICE_ENV, ICD_DIR_ENV, context_queue, status
from .runtime import resolve as select_device


def device_profiles() -> list:
    """Profiles of every OpenCL device (empty without a usable runtime)."""
    from .devices import profiles

    return profiles()


__all__ = ["__version__", "DEVICE_ENV", "ICD_DIR_ENV", "PyOpenCLAdapter", "context_queue", "device_profiles",
           "select_device", "status", "to_device"]
