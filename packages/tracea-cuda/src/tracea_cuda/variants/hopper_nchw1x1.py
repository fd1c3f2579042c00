"""Hopper 1x1 conv on NCHW tensors as a batched GEMM with a shared weight: ``out[n] = W @ x[n]``.

A 1x1 stride-1 unpadded NCHW conv is, per image, the GEMM of the weight (K x C, row-major: K-major A)
and the image's channel planes (C x H*W, pixels contiguous: an MN-major B, which 16-bit wgmma reads
transposed), stored row-major: the NCHW output plane by plane. So the Hopper GEMM kernel runs it in
place -- batch = images, A's TMA loads all read batch entry 0 (``a_bcast``), the bias along the rows
(output channels, ``row_bias``) -- with no channels-last transpose of x (what ``cuda.conv2d.wgmma`` pays
on NCHW input, and what kept it to a narrow window of such convs). TMA needs 16-byte row strides: planes
whose pixel count is not a multiple of 8 (7x7, 14x14) are first copied into rows of a padded pitch by one
small launch (:func:`tracea_cuda.emit.pad.render_pitch`).

float32 (TF32 allowed): TF32 wgmma reads a shared-memory B K-major only, so the kernel computes the
transposed product per image, ``out[n]^T = x[n]^T @ W^T``: A = x[n] stored (C, H*W), MN-major, fed to
wgmma from registers; B = the weight stored (K, C), K-major, shared by every image (``b_bcast``); C^T
stored column-major is the NCHW plane (``out_cm``), the bias along C^T's columns (``cm_bias_cols``).
Planes whose pixel count is not a multiple of 4 take the pitched copy.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs
from tracea.dtypes import DType
from tracea.ir.ops import Conv2dOp, GemmOp
from tracea.semantic.config import PipelineConfig
from tracea.semantic.search_space import SearchSpace

from .. import helpers_kernels, launcher, toolkit
from ..arrays import data_ptr, device_index, launch_stream
from ..emit import operands
from ..emit.wgmma import WgmmaSpec
from .base import scratch_buffer
from .hopper import WgmmaGemm, _hero
from .hopper_conv import HOPPER_CONV_REQUIREMENTS
from .pooled import pooled_reasons

def run_of(op: Conv2dOp) -> int:
    """Elements of one 16-byte run of ``op``'s dtype (8 16-bit, 4 fp32)."""
    return 16 // op.dtype.storage.itemsize


#: (tile_m, tile_n, schedule, stages) of the heroes, largest first (a tile of 128x256 elements only over two
#: waves; 64x256 only where the conv has at most 64 output channels)
TILES = ((128, 256, "coop", 4), (128, 128, "coop", 6), (64, 256, "pingpong", 4), (128, 64, "coop", 8),
         (64, 128, "pingpong", 6), (64, 64, "pingpong", 8))


