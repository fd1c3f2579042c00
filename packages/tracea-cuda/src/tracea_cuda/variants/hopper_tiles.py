"""Tile width of the Hopper GEMM for grids of a few waves: a 128-row tile of any width that is a multiple of
16 (wgmma's N), chosen so that the tiles fill the SMs' waves, from a cost model of the persistent grid.

Every CTA of the persistent grid runs ``ceil(tiles / SMs)`` tiles one after the other, so the last partial
wave costs a whole one: 512 x 5120 on 128 x 256 tiles is 80 tiles for 132 SMs (61% of the SM time used),
on 128 x 160 tiles 128 tiles (97%). A narrower tile does less work per k-step for the same A tile and the
same fixed costs (wgmma issue, barriers, TMA descriptors), so a 128 x ``bn`` tile is costed as ``bn +``
:data:`TILE_OVERHEAD_COLS` columns per k-step: with 32, a 128 x 256 tile runs 10% faster per column than a
128 x 128 tile, as measured (H100 / H200, the coop kernel, see ``hopper.py``).
"""

from __future__ import annotations

from tracea.ir.ops import GemmOp

#: the fixed per-k-step cost of a 128-row coop tile, in columns of work (see the module docstring)
TILE_OVERHEAD_COLS = 32
#: shared memory the stage ring of the fill heroes may take (the 128x256 / 128x128 / 128x64 heroes'
#: 4 / 6 / 8 stages take 192 KB)
RING_BYTES = 192 * 1024
#: a fill width replaces the rule's tile only when its modelled time is at most this share of the rule's
FILL_GAIN = 0.92
#: fewest rows for the fill rule over compute-bound tiles (widths from 64)
FILL_MIN_ROWS = 256
#: one whole 128-row tile streaming a weight (M = 128, K at least this): when the rule's tile is not split
#: along K, narrower tiles (widths from 32) put more SMs on the weight stream. H200, kernel time vs cuBLAS
#: (``benchmarks/cuda/probe_tile_n.py``): M128 N5120 K5120 128x64 0.79x -> 128x48 0.83x, N4096 K4096
#: 128x64 0.80x -> 128x32 0.85x, N13824 K5120 128x128 0.97x -> 128x112 0.99x, N11008 K4096 128x128 0.95x
#: -> 128x96 0.97x (the model overestimates these gains: the weight stream, not the tile work, bounds them)
WEIGHT_FILL_MIN_K = 1024


def widths(b_kmajor: bool, narrowest: int = 64) -> tuple[int, ...]:
    """Tile widths from ``narrowest`` the kernel serves for 128-row fill tiles: multiples of 16 up to 256 when
    B is K-major (one TMA box of ``bn`` rows), else multiples of the 64-column boxes of an MN-major B."""
    return tuple(bn for bn in range(16, 257, 16) if bn >= narrowest and (b_kmajor or bn % 64 == 0))


