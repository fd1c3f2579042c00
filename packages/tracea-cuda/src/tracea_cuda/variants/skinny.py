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
from .gemv import WeightStreamingGemm, flag_param, int_param

#: fraction of the measured copy bandwidth the kernel is expected to reach on large weights
BANDWIDTH_SHARE = 0.85
#: rows served (the kernel takes up to MAX_ROWS): at M = 64 it reached only ~52% of the copy bandwidth on an
#: H100 (0.61-0.77x PyTorch) while the tiled variants do better; M = 4 and 16 ran at 80-95% (1.0-1.6x)
SERVED_ROWS = 16
#: at M = 1, weights of at least this many rows per SM go to cuda.gemm.gemv (one row per warp, 8 warps per
#: block: 6 blocks per SM and more), which streamed them faster on an H200 (benchmarks/cuda/probe_skinny.py);
#: on fewer rows the skinny kernel's K split across warps keeps more loads in flight (W1024x8192: 1.34x
#: cuBLAS against 0.52x for the GEMV, W4096x11008 1.05x / 0.99x, W5120x5120 0.90x / 0.88x)
GEMV_ROWS_PER_SM = 48
#: memory bandwidth (GB/s) from which the skinny heroes measured on an H200 come first
HIGH_BANDWIDTH_GBS = 4000.0
#: registers per thread of the prefetching (nb=1, kw=8, unroll=2) kernel on whole A fragments (ptxas, sm_90):
#: 64, so a 256-thread block takes 16384 of an SM's registers -- four blocks per SM on Hopper and Ampere
ONE_ROW_BLOCK_REGS = 64 * 256


