"""``cuda.gemm.rows_fma``: exact-fp32 GEMMs of a few dozen rows against an (N, K) weight (``x @ W.T`` of a float32
``nn.Linear`` at small batches, PyTorch's default precision), FFMA tiles with K split across blocks and reduced in
the kernel; see :mod:`tracea_cuda.emit.rows_fma`."""

from __future__ import annotations

from typing import Any

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType, Fp32Precision
from tracea.ir.ops import GemmOp, LayerType
from tracea.semantic.config import PipelineConfig
from tracea.semantic.search_space import SearchSpace

from .. import compiler, launcher, toolkit
from ..arrays import data_ptr, device_index, launch_stream
from ..emit.rows_fma import BK, BN, KERNEL_NAME, MAX_ROWS, THREADS, RowsFmaSpec, render
from .base import FLOAT_IO, CudaVariant, aligned, run_pointers, u64
from .gemv import int_param

#: share of the fp32 FFMA peak the estimate assumes (the inner loop is 3 shared-memory loads per 32 FFMA at
#: bm=64, fewer FFMA per load at smaller tiles)
FMA_SHARE = {16: 0.35, 32: 0.5, 64: 0.6}
#: share of the bandwidth the weight stream reaches
BANDWIDTH_SHARE = 0.75
#: resident blocks per SM by tile height (ptxas, sm_90a: 64 / 80 / 128 registers a thread at 128 threads, 23-37 KB
#: of shared memory): K slices are added while the grid fits one wave of them
BLOCKS_PER_SM = {16: 8, 32: 6, 64: 4}
#: fewest rows served: at 16 and fewer, skinny_tf32 streams the weight with Tensor Cores
MIN_ROWS = 17
#: weights under this many bytes at up to SMALL_WEIGHT_ROWS rows are left to skinny_tf32 (H100, fp32-exact, kernel time
#: against cuBLAS: W768x768 / W3072x768 at M 17-48 skinny_tf32 0.98-1.37x, rows_fma 0.84-1.02x; from W1024x8192
#: (32 MiB) up, M 17-32: rows_fma 1.00-1.29x, skinny_tf32 0.70-0.92x)
SMALL_WEIGHT = 16 << 20
SMALL_WEIGHT_ROWS = 48


