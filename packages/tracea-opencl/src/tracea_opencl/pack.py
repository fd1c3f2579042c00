"""Operand packing on the device for the direct (non-local-memory) kernels: B is copied into column
panels of ``tile_n`` columns, k-major inside a panel, so a work-group streams one contiguous
K x tile_n block (no power-of-two strides aliasing cache sets, SIMD loads along n, no edge clamps).
Works from either B layout: (K, N), transposed (N, K), and conv2d weights (K, C*R*S) per group."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from . import programs, runtime

_SOURCE = """
// dim 0: column within a panel (contiguous stores, and loads when B is (K, N)); dim 1: k;
// dim 2: batch * panels + panel.
__kernel void tracea_pack_b(__global const {t}* restrict src, const int off, __global {t}* restrict dst,
                            const int K, const int N, const int panels)
{{
    const int cc = get_global_id(0), k = get_global_id(1), bp = get_global_id(2);
    const int b = bp / panels, c = (bp - b * panels) * {tn} + cc;
    {t} v = 0;
    if (c < N)
        v = {load};
    dst[((size_t)bp * K + k) * {tn} + cc] = v;
}}
"""
_LOADS = {False: "src[off + ((size_t)b * K + k) * N + c]", True: "src[off + ((size_t)b * N + c) * K + k]"}
_STORAGE = {2: "ushort", 4: "float"}
_kernels: dict[tuple[int, int, int, int, bool], Any] = {}
_lock = threading.Lock()


def pack_b(queue: Any, src: Any, batch: int, k: int, n: int, tile_n: int, trans: bool) -> tuple[Any, Any]:
    """B (batch, K, N), or (batch, N, K) when ``trans``, packed into column panels
    ``(batch, N_pad / tile_n, K, tile_n)`` (zero-padded to N_pad, a multiple of ``tile_n``) as a new device
    array, enqueued on ``queue`` (elements copied bit for bit); returns (array, event)."""
    import pyopencl.array as cla  # noqa: PLC0415

    item = src.dtype.itemsize
    key = (queue.context.int_ptr, queue.device.int_ptr, item, tile_n, bool(trans))
    with _lock:
        kernel = _kernels.get(key)
        if kernel is None:
            source = _SOURCE.format(t=_STORAGE[item], tn=tile_n, load=_LOADS[bool(trans)])
            program = programs.build(queue.context, queue.device, source)
            kernel = runtime.cl().Kernel(program, "tracea_pack_b")
            _kernels[key] = kernel
    panels = -(-n // tile_n)
    dst = cla.empty(queue, (batch * panels * k * tile_n,), src.dtype)
    i32 = np.int32
    with _lock:
        event = kernel(queue, (tile_n, k, batch * panels), None, src.base_data, i32(src.offset // item), dst.data,
                       i32(k), i32(n), i32(panels))
    return dst, event
