"""Shared machinery of the OpenCL variants: availability, config validation, program preparation,
launching on the arrays' queue, and event-timed measurement."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import KernelVariant, OpArgs
from tracea.dtypes import DType
from tracea.errors import LaunchError, UnsupportedConfigError, UnsupportedDeviceError
from tracea.ir.ops import Op
from tracea.semantic.config import PipelineConfig, Validity, VALID
from tracea.semantic.search_space import SearchSpace

from . import inflight, pack, programs, runtime, spaces
from .arrays import device_of, is_cl_array, queue_of
from .render import KernelSpec, render
from .tiling import Tiling

CL_TYPES = {DType.F32: "float", DType.F16: "half"}
INT32_MAX = 2**31 - 1
_kernels: "OrderedDict[tuple[int, str], Any]" = OrderedDict()
_kernels_lock = threading.Lock()
# pyopencl kernel objects hold their arguments: setting them and enqueueing must not interleave.
_launch_lock = threading.Lock()


def cl_type(dtype: DType) -> str:
    return CL_TYPES[dtype.storage]


class OpenCLVariant(KernelVariant):
    """Base of the OpenCL variants; subclasses describe the op as an (implicit) GEMM."""

    backend = "opencl"
    priority = 10

    # -- what subclasses provide ---------------------------------------------------------------------
    def gemm_view(self, op: Op) -> tuple[int, int, int, int]:
        """(M, N, K, grid depth) of the kernel for ``op``."""
        raise NotImplementedError

    def kernel_spec(self, op: Op, tiling: Tiling, bias_dtype: DType | None) -> KernelSpec:
        raise NotImplementedError

    def kernel_args(self, op: Op, args: OpArgs, context: Any) -> list[Any]:
        """Arguments after (A, offA, B, offB, bias, offBias, C, offC) and before (M, N, K)."""
        return []

    def operands(self, args: OpArgs) -> tuple[Any, Any]:
        raise NotImplementedError

    def element_counts(self, op: Op) -> list[int]:
        raise NotImplementedError

    def pack_dims(self, op: Op) -> tuple[int, int, int, bool]:
        """(batch, K, N, transposed) of B as stored, for packing it into column panels."""
        raise NotImplementedError

    # -- KernelVariant ---------------------------------------------------------------------------------
    def check(self, op: Op, profile: DeviceProfile) -> list[str]:
        st = runtime.status()
        if not st.available:
            return [st.reason]
        reasons = super().check(op, profile)
        if not reasons and max(self.element_counts(op)) > INT32_MAX:
            reasons.append("an operand exceeds 2^31-1 elements (the kernels index with 32-bit ints)")
        return reasons

    def search_space(self, op: Op, profile: DeviceProfile) -> SearchSpace:
        m, n, _, _ = self.gemm_view(op)
        return spaces.search_space(profile, m, n)

    def hero_configs(self, op: Op, profile: DeviceProfile) -> list[PipelineConfig]:
        m, n, _, _ = self.gemm_view(op)
        return spaces.hero_configs(profile, m, n, b_rows_contiguous=not self.pack_dims(op)[3])

    def validate_config(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        tiling = Tiling.from_config(config)
        problems = tiling.problems()
        if problems:
            return Validity(False, problems[0])
        if profile.max_threads_per_block > 1 and tiling.work_group_size > profile.max_threads_per_block:
            return Validity(False, f"work-group of {tiling.work_group_size} items exceeds the device limit "
                                   f"{profile.max_threads_per_block}")
        if profile.shared_mem_per_block and tiling.local_bytes > profile.shared_mem_per_block:
            return Validity(False, f"needs {tiling.local_bytes} B of local memory, device allows "
                                   f"{profile.shared_mem_per_block} B")
        return VALID

    def estimate_seconds(self, op: Op, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        base = super().estimate_seconds(op, profile, config)
        if config is None:
            return base
        m, n, _, _ = self.gemm_view(op)
        pm = -(-m // config.tile_m) * config.tile_m
        pn = -(-n // config.tile_n) * config.tile_n
        return base * (pm * pn) / (m * n)

    def prepare(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Any:
        self._require_valid(op, config, profile)
        context, queue = runtime.context_queue(profile.device)
        bias = op.out_dtype if op.epilogue.has_bias else None  # type: ignore[attr-defined]
        return self._kernel(context, queue.device, self.kernel_spec(op, Tiling.from_config(config), bias))

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        self.launch(op, config, args, profile)

    # -- launching -------------------------------------------------------------------------------------
    def _require_valid(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> None:
        v = self.validate_config(op, config, profile)
        if not v:
            raise UnsupportedConfigError(f"config {config.key} is invalid for {self.name} on {profile.name}: "
                                         f"{v.reason}", reason=v.reason)

    def _kernel(self, context: Any, device: Any, spec: KernelSpec) -> Any:
        program = programs.build(context, device, render(spec))
        key = (id(program), spec.kernel_name)
        with _kernels_lock:
            entry = _kernels.get(key)
            if entry is None:
                # The entry keeps its program alive, so id(program) cannot be reused while cached.
                entry = (runtime.cl().Kernel(program, spec.kernel_name), program)
                _kernels[key] = entry
                while len(_kernels) > programs.MAX_PROGRAMS:
                    _kernels.popitem(last=False)
            else:
                _kernels.move_to_end(key)
            return entry[0]

    def launch(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> Any:
        """Enqueue the kernel (after packing B when the kernel wants it k-major) on the output's queue;
        returns the OpenCL events in order."""
        self._require_valid(op, config, profile)
        inputs = self.operands(args)
        arrays = [*inputs, args.bias, args.out]
        for role, arr in zip(("input", "weight", "bias", "out"), arrays):
            if arr is not None and not is_cl_array(arr):
                raise UnsupportedDeviceError(f"{self.name} needs pyopencl arrays; '{role}' is "
                                             f"{type(arr).__name__} (copy it with tracea_opencl.to_device)")
        out = args.out
        queue = queue_of(out)
        dev = device_of(out)
        for arr in arrays:
            if arr is not None and arr.context.int_ptr != out.context.int_ptr:
                raise UnsupportedDeviceError(f"{self.name}: operands live in different OpenCL contexts")
        if dev != profile.device:
            raise UnsupportedDeviceError(f"{self.name}: arrays are on {dev}, profile is {profile.device}")
        tiling = Tiling.from_config(config)
        bias = args.bias
        bias_dtype = DType.parse(bias.dtype) if bias is not None else None
        spec = self.kernel_spec(op, tiling, bias_dtype)
        kernel = self._kernel(out.context, queue.device, spec)
        m, n, k, depth = self.gemm_view(op)
        events = []
        packed = None
        if spec.pack_b:
            packed, pack_event = pack.pack_b(queue, inputs[1], *self.pack_dims(op)[:3], tiling.tile_n,
                                             self.pack_dims(op)[3])
            inputs = (inputs[0], packed)
            events.append(pack_event)
        i32 = np.int32
        kargs = [inputs[0].base_data, i32(inputs[0].offset // inputs[0].dtype.itemsize),
                 inputs[1].base_data, i32(inputs[1].offset // inputs[1].dtype.itemsize),
                 None if bias is None else bias.base_data,
                 i32(0 if bias is None else bias.offset // bias.dtype.itemsize),
                 out.base_data, i32(out.offset // out.dtype.itemsize),
                 *self.kernel_args(op, args, out.context), i32(m), i32(n), i32(k)]
        gsize = (-(-n // tiling.tile_n) * tiling.wg_n, -(-m // tiling.tile_m) * tiling.wg_m, depth)
        lsize = (tiling.wg_n, tiling.wg_m, 1)
        pcl = runtime.cl()
        try:
            with _launch_lock:
                event = kernel(queue, gsize, lsize, *kargs)
        except pcl.Error as exc:
            raise LaunchError(f"{self.name} launch failed ({config.key}): {exc}", backend="opencl") from exc
        if packed is not None:  # only the enqueued kernel references the packed B now
            inflight.hold(event, packed)
        if runtime.context_queue(dev)[1] is not queue:
            runtime.note_queue(dev.index, queue)
        return [*events, event]
