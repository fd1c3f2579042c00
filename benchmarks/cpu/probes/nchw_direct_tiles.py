"""Tiles of the direct NCHW conv (``indirect=3``) against each other, the indirect algorithm and
``F.conv2d``, interleaved in one process: the blocked library compiled once per direct tile (``--tiles``
``PVxKB``: vectors of pixels x output channels) and once for the indirect config, ``tr_conv2d`` called
directly (no Doctor), order reversed every other round. Prints per layer, for each, the median over
``--reps`` repetitions of its GFLOP/s (each repetition: the median of ``--rounds`` rounds) and of its
ratio to torch, with the ratio's range over the repetitions.

    source scripts/srcenv.sh
    flock /tmp/tracea-bench.lock python benchmarks/cpu/probes/nchw_direct_tiles.py --isa avx2 \
        [--tiles 3x4,2x6,2x6:-DTR_ND_CB=32:-DTR_ND_GROUP=1] [--layers 64@56,128@28] [--batches 8,1] [--indirect 6x16:2304] [--rounds 11] [--reps 3]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time
from typing import Callable

import numpy as np

from tracea.ir.epilogue import Epilogue
from tracea_cpu.emit.blocked import blocked_source
from tracea_cpu.emit.nchw_direct import nchw_direct_source
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.kernels import CONV_ARGTYPES, set_caches
from tracea_cpu.toolchain import build


def library(isa_name: str, mr: int, nr: int, tile: tuple[int, int] | None = None, cflags: tuple[str, ...] = ()):
    """The blocked library (``mr`` x ``nr`` GEMM tile) with the direct conv's tile set to ``tile``, compiled
    with ``cflags`` added (e.g. ``-DTR_ND_CB=32``)."""
    isa = ISA_BY_NAME[isa_name]
    src = blocked_source(isa, mr, nr, Epilogue.empty())
    if tile is not None:
        src = src.replace(nchw_direct_source(isa), nchw_direct_source(isa, *tile))
    name = f"probe-nd-{isa_name}-{mr}x{nr}" + (f"-{tile[0]}x{tile[1]}" if tile else "")
    lib = build(src, isa.cflags + cflags, name)
    lib.tr_conv2d.argtypes = CONV_ARGTYPES
    lib.tr_conv2d.restype = ctypes.c_int
    set_caches(lib)
    return lib


def conv_call(lib, x: np.ndarray, w: np.ndarray, out: np.ndarray, kc: int, algo: int,
              threads: int) -> Callable[[], None]:
    """``tr_conv2d`` on NCHW ``x`` / KCRS ``w`` (stride 1, "same" padding) as a callable."""
    n, c, h, wd = x.shape
    k, _, r, s = w.shape

    def call() -> None:
        rc = lib.tr_conv2d(0, n, c, h, wd, k, r, s, 1, 1, r // 2, s // 2, 1, 1, 1, h, wd, x.ctypes.data,
                           w.ctypes.data, None, out.ctypes.data, 48, 4096, kc, threads, algo)
        assert rc == 0

    return call


def parse_layer(spec: str) -> tuple[int, int, int, int]:
    """``C@HW`` (3x3, C -> C) or ``C>K@HW/R`` (R x R, C -> K): (C, K, HW, R)."""
    chans, rest = spec.split("@")
    c, k = (int(v) for v in chans.split(">")) if ">" in chans else (int(chans), int(chans))
    hw, r = (int(v) for v in rest.split("/")) if "/" in rest else (int(rest), 3)
    return c, k, hw, r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--isa", default="avx2")
    ap.add_argument("--tiles", default="3x4,2x6", help="PVxKB[:cflag[:cflag]] of each direct library")
    ap.add_argument("--indirect", default="6x16:2304", help="MRxNR:KC of the indirect config ('' for none)")
    ap.add_argument("--layers", default="64@56,128@28", help="C@HW (3x3 C -> C) or C>K@HW/R (R x R C -> K)")
    ap.add_argument("--batches", default="8,1")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="threads of ours and torch's (0: every core)")
    ns = ap.parse_args()
    import torch
    import torch.nn.functional as F

    if ns.threads:
        torch.set_num_threads(ns.threads)
    mr, nr = (6, 16) if ns.isa == "avx2" else (6, 64)
    libs = {}
    for spec in (t for t in ns.tiles.split(",") if t):
        shape, *flags = spec.split(":")
        pv, kb = (int(v) for v in shape.split("x"))
        libs[f"direct {spec}"] = library(ns.isa, mr, nr, (pv, kb), tuple(flags))
    ind = None
    if ns.indirect:
        shape, kc = ns.indirect.split(":")
        imr, inr = (int(v) for v in shape.split("x"))
        ind = (library(ns.isa, imr, inr), int(kc), f"indirect {shape} kc{kc}")
    rng = np.random.default_rng(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}", flush=True)
    for batch in (int(b) for b in ns.batches.split(",")):
        for c, k, hw, rk in (parse_layer(lay) for lay in ns.layers.split(",")):
            x = rng.standard_normal((batch, c, hw, hw), dtype=np.float32)
            w = (rng.standard_normal((k, c, rk, rk), dtype=np.float32) / np.sqrt(rk * rk * c)).astype(np.float32)
            xt, wt = torch.from_numpy(x), torch.from_numpy(w)
            ref = F.conv2d(xt.double(), wt.double(), padding=rk // 2).numpy()
            fns: dict[str, Callable[[], object]] = {}
            for name, lib in libs.items():
                out = np.empty_like(ref, dtype=np.float32)
                fns[name] = conv_call(lib, x, w, out, 512, 3, ns.threads)
                fns[name]()
                assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5, name
            if ind is not None:
                out = np.empty_like(ref, dtype=np.float32)
                fns[ind[2]] = conv_call(ind[0], x, w, out, ind[1], 1, ns.threads)
                fns[ind[2]]()
                assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5, ind[2]
            fns["torch"] = lambda xt=xt, wt=wt, pad=rk // 2: F.conv2d(xt, wt, padding=pad)
            flops = 2.0 * batch * c * k * rk * rk * hw * hw
            names = list(fns)
            gf: dict[str, list[float]] = {k: [] for k in fns}
            ratio: dict[str, list[float]] = {k: [] for k in fns}
            with torch.no_grad():
                for fn in fns.values():
                    fn(), fn()
                for _ in range(ns.reps):
                    ts: dict[str, list[float]] = {k: [] for k in fns}
                    for r in range(ns.rounds):
                        for fn in names if r % 2 == 0 else names[::-1]:
                            t = time.perf_counter()
                            fns[fn]()
                            ts[fn].append(time.perf_counter() - t)
                    med = {fn: statistics.median(v) for fn, v in ts.items()}
                    for fn in names:
                        gf[fn].append(flops / med[fn] / 1e9)
                        ratio[fn].append(med["torch"] / med[fn])
            name = f"{c}@{hw}" if (k, rk) == (c, 3) else f"{c}>{k}@{hw}/{rk}x{rk}"
            print(f"{name} b{batch}: " + "  ".join(
                f"{fn} {statistics.median(gf[fn]):.0f} GF {statistics.median(ratio[fn]):.2f}x "
                f"({min(ratio[fn]):.2f}-{max(ratio[fn]):.2f})" for fn in names), flush=True)

if __name__ == "__main__":
    main()
