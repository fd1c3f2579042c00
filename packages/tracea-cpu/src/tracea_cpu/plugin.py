"""Tracea plugin entry point for the cpu package (entry-point group ``tracea``, name ``cpu``).

Importing this module never compiles anything and never fails when no C compiler is installed: the
backend then reports itself unavailable and every variant's ``check`` carries the reason. It sets
``GOMP_SPINCOUNT`` when no OpenMP runtime is loaded yet and the user set none (:mod:`.omp_env`).
"""

from __future__ import annotations

from tracea.plugins import BackendInfo, hookimpl

from ._version import __version__
from .launch_shim import status as launch_status
from .omp_env import apply_spin_default, blas_pool_advice
from .pool import status as pool_status
from .toolchain import OPENMP_FLAG, cache_dir, compiler_or_reason

# The Doctor loads this plugin before tracea-torch's (which imports torch and with it libgomp): set the
# OpenMP spin default now, while Tracea may still be the first to load the runtime (see omp_env).
apply_spin_default()


@hookimpl
def tracea_backend_info() -> BackendInfo:
    cc, why = compiler_or_reason()
    if cc is None:
        return BackendInfo(name="cpu", version=__version__, package="tracea-cpu", available=False, reason=why)
    return BackendInfo(name="cpu", version=__version__, package="tracea-cpu", available=True,
                       details={"compiler": cc.path, "compiler_version": cc.version,
                                "openmp": "yes" if cc.openmp else "no (single-threaded kernels)",
                                "launch_shim": launch_status(), "worker_pool": pool_status(),
                                "blas_pool": blas_pool_advice(),
                                "cache_dir": str(cache_dir())})


@hookimpl
def tracea_register_variants() -> list:
    from .variants import all_variants

    return all_variants()


@hookimpl
def tracea_environment(profile) -> dict | None:
    if profile.device.kind != "cpu":
        return None
    cc, why = compiler_or_reason()
    if cc is None:
        return {"cpu_compiler": "none"}
    return {"cpu_compiler": cc.version, "cpu_openmp": OPENMP_FLAG if cc.openmp else "off"}


@hookimpl
def tracea_kernel_runner(lang: str, device, options: dict):
    """User C kernels for ``tracea.tune_kernel(lang="C")`` (see :mod:`tracea_cpu.user_kernels`)."""
    if lang != "C":
        return None
    from .user_kernels import runner

    return runner(lang, device, options)


@hookimpl
def tracea_perf_data(profile) -> list | None:
    """The measured data of this backend's variants (``perf_data/<arch>.json``) for the performance model."""
    if profile.device.kind != "cpu":
        return None
    from pathlib import Path  # noqa: PLC0415

    return sorted(str(p) for p in (Path(__file__).parent / "perf_data").glob("*.json"))
