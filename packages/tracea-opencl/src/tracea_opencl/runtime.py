"""The OpenCL runtime as Tracea sees it: a lazily imported pyopencl, every platform's devices in one
global order (``opencl:0``, ``opencl:1`` ...), one shared context and profiling queue per device, and
device selection by index or name.

Nothing here imports pyopencl at module import time; :func:`status` says whether OpenCL is usable and,
if not, why (pyopencl missing, no platform, a broken driver).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tracea.errors import InvalidArgumentError, UnsupportedDeviceError
from tracea.ir.device import Device

#: Selects the default OpenCL device: an index (``1``, ``opencl:1``) or a case-insensitive substring of
#: the device or platform name (``H200``, ``Intel``).
DEVICE_ENV = "TRACEA_OPENCL_DEVICE"
#: A directory of ``.icd`` files (written by ``ci/setup_opencl_runtime.sh``); copied into
#: ``OCL_ICD_VENDORS`` before the first OpenCL call when that variable is unset.
ICD_DIR_ENV = "TRACEA_OPENCL_ICD_DIR"
SETUP_HINT = ("install an OpenCL driver, or the Intel CPU runtime from PyPI with "
              "packages/tracea-opencl/ci/setup_opencl_runtime.sh and export the lines it prints")

_lock = threading.RLock()


@dataclass(frozen=True)
class Status:
    """Whether OpenCL can run here; ``reason`` says why not."""

    available: bool
    reason: str = ""
    pyopencl_version: str = ""


def _apply_icd_env() -> None:
    icd_dir = os.environ.get(ICD_DIR_ENV)
    if icd_dir and not os.environ.get("OCL_ICD_VENDORS") and not os.environ.get("OCL_ICD_FILENAMES"):
        os.environ["OCL_ICD_VENDORS"] = icd_dir


def cl() -> Any:
    """The ``pyopencl`` module (imported on first use).

    :raises UnsupportedDeviceError: when pyopencl is not installed.
    """
    _apply_icd_env()
    try:
        import pyopencl  # noqa: PLC0415 - optional toolkit, imported lazily
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise UnsupportedDeviceError(f"pyopencl is not installed ({exc}): pip install pyopencl") from exc
    return pyopencl


@lru_cache(maxsize=1)
def _enumerate() -> tuple[tuple[Any, Any], ...] | str:
    """Every (platform, device) pair in global order, or the reason there are none."""
    try:
        pcl = cl()
    except UnsupportedDeviceError as exc:
        return str(exc)
    try:
        platforms = pcl.get_platforms()
    except Exception as exc:  # pyopencl raises LogicError(PLATFORM_NOT_FOUND_KHR) when the loader finds none
        return f"no OpenCL platform found ({exc}); {SETUP_HINT}"
    pairs: list[Any] = []
    errors = []
    for plat in platforms:
        try:
            pairs.extend((plat, dev) for dev in plat.get_devices())
        except Exception as exc:  # a platform with no devices raises DEVICE_NOT_FOUND
            errors.append(f"{plat.name}: {exc}")
    if not pairs:
        return "OpenCL platforms have no devices (" + "; ".join(errors or ["none listed"]) + f"); {SETUP_HINT}"
    return tuple(pairs)


def status() -> Status:
    """Whether any OpenCL device is usable, with the reason when not."""
    found = _enumerate()
    version = ""
    try:
        version = cl().VERSION_TEXT
    except UnsupportedDeviceError:
        pass
    if isinstance(found, str):
        return Status(False, found, version)
    return Status(True, "", version)


def devices() -> list[tuple[Any, Any]]:
    """The (pyopencl platform, pyopencl device) pairs; position = Tracea device index. Empty when none."""
    found = _enumerate()
    return [] if isinstance(found, str) else list(found)


def cl_device(device: Device | int | str) -> Any:
    """The pyopencl device behind ``opencl:<index>``."""
    index = resolve(device).index
    return devices()[index][1]


def platform_of(device: Device | int | str) -> Any:
    """The pyopencl platform of ``opencl:<index>``."""
    return devices()[resolve(device).index][0]


def index_of(cl_dev: Any) -> int:
    """The Tracea index of a pyopencl device (matched by its handle)."""
    ptr = cl_dev.int_ptr
    for i, (_, d) in enumerate(devices()):
        if d.int_ptr == ptr:
            return i
    for i, (_, d) in enumerate(devices()):  # some ICDs hand out fresh handles: fall back to identity facts
        ident = (cl_dev.name, cl_dev.platform.name, cl_dev.driver_version)
        if (d.name, d.platform.name, d.driver_version) == ident:
            return i
    raise UnsupportedDeviceError(f"OpenCL device '{cl_dev.name}' is not among the enumerated devices")


def resolve(spec: Device | int | str | None = None) -> Device:
    """The :class:`Device` for ``spec``: a Device, an index, ``"opencl:N"``, a name substring, or None for
    the default (``$TRACEA_OPENCL_DEVICE``, else the first GPU, else device 0).

    :raises UnsupportedDeviceError: when OpenCL has no device.
    :raises InvalidArgumentError: when ``spec`` matches no device.
    """
    pairs = devices()
    if not pairs:
        raise UnsupportedDeviceError(f"no OpenCL device: {status().reason}")
    if spec is None:
        env = os.environ.get(DEVICE_ENV, "").strip()
        if env:
            return resolve(env)
        pcl = cl()
        for i, (_, d) in enumerate(pairs):
            if d.type & pcl.device_type.GPU:
                return Device.opencl(i)
        return Device.opencl(0)
    if isinstance(spec, Device):
        if spec.kind != "opencl":
            raise InvalidArgumentError("device", str(spec), "an OpenCL device ('opencl:N')")
        index = spec.index
    elif isinstance(spec, int) and not isinstance(spec, bool):
        index = spec
    elif isinstance(spec, str):
        text = spec.strip()
        low = text.lower()
        if low.startswith("opencl:"):
            low = low[len("opencl:"):]
        if low.isdigit():
            index = int(low)
        else:
            hits = [i for i, (p, d) in enumerate(pairs) if low in d.name.lower() or low in p.name.lower()]
            if not hits:
                names = ", ".join(f"{i}: {d.name} ({p.name})" for i, (p, d) in enumerate(pairs))
                raise InvalidArgumentError("device", spec, f"an index or a name matching one of [{names}]")
            index = hits[0]
    else:
        raise InvalidArgumentError("device", spec, "an index, 'opencl:N', a device name or a Device")
    if not 0 <= index < len(pairs):
        raise InvalidArgumentError("device", spec, f"an OpenCL device index below {len(pairs)}")
    return Device.opencl(index)


_contexts: dict[int, tuple[Any, Any]] = {}
_user_queues: dict[int, dict[int, Any]] = {}


def context_queue(device: Device | int | str | None = None) -> tuple[Any, Any]:
    """The shared (context, in-order profiling queue) Tracea uses for ``device``."""
    dev = resolve(device)
    with _lock:
        if dev.index not in _contexts:
            pcl = cl()
            cl_dev = cl_device(dev)
            ctx = pcl.Context([cl_dev])
            queue = pcl.CommandQueue(ctx, cl_dev, properties=pcl.command_queue_properties.PROFILING_ENABLE)
            _contexts[dev.index] = (ctx, queue)
        return _contexts[dev.index]


def note_queue(index: int, queue: Any) -> None:
    """Remember a user's queue that received Tracea work, so :func:`finish` can wait for it."""
    with _lock:
        _user_queues.setdefault(index, {})[queue.int_ptr] = queue


def finish(device: Device) -> None:
    """Block until every queue Tracea used on ``device`` is idle."""
    if device.kind != "opencl":
        return
    with _lock:
        queues = list(_user_queues.get(device.index, {}).values())
        shared = _contexts.get(device.index)
    if shared is not None:
        queues.append(shared[1])
    for q in queues:
        q.finish()
