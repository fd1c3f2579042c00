"""Operand address maps: where element (row, k) of an operand tile lives in global memory, and where
an output element is stored. GEMM and implicit-GEMM conv2d differ only here.

A map's ``address`` is a C snippet run inside the tile loader with ``mi``/``ni`` (the output row or
column index), ``ki`` (reduction index), ``g`` (the operand's base pointer) and ``M, N, K`` in scope;
it sets ``valid`` and ``src``. Conv geometry is baked in as constants so divisions become
multiply-shifts.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracea.ir.ops import Conv2dOp, Layout


@dataclass(frozen=True)
class OperandMap:
    """One input operand of the tile loop.

    :param k_major: the reduction index is contiguous (shared-memory rows hold tile_k elements).
    :param vectorized: 16-byte chunks along the contiguous axis are all-valid or all-invalid and
        16-byte aligned, so ``cp.async.cg`` 16-byte copies may be used.
    :param address: C code setting ``valid`` and ``src``.
    :param batch_stride: C expression of elements between batches.
    """

    k_major: bool
    vectorized: bool
    address: str
    batch_stride: str = "0"


@dataclass(frozen=True)
class StoreMap:
    """Where output (row, col) goes. ``kind`` is ``rowmajor`` (row*N + col) or ``nchw``."""

    kind: str
    pairs: bool = False
    geometry: tuple[int, int] = (0, 0)  # (P*Q, K) for nchw
    batch_stride: str = "(long long)M * N"

    @property
    def helpers(self) -> str:
        return ""

    def render(self, tout: str, cvt: str) -> str:
        c0, c1 = cvt.format(v="v0"), cvt.format(v="v1")
        if self.kind == "nchw":
            pq, _ = self.geometry
            return (f"{{ const int n_img = row / {pq}, pq = row % {pq};"
                    f" {tout}* p = C + ((long long)n_img * N + col) * {pq} + pq;"
                    f" if (col < N) p[0] = {c0}; if (col + 1 < N) p[{pq}] = {c1}; }}")
        scalar = f"if (col < N) p[0] = {c0}; if (col + 1 < N) p[1] = {c1};"
        if not self.pairs:
            return f"{{ {tout}* p = C + (long long)row * N + col; {scalar} }}"
        if tout == "float":
            vec = 'asm volatile("st.global.v2.f32 [%0], {%1,%2};" :: "l"(p), "f"(v0), "f"(v1));'
        else:
            vec = f"*reinterpret_cast<u32*>(p) = (u32){c0} | ((u32){c1} << 16);"
        return (f"{{ {tout}* p = C + (long long)row * N + col;"
                f" if (col + 1 < N) {{ {vec} }} else {{ {scalar} }} }}")


def gemm_a(trans_a: bool, vectorized: bool) -> OperandMap:
    """GEMM A: (M, K) row-major, or (K, M) when ``trans_a``."""
    if trans_a:
        addr = "valid = ki < K && mi < M; src = g + (long long)ki * M + mi;"
    else:
        addr = "valid = mi < M && ki < K; src = g + (long long)mi * K + ki;"
    return OperandMap(not trans_a, vectorized, addr, "(long long)M * K")


def gemm_b(trans_b: bool, vectorized: bool) -> OperandMap:
    """GEMM B: (K, N) row-major, or (N, K) when ``trans_b``."""
    if trans_b:
        addr = "valid = ni < N && ki < K; src = g + (long long)ni * K + ki;"
    else:
        addr = "valid = ki < K && ni < N; src = g + (long long)ki * N + ni;"
    return OperandMap(trans_b, vectorized, addr, "(long long)K * N")


def conv_input(op: Conv2dOp, vectorized: bool) -> OperandMap:
    """Implicit-GEMM A of a conv: row m = (n, p, q), column k = (r, s, c) for NHWC or (c, r, s) for NCHW."""
    pq, q_, s_, rs = op.p * op.q, op.q, op.s, op.r * op.s
    (sh, sw), (ph, pw), (dh, dw) = op.stride, op.padding, op.dilation
    pix = (f"const int n_img = mi / {pq}, pq = mi % {pq}, p = pq / {q_}, q = pq % {q_};"
           f" const int h = p * {sh} - {ph} + r * {dh}, w = q * {sw} - {pw} + s * {dw};"
           f" valid = mi < M && ki < K && (unsigned)h < {op.h}u && (unsigned)w < {op.w}u;")
    if op.layout is Layout.NHWC:
        addr = (f"const int rs = ki / {op.c}, c = ki % {op.c}, r = rs / {s_}, s = rs % {s_}; {pix}"
                f" src = g + (((long long)n_img * {op.h} + h) * {op.w} + w) * {op.c} + c;")
        return OperandMap(True, vectorized, addr)
    addr = (f"const int c = ki / {rs}, rs = ki % {rs}, r = rs / {s_}, s = rs % {s_}; {pix}"
            f" src = g + (((long long)n_img * {op.c} + c) * {op.h} + h) * {op.w} + w;")
    return OperandMap(False, vectorized and pixels_contiguous(op), addr)


def pixels_contiguous(op: Conv2dOp) -> bool:
    """NCHW 1x1, stride 1, no padding: im2col rows of one channel are the input plane itself, so
    16-byte runs of output pixels are 16-byte runs of the input (when P*Q is a multiple of 4)."""
    return (op.layout is Layout.NCHW and (op.r, op.s) == (1, 1) and tuple(op.stride) == (1, 1)
            and tuple(op.padding) == (0, 0) and (op.p * op.q) % 4 == 0)


def pointwise_nchw(op: Conv2dOp) -> bool:
    """NCHW 1x1, stride 1, no padding, any plane size: a GEMM per image, out[n] = W @ x[n]."""
    return (op.layout is Layout.NCHW and (op.r, op.s) == (1, 1) and tuple(op.stride) == (1, 1)
            and tuple(op.padding) == (0, 0))


def conv_weight(op: Conv2dOp, vectorized: bool) -> OperandMap:
    """Conv weights as GEMM B: (K_out, C*R*S) row-major (KCRS or KRSC flattened) = k-major."""
    return OperandMap(True, vectorized, "valid = ni < N && ki < K; src = g + (long long)ni * K + ki;")


def conv_output(op: Conv2dOp, pairs: bool) -> StoreMap:
    """Conv output: NHWC is the GEMM's (M, K_out) row-major; NCHW scatters per channel plane."""
    if op.layout is Layout.NHWC:
        return StoreMap("rowmajor", pairs, batch_stride="0")
    return StoreMap("nchw", False, (op.p * op.q, op.k), batch_stride="0")
