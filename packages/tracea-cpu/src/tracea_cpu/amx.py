"""bf16 GEMM on AMX tiles (``cpu.gemm.amxbf16``): the AVX512_BF16 variant's operands, epilogues,
transposes, batches and drivers with a ``tdpbf16ps`` micro-kernel (see :mod:`.emit.amx`).

Linux lets a process use AMX tile data only after it asks (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``; the permission is process-wide). :func:`amx_permission` asks once per process,
before any AMX kernel runs; when the OS refuses (an old kernel, a seccomp filter) the variant declines
with the reason and the AVX512_BF16 variant serves bf16 GEMMs.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
from typing import Any


from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import Requirements
from tracea.dtypes import DType
from tracea.errors import BackendError
from tracea.ir.ops import GemmOp, LayerType, Op
from tracea.semantic import PipelineConfig, SearchSpace
from tracea.semantic.config import VALID, Validity

from . import kernels, spaces
from .bf16 import CpuGemmBf16Variant, widened_bias
from .panel_cache import PANELS
from .emit.amx import check_amx_tile
from .isa import AMX_BF16
from .host_load import thread_picker
from .variant_base import _check_rc, _requested_threads, _threads_problem

_SYS_ARCH_PRCTL = 158  # x86_64
_ARCH_GET_XCOMP_PERM = 0x1022
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18

#: Share of the AMX bf16 peak (1024 flops per cycle and core) the kernel reaches on large GEMMs:
#: ~1.0 TFLOP/s per core at 1024^3 on the 2.6 GHz Xeon (docs/backends/cpu.md, "AMX").
AMX_EFFICIENCY = 0.4
#: B bytes per second per core that packing and tile loads sustain when the weights stream from memory
#: (an assumption, not measured: the machine was never quiet enough).
AMX_STREAM_GBS_PER_CORE = 12.0
#: most rows of the few-rows driver (``TB_WA_MAXM`` in :mod:`.emit.amx_rows`)
ROWS_MAXM = 128


@functools.lru_cache(maxsize=1)
def amx_permission() -> str | None:
    """Ask the OS once per process for AMX tile data; None when granted, else why not."""
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return f"AMX tile permission is requested through Linux x86_64 arch_prctl; this is " \
               f"{platform.system()} {platform.machine()}"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)
        if rc != 0:
            err = ctypes.get_errno()
            return (f"the OS refused AMX tile data (arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA): "
                    f"{os.strerror(err) if err else 'failed'})")
        mask = ctypes.c_ulong(0)
        libc.syscall(_SYS_ARCH_PRCTL, _ARCH_GET_XCOMP_PERM, ctypes.byref(mask))
        if not mask.value >> _XFEATURE_XTILEDATA & 1:
            return "the OS accepted the AMX request but did not grant tile data"
    except (OSError, AttributeError) as exc:
        return f"cannot ask the OS for AMX tile data: {exc}"
    return None


@functools.lru_cache(maxsize=4)
def amx_compiler_reason(kind: str = "bf16") -> str | None:
    """None when the C compiler builds AMX code (``kind``: ``bf16`` or ``int8`` intrinsics), else why
    not (GCC < 11 and clang < 12 lack ``-mamx-tile``). Compiled once, then found in the kernel cache."""
    from tracea.errors import CompilationError

    from .isa import AMX_INT8
    from .toolchain import build

    isa = AMX_BF16 if kind == "bf16" else AMX_INT8
    op = "_tile_dpbf16ps(0, 1, 2)" if kind == "bf16" else "_tile_dpbssd(0, 1, 2)"
    src = f"#include <immintrin.h>\nvoid tr_amx_probe(void) {{ _tile_zero(0); {op}; _tile_release(); }}\n"
    try:
        build(src, isa.cflags, f"amx-probe-{kind}")
    except (CompilationError, BackendError) as exc:
        return f"the C compiler cannot build AMX {kind} code ({isa.cflags[-2]} {isa.cflags[-1]}): {exc}"
    return None


def amx_bf16_reasons(reasons: list[str]) -> list[str]:
    """A bf16 AMX variant's rejection reasons from its base checks: a missing ISA named as AMX, then (when
    nothing else rejects) why the compiler or the OS cannot run AMX bf16 code here."""
    reasons = [f"needs AMX (amx_tile, amx_bf16): {r}" if r.startswith("device lacks") else r for r in reasons]
    if not reasons:
        why = amx_compiler_reason("bf16") or amx_permission()
        if why:
            reasons.append(why)
    return reasons


def rows_driver(op: GemmOp) -> bool:
    """Whether the AMX library runs ``op`` through its few-rows driver (:mod:`.emit.amx_rows`):
    at most 128 rows of a row-major A against transposed (N x K) weights."""
    return op.m <= ROWS_MAXM and op.trans_b and not op.trans_a


def amx_peak_gflops(profile: DeviceProfile) -> float:
    """AMX bf16 peak: 1024 flops per cycle and core (one 16x16x32 ``tdpbf16ps`` per 16 cycles)."""
    try:
        ghz = float(profile.extras.get("mhz", "")) / 1000.0
    except ValueError:
        ghz = 0.0
    return profile.compute_units * 1024 * (ghz or 2.0)


class CpuGemmAmxVariant(CpuGemmBf16Variant):
    """The blocked bf16 GEMM with an AMX ``tdpbf16ps`` micro-kernel (MR x NR blocks of 16 x 16 tiles)."""

    offers_direct = False  # the AMX kernels keep their own B handling

    def __init__(self) -> None:
        super().__init__()
        self.isa = AMX_BF16
        self.priority = 45
        self.name = "cpu.gemm.amxbf16"
        self.description = "blocked bf16 GEMM on AMX tiles (tdpbf16ps, fp32 accumulate), fused epilogue"
        self.requirements = Requirements(device_kind="cpu", op_kind=LayerType.GEMM, dtypes=frozenset({DType.BF16}),
                                         out_dtypes=frozenset({DType.BF16, DType.F32}), isa=AMX_BF16.requires)

    def library(self, mr: int, nr: int, epilogue_key: str) -> Any:
        why = amx_permission()
        if why:
            raise BackendError(why, backend="cpu")
        return kernels.amx_gemm_library(mr, nr, epilogue_key)

    def bind(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        """The AVX512_BF16 variant's launcher, except where the many-rows driver runs one GEMM: there a
        torch B's packed panels are kept between calls (:mod:`.panel_cache`; packing a 512 x 512 B was
        ~10% of a 512^3 call)."""
        assert isinstance(op, GemmOp)
        fn, call, ref = self.prepare(op, config, profile)
        nth = self.threads(op, config, profile)
        lib = kernels.amx_gemm_library(int(config.get("mr")), int(config.get("nr")), op.epilogue.key)
        if not lib.tb_amx_takes_packed_b(ref, nth):
            return super().bind(op, config, profile, adapter)
        geometry = (id(lib), "gemm", int(config.get("nr")), op.n, op.k, call.rsb, call.csb)
        words, packb, pk, panels_of = lib.tb_amx_bwords(op.n, op.k), lib.tb_amx_pack_b, lib.tb_gemm_call_pk, PANELS.panels
        ptr, n, k, rsb, csb = adapter.data_ptr, op.n, op.k, call.rsb, call.csb
        has_bias, widen = op.epilogue.has_bias, op.out_dtype is DType.BF16
        pick = thread_picker(nth, _requested_threads(config))

        def launch(a: Any, b: Any, bias: Any, out: Any) -> None:
            bp, nt = ptr(b), pick()
            panels = panels_of(geometry, b, bp, words, lambda dst: packb(n, k, bp, rsb, csb, dst, nt))
            b32 = None
            if has_bias:  # the bias arrives in the output dtype; the epilogue runs in fp32
                b32 = widened_bias(adapter, bias) if widen else bias
            bias_ptr = None if b32 is None else (b32.ctypes.data if widen else ptr(b32))
            if panels is None:
                rc = fn(ref, ptr(a), bp, ptr(out), bias_ptr, nt)
            else:
                rc = pk(ref, ptr(a), bp, panels[1], ptr(out), bias_ptr, nt)
            del panels, b32  # alive until the kernel returned
            if rc:
                _check_rc(rc, "bf16 gemm")

        launch.pointer_only = True  # type: ignore[attr-defined]
        return launch

    def check(self, op: Op, profile: DeviceProfile) -> list[str]:
        return amx_bf16_reasons(super(CpuGemmBf16Variant, self).check(op, profile))

    def efficiency_on(self, profile: DeviceProfile) -> float:
        return AMX_EFFICIENCY

    def estimate_seconds(self, op: Op, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        assert isinstance(op, GemmOp)
        # Tiles compute whole 16-row blocks: a few rows cost a full tile's flops.
        m_pad = -(-op.m // 16) * 16
        flop_time = 2.0 * op.batch * m_pad * op.n * op.k / (amx_peak_gflops(profile) * 1e9 * AMX_EFFICIENCY)
        memory = op.min_bytes / ((profile.bandwidth_gbs or 20.0) * 1e9)
        if rows_driver(op):
            # The weights are read in place, once: bound by memory (or the padded tile flops).
            return max(flop_time, memory) + 10e-6
        stream = op.batch * op.n * op.k * 2 / (AMX_STREAM_GBS_PER_CORE * profile.compute_units * 1e9)
        return max(flop_time, stream, memory) + 15e-6

    def block_rows(self, op: Op, config: PipelineConfig, profile: DeviceProfile | None) -> int:
        """The config's ``mc``, lowered for a deep K so that the A block the many-rows driver packs for
        the whole K (``mc x K`` bf16, :mod:`.emit.amx_blocks`) stays within twice the profile's L2 (whole
        tile rows, at least one). Not within the L2 itself: every M block streams the packed B once from
        beyond the L2, so fewer, taller blocks win even when A spills (measured 4096^3, one thread:
        mc = 128 / 256 / 384 ran 0.51-0.58 / 0.89-0.91 / 1.01 TFLOP/s; at 2048^3 mc = 128 0.85, 256-512
        0.97-1.10)."""
        mc, mr = int(config.get("mc")), int(config.get("mr"))
        l2 = int(profile.caches.get("L2") or 0) if profile is not None else 0
        if not l2 or not isinstance(op, GemmOp):
            return mc
        fit = l2 // max(op.k, 1) // mr * mr
        return max(mr, min(mc, fit))

    def search_space(self, op: Op, profile: DeviceProfile) -> SearchSpace:
        if isinstance(op, GemmOp) and rows_driver(op):
            return spaces.amx_rows_space(profile)
        return spaces.amx_space(profile)

    def hero_configs(self, op: Op, profile: DeviceProfile) -> list[PipelineConfig]:
        # The few-rows driver uses no tile block or cache block: one hero (one compiled library).
        if isinstance(op, GemmOp) and rows_driver(op):
            return spaces.amx_heroes(op)[:1]
        return spaces.amx_heroes(op)

    def validate_config(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        names = ("mr", "nr", "mc", "nc", "kc")
        values = [config.get(n) for n in names]
        for n, v in zip(names, values):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                return Validity(False, f"param {n}={v!r} must be a positive integer")
            if n in ("mc", "nc", "kc") and v > kernels.MAX_BLOCK:
                return Validity(False, f"param {n}={v} exceeds the largest cache block, {kernels.MAX_BLOCK}")
        why = check_amx_tile(values[0], values[1]) or _threads_problem(config)
        return Validity(False, why) if why else VALID
