"""``opencl.gemm.tiled``: batched GEMM with transposes and a fused epilogue."""

from __future__ import annotations

from typing import Any

from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType
from tracea.ir.ops import GemmOp, LayerType

from .render import KernelSpec
from .tiling import Tiling
from .variant_base import OpenCLVariant, cl_type

IO_DTYPES = frozenset({DType.F32, DType.F16})


class OpenCLGemm(OpenCLVariant):
    """Tiled GEMM: work-group blocking (local memory on GPUs, caches on CPUs), register tiles, vector
    loads/stores, any M/N/K with edge handling, fp32 accumulation, fused bias/activation epilogue."""

    name = "opencl.gemm.tiled"
    requirements = Requirements(device_kind="opencl", op_kind=LayerType.GEMM, dtypes=IO_DTYPES,
                                out_dtypes=IO_DTYPES)
    description = "OpenCL tiled GEMM (local-memory or cache blocking, register tiles, fused epilogue)"
    efficiency = 0.3

    def gemm_view(self, op: GemmOp) -> tuple[int, int, int, int]:
        return op.m, op.n, op.k, op.batch

    def kernel_spec(self, op: GemmOp, tiling: Tiling, bias_dtype: DType | None) -> KernelSpec:
        even_k = op.k % tiling.tile_k == 0
        pack = tiling.pack
        return KernelSpec(kind="gemm", tiling=tiling, in_type=cl_type(op.dtype_a), out_type=cl_type(op.out_dtype),
                          bias_type=cl_type(bias_dtype) if bias_dtype is not None else None,
                          epilogue=op.epilogue, trans_a=op.trans_a, trans_b=op.trans_b and not pack, pack_b=pack,
                          even_m=op.m % tiling.tile_m == 0, even_n=op.n % tiling.tile_n == 0, even_k=even_k)

    def operands(self, args: OpArgs) -> tuple[Any, Any]:
        return args.a, args.b

    def pack_dims(self, op: GemmOp) -> tuple[int, int, int, bool]:
        return op.batch, op.k, op.n, op.trans_b

    def element_counts(self, op: GemmOp) -> list[int]:
        return [op.batch * op.m * op.k, op.batch * op.k * op.n, op.batch * op.m * op.n]
