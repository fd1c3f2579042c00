"""Where the time of a batch-1 3x3 conv goes, NCHW against NHWC: the conv library compiled with
``-DTR_PROBE`` (per-thread phase timers, see ``emit/common.py``) times the input copy (NCHW only), the
B-panel packing, the micro-kernels (with their row pointers; NHWC stores its output there) and the
transposed NCHW store, summed over both threads, per call (best call of ``--reps`` by wall time).

    source scripts/srcenv.sh
    flock /tmp/tracea-bench.lock python benchmarks/cpu/probes/nchw_phases.py [--layers 128@28,256@14]
        [--configs 14x32:2304,7x32:2304] [--cflags -DTR_SEG_PAD=0] [--batch 8]
"""

from __future__ import annotations

import argparse
import ctypes
import time

import numpy as np

from tracea.ir.epilogue import Epilogue
from tracea.ir.ops import Conv2dOp
from tracea_cpu.emit.blocked import blocked_source
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.kernels import CONV_ARGTYPES
from tracea_cpu.toolchain import build

PHASES = ("input copy", "B pack", "kernel", "NCHW store", "region", "start")


def library(mr: int, nr: int, cflags: tuple[str, ...] = ()):
    isa = ISA_BY_NAME["avx512"]
    lib = build(blocked_source(isa, mr, nr, Epilogue.empty()), isa.cflags + ("-DTR_PROBE",) + cflags,
                f"probe-{mr}x{nr}")
    lib.tr_conv2d.argtypes = CONV_ARGTYPES
    lib.tr_conv2d.restype = ctypes.c_int
    lib.tr_probe_read.argtypes = [ctypes.c_void_p]
    return lib


def run(lib, op: Conv2dOp, x, w, out, mc: int, kc: int, threads: int, reps: int):
    """Best wall time of ``reps`` calls and that call's per-phase thread-seconds."""
    layout = 0 if op.layout.name == "NCHW" else 1
    ptr = lambda a: a.ctypes.data  # noqa: E731
    buf = np.zeros((64, 8))

    def call():
        rc = lib.tr_conv2d(layout, op.n, op.c, op.h, op.w, op.k, op.r, op.s, 1, 1, 1, 1, 1, 1, 1, op.p, op.q,
                           ptr(x), ptr(w), None, ptr(out), mc, 4096, kc, threads, 1)
        assert rc == 0

    for _ in range(5):
        call()
    lib.tr_probe_read(buf.ctypes.data)
    best = (float("inf"), None)
    for _ in range(reps):
        t = time.perf_counter()
        call()
        dt = time.perf_counter() - t
        lib.tr_probe_read(buf.ctypes.data)
        if dt < best[0]:
            best = (dt, buf[:threads, :6].sum(axis=0) / 1e9)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="128@28,256@14")
    ap.add_argument("--configs", default="14x32:2304,7x32:2304")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--cflags", default="", help="extra compiler flags, e.g. -DTR_SEG_PAD=0; several sets "
                    "separated by ';' are compared in the same process (the machine's slow state is per process)")
    ns = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'layer':>16} {'layout':>6} {'config':>12} {'GFLOP/s':>8} {'wall us':>8}  thread-us: "
          + " ".join(f"{p:>10}" for p in PHASES) + f" {'idle':>8}  cflags")
    for layer in ns.layers.split(","):
        c, hw = (int(v) for v in layer.split("@"))
        for cfg in ns.configs.split(","):
            tile, kc = cfg.split(":")
            mr, nr = (int(v) for v in tile.split("x"))
            for flags in ns.cflags.split(";"):
                lib = library(mr, nr, tuple(flags.split()))
                for layout in ("nchw", "nhwc"):
                    op = Conv2dOp(ns.batch, c, hw, hw, c, 3, 3, padding=1, layout=layout)
                    x = rng.standard_normal(op.x_shape, dtype=np.float32)
                    w = rng.standard_normal(op.w_shape, dtype=np.float32)
                    out = np.empty(op.out_shape, np.float32)
                    wall, ph = run(lib, op, x, w, out, 2 * mr, int(kc), ns.threads, ns.reps)
                    idle = wall * ns.threads - ph[:4].sum()
                    print(f"{layer:>16} {layout:>6} {cfg:>12} {op.flops / wall / 1e9:8.1f} {wall * 1e6:8.0f}     "
                          + " ".join(f"{v * 1e6:10.0f}" for v in ph) + f" {idle * 1e6:8.0f}  {flags}", flush=True)


if __name__ == "__main__":
    main()
