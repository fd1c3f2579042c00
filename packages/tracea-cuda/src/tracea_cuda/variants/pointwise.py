"""``cuda.conv2d.pointwise``: 1x1 stride-1 convolutions with few channels (MobileNet / EfficientNet
projections such as 32->16 at 112^2), which move far more bytes than they compute; see
:mod:`tracea_cuda.emit.pointwise`."""

from __future__ import annotations

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import Requirements
from tracea.dtypes import DType
from tracea.errors import UnsupportedConfigError
from tracea.ir.ops import Conv2dOp, LayerType, Layout
from tracea.semantic.config import PipelineConfig
from tracea.semantic.search_space import SearchSpace

from .. import compiler, toolkit
from ..emit.pointwise import KERNEL_NAME, SMEM_LIMIT, THREADS, PointwiseSpec, render
from .base import FLOAT_IO, CudaVariant, aligned, u64
from .gemv import int_param
from .pooled import pooled_reasons

#: most FLOPs per byte moved that the variant serves: below the CUDA cores' balance point (an H200's fp32 FMA
#: peak over its bandwidth is ~14 FLOP/B) the layer is bound by memory there too; above, the Tensor Core
#: variants are faster (H200, 240->40 fp32 at 28^2 batch 32, 17 FLOP/B: 27.3 us here, 21.6 us implicit_mma)
MAX_FLOP_PER_BYTE = 12.0
#: fraction of the device bandwidth the estimate assumes (and of the fp32 FMA peak for the FLOPs)
BANDWIDTH_SHARE, FMA_SHARE = 0.8, 0.5
#: fixed cost per call in the estimate (launch, the weight slice's load, the tail of the grid)
FIXED_S = 2e-6


def flop_per_byte(op: Conv2dOp) -> float:
    """FLOPs per byte of x and out of a pointwise conv: 2 C K / ((C + K) itemsize)."""
    return 2.0 * op.c * op.k / ((op.c + op.k) * op.dtype.storage.itemsize)


