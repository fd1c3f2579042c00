"""Search spaces and hero configs of the OpenCL kernels, per device type.

Config fields used: ``tile_m``/``tile_n`` (work-group tile of C), ``tile_k`` (k slice staged in local
memory, or the k-loop unroll of direct kernels); params ``wg_m``/``wg_n`` (work-group shape), ``vw``
(vector width of B loads and C stores), ``local`` (1: local-memory staging), ``raster`` (grouped
work-group order, 0 = hardware order). ``stages``, ``warps``, ``swizzle`` and ``barrier`` are unused.
"""

from __future__ import annotations

from tracea.doctor.profile import DeviceProfile
from tracea.semantic.config import PipelineConfig
from tracea.semantic.search_space import SearchSpace

from .tiling import Tiling

#: Accumulator budget (rm x rn) on CPU runtimes, which vectorize 16 work-items per SIMD register: each
#: accumulator is one vector register, and AVX-512 has 32.
CPU_MAX_TILE = 24
GPU_MAX_TILE = 64
COLUMN_MAJOR = 4096  # raster band taller than any grid: walk whole column panels


def device_type(profile: DeviceProfile) -> str:
    return str(profile.extras.get("device_type", "gpu"))


def _cfg(tm: int, tn: int, tk: int, wg_m: int, wg_n: int, vw: int, local: int, raster: int,
         pack: int = 0) -> PipelineConfig:
    return PipelineConfig(tile_m=tm, tile_n=tn, tile_k=tk, stages=1, warps=1,
                          params=(("wg_m", wg_m), ("wg_n", wg_n), ("vw", vw), ("local", local),
                                  ("raster", raster), ("pack", pack)))


def _cpu_vectors(t: Tiling) -> int:
    """Vector registers of a CPU work-item's accumulators: one per scalar accumulator when the runtime
    vectorizes across work-items (vw=1), else rm x rn / vw explicit vectors."""
    return t.rm * t.rn if t.vw == 1 else t.rm * t.rn // t.vw


def _fits(profile: DeviceProfile, max_tile: int, cpu: bool = False):
    def constraint(config: PipelineConfig) -> str | None:
        t = Tiling.from_config(config)
        problems = t.problems()
        if problems:
            return problems[0]
        regs = _cpu_vectors(t) if cpu else t.rm * t.rn
        if regs > max_tile:
            return f"register tile {t.rm}x{t.rn} (vw={t.vw}) above {max_tile}"
        if cpu and not ((t.wg_n == 16 and t.vw == 1) or (t.wg_n <= 2 and t.vw >= 8)):
            return "CPU kernels vectorize either across 16 work-items (vw=1) or explicitly (vw>=8, wg_n<=2)"
        if profile.max_threads_per_block > 1 and t.work_group_size > profile.max_threads_per_block:
            return f"work-group {t.work_group_size} above {profile.max_threads_per_block}"
        if profile.shared_mem_per_block and t.local_bytes > profile.shared_mem_per_block:
            return f"local memory {t.local_bytes} B above {profile.shared_mem_per_block} B"
        return None
    constraint.__name__ = "fits_device"
    return constraint


def _not_wasteful(m: int, n: int, min_m: int, min_n: int):
    """Drop tiles that pad a small output more than 2x in a dimension (the smallest tile always stays)."""
    def constraint(config: PipelineConfig) -> str | None:
        if config.tile_m > min_m and -(-m // config.tile_m) * config.tile_m > 2 * m:
            return f"tile_m={config.tile_m} pads m={m} more than 2x"
        if config.tile_n > min_n and -(-n // config.tile_n) * config.tile_n > 2 * n:
            return f"tile_n={config.tile_n} pads n={n} more than 2x"
        return None
    constraint.__name__ = "not_wasteful"
    return constraint


def search_space(profile: DeviceProfile, m: int, n: int) -> SearchSpace:
    """The space a tuner explores for an (m x n) output on ``profile``."""
    if device_type(profile) == "cpu":
        space = (SearchSpace().stages([1]).warps([1])
                 .tile_m([4, 6, 8, 12]).tile_n([16, 32, 48, 64]).tile_k([4, 8, 16])
                 .param("wg_m", [1]).param("wg_n", [1, 2, 16]).param("vw", [1, 8, 16]).param("local", [0])
                 .param("raster", [0, 16, COLUMN_MAJOR]).param("pack", [0, 1]))
        return space.where(_fits(profile, CPU_MAX_TILE, cpu=True)).where(_not_wasteful(m, n, 4, 16))
    space = (SearchSpace().stages([1]).warps([1])
             .tile_m([32, 64, 128]).tile_n([32, 64, 128]).tile_k([8, 16, 32])
             .param("wg_m", [8, 16]).param("wg_n", [8, 16]).param("vw", [1, 2, 4]).param("local", [1])
             .param("raster", [0, 8]).param("pack", [0]))
    return space.where(_fits(profile, GPU_MAX_TILE)).where(_not_wasteful(m, n, 32, 32))


def hero_configs(profile: DeviceProfile, m: int, n: int, b_rows_contiguous: bool = True) -> list[PipelineConfig]:
    """Known-good configs, the ones wasting least padding on an (m x n) output first.

    :param b_rows_contiguous: B is stored (K, N) (a plain GEMM B). Otherwise (transposed B, conv weights)
        the CPU heroes pack B into panels, since reading it in place would be a strided gather.
    """
    if device_type(profile) == "cpu":
        pk = 0 if b_rows_contiguous else 1
        heroes = [_cfg(8, 32, 16, 1, 16, 1, 0, COLUMN_MAJOR, pk), _cfg(4, 64, 8, 1, 1, 16, 0, COLUMN_MAJOR, pk),
                  _cfg(6, 64, 4, 1, 16, 1, 0, 16, pk), _cfg(8, 16, 8, 1, 16, 1, 0, COLUMN_MAJOR, pk),
                  _cfg(4, 16, 8, 1, 16, 1, 0, 0, pk)]
    else:
        heroes = [_cfg(128, 128, 16, 16, 16, 4, 1, 8), _cfg(64, 64, 16, 16, 16, 4, 1, 8),
                  _cfg(64, 64, 16, 8, 8, 1, 1, 0), _cfg(32, 32, 16, 8, 8, 1, 1, 0)]
    cpu = device_type(profile) == "cpu"
    fits = _fits(profile, CPU_MAX_TILE if cpu else GPU_MAX_TILE, cpu=cpu)
    heroes = [h for h in heroes if fits(h) is None]

    def waste(c: PipelineConfig) -> float:
        pm = -(-m // c.tile_m) * c.tile_m
        pn = -(-n // c.tile_n) * c.tile_n
        return round(pm * pn / (m * n), 1)  # ties (within 10%) keep the hand-ordered preference

    return sorted(heroes, key=waste)
