"""bf16 GEMM on CPUs with AVX512_BF16 (``cpu.gemm.avx512bf16``): bf16 A and B, fp32 accumulation,
bf16 or fp32 output, the fp32 GEMM's fused epilogues, transposes and batches.

NumPy has no bf16 dtype without ml_dtypes, so the kernel reads the arrays' raw bits: the array
adapter's ``host_bits`` (torch CPU tensors: a zero-copy int16 view; ml_dtypes arrays: a uint16 view).
"""

from __future__ import annotations

import ctypes
import functools
import math
from typing import Any

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType
from tracea.errors import DTypeError, InvalidArgumentError, LayoutError, TraceaError
from tracea.ir.ops import GemmOp, LayerType, Op
from tracea.semantic import PipelineConfig, SearchSpace
from tracea.semantic.config import Validity
from tracea.runtime.arrays import imported

from . import kernels, spaces
from .isa import AVX512_BF16
from .host_load import thread_picker
from .variant_base import CpuVariant, _check_rc, _host, _ptr, _require, _requested_threads, _validate_blocked

# Measured share of the bf16 dot-product peak (2x the fp32 FMA rate) the kernel reaches.
BF16_EFFICIENCY = 0.85
_HOW = "a torch CPU bfloat16 tensor, or a NumPy bfloat16 array (needs ml_dtypes)"


def host_bf16(args: OpArgs, name: str, shape: tuple[int, ...], packed: bool = True) -> np.ndarray | None:
    """A zero-copy ``uint16`` view of bf16 argument ``name`` (None stays None); C-contiguous unless
    ``packed`` is False (then with the argument's own strides)."""
    obj = args.out if name == "out" else args.arrays.get(name)
    if obj is None:
        return None
    # torch.bfloat16 / ml_dtypes' bfloat16 by name (cheap); anything else is asked of the adapter.
    if not str(getattr(obj, "dtype", "")).endswith("bfloat16"):
        dtype = args.adapter.info(obj).dtype
        if dtype is not DType.BF16:
            raise DTypeError(name, dtype.value, "bfloat16 (" + _HOW + ")")
    try:
        bits = args.adapter.host_bits(obj)
    except (TraceaError, AttributeError, TypeError) as exc:
        raise DTypeError(name, "bfloat16", f"{_HOW}; the {args.adapter.name} adapter gave no host "
                                           f"view: {exc}") from None
    if bits.dtype != np.uint16:
        raise DTypeError(name, bits.dtype, "16-bit storage (bfloat16)")
    if packed and not bits.flags.c_contiguous:
        raise LayoutError(name, obj, "a packed row-major (C-contiguous) array")
    if bits.size != math.prod(shape):
        raise InvalidArgumentError(name, obj, f"{math.prod(shape)} elements (shape {shape})")
    return bits


def _tensor_ptr(obj: Any, dtype_name: str, size: int) -> int | None:
    """Fast path for torch CPU tensors (NumPy views cost microseconds per call): the data address of
    a contiguous CPU tensor of torch dtype ``dtype_name`` and ``size`` elements, else None (take the
    checked path)."""
    torch = imported("torch")
    if torch is None or not isinstance(obj, torch.Tensor):
        return None
    if obj.dtype is getattr(torch, dtype_name) and obj.device.type == "cpu" and obj.is_contiguous() \
            and obj.numel() == size:
        return int(obj.data_ptr())
    return None


def bf16_operand(args: OpArgs, name: str, shape: tuple[int, ...]) -> tuple[int, Any]:
    """``(data address, owner)`` of bf16 argument ``name`` (checked: dtype, host memory, packed, size).

    The caller must keep ``owner`` referenced until the kernel has returned: it is the object whose
    memory the address points into (the tensor itself, or the NumPy view holding it)."""
    obj = args.out if name == "out" else args.arrays.get(name)
    ptr = _tensor_ptr(obj, "bfloat16", math.prod(shape))
    if ptr is not None:
        return ptr, obj
    bits = host_bf16(args, name, shape)
    return _ptr(bits), bits  # type: ignore[return-value]


def f32_operand(args: OpArgs, name: str, shape: tuple[int, ...]) -> tuple[int, Any]:
    """``(data address, owner)`` of float32 argument ``name`` (checked like the fp32 kernels'
    operands); keep ``owner`` referenced until the kernel has returned."""
    obj = args.out if name == "out" else args.arrays.get(name)
    ptr = _tensor_ptr(obj, "float32", math.prod(shape))
    if ptr is not None:
        return ptr, obj
    arr = _host(args, name, shape)
    return _ptr(arr), arr  # type: ignore[return-value]


