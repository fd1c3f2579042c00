"""Skinny GEMM variants: ``nn.Linear`` at decode time (``M <= 16`` rows of A against weights stored
N x K), fp32 (``cpu.gemv.<isa>``) and bf16 (``cpu.gemv.avx512bf16``; ``cpu.gemv.bf16cvt.<isa>`` on CPUs
without AVX512_BF16), memory-bound, parallel over N.

The kernels are in :mod:`.emit.skinny`. What is decided here:

* **Which ops.** A GEMM whose B is the transposed weight (``trans_b``: columns of B contiguous along k,
  as ``F.linear`` / ``x @ W.T`` hand it over), A not transposed, at most :data:`MAX_M` rows per batch
  entry (bf16: :data:`BF16_MAX_M`; widened bf16: :data:`BF16CVT_MAX_M`). Anything else is declined with
  the reason and runs on the blocked variants (``cpu.gemm.*``, whose axpy driver serves B stored K x N).
* **Threads** (:func:`auto_threads`). A second thread halves the time of a weight that streams from
  L2/L3/DRAM, but the call must start the OpenMP worker: while libgomp's workers spin after their last
  region (its default, e.g. when torch loaded the runtime first) that costs ~1.5 us and two threads win
  from ~64-128 KiB of weights; a sleeping worker (``GOMP_SPINCOUNT`` small -- Tracea's own default when
  it loads the runtime first -- or ``OMP_WAIT_POLICY=passive``) takes 45-90 us to wake on the 2-core KVM
  VM, so then one thread serves up to :data:`COLD_THREADS_BYTES`. The count is further capped at the
  cores other processes leave free (:mod:`.host_load`).
* **Ranking.** No measured data ships for these variants: the Doctor ranks them by their roofline
  (weight bytes over the profile's bandwidth), below the blocked variants' measured estimates for the
  same shapes, and their priority breaks ties in their favour.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType
from tracea.ir.ops import GemmOp, LayerType, Op
from tracea.semantic import PipelineConfig, SearchSpace
from tracea.semantic.config import VALID, Validity

from . import kernels
from .bf16 import bf16_operand, bias_f32, f32_operand, widened_bias
from .emit.skinny import MAX_M, SKINNY_PARAMS
from .host_load import thread_picker
from .isa import ALL_ISAS, AVX2, AVX512, AVX512_BF16, Isa
from .variant_base import CpuVariant, _check_rc, _host, _ptr, _requested_threads, _threads_problem, pointer_launcher

#: bf16: the most rows the dot-product kernel serves. Up to 2 rows its tiles walk 8-16 weight rows side
#: by side; 3-4 rows walk 4, and there the AMX variant's few-rows driver measured faster (4096 x 4096, 4
#: rows, patched nn.Linear: AMX 1.42-1.44x torch, this kernel 1.32-1.35x); at 8-16 rows AMX wins by far.
BF16_MAX_M = 2
#: weight bytes per thread below which another thread does not pay while the OpenMP workers spin
#: (2-core Sapphire Rapids VM, M = 1, fp32: 64x64 / 128x128 / 256x256 weights 3.3 / 3.0 / 6.9 us on one
#: thread, 4.7 / 3.2 / 5.7 us on two)
HOT_BYTES_PER_THREAD = 64 * 1024
#: total weight bytes from which a call wakes sleeping OpenMP workers (45-90 us each on that VM)
COLD_THREADS_BYTES = 4 * 1024 * 1024
#: libgomp spins below this count sleep within tens of microseconds: treated as sleeping workers
_SPINNING = 100_000
#: added to the ISA's priority (cpu.gemm.<isa>: avx512 30, avx2 / neon 20, scalar 0): above the blocked
#: variant of the same ISA, the wider ISA first; bf16: above the AMX variant's 45
_PRIORITY_BONUS = 10
_BF16_PRIORITY = 46
#: widened bf16 (cpu.gemv.bf16cvt.<isa>): below the AMX variant's 45 and cpu.gemv.avx512bf16's 46, the
#: wider ISA first
_BF16CVT_PRIORITY = {"avx512": 44, "avx2": 43}
#: widened bf16: the most rows served. Zen 3 2-core VM, 4096 x 4096: 16 rows 4.0-4.7x torch's bf16
#: F.linear, the only other bf16 path on AVX2 (no blocked bf16 GEMM there to compare with yet)
BF16CVT_MAX_M = MAX_M
#: widened bf16: share of the fp32 kernels' FMA rate left by the widening (two integer ops per 2 x VW
#: bf16 values of each operand, on the FP pipes the FMAs use). Zen 3 2-core VM, 16 x 4096 x 4096, AVX2:
#: 5.8 ms = 93 GFLOP/s, 0.59 of the profile's 156 GFLOP/s fp32 peak = 0.74 x avx2's 0.8
BF16CVT_EFFICIENCY = 0.75


def workers_spin(env: Any = None) -> bool:
    """Whether idle OpenMP workers keep spinning between calls (libgomp's default, ``GOMP_SPINCOUNT`` of
    at least 100000 or ``infinite``, ``OMP_WAIT_POLICY=active``), as read from the environment the
    runtime read when it loaded; False when they sleep soon (a small spin count, ``passive``)."""
    env = os.environ if env is None else env
    policy = env.get("OMP_WAIT_POLICY", "").strip().lower()
    if policy == "passive":
        return False
    spin = env.get("GOMP_SPINCOUNT", "").strip().lower()
    if not spin or policy == "active":
        return True
    if spin in ("infinite", "infinity"):
        return True
    scale = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
    try:
        value = int(spin[:-1]) * scale[spin[-1]] if spin[-1] in scale else int(spin)
    except (ValueError, IndexError):
        return True  # libgomp ignores a value it cannot read: its default spins
    return value >= _SPINNING


def auto_threads(weight_bytes: int, cores: int, spinning: bool | None = None) -> int:
    """Threads for a skinny call whose weights take ``weight_bytes`` (see the module docstring)."""
    if cores <= 1:
        return 1
    if spinning is None:
        spinning = workers_spin()
    if not spinning and weight_bytes < COLD_THREADS_BYTES:
        return 1
    return int(max(1, min(cores, weight_bytes // HOT_BYTES_PER_THREAD)))


class CpuSkinnyVariant(CpuVariant):
    """fp32 ``C = epilogue(A @ W.T)`` for few rows: dot products against unpacked weight rows."""

    def __init__(self, isa: Isa) -> None:
        super().__init__(isa)
        self.priority += _PRIORITY_BONUS
        self.name = f"cpu.gemv.{isa.name}"
        self.description = (f"skinny GEMM x @ W.T for <= {MAX_M} rows (nn.Linear decode), {isa.name}, "
                            f"weights read once, split over N across threads, fused epilogue")
        self.requirements = Requirements(device_kind="cpu", op_kind=LayerType.GEMM, dtypes=frozenset({DType.F32}),
                                         isa=isa.requires)

    # -- which ops ------------------------------------------------------------------------------
    def max_m(self) -> int:
        return MAX_M

    def check(self, op: Op, profile: DeviceProfile) -> list[str]:
        reasons = super().check(op, profile)
        if reasons or not isinstance(op, GemmOp):
            return reasons
        if op.m > self.max_m():
            reasons.append(f"m={op.m} rows: the skinny kernel serves at most {self.max_m()} (blocked GEMM variants)")
        if not op.trans_b:
            reasons.append("B stored K x N (the skinny kernel reads weights stored N x K: b transposed)")
        if op.trans_a:
            reasons.append("a transposed (the skinny kernel reads rows of a contiguous along k)")
        return reasons

    def estimate_seconds(self, op: Op, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        # Memory-bound: the weights stream once; the flops run at the FMA rate on every core.
        assert isinstance(op, GemmOp)
        flop_time = op.flops / (profile.peak("float32") * 1e9 * self.efficiency_on(profile))
        return max(flop_time, op.min_bytes / ((profile.bandwidth_gbs or 20.0) * 1e9)) + 3e-6

    # -- configs --------------------------------------------------------------------------------
    def search_space(self, op: Op, profile: DeviceProfile) -> SearchSpace:
        cores = max(1, profile.compute_units)
        return SearchSpace().param("threads", [0] + list(range(1, min(cores, 8) + 1)))

    def hero_configs(self, op: Op, profile: DeviceProfile) -> list[PipelineConfig]:
        return [PipelineConfig(params=(("threads", 0),))]

    def validate_config(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        why = _threads_problem(config)
        return Validity(False, why) if why else VALID

    def threads(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> int:
        requested = _requested_threads(config)
        if requested:
            return kernels.thread_count(requested, profile.compute_units)
        assert isinstance(op, GemmOp)
        cores = kernels.thread_count(0, profile.compute_units)
        return auto_threads(op.n * op.k * op.dtypes[1].itemsize, cores)

    # -- running --------------------------------------------------------------------------------
    def library(self, op: GemmOp) -> Any:
        return kernels.skinny_library(self.isa.name, op.epilogue.key)

    def entry(self, op: GemmOp) -> Any:
        return self.library(op).ts_f32_call

    def params(self, op: GemmOp, nth: int) -> ctypes.Array:
        m, n, k = op.m, op.n, op.k
        return kernels.call_params(SKINNY_PARAMS, dict(batch=op.batch, M=m, N=n, K=k, rsa=k, sa=m * k, ldw=k,
                                                       sw=n * k, ldc=n, sc=m * n, nth=nth,
                                                       out_bf16=int(op.out_dtype is DType.BF16)))

    def prepare(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Any:
        assert isinstance(op, GemmOp)
        return self.entry(op)

    def bind(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        assert isinstance(op, GemmOp)
        return pointer_launcher(self.prepare(op, config, profile), self.params(op, self.threads(op, config, profile)),
                                SKINNY_PARAMS.index("nth"), config, adapter, op.epilogue.has_bias, "skinny gemm")

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, GemmOp)
        fn = self.prepare(op, config, profile)
        bt, m, n, k = op.batch, op.m, op.n, op.k
        a = _host(args, "a", (bt, m, k))
        b = _host(args, "b", (bt, k, n))
        bias = _host(args, "bias", (n,)) if op.epilogue.has_bias else None
        out = _host(args, "out", (bt, m, n))
        rc = fn(self.params(op, self.threads(op, config, profile)), _ptr(a), _ptr(b), _ptr(out), _ptr(bias))
        _check_rc(rc, "skinny gemm")


class CpuSkinnyBf16Variant(CpuSkinnyVariant):
    """bf16 ``C = epilogue(A @ W.T)`` for few rows on AVX512_BF16 (``vdpbf16ps``), fp32 accumulation,
    bf16 (round to nearest even) or fp32 output."""

    def __init__(self) -> None:
        super().__init__(AVX512_BF16)
        self.priority = _BF16_PRIORITY
        self.name = "cpu.gemv.avx512bf16"
        self.description = (f"skinny bf16 GEMM x @ W.T for <= {BF16_MAX_M} rows (nn.Linear decode), vdpbf16ps, "
                            f"fp32 accumulate, weights read once, split over N across threads, fused epilogue")
        self.requirements = Requirements(device_kind="cpu", op_kind=LayerType.GEMM, dtypes=frozenset({DType.BF16}),
                                         out_dtypes=frozenset({DType.BF16, DType.F32}), isa=AVX512_BF16.requires)

    def max_m(self) -> int:
        return BF16_MAX_M

    def check(self, op: Op, profile: DeviceProfile) -> list[str]:
        return [f"needs avx512_bf16 (vdpbf16ps): {r}" if r.startswith("device lacks") else r
                for r in super().check(op, profile)]

    def efficiency_on(self, profile: DeviceProfile) -> float:
        return 1.6  # two products per fp32 lane and instruction, ~80% of that rate

    def library(self, op: GemmOp) -> Any:
        return kernels.skinny_library(self.isa.name, op.epilogue.key)

    def entry(self, op: GemmOp) -> Any:
        return self.library(op).ts_bf16_call

    def bind(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        assert isinstance(op, GemmOp)
        if op.epilogue.has_bias and op.out_dtype is DType.BF16:
            return self._bind_widened_bias(op, config, profile, adapter)
        return super().bind(op, config, profile, adapter)

    def _bind_widened_bias(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:

        fn = self.prepare(op, config, profile)
        params = self.params(op, self.threads(op, config, profile))
        slot = SKINNY_PARAMS.index("nth")
        pick, ptr = thread_picker(params[slot], _requested_threads(config)), adapter.data_ptr

        def launch(a: Any, b: Any, bias: Any, out: Any) -> None:
            # the bias arrives in the output dtype (bf16); the epilogue runs in fp32. b32 must outlive the call.
            b32 = widened_bias(adapter, bias)
            params[slot] = pick()
            rc = fn(params, ptr(a), ptr(b), ptr(out), b32.ctypes.data)
            if rc:
                _check_rc(rc, "skinny bf16 gemm")

        launch.pointer_only = True  # type: ignore[attr-defined]
        return launch

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, GemmOp)
        fn = self.prepare(op, config, profile)
        bt, m, n, k = op.batch, op.m, op.n, op.k
        # every (address, owner) pair keeps its owner alive in this frame until the kernel has returned
        a, a_owner = bf16_operand(args, "a", (bt, m, k))
        b, b_owner = bf16_operand(args, "b", (bt, k, n))
        out, out_owner = (bf16_operand if op.out_dtype is DType.BF16 else f32_operand)(args, "out", (bt, m, n))
        bias_arr = bias_f32(args, n) if op.epilogue.has_bias else None
        rc = fn(self.params(op, self.threads(op, config, profile)), a, b, out, _ptr(bias_arr))
        del a_owner, b_owner, out_owner, bias_arr
        _check_rc(rc, "skinny bf16 gemm")


class CpuSkinnyBf16CvtVariant(CpuSkinnyBf16Variant):
    """bf16 ``C = epilogue(A @ W.T)`` for few rows on CPUs without AVX512_BF16 (AVX2, plain AVX-512): bf16
    weights and activations widened to fp32 in registers, fp32 FMAs, bf16 (round to nearest even) or fp32
    output. The weights are read once, in place."""

    def __init__(self, isa: Isa) -> None:
        CpuSkinnyVariant.__init__(self, isa)
        self.priority = _BF16CVT_PRIORITY[isa.name]
        self.name = f"cpu.gemv.bf16cvt.{isa.name}"
        self.description = (f"skinny bf16 GEMM x @ W.T for <= {BF16CVT_MAX_M} rows (nn.Linear decode), {isa.name}, "
                            f"bf16 widened to fp32 in registers, fp32 FMA, weights read once, fused epilogue")
        self.requirements = Requirements(device_kind="cpu", op_kind=LayerType.GEMM, dtypes=frozenset({DType.BF16}),
                                         out_dtypes=frozenset({DType.BF16, DType.F32}), isa=isa.requires)

    def max_m(self) -> int:
        return BF16CVT_MAX_M

    def check(self, op: Op, profile: DeviceProfile) -> list[str]:
        reasons = CpuSkinnyVariant.check(self, op, profile)
        if not reasons and profile.has("avx512_bf16"):
            # vdpbf16ps does the two products of a widened pair in one instruction, and AMX more: on such
            # hosts cpu.gemv.avx512bf16 (1-2 rows) and the AMX / AVX512_BF16 GEMMs serve bf16
            reasons.append("the host has avx512_bf16: the vdpbf16ps / AMX bf16 variants serve it")
        return reasons

    def efficiency_on(self, profile: DeviceProfile) -> float:
        return CpuVariant.efficiency_on(self, profile) * BF16CVT_EFFICIENCY

    def library(self, op: GemmOp) -> Any:
        return kernels.skinny_library(self.isa.name, op.epilogue.key, True)

    def entry(self, op: GemmOp) -> Any:
        return self.library(op).ts_bw_call


def skinny_variants() -> list[CpuSkinnyVariant]:
    """The fp32 skinny variant of every ISA, the AVX512_BF16 one and the widened bf16 ones (the Doctor
    filters by the host's flags)."""
    return [CpuSkinnyVariant(isa) for isa in ALL_ISAS] + [CpuSkinnyBf16Variant()] + \
        [CpuSkinnyBf16CvtVariant(isa) for isa in (AVX512, AVX2)]
