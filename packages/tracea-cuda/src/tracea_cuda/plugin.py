"""Tracea plugin entry point for the cuda package (entry-point group ``tracea``, name ``cuda``).

Importing this module never imports CuPy; every hook degrades to "unavailable, with a reason".
"""

from __future__ import annotations

from typing import Any

from tracea.plugins import BackendInfo, hookimpl

from . import toolkit
from ._version import __version__


@hookimpl
def tracea_backend_info() -> BackendInfo:
    ok, reason = toolkit.status()
    details: dict[str, str] = {}
    if ok:
        details = {k: v for k, v in toolkit.versions().items() if v}
        details["devices"] = str(toolkit.device_count())
    return BackendInfo(name="cuda", version=__version__, package="tracea-cuda", available=ok, reason=reason,
                       details=details)


@hookimpl
def tracea_register_variants() -> list:
    from .variants import all_variants  # noqa: PLC0415

    return all_variants()


@hookimpl
def tracea_device_profiles() -> list:
    from .device import profiles  # noqa: PLC0415

    return profiles()


@hookimpl
def tracea_array_adapters() -> list:
    from .arrays import CupyAdapter  # noqa: PLC0415

    return [CupyAdapter()]


@hookimpl
def tracea_environment(profile: Any) -> dict[str, str] | None:
    if profile.device.kind != "cuda":
        return None
    v = toolkit.versions()
    cc = profile.compute_capability
    return {"cuda.cc": f"{cc[0]}.{cc[1]}" if cc else "", "cuda.driver": v["driver"], "cuda.runtime": v["runtime"],
            "cuda.nvrtc": v["nvrtc"], "cuda.cupy": v["cupy"]}


@hookimpl
def tracea_synchronize(device: Any) -> None:
    if device.kind != "cuda" or not toolkit.status()[0]:
        return
    cp = toolkit.cupy()
    with cp.cuda.Device(device.index):
        cp.cuda.runtime.deviceSynchronize()


@hookimpl
def tracea_measure(variant: Any, op: Any, config: Any, args: Any, profile: Any, warmup: int,
                   repeats: int) -> list[float] | None:
    if getattr(variant, "backend", "") != "cuda":
        return None
    from .measure import measure  # noqa: PLC0415

    return measure(variant, op, config, args, profile, warmup, repeats)


@hookimpl
def tracea_kernel_runner(lang: str, device: Any, options: dict) -> Any:
    """User CUDA kernels (CuPy/NVRTC) and Triton kernels for ``tracea.tune_kernel``."""
    if lang not in ("CUDA", "TRITON"):
        return None
    from .user_kernels import runner

    return runner(lang, device, options)


@hookimpl
def tracea_perf_data(profile: Any) -> list[str] | None:
    """The measured data of this backend's variants (``perf_data/<arch>.json``) for the performance model."""
    if profile.device.kind != "cuda":
        return None
    from pathlib import Path  # noqa: PLC0415

    return sorted(str(p) for p in (Path(__file__).parent / "perf_data").glob("*.json"))
