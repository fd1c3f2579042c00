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

from .. import compiler, launcher, toolkit
from ..arrays import data_ptr, device_index, launch_stream
from ..emit.rows_kn import KERNEL_NAME, MAX_ROWS, MAX_SLICE, THREADS, WARPS, RowsKnSpec, render
from .base import FLOAT_IO, CudaVariant, aligned, run_pointers, u64
from .rows_fma import zeroed_layout

#: fraction of the device bandwidth the estimate assumes for the stream of B (and the workspace's traffic)
BANDWIDTH_SHARE = 0.75
#: B of at least this many bytes makes the tiled 3xTF32 GEMMs decline fp32-exact products rows_kn serves
STREAMED_BYTES = 1 << 20
#: K slices at most (the last slice of a column block sums them, WARPS at a time)
MAX_SLICES = 256
#: K slices at most in the default rule (config param ``slices`` goes to MAX_SLICES). H100, B cycled through HBM,
#: kernel time vs cuBLAS by slices: x1 @ B8192x1024 99 slices 0.91x, 32 1.01x; x8 @ B768x768 24 0.80x, 8-12 0.81-0.92x
RULE_MAX_SLICES = 32
#: columns of C a block covers with 16-byte loads (32 lanes x 4); unaligned B takes 32
COLS = 128


def _rows(m: int) -> int:
    return next(r for r in (1, 2, 4, 8, 16) if r >= m)


#: resident blocks per SM of the 16-byte-load kernel by row bound (ptxas, sm_90a: 40 / 48 / 72 / 100-116 / 128
#: registers a thread at 256 threads); the element-load kernel takes 32-40 registers (6 blocks)
RESIDENT = {1: 6, 2: 5, 4: 3, 8: 2, 16: 2}


