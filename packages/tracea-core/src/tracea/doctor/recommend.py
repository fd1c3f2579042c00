"""Which backend packages suit this machine: ``tracea doctor``'s "Recommended backends" section and the
one-time :class:`~tracea.errors.ReferenceBackendWarning` of a core-only install.

The facts are cheap and need no backend: an NVIDIA driver (``/proc/driver/nvidia`` or ``nvidia-smi``),
an OpenCL ICD registry (``/etc/OpenCL/vendors``), a C compiler on ``PATH``, and whether torch imports.
A package is recommended when the hardware or library is there and no installed plugin serves it yet.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import sys
import threading
import warnings
from dataclasses import asdict, dataclass
from types import FrameType
from typing import Any

from ..errors import ReferenceBackendWarning

#: the package and pip line per device kind
PACKAGES = {
    "cpu": ("tracea-cpu", "pip install tracea-cpu"),
    "cuda": ("tracea-cuda", "pip install 'tracea-cuda[cuda13]'  (or [cuda12] for a CUDA 12 driver)"),
    "opencl": ("tracea-opencl", "pip install tracea-opencl"),
}


@dataclass(frozen=True)
class Recommendation:
    """One package to install: ``package``, why it suits this machine, and the ``install`` command."""

    package: str
    why: str
    install: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def nvidia_driver_present() -> bool:
    """Whether this machine has an NVIDIA driver (so a CUDA GPU), without importing CuPy."""
    return os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is not None


def opencl_icds() -> list[str]:
    """Installed OpenCL ICD files (Linux registry), empty when none or not Linux."""
    folder = os.environ.get("OCL_ICD_VENDORS") or "/etc/OpenCL/vendors"
    return sorted(glob.glob(os.path.join(folder, "*.icd"))) if os.path.isdir(folder) else []


def c_compiler() -> str | None:
    """The first C compiler on PATH (``$CC``, cc, gcc, clang), or None."""
    for cc in ([os.environ["CC"]] if os.environ.get("CC") else []) + ["cc", "gcc", "clang"]:
        path = shutil.which(cc.split()[0])
        if path:
            return path
    return None


def served_kinds(doctor: Any) -> set[str]:
    """Device kinds that an installed backend other than the NumPy reference serves."""
    return {v.device_kind for v in doctor.variants() if v.backend != "reference"}


def recommendations(doctor: Any) -> list[Recommendation]:
    """The backend packages worth installing on this machine, most useful first."""
    served = served_kinds(doctor)
    out: list[Recommendation] = []
    if "cuda" not in served and nvidia_driver_present():
        out.append(Recommendation("tracea-cuda", "an NVIDIA driver is present: Tensor Core GEMM and conv2d "
                                  "(needs CuPy, which the extra installs)", PACKAGES["cuda"][1]))
    if "cpu" not in served:
        cc = c_compiler()
        why = ("no CPU backend is installed, so CPU calls run on the NumPy reference (GEMM through NumPy's BLAS, "
               "conv2d and attention in float64); SIMD kernels for this CPU")
        why += f" (C compiler: {cc})" if cc else " (needs a C compiler: none found on PATH; install gcc or clang)"
        out.append(Recommendation("tracea-cpu", why, PACKAGES["cpu"][1]))
    if "opencl" not in served and "cuda" not in served and not nvidia_driver_present() and opencl_icds():
        out.append(Recommendation("tracea-opencl", f"an OpenCL runtime is registered ({len(opencl_icds())} ICD "
                                  "file(s)): portable GEMM and conv2d on its devices", PACKAGES["opencl"][1]))
    if importlib.util.find_spec("torch") is not None and importlib.util.find_spec("tracea_torch") is None:
        out.append(Recommendation("tracea-torch", "torch is installed: Tracea ops on tensors and patched "
                                  "conv/linear layers", "pip install tracea-torch"))
    return out


_warned: set[str] = set()
_warn_lock = threading.Lock()


def warn_reference_only(doctor: Any, kind: str, device_kind: str, variant: str) -> None:
    """Once per process and device kind: say that ``kind`` ops run on the reference backend because no
    backend for ``device_kind`` is installed, and which package to install."""
    if device_kind in _warned:
        return
    with _warn_lock:
        if device_kind in _warned or device_kind in served_kinds(doctor):
            return
        _warned.add(device_kind)
    package, install = PACKAGES.get(device_kind, ("a Tracea backend", "see `tracea doctor`"))
    warnings.warn(f"tracea: no compute backend for {device_kind} is installed, so {kind} runs on the NumPy "
                  f"reference backend ({variant}; GEMM uses NumPy's BLAS, conv2d and attention are float64 "
                  f"and slow). Install {package} for real kernels: {install}. `tracea doctor` lists the backends "
                  f"that suit this machine.", ReferenceBackendWarning, stacklevel=_caller_level())


def _caller_level() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside the ``tracea`` package."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(root + os.sep):
        frame, level = frame.f_back, level + 1
    return level
