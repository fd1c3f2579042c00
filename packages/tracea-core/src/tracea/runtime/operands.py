"""Argument checking shared by the public ops: one adapter and device for all arrays, specific errors
for wrong kinds, ranks, shapes and dtypes, and packing of operands into the layouts kernels expect."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..doctor.doctor import Doctor
from ..dtypes import DType
from ..errors import DTypeError, InvalidArgumentError, ShapeError, UnsupportedDeviceError
from ..ir.device import Device
from .arrays import ArrayAdapter, ArrayInfo, find_adapter

FLOATS = (DType.F64, DType.F32, DType.F16, DType.BF16)


@dataclass
class Operand:
    """One array argument: the user's object, its adapter and what it is."""

    name: str
    obj: Any
    adapter: ArrayAdapter
    info: ArrayInfo


def operands(doctor: Doctor, named: Sequence[tuple[str, Any]]) -> tuple[ArrayAdapter, Device, dict[str, Operand]]:
    """Describe every non-None array; all must share one adapter kind and one device."""
    adapters = doctor.adapters()
    found: dict[str, Operand] = {}
    for name, obj in named:
        if obj is None:
            continue
        adapter = find_adapter(obj, adapters, name)
        try:
            info = adapter.info(obj)
        except DTypeError as exc:  # an adapter names the dtype; say whose it is
            if exc.arg != "dtype":
                raise
            raise DTypeError(f"{name}.dtype", exc.value, exc.expected, hint=exc.hint) from None
        found[name] = Operand(name, obj, adapter, info)
    first = next(iter(found.values()))
    for op in found.values():
        if op.adapter.name != first.adapter.name:
            raise InvalidArgumentError(op.name, op.obj, f"a {first.adapter.name} array like '{first.name}'",
                                       hint="all arrays of one call must be of the same kind")
        if op.info.device != first.info.device:
            raise UnsupportedDeviceError(f"argument '{op.name}' is on {op.info.device} but '{first.name}' is on "
                                         f"{first.info.device}; move them to one device")
    if first.adapter.name == "dlpack":
        raise UnsupportedDeviceError(
            f"argument '{first.name}' ({type(first.obj).__module__}.{type(first.obj).__name__} on "
            f"{first.info.device}) is of an array kind no installed backend handles; install the backend "
            "for it (tracea-cuda for CuPy, tracea-torch for torch tensors) or pass NumPy arrays")
    return first.adapter, first.info.device, found


def check_rank(op: Operand, ranks: Sequence[int], what: str) -> None:
    if op.info.ndim not in ranks:
        raise ShapeError(op.name, op.obj, f"a {' or '.join(f'{r}-D' for r in ranks)} array {what}")
    for i, size in enumerate(op.info.shape):
        if size <= 0:
            raise ShapeError(f"{op.name}.shape[{i}]", size, "a positive size (empty arrays are not supported)")


def check_float(op: Operand) -> DType:
    if op.info.dtype not in FLOATS:
        raise DTypeError(f"{op.name}.dtype", op.info.dtype.value, "float64, float32, float16 or bfloat16")
    return op.info.dtype


def same_dtype(ref: Operand, *others: Operand | None) -> None:
    for o in others:
        if o is not None and o.info.dtype is not ref.info.dtype:
            raise DTypeError(f"{o.name}.dtype", o.info.dtype.value, f"{ref.info.dtype.value}, the dtype of '{ref.name}'")


def packed(op: Operand) -> Any:
    """The operand as a packed row-major array (a copy only when it is not already packed)."""
    return op.obj if op.info.c_contiguous else op.adapter.contiguous(op.obj)


def packed_maybe_transposed(op: Operand) -> tuple[Any, bool]:
    """``(array, transposed)``: a packed array, using the transposed view of a column-major operand
    instead of copying it."""
    if op.info.c_contiguous:
        return op.obj, False
    if op.info.ndim >= 2 and op.info.strides is not None:
        swapped = op.adapter.swap_last(op.obj)
        if op.adapter.info(swapped).c_contiguous:
            return swapped, True
    return op.adapter.contiguous(op.obj), False


