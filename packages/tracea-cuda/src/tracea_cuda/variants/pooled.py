"""``cuda.conv2d.pooled_gemm``: a 1x1 conv over a 1x1 plane is ``x @ W.T``.

Pooled heads apply 1x1 convs to (N, C, 1, 1) features: VGG's ``ConvMlp`` pre-logits in timm (a 4096 -> 4096 1x1
conv), MobileNetV3 / GhostNet ``conv_head``, every squeeze-and-excitation block's reduce / expand pair. Their
memory is a plain GEMM in any layout (x (N, C) row-major, the weight (K, C), the output (N, K)), with rows = the
batch: the few-row GEMM kernels (``gemv``, ``skinny_mma``, ``skinny_tf32``, ``wgmma_fewrows``) stream the weight
once, where the conv kernels tile a plane of one pixel (H100, VGG-11 fp32 batch 8, 4096 -> 4096: the NCHW
``cuda.conv2d.wgmma`` path 202 us, cuDNN 33 us, ``skinny_tf32`` on the same product ~20 us).

The variant ranks the CUDA GEMM variants that accept the product by their own estimates and runs the chosen
one's kernels on the conv's arrays as they are (pointers only: no copy, no reshape). Its configs are the GEMM
variant's, with a ``gemm`` param naming it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType
from tracea.errors import UnsupportedConfigError
from tracea.ir.ops import Conv2dOp, GemmOp, LayerType
from tracea.semantic.config import PipelineConfig, Validity
from tracea.semantic.search_space import SearchSpace

from .base import FLOAT_IO, CudaVariant

PARAM = "gemm"


def gemm_op(op: Conv2dOp) -> GemmOp:
    """The product a 1x1 conv over a 1x1 plane computes: (N, C) @ (K, C)^T with the conv's epilogue."""
    return GemmOp(op.n, op.k, op.c, trans_b=True, dtype_a=op.dtype, dtype_b=op.dtype, dtype_out=op.dtype_out,
                  epilogue=op.epilogue, fp32_precision=op.fp32_precision)


def pooled_shape(op: Conv2dOp) -> bool:
    """A dense 1x1 unpadded conv over a 1x1 plane (any stride or dilation: one output pixel)."""
    return (op.r, op.s) == (1, 1) and (op.h, op.w) == (1, 1) and op.padding == (0, 0) and op.groups == 1


def _gemm_variants() -> list[Any]:
    from . import all_variants  # noqa: PLC0415

    return [v for v in all_variants() if v.op_kind is LayerType.GEMM]


_GEMMS: list[Any] = []


def gemm_variants() -> list[Any]:
    """One instance of each CUDA GEMM variant (built on first use)."""
    if not _GEMMS:
        _GEMMS.extend(_gemm_variants())
    return _GEMMS


def candidates(op: Conv2dOp, profile: DeviceProfile) -> list[tuple[float, Any, PipelineConfig]]:
    """(estimate, GEMM variant, its first hero) for every GEMM variant accepting the product, fastest first."""
    gop = gemm_op(op)
    out = []
    for v in gemm_variants():
        if v.check(gop, profile):
            continue
        heroes = [c for c in v.hero_configs(gop, profile) if v.validate_config(gop, c, profile)]
        if heroes:
            out.append((float(v.estimate_seconds(gop, profile, heroes[0])), v, heroes[0]))
    return sorted(out, key=lambda t: (t[0], -t[1].priority))


def serves(op: Conv2dOp, profile: DeviceProfile) -> bool:
    """Whether ``cuda.conv2d.pooled_gemm`` takes ``op`` (the conv variants decline what it takes)."""
    return isinstance(op, Conv2dOp) and pooled_shape(op) and op.dtype in (DType.F16, DType.BF16, DType.F32) and \
        bool(candidates(op, profile))


def pooled_reasons(op: Conv2dOp, profile: DeviceProfile) -> list[str]:
    """The conv variants' reason to decline what ``cuda.conv2d.pooled_gemm`` serves (else none)."""
    if serves(op, profile):
        return ["a 1x1 conv over a 1x1 plane is x @ W.T: cuda.conv2d.pooled_gemm runs it on the GEMM variants "
                "(H100, VGG's 4096 -> 4096 fp32 head at batch 8: this path's NCHW kernel 202 us, cuDNN 33 us)"]
    return []


