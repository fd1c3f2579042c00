"""``cuda.conv2d.depthwise``: depthwise and grouped convolutions with few channels per group (``groups > 1``,
C/groups and K/groups at most 64) as a direct, memory-bound kernel on the CUDA cores; see
:mod:`tracea_cuda.emit.depthwise`. The dense conv variants (implicit GEMM, wgmma, pointwise) decline every
``groups > 1`` op, so this is what serves EfficientNet / MobileNet / ConvNeXt depthwise layers and ResNeXt /
RegNet grouped 3x3s on CUDA."""

from __future__ import annotations

from dataclasses import replace
from math import gcd

from tracea.doctor.decision import FrameworkFaster
from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import Requirements
from tracea.dtypes import DType
from tracea.errors import UnsupportedConfigError
from tracea.ir.ops import Conv2dOp, LayerType, Layout
from tracea.semantic.config import PipelineConfig
from tracea.semantic.search_space import SearchSpace

from .. import compiler, toolkit
from ..emit.depthwise import KERNEL_NAME, MAX_KERNEL, MAX_PER_GROUP, SMEM_LIMIT, DepthwiseSpec, render
from .base import FLOAT_IO, CudaVariant, aligned, u64
from .gemv import int_param

#: fraction of the device bandwidth the estimate assumes (x, w and the output each moved once; taps re-read
#: from L1 / L2), and of the fp32 FMA peak for the FLOPs (7x7 depthwise and 16-channel groups lean on the
#: FMA pipes). Set by reasoning, not yet fitted to measurements.
BANDWIDTH_SHARE, FMA_SHARE = 0.7, 0.5
#: fixed cost per call in the estimate (launch, the weight slice's load, the tail of the grid)
FIXED_S = 3e-6
#: the channel vector widths searched (``vec`` caps the widest the op allows)
VECS = (8, 4, 2, 1)
#: input channels per group from which a group counts as wide (8+ FMAs per output and tap)
WIDE_GROUP = 8
#: multiply-adds (N*P*Q*K*C/groups) from which cuDNN's grouped kernels beat this one on wide groups (H100
#: probe, graph-replayed device time, best of the probed configs: fp16 NHWC with 16 per group 0.57-0.72x from
#: 12.8M, 1.4x at 1.6M, while 8 per group stays 1.2-2.4x at every size probed; fp32 NCHW, with several output
#: channels per thread (``kpt``), 1.24-1.51x cuDNN with 8 per group at 11-51M, 16 per group 0.89x at 12.8M and
#: 0.73x at 51M, 1.27x at 1.6M; fp32 NHWC was probed before ``kpt``: 8+ per group measured slower)
DECLINE_MACS = 4_000_000
#: the probe turns the decline off to time the declined shapes
DECLINE_WIDE_GROUPS = True
#: channels per group where cuDNN has fast grouped kernels, from DECLINE_MACS (ResNeXt's widths: 16 measured
#: above, 32 kept with cuDNN unmeasured). 64 per group only in NCHW (see :data:`WIDEST_DECLINE_MACS`)
CUDNN_GROUP_WIDTHS = frozenset({16, 32})
#: NCHW groups of 17-32 channels outside :data:`CUDNN_GROUP_WIDTHS` go to cuDNN from this many multiply-adds
#: (RegNetX-1.6GF's 24 per group, H200 ``bench_shapes.py`` with the declines off: b1 fp32 2.5-3.7x eager, b32
#: 0.66-0.77x eager at 34-101M)
NCHW_WIDE_DECLINE_MACS = 32_000_000
#: groups of more than 32 channels (RegNetX-3.2GF / 4.0GF's 48 / 40 per group, RegNetY-8.0GF / 4.0GF's 56 /
#: 64) go to cuDNN from these multiply-adds, keyed by (layout, the tier's smallest width; NHWC tiers are 16-bit:
#: fp32 NHWC goes from DECLINE_MACS). H200, ``bench_shapes.py --families "regnet
#: wide"`` with the declines off, eager (graph-replayed) ratios: NCHW fp32 b1 1.56-1.64x (0.79-0.97x) at 4-10M,
#: 0.95x (0.60x) at 19.7M, b32 0.19-0.39x; 64 per group 0.97-0.98x (0.39-0.44x) at 3.4-6.4M. 16-bit NHWC: 40 and
#: 48 per group win at every size (1.13-3.0x both ways, served); 56 / 64 per group 5-13x eager at b1 (PyTorch
#: launches cuDNN per group there: 17-20 us of host time each; graphs 0.74-2.0x), b32 0.38-2.9x eager but
#: 0.33-0.52x in graphs: from 32M a model's device time decides
WIDEST_DECLINE_MACS = {("NCHW", 64): DECLINE_MACS, ("NCHW", 33): 16_000_000, ("NHWC", 49): 32_000_000}


