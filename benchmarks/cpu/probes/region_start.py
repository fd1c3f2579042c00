"""Where the time of a many-thread fp32 GEMM goes right after NumPy's calls (OpenBLAS's workers spin ~0.1 s):
the column driver (``tr_drive_cols``) on Tracea's pool (``pool``) and in an OpenMP region (``cols``) against the
packed one (``-DTR_COLS_FEW_T=99``) at 1024^3 on 16 threads,
12 calls per pattern -- right after a NumPy + torch 512^2 matmul (``after-numpy``), with them before every call
(``interleaved``), with a torch 512^2 matmul alone before every call (``torch-inter``: torch's OpenMP
workers spin, and the OpenMP driver shares them), with one of Tracea's own OpenMP regions before every call
(``omp-inter``: a 512^3 GEMM on the packed driver), after 0.3 s of sleep (``quiet``) -- each call's wall time and, from the ``TR_PROBE`` phase
timers (column driver only), the latest thread's start delay (pool: of the threads that joined), the longest and shortest per-thread work and the
region. Needs an AVX-512 host (the 16-core Xeon of the GPU machine).

    source scripts/srcenv.sh && python benchmarks/cpu/probes/region_start.py [--n 1024] [--threads 16]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time

import numpy as np
import torch

from tracea.ir.epilogue import Epilogue
from tracea_cpu.emit.blocked import blocked_source
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu import pool
from tracea_cpu.kernels import GEMM_ARGTYPES, set_caches
from tracea_cpu.toolchain import build


def library(name: str, flags: tuple[str, ...]) -> ctypes.CDLL:
    isa = ISA_BY_NAME["avx512"]
    lib = build(blocked_source(isa, 14, 32, Epilogue.empty()), isa.cflags + flags + ("-DTR_PROBE",),
                "region-start-" + name)
    lib.tr_gemm.argtypes = GEMM_ARGTYPES
    lib.tr_gemm.restype = ctypes.c_int
    lib.tr_probe_read.argtypes = [ctypes.c_void_p]
    lib.tr_gemm_route.argtypes = [ctypes.c_long] * 5 + [ctypes.c_int]
    set_caches(lib)
    lib.tr_set_pool.argtypes = [ctypes.c_void_p]
    pooled = "-DTR_PROBE_POOL" in flags  # (whatever TRACEA_CPU_POOL says: this probe compares the two)
    lib.tr_set_pool(ctypes.cast(pool.library().tr_pool_run, ctypes.c_void_p).value if pooled else None)
    return lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=16)
    args = ap.parse_args()
    n, nth = args.n, args.threads
    libs = {"pool": library("pool", ("-DTR_PROBE_POOL",)), "cols": library("cols", ()),
            "packed": library("packed", ("-DTR_COLS_FEW_T=99",))}
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    c = np.empty((n, n), np.float32)
    an, bn = (rng.standard_normal((512, 512), dtype=np.float32) for _ in range(2))
    at, bt = torch.from_numpy(an.copy()), torch.from_numpy(bn.copy())
    buf = np.zeros((64, 8))
    routes = {k: lib.tr_gemm_route(n, n, n, n, 1, nth) for k, lib in libs.items()}
    print(f"routes {routes}, load {os.getloadavg()}", flush=True)

    def call(lib: ctypes.CDLL) -> None:
        rc = lib.tr_gemm(1, n, n, n, a.ctypes.data, n, 1, 0, b.ctypes.data, n, 1, 0, c.ctypes.data, n, 0, None,
                         112, 4096, 768, nth)
        assert rc == 0

    def others() -> None:
        _ = an @ bn
        _ = at @ bt

    def omp_call() -> None:  # one of Tracea's own OpenMP regions (the packed driver, 512^3)
        rc = libs["packed"].tr_gemm(1, 512, 512, 512, an.ctypes.data, 512, 1, 0, bn.ctypes.data, 512, 1, 0,
                                    c.ctypes.data, 512, 0, None, 112, 4096, 768, nth)
        assert rc == 0

    def torch_only() -> None:  # torch's OpenMP workers spin after it (libgomp's default with torch loaded)
        _ = at @ bt

    for lib in libs.values():
        for _ in range(5):
            call(lib)
        lib.tr_probe_read(buf.ctypes.data)
    for rnd in range(3):
        for name, lib in libs.items():
            for pattern in ("after-numpy", "interleaved", "torch-inter", "omp-inter", "quiet"):
                if pattern == "quiet":
                    time.sleep(0.3)  # OpenBLAS's workers stop spinning
                elif pattern in ("torch-inter", "omp-inter"):
                    time.sleep(0.3)
                    (torch_only if pattern == "torch-inter" else omp_call)()
                else:
                    others()
                rows = []
                for i in range(12):
                    if pattern == "interleaved" and i:
                        others()
                    if pattern == "torch-inter" and i:
                        torch_only()
                    if pattern == "omp-inter" and i:
                        omp_call()
                    lib.tr_probe_read(buf.ctypes.data)
                    t0 = time.perf_counter()
                    call(lib)
                    dt = time.perf_counter() - t0
                    lib.tr_probe_read(buf.ctypes.data)
                    ph = buf[:nth] / 1e3  # us per thread x phase
                    if name == "pool":  # (threads that did not join have no timers)
                        ph = ph[ph[:, 0] > 0] if (ph[:, 0] > 0).any() else ph[:1]
                    work = ph[:, 1] + ph[:, 2] + ph[:, 3] + ph[:, 6]
                    rows.append((dt * 1e3, ph[:, 0].max(), int(ph[:, 0].argmax()), work.max(), work.min(), ph[0, 4]))
                worst = max(rows)
                print(f"r{rnd} {name:6} {pattern:11}: median {statistics.median(r[0] for r in rows):5.2f} ms | calls "
                      + " ".join(f"{r[0]:.1f}" for r in rows)
                      + f" | worst call: latest start {worst[1]:.0f} us (t{worst[2]}), work max {worst[3]:.0f} / "
                        f"min {worst[4]:.0f} us, region {worst[5]:.0f} us", flush=True)


if __name__ == "__main__":
    main()
