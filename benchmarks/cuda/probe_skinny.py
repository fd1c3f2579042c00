"""Probe of ``cuda.gemm.skinny_mma``'s configurations on decode shapes (``x @ W.T``, few tokens), against
PyTorch and against the default (untuned) choice, in one run: which (nb, kw, unroll) reaches what share of
the measured copy bandwidth, so the hero order can follow measurements.

    python benchmarks/cuda/probe_skinny.py [--ms 4,8,16,32,64] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

import tracea
from tracea.semantic.config import PipelineConfig

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "user_path"))
from bench_shapes import b2b, copy_bandwidth, paired  # noqa: E402

SHAPES = [(4096, 4096), (11008, 4096), (4096, 11008), (8192, 8192), (28672, 8192), (1024, 8192)]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ms", default="4,8,16,32,64")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e12:.2f} TB/s")
    rows = []
    for (n, k), m in itertools.product(SHAPES, [int(v) for v in args.ms.split(",")]):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        t_def, t_torch = paired(lambda x=x, w=w: tracea.ops.matmul(x, w.t()), lambda x=x, w=w: x @ w.t())
        best = None
        for nb, kw, un in itertools.product((1, 2, 4), (4, 8, 16), (1, 2, 4)):
            cfg = PipelineConfig(warps=kw, params=(("nb", nb), ("kw", kw), ("unroll", un)))
            try:
                fn = lambda x=x, w=w, cfg=cfg: tracea.ops.matmul(  # noqa: E731
                    x, w.t(), variant="cuda.gemm.skinny_mma", config=cfg)
                fn()
            except tracea.TraceaError:
                continue
            t = min(b2b(fn, 50) for _ in range(3))
            rows.append({"m": m, "n": n, "k": k, "nb": nb, "kw": kw, "unroll": un, "s": t,
                         "bw%": 100 * n * k * 2 / t / bw})
            if best is None or t < best[0]:
                best = (t, nb, kw, un)
        assert best is not None
        print(f"x{m:<3} @ W{n}x{k}.T  torch {t_torch * 1e6:6.1f} us  default {t_def * 1e6:6.1f} us "
              f"({t_torch / t_def:4.2f}x)  best skinny {best[0] * 1e6:6.1f} us ({t_torch / best[0]:4.2f}x, "
              f"{100 * n * k * 2 / best[0] / bw:3.0f}% bw) nb={best[1]} kw={best[2]} unroll={best[3]}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