#: NCHW: input channels per group from which a thread computes several output channels of its group (each
#: input value loaded once for them: ``kpt``), one output row each
NCHW_SHARED_INPUT = 4
#: NCHW wide groups: the most output channels per thread keep at least this many threads per SM (H100 probe,
#: ``probe_depthwise.py --families resnext,regnet --batches 1,8,32 --dtypes float32``, 15 fp32 layers with
#: 4 / 8 / 16 channels per group: this rule at 64-thread blocks is 0.976x the best probed config on average,
#: worst 0.92x; the earlier one-channel threads were 0.39-0.83x cuDNN on the layers then declined)
NCHW_THREADS_PER_SM = 256


def nchw_channels_per_thread(op: Conv2dOp, units: int) -> int:
    """NCHW ``kpt``: the largest power of two up to 16 dividing K/groups that leaves
    :data:`NCHW_THREADS_PER_SM` threads (one output row and ``kpt`` channels each) per SM."""
    _, kg = per_group(op)
    outputs, kpt = op.n * op.k * op.p * op.q, 1
    while kpt < 16 and kg % (2 * kpt) == 0 and outputs // (2 * kpt) >= NCHW_THREADS_PER_SM * units:
        kpt *= 2
    return kpt


def per_group(op: Conv2dOp) -> tuple[int, int]:
    """(input, output) channels per group."""
    return op.c // op.groups, op.k // op.groups


