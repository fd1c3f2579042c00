"""Probe of ``cuda.gemm.skinny_mma``'s configurations (and ``cuda.gemm.gemv`` at M = 1) on decode shapes
(``x @ W.T``, few tokens), against PyTorch and against the default (untuned) choice, in one run: which
(nb, kw, unroll, coalesced, prefetch, wn) reaches what share of the measured copy bandwidth, so the hero order
can follow measurements.

Per shape it prints PyTorch's time, the default path's (user path: ``tracea.ops.matmul`` back to back,
host time included, as a ratio torch / tracea; kernel: the calls replayed from a CUDA graph, device time
only) and the best config's kernel time; at the end, per row class (M <= 8: half fragments, else whole),
every config's geometric mean and worst share of each shape's best kernel time, best first.

    python benchmarks/cuda/probe_skinny.py [--ms 1,4,16] [--kws 8,16] [--orders 0,1] [--prefetch 0,1] [--wns 1,2]
        [--nbs 1,2,4] [--unrolls 1,2,4] [--shapes 5120x5120,11008x4096] [--heroes] [--json out.json]

``--heroes`` adds the variant's hero configs for each shape (named ``hero <params>``). ``--dtype float32`` probes
``cuda.gemm.skinny_tf32`` instead (fp32 ``x @ W.T``; ``--precision highest``: the 3xTF32 split, PyTorch's
default fp32 matmul; ``high``: one TF32 product, against PyTorch with TF32 allowed).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import json
import math
import multiprocessing as mp
import os
import sys
from typing import Any, Callable

import torch

import tracea
from tracea.ir.ops import GemmOp
from tracea.semantic.config import PipelineConfig

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "user_path"))
from bench_shapes import copy_bandwidth, paired  # noqa: E402
from probe_split_k import graph_time  # noqa: E402

SHAPES = [(4096, 4096), (11008, 4096), (4096, 11008), (5120, 5120), (13824, 5120), (8192, 8192), (28672, 8192),
          (1024, 8192)]


def configs(kws: list[int], orders: list[bool], prefetch: list[bool], wns: tuple[int, ...] = (1,),
            nbs: tuple[int, ...] = (1, 2, 4), unrolls: tuple[int, ...] = (1, 2, 4)) -> list[tuple[str, PipelineConfig]]:
    """Every (nb, kw, unroll, wn) with kw in ``kws`` for each k order (``coalesced``) and prefetch setting,
    named ``[pf ][old ]nbX kwY uZ[ wnW]`` (``old``: the non-coalesced order); 16-warp blocks get
    ``wide_regs``."""
    out = []
    for co, pf, nb, kw, un, wn in itertools.product(orders, prefetch, nbs, kws, unrolls, wns):
        if kw * wn > 16:
            continue
        out.append((f"{'pf ' if pf else ''}{'' if co else 'old '}nb{nb} kw{kw} u{un}{f' wn{wn}' if wn > 1 else ''}",
                    PipelineConfig(warps=kw * wn, params=(("nb", nb), ("kw", kw), ("unroll", un), ("coalesced", co),
                                                          ("prefetch", pf), ("wide_regs", kw * wn == 16),
                                                          ("wn", wn)))))
    return out


def probed(dtype: str, precision: str = "highest") -> tuple[Any, Callable[[int, int, int], GemmOp]]:
    """The variant probed for ``dtype`` (skinny_mma for 16-bit, skinny_tf32 for float32) and the op of a shape."""
    from tracea_cuda.variants.skinny import SkinnyMmaGemm, SkinnyTf32Gemm  # noqa: PLC0415

    variant = SkinnyTf32Gemm() if dtype == "float32" else SkinnyMmaGemm()
    return variant, lambda m, n, k: GemmOp(m, n, k, trans_b=True, dtype_a=dtype, dtype_b=dtype, fp32_precision=precision)


def hero_items(m: int, n: int, k: int, dtype: str = "bfloat16", precision: str = "highest") -> list[tuple[str, PipelineConfig]]:
    """The skinny variant's hero configs for this shape on this GPU, named ``hero <params>``."""
    variant, make = probed(dtype, precision)
    profile = tracea.get_doctor().profile_for("cuda:0")
    return [("hero " + " ".join(f"{key}={v}" for key, v in cfg.params), cfg)
            for cfg in variant.hero_configs(make(m, n, k), profile)]


def _compile(item: tuple[str, str, str]) -> str:
    """Worker: compile one kernel into the disk cache (no CUDA context needed)."""
    from tracea_cuda import compiler  # noqa: PLC0415

    compiler.precompile(*item)
    return item[1]


