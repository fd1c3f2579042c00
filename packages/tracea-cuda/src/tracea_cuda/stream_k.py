"""Stream-K work split of the persistent Hopper GEMM (the host side and a Python mirror of the kernel's
``sk_unit``).

A persistent grid of G CTAs walking T tiles in waves leaves ``T mod G`` tiles for a last, partial wave
(4096^3 in 128x256 tiles on 132 SMs: 512 = 3 x 132 + 116, so 16 SMs idle for a quarter of the run).
Stream-K gives every CTA an equal share of the k-iterations of the last tiles instead: CTA b runs its
data-parallel tiles, then iterations ``[b*I/G, (b+1)*I/G)`` of the ``I = sk_tiles * KT`` iterations of
the last ``sk_tiles`` tiles. The piece of a tile holding its k-iteration 0 is the tile's *owner*: it adds
the fp32 partial sums stored by the tile's other pieces (*contributors*) and runs the epilogue.

:func:`split_units` mirrors the split-K kernel's unit order (``split_k`` configs: few tiles, every tile
cut into the same number of K slices, one per CTA; see docs/backends/cuda.md, "Split-K for few tiles").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class StreamKPlan:
    """``sk_tiles`` tiles split along K (0: plain data-parallel); ``max_contributors`` partial-sum slots
    per split tile."""

    sk_tiles: int
    max_contributors: int


@lru_cache(maxsize=1024)
def plan(tiles: int, ctas: int, k_iters: int) -> StreamKPlan:
    """Which tiles to split. Only grids of two full waves or more, with a partial last wave: the last
    ``T mod G`` tiles when they fill at least half a wave, else those plus one full wave (so no CTA's
    share is tiny); every share holds at least one k-iteration."""
    rem = tiles % ctas if ctas else 0
    if ctas <= 0 or tiles < 2 * ctas or rem == 0:
        return StreamKPlan(0, 0)
    sk = rem if 2 * rem >= ctas else rem + ctas
    total = sk * k_iters
    if total < ctas:
        return StreamKPlan(0, 0)
    most = max(_cta_of(t * k_iters + k_iters - 1, ctas, total) - _cta_of(t * k_iters, ctas, total)
               for t in range(sk))
    return StreamKPlan(sk, most)


def _cta_of(it: int, ctas: int, total: int) -> int:
    """The CTA whose share holds stream-K iteration ``it`` (shares [b*I/G, (b+1)*I/G))."""
    return ((it + 1) * ctas - 1) // total


def units(b: int, tiles: int, ctas: int, k_iters: int, sk_tiles: int) -> list[tuple[int, int, int, bool, int, int]]:
    """CTA ``b``'s work in order, as the kernel walks it: (tile, k_begin, k_end, owner, contributors,
    contributor slot or -1)."""
    dp = tiles - sk_tiles
    out = [(t, 0, k_iters, True, 0, -1) for t in range(b, dp, ctas)]
    if not sk_tiles:
        return out
    total = sk_tiles * k_iters
    s, e = b * total // ctas, (b + 1) * total // ctas
    t = s // k_iters
    while s < e and t * k_iters < e:
        tb = t * k_iters
        owner, last = _cta_of(tb, ctas, total), _cta_of(tb + k_iters - 1, ctas, total)
        out.append((dp + t, max(s, tb) - tb, min(e, tb + k_iters) - tb, b == owner, last - owner, b - owner - 1))
        t += 1
    return out


def split_units(b: int, tiles: int, ctas: int, k_iters: int, splits: int) -> list[tuple[int, int, int, int]]:
    """Python mirror of the split-K kernel's ``split_unit``: CTA ``b``'s work as (tile, k_begin, k_end,
    slice); unit g is slice ``splits - 1 - g // tiles`` of tile ``g % tiles`` and CTA b runs b, b + G, ...
    (the host makes tiles x splits <= G: one unit per CTA). The 16-row block r of the consumer warps
    (8 per tile) is reduced and stored by slice ``r % splits``."""
    return [(g % tiles, s * k_iters // splits, (s + 1) * k_iters // splits, s)
            for g in range(b, tiles * splits, ctas) for s in (splits - 1 - g // tiles,)]
