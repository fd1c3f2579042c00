"""``cuda.gemm.skinny_mma``: few-row 16-bit GEMMs against an (N, K) weight (LLM decode with several
tokens, small-batch ``nn.Linear``) on Tensor Cores, the weight streamed once from global memory into
``mma.sync`` fragments; see :mod:`tracea_cuda.emit.skinny`."""

from __future__ import annotations

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import Requirements
from tracea.dtypes import DType
from tracea.ir.ops import GemmOp, LayerType
from tracea.semantic.config import PipelineConfig
from tracea.semantic.search_space import SearchSpace

from ..emit.skinny import KERNEL_NAME, SkinnySpec, render
from .base import FLOAT_IO, aligned
from .gemv import WeightStreamingGemm, int_param

#: fraction of the measured copy bandwidth the kernel is expected to reach on large weights
BANDWIDTH_SHARE = 0.85
#: rows served (the kernel takes up to MAX_ROWS): at M = 64 it reached only ~52% of the copy bandwidth on an
#: H100 (0.61-0.77x PyTorch) while the tiled variants do better; M = 4 and 16 ran at 80-95% (1.0-1.6x)
SERVED_ROWS = 16
#: memory bandwidth (GB/s) from which the skinny heroes measured on an H200 come first
HIGH_BANDWIDTH_GBS = 4000.0


class SkinnyMmaGemm(WeightStreamingGemm):
    name = "cuda.gemm.skinny_mma"
    description = ("few-row f16/bf16 GEMM (M <= 16) against an (N, K) weight on mma.sync: the weight streamed "
                   "once from global memory straight into Tensor Core fragments, K split across the warps of "
                   "a block, fused epilogue")
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.GEMM, dtypes=frozenset({DType.F16, DType.BF16}),
                                out_dtypes=FLOAT_IO, min_compute_capability=(8, 0), batched=False,
                                max_dims={"m": SERVED_ROWS})
    efficiency = 0.05  # memory-bound: the estimate below is a bandwidth one
    wave_quantized = False  # many small blocks per SM
    priority = 25

    kernel_word = "skinny"
    kernel_name = KERNEL_NAME
    render = staticmethod(render)

    def row_reasons(self, op: GemmOp) -> list[str]:
        if op.k % 8:
            return [f"K={op.k} is not a multiple of 8: rows of 16-byte loads (the tiled variants serve it)"]
        return []

    def estimate_seconds(self, op: GemmOp, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        """Reading the weight once at a share of the bandwidth, plus A re-read by every block from L2
        (about one tenth of the bandwidth's cost per byte) and a launch."""
        bw = max(profile.bandwidth_gbs, 1.0) * 1e9
        weight = op.n * op.k * op.dtype_b.itemsize
        a_reads = op.m * op.k * op.dtype_a.itemsize * -(-op.n // 32)
        return weight / (bw * BANDWIDTH_SHARE) + a_reads / (10 * bw) + 4e-6

    def spec(self, op: GemmOp, config: PipelineConfig, ptrs: dict | None) -> SkinnySpec:
        vec = op.k % 8 == 0 and aligned(ptrs, "a") and aligned(ptrs, "b")
        bias_dtype = DType.parse(ptrs["bias_dtype"]) if ptrs and "bias_dtype" in ptrs else op.out_dtype
        return SkinnySpec(op.dtype_a.storage, op.out_dtype, bias_dtype, op.epilogue, -(-op.m // 16),
                          int_param(config, "nb", 2), int_param(config, "kw", 4), int_param(config, "unroll", 2), vec)

    def grid(self, op: GemmOp, spec: SkinnySpec) -> tuple[int, int, int]:  # type: ignore[override]
        return (-(-op.n // (8 * spec.nb)), 1, 1)

    def search_space(self, op: GemmOp, profile: DeviceProfile) -> SearchSpace:
        return (SearchSpace().param("nb", [1, 2, 4]).param("kw", [2, 4, 8, 16]).param("unroll", [1, 2, 4])
                .where(lambda c: bool(self.validate_config(op, c, profile)) or "invalid"))

    def hero_configs(self, op: GemmOp, profile: DeviceProfile) -> list[PipelineConfig]:
        # Measured on an H100 (benchmarks/cuda/probe_skinny.py, 12 decode shapes, M = 4 and 16, weights
        # 1024x8192 to 28672x8192): (nb=2, kw=16, unroll=2) was within 3.5% of each shape's best config
        # on geometric mean (6.6% at worst), at 80-95% of the copy bandwidth on weights of 32 MB and more.
        # On an H200 (4.8 TB/s; same probe, M = 4 and 16) that hero fell to 0.84 of the best on geometric
        # mean (0.22 on one shape) and (nb=2, kw=8, unroll=2) reached 0.95 (0.89 at worst): GPUs with that
        # much bandwidth take it first.
        mf = -(-op.m // 16)
        heroes = [(2, 16, 2), (1, 8, 2), (1, 16, 2), (4, 16, 1)]
        if (profile.bandwidth_gbs or 0) >= HIGH_BANDWIDTH_GBS:
            heroes = [(2, 8, 2), (4, 16, 2)] + heroes
        return [PipelineConfig(warps=kw, params=(("nb", nb), ("kw", kw), ("unroll", un))) for nb, kw, un in heroes
                if mf * nb <= 8 and mf * nb * un <= 16]


SKINNY_VARIANTS = [SkinnyMmaGemm]