def tiles(op: GemmOp, bm: int, bn: int) -> int:
    """Output tiles of ``bm`` x ``bn`` (all batch entries)."""
    return -(-op.m // bm) * -(-op.n // bn) * op.batch


def grid_cost(op: GemmOp, bm: int, bn: int, ctas: int) -> float:
    """Modelled mainloop time of the persistent grid (arbitrary units per k-step): waves x per-tile cost. A
    256 x 128 tile is costed as a 128 x 256 one (same area, both 128 accumulators per consumer thread)."""
    waves = -(-tiles(op, bm, bn) // ctas)
    width = bn * bm // 128 if bm == 256 else bn
    return waves * (width + TILE_OVERHEAD_COLS)


def fill_width(op: GemmOp, ctas: int, b_kmajor: bool, narrowest: int = 80) -> tuple[int, float]:
    """(width, cost) of the cheapest 128-row tile; the wider one on ties (fewer tiles, less A traffic)."""
    best = min(widths(b_kmajor, narrowest), key=lambda bn: (grid_cost(op, 128, bn, ctas), -bn))
    return best, grid_cost(op, 128, best, ctas)


def fill_stages(bn: int, bm: int = 128) -> int:
    """Stages of a fill hero: as many as :data:`RING_BYTES` holds, at most 8."""
    return max(2, min(8, RING_BYTES // ((bm + bn) * 128)))


def fill_tile(op: GemmOp, ctas: int, b_kmajor: bool, current: tuple[int, int]) -> int | None:
    """The width of the 128-row tile that fills the waves better than the rule's ``current`` (bm, bn) tile
    (not split along K) by the margin :data:`FILL_GAIN`, or None (keep it). GEMMs of at least
    :data:`FILL_MIN_ROWS` rows, and of exactly 128 rows over a K of at least :data:`WEIGHT_FILL_MIN_K`
    (widths from 32 there); others (partial row tiles, short K) keep the rule's tile."""
    if op.m >= FILL_MIN_ROWS:
        narrowest = 80  # 128x64 tiles re-read A once per 64 columns: 1000^3 0.69x -> 0.63x cuBLAS (H200)
    elif op.m == 128 and op.k >= WEIGHT_FILL_MIN_K:
        narrowest = 32
    else:
        return None
    if not ctas:
        return None
    bn, cost = fill_width(op, ctas, b_kmajor, narrowest)
    if (128, bn) == current or cost > FILL_GAIN * grid_cost(op, current[0], current[1], ctas):
        return None
    return bn


#: :func:`narrow_fill` applies to 128x256 grids whose waves' SM-slots the tiles fill less than this share of
NARROW_FILL_EFFICIENCY = 0.9
#: the fewest stages of a :func:`narrow_fill` width's ring (:func:`fill_stages`: widths up to 176)
NARROW_FILL_STAGES = 5


def narrow_fill(op: GemmOp, ctas: int, b_kmajor: bool) -> int | None:
    """The width of a 128-row tile with a deep ring (at least :data:`NARROW_FILL_STAGES` stages) that
    replaces the 128x256 tile of a grid of whole waves and a poor last one (the 128x256 tiles fill under
    :data:`NARROW_FILL_EFFICIENCY` of their waves' SM-slots, at least one wave): the cheapest such width by
    :func:`grid_cost`, when it costs less than the 128x256 grid; else None. GEMMs of at least
    :data:`FILL_MIN_ROWS` rows with a K-major B (``x @ W.T``).

    The model alone keeps 128x256 there (a few percent apart), but on an H100 (interleaved with cuBLAS,
    ``benchmarks/cuda/probe_prefill.py --paired``) the deferred 128x256 hero ran M2048 N5632 K2048 (2.7
    waves) at 0.91x cuBLAS kernel time and 128x176 (5 stages, 3.9 waves) at 1.01x, M2048 N11008 K4096
    0.94x against 1.02x; the 4-stage 128x240 / 128x224 widths the model ranked first ran 0.93x / 0.99x. On
    grids that 128x256 fills (M2048 N4096 K11008, M4096 N14336 K4096, M3000 N4096 K4096: >= 97%) 128x176
    ran 4-15% slower, and this rule leaves them."""
    if op.m < FILL_MIN_ROWS or not b_kmajor or not ctas:
        return None
    full = tiles(op, 128, 256)
    if full < ctas or full / (-(-full // ctas) * ctas) >= NARROW_FILL_EFFICIENCY:
        return None
    deep = [bn for bn in widths(b_kmajor, 80) if fill_stages(bn) >= NARROW_FILL_STAGES]
    best = min(deep, key=lambda bn: (grid_cost(op, 128, bn, ctas), -bn))
    return best if grid_cost(op, 128, best, ctas) < grid_cost(op, 128, 256, ctas) else None


#: fill widths :func:`fill_alternatives` offers besides the rule's tile (first-use tuning times the first
#: three heroes, so at most two)
ALTERNATIVES = 2


def fill_alternatives(op: GemmOp, ctas: int, b_kmajor: bool, current: tuple[int, int],
                      exclude: tuple[int, ...] = ()) -> list[int]:
    """Up to :data:`ALTERNATIVES` 128-row tile widths (cheapest first, the wider on ties) that the model
    costs no more than the rule's ``current`` (bm, bn) tile, other than ``current`` and the widths in
    ``exclude``: the alternatives first-use tuning times after the default. GEMMs of at least
    :data:`FILL_MIN_ROWS` rows only (widths from 80).

    The model's cost separates widths by a few percent at most where it matters, less than the run-to-run
    spread of one kernel on an H100 (``benchmarks/cuda/probe_prefill.py``: M1024 N14336 K4096 128x224 (the
    rule's width) 0.86x cuBLAS, 128x176 (costed 2% more) 0.97x; M512 N5120 K5120 128x160 1.08x, 128x176
    1.17x; M2048 N5632 K2048 128x256 0.90x, 128x176 0.93x): the default keeps the rule's tile and tuning
    measures the runners-up."""
    if op.m < FILL_MIN_ROWS or not ctas:
        return []
    limit = grid_cost(op, current[0], current[1], ctas)
    skip = set(exclude) | ({current[1]} if current[0] == 128 else set())
    ranked = sorted(widths(b_kmajor, 80), key=lambda bn: (grid_cost(op, 128, bn, ctas), -bn))
    return [bn for bn in ranked if bn not in skip and grid_cost(op, 128, bn, ctas) <= limit][:ALTERNATIVES]

