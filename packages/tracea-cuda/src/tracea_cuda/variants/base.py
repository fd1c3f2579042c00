"""Shared machinery of the CUDA variants: availability checks, spec building, compile and launch."""

from __future__ import annotations

from typing import Any

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import KernelVariant, OpArgs
from tracea.dtypes import DType, Fp32Precision
from tracea.ir.ops import Op
from tracea.semantic.config import PipelineConfig, SwizzleMode, Validity
from tracea.errors import UnsupportedConfigError

from .. import compiler, toolkit
from ..arrays import data_ptr, device_index, launch_stream
from ..emit.mma import KERNEL_NAME, MmaSpec, render

FLOAT_IO = frozenset({DType.F32, DType.F16, DType.BF16})


def math_mode(dtype: DType, precision: Fp32Precision) -> str:
    """Tensor Core math for an input dtype: f16/bf16 directly; f32 as one TF32 product when TF32 is
    allowed (HIGH, MEDIUM) or as the 3xTF32 split when fp32 accuracy is required (HIGHEST)."""
    if dtype is DType.F16:
        return "f16"
    if dtype is DType.BF16:
        return "bf16"
    return "3xtf32" if precision is Fp32Precision.HIGHEST else "tf32"


def default_warp_m(config: PipelineConfig) -> int:
    """Warps along M when the config does not say: the split giving the squarest warp tile."""
    best, best_score = 1, None
    w = config.warps
    for wm in (1, 2, 4, 8):
        if w % wm:
            continue
        tm, tn = config.tile_m / wm, config.tile_n / (w // wm)
        score = abs(np.log2(tm / tn))
        if best_score is None or score < best_score:
            best, best_score = wm, score
    return best


def tile_shape(config: PipelineConfig) -> dict[str, int]:
    wm = int(config.get("warp_m") or default_warp_m(config))
    if config.warps % wm:
        raise UnsupportedConfigError(f"warp_m={wm} does not divide warps={config.warps}")
    return {"bm": config.tile_m, "bn": config.tile_n, "bk": config.tile_k, "stages": config.stages,
            "warps_m": wm, "warps_n": config.warps // wm, "swizzle": config.swizzle.factor,
            "group_m": int(config.get("group_m") or 8)}


class CudaVariant(KernelVariant):
    """Base of every CUDA variant: toolkit availability first, then the data requirements."""

    backend = "cuda"

    def check(self, op: Op, profile: DeviceProfile) -> list[str]:
        ok, reason = toolkit.status()
        if not ok and profile.device.kind == "cuda":
            return [reason]
        reasons = super().check(op, profile)
        if not reasons:
            reasons += self.extra_checks(op, profile)
        return reasons

    def extra_checks(self, op: Op, profile: DeviceProfile) -> list[str]:
        return []

    # -- spec / compile ----------------------------------------------------------------------
    def spec(self, op: Op, config: PipelineConfig, arrays: dict[str, int] | None) -> MmaSpec:
        raise NotImplementedError

    def grid(self, op: Op, spec: MmaSpec) -> tuple[int, int, int]:
        raise NotImplementedError

    def kernel_args(self, op: Op, ptrs: dict[str, int]) -> tuple:
        raise NotImplementedError

    def validate_config(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        try:
            spec = self.spec(op, config, None)
            spec.check()
        except UnsupportedConfigError as exc:
            return Validity(False, exc.reason)
        return config.validate(profile, smem_bytes=spec.smem_bytes)

    def _kernel(self, spec: MmaSpec, profile: DeviceProfile) -> compiler.Kernel:
        arch = toolkit.arch_name(profile.compute_capability or toolkit.compute_capability(profile.device.index))
        return compiler.load(render(spec), KERNEL_NAME, arch, smem=spec.smem_bytes, threads=spec.threads)

    def prepare(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Any:
        cp = toolkit.cupy()
        with cp.cuda.Device(profile.device.index):
            return self._kernel(self.spec(op, config, None), profile)

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile, stream: Any = None) -> None:
        cp = toolkit.cupy()
        ptrs: dict[str, Any] = {name: data_ptr(arr, name) for name, arr in args.arrays.items() if arr is not None}
        ptrs["out"] = data_ptr(args.out, "out")
        bias = args.arrays.get("bias")
        if bias is not None:
            ptrs["bias_dtype"] = DType.parse(bias.dtype, arg="bias").value
        dev = device_index(args.out)
        # Fast path: the launch plan depends on the op, the config, the device, the bias dtype and
        # which pointers are 16-byte aligned; rendering and hashing happen only on a miss.
        key = (op, config, dev, ptrs.get("bias_dtype"),
               tuple(sorted((k, v % 16) for k, v in ptrs.items() if isinstance(v, int))))
        plan = self._plans.get(key) if hasattr(self, "_plans") else None
        with cp.cuda.Device(dev):
            if plan is None:
                spec = self.spec(op, config, ptrs)
                plan = (self._kernel(spec, profile), self.grid(op, spec))
                if not hasattr(self, "_plans"):
                    self._plans = {}
                if len(self._plans) > 4096:
                    self._plans.clear()
                self._plans[key] = plan
            kernel, grid = plan
            kernel.launch(grid, self.kernel_args(op, ptrs), stream if stream is not None else launch_stream(args))


def scratch_buffer(cache: dict, dev: int, stream: Any, role: str, n: int, zeroed: bool = False) -> Any:
    """A float32 buffer of at least ``n`` elements cached in ``cache`` per (device, stream, role); reused
    only on the same stream, so stream order keeps consecutive calls from racing. ``zeroed``: zero-filled
    when allocated (for counters that the kernels using them return to zero)."""
    key = (dev, int(stream.ptr), role)
    buf = cache.get(key)
    if buf is None or buf.size < n:
        cp = toolkit.cupy()
        buf = cp.zeros(max(n, 1), dtype=np.float32) if zeroed else cp.empty(max(n, 1), dtype=np.float32)
        cache[key] = buf
    return buf


def aligned(ptrs: dict[str, int] | None, name: str, nbytes: int = 16) -> bool:
    """Whether pointer ``name`` is ``nbytes``-aligned (assumed when no pointers are known yet)."""
    return True if ptrs is None or name not in ptrs else ptrs[name] % nbytes == 0


def u64(v: int) -> np.uint64:
    return np.uint64(v)


def hero(tm: int, tn: int, tk: int, st: int, w: int, sw: SwizzleMode = SwizzleMode.XOR8, **params: Any) -> PipelineConfig:
    from tracea.semantic.config import BarrierMode  # noqa: PLC0415

    return PipelineConfig(tm, tn, tk, st, w, sw, BarrierMode.SYNC, tuple(params.items()))