def max_vec(op: Conv2dOp, cap: int = 8) -> int:
    """NHWC output channels per thread: the widest power of two up to one 16-byte input vector (and
    ``cap``) that divides K and keeps a thread's channels in one group or on whole groups."""
    _, kg = per_group(op)
    v = min(cap, 16 // op.dtype.storage.itemsize)
    while v > 1 and (op.k % v or (v % kg and kg % v)):
        v //= 2
    return max(v, 1)


class DepthwiseConv(CudaVariant):
    name = "cuda.conv2d.depthwise"
    tiled = False  # configs are plain parameters: the spec checks them
    description = ("depthwise / grouped conv2d (groups > 1, <= 64 channels per group) as a direct kernel on the "
                   "CUDA cores: NHWC f16/bf16/f32 (channel vectors per thread), NCHW (threads along W); any "
                   "kernel up to 7x7, stride, padding, dilation; fp32 accumulation, fused epilogue")
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.CONV2D,
                                dtypes=frozenset({DType.F16, DType.BF16, DType.F32}), out_dtypes=FLOAT_IO,
                                min_compute_capability=(7, 0))
    efficiency = FMA_SHARE  # of the fp32 FMA peak; the estimate below is mostly a bandwidth one
    wave_quantized = False  # many small blocks per SM
    priority = 15

    def extra_checks(self, op: Conv2dOp, profile: DeviceProfile) -> list[str]:
        reasons = []
        cg, kg = per_group(op)
        if op.groups == 1:
            reasons.append("groups=1: a dense conv (the implicit-GEMM / wgmma / pointwise variants serve it)")
        if cg > MAX_PER_GROUP or kg > MAX_PER_GROUP:
            reasons.append(f"{cg} input / {kg} output channels per group: the direct kernel serves at most "
                           f"{MAX_PER_GROUP} (its FMAs per output grow with C/groups)")
        elif op.groups > 1:
            reasons += self._cudnn_faster(op, cg)
        if max(op.r, op.s) > MAX_KERNEL:
            reasons.append(f"kernel {op.r}x{op.s}: at most {MAX_KERNEL}x{MAX_KERNEL} (the tap loops are unrolled)")
        if op.dtype.storage is DType.BF16 or op.out_dtype.storage is DType.BF16:
            cc = profile.compute_capability
            if cc is not None and tuple(cc) < (8, 0):
                reasons.append("bfloat16 conversions need compute capability >= 8.0")
        if max(op.n * op.c * op.h * op.w, op.n * op.k * op.p * op.q) >= 2**62 or op.n * op.p * op.q >= 2**36:
            reasons.append("tensor larger than the index range")
        return reasons

    @staticmethod
    def _cudnn_faster(op: Conv2dOp, cg: int) -> list[str]:
        """The wide-group shapes cuDNN serves faster, from a number of multiply-adds (N*P*Q*K*C/groups):
        :data:`DECLINE_MACS` for fp32 NHWC with 8+ input channels per group and for cuDNN's widths
        (:data:`CUDNN_GROUP_WIDTHS`); NCHW widths 17-32 from :data:`NCHW_WIDE_DECLINE_MACS`; wider groups by
        :data:`WIDEST_DECLINE_MACS`."""
        macs = op.n * op.p * op.q * op.k * cg
        limit = DepthwiseConv.decline_macs(op, cg)
        if not DECLINE_WIDE_GROUPS or limit is None or macs < limit:
            return []
        return [FrameworkFaster(f"{cg} input channels per group over {macs / 1e6:.1f}M multiply-adds "
                                f"({op.layout.name} {op.dtype.storage.value}): cuDNN's grouped kernels measured "
                                f"faster from {limit / 1e6:.0f}M (PyTorch serves it)")]

    @staticmethod
    def decline_macs(op: Conv2dOp, cg: int) -> int | None:
        """The multiply-adds from which a group width goes to cuDNN (None: served at every size)."""
        layout = op.layout.name
        if cg < WIDE_GROUP:
            return None
        if (layout == "NHWC" and op.dtype.storage is DType.F32) or cg in CUDNN_GROUP_WIDTHS:
            return DECLINE_MACS
        if cg > 32:
            tiers = sorted(((w, m) for (lay, w), m in WIDEST_DECLINE_MACS.items() if lay == layout), reverse=True)
            return next((m for w, m in tiers if cg >= w), None)
        return NCHW_WIDE_DECLINE_MACS if layout == "NCHW" and cg > 16 else None

    def estimate_seconds(self, op: Conv2dOp, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        """Memory-bound roofline: the bytes of x, w and the output (each once) over the device bandwidth,
        or the FLOPs over the fp32 FMA peak when more (long kernels, 16-channel groups), plus a fixed cost."""
        bw = max(profile.bandwidth_gbs, 1.0) * 1e9 * BANDWIDTH_SHARE
        fma = profile.peak("float32") * 1e9 * FMA_SHARE
        return max(op.min_bytes / bw, op.flops / max(fma, 1.0)) + FIXED_S

    def spec(self, op: Conv2dOp, config: PipelineConfig, ptrs: dict | None) -> DepthwiseSpec:
        cg, kg = per_group(op)
        bias_dtype = DType.parse(ptrs["bias_dtype"]) if ptrs and "bias_dtype" in ptrs else op.out_dtype
        geom = (op.n, op.c, op.h, op.w, op.k, op.r, op.s, *op.stride, *op.padding, *op.dilation)
        base = DepthwiseSpec(op.dtype.storage, op.out_dtype, bias_dtype, op.epilogue, op.layout is Layout.NCHW, geom,
                             cg, kg)
        threads = int_param(config, "threads", 128)
        if op.layout is Layout.NCHW:
            for name in ("cv", "ppt", "vec"):
                if config.get(name) is not None:
                    raise UnsupportedConfigError(f"param {name} is for NHWC; NCHW takes threads, rows and kpt")
            return replace(base, rows=int_param(config, "rows", 1), kpt=int_param(config, "kpt", 1),
                           nchw_threads=threads)
        for name in ("rows", "kpt"):
            if config.get(name) is not None:
                raise UnsupportedConfigError(f"param {name} is for NCHW; NHWC takes threads, cv, ppt and vec")
        vec = max_vec(op, int_param(config, "vec", 8))
        isz, osz = op.dtype.storage.itemsize, op.out_dtype.itemsize
        nw = cg if kg % vec == 0 else vec // kg * cg
        vin = gcd(nw, 16 // isz)  # the widest power of two dividing the window, in one 16-byte load
        while vin > 1 and not aligned(ptrs, "x", vin * isz):
            vin //= 2
        vec_out = vec * osz >= 4 and aligned(ptrs, "out", min(16, vec * osz))
        # cv caps the channel vectors per block; the channel tiles are balanced (K/vec = 12 at cv 8: two tiles
        # of 6, not 8 + 4 with a quarter of the threads idle); a block is tc x threads // tc threads
        kv, cv = op.k // vec, int_param(config, "cv", 8)
        tc = -(-kv // -(-kv // cv)) if cv > 0 else cv
        return replace(base, vec=vec, vin=vin, vec_out=vec_out, ppt=int_param(config, "ppt", 1), tc=tc,
                       tp=max(1, threads // tc))

    def _kernel(self, spec: DepthwiseSpec, profile: DeviceProfile) -> compiler.Kernel:
        arch = toolkit.arch_name(profile.compute_capability or toolkit.compute_capability(profile.device.index))
        return compiler.load(render(spec), KERNEL_NAME, arch, smem=0, threads=spec.threads)

    def grid(self, op: Conv2dOp, spec: DepthwiseSpec) -> tuple[int, int, int]:
        return spec.grid()

    def kernel_args(self, op: Conv2dOp, ptrs: dict) -> tuple:
        bias = ptrs.get("bias") or ptrs["out"]
        return (u64(ptrs["x"]), u64(ptrs["w"]), u64(ptrs["out"]), u64(bias))

    def search_space(self, op: Conv2dOp, profile: DeviceProfile) -> SearchSpace:
        space = SearchSpace().param("threads", [64, 128, 256])
        if op.layout is Layout.NCHW:
            space = space.param("rows", [1, 2, 4, 8]).param("kpt", [1, 2, 4, 8, 16])
        else:
            space = (space.param("cv", [1, 2, 4, 8, 16, 32]).param("ppt", [1, 2, 4])
                     .param("vec", sorted({max_vec(op, v) for v in VECS}, reverse=True)))
        return space.where(lambda c: bool(self.validate_config(op, c, profile)) or "invalid")

    def hero_configs(self, op: Conv2dOp, profile: DeviceProfile) -> list[PipelineConfig]:
        """Untuned choices, from the H100 probe (``benchmarks/cuda/probe_depthwise.py``: b32 depthwise layers of
        ``bench_shapes.py --groups grouped``, b1 / b8 / b32 ResNeXt and RegNet grouped layers, b1 depthwise):
        NHWC 8 channel vectors of 4 channels x 256 threads with 4 outputs per thread along Q at any stride
        (the best probed config on every b32 fp16 depthwise layer but one, often 1.3-2x the earlier 8-channel,
        2-output hero: 4-channel vectors keep a 7x7 row of 4 outputs in registers); wide groups (8+ channels
        per group) 4 vectors per block (smaller weight slices: 1.05 -> 1.25x cuDNN at ResNeXt 256 g32 b32).
        NCHW 128 threads with 4 rows per thread at stride 1, 2 at stride 2. Small grids (batch-1 late
        layers): NHWC blocks halve down to 64 threads (wide groups: to 128 first, to 64 after the outputs, and the
        grid needs only 128 threads per SM), then fewer outputs per thread, then fewer vectors, until two
        blocks per SM; NCHW
        drops rows, then threads, until two blocks of 128 per SM (wide groups: C/groups / 4 times that)."""
        cg, _ = per_group(op)
        # blocks wanted: two per SM, more where each output costs 8+ FMAs per tap (wide groups)
        units = max(int(profile.compute_units or 1), 1)
        want = 2 * units * max(1, cg // 4)  # NCHW blocks of 128
        if op.layout is Layout.NCHW and cg >= NCHW_SHARED_INPUT:
            kpt = nchw_channels_per_thread(op, units)
            first = self._nchw(64, 1, kpt)
            alt = self._nchw(64, 1, kpt // 2 if kpt > 1 else 1)
        elif op.layout is Layout.NCHW:
            rows = (4 if op.stride[0] == 1 else 2) if op.r >= 3 and op.p >= 4 else 1
            threads = 128
            while self._blocks(op, self._nchw(threads, rows)) < want:
                if rows > 1:  # b1 probe: fewer rows beat smaller blocks
                    rows //= 2
                elif threads > 64:
                    threads //= 2
                else:
                    break
            first = self._nchw(threads, rows)
            alt = self._nchw(threads, max(1, rows // 2))
        else:
            vec = max_vec(op, 4)
            kv = op.k // vec
            cv = min(8 if cg < WIDE_GROUP else 4, kv)  # wide groups: smaller weight slices per block
            while cv > 1 and cv * vec * op.r * op.s * cg * 4 > SMEM_LIMIT:
                cv //= 2
            ppt = 4 if op.s >= 3 and op.q >= 4 else 2 if op.s >= 3 and op.q >= 2 else 1
            threads, floor = 256, 64 if cg < WIDE_GROUP else 128

            def small() -> bool:  # depthwise: two blocks per SM; wide groups: 128 threads per SM
                blocks = self._blocks(op, self._nhwc(threads, cv, ppt, vec))
                return blocks < 2 * units if cg < WIDE_GROUP else blocks * threads < 128 * units

            while small():
                if threads > floor:
                    threads //= 2
                elif ppt > 1:  # small layers (batch 1, late stages): threads over sharing
                    ppt //= 2
                elif threads > 64:
                    threads //= 2
                elif cv > 2:
                    cv //= 2
                else:
                    break
            first = self._nhwc(threads, cv, ppt, vec)
            alt = self._nhwc(threads, cv, max(1, ppt // 2), vec)
        heroes = [first] + ([alt] if alt != first else [])
        return [c for c in heroes if self.validate_config(op, c, profile)]

    @staticmethod
    def _nhwc(threads: int, cv: int, ppt: int, vec: int) -> PipelineConfig:
        return PipelineConfig(params=(("threads", threads), ("cv", cv), ("ppt", ppt), ("vec", vec)))

    @staticmethod
    def _nchw(threads: int, rows: int, kpt: int = 1) -> PipelineConfig:
        return PipelineConfig(params=(("threads", threads), ("rows", rows)) + ((("kpt", kpt),) if kpt > 1 else ()))

    def _blocks(self, op: Conv2dOp, config: PipelineConfig) -> int:
        try:
            gx, gy, gz = self.spec(op, config, None).grid()
        except UnsupportedConfigError:
            return 0
        return gx * gy * gz


DEPTHWISE_VARIANTS = [DepthwiseConv]
