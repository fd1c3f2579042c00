"""Probe of few-row GEMMs (``x @ W.T``, 17-128 tokens: batched decode, small-batch ``nn.Linear``) on Hopper:
``cuda.gemm.wgmma_fewrows`` (C^T = W x^T) by K slices and schedule, against cuBLAS and the default (untuned)
choice, in one run, so its hero rule and its row range follow measurements.

Kernel times are calls replayed from a CUDA graph (device time only), each call on the next of R weights
whose bytes together exceed the L2 cache ("cold": every call streams its weight from memory, as a model's
layers do) and, with ``--hot``, on one weight (L2-resident when it fits). The default also runs on the user
path (``tracea.ops.matmul`` back to back, host time included). Ratios are torch time / tracea time.

    python benchmarks/cuda/probe_fewrows.py [--ms 17,24,32,48,64,96,128] [--shapes 4096x4096,...] [--hot]
        [--dtype bfloat16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import itertools
import sys
from typing import Any, Callable

import torch

import tracea
from tracea.ir.ops import GemmOp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "user_path"))
from bench_shapes import copy_bandwidth, graph_time, paired  # noqa: E402

from tracea_cuda.variants.hopper import _hero  # noqa: E402
from tracea_cuda.variants.hopper_fewrows import WgmmaFewRows, stages_for, token_tile  # noqa: E402

SHAPES = ["4096x4096", "11008x4096", "4096x11008", "1024x8192", "8192x8192", "5120x5120", "13824x5120",
          "2048x2048", "28672x8192"]
VARIANT = WgmmaFewRows.name


def rotating_graph_time(fn: Callable[[torch.Tensor], Any], weights: list[torch.Tensor], reps: int = 5) -> float:
    """Device seconds per call of ``fn(w)`` over ``weights`` in turn (two rounds captured in one graph,
    ``bench_shapes.graph_time``); every weight is called once first, outside the capture."""
    for w in weights:
        fn(w)
    turn = itertools.cycle(weights)
    return graph_time(lambda: fn(next(turn)), calls=2 * len(weights) if len(weights) > 1 else 20, reps=reps)


def configs(m: int, n: int, k: int) -> dict[str, Any]:
    bn = token_tile(GemmOp(m, n, k))
    out = {f"s{s}": _hero(bn, stages_for(bn), cluster=1, split_k=s, smem_epilogue=False)
           for s in (1, 2, 3, 4, 6, 8, 12, 16)}
    out["pp64"] = _hero(bn, stages_for(bn), schedule="pingpong", bm=64, cluster=1, smem_epilogue=False)
    return out


def probe(m: int, n: int, k: int, dtype: torch.dtype, hot: bool, bw: float) -> dict:
    l2_bytes = 160 * 2**20
    r = 1 if hot else max(2, -(-l2_bytes // (n * k * 2)))
    ws = [torch.randn(n, k, device="cuda", dtype=dtype) / k ** 0.5 for _ in range(r)]
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    ref = x.double() @ ws[0].double().t()
    t_torch = rotating_graph_time(lambda w: x @ w.t(), ws)
    t_def = rotating_graph_time(lambda w: tracea.ops.matmul(x, w.t()), ws)
    u_def, u_torch, _ = paired(lambda: tracea.ops.matmul(x, ws[0].t()), lambda: x @ ws[0].t())
    dt = str(dtype)[6:]
    decision = tracea.get_doctor().decide(GemmOp(m, n, k, trans_b=True, dtype_a=dt, dtype_b=dt), "cuda:0")
    c = decision.chosen.config
    row: dict[str, Any] = {"m": m, "n": n, "k": k, "dtype": dt, "weights": r, "torch_s": t_torch, "default_s": t_def,
                           "default_user_s": u_def, "torch_user_s": u_torch, "default": decision.variant.name,
                           "default_config": c.key, "configs": {}}
    for key, cfg in configs(m, n, k).items():
        fn = lambda w, cfg=cfg: tracea.ops.matmul(x, w.t(), variant=VARIANT, config=cfg)  # noqa: E731
        try:
            err = float((fn(ws[0]).double() - ref).norm() / ref.norm())
            row["configs"][key] = {"s": rotating_graph_time(fn, ws), "err": err}
        except tracea.TraceaError as exc:
            row["configs"][key] = {"error": str(exc)[:120]}
    timed = {kk: v["s"] for kk, v in row["configs"].items() if "s" in v}
    best = sorted(timed.items(), key=lambda kv: kv[1])
    worst_err = max((v["err"] for v in row["configs"].values() if "err" in v), default=float("nan"))
    short = decision.variant.name.replace("cuda.gemm.", "")
    split = c.get("split_k") or 1
    print(f"M{m:<4} N{n:<6} K{k:<6} {'hot ' if hot else 'cold'} cuBLAS {t_torch * 1e6:6.1f} us "
          f"({100 * n * k * 2 / t_torch / bw:3.0f}% bw) | default {short} {c.tile_m}x{c.tile_n} s{split}: kernel "
          f"{t_torch / t_def:4.2f}x user {u_torch / u_def:4.2f}x | "
          + "  ".join(f"{kk} {t_torch / v:4.2f}" for kk, v in best[:5]) + f"  err {worst_err:.1e}", flush=True)
    return row


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ms", default="17,24,32,48,64,96,128")
    p.add_argument("--shapes", default=",".join(SHAPES), help="NxK weights")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--hot", action="store_true", help="also time on one (L2-resident) weight")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}; copy bandwidth {bw / 1e9:.0f} GB/s; ratios are torch time / tracea time")
    dtype = getattr(torch, args.dtype)
    rows = []
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        for m in (int(v) for v in args.ms.split(",")):
            for hot in (False, True) if args.hot else (False,):
                rows.append(probe(m, n, k, dtype, hot, bw))
                if args.json:
                    with open(args.json, "w") as f:
                        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
