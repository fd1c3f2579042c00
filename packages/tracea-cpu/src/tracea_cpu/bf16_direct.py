"""The direct form of the AVX512_BF16 GEMM (config param ``direct=1`` of ``cpu.gemm.avx512bf16``) for
``x @ W.T`` against an (N, K) weight -- ``nn.Linear`` / ``F.linear`` in bf16: the direct conv kernel of
:mod:`.emit.bf16_conv` with one 1x1 tap (A's rows read in place, all of K per MR x NR register tile, no partial
sums) and the weight packed once into VNNI panels, kept per unchanged torch weight (:mod:`.panel_cache`).

Why: the blocked driver packs A and B on every call; 2-core Zen 4 VM, torch 2.13 CPU, ``F.linear`` shapes
512x4096x4096 / 512x512x512: 0.83-0.87x torch with every blocked config tried (kc 512-4096, mc 28-192, 4x64 /
6x64 / 14x32 tiles), where the same register tile reading its A in place (the conv kernel) ran 416-451 GFLOP/s.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

import numpy as np

from tracea.dtypes import DType
from tracea.ir.ops import GemmOp

from . import kernels
from .panel_cache import PANELS
from .variant_base import _check_rc

#: a kernel entry on addresses: ``run(x, w_obj, w, bias32, out, nth)`` (``w_obj``: the weight object, for the panel
#: cache; ``bias32``: an fp32 bias address or 0)
Runner = Callable[[int, Any, int, int, int, int], None]


def direct_ok(op: GemmOp) -> bool:
    """Whether the direct form computes ``op``: A (M, K) row-major, B an (N, K) weight (``trans_b``), one batch
    entry, K even (a k pair is one 32-bit word of an A row)."""
    return op.trans_b and not op.trans_a and op.batch == 1 and op.k % 2 == 0 and op.k > 0


def kept_panels(geometry: tuple, w_obj: Any, w: int, words: int, pack: Callable[[int], Any]) -> tuple[Any, int]:
    """``(holder, address)`` of weight ``w``'s panels (``words`` uint32 words that ``pack(address)`` writes): kept per
    unchanged torch weight (:data:`~tracea_cpu.panel_cache.PANELS`), else packed now into a new buffer. Hold
    ``holder`` until the kernel reading the panels has returned."""
    cached = PANELS.panels(geometry, w_obj, w, words, pack)
    if cached is not None:
        return cached
    buf = np.empty(max(words, 16), np.uint32)
    pack(buf.ctypes.data)
    return buf, buf.ctypes.data


def direct_launcher(op: GemmOp, mr: int, nr: int, mb: int) -> Runner:
    """``launch(a, b_obj, b, bias32, out, nth)`` on data addresses (``b_obj``: the weight object, for the panel
    cache; ``bias32``: an fp32 bias address or 0)."""
    lib = kernels.bf16_conv_library(mr, nr, op.epilogue.key)
    geo = (ctypes.c_long * 15)(1, op.m, 1, op.k, op.n, op.m, 1, 1, 1, 1, 1, 0, 0, 1, 1)
    words = int(lib.tb_conv_bwords(op.n, op.k))
    geometry = ("bf16gemm-vnni", nr, op.n, op.k)
    out_b16 = int(op.out_dtype is DType.BF16)
    pack, run = lib.tb_conv_pack_w, lib.tb_conv_ind

    def launch(a: int, b_obj: Any, b: int, bias32: int, out: int, nth: int) -> None:
        held, wp = kept_panels(geometry, b_obj, b, words, lambda addr: pack(b, op.n, op.k, addr, nth))
        rc = run(geo, a, wp, out, out_b16, bias32 or None, mb, nth)
        del held  # the panels: alive until the kernel has returned
        _check_rc(rc, "bf16 gemm (direct)")

    return launch


def pointer_launcher(run: Runner, adapter: Any, has_bias: bool, widen: bool, pick: Callable[[], int]) -> Any:
    """The pointer-only launcher ``launch(x, w, bias, out)`` of ``run``: the bias (in the output dtype) as fp32 for
    the epilogue -- a bf16 one widened (``widen``) -- held until the kernel has returned."""
    from .bf16 import widened_bias  # noqa: PLC0415

    ptr = adapter.data_ptr

    def launch(x: Any, w: Any, bias: Any, out: Any) -> None:
        b32 = None
        if has_bias:
            b32 = widened_bias(adapter, bias) if widen else np.ascontiguousarray(adapter.to_numpy(bias), np.float32)
        run(ptr(x), w, ptr(w), 0 if b32 is None else b32.ctypes.data, ptr(out), pick())

    launch.pointer_only = True  # type: ignore[attr-defined]
    return launch
