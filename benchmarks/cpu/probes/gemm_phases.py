"""Where the time of a two-thread fp32 GEMM goes on the column-split driver (``tr_drive_cols``), and how
it changes when NumPy ran just before: the GEMM library compiled with ``-DTR_PROBE`` (per-thread phase
timers, see ``emit/common.py``) times each thread's start delay after the call, its B packing, A packing
and micro-kernels; calls alternate at random between Tracea and NumPy (``a @ b``), and the medians are
split by what ran before (T: Tracea, N: NumPy).

    source scripts/srcenv.sh
    python benchmarks/cpu/probes/gemm_phases.py [--sizes 512,768,512x4096x4096] [--tile 14x32] [--mc 112] [--kc 512]
        [--threads 2] [--cflags="-DX=1;-DX=2"] [--variants "mc:kc:cflags,..."] [--isa avx2]

``--variants``: several (mc, kc, extra compiler flags) settings timed in the same process, interleaved
(empty fields take ``--mc`` / ``--kc``), e.g. ``--variants "112:512:,112:768:,:512:-DTR_JOIN_SPIN=0"``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import argparse
import ctypes
import random
import statistics
import time

import numpy as np

from tracea.ir.epilogue import Epilogue
from tracea.doctor.host_plugin import host_profile
from tracea_cpu.emit.blocked import blocked_source
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.kernels import GEMM_ARGTYPES, set_caches
from tracea_cpu.toolchain import build

PHASES = ("start", "B pack", "kernel", "A pack", "region")


def library(mr: int, nr: int, cflags: tuple[str, ...], isa_name: str = "avx512") -> ctypes.CDLL:
    isa = ISA_BY_NAME[isa_name]
    lib = build(blocked_source(isa, mr, nr, Epilogue.empty()), isa.cflags + ("-DTR_PROBE",) + cflags,
                f"probe-gemm-{mr}x{nr}")
    lib.tr_gemm.argtypes = GEMM_ARGTYPES
    lib.tr_gemm.restype = ctypes.c_int
    lib.tr_probe_read.argtypes = [ctypes.c_void_p]
    set_caches(lib)
    return lib


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="512,768")
    ap.add_argument("--tile", default="14x32")
    ap.add_argument("--mc", type=int, default=112)
    ap.add_argument("--nc", type=int, default=4096)
    ap.add_argument("--kc", type=int, default=512)
    ap.add_argument("--isa", default="", help="avx512 / avx2 / ... (default: this host's best)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--cflags", default="", help="flag sets separated by ';', compared in one process")
    ap.add_argument("--variants", default="", help="mc:kc:cflags settings separated by ',' (see above)")
    ns = ap.parse_args()
    mr, nr = (int(v) for v in ns.tile.split("x"))
    isa_name = ns.isa or host_profile().extras.get("best_isa", "avx512")
    settings = {}
    for v in (ns.variants.split(",") if ns.variants else [f"::{f}" for f in ns.cflags.split(";")]):
        mc, kc, flags = v.split(":", 2)
        settings[v] = (int(mc or ns.mc), int(kc or ns.kc), library(mr, nr, tuple(flags.split()), isa_name))
    libs = {name: lib for name, (_, _, lib) in settings.items()}
    buf = np.zeros((64, 8))
    print(f"load {os.getloadavg()}, {isa_name}, tile {mr}x{nr} mc {ns.mc} kc {ns.kc}, {ns.threads} threads")
    for size in ns.sizes.split(","):
        m, n, k = (int(v) for v in size.split("x")) if "x" in size else (int(size),) * 3
        rng = np.random.default_rng(m + n + k)
        a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
        c = np.empty((m, n), np.float32)

        def tracea_call(name: str, m: int = m, n: int = n, k: int = k, a: np.ndarray = a, b: np.ndarray = b,
                        c: np.ndarray = c) -> None:
            mc, kc, lib = settings[name]
            rc = lib.tr_gemm(1, m, n, k, a.ctypes.data, k, 1, 0, b.ctypes.data, n, 1, 0, c.ctypes.data, n, 0, None,
                             mc, ns.nc, kc, ns.threads)
            assert rc == 0

        names = ["N"] + list(libs)
        for name, lib in libs.items():
            tracea_call(name)
            lib.tr_probe_read(buf.ctypes.data)
        walls: dict[tuple[str, str], list[float]] = {}
        phases: dict[tuple[str, str], list[np.ndarray]] = {}
        prev = "N"
        random.seed(m + n + k)
        for _ in range(ns.calls):
            name = random.choice(names)
            t = time.perf_counter()
            if name == "N":
                _ = a @ b
            else:
                tracea_call(name)
            dt = time.perf_counter() - t
            key = (prev if prev == "N" else "T", name)
            walls.setdefault(key, []).append(dt)
            if name != "N":
                libs[name].tr_probe_read(buf.ctypes.data)
                phases.setdefault(key, []).append(buf[: ns.threads].copy())
            prev = name
        print(f"{m}x{n}x{k} (load {os.getloadavg()[0]:.1f})")
        for (before, name), ws in sorted(walls.items()):
            wall = statistics.median(ws)
            line = f"  {name or 'tracea':>16} after {before}: {wall * 1e6:7.0f} us {2 * m * n * k / wall / 1e9:5.0f} GFLOP/s"
            if name != "N":
                ph = np.median(np.stack(phases[(before, name)]), axis=0) / 1e3  # us, per thread x phase
                line += "  " + " | ".join(f"t{t}: " + " ".join(f"{p} {ph[t, i]:5.0f}" for i, p in enumerate(PHASES))
                                          for t in range(ns.threads))
            print(line + f"  (n={len(ws)})")


if __name__ == "__main__":
    main()
