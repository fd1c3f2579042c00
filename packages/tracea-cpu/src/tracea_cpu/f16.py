"""fp16 GEMM on x86 CPUs with F16C (``cpu.gemm.f16.<isa>``, AVX-512 and AVX2 builds): fp16 A and B
converted to fp32 while they are packed, fp32 products and accumulation (PyTorch's CPU fp16 matmul has
the same accuracy class), the fp32 epilogue, fp32 or fp16 output (kernel: :mod:`.emit.f16`, which says
why AVX512_FP16's fp16 arithmetic is not used). Operands: NumPy ``float16`` arrays or torch CPU
``float16`` tensors. On other CPUs no variant serves fp16 GEMMs: torch tensors fall back to PyTorch, NumPy
arrays to the float64 reference (``tracea doctor`` says why).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType
from tracea.errors import DTypeError, InvalidArgumentError, LayoutError
from tracea.ir.ops import GemmOp, LayerType, Op
from tracea.semantic import PipelineConfig, SearchSpace
from tracea.semantic.config import Validity

from . import kernels, spaces
from .isa import AVX2, AVX512, Isa
from .host_load import thread_picker
from .variant_base import CpuVariant, _check_rc, _require, _requested_threads, _validate_blocked

#: Fewer rows of A are declined: widening and packing the whole weight costs more than the GEMM (2-core Zen 3
#: VM, fp16 x 4096^2 against torch's `F.linear`: 1 / 4 / 8 / 16 rows 0.30 / 0.99 / 1.58 / 1.62x, after the
#: 8 x 8 register-transposing packer; 1 row was 0.10x before it); PyTorch serves them.
MIN_ROWS = 8
#: Elements the converting packers widen per second and core (2-core Zen 3 VM, the bf16 flavour: 16 x 4096^2
#: took 12.2 ms, of which the FMAs ~4.9: ~7.3 ms for the 16.8 M weight elements). The estimate adds it, so
#: that at few rows the skinny kernels (which read the weight once, in place) rank first: bf16 8 / 16 x
#: 4096^2 ran 3.3-3.6x / 4.1x torch there against the converting GEMM's 2.0x / 2.3x.
PACK_ELEMS_PER_CORE_S = 1.15e9


def widening_seconds(op: Op, profile: DeviceProfile) -> float:
    """The converting packers' time: every element of A and B widened once (:data:`PACK_ELEMS_PER_CORE_S`)."""
    if not isinstance(op, GemmOp):
        return 0.0
    return op.batch * (op.n + op.m) * op.k / (PACK_ELEMS_PER_CORE_S * max(1, profile.compute_units or 1))


def _host16(args: OpArgs, name: str, shape: tuple[int, ...], dtype: type = np.float16) -> np.ndarray | None:
    """A checked host view of argument ``name``: ``dtype``, C-contiguous, ``prod(shape)`` elements."""
    arr = args.host(name)
    if arr is None:
        return None
    if arr.dtype != dtype:
        raise DTypeError(name, arr.dtype, np.dtype(dtype).name)
    if not arr.flags.c_contiguous:
        raise LayoutError(name, arr, "a packed row-major (C-contiguous) array")
    if arr.size != math.prod(shape):
        raise InvalidArgumentError(name, arr, f"{math.prod(shape)} elements (shape {shape})")
    return arr


def _bias32(adapter: Any, bias: Any) -> np.ndarray:
    """The bias as a C-contiguous float32 array (fp16 widened: a new array to hold until the kernel returned)."""
    arr = adapter.to_numpy(bias)
    if arr.dtype not in (np.float16, np.float32):
        raise DTypeError("bias", arr.dtype, "float16 or float32")
    return np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)