def zeroed_layout(n_tiles: int, ws_floats: int) -> tuple[int, int]:
    """(floats, byte offset of the partial tiles) of a zeroed buffer of a call's own (CUDA graph capture, the run
    path): the tiles' arrival counters, padded to 64 words (the partial tiles start 256-byte aligned), then the
    partial tiles."""
    counters = 64 * -(-n_tiles // 64)
    return counters + ws_floats, 4 * counters


def tiles(op: GemmOp, bm: int) -> tuple[int, int]:
    """(column tiles, row tiles) of the grid."""
    return -(-op.n // BN), -(-op.m // bm)


def slices(op: GemmOp, bm: int, sms: int) -> tuple[int, int]:
    """(K slices, slice length): as many slices as keep the grid within one wave of resident blocks
    (:data:`BLOCKS_PER_SM`; H100, x64 @ W4096x4096.T at 9 slices of 64 tiles ran 1.09 waves at 0.67x cuBLAS), but
    no more than keep the partial tiles' traffic (written and read back) under the weight's (K / (2 * rows)), each
    slice a whole number of ``BK`` k steps."""
    nt, mt = tiles(op, bm)
    want = max(1, BLOCKS_PER_SM[bm] * max(sms, 1) // (nt * mt))
    steps = -(-op.k // BK)
    count = max(1, min(want, op.k // (2 * bm * mt), steps))
    length = BK * -(-steps // count)
    return -(-op.k // length), length


class RowsFmaGemm(CudaVariant):
    name = "cuda.gemm.rows_fma"
    description = ("exact-fp32 GEMM of a few dozen rows against an (N, K) weight: 64-column FFMA tiles fed by "
                   "cp.async through shared memory, K split across blocks and summed in slice order in the kernel")
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.GEMM, dtypes=frozenset({DType.F32}),
                                out_dtypes=FLOAT_IO, min_compute_capability=(8, 0), batched=False,
                                max_dims={"m": MAX_ROWS})
    efficiency = 0.6  # of the fp32 FFMA peak; the estimate below applies FMA_SHARE per tile height
    wave_quantized = False
    priority = 22
    tiled = False

    def extra_checks(self, op: GemmOp, profile: DeviceProfile) -> list[str]:  # type: ignore[override]
        reasons = []
        if op.fp32_precision is not Fp32Precision.HIGHEST:
            reasons.append("TF32 allowed: the Tensor Core variants serve it (rows_fma computes exact fp32)")
        if op.m < MIN_ROWS:
            reasons.append(f"M={op.m} < {MIN_ROWS} rows: the weight-streaming kernels (skinny_tf32, GEMV) serve it")
        elif op.m <= SMALL_WEIGHT_ROWS and op.n * op.k * 4 < SMALL_WEIGHT:
            reasons.append(f"a weight under {SMALL_WEIGHT >> 20} MiB at M={op.m} rows: cuda.gemm.skinny_tf32 streams it "
                           "faster")
        if op.trans_a:
            reasons.append("A stored (K, M) (transposed) is not read by the rows_fma kernel")
        if not op.trans_b:
            reasons.append("B stored (K, N): rows_kn (M <= 16) or the tiled GEMMs serve it")
        if op.n * op.k >= 2**62 or op.m * op.k >= 2**31 or op.m * op.n >= 2**31:
            reasons.append("operands larger than the kernel's index range")
        return reasons

    @staticmethod
    def _bm(op: GemmOp, config: PipelineConfig | None) -> int:
        default = 16 if op.m <= 16 else 32 if op.m <= 32 else 64
        return int_param(config, "bm", default) if config is not None else default

    def estimate_seconds(self, op: GemmOp, profile: DeviceProfile,  # type: ignore[override]
                         config: PipelineConfig | None = None) -> float:
        """The FFMA time of the padded tiles at :data:`FMA_SHARE` of the fp32 peak, or the weight stream at
        :data:`BANDWIDTH_SHARE` of the bandwidth (plus the partial tiles' traffic), whichever is longer, and a
        launch."""
        bm = self._bm(op, config)
        nt, mt = tiles(op, bm)
        n_slices, _ = slices(op, bm, profile.compute_units)
        flops = 2.0 * mt * bm * nt * BN * op.k
        fma = flops / (profile.peak("float32") * 1e9 * FMA_SHARE[bm])
        ws = 2 * 4 * mt * bm * nt * BN * n_slices if n_slices > 1 else 0
        # the weight once, A once per column tile (from L2: counted at a third of its bytes), the partial tiles
        a_reads = nt * op.m * op.k * 4 / 3
        stream = (op.n * op.k * 4 + a_reads + ws) / (max(profile.bandwidth_gbs, 1.0) * 1e9 * BANDWIDTH_SHARE)
        return max(fma, stream) + 4e-6

    def spec(self, op: GemmOp, config: PipelineConfig, ptrs: dict | None, split: bool = False) -> RowsFmaSpec:  # type: ignore[override]
        vec = op.k % 4 == 0 and aligned(ptrs, "a", 16) and aligned(ptrs, "b", 16)
        bias_dtype = DType.parse(ptrs["bias_dtype"]) if ptrs and "bias_dtype" in ptrs else op.out_dtype
        return RowsFmaSpec(op.out_dtype, bias_dtype, op.epilogue, self._bm(op, config), vec, split)

    def search_space(self, op: GemmOp, profile: DeviceProfile) -> SearchSpace:  # type: ignore[override]
        return SearchSpace().param("bm", [b for b in (16, 32, 64) if -(-op.m // b) <= 4])

    def hero_configs(self, op: GemmOp, profile: DeviceProfile) -> list[PipelineConfig]:  # type: ignore[override]
        first = self._bm(op, None)
        return [PipelineConfig(params=(("bm", b),)) for b in [first] + [b for b in (64, 32, 16) if b != first]
                if -(-op.m // b) <= 4]

    def _launch_shape(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile) -> tuple[int, int, tuple, int]:
        """(slices, slice length, grid, tiles)."""
        bm = self._bm(op, config)
        nt, mt = tiles(op, bm)
        n_slices, length = slices(op, bm, profile.compute_units)
        return n_slices, length, (nt, n_slices, mt), nt * mt

    def bind(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:  # type: ignore[override]
        """One pointer-only launch a call. With several K slices the partial tiles and the tiles' arrival counters
        live in the stream's split scratch (:func:`tracea_cuda.launcher.split_scratch`: one launch, so stream
        order alone keeps two calls apart, and the kernel leaves the counters at zero); inside CUDA graph capture a
        zeroed buffer of the call's own (a captured graph may replay on another stream)."""
        device = launcher.on_device(profile.device.index)
        n_slices, length, grid, n_tiles = self._launch_shape(op, config, profile)
        split = n_slices > 1
        bm = self._bm(op, config)
        ws_floats = n_tiles * n_slices * bm * BN if split else 0
        sizes = (n_tiles if split else 0, ws_floats, *zeroed_layout(n_tiles, ws_floats))
        roles = ("a", "b", "out", "bias", "ws", "flags")
        args = lambda p: (u64(p["a"]), u64(p["b"]), u64(p["out"]), u64(p["bias"]), u64(p["ws"]),  # noqa: E731
                          u64(p["flags"]), np.int32(op.m), np.int32(op.n), np.int32(op.k), np.int32(length))

        def fl_for(mod: int) -> tuple[launcher.FastLaunch, tuple[int, int, int, int]]:
            spec = self.spec(op, config, {"a": mod, "b": mod}, split=split)
            with device():
                kernel = self._load(spec, profile)
            return launcher.FastLaunch(kernel.function, grid, THREADS, 0,
                                       launcher.ParamBlock.from_args(args, roles)), sizes

        # an operand not 16-byte aligned: one float per copy (class 4)
        return launcher.split_k_launcher(adapter, profile.device.index, self.name, split, fl_for,
                                         lambda pa, pb: 0 if not (pa | pb) & 15 else 4)

    def _load(self, spec: RowsFmaSpec, profile: DeviceProfile) -> compiler.Kernel:
        arch = toolkit.arch_name(profile.compute_capability or toolkit.compute_capability(profile.device.index))
        return compiler.load(render(spec), KERNEL_NAME, arch, smem=0, threads=THREADS)

    def prepare(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile) -> Any:  # type: ignore[override]
        with toolkit.cupy().cuda.Device(profile.device.index):
            n_slices = self._launch_shape(op, config, profile)[0]
            return self._load(self.spec(op, config, None, split=n_slices > 1), profile)

    def preload(self, op: GemmOp, config: PipelineConfig, profile: DeviceProfile) -> None:  # type: ignore[override]
        self.prepare(op, config, profile)

    def run(self, op: GemmOp, config: PipelineConfig, args: OpArgs, profile: DeviceProfile,  # type: ignore[override]
            stream: Any = None) -> None:
        cp = toolkit.cupy()
        ptrs = run_pointers(args)
        dev = device_index(args.out)
        n_slices, length, grid, n_tiles = self._launch_shape(op, config, profile)
        bm = self._bm(op, config)
        with cp.cuda.Device(dev):
            stream = stream if stream is not None else launch_stream(args)
            kernel = self._load(self.spec(op, config, ptrs, split=n_slices > 1), profile)
            pb = ptrs.get("bias", ptrs["out"])
            pw = pf = ptrs["out"]
            ws = None
            if n_slices > 1:  # a zeroed buffer of this call's own: counters, then the partial tiles
                floats, ws_offset = zeroed_layout(n_tiles, n_tiles * n_slices * bm * BN)
                ws = launcher.scratch(args.adapter, args.out, floats, zeroed=True)
                pf = data_ptr(ws, "ws")
                pw = pf + ws_offset
            kernel.launch(grid, (u64(ptrs["a"]), u64(ptrs["b"]), u64(ptrs["out"]), u64(pb), u64(pw), u64(pf),
                                 np.int32(op.m), np.int32(op.n), np.int32(op.k), np.int32(length)), stream)


def rows_fma_serves(op: GemmOp, profile: DeviceProfile) -> bool:
    """Whether ``cuda.gemm.rows_fma`` takes an fp32-exact ``op`` (x @ W.T of 17-64 rows; skinny_tf32 and the tiled
    3xTF32 GEMMs decline those: H100, kernel time against cuBLAS at M 17-64 on 32-180 MiB weights, skinny_tf32
    0.36-0.95x, rows_fma 0.84-1.29x; the tiled ones ran 0.17-0.65x on few-row products)."""
    return not _ROWS_FMA.own_reasons(op, profile)


_ROWS_FMA = RowsFmaGemm()

ROWS_FMA_VARIANTS = [RowsFmaGemm]
