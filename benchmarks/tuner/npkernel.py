"""A measurable NumPy kernel with a real tuning space, for the tuner benchmark when no compiled CPU
backend is installed: a cache-blocked GEMM (tile_m x tile_n x tile_k blocks, two loop orders). Its
time really depends on the blocking (Python overhead per block against cache reuse), but it is a
stand-in: the benchmark prefers a real backend's variant when the Doctor offers one."""

from __future__ import annotations


from tracea.doctor.variant import KernelVariant, Requirements
from tracea.dtypes import DType
from tracea.ir.ops import LayerType
from tracea.plugins.backend_info import BackendInfo
from tracea.plugins.manager import hookimpl
from tracea.semantic.config import PipelineConfig
from tracea.semantic.search_space import SearchSpace


class NumpyBlockedGemm(KernelVariant):
    name = "npbench.gemm.blocked"
    backend = "npbench"
    requirements = Requirements("cpu", LayerType.GEMM, dtypes=frozenset({DType.F32}), transposes=False,
                                batched=False, epilogues=frozenset())
    description = "NumPy cache-blocked GEMM (tuner benchmark stand-in)"

    def search_space(self, op, profile):
        tiles = [16, 32, 64, 128, 256]
        return (SearchSpace().tile_m(tiles).tile_n(tiles).tile_k(tiles).warps([1])
                .param("order", ["mn", "nm"]))

    def hero_configs(self, op, profile):
        return [PipelineConfig(tile_m=64, tile_n=64, tile_k=64, warps=1, params=(("order", "mn"),))]

    def run(self, op, config, args, profile):
        a, b, out = args.host("a"), args.host("b"), args.host("out")
        tm, tn, tk = config.tile_m, config.tile_n, config.tile_k
        rows, cols = range(0, op.m, tm), range(0, op.n, tn)
        pairs = [(i, j) for i in rows for j in cols] if config.get("order") == "mn" else \
            [(i, j) for j in cols for i in rows]
        for i, j in pairs:
            acc = a[i:i + tm, 0:tk] @ b[0:tk, j:j + tn]
            for p in range(tk, op.k, tk):
                acc += a[i:i + tm, p:p + tk] @ b[p:p + tk, j:j + tn]
            out[i:i + tm, j:j + tn] = acc


@hookimpl
def tracea_register_variants():
    return [NumpyBlockedGemm()]


@hookimpl
def tracea_backend_info():
    return BackendInfo("npbench", "0.1.0", package="benchmarks")
