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

from .. import compiler, launcher, toolkit
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


def served_by(condition: bool, reason: str) -> list[str]:
    """``[reason]`` when another variant serves the op better (the routing rules between variants), else []."""
    return [reason] if condition else []


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
        return self.own_reasons(op, profile)

    def own_reasons(self, op: Op, profile: DeviceProfile) -> list[str]:
        """The data requirements, then (where they hold) :meth:`extra_checks` -- :meth:`check` without asking
        whether the toolkit works (the routing rules between variants ask this of another variant)."""
        reasons = super().check(op, profile)
        if not reasons:
            reasons += self.extra_checks(op, profile)
        return reasons

    def extra_checks(self, op: Op, profile: DeviceProfile) -> list[str]:
        return []

    def estimate_seconds(self, op: Op, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        """Roofline on the Tensor Core peak of the math the variant runs (f16, bf16, TF32; 3xTF32 does
        three TF32 products), times :attr:`efficiency`, and on the device bandwidth."""
        return self.roofline(op, profile)

    def roofline(self, op: Op, profile: DeviceProfile, flops: float | None = None, busy: float = 1.0) -> float:
        """max(compute, memory) + a launch: ``flops`` (default the op's) on the Tensor Core peak of the variant's
        math at :attr:`efficiency` (three products for 3xTF32), the op's bytes at ``busy`` x the bandwidth."""
        mode = math_mode(op.dtypes[0].storage, getattr(op, "fp32_precision", Fp32Precision.HIGHEST))
        dtype = {"f16": "float16", "bf16": "bfloat16", "tf32": "tf32", "3xtf32": "tf32"}[mode]
        factor = 3.0 if mode == "3xtf32" else 1.0
        flop_t = (op.flops if flops is None else flops) * factor / (profile.peak(dtype) * 1e9 * max(self.efficiency, 1e-6))
        return max(flop_t, op.min_bytes / (max(profile.bandwidth_gbs, 1.0) * 1e9 * busy)) + 5e-6

    # -- spec / compile ----------------------------------------------------------------------
    def spec(self, op: Op, config: PipelineConfig, arrays: dict[str, int] | None) -> MmaSpec:
        raise NotImplementedError

    def grid(self, op: Op, spec: MmaSpec) -> tuple[int, int, int]:
        raise NotImplementedError

    def kernel_args(self, op: Op, ptrs: dict[str, int]) -> tuple:
        raise NotImplementedError

    #: whether configs are tile configs that :meth:`PipelineConfig.validate` checks too (after the spec's own
    #: ``check``); False for variants whose configs are plain parameters (GEMV, pointwise, depthwise)
    tiled = True

    def validate_config(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        try:
            spec = self.spec(op, config, None)
            spec.check()
        except UnsupportedConfigError as exc:
            return Validity(False, exc.reason)
        return config.validate(profile, smem_bytes=spec.smem_bytes) if self.tiled else Validity(True)

    def _kernel(self, spec: MmaSpec, profile: DeviceProfile) -> compiler.Kernel:
        arch = toolkit.arch_name(profile.compute_capability or toolkit.compute_capability(profile.device.index))
        return compiler.load(render(spec), KERNEL_NAME, arch, smem=spec.smem_bytes, threads=spec.threads)

    def prepare(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Any:
        cp = toolkit.cupy()
        with cp.cuda.Device(profile.device.index):
            return self._kernel(self.spec(op, config, None), profile)

    # -- binding (the plan cache) -----------------------------------------------------------------
    def fast_launch_ok(self, op: Op, config: PipelineConfig) -> bool:
        """Whether one kernel with pointer-only arguments computes ``op`` (no scratch, no second kernel):
        then :meth:`bind` returns a :class:`~tracea_cuda.launcher.FastLaunch`-based launcher."""
        return True

    def preload(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> None:
        """Compile and load every kernel :meth:`run` launches for ``op`` (so none compiles later, when a
        CUDA graph may be capturing). The default loads the main kernel of aligned operands."""
        self.prepare(op, config, profile)

    def bind(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        dev = profile.device.index
        stream = launcher.stream_getter(adapter, dev)
        launcher.refuse_if_capturing(stream(), self.name)
        if not self.fast_launch_ok(op, config):
            return self._bind_run(op, config, profile, adapter)
        ptr, device = launcher.pointer_getter(adapter), launcher.on_device(dev)
        roles = (op.roles[0], op.roles[1], "out", "bias")
        builds: dict[tuple[int, ...], launcher.FastLaunch] = {}

        def build(key: tuple[int, ...]) -> launcher.FastLaunch:
            # the pointers' residues mod 16 stand in for the pointers: alignment is all a spec reads of them
            spec = self.spec(op, config, dict(zip(roles, key)))
            with device():
                kernel = self._kernel(spec, profile)
            params = launcher.ParamBlock.from_args(lambda p: self.kernel_args(op, p), roles)
            return launcher.FastLaunch(kernel.function, self.grid(op, spec), spec.threads, spec.smem_bytes, params)

        builds[(0, 0, 0, 0)] = build((0, 0, 0, 0))
        name = self.name

        current = toolkit.cupy().cuda.runtime.getDevice
        single = launcher.single_device()

        def launch(x0: Any, x1: Any, bias: Any, out: Any) -> None:
            po = ptr(out)
            ptrs = (ptr(x0), ptr(x1), po, po if bias is None else ptr(bias))
            s = stream()
            fl = builds.get((ptrs[0] & 15, ptrs[1] & 15, po & 15, ptrs[3] & 15))
            if fl is None:  # misaligned views: another compiled variant of the kernel
                launcher.refuse_if_capturing(s, name)
                fl = builds[launcher.align_key(ptrs)] = build(launcher.align_key(ptrs))
            if single or current() == dev:
                fl(s, ptrs)
            else:
                with device():
                    fl(s, ptrs)

        launch.pointer_only = True  # type: ignore[attr-defined]
        return launch

    def _bind_run(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        """A launcher running :meth:`run` (several kernels, scratch): everything compiled now."""
        with toolkit.cupy().cuda.Device(profile.device.index):
            self.preload(op, config, profile)
        roles = op.roles

        def launch(*arrays: Any) -> None:
            self.run(op, config, OpArgs(dict(zip(roles, arrays)), arrays[-1], adapter), profile)

        return launch

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile, stream: Any = None) -> None:
        cp = toolkit.cupy()
        ptrs = run_pointers(args)
        dev = device_index(args.out)
        # Fast path: the launch plan depends on the op, the config, the device, the bias dtype and
        # which pointers are 16-byte aligned; rendering and hashing happen only on a miss.
        key = (op, config, dev, ptrs.get("bias_dtype"),
               tuple(sorted((k, v % 16) for k, v in ptrs.items() if isinstance(v, int))))
        plan = self._plans.get(key) if hasattr(self, "_plans") else None  # type: ignore[has-type]
        with cp.cuda.Device(dev):
            if plan is None:
                spec = self.spec(op, config, ptrs)
                plan = (self._kernel(spec, profile), self.grid(op, spec))
                if not hasattr(self, "_plans"):
                    self._plans = {}  # type: ignore[var-annotated]
                if len(self._plans) > 4096:
                    self._plans.clear()
                self._plans[key] = plan
            kernel, grid = plan
            kernel.launch(grid, self.kernel_args(op, ptrs), stream if stream is not None else launch_stream(args))


def run_pointers(args: OpArgs) -> dict[str, Any]:
    """The device addresses of a call's arrays by role, ``"out"``'s, and ``"bias_dtype"`` (the bias's dtype name)
    where a bias is given: what :meth:`CudaVariant.spec` and the kernel arguments of a ``run`` read."""
    ptrs: dict[str, Any] = {name: data_ptr(arr, name) for name, arr in args.arrays.items() if arr is not None}
    ptrs["out"] = data_ptr(args.out, "out")
    bias = args.arrays.get("bias")
    if bias is not None:
        ptrs["bias_dtype"] = DType.parse(bias.dtype, arg="bias").value
    return ptrs


def scratch_buffer(args: OpArgs, n: int, zeroed: bool = False) -> Any:
    """A float32 scratch buffer of ``n`` elements for one call, from the caller's framework allocator
    on the call's stream (see :func:`tracea_cuda.launcher.scratch`)."""
    return launcher.scratch(args.adapter, args.out, n, zeroed)


def aligned(ptrs: dict[str, int] | None, name: str, nbytes: int = 16) -> bool:
    """Whether pointer ``name`` is ``nbytes``-aligned (assumed when no pointers are known yet)."""
    return True if ptrs is None or name not in ptrs else ptrs[name] % nbytes == 0


def u64(v: int) -> np.uint64:
    return np.uint64(v)


def hero(tm: int, tn: int, tk: int, st: int, w: int, sw: SwizzleMode = SwizzleMode.XOR8, **params: Any) -> PipelineConfig:
    from tracea.semantic.config import BarrierMode  # noqa: PLC0415

    return PipelineConfig(tm, tn, tk, st, w, sw, BarrierMode.SYNC, tuple(params.items()))
