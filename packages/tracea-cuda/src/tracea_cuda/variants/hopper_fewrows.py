"""``cuda.gemm.wgmma_fewrows``: 16-bit GEMMs of a few rows (17-127 tokens: batched decode, small-batch
``nn.Linear``) against an (N, K) weight on Hopper, computed as C^T = W x^T.

wgmma's M side is 64 rows at least, so a 32-row ``x @ W.T`` on the row-major kernel fills half of every
tile with rows that do not exist, and its tiles along N are few (H100, weights streamed from memory:
0.26-0.66x cuBLAS at 24-64 rows). Swapped, the weight's rows fill wgmma's M side (128-row tiles, all of
them real) and the tokens its N side (one tile of 32-128 columns), in 64-row ping-pong tiles where they
fit one wave, 128-row tiles where they do not, K split only where the 128-row tiles leave most SMs idle;
the kernel stores C^T column-major, i.e. C row-major. Every byte the
producer loads from memory is then the weight's (the tokens' tile comes from L2).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType, Fp32Precision
from tracea.ir.ops import GemmOp, LayerType
from tracea.semantic.config import BarrierMode, PipelineConfig, SwizzleMode
from tracea.semantic.search_space import SearchSpace

from ..emit.wgmma import BK, WgmmaSpec
from .base import FLOAT_IO
from .hopper import WgmmaGemm, _hero
from .skinny import SERVED_ROWS

#: most rows (tokens) served: 17-127 rows measured at or above the 128-row Hopper GEMM on most weights (H100,
#: probe_fewrows.py, 113-127 rows: W4096x4096 0.78-0.81x against 0.65-0.67x, W2048x2048 0.64-0.66x against
#: 0.48x, W11008x4096 0.97x against 1.00-1.02x); 128 rows below its narrow-tile hero (W4096x4096 0.82x against
#: 0.93x, W5120x5120 0.85x / 0.93x). The tokens' tile is rounded up to 16 columns (128 at most).
MAX_ROWS = 127
#: shared memory the hero's stage ring may take (bytes): room is left for the epilogue and barriers
RING_BYTES = 192 * 1024
#: at least this many 64-wide k-tiles per K slice (a shorter slice does not fill the pipeline)
MIN_SLICE_KTILES = 8
#: the split hero comes first only over at least this many k-tiles (K >= 4096)
SPLIT_MIN_KTILES = 64


def slices(n: int, k: int, sms: int, max_slices: int = 16) -> int:
    """K slices for ``n`` weight rows in 128-row tiles: as many as fill the SMs with one piece each, at most
    ``max_slices`` and no slice under :data:`MIN_SLICE_KTILES` k-tiles."""
    tiles = -(-n // 128)
    return max(1, min(max_slices, sms // max(tiles, 1), -(-k // BK) // MIN_SLICE_KTILES))


def token_tile(op: GemmOp) -> int:
    """The kernel's tile_n: the tokens (``op.m``) rounded up to wgmma's N steps of 16, 128 at most."""
    return min(128, -(-op.m // 16) * 16)


def stages_for(bn: int) -> int:
    """Deepest ring (at most 8 stages) of 128 x 64 weight and bn x 64 token tiles within :data:`RING_BYTES`."""
    return max(2, min(8, RING_BYTES // ((128 + bn) * BK * 2)))


class WgmmaFewRows(WgmmaGemm):
    """The Hopper GEMM (:class:`~tracea_cuda.variants.hopper.WgmmaGemm`) on the swapped product of a few-row
    ``x @ W.T``: :meth:`kernel_op` exchanges M and N, :meth:`operands` hands the kernel W as A and x as B, and
    the spec stores C^T column-major (the row-major C the caller asked for). ``x @ B`` with B stored (K, N)
    row-major runs the same way with B read MN-major (any row count up to 127: no weight-streaming kernel of
    16-bit rows reads that layout faster). Declines 16 rows and fewer against an (N, K) weight (the
    weight-streaming kernels' range), batches, a transposed x and K (or a (K, N) B's N) not a multiple of 8."""

    name = "cuda.gemm.wgmma_fewrows"
    description = ("few-row (17-127) f16/bf16 GEMM against an (N, K) weight for Hopper, computed as C^T = W x^T: "
                   "the weight's rows on wgmma's 64-row side, the tokens on its N side (K split across CTAs where the "
                   "weight's tiles are few), C stored transposed (row-major C); TMA + wgmma, sm_90a")
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.GEMM, dtypes=frozenset({DType.F16, DType.BF16}),
                                out_dtypes=FLOAT_IO, isa=("wgmma", "tma"), min_compute_capability=(9, 0),
                                batched=False, max_dims={"m": MAX_ROWS})
    priority = 21
    pads_rows = False  # rows TMA cannot address are refused (extra_checks), not copied

    def extra_checks(self, op: GemmOp, profile: DeviceProfile) -> list[str]:
        reasons = super().extra_checks(op, profile)
        if op.m <= SERVED_ROWS and op.trans_b:
            reasons.append(f"M={op.m} <= {SERVED_ROWS}: the few-row weight-streaming kernels serve it "
                           "(cuda.gemm.skinny_mma, cuda.gemm.gemv)")
        if op.trans_a:
            reasons.append("serves x @ W.T / x @ B with x (M, K) row-major (the weight becomes the kernel's A)")
        if op.k % 8:
            reasons.append(f"K={op.k} is not a multiple of 8: rows TMA cannot address")
        if not op.trans_b and op.n % 8:
            reasons.append(f"B stored (K, N) with N={op.n} not a multiple of 8: rows TMA cannot address")
        return reasons

    def kernel_op(self, op: GemmOp) -> GemmOp:
        """The GEMM as the kernel sees it: the weight as A -- (N, K) K-major, or B stored (K, N) read MN-major
        (16-bit wgmma transposes it) -- and the tokens (M, K) as a K-major B."""
        return replace(op, m=op.n, n=op.m, trans_a=not op.trans_b, trans_b=True)

    def kmajor(self, op: GemmOp) -> tuple[bool, bool]:
        return not op.trans_a, True

    def spec(self, op: GemmOp, config: PipelineConfig, ptrs: dict | None) -> WgmmaSpec:
        sp = super().spec(self.kernel_op(op), config, ptrs)
        return replace(sp, out_cm=True, pairs=False, vec_store=False)

    def operands(self, op: GemmOp, args: OpArgs, ptrs: dict, stream: Any) -> tuple[int, int]:
        return ptrs["b"], ptrs["a"]

    def hero_configs(self, op: GemmOp, profile: DeviceProfile) -> list[PipelineConfig]:
        # Kernel terms: M' = the N weight rows, N' = the tokens in one tile. H100, weights streamed from
        # memory (benchmarks/cuda/probe_fewrows.py, kernel time vs cuBLAS at 17-96 rows): 64-row ping-pong
        # tiles where they fit one wave (W4096x4096 0.90-0.97x, W8192x8192 0.96-1.02x, W5120x5120 0.88-0.96x,
        # W2048x2048 0.77-0.94x, against 0.69-0.86x / 0.89-0.99x / 0.77-0.93x / 0.55-0.78x for 128-row
        # tiles); 128-row tiles unsplit where the 64-row ones take more than a wave (W11008x4096 0.97-1.03x,
        # W13824x5120 0.99-1.02x, W28672x8192 1.13-1.21x); a K split only where the 128-row tiles leave
        # most SMs idle over a long K (W1024x8192: 8 tiles, 6-8 slices 0.63-0.69x, unsplit or ping-pong
        # lower; W768x3072: ping-pong 0.63-0.75x, 6 slices 0.54-0.61x). The split costs elsewhere (W4096x4096:
        # 4 slices 0.71x against 0.86x unsplit): its pieces wait for each other.
        bn = token_tile(op)
        st = stages_for(bn)
        sms = max(profile.compute_units, 1)
        pingpong = _hero(bn, st, schedule="pingpong", bm=64, cluster=1, smem_epilogue=False)
        whole = _hero(bn, st, cluster=1, smem_epilogue=False)
        s = slices(op.n, op.k, sms, max_slices=8)
        split = _hero(bn, st, cluster=1, split_k=s, smem_epilogue=False)
        if 16 * -(-op.n // 128) <= sms and -(-op.k // BK) >= SPLIT_MIN_KTILES and s > 1:
            heroes = [split, pingpong, whole]
        elif -(-op.n // 64) <= sms:
            heroes = [pingpong, whole] + ([split] if s > 1 else [])
        else:
            heroes = [whole, pingpong] + ([split] if s > 1 else [])
        return heroes

    def search_space(self, op: GemmOp, profile: DeviceProfile) -> SearchSpace:
        bn = token_tile(op)
        return (SearchSpace().tile_m([64, 128]).tile_n(sorted({bn, min(128, bn + 16)})).tile_k([BK])
                .stages([4, 5, 6, 7, 8]).warps([12]).swizzles([SwizzleMode.XOR8])
                .barrier_modes([BarrierMode.PRODUCER_CONSUMER]).param("group_m", [8])
                .param("schedule", ["coop", "pingpong"]).param("smem_epilogue", [False]).param("cluster", [1])
                .param("split_k", [1, 2, 3, 4, 6, 8, 12, 16])
                .where(lambda c: bool(self.validate_config(op, c, profile)) or "invalid"))



class WgmmaFewRowsTf32(WgmmaFewRows):
    """:class:`WgmmaFewRows` for float32 with TF32 allowed (``fp32_precision`` high / medium): the swapped product
    C^T = W x^T on TF32 wgmma, whose shared-memory operands must be K-major -- the weight (N, K) and the tokens
    (M, K) both are. ``x @ B`` with B stored (K, N) is declined (an MN-major weight; ``cuda.gemm.wgmma_tf32`` swaps
    that product itself), and 16 rows and fewer (``cuda.gemm.skinny_tf32`` streams those)."""

    name = "cuda.gemm.wgmma_fewrows_tf32"
    description = ("few-row (17-127) float32 GEMM with TF32 allowed against an (N, K) weight for Hopper, computed as "
                   "C^T = W x^T on TF32 wgmma: the weight's rows on wgmma's 64-row side, the tokens on its N side, C "
                   "stored transposed (row-major C); TMA + wgmma, sm_90a")
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.GEMM, dtypes=frozenset({DType.F32}),
                                out_dtypes=FLOAT_IO, isa=("wgmma", "tma"), min_compute_capability=(9, 0),
                                batched=False, max_dims={"m": MAX_ROWS},
                                fp32_precisions=frozenset({Fp32Precision.HIGH, Fp32Precision.MEDIUM}))

    def __init__(self) -> None:
        super().__init__()
        from .gemm import MmaGemmTf32  # noqa: PLC0415

        self._fallback = MmaGemmTf32()  # type: ignore[assignment]

    def extra_checks(self, op: GemmOp, profile: DeviceProfile) -> list[str]:
        reasons = super().extra_checks(op, profile)
        if not op.trans_b:
            reasons.append("B stored (K, N): TF32 wgmma reads K-major operands only (cuda.gemm.wgmma_tf32 swaps "
                           "x @ B itself, rows_kn streams it)")
        return reasons


#: rows up to which the tiled TF32 GEMMs give way to cuda.gemm.wgmma_fewrows_tf32 (measured there; 65-127 rows are
#: left to the estimates)
TF32_ROUTED_ROWS = 64


def fewrows_tf32_serves(op: GemmOp, profile: DeviceProfile) -> bool:
    """Whether ``cuda.gemm.wgmma_fewrows_tf32`` takes ``op`` where the tiled TF32 GEMMs decline it (17-64 rows). H200,
    weights cycled through HBM, CUDA graphs vs cuBLAS TF32 over 8 weights (768x768 to 4096x25088) at 17-64 rows: this
    kernel 0.78-1.36x, ``wgmma_tf32`` 0.10-0.94x, ``mma_tf32`` 0.16-0.78x (the estimates tie: both are bandwidth
    rooflines)."""
    return (op.dtype_a.storage is DType.F32 and op.fp32_precision is not Fp32Precision.HIGHEST
            and op.m <= TF32_ROUTED_ROWS and not _FEWROWS_TF32.own_reasons(op, profile))


_FEWROWS_TF32 = WgmmaFewRowsTf32()


FEWROWS_VARIANTS = [WgmmaFewRows, WgmmaFewRowsTf32]
