"""conv2d as an implicit GEMM on the mma.sync kernel: no im2col buffer, the tile loader gathers
input pixels directly (padding and edges are zero-filled predicated copies)."""

from __future__ import annotations

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import Requirements
from tracea.dtypes import DType, Fp32Precision
from tracea.ir.ops import Conv2dOp, LayerType, Layout
from tracea.semantic.config import BarrierMode, PipelineConfig, SwizzleMode
from tracea.semantic.search_space import SearchSpace

from ..emit import operands
from ..emit.mma import MmaSpec
from .base import FLOAT_IO, CudaVariant, aligned, hero, math_mode, tile_shape, u64


class ImplicitGemmConv(CudaVariant):
    name = "cuda.conv2d.implicit_mma"
    description = ("conv2d implicit GEMM (M=N*P*Q, N=K, K=C*R*S) on mma.sync: NHWC f16/bf16/f32 and NCHW f32, "
                   "TF32 or 3xTF32 for f32, any stride/padding/dilation/kernel size, fused epilogue")
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.CONV2D,
                                dtypes=frozenset({DType.F16, DType.BF16, DType.F32}), out_dtypes=FLOAT_IO,
                                min_compute_capability=(8, 0), groups=False)
    efficiency = 0.4
    priority = 10

    def extra_checks(self, op: Conv2dOp, profile: DeviceProfile) -> list[str]:
        reasons = []
        m, n, k = op.gemm_mnk
        if m * k > 2**31 or op.n * op.c * op.h * op.w > 2**31:
            reasons.append("tensor larger than the 32-bit index range")
        if op.layout is Layout.NCHW and op.dtype.storage is not DType.F32:
            reasons.append("16-bit conv needs NHWC (channels_last) layout; NCHW is served for float32 only")
        return reasons

    def spec(self, op: Conv2dOp, config: PipelineConfig, ptrs: dict | None) -> MmaSpec:
        dt = op.dtype.storage
        epc = 16 // dt.itemsize
        _, _, kdim = op.gemm_mnk
        bias_dtype = DType.parse(ptrs["bias_dtype"]) if ptrs and "bias_dtype" in ptrs else op.out_dtype
        vec_x = op.layout is Layout.NHWC and op.c % epc == 0 and aligned(ptrs, "x")
        return MmaSpec(
            dtype_in=dt, math=math_mode(dt, op.fp32_precision), dtype_out=op.out_dtype, bias_dtype=bias_dtype,
            epilogue=op.epilogue, a=operands.conv_input(op, vec_x),
            b=operands.conv_weight(op, kdim % epc == 0 and aligned(ptrs, "w")),
            store=operands.conv_output(op, op.k % 2 == 0 and aligned(ptrs, "out", 2 * op.out_dtype.itemsize)),
            **tile_shape(config))

    def grid(self, op: Conv2dOp, spec: MmaSpec) -> tuple[int, int, int]:
        m, n, _ = op.gemm_mnk
        return (-(-m // spec.bm) * -(-n // spec.bn), 1, 1)

    def kernel_args(self, op: Conv2dOp, ptrs: dict) -> tuple:
        m, n, k = op.gemm_mnk
        bias = ptrs.get("bias") or ptrs["out"]
        return (u64(ptrs["x"]), u64(ptrs["w"]), u64(ptrs["out"]), u64(bias), np.int32(m), np.int32(n), np.int32(k))

    def search_space(self, op: Conv2dOp, profile: DeviceProfile) -> SearchSpace:
        return (SearchSpace().tile_m([64, 128, 256]).tile_n([32, 64, 128, 256]).tile_k([16, 32, 64])
                .stages([2, 3, 4]).warps([4, 8]).swizzles([SwizzleMode.XOR8, SwizzleMode.NONE])
                .barrier_modes([BarrierMode.SYNC]).param("warp_m", [1, 2, 4])
                .where(lambda c: bool(self.validate_config(op, c, profile)) or "invalid tiling"))

    def hero_configs(self, op: Conv2dOp, profile: DeviceProfile) -> list[PipelineConfig]:
        m, n, _ = op.gemm_mnk
        if op.dtype.storage is DType.F32:
            big = [hero(128, 128, 32, 3, 8, warp_m=2), hero(128, 64, 32, 3, 4, warp_m=2)]
            small = [hero(64, 64, 32, 3, 4, warp_m=2)]
        else:
            big = [hero(128, 128, 32, 4, 4, warp_m=2), hero(128, 256, 32, 3, 8, warp_m=2),
                   hero(128, 64, 32, 4, 4, warp_m=2)]
            small = [hero(64, 64, 32, 4, 4, warp_m=2)]
        if n <= 64:
            big = [c.replace(tile_n=64) if c.tile_n > 64 else c for c in big]
            big = list(dict.fromkeys(big))
        tiles = -(-m // 128) * -(-n // 128)
        return big + small if tiles >= profile.compute_units else small + big


CONV_VARIANTS = [ImplicitGemmConv]
