"""CUDA C++ templates of the Hopper GEMM's stream-K split (rendered by :mod:`.wgmma`; the host plan and
its Python mirror are in :mod:`tracea_cuda.stream_k`)."""

from __future__ import annotations

import textwrap

# Stream-K: CTA b runs its data-parallel tiles (b, b + G, ... below tiles - sk_tiles), then its share
# [b I / G, (b + 1) I / G) of the I = sk_tiles * KT k-iterations of the last sk_tiles tiles. A tile's
# piece holding k-iteration 0 is its owner (always the last piece of a CTA's share); the other pieces
# (contributors, each the first piece of a later CTA's share) store fp32 partial sums, which the owner
# adds before the epilogue. The host makes every share non-empty (I >= G).
SK_UNIT = r"""
struct SkUnit { int tile, kb, ke, owner, ncon, cslot; };
static __device__ __forceinline__ bool sk_unit(int u, int tiles, int KT, int sk_tiles, SkUnit& w) {
    const int G = gridDim.x, b = blockIdx.x, dp = tiles - sk_tiles;
    const int n_dp = b < dp ? (dp - 1 - b) / G + 1 : 0;
    if (u < n_dp) { w.tile = b + u * G; w.kb = 0; w.ke = KT; w.owner = 1; w.ncon = 0; w.cslot = -1; return true; }
    if (sk_tiles == 0) return false;
    const long long I = (long long)sk_tiles * KT, s = b * I / G, e = (b + 1) * I / G;
    const long long t = s / KT + (u - n_dp), tb = t * KT;
    if (s >= e || tb >= e) return false;
    const int owner_b = (int)(((tb + 1) * G - 1) / I), last_b = (int)(((tb + KT) * G - 1) / I);
    w.tile = dp + (int)t; w.kb = (int)(max(s, tb) - tb); w.ke = (int)(min(e, tb + KT) - tb);
    w.owner = b == owner_b; w.ncon = last_b - owner_b; w.cslot = b - owner_b - 1;
    return true;
}
"""

# The partial-sum exchange of a warpgroup's accumulators with an fp32 slot (float4 runs coalesced over the
# warpgroup), shared by split-K and stream-K: store d to ``slot``, and add ``slot`` into d.
_STORE_PARTIALS = """\
#pragma unroll
for (int sub = 0; sub < {subs}; ++sub)
    #pragma unroll
    for (int i = 0; i < {regs}; i += 4)
        asm volatile("st.global.cg.v4.f32 [%0], {{%1, %2, %3, %4}};"
                     :: "l"(slot + ((sub * {regs} + i) * 128 + tid * 4)), "f"(d[sub][i]), "f"(d[sub][i + 1]),
                        "f"(d[sub][i + 2]), "f"(d[sub][i + 3]) : "memory");
"""
_ADD_PARTIALS = """\
#pragma unroll
for (int sub = 0; sub < {subs}; ++sub)
    #pragma unroll
    for (int i = 0; i < {regs}; i += 4) {{
        float x0, x1, x2, x3;
        asm volatile("ld.global.cg.v4.f32 {{%0, %1, %2, %3}}, [%4];"
                     : "=f"(x0), "=f"(x1), "=f"(x2), "=f"(x3)
                     : "l"(slot + ((sub * {regs} + i) * 128 + tid * 4)) : "memory");
        d[sub][i] += x0; d[sub][i + 1] += x1; d[sub][i + 2] += x2; d[sub][i + 3] += x3;
    }}
"""


def _indented(fragment: str, spaces: int) -> str:
    """``fragment`` with every line indented by ``spaces`` (where a template places it)."""
    return textwrap.indent(fragment, " " * spaces)


# Split-K (few output tiles): every tile's K range is cut into S = sk_maxc + 1 slices, one unit each, and
# the host makes tiles x S <= the resident grid, so every CTA runs exactly one unit and all S pieces of a
# tile run at once (they wait for each other). Unit g is slice S - 1 - g / tiles of tile g % tiles; the
# host keeps S <= KT (no empty slice).
SPLIT_UNIT = r"""
struct SkUnit { int tile, kb, ke, owner, ncon, cslot; };
static __device__ __forceinline__ bool split_unit(int u, int tiles, int KT, int S, SkUnit& w) {
    const long long g = blockIdx.x + (long long)u * gridDim.x;
    if (g >= (long long)tiles * S) return false;
    const int slice = S - 1 - (int)(g / tiles);
    w.tile = (int)(g % tiles);
    w.kb = (int)((long long)slice * KT / S); w.ke = (int)((long long)(slice + 1) * KT / S);
    w.owner = slice == 0; w.ncon = S - 1; w.cslot = slice;
    return true;
}
"""