def precompile(cfgs: list[tuple[str, PipelineConfig]], ms: list[int], dtype: str = "bfloat16",
               precision: str = "highest") -> None:
    """Every probed skinny kernel compiled into the disk cache by a process pool (the probe then loads
    them), instead of one after the other on first use."""
    from tracea_cuda import toolkit  # noqa: PLC0415
    from tracea_cuda.emit.skinny import KERNEL_NAME, render  # noqa: PLC0415

    (v, make), arch = probed(dtype, precision), toolkit.arch_name(torch.cuda.get_device_capability())
    srcs = set()
    for m, (_, cfg) in itertools.product(ms, cfgs):
        op = make(m, 4096, 4096)
        try:
            srcs.add((render(v.spec(op, cfg, None)), KERNEL_NAME, arch))
        except tracea.TraceaError:
            continue
    with cf.ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 4), mp_context=mp.get_context("spawn")) as ex:
        list(ex.map(_compile, srcs))
    print(f"{len(srcs)} kernels compiled", flush=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ms", default="1,4,16")
    p.add_argument("--kws", default="4,8,16", help="warps per block to sweep")
    p.add_argument("--orders", default="0,1", help="k orders: 0 adjacent vectors per lane, 1 coalesced")
    p.add_argument("--prefetch", default="0,1")
    p.add_argument("--npw", default="1,2,4", help="GEMV rows per warp timed at M = 1")
    p.add_argument("--wns", default="1", help="row groups per block (warps sharing A's K slices) to sweep")
    p.add_argument("--nbs", default="1,2,4")
    p.add_argument("--unrolls", default="1,2,4")
    p.add_argument("--shapes", default="", help="weights NxK,... (default: the 8 decode weights)")
    p.add_argument("--heroes", action="store_true", help="also time the variant's hero configs per shape")
    p.add_argument("--dtype", default="bfloat16", help="bfloat16 / float16 (skinny_mma) or float32 (skinny_tf32)")
    p.add_argument("--precision", default="highest", help="float32: highest (3xTF32) or high (TF32)")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = args.precision != "highest"
    dt, variant, make = getattr(torch, args.dtype), *probed(args.dtype, args.precision)
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e12:.2f} TB/s; ratios are torch time / tracea time")
    rows = []
    ints = lambda text: [int(v) for v in text.split(",")]  # noqa: E731
    cfgs = configs(ints(args.kws), [bool(v) for v in ints(args.orders)], [bool(v) for v in ints(args.prefetch)],
                   tuple(ints(args.wns)), tuple(ints(args.nbs)), tuple(ints(args.unrolls)))
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    ms = ints(args.ms)
    heroes = ({(m, n, k): hero_items(m, n, k, args.dtype, args.precision) for (n, k), m in itertools.product(shapes, ms)}
              if args.heroes else {})
    precompile(cfgs + [item for items in heroes.values() for item in items], ms, args.dtype, args.precision)
    for (n, k), m in itertools.product(shapes, ms):
        w = torch.randn(n, k, device="cuda", dtype=dt) / k ** 0.5
        x = torch.randn(m, k, device="cuda", dtype=dt)
        item = x.element_size()
        ref = x.double() @ w.double().t()
        t_def, t_torch, _ = paired(lambda x=x, w=w: tracea.ops.matmul(x, w.t()), lambda x=x, w=w: x @ w.t())
        t_torch_g = graph_time(lambda x=x, w=w: x @ w.t())
        t_def_g = graph_time(lambda x=x, w=w: tracea.ops.matmul(x, w.t()))
        decision = tracea.get_doctor().decide(make(m, n, k), "cuda:0")
        row = {"m": m, "n": n, "k": k, "torch_s": t_torch, "torch_graph_s": t_torch_g, "default_s": t_def,
               "default_graph_s": t_def_g, "default": f"{decision.variant.name} {dict(decision.chosen.config.params)}",
               "configs": {}}
        extra = [(f"gemv npw{v}", "cuda.gemm.gemv", PipelineConfig(params=(("npw", v),))) for v in ints(args.npw)
                 if m == 1]
        for key, name, cfg in [(key, variant.name, cfg) for key, cfg in cfgs + heroes.get((m, n, k), [])] + extra:
            fn = lambda x=x, w=w, cfg=cfg, name=name: tracea.ops.matmul(  # noqa: E731
                x, w.t(), variant=name, config=cfg)
            try:
                out = fn()
            except tracea.TraceaError:
                continue
            err = float((out.double() - ref).norm() / ref.norm())
            if err > (1e-5 if args.dtype == "float32" and args.precision == "highest" else 2e-2):
                print(f"    {key}: relative error {err:.1e}", flush=True)
                continue
            row["configs"][key] = graph_time(fn)
        if not row["configs"]:
            print(f"x{m:<3} @ W{n}x{k}.T  no config ran within the error bound", flush=True)
            continue
        best = min(row["configs"].items(), key=lambda kv: kv[1])
        row["best"] = best[0]
        rows.append(row)
        print(f"x{m:<3} @ W{n}x{k}.T  torch {t_torch_g * 1e6:6.1f} us ({100 * n * k * item / t_torch_g / bw:3.0f}% bw)"
              f" | default user {t_torch / t_def:4.2f}x kernel {t_torch_g / t_def_g:4.2f}x "
              f"({100 * n * k * item / t_def_g / bw:3.0f}% bw) | best {best[0]} {t_torch_g / best[1]:4.2f}x "
              f"({100 * n * k * item / best[1] / bw:3.0f}% bw)"
              + "".join(f" {key} {t_torch_g / t:4.2f}x" for key, t in row["configs"].items() if key.startswith("gemv"))
              + f" | default {row['default']}", flush=True)
    for label, sel in (("M <= 8", lambda r: r["m"] <= 8), ("M 9-16", lambda r: 8 < r["m"] <= 16),
                       ("M 17-32", lambda r: 16 < r["m"] <= 32), ("M 33-64", lambda r: 32 < r["m"] <= 64)):
        part = [r for r in rows if sel(r)]
        if not part:
            continue
        keys = set.intersection(*(set(r["configs"]) for r in part))
        score = {key: [min(r["configs"].values()) / r["configs"][key] for r in part] for key in keys}
        ranked = sorted(score.items(), key=lambda kv: -sum(math.log(v) for v in kv[1]))
        print(f"\n{label}: share of each shape's best kernel time (geomean, worst), best first")
        for key, v in ranked[:14]:
            print(f"  {key:<22} {math.exp(sum(math.log(s) for s in v) / len(v)):.3f}  {min(v):.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_bw": bw, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
