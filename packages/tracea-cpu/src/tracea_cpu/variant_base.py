"""What every CPU variant shares: ISA availability and compiler checks, estimates, thread counts, the
validation of blocked-kernel configs, and the checked host views and return codes of kernel calls."""

from __future__ import annotations

import ctypes
import math
from typing import Any, Callable

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import KernelVariant, OpArgs
from tracea.errors import InvalidArgumentError, LaunchError, LayoutError, UnsupportedConfigError
from tracea.ir.ops import Op
from tracea.semantic import PipelineConfig
from tracea.semantic.config import VALID, Validity

from . import kernels, launch_shim, spaces
from .host_load import thread_picker
from .isa import Isa
from .toolchain import compiler_or_reason

_LANES = {"avx512": 16, "avx512bf16": 16, "avx2": 8, "neon": 4, "scalar": 1}
# Fraction of the per-lane peak each ISA's kernels reach (measured); scalar code gets what the
# compiler's auto-vectorisation gives.
_BASE_EFFICIENCY = {"avx512": 0.85, "avx512bf16": 0.7, "avx2": 0.8, "neon": 0.7, "scalar": 0.5}
# B bytes from which the packing-free GEMM drivers use every thread (see CpuGemmVariant.threads). Timed
# alone, two threads pay off from ~256 KiB (M = 1, 512 x 512 fp32: 57 -> 95 GB/s); inside a model the
# pool's sleeping worker must be woken for every such call, and on the 2-core Sapphire Rapids VM a
# Llama-style d512 fp32 block at one-token decode (weights 1-2.8 MiB) ran 0.87-0.90x eager with the
# two-thread GEMVs and 1.00x with one thread (torch's ops after them slowed too). 4 MiB: one thread up
# to a 1024 x 1024 fp32 weight.
GEMV_THREADS_BYTES = 4 * 1024 * 1024
_PRIORITY = {"avx512": 30, "avx512bf16": 40, "avx2": 20, "neon": 20, "scalar": 0}


