"""``cuda.gemm.gemv``: few-row GEMMs against an (N, K) weight (LLM decode, small-batch ``nn.Linear``),
bound by reading the weight once; see :mod:`tracea_cuda.emit.gemv`."""

from __future__ import annotations

from typing import Any

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import Requirements
from tracea.dtypes import DType
from tracea.ir.ops import GemmOp, LayerType
from tracea.semantic.config import PipelineConfig
from tracea.semantic.search_space import SearchSpace
from tracea.errors import UnsupportedConfigError

from .. import compiler, toolkit
from ..emit.gemv import KERNEL_NAME, WARPS, GemvSpec, render
from .base import FLOAT_IO, CudaVariant, aligned, u64

#: rows served: from 8 rows on, the per-row reads of A outweigh the weight stream (measured on an H100:
#: x16 @ W4096x4096.T ran at 13% of the copy bandwidth) and the mma/wgmma variants do better
SERVED_ROWS = 4
#: fraction of the measured copy bandwidth the kernel is expected to reach on large weights
BANDWIDTH_SHARE = 0.85


def _rows(m: int) -> int:
    """The compile-time row bound for ``m`` rows (powers of two keep the kernel count small)."""
    return next(r for r in (1, 2, 4, 8, 16) if r >= m)


def int_param(config: PipelineConfig, name: str, default: int) -> int:
    """Integer parameter ``name`` of ``config`` (``default`` when absent); anything else is refused."""
    value = config.get(name) or default
    if not isinstance(value, int) or isinstance(value, bool):
        raise UnsupportedConfigError(f"param {name}={value!r} must be an integer")
    return value


def flag_param(config: PipelineConfig, name: str, default: bool) -> bool:
    """Boolean parameter ``name`` of ``config`` (``default`` when absent; 0 / 1 read as False / True);
    anything else is refused."""
    value = config.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or value in (0, 1):
        return bool(value)
    raise UnsupportedConfigError(f"param {name}={value!r} must be a boolean")


class WeightStreamingGemm(CudaVariant):
    """Base of the few-row kernels streaming an (N, K) weight once (``C = epi(A @ B^T)``, A (M, K) row-major,
    one launch of ``(A, B, C, bias, M, N, K)``): the layout checks, config validation, compile and
    arguments they share. Subclasses set ``kernel_word`` (for reasons), ``render`` and ``kernel_name``,
    and add their own reasons in :meth:`row_reasons`."""

    kernel_word = "few-row"
    kernel_name = ""
    tiled = False  # configs are plain parameters: the spec checks them

    @staticmethod
    def render(spec: Any) -> str:
        raise NotImplementedError

    def row_reasons(self, op: GemmOp) -> list[str]:
        """Reasons of the subclass (rows, alignment) between the layout and the size checks."""
        return []

    def extra_checks(self, op: GemmOp, profile: DeviceProfile) -> list[str]:
        reasons = []
        if op.trans_a:
            reasons.append(f"A stored (K, M) (transposed) is not read by the {self.kernel_word} kernel")
        if not op.trans_b:
            reasons.append(f"B stored (K, N): the {self.kernel_word} kernel reads B stored (N, K) (an nn.Linear "
                           "weight); the mma/wgmma variants serve it")
        reasons += self.row_reasons(op)
        if op.n * op.k >= 2**62:
            reasons.append("weight larger than the 64-bit index range")
        return reasons

    def _kernel(self, spec: Any, profile: DeviceProfile) -> compiler.Kernel:
        arch = toolkit.arch_name(profile.compute_capability or toolkit.compute_capability(profile.device.index))
        return compiler.load(self.render(spec), self.kernel_name, arch, smem=spec.smem_bytes, threads=spec.threads)

    def kernel_args(self, op: GemmOp, ptrs: dict) -> tuple:
        bias = ptrs.get("bias") or ptrs["out"]
        return (u64(ptrs["a"]), u64(ptrs["b"]), u64(ptrs["out"]), u64(bias), np.int32(op.m), np.int32(op.n),
                np.int32(op.k))


#: weights of at least this many rows keep one warp a row over a short K (:func:`k_parts`)
TALL_ROWS = 4096


