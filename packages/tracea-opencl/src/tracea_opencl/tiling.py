"""The work decomposition of the OpenCL GEMM/conv kernels, read from a :class:`PipelineConfig`.

One work-group computes a ``tile_m x tile_n`` block of C with ``wg_m x wg_n`` work-items; each work-item
holds an ``rm x rn`` register tile (``rm = tile_m / wg_m``, ``rn = tile_n / wg_n``). Its rows are strided
by ``wg_m``; its columns come in groups of ``vw`` adjacent columns (one vector load/store), groups
strided by ``wg_n * vw``, so neighbouring work-items touch neighbouring addresses (coalesced on GPUs,
one SIMD vector across work-items on CPU runtimes that vectorize along dimension 0).

``raster=G`` (> 0) reorders work-groups so that consecutive groups walk G row-blocks down one column
panel before moving right (grouped ordering): the B panel stays in cache while A streams.

``pack=1`` (direct kernels) copies B into contiguous column panels first (see pack.py).

``local=1`` stages ``tile_k``-deep slices of A and B in local memory (barrier-synchronised work-group
blocking, the GPU design); ``local=0`` reads operands straight from global memory through the caches
and unrolls the k loop ``tile_k`` times (the better design on CPU runtimes, where local memory is
ordinary cached memory and barriers cost a fibre switch).
"""

from __future__ import annotations

from dataclasses import dataclass

from tracea.semantic.config import PipelineConfig

#: Accumulators one work-item may hold; larger register tiles spill on every device we know.
MAX_ACCUMULATORS = 512
VECTOR_WIDTHS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class Tiling:
    """Tile sizes and work-group shape of one kernel instance (see the module docstring)."""

    tile_m: int
    tile_n: int
    tile_k: int
    wg_m: int
    wg_n: int
    vw: int
    local: bool
    raster: int = 0
    pack: bool = False

    @classmethod
    def from_config(cls, config: PipelineConfig) -> "Tiling":
        return cls(tile_m=config.tile_m, tile_n=config.tile_n, tile_k=config.tile_k,
                   wg_m=int(config.get("wg_m", 8)), wg_n=int(config.get("wg_n", 8)),
                   vw=int(config.get("vw", 1)), local=bool(config.get("local", 1)),
                   raster=int(config.get("raster", 0)), pack=bool(config.get("pack", 0)))

    @property
    def rm(self) -> int:
        return self.tile_m // self.wg_m

    @property
    def rn(self) -> int:
        return self.tile_n // self.wg_n

    @property
    def work_group_size(self) -> int:
        return self.wg_m * self.wg_n

    @property
    def local_bytes(self) -> int:
        """Local memory one work-group uses (float staging of A and B slices)."""
        return 4 * self.tile_k * (self.tile_m + self.tile_n) if self.local else 0

    def problems(self) -> list[str]:
        """Why this tiling cannot be rendered (empty when it can)."""
        out = []
        if self.wg_m <= 0 or self.wg_n <= 0:
            out.append(f"work-group shape {self.wg_m}x{self.wg_n} must be positive")
            return out
        if self.tile_m % self.wg_m:
            out.append(f"tile_m={self.tile_m} is not a multiple of wg_m={self.wg_m}")
        if self.tile_n % (self.wg_n * self.vw):
            out.append(f"tile_n={self.tile_n} is not a multiple of wg_n*vw={self.wg_n * self.vw}")
        if self.pack and self.local:
            out.append("pack=1 (packed B panels) needs local=0")
        if self.raster < 0:
            out.append(f"raster={self.raster} must be >= 0")
        if self.vw not in VECTOR_WIDTHS:
            out.append(f"vw={self.vw} is not an OpenCL vector width {VECTOR_WIDTHS}")
        if not out and self.rm * self.rn > MAX_ACCUMULATORS:
            out.append(f"register tile {self.rm}x{self.rn} exceeds {MAX_ACCUMULATORS} accumulators")
        if self.local and not out:
            wg = self.work_group_size
            if (self.tile_m * self.tile_k) % wg or (self.tile_n * self.tile_k) % wg:
                out.append(f"local staging needs tile_m*tile_k and tile_n*tile_k to be multiples of the "
                           f"work-group size {wg}")
        return out
