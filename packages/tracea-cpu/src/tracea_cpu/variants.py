"""Kernel variants of the CPU backend: ``cpu.<op>.<isa>`` for GEMM, conv2d and attention, one per
instruction set (AVX-512, AVX2+FMA, NEON, portable scalar)."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np


from tracea.doctor.profile import DeviceProfile
from tracea.doctor.variant import OpArgs, Requirements
from tracea.dtypes import DType
from tracea.errors import InvalidArgumentError, LayoutError
from tracea.ir.ops import AttentionOp, Conv2dOp, GemmOp, LayerType, Layout, Op
from tracea.semantic import PipelineConfig, SearchSpace
from tracea.semantic.config import VALID, Validity

from . import kernels, spaces
from .amx import CpuGemmAmxVariant
from .amx_conv import CpuConv2dAmxVariant
from .f16 import f16_variants
from .f16_amx import CpuGemmF16AmxVariant
from .bf16 import CpuGemmBf16Variant
from .emit.calls import ATTENTION_PARAMS, CONV_PARAMS, GEMM_PARAMS
from .emit.gemv import unpacked_driver
from .skinny import skinny_variants
from .host_load import thread_picker
from .isa import ALL_ISAS, Isa
from .variant_base import (GEMV_THREADS_BYTES, CpuVariant, _check_rc, _host, _ptr, _require,  # noqa: F401
                           _requested_threads, _threads_problem, _validate_blocked, pointer_launcher)

def _gemv(op: Op) -> bool:
    """Whether ``tr_gemm`` runs this GEMM through a packing-free driver (GEMV or axpy, see
    :mod:`.emit.gemv`), where the tile and cache blocks of the config are unused."""
    return isinstance(op, GemmOp) and unpacked_driver(op.m, op.n, op.k, op.trans_b) is not None


class CpuGemmVariant(CpuVariant):
    """BLIS-style GEMM: packed panels, MR x NR register micro-kernel, KC/MC/NC blocks, fused epilogue."""

    def __init__(self, isa: Isa) -> None:
        super().__init__(isa)
        self.name = f"cpu.gemm.{isa.name}"
        self.description = (f"blocked GEMM, {isa.name} micro-kernel, packed panels, fused epilogue; "
                            f"packing-free GEMV / axpy drivers for a few rows (nn.Linear decode)")
        self.requirements = Requirements(device_kind="cpu", op_kind=LayerType.GEMM, dtypes=frozenset({DType.F32}),
                                         isa=isa.requires)

    def search_space(self, op: Op, profile: DeviceProfile) -> SearchSpace:
        if _gemv(op):
            return spaces.gemv_space(self.isa, profile)
        return spaces.blocked_space(self.isa, profile)

    def hero_configs(self, op: Op, profile: DeviceProfile) -> list[PipelineConfig]:
        # The GEMV / axpy drivers use no tile: one hero (one compiled library), not one per tile.
        if _gemv(op):
            return [spaces.heroes(spaces.GEMM_HEROES, self.isa)[0]]
        return spaces.blocked_heroes(self.isa, op, profile=profile)

    def validate_config(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        return _validate_blocked(self.isa, config)

    def threads(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> int:
        # The GEMV / axpy drivers are memory-bound: a second thread pays off from ~256 KiB of B
        # (measured M = 1, weights 256 x 256: 41 -> 49 GB/s, 512 x 512: 57 -> 95 GB/s, from one to two
        # threads), far below the flop-based small-problem cut.
        if _gemv(op) and not _requested_threads(config):
            assert isinstance(op, GemmOp)
            if 4 * op.n * op.k * op.batch < GEMV_THREADS_BYTES:
                return 1
            return kernels.thread_count(0, profile.compute_units)
        return super().threads(op, config, profile)

    def prepare(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Any:
        return _blocked_plan(self, op, config)

    def bind(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        assert isinstance(op, GemmOp)
        lib, mc, nc, kc = self.prepare(op, config, profile)
        m, n, k = op.m, op.n, op.k
        rsa, csa = (1, m) if op.trans_a else (k, 1)
        rsb, csb = (1, k) if op.trans_b else (n, 1)
        params = kernels.call_params(GEMM_PARAMS, dict(
            batch=op.batch, M=m, N=n, K=k, rsa=rsa, csa=csa, sa=m * k, rsb=rsb, csb=csb, sb=k * n, ldc=n, sc=m * n,
            mc=mc, nc=nc, kc=kc, nth=self.threads(op, config, profile)))
        return pointer_launcher(lib.tr_gemm_call, params, GEMM_PARAMS.index("nth"), config, adapter,
                                op.epilogue.has_bias, "gemm")

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, GemmOp)
        lib, mc, nc, kc = self.prepare(op, config, profile)
        m, n, k, bt = op.m, op.n, op.k, op.batch
        a = _host(args, "a", (bt, m, k))
        b = _host(args, "b", (bt, k, n))
        bias = _host(args, "bias", (n,)) if op.epilogue.has_bias else None
        out = _host(args, "out", (bt, m, n))
        rsa, csa = (1, m) if op.trans_a else (k, 1)
        rsb, csb = (1, k) if op.trans_b else (n, 1)
        rc = lib.tr_gemm(bt, m, n, k, _ptr(a), rsa, csa, m * k, _ptr(b), rsb, csb, k * n, _ptr(out), n, m * n,
                         _ptr(bias), mc, nc, kc, self.threads(op, config, profile))
        _check_rc(rc, "gemm")


class CpuConv2dVariant(CpuVariant):
    """Implicit-GEMM conv2d: im2col tiles gathered while packing (no im2col buffer), NCHW and NHWC."""

    def __init__(self, isa: Isa) -> None:
        super().__init__(isa)
        self.name = f"cpu.conv2d.{isa.name}"
        self.description = f"implicit-GEMM conv2d (NCHW/NHWC), {isa.name} micro-kernel, fused epilogue"
        self.requirements = Requirements(device_kind="cpu", op_kind=LayerType.CONV2D,
                                         dtypes=frozenset({DType.F32}), isa=isa.requires)

    def search_space(self, op: Op, profile: DeviceProfile) -> SearchSpace:
        space = spaces.blocked_space(self.isa, profile)
        if isinstance(op, Conv2dOp):
            algos = [1, 0, 2] if spaces.indirect_ok(op) else [0, 2]
            space = space.param("indirect", algos + ([3] if spaces.direct_nchw_ok(self.isa, op) else []))
        return space

    def hero_configs(self, op: Op, profile: DeviceProfile) -> list[PipelineConfig]:
        heroes = spaces.blocked_heroes(self.isa, op)
        if not isinstance(op, Conv2dOp):
            return heroes
        packed = [h.with_params(indirect=0) for h in heroes[:1]]
        # Weights-stationary: deep K blocks (the weights are read in place; only the KC x NR im2col panels
        # are packed) mean fewer passes over C and fewer barriers (measured +8% on ResNet-50 512@7^2).
        stationary = [h.with_params(indirect=2, kc=max(h.get("kc"), spaces.STATIONARY_KC), nc=min(h.get("nc"), 2048))
                      for h in spaces.blocked_heroes(self.isa, op, indirect=2)]
        stationary = [h for h in stationary if h.get("mr") >= 6] + [h for h in stationary if h.get("mr") < 6]
        indirect: list[PipelineConfig] = []
        if spaces.indirect_ok(op):
            # The indirect kernel keeps one pointer per tile row in a general register: short tiles first.
            ind = spaces.blocked_heroes(self.isa, op, indirect=1)
            short = [h for h in ind if h.get("mr") <= 6] + [h for h in ind if h.get("mr") > 6]
            rows = spaces.row_heroes(self.isa, op)
            # Small images: the padding taps skipped by row tiles are a large share of the work.
            short = rows + short if op.q <= spaces.row_first_max_q(profile) else short + rows
            indirect = [h.with_params(indirect=1) for h in short]
        # (Weights-stationary was first for NCHW 512@7^2 at batch 1 until the NCHW indirect path read the
        # KCRS weights in channel blocks and skipped padding taps: now 176 vs 153 GFLOP/s there.)
        if not spaces.direct_nchw_ok(self.isa, op):
            return indirect + packed + stationary[:2]
        # Direct NCHW (no NHWC copies): its tile is fixed, the config's tile only names the library.
        direct = [(indirect or heroes)[0].with_params(indirect=3)]
        if indirect and spaces.direct_nchw_first(self.isa, op):
            return direct + indirect + packed + stationary[:2]
        return indirect + packed + stationary[:2] + direct

    def validate_config(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        if config.get("indirect", 0) not in (0, 1, 2, 3):
            return Validity(False, f"param indirect={config.get('indirect')!r} must be 0, 1, 2 or 3")
        return _validate_blocked(self.isa, config)

    def prepare(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Any:
        return _blocked_plan(self, op, config)

    def bind(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        assert isinstance(op, Conv2dOp)
        lib, mc, nc, kc = self.prepare(op, config, profile)
        params = kernels.call_params(CONV_PARAMS, dict(
            layout=0 if op.layout is Layout.NCHW else 1, n=op.n, C=op.c, H=op.h, W=op.w, K=op.k, R=op.r, S=op.s,
            sh=op.stride[0], sw=op.stride[1], ph=op.padding[0], pw=op.padding[1], dh=op.dilation[0],
            dw=op.dilation[1], groups=op.groups, P=op.p, Q=op.q, mc=mc, nc=nc, kc=kc,
            nth=self.threads(op, config, profile), indirect=int(config.get("indirect", 0) or 0)))
        return pointer_launcher(lib.tr_conv2d_call, params, CONV_PARAMS.index("nth"), config, adapter,
                                op.epilogue.has_bias, "conv2d", bias_before_out=True)

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, Conv2dOp)
        lib, mc, nc, kc = self.prepare(op, config, profile)
        x = _host(args, "x", op.x_shape)
        w = _host(args, "w", op.w_shape)
        bias = _host(args, "bias", (op.k,)) if op.epilogue.has_bias else None
        out = _host(args, "out", op.out_shape)
        layout = 0 if op.layout is Layout.NCHW else 1
        rc = lib.tr_conv2d(layout, op.n, op.c, op.h, op.w, op.k, op.r, op.s, op.stride[0], op.stride[1],
                           op.padding[0], op.padding[1], op.dilation[0], op.dilation[1], op.groups, op.p, op.q,
                           _ptr(x), _ptr(w), _ptr(bias), _ptr(out), mc, nc, kc, self.threads(op, config, profile),
                           int(config.get("indirect", 0) or 0))
        _check_rc(rc, "conv2d")


class CpuAttentionVariant(CpuVariant):
    """Flash-style attention forward: online softmax over key blocks, causal or not, GQA, boolean and
    additive masks, a value head dim of its own; q, k, v and the output read in place through their
    (batch, head, seq) strides. A tile driver for many query rows per kv head, a rows driver (keys read
    in place, no packing) for a few (decode); see :mod:`tracea_cpu.emit.attention`."""

    def __init__(self, isa: Isa) -> None:
        super().__init__(isa)
        self.name = f"cpu.attention.{isa.name}"
        self.description = f"flash attention forward (online softmax, causal, GQA, masks, strided), {isa.name}"
        self.requirements = Requirements(device_kind="cpu", op_kind=LayerType.ATTENTION,
                                         dtypes=frozenset({DType.F32}), isa=isa.requires,
                                         masks=frozenset({"bool", "additive"}), lse=True, value_head_dim=True)

    def check(self, op: Op, profile: DeviceProfile) -> list[str]:
        reasons = super().check(op, profile)
        if isinstance(op, AttentionOp) and not float(op.scale) > 0:  # type: ignore[arg-type]
            # masked logits are -inf before the scale is applied: a negative scale would make them +inf
            reasons.append(f"scale={op.scale} (the kernel assumes a positive scale)")
        return reasons

    def takes_strides(self, op: Op) -> bool:
        """Always: the kernel reads q, k, v and writes the output through their (batch, head, seq) strides."""
        return True

    def search_space(self, op: Op, profile: DeviceProfile) -> SearchSpace:
        return spaces.attention_space(self.isa, profile, op)

    def hero_configs(self, op: Op, profile: DeviceProfile) -> list[PipelineConfig]:
        return spaces.attention_heroes(self.isa, op)

    def validate_config(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Validity:
        bq, bk = config.get("bq"), config.get("bk")
        kb, rows = config.get("kb"), config.get("rows", spaces.ATTN_ROWS)
        if kb is None and isinstance(bk, int) and not isinstance(bk, bool) and bk > 0:
            kb = spaces.attention_kb(bk)
        for name, val in (("bq", bq), ("bk", bk), ("kb", kb), ("rows", rows)):
            if not isinstance(val, int) or isinstance(val, bool):
                return Validity(False, f"attention configs need integer params bq, bk, kb and rows ({name}={val!r})")
        why = kernels.check_tile(self.isa, bq, bk) or _threads_problem(config)
        if not why and (kb < bk or kb % bk or kb % 4 or kb > spaces.ATTN_KB_MAX):
            why = f"kb={kb} must be a multiple of bk={bk} and of 4, at most {spaces.ATTN_KB_MAX}"
        if not why and rows < 0:
            why = f"rows={rows} must be >= 0"
        return Validity(False, why) if why else VALID

    def prepare(self, op: Op, config: PipelineConfig, profile: DeviceProfile) -> Any:
        return _attention_plan(self, op, config)

    def _params(self, op: AttentionOp, config: PipelineConfig, profile: DeviceProfile,
                strides: tuple[int, ...] | None) -> Any:
        mb, mh = op.mask_shape or (1, 1)
        kvh = int(op.kv_heads or op.heads)
        st = strides or _packed_strides(op)
        names = ("qb", "qh", "qs", "kb", "kh", "ks", "vb", "vh", "vs", "ob", "oh", "os")
        return kernels.call_params(ATTENTION_PARAMS, dict(
            B=op.batch, H=op.heads, KVH=kvh, Sq=op.seq_q, Skv=op.seq_kv, D=op.head_dim, Dv=op.dv,
            causal=int(op.causal), nth=self.threads(op, config, profile), mkind=_MASK_KINDS[op.mask], MB=mb, MH=mh,
            rows_max=int(config.get("rows", spaces.ATTN_ROWS)), **dict(zip(names, st))))

    def bind(self, op: Op, config: PipelineConfig, profile: DeviceProfile, adapter: Any) -> Any:
        assert isinstance(op, AttentionOp)
        lib = self.prepare(op, config, profile)
        params = self._params(op, config, profile, op.strides)
        slot = ATTENTION_PARAMS.index("nth")
        pick = thread_picker(params[slot], _requested_threads(config))
        fn, ptr, scale = lib.tr_attention_call, adapter.data_ptr, float(op.scale)  # type: ignore[arg-type]

        if op.mask is None and not op.lse:
            def launch(q: Any, k: Any, v: Any, mask: Any, *rest: Any) -> None:
                params[slot] = pick()
                rc = fn(params, scale, ptr(q), ptr(k), ptr(v), ptr(rest[-1]), None, None)
                if rc:
                    _check_rc(rc, "attention")
        else:  # (q, k, v, mask, out) or, with the log-sum-exp output, (q, k, v, mask, lse, out)
            def launch(q: Any, k: Any, v: Any, mask: Any, *rest: Any) -> None:
                if op.mask is not None and mask is None:
                    raise InvalidArgumentError("mask", None, f"a {op.mask} mask array (the op has one)")
                lse = rest[0] if len(rest) > 1 else None
                params[slot] = pick()
                rc = fn(params, scale, ptr(q), ptr(k), ptr(v), ptr(rest[-1]), None if mask is None else ptr(mask),
                        None if lse is None else ptr(lse))
                if rc:
                    _check_rc(rc, "attention")

        launch.pointer_only = True  # type: ignore[attr-defined]
        return launch

    def run(self, op: Op, config: PipelineConfig, args: OpArgs, profile: DeviceProfile) -> None:
        assert isinstance(op, AttentionOp)
        lib = self.prepare(op, config, profile)
        kvh = int(op.kv_heads or op.heads)
        arrays = [_strided_host(args, "q", (op.batch, op.heads, op.seq_q, op.head_dim)),
                  _strided_host(args, "k", (op.batch, kvh, op.seq_kv, op.head_dim)),
                  _strided_host(args, "v", (op.batch, kvh, op.seq_kv, op.dv)),
                  _strided_host(args, "out", (op.batch, op.heads, op.seq_q, op.dv))]
        if any(a is None for a in arrays):
            raise InvalidArgumentError("q, k, v, out", None, "four arrays (the op's operands and output)")
        strides = tuple(x for a in arrays for x in _fold(a))  # type: ignore[arg-type]
        mb, mh = op.mask_shape or (1, 1)
        mask = _host(args, "mask", (mb, mh, op.seq_q, op.seq_kv)) if op.mask else None
        if op.mask and mask is None:
            raise InvalidArgumentError("mask", None, f"a {op.mask} mask array (the op has one)")
        lse = _host(args, "lse", (op.batch, op.heads, op.seq_q)) if op.lse else None
        params = self._params(op, config, profile, strides)
        rc = lib.tr_attention_call(params, float(op.scale), *(_ptr(a) for a in arrays), _ptr(mask), _ptr(lse))  # type: ignore[arg-type]
        _check_rc(rc, "attention")


def _packed_strides(op: AttentionOp) -> tuple[int, ...]:
    """The (batch, head, seq) element strides of packed q, k, v and output arrays."""
    kvh = int(op.kv_heads or op.heads)
    out: tuple[int, ...] = ()
    for h, s, e in ((op.heads, op.seq_q, op.head_dim), (kvh, op.seq_kv, op.head_dim), (kvh, op.seq_kv, op.dv),
                    (op.heads, op.seq_q, op.dv)):
        out += (h * s * e, s * e, e)
    return out


def _strided_host(args: OpArgs, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """A float32 host array of ``shape`` whose head_dim is unit-stride (other strides any non-negative);
    a packed array may have any shape of the same size."""
    arr = args.host(name)
    if arr is None:
        return None
    if arr.dtype != np.float32:
        raise InvalidArgumentError(name, arr, "a float32 array")
    if arr.flags.c_contiguous:
        if arr.size != math.prod(shape):
            raise InvalidArgumentError(name, arr, f"{math.prod(shape)} elements (shape {shape})")
        return arr.reshape(shape)
    if tuple(arr.shape) != shape or _fold(arr) is None:
        raise LayoutError(name, arr, f"a packed array, or a strided {shape} one with a unit-stride last dimension")
    return arr


def _fold(arr: np.ndarray) -> tuple[int, int, int] | None:
    """(batch, head, seq) element strides of a (b, h, s, d) float32 array with unit-stride d."""
    st = [x // 4 for x in arr.strides]
    if arr.shape[3] > 1 and st[3] != 1 or any(x < 0 for x in st):
        return None
    return st[0], st[1], st[2]


_MASK_KINDS = {None: 0, "bool": 1, "additive": 2}


@functools.lru_cache(maxsize=512)
def _blocked_plan(variant: "CpuVariant", op: Op, config: PipelineConfig) -> tuple[Any, int, int, int]:
    """Validated config -> (compiled library, mc, nc, kc), memoised so a call costs one dict lookup."""
    _require(variant.validate_config(op, config, None), variant.name, config)  # type: ignore[arg-type]
    lib = kernels.blocked_library(variant.isa.name, int(config.get("mr")), int(config.get("nr")), op.epilogue.key)  # type: ignore[attr-defined]
    return lib, int(config.get("mc")), int(config.get("nc")), int(config.get("kc"))


@functools.lru_cache(maxsize=256)
def _attention_plan(variant: "CpuAttentionVariant", op: Op, config: PipelineConfig) -> Any:
    _require(variant.validate_config(op, config, None), variant.name, config)  # type: ignore[arg-type]
    return kernels.attention_library(variant.isa.name, int(config.get("bq")), int(config.get("bk")),
                                     int(config.get("kb") or spaces.attention_kb(int(config.get("bk")))))


def all_variants() -> list[CpuVariant]:
    """Every CPU variant, for every ISA (the Doctor filters by the host's flags)."""
    out: list[CpuVariant] = []
    for isa in ALL_ISAS:
        out += [CpuGemmVariant(isa), CpuConv2dVariant(isa), CpuAttentionVariant(isa)]
    return out + [CpuGemmBf16Variant(), CpuGemmAmxVariant(), CpuConv2dAmxVariant(), CpuGemmF16AmxVariant()] + f16_variants() + skinny_variants()
