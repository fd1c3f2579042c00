"""Probe of the Hopper GEMM's tile widths (``cuda.gemm.wgmma``, any multiple of 16 with a K-major B): per shape,
PyTorch's kernel time against the default hero (with the wave-filling width rule of ``variants/hopper_tiles.py``),
the hero the rule replaced, the widths next to the chosen one and a few extras, so the rule follows
measurements. Kernel times are calls replayed from a CUDA graph (device time only); the default also runs on
the user path (``tracea.ops.matmul`` back to back, host time included). Ratios are torch time / tracea time.

    python benchmarks/cuda/probe_tile_n.py [--shapes MxNxK[t],...] [--jobs 12] [--json out.json]

A shape ending in ``t`` is ``a @ b`` with b stored (K, N) (an MN-major B); the others are ``x @ W.T``.
``--jobs`` compiles every config first in that many processes (NVRTC, into the disk cache).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import torch

import tracea
from tracea.ir.ops import GemmOp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "user_path"))
sys.path.insert(0, os.path.dirname(__file__))
from bench_shapes import paired, rel  # noqa: E402
from probe_split_k import graph_time  # noqa: E402

from tracea_cuda.variants import hopper_tiles  # noqa: E402
from tracea_cuda.variants.hopper import WgmmaGemm, _hero  # noqa: E402

# prefill-like shapes (the fill rule's domain), then 128-row shapes (weight-bound: alternatives only)
SHAPES = ["512x5120x5120", "512x13824x5120", "512x11008x4096", "256x5120x5120", "1024x5120x5120",
          "512x28672x8192", "256x11008x4096", "512x6144x4096", "1024x3584x3584", "512x3072x768", "2048x4608x3584",
          "1000x1000x1000t", "768x768x768t", "2048x4096x4096"]
# (shape, extra configs (bn, stages, split_k)) for the 128-row shapes
EXTRAS = {"128x5120x5120": [(48, 8, 1), (80, 7, 2), (96, 6, 2)], "128x4096x4096": [(32, 8, 1), (48, 8, 1)],
          "128x13824x5120": [(112, 6, 1), (224, 4, 2)], "128x11008x4096": [(96, 6, 1), (176, 5, 2)],
          "128x28672x8192": [(128, 6, 1)], "128x14336x4096": [], "128x6144x4096": [], "128x3584x3584": [],
          "128x9216x3072": [], "128x8192x8192": [(48, 8, 1)]}


def parse(s: str) -> tuple[int, int, int, bool]:
    mn = s.endswith("t")
    m, n, k = (int(v) for v in s.rstrip("t").split("x"))
    return m, n, k, mn


def op_of(m: int, n: int, k: int, mn: bool) -> GemmOp:
    return GemmOp(m, n, k, trans_b=not mn, dtype_a="bfloat16", dtype_b="bfloat16")


def configs_for(op: GemmOp, profile: Any, extras: list) -> dict[str, Any]:
    """label -> config: the default, the rule's tile without the fill width, the neighbours, extras."""
    v = WgmmaGemm()
    new = v.hero_configs(op, profile)[0]
    gain, hopper_tiles.FILL_GAIN = hopper_tiles.FILL_GAIN, 0.0
    try:
        old = v.hero_configs(op, profile)[0]
    finally:
        hopper_tiles.FILL_GAIN = gain
    out = {"default": new}
    if old != new:
        out["old"] = old
    kmaj = op.trans_b
    if op.m >= hopper_tiles.FILL_MIN_ROWS and new.tile_m == 128 and not new.get("split_k") and not new.get("stream_k"):
        for bn in (new.tile_n - 16, new.tile_n + 16) if kmaj else (new.tile_n - 64, new.tile_n + 64):
            if 16 <= bn <= 256:
                out[f"bn{bn}"] = _hero(bn, hopper_tiles.fill_stages(bn), cluster=1)
    for bn, st, s in extras:
        out[f"bn{bn}_s{s}"] = _hero(bn, st, cluster=1, split_k=s)
    out = {k: c for i, (k, c) in enumerate(out.items()) if c not in list(out.values())[:i]}
    if "old" in out and op.n % 8 == 0 and op.m >= hopper_tiles.FILL_MIN_ROWS:
        out["bn256_defer"] = _hero(256, 3, 16, cluster=1, defer=True)
    return {k: c for k, c in out.items() if v.validate_config(op, c, profile)}


