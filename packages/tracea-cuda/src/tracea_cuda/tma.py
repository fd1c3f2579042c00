"""TMA tensor maps (``cuTensorMapEncodeTiled`` through ctypes on libcuda) and kernel launches with
by-value ``__grid_constant__`` tensor-map parameters (``cuLaunchKernel`` through CuPy's driver module).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any, Sequence

from tracea.dtypes import DType
from tracea.errors import BackendError, LaunchError

from . import toolkit

# CUtensorMapDataType / Swizzle / L2 promotion enum values (cuda.h).
_DTYPE = {DType.F16: 6, DType.F32: 7, DType.BF16: 9}
SWIZZLE_128B = 3
L2_PROMO_256B = 3


class TensorMap(ctypes.Structure):
    """``CUtensorMap``: 128 opaque bytes, 64-byte aligned when passed by value."""

    _fields_ = [("opaque", ctypes.c_uint64 * 16)]


@functools.lru_cache(maxsize=1)
def _libcuda() -> Any:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise BackendError(f"cannot load libcuda.so.1 for TMA descriptors: {exc}", backend="cuda") from None
    fn = lib.cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(TensorMap), ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                   ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return lib


def tiled_map(ptr: int, dtype: DType, dims: Sequence[int], box: Sequence[int], pitch: int | None = None,
              strides: Sequence[int] | None = None) -> TensorMap:
    """A 128B-swizzled tiled tensor map of a row-major tensor, packed but for its rows.

    :param dims: sizes innermost first (for a (batch, rows, cols) array: ``(cols, rows, batch)``).
    :param box: box sizes innermost first; the innermost box must span at most 128 bytes.
    :param pitch: elements from one row to the next (default ``dims[0]``; its bytes must be a multiple
        of 16); the outer dimensions are packed over rows of that pitch.
    :param strides: instead of ``pitch``, the element strides of ``dims[1:]`` (innermost dim unit-stride;
        each stride's bytes a multiple of 16; a dimension of size 1 may give 0).
    """
    rank = len(dims)
    item = dtype.itemsize
    g_dim = (ctypes.c_uint64 * rank)(*dims)
    if strides is not None:  # a size-1 dim's stride is never used; TMA still wants a valid one
        strides = [(int(st) or int(dims[0])) * item for st in strides]
    else:
        strides, acc = [], item
        for i, d in enumerate(dims[:-1]):
            acc *= pitch if i == 0 and pitch is not None else d
            strides.append(acc)
    g_stride = (ctypes.c_uint64 * max(rank - 1, 1))(*strides)
    b_dim = (ctypes.c_uint32 * rank)(*box)
    e_str = (ctypes.c_uint32 * rank)(*([1] * rank))
    out = TensorMap()
    rc = _libcuda().cuTensorMapEncodeTiled(ctypes.byref(out), _DTYPE[dtype], rank, ctypes.c_void_p(ptr), g_dim,
                                           g_stride, b_dim, e_str, 0, SWIZZLE_128B, L2_PROMO_256B, 0)
    if rc != 0:
        raise LaunchError(f"cuTensorMapEncodeTiled failed with CUresult {rc} (dims={tuple(dims)}, box={tuple(box)}, "
                          f"ptr=0x{ptr:x})", backend="cuda")
    return out


class _LaunchAttr(ctypes.Structure):
    """``CUlaunchAttribute``: an id and a 64-byte value union (cluster dims use its first 12 bytes)."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_int), ("value", ctypes.c_uint32 * 16)]


class _LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (cuda.h)."""

    _fields_ = [("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3), ("smem", ctypes.c_uint32),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttr)), ("num_attrs", ctypes.c_uint32)]


_CLUSTER_DIMENSION = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
_ACTIVE_CLUSTERS: dict[tuple[int, int, int, int], int] = {}


def max_active_clusters(function: Any, cluster: int, block: int, smem: int, fallback: int) -> int:
    """How many ``cluster``-CTA clusters of ``function`` can be resident at once
    (``cuOccupancyMaxActiveClusters``): the persistent grid must not exceed it, or the clusters past it
    run as a second wave. ``fallback`` when the driver cannot say."""
    key = (int(function.ptr), cluster, block, smem)
    if key not in _ACTIVE_CLUSTERS:
        count = fallback
        try:
            fn = _libcuda().cuOccupancyMaxActiveClusters
            fn.restype = ctypes.c_int
            attr = _LaunchAttr(_CLUSTER_DIMENSION, 0, (ctypes.c_uint32 * 16)(cluster, 1, 1))
            cfg = _LaunchConfig((ctypes.c_uint32 * 3)(cluster, 1, 1), (ctypes.c_uint32 * 3)(block, 1, 1), smem, None,
                                ctypes.pointer(attr), 1)
            out = ctypes.c_int(0)
            if fn(ctypes.byref(out), ctypes.c_void_p(int(function.ptr)), ctypes.byref(cfg)) == 0 and out.value > 0:
                count = out.value
        except (AttributeError, BackendError, OSError):
            pass
        _ACTIVE_CLUSTERS[key] = count
    return _ACTIVE_CLUSTERS[key]


class Packed:
    """Kernel parameters as ctypes values plus the ``void*[]`` array pointing at them (kept alive together)."""

    def __init__(self, holders: list) -> None:
        self.holders = holders
        self.params = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
        self.address = ctypes.addressof(self.params)


def pack(args: Sequence[Any]) -> Packed:
    """Pack ctypes values (tensor maps by value, pointers, ints) for :func:`launch`."""
    holders = [a if isinstance(a, (ctypes._SimpleCData, ctypes.Structure)) else None for a in args]
    if any(h is None for h in holders):
        raise LaunchError("launch arguments must be ctypes values", backend="cuda")
    return Packed(holders)


def launch(function: Any, grid: tuple[int, int, int], block: int, smem: int, stream: Any, args: Any) -> None:
    """``cuLaunchKernel`` with parameters given as ctypes objects (tensor maps by value) or a :class:`Packed`."""
    packed = args if isinstance(args, Packed) else pack(args)
    drv = toolkit.cupy().cuda.driver
    try:
        drv.launchKernel(function.ptr, grid[0], grid[1], grid[2], block, 1, 1, smem, stream.ptr, packed.address, 0)
    except Exception as exc:
        raise LaunchError(f"cuLaunchKernel failed: {type(exc).__name__}: {exc}", backend="cuda") from None