def pitch_of(op: Conv2dOp) -> int | None:
    """Elements per row of the pitched copy of x (pixels rounded up to a 16-byte run), or None when the
    planes' rows are 16-byte multiples already and x is read in place."""
    hw, run = op.p * op.q, run_of(op)
    return None if hw % run == 0 else -(-hw // run) * run


def transposed(op: Any) -> bool:
    """Whether the kernel computes out[n]^T = x[n]^T @ W^T (float32 on TF32 wgmma; see the module docstring)."""
    return op.dtype.storage is DType.F32 if isinstance(op, Conv2dOp) else op.dtype_a.storage is DType.F32


class WgmmaNchw1x1Conv(WgmmaGemm):
    name = "cuda.conv2d.wgmma_nchw1x1"
    description = ("NCHW 1x1 stride-1 conv for Hopper as a batched GEMM out[n] = W @ x[n] on the wgmma kernel (f16/"
                   "bf16; f32 as TF32, computed transposed): weight shared by every image, x's pixel rows read "
                   "MN-major in place (planes of a pixel count not in 16-byte runs copied to padded rows first), "
                   "bias along the output channels")
    requirements = HOPPER_CONV_REQUIREMENTS
    efficiency = 0.75
    priority = 20
    pads_rows = False  # x's pitched copy is this variant's own (pitch_of); W's rows are whole runs (checked)
    roles = ("x", "w")
    mapped_roles = ("x", "w")

    @staticmethod
    def gemm(op: Conv2dOp) -> GemmOp:
        """The per-image GEMM the kernel runs: M = output channels, N = pixels, K = input channels, batch =
        images (A = the weight, shared; B = x[n] stored (K, N)); float32: its transpose, M = pixels, N = output
        channels (A = x[n] stored (K, M), B = the weight stored (N, K), shared)."""
        if transposed(op):
            return GemmOp(m=op.p * op.q, n=op.k, k=op.c, batch=op.n, trans_a=True, trans_b=True, dtype_a=op.dtype,
                          dtype_b=op.dtype, dtype_out=op.out_dtype, epilogue=op.epilogue,
                          fp32_precision=op.fp32_precision)
        return GemmOp(m=op.k, n=op.p * op.q, k=op.c, batch=op.n, dtype_a=op.dtype, dtype_b=op.dtype,
                      dtype_out=op.out_dtype, epilogue=op.epilogue)

    def kernel_op(self, op: Any) -> GemmOp:  # type: ignore[override]
        return op if isinstance(op, GemmOp) else self.gemm(op)

    def extra_checks(self, op: Conv2dOp, profile: DeviceProfile) -> list[str]:  # type: ignore[override]
        reasons = pooled_reasons(op, profile)
        if not operands.pointwise_nchw(op):
            reasons.append("not an NCHW 1x1 stride-1 unpadded conv")
        if op.c % run_of(op):
            reasons.append(f"C={op.c} is not a multiple of {run_of(op)}: the weight's rows are not whole 16-byte "
                           "runs, which its TMA map needs")
        hw = op.p * op.q
        if max(op.k, hw, op.c) >= 2**31 - 256 or op.n * op.c * (pitch_of(op) or hw) >= 2**31:
            reasons.append("tensor larger than the 32-bit index range")
        return reasons

    def estimate_seconds(self, op: Conv2dOp, profile: DeviceProfile,  # type: ignore[override]
                         config: PipelineConfig | None = None) -> float:
        """The GEMM's roofline, plus reading and writing x once more where its rows are copied first."""
        t = super().estimate_seconds(op, profile, config)
        if pitch_of(op) is not None:
            t += 2 * op.n * op.c * op.h * op.w * op.dtype.storage.itemsize / (max(profile.bandwidth_gbs, 1.0) * 1e9)
        return t

    def pitches(self, op: Any) -> tuple[int | None, int | None]:
        """(A, B) row pitches of what the kernel reads: x's pitched copy where its rows need one (x is B, or
        A for float32)."""
        gop = self.kernel_op(op)
        vec = 16 // gop.dtype_a.storage.itemsize
        rows = (gop.m if gop.trans_a else gop.k, gop.k if gop.trans_b else gop.n)
        return tuple(None if r % vec == 0 else -(-r // vec) * vec for r in rows)  # type: ignore[return-value]

    def spec(self, op: Any, config: PipelineConfig, ptrs: dict | None) -> WgmmaSpec:  # type: ignore[override]
        gop = self.kernel_op(op)
        base = super().spec(gop, config, ptrs)
        if not transposed(gop):
            return replace(base, a_bcast=True, row_bias=True)
        pairs = gop.m % 2 == 0 and (ptrs is None or ptrs.get("out", 0) % 8 == 0)  # adjacent pixels: one 8-byte store
        return replace(base, b_bcast=True, out_cm=True, cm_bias_cols=True, pairs=pairs, vec_store=False, narrow_store=0)

    def operands(self, op: Any, args: OpArgs, ptrs: dict, stream: Any) -> tuple[int, int]:  # type: ignore[override]
        # A = the weight, B = x (or its pitched copy); float32: A = x, B = the weight
        return (ptrs["x"], ptrs["w"]) if transposed(op) else (ptrs["w"], ptrs["x"])

    def search_space(self, op: Conv2dOp, profile: DeviceProfile) -> SearchSpace:  # type: ignore[override]
        space = super().search_space(op, profile)  # type: ignore[arg-type]
        space = space.param("cluster", [1]).param("stream_k", [False]).param("defer", [False])
        return space.param("smem_epilogue", [False]) if transposed(op) else space

    def hero_configs(self, op: Conv2dOp, profile: DeviceProfile) -> list[PipelineConfig]:  # type: ignore[override]
        """The largest tile of :data:`TILES` whose count fills the SMs (the smallest when none does), then the
        nearest sizes, then a split-K form for tuning. Tiles over half empty are left out: 128-row tiles where
        the conv has at most 64 output channels, tiles wider than 64 columns over at most half their width of
        pixels (7x7 planes take 64-column tiles). Measured on an H100 (CUDA graphs, fp16, bias+ReLU, vs
        ``F.conv2d``): a 128x256 tile first with K split where tiles were few ran 0.71-0.97x cuDNN on 14x14
        planes, this rule 1.19-1.48x at batch 32 (128x128) and 1.28-1.47x at batch 1 (64x64 ping-pong;
        960->160 at 7x7, 672->112 at 14x14); split-K never came first there."""
        gop = self.gemm(op)
        ctas = profile.compute_units or 132
        tiles = [t for t in TILES if (t[0] == 64 or gop.m > 64) and (t[1] == 64 or gop.n > t[1] // 2)
                 and (t[0] == 128 or t[1] < 256 or gop.m <= 64)]
        counts = [-(-gop.m // bm) * -(-gop.n // bn) * gop.batch for bm, bn, _, _ in tiles]
        first = next((i for i, (t, (bm, bn, _, _)) in enumerate(zip(counts, tiles))
                      if t >= (2 * ctas if bm * bn >= 128 * 256 else ctas / 3)), len(tiles) - 1)
        order = sorted(range(len(tiles)), key=lambda i: (abs(i - first), -i))  # nearest sizes, smaller first
        epi = not transposed(op)  # float32: the column-major epilogue of a register-fed A
        out = [_hero(bn, st, bm=bm, schedule=sched, smem_epilogue=epi) for bm, bn, sched, st in (tiles[i] for i in order)]
        if -(-gop.k // 64) >= 16:
            out.append(_hero(64 if gop.n <= 64 else 128, 6, split_k=2, smem_epilogue=epi))
        return [c for c in out if self.validate_config(op, c, profile)]  # type: ignore[arg-type]

    def fast_launch_ok(self, op: Any, config: PipelineConfig) -> bool:
        return True

    def bind(self, op: Conv2dOp, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:  # type: ignore[override]
        """x read in place: :meth:`WgmmaGemm.bind`'s one-kernel launcher (misaligned operands take :meth:`run`).
        Planes whose rows TMA cannot address: two pointer-only launches per call, x copied into padded rows of
        the stream's pre-pass scratch, then the GEMM reading that copy (a misaligned weight takes :meth:`run`)."""
        pitch = pitch_of(op)
        if pitch is None:
            return WgmmaGemm.bind(self, op, config, profile, adapter)  # type: ignore[arg-type]
        dev = profile.device.index
        stream = launcher.stream_getter(adapter, dev)
        launcher.refuse_if_capturing(stream(), self.name)
        inner = WgmmaGemm.bind(self, op, config, profile, adapter)  # type: ignore[arg-type]
        with toolkit.cupy().cuda.Device(dev):
            copy = _pitch_launch(op, pitch)
        pre = launcher.with_prepasses(adapter, dev, stream, (op.n * op.c * pitch, 0), op.dtype, copy, inner)
        ptr = launcher.pointer_getter(adapter)

        def launch(x: Any, w: Any, bias: Any, out: Any) -> None:
            if ptr(w) & 15:
                self.run(op, config, OpArgs({"x": x, "w": w, "bias": bias}, out, adapter), profile)
                return
            pre(x, w, bias, out)

        launch.pointer_only = True  # type: ignore[attr-defined]
        return launch

    def preload(self, op: Conv2dOp, config: PipelineConfig, profile: DeviceProfile) -> None:  # type: ignore[override]
        self.prepare(op, config, profile)  # type: ignore[arg-type]
        helpers_kernels.pitcher(op.dtype, "sm_90a")

    def run(self, op: Conv2dOp, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:  # type: ignore[override]
        """x copied into aligned (and, where needed, padded) rows when it is misaligned or its rows need a
        pitch, the weight copied when misaligned; then :meth:`WgmmaGemm.run` on what the kernel reads."""
        arrays = dict(args.arrays)
        px, pw = data_ptr(arrays["x"], "x"), data_ptr(arrays["w"], "w")
        pitch = pitch_of(op)
        cp = toolkit.cupy()
        with cp.cuda.Device(device_index(args.out)):
            stream = launch_stream(args)
            if pitch is not None or px % 16:
                p = pitch or op.p * op.q
                buf = scratch_buffer(args, -(-op.n * op.c * p * op.dtype.storage.itemsize // 4))
                _pitch_launch(op, p)(stream.ptr, (px, data_ptr(buf, "x")))
                arrays["x"] = buf
            if pw % 16:
                nbytes = op.k * op.c * op.dtype.storage.itemsize
                wbuf = scratch_buffer(args, -(-nbytes // 4))
                cp.cuda.runtime.memcpyAsync(data_ptr(wbuf, "w"), pw, nbytes, 3, stream.ptr)  # 3: device to device
                arrays["w"] = wbuf
            WgmmaGemm.run(self, op, config, OpArgs(arrays, args.out, args.adapter), profile)  # type: ignore[arg-type]


def _pitch_launch(op: Conv2dOp, pitch: int) -> launcher.FastLaunch:
    """One launch copying x's N*C rows of P*Q pixels into rows of ``pitch`` (load it on the op's device);
    pointers by role: src0, dst0."""
    item = op.dtype.storage.itemsize
    kernel = helpers_kernels.pitcher(op.dtype, "sm_90a")
    rows, width = op.n * op.c, op.p * op.q
    blocks = -(-rows * pitch // (4 // item) // 256)  # 16-bit: one thread per pair; 32-bit: per value

    def args(p: dict[str, int]) -> tuple:
        return (np.uint64(p["src0"]), np.uint64(p["dst0"]), np.int32(rows), np.int32(width), np.int32(pitch))

    return launcher.FastLaunch(kernel.function, (blocks, 1, 1), 256, 0,
                               launcher.ParamBlock.from_args(args, ("src0", "dst0")))


NCHW1X1_VARIANTS = [WgmmaNchw1x1Conv]