def k_parts(op: GemmOp) -> int:
    """Warps sharing a weight row (``ks``), each on an interleaved share of K: as many as give each at least one
    16-byte load a lane (8 at most), except on tall weights (:data:`TALL_ROWS`) over a short K (<= 8 loads a lane).
    A warp per row left narrow weights with too few loads in flight: H100, weights cycled through HBM, CUDA graphs
    vs cuBLAS, fp32 x1 @ W(N, K).T at N 256-2048, K 4096-8192 0.57-0.97x -> 1.09-1.37x, x4 0.42-0.98x ->
    1.66-3.05x, bf16 x1 0.52-0.87x -> 1.06-2.04x; tall / short-K weights 1.06-1.34x either way
    (``benchmarks/cuda/probe_streamed_rows.py --kernel gemv``)."""
    epv = 16 // op.dtype_a.storage.itemsize
    loads = op.k // (32 * epv)  # 16-byte loads a lane over the whole K
    if loads < 2 or (op.n >= TALL_ROWS and loads <= 8):
        return 1
    return min(8, 1 << (loads.bit_length() - 1))


class GemvGemm(WeightStreamingGemm):
    name = "cuda.gemm.gemv"
    description = ("few-row GEMM (M <= 4) against an (N, K) weight, e.g. nn.Linear decode: 16-byte streaming "
                   "loads of the weight, fp32 accumulation, warp reduction, fused epilogue; f16/bf16/f32 (f32 exact)")
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.GEMM,
                                dtypes=frozenset({DType.F16, DType.BF16, DType.F32}), out_dtypes=FLOAT_IO,
                                min_compute_capability=(7, 0), batched=False, max_dims={"m": SERVED_ROWS})
    efficiency = 0.05  # memory-bound: the estimate below is a bandwidth one
    wave_quantized = False  # many small blocks per SM
    priority = 30

    kernel_word = "GEMV"
    kernel_name = KERNEL_NAME
    render = staticmethod(render)

    def row_reasons(self, op: GemmOp) -> list[str]:
        if op.m > 1 and op.dtype_a.storage is not DType.F32:
            return [f"M={op.m} 16-bit rows: cuda.gemm.skinny_mma serves them (Tensor Cores; on an H100 at M = 4 on "
                    "7B/70B-class weights it ran 1.0-1.6x PyTorch, the previous default 0.73-1.17x)"]
        return []

    def estimate_seconds(self, op: GemmOp, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        bw = max(profile.bandwidth_gbs, 1.0) * 1e9 * BANDWIDTH_SHARE
        return op.min_bytes / bw + 3e-6

    def spec(self, op: GemmOp, config: PipelineConfig, ptrs: dict | None) -> GemvSpec:
        epv = 16 // op.dtype_a.storage.itemsize
        vec = epv if op.k % epv == 0 and aligned(ptrs, "a") and aligned(ptrs, "b") else 1
        npw = int_param(config, "npw", 2)
        bias_dtype = DType.parse(ptrs["bias_dtype"]) if ptrs and "bias_dtype" in ptrs else op.out_dtype
        return GemvSpec(op.dtype_a.storage, op.out_dtype, bias_dtype, op.epilogue, _rows(op.m), npw, vec,
                        int_param(config, "ks", 1))

    def grid(self, op: GemmOp, spec: GemvSpec) -> tuple[int, int, int]:
        rows_per_block = WARPS // spec.ks * spec.npw
        return (-(-op.n // rows_per_block), 1, 1)

    def search_space(self, op: GemmOp, profile: DeviceProfile) -> SearchSpace:
        return (SearchSpace().param("npw", [1, 2, 4]).param("ks", [1, 2, 4, 8])
                .where(lambda c: bool(self.validate_config(op, c, profile)) or "invalid"))

    def hero_configs(self, op: GemmOp, profile: DeviceProfile) -> list[PipelineConfig]:
        """One row per warp group split over :func:`k_parts` warps first; then the warp-per-row heroes (enough
        warps to keep every SM's memory pipes busy: one row per warp for narrow weights)."""
        warps_wanted = 8 * max(profile.compute_units, 1) * WARPS
        first = 1 if op.n < warps_wanted else 2
        npws = [first] + [n for n in (2, 4, 1) if n != first and (n < 4 or _rows(op.m) <= 2)]
        plain = [PipelineConfig(params=(("npw", n),)) for n in npws]
        ks = k_parts(op)
        return plain if ks == 1 else [PipelineConfig(params=(("npw", 1), ("ks", ks)))] + plain


GEMV_VARIANTS = [GemvGemm]
