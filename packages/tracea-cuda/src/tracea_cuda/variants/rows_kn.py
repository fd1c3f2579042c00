"""``cuda.gemm.rows_kn``: few-row GEMMs against a B stored (K, N) row-major (``a @ b`` of plain matrices with a
few rows in ``a``), bound by reading B once; see :mod:`tracea_cuda.emit.rows_kn`."""

from __future__ import annotations

from typing import Any

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType
from tracea.ir.ops import GemmOp, LayerType
from tracea.semantic.config import PipelineConfig
from tracea.semantic.search_space import SearchSpace

from .. import compiler, helpers_kernels, launcher, toolkit
from ..arrays import data_ptr, device_index, launch_stream
from ..emit.rows_kn import KERNEL_NAME, MAX_ROWS, MAX_SLICE, THREADS, RowsKnSpec, render
from ..launcher import scratch
from .base import FLOAT_IO, CudaVariant, aligned, run_pointers, u64

#: fraction of the device bandwidth the estimate assumes for the stream of B (and the workspace's traffic)
BANDWIDTH_SHARE = 0.75
#: B of at least this many bytes makes the tiled 3xTF32 GEMMs decline fp32-exact products rows_kn serves
STREAMED_BYTES = 1 << 20
#: K slices at most (unless K needs more of MAX_SLICE rows). H100, fp32 x8 @ B8192x1024 eager: 256 slices 0.92x,
#: 128 0.75x torch; x1 @ B8192x1024 512 slices 0.60x, 128 0.73x (the serial reduction over 512)
MAX_SLICES = 256
#: from this many K slices the reduction runs 8 slice groups per output (helpers_kernels.wide_reducer)
WIDE_FROM = 32
#: blocks wanted per SM (K slices are added until the grid has this many)
BLOCKS_PER_SM = 8


def _rows(m: int) -> int:
    return next(r for r in (1, 2, 4, 8, 16) if r >= m)