class CpuGemmF16Variant(CpuVariant):
    """Blocked fp16 GEMM: converting packers, the ISA's fp32 micro-kernel, fp32 accumulation."""

    def __init__(self, isa: Isa) -> None:
        super().__init__(isa)
        self.name = f"cpu.gemm.f16.{isa.name}"
        self.description = f"blocked fp16 GEMM (fp16 -> fp32 on packing, {isa.name} fp32 micro-kernel), fused epilogue"
        self.requirements = Requirements(device_kind="cpu", op_kind=LayerType.GEMM, dtypes=frozenset({DType.F16}),
                                         out_dtypes=frozenset({DType.F16, DType.F32}),
                                         isa=tuple(isa.requires) + ("f16c",))

    #: what the check's "device lacks" reasons are prefixed with, and who serves the declined decode rows
    needs = " and F16C"
    decode_served_by = "PyTorch serves them"
    #: the library flavour (:func:`~tracea_cpu.kernels.f16_gemm_library`)
    bf16 = False

    def check(self, op: Op, profile: DeviceProfile) -> list[str]:
        reasons = [f"needs {self.isa.name}{self.needs}: {r}" if r.startswith("device lacks") else r
                   for r in super().check(op, profile)]
        if isinstance(op, GemmOp) and op.m < MIN_ROWS:
            reasons.append(f"m={op.m} rows: below {MIN_ROWS} widening the whole weight costs more than the GEMM "
                           f"(decode shapes: {self.decode_served_by})")
        return reasons

    def estimate_seconds(self, op: Op, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        return super().estimate_seconds(op, profile, config) + widening_seconds(op, profile)

    def search_space(self, op: Op, profile: DeviceProfile) -> SearchSpace:
        return spaces.blocked_space(self.isa, profile)

    def hero_configs(self, op: Op, profile: DeviceProfile) -> list[PipelineConfig]:
        return spaces.blocked_heroes(self.isa, op, profile=profile)

    def validate_config(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        return _validate_blocked(self.isa, config)

    def prepare(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Any:
        return _f16_plan(self, op, config)

    #: the kernel named in launch errors
    label = "fp16 gemm"

    def _picker(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile) -> Callable[[], int]:
        """The thread count of each call (:func:`~tracea_cpu.host_load.thread_picker`)."""
        return thread_picker(self.threads(op, config, profile), _requested_threads(config))

    def _bias_arg(self, op: GemmOp, adapter: Any) -> Callable[[Any], tuple[Any, int]]:
        """``bias -> (holder, fp32 address)`` for a launch: fp16 widened into a new array (the holder, kept
        until the kernel returned), fp32 as a contiguous copy or the array itself."""
        def arg(bias: Any) -> tuple[Any, int]:
            b32 = _bias32(adapter, bias)
            return b32, b32.ctypes.data

        return arg

    def _run_operands(self, op: GemmOp, args: OpArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """``((a, b, out, bias) addresses, their owners)`` for ``run`` (hold the owners until the kernel
        returned)."""
        a, b, out, b32 = host_operands(op, args)
        return (a.ctypes.data, b.ctypes.data, out.ctypes.data, None if b32 is None else b32.ctypes.data), (a, b, out, b32)

    def bind(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        assert isinstance(op, GemmOp)
        fn, geo = self.prepare(op, config, profile)
        ptr, pick, label = adapter.data_ptr, self._picker(op, config, profile), self.label
        head, mid, tail, out16, blocks = geo[:4], geo[4:6], geo[6:8], geo[8], geo[9:]
        if not op.epilogue.has_bias:
            def launch(a: Any, b: Any, bias: Any, out: Any) -> None:
                rc = fn(*head, ptr(a), *mid, ptr(b), *tail, ptr(out), out16, None, *blocks, pick())
                if rc:
                    _check_rc(rc, label)

            launch.pointer_only = True  # type: ignore[attr-defined]
            return launch
        bias_arg = self._bias_arg(op, adapter)

        def launch_bias(a: Any, b: Any, bias: Any, out: Any) -> None:
            held, pb = bias_arg(bias)  # the fp32 bias must outlive the kernel call: held until it returned
            rc = fn(*head, ptr(a), *mid, ptr(b), *tail, ptr(out), out16, pb, *blocks, pick())
            del held
            if rc:
                _check_rc(rc, label)

        launch_bias.pointer_only = True  # type: ignore[attr-defined]
        return launch_bias

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, GemmOp)
        fn, geo = self.prepare(op, config, profile)
        (a, b, out, bias), owners = self._run_operands(op, args)
        rc = fn(*geo[:4], a, *geo[4:6], b, *geo[6:8], out, geo[8], bias, *geo[9:], self.threads(op, config, profile))
        del owners  # referenced until the kernel returned
        _check_rc(rc, self.label)


def host_operands(op: GemmOp, args: OpArgs) -> tuple[Any, Any, Any, np.ndarray | None]:
    """Checked host views of an fp16 GEMM's a, b and out (fp16, or fp32 out) and its bias widened to float32
    (None without one; hold it until the kernel returned), for the ``run`` paths."""
    bt, m, n, k = op.batch, op.m, op.n, op.k
    a = _host16(args, "a", (bt, m, k))
    b = _host16(args, "b", (bt, k, n))
    out = _host16(args, "out", (bt, m, n), np.float16 if op.out_dtype is DType.F16 else np.float32)
    b32 = _bias32(args.adapter, args.arrays.get("bias")) if op.epilogue.has_bias else None
    if b32 is not None and b32.size != n:
        raise InvalidArgumentError("bias", b32, f"{n} values (one per output column)")
    return a, b, out, b32


@functools.lru_cache(maxsize=256)
def _f16_plan(variant: CpuGemmF16Variant, op: Op, config: PipelineConfig) -> tuple[Any, tuple]:
    """Validated config -> (``tr_gemm_f16`` / ``tr_gemm_bf16c``, its shape, stride, 16-bit-output flag and block
    arguments), memoised."""
    _require(variant.validate_config(op, config, None), variant.name, config)  # type: ignore[arg-type]
    assert isinstance(op, GemmOp)
    lib = kernels.f16_gemm_library(variant.isa.name, int(config.get("mr")), int(config.get("nr")), op.epilogue.key,
                                   variant.bf16)
    rsa, csa = (1, op.m) if op.trans_a else (op.k, 1)
    rsb, csb = (1, op.k) if op.trans_b else (op.n, 1)
    geo = (op.batch, op.m, op.n, op.k, rsa, csa, rsb, csb, int(op.out_dtype is not DType.F32),
           int(config.get("mc")), int(config.get("nc")), int(config.get("kc")))
    return kernels.half_gemm_entry(lib, variant.bf16), geo


def f16_variants() -> list[CpuGemmF16Variant]:
    """The fp16 GEMM variants (x86 with F16C: AVX-512 and AVX2 builds)."""
    return [CpuGemmF16Variant(AVX512), CpuGemmF16Variant(AVX2)]
