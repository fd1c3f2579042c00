"""A core-only install (no backend package): ``tracea.ops.matmul`` on NumPy arrays runs the core's
NumPy-BLAS GEMM (``reference.gemm_blas``). Side by side in one run: the user path (public call, default
settings, untuned), NumPy's ``a @ b`` (the anchor) and the float64 oracle (``variant="reference.gemm"``,
what a core-only install ran before). Prints milliseconds and ratios against NumPy.

    python benchmarks/core/bench_core_only.py [--sizes 256,512,1024,2048] [--reps 10]
"""

from __future__ import annotations

import os

os.environ["TRACEA_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # core only, whatever is installed
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import argparse
import platform
import statistics
import time
import warnings

import numpy as np

import tracea
from tracea.errors import ReferenceBackendWarning


def _median_s(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="256,512,1024,2048")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    warnings.simplefilter("ignore", ReferenceBackendWarning)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; numpy {np.__version__}; "
          f"backends: {[b.name for b in tracea.get_doctor().backends()]}")
    print(f"{'dtype':8} {'size':>6} {'numpy ms':>10} {'tracea ms':>10} {'oracle ms':>10} {'tracea/numpy':>13} "
          f"{'oracle/numpy':>13}")
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64, np.float16):
        for n in (int(s) for s in args.sizes.split(",")):
            a = rng.standard_normal((n, n)).astype(dtype)
            b = rng.standard_normal((n, n)).astype(dtype)
            if dtype == np.float16:  # NumPy has no float16 BLAS: the anchor is what a NumPy user writes
                ref = _median_s(lambda a=a, b=b: (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16), args.reps)
            else:
                ref = _median_s(lambda a=a, b=b: a @ b, args.reps)
            user = _median_s(lambda a=a, b=b: tracea.ops.matmul(a, b), args.reps)
            oracle = _median_s(lambda a=a, b=b: tracea.ops.matmul(a, b, variant="reference.gemm"), max(2, args.reps // 3))
            print(f"{np.dtype(dtype).name:8} {n:>6} {ref * 1e3:>10.2f} {user * 1e3:>10.2f} {oracle * 1e3:>10.2f} "
                  f"{ref / user:>12.2f}x {ref / oracle:>12.2f}x")
    print("ratios: NumPy time / Tracea time (>1: Tracea faster). float16 anchor: NumPy in float32, cast back.")


if __name__ == "__main__":
    main()