def slices(op: GemmOp, sms: int) -> tuple[int, int]:
    """(K slices, slice length): enough slices for ``BLOCKS_PER_SM`` blocks per SM over the column blocks, but
    not so many that the partial sums (written and read back) exceed half of B's traffic (K / (4M) slices), at
    most :data:`MAX_SLICES` (the reduction sums a slice per load, serially per output) and rounded up to a power of two, so the reduction kernels (one per
    slice count) are shared by many shapes; each slice at most :data:`MAX_SLICE` rows of B (slices past K
    contribute zeros)."""
    col_blocks = -(-op.n // (THREADS * 4))
    want = max(1, -(-BLOCKS_PER_SM * max(sms, 1) // col_blocks))
    want = min(want, max(1, op.k // (4 * op.m)), -(-op.k // 16), MAX_SLICES)
    need = -(-op.k // MAX_SLICE)
    count = 1 << (max(want, need) - 1).bit_length()
    return count, -(-op.k // count)


class RowsKnGemm(CudaVariant):
    name = "cuda.gemm.rows_kn"
    description = ("few-row GEMM (M <= 16) against a B stored (K, N) row-major: coalesced row streams of B, A's "
                   "slice in shared memory, exact fp32 FMA, K split across blocks with an ordered fp32 reduction")
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.GEMM,
                                dtypes=frozenset({DType.F16, DType.BF16, DType.F32}), out_dtypes=FLOAT_IO,
                                min_compute_capability=(7, 0), batched=False, max_dims={"m": MAX_ROWS})
    efficiency = 0.05  # memory-bound: the estimate below is a bandwidth one
    wave_quantized = False
    priority = 20
    tiled = False

    def extra_checks(self, op: GemmOp, profile: DeviceProfile) -> list[str]:  # type: ignore[override]
        reasons = []
        if op.trans_a:
            reasons.append("A stored (K, M) (transposed) is not read by the rows_kn kernel")
        if op.trans_b:
            reasons.append("B stored (N, K) (an nn.Linear weight): the skinny / GEMV variants stream it")
        if op.n * op.k >= 2**62 or op.m * op.k >= 2**31:
            reasons.append("operands larger than the kernel's index range")
        return reasons

    def estimate_seconds(self, op: GemmOp, profile: DeviceProfile,  # type: ignore[override]
                         config: PipelineConfig | None = None) -> float:
        """B once at :data:`BANDWIDTH_SHARE` of the bandwidth, the partial sums written and read back, and the
        two launches."""
        bw = max(profile.bandwidth_gbs, 1.0) * 1e9
        n_slices, _ = slices(op, profile.compute_units)
        ws = 2 * 4 * op.m * op.n * n_slices if n_slices > 1 else 0
        return (op.n * op.k * op.dtype_b.itemsize + ws) / (bw * BANDWIDTH_SHARE) + (8e-6 if n_slices > 1 else 4e-6)

    def spec(self, op: GemmOp, config: PipelineConfig, ptrs: dict | None, partial: bool = True) -> RowsKnSpec:  # type: ignore[override]
        item = op.dtype_b.storage.itemsize
        vec = 4 if op.n % 4 == 0 and aligned(ptrs, "b", 4 * item) else 1
        bias_dtype = DType.parse(ptrs["bias_dtype"]) if ptrs and "bias_dtype" in ptrs else op.out_dtype
        return RowsKnSpec(op.dtype_a.storage, op.out_dtype, bias_dtype, op.epilogue, _rows(op.m), vec, partial)

    def search_space(self, op: GemmOp, profile: DeviceProfile) -> SearchSpace:  # type: ignore[override]
        return SearchSpace()

    def hero_configs(self, op: GemmOp, profile: DeviceProfile) -> list[PipelineConfig]:  # type: ignore[override]
        return [PipelineConfig()]

    def bind(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:  # type: ignore[override]
        """Pointer-only launches of the kernel (and of the reduction, with several K slices); the workspace is a
        buffer from the caller's stream-ordered allocator per call (:func:`tracea_cuda.launcher.scratch`), not
        the stream's shared split scratch: another thread's launch on the same stream could land between the
        kernel and its reduction and overwrite the partial sums. No other per-call Python beyond the pointers
        (the run path cost ~40 us of host time a call on an H100 host)."""
        dev = profile.device.index
        stream = launcher.stream_getter(adapter, dev)
        launcher.refuse_if_capturing(stream(), self.name)
        ptr, device, name = adapter.data_ptr, launcher.on_device(dev), self.name
        n_slices, length = slices(op, profile.compute_units)
        arch = toolkit.arch_name(profile.compute_capability or (8, 0))
        ws_floats = n_slices * op.m * op.n if n_slices > 1 else 0
        roles = ("a", "b", "out", "bias", "ws")
        args = lambda p: (u64(p["a"]), u64(p["b"]), u64(p["out"]), u64(p["bias"]), u64(p["ws"]),  # noqa: E731
                          np.int32(op.m), np.int32(op.n), np.int32(op.k), np.int32(length))
        mains: dict[int, launcher.FastLaunch] = {}

        def main_for(b_mod: int) -> launcher.FastLaunch:
            spec = self.spec(op, config, {"b": b_mod}, partial=n_slices > 1)
            with device():
                kernel = self._load(spec, profile)
            return launcher.FastLaunch(kernel.function, (-(-op.n // (THREADS * spec.vec)), n_slices, 1), THREADS, 0,
                                       launcher.ParamBlock.from_args(args, roles))

        mains[0] = main_for(0)
        reduce = None
        if n_slices > 1:
            with device():
                rk, grid = self._reducer(op, op.out_dtype, n_slices, arch)
            reduce = launcher.FastLaunch(rk.function, grid, rk.threads, 0,
                                         launcher.ParamBlock.from_args(
                                             lambda p: (u64(p["ws"]), u64(p["out"]), u64(p["bias"]), np.int32(op.m),
                                                        np.int32(op.n)), ("ws", "out", "bias")))
        scratch_, current = scratch, toolkit.cupy().cuda.runtime.getDevice

        def launch(a: Any, b: Any, bias: Any, out: Any) -> None:
            pa, pb, po = ptr(a), ptr(b), ptr(out)
            pbias = po if bias is None else ptr(bias)
            s = stream()
            fl = mains.get(pb & 15)
            if fl is None:  # a view of other alignment: element loads (compiled once, not while capturing)
                launcher.refuse_if_capturing(s, name)
                fl = mains[pb & 15] = main_for(pb & 15)
            keep = None
            if reduce is None:
                pw = po
            else:
                keep = scratch_(adapter, out, ws_floats)  # noqa: F841 - alive until both launches are queued
                pw = adapter.data_ptr(keep)
            if current() == dev:
                fl(s, (pa, pb, po, pbias, pw))
                if reduce is not None:
                    reduce(s, (pw, po, pbias))
            else:
                with device():
                    fl(s, (pa, pb, po, pbias, pw))
                    if reduce is not None:
                        reduce(s, (pw, po, pbias))

        return launch

    def _load(self, spec: RowsKnSpec, profile: DeviceProfile) -> compiler.Kernel:
        arch = toolkit.arch_name(profile.compute_capability or toolkit.compute_capability(profile.device.index))
        return compiler.load(render(spec), KERNEL_NAME, arch, smem=0, threads=THREADS)

    def prepare(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile) -> Any:  # type: ignore[override]
        with toolkit.cupy().cuda.Device(profile.device.index):
            n_slices, _ = slices(op, profile.compute_units)
            return self._load(self.spec(op, config, None, partial=n_slices > 1), profile)

    @staticmethod
    def _reducer(op: GemmOp, bias_dtype: DType, n_slices: int, arch: str) -> tuple[compiler.Kernel, tuple[int, int, int]]:
        """The reduction of ``n_slices`` partial tiles and its grid: from :data:`WIDE_FROM` slices the wide form
        (a block of 32 outputs x 8 slice groups; H100, x1 @ B8192x1024 fp32 summed 256-512 slices per output
        on 1024 threads otherwise), else one thread per output."""
        if n_slices >= WIDE_FROM:
            rk = helpers_kernels.wide_reducer(op.out_dtype, bias_dtype, op.epilogue, n_slices, arch)
            return rk, (-(-(op.m * op.n) // 32), 1, 1)
        rk = helpers_kernels.reducer(op.out_dtype, bias_dtype, op.epilogue, n_slices, 0, arch)
        return rk, (-(-(op.m * op.n) // 256), 1, 1)

    def preload(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile) -> None:  # type: ignore[override]
        self.prepare(op, config, profile)
        n_slices, _ = slices(op, profile.compute_units)
        if n_slices > 1:
            arch = toolkit.arch_name(profile.compute_capability or (8, 0))
            with toolkit.cupy().cuda.Device(profile.device.index):
                self._reducer(op, op.out_dtype, n_slices, arch)

    def run(self, op: GemmOp, config: PipelineConfig, args: OpArgs, profile: DeviceProfile,  # type: ignore[override]
            stream: Any = None) -> None:
        cp = toolkit.cupy()
        ptrs = run_pointers(args)
        bias_dtype = DType.parse(ptrs.get("bias_dtype", op.out_dtype.value))
        dev = device_index(args.out)
        n_slices, length = slices(op, profile.compute_units)
        arch = toolkit.arch_name(profile.compute_capability or (8, 0))
        with cp.cuda.Device(dev):
            stream = stream if stream is not None else launch_stream(args)
            spec = self.spec(op, config, ptrs, partial=n_slices > 1)
            kernel = self._load(spec, profile)
            pb = ptrs.get("bias", ptrs["out"])
            ws = scratch(args.adapter, args.out, n_slices * op.m * op.n) if n_slices > 1 else None
            pw = data_ptr(ws, "ws") if ws is not None else ptrs["out"]
            grid = (-(-op.n // (THREADS * spec.vec)), n_slices, 1)
            kernel.launch(grid, (u64(ptrs["a"]), u64(ptrs["b"]), u64(ptrs["out"]), u64(pb), u64(pw), np.int32(op.m),
                                 np.int32(op.n), np.int32(op.k), np.int32(length)), stream)
            if ws is not None:
                rk, grid = self._reducer(op, bias_dtype, n_slices, arch)
                rk.launch(grid, (u64(pw), u64(ptrs["out"]), u64(pb), np.int32(op.m), np.int32(op.n)), stream)


def rows_kn_serves(op: GemmOp, profile: DeviceProfile) -> bool:
    """Whether ``cuda.gemm.rows_kn`` takes an fp32-exact ``op`` whose B is worth streaming (1 MiB and more; the
    tiled 3xTF32 GEMMs decline those: H100, x8 @ B(4096x4096) fp32, mma_3xtf32 ran 0.31x cuBLAS, rows_kn 1.25x,
    and the estimates were within a few %; smaller products are left to the estimates)."""
    from tracea.dtypes import Fp32Precision  # noqa: PLC0415

    return (op.dtype_a.storage is DType.F32 and op.fp32_precision is Fp32Precision.HIGHEST
            and op.n * op.k * 4 >= STREAMED_BYTES
            and not _ROWS_KN.own_reasons(op, profile))


_ROWS_KN = RowsKnGemm()

ROWS_KN_VARIANTS = [RowsKnGemm]
