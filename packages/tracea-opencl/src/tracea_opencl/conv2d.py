"""``opencl.conv2d.implicit_gemm``: conv2d as an implicit GEMM (M = N*P*Q output pixels, N = K/groups
output channels, K = C/groups*R*S taps), NCHW or NHWC, any stride, padding, dilation and groups."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType
from tracea.ir.ops import Conv2dOp, LayerType, Layout

from . import runtime
from .render import ConvGeometry, KernelSpec
from .tiling import Tiling
from .variant_base import OpenCLVariant, cl_type

IO_DTYPES = frozenset({DType.F32, DType.F16})
_tables: dict[tuple[int, str], Any] = {}
_tables_lock = threading.Lock()


def tap_table(op: Conv2dOp) -> np.ndarray:
    """Per reduction index k (in the weight's (c, r, s) or (r, s, c) order): the input offset of the
    tap relative to the output pixel's top-left input position, and its (dh, dw) for bounds checks."""
    cg = op.c // op.groups
    dh, dw = op.dilation
    c, r, s = np.meshgrid(np.arange(cg), np.arange(op.r), np.arange(op.s), indexing="ij")
    if op.layout is Layout.NHWC:
        c, r, s = (a.transpose(1, 2, 0) for a in (c, r, s))  # k order (r, s, c)
        offset = (r * dh * op.w + s * dw) * op.c + c
    else:
        offset = c * op.h * op.w + r * dh * op.w + s * dw
    table = np.zeros((cg * op.r * op.s, 4), dtype=np.int32)
    table[:, 0] = offset.reshape(-1)
    table[:, 1] = (r * dh).reshape(-1)
    table[:, 2] = (s * dw).reshape(-1)
    return table


class OpenCLConv2d(OpenCLVariant):
    """Implicit-GEMM conv2d sharing the GEMM kernel's tiling; input taps are gathered through a
    per-layer offset table, out-of-image taps read zero, the epilogue is fused."""

    name = "opencl.conv2d.implicit_gemm"
    requirements = Requirements(device_kind="opencl", op_kind=LayerType.CONV2D, dtypes=IO_DTYPES,
                                out_dtypes=IO_DTYPES)
    description = "OpenCL implicit-GEMM conv2d (NCHW/NHWC, stride, padding, dilation, groups, fused epilogue)"
    efficiency = 0.25

    def gemm_view(self, op: Conv2dOp) -> tuple[int, int, int, int]:
        m, n, k = op.gemm_mnk
        return m, n, k, op.groups

    def kernel_spec(self, op: Conv2dOp, tiling: Tiling, bias_dtype: DType | None) -> KernelSpec:
        m, n, k = op.gemm_mnk
        ph, pw = op.padding
        needs_bounds = bool(ph or pw)
        geo = ConvGeometry(nhwc=op.layout is Layout.NHWC, c=op.c, h=op.h, w=op.w, k=op.k, p=op.p, q=op.q,
                           cg=op.c // op.groups, kg=op.k // op.groups, kdim=k, stride=op.stride,
                           padding=op.padding, needs_bounds=needs_bounds)
        return KernelSpec(kind="conv", tiling=tiling, in_type=cl_type(op.dtype), out_type=cl_type(op.out_dtype),
                          bias_type=cl_type(bias_dtype) if bias_dtype is not None else None,
                          epilogue=op.epilogue, trans_b=True, pack_b=tiling.pack, even_m=m % tiling.tile_m == 0,
                          even_n=n % tiling.tile_n == 0, even_k=k % tiling.tile_k == 0, conv=geo)

    def kernel_args(self, op: Conv2dOp, args: OpArgs, context: Any) -> list[Any]:
        key = (context.int_ptr, f"{op.layout.value}:{op.c}:{op.h}:{op.w}:{op.r}:{op.s}:{op.dilation}:{op.groups}")
        with _tables_lock:
            buf = _tables.get(key)
            if buf is None:
                pcl = runtime.cl()
                table = tap_table(op)
                buf = pcl.Buffer(context, pcl.mem_flags.READ_ONLY | pcl.mem_flags.COPY_HOST_PTR, hostbuf=table)
                _tables[key] = buf
        return [buf]

    def operands(self, args: OpArgs) -> tuple[Any, Any]:
        return args.x, args.w

    def pack_dims(self, op: Conv2dOp) -> tuple[int, int, int, bool]:
        return op.groups, (op.c // op.groups) * op.r * op.s, op.k // op.groups, True

    def element_counts(self, op: Conv2dOp) -> list[int]:
        n, c, h, w = op.x_shape
        out = op.out_shape
        # The offset table addresses x from a pixel's top-left corner, which may sit before x[0] with padding.
        return [n * c * h * w + op.padding[0] * op.w * op.c, op.k * (op.c // op.groups) * op.r * op.s,
                out[0] * out[1] * out[2] * out[3]]