class PointwiseConv(CudaVariant):
    name = "cuda.conv2d.pointwise"
    tiled = False  # configs are plain parameters: the spec checks them
    description = ("1x1 stride-1 conv with few channels on the CUDA cores: NCHW float32 read in place as "
                   "per-image W @ X (no transpose), NHWC f16/bf16/f32 rows; fp32 accumulation, fused epilogue")
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.CONV2D,
                                dtypes=frozenset({DType.F16, DType.BF16, DType.F32}), out_dtypes=FLOAT_IO,
                                min_compute_capability=(7, 0), groups=False)
    efficiency = FMA_SHARE  # of the fp32 FMA peak; the estimate below is mostly a bandwidth one
    wave_quantized = False  # many small blocks per SM
    priority = 15

    def extra_checks(self, op: Conv2dOp, profile: DeviceProfile) -> list[str]:
        reasons = pooled_reasons(op, profile)
        if (op.r, op.s) != (1, 1) or tuple(op.stride) != (1, 1) or tuple(op.padding) != (0, 0):
            reasons.append("not a 1x1 stride-1 unpadded conv")
        if op.layout is Layout.NCHW and op.dtype.storage is not DType.F32:
            reasons.append("16-bit conv needs NHWC (channels_last) layout; NCHW is served for float32 only")
        if flop_per_byte(op) > MAX_FLOP_PER_BYTE:
            reasons.append(f"{op.c}->{op.k} channels: {flop_per_byte(op):.1f} FLOP/B, compute-bound on CUDA cores "
                           f"(served up to {MAX_FLOP_PER_BYTE:g}); the Tensor Core conv variants serve it")
        if op.c * 4 * 4 > SMEM_LIMIT:
            reasons.append(f"C={op.c}: a weight slice of 4 output channels exceeds {SMEM_LIMIT} B of shared memory")
        if max(op.n * op.c * op.h * op.w, op.n * op.k * op.h * op.w) >= 2**62 or op.n * op.h * op.w >= 2**31:
            reasons.append("tensor larger than the index range")
        return reasons

    def estimate_seconds(self, op: Conv2dOp, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        bw = max(profile.bandwidth_gbs, 1.0) * 1e9 * BANDWIDTH_SHARE
        fma = profile.peak("float32") * 1e9 * FMA_SHARE
        return max(op.min_bytes / bw, op.flops / max(fma, 1.0)) + FIXED_S

    def _pixels(self, op: Conv2dOp) -> int:
        """P of the kernel: pixels per image (NCHW) or rows N*H*W (NHWC)."""
        return op.h * op.w if op.layout is Layout.NCHW else op.n * op.h * op.w

    def spec(self, op: Conv2dOp, config: PipelineConfig, ptrs: dict | None) -> PointwiseSpec:
        nchw = op.layout is Layout.NCHW
        kb = int_param(config, "kb", 16)
        vp = int_param(config, "vp", 1)
        bias_dtype = DType.parse(ptrs["bias_dtype"]) if ptrs and "bias_dtype" in ptrs else op.out_dtype
        osz, isz = op.out_dtype.itemsize, op.dtype.storage.itemsize
        if nchw:
            if vp > 1 and (self._pixels(op) % vp or not aligned(ptrs, "x", 4 * vp)):
                vp = 1  # an unaligned view or an odd plane: one pixel per thread (same grid shape per config)
            vec_in = False
            vec_out = vp > 1 and op.out_dtype.storage is DType.F32 and aligned(ptrs, "out", 4 * vp)
        else:
            if vp != 1:
                raise UnsupportedConfigError("NHWC runs one row per thread (vp=1)")
            vec_in = (op.c * isz) % 16 == 0 and aligned(ptrs, "x")
            epv = 16 // osz
            vec_out = op.k % epv == 0 and kb % epv == 0 and aligned(ptrs, "out")
        return PointwiseSpec(op.dtype.storage, op.out_dtype, bias_dtype, op.epilogue, nchw, op.c, op.k, kb, vp,
                             vec_in, vec_out)

    def _kernel(self, spec: PointwiseSpec, profile: DeviceProfile) -> compiler.Kernel:
        arch = toolkit.arch_name(profile.compute_capability or toolkit.compute_capability(profile.device.index))
        return compiler.load(render(spec), KERNEL_NAME, arch, smem=0, threads=THREADS)

    def grid(self, op: Conv2dOp, spec: PointwiseSpec) -> tuple[int, int, int]:
        p = self._pixels(op)
        chunks = op.n * -(-p // (spec.vp * THREADS)) if spec.nchw else -(-p // THREADS)
        return (spec.groups * chunks, 1, 1)

    def kernel_args(self, op: Conv2dOp, ptrs: dict) -> tuple:
        bias = ptrs.get("bias") or ptrs["out"]
        return (u64(ptrs["x"]), u64(ptrs["w"]), u64(ptrs["out"]), u64(bias), np.int32(self._pixels(op)))

    def search_space(self, op: Conv2dOp, profile: DeviceProfile) -> SearchSpace:
        vps = [1, 2, 4] if op.layout is Layout.NCHW else [1]
        return (SearchSpace().param("kb", [4, 8, 12, 16, 24, 32]).param("vp", vps)
                .where(lambda c: bool(self.validate_config(op, c, profile)) or "invalid"))

    def hero_configs(self, op: Conv2dOp, profile: DeviceProfile) -> list[PipelineConfig]:
        nchw = op.layout is Layout.NCHW
        cap = 16 if nchw else 32  # accumulators: kb x vp (NCHW at vp 4: 64 registers)
        step = 4 if nchw else 16 // op.out_dtype.itemsize  # NHWC: whole 16-byte output vectors
        per_group = -(-op.k // -(-op.k // cap))  # K spread evenly over the fewest groups of <= cap
        kb = -(-per_group // step) * step
        while op.c * kb * 4 > SMEM_LIMIT and kb > 4:
            kb -= 4
        p = self._pixels(op)
        vp = (4 if p % 4 == 0 else 2 if p % 2 == 0 else 1) if nchw else 1
        units = max(int(profile.compute_units or 1), 1)

        def blocks(kb_: int, vp_: int) -> int:
            chunks = op.n * -(-p // (vp_ * THREADS)) if nchw else -(-p // THREADS)
            return -(-op.k // kb_) * chunks

        # at least two blocks per SM: fewer pixels per thread first, then fewer channels per block
        while blocks(kb, vp) < 2 * units and vp > 1:
            vp //= 2
        while blocks(kb, vp) < 2 * units and kb > step and kb % (2 * step) == 0:
            kb //= 2
        first = PipelineConfig(params=(("kb", kb), ("vp", vp)))
        alt = PipelineConfig(params=(("kb", max(4, kb // 2) if nchw else kb), ("vp", 1 if vp > 1 else vp)))
        return [first] + ([alt] if alt != first and self.validate_config(op, alt, profile) else [])


POINTWISE_VARIANTS = [PointwiseConv]
