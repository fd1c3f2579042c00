"""Probe of the Hopper GEMM's split-K configurations (``cuda.gemm.wgmma``, param ``split_k``) on GEMMs with
few output tiles (``x @ W.T``, M = 96-2048 rows against LLM-sized weights), against PyTorch and the default
(untuned) choice, in one run, so the hero rule follows measurements.

Per shape and dtype it prints PyTorch's time, the default path's (user path: ``tracea.ops.matmul`` back to
back, host time included; kernel: the same calls replayed from a CUDA graph, device time only) and the
kernel time of every (tile_n, split_k) pair with tile_m 128 (tile_n 64, 128, 256), as ratios torch / tracea.

    python benchmarks/cuda/probe_split_k.py [--dtypes bfloat16,float16,float32] [--quick] [--default-only]
                                            [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch

import tracea

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "user_path"))
from bench_shapes import graph_time, paired, rel  # noqa: E402

from tracea_cuda.variants.hopper import _hero  # noqa: E402

# (M, N, K): the few-tile shapes bench_shapes.py measured below 0.9x, then shapes it does not hold.
TARGETS = [(512, 1024, 8192), (128, 1024, 8192), (512, 5120, 5120), (512, 11008, 4096), (512, 13824, 5120),
           (512, 28672, 8192), (2048, 5120, 5120), (128, 4096, 4096), (128, 11008, 4096), (128, 4096, 11008),
           (128, 5120, 5120), (128, 8192, 8192), (128, 28672, 8192), (512, 4096, 4096), (512, 8192, 8192)]
OTHERS = [(96, 768, 2048), (96, 4096, 14336), (192, 2048, 4096), (192, 3072, 8192), (256, 4096, 14336),
          (256, 1536, 6144), (384, 3072, 8192), (384, 768, 3072), (256, 4096, 2048), (96, 2560, 10240)]
QUICK = [(512, 1024, 8192), (128, 4096, 4096), (512, 5120, 5120), (256, 4096, 14336), (192, 2048, 4096)]


def probe(m: int, n: int, k: int, dtype: torch.dtype, splits: list[int], sweep: bool = True) -> dict:
    w = torch.randn(n, k, device="cuda", dtype=dtype) / k ** 0.5
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    ref = x @ w.t()
    t_torch_g = graph_time(lambda: x @ w.t())
    t_def, t_torch, _ = paired(lambda: tracea.ops.matmul(x, w.t()), lambda: x @ w.t())
    t_def_g = graph_time(lambda: tracea.ops.matmul(x, w.t()))
    variant = "cuda.gemm.wgmma_tf32" if dtype == torch.float32 else "cuda.gemm.wgmma"
    row: dict[str, Any] = {"m": m, "n": n, "k": k, "dtype": str(dtype)[6:], "torch_s": t_torch,
                           "torch_graph_s": t_torch_g, "default_s": t_def, "default_graph_s": t_def_g,
                           "default_err": rel(tracea.ops.matmul(x, w.t()), ref), "configs": {}}
    if not sweep:
        decision = tracea.get_doctor().decide(gemm_op(m, n, k, dtype), "cuda:0")
        c = decision.chosen.config
        cfg = f"{decision.variant.name} {c.tile_m}x{c.tile_n} split_k={c.get('split_k') or 1}"
        print(f"M{m:<5} N{n:<6} K{k:<6} {row['dtype']:<8} torch {t_torch_g * 1e6:6.1f} us | default user "
              f"{t_torch / t_def:4.2f}x kernel {t_torch_g / t_def_g:4.2f}x  err {row['default_err']:.1e}  "
              f"{cfg}", flush=True)
        return row
    configs = {f"bn128_s{s}": _hero(128, 6, cluster=1, split_k=s) for s in splits}
    configs.update({f"bn256_s{s}": _hero(256, 4, cluster=1, split_k=s) for s in splits if s <= 4})
    configs.update({f"bn64_s{s}": _hero(64, 8, cluster=1, split_k=s) for s in splits})
    configs.update({f"bm256_s{s}": _hero(128, 4, bm=256, cluster=1, split_k=s) for s in splits if s <= 2})
    if dtype != torch.float32:
        configs["bn256_defer"] = _hero(256, 3, 16, cluster=1, defer=True)
    for key, cfg in configs.items():
        fn = lambda cfg=cfg: tracea.ops.matmul(x, w.t(), variant=variant, config=cfg)  # noqa: E731
        try:
            err = rel(fn(), ref)
            t = graph_time(fn)
        except tracea.TraceaError as exc:
            print(f"    {key}: {exc}")
            continue
        row["configs"][key] = {"s": t, "err": err}
    best = min(row["configs"].items(), key=lambda kv: kv[1]["s"])
    row["best"] = best[0]
    t_best, t_torch2, _ = paired(lambda: tracea.ops.matmul(x, w.t(), variant=variant, config=configs[best[0]]),
                              lambda: x @ w.t())
    row["best_user_s"], row["torch2_s"] = t_best, t_torch2
    cf = "  ".join(f"{key} {t_torch_g / v['s']:4.2f}" for key, v in row["configs"].items())
    print(f"M{m:<5} N{n:<6} K{k:<6} {row['dtype']:<8} torch {t_torch_g * 1e6:6.1f} us | default user "
          f"{t_torch / t_def:4.2f}x kernel {t_torch_g / t_def_g:4.2f}x | best {best[0]} {t_torch_g / best[1]['s']:4.2f}x"
          f" (user {t_torch2 / t_best:4.2f}x) err {max(v['err'] for v in row['configs'].values()):.1e}\n      {cf}", flush=True)
    return row


def gemm_op(m: int, n: int, k: int, dtype: torch.dtype) -> Any:
    """The op ``x @ W.T`` is (W stored (N, K))."""
    from tracea.ir.ops import GemmOp  # noqa: PLC0415

    dt = str(dtype)[6:]
    return GemmOp(m, n, k, trans_b=True, dtype_a=dt, dtype_b=dt,
                  **({"fp32_precision": "high"} if dtype == torch.float32 else {}))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", default="bfloat16,float16,float32")
    p.add_argument("--quick", action="store_true", help="five shapes only")
    p.add_argument("--splits", default="1,2,3,4,6,8")
    p.add_argument("--shapes", default="", help="MxNxK,... instead of the built-in lists")
    p.add_argument("--default-only", action="store_true", help="time only the default path (no config sweep)")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = True  # fp32 rows: TF32 on both sides
    print(f"{torch.cuda.get_device_name()}; ratios are torch time / tracea time")
    rows = []
    splits = [int(s) for s in args.splits.split(",")]
    for dt in args.dtypes.split(","):
        dtype = getattr(torch, dt)
        shapes = QUICK if args.quick or dt != "bfloat16" else TARGETS + OTHERS
        if args.shapes:
            shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        for m, n, k in shapes:
            rows.append(probe(m, n, k, dtype, splits, sweep=not args.default_only))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
