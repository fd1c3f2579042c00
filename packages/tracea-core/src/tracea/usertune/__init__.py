"""Tuning the user's own kernels: Kernel Tuner's ``tune_kernel`` / ``run_kernel`` and ``@tracea.kernel``.

- :func:`tune_kernel`, :func:`run_kernel` (:mod:`.interface`): Kernel Tuner's entry points and
  arguments; C, CUDA, OpenCL (and Triton) kernels launched by the backends' runners
  (the ``tracea_kernel_runner`` hook, :mod:`.runner`).
- :func:`kernel` (:mod:`.decorator`): the Tessera-style decorator that describes a kernel once and
  returns a callable that tunes on demand and runs the cached best config.

See docs/kernel_tuner.md.
"""

from __future__ import annotations

from .interface import run_kernel, tune_kernel

__all__ = ["KernelLaunch", "kernel", "run_kernel", "tune_kernel", "TunableKernel"]


def __getattr__(name: str):  # noqa: ANN202 - PEP 562 lazy attributes
    if name in ("kernel", "TunableKernel", "KernelLaunch"):
        from . import decorator

        return getattr(decorator, name)
    raise AttributeError(name)
