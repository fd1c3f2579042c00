"""fp32 nn.Linear decode shapes (M x N x K, weights stored N x K) through ``tr_gemm`` compiled with extra
``-D`` flags, against ``torch.nn.functional.linear`` (``--kn``: weights K x N against ``torch.mm``): A/B of
the GEMV / axpy drivers (``-DTR_GEMV_DRIVER=0``, ``-DTR_AXPY_DRIVER=0``), their row limits
(``-D'TR_GEMV_ROWS_OK(M, K)=...'``), weight rows per step (``TR_GV_R``), prefetch distance
(``TR_GV_PF``) and axpy column chunk (``TR_AX_CW``).

    source scripts/srcenv.sh
    flock /tmp/tracea-bench.lock python benchmarks/cpu/probes/gemv_linear.py --m 1,4,8,32 \
        --variants base=,nogemv=-DTR_GEMV_DRIVER=0,pf=-DTR_GV_PF=512    (flags split on spaces)
"""

from __future__ import annotations

import argparse
import ctypes
import time

import numpy as np

from tracea.ir.epilogue import Epilogue
from tracea_cpu.emit.blocked import blocked_source
from tracea_cpu.isa import ISA_BY_NAME
from tracea_cpu.kernels import GEMM_ARGTYPES
from tracea_cpu.toolchain import build


def library(isa_name: str, cflags: tuple[str, ...]):
    isa = ISA_BY_NAME[isa_name]
    mr, nr = (6, 64) if isa_name == "avx512" else isa.tiles[0]
    lib = build(blocked_source(isa, mr, nr, Epilogue.empty()), isa.cflags + cflags, f"probe-gemv-{isa_name}")
    lib.tr_gemm.argtypes = GEMM_ARGTYPES
    lib.tr_gemm.restype = ctypes.c_int
    return lib


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="1,4,8,32")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--isa", default="avx512")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--kn", action="store_true", help="weights stored K x N (A @ W) instead of N x K")
    ap.add_argument("--variants", default="base=,nogemv=-DTR_GEMV_DRIVER=0")
    ns = ap.parse_args()
    import torch

    torch.set_num_threads(ns.threads)
    n, k = ns.n, ns.k
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, n) if ns.kn else (n, k), dtype=np.float32)
    libs = {}
    for item in ns.variants.split(","):
        name, _, flags = item.partition("=")
        libs[name] = library(ns.isa, tuple(f for f in flags.split() if f))
    for m in (int(x) for x in ns.m.split(",")):
        a = rng.standard_normal((m, k), dtype=np.float32)
        out = np.empty((m, n), np.float32)
        ref = a.astype(np.float64) @ (w.astype(np.float64) if ns.kn else w.astype(np.float64).T)
        rsb, csb = (n, 1) if ns.kn else (1, k)
        pa, pw, po = (x.__array_interface__["data"][0] for x in (a, w, out))
        fns = {name: (lambda lib=lib: lib.tr_gemm(1, m, n, k, pa, k, 1, 0, pw, rsb, csb, 0, po, n, 0, None,
                                                  96, 4096, 1024, ns.threads)) for name, lib in libs.items()}
        ta, tw = torch.from_numpy(a), torch.from_numpy(w)
        fns["F.linear"] = (lambda: torch.mm(ta, tw)) if ns.kn else (lambda: torch.nn.functional.linear(ta, tw))
        best = {name: float("inf") for name in fns}
        for name, fn in fns.items():
            fn()
            if name != "F.linear":
                err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
                assert err < 1e-5, (name, err)
        for _ in range(ns.rounds):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
        gb = 4 * n * k / 1e9
        cells = "  ".join(f"{name} {1e3 * t:6.2f} ms {gb / t:5.1f} GB/s" for name, t in best.items())
        print(f"M={m:3d}  {cells}", flush=True)


if __name__ == "__main__":
    main()
