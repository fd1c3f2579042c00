"""Implicit-GEMM gather for the Hopper kernel: the producer warpgroup builds the A tile of a conv2d
(rows = output pixels (n, p, q), columns = a 128-byte slice of the reduction (r, s, c)) straight from
the NHWC input with ``cp.async`` 16-byte copies into the 128B-swizzled layout ``wgmma`` reads, while
its first thread loads the weight tile with TMA. No im2col buffer exists in global memory.

Why it is simple: when C is a multiple of the 128-byte slice (64 16-bit or 32 fp32 channels), a
K-tile has a single (r, s) and a contiguous channel range, so each tile row is one contiguous
128-byte run of the input (or all zeros in the padding). Other channel counts in whole 16-byte runs
gather chunk by chunk (each chunk's own (r, s); see :func:`producer`). Each of the 128 producer threads owns one
16-byte chunk column and ``bm / 16`` rows; their copies arrive on the stage's ``full`` barrier
through ``cp.async.mbarrier.arrive.noinc`` (the barrier expects 128 such arrivals plus the TMA
thread's ``expect_tx``). Consumers issue ``fence.proxy.async`` after the wait, since ``cp.async``
writes through the generic proxy and ``wgmma`` reads through the async proxy.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracea.ir.ops import Conv2dOp

#: Registers the conv producer warpgroup keeps after ``setmaxnreg`` (row offsets need more than TMA).
PRODUCER_REGS = 56
CONSUMER_REGS = 224


@dataclass(frozen=True)
class ConvGather:
    """The conv geometry the producer bakes in as constants (divisions become multiply-shifts)."""

    c: int
    h: int
    w: int
    p: int
    q: int
    s: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    r: int = 0  # filter rows (bounds the (r, s) of a slice's chunks when C is less than a slice)

    @classmethod
    def of(cls, op: Conv2dOp) -> "ConvGather":
        return cls(op.c, op.h, op.w, op.p, op.q, op.s, tuple(op.stride), tuple(op.padding), tuple(op.dilation),  # type: ignore[arg-type]
                   op.r)


def producer(g: ConvGather, bm: int, bn: int, stages: int, epc: int, split_k: bool = False) -> str:
    """C++ body of the producer warpgroup (all 128 threads; ``bars``/``base``/``tile_origin`` etc. in scope).
    With ``split_k`` it walks the split-K units (``split_unit``: one (tile, K slice) per CTA) instead of whole
    tiles, gathering only the slice's K-tiles.

    C a multiple of the slice: a K-tile is one (r, s) and a channel range, each row one 128-byte run. Any
    other C in whole 16-byte runs (a multiple of 8 16-bit / 4 fp32 channels: 24, 40, 80, 96, 112, 160 ...,
    an RGB stem padded to 16 bytes): the K-tile is the slice of the flat (r, s, c) reduction the KRSC
    weight tile covers too, and each 16-byte chunk of a row lies inside one (r, s) (C being a multiple of
    the chunk), so every producer thread finds the (r, s) and channel of its chunk column; a tile may
    straddle two or more (r, s); chunks past the last (r, s) are zeros (and TMA zero-fills the weight
    tile's columns past R*S*C)."""
    rows = bm // 16
    a_bytes, b_bytes = bm * 128, bn * 128
    bke = 8 * epc                       # reduction elements per 128-byte slice
    (sh, sw), (ph, pw), (dh, dw) = g.stride, g.padding, g.dilation
    small = g.c % bke != 0
    if small and (g.c % epc or not g.r):
        raise ValueError(f"C={g.c}: the gather takes C in whole 16-byte chunks ({epc} channels)")
    chunk_off = "" if small else f" + chunk * {epc}"
    if small:  # the chunk's own (r, s); zeros past R*S
        k_line = f"const int k0 = kt * {bke} + chunk * {epc}, rs = k0 / {g.c}, c0 = k0 - rs * {g.c};"
        rs_ok = f"rs < {g.r * g.s} && "
    else:
        k_line = f"const int k0 = kt * {bke}, rs = k0 / {g.c}, c0 = k0 - rs * {g.c};"
        rs_ok = ""
    if split_k:
        loop = ("        for (int u = 0; ; ++u) {\n            SkUnit w;\n"
                "            if (!split_unit(u, tiles, KT, sk_maxc + 1, w)) break;\n"
                "            const int tile = w.tile, k_first = w.kb, k_end = w.ke;")
    else:
        loop = ("        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {\n"
                "            const int k_first = 0, k_end = KT;")
    return f"""
        asm volatile("setmaxnreg.dec.sync.aligned.u32 {PRODUCER_REGS};");
        const int tid = threadIdx.x, chunk = tid & 7, rsub = tid >> 3;
        const u32 swz = (u32)((chunk ^ (rsub & 7)) * 16);   // 128B swizzle: chunk ^ (row % 8)
        int s = 0; u32 phase = 0;
{loop}
            int m0, n0;
            tile_origin(tile % tiles_mn, tiles_m, tiles_n, m0, n0);
            int off[{rows}], hh[{rows}], ww[{rows}];
            #pragma unroll
            for (int i = 0; i < {rows}; ++i) {{
                const int m = m0 + rsub + 16 * i;
                const int n_img = m / {g.p * g.q}, pq = m - n_img * {g.p * g.q};
                const int p = pq / {g.q}, q = pq - p * {g.q};
                const int h0 = p * {sh} - {ph}, w0 = q * {sw} - {pw};
                hh[i] = m < M ? h0 : -(1 << 20);   // rows past M never pass the bounds test
                ww[i] = w0;
                off[i] = ((n_img * {g.h} + h0) * {g.w} + w0) * {g.c}{chunk_off};
            }}
            for (int kt = k_first; kt < k_end; ++kt) {{
                mbar_wait(bars + 8 * ({stages} + s), phase ^ 1);
                const u32 full = bars + 8 * s;
                const u32 sa = base + s * {a_bytes}, sb = base + {stages * a_bytes} + s * {b_bytes};
                if (tid == 0) {{
                    mbar_expect_tx(full, {b_bytes});
                    tma_load_3d(sb, &tmB, full, kt * {bke}, n0, 0);
                }}
                {k_line}
                const int r = rs / {g.s}, sx = rs - r * {g.s};
                const int dr = r * {dh}, ds = sx * {dw};
                const int delta = (dr * {g.w} + ds) * {g.c} + c0;
                #pragma unroll
                for (int i = 0; i < {rows}; ++i) {{
                    const bool ok = {rs_ok}(unsigned)(hh[i] + dr) < {g.h}u && (unsigned)(ww[i] + ds) < {g.w}u;
                    cp_async16(sa + (rsub + 16 * i) * 128 + swz, X + (ok ? off[i] + delta : 0), ok);
                }}
                asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(full) : "memory");
                if (++s == {stages}) {{ s = 0; phase ^= 1; }}
            }}
        }}
        asm volatile("cp.async.wait_all;" ::: "memory");
        return;"""
