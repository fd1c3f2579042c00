"""Loading emitted kernels: render the C source for an (ISA, tile, epilogue) choice, build it through
:mod:`tracea_cpu.toolchain` (disk-cached) and bind the exported functions with ctypes signatures."""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

from tracea.errors import InvalidArgumentError, UnsupportedConfigError
from tracea.ir.epilogue import Epilogue

from . import pool
from .emit.amx import amx_gemm_source
from .emit.attention import attention_source
from .emit.bf16 import bf16_gemm_source
from .emit.bf16_conv import bf16_conv_source
from .emit.blocked import blocked_source
from .isa import AMX_BF16, AVX512_BF16, ISA_BY_NAME, Isa
from .toolchain import build

_L, _P, _I, _F = ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_float

# tr_gemm_route's answers: which driver tr_gemm runs for a shape.
GEMM_ROUTES = {0: "packed", 1: "rows", 2: "gemv", 3: "axpy", 4: "cols"}
GEMM_ARGTYPES = [_L, _L, _L, _L, _P, _L, _L, _L, _P, _L, _L, _L, _P, _L, _L, _P, _L, _L, _L, _I]
CONV_ARGTYPES = [_I] + [_L] * 16 + [_P, _P, _P, _P, _L, _L, _L, _I, _I]
BF16_GEMM_ARGTYPES = [_L, _L, _L, _L, _P, _L, _L, _L, _P, _L, _L, _L, _P, _L, _L, _I, _P, _L, _L, _L, _I]
ATTN_ARGTYPES = [_L, _L, _L, _L, _L, _L, _L, _F, _I, _P, _P, _P, _P, _I, _P, _I, _L, _L, _P, _P, _L]


@functools.lru_cache(maxsize=128)
def blocked_library(isa_name: str, mr: int, nr: int, epilogue_key: str) -> ctypes.CDLL:
    """The GEMM + conv2d library for one ISA, register tile and epilogue chain (compiled once)."""
    isa = ISA_BY_NAME[isa_name]
    source = blocked_source(isa, mr, nr, Epilogue.parse(epilogue_key))
    lib = build(source, isa.cflags, f"blocked-{isa_name}-{mr}x{nr}")
    lib.tr_gemm.argtypes = GEMM_ARGTYPES  # type: ignore[assignment]
    lib.tr_gemm.restype = _I
    lib.tr_gemm_route.argtypes = [_L, _L, _L, _L, _L, _I]
    lib.tr_gemm_route.restype = _I
    lib.tr_conv2d.argtypes = CONV_ARGTYPES  # type: ignore[assignment]
    lib.tr_conv2d.restype = _I
    lib.tr_gemm_call.argtypes = [_P, _P, _P, _P, _P]
    lib.tr_gemm_call.restype = _I
    lib.tr_conv2d_call.argtypes = [_P, _P, _P, _P, _P]
    lib.tr_conv2d_call.restype = _I
    set_caches(lib)
    pool.attach(lib)  # the column driver's workers (None: OpenMP regions; tracea_cpu.pool)
    return lib


def set_caches(lib: ctypes.CDLL) -> None:
    """Tell a blocked library (``tr_set_caches``) the host's per-core L1d and L2 sizes, which its drivers'
    blocking decisions read (see ``tr_drive_cols``); unknown sizes keep the library's defaults."""
    from tracea.doctor.host_plugin import host_profile

    caches = host_profile().caches
    lib.tr_set_caches.argtypes = [_L, _L]
    lib.tr_set_caches.restype = None
    lib.tr_set_caches(int(caches.get("L1d") or 0), int(caches.get("L2") or 0))