def widen_bits(bits: np.ndarray) -> np.ndarray:
    """bf16 values given as their uint16 bits -> a new float32 array (exact: the bits become the top half)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def widened_bias(adapter: Any, bias: Any) -> np.ndarray:
    """A bf16 bias (a torch tensor or an ml_dtypes array, through ``adapter.host_bits``) as a new float32
    array: the only reference to its memory, so hold it until the kernel reading it has returned."""
    return widen_bits(adapter.host_bits(bias))


def bias_f32(args: OpArgs, n: int) -> np.ndarray:
    """The bias as fp32 (the kernel's epilogue runs in fp32): float32 as is (a view), bf16 widened into
    a new array (n values). The result may be the only reference to its memory: hold it in a variable
    until the kernel reading it has returned (never ``_ptr(bias_f32(...))``)."""
    obj = args.arrays.get("bias")
    dtype = args.adapter.info(obj).dtype
    if dtype is DType.F32:
        return _host(args, "bias", (n,))  # type: ignore[return-value]
    if dtype is DType.BF16:
        bits = host_bf16(args, "bias", (n,))
        return widen_bits(bits)  # type: ignore[arg-type]
    raise DTypeError("bias", dtype.value, "float32 or bfloat16")


class CpuGemmBf16Variant(CpuVariant):
    """BLIS-style bf16 GEMM: k-pair-interleaved packed panels, ``vdpbf16ps`` register micro-kernel,
    KC/MC/NC blocks, fp32 epilogue, bf16 (round to nearest even) or fp32 output."""

    def __init__(self) -> None:
        super().__init__(AVX512_BF16)
        self._last: tuple[Any, Any, Any] | None = None
        self.name = "cpu.gemm.avx512bf16"
        self.description = "blocked bf16 GEMM, vdpbf16ps micro-kernel (fp32 accumulate), fused epilogue"
        self.requirements = Requirements(device_kind="cpu", op_kind=LayerType.GEMM, dtypes=frozenset({DType.BF16}),
                                         out_dtypes=frozenset({DType.BF16, DType.F32}), isa=AVX512_BF16.requires)

    def library(self, mr: int, nr: int, epilogue_key: str) -> Any:
        """The compiled ``tb_gemm`` library for one register tile and epilogue chain."""
        return kernels.bf16_gemm_library(mr, nr, epilogue_key)

    def check(self, op: Op, profile: DeviceProfile) -> list[str]:
        return [f"needs avx512_bf16 (vdpbf16ps): {r}" if r.startswith("device lacks") else r
                for r in super().check(op, profile)]

    def efficiency_on(self, profile: DeviceProfile) -> float:
        return BF16_EFFICIENCY

    def estimate_seconds(self, op: Op, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        # vdpbf16ps: two products per fp32 lane, twice the fp32 FMA rate (the profile's bf16 peak is
        # that of CPUs without it).
        flop_time = op.flops / (2 * profile.peak("float32") * 1e9 * BF16_EFFICIENCY)
        return max(flop_time, op.min_bytes / ((profile.bandwidth_gbs or 20.0) * 1e9)) + 15e-6

    #: whether the variant offers the direct form (:mod:`tracea_cpu.bf16_direct`, config param ``direct``)
    offers_direct = True

    def _direct(self, op: Op) -> bool:
        from .bf16_direct import direct_ok  # noqa: PLC0415

        return self.offers_direct and isinstance(op, GemmOp) and direct_ok(op)

    def search_space(self, op: Op, profile: DeviceProfile) -> SearchSpace:
        space = spaces.bf16_space(self.isa, profile)
        return space.param("direct", [1, 0]) if self._direct(op) else space

    def hero_configs(self, op: Op, profile: DeviceProfile) -> list[PipelineConfig]:
        heroes = spaces.bf16_heroes(op)
        if not self._direct(op):
            return heroes
        # the direct form first (x @ W.T: A read in place, the weight's VNNI panels kept), then the blocked ones
        return [h.with_params(direct=1) for h in heroes[:2]] + heroes

    def validate_config(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        if config.get("direct", 0) and not self._direct(op):
            return Validity(False, "direct=1 needs x @ W.T of one batch entry with an even K (and no AMX variant)")
        return _validate_blocked(self.isa, config)

    def prepare(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Any:
        # The last (op, config) by identity first: hashing the op for the memo costs microseconds, as
        # much as the kernel of a small GEMM gains from a second thread.
        last = self._last
        if last is not None and last[0] is op and last[1] is config:
            return last[2]
        plan = _bf16_plan(self, op, config, self.block_rows(op, config, profile))
        self._last = (op, config, plan)
        return plan

    def block_rows(self, op: Op, config: PipelineConfig, profile: DeviceProfile | None) -> int:
        """The M block (``mc``) the kernel gets for ``op``: the config's."""
        return int(config.get("mc"))

    def bind(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        assert isinstance(op, GemmOp)
        ptr, pick = adapter.data_ptr, thread_picker(self.threads(op, config, profile), _requested_threads(config))
        if config.get("direct", 0) and self._direct(op):
            return self._bind_direct(op, config, adapter, pick)
        fn, call, ref = self.prepare(op, config, profile)
        if not op.epilogue.has_bias:
            def launch(a: Any, b: Any, bias: Any, out: Any) -> None:
                rc = fn(ref, ptr(a), ptr(b), ptr(out), None, pick())
                if rc:
                    _check_rc(rc, "bf16 gemm")

            launch.pointer_only = True  # type: ignore[attr-defined]
            return launch
        widen = op.out_dtype is DType.BF16  # the bias arrives in the output dtype; the epilogue runs in fp32

        def launch_bias(a: Any, b: Any, bias: Any, out: Any) -> None:
            # the fp32 bias must outlive the kernel call: hold it in a local until the call returns
            b32 = widened_bias(adapter, bias) if widen else bias
            rc = fn(ref, ptr(a), ptr(b), ptr(out), b32.ctypes.data if widen else ptr(b32), pick())
            if rc:
                _check_rc(rc, "bf16 gemm")

        launch_bias.pointer_only = True  # type: ignore[attr-defined]
        return launch_bias

    def _direct_runner(self, op: GemmOp, config: PipelineConfig) -> Any:
        """The direct form's kernel entry on addresses (:func:`tracea_cpu.bf16_direct.direct_launcher`), the config
        checked first."""
        from .bf16_direct import direct_launcher  # noqa: PLC0415

        _require(self.validate_config(op, config, None), self.name, config)  # type: ignore[arg-type]
        return direct_launcher(op, int(config.get("mr")), int(config.get("nr")), int(config.get("mc")))

    def _bind_direct(self, op: GemmOp, config: PipelineConfig, adapter: Any, pick: Any) -> Any:
        """The pointer-only launcher of the direct form."""
        from .bf16_direct import pointer_launcher  # noqa: PLC0415

        return pointer_launcher(self._direct_runner(op, config), adapter, op.epilogue.has_bias,
                                op.out_dtype is DType.BF16, pick)

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, GemmOp)
        if config.get("direct", 0) and self._direct(op):
            run = self._direct_runner(op, config)
            a, a_owner = bf16_operand(args, "a", (op.m, op.k))
            b, b_owner = bf16_operand(args, "b", (op.k, op.n))
            out, out_owner = (bf16_operand if op.out_dtype is DType.BF16 else f32_operand)(args, "out", (op.m, op.n))
            bias_arr = bias_f32(args, op.n) if op.epilogue.has_bias else None
            run(a, None, b, 0 if bias_arr is None else int(bias_arr.ctypes.data), out, self.threads(op, config, profile))
            del a_owner, b_owner, out_owner, bias_arr  # alive until here, after the kernel returned
            return
        fn, call, ref = self.prepare(op, config, profile)
        bt, m, n, k = op.batch, op.m, op.n, op.k
        # Every (address, owner) pair keeps its owner referenced in this frame until the kernel has
        # returned: a widened bf16 bias is a fresh array whose only reference is here.
        a, a_owner = bf16_operand(args, "a", (bt, m, k))
        b, b_owner = bf16_operand(args, "b", (bt, k, n))
        out, out_owner = (bf16_operand if call.out_bf16 else f32_operand)(args, "out", (bt, m, n))
        bias_arr = bias_f32(args, n) if op.epilogue.has_bias else None
        rc = fn(ref, a, b, out, _ptr(bias_arr), self.threads(op, config, profile))
        del a_owner, b_owner, out_owner, bias_arr  # alive until here, after the kernel returned
        _check_rc(rc, "bf16 gemm")


@functools.lru_cache(maxsize=256)
def _bf16_plan(variant: CpuGemmBf16Variant, op: Op, config: PipelineConfig, mc: int) -> tuple[Any, Any, Any]:
    """Validated config (``mc``: its M block as :meth:`CpuGemmBf16Variant.block_rows` chose it) ->
    (kernel entry point, its constants as a ``tb_call`` struct, a pointer to it), memoised so a call
    costs one lookup."""
    _require(variant.validate_config(op, config, None), variant.name, config)  # type: ignore[arg-type]
    assert isinstance(op, GemmOp)
    lib = variant.library(int(config.get("mr")), int(config.get("nr")), op.epilogue.key)
    rsa, csa = (1, op.m) if op.trans_a else (op.k, 1)
    rsb, csb = (1, op.k) if op.trans_b else (op.n, 1)
    call = kernels.Bf16Call(op.batch, op.m, op.n, op.k, rsa, csa, rsb, csb, mc,
                            int(config.get("nc")), int(config.get("kc")), int(op.out_dtype is DType.BF16))
    return lib.tb_gemm_call, call, ctypes.addressof(call)
