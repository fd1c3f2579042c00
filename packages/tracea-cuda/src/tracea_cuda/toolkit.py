"""Lazy access to CuPy and the CUDA runtime. Importing this module never imports CuPy.

:func:`status` says whether the backend can run here and, if not, why; every variant's ``check``
returns that reason so ``tracea doctor`` shows it instead of a crash.
"""

from __future__ import annotations

import functools
from typing import Any

from tracea.errors import UnsupportedDeviceError

INSTALL_HINT = "pip install tracea-cuda[cuda13] (or [cuda12]) to get CuPy"


@functools.lru_cache(maxsize=1)
def _load() -> tuple[Any, str]:
    try:
        import cupy  # noqa: PLC0415 - lazy by design
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        return None, f"cupy is not importable ({type(exc).__name__}: {exc}); {INSTALL_HINT}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return None, f"no usable CUDA driver/GPU ({type(exc).__name__}: {exc})"
    if count < 1:
        return None, "no CUDA GPU found"
    return cupy, ""


def status() -> tuple[bool, str]:
    """(available, reason): reason is empty when CuPy and at least one GPU work."""
    mod, reason = _load()
    return mod is not None, reason


def cupy() -> Any:
    """The CuPy module; raises :class:`UnsupportedDeviceError` with the reason when unusable."""
    mod, reason = _load()
    if mod is None:
        raise UnsupportedDeviceError(f"the CUDA backend is unavailable: {reason}")
    return mod


def device_count() -> int:
    ok, _ = status()
    return cupy().cuda.runtime.getDeviceCount() if ok else 0


@functools.lru_cache(maxsize=None)
def compute_capability(index: int = 0) -> tuple[int, int]:
    rt = cupy().cuda.runtime
    props = rt.getDeviceProperties(index)
    return int(props["major"]), int(props["minor"])


def arch_name(cc: tuple[int, int]) -> str:
    """The NVRTC target for ``cc``: ``sm_90a`` on Hopper (wgmma/setmaxnreg), else ``sm_XY``."""
    major, minor = cc
    return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


@functools.lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    """Driver, runtime, NVRTC and CuPy versions as strings (empty when unknown)."""
    out = {"cupy": "", "driver": "", "runtime": "", "nvrtc": ""}
    ok, _ = status()
    if not ok:
        return out
    cp = cupy()
    out["cupy"] = str(cp.__version__)
    try:
        out["driver"] = _fmt(cp.cuda.runtime.driverGetVersion())
        out["runtime"] = _fmt(cp.cuda.runtime.runtimeGetVersion())
    except Exception:
        pass
    try:
        from cupy.cuda import nvrtc  # noqa: PLC0415

        major, minor = nvrtc.getVersion()
        out["nvrtc"] = f"{major}.{minor}"
    except Exception:
        pass
    return out


def _fmt(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"
