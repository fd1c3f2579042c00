"""Attention variant: the flash-attention forward (``emit/flash_attn.py``) on ``mma.sync`` (sm_80+),
float16 / bfloat16, head dims 32, 64 and 128, causal or not, GQA / MQA, seq_q != seq_kv, ``scale``, boolean
and additive masks, and a split-KV path (partials + a combine kernel) that fills the GPU when the query
rows alone cannot (one-token decode over a long KV cache).

Config: ``tile_m`` = query rows per CTA, param ``mt`` = 16-row m-tiles per warp (``warps = tile_m / (16 mt)``),
``tile_n`` = keys per tile, param ``splits`` (0: chosen from the grid size and the SM count, 1: none,
n: n key chunks), param ``mask_ring`` (default True: a mask's tiles travel with K / V through ``cp.async``
into shared memory; used where ``seq_kv`` is a multiple of 8, so the mask rows are 16-byte aligned: with
other lengths the per-key global loads measured faster than plain loads into the tile).

Strided operands (:attr:`AttentionOp.strides`) are read as they are when q / k / v strides are 16-byte
multiples (``cp.async``) and the output's 4-byte ones (:meth:`FlashAttention.takes_strides`): the kernel
takes the twelve strides as arguments and forms row addresses from them (split-KV partials stay packed,
the combine kernel stores through the output's strides).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from tracea.doctor.decision import FrameworkFaster
from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType
from tracea.errors import InvalidArgumentError, LaunchError, UnsupportedConfigError
from tracea.ir.ops import AttentionOp, LayerType
from tracea.runtime import attention_strides
from tracea.semantic.config import PipelineConfig, Validity
from tracea.semantic.search_space import SearchSpace

from .. import compiler, launcher, toolkit
from ..arrays import data_ptr
from ..emit import flash_attn
from ..emit.flash_attn import FlashSpec
from .base import CudaVariant, hero, u64

_MASKS = {None: 0, "bool": 1, "additive": 2}
MAX_SPLITS = 64
#: head dim 32 is served over at most this many keys. H100, fp16, CUDA graphs, the default hero vs
#: ``F.scaled_dot_product_attention``: 49 keys (Swin / PVT / TinyViT windows and reduced keys) 1.61-2.49x,
#: 196-197 keys 1.00-1.08x, 1024 keys 0.76x (its best config 0.88x): the short-sequence kernel only
D32_MAX_KV = 256
#: grid z holds batch x split-KV chunks (Swin's windows make a batch of B x 64 at 7x7: 2048 at batch 32)
GRID_Z = 65535


def scale_reasons(op: AttentionOp) -> list[str]:
    """The CUDA attention kernels fold ``scale * log2(e)`` into the online softmax's exponent and running
    maximum, which holds for a positive scale only: zero or negative scales are declined (the reference
    computes them, as PyTorch accepts any float)."""
    return [] if float(op.scale) > 0 else [f"scale={op.scale} (the online softmax assumes a positive scale)"]  # type: ignore[arg-type]


def auto_splits(op: AttentionOp, bm: int, bn: int, sms: int) -> int:
    """Key chunks for split-KV: about two CTAs per SM when the query blocks alone leave most SMs idle, each
    chunk at least two key tiles long; 1 when the grid is already full. (H100, decode GQA 32/8 D128 batch
    1: 32 chunks ran 16 / 23 / 39 / 66 us at kv 4096 / 8192 / 16384 / 32768, 64 chunks 21-78 us, 16
    chunks 20-114 us; batch 8 ran 0.94-0.97x SDPA at ~5 chunks and 0.77-0.84x at ~9.)"""
    kvh = int(op.kv_heads or op.heads)
    rows = (op.heads // kvh) * op.seq_q
    ctas = -(-rows // bm) * kvh * op.batch
    if ctas >= sms or op.causal and op.seq_q > 1:
        return 1
    by_len = max(1, op.seq_kv // (2 * bn))
    return int(max(1, min(MAX_SPLITS, -(-2 * sms // ctas), by_len)))


class FlashAttention(CudaVariant):
    name = "cuda.attention.flash_mma"
    description = ("flash-attention forward, mma.sync m16n8k16 + ldmatrix + cp.async double buffering, online "
                   "softmax in registers, causal tile skipping, GQA, masks, split-KV decode (sm_80+)")
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.ATTENTION,
                                dtypes=frozenset({DType.F16, DType.BF16}), min_compute_capability=(8, 0),
                                masks=frozenset({"bool", "additive"}), lse=True)
    #: the module whose ``render`` / ``render_combine`` / ``KERNEL_NAME`` / ``COMBINE_NAME`` this variant compiles
    #: (a probe comparing an older emitter subclasses with another)
    emitter: Any = flash_attn
    efficiency = 0.3  # of the f16/bf16 Tensor Core peak (an mma.sync FA2 design on Hopper)
    priority = 10

    def takes_strides(self, op: AttentionOp) -> bool:  # type: ignore[override]
        """Strided q / k / v whose strides are 16-byte multiples (``cp.async`` rows) and an output whose
        are 4-byte ones (32-bit stores)."""
        return strides_fit(op)

    def extra_checks(self, op: AttentionOp, profile: DeviceProfile) -> list[str]:
        reasons = scale_reasons(op)
        if op.head_dim not in flash_attn.HEAD_DIMS:
            reasons.append(f"head_dim={op.head_dim} not served (32, 64 and 128; others need another register budget)")
        elif op.head_dim == 32 and op.seq_kv > D32_MAX_KV:
            reasons.append(FrameworkFaster(f"head_dim=32 over seq_kv={op.seq_kv} > {D32_MAX_KV} keys: PyTorch's "
                                           "kernel measured faster (H100, 1024 keys: 0.76x)"))
        kvh = int(op.kv_heads or op.heads)
        if kvh > 65535 or op.batch > GRID_Z:  # (split-KV chunks are capped to fit batch x chunks in grid z)
            reasons.append("batch or kv heads exceed the grid limits")
        elems = op.batch * op.heads * op.seq_q * op.head_dim
        if max(elems, op.batch * kvh * op.seq_kv * op.head_dim) >= 2**31 or op.seq_q * op.seq_kv >= 2**31:
            reasons.append("arrays exceed the 32-bit index range of the kernel")
        return reasons

    # -- configs ---------------------------------------------------------------------------------
    def spec(self, op: AttentionOp, config: PipelineConfig, ptrs: Any = None, profile: DeviceProfile | None = None) -> FlashSpec:
        mt = int(config.get("mt", 1) or 1)
        if config.tile_m % (16 * mt):
            raise UnsupportedConfigError(f"tile_m={config.tile_m} must be a multiple of 16 x mt={mt}")
        splits = int(config.get("splits", 0) or 0)
        if splits <= 0:
            sms = profile.compute_units if profile is not None and profile.compute_units > 1 else 132
            splits = auto_splits(op, config.tile_m, config.tile_n, sms)
        return FlashSpec(op.dtype.storage, op.head_dim, config.tile_m, config.tile_n, op.causal, _MASKS[op.mask],
                         max(1, min(splits, MAX_SPLITS, GRID_Z // max(op.batch, 1))), mt, op.lse,
                         mask_ring=bool(config.get("mask_ring", True)) and op.seq_kv % 8 == 0,
                         strided=self.takes_strides(op))

    def validate_config(self, op: AttentionOp, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        try:
            spec = self.spec(op, config, None, profile)
            spec.check()
        except UnsupportedConfigError as exc:
            return Validity(False, exc.reason)
        if config.warps != spec.warps:
            return Validity(False, f"warps={config.warps} must be tile_m / (16 mt) = {spec.warps}")
        return config.validate(profile, smem_bytes=spec.smem_bytes)

    def search_space(self, op: AttentionOp, profile: DeviceProfile) -> SearchSpace:
        return (SearchSpace().tile_m([16, 32, 64, 128]).tile_n([32, 64, 128]).tile_k([op.head_dim]).stages([2])
                .warps([1, 2, 4, 8]).param("mt", [1, 2]).param("splits", [0, 1, 2, 4, 8, 16, 32])
                .where(lambda c: bool(self.validate_config(op, c, profile)) or "invalid tiling"))

    def hero_configs(self, op: AttentionOp, profile: DeviceProfile) -> list[PipelineConfig]:
        kvh = int(op.kv_heads or op.heads)
        rows = (op.heads // kvh) * op.seq_q

        def h(bm: int, bn: int, mt: int = 1) -> PipelineConfig:
            return hero(bm, bn, op.head_dim, 2, bm // (16 * mt), mt=mt, splits=0)

        if rows <= 16:
            return [h(16, 64), h(32, 64), h(64, 64)]
        if rows <= 64:
            return [h(64, 64), h(16, 64), h(128, 64)]
        if op.head_dim <= 64:
            return [h(128, 64, 2), h(128, 64), h(64, 64), h(128, 32)]
        if op.mask is not None or op.lse:  # d128 with two m-tiles per warp and a mask (or lse) spills
            return [h(128, 64), h(64, 64), h(128, 32)]
        return [h(128, 32, 2), h(128, 64), h(64, 64)]

    # -- compile and launch ----------------------------------------------------------------------
    def _kernels(self, spec: FlashSpec, profile: DeviceProfile) -> tuple[compiler.Kernel, compiler.Kernel | None]:
        arch = toolkit.arch_name(profile.compute_capability or toolkit.compute_capability(profile.device.index))
        em = self.emitter
        main = compiler.load(em.render(spec), em.KERNEL_NAME, arch, smem=spec.smem_bytes, threads=spec.threads)
        combine = None
        if spec.splits > 1:
            combine = compiler.load(em.render_combine(spec), em.COMBINE_NAME, arch, smem=0, threads=256)
        return main, combine

    def prepare(self, op: AttentionOp, config: PipelineConfig, profile: DeviceProfile) -> Any:
        with toolkit.cupy().cuda.Device(profile.device.index):
            return self._kernels(self.spec(op, config, None, profile), profile)

    def fast_launch_ok(self, op: AttentionOp, config: PipelineConfig) -> bool:
        return False  # bind() below is this variant's own fast launcher

    def bind(self, op: AttentionOp, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        dev = profile.device.index
        stream = launcher.stream_getter(adapter, dev)
        launcher.refuse_if_capturing(stream(), self.name)
        spec = self.spec(op, config, None, profile)
        with toolkit.cupy().cuda.Device(dev):
            main, combine = self._kernels(spec, profile)
        kvh = int(op.kv_heads or op.heads)
        rows = (op.heads // kvh) * op.seq_q
        grid = (-(-rows // spec.bm), kvh, op.batch * spec.splits)
        mb, mh = op.mask_shape or (1, 1)
        scalars = (np.int32(op.batch), np.int32(op.heads), np.int32(kvh), np.int32(op.seq_q), np.int32(op.seq_kv),
                   np.float32(float(op.scale) * flash_attn.LOG2E), np.int32(mb), np.int32(mh))  # type: ignore[arg-type]
        if spec.strided and op.strides is not None:  # (batch, head, seq) strides of q, k, v, out
            scalars += tuple(np.int64(x) for x in op.strides)
        roles = ("q", "k", "v", "out", "mask", "part", "plse", "lse")

        def main_args(p: dict[str, int]) -> tuple:
            return tuple(u64(p[r]) for r in roles) + scalars

        fl = launcher.FastLaunch(main.function, grid, spec.threads, spec.smem_bytes,
                                 launcher.ParamBlock.from_args(main_args, roles))
        total_rows = op.batch * op.heads * op.seq_q
        fc = None
        if combine is not None:
            croles = ("part", "plse", "out", "lse")
            cextra = ((np.int32(op.heads), np.int32(op.seq_q), *(np.int64(x) for x in op.strides[9:]))
                      if spec.strided and op.strides is not None else ())
            fc = launcher.FastLaunch(combine.function, (-(-total_rows // 8), 1, 1), 256, 0, launcher.ParamBlock.from_args(
                lambda p: (u64(p["part"]), u64(p["plse"]), u64(p["out"]), u64(p["lse"]), np.int32(total_rows),
                           *cextra), croles))
        ptr, device, name = launcher.pointer_getter(adapter), launcher.on_device(dev), self.name
        scratch, splits, needs_mask = launcher.scratch, spec.splits, op.mask is not None

        def launch(q: Any, k: Any, v: Any, mask: Any, *rest: Any) -> None:
            # rest: (out,) or, with the log-sum-exp output, (lse, out)
            out = rest[-1]
            pq, pk, pv, po = ptr(q), ptr(k), ptr(v), ptr(out)
            plo = ptr(rest[0]) if len(rest) > 1 and rest[0] is not None else 0
            if needs_mask and mask is None:
                raise InvalidArgumentError("mask", None, f"a {op.mask} mask array (the op has one)")
            pm = ptr(mask) if needs_mask else po
            if (pq | pk | pv | po) & 15 or pm & 1 or plo & 3:
                raise LaunchError(f"{name}: q, k, v and out must be 16-byte aligned (pass packed arrays)", backend="cuda")
            s = stream()
            with device():  # makes dev current only when it is not
                if fc is None:
                    fl(s, (pq, pk, pv, po, pm, po, po, plo))
                else:
                    part = scratch(adapter, out, splits * total_rows * (op.head_dim + 1))
                    pp = ptr(part)
                    pl = pp + 4 * splits * total_rows * op.head_dim
                    fl(s, (pq, pk, pv, po, pm, pp, pl, 0))
                    fc(s, (pp, pl, po, plo))
                    del part  # stream-ordered allocator: reused only after the launches above

        launch.pointer_only = True  # type: ignore[attr-defined]
        return launch

    def run(self, op: AttentionOp, config: PipelineConfig, args: OpArgs, profile: DeviceProfile, stream: Any = None) -> None:
        op = _as_laid_out(op, args)
        launch = _bound(self, op, config, profile, args.adapter)
        launch(args.arrays["q"], args.arrays["k"], args.arrays["v"], args.arrays.get("mask"), args.arrays.get("lse"),
               args.out)


def strides_fit(op: AttentionOp) -> bool:
    """Whether ``op`` has strided operands the CUDA attention kernels read as they are: q / k / v strides
    16-byte multiples (TMA and ``cp.async`` rows), the output's 4-byte ones (32-bit stores), and no dimension
    of more than one element broadcast (stride 0: an expanded view, which the fuzzer found read wrongly)."""
    st = op.strides
    if st is None:
        return False
    kvh = op.kv_heads or op.heads
    sizes = (op.batch, op.heads, op.seq_q, op.batch, kvh, op.seq_kv, op.batch, kvh, op.seq_kv,
             op.batch, op.heads, op.seq_q)
    if any(x <= 0 and n > 1 for x, n in zip(st, sizes)):  # a broadcast (expanded) dimension: packed copies
        return False
    item = op.dtype.itemsize
    return all(x * item % 16 == 0 for x in st[:9]) and all(x * item % 4 == 0 for x in st[9:])


def _as_laid_out(op: AttentionOp, args: OpArgs) -> AttentionOp:
    """``op`` with the strides its ``run`` arrays have (the tuner passes packed arrays for a strided op;
    a plan whose runs a plugin intercepts, the strided operands as they are)."""
    a = args.arrays
    st = attention_strides.of_arrays(args.adapter, op, a["q"], a["k"], a["v"], args.out)
    return op if st == op.strides else dataclasses.replace(op, strides=st)


@functools.lru_cache(maxsize=256)
def _bound(variant: CudaVariant, op: AttentionOp, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
    return variant.bind(op, config, profile, adapter)


ATTENTION_VARIANTS = [FlashAttention]

__all__ = ["ATTENTION_VARIANTS", "FlashAttention", "auto_splits", "data_ptr", "strides_fit"]
