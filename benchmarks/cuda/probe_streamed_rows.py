"""Probe of the weight-streaming few-row kernels' split parameters against cuBLAS, the operand cycled through enough
copies that every call reads it from HBM (as a model's layers do), device time from CUDA graphs:

* ``cuda.gemm.gemv`` (``x @ W.T``, M <= 4): K parts ``ks`` (warps sharing a weight row) x rows per warp ``npw``;
* ``cuda.gemm.rows_kn`` (``x @ B``, B stored (K, N), M <= 16): K slices (config param ``slices``).

Each line gives cuBLAS's time, the default decision's ratio, the best setting's and every setting's (torch time /
tracea time; above 1: faster than cuBLAS).

    python benchmarks/cuda/probe_streamed_rows.py [--kernel gemv|rows_kn|both] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable

import torch

import tracea.ops
from tracea.ir.ops import GemmOp
from tracea.semantic.config import PipelineConfig

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "user_path"))
from bench_shapes import graph_time as shapes_graph_time  # noqa: E402

GEMV_SHAPES = [(1, 1024, 8192), (1, 512, 8192), (1, 2048, 8192), (1, 256, 4096), (1, 768, 768), (1, 3072, 768),
               (1, 4096, 4096), (1, 11008, 4096), (1, 8192, 1024), (4, 1024, 8192), (4, 768, 3072), (4, 4096, 14336)]
ROWS_KN_SHAPES = [(1, 768, 768), (8, 768, 768), (16, 768, 768), (1, 1024, 8192), (8, 1024, 8192), (16, 1024, 8192),
                  (1, 4096, 4096), (8, 4096, 4096), (16, 4096, 4096), (1, 11008, 4096), (16, 11008, 4096),
                  (4, 3000, 1000)]


def graph_time(fns: list[Callable[[], Any]], reps: int = 5) -> float:
    """Device us per call of ``fns``, all captured in one CUDA graph (:func:`bench_shapes.graph_time`)."""
    return shapes_graph_time(lambda: [f() for f in fns], calls=1, reps=reps) * 1e6 / len(fns)


def copies_of(shape: tuple[int, int], dtype: torch.dtype) -> list[torch.Tensor]:
    """Enough copies of a random operand that one pass over them (160 MB) leaves none in the L2 cache."""
    nbytes = shape[0] * shape[1] * torch.tensor([], dtype=dtype).element_size()
    return [torch.randn(*shape, device="cuda", dtype=dtype) / shape[1] ** 0.5
            for _ in range(max(1, min(16, -(-160_000_000 // nbytes))))]


def probe(kernel: str, m: int, n: int, k: int, dtype: torch.dtype) -> None:
    from tracea_cuda.variants.gemv import k_parts
    from tracea_cuda.variants.rows_kn import slices

    x = torch.randn(m, k, device="cuda", dtype=dtype)
    if kernel == "gemv":
        ws = copies_of((n, k), dtype)
        call = lambda w, **kw: tracea.ops.matmul(x, w.t(), variant="cuda.gemm.gemv", **kw)  # noqa: E731
        ref = graph_time([lambda w=w: x @ w.t() for w in ws])
        op = GemmOp(m, n, k, trans_b=True, dtype_a=str(dtype)[6:], dtype_b=str(dtype)[6:])
        default = f"ks={k_parts(op)}"
        settings = {f"npw{npw} ks{ks}": PipelineConfig(params=(("npw", npw), ("ks", ks)))
                    for npw in (1, 2) for ks in (1, 2, 4, 8) if not (ks > 1 and npw * m > 4)}
    else:
        ws = copies_of((k, n), dtype)
        call = lambda w, **kw: tracea.ops.matmul(x, w, variant="cuda.gemm.rows_kn", **kw)  # noqa: E731
        ref = graph_time([lambda w=w: x @ w for w in ws])
        default = f"slices={slices(GemmOp(m, n, k), torch.cuda.get_device_properties(0).multi_processor_count)[0]}"
        settings = {f"S={s}": PipelineConfig(params=(("slices", s),)) for s in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128)
                    if s <= k // 2}
    t_default = graph_time([lambda w=w: call(w) for w in ws])
    times = {name: graph_time([lambda w=w, c=cfg: call(w, config=c) for w in ws]) for name, cfg in settings.items()}
    best = min(times, key=times.get)
    what = f"x{m} @ W{n}x{k}.T" if kernel == "gemv" else f"x{m} @ B{k}x{n}"
    print(f"{kernel} {str(dtype)[6:]} {what}: cuBLAS {ref:6.1f} us | default ({default}) {ref / t_default:4.2f}x | best "
          f"{best} {ref / times[best]:4.2f}x | " + " ".join(f"{name}:{ref / t:4.2f}" for name, t in times.items()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernel", default="both", choices=["gemv", "rows_kn", "both"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    dtype = getattr(torch, args.dtype)
    print(f"{torch.cuda.get_device_name()}, {args.dtype}")
    for kernel in (["gemv", "rows_kn"] if args.kernel == "both" else [args.kernel]):
        for m, n, k in (GEMV_SHAPES if kernel == "gemv" else ROWS_KN_SHAPES):
            if kernel == "gemv" and m > 1 and dtype != torch.float32:
                continue  # 16-bit rows beyond the first are skinny_mma's
            probe(kernel, m, n, k, dtype)


if __name__ == "__main__":
    main()
