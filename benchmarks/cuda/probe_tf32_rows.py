"""Probe of float32 ``x @ W.T`` with TF32 allowed at 17-64 rows: the default decision and every candidate kernel against
cuBLAS TF32, the weights cycled through enough copies that each call reads its weight from HBM, device time from
CUDA graphs (ratios torch time / tracea time). ``rows_fma`` runs the product fp32-exact (it serves ``highest``).

    python benchmarks/cuda/probe_tf32_rows.py [--rows 17,32,48,64]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import tracea.ops
from tracea.runtime import plans

sys.path.insert(0, os.path.dirname(__file__))
from probe_streamed_rows import copies_of, graph_time  # noqa: E402

WEIGHTS = [(4096, 4096), (11008, 4096), (4096, 11008), (1024, 8192), (768, 768), (3072, 768), (1000, 4096), (4096, 25088)]
CANDIDATES = [("cuda.gemm.wgmma_fewrows_tf32", None), ("cuda.gemm.wgmma_tf32", None), ("cuda.gemm.mma_tf32", None),
              ("cuda.gemm.skinny_tf32", None), ("cuda.gemm.rows_fma", "highest")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="17,32,48,64")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    print(torch.cuda.get_device_name())
    for n, k in WEIGHTS:
        ws = copies_of((n, k), torch.float32)
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k, device="cuda")
            ref = graph_time([lambda w=w, x=x: x @ w.t() for w in ws])
            tracea.ops.matmul(x, ws[0].t())
            runner = plans._plans[[key for key in plans._plans if key[0] == "matmul"][-1]].runner
            ratios = {"default": ref / graph_time([lambda w=w, x=x: tracea.ops.matmul(x, w.t()) for w in ws])}
            for name, prec in CANDIDATES:
                try:
                    ratios[name.split(".")[-1]] = ref / graph_time(
                        [lambda w=w, x=x, v=name, q=prec: tracea.ops.matmul(x, w.t(), variant=v, fp32_precision=q) for w in ws])
                except Exception:  # noqa: BLE001 - declined (routing or requirements): not a candidate here
                    ratios[name.split(".")[-1]] = float("nan")
            print(f"x{m} @ W{n}x{k}.T: cuBLAS TF32 {ref:6.1f} us | default {runner.variant or runner.reason} | "
                  + " ".join(f"{name} {r:4.2f}" for name, r in ratios.items()))
        del ws


if __name__ == "__main__":
    main()
