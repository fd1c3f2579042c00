"""The CPU attention variant ``cpu.attention.<isa>``: the flash-style kernel of :mod:`.emit.attention`
behind the variant interface (heroes, search space, config checks, a pointer-only launcher that reads
q, k, v and the output through their strides)."""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import numpy as np

from tracea.doctor.decision import FrameworkFaster
from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType
from tracea.errors import InvalidArgumentError
from tracea.ir.ops import AttentionOp, LayerType, Op
from tracea.semantic import PipelineConfig, SearchSpace
from tracea.runtime import attention_strides as strided
from tracea.semantic.config import VALID, Validity

from . import kernels, spaces
from .bf16 import host_bf16
from .emit.attention import ELEMENTS
from .emit.calls import ATTENTION_PARAMS
from .host_load import thread_picker
from .isa import Isa
from .variant_base import CpuVariant, _check_rc, _host, _ptr, _require, _requested_threads, _threads_problem

_MASK_KINDS = {None: 0, "bool": 1, "additive": 2}
#: element type of the emitted kernel (:data:`tracea_cpu.emit.attention.ELEMENTS`) by storage dtype
_ELEM_OF = {DType.F32: "f32", DType.BF16: "bf16", DType.F16: "f16"}


class CpuAttentionVariant(CpuVariant):
    """Flash-style attention forward: online softmax over key blocks, causal or not, GQA, boolean and
    additive masks, a value head dim of its own; q, k, v and the output read in place through their
    (batch, head, seq) strides. A tile driver for many query rows per kv head, a rows driver (keys read
    in place, no packing) for a few (decode); see :mod:`tracea_cpu.emit.attention`. float32, and on
    AVX-512 bfloat16 and float16 (AVX2: bfloat16): 16-bit operands widened as they are loaded, float32
    arithmetic, the output rounded once."""

    def __init__(self, isa: Isa) -> None:
        super().__init__(isa)
        self.name = f"cpu.attention.{isa.name}"
        self.description = f"flash attention forward (online softmax, causal, GQA, masks, strided), {isa.name}"
        self.requirements = Requirements(device_kind="cpu", op_kind=LayerType.ATTENTION,
                                         dtypes=frozenset(d for d, e in _ELEM_OF.items()
                                                          if e in ELEMENTS.get(isa.name, ("f32",))),
                                         isa=isa.requires,
                                         masks=frozenset({"bool", "additive"}), lse=True, value_head_dim=True)

    def check(self, op: Op, profile: DeviceProfile) -> list[str]:
        reasons = super().check(op, profile)
        if isinstance(op, AttentionOp) and op.dtype.storage is not DType.F32 and profile.has("amx_tile", "amx_bf16"):
            # PyTorch's 16-bit CPU SDPA multiplies on AMX tiles there, this kernel in fp32 vector FMAs: kept as a
            # candidate only where a call is timed against PyTorch's (the arbiter, first-use tuning's check)
            reasons.append(FrameworkFaster(f"{op.dtype.storage.value} on a CPU with AMX: PyTorch's SDPA runs on AMX "
                                           "tiles (this kernel computes in fp32 vector FMAs)"))
        if isinstance(op, AttentionOp) and not float(op.scale) > 0:  # type: ignore[arg-type]
            # masked logits are -inf before the scale is applied: a negative scale would make them +inf
            reasons.append(f"scale={op.scale} (the kernel assumes a positive scale)")
        return reasons

    def takes_strides(self, op: Op) -> bool:
        """Always: the kernel reads q, k, v and writes the output through their (batch, head, seq) strides."""
        return True

    def search_space(self, op: Op, profile: DeviceProfile) -> SearchSpace:
        return spaces.attention_space(self.isa, profile, op)

    def hero_configs(self, op: Op, profile: DeviceProfile) -> list[PipelineConfig]:
        return spaces.attention_heroes(self.isa, op)

    def validate_config(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        bq, bk = config.get("bq"), config.get("bk")
        kb, rows = config.get("kb"), config.get("rows", spaces.ATTN_ROWS)
        if kb is None and isinstance(bk, int) and not isinstance(bk, bool) and bk > 0:
            kb = spaces.attention_kb(bk)
        for name, val in (("bq", bq), ("bk", bk), ("kb", kb), ("rows", rows)):
            if not isinstance(val, int) or isinstance(val, bool):
                return Validity(False, f"attention configs need integer params bq, bk, kb and rows ({name}={val!r})")
        why = kernels.check_tile(self.isa, bq, bk) or _threads_problem(config)
        if not why and (kb < bk or kb % bk or kb % 4 or kb > spaces.ATTN_KB_MAX):
            why = f"kb={kb} must be a multiple of bk={bk} and of 4, at most {spaces.ATTN_KB_MAX}"
        if not why and rows < 0:
            why = f"rows={rows} must be >= 0"
        return Validity(False, why) if why else VALID

    def prepare(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Any:
        return _attention_plan(self, op, config)

    def _params(self, op: AttentionOp, config: PipelineConfig, profile: DeviceProfile,
                strides: tuple[int, ...] | None) -> Any:
        mb, mh = op.mask_shape or (1, 1)
        kvh = int(op.kv_heads or op.heads)
        st = strides or _packed_strides(op)
        names = ("qb", "qh", "qs", "kb", "kh", "ks", "vb", "vh", "vs", "ob", "oh", "os")
        return kernels.call_params(ATTENTION_PARAMS, dict(
            B=op.batch, H=op.heads, KVH=kvh, Sq=op.seq_q, Skv=op.seq_kv, D=op.head_dim, Dv=op.dv,
            causal=int(op.causal), nth=self.threads(op, config, profile), mkind=_MASK_KINDS[op.mask], MB=mb, MH=mh,
            rows_max=int(config.get("rows", spaces.ATTN_ROWS)), **dict(zip(names, st))))

    def bind(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        assert isinstance(op, AttentionOp)
        lib = self.prepare(op, config, profile)
        params = self._params(op, config, profile, op.strides)
        slot = ATTENTION_PARAMS.index("nth")
        pick = thread_picker(params[slot], _requested_threads(config))
        fn, ptr, scale = lib.tr_attention_call, adapter.data_ptr, float(op.scale)  # type: ignore[arg-type]

        if op.mask is None and not op.lse:
            def launch(q: Any, k: Any, v: Any, mask: Any, *rest: Any) -> None:
                params[slot] = pick()
                rc = fn(params, scale, ptr(q), ptr(k), ptr(v), ptr(rest[-1]), None, None)
                if rc:
                    _check_rc(rc, "attention")
        else:  # (q, k, v, mask, out) or, with the log-sum-exp output, (q, k, v, mask, lse, out)
            def launch(q: Any, k: Any, v: Any, mask: Any, *rest: Any) -> None:
                if op.mask is not None and mask is None:
                    raise InvalidArgumentError("mask", None, f"a {op.mask} mask array (the op has one)")
                lse = rest[0] if len(rest) > 1 else None
                params[slot] = pick()
                rc = fn(params, scale, ptr(q), ptr(k), ptr(v), ptr(rest[-1]), None if mask is None else ptr(mask),
                        None if lse is None else ptr(lse))
                if rc:
                    _check_rc(rc, "attention")

        launch.pointer_only = True  # type: ignore[attr-defined]
        return launch

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, AttentionOp)
        lib = self.prepare(op, config, profile)
        kvh = int(op.kv_heads or op.heads)
        shapes = {"q": (op.batch, op.heads, op.seq_q, op.head_dim), "k": (op.batch, kvh, op.seq_kv, op.head_dim),
                  "v": (op.batch, kvh, op.seq_kv, op.dv), "out": (op.batch, op.heads, op.seq_q, op.dv)}
        dtype = op.dtype.storage
        want = _HOST_DTYPE[dtype]
        arrays: dict[str, np.ndarray] = {}
        strides: tuple[int, ...] = ()
        for name, shape in shapes.items():
            arr = _host_view(args, name, shape, dtype)
            if arr is None:
                raise InvalidArgumentError(name, None, f"an array of {math.prod(shape)} elements (shape {shape})")
            if arr.dtype != want:
                raise InvalidArgumentError(name, arr, f"a {dtype.value} array")
            if arr.size != math.prod(shape):
                raise InvalidArgumentError(name, arr, f"{math.prod(shape)} elements (shape {shape})")
            folded = _fold(arr, shape)
            if folded is None:  # strides the kernel cannot follow: a packed copy (the output: copied back)
                arr = np.ascontiguousarray(arr) if name != "out" else np.empty(shape, want)
                folded = _fold(arr, shape)
            assert folded is not None
            arrays[name] = arr
            strides += folded
        mb, mh = op.mask_shape or (1, 1)
        mshape = (mb, mh, op.seq_q, op.seq_kv)  # (a mask in the input dtype, packed by the core)
        mask = None if not op.mask else host_bf16(args, "mask", mshape) if dtype is DType.BF16 else _host(
            args, "mask", mshape, want)
        if op.mask and mask is None:
            raise InvalidArgumentError("mask", None, f"a {op.mask} mask array (the op has one)")
        lse = _host(args, "lse", (op.batch, op.heads, op.seq_q)) if op.lse else None
        params = self._params(op, config, profile, strides)
        rc = lib.tr_attention_call(params, float(op.scale), *(_ptr(arrays[n]) for n in ("q", "k", "v", "out")),  # type: ignore[arg-type]
                                   _ptr(mask), _ptr(lse))
        _check_rc(rc, "attention")
        out = _host_view(args, "out", shapes["out"], dtype)
        if out is not None and arrays["out"] is not out:
            out[...] = arrays["out"].reshape(out.shape)


#: the NumPy dtype :meth:`CpuAttentionVariant.run` reads each storage dtype as (bf16: its bits)
_HOST_DTYPE: dict[DType, Any] = {DType.F32: np.dtype(np.float32), DType.F16: np.dtype(np.float16), DType.BF16: np.dtype(np.uint16)}


def _host_view(args: OpArgs, name: str, shape: tuple[int, ...], dtype: DType) -> np.ndarray | None:
    """A host view of argument ``name`` with its own strides (bf16: a ``uint16`` view of its bits,
    :func:`~tracea_cpu.bf16.host_bf16`); None stays None."""
    return host_bf16(args, name, shape, packed=False) if dtype is DType.BF16 else args.host(name)


def _packed_strides(op: AttentionOp) -> tuple[int, ...]:
    """The (batch, head, seq) element strides of packed q, k, v and output arrays."""
    kvh = int(op.kv_heads or op.heads)
    out: tuple[int, ...] = ()
    for h, s, e in ((op.heads, op.seq_q, op.head_dim), (kvh, op.seq_kv, op.head_dim), (kvh, op.seq_kv, op.dv),
                    (op.heads, op.seq_q, op.dv)):
        out += (h * s * e, s * e, e)
    return out


def _fold(arr: np.ndarray, shape: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(batch, head, seq) element strides of an array viewed as ``shape`` (batch, heads, seq, dim):
    packed arrays of any shape of that size; others as ``attention_strides.fold`` folds their own shape
    (leading dims that nest into one batch, a unit-stride last dim), None when it cannot."""
    if arr.flags.c_contiguous:
        b, h, s, d = shape
        return (h * s * d if b > 1 else 0, s * d if h > 1 else 0, d if s > 1 else 0)
    size = arr.itemsize
    if arr.ndim < 3 or tuple(arr.shape[-3:]) != tuple(shape[1:]) or any(x % size for x in arr.strides):
        return None
    return strided.fold(arr.shape, [x // size for x in arr.strides])


@functools.lru_cache(maxsize=256)
def _attention_plan(variant: "CpuAttentionVariant", op: Op, config: PipelineConfig) -> Any:
    _require(variant.validate_config(op, config, None), variant.name, config)  # type: ignore[arg-type]
    elem = _ELEM_OF[op.dtype.storage]  # type: ignore[attr-defined]
    return kernels.attention_library(variant.isa.name, int(config.get("bq")), int(config.get("bk")),
                                     int(config.get("kb") or spaces.attention_kb(int(config.get("bk")))),
                                     elem, elem == "bf16" and variant.isa.name == "avx512" and bf16_dot())


def bf16_dot() -> bool:
    """Whether bf16 attention on AVX-512 computes Q K^T on ``vdpbf16ps`` (this host has AVX512_BF16, and
    ``TRACEA_CPU_BF16_DOT`` is not 0); else its operands are widened to fp32 for the FMAs."""
    return _host_has_bf16_dot() and os.environ.get("TRACEA_CPU_BF16_DOT", "1").strip().lower() not in (
        "0", "off", "no", "false")


@functools.lru_cache(maxsize=1)
def _host_has_bf16_dot() -> bool:
    from tracea.doctor.host_plugin import host_profile

    return bool(host_profile().has("avx512_bf16"))
