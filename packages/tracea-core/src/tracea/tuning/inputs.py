"""Inputs for timing a candidate: random arrays of every role of an op, several rotating sets on the
device, and the reference output a candidate must match before its time counts."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..doctor.variant import OpArgs
from ..dtypes import DType, Fp32Precision
from ..errors import DTypeError, UnsupportedDeviceError
from ..ir.device import Device
from ..ir.ops import AttentionOp, Conv2dOp, GemmOp, Op
from ..runtime.arrays import imported

#: relative-error bound (||out - ref|| / ||ref||) a candidate must meet, by compute type. Looser than
#: the kernel tests' bounds: the tuner rejects broken configs, it does not certify accuracy.
TOLERANCE = {"f32": 1e-4, "tf32": 5e-3, "bf16x": 2e-2, "f16": 1e-2, "bf16": 3e-2, "fp8": 1.5e-1,
             "int": 1e-6, "f64": 1e-10}
#: input sets are rotated until they cover this multiple of the largest cache.
CACHE_COVER = 2.0
MAX_SETS = 8
MAX_SET_BYTES = 512 << 20


def array_shapes(op: Op) -> dict[str, tuple[int, ...] | None]:
    """Physical shape of every array role of ``op`` (``None`` for an absent bias), ``out`` included.

    GEMM operands carry a leading batch dimension only when ``batch > 1`` (same memory either way).
    """
    if isinstance(op, GemmOp):
        lead = (op.batch,) if op.batch > 1 else ()
        a = (op.k, op.m) if op.trans_a else (op.m, op.k)
        b = (op.n, op.k) if op.trans_b else (op.k, op.n)
        return {"a": lead + a, "b": lead + b, "bias": (op.n,) if op.epilogue.has_bias else None,
                "out": lead + (op.m, op.n)}
    if isinstance(op, Conv2dOp):
        return {"x": op.x_shape, "w": op.w_shape, "bias": (op.k,) if op.epilogue.has_bias else None,
                "out": op.out_shape}
    if isinstance(op, AttentionOp):
        q = (op.batch, op.heads, op.seq_q, op.head_dim)
        kv = (op.batch, int(op.kv_heads or op.heads), op.seq_kv)
        mask = None if op.mask_shape is None else tuple(op.mask_shape) + (op.seq_q, op.seq_kv)
        shapes: dict[str, tuple[int, ...] | None] = {"q": q, "k": kv + (op.head_dim,), "v": kv + (op.dv,),
                                                      "mask": mask}
        if op.lse:  # float32 (batch, heads, seq_q), written by the kernel
            shapes["lse"] = q[:3]
        return {**shapes, "out": q[:3] + (op.dv,)}
    raise DTypeError("op", type(op).__name__, "a GemmOp, Conv2dOp or AttentionOp")


def host_roles(op: Op) -> list[str]:
    """The input roles of ``op`` (every array role but ``out``)."""
    return [r for r in array_shapes(op) if r != "out"]


def input_dtype(op: Op, role: str) -> DType:
    if role == "lse":
        return DType.F32
    if role in ("out", "bias"):
        return op.out_dtype
    return op.dtypes[0]


def _np_dtype(dt: DType) -> np.dtype:
    """The NumPy dtype holding host copies of ``dt``: its own, or float32 for bf16 without ml_dtypes
    (values rounded to bf16 first, see :func:`carried`)."""
    nd = dt.numpy
    if nd is None:
        if dt is DType.BF16:
            return np.dtype(np.float32)
        raise DTypeError("dtype", dt.value, "a dtype NumPy can store to build tuning inputs "
                                            "(install ml_dtypes for bf16/fp8)")
    return np.dtype(nd)


def carried(dt: DType) -> bool:
    """True when host copies of ``dt`` are float32 carriers (bf16 without ml_dtypes): device arrays are
    converted with the adapter's ``astype``, outputs read back through float32."""
    return dt is DType.BF16 and dt.numpy is None


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bf16 (ties to even), still float32 (finite inputs)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    bits = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def _to_device(adapter: Any, arr: np.ndarray, dt: DType, device: Device) -> Any:
    obj = adapter.from_numpy(arr, device)
    if not carried(dt):
        return obj
    obj = adapter.astype(obj, dt)
    if adapter.info(obj).dtype is not dt:
        raise DTypeError("dtype", dt.value, f"an array kind that stores {dt.value} (the {adapter.name} adapter "
                                            "cannot; install ml_dtypes or tracea-torch)")
    return obj


def random_host_inputs(op: Op, rng: np.random.Generator) -> dict[str, np.ndarray | None]:
    """Fresh random inputs (never zeros) for every input role of ``op``, as NumPy arrays."""
    out: dict[str, np.ndarray | None] = {}
    for role, shape in array_shapes(op).items():
        if role == "out":
            continue
        if shape is None:
            out[role] = None
            continue
        dt = input_dtype(op, role)
        if role == "mask" and getattr(op, "mask", None) == "bool":  # 0: masked; most keys are kept
            out[role] = (rng.uniform(size=shape) < 0.8).astype(_np_dtype(dt))
        elif dt in (DType.INT8, DType.INT32):
            out[role] = rng.integers(-8, 8, size=shape).astype(_np_dtype(dt))
        else:
            out[role] = rng.uniform(-1.0, 1.0, size=shape).astype(_np_dtype(dt))
            if carried(dt):
                out[role] = _round_bf16(out[role])  # type: ignore[arg-type]
    return out