class PooledGemmConv(CudaVariant):
    name = "cuda.conv2d.pooled_gemm"
    description = ("1x1 convs over a 1x1 plane (pooled heads, squeeze-excitation) as x @ W.T on the CUDA GEMM "
                   "variant that fits the product (few-row kernels stream the weight once)")
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.CONV2D,
                                dtypes=frozenset({DType.F16, DType.BF16, DType.F32}), out_dtypes=FLOAT_IO,
                                min_compute_capability=(7, 0), groups=False)
    tiled = False
    wave_quantized = False  # the GEMM variant's estimate is used as is
    priority = 30

    def extra_checks(self, op: Conv2dOp, profile: DeviceProfile) -> list[str]:  # type: ignore[override]
        if not pooled_shape(op):
            return ["not a dense unpadded 1x1 conv over a 1x1 plane (the conv variants serve it)"]
        if not candidates(op, profile):
            return [f"no CUDA GEMM variant accepts {gemm_op(op).describe()}"]
        return []

    # -- the delegate ----------------------------------------------------------------------------
    def _split(self, config: PipelineConfig) -> tuple[Any, PipelineConfig]:
        name = config.get(PARAM)
        for v in gemm_variants():
            if v.name == name:
                return v, replace(config, params=tuple((k, val) for k, val in config.params if k != PARAM))
        raise UnsupportedConfigError(f"param {PARAM}={name!r} names no CUDA GEMM variant")

    def hero_configs(self, op: Conv2dOp, profile: DeviceProfile) -> list[PipelineConfig]:  # type: ignore[override]
        """The heroes of the best-estimated GEMM variant, then the first hero of the others."""
        ranked = candidates(op, profile)
        if not ranked:
            return []
        gop, first = gemm_op(op), ranked[0][1]
        tag = lambda v, c: replace(c, params=tuple(c.params) + ((PARAM, v.name),))  # noqa: E731
        return ([tag(first, c) for c in first.hero_configs(gop, profile) if first.validate_config(gop, c, profile)]
                + [tag(v, c) for _, v, c in ranked[1:]])

    def search_space(self, op: Conv2dOp, profile: DeviceProfile) -> SearchSpace:  # type: ignore[override]
        return SearchSpace().where(lambda c: bool(self.validate_config(op, c, profile)) or "invalid")

    def validate_config(self, op: Conv2dOp, config: PipelineConfig, profile: DeviceProfile) -> Validity:  # type: ignore[override]
        try:
            v, cfg = self._split(config)
        except UnsupportedConfigError as exc:
            return Validity(False, exc.reason)
        reasons = v.check(gemm_op(op), profile)
        if reasons:
            return Validity(False, "; ".join(reasons))
        return v.validate_config(gemm_op(op), cfg, profile)

    def estimate_seconds(self, op: Conv2dOp, profile: DeviceProfile,  # type: ignore[override]
                         config: PipelineConfig | None = None) -> float:
        if config is not None and config.get(PARAM):
            v, cfg = self._split(config)
            return float(v.estimate_seconds(gemm_op(op), profile, cfg))
        ranked = candidates(op, profile)
        return ranked[0][0] if ranked else float("inf")

    def prepare(self, op: Conv2dOp, config: PipelineConfig, profile: DeviceProfile) -> Any:  # type: ignore[override]
        v, cfg = self._split(config)
        return v.prepare(gemm_op(op), cfg, profile)

    def preload(self, op: Conv2dOp, config: PipelineConfig, profile: DeviceProfile) -> None:  # type: ignore[override]
        v, cfg = self._split(config)
        v.preload(gemm_op(op), cfg, profile)

    def bind(self, op: Conv2dOp, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:  # type: ignore[override]
        """The GEMM variant's launcher: it reads (x, w, bias, out) by pointer, whose memory is (a, b, bias, out)."""
        v, cfg = self._split(config)
        return v.bind(gemm_op(op), cfg, profile, adapter)

    def run(self, op: Conv2dOp, config: PipelineConfig, args: OpArgs, profile: DeviceProfile,  # type: ignore[override]
            stream: Any = None) -> None:
        v, cfg = self._split(config)
        inner = OpArgs({"a": args.arrays["x"], "b": args.arrays["w"], "bias": args.arrays.get("bias")}, args.out,
                       args.adapter)
        v.run(gemm_op(op), cfg, inner, profile)


POOLED_VARIANTS = [PooledGemmConv]
