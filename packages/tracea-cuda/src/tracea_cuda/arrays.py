"""CuPy array adapter, zero-copy views of any CUDA array, and the stream to launch on.

Kernels take raw device pointers, so any array exposing ``__cuda_array_interface__`` or DLPack (CuPy,
torch, JAX, Numba) is used in place. Launches go on the caller's current stream: torch's when the
arrays are torch tensors, CuPy's otherwise.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tracea.dtypes import DType
from tracea.errors import DTypeError, InvalidArgumentError, UnsupportedDeviceError
from tracea.ir.device import Device
from tracea.runtime.arrays import ArrayAdapter, ArrayInfo

from . import toolkit


def _module(obj: Any) -> str:
    return type(obj).__module__.split(".")[0]


class CupyAdapter(ArrayAdapter):
    """``cupy.ndarray`` (device kind ``cuda``)."""

    name = "cupy"
    priority = 50
    device_kinds = ("cuda",)

    def stores(self, dtype: DType) -> bool:
        """CuPy allocates the NumPy dtypes but not bfloat16 or the fp8 formats (no ``ml_dtypes`` support)."""
        return dtype in (DType.F64, DType.F32, DType.TF32, DType.F16, DType.INT8, DType.INT32)

    def owns(self, obj: Any) -> bool:
        return _module(obj) == "cupy" and type(obj).__name__ == "ndarray"

    def info(self, obj: Any) -> ArrayInfo:
        dtype = DType.parse(obj.dtype, arg="dtype")
        item = obj.itemsize
        strides = tuple(s // item for s in obj.strides) if all(s % item == 0 for s in obj.strides) else None
        return ArrayInfo(tuple(obj.shape), strides, dtype, Device("cuda", int(obj.device.id)), self.name)

    def empty(self, shape: Sequence[int], dtype: DType, like: Any) -> Any:
        cp = toolkit.cupy()
        np_dtype = dtype.numpy
        if np_dtype is None:
            raise DTypeError("out_dtype", dtype.value, "a dtype CuPy can allocate (float32/float16)")
        with cp.cuda.Device(like.device.id):
            return cp.empty(tuple(shape), dtype=np_dtype)

    def contiguous(self, obj: Any) -> Any:
        return toolkit.cupy().ascontiguousarray(obj)

    def swap_last(self, obj: Any) -> Any:
        return toolkit.cupy().swapaxes(obj, -1, -2)

    def from_numpy(self, arr: np.ndarray, device: Device) -> Any:
        if device.kind != "cuda":
            raise UnsupportedDeviceError(f"CuPy arrays live on CUDA devices, not {device}")
        cp = toolkit.cupy()
        with cp.cuda.Device(device.index):
            return cp.asarray(arr)

    def to_host(self, obj: Any) -> np.ndarray:
        return toolkit.cupy().asnumpy(obj)

    def copy_(self, dst: Any, src: Any) -> None:
        dst[...] = src

    def data_ptr(self, obj: Any) -> int:
        return obj.data.ptr

    def signature(self, obj: Any) -> Any:
        return obj.shape, obj.strides, obj.dtype, obj.device.id

    def memory_span(self, obj: Any) -> tuple[int, int] | None:
        """Byte range of the array's elements (CuPy strides may be negative)."""
        if obj.size == 0:
            return None
        start = end = int(obj.data.ptr)
        for n, st in zip(obj.shape, obj.strides):
            if st < 0:
                start += (int(n) - 1) * int(st)
            else:
                end += (int(n) - 1) * int(st)
        return start, end + int(obj.itemsize)


def data_ptr(obj: Any, arg: str) -> int:
    """The device address of ``obj``'s first element, for any CUDA array kind, without copying."""
    if obj is None:
        return 0
    mod = _module(obj)
    if mod == "cupy":
        return int(obj.data.ptr)
    if mod == "torch":
        if not obj.is_cuda:
            raise UnsupportedDeviceError(f"argument '{arg}' is a torch tensor on {obj.device}, not a CUDA device")
        return int(obj.data_ptr())
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    if hasattr(obj, "__dlpack__"):
        return int(toolkit.cupy().from_dlpack(obj).data.ptr)
    raise InvalidArgumentError(arg, obj, "a CUDA array (CuPy, torch, or anything with __cuda_array_interface__/DLPack)")


def device_index(obj: Any) -> int:
    mod = _module(obj)
    if mod == "cupy":
        return int(obj.device.id)
    if mod == "torch":
        return int(obj.device.index or 0)
    if hasattr(obj, "__dlpack_device__"):
        return int(obj.__dlpack_device__()[1])
    return 0


_EXTERNAL: dict[tuple[int, int], Any] = {}


def launch_stream(args: Any) -> Any:
    """The stream the caller's framework is issuing on: torch's current stream for torch tensors
    (as a cached CuPy ExternalStream), CuPy's current stream otherwise."""
    cp = toolkit.cupy()
    sample = args.out if getattr(args, "out", None) is not None else next(iter(args.arrays.values()))
    if _module(sample) == "torch":
        import torch  # noqa: PLC0415 - the caller already uses torch

        dev = int(sample.device.index or 0)
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # an int, no Stream object (~3 us less)
        ptr = int(raw(dev)) if raw is not None else int(torch.cuda.current_stream(sample.device).cuda_stream)
        stream = _EXTERNAL.get((ptr, dev))
        if stream is None:
            import warnings  # noqa: PLC0415

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                stream = cp.cuda.ExternalStream(ptr, dev)
            if len(_EXTERNAL) > 256:
                _EXTERNAL.clear()
            _EXTERNAL[(ptr, dev)] = stream
        return stream
    return cp.cuda.get_current_stream()