def _compile(job: tuple) -> None:
    """NVRTC only (no CUDA context: the pool is forked from a process that holds one)."""
    from tracea.fileio import write_atomic  # noqa: PLC0415

    from tracea_cuda import compiler  # noqa: PLC0415
    from tracea_cuda.emit.wgmma import KERNEL_NAME  # noqa: PLC0415

    src, opts, path = job
    write_atomic(path, compiler._nvrtc_cubin(src, opts, KERNEL_NAME))


def compile_jobs(plan: list) -> list:
    """(source, options, cache path) of every config not yet in the disk cache (keys made here, where the
    toolkit's versions are known)."""
    from tracea_cuda import compiler  # noqa: PLC0415
    from tracea_cuda.emit.wgmma import render  # noqa: PLC0415

    opts, jobs, seen = compiler.options_for("sm_90a"), [], set()
    for _, op, cs in plan:
        for c in cs.values():
            src = render(WgmmaGemm().spec(op, c, None))
            path = compiler.cache_dir() / f"{compiler.cache_key(src, opts, 'sm_90a')}.cubin"
            if path not in seen and not path.is_file():
                seen.add(path)
                jobs.append((src, opts, path))
    return jobs


def precompile(plan: list, workers: int) -> None:
    """Compile every config of ``plan`` missing from the disk cache in ``workers`` processes (NVRTC only);
    a failure only leaves the timed calls to compile on first use."""
    jobs = compile_jobs(plan)
    try:
        with ProcessPoolExecutor(workers) as ex:
            list(ex.map(_compile, jobs))
        print(f"{len(jobs)} configs compiled", flush=True)
    except Exception as exc:  # noqa: BLE001 - the timed calls compile what is missing
        print(f"parallel compile failed ({type(exc).__name__}: {exc}); compiling on first use", flush=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES + list(EXTRAS)))
    p.add_argument("--jobs", type=int, default=0)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    profile = tracea.get_doctor().profile_for("cuda:0")
    print(f"{torch.cuda.get_device_name()} ({profile.compute_units} SMs); ratios are torch time / tracea time")
    plan = []
    for s in args.shapes.split(","):
        m, n, k, mn = parse(s)
        op = op_of(m, n, k, mn)
        plan.append((s, op, configs_for(op, profile, EXTRAS.get(s, []))))
    if args.jobs:
        precompile(plan, args.jobs)
    rows = []
    for s, _op, cs in plan:
        m, n, k, mn = parse(s)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) if mn else torch.randn(
            n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        wt = w if mn else w.t()
        ref = x @ wt
        t_torch = graph_time(lambda x=x, wt=wt: x @ wt)
        t_user, t_torch_user, _ = paired(lambda x=x, wt=wt: tracea.ops.matmul(x, wt), lambda x=x, wt=wt: x @ wt)
        row: dict[str, Any] = {"shape": s, "torch_s": t_torch, "user_s": t_user, "torch_user_s": t_torch_user,
                               "configs": {}}
        for label, cfg in cs.items():
            fn = lambda cfg=cfg, x=x, wt=wt: tracea.ops.matmul(x, wt, variant="cuda.gemm.wgmma", config=cfg)  # noqa: E731
            err = rel(fn(), ref)
            row["configs"][label] = {"config": cfg.key, "tile": f"{cfg.tile_m}x{cfg.tile_n}", "s": graph_time(fn),
                                     "err": err}
        cf = "  ".join(f"{lab} {v['tile']} {t_torch / v['s']:4.2f}"
                       for lab, v in row["configs"].items())
        print(f"{s:<16} torch {t_torch * 1e6:7.1f} us | user {t_torch_user / t_user:4.2f}x | {cf}  "
              f"err {max(v['err'] for v in row['configs'].values()):.0e}", flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