# The split-K exchange shares the reduction among the S pieces of a tile: consumer warp r (its 16-row
# block, r = 4 wg + warp) of slice r mod S reduces and stores those rows. Every piece first stores the fp32
# partial sums of the row blocks it does not reduce (slot [tile][slice][wg], float4 runs coalesced over
# the warpgroup), bumps the tile's counter and waits until all S pieces have arrived (the last piece to
# leave that wait, counted by a second counter, sets both back to zero: counters left at zero by every
# launch can live in a buffer that outlasts it, see launcher.split_scratch); then each warp that
# reduces adds the other S - 1 partial sums of its rows and runs the epilogue, the others skip it. Every
# piece reads at most (S - 1) / S of one tile (the owner of a stream-K tile reads S - 1 tiles).
SPLIT_FIXUP = ("""        bool sk_mine = true;  // this warp stores its rows in the epilogue
        if (sk_maxc > 0) {{
            const int tid = threadIdx.x % 128, S = sk_maxc + 1, slice = w.cslot;
            sk_mine = (wg * 4 + warp) % S == slice;
            unsigned* flag = sk_flags + 2 * tile + wg;
            float* tslot = sk_ws + ((long long)tile * S * 2 + wg) * {nreg} * 128;
            if (!sk_mine) {{
                float* slot = tslot + (long long)slice * 2 * {nreg} * 128;
{store16}                __threadfence();
            }}
            named_bar_sync(1 + wg);
            if (tid == 0) {{
                u32 seen;
                asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(flag) : "memory");
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(flag) : "memory");
                while (seen < (u32)S) {{
                    __nanosleep(64);
                    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(flag) : "memory");
                }}
                // departures (a second counter per tile and warpgroup, 2 * sk_tiles words on): the last piece
                // out has seen every other leave its wait, so it re-zeroes both for the next launch
                unsigned* gone = flag + 2 * sk_tiles;
                if (atomicAdd(gone, 1u) == (unsigned)(S - 1)) {{ *flag = 0u; *gone = 0u; }}
            }}
            named_bar_sync(1 + wg);
            if (sk_mine) {{
                for (int q = 0; q < S; ++q) {{
                    if (q == slice) continue;
                    const float* slot = tslot + (long long)q * 2 * {nreg} * 128;
{add20}                }}
            }}
        }}
""").replace("{store16}", _indented(_STORE_PARTIALS, 16)).replace("{add20}", _indented(_ADD_PARTIALS, 20))

SK_FIXUP = ("""        if (w.cslot >= 0 || w.ncon > 0) {{  // a stream-K piece: exchange fp32 partial sums with the owner
            const int tid = threadIdx.x % 128, t_local = tile - (tiles - sk_tiles);
            unsigned* flag = sk_flags + 2 * t_local + wg;
            if (!w.owner) {{
                float* slot = sk_ws + ((long long)(t_local * sk_maxc + w.cslot) * 2 + wg) * {nreg} * 128;
{store16}                __threadfence();
                named_bar_sync(1 + wg);
                if (tid == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(flag) : "memory");
                continue;
            }}
            if (tid == 0) {{
                u32 seen;
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(flag) : "memory");
                while (seen < (u32)w.ncon) {{
                    __nanosleep(128);
                    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(flag) : "memory");
                }}
                *flag = 0u;  // reset for the next launch (every contributor has arrived)
            }}
            named_bar_sync(1 + wg);
            for (int c = 0; c < w.ncon; ++c) {{
                const float* slot = sk_ws + ((long long)(t_local * sk_maxc + c) * 2 + wg) * {nreg} * 128;
{add16}            }}
        }}
""").replace("{store16}", _indented(_STORE_PARTIALS, 16)).replace("{add16}", _indented(_ADD_PARTIALS, 16))
