"""Decode attention variant: the split-KV flash-decoding forward (``emit/flash_decode.py``) on ``mma.sync``
(sm_80+), float16 / bfloat16, head dims 64 and 128, for few query rows per kv head (``heads / kv_heads x
seq_q <= 32``: one-token decode, speculative decoding, short KV-cache prefill chunks) over any KV length;
causal (top-left), GQA / MQA, ``scale``, boolean and additive masks. Longer queries are declined with a
reason (``cuda.attention.wgmma`` / ``flash_mma`` serve them).

Config: ``tile_m`` = 16 (query rows per CTA), ``tile_n`` = keys per warp tile (16 or 32), ``stages`` = ring
depth per warp, ``warps`` = warps per CTA (each streams its own tiles), param ``splits`` (0: chosen from the
grid size, the blocks that fit per SM and the KV length; n: n key chunks).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType
from tracea.errors import InvalidArgumentError, LaunchError, UnsupportedConfigError
from tracea.ir.ops import AttentionOp, LayerType
from tracea.semantic.config import PipelineConfig, Validity
from tracea.semantic.search_space import SearchSpace

from .. import compiler, launcher, toolkit
from ..device import resident_sms
from ..emit import flash_attn, flash_decode
from ..emit.flash_decode import DecodeSpec
from .attention import _MASKS, _bound, scale_reasons
from .base import CudaVariant, hero, u64

MAX_ROWS = 32  # query rows per kv head (G x seq_q) served; each 16 re-read K / V (flash_mma serves more)
MAX_SPLITS = 64


def decode_splits(op: AttentionOp, spec: DecodeSpec, sms: int) -> int:
    """Key chunks: as many as give every SM one block (H100, GQA 32/8 D64 / D128 batch 1: one block per
    SM ran 5-15% faster than two smaller ones, and than two waves), no more than leave each warp two tiles,
    at most :data:`MAX_SPLITS`; 1 when the grid already has a block per SM."""
    kvh = int(op.kv_heads or op.heads)
    base = -(-(op.heads // kvh) * op.seq_q // flash_decode.ROWS) * kvh * op.batch
    if base >= sms:
        return 1
    by_len = max(1, op.seq_kv // (2 * spec.warps * spec.bn))
    return int(max(1, min(MAX_SPLITS, sms // base, by_len)))


class FlashDecode(CudaVariant):
    name = "cuda.attention.decode"
    description = ("split-KV decode attention: the GQA group's query rows packed in one m16 tile, every warp its own "
                   "cp.async ring of K/V tiles, mma.sync, online softmax, warps merged in shared memory, splits "
                   "merged by the last CTA of each row block (sm_80+)")
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.ATTENTION,
                                dtypes=frozenset({DType.F16, DType.BF16}), min_compute_capability=(8, 0),
                                masks=frozenset({"bool", "additive"}), lse=True)
    efficiency = 0.3  # same roofline as flash_mma: ties at decode shapes go to the higher priority
    priority = 30

    def extra_checks(self, op: AttentionOp, profile: DeviceProfile) -> list[str]:
        reasons = scale_reasons(op)
        if op.head_dim not in (64, 128):
            reasons.append(f"head_dim={op.head_dim} not served (64 and 128)")
        kvh = int(op.kv_heads or op.heads)
        rows = (op.heads // kvh) * op.seq_q
        if rows > MAX_ROWS:
            reasons.append(f"{rows} query rows per kv head (heads / kv_heads x seq_q) exceed the decode kernel's "
                           f"{MAX_ROWS}: a prefill kernel serves them")
        if op.seq_kv < 1 or op.seq_q < 1:
            reasons.append("empty sequences are not served")
        if kvh > 65535 or op.batch * MAX_SPLITS > 65535:
            reasons.append("batch or kv heads exceed the grid limits")
        if max(op.batch * op.heads * op.seq_q, op.batch * kvh * op.seq_kv) * op.head_dim >= 2**31:
            reasons.append("arrays exceed the 32-bit index range of the kernel")
        return reasons

    # -- configs ---------------------------------------------------------------------------------
    def spec(self, op: AttentionOp, config: PipelineConfig, ptrs: Any = None,
             profile: DeviceProfile | None = None) -> DecodeSpec:
        """The kernel ``config`` compiles to; ``splits`` 0 is resolved for ``profile``'s SM count."""
        if config.tile_m != flash_decode.ROWS:
            raise UnsupportedConfigError(f"tile_m={config.tile_m} must be {flash_decode.ROWS} (one m16 tile)")
        spec = DecodeSpec(op.dtype.storage, op.head_dim, config.tile_n, config.warps, config.stages, op.causal,
                          _MASKS[op.mask], 1, op.lse)
        splits = int(config.get("splits", 0) or 0)
        if splits <= 0:
            # SMs this process can count on (an MPS share scales them down): one wave of blocks; the
            # blocks never wait for each other (the last to arrive merges), so this is for speed only
            sms = resident_sms(profile) if profile is not None and profile.compute_units > 1 else 132
            splits = decode_splits(op, spec, sms)
        return DecodeSpec(spec.dtype, spec.head_dim, spec.bn, spec.warps, spec.stages, spec.causal, spec.mask,
                          min(splits, MAX_SPLITS), spec.lse)

    def validate_config(self, op: AttentionOp, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        try:
            spec = self.spec(op, config, None, profile)
            spec.check()
        except UnsupportedConfigError as exc:
            return Validity(False, exc.reason)
        return config.validate(profile, smem_bytes=spec.smem_bytes)

    def search_space(self, op: AttentionOp, profile: DeviceProfile) -> SearchSpace:
        return (SearchSpace().tile_m([16]).tile_n([16, 32]).tile_k([op.head_dim]).stages([2, 3, 4, 6])
                .warps([2, 4, 8]).param("splits", [0, 8, 16, 32, 64])
                .where(lambda c: bool(self.validate_config(op, c, profile)) or "invalid tiling"))

    def hero_configs(self, op: AttentionOp, profile: DeviceProfile) -> list[PipelineConfig]:
        def h(bn: int, warps: int, stages: int) -> PipelineConfig:
            return hero(16, bn, op.head_dim, stages, warps, splits=0)

        # H100, GQA 32/8, batch 1 / 4, kv 4096 / 32768, D128 and D64 (kernel time): 8 warps x 3 stages of 16
        # keys was best or within 2% on 6 of 8 shapes; 4 x 3 of 32 keys next.
        if op.mask is not None and op.head_dim == 128:  # bn=32 with a mask spills at d128
            heroes = [h(16, 8, 3), h(16, 4, 4), h(16, 4, 6)]
        else:
            heroes = [h(16, 8, 3), h(32, 4, 3), h(16, 4, 4), h(32, 4, 2), h(16, 4, 6)]
        # smaller rings for devices with less shared memory per block (sm_80: 163 KB, sm_86 / sm_89: 99 KB)
        heroes += [h(16, 4, 3), h(16, 4, 2)]
        return [c for c in heroes if self.validate_config(op, c, profile)]

    # -- compile and launch ----------------------------------------------------------------------
    def _kernel(self, spec: DecodeSpec, profile: DeviceProfile) -> compiler.Kernel:  # type: ignore[override]
        arch = toolkit.arch_name(profile.compute_capability or toolkit.compute_capability(profile.device.index))
        return compiler.load(flash_decode.render(spec), flash_decode.KERNEL_NAME, arch, smem=spec.smem_bytes,
                             threads=spec.threads)

    def prepare(self, op: AttentionOp, config: PipelineConfig, profile: DeviceProfile) -> Any:
        with toolkit.cupy().cuda.Device(profile.device.index):
            return self._kernel(self.spec(op, config, None, profile), profile)

    def fast_launch_ok(self, op: AttentionOp, config: PipelineConfig) -> bool:
        return False  # bind() below is this variant's own fast launcher

    def bind(self, op: AttentionOp, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        """Pointer-only launcher of one kernel. With splits, the fp32 partials and log-sum-exps go to
        scratch from the caller's stream-ordered allocator, and the kernel counts arrivals per row block
        in a small int32 buffer that every launch leaves at zero: one buffer per stream (so launches on
        different streams never share one), and inside CUDA graph capture a fresh zeroed buffer per call
        (its memset is captured with the kernel). No synchronisation, no host reads."""
        dev = profile.device.index
        stream = launcher.stream_getter(adapter, dev)
        launcher.refuse_if_capturing(stream(), self.name)
        spec = self.spec(op, config, None, profile)
        with toolkit.cupy().cuda.Device(dev):
            main = self._kernel(spec, profile)
        kvh = int(op.kv_heads or op.heads)
        rows = (op.heads // kvh) * op.seq_q
        grid = (-(-rows // flash_decode.ROWS), kvh, op.batch * spec.splits)
        slots = grid[0] * kvh * op.batch
        mb, mh = op.mask_shape or (1, 1)
        scalars = (np.int32(op.batch), np.int32(op.heads), np.int32(kvh), np.int32(op.seq_q), np.int32(op.seq_kv),
                   np.float32(float(op.scale) * flash_attn.LOG2E), np.int32(mb), np.int32(mh))  # type: ignore[arg-type]
        roles = ("q", "k", "v", "out", "mask", "part", "plse", "arrivals", "lse")

        def main_args(p: dict[str, int]) -> tuple:
            return tuple(u64(p[r]) for r in roles) + scalars

        fl = launcher.FastLaunch(main.function, grid, spec.threads, spec.smem_bytes,
                                 launcher.ParamBlock.from_args(main_args, roles))
        total_rows = op.batch * op.heads * op.seq_q
        ptr, device, name = launcher.pointer_getter(adapter), launcher.on_device(dev), self.name
        scratch, splits, needs_mask = launcher.scratch, spec.splits, op.mask is not None
        capturing = launcher.is_capturing
        counters: dict[int, Any] = {}  # stream handle -> int32 arrival counts (zero between launches)

        def launch(q: Any, k: Any, v: Any, mask: Any, *rest: Any) -> None:
            # rest: (out,) or, with the log-sum-exp output, (lse, out)
            out = rest[-1]
            pq, pk, pv, po = ptr(q), ptr(k), ptr(v), ptr(out)
            pl = ptr(rest[0]) if len(rest) > 1 and rest[0] is not None else 0
            if needs_mask and mask is None:
                raise InvalidArgumentError("mask", None, f"a {op.mask} mask array (the op has one)")
            pm = ptr(mask) if needs_mask else po
            if (pq | pk | pv | po) & 15 or pm & 1 or pl & 3:
                raise LaunchError(f"{name}: q, k, v and out must be 16-byte aligned (pass packed arrays)", backend="cuda")
            s = stream()
            with device():
                if splits == 1:
                    fl(s, (pq, pk, pv, po, pm, po, po, po, pl))
                    return
                if capturing(s):
                    arrivals = scratch(adapter, out, slots, zeroed=True)
                else:
                    arrivals = counters.get(s)
                    if arrivals is None:
                        arrivals = counters[s] = scratch(adapter, out, slots, zeroed=True)
                part = scratch(adapter, out, splits * total_rows * (op.head_dim + 1))
                pp = ptr(part)
                fl(s, (pq, pk, pv, po, pm, pp, pp + 4 * splits * total_rows * op.head_dim, ptr(arrivals), pl))
                del part  # stream-ordered allocator: reused only after the launch above

        launch.pointer_only = True  # type: ignore[attr-defined]
        return launch

    def run(self, op: AttentionOp, config: PipelineConfig, args: OpArgs, profile: DeviceProfile, stream: Any = None) -> None:
        launch = _bound(self, op, config, profile, args.adapter)
        launch(args.arrays["q"], args.arrays["k"], args.arrays["v"], args.arrays.get("mask"), args.arrays.get("lse"),
               args.out)


ATTENTION_DECODE_VARIANTS = [FlashDecode]

__all__ = ["ATTENTION_DECODE_VARIANTS", "FlashDecode", "decode_splits"]
