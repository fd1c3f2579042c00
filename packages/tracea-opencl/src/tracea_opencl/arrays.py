"""Array adapter for ``pyopencl.array.Array``: lets ``tracea.ops`` accept OpenCL device arrays and lets
the tuner allocate inputs on ``opencl:N`` devices."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tracea.dtypes import DType
from tracea.errors import DTypeError, UnsupportedDeviceError
from tracea.ir.device import Device
from tracea.runtime.arrays import ArrayAdapter, ArrayInfo

from . import inflight, runtime


def is_cl_array(obj: Any) -> bool:
    """True for ``pyopencl.array.Array`` instances, decided without importing pyopencl."""
    for cls in type(obj).__mro__:
        if cls.__name__ == "Array" and cls.__module__ == "pyopencl.array":
            return True
    return False


def queue_of(arr: Any) -> Any:
    """The queue an array's work goes to: its own, else Tracea's shared queue of its device."""
    if arr.queue is not None:
        return arr.queue
    return runtime.context_queue(device_of(arr))[1]


def device_of(arr: Any) -> Device:
    """The ``opencl:N`` device an array lives on."""
    cl_dev = arr.queue.device if arr.queue is not None else arr.context.devices[0]
    return Device.opencl(runtime.index_of(cl_dev))


class PyOpenCLAdapter(ArrayAdapter):
    """``pyopencl.array.Array`` on any OpenCL device."""

    name = "pyopencl"
    priority = 50
    device_kinds = ("opencl",)

    def owns(self, obj: Any) -> bool:
        return is_cl_array(obj)

    def info(self, obj: Any) -> ArrayInfo:
        dtype = DType.parse(obj.dtype, arg="dtype")
        item = obj.dtype.itemsize
        strides = tuple(s // item for s in obj.strides) if all(s % item == 0 for s in obj.strides) else None
        return ArrayInfo(tuple(int(s) for s in obj.shape), strides, dtype, device_of(obj), self.name)

    def empty(self, shape: Sequence[int], dtype: DType, like: Any) -> Any:
        np_dtype = dtype.numpy
        if np_dtype is None:
            raise DTypeError("out_dtype", dtype.value, "a dtype NumPy/pyopencl can store")
        import pyopencl.array as cla  # noqa: PLC0415

        return cla.empty(queue_of(like), tuple(shape), np_dtype)

    def contiguous(self, obj: Any) -> Any:
        if obj.flags.c_contiguous:
            return obj
        # pyopencl has no strided copy kernel for arbitrary views; go through the host (rare path).
        import pyopencl.array as cla  # noqa: PLC0415

        return cla.to_device(queue_of(obj), np.ascontiguousarray(obj.get()))

    def swap_last(self, obj: Any) -> Any:
        axes = list(range(obj.ndim))
        axes[-1], axes[-2] = axes[-2], axes[-1]
        return obj.transpose(axes)

    def reshape(self, obj: Any, shape: Sequence[int]) -> Any:
        return obj.reshape(tuple(shape))

    def to_numpy(self, obj: Any) -> np.ndarray:
        raise UnsupportedDeviceError(f"pyopencl arrays on {device_of(obj)} have no zero-copy host view; "
                                     "use to_host()")

    def to_host(self, obj: Any) -> np.ndarray:
        return obj.get()

    def from_numpy(self, arr: np.ndarray, device: Device) -> Any:
        if device.kind != "opencl":
            raise UnsupportedDeviceError(f"the pyopencl adapter allocates on OpenCL devices, not {device}")
        import pyopencl.array as cla  # noqa: PLC0415

        return cla.to_device(runtime.context_queue(device)[1], np.ascontiguousarray(arr))

    def copy_(self, dst: Any, src: Any) -> None:
        if tuple(dst.shape) != tuple(src.shape) or dst.dtype != src.dtype:
            raise UnsupportedDeviceError("copy_ needs arrays of equal shape and dtype")
        pcl = runtime.cl()
        src_c = self.contiguous(src)
        event = pcl.enqueue_copy(queue_of(dst), dst.base_data, src_c.base_data, byte_count=src_c.nbytes,
                                 dst_offset=dst.offset, src_offset=src_c.offset)
        # The copy runs after this returns; src (often a temporary output of tracea.ops) must outlive it.
        inflight.hold(event, src_c, src)


def to_device(arr: np.ndarray, device: Device | int | str | None = None) -> Any:
    """Copy a NumPy array to an OpenCL device (default: ``$TRACEA_OPENCL_DEVICE``, else the first GPU,
    else device 0) as a ``pyopencl.array.Array`` on Tracea's shared queue of that device."""
    return PyOpenCLAdapter().from_numpy(np.asarray(arr), runtime.resolve(device))
