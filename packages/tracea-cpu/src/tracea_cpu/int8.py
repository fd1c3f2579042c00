"""Quantized (int8) linear layers on the CPU: weights quantized once per output channel, activations
quantized per row at each call, int32 accumulation, fp32 output — the scheme of PyTorch's dynamically
quantized ``Linear`` (``torch.ao.nn.quantized.dynamic.Linear``), with symmetric int8 activations.

    from tracea_cpu.int8 import quantize_weight, linear_int8
    qw = quantize_weight(linear.weight)             # once: Int8Weight(q: N x K int8, scale: N float32)
    y = linear_int8(x, qw, linear.bias)             # x: (..., K) float32 NumPy array or torch CPU tensor

Math (both paths): ``sx[m] = max|x[m, :]| / 127``, ``xq = round_half_even(x / sx)``; ``sw[n] =
max|w[n, :]| / 127``, ``wq = round_half_even(w / sw)``; ``y[m, n] = sx[m] * sw[n] * sum_k xq[m, k] *
wq[n, k] + bias[n]``. A row of x holding NaN or Inf gives a NaN output row (its scale is NaN); weights
must be finite (``InvalidArgumentError`` otherwise).

On CPUs with AMX-INT8 whose OS grants tile data (``tracea doctor`` shows ``amx (... int8 ...)``) the
kernel is ``tdpbssd`` on AMX tiles with the weights loaded in place (:mod:`.emit.amx_int8`); calls of at
most :data:`VNNI_MAX_TOKENS` rows run an AVX512-VNNI (``vpdpbusd``) kernel instead, which reads the same
weights in place without padding a token to a 16-row tile (:mod:`.emit.int8_vnni`; it uses the weights'
row sums, :attr:`Int8Weight.row_sums`, computed on first use). CPUs with AVX512-VNNI but no usable AMX
(Ice Lake, AMD Zen 4 / Zen 5, or an OS refusing tile data) run the VNNI kernel for every token count.
Elsewhere the documented fallback computes the same integers with NumPy (exact, slow). The result is
returned in the kind of ``x`` (NumPy array or torch tensor), shaped ``(..., N)``, float32.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracea.errors import DTypeError, InvalidArgumentError, LaunchError, LayoutError, ShapeError
from tracea.runtime.arrays import imported

from . import kernels
from .host_load import thread_picker

#: calls with at most this many rows (tokens) run the AVX512-VNNI kernel; more rows, the AMX one (at
#: 4096 x 4096 on the 2-core Sapphire Rapids VM, warm, kernels alone: VNNI 400-430 us for 1-4 tokens,
#: 5-25% faster than AMX; from 5 tokens AMX is faster, 8 tokens by 20%, 16 by 75%)
VNNI_MAX_TOKENS = 4


@dataclass(frozen=True)
class Int8Weight:
    """Weights of a quantized linear layer: ``q`` (N x K int8, C-contiguous NumPy array) and the
    per-output-channel scales ``scale`` (N float32), ``w ~= q * scale[:, None]``. Checked when built
    (ShapeError / DTypeError / LayoutError); treat it as read-only (see :attr:`row_sums`)."""

    q: np.ndarray
    scale: np.ndarray

    def __post_init__(self) -> None:
        q, scale = self.q, self.scale
        if not isinstance(q, np.ndarray) or not isinstance(scale, np.ndarray):
            raise InvalidArgumentError("Int8Weight", type(q).__name__, "NumPy arrays q and scale (quantize_weight())")
        if q.ndim != 2 or 0 in q.shape:
            raise ShapeError("q", q, "a non-empty 2-d (N x K) int8 array")
        if q.dtype != np.int8:
            raise DTypeError("q", q.dtype, "int8")
        if scale.dtype != np.float32:
            raise DTypeError("scale", scale.dtype, "float32")
        if scale.shape != (q.shape[0],):
            raise ShapeError("scale", scale, f"shape ({q.shape[0]},)")
        if not (q.flags.c_contiguous and scale.flags.c_contiguous):
            raise LayoutError("q", q, "C-contiguous q and scale")

    @functools.cached_property
    def row_sums(self) -> np.ndarray:
        """``sum_k q[n, k]`` per output channel (N int32), which the VNNI kernel needs; computed once, on
        first use, so ``q`` must not change afterwards (treat an Int8Weight as read-only)."""
        return np.ascontiguousarray(self.q.sum(axis=1, dtype=np.int32))

    @functools.cached_property
    def _addresses(self) -> tuple[int, int, int]:
        """Data addresses of ``q``, ``scale`` and :attr:`row_sums` (NumPy's ``.ctypes.data`` costs ~0.8 us
        a read; a call reads all three)."""
        return int(self.q.ctypes.data), int(self.scale.ctypes.data), int(self.row_sums.ctypes.data)

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.q.shape[0]), int(self.q.shape[1])


def _host_f32(obj: Any, name: str) -> tuple[np.ndarray, bool]:
    """A float32 NumPy view (or copy) of a NumPy array or torch CPU tensor; whether it was torch."""
    torch = imported("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type != "cpu":
            raise InvalidArgumentError(name, obj, "a CPU tensor")
        if obj.dtype is not torch.float32:
            raise DTypeError(name, obj.dtype, "float32")
        return obj.detach().contiguous().numpy(), True
    arr = np.asarray(obj)
    if arr.dtype != np.float32:
        raise DTypeError(name, arr.dtype, "float32")
    return np.ascontiguousarray(arr), False


def quantize_weight(w: Any) -> Int8Weight:
    """Quantize an N x K float32 weight (``nn.Linear.weight``) per output channel, symmetric int8."""
    arr, _ = _host_f32(w, "w")
    if arr.ndim != 2 or 0 in arr.shape:
        raise ShapeError("w", arr, "a non-empty 2-d (N x K) weight")
    if not np.isfinite(arr).all():
        raise InvalidArgumentError("w", arr, "finite values (NaN/Inf weights cannot be quantized)")
    amax = np.abs(arr).max(axis=1)
    scale = (amax / 127.0).astype(np.float32)
    inv = np.where(amax > 0, 127.0 / np.where(amax > 0, amax, 1.0), 0.0).astype(np.float32)
    q = np.clip(np.rint(arr * inv[:, None]), -127, 127).astype(np.int8)
    return Int8Weight(np.ascontiguousarray(q), scale)


@functools.lru_cache(maxsize=1)
def _amx_ready() -> str | None:
    """None when the AMX int8 kernel can run here, else why not (worked out once per process: the probes
    took ~30 us timed alone and most of a one-token 1024x1024 call's 120-160 us)."""
    from tracea.doctor.host_plugin import host_profile

    from .amx import amx_compiler_reason, amx_permission
    from .isa import AMX_INT8
    from .toolchain import compiler_or_reason

    if not (AMX_INT8.runs_here() and host_profile().has(*AMX_INT8.requires)):
        return "this CPU lacks AMX-INT8"
    if compiler_or_reason()[0] is None:
        return compiler_or_reason()[1]
    return amx_compiler_reason("int8") or amx_permission()


@functools.lru_cache(maxsize=1)
def _vnni_ready() -> str | None:
    """None when the AVX512-VNNI kernel can run here, else why not (worked out once per process)."""
    from tracea.doctor.host_plugin import host_profile

    from .isa import AVX512_VNNI
    from .toolchain import compiler_or_reason

    if not (AVX512_VNNI.runs_here() and host_profile().has(*AVX512_VNNI.requires)):
        return "this CPU lacks AVX512-VNNI"
    return compiler_or_reason()[1] if compiler_or_reason()[0] is None else None


def kernel_in_use() -> str:
    """Which int8 kernel :func:`linear_int8` runs here: ``"amx"`` (AMX, and AVX512-VNNI for 1-4 tokens),
    ``"vnni"`` (AVX512-VNNI for every token count) or ``"numpy"`` (the fallback)."""
    if _amx_ready() is None:
        return "amx"
    return "vnni" if _vnni_ready() is None else "numpy"


def fallback_reason() -> str | None:
    """Why :func:`linear_int8` runs its NumPy fallback on this machine (None: a compiled kernel runs,
    see :func:`kernel_in_use`)."""
    amx = _amx_ready()
    if amx is None:
        return None
    vnni = _vnni_ready()
    return None if vnni is None else f"{amx}; {vnni}"


def reference(x: np.ndarray, weight: Int8Weight, bias: np.ndarray | None) -> np.ndarray:
    """The documented math in float64 (exact integer products): x (M x K float32) -> M x N float64."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        amax = np.abs(x).max(axis=1).astype(np.float32)
        bad = ~np.isfinite(x).all(axis=1)
        sx = (amax / np.float32(127.0)).astype(np.float32)
        inv = np.where(amax > 0, np.float32(127.0) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
        xq = np.clip(np.rint(np.nan_to_num(x * inv[:, None], nan=0.0, posinf=0.0, neginf=0.0)), -127, 127)
        acc = xq.astype(np.int64) @ weight.q.astype(np.int64).T
        y = acc * (sx.astype(np.float64)[:, None] * weight.scale.astype(np.float64)[None, :])
        y[bad] = np.nan
    return y + (0.0 if bias is None else bias.astype(np.float64))


def linear_int8(x: Any, weight: Int8Weight, bias: Any = None, *, threads: int = 0) -> Any:
    """``y = dequant(quant(x) @ weight.q^T) + bias`` (see the module doc): x (..., K) float32, NumPy or
    torch CPU; ``bias`` None or N float32; ``threads`` 0 = ``$TRACEA_NUM_THREADS``, else torch's thread count
    when torch is loaded or every core, capped at the cores free of other processes' work (see
    :mod:`.host_load`; ``TRACEA_CPU_ADAPT_THREADS=0``: no cap)."""
    if not isinstance(weight, Int8Weight):
        raise InvalidArgumentError("weight", weight, "an Int8Weight from quantize_weight()")
    n, k = weight.shape
    kernel = fallback_reason() is None
    fast = _torch_fast(x, bias, k, n) if kernel else None
    if fast is not None:  # contiguous float32 torch CPU tensors: addresses without NumPy views
        torch, lead, m = fast
        y_t = torch.empty(*lead, n)
        if m:
            _run(m, n, k, x.data_ptr(), weight, None if bias is None else bias.data_ptr(), y_t.data_ptr(), threads,
                 x, bias)
        return y_t
    xa, was_torch = _host_f32(x, "x")
    if xa.ndim < 1 or xa.shape[-1] != k:
        raise ShapeError("x", xa, f"an array whose last dimension is K = {k}")
    lead = xa.shape[:-1]
    m = math.prod(lead)
    x2 = xa.reshape(m, k)
    b = None
    if bias is not None:
        b, _ = _host_f32(bias, "bias")
        if b.shape != (n,):
            raise ShapeError("bias", b, f"shape ({n},)")
    y = np.empty((m, n), np.float32)
    if m and not kernel:  # the documented NumPy fallback
        y[...] = reference(x2, weight, b)
    elif m:
        _run(m, n, k, x2.ctypes.data, weight, None if b is None else b.ctypes.data, y.ctypes.data, threads, x2, b)
    y = y.reshape(*lead, n)
    if was_torch:
        import torch

        return torch.from_numpy(y)
    return y


def _torch_fast(x: Any, bias: Any, k: int, n: int) -> tuple[Any, tuple[int, ...], int] | None:
    """(torch, leading shape, rows) when x and bias are torch CPU float32 tensors, contiguous and of the
    right shapes (bias None or (N,)), else None (the checked path takes the call and raises as due)."""
    torch = imported("torch")
    if torch is None or not isinstance(x, torch.Tensor):
        return None
    if x.dtype is not torch.float32 or x.device.type != "cpu" or x.dim() < 1 or x.shape[-1] != k \
            or not x.is_contiguous() or x.requires_grad:
        return None
    if bias is not None and not (isinstance(bias, torch.Tensor) and bias.dtype is torch.float32
                                 and bias.device.type == "cpu" and tuple(bias.shape) == (n,)
                                 and bias.is_contiguous() and not bias.requires_grad):
        return None
    lead = tuple(x.shape[:-1])
    return torch, lead, math.prod(lead)


def _run(m: int, n: int, k: int, xp: int, weight: Int8Weight, bp: int | None, yp: int, threads: int,
         *owners: Any) -> None:
    """Rows ``m`` of x (address ``xp``, row stride K) through the compiled kernel for this call (the AMX
    or the VNNI one: :func:`fallback_reason` is None; ``owners``: the objects the addresses point into,
    referenced here until the kernel has returned)."""
    amx = _amx_ready() is None
    lib = kernels.int8_linear_library() if amx else kernels.int8_vnni_library()
    if threads == 0 and not os.environ.get("TRACEA_NUM_THREADS"):
        nth = thread_picker(_auto_threads(), 0)()  # torch's team; the cores other processes leave free
    else:
        nth = kernels.thread_count(threads, _cores())
    qp, sp, rp = weight._addresses
    if m <= VNNI_MAX_TOKENS or not amx:
        rc = lib.ti_linear_vnni(m, n, k, xp, k, qp, k, sp, rp, bp, yp, n, nth)
    else:
        rc = lib.ti_linear(m, n, k, xp, k, qp, k, sp, bp, yp, n, nth)
    del owners  # alive until the kernel returned
    if rc:
        raise LaunchError(f"int8 linear kernel failed (status {rc}: "
                          f"{'workspace allocation' if rc == 1 else 'K too large for int32 sums'})", backend="cpu")


@functools.lru_cache(maxsize=1)
def _auto_threads() -> int:
    """Threads of a call with no explicit count: the usable cores (capped at kernels.max_threads()),
    worked out once per process like a bound op's count."""
    return kernels.thread_count(0, _cores())


def _cores() -> int:
    from tracea.doctor.cpu_probe import usable_cores

    return usable_cores()