def slices(op: GemmOp, sms: int, count: int | None = None) -> tuple[int, int]:
    """(K slices, slice length): ``count`` when given (config param ``slices``), else as many slices as keep the grid
    of 128-column blocks within one wave of resident blocks (:data:`RESIDENT`), but not so many that the partial
    sums (written and read back) exceed half of B's traffic (K / (4M) slices), that a warp gets under eight rows of
    B a slice, or more than :data:`RULE_MAX_SLICES`; each slice at most :data:`MAX_SLICE` rows of B."""
    col_blocks = -(-op.n // COLS)
    if count is None:
        want = max(1, RESIDENT[_rows(op.m)] * max(sms, 1) // col_blocks)
        count = min(want, max(1, op.k // (4 * op.m)), max(1, op.k // (8 * WARPS)), RULE_MAX_SLICES)
    count = max(1, min(int(count), op.k, MAX_SLICES))
    count = max(count, -(-op.k // MAX_SLICE))
    length = -(-op.k // count)
    return -(-op.k // length), length


def config_slices(config: PipelineConfig | None) -> int | None:
    """The config's ``slices`` param (None: the rule of :func:`slices`)."""
    value = config.get("slices") if config is not None else None
    return None if value is None else int(value)


def tile_shape(op: GemmOp, spec: RowsKnSpec) -> tuple[int, int]:
    """(column blocks, floats of one partial tile) of ``spec``'s launch."""
    return -(-op.n // spec.cols), spec.mr * spec.cols


class RowsKnGemm(CudaVariant):
    name = "cuda.gemm.rows_kn"
    description = ("few-row GEMM (M <= 16) against a B stored (K, N) row-major: coalesced row streams of B, A's "
                   "slice in shared memory, exact fp32 FMA, K split across blocks and summed in a fixed order by the "
                   "last slice of each column block (one launch)")
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
        """B once at :data:`BANDWIDTH_SHARE` of the bandwidth, the partial sums written and read back, a launch and
        (with several K slices) the last slices' reductions."""
        bw = max(profile.bandwidth_gbs, 1.0) * 1e9
        n_slices, _ = slices(op, profile.compute_units, config_slices(config))
        ws = 2 * 4 * op.m * op.n * n_slices if n_slices > 1 else 0
        return (op.n * op.k * op.dtype_b.itemsize + ws) / (bw * BANDWIDTH_SHARE) + (5e-6 if n_slices > 1 else 4e-6)

    def spec(self, op: GemmOp, config: PipelineConfig, ptrs: dict | None, split: bool = True) -> RowsKnSpec:  # type: ignore[override]
        item = op.dtype_b.storage.itemsize
        vec = 4 if op.n % 4 == 0 and aligned(ptrs, "b", 4 * item) else 1
        bias_dtype = DType.parse(ptrs["bias_dtype"]) if ptrs and "bias_dtype" in ptrs else op.out_dtype
        return RowsKnSpec(op.dtype_a.storage, op.out_dtype, bias_dtype, op.epilogue, _rows(op.m), vec, split)

    def search_space(self, op: GemmOp, profile: DeviceProfile) -> SearchSpace:  # type: ignore[override]
        return SearchSpace().param("slices", [1, 2, 4, 8, 16, 32, 64, 128])

    def hero_configs(self, op: GemmOp, profile: DeviceProfile) -> list[PipelineConfig]:  # type: ignore[override]
        return [PipelineConfig()]

    def bind(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:  # type: ignore[override]
        """One pointer-only launch a call. With several K slices the partial tiles and the column blocks' arrival
        counters live in the stream's split scratch (:func:`tracea_cuda.launcher.split_scratch`: one launch, so
        stream order alone keeps two calls apart, and the kernel leaves the counters at zero); inside CUDA graph
        capture a zeroed buffer of the call's own (a captured graph may replay on another stream). No other
        per-call Python beyond the pointers (the run path cost ~40 us of host time a call on an H100 host)."""
        device = launcher.on_device(profile.device.index)
        n_slices, length = slices(op, profile.compute_units, config_slices(config))
        split = n_slices > 1
        roles = ("a", "b", "out", "bias", "ws", "flags")
        args = lambda p: (u64(p["a"]), u64(p["b"]), u64(p["out"]), u64(p["bias"]), u64(p["ws"]),  # noqa: E731
                          u64(p["flags"]), np.int32(op.m), np.int32(op.n), np.int32(op.k), np.int32(length))

        def main_for(b_mod: int) -> tuple[launcher.FastLaunch, tuple[int, int, int, int]]:
            """The launch for B's alignment class and its buffers' sizes (counters, partial floats, own zeroed
            buffer's floats, the partials' byte offset there)."""
            spec = self.spec(op, config, {"b": b_mod}, split=split)
            blocks, tile = tile_shape(op, spec)
            with device():
                kernel = self._load(spec, profile)
            fl = launcher.FastLaunch(kernel.function, (blocks, n_slices, 1), THREADS, 0,
                                     launcher.ParamBlock.from_args(args, roles))
            ws_floats = blocks * n_slices * tile if split else 0
            return fl, (blocks if split else 0, ws_floats, *zeroed_layout(blocks, ws_floats))

        # only B's alignment matters (a view of another one: element loads)
        return launcher.split_k_launcher(adapter, profile.device.index, self.name, split, main_for,
                                         lambda pa, pb: pb & 15)

    def _load(self, spec: RowsKnSpec, profile: DeviceProfile) -> compiler.Kernel:
        arch = toolkit.arch_name(profile.compute_capability or toolkit.compute_capability(profile.device.index))
        return compiler.load(render(spec), KERNEL_NAME, arch, smem=0, threads=THREADS)

    def prepare(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile) -> Any:  # type: ignore[override]
        with toolkit.cupy().cuda.Device(profile.device.index):
            n_slices, _ = slices(op, profile.compute_units, config_slices(config))
            return self._load(self.spec(op, config, None, split=n_slices > 1), profile)

    def preload(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile) -> None:  # type: ignore[override]
        self.prepare(op, config, profile)

    def run(self, op: GemmOp, config: PipelineConfig, args: OpArgs, profile: DeviceProfile,  # type: ignore[override]
            stream: Any = None) -> None:
        cp = toolkit.cupy()
        ptrs = run_pointers(args)
        dev = device_index(args.out)
        n_slices, length = slices(op, profile.compute_units, config_slices(config))
        with cp.cuda.Device(dev):
            stream = stream if stream is not None else launch_stream(args)
            spec = self.spec(op, config, ptrs, split=n_slices > 1)
            kernel = self._load(spec, profile)
            blocks, tile = tile_shape(op, spec)
            pb = ptrs.get("bias", ptrs["out"])
            pw = pf = ptrs["out"]
            ws = None
            if n_slices > 1:  # a zeroed buffer of this call's own: counters, then the partial tiles
                floats, ws_offset = zeroed_layout(blocks, blocks * n_slices * tile)
                ws = launcher.scratch(args.adapter, args.out, floats, zeroed=True)
                pf = data_ptr(ws, "ws")
                pw = pf + ws_offset
            kernel.launch((blocks, n_slices, 1), (u64(ptrs["a"]), u64(ptrs["b"]), u64(ptrs["out"]), u64(pb), u64(pw),
                                                  u64(pf), np.int32(op.m), np.int32(op.n), np.int32(op.k),
                                                  np.int32(length)), stream)


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