def _bind_tb_gemm(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Argument types of the bf16 GEMM entry points (``tb_gemm``, ``tb_gemm_call``) the AVX512_BF16 and
    AMX libraries share."""
    lib.tb_gemm.argtypes = BF16_GEMM_ARGTYPES  # type: ignore[assignment]
    lib.tb_gemm.restype = _I
    lib.tb_gemm_call.argtypes = [_P, _P, _P, _P, _P, _I]
    lib.tb_gemm_call.restype = _I
    return lib


@functools.lru_cache(maxsize=64)
def bf16_gemm_library(mr: int, nr: int, epilogue_key: str) -> ctypes.CDLL:
    """The AVX512_BF16 GEMM library for one register tile and epilogue chain (compiled once)."""
    source = bf16_gemm_source(ISA_BY_NAME["avx512"], mr, nr, Epilogue.parse(epilogue_key))
    lib = build(source, AVX512_BF16.cflags, f"gemm-bf16-{mr}x{nr}")
    return _bind_tb_gemm(lib)


@functools.lru_cache(maxsize=64)
def bf16_conv_library(mr: int, nr: int, epilogue_key: str) -> ctypes.CDLL:
    """The AVX512_BF16 conv library for one register tile and epilogue chain (compiled once): the implicit GEMM
    ``tb_conv``, the direct kernel ``tb_conv_ind`` with its weight packer (``tb_conv_pack_w``, ``tb_conv_bwords``)
    and the layout transposes ``tb_tr16`` / ``tb_tr32``."""
    source = bf16_conv_source(ISA_BY_NAME["avx512"], mr, nr, Epilogue.parse(epilogue_key))
    lib = build(source, AVX512_BF16.cflags, f"conv-bf16-{mr}x{nr}")
    lib.tb_conv.argtypes = [_P, _P, _P, _P, _I, _P, _L, _L, _L, _I]
    lib.tb_conv.restype = _I
    lib.tb_conv_bwords.argtypes = [_L, _L]
    lib.tb_conv_bwords.restype = _L
    lib.tb_conv_pack_w.argtypes = [_P, _L, _L, _P, _I]
    lib.tb_conv_pack_w.restype = _I
    lib.tb_conv_ind.argtypes = [_P, _P, _P, _P, _I, _P, _L, _I]
    lib.tb_conv_ind.restype = _I
    for name in ("tb_tr16", "tb_tr32"):
        getattr(lib, name).argtypes = [_P, _P, _L, _L, _L, _I]
        getattr(lib, name).restype = _I
    return lib


@functools.lru_cache(maxsize=64)
def amx_gemm_library(mr: int, nr: int, epilogue_key: str) -> ctypes.CDLL:
    """The AMX bf16 GEMM library for one MR x NR block of tiles and epilogue chain (compiled once;
    call :func:`tracea_cpu.amx.amx_permission` before running it)."""
    source = amx_gemm_source(ISA_BY_NAME["avx512"], mr, nr, Epilogue.parse(epilogue_key))
    lib = build(source, AMX_BF16.cflags, f"gemm-amx-{mr}x{nr}")
    lib.tf_gemm_split.argtypes = [_P, _P, _P, _P, _P, _I]
    lib.tf_gemm_split.restype = _I
    lib.tb_amx_bwords.argtypes = [_L, _L]
    lib.tb_amx_bwords.restype = _L
    lib.tb_amx_pack_b.argtypes = [_L, _L, _P, _L, _L, _P, _I]
    lib.tb_amx_pack_b.restype = _I
    lib.tb_amx_takes_packed_b.argtypes = [_P, _I]
    lib.tb_amx_takes_packed_b.restype = _I
    lib.tb_gemm_call_pk.argtypes = [_P, _P, _P, _P, _P, _P, _I]
    lib.tb_gemm_call_pk.restype = _I
    return _bind_tb_gemm(lib)


@functools.lru_cache(maxsize=64)
def skinny_library(isa_name: str, epilogue_key: str, widen: bool = False) -> ctypes.CDLL:
    """The skinny GEMM library (``ts_f32_call``; with ``isa_name="avx512bf16"`` also ``ts_bf16_call``; with
    ``widen`` and ``avx2`` / ``avx512`` also ``ts_bw_call``, bf16 widened to fp32) for one ISA and epilogue
    chain (compiled once; see :mod:`.emit.skinny`)."""
    from .emit.skinny import skinny_source

    bf16 = isa_name == AVX512_BF16.name
    isa = AVX512_BF16 if bf16 else ISA_BY_NAME[isa_name]
    tag = f"skinny-bw-{isa_name}" if widen else f"skinny-{isa_name}"
    lib = build(skinny_source(isa, Epilogue.parse(epilogue_key), bf16, widen), isa.cflags, tag)
    entries = [lib.ts_f32_call] + ([lib.ts_bf16_call] if bf16 else []) + ([lib.ts_bw_call] if widen else [])
    for fn in entries:
        fn.argtypes = [_P, _P, _P, _P, _P]
        fn.restype = _I
    return lib


@functools.lru_cache(maxsize=4)
def int8_linear_library() -> ctypes.CDLL:
    """The AMX int8 linear library (``ti_linear``; compiled once; call
    :func:`tracea_cpu.amx.amx_permission` before running it)."""
    from .emit.amx_int8 import int8_linear_source
    from .emit.bf16 import T16
    from .emit.common import prologue
    from .isa import AMX_INT8

    lib = build(int8_linear_source(prologue(ISA_BY_NAME["avx512"]), T16), AMX_INT8.cflags, "linear-int8-amx")
    lib.ti_linear.argtypes = [_L, _L, _L, _P, _L, _P, _L, _P, _P, _P, _L, _I]
    lib.ti_linear.restype = _I
    lib.ti_linear_vnni.argtypes = [_L, _L, _L, _P, _L, _P, _L, _P, _P, _P, _P, _L, _I]
    lib.ti_linear_vnni.restype = _I
    return lib


@functools.lru_cache(maxsize=1)
def int8_vnni_library() -> ctypes.CDLL:
    """The AVX512-VNNI int8 linear library (``ti_linear_vnni`` alone, no AMX code) for CPUs without
    usable AMX-INT8 (compiled once)."""
    from .emit.int8_vnni import QUANT, vnni_source
    from .emit.common import prologue
    from .isa import AVX512_VNNI

    lib = build("\n".join([prologue(ISA_BY_NAME["avx512"]), QUANT, vnni_source()]), AVX512_VNNI.cflags,
                "linear-int8-vnni")
    lib.ti_linear_vnni.argtypes = [_L, _L, _L, _P, _L, _P, _L, _P, _P, _P, _P, _L, _I]
    lib.ti_linear_vnni.restype = _I
    return lib


@functools.lru_cache(maxsize=64)
def amx_conv_library(mr: int, nr: int, epilogue_key: str) -> ctypes.CDLL:
    """The AMX bf16 conv2d library (``tc_conv2d``, ``tc_pack_w``, ``tc_wpack_words``) for one MR x NR
    block of tiles and epilogue chain (compiled once; call :func:`tracea_cpu.amx.amx_permission` before
    running it)."""
    from .emit.amx_conv import amx_conv_source

    source = amx_conv_source(ISA_BY_NAME["avx512"], mr, nr, Epilogue.parse(epilogue_key))
    lib = build(source, AMX_BF16.cflags, f"conv-amx-{mr}x{nr}")
    lib.tc_conv2d.argtypes = [_P, _P, _P, _P, _P, _P]
    lib.tc_conv2d.restype = _I
    lib.tc_pack_w.argtypes = [_P, _P, _P]
    lib.tc_pack_w.restype = _I
    lib.tc_wpack_words.argtypes = [_P]
    lib.tc_wpack_words.restype = _L
    return lib


@functools.lru_cache(maxsize=64)
def f16_gemm_library(isa_name: str, mr: int, nr: int, epilogue_key: str, bf16: bool = False) -> ctypes.CDLL:
    """The converting 16-bit GEMM library of one x86 ISA, register tile and epilogue (compiled once): fp16
    (``tr_gemm_f16``, F16C) or, with ``bf16``, bf16 (``tr_gemm_bf16c``); both widen while packing and run
    the fp32 micro-kernel. ``half_gemm_entry`` gives the entry point."""
    from .emit.f16 import bf16c_gemm_source, f16_gemm_source

    isa = ISA_BY_NAME[isa_name]
    source = (bf16c_gemm_source if bf16 else f16_gemm_source)(isa, mr, nr, Epilogue.parse(epilogue_key))
    lib = build(source, isa.cflags + (() if bf16 else ("-mf16c",)),
                f"gemm-{'bf16c' if bf16 else 'f16'}-{isa_name}-{mr}x{nr}")
    fn = half_gemm_entry(lib, bf16)
    fn.argtypes = [_L, _L, _L, _L, _P, _L, _L, _P, _L, _L, _P, _I, _P, _L, _L, _L, _I]
    fn.restype = _I
    return lib


def half_gemm_entry(lib: ctypes.CDLL, bf16: bool) -> Any:
    """The GEMM entry point of a :func:`f16_gemm_library` library."""
    return lib.tr_gemm_bf16c if bf16 else lib.tr_gemm_f16


@functools.lru_cache(maxsize=8)
def bf16_cast_library(isa_name: str) -> ctypes.CDLL:
    """``tr_bf16_widen`` / ``tr_bf16_round`` and ``tr_f16_widen`` / ``tr_f16_round`` (16-bit <-> fp32 arrays)
    built for one x86 ISA with F16C (compiled once)."""
    from .emit.bf16_cast import CAST

    lib = build(CAST, ISA_BY_NAME[isa_name].cflags + ("-mf16c",), f"bf16-cast-{isa_name}")
    for fn in (lib.tr_bf16_widen, lib.tr_bf16_round, lib.tr_f16_widen, lib.tr_f16_round):
        fn.argtypes = [_P, _P, _L, _I]
        fn.restype = None
    return lib


class Bf16Call(ctypes.Structure):
    """``tb_call``: the constants of one bf16 GEMM (op shape, operand strides, blocks) for ``tb_gemm_call``."""

    _fields_ = [(n, _L) for n in ("batch", "M", "N", "K", "rsa", "csa", "rsb", "csb", "mc", "nc", "kc")] + \
        [("out_bf16", _I)]


@functools.lru_cache(maxsize=64)
def attention_library(isa_name: str, bq: int, bk: int, kb: int = 256, elem: str = "f32",
                      dot: bool = False) -> ctypes.CDLL:
    """The attention library for one ISA, query/key register block, softmax key block and element type
    (``"f32"``, ``"bf16"``, ``"f16"``; ``dot``: bf16 Q K^T on ``vdpbf16ps``, built for AVX512_BF16; compiled
    once)."""
    isa = ISA_BY_NAME[isa_name]
    tag = ("" if elem == "f32" else f"-{elem}") + ("-dot" if dot else "")
    flags = AVX512_BF16.cflags if dot else isa.cflags
    lib = build(attention_source(isa, bq, bk, kb, elem, dot), flags, f"attention-{isa_name}-{bq}x{bk}-{kb}{tag}")
    lib.tr_attention.argtypes = ATTN_ARGTYPES  # type: ignore[assignment]
    lib.tr_attention.restype = _I
    lib.tr_attention_call.argtypes = [_P, _F, _P, _P, _P, _P, _P, _P]
    lib.tr_attention_call.restype = _I
    return lib


#: largest mc / nc / kc cache block a config may ask for (the spaces offer at most 8192; the C
#: drivers round blocks up with ``long`` arithmetic, which overflows near 2**63 and then never ends).
MAX_BLOCK = 1 << 16


def max_threads() -> int:
    """Most threads one call may use: 4 per core, at least 64, at most 1024. OpenMP given a million
    threads (a damaged config) dies creating them, and every thread gets its own packing buffer."""
    return min(1024, max(64, 4 * (os.cpu_count() or 1)))


def call_params(names: tuple[str, ...], values: dict[str, int]) -> ctypes.Array:
    """The ``long`` parameter block of a ``*_call`` entry point (see :mod:`.emit.calls`), in ``names``
    order; every name must be given."""
    return (_L * len(names))(*(int(values[n]) for n in names))


def thread_count(requested: int, cores: int) -> int:
    """Threads for one call: the config's ``threads`` when positive, else ``$TRACEA_NUM_THREADS``,
    else every usable core. A config asking for more than :func:`max_threads` is refused
    (UnsupportedConfigError); the environment variable is capped at it."""
    limit = max_threads()
    if requested and requested > 0:
        if requested > limit:
            raise UnsupportedConfigError(f"threads={requested} exceeds the limit of {limit} threads per call",
                                         reason=f"threads > {limit}")
        return int(requested)
    env = os.environ.get("TRACEA_NUM_THREADS")
    if env:
        try:
            value = int(env)
        except ValueError:
            raise InvalidArgumentError("TRACEA_NUM_THREADS", env, "a positive integer") from None
        if value <= 0:
            raise InvalidArgumentError("TRACEA_NUM_THREADS", env, "a positive integer")
        return min(value, limit)
    return max(1, min(cores, limit))


def check_tile(isa: Isa, mr: int, nr: int) -> str | None:
    """Why an mr x nr register tile cannot be emitted for ``isa`` (None when it can)."""
    if mr <= 0 or nr <= 0:
        return f"tile {mr}x{nr} must be positive"
    if nr % isa.width:
        return f"nr={nr} is not a multiple of the {isa.name} vector width {isa.width}"
    if not isa.fits(mr, nr):
        return f"tile {mr}x{nr} needs more than {isa.name}'s {isa.registers} vector registers"
    return None