def short_last_wave(blocks: int, per_sm: int, sms: int) -> bool:
    """Whether a grid of ``blocks`` blocks, ``per_sm`` resident per SM on ``sms`` SMs, runs one or two full
    waves and then a last wave under a third full (H100, M = 16 against W5120x5120: 640 one-row-block
    blocks at four per SM are 1.21 waves and ran 0.88x the two-row-block kernel's speed, 320 blocks in one
    wave; 8192x8192's 1.94 waves and 13824x5120's 3.27 did not lose)."""
    waves = blocks / max(per_sm * sms, 1)
    return 1.0 < waves < 3.0 and waves - int(waves) < 1 / 3


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

    def extra_checks(self, op: GemmOp, profile: DeviceProfile) -> list[str]:
        reasons = super().extra_checks(op, profile)
        if op.m == 1 and op.n >= GEMV_ROWS_PER_SM * max(profile.compute_units, 1):
            reasons.append(f"one row against a weight of N={op.n} >= {GEMV_ROWS_PER_SM} rows per SM: cuda.gemm.gemv "
                           "streams it faster (H200: 1.00-1.15x cuBLAS against 0.94-1.04x for the best skinny "
                           "config on 8192-28672-row weights)")
        return reasons

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
        mf = -(-op.m // 16)
        return SkinnySpec(op.dtype_a.storage, op.out_dtype, bias_dtype, op.epilogue, mf,
                          int_param(config, "nb", 2), int_param(config, "kw", 4), int_param(config, "unroll", 2), vec,
                          coalesced=flag_param(config, "coalesced", False), prefetch=flag_param(config, "prefetch", False),
                          half=op.m <= 8, wide_regs=flag_param(config, "wide_regs", False),
                          wn=int_param(config, "wn", 1))

    def grid(self, op: GemmOp, spec: SkinnySpec) -> tuple[int, int, int]:  # type: ignore[override]
        return (-(-op.n // spec.rows), 1, 1)

    def search_space(self, op: GemmOp, profile: DeviceProfile) -> SearchSpace:
        return (SearchSpace().param("nb", [1, 2, 4]).param("kw", [2, 4, 8, 16]).param("unroll", [1, 2, 4])
                .param("coalesced", [False, True]).param("prefetch", [False, True]).param("wide_regs", [False, True])
                .param("wn", [1, 2])
                .where(lambda c: bool(self.validate_config(op, c, profile)) or "invalid"))

    def hero_configs(self, op: GemmOp, profile: DeviceProfile) -> list[PipelineConfig]:
        # Measured on an H100 (benchmarks/cuda/probe_skinny.py, 12 decode shapes, M = 4 and 16, weights
        # 1024x8192 to 28672x8192): (nb=2, kw=16, unroll=2) was within 3.5% of each shape's best config
        # on geometric mean (6.6% at worst), at 80-95% of the copy bandwidth on weights of 32 MB and more.
        # On an H200 (4.8 TB/s) the same probe with the prefetching loop (kernel time, 8 weights 1024x8192
        # to 28672x8192, share of each shape's best config, geometric mean / worst): M = 9-16 (nb=2, kw=8,
        # unroll=2, prefetch) 0.93 / 0.67 against 0.85 / 0.50 without prefetch; M = 2-8 (nb=2, kw=16,
        # unroll=2, prefetch) 0.91 / 0.73. Where two-block rows leave SMs without a block (N < 16 x SMs:
        # W1024x8192) one-block rows over 16 warps won (1.00 there): (nb=1, kw=16, unroll=2, prefetch) at
        # M 9-16, (nb=1, kw=16, unroll=4, prefetch, coalesced) at M <= 8, first where those blocks fit one
        # per SM (N <= 8 x SMs).
        # Below 4 TB/s the same probe on an H100 (2.97 TB/s copy; kernel time, 8 weights, share of each shape's
        # best config, geometric mean / worst) put the prefetching one-row-block kernels first: M <= 8
        # (nb=1, kw=16, unroll=2, prefetch, wide_regs) 0.985 / 0.904 against 0.79 / 0.52 for the former first
        # hero (nb=2, kw=16, unroll=2) (x4 @ W5120x5120: 1.01x cuBLAS against 0.78x); M 9-16 (nb=1, kw=8,
        # unroll=2, prefetch) 0.94 / 0.71 (the worst on W1024x8192, where the 16-warp kernel is first), with
        # (nb=2, kw=8, unroll=2, prefetch) first where the one-row blocks leave a short last wave
        # (short_last_wave; x16 @ W5120x5120 1.00x against 0.88x).
        mf = -(-op.m // 16)
        sms = max(profile.compute_units, 1)
        # (nb, kw, unroll, coalesced, prefetch, wide_regs)
        heroes = [(2, 16, 2, False, False, False), (1, 8, 2, False, False, False), (1, 16, 2, False, False, False),
                  (4, 16, 1, False, False, False)]
        if (profile.bandwidth_gbs or 0) < HIGH_BANDWIDTH_GBS:
            wide16 = (1, 16, 2, False, True, True)
            if -(-op.n // 8) <= sms or op.m <= 8:
                first = [wide16, (1, 8, 2, False, True, False)]
            else:
                pair = [(1, 8, 2, False, True, False), (2, 8, 2, False, True, False)]
                per_sm = max(profile.registers_per_block // ONE_ROW_BLOCK_REGS, 1)
                first = (pair[::-1] if short_last_wave(-(-op.n // 8), per_sm, sms) else pair) + [wide16]
            heroes = first + heroes
        else:
            # one-block rows fill at most one block per SM: the prefetching kw=16 kernels get the registers
            # of one block per SM (they spill at two)
            few = [(1, 16, 4, True, True, True)] if op.m <= 8 else [(1, 16, 2, False, True, True)]
            many = ([(2, 16, 2, False, True, False), (2, 8, 4, True, True, False)] if op.m <= 8
                    else [(2, 8, 2, False, True, False), (1, 8, 2, False, True, False)])
            first = few + many if -(-op.n // 8) <= sms else many + few
            heroes = first + [(2, 8, 2, False, False, False)] + heroes
        return [PipelineConfig(warps=kw, params=(("nb", nb), ("kw", kw), ("unroll", un), ("coalesced", co),
                                                 ("prefetch", pf), ("wide_regs", wide)))
                for nb, kw, un, co, pf, wide in heroes
                if mf * nb <= 8 and mf * nb * un <= (8 if pf else 16)]


SKINNY_VARIANTS = [SkinnyMmaGemm]
