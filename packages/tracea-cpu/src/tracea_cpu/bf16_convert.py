"""16-bit kernels for x86 CPUs without AVX512_BF16 or AMX, through their fp32 ones (AVX2 and AVX-512 builds):

* ``cpu.gemm.bf16cvt.<isa>``: bf16 A and B widened to fp32 while they are packed (exact: a bf16 is the top
  half of an fp32), the ISA's fp32 blocked driver and micro-kernel, the fp32 epilogue, and an fp32 or bf16
  (round to nearest even, NaN kept) output. Kernel: :data:`.emit.f16.BF16C`, the bf16 flavour of the fp16
  library.
* ``cpu.conv2d.bf16cvt.<isa>`` / ``cpu.conv2d.f16cvt.<isa>``: x and w widened into fp32 scratch
  (:mod:`.emit.bf16_cast`), the ISA's fp32 conv, the output rounded back.

Why: PyTorch's CPU bf16 matmul has no fast path there. 2-core AMD Zen 3 VM (AVX2), torch 2.13, ``F.linear``
bf16 512^3 / 1024^3 / 2048^3 / 512x4096x4096: 15 / 18 / 20 / 16 GFLOP/s against 106-115 in fp32.
Where AVX512_BF16 (``cpu.gemm.avx512bf16``, twice the fp32 FMA rate) or AMX exists, those rank first.
"""

from __future__ import annotations

import ctypes
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType
from tracea.errors import LayoutError
from tracea.ir.ops import Conv2dOp, GemmOp, LayerType, Op
from tracea.runtime.arrays import NumpyAdapter
from tracea.semantic import PipelineConfig, SearchSpace

from . import kernels
from .bf16 import bf16_operand, bias_f32, f32_operand, host_bf16, widened_bias
from .f16 import CpuGemmF16Variant, widening_seconds
from .host_load import thread_picker
from .isa import AVX2, AVX512, Isa
from .variant_base import CpuVariant, _host, _ptr, _requested_threads
from .variants import CpuConv2dVariant

#: Share of the fp32 blocked GEMM's speed the widening packers leave (they convert every element of A and
#: B once per pass; measured on the Zen 3 VM: 0.85-0.95 of the fp32 kernel on 512-2048 squares).
CONVERT_SHARE = 0.85


