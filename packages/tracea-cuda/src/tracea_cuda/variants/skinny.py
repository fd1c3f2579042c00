"""``cuda.gemm.skinny_mma``: few-row 16-bit GEMMs against an (N, K) weight (LLM decode with several
tokens, small-batch ``nn.Linear``) on Tensor Cores, the weight streamed once from global memory into
``mma.sync`` fragments; ``cuda.gemm.skinny_tf32``: the same kernel on float32 (TF32, or the 3xTF32 split in
registers for fp32 accuracy); see :mod:`tracea_cuda.emit.skinny`."""

from __future__ import annotations

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import Requirements
from tracea.dtypes import DType, Fp32Precision
from tracea.ir.ops import GemmOp, LayerType
from tracea.semantic.config import PipelineConfig
from tracea.semantic.search_space import SearchSpace

from ..emit.skinny import KERNEL_NAME, SkinnySpec, render
from .base import FLOAT_IO, aligned, math_mode, served_by
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
#: float32 rows served by cuda.gemm.skinny_tf32 with the 3xTF32 split (the kernel's bound): on an H100, fp32-exact
#: x @ W.T against 768x768-11008x4096 weights ran 0.93-5.1x cuBLAS at M = 5-64 (the tiled 3xTF32 GEMMs 0.17-0.65x)
F32_SERVED_ROWS = 64
#: rows served with one TF32 product (TF32 allowed): 0.94-2.3x cuBLAS TF32 at M = 5-16 on the same weights,
#: but 0.50-0.80x at M = 32-64 on weights of 4096 rows and more, where cuda.gemm.wgmma_tf32 ran 0.79-1.07x
TF32_SERVED_ROWS = 16
#: share of the TF32 Tensor Core peak the float32 skinny kernel's mma.sync reaches (its estimate's compute part)
F32_MMA_SHARE = 0.35
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
        bias_dtype = DType.parse(ptrs["bias_dtype"]) if ptrs and "bias_dtype" in ptrs else op.out_dtype
        mf = -(-op.m // 16)
        dt = op.dtype_a.storage
        vec = op.k % (16 // dt.itemsize) == 0 and aligned(ptrs, "a") and aligned(ptrs, "b")
        return SkinnySpec(dt, op.out_dtype, bias_dtype, op.epilogue, mf,
                          int_param(config, "nb", 2), int_param(config, "kw", 4), int_param(config, "unroll", 2), vec,
                          coalesced=flag_param(config, "coalesced", False), prefetch=flag_param(config, "prefetch", False),
                          half=op.m <= 8, wide_regs=flag_param(config, "wide_regs", False),
                          wn=int_param(config, "wn", 1),
                          math="" if dt is not DType.F32 else math_mode(dt, op.fp32_precision))

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



class SkinnyTf32Gemm(SkinnyMmaGemm):
    """The skinny kernel on float32: one TF32 product where TF32 is allowed, else the 3xTF32 split in
    registers (fp32-level accuracy, what ``x @ W.T`` of an fp32 ``nn.Linear`` needs by default). The tiled
    3xTF32 GEMMs split both operands through memory or run 128-row tiles: on an H100, fp32-exact
    x(8-32) @ W.T against 1000-11008-row weights they ran 0.17-0.65x cuBLAS (H100, 2026-11-27: the user path's
    ``bench_shapes.py --groups fp32`` rows before this variant served them)."""

    name = "cuda.gemm.skinny_tf32"
    description = ("few-row float32 GEMM (M <= 64) against an (N, K) weight on mma.sync TF32: the weight "
                   "streamed once into fragments, split into 3xTF32 parts in registers for fp32 accuracy "
                   "(one TF32 product where TF32 is allowed), K split across warps, fused epilogue")
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.GEMM, dtypes=frozenset({DType.F32}),
                                out_dtypes=FLOAT_IO, min_compute_capability=(8, 0), batched=False,
                                max_dims={"m": F32_SERVED_ROWS})
    priority = 24

    def row_reasons(self, op: GemmOp) -> list[str]:
        if op.k % 4:
            return [f"K={op.k} is not a multiple of 4: rows of 16-byte loads (the tiled variants serve it)"]
        if op.fp32_precision is not Fp32Precision.HIGHEST and op.m > TF32_SERVED_ROWS:
            return [f"M={op.m} rows with TF32 allowed: the tiled TF32 variants serve more than {TF32_SERVED_ROWS} "
                    "(one TF32 product leaves the skinny kernel short of the weight stream's bandwidth there)"]
        return []

    def extra_checks(self, op: GemmOp, profile: DeviceProfile) -> list[str]:
        from .rows_fma import rows_fma_serves  # noqa: PLC0415

        return WeightStreamingGemm.extra_checks(self, op, profile) + served_by(
            rows_fma_serves(op, profile), f"M={op.m} fp32-exact rows against a weight of "
            f"{op.n * op.k * 4 >> 20} MiB: cuda.gemm.rows_fma serves it (the 3xTF32 split of A in registers is "
            "issue-bound from 17 rows)")

    def estimate_seconds(self, op: GemmOp, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        """The streaming estimate, or the Tensor Core time of the padded rows (16 per fragment, three products
        for 3xTF32, mma.sync at :data:`F32_MMA_SHARE` of the TF32 peak) where that is longer."""
        stream = super().estimate_seconds(op, profile, config)
        rows = 8 if op.m <= 8 else 16 * -(-op.m // 16)
        products = 3.0 if op.fp32_precision is Fp32Precision.HIGHEST else 1.0
        mma = 2.0 * rows * op.n * op.k * products / (max(profile.peak("tf32"), 1.0) * 1e9 * F32_MMA_SHARE)
        return max(stream, mma + 4e-6)

    def hero_configs(self, op: GemmOp, profile: DeviceProfile) -> list[PipelineConfig]:
        # H100 (2.95 TB/s copy), benchmarks/cuda/probe_skinny.py --dtype float32 (3xTF32) over 5 weights
        # (768x768 to 11008x4096) at M = 5-64, kernel time, share of each shape's best config (geomean /
        # worst): 16-warp blocks led every row class -- M <= 8 (nb=1, u=2, adjacent k) 0.88 / 0.84; M 9-16
        # (nb=2, u=4, coalesced) 0.89 / 0.78; M 17-32 (nb=2, u=2, coalesced) 0.80 / 0.75; M 33-64 (nb=2, u=1,
        # coalesced) 0.93 / 0.82. The prefetching loop did not help (the split's ALU work hides the loads).
        if op.m <= 8:
            heroes = [(1, 16, 2, False), (1, 16, 2, True), (1, 16, 4, True), (2, 16, 4, True)]
        elif op.m <= 16:
            heroes = [(2, 16, 4, True), (1, 16, 2, False), (1, 16, 2, True), (2, 16, 2, False)]
        elif op.m <= 32:
            heroes = [(2, 16, 2, True), (2, 16, 1, False), (2, 16, 1, True), (1, 16, 2, True)]
        elif op.m <= 48:
            heroes = [(2, 16, 1, True), (2, 8, 1, True), (1, 16, 2, True)]
        else:  # four A fragments: (nb=2, kw=16) spills at 128 registers (ptxas, sm_90a); 8-warp blocks get 255
            heroes = [(2, 8, 1, True), (1, 16, 2, True), (1, 8, 2, True)]
        mf = -(-op.m // 16)
        return [PipelineConfig(warps=kw, params=(("nb", nb), ("kw", kw), ("unroll", un), ("coalesced", co),
                                                 ("prefetch", False), ("wide_regs", kw == 16)))
                for nb, kw, un, co in heroes if mf * nb * un <= 8]  # more spills at 512 threads (ptxas, sm_80)



def skinny_tf32_serves(op: GemmOp, profile: DeviceProfile) -> bool:
    """Whether ``cuda.gemm.skinny_tf32`` takes ``op`` with one TF32 product (the tiled TF32 GEMMs decline those
    few-row products: H100, x8 @ W.T against 1024-4096-row weights, wgmma_tf32 ran 0.13-0.36x cuBLAS TF32 and
    mma_tf32 0.83x on 11008 rows, the skinny kernel 0.99-1.18x; the estimates had ranked them first)."""
    return (op.dtype_a.storage is DType.F32 and op.fp32_precision is not Fp32Precision.HIGHEST
            and not _SKINNY_TF32.own_reasons(op, profile))


_SKINNY_TF32 = SkinnyTf32Gemm()


SKINNY_VARIANTS = [SkinnyMmaGemm, SkinnyTf32Gemm]
