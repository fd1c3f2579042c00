"""GEMM variants on the portable ``mma.sync`` kernel (sm_80+): f16/bf16, TF32, and 3xTF32."""

from __future__ import annotations

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import Requirements
from tracea.dtypes import DType, Fp32Precision
from tracea.ir.ops import GemmOp, LayerType
from tracea.semantic.config import BarrierMode, PipelineConfig, SwizzleMode
from tracea.semantic.search_space import SearchSpace

from ..emit import operands
from ..emit.mma import MmaSpec
from .base import FLOAT_IO, CudaVariant, aligned, hero, math_mode, served_by, tile_shape, u64

INT32_MAX = 2**31 - 1


class MmaGemmBase(CudaVariant):
    """``out = epilogue(op(A) @ op(B))`` with a multi-stage cp.async pipeline and mma.sync."""

    def extra_checks(self, op: GemmOp, profile: DeviceProfile) -> list[str]:
        reasons = []
        for name in ("m", "n", "k"):
            if getattr(op, name) > INT32_MAX // 2:
                reasons.append(f"{name}={getattr(op, name)} exceeds the 32-bit index range")
        if op.batch > 65535:
            reasons.append(f"batch={op.batch} exceeds the grid limit 65535")
        return reasons

    def spec(self, op: GemmOp, config: PipelineConfig, ptrs: dict | None) -> MmaSpec:
        dt = op.dtype_a.storage
        epc = 16 // dt.itemsize
        a_contig = op.m if op.trans_a else op.k
        b_contig = op.k if op.trans_b else op.n
        out_item = op.out_dtype.itemsize
        bias_dtype = DType.parse(ptrs["bias_dtype"]) if ptrs and "bias_dtype" in ptrs else op.out_dtype
        return MmaSpec(
            dtype_in=dt, math=math_mode(dt, op.fp32_precision), dtype_out=op.out_dtype, bias_dtype=bias_dtype,
            epilogue=op.epilogue,
            a=operands.gemm_a(op.trans_a, a_contig % epc == 0 and aligned(ptrs, "a")),
            b=operands.gemm_b(op.trans_b, b_contig % epc == 0 and aligned(ptrs, "b")),
            store=operands.StoreMap("rowmajor", op.n % 2 == 0 and aligned(ptrs, "out", 2 * out_item)),
            **tile_shape(config))

    def estimate_seconds(self, op: GemmOp, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        """The roofline of what the tiles run: every tile computes all its rows and columns (M = 8 in a 64-row
        tile is 8x the FLOPs), and a grid of fewer tiles than SMs streams memory from that share of them (a
        cp.async pipeline per tile: H100, fp32-exact x8-16 @ W.T against 4096-11008-row weights ran 0.19-0.43x
        cuBLAS on 64-172 tiles where the plain roofline had ranked this variant first). Without a config's
        tile (data rows that lack it) the plain roofline."""
        tm, tn = (int(getattr(config, "tile_m", 0) or 0), int(getattr(config, "tile_n", 0) or 0)) if config else (0, 0)
        if tm <= 0 or tn <= 0:
            return super().estimate_seconds(op, profile, config)
        rows, cols = -(-op.m // tm), -(-op.n // tn)
        return self.roofline(op, profile, flops=2.0 * rows * tm * cols * tn * op.k * op.batch,
                             busy=min(1.0, rows * cols * op.batch / max(profile.compute_units, 1)))

    def grid(self, op: GemmOp, spec: MmaSpec) -> tuple[int, int, int]:
        tiles = -(-op.m // spec.bm) * -(-op.n // spec.bn)
        return (tiles, 1, op.batch)

    def kernel_args(self, op: GemmOp, ptrs: dict) -> tuple:
        bias = ptrs.get("bias") or ptrs["out"]
        return (u64(ptrs["a"]), u64(ptrs["b"]), u64(ptrs["out"]), u64(bias),
                np.int32(op.m), np.int32(op.n), np.int32(op.k))

    def search_space(self, op: GemmOp, profile: DeviceProfile) -> SearchSpace:
        big_k = 64 if op.dtype_a.itemsize == 2 else 32
        return (SearchSpace().tile_m([64, 128, 256]).tile_n([64, 128, 256]).tile_k([big_k // 2, big_k])
                .stages([2, 3, 4, 5]).warps([4, 8]).swizzles([SwizzleMode.XOR8, SwizzleMode.XOR4, SwizzleMode.NONE])
                .barrier_modes([BarrierMode.SYNC]).param("warp_m", [1, 2, 4]).param("group_m", [4, 8, 16])
                .where(lambda c: bool(self.validate_config(op, c, profile)) or "invalid tiling"))

    def hero_configs(self, op: GemmOp, profile: DeviceProfile) -> list[PipelineConfig]:
        heroes = self.heroes(profile)
        sms = max(profile.compute_units, 1)

        def waves(c: PipelineConfig) -> float:
            tiles = -(-op.m // c.tile_m) * -(-op.n // c.tile_n) * op.batch
            return tiles / sms

        # Big tiles first unless they leave most SMs idle.
        return sorted(heroes, key=lambda c: 0 if waves(c) >= 0.8 else 1 + (c.tile_m * c.tile_n) / 1e6)

    def heroes(self, profile: DeviceProfile) -> list[PipelineConfig]:
        raise NotImplementedError


class MmaGemm16(MmaGemmBase):
    name = "cuda.gemm.mma_f16"
    description = "fp16/bf16 GEMM, mma.sync m16n8k16 + cp.async multi-stage pipeline, fused epilogue (sm_80+)"
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.GEMM,
                                dtypes=frozenset({DType.F16, DType.BF16}), out_dtypes=FLOAT_IO,
                                min_compute_capability=(8, 0))
    efficiency = 0.55
    priority = 10

    def heroes(self, profile: DeviceProfile) -> list[PipelineConfig]:
        return [hero(128, 256, 32, 3, 8, warp_m=2), hero(128, 128, 32, 4, 4, warp_m=2),
                hero(128, 128, 64, 3, 8, warp_m=2), hero(64, 128, 32, 4, 4, warp_m=2),
                hero(64, 64, 32, 4, 4, warp_m=2)]


class MmaGemmTf32(MmaGemmBase):
    name = "cuda.gemm.mma_tf32"
    description = "fp32 GEMM on TF32 Tensor Cores (allowed by fp32_precision high/medium), mma.sync m16n8k8"
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.GEMM, dtypes=frozenset({DType.F32}),
                                out_dtypes=FLOAT_IO, min_compute_capability=(8, 0),
                                fp32_precisions=frozenset({Fp32Precision.HIGH, Fp32Precision.MEDIUM}))
    efficiency = 0.25  # of the TF32 peak (measured ~0.27x cuBLAS TF32 at 4096^3 on an H100)
    priority = 10

    def extra_checks(self, op: GemmOp, profile: DeviceProfile) -> list[str]:
        from .skinny import skinny_tf32_serves  # noqa: PLC0415

        from .hopper_fewrows import fewrows_tf32_serves  # noqa: PLC0415

        return super().extra_checks(op, profile) + served_by(
            skinny_tf32_serves(op, profile), f"M={op.m} rows against an (N, K) weight: cuda.gemm.skinny_tf32 serves "
            "it (H100, x5-8 @ W11008x4096.T: this kernel 0.83x cuBLAS TF32, the skinny one 1.00x)") + served_by(
            fewrows_tf32_serves(op, profile), f"M={op.m} rows against an (N, K) weight on Hopper: "
            "cuda.gemm.wgmma_fewrows_tf32 serves it (H200, 17-64 rows: this kernel 0.16-0.78x cuBLAS TF32, that one "
            "0.78-1.36x)")

    def heroes(self, profile: DeviceProfile) -> list[PipelineConfig]:
        return [hero(128, 128, 32, 3, 8, warp_m=2), hero(128, 128, 16, 4, 8, warp_m=2),
                hero(64, 128, 32, 3, 4, warp_m=2), hero(64, 64, 32, 4, 4, warp_m=2)]


class MmaGemm3xTf32(MmaGemmBase):
    name = "cuda.gemm.mma_3xtf32"
    description = "fp32-accurate GEMM: 3xTF32 split (big*big + big*small + small*big) on Tensor Cores"
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.GEMM, dtypes=frozenset({DType.F32}),
                                out_dtypes=FLOAT_IO, min_compute_capability=(8, 0),
                                fp32_precisions=frozenset({Fp32Precision.HIGHEST}))
    efficiency = 0.3  # of the TF32 peak over 3x the FLOPs (measured ~1.0x cuBLAS SGEMM on an H200)
    priority = 10

    def extra_checks(self, op: GemmOp, profile: DeviceProfile) -> list[str]:
        from .rows_fma import rows_fma_serves  # noqa: PLC0415
        from .rows_kn import rows_kn_serves  # noqa: PLC0415

        return super().extra_checks(op, profile) + served_by(
            rows_kn_serves(op, profile), f"M={op.m} rows against a (K, N) row-major B: cuda.gemm.rows_kn serves it "
            "(H100, x8 @ B(4096x4096): this kernel 0.31x cuBLAS SGEMM, rows_kn 1.25x)") + served_by(
            rows_fma_serves(op, profile), f"M={op.m} rows against an (N, K) weight: cuda.gemm.rows_fma serves it")

    def heroes(self, profile: DeviceProfile) -> list[PipelineConfig]:
        # 128x64 on 8 warps (not 4): the IEEE-safe split holds more fragment registers, and the 4-warp tile
        # spilled (ptxas, sm_80 and sm_90a); 8 warps keep it at ~167 registers, no spills.
        return [hero(128, 128, 32, 3, 8, warp_m=2), hero(128, 64, 32, 3, 8, warp_m=2),
                hero(64, 64, 32, 4, 4, warp_m=2)]


GEMM_VARIANTS = [MmaGemm16, MmaGemmTf32, MmaGemm3xTf32]
