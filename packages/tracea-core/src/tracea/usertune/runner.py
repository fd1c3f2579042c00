"""What a backend provides to run *user* kernels: the :class:`KernelRunner` protocol and its lookup.

A runner is returned by the ``tracea_kernel_runner`` hook for one language. The core
(:mod:`tracea.usertune.tuning`) never touches CuPy, pyopencl or a compiler itself; it asks the runner
to copy the arguments, compile one instance of the kernel, launch it, time it and read results back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from ..errors import InvalidArgumentError, UnsupportedDeviceError

#: languages and the plugin that serves each (for the error when none answers)
LANGS = {"C": "tracea-cpu (and a C/C++ compiler)", "CUDA": "tracea-cuda with CuPy (pip install tracea-cuda[cuda13])",
         "OPENCL": "tracea-opencl with pyopencl and an OpenCL runtime",
         "TRITON": "tracea-cuda, torch and triton on an NVIDIA GPU"}


@dataclass
class Launch:
    """One kernel instance: its name, source (defines already prepended), launch geometry and options."""

    name: str
    source: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    params: dict[str, Any]
    compiler_options: tuple[str, ...] = ()
    smem_bytes: int = 0
    cmem_args: dict[str, Any] = field(default_factory=dict)
    #: the original source object (a Triton JITFunction for lang TRITON)
    origin: Any = None


class KernelRunner(Protocol):
    """A backend's launcher of user kernels (one language, one device).

    ``device_name``: shown in results and keyed in Kernel Tuner's cache. ``max_threads``: largest
    thread block (product of the block dimensions); configs beyond it are skipped like in Kernel
    Tuner. ``profile``: the :class:`~tracea.doctor.profile.DeviceProfile` the tuning cache
    fingerprints. ``returns_time``: True when the kernel returns its own time (C).
    """

    lang: str
    device_name: str
    max_threads: int
    profile: Any
    returns_time: bool

    def environment(self) -> dict[str, str]:
        """Facts that make a timing valid here (compiler, driver versions); merged into the env dict."""

    def prepare_arguments(self, arguments: Sequence[Any], inplace: bool = False) -> Any:
        """Check ``arguments`` (raise :class:`~tracea.errors.InvalidArgumentError` naming the index) and
        make them launchable. By default private copies (the caller's arrays stay untouched, as tuning
        must not write them); ``inplace=True`` launches on the caller's arrays where the device can
        (then :meth:`copy_back` writes the rest), for ``@tracea.kernel`` calls."""

    def compile(self, launch: Launch) -> Any:
        """Compile ``launch``; raise :class:`~tracea.errors.CompilationError` with the log on failure."""

    def reset_arguments(self, args: Any) -> None:
        """Restore every argument to the caller's original values (before a checked run)."""

    def run(self, kernel: Any, args: Any, launch: Launch) -> float | None:
        """Launch once and wait; return the kernel's own time in ms for runners with ``returns_time``."""

    def benchmark(self, kernel: Any, args: Any, launch: Launch, iterations: int) -> list[float]:
        """``iterations`` timed launches (after one untimed); times in ms."""

    def results(self, args: Any, only: Sequence[int] | None = None) -> list[Any]:
        """Host (NumPy) copies of every argument's current contents (scalars as they are); with
        ``only``, the other positions may hold None (skips copies nobody checks)."""

    def copy_back(self, args: Any) -> None:
        """After an ``inplace`` run: write results into caller arrays that were not launched on directly."""

    def close(self) -> None:
        """Release compiled modules and device buffers."""


def normalize_lang(lang: Any, source_text: str | None) -> str:
    """Kernel Tuner's ``lang`` (case-insensitive), or the language detected from the source."""
    if lang is None:  # Kernel Tuner's detection: __global__ -> CUDA, __kernel -> OpenCL, else C
        text = (source_text or "").lower()
        if "__global__" in text:
            return "CUDA"
        if "__kernel" in text:
            return "OPENCL"
        return "C"
    if not isinstance(lang, str):
        raise InvalidArgumentError("lang", lang, "'CUDA', 'C', 'OpenCL' or 'Triton'")
    up = lang.strip().upper()
    if up == "CUPY":
        up = "CUDA"
    if up not in LANGS:
        from ..errors import UnsupportedOptionError

        raise UnsupportedOptionError("lang", f"{lang!r} is not supported; use one of 'CUDA', 'C', 'OpenCL', 'Triton' "
                                             "(HIP, Fortran and Julia kernels are not)")
    return up


def get_runner(lang: str, device: Any = None, options: dict[str, Any] | None = None, pm: Any = None) -> KernelRunner:
    """The runner a plugin provides for ``lang``; :class:`UnsupportedDeviceError` saying what to install.

    ``options``: runner options from the call (``platform`` for OpenCL, ``compiler`` for C)."""
    if pm is None:
        from ..plugins.manager import get_plugin_manager

        pm = get_plugin_manager()
    runner = pm.hook.tracea_kernel_runner(lang=lang, device=device, options=dict(options or {}))
    if runner is None:
        raise UnsupportedDeviceError(f"no installed backend runs {lang} kernels; install {LANGS[lang]}")
    return runner