def tolerance(op: Op) -> float:
    """The relative-error bound a candidate's output must meet for ``op``."""
    dt = op.dtypes[0]
    if dt in (DType.INT8, DType.INT32):
        return TOLERANCE["int"]
    if dt is DType.F64:
        return TOLERANCE["f64"]
    if dt in (DType.FP8_E4M3, DType.FP8_E5M2):
        return TOLERANCE["fp8"]
    if dt is DType.F16 or op.out_dtype is DType.F16:
        return TOLERANCE["f16"]
    if dt is DType.BF16 or op.out_dtype is DType.BF16:
        return TOLERANCE["bf16"]
    prec = getattr(op, "fp32_precision", Fp32Precision.HIGHEST)
    if dt is DType.TF32 or prec is Fp32Precision.HIGH:
        return TOLERANCE["tf32"]
    if prec is Fp32Precision.MEDIUM:
        return TOLERANCE["bf16x"]
    return TOLERANCE["f32"]


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref|| in float64; inf when ``out`` has NaN/inf or the shapes differ."""
    o = np.asarray(out, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if o.size != r.size:
        return math.inf
    o = o.reshape(r.shape)
    if not np.all(np.isfinite(o)):
        return math.inf
    # Plain ufunc reductions, not np.linalg.norm: that calls BLAS (ddot), whose OpenBLAS worker threads
    # then busy-wait for ~0.1 s and would steal the cores from the candidate timed next.
    denom = math.sqrt(float(np.square(r).sum()))
    diff = math.sqrt(float(np.square(o - r).sum()))
    return diff / denom if denom > 0 else diff


def pick_adapter(adapters: Sequence[Any], device: Device, dtypes: Sequence[DType] = ()) -> Any:
    """The highest-priority adapter that can allocate on ``device``'s kind -- but not one whose framework is
    not imported yet (``ArrayAdapter.framework``) while another adapter of the device stores every one of
    ``dtypes`` natively (``ArrayAdapter.stores``): tuning a NumPy or CuPy program's op must not import torch
    (seconds and hundreds of MB, its OpenMP runtime and CUDA context; a tuning thread importing it also raced
    another thread's ``tracea.ops`` call). bfloat16, which neither NumPy without ``ml_dtypes`` nor CuPy
    stores, still takes the framework adapter."""
    able = [a for a in sorted(adapters, key=lambda a: -getattr(a, "priority", 0))
            if device.kind in tuple(getattr(a, "device_kinds", ()) or ())]
    if not able:
        raise UnsupportedDeviceError(f"no array adapter can allocate tuning inputs on {device}; install the "
                                     f"backend package that serves {device.kind} devices")
    for a in able:
        framework = getattr(a, "framework", None)
        if framework is not None and imported(framework) is None:
            continue  # its framework is not loaded: take it only when no other adapter can
        stores = getattr(a, "stores", None)
        if framework is not None or stores is None or all(stores(d) for d in dtypes):
            return a
    return able[0]


class InputSets:
    """``count`` independent input sets (and poisoned outputs) of ``op`` on ``device``; rotate through
    them so consecutive timed runs do not find their operands already in cache."""

    def __init__(self, op: Op, device: Device, adapter: Any, *, seed: int = 0,
                 cache_bytes: int = 0, count: int | None = None) -> None:
        self.op, self.device, self.adapter = op, device, adapter
        rng = np.random.default_rng(seed)
        shapes = array_shapes(op)
        self.out_shape = shapes["out"]
        self.out_np_dtype = _np_dtype(op.out_dtype)
        first = random_host_inputs(op, rng)
        set_bytes = sum(a.nbytes for a in first.values() if a is not None) + \
            int(np.prod(self.out_shape)) * self.out_np_dtype.itemsize  # type: ignore[arg-type]
        if count is None:
            need = math.ceil(CACHE_COVER * cache_bytes / max(set_bytes, 1)) if cache_bytes else 2
            count = max(2, min(MAX_SETS, need, max(1, MAX_SET_BYTES // max(set_bytes, 1))))
        self.host: list[dict[str, np.ndarray | None]] = [first] + [random_host_inputs(op, rng)
                                                                  for _ in range(count - 1)]
        self._nan = np.full(self.out_shape, np.nan, dtype=self.out_np_dtype)  # type: ignore[type-var]
        self.args: list[OpArgs] = []
        roles = {r: input_dtype(op, r) for r in host_roles(op)}
        for host in self.host:
            arrays = {r: (None if a is None else _to_device(adapter, a, roles[r], device)) for r, a in host.items()}
            out = _to_device(adapter, self._nan, op.out_dtype, device)  # type: ignore[arg-type]
            self.args.append(OpArgs(arrays, out, adapter))
        self.poison_src = _to_device(adapter, self._nan, op.out_dtype, device)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.args)

    def poison(self, i: int) -> None:
        """Fill output ``i`` with NaN so unwritten elements show in the check."""
        self.adapter.copy_(self.args[i].out, self.poison_src)

    def output(self, i: int) -> np.ndarray:
        """A host copy of output ``i`` (float32 for a bf16 output without ml_dtypes)."""
        out = self.args[i].out
        if carried(self.op.out_dtype):
            out = self.adapter.astype(out, DType.F32)
        return self.adapter.to_host(out)


def reference_output(op: Op, host: dict[str, np.ndarray | None], reference_variant: Any,
                     cpu_profile: Any) -> np.ndarray:
    """Run the reference variant (NumPy, float64 accumulation) on host copies of ``host``."""
    from ..runtime.arrays import NumpyAdapter

    adapter = NumpyAdapter()
    shapes = array_shapes(op)
    out = np.full(shapes["out"], np.nan, dtype=_np_dtype(op.out_dtype))  # type: ignore[type-var]
    args = OpArgs({r: (None if a is None else np.array(a)) for r, a in host.items()}, out, adapter)
    reference_variant.run(op, reference_variant.hero_configs(op, cpu_profile)[0], args, cpu_profile)
    return out  # type: ignore[return-value]
