"""Hopper attention variant: the FlashAttention-3 style forward (``emit/flash_wgmma.py``) on ``wgmma`` and
TMA (sm_90a), float16 / bfloat16, head dims 64 and 128, causal or not, GQA / MQA, seq_q != seq_kv, ``scale``,
boolean and additive ``attn_mask`` over more than ``SHORT_KV`` keys (the mask values of each thread's score
fragment loaded from global memory while the tile's score GEMM runs; :meth:`FlashAttentionWgmma.masked_heroes`).

Declined with a reason (``cuda.attention.flash_mma`` serves it): a mask over at most ``SHORT_KV`` keys (BERT-style
padding masks, where flash_mma's mask ring runs 2x SDPA on an H100). Decode and small grids over
long KV caches are served but rank below flash_mma, whose split-KV pass fills the GPU (see
:meth:`FlashAttentionWgmma.estimate_seconds`).
Misaligned arrays (TMA needs 16-byte aligned bases) raise :class:`~tracea.errors.LaunchError`, as flash_mma does.

Strided operands (:attr:`AttentionOp.strides`, e.g. Hugging Face's BSHD views or timm's packed qkv) are read
as they are when every q / k / v stride is a multiple of 16 bytes and the output's of 4 (see
:meth:`FlashAttentionWgmma.takes_strides`): 4-D tensor maps (d, seq, head, batch), one query head per
work item, the output stored through its strides.

Config: ``tile_m`` = 64 x consumer warpgroups (64, 128 or 192), ``tile_n`` = keys per tile, ``stages`` = depth of
the K and V rings, ``warps`` = 4 x (consumer warpgroups + 1), param ``pingpong`` (default True with two or three
consumer warpgroups: they take turns issuing their GEMMs; tile_m 64 has none), param ``ctas`` (CTAs resident
per SM, default 1; 2 or 3 with tile_m 64: registers and shared memory split between them, the short-sequence
heroes of :meth:`FlashAttentionWgmma.short_heroes` and the mid-length small-grid ones of
:meth:`FlashAttentionWgmma.mid_heroes`), param ``persistent`` (default False: one CTA per query
block; True: ``ctas`` CTAs per SM walking the blocks, each block's load overlapping the previous one's
epilogue), param
``overlap`` (default: True with two consumer warpgroups, False with three; not a search dimension: a tile's
softmax runs inside its own warpgroup's previous P V, see ``emit/flash_wgmma.py``; H200, B4 H16 S4096 bf16:
with two warpgroups it was worth +0.3-1.5% with ping-pong and +2-12% without, with three 2-4% less), param
``tail`` (persistent, non-causal: the items past the last whole wave are cut along the keys into one run
of key tiles per CTA, see :func:`tail_split`; the pieces publish fp32 partials and base-2 log-sum-exps, the
last to arrive merges them; non-causal heroes), param ``edge_pv`` (not causal: an item's last P V skips the
16-key groups past seq_kv; off in the heroes, it read within +-0.3% where it applied), param ``lpt`` (causal;
default True with ``persistent``: blocks longest first over all heads, a persistent grid dealing balanced pairs
of one (batch, kv head)'s blocks in snake order, see ``Walk`` in ``emit/flash_wgmma.py``; the D128 causal
heroes lead with it). With ``tail`` and fewer items than SMs x ``ctas`` the grid takes up to
``TAIL_MAX_PIECES`` CTAs an item and cuts every item (split-KV, :func:`persistent_grid`).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType
from tracea.errors import InvalidArgumentError, LaunchError, UnsupportedConfigError
from tracea.ir.ops import AttentionOp, LayerType
from tracea.semantic.config import PipelineConfig, Validity
from tracea.semantic.search_space import SearchSpace

from .. import compiler, helpers_kernels, launcher, tma, toolkit
from ..emit import flash_wgmma
from ..emit.flash_wgmma import FlashWgmmaSpec
from .attention import _MASKS, _as_laid_out, _bound, scale_reasons, strides_fit
from .base import CudaVariant, hero, u64


def _work(op: AttentionOp, strided: bool) -> tuple[int, int]:
    """(query rows of one work item, items per row block): a (batch, kv head) pair holds its group's query
    heads' rows one after another; with strided operands each (batch, query head) is its own item."""
    if strided:
        return op.seq_q, op.batch * op.heads
    kvh = int(op.kv_heads or op.heads)
    return (op.heads // kvh) * op.seq_q, op.batch * kvh


def _keys(op: AttentionOp) -> int:
    """The most keys a query row sees: ``seq_kv``, or with (top-left) causal masking at most ``seq_q`` (a
    short query chunk over a long cache sees only the first ``seq_q`` keys, a short-sequence op)."""
    return min(op.seq_kv, op.seq_q) if op.causal else op.seq_kv


def _sms(profile: DeviceProfile) -> int:
    """The SMs the grid is sized for (132, an H100's, when the profile does not say)."""
    return profile.compute_units if profile.compute_units > 1 else 132


#: keys up to which the short-sequence heroes (one consumer warpgroup, several CTAs per SM) lead
SHORT_KV = 512
#: a prefill of at least this many query rows past SHORT_KV keys whose long-hero row blocks fill fewer
#: than ``MID_WAVES`` waves of the SMs leads with the 64-row tiles of :meth:`FlashAttentionWgmma.mid_heroes`
MID_MIN_Q = 256
MID_WAVES = 3.0
#: keys from which a non-causal mid-length prefill with fewer 128-row blocks than SMs leads with the tail
#: split cutting every block (see :meth:`FlashAttentionWgmma.mid_heroes`)
SPLIT_MIN_KV = 4096
#: a tail item is cut into at most this many pieces (the merging piece reads the others' fp32 partials)
TAIL_MAX_PIECES = 4


def tail_split(items: int, ctas: int, key_tiles: int) -> tuple[int, int]:
    """``(full, trun)`` of the ``tail`` param: a persistent grid of ``ctas`` runs items ``[0, full)`` whole
    (a multiple of ``ctas``), and the rest -- fewer than a wave -- cut along the keys: their
    ``(items - full) * key_tiles`` key tiles in runs of ``trun`` tiles, one run per CTA, no run longer
    than an item and no item cut into more than about ``TAIL_MAX_PIECES`` pieces. ``full == items``: nothing
    to cut (whole waves, or a grid of one CTA per item). A grid of more CTAs than items (see
    :func:`persistent_grid`) cuts every item (``full == 0``)."""
    if items % ctas == 0:
        return items, 1
    full = items - items % ctas
    tiles = (items - full) * key_tiles
    trun = max(-(-tiles // ctas), -(-key_tiles // TAIL_MAX_PIECES))
    if 4 * trun > 3 * key_tiles:
        # runs of (nearly) whole items: the cut would save under a quarter of the last wave and run its items
        # through the tail's code (4-byte stores, no staged O, the merge). H100, D128: 2x16x1024 (124 of 256
        # items in runs of whole items) 10% slower; 4x32/8x256 over 4096 keys (runs of 31 of 32 tiles) 0.91 vs
        # 1.03x SDPA, 1x32/8x511 over 16384 (128 items, runs of 125 of 128 tiles) 0.95 vs 1.04x
        return items, 1
    return full, trun


def persistent_grid(items: int, slots: int, tail: bool) -> int:
    """CTAs of a persistent grid of ``slots`` resident CTAs (SMs x ``ctas``) over ``items`` work items: one
    per item up to ``slots``; with the tail split and fewer items than slots (a few long items: a short
    query chunk or a small batch over long keys), up to ``TAIL_MAX_PIECES`` CTAs per item, every item cut
    along its keys (split-KV)."""
    if tail and items < slots:
        return min(slots, items * TAIL_MAX_PIECES)
    return min(items, slots)


class FlashAttentionWgmma(CudaVariant):
    name = "cuda.attention.wgmma"
    description = ("flash-attention forward for Hopper: TMA K/V rings (128B swizzle, mbarriers), a producer and 2-3 "
                   "consumer warpgroups (setmaxnreg), S = QK^T and O += PV on wgmma (P from registers), P V of a tile "
                   "overlapped with the next tile's softmax, ping-pong consumer warpgroups, causal tile skipping, GQA "
                   "(sm_90a)")
    requirements = Requirements(device_kind="cuda", op_kind=LayerType.ATTENTION,
                                dtypes=frozenset({DType.F16, DType.BF16}), isa=("wgmma", "tma"),
                                min_compute_capability=(9, 0), masks=frozenset({"bool", "additive"}), lse=True)
    efficiency = 0.6  # of the f16/bf16 Tensor Core peak
    #: the module whose ``render`` / ``KERNEL_NAME`` this variant compiles (a probe comparing an older emitter
    #: subclasses with another)
    emitter: Any = flash_wgmma
    priority = 20

    def extra_checks(self, op: AttentionOp, profile: DeviceProfile) -> list[str]:
        reasons = scale_reasons(op)
        if op.head_dim not in (64, 128):
            reasons.append(f"head_dim={op.head_dim} not served (64 and 128)")
        kvh = int(op.kv_heads or op.heads)
        if op.seq_kv < 1 or op.seq_q < 1:
            reasons.append("empty sequences are not served")
        if op.mask is not None and _keys(op) <= SHORT_KV:
            reasons.append(f"a mask over at most {SHORT_KV} keys (cuda.attention.flash_mma serves it)")
        if -(-(op.heads // kvh) * op.seq_q // 64) * op.batch * kvh >= 2**31:
            reasons.append("query blocks x batch x kv heads exceeds the grid limit")
        elems = op.batch * op.heads * op.seq_q * op.head_dim
        if max(elems, op.batch * kvh * op.seq_kv * op.head_dim) >= 2**31:
            reasons.append("arrays exceed the 32-bit index range of the kernel")
        return reasons

    def takes_strides(self, op: AttentionOp) -> bool:  # type: ignore[override]
        """Strided q / k / v whose strides are 16-byte multiples (TMA) and an output whose are 4-byte ones
        (the epilogue stores 32-bit pairs)."""
        return strides_fit(op)

    def estimate_seconds(self, op: AttentionOp, profile: DeviceProfile, config: PipelineConfig | None = None) -> float:
        """The roofline estimate divided by how much of the GPU the grid keeps busy: the fraction of each
        query block (``config``'s, else the first hero's: 64 rows for short keys) that holds query rows, and
        of the SMs that get a block. Decode and short-query, long-KV shapes so rank below flash_mma, whose
        split-KV pass fills the GPU (its estimate assumes a full GPU at half this variant's efficiency: this
        one wins where it fills more than half). With short keys (``seq_kv <= SHORT_KV``) only the block's row
        fill counts: flash_mma runs no split there either; nor for the mid-length prefills of
        :meth:`few_waves`."""
        rows, pairs = _work(op, self.takes_strides(op))
        bm = (config or self.hero_configs(op, profile)[0]).tile_m or 128
        ctas = -(-rows // bm) * pairs
        # short keys: a small grid is latency-bound for flash_mma too (no split-KV pass there); H100, ViT-S b1
        # (1x6x197x64, 24 blocks): the short heroes 1.33-1.42x SDPA's kernel time, flash_mma 0.70x
        # mid-length prefills on small grids (few_waves) alike: 1x8x1024x128 flash_mma 0.41x, the mid heroes 1.21x
        small = _keys(op) <= SHORT_KV or self.few_waves(op, profile)
        sm_fill = 1.0 if small else min(1.0, ctas / _sms(profile))
        fill = min(1.0, rows / bm) * sm_fill
        return super().estimate_seconds(op, profile, config) / max(fill, 1e-3)

    # -- configs ---------------------------------------------------------------------------------
    def spec(self, op: AttentionOp, config: PipelineConfig, ptrs: Any = None,
             profile: DeviceProfile | None = None) -> FlashWgmmaSpec:
        """The kernel ``config`` compiles to (``ptrs`` and ``profile`` unused: the signature of flash_mma's)."""
        if config.tile_m % 64:
            raise UnsupportedConfigError(f"tile_m={config.tile_m} must be 64 x consumer warpgroups")
        cw = config.tile_m // 64
        return FlashWgmmaSpec(op.dtype.storage, op.head_dim, config.tile_n, cw, config.stages, op.causal,
                              pingpong=bool(config.get("pingpong", cw > 1)), lse=op.lse,
                              overlap=bool(config.get("overlap", cw <= 2)),
                              tail=bool(config.get("tail", False)), edge_pv=bool(config.get("edge_pv", False)),
                              strided=self.takes_strides(op), ctas=int(config.get("ctas", 1)),
                              ostage=bool(config.get("ostage", False)),
                              lpt=bool(config.get("lpt", op.causal and bool(config.get("persistent", False)))),
                              mask=_MASKS[op.mask])

    def validate_config(self, op: AttentionOp, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        try:
            spec = self.spec(op, config)
            spec.check()
        except UnsupportedConfigError as exc:
            return Validity(False, exc.reason)
        if spec.tail and not config.get("persistent", False):
            return Validity(False, "tail=True splits the items past the last whole wave of a persistent grid "
                                   "(needs persistent=True)")
        if config.warps != spec.threads // 32:
            return Validity(False, f"warps={config.warps} must be 4 x (tile_m / 64 + 1) = {spec.threads // 32}")
        if profile.shared_mem_per_block and spec.smem_bytes > profile.shared_mem_per_block:
            return Validity(False, f"needs {spec.smem_bytes} B of shared memory, device allows "
                                   f"{profile.shared_mem_per_block} B per block")
        return Validity(True)

    def search_space(self, op: AttentionOp, profile: DeviceProfile) -> SearchSpace:
        return (SearchSpace().tile_m([64, 128, 192]).tile_n([64, 80, 96, 128, 160, 176, 192]).tile_k([op.head_dim])
                .stages([1, 2, 3, 4]).warps([8, 12, 16]).param("pingpong", [True, False])
                .param("persistent", [False, True]).param("tail", [False, True]).param("ctas", [1, 2, 3])
                .param("ostage", [False, True]).param("lpt", [False, True] if op.causal else [False])
                .where(lambda c: bool(self.validate_config(op, c, profile)) or "invalid tiling"))

    @staticmethod
    def _h(op: AttentionOp) -> Any:
        """A hero maker for ``op``'s head dim: tile_m x tile_n, stages, ping-pong, persistent, tail, ostage."""
        def h(bm: int, bn: int, st: int, pp: bool = True, persistent: bool = False, tail: bool = False,
              ostage: bool = False) -> PipelineConfig:
            kw: dict[str, Any] = {"ostage": True} if ostage else {}
            if tail:
                return hero(bm, bn, op.head_dim, st, 4 * (bm // 64 + 1), pingpong=pp, persistent=True, tail=True, **kw)
            return hero(bm, bn, op.head_dim, st, 4 * (bm // 64 + 1), pingpong=pp, persistent=persistent, **kw)
        return h

    def hero_configs(self, op: AttentionOp, profile: DeviceProfile) -> list[PipelineConfig]:
        """The short-style heroes of :meth:`short_heroes` (short keys, or a mid-length op whose long-hero
        blocks fill few waves) first, then the long-sequence ones of :meth:`long_heroes`."""
        # H100, B4 H16 S4096 bf16 (TFLOP/s, kernel time): d64 192x128 516 / causal 407, 192x96x3 493 / 401,
        # 128x128x3 453 / 391; d128 128x176 673 / causal 583, 128x128 658 / 585, 192x64 622 / 515; without
        # ping-pong 0-18% less. (Later, with the grouped causal order: d128 128x192 672 / 600, 128x160 669 / 596.)
        # H200, 2026-11-26, with the softmax / P V overlap (B4 H16 and GQA H32/8 S4096 D128 non-causal, bf16 /
        # fp16, two runs): 128x160 persistent 667-671 TFLOP/s (bf16), 128x128 persistent 654-671, 128x176
        # persistent 663-668; 128x160 read best or within 0.3% of the best on every shape, so it leads.
        # Non-causal items are all alike: a persistent grid overlaps each item's loads with the last one's
        # epilogue (+1-2%: d64 518 vs 509, d128 128x176 664 vs 657); causal items differ, and the
        # hardware's dynamic dispatch balances them far better (d128 593 vs 472 persistent).
        # H100, 2026-11-26 (probe_attention_ab.py, two runs, bf16 / fp16, B4 H16 and GQA H32/8 S4096): the
        # tail split (the items past the last whole wave cut along the keys) on the non-causal persistent
        # heroes: 128x160 +0.2-1.5% (B4 H16 bf16 678.6 -> 682.2 TFLOP/s), 128x128 +1.1-2.4% over the base
        # commit's same config and the best D128 config of the second run on all four rows (679.3 / 688.8 /
        # 657.0 / 660.4 against 128x160 with the tail 673.5 / 681.8 / 649.7 / 656.8), D64 192x128 +1.3-2%.
        # edge_pv read within +-0.3% (an edge tile only at 128x160 there), so the heroes leave it off.
        heroes = (self.masked_heroes(op, profile) if op.mask is not None
                  else self.short_heroes(op, profile) + self.long_heroes(op, profile))
        first: dict[str, PipelineConfig] = {}
        for c in heroes:
            first.setdefault(c.key, c)  # each key once, where it first comes
        return list(first.values())

    def masked_heroes(self, op: AttentionOp, profile: DeviceProfile) -> list[PipelineConfig]:
        """Configs for a masked op (past ``SHORT_KV`` keys). A boolean mask is read as bits (a word per 32
        keys and row: 8 registers at 128 keys), so the unmasked long heroes' 128x128 tiles lead; an additive
        one as 16-bit pairs (``tile_n / 4`` registers, 16 times the bits' L2 traffic), where 192x64 leads at D64 (three warpgroups keep more loads in flight; 192x64 spills at D128).
        Non-causal: a persistent grid with the tail split first (it also cuts every item where a few items
        meet long keys: a prefill chunk over a KV cache); causal: persistent, dealing balanced pairs of
        blocks (``lpt``)."""
        # H100, 2026-11-27 (a padded batch, B4 S2048 bf16, (B, 1, S, S) mask; kernel time vs SDPA's masked
        # kernel, 840 / 319 us): D128 GQA 32/8 bool 128x128 tail + ostage 502 us (unmasked 419), 128x128
        # persistent 514, 192x64 551, 128x64 659 (917 before the bits, the 16-bit mask's reads); additive
        # 128x128 tail + ostage 835, 192x64 780 (spills), 128x64 875. D64 H16 bool 128x128 221-223 (192x128
        # 216, spills), 192x64 241; additive 192x64 335, 128x128 377-390 (SDPA 267: behind).
        h = self._h(op)
        bits = op.mask == "bool"
        if op.head_dim <= 64:
            if bits:
                lead = [h(128, 128, 2, persistent=True), h(128, 128, 2), h(192, 64, 2, persistent=True)]
                return lead if op.causal else [h(128, 128, 2, tail=True), *lead]
            if op.causal:
                return [h(192, 64, 2, persistent=True), h(192, 64, 2), h(128, 128, 2, persistent=True)]
            return [h(192, 64, 2, tail=True), h(192, 64, 2, persistent=True), h(128, 128, 2, tail=True)]
        if op.causal:
            return [h(128, 128, 2, persistent=True, ostage=True), h(128, 128, 2), h(128, 64, 2, persistent=True)]
        return [h(128, 128, 2, tail=True, ostage=True), h(128, 128, 2, persistent=True), h(128, 64, 2, tail=True)]

    def long_heroes(self, op: AttentionOp, profile: DeviceProfile) -> list[PipelineConfig]:
        """The long-sequence configs (two or three consumer warpgroups, one CTA per SM): all of the heroes
        where :meth:`short_heroes` gives none, after the short-style ones (for the tuner) elsewhere."""
        h = self._h(op)
        pers = not op.causal
        if op.head_dim <= 64:
            if pers:
                return [h(192, 128, 2, tail=True), h(192, 128, 2, persistent=True), h(192, 128, 2), h(192, 96, 3),
                        h(128, 128, 3), h(192, 96, 3, False)]
            return [h(192, 128, 2), h(192, 128, 2, persistent=True), h(192, 96, 3), h(128, 128, 3),
                    h(192, 96, 3, False)]
        if op.causal:
            # H100, 2026-11-26 (probe_attention_short.py): a persistent grid dealing balanced pairs of blocks
            # (lpt, on by default there) with O staged: B4 H16 S4096 1.09x SDPA against 1.03x for the plain grid,
            # GQA 32/8 B4 / B8 S2048 1.08 / 1.03x against 0.96 / 0.94x
            return [h(128, 128, 2, persistent=True, ostage=True), h(128, 128, 2), h(128, 128, 2, persistent=True),
                    h(128, 176, 2), h(192, 64, 2), h(128, 128, 2, False)]
        # H100, 2026-11-26 (probe_attention_short.py): staging O in shared memory for whole-row stores (param
        # ostage) took 1x16x1024x128 from 0.935x to 1.088x SDPA (128x128 persistent), so it leads the D128 heroes
        return [h(128, 128, 2, tail=True, ostage=True), h(128, 128, 2, tail=True), h(128, 160, 2, tail=True),
                h(128, 160, 2, persistent=True), h(128, 128, 2, persistent=True), h(128, 176, 2), h(192, 64, 2),
                h(128, 128, 2, False)]

    def short_heroes(self, op: AttentionOp, profile: DeviceProfile) -> list[PipelineConfig]:
        """Configs for short keys (``seq_kv <= SHORT_KV``: ViT, BERT, short prefills), empty otherwise. D64:
        one consumer warpgroup (tile_m 64, pingpong off) and two or three CTAs per SM (param ``ctas``), so a
        short item's prologue, loads and epilogue overlap the other CTAs' work and 64-row blocks fill the
        waves; with at most 128 keys 64x64 with the O tile staged in shared memory (``ostage``) leads. D128
        (two tile_m 64 CTAs at most: O alone is 64 registers per thread): the O tile staged in
        shared memory (``ostage``) on a persistent grid, 128x128 where 128-row blocks fill the SMs, else
        64x64 with two CTAs per SM. Past SHORT_KV: the configs of :meth:`mid_heroes`."""
        if _keys(op) > SHORT_KV:
            return self.mid_heroes(op, profile)
        d = op.head_dim

        def c(bn: int, st: int, ctas: int, persistent: bool = False, **kw: Any) -> PipelineConfig:
            return hero(64, bn, d, st, 8, pingpong=False, ctas=ctas, persistent=persistent, **kw)

        # H100, 2026-11-26, probe_attention_short.py (kernel time vs SDPA, which runs cuDNN's 64x128 kernels
        # there; the heroes before these 0.57-0.77x on D64): the fewest padded keys decide the key tile,
        # three CTAs per SM (64..96-key tiles) beat two (128-key tiles) unless the 128-key tile pads no more
        # and the blocks exceed a wave of three per SM with a tile under 96 keys. D64 non-causal: ViT-S b32
        # 197 64x80 x3 persistent 1.11x (packed 1.17x), BERT b8 256 64x64 x3 1.20x (its 384 blocks: one
        # wave), 384 tokens 64x96 x3 1.04x, b32 128 / b8 512 tokens 64x128 x2 1.03 / 0.99x (b2 h16 1024
        # tokens, past SHORT_KV: 64x128 x2 1.00x against the long hero's 0.76x: see mid_heroes);
        # causal 64x64 x3 1.17x (BERT) / 0.94x (b8 512). D128 (two CTAs: O alone holds 64 registers), before
        # the staged epilogue below: 0.80-0.92x non-causal at b8..b32, 1.13x at b1 512, causal 0.82-0.87x.
        rows, pairs = _work(op, self.takes_strides(op))
        items = -(-rows // 64) * pairs
        sms = _sms(profile)

        def padded(bn: int) -> int:
            return -(-_keys(op) // bn) * bn

        if d <= 64:
            if op.causal:
                return [c(64, 2, 3), c(64, 2, 3, True), c(128, 2, 2, True)]
            bn3 = min((64, 80, 96), key=lambda bn: (padded(bn), -bn))  # fewest padded keys, then the longest tile
            wide = c(128, 2, 2, True)
            if op.seq_kv <= 128:
                # H100, 2026-11-26: 32x12x128 (two 64-key tiles) 64x64 x3 persistent with O staged (ostage)
                # 1.12x against 1.02x for 64x128 x2 (and 0.96x unstaged); at 197..512 keys staging read -4..+2%
                return [c(64, 2, 3, True, ostage=True), wide, c(64, 2, 3)]
            if bn3 < 96 and items > 3 * sms and padded(128) <= padded(bn3):
                return [wide, c(bn3, 2, 3, True), c(64, 2, 3)]
            return [c(bn3, 2, 3, True), wide, c(64, 2, 3)]
        # D128, H100, 2026-11-26 (probe_attention_short.py, results h100-2026-11-26-attention-d128-*): the
        # epilogue's 4-byte stores (8 rows x 16 bytes per warp instruction) cost more than the loads at these
        # lengths; staging O in shared memory for whole-row 16-byte stores (param ostage) on a persistent grid
        # lifted every shape: 128x128 (two consumer warpgroups, one CTA per SM, cuDNN's own arrangement) 8x16x256
        # 0.79 -> 1.02x, 16x12x197 0.88 -> 0.94x, causal 8x16x384 0.86 -> 0.90x, 4x32x512 0.81 -> 0.82x, GQA
        # 0.87 -> 0.92x; with one key tile (32x16x128) 64x128 x2 0.92 -> 0.98x; where 128-row blocks leave SMs
        # idle (1x16x512: 64 blocks) 64x64 x2 1.14 -> 1.27x.
        wide = hero(128, 128, d, 2, 12, pingpong=True, persistent=True, ostage=True)
        narrow = c(64, 2, 2, True, ostage=True)
        # too few 128-row blocks for the SMs (causal: at most half of them; H100, GQA 1x32/8x512 causal, 128
        # blocks: 128x128 1.10x SDPA, 64x64 x2 1.03x; a 511-query chunk 1.07 vs 1.00x)
        if -(-rows // 128) * pairs < (sms // 2 + 1 if op.causal else sms):
            return [narrow, wide, c(64, 2, 2)]
        if op.causal:
            # H100, 2026-11-26 (probe_attention_short.py; lpt: balanced pairs of blocks, see emit/flash_wgmma.py):
            # 128x128 with lpt 8x16x384 0.98x SDPA (0.90x in the plain deal), 4x32x512 0.90x (0.82x), 8x16x500
            # 0.93x (0.84x), GQA 4x32/8x512 1.11x (0.92x). 64x64 x2 where its blocks skip a quarter of the
            # masked work 128x128 does: 16x16x257 1.12x (128x128 0.85-0.94x), 64x12x77 0.92x (flash_mma ran
            # there: 0.65x), in the plain deal with at most two blocks per (batch, kv head) (lpt 0.85x there)
            if self._causal_area(op, rows, 64, 64) * 4 <= self._causal_area(op, rows, 128, 128) * 3:
                lead = c(64, 2, 2, True, ostage=True, **({"lpt": False} if -(-rows // 64) <= 2 else {}))
                return [lead, wide, c(64, 2, 2)]
            return [wide, narrow, c(64, 2, 2)]
        # Not causal: the tile that pads the (rows x keys) product least, the first of equals in this order.
        # H100, 2026-11-26 (probe_attention_short.py, kernel time vs SDPA): 16x12x197 128x112 0.98x (128x128
        # 0.92x), 16x12x257 64x64 x2 1.08x (128x128 0.89x, 128x144 1.00x), 8x16x500 128x128 0.98x (128x112
        # 0.93x, 64x64 0.90x); up to 128 keys (one key tile: no ring to overlap, a single stage leaves room for
        # 128 keys) 64x128 x2 leads its equals (32x16x128: 0.98x against 128x128's 0.94x; 64x12x77 0.86x).
        def area(bm: int, bn: int) -> int:
            return -(-rows // bm) * bm * padded(bn)

        # (fewer than 128 rows: 64-row tiles only; the Doctor's estimate counts a 128-row block's empty rows, and
        # flash_mma took 64x12x77 from a 128x96 lead at 0.67x SDPA)
        wides = [(128, bn) for bn in (128, 112, 96, 144, 160)] if rows >= 128 else []
        tiles = ([(64, 128)] if op.seq_kv <= 128 else []) + wides + [(64, 64)]
        bm, bn = min(tiles, key=lambda t: area(*t))
        lead = (c(128, 1, 2, True, ostage=True) if (bm, bn) == (64, 128) else narrow if bm == 64
                else hero(128, bn, d, 2, 12, pingpong=True, persistent=True, ostage=True))
        return [lead] + [x for x in (wide, narrow, c(64, 2, 2, True)) if x.key != lead.key]

    @staticmethod
    def _causal_area(op: AttentionOp, rows: int, bm: int, bn: int) -> int:
        """Query rows x keys a causal (batch, kv head)'s ``bm``-row blocks compute in ``bn``-key tiles (the
        kernel's tile skipping, ``item_of`` in ``emit/flash_wgmma.py``)."""
        total = 0
        for m0 in range(0, rows, bm):
            r_last = min(m0 + bm, rows) - 1
            i_max = r_last % op.seq_q if m0 // op.seq_q == r_last // op.seq_q else op.seq_q - 1
            total += -(-min(op.seq_kv, i_max + 1) // bn) * bn * bm
        return total

    def few_waves(self, op: AttentionOp, profile: DeviceProfile) -> bool:
        """Whether a prefill past SHORT_KV keys (``seq_q >= MID_MIN_Q``) gives the long heroes' row blocks
        (192 rows at D64, 128 at D128) fewer than ``MID_WAVES`` waves over the SMs: 1-4 sequences of
        8-16 heads at 640-2048 tokens, where those blocks leave SMs idle or a last wave mostly empty.
        Decode and short-query shapes (flash_mma's split-KV pass, the decode variant) are never such."""
        if _keys(op) <= SHORT_KV or op.seq_q < MID_MIN_Q:
            return False
        rows, pairs = _work(op, self.takes_strides(op))
        bm = 192 if op.head_dim <= 64 else 128
        return -(-rows // bm) * pairs < MID_WAVES * _sms(profile)

    def mid_heroes(self, op: AttentionOp, profile: DeviceProfile) -> list[PipelineConfig]:
        """Configs for mid-length prefills on small grids (:meth:`few_waves`), empty elsewhere. D64: 64-row
        blocks with two or three CTAs per SM (four or six times the long heroes' blocks a wave), so the
        waves fill and one CTA's softmax and epilogue overlap another's loads. D128: the O tile staged in
        shared memory (``ostage``) -- 128x128 (non-causal: persistent without the tail split), 64x64 with
        two CTAs per SM first where 128-row blocks would leave half the SMs idle."""
        if not self.few_waves(op, profile):
            return []
        d = op.head_dim

        def c(bn: int, st: int, ctas: int, persistent: bool = False, **kw: Any) -> PipelineConfig:
            return hero(64, bn, d, st, 8, pingpong=False, ctas=ctas, persistent=persistent, **kw)

        # H100, 2026-11-26, probe_attention_short.py --shapes mid (results h100-2026-11-26-attention-mid-*),
        # kernel time vs SDPA (cuDNN 64x128 there), new lead vs the previous default. D64 non-causal 64x128
        # x2 persistent: 1x16x1024 1.03x, 2x16x1024 1.00 vs 0.77x, 4x16x1024 0.98 vs 0.96x, 1x8x1536 1.01x,
        # 2x16x2048 (2.7 waves of 192 rows) 0.96 vs 0.93x (192x128 persistent without the tail 0.98x).
        # D64 causal: up to 1024 keys 64x64 x3 2x16 1.11 vs 1.07x, 4x16 0.98 vs 0.80x; 1x16x2048 64x128 x2
        # 1.39x (64x64 x3 below 1.33x). D128 non-causal 128x128 staged persistent: 2x16x1024 1.02 vs 0.91x
        # (the tail split costs 10% when the items past the last wave are nearly a whole wave),
        # 2x16x1536 1.00 vs 0.85x, 1x16x1024 / 1x8x2048 1.08 / 1.06x (as with the tail); 1x8x1024 (64
        # blocks of 128 rows) 64x64 x2 staged 1.21x, where flash_mma ran before (0.41x). D128 causal
        # 128x128 staged: 1x16x1024 1.14 vs 1.08x, 2x16x1024 1.07 vs 1.02x, 1x16x2048 1.47 vs 1.37x,
        # 4x8x768 1.11x (64x64 x2 staged 1.12x).
        if d <= 64:
            if op.causal:
                short_keys = op.seq_kv <= 1024
                return [c(64, 2, 3), c(128, 2, 2)] if short_keys else [c(128, 2, 2), c(64, 2, 3)]
            return [c(128, 2, 2, True), c(128, 2, 2, True, ostage=True), c(64, 2, 3)]
        rows, pairs = _work(op, self.takes_strides(op))
        items = -(-rows // 128) * pairs
        few = items <= _sms(profile) // 2
        if not op.causal and items < _sms(profile) and op.seq_kv >= SPLIT_MIN_KV:
            # fewer 128-row blocks than SMs over long keys (a prefill chunk over a KV cache): the tail split cuts
            # every block along its keys (split-KV). H100: 1x32/8x256 over 8192 keys (64 blocks) 1.57x SDPA
            # against 1.13x for 64x64 x2; where the cut would leave (nearly) whole blocks it is not made
            full, _ = tail_split(items, persistent_grid(items, _sms(profile), True), -(-op.seq_kv // 128))
            if full < items:
                split = hero(128, 128, d, 2, 12, pingpong=True, persistent=True, tail=True)
                return [split, c(64, 2, 2, True, ostage=True), hero(128, 128, d, 2, 12, pingpong=True, persistent=True,
                                                                     ostage=True)]
        # causal: persistent too, dealing balanced pairs of blocks (lpt): H100, 1x32/8x1024 1.45x SDPA against
        # 1.13x for the plain grid, 2x16x1024 1.46x against 1.08x
        wide = hero(128, 128, d, 2, 12, pingpong=True, persistent=True, ostage=True)
        narrow = c(64, 2, 2, True, ostage=True)
        return [narrow, wide] if few else [wide, narrow]

    # -- compile and launch ----------------------------------------------------------------------
    def _kernel(self, spec: FlashWgmmaSpec) -> compiler.Kernel:
        em = self.emitter
        return compiler.load(em.render(spec), em.KERNEL_NAME, "sm_90a", smem=spec.smem_bytes, threads=spec.threads)

    def prepare(self, op: AttentionOp, config: PipelineConfig, profile: DeviceProfile) -> Any:
        with toolkit.cupy().cuda.Device(profile.device.index):
            return self._kernel(self.spec(op, config))

    def fast_launch_ok(self, op: AttentionOp, config: PipelineConfig) -> bool:
        return False  # bind() below is this variant's own fast launcher

    def pack_params(self, maps: list[Any], slots: list[ctypes.c_uint64], scalars: list[Any]) -> tma.Packed:
        """The kernel's parameter block: the Q / K / V tensor maps, the pointer slots (out, lse, tail
        partials, their log-sum-exps, arrival counts, the mask) and the scalars (full, trun, heads, kv heads,
        seq_q, seq_kv, batch x kv heads (strided: batch x heads), scale x log2 e, the output's (batch, head,
        seq) strides as int64, the mask's batch and head counts), in the kernel's order."""
        return tma.pack([*maps, *slots, *scalars])

    def bind(self, op: AttentionOp, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        """Compiles once; per call: the tensor maps of q, k and v (memoised per pointer triple: torch's
        caching allocator mostly hands the same blocks back), the output pointer, one cuLaunchKernel.
        With ``tail`` (and items past the last whole wave) the tail pieces' fp32 partials and the tail
        items' arrival counts (left at zero by every launch) come from the stream's split scratch
        (:func:`~tracea_cuda.launcher.split_scratch`), inside CUDA graph capture from buffers of the call
        (the counts zeroed). A boolean mask is packed into bits first (``tracea_mask_bits``, one launch on the
        same stream) in a buffer of the call from the framework's allocator. Nothing is synchronised at
        launch, so captured CUDA graphs replay it."""
        dev = profile.device.index
        stream = launcher.stream_getter(adapter, dev)
        launcher.refuse_if_capturing(stream(), self.name)
        spec = self.spec(op, config)
        with toolkit.cupy().cuda.Device(dev):
            kernel = self._kernel(spec)
        kvh = int(op.kv_heads or op.heads)
        strided = spec.strided
        rows, pairs = _work(op, strided)
        items = -(-rows // spec.bm) * pairs  # query blocks x (batch, kv head) pairs
        cut = bool(config.get("tail", False))  # spec.tail (read from the config: a probe's baseline spec lacks it)
        grid = (persistent_grid(items, _sms(profile) * spec.ctas, cut) if bool(config.get("persistent", False))
                else items, 1, 1)
        full, trun = tail_split(items, grid[0], -(-op.seq_kv // spec.bn)) if cut else (items, 1)
        n_tail = items - full
        part_floats = 2 * grid[0] * spec.bm * (op.head_dim + 1) if n_tail else 0  # partials, then lse
        lse_off = 4 * 2 * grid[0] * spec.bm * op.head_dim
        dt, d = spec.dtype, op.head_dim
        fptr, threads, smem = int(kernel.function.ptr), spec.threads, spec.smem_bytes
        ost = op.strides[9:] if strided and op.strides is not None else (0, 0, 0)
        mb, mh = op.mask_shape or (1, 1)
        bits = spec.mask == 1  # a boolean mask, read as bits (flash_wgmma.render_mask_bits)
        mwords = flash_wgmma.mask_words(op.seq_kv) if bits else 0
        tail = [ctypes.c_int32(full), ctypes.c_int32(trun), ctypes.c_int32(op.heads), ctypes.c_int32(kvh),
                ctypes.c_int32(op.seq_q), ctypes.c_int32(op.seq_kv), ctypes.c_int32(pairs),
                ctypes.c_float(float(op.scale) * flash_wgmma.LOG2E),  # type: ignore[arg-type]
                *(ctypes.c_int64(x) for x in ost), ctypes.c_int32(mb), ctypes.c_int32(mh), ctypes.c_int32(mwords)]
        to_bits, mrows = None, mb * mh * op.seq_q
        if bits:
            warps = mrows * -(-mwords // 32)
            with toolkit.cupy().cuda.Device(dev):
                bk = helpers_kernels.mask_bits()
            to_bits = launcher.FastLaunch(bk.function, (-(-warps // 8), 1, 1), flash_wgmma.MASK_BITS_THREADS, 0,
                                          launcher.ParamBlock.from_args(
                                              lambda p: (u64(p["m"]), u64(p["bits"]), np.int32(mrows),
                                                         np.int32(op.seq_kv), np.int32(mwords)), ("m", "bits")))
        memo: dict[tuple[int, int, int], tuple[tma.Packed, list[ctypes.c_uint64]]] = {}
        lock = threading.Lock()
        drv_launch = toolkit.cupy().cuda.driver.launchKernel
        ptr, device, name = launcher.pointer_getter(adapter), launcher.on_device(dev), self.name
        capturing, split_scratch, scratch = launcher.is_capturing, launcher.split_scratch, launcher.scratch
        masked = op.mask is not None

        def build(pq: int, pk: int, pv: int) -> tuple[tma.Packed, list[ctypes.c_uint64]]:
            slots = [ctypes.c_uint64(0) for _ in range(6)]  # out, lse, part, part_lse, arrivals, mask
            if strided and op.strides is not None:  # (d, seq, head, batch), the op's (seq, head, batch) strides
                st = op.strides
                maps = [tma.tiled_map(pq, dt, (d, op.seq_q, op.heads, op.batch), (64, spec.bm, 1, 1),
                                      strides=(st[2], st[1], st[0])),
                        tma.tiled_map(pk, dt, (d, op.seq_kv, kvh, op.batch), (64, spec.bn, 1, 1),
                                      strides=(st[5], st[4], st[3])),
                        tma.tiled_map(pv, dt, (d, op.seq_kv, kvh, op.batch), (64, spec.bn, 1, 1),
                                      strides=(st[8], st[7], st[6]))]
            else:
                maps = [tma.tiled_map(pq, dt, (d, rows, op.batch * kvh), (64, spec.bm, 1)),
                        tma.tiled_map(pk, dt, (d, op.seq_kv, op.batch * kvh), (64, spec.bn, 1)),
                        tma.tiled_map(pv, dt, (d, op.seq_kv, op.batch * kvh), (64, spec.bn, 1))]
            return self.pack_params(maps, slots, tail), slots

        def launch(q: Any, k: Any, v: Any, mask: Any, *rest: Any) -> None:
            # rest: (out,) or, with the log-sum-exp output, (lse, out)
            out = rest[-1]
            pq, pk, pv, po = ptr(q), ptr(k), ptr(v), ptr(out)
            pl = ptr(rest[0]) if len(rest) > 1 and rest[0] is not None else 0
            if (mask is None) is masked:
                raise InvalidArgumentError("mask", mask, f"a {op.mask} mask array (the op has one)" if masked
                                           else "no mask (the op has none)")
            pm = ptr(mask) if masked else 0
            if (pq | pk | pv) & 15 or (po | pl) & 3 or pm & 1:  # TMA needs 16-byte aligned bases (as flash_mma's loads do)
                raise LaunchError(f"{name}: q, k and v must be 16-byte aligned, out 4-byte, a mask 2-byte (pass packed arrays)",
                                  backend="cuda")
            key = (pq, pk, pv)
            held: tuple[Any, ...] = ()  # per-call scratch (graph capture), kept until the launch is queued
            with lock:
                hit = memo.get(key)
                if hit is None:
                    if len(memo) >= 64:
                        memo.clear()
                    hit = memo[key] = build(pq, pk, pv)
                packed, slots = hit
                slots[0].value, slots[1].value, slots[5].value = po, pl, pm
                s = stream()
                try:
                    with device():  # makes dev current only when it is not
                        if to_bits is not None:
                            # the boolean mask as bits, in a buffer of the call (stream-ordered, graph-aware)
                            mbuf = scratch(adapter, out, mwords * mrows)
                            held = (*held, mbuf)
                            slots[5].value = ptr(mbuf)
                            to_bits(s, (pm, slots[5].value))
                        if n_tail:
                            if capturing(s):
                                bufs = (scratch(adapter, out, n_tail, zeroed=True), scratch(adapter, out, part_floats))
                                held = (*held, *bufs)
                                pflags, pws = ptr(bufs[0]), ptr(bufs[1])
                            else:
                                pflags, pws = split_scratch(adapter, out, dev, s, n_tail, part_floats)
                            slots[2].value, slots[3].value, slots[4].value = pws, pws + lse_off, pflags
                        drv_launch(fptr, grid[0], grid[1], grid[2], threads, 1, 1, smem, s, packed.address, 0)
                except Exception as exc:  # noqa: BLE001
                    raise LaunchError(f"cuLaunchKernel failed: {type(exc).__name__}: {exc}", backend="cuda") from None
            del held  # stream-ordered allocator: reused only after the launch above

        launch.pointer_only = True  # type: ignore[attr-defined]
        return launch

    def run(self, op: AttentionOp, config: PipelineConfig, args: OpArgs, profile: DeviceProfile, stream: Any = None) -> None:
        op = _as_laid_out(op, args)
        launch = _bound(self, op, config, profile, args.adapter)
        launch(args.arrays["q"], args.arrays["k"], args.arrays["v"], args.arrays.get("mask"), args.arrays.get("lse"),
               args.out)


ATTENTION_WGMMA_VARIANTS = [FlashAttentionWgmma]

__all__ = ["ATTENTION_WGMMA_VARIANTS", "MID_MIN_Q", "MID_WAVES", "SHORT_KV", "SPLIT_MIN_KV", "TAIL_MAX_PIECES", "FlashAttentionWgmma",
           "persistent_grid", "tail_split"]
