"""conv2d as an implicit GEMM on the mma.sync kernel: no im2col buffer, the tile loader gathers
input pixels directly (padding and edges are zero-filled predicated copies)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import Requirements
from tracea.dtypes import DType
from tracea.ir.ops import Conv2dOp, LayerType, Layout
from tracea.semantic.config import BarrierMode, PipelineConfig, SwizzleMode
from tracea.semantic.search_space import SearchSpace

from ..emit import operands, transpose
from ..emit.mma import MmaSpec
from .. import helpers_kernels, launcher, toolkit
from ..arrays import data_ptr, device_index, launch_stream
from .base import FLOAT_IO, CudaVariant, aligned, hero, math_mode, scratch_buffer, tile_shape, u64
from .pooled import pooled_reasons


def to_channels_last(op: Conv2dOp, px: int, pw: int, args: Any, stream: Any, arch: str,
                     round_tf32: bool = False) -> tuple[Any, Any]:
    """:func:`channels_last_prepass` for the ``run`` paths: NCHW x and KCRS w transposed into NHWC /
    KRSC scratch buffers (see :func:`~.base.scratch_buffer`) by one launch on ``stream``, so they are ordered
    before the conv that reads them. The caller keeps the returned buffers referenced until the conv is
    enqueued."""
    (sx, sw), fl = channels_last_prepass(op, arch, round_tf32)
    x_t, w_t = scratch_buffer(args, sx), scratch_buffer(args, sw)
    fl(int(stream.ptr), (px, data_ptr(x_t, "x"), pw, data_ptr(w_t, "w")))
    return x_t, w_t


def channels_last_prepass(op: Conv2dOp, arch: str, round_tf32: bool = False) -> tuple[tuple[int, int],
                                                                                       launcher.FastLaunch]:
    """The bound form of :func:`to_channels_last`: the scratch sizes of x (NHWC) and w (KRSC) and one
    launch transposing both (``launcher.pair_launch``; load it on the op's device; ``round_tf32``: the
    copies rounded to TF32 for a Hopper TF32 kernel)."""
    tk = helpers_kernels.transposer(op.dtype, arch, pair=True, round_tf32=round_tf32)
    hw, rs = op.h * op.w, op.r * op.s

    def job(batch: int, inner: int) -> tuple[tuple[int, int, int], tuple[int, int]]:
        # [batch][C][inner] -> [batch][inner][C]: 32x32 tiles, or blocks of whole rows when they are short
        if inner < transpose.NARROW:
            return (-(-op.c // transpose.NARROW_ROWS), 1, batch), (op.c, inner)
        return (-(-inner // 32), -(-op.c // 32), batch), (op.c, inner)

    return (op.n * hw * op.c, op.k * rs * op.c), launcher.pair_launch(tk.function, job(op.n, hw), job(op.k, rs))


#: output rows (N*P*Q) from which the padded-channel heroes come first: below, the extra pre-pass launch
#: costs more host time than the vector gathers save (H200: the b32 RGB stem 0.56x -> 0.76x cuDNN
#: padded; at batch 1 the padded path read 0.64x, the scalar one 0.82x on an H100)
PAD_FIRST_ROWS = 65536


def can_pad(op: Conv2dOp) -> bool:
    """Whether an NHWC conv has fewer channels than one 16-byte run (RGB stems: C = 3)."""
    return op.layout is Layout.NHWC and op.groups == 1 and 0 < op.c < 16 // op.dtype.storage.itemsize


def padded_op(op: Conv2dOp, config: PipelineConfig) -> Conv2dOp | None:
    """With ``pad_c=True`` on an op :func:`can_pad`: the op with its channels padded to one 16-byte run
    (C -> 16 / itemsize), whose x and w come from :func:`channel_pad_prepass` / :func:`pad_channels` (zero
    channels: vectorised gathers, the same result); else None."""
    if config.get("pad_c", False) and can_pad(op):
        return replace(op, c=16 // op.dtype.storage.itemsize)
    return None


def channel_pad_prepass(op: Conv2dOp, pop: Conv2dOp, arch: str) -> tuple[tuple[int, int], launcher.FastLaunch]:
    """The scratch sizes of x and w with ``pop.c`` channels and one launch padding both (load it on the
    op's device)."""
    pk = helpers_kernels.padder(op.dtype, arch)
    rows_x, rows_w = op.n * op.h * op.w, op.k * op.r * op.s
    jobs = [((-(-rows_x // 256), 1, 1), (rows_x, op.c, pop.c)),  # one row per thread
            ((-(-rows_w // 256), 1, 1), (rows_w, op.c, pop.c))]
    return (rows_x * pop.c, rows_w * pop.c), launcher.pair_launch(pk.function, *jobs)


def pad_channels(op: Conv2dOp, pop: Conv2dOp, px: int, pw: int, args: Any, stream: Any, arch: str) -> tuple[Any, Any]:
    """:func:`channel_pad_prepass` for :meth:`ImplicitGemmConv.run`: x and w padded into scratch buffers
    on ``stream`` (keep them referenced until the conv is enqueued)."""
    (sx, sw), fl = channel_pad_prepass(op, pop, arch)
    x_p = scratch_buffer(args, sx * op.dtype.storage.itemsize // 4 + 1)  # float32 words: any dtype fits
    w_p = scratch_buffer(args, sw * op.dtype.storage.itemsize // 4 + 1)
    fl(int(stream.ptr), (px, data_ptr(x_p, "x"), pw, data_ptr(w_p, "w")))
    return x_p, w_p


class ImplicitGemmConv(CudaVariant):
    name = "cuda.conv2d.implicit_mma"
    description = ("conv2d implicit GEMM (M=N*P*Q, N=K, K=C*R*S) on mma.sync: NHWC f16/bf16/f32 and NCHW f32, "
                   "TF32 or 3xTF32 for f32, any stride/padding/dilation/kernel size, fused epilogue")
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.CONV2D,
                                dtypes=frozenset({DType.F16, DType.BF16, DType.F32}), out_dtypes=FLOAT_IO,
                                min_compute_capability=(8, 0), groups=False)
    efficiency = 0.4
    priority = 10

    def extra_checks(self, op: Conv2dOp, profile: DeviceProfile) -> list[str]:
        reasons = pooled_reasons(op, profile)
        m, n, k = op.gemm_mnk
        if m * k > 2**31 or op.n * op.c * op.h * op.w > 2**31:
            reasons.append("tensor larger than the 32-bit index range")
        if op.layout is Layout.NCHW and op.dtype.storage is not DType.F32:
            reasons.append("16-bit conv needs NHWC (channels_last) layout; NCHW is served for float32 only")
        return reasons

    @staticmethod
    def transforms_input(op: Conv2dOp, config: PipelineConfig) -> bool:
        """NCHW float32 with ``nchw_mode=transform``: x and w are transposed to channels-last scratch
        buffers first, so the main kernel gathers 16-byte vectors and feeds ldmatrix (output still NCHW)."""
        return op.layout is Layout.NCHW and config.get("nchw_mode", "direct") == "transform"

    def spec(self, op: Conv2dOp, config: PipelineConfig, ptrs: dict | None) -> MmaSpec:
        splits = int(config.get("split_k") or 1)
        if splits > 1:  # partial products to an fp32 workspace; the reduction applies the epilogue
            from tracea.ir.epilogue import Epilogue  # noqa: PLC0415

            base = self.spec(op, config.replace(split_k=1), None if ptrs is None else {**ptrs, "out": 0})
            return replace(base, dtype_out=DType.F32, epilogue=Epilogue.empty(), split_k=splits,
                           store=operands.StoreMap("rowmajor", True, batch_stride="0"))
        pop = padded_op(op, config)
        if pop is not None:  # x and w come padded to one 16-byte channel run
            return self.spec(pop, config.replace(pad_c=False), None if ptrs is None else {**ptrs, "x": 0, "w": 0})
        if self.transforms_input(op, config):
            inner = replace(op, layout=Layout.NHWC)
            base = self.spec(inner, config.replace(nchw_mode="direct"),
                             None if ptrs is None else {**ptrs, "x": 0, "w": 0})
            return replace(base, store=operands.conv_output(op, False))
        dt = op.dtype.storage
        epc = 16 // dt.itemsize
        _, _, kdim = op.gemm_mnk
        bias_dtype = DType.parse(ptrs["bias_dtype"]) if ptrs and "bias_dtype" in ptrs else op.out_dtype
        vec_x = aligned(ptrs, "x") and (op.c % epc == 0 if op.layout is Layout.NHWC else
                                        dt is DType.F32 and operands.pixels_contiguous(op))
        return MmaSpec(
            dtype_in=dt, math=math_mode(dt, op.fp32_precision), dtype_out=op.out_dtype, bias_dtype=bias_dtype,
            epilogue=op.epilogue, a=operands.conv_input(op, vec_x),
            b=operands.conv_weight(op, kdim % epc == 0 and aligned(ptrs, "w")),
            store=operands.conv_output(op, op.k % 2 == 0 and aligned(ptrs, "out", 2 * op.out_dtype.itemsize)),
            **tile_shape(config))

    def fast_launch_ok(self, op: Conv2dOp, config: PipelineConfig) -> bool:
        return (not self.transforms_input(op, config) and padded_op(op, config) is None
                and int(config.get("split_k") or 1) == 1)

    def bind(self, op: Conv2dOp, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        """One kernel: the base class's pointer-only launcher. NCHW float32 in ``nchw_mode=transform``:
        two pointer-only launches per call (x and w transposed by one launch into one channels-last
        scratch buffer from the caller's allocator, then the conv reading it) instead of :meth:`run`'s
        per-call Python (~70 us of host time per call on an H100 host, more than batch-1 layers take).
        NHWC with fewer channels than one 16-byte run (RGB stems) likewise, x and w padded with zero
        channels by the first launch. Split-K keeps :meth:`run`."""
        pop = padded_op(op, config)
        if not (self.transforms_input(op, config) or pop is not None) or int(config.get("split_k") or 1) != 1:
            return super().bind(op, config, profile, adapter)
        kop = pop or op  # the op the kernel computes (its K counts the padded channels)
        dev = profile.device.index
        stream = launcher.stream_getter(adapter, dev)
        launcher.refuse_if_capturing(stream(), self.name)
        ptr, device, name = launcher.pointer_getter(adapter), launcher.on_device(dev), self.name
        roles = ("x", "w", "out", "bias")
        builds: dict[tuple[int, int], launcher.FastLaunch] = {}

        def build(key: tuple[int, int]) -> launcher.FastLaunch:
            # the scratch operands are aligned; out and bias alignment pick the store and bias loads
            spec = self.spec(op, config, {"x": 0, "w": 0, "out": key[0], "bias": key[1]})
            with device():
                kernel = self._kernel(spec, profile)
            params = launcher.ParamBlock.from_args(lambda p: self.kernel_args(kop, p), roles)
            return launcher.FastLaunch(kernel.function, self.grid(kop, spec), spec.threads, spec.smem_bytes, params)

        builds[(0, 0)] = build((0, 0))

        def by_pointer(px: int, pw: int, bias: Any, out: Any) -> None:
            po = ptr(out)
            pb = po if bias is None else ptr(bias)
            s = stream()
            fl = builds.get((po & 15, pb & 15))
            if fl is None:
                launcher.refuse_if_capturing(s, name)
                fl = builds[(po & 15, pb & 15)] = build((po & 15, pb & 15))
            with device():
                fl(s, (px, pw, po, pb))

        def inner(*arrays: Any) -> None:  # only the pointer form is used
            raise NotImplementedError

        inner.by_pointer = by_pointer  # type: ignore[attr-defined]
        arch = toolkit.arch_name(profile.compute_capability or (8, 0))
        with toolkit.cupy().cuda.Device(dev):
            sizes, prepass = (channel_pad_prepass(op, pop, arch) if pop is not None
                              else channels_last_prepass(op, arch))
        return launcher.with_prepasses(adapter, dev, stream, sizes, op.dtype, prepass, inner)

    def preload(self, op: Conv2dOp, config: PipelineConfig, profile: DeviceProfile) -> None:
        self.prepare(op, config, profile)
        arch = toolkit.arch_name(profile.compute_capability or (8, 0))
        if self.transforms_input(op, config):
            helpers_kernels.transposer(op.dtype, arch, pair=True)
        if padded_op(op, config) is not None:
            helpers_kernels.padder(op.dtype, arch)
        splits = int(config.get("split_k") or 1)
        if splits > 1:
            helpers_kernels.reducer(op.out_dtype, op.out_dtype, op.epilogue, splits,
                                    op.p * op.q if op.layout is Layout.NCHW else 0, arch)

    def run(self, op: Conv2dOp, config: PipelineConfig, args, profile: DeviceProfile, stream: Any = None) -> None:
        splits = int(config.get("split_k") or 1)
        transform = self.transforms_input(op, config)
        pop = padded_op(op, config)
        if pop is not None:  # pad x and w to one channel run, then the padded op on them
            cp = toolkit.cupy()
            with cp.cuda.Device(device_index(args.out)):
                stream = stream if stream is not None else launch_stream(args)
                x_p, w_p = pad_channels(op, pop, data_ptr(args.arrays["x"], "x"), data_ptr(args.arrays["w"], "w"),
                                        args, stream, toolkit.arch_name(profile.compute_capability or (8, 0)))
                arrays = {**args.arrays, "x": x_p, "w": w_p}
                return self.run(pop, config.replace(pad_c=False), type(args)(arrays, args.out, args.adapter), profile,
                                stream)
        if not transform and splits == 1:
            return super().run(op, config, args, profile, stream)
        cp = toolkit.cupy()
        dev = device_index(args.out)
        arch = toolkit.arch_name(profile.compute_capability or (8, 0))
        with cp.cuda.Device(dev):
            stream = stream if stream is not None else launch_stream(args)
            arrays = dict(args.arrays)
            if transform:
                x_t, w_t = to_channels_last(op, data_ptr(arrays["x"], "x"), data_ptr(arrays["w"], "w"), args, stream,
                                            arch)
                arrays.update(x=x_t, w=w_t)
            out = args.out
            m, n, _ = op.gemm_mnk
            if splits > 1:
                out = scratch_buffer(args, splits * m * n)
            super().run(op, config, type(args)(arrays, out, args.adapter), profile, stream)
            if splits > 1:
                bias = args.arrays.get("bias")
                bias_dtype = DType.parse(bias.dtype, arg="bias") if bias is not None else op.out_dtype
                rk = helpers_kernels.reducer(op.out_dtype, bias_dtype, op.epilogue, splits,
                                             op.p * op.q if op.layout is Layout.NCHW else 0, arch)
                optr = data_ptr(args.out, "out")
                rk.launch((-(-(m * n) // 256), 1, 1),
                          (u64(data_ptr(out, "ws")), u64(optr),
                           u64(data_ptr(bias, "bias") if bias is not None else optr), np.int32(m), np.int32(n)), stream)

    def grid(self, op: Conv2dOp, spec: MmaSpec) -> tuple[int, int, int]:
        m, n, _ = op.gemm_mnk
        return (-(-m // spec.bm) * -(-n // spec.bn), 1, spec.split_k)

    def kernel_args(self, op: Conv2dOp, ptrs: dict) -> tuple:
        m, n, k = op.gemm_mnk
        bias = ptrs.get("bias") or ptrs["out"]
        return (u64(ptrs["x"]), u64(ptrs["w"]), u64(ptrs["out"]), u64(bias), np.int32(m), np.int32(n), np.int32(k))

    def search_space(self, op: Conv2dOp, profile: DeviceProfile) -> SearchSpace:
        return (SearchSpace().tile_m([64, 128, 256]).tile_n([32, 64, 128, 256]).tile_k([16, 32, 64])
                .stages([2, 3, 4]).warps([4, 8]).swizzles([SwizzleMode.XOR8, SwizzleMode.NONE])
                .barrier_modes([BarrierMode.SYNC]).param("warp_m", [1, 2, 4])
                .param("nchw_mode", ["transform", "direct"] if op.layout is Layout.NCHW else ["direct"])
                .param("split_k", [1, 2, 4, 8]).param("pad_c", [False, True] if can_pad(op) else [False])
                .where(lambda c: bool(self.validate_config(op, c, profile)) or "invalid tiling"))

    def hero_configs(self, op: Conv2dOp, profile: DeviceProfile) -> list[PipelineConfig]:
        heroes = self._heroes(op, profile)
        if not can_pad(op):
            return heroes
        padded = [c.replace(pad_c=True) for c in heroes if int(c.get("split_k") or 1) == 1][:2]
        return padded + heroes if op.gemm_mnk[0] >= PAD_FIRST_ROWS else heroes + padded

    def _heroes(self, op: Conv2dOp, profile: DeviceProfile) -> list[PipelineConfig]:
        m, n, _ = op.gemm_mnk
        if op.dtype.storage is DType.F32:
            big = [hero(128, 128, 32, 3, 8, warp_m=2), hero(128, 64, 32, 3, 4, warp_m=2)]
            small = [hero(64, 64, 32, 3, 4, warp_m=2)]
            if op.layout is Layout.NCHW and op.c % 4 == 0 and not operands.pixels_contiguous(op):
                big = [c.replace(nchw_mode="transform") for c in big] + big
                small = [c.replace(nchw_mode="transform") for c in small] + small
        else:
            big = [hero(128, 128, 32, 4, 4, warp_m=2), hero(128, 256, 32, 3, 8, warp_m=2),
                   hero(128, 64, 32, 4, 4, warp_m=2)]
            small = [hero(64, 64, 32, 4, 4, warp_m=2)]
        if n <= 64:
            big = [c.replace(tile_n=64) if c.tile_n > 64 else c for c in big]
            big = list(dict.fromkeys(big))
        tiles = -(-m // 128) * -(-n // 128)
        if tiles >= profile.compute_units:
            return big + small
        # Too few output tiles to fill the GPU: small tiles first. Split-K (fp32 workspace + a reduction
        # applying the epilogue) is offered last: measured slower than 64x64 tiles on ResNet 7x7/14x14
        # layers on an H200 (106 vs 119 TF/s), so it is for the tuner to find where it pays.
        _, _, kdim = op.gemm_mnk
        tiles64 = -(-m // 64) * -(-n // 64)
        splits = max(2, min(8, -(-4 * profile.compute_units // tiles64), kdim // 256))
        split = [small[0].replace(split_k=splits)] if kdim >= 512 else []
        return small + big + split


CONV_VARIANTS = [ImplicitGemmConv]