class CpuVariant(KernelVariant):
    """Shared logic of the CPU variants: ISA availability, compiler checks, estimates."""

    backend = "cpu"
    isa: Isa

    def __init__(self, isa: Isa) -> None:
        self.isa = isa
        self.priority = _PRIORITY[isa.name]

    def check(self, op: Op, profile: DeviceProfile) -> list[str]:
        reasons = super().check(op, profile)
        if reasons and reasons[0].startswith(("serves ", "runs on ")):
            return reasons
        if not self.isa.runs_here():
            reasons.append(f"{self.isa.name} code does not run on this machine's architecture")
        cc, why = compiler_or_reason()
        if cc is None:
            reasons.append(why)
        return reasons

    def efficiency_on(self, profile: DeviceProfile) -> float:
        best = str(profile.extras.get("best_isa", self.isa.name))
        share = min(1.0, self.isa.width / _LANES.get(best, self.isa.width))
        return _BASE_EFFICIENCY[self.isa.name] * share

    def estimate_seconds(self, op: Op, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        self.efficiency = self.efficiency_on(profile)
        return super().estimate_seconds(op, profile, config) + 10e-6

    def threads(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> int:
        requested = _requested_threads(config)
        if requested == 0 and spaces.small_problem(op):
            return 1
        return kernels.thread_count(requested, profile.compute_units)


def _host(args: OpArgs, name: str, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray | None:
    arr = args.host(name)
    if arr is None:
        return None
    if arr.dtype != dtype:
        raise InvalidArgumentError(name, arr, f"a {np.dtype(dtype).name} array")
    if not arr.flags.c_contiguous:
        raise LayoutError(name, arr, "a packed row-major (C-contiguous) array")
    if arr.size != math.prod(shape):
        raise InvalidArgumentError(name, arr, f"{math.prod(shape)} elements (shape {shape})")
    return arr


def _ptr(arr: np.ndarray | None) -> int | None:
    return None if arr is None else arr.__array_interface__["data"][0]


def _check_rc(rc: int, what: str) -> None:
    if rc != 0:
        raise LaunchError(f"{what} kernel failed (status {rc}: workspace allocation)", backend="cpu")


def _require(validity: Validity, name: str, config: PipelineConfig) -> None:
    if not validity:
        raise UnsupportedConfigError(f"config {config.key} is invalid for {name}: {validity.reason}",
                                     reason=validity.reason)


def _validate_blocked(isa: Isa, config: PipelineConfig) -> Validity:
    names = ("mr", "nr", "mc", "nc", "kc")
    values = [config.get(n) for n in names]
    for n, v in zip(names, values):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            return Validity(False, f"param {n}={v!r} must be a positive integer")
    for n, v in zip(names[2:], values[2:]):
        if v > kernels.MAX_BLOCK:
            return Validity(False, f"param {n}={v} exceeds the largest cache block, {kernels.MAX_BLOCK}")
    why = kernels.check_tile(isa, values[0], values[1]) or _threads_problem(config)
    return Validity(False, why) if why else VALID


def _threads_problem(config: PipelineConfig) -> str | None:
    """Why the config's ``threads`` param (0 or absent: automatic) cannot be used, or None."""
    t = config.get("threads", 0)
    if isinstance(t, bool) or not isinstance(t, int) or t < 0:
        return f"param threads={t!r} must be a non-negative integer (0: automatic)"
    if t > kernels.max_threads():
        return f"param threads={t} exceeds the limit of {kernels.max_threads()} threads per call"
    return None


def _requested_threads(config: PipelineConfig) -> int:
    """The config's ``threads`` (0: automatic), or UnsupportedConfigError for a value no kernel may get."""
    why = _threads_problem(config)
    if why:
        raise UnsupportedConfigError(f"config {config.key}: {why}", reason=why)
    return int(config.get("threads", 0) or 0)


def pointer_launcher(fn: Callable[..., int], params: Any, slot: int, config: PipelineConfig, adapter: Any,
                     has_bias: bool, what: str, bias_before_out: bool = False) -> Callable[..., None]:
    """The pointer-only launcher of a bound CPU kernel: ``launch(a, b, bias, out)`` writes the thread
    count picked for this call (:func:`~tracea_cpu.host_load.thread_picker`) into ``params[slot]`` (the
    launcher's own parameter block) and calls ``fn(params, a, b, out, bias)`` -- ``fn(params, a, b, bias,
    out)`` with ``bias_before_out`` -- on the arrays' data pointers; a non-zero status raises LaunchError
    naming ``what``. The call goes through the compiled launch shim when it is available
    (:mod:`tracea_cpu.launch_shim`; NumPy arrays are then passed as they are), else through ctypes."""
    pick, ptr = thread_picker(params[slot], _requested_threads(config)), adapter.data_ptr

    if bias_before_out:
        def launch(a: Any, b: Any, bias: Any, out: Any) -> None:
            params[slot] = pick()
            rc = fn(params, ptr(a), ptr(b), ptr(bias) if has_bias else None, ptr(out))
            if rc:
                _check_rc(rc, what)
    else:
        def launch(a: Any, b: Any, bias: Any, out: Any) -> None:
            params[slot] = pick()
            rc = fn(params, ptr(a), ptr(b), ptr(out), ptr(bias) if has_bias else None)
            if rc:
                _check_rc(rc, what)

    shim = launch_shim.entry_point(fn)
    if shim is not None:
        launch = _shim_launcher(shim, launch, params, slot, pick, adapter, has_bias, what, bias_before_out)
    launch.pointer_only = True  # type: ignore[attr-defined]
    return launch


def _shim_launcher(shim: tuple[Callable[..., int], int], through_ctypes: Callable[..., None], params: Any,
                   slot: int, pick: Callable[[], int], adapter: Any, has_bias: bool, what: str,
                   bias_before_out: bool) -> Callable[..., None]:
    """:func:`pointer_launcher`'s launch through the shim. NumPy arrays go in as they are (the shim reads
    their data pointers), other arrays as ``adapter.data_ptr`` addresses; an object the shim does not
    take (TypeError) is launched by ``through_ctypes`` (the ctypes launch) instead. A thread count that
    cannot change is written into the parameter block once, here."""
    call5, entry = shim
    block, ptr = ctypes.addressof(params), adapter.data_ptr
    fixed = getattr(pick, "fixed", None)
    moving = fixed is None
    if not moving:
        params[slot] = fixed

    if getattr(adapter, "name", None) == "numpy":  # arrays as they are
        def launch(a: Any, b: Any, bias: Any, out: Any) -> None:
            if moving:
                params[slot] = pick()
            try:
                if bias_before_out:
                    rc = call5(entry, block, a, b, bias if has_bias else None, out)
                else:
                    rc = call5(entry, block, a, b, out, bias if has_bias else None)
            except TypeError:  # not an ndarray after all
                through_ctypes(a, b, bias, out)
                return
            if rc:
                _check_rc(rc, what)
    else:
        def launch(a: Any, b: Any, bias: Any, out: Any) -> None:
            if moving:
                params[slot] = pick()
            if bias_before_out:
                rc = call5(entry, block, ptr(a), ptr(b), ptr(bias) if has_bias else None, ptr(out))
            else:
                rc = call5(entry, block, ptr(a), ptr(b), ptr(out), ptr(bias) if has_bias else None)
            if rc:
                _check_rc(rc, what)

    launch.keepalive = (params, through_ctypes)  # type: ignore[attr-defined]  # the block, the entry's library
    return launch