def check_out(out: Operand | None, shape: tuple[int, ...], dtype: DType | None) -> None:
    """``out`` must have ``shape`` and ``dtype``, be writeable and have no two elements in one place."""
    if out is None:
        return
    if tuple(out.info.shape) != tuple(shape):
        raise ShapeError("out", out.obj, f"shape {tuple(shape)}")
    if out.info.dtype not in FLOATS:
        raise DTypeError("out.dtype", out.info.dtype.value, "float64, float32, float16 or bfloat16")
    if dtype is not None and out.info.dtype is not dtype:
        raise DTypeError("out.dtype", out.info.dtype.value, f"{dtype.value}")
    why = out.adapter.write_error(out.obj)
    if why:
        raise InvalidArgumentError("out", out.obj, "an array Tracea may write into", hint=why)
    if may_self_overlap(out.info):
        raise InvalidArgumentError("out", out.obj, "an array whose elements occupy distinct memory",
                                   hint=f"strides {out.info.strides} make elements share memory (an expanded or "
                                        "broadcast view?); pass a fresh array")


def may_self_overlap(info: ArrayInfo) -> bool:
    """True unless the strides prove that no two elements share memory (sorted by stride, each
    dimension must step past the whole extent of the ones inside it). Unknown strides (NumPy byte
    strides that are not a multiple of the item size) are not judged: such outputs are written by a
    copy of the framework's own."""
    if info.strides is None:
        return False
    dims = [(abs(st), size) for size, st in zip(info.shape, info.strides) if size > 1]
    span = 1
    for stride, size in sorted(dims):
        if stride < span:
            return True
        span = stride * size
    return False


def check_out_dtype(dtype: DType) -> DType:
    """Outputs are floating point (the kernels accumulate in float)."""
    if dtype not in FLOATS:
        raise DTypeError("out_dtype", dtype.value, "float64, float32, float16 or bfloat16")
    return dtype


def check_no_overlap(out: Operand | None, inputs: Sequence[Operand | None]) -> None:
    """Outputs may not alias inputs: NumPy's ``may_share_memory``, else the adapters' memory spans
    (torch tensors, CuPy arrays) on one device."""
    if out is None:
        return
    span = None
    for i in inputs:
        if i is None:
            continue
        if isinstance(out.obj, np.ndarray) and isinstance(i.obj, np.ndarray):
            overlap = bool(np.may_share_memory(out.obj, i.obj))
        else:
            if span is None:
                span = out.adapter.memory_span(out.obj) or (0, 0)
            other = i.adapter.memory_span(i.obj) if i.info.device == out.info.device else None
            overlap = other is not None and span[0] < other[1] and other[0] < span[1]
        if overlap:
            raise InvalidArgumentError("out", out.obj, f"an array that does not overlap input '{i.name}'")


def bias_operand(bias: Operand | None, length: int, out_dtype: DType, what: str) -> Any:
    """Check a bias vector of ``length`` and convert it to the output dtype (the kernels' contract)."""
    if bias is None:
        return None
    if bias.info.ndim != 1 or bias.info.shape[0] != length:
        raise ShapeError("bias", bias.obj, f"a 1-D array of length {length} ({what})")
    check_float(bias)
    converted = bias.adapter.astype(bias.obj, out_dtype)
    return packed(Operand(bias.name, converted, bias.adapter, bias.adapter.info(converted)))


def pair(arg: str, value: Any) -> tuple[int, int]:
    """An int or a pair of ints (Python or NumPy integers; not bools, floats or strings) as a pair."""
    items = value if isinstance(value, (list, tuple)) else (value, value)
    if len(items) != 2 or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in items):
        raise InvalidArgumentError(arg, value, "an int or a pair of ints")
    return int(items[0]), int(items[1])
