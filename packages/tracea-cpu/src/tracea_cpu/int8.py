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
kernel is ``tdpbssd`` on AMX tiles with the weights loaded in place (:mod:`.emit.amx_int8`). Elsewhere
the documented fallback computes the same integers with NumPy (exact, slow). The result is returned
in the kind of ``x`` (NumPy array or torch tensor), shaped ``(..., N)``, float32.
"""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracea.errors import DTypeError, InvalidArgumentError, LaunchError, ShapeError

from . import kernels


@dataclass(frozen=True)
class Int8Weight:
    """Weights of a quantized linear layer: ``q`` (N x K int8, C-contiguous) and the per-output-channel
    scales ``scale`` (N float32), ``w ~= q * scale[:, None]``."""

    q: np.ndarray
    scale: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.q.shape[0]), int(self.q.shape[1])


def _host_f32(obj: Any, name: str) -> tuple[np.ndarray, bool]:
    """A float32 NumPy view (or copy) of a NumPy array or torch CPU tensor; whether it was torch."""
    torch = sys.modules.get("torch")
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


def fallback_reason() -> str | None:
    """Why :func:`linear_int8` runs its NumPy fallback on this machine (None: the AMX kernel runs)."""
    return _amx_ready()


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
    torch CPU; ``bias`` None or N float32; ``threads`` 0 = ``$TRACEA_NUM_THREADS`` or every core."""
    if not isinstance(weight, Int8Weight):
        raise InvalidArgumentError("weight", weight, "an Int8Weight from quantize_weight()")
    n, k = weight.shape
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
    if m:
        why = _amx_ready()
        if why:
            y[...] = reference(x2, weight, b)
        else:
            lib = kernels.int8_linear_library()
            nth = kernels.thread_count(threads, _cores())
            rc = lib.ti_linear(m, n, k, x2.ctypes.data, k, weight.q.ctypes.data, k, weight.scale.ctypes.data,
                               None if b is None else b.ctypes.data, y.ctypes.data, n, nth)
            if rc:
                raise LaunchError(f"int8 linear kernel failed (status {rc}: "
                                  f"{'workspace allocation' if rc == 1 else 'K too large for int32 sums'})",
                                  backend="cpu")
    y = y.reshape(*lead, n)
    if was_torch:
        import torch

        return torch.from_numpy(y)
    return y


def _cores() -> int:
    from tracea.doctor.cpu_probe import usable_cores

    return usable_cores()