class CpuGemmBf16ConvertVariant(CpuGemmF16Variant):
    """Blocked bf16 GEMM for CPUs without a bf16 dot product: the fp16 variant's widening packers, fp32
    micro-kernel, blocks, heroes and decode-row decline (:data:`~tracea_cpu.f16.MIN_ROWS`: 1 / 4 / 8 / 16
    tokens x 4096^2 ran 0.43 / 0.84 / 1.97 / 2.27x torch on the Zen 3 VM), with bf16 operands."""

    needs = ""
    decode_served_by = "the skinny kernels or PyTorch serve them"
    bf16 = True

    def __init__(self, isa: Isa) -> None:
        super().__init__(isa)
        self.name = f"cpu.gemm.bf16cvt.{isa.name}"
        self.description = (f"blocked bf16 GEMM (bf16 -> fp32 on packing, {isa.name} fp32 micro-kernel), "
                            "fused epilogue, bf16 or fp32 output")
        self.requirements = Requirements(device_kind="cpu", op_kind=LayerType.GEMM, dtypes=frozenset({DType.BF16}),
                                         out_dtypes=frozenset({DType.BF16, DType.F32}), isa=isa.requires)

    def estimate_seconds(self, op: Op, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        # fp32 FMAs (the profile's bf16 peak would be a bf16 dot product's, which this kernel does not use)
        eff = self.efficiency_on(profile) * CONVERT_SHARE
        flop_time = op.flops / (profile.peak("float32") * 1e9 * eff)
        byte_time = op.min_bytes / ((profile.bandwidth_gbs or 20.0) * 1e9)
        return max(flop_time, byte_time) + widening_seconds(op, profile) + 15e-6

    label = "bf16 gemm"

    def _picker(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile) -> Callable[[], int]:
        """The thread count of each call, capped by the host's load where the config allows
        (:func:`~tracea_cpu.host_load.thread_picker`)."""
        return thread_picker(self.threads(op, config, profile), _requested_threads(config))

    def _bias_arg(self, op: GemmOp, adapter: Any) -> Callable[[Any], tuple[Any, int]]:
        """The bias arrives in the output dtype and the epilogue runs in fp32: a bf16 one widened into a new
        array (the holder), an fp32 one read in place."""
        if op.out_dtype is DType.BF16:
            def widened(bias: Any) -> tuple[Any, int]:
                b32 = widened_bias(adapter, bias)
                return b32, b32.ctypes.data

            return widened
        ptr = adapter.data_ptr
        return lambda bias: (bias, ptr(bias))

    def _run_operands(self, op: GemmOp, args: OpArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        bt, m, n, k = op.batch, op.m, op.n, op.k
        # every (address, owner) pair keeps its owner referenced until the kernel has returned
        a, a_owner = bf16_operand(args, "a", (bt, m, k))
        b, b_owner = bf16_operand(args, "b", (bt, k, n))
        out, out_owner = (f32_operand if op.out_dtype is DType.F32 else bf16_operand)(args, "out", (bt, m, n))
        bias_arr = bias_f32(args, n) if op.epilogue.has_bias else None
        return (a, b, out, _ptr(bias_arr)), (a_owner, b_owner, out_owner, bias_arr)


class CpuConv2dBf16ConvertVariant(CpuConv2dVariant):
    """bf16 (or, with ``dtype``, fp16) conv2d for CPUs without AMX: x and w widened to fp32 scratch arrays
    (exact), the fp32 conv of the same ISA (its algorithms, heroes and search space), the fp32 output rounded
    to the 16-bit dtype (nearest even).
    PyTorch's bf16 conv there: 2-core Zen 3 VM, ResNet 3x3 layers 1.6-17.5 GFLOP/s (NCHW 24-50x, channels_last
    8-9x slower than its fp32 convs)."""

    def __init__(self, isa: Isa, dtype: DType = DType.BF16) -> None:
        super().__init__(isa)
        self.half = dtype
        tag = "bf16" if dtype is DType.BF16 else "f16"
        self.name = f"cpu.conv2d.{tag}cvt.{isa.name}"
        self.description = (f"{tag} conv2d through the {isa.name} fp32 conv (x, w widened exactly; output rounded "
                            "to nearest even), NCHW/NHWC, fused epilogue")
        needs = isa.requires if dtype is DType.BF16 else tuple(isa.requires) + ("f16c",)
        self.requirements = Requirements(device_kind="cpu", op_kind=LayerType.CONV2D, dtypes=frozenset({dtype}),
                                         out_dtypes=frozenset({dtype, DType.F32}), isa=needs)

    @staticmethod
    def fp32(op: Op) -> Op:
        """The fp32 conv computed in place of the bf16 ``op``."""
        return replace(op, dtype=DType.F32, dtype_out=DType.F32) if isinstance(op, Conv2dOp) else op

    def estimate_seconds(self, op: Op, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        return super().estimate_seconds(self.fp32(op), profile, config) / CONVERT_SHARE

    def search_space(self, op: Op, profile: DeviceProfile) -> SearchSpace:
        return super().search_space(self.fp32(op), profile)

    def hero_configs(self, op: Op, profile: DeviceProfile) -> list[PipelineConfig]:
        return super().hero_configs(self.fp32(op), profile)

    def prepare(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Any:
        return super().prepare(self.fp32(op), config, profile)

    def _computer(self, op: Conv2dOp, config: PipelineConfig, profile: DeviceProfile) -> Any:
        """``compute(x, w, bias32, out)`` on data addresses (the kernel's memory order, packed, as a
        pointer-only launcher gets them): bf16 x and w widened into fp32 scratch, the fp32 conv, its output
        rounded into the bf16 ``out`` or written straight into the float32 one; ``bias32`` a float32
        array or None."""
        inner = super().bind(self.fp32(op), config, profile, NumpyAdapter())
        cast = kernels.bf16_cast_library(self.isa.name)
        bf = self.half is DType.BF16
        widen, rnd = (cast.tr_bf16_widen, cast.tr_bf16_round) if bf else (cast.tr_f16_widen, cast.tr_f16_round)
        nth = max(1, self.threads(self.fp32(op), config, profile))
        out_b16 = op.out_dtype is self.half
        nx, nw = op.n * op.c * op.h * op.w, op.k * (op.c // op.groups) * op.r * op.s
        no = op.n * op.k * op.p * op.q

        def compute(x: int, w: int, b32: Any, out: int) -> None:
            x32, w32 = np.empty(nx, np.float32), np.empty(nw, np.float32)
            widen(x, x32.ctypes.data, nx, nth)
            widen(w, w32.ctypes.data, nw, nth)
            if not out_b16:
                inner(x32, w32, b32, np.ctypeslib.as_array((ctypes.c_float * no).from_address(out)))
                return
            o32 = np.empty(no, np.float32)
            inner(x32, w32, b32, o32)
            rnd(o32.ctypes.data, out, no, nth)

        return compute

    def bind(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        assert isinstance(op, Conv2dOp)
        compute, ptr = self._computer(op, config, profile), adapter.data_ptr
        out_b16, has_bias = op.out_dtype is DType.BF16, op.epilogue.has_bias

        def launch(x: Any, w: Any, bias: Any, out: Any) -> None:
            b32 = None
            if has_bias:  # the bias arrives in the output dtype; the epilogue runs in fp32
                b32 = widened_bias(adapter, bias) if out_b16 else \
                    np.ascontiguousarray(adapter.to_numpy(bias), np.float32)  # (fp16 / fp32: NumPy widens)
            compute(ptr(x), ptr(w), b32, ptr(out))

        launch.pointer_only = True  # type: ignore[attr-defined]
        return launch

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, Conv2dOp)
        if self.half is DType.BF16:
            xb, wb = host_bf16(args, "x", op.x_shape), host_bf16(args, "w", op.w_shape)
            out = host_bf16(args, "out", op.out_shape) if op.out_dtype is DType.BF16 else _host(args, "out", op.out_shape)
            b32 = bias_f32(args, op.k) if op.epilogue.has_bias else None
        else:
            from .f16 import _bias32, _host16

            xb, wb = _host16(args, "x", op.x_shape), _host16(args, "w", op.w_shape)
            out = _host16(args, "out", op.out_shape, np.float16 if op.out_dtype is DType.F16 else np.float32)
            b32 = _bias32(args.adapter, args.arrays.get("bias")) if op.epilogue.has_bias else None
        if out is None or not out.flags.writeable:
            raise LayoutError("out", out, "a writable array")
        self._computer(op, config, profile)(_ptr(xb), _ptr(wb), b32, _ptr(out))


def bf16_convert_variants() -> list[CpuVariant]:
    """The converting bf16 GEMM and bf16 / fp16 conv2d variants (AVX-512 and AVX2 builds)."""
    return [CpuGemmBf16ConvertVariant(AVX512), CpuGemmBf16ConvertVariant(AVX2),
            CpuConv2dBf16ConvertVariant(AVX512), CpuConv2dBf16ConvertVariant(AVX2),
            CpuConv2dBf16ConvertVariant(AVX512, DType.F16), CpuConv2dBf16ConvertVariant(AVX2, DType.F16)]
