"""Operand packing on the device: transposes B to k-major order for the direct (non-local-memory)
kernels, whose work-items read B along n and need those reads contiguous (one SIMD load on CPU runtimes).
Used for conv2d weights (K, C*R*S -> C*R*S, K) and transposed GEMM B operands ((N, K) -> (K, N))."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from . import programs, runtime

_SOURCE = """
__kernel void tracea_transpose(__global const {t}* restrict src, const int off, __global {t}* restrict dst,
                               const int rows, const int cols)
{{
    const int r = get_global_id(0), c = get_global_id(1), b = get_global_id(2);
    if (r < rows && c < cols)
        dst[(size_t)b * rows * cols + (size_t)c * rows + r] = src[off + (size_t)b * rows * cols + (size_t)r * cols + c];
}}
"""
_STORAGE = {2: "ushort", 4: "float"}
_kernels: dict[tuple[int, int, int], Any] = {}
_lock = threading.Lock()


def transpose(queue: Any, src: Any, batch: int, rows: int, cols: int) -> tuple[Any, Any]:
    """A new device array (batch, cols, rows) holding ``src`` (batch, rows, cols) transposed, enqueued on
    ``queue`` (elements copied bit for bit), and the transpose's event."""
    import pyopencl.array as cla  # noqa: PLC0415

    item = src.dtype.itemsize
    key = (queue.context.int_ptr, queue.device.int_ptr, item)
    kernel = _kernels.get(key)
    if kernel is None:
        program = programs.build(queue.context, queue.device, _SOURCE.format(t=_STORAGE[item]))
        kernel = runtime.cl().Kernel(program, "tracea_transpose")
        _kernels[key] = kernel
    dst = cla.empty(queue, (batch, cols, rows), src.dtype)
    local = (16, 1, 1) if rows >= 16 else None
    gsize = (-(-rows // 16) * 16 if local else rows, cols, batch)
    with _lock:
        event = kernel(queue, gsize, local, src.base_data, np.int32(src.offset // item), dst.data, np.int32(rows),
               np.int32(cols))
    return dst, event
